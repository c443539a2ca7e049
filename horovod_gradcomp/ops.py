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

from .dtype_codes import CODE_DTYPES, DTYPE_CODES, as_dtype  # noqa: F401 - (a dtype list travels as codes; re-exported)

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


def _bind_arguments(fname: str, visible, pos, kw) -> dict:
    """{name: value} of a call ``fname(*pos, **kw)`` to a function taking ``visible`` in order;
    a TypeError for too many, unknown or repeated arguments."""
    if len(pos) > len(visible):
        raise TypeError(f"{fname}() takes {len(visible)} arguments, got {len(pos)}")
    bound = dict(zip(visible, pos))
    for key, value in kw.items():
        if key in bound or key not in visible:
            raise TypeError(f"{fname}() got an unexpected or repeated argument {key!r}")
        bound[key] = value
    return bound


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
        bound = _bind_arguments(op.__name__, visible, pos, kw)
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


def _out_argument(op) -> str:
    """The name of the argument that ``op`` (a ``_into`` op) writes into."""
    return next(a.name for a in op.default._schema.arguments if a.alias_info is not None and a.alias_info.is_write)


def _fill_outs(outs, n, dtypes):
    """``outs`` with each ``None`` replaced by a new tensor of its n and dtype, on the device of
    the given ones (a bucket is on one device; the kernel overwrites every out)."""
    device = next(o.device for o in outs if o is not None)
    return [torch.empty(int(m), dtype=as_dtype(d), device=device) if o is None else o
            for o, m, d in zip(outs, n, dtypes)]


def _fresh_or_into(fresh, into, into_op):
    """``name(..., out=None)`` as the codecs call a decode: without an out (or with ``None`` for
    every one of ``outs``) the op ``name``, which returns a fresh result; else ``name_into``
    with it (``None`` entries of ``outs`` get new tensors), returning the out(s)."""
    args = into_op.default._schema.arguments
    visible = [a.name for a in args if not a.name.endswith("_counts")]
    out_name = _out_argument(into_op)

    def call(*pos, **kw):
        bound = _bind_arguments(fresh.__name__, visible, pos, kw)
        out = bound.pop(out_name, None)
        if isinstance(out, (list, tuple)):
            if all(o is None for o in out):
                return fresh(**bound)
            out = _fill_outs(out, bound["n"], bound["dtypes"])
        elif out is None:
            return fresh(**bound)
        into(**bound, **{out_name: out})
        return out

    call.__name__ = call.__qualname__ = fresh.__name__
    call.__doc__ = (f"{fresh.__doc__ or fresh.__name__}; with {out_name}=...: "
                    f"{into_op.default._schema} (the out(s) returned)")
    call.packet = getattr(fresh, "packet", fresh)
    return call


def bind(module, namespace: str) -> None:
    """Put each op of ``module`` (its ``ops`` attribute: the ops it registered under
    ``torch.ops.<namespace>``) on ``module`` under :func:`python_name`, and register the
    fake kernels of those ops. A decode with a ``<name>_into`` op is bound as
    ``name(..., out=None)``, which calls one or the other (csrc/ops/schemas.h)."""
    from . import ops_fake

    ns = getattr(torch.ops, namespace)
    names = set(module.ops)
    for name in module.ops:
        caller = _caller(getattr(ns, name))
        if name + "_into" in names:
            into_op = getattr(ns, name + "_into")
            caller = _fresh_or_into(caller, _caller(into_op), into_op)
        setattr(module, python_name(name), caller)
    ops_fake.register(namespace, list(module.ops))
