"""The native ops as PyTorch custom ops: ``torch.ops.hgc.*`` (``_C``: CPU kernels, and CUDA
kernels when built with them) and ``torch.ops.hgc_twin.*`` (``_C_twin``: the device sources on
CPU tensors). Each op has one schema (csrc/ops/schemas.h), kernels registered per dispatch key,
and a fake kernel (:mod:`horovod_gradcomp.ops_fake`) so that ``torch.compile`` can trace it.

:func:`bind` puts every op of a module on the module under its Python name (``_C.onebit_encode``
calls ``torch.ops.hgc.onebit_encode``), with the call conventions the codecs use: dtype lists
as torch dtypes, per-tensor payload lists nested (the schemas take them flattened, with their
lengths in ``<name>_counts``), and ``_`` at the end of the ops that work in place.
"""
from __future__ import annotations

import torch

from .dtype_codes import CODE_DTYPES, DTYPE_CODES  # noqa: F401 - (a dtype list travels as codes; re-exported)

# Ops that work in place: their Python names end in "_" (the schemas' names do not).
IN_PLACE = ("dgc_accumulate", "dgc_accumulate_many", "dgc_mask_many")


def dtype_code(dtype) -> int:
    """The ScalarType code of ``dtype`` (a TypeError naming it when it is not a torch dtype)."""
    try:
        return DTYPE_CODES[dtype]
    except (KeyError, TypeError):
        raise TypeError(f"expected a torch dtype, got {dtype!r}") from None


def python_name(op_name: str) -> str:
    """The name under which the op ``op_name`` is bound on its module."""
    return op_name + "_" if op_name in IN_PLACE else op_name


def _caller(op):
    """``op`` itself when its schema takes what callers pass; else a function taking the
    nested payload lists and dtype lists and passing them as the schema wants."""
    args = op.default._schema.arguments
    names = [a.name for a in args]
    nested = {n[: -len("_counts")] for n in names if n.endswith("_counts")}
    if not nested and "dtypes" not in names:
        return op
    visible = [n for n in names if not n.endswith("_counts")]

    def call(*pos, **kw):
        if len(pos) > len(visible):
            raise TypeError(f"{op.__name__}() takes {len(visible)} arguments, got {len(pos)}")
        bound = dict(zip(visible, pos))
        for key, value in kw.items():
            if key in bound or key not in visible:
                raise TypeError(f"{op.__name__}() got an unexpected or repeated argument {key!r}")
            bound[key] = value
        for name in nested:
            if name in bound:
                lists = [list(x) for x in bound[name]]
                bound[name] = [t for x in lists for t in x]
                bound[name + "_counts"] = [len(x) for x in lists]
        if "dtypes" in bound:
            bound["dtypes"] = [dtype_code(d) for d in bound["dtypes"]]
        return op(**bound)

    call.__name__ = call.__qualname__ = op.__name__
    call.__doc__ = f"{op.default._schema} (nested payload lists and torch dtypes accepted)"
    call.packet = op  # the torch.ops packet it calls
    return call


def bind(module, namespace: str) -> None:
    """Put each op of ``module`` (its ``ops`` attribute: the ops it registered under
    ``torch.ops.<namespace>``) on ``module`` under :func:`python_name`, and register the
    fake kernels of those ops."""
    from . import ops_fake

    ns = getattr(torch.ops, namespace)
    for name in module.ops:
        setattr(module, python_name(name), _caller(getattr(ns, name)))
    ops_fake.register(namespace, list(module.ops))
