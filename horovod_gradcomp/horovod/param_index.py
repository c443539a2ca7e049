"""Find which named parameter a gradient tensor belongs to.

Horovod hands ``compress`` the tensor ``p.grad`` and nothing else. The index answers
``name_of(tensor)`` by identity (``p.grad is tensor``), trying first the parameter that
followed the previous one in the last step (hooks fire in a steady order), then all.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Tuple

import torch


class ParamIndex:
    def __init__(self, named_parameters: Iterable[Tuple[str, torch.nn.Parameter]], owner: str):
        named = list(named_parameters)
        if not named:
            raise ValueError(f"{owner}: named_parameters is empty; pass model.named_parameters()")
        if any(not (isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str)) for x in named):
            raise TypeError(f"{owner}: named_parameters must be (name, parameter) pairs, as model.named_parameters() gives")
        names = [n for n, _ in named]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise ValueError(f"{owner}: duplicate parameter names {dups}")
        self.owner = owner
        self.names: List[str] = names
        self.params: List[torch.Tensor] = [p for _, p in named]
        # Exchange order: sorted names, the same on every rank whatever the hook order.
        self.order: Dict[str, int] = {n: i for i, n in enumerate(sorted(names))}
        self._successor: Dict[int, int] = {}
        self._last = -1

    def name_of(self, tensor: torch.Tensor) -> str:
        guess = self._successor.get(self._last)
        if guess is not None and self.params[guess].grad is tensor:
            i = guess
        else:
            i = next((j for j, p in enumerate(self.params) if p.grad is tensor), None)
            if i is None:
                if any(p.grad is not None and p.grad.is_sparse and p.shape == tensor.shape for p in self.params):
                    raise LookupError(f"{self.owner}: sparse gradients are not supported, sparse_as_dense=True "
                                      "included (the dense copy is not any parameter's .grad); use dense "
                                      "embeddings (sparse=False)")
                raise LookupError(
                    f"{self.owner}: compress() received a tensor that is not the .grad of any parameter given to it "
                    f"(shape {tuple(tensor.shape)}). Pass the same model.named_parameters() to the compression and to "
                    "hvd.DistributedOptimizer; sparse gradients (sparse_as_dense=True) are not supported.")
            self._successor[self._last] = i
        self._last = i
        return self.names[i]

    def end_step(self) -> None:
        """Forget the position in the hook order (called after each exchange)."""
        self._last = -1
