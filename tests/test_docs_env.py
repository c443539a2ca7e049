"""docs/guide/environment.md lists every environment variable the package reads, and no other.

The code side is read from the source (no import): every ``os.environ.get(X)``,
``os.environ[X]``, ``os.getenv(X)``, ``X in os.environ``, ``os.environ.setdefault(X, ...)`` and
every call of a package function that reads the variable its first parameter names (such as
``flag_from_env(X)``), where ``X`` is a string, a module-level constant (a string or a tuple of
strings, of this module or imported from another of the package) or a loop variable over such
a tuple. A read whose name cannot be resolved fails the test, so a new way of reading the
environment cannot slip past it.
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import Dict, List, Set, Tuple

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "horovod_gradcomp"
PAGE = ROOT / "docs" / "guide" / "environment.md"


@functools.lru_cache(maxsize=None)
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


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


def _module_consts(tree: ast.Module) -> Dict[str, Tuple[str, ...]]:
    """Module-level ``NAME = "X"`` / ``NAME = ("X", "Y")``."""
    consts: Dict[str, Tuple[str, ...]] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            val = _strings(stmt.value, consts)
            for target in stmt.targets:
                if isinstance(target, ast.Name) and val is not None:
                    consts[target.id] = val
    return consts


def _imported_consts(tree: ast.Module, path: Path, root: Path) -> Dict[str, Tuple[str, ...]]:
    """Constants this module imports from another module of the package (``from .env import X``)."""
    out: Dict[str, Tuple[str, ...]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
            parts = node.module.split(".") if node.module else []
        elif node.module and node.module.split(".")[0] == PACKAGE.name:
            base, parts = root, node.module.split(".")
        else:
            continue
        source = base.joinpath(*parts).with_suffix(".py") if parts else base / "__init__.py"
        if not source.is_file():
            source = base.joinpath(*parts, "__init__.py")
        if source.is_file():
            consts = _module_consts(_parse(source))
            for alias in node.names:
                if alias.name in consts:
                    out[alias.asname or alias.name] = consts[alias.name]
    return out


def _env_key(node: ast.AST):
    """The key expression of an environment read ``node``, or None when it is no such read."""
    if isinstance(node, ast.Call):
        f = node.func
        env_method = isinstance(f, ast.Attribute) and _is_environ(f.value) and f.attr in ("get", "setdefault", "pop")
        getenv = isinstance(f, ast.Attribute) and f.attr == "getenv"
        if env_method or getenv:
            return node.args[0] if node.args else node
    elif isinstance(node, ast.Subscript) and _is_environ(node.value):
        return node.slice
    elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
        return node.left
    return None


def reader_functions(tree: ast.Module) -> Set[str]:
    """Functions that read the variable their first parameter names (``flag_from_env(name)``)."""
    out = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.args.args:
            first = fn.args.args[0].arg
            if any(isinstance(_env_key(n), ast.Name) and _env_key(n).id == first for n in ast.walk(fn)):
                out.add(fn.name)
    return out


def package_readers() -> Set[str]:
    return {name for path in PACKAGE.rglob("*.py") for name in reader_functions(_parse(path))}


def reads_in(path: Path, root: Path = ROOT, readers: Set[str] = frozenset()) -> Tuple[Set[str], List[str]]:
    """(variable names read in ``path``, reads that could not be resolved as 'file:line'). A
    call of one of ``readers`` (or of this file's own) is a read of its first argument."""
    tree = _parse(path)
    readers = set(readers) | reader_functions(tree)
    consts = {**_imported_consts(tree, path, root), **_module_consts(tree)}
    for node in ast.walk(tree):   # loop variables over such tuples
        loops = [node] if isinstance(node, ast.For) else getattr(node, "generators", [])
        for loop in loops:
            if isinstance(loop.target, ast.Name):
                val = _strings(loop.iter, consts)
                if val is not None:
                    consts.setdefault(loop.target.id, val)
    # inside a reader, the read keyed by its own parameter is its caller's read
    skip = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name in readers:
            first = fn.args.args[0].arg
            skip |= {id(n) for n in ast.walk(fn) if isinstance(_env_key(n), ast.Name) and _env_key(n).id == first}
    found: Set[str] = set()
    unresolved: List[str] = []
    for node in ast.walk(tree):
        key = _env_key(node) if id(node) not in skip else None
        if key is None and isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in readers:
                key = node.args[0] if node.args else node
        if key is None:
            continue
        val = _strings(key, consts)
        if val is None:
            unresolved.append(f"{path.relative_to(root)}:{node.lineno}")
        else:
            found.update(val)
    return found, unresolved


@functools.lru_cache(maxsize=None)
def code_variables() -> Tuple[Dict[str, List[str]], List[str]]:
    """{variable: [files that read it]}, [unresolved reads]."""
    out: Dict[str, List[str]] = {}
    unresolved: List[str] = []
    readers = package_readers()
    for path in sorted(PACKAGE.rglob("*.py")):
        names, bad = reads_in(path, ROOT, readers)
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
    """A string, a constant (local or imported), a loop over a tuple, a subscript, ``in``, a
    package reader and a reader defined in the file; an unresolvable name is reported."""
    (tmp_path / "consts.py").write_text("IMPORTED = 'VAR_IMPORTED'\n", encoding="utf-8")
    src = tmp_path / "m.py"
    src.write_text(
        "import os\nfrom .consts import IMPORTED\nA = 'VAR_A'\nB = ('VAR_B1', 'VAR_B2')\n"
        "def int_from_env(name):\n    return int(os.environ.get(name, '0'))\n"
        "os.environ.get('VAR_S')\nos.environ.get(A, '1')\nany(os.environ.get(v) for v in B)\n"
        "os.environ['VAR_SUB']\n'VAR_IN' in os.environ\nos.getenv('VAR_GETENV')\n"
        "seconds_from_env('VAR_SEC', 'off')\nflag_from_env(IMPORTED)\nint_from_env('VAR_OWN')\n"
        "os.environ.get(name)\n", encoding="utf-8")
    found, unresolved = reads_in(src, tmp_path, {"seconds_from_env", "flag_from_env"})
    assert found == {"VAR_A", "VAR_B1", "VAR_B2", "VAR_S", "VAR_SUB", "VAR_IN", "VAR_GETENV", "VAR_SEC",
                     "VAR_IMPORTED", "VAR_OWN"}
    assert unresolved == ["m.py:16"]


def test_the_package_readers_are_found():
    assert {"seconds_from_env", "flag_from_env"} <= package_readers()
