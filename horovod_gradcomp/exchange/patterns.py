"""The exchange patterns by name: where the engine finds a bucket's pattern.

:data:`PATTERNS` maps each name the engine may choose (:meth:`StepEngine.choose_pattern
<horovod_gradcomp.exchange.engine.StepEngine.choose_pattern>`) to the factory of its pattern
object; :func:`build_patterns` makes one engine's objects, in the mapping's order (the
hierarchical pattern exchanges between nodes through the flat ones made before it). A factory
returns None where the pattern does not fit the codec and memory.

Every pattern object has the same face: ``steps(comm, bucket, stats, totals, overlap)``, the
exchange as a request sequence (:mod:`.requests`), which any driver runs; ``memory_keys(names,
rank)``, what a bucket may change in the memory (the engine's snapshot of a step that may be
skipped). A new pattern: its module, and one line here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional

import torch

from ..codecs.base import Codec
from .allgather import AllgatherPattern
from .dense import DensePattern
from .hierarchical import HierarchicalPattern
from .two_phase import TwoPhasePattern


@dataclass
class PatternSettings:
    """What the factories take: the codec, the memory, ``chunk_bytes`` (pipelined chunks, None:
    none), ``inner_pattern`` (the hierarchical pattern's), ``choose`` (the flat ``"auto"`` rule,
    ``choose(grads, k)`` -> name) and ``built`` (the objects made so far, name -> object)."""
    codec: Codec
    memory: object
    chunk_bytes: Optional[int]
    inner_pattern: str
    choose: Callable[[Mapping[str, torch.Tensor], int], str]
    built: Dict[str, object]


def two_phase_fits(codec: Codec, memory) -> bool:
    """The two-phase pattern needs fixed-size payloads and error feedback (the owners' residuals)."""
    return not codec.variable_size and memory.supports_owner_stripes


#: name -> factory(settings) -> pattern object or None (does not fit); built in this order.
PATTERNS: Dict[str, Callable[[PatternSettings], Optional[object]]] = {
    "allgather": lambda s: AllgatherPattern(s.codec, s.chunk_bytes),
    "dense": lambda s: DensePattern(),   # a codec's warm-up steps (warmup_steps)
    "two_phase": lambda s: (TwoPhasePattern(s.codec, chunk_bytes=s.chunk_bytes)
                            if two_phase_fits(s.codec, s.memory) else None),
    "hierarchical": lambda s: HierarchicalPattern(s.codec, s.built, s.choose, s.inner_pattern),
}

#: The names a caller may pass as ``pattern=``: the registered ones but the warm-up's ``"dense"``
#: (the engine's own choice), and ``"auto"`` (the engine chooses per bucket).
CHOOSABLE = tuple(name for name in PATTERNS if name != "dense") + ("auto",)


def build_patterns(codec: Codec, memory, chunk_bytes: Optional[int], inner_pattern: str,
                   choose: Callable[[Mapping[str, torch.Tensor], int], str]) -> Dict[str, object]:
    """One engine's pattern objects, name -> object, for the patterns of :data:`PATTERNS` that fit."""
    built: Dict[str, object] = {}
    settings = PatternSettings(codec, memory, chunk_bytes, inner_pattern, choose, built)
    for name, factory in PATTERNS.items():
        made = factory(settings)
        if made is not None:
            built[name] = made
    return built


__all__ = ["CHOOSABLE", "PATTERNS", "PatternSettings", "build_patterns", "two_phase_fits"]
