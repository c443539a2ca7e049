"""docs/guide/environment.md lists every environment variable the package reads, and no other.

The code side is read from the source (no import): every ``os.environ.get(X)``,
``os.environ[X]``, ``os.getenv(X)``, ``X in os.environ``, ``os.environ.setdefault(X, ...)`` and
the package's own parsers ``seconds_from_env(X, ...)`` / ``flag_from_env(X)``, where ``X`` is a
string, a module-level constant (a string or a tuple of strings) or a loop variable over such a
tuple. A read whose name cannot be resolved fails the test, so a new way of reading the
environment cannot slip past it.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Set, Tuple

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "horovod_gradcomp"
PAGE = ROOT / "docs" / "guide" / "environment.md"
#: The package's own helpers that read the variable named by their first argument.
READERS = {"seconds_from_env", "flag_from_env"}


def _strings(node: ast.AST, consts: Dict[str, Tuple[str, ...]]):
    """The names ``node`` stands for, or None when it cannot be resolved statically."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return (node.value,)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        parts = [_strings(e, consts) for e in node.elts]
        return None if any(p is None for p in parts) else tuple(x for p in parts for x in p)
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    return None


def _is_environ(node: ast.AST) -> bool:
    """``os.environ`` / ``_os.environ`` / ``environ``."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ")


def reads_in(path: Path, root: Path = ROOT) -> Tuple[Set[str], List[str]]:
    """(variable names read in ``path``, reads that could not be resolved as 'file:line')."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    consts: Dict[str, Tuple[str, ...]] = {}
    for stmt in tree.body:   # module-level NAME = "X" / ("X", "Y")
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    val = _strings(stmt.value, consts)
                    if val is not None:
                        consts[target.id] = val
    for node in ast.walk(tree):   # loop variables over such tuples
        loops = [node] if isinstance(node, ast.For) else getattr(node, "generators", [])
        for loop in loops:
            if isinstance(loop.target, ast.Name):
                val = _strings(loop.iter, consts)
                if val is not None:
                    consts.setdefault(loop.target.id, val)
    found: Set[str] = set()
    unresolved: List[str] = []

    def take(arg, node):
        val = _strings(arg, consts) if arg is not None else None
        if val is None:
            unresolved.append(f"{path.relative_to(root)}:{node.lineno}")
        else:
            found.update(val)

    # the readers' own bodies read the variable their caller names
    inside_readers = {id(n) for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef) and fn.name in READERS
                      for n in ast.walk(fn)}
    for node in ast.walk(tree):
        if id(node) in inside_readers:
            continue
        if isinstance(node, ast.Call):
            f = node.func
            env_method = isinstance(f, ast.Attribute) and _is_environ(f.value) and f.attr in (
                "get", "setdefault", "pop")
            getenv = isinstance(f, ast.Attribute) and f.attr == "getenv"
            reader = isinstance(f, ast.Name) and f.id in READERS
            if env_method or getenv or reader:
                take(node.args[0] if node.args else None, node)
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            take(node.slice, node)
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            take(node.left, node)
    return found, unresolved


def code_variables() -> Tuple[Dict[str, List[str]], List[str]]:
    """{variable: [files that read it]}, [unresolved reads]."""
    out: Dict[str, List[str]] = {}
    unresolved: List[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        names, bad = reads_in(path)
        unresolved += bad
        for name in names:
            out.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return out, unresolved


def page_variables() -> Dict[str, str]:
    """{variable: its row} from the page's table (first cell: the name in backticks)."""
    rows = {}
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\|\s*`([A-Z][A-Z0-9_]*)`\s*\|", line)
        if m:
            assert m.group(1) not in rows, f"{PAGE.name}: {m.group(1)} has two rows"
            rows[m.group(1)] = line
    return rows


def test_every_read_is_resolved():
    _, unresolved = code_variables()
    assert not unresolved, ("environment reads whose variable name this test cannot work out (use a string or a "
                            f"module-level constant): {unresolved}")


def test_every_variable_read_has_a_row():
    code, _ = code_variables()
    rows = page_variables()
    missing = {v: files for v, files in code.items() if v not in rows}
    assert not missing, ("variables the package reads with no row in docs/guide/environment.md: "
                         + "; ".join(f"{v} (read in {', '.join(f)})" for v, f in sorted(missing.items())))


def test_every_row_is_read():
    code, _ = code_variables()
    extra = sorted(set(page_variables()) - set(code))
    assert not extra, f"docs/guide/environment.md lists variables the package does not read: {extra}"


def test_rows_give_a_default_and_a_page():
    for name, row in page_variables().items():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        assert len(cells) >= 4 and all(cells[:4]), f"{name}: the row needs name, default, meaning and page: {row}"
        assert "](" in cells[3], f"{name}: the page cell links no page: {row}"


def test_the_scan_sees_each_kind_of_read(tmp_path):
    """A string, a constant, a loop over a tuple, a subscript, ``in`` and the package's readers."""
    src = tmp_path / "m.py"
    src.write_text(
        "import os\nA = 'VAR_A'\nB = ('VAR_B1', 'VAR_B2')\n"
        "os.environ.get('VAR_S')\nos.environ.get(A, '1')\nany(os.environ.get(v) for v in B)\n"
        "os.environ['VAR_SUB']\n'VAR_IN' in os.environ\nos.getenv('VAR_GETENV')\n"
        "seconds_from_env('VAR_SEC', 'off')\nflag_from_env(A)\nos.environ.get(name)\n", encoding="utf-8")
    found, unresolved = reads_in(src, tmp_path)
    assert found == {"VAR_A", "VAR_B1", "VAR_B2", "VAR_S", "VAR_SUB", "VAR_IN", "VAR_GETENV", "VAR_SEC"}
    assert unresolved == ["m.py:12"]
