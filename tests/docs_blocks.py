"""The Python code blocks of README.md and the guide under docs/, and how each one runs.

A block's launcher is the HTML comment on the last non-blank line before its fence:

    <!-- docs-test: single process -->     one Python process (also the default: no marker)
    <!-- docs-test: mpirun -np 2 -->       mpirun --allow-run-as-root --oversubscribe -np 2
    <!-- docs-test: torchrun -np 2 -->     torchrun --standalone --nproc_per_node 2
    <!-- docs-test: skip: REASON -->       not run (an illustrative fragment; the reason is required)

A marker that does not parse, or that is not followed by a Python block, is an error: a typo
must not turn a block into one that silently runs differently or not at all.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]

#: Pages whose Python blocks are executed: the README and the guide. docs/results/ holds what
#: the benchmarks write (figures and their commands), not guide pages.
EXCLUDED_DIRS = ("docs/results",)

MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<spec>.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
PYTHON = {"python", "py", "python3"}


class MarkerError(ValueError):
    pass


@dataclass(frozen=True)
class Block:
    path: str            # relative to the repository root
    line: int            # 1-based line of the opening fence
    code: str
    launcher: str        # "single" | "mpirun" | "torchrun" | "skip"
    np: int = 1
    reason: str = ""

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def parse_marker(spec: str) -> tuple:
    """``spec`` (the text after ``docs-test:``) -> (launcher, np, reason)."""
    if spec == "single process":
        return "single", 1, ""
    m = re.fullmatch(r"(mpirun|torchrun) -np (\d+)", spec)
    if m:
        np_ = int(m.group(2))
        if not 1 <= np_ <= 8:
            raise MarkerError(f"docs-test: -np must be 1..8, got {np_}")
        return m.group(1), np_, ""
    m = re.fullmatch(r"skip:\s*(\S.*)", spec)
    if m:
        return "skip", 1, m.group(1)
    raise MarkerError(f"unknown docs-test marker {spec!r}: use 'single process', 'mpirun -np N', "
                      "'torchrun -np N' or 'skip: REASON'")


def blocks_of(text: str, path: str) -> List[Block]:
    """Every Python block of a Markdown text, with its launcher (see the module doc)."""
    lines = text.splitlines()
    out: List[Block] = []
    pending: Optional[tuple] = None    # (line number, spec) of a marker not yet used
    last_nonblank = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = MARKER.match(line)
        if m:
            if pending is not None:
                raise MarkerError(f"{path}:{pending[0]}: docs-test marker not followed by a Python block")
            pending = (i + 1, m.group("spec"))
            last_nonblank = i
            i += 1
            continue
        f = FENCE.match(line)
        if f:
            fence, indent, info = f.group("fence"), len(f.group("indent")), f.group("info").lower()
            start = i
            i += 1
            body = []
            while i < len(lines) and not (lines[i].strip().startswith(fence[0] * len(fence))
                                          and lines[i].strip().strip(fence[0]) == ""):
                body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i].lstrip())
                i += 1
            i += 1    # the closing fence
            marker_here = pending is not None and last_nonblank is not None and pending[0] - 1 == last_nonblank
            if info in PYTHON:
                launcher, np_, reason = parse_marker(pending[1]) if marker_here else ("single", 1, "")
                out.append(Block(path, start + 1, "\n".join(body) + "\n", launcher, np_, reason))
                pending = None
            elif pending is not None:
                raise MarkerError(f"{path}:{pending[0]}: docs-test marker not followed by a Python block "
                                  f"(the next block, line {start + 1}, is {info or 'untagged'!r})")
            last_nonblank = i - 1
            continue
        if line.strip():
            if pending is not None:
                raise MarkerError(f"{path}:{pending[0]}: docs-test marker not followed by a Python block")
            last_nonblank = i
        i += 1
    if pending is not None:
        raise MarkerError(f"{path}:{pending[0]}: docs-test marker at the end of the page")
    return out


def pages(root: Path = ROOT) -> List[Path]:
    """README.md and every Markdown page under docs/ except the excluded directories."""
    found = [root / "README.md"]
    for p in sorted((root / "docs").rglob("*.md")):
        rel = p.relative_to(root).as_posix()
        if not any(rel.startswith(d + "/") for d in EXCLUDED_DIRS):
            found.append(p)
    return found


def all_blocks(root: Path = ROOT) -> List[Block]:
    out: List[Block] = []
    for p in pages(root):
        out.extend(blocks_of(p.read_text(encoding="utf-8"), p.relative_to(root).as_posix()))
    return out
