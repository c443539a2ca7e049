"""No module of horovod_gradcomp reaches into another's private names.

A private name (one leading underscore, not a dunder) belongs to the module or class that
defines it. This scan reads every .py file of the package with ``ast`` and fails on

* ``from <module> import _name``: a private name of another module;
* ``obj._attr`` where ``obj`` is not ``self``, ``cls`` or ``super()``, nor the name of a class
  whose own body holds the expression (the class's own attribute, as ``cls`` would read it).

Third-party objects whose private members are the only way to do something are allowed by
:data:`ALLOWED`, one entry per file and member, each saying why.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "horovod_gradcomp"

#: (file relative to the package, private member) -> why reading it there is unavoidable.
ALLOWED: Dict[Tuple[str, str], str] = {
    # the native extension's compiled modules are named _C and _C_twin; native.py is their one importer
    ("native.py", "_C"): "the compiled extension module itself",
    ("native.py", "_C_twin"): "the compiled twin extension module itself",
    # Python's own: os._exit and sys._getframe are documented, public functions despite the underscore
    ("ddp/stall.py", "_exit"): "os._exit: end the process at once from the stall watchdog's thread",
    ("hvd_adapter/options_check.py", "_getframe"): "sys._getframe: the caller's frame for a warning's location",
    # torch: no public API for these
    ("ddp/hook.py", "_execution_engine"): "torch.autograd.Variable._execution_engine.queue_callback: run after "
                                          "DDP's end-of-backward callback",
    ("ddp/hook.py", "_values"): "a sparse COO tensor's values without coalescing (.values() requires coalesced)",
    ("ddp/sparse_exchange.py", "_nnz"): "a sparse tensor's nonzero count (no public accessor)",
    ("ddp/gloo_exit.py", "_forward_hooks"): "nn.Module's registered forward hooks, to find the one held here",
    ("ops.py", "_schema"): "an OpOverload's schema (what the registration check compares)",
    ("fsdp/register.py", "_get_fsdp_state"): "FSDP2's per-module state (its parameter group)",
    ("fsdp/register.py", "_fsdp_param_group"): "FSDP2's parameter group, where the reduce-scatter is swapped",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own(node: ast.expr, classes: Set[str]) -> bool:
    """True when ``node`` is this object or class: ``self``, ``cls``, ``super()`` or an enclosing class's name."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls") or node.id in classes
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def private_accesses(source: str, relative: str) -> List[str]:
    """Every private access of another module or object in ``source`` (the file ``relative`` to
    the package), as ``"<file>:<line>: <code>"``, less the :data:`ALLOWED` ones."""
    found: List[str] = []

    def visit(node: ast.AST, classes: Set[str]) -> None:
        if isinstance(node, ast.ClassDef):
            classes = classes | {node.name}
        name: Optional[str] = None
        if isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names if _private(a.name)]
            name = names[0] if names else None
        elif isinstance(node, ast.Attribute) and _private(node.attr) and not _own(node.value, classes):
            name = node.attr
        if name is not None and (relative, name) not in ALLOWED:
            found.append(f"{relative}:{node.lineno}: {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, classes)

    visit(ast.parse(source, relative), set())
    return found


def test_no_private_access_across_modules():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += private_accesses(path.read_text(encoding="utf-8"), path.relative_to(PACKAGE).as_posix())
    assert not found, ("private names read outside the module or object that owns them; give them a public "
                       "name, or (third-party internals only) an ALLOWED entry saying why:\n" + "\n".join(found))


def test_every_allowed_entry_is_used():
    """An allowlist entry whose access is gone must go too (the list stays short and true)."""
    for (relative, name), why in ALLOWED.items():
        assert why, f"{relative} {name}: say why it is allowed"
        source = (PACKAGE / relative).read_text(encoding="utf-8")
        tree = ast.parse(source)
        used = any(isinstance(n, ast.Attribute) and n.attr == name for n in ast.walk(tree)) or any(
            isinstance(n, ast.ImportFrom) and any(a.name == name for a in n.names) for n in ast.walk(tree))
        assert used, f"ALLOWED lists {relative} {name}, which that file no longer reads"


@pytest.mark.parametrize("code, bad", [
    ("from .engine import _threads_allowed\n", True),
    ("from .engine import StepEngine\n", False),
    ("def f(engine):\n    return engine._patterns\n", True),
    ("def f(self):\n    return self._patterns\n", False),
    ("class A:\n    @classmethod\n    def f(cls):\n        return cls._n\n", False),
    ("class A:\n    _n = 0\n    def f(self):\n        return A._n\n", False),
    ("class A:\n    def f(self):\n        return B._n\n", True),
    ("class A(B):\n    def f(self):\n        return super()._f()\n", False),
    ("def f(x):\n    return x.__class__\n", False),
])
def test_the_scan_finds_what_it_should(code, bad):
    assert bool(private_accesses(code, "exchange/example.py")) is bad
