"""What the guide says about the code's text, and what the code's text says about the project.

Three kinds of statement are read here (the tests: tests/test_docs_text.py):

* **Internal issue numbers.** A user reads the package's messages and docstrings and the guide;
  none of them may point at the project's own tracker ("until issue 30", "see #31"): history
  lives in git and the changelog, in words. :func:`code_issue_refs` reads every string literal
  of horovod_gradcomp/ (docstrings and messages; comments are not user-visible),
  :func:`doc_issue_refs` every page of docs/, README.md and mkdocs.yml.
* **Troubleshooting headings.** A heading of docs/guide/troubleshooting.md that quotes a message
  in backticks must quote one the code can produce: its fixed words (what is left between
  ``...``, ``[...]`` and one-letter placeholders such as ``T`` or ``N``) appear, in order, in one
  string literal of horovod_gradcomp/ that is not a docstring (:func:`unmatched_headings`).
  Messages of other programs that the guide explains are listed in :data:`EXTERNAL_MESSAGES`.
* **Option lists of the factory docstrings.** Each ``Compression.<codec>`` docstring names every
  option of its codec's constructor (:func:`undocumented_codec_options`), and each option list
  in a factory docstring ("options (``a``, ``b``)", "Options: ``a``, ``b``.") names only options
  the factory takes, a deprecated one only as deprecated (:func:`bad_listed_options`).
"""
from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

from docs_blocks import ROOT

PACKAGE = ROOT / "horovod_gradcomp"
TROUBLESHOOTING = ROOT / "docs" / "guide" / "troubleshooting.md"

# --- internal issue numbers -------------------------------------------------------------------

#: "issue 30", "Issue #7", "issues 12 and 13", "#31" (not "#1f77b4", a link's "#anchor" or "C#1").
ISSUE_REF = re.compile(r"\b[Ii]ssues?\s+#?\d+|(?<![\w&/#])#\d+\b(?![\w-])")


def issue_refs(text: str) -> List[str]:
    """The internal issue references in ``text`` (each with a little context)."""
    return [text[max(0, m.start() - 30):m.end() + 20].replace("\n", " ") for m in ISSUE_REF.finditer(text)]


def _string_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every string literal of a module: plain strings and f-strings (not the parts inside one)."""
    inner = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)
                                               and id(node) not in inner):
            yield node


def _parts(node: ast.AST) -> List[str]:
    """The fixed text of a string literal: one part, or an f-string's constant parts."""
    if isinstance(node, ast.Constant):
        return [node.value]
    return [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]


def code_issue_refs(root: Path = ROOT) -> List[str]:
    """'file:line: context' for each issue reference in a string literal of the package."""
    out = []
    for path in sorted((root / "horovod_gradcomp").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in _string_nodes(tree):
            for ref in issue_refs(" ".join(_parts(node))):
                out.append(f"{path.relative_to(root)}:{node.lineno}: ...{ref}...")
    return out


def doc_issue_refs(root: Path = ROOT) -> List[str]:
    """'file:line: context' for each issue reference in README.md, mkdocs.yml or a page of docs/."""
    out = []
    for path in [root / "README.md", root / "mkdocs.yml"] + sorted((root / "docs").rglob("*.md")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for ref in issue_refs(line):
                out.append(f"{path.relative_to(root)}:{number}: ...{ref}...")
    return out


# --- troubleshooting headings -----------------------------------------------------------------

#: Messages of other programs that a troubleshooting heading may quote: the quote -> who prints it.
EXTERNAL_MESSAGES = {
    "terminate called without an active exception": "the C++ runtime (libstdc++), when a thread outlives exit",
}


def _docstring_ids(tree: ast.AST) -> set:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def message_literals(root: Path = ROOT) -> List[Tuple[str, List[str]]]:
    """('file:line', fixed parts) of every string literal of the package that is not a docstring."""
    out = []
    for path in sorted((root / "horovod_gradcomp").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstring_ids(tree)
        for node in _string_nodes(tree):
            if id(node) not in docs:
                out.append((f"{path.relative_to(root)}:{node.lineno}", _parts(node)))
    return out


def heading_quotes(text: str) -> List[Tuple[int, str]]:
    """(line, quote) for each backticked message in a ``##`` heading. A quote that is one
    identifier (a class name such as ``UnsupportedHorovodOption``) is not a message."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("## "):
            for quote in re.findall(r"`([^`]+)`", line):
                if not re.fullmatch(r"[\w.]+", quote):
                    out.append((number, quote))
    return out


PLACEHOLDER = re.compile(r"\[\.\.\.\]|\.\.\.|\b[A-Z]\b")


def quote_fragments(quote: str) -> List[str]:
    """The fixed words of a quoted message, in order: the text between ``...``, ``[...]`` and
    one-letter placeholders, less a leading ``SomeError:`` (Python prints the class name)."""
    quote = re.sub(r"^\w+(?:Error|Exception|Warning):\s*", "", quote)
    frags = [f.strip(" ,;:") for f in PLACEHOLDER.split(quote)]
    return [f for f in frags if len(re.sub(r"\W", "", f)) >= 2]


def fragments_in(fragments: List[str], parts: List[str]) -> bool:
    """True when every fragment lies inside one fixed part, in order (an f-string's value may
    stand between two fragments, not inside one)."""
    text = "\x00".join(parts)
    pos = 0
    for frag in fragments:
        found = text.find(frag, pos)
        if found < 0:
            return False
        pos = found + len(frag)
    return True


def unmatched_headings(page_text: str, literals: List[Tuple[str, List[str]]]) -> List[str]:
    """'line: `quote`' for each heading quote that no message literal (and no entry of
    :data:`EXTERNAL_MESSAGES`) contains."""
    bad = []
    for number, quote in heading_quotes(page_text):
        if quote in EXTERNAL_MESSAGES:
            continue
        frags = quote_fragments(quote)
        if not frags or not any(fragments_in(frags, parts) for _, parts in literals):
            bad.append(f"line {number}: `{quote}` (fixed words {frags})")
    return bad


# --- option lists of the factory docstrings ---------------------------------------------------

#: Options a codec still takes under an old name, with a FutureWarning: (codec, option) -> a value
#: that passes the constructor's checks (tests/test_docs_text.py checks that each one warns).
DEPRECATED_OPTIONS = {("onebit", "ramp_steps"): 1}
#: Constructor options the factories set themselves.
SET_BY_FACTORY = {"impl", "rank_stream"}
CODEC_FACTORIES = ("onebit", "terngrad", "qsgd", "dgc")
OPTION_LIST = re.compile(r"[Oo]ptions?\s*(?:\(([^()]*)\)|:([^.]*)\.)")


def factory_doc(name: str) -> str:
    import horovod_gradcomp as hgc
    return inspect.getdoc(getattr(hgc.Compression, name)) or ""


def undocumented_codec_options(name: str, doc: Optional[str] = None) -> List[str]:
    """The options of codec ``name``'s constructor that ``Compression.<name>``'s docstring does
    not name in double backticks (deprecated ones and those the factory sets need not be)."""
    from horovod_gradcomp.codecs.registry import codec_class
    doc = factory_doc(name) if doc is None else doc
    named = set(re.findall(r"``(\w+)", doc))
    params = inspect.signature(codec_class(name)).parameters
    return [p for p in params if p not in SET_BY_FACTORY and (name, p) not in DEPRECATED_OPTIONS and p not in named]


def option_lists(doc: str) -> Iterator[str]:
    """The option lists of a docstring (the text in the parentheses or after the colon)."""
    flat = " ".join(doc.split())
    for m in OPTION_LIST.finditer(flat):
        body = m.group(1) if m.group(1) is not None else m.group(2)
        if ":meth:" not in body and ":class:" not in body:
            yield body


def bad_listed_options(name: str, doc: Optional[str] = None) -> List[str]:
    """Problems of ``Compression.<name>``'s option lists: a list with no ``name`` in it, a
    name the factory does not take, a deprecated option not said to be deprecated."""
    import horovod_gradcomp as hgc
    import docs_options as opts
    doc = factory_doc(name) if doc is None else doc
    codec = name if name in hgc.available_codecs() else None
    bad = []
    for body in option_lists(doc):
        names = re.findall(r"``(\w+)``", body)
        if not names:
            bad.append(f"option list {body.strip()!r} names no option in ``double backticks``")
        for option in names:
            quote = opts.Quote(f"Compression.{name}", f"Compression.{name}", codec, option, ..., False)
            if not opts.lookup(quote)[0]:
                bad.append(f"``{option}`` is listed as an option but Compression.{name} does not take it")
            elif (codec, option) in DEPRECATED_OPTIONS and "deprecated" not in body:
                bad.append(f"``{option}`` is deprecated but listed as a current option")
    return bad


def all_factory_docstring_problems() -> Dict[str, List[str]]:
    out = {}
    for name in ("none", "fp16", "codec") + CODEC_FACTORIES:
        problems = bad_listed_options(name)
        if name in CODEC_FACTORIES:
            problems += [f"codec option ``{o}`` is not named" for o in undocumented_codec_options(name)]
        if problems:
            out[name] = problems
    return out
