"""Optimizer-aware codec defaults: per codec, one table per optimizer family, applied once the
wrapped optimizer is known.

Adam and its relatives divide each coordinate's step by a running estimate of that
coordinate's gradient magnitude. A codec whose payload changes that magnitude (TernGrad's
ternary values have second moment ``s*|g|``; DGC delivers a coordinate's accumulation as one
large value) shrinks Adam's steps; the SGD defaults that suit plain SGD lose 16-60% of
test loss under Adam on the char model (docs/results/adam_table.md). Each codec class lists,
in ``Codec.adam_defaults``, the options that replace its constructor defaults under the Adam
family (TernGrad a clip, DGC a larger density, onebit a dense warm-up), and in
``Codec.sgd_defaults`` those that replace them under ``torch.optim.SGD`` (measured:
docs/results/defaults_check.md). :data:`FAMILIES` is the one table of families; every rule
below holds for each of them alike.

Rules:

* The Adam family is :data:`ADAM_FAMILY` (Adam, AdamW, NAdam, RAdam, Adamax: every optimizer
  here that divides by a per-coordinate moment estimate). Only Adam and AdamW were measured.
  The SGD family is ``torch.optim.SGD`` and its subclasses. Any other optimizer (Adagrad,
  RMSprop, ...) keeps the constructor defaults.
* An option the user passed explicitly is never replaced (``CodecCompression.explicit_options``).
* Where the optimizer is learnt: under Horovod from the ``DistributedOptimizer`` calling
  ``compress``, before the first gradient is encoded (every rank runs the same optimizer
  class). An ``optimizer=`` argument to the factories (and so to ``hgc.ddp.register``, whose
  options the Lightning / Accelerate strategies pass on) applies them at construction. Without
  it, the DDP hook learns the optimizer at its first ``step()`` (:class:`AdamDefaultsGuard`):
  the family's defaults then hold from the second step on, and the log line says so.
* What was taken is logged once (one line) and saved in the compression's checkpoint, which
  applies it again on load. After a load nothing more is taken, so a run resumes with the
  options it ran with (also one written before these defaults existed).
"""
from __future__ import annotations

import inspect
import logging
import weakref
from typing import Dict, Iterable, Optional, Tuple

import torch

from .optimizer_check import watch_optimizer_steps

#: The optimizers served by the codecs' ``adam_defaults`` (subclasses included: Horovod's
#: ``DistributedOptimizer`` is a subclass of the optimizer it wraps).
ADAM_FAMILY = (torch.optim.Adam, torch.optim.AdamW, torch.optim.NAdam, torch.optim.RAdam, torch.optim.Adamax)

#: The optimizer families that have codec defaults of their own, in the order they are tried:
#: (the family's name in messages, its optimizer classes, the codec class attribute holding the
#: options that family takes). An optimizer in none of them keeps the constructor defaults.
FAMILIES = (("Adam", ADAM_FAMILY, "adam_defaults"),
            ("SGD", (torch.optim.SGD,), "sgd_defaults"))

_log = logging.getLogger("horovod_gradcomp")


def is_adam_family(optimizer) -> bool:
    """True when ``optimizer`` is (a subclass of) one of :data:`ADAM_FAMILY`."""
    return isinstance(optimizer, ADAM_FAMILY)


def optimizer_family(optimizer) -> Optional[Tuple[str, str]]:
    """``(family name, codec attribute)`` of the first of :data:`FAMILIES` that ``optimizer`` is
    an instance of; None for None and for an optimizer in none of them."""
    if optimizer is None:
        return None
    for name, classes, attribute in FAMILIES:
        if isinstance(optimizer, classes):
            return name, attribute
    return None


def family_defaults(codec, attribute: str) -> Dict[str, object]:
    """The options ``codec``'s class lists under ``attribute`` (``adam_defaults``, ``sgd_defaults``)."""
    return dict(getattr(type(codec), attribute, {}))


def pending_defaults(compression, attribute: str) -> Dict[str, object]:
    """The codec's defaults for one family (its class attribute ``attribute``) that the user did
    not pass and that are not in force yet; none after a checkpoint was loaded (it resumes with
    the options it ran with)."""
    if compression.options_from_checkpoint:
        return {}
    codec = compression.codec
    return {k: v for k, v in family_defaults(codec, attribute).items()
            if k not in compression.explicit_options and getattr(codec, k, None) != v}


def pending_adam_defaults(compression) -> Dict[str, object]:
    """:func:`pending_defaults` of the Adam family."""
    return pending_defaults(compression, "adam_defaults")


def apply_optimizer_defaults(compression, optimizer: Optional[object], when: str = "") -> Dict[str, object]:
    """When ``optimizer`` belongs to one of :data:`FAMILIES`, set that family's codec defaults
    that the user did not pass on ``compression`` (recorded in ``compression.adapted_options``,
    logged once, with ``when`` appended) and return them; ``{}`` (nothing changed) for any other
    optimizer, for None, and for a codec without defaults for that family."""
    family = optimizer_family(optimizer)
    if family is None:
        return {}
    name, attribute = family
    taken = pending_defaults(compression, attribute)
    if taken:
        compression.set_options(taken)
        _log.warning("Compression.%s: the optimizer is %s (%s family): took the %s defaults %s%s (pass them "
                     "explicitly to override; docs/guide/adam.md)", compression.codec.name,
                     _class_name(optimizer, name), name, name, ", ".join(f"{k}={v}" for k, v in taken.items()),
                     f" {when}" if when else "")
    return taken


def constructor_defaults(codec, names: Iterable[str]) -> Dict[str, object]:
    """The defaults of ``type(codec).__init__`` for ``names`` (the values an option has when
    neither the user nor an optimizer family set it). ValueError naming an option the
    constructor does not take (nothing to go back to)."""
    params = inspect.signature(type(codec).__init__).parameters
    missing = [n for n in names if n not in params or params[n].default is inspect.Parameter.empty]
    if missing:
        raise ValueError(f"{type(codec).__name__}: no constructor default for {missing}")
    return {n: params[n].default for n in names}


def unrecorded_defaults(compression, recorded: Iterable[str]) -> Dict[str, object]:
    """For a checkpoint whose adapted options are ``recorded``: the options this compression took
    from a family table that the checkpoint's run did not take (written before that default
    existed, or with no optimizer known), mapped to the constructor defaults that run had, so that
    it resumes with the options it ran with; an option the user passed is never among them."""
    recorded = set(recorded)
    names = [k for k in compression.adapted_options if k not in recorded and k not in compression.explicit_options]
    return constructor_defaults(compression.codec, names)


#: The name the adapters call (the Adam family was the first with defaults of its own).
apply_adam_defaults = apply_optimizer_defaults


def _class_name(optimizer, family: str) -> str:
    """The optimizer's class as the user wrote it: the first class of the family in its MRO
    (Horovod's DistributedOptimizer is a subclass named after no optimizer)."""
    classes = next(c for n, c, _ in FAMILIES if n == family)
    for cls in type(optimizer).__mro__:
        if cls in classes:
            return cls.__name__
    return type(optimizer).__name__


class AdamDefaultsGuard:
    """For an exchange that never sees the optimizer (the DDP hook, and through it the Lightning
    and Accelerate strategies) and was given no ``optimizer=``: before the first ``step()`` of an
    optimizer holding one of ``params``, :func:`apply_optimizer_defaults` with it. The gradients
    of that first step were already exchanged with the constructor defaults; the family's
    defaults hold from the next step on (every rank at the same step: DDP's backward has returned, its exchange is
    idle). Pass ``optimizer=`` to have them from the first step."""

    def __init__(self, compression, params: Iterable[torch.Tensor]):
        self._ids = {id(p) for p in params}
        self._done = False
        self._compression = weakref.ref(compression)   # the global hook must not keep it alive
        self._handle = watch_optimizer_steps(self)

    def check(self, optimizer) -> None:
        """Act once, at the first step of an optimizer holding the compressed parameters."""
        compression = self._compression()
        if (compression is None or self._done
                or not any(id(p) in self._ids for g in optimizer.param_groups for p in g["params"])):
            return
        self._done = True
        apply_optimizer_defaults(compression, optimizer, when=f"from step {compression.state.step} on (the first step "
                            "used the plain defaults: pass optimizer= to have them from the first step)")
