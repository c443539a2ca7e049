"""Find which named parameter a gradient tensor belongs to.

Horovod hands ``compress`` the tensor ``p.grad`` and nothing else. The index answers
``name_of(tensor)`` by identity (``p.grad is tensor``), trying first the parameter that
followed the previous one in the last step (hooks fire in a steady order), then all. The one
tensor that is no parameter's ``.grad`` is the dense copy of a sparse gradient
(``sparse_as_dense=True``): it is named by the parameter of the calling hook.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional, Tuple

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

    def name_of(self, tensor: torch.Tensor, caller: Optional[Callable[[], Optional[torch.Tensor]]] = None) -> str:
        """The name of the parameter whose gradient ``tensor`` is. ``caller()``, asked only when
        ``tensor`` is no parameter's ``.grad``, gives the parameter whose hook is compressing
        (or None): its dense copy of a sparse gradient is accepted. Raises LookupError otherwise."""
        guess = self._successor.get(self._last)
        if guess is not None and self.params[guess].grad is tensor:
            i = guess
        else:
            i = next((j for j, p in enumerate(self.params) if p.grad is tensor), None)
            if i is None:
                i = self._dense_copy_of_sparse(tensor, caller() if caller is not None else None)
            self._successor[self._last] = i
        self._last = i
        return self.names[i]

    def _dense_copy_of_sparse(self, tensor: torch.Tensor, param: Optional[torch.Tensor]) -> int:
        """The index of the parameter whose sparse gradient ``tensor`` is the dense copy of:
        ``param`` when it is one of ours, else the only parameter with a sparse gradient of
        ``tensor``'s shape."""
        def fits(p):
            return p.grad is not None and p.grad.is_sparse and p.shape == tensor.shape
        if param is not None:
            i = next((j for j, p in enumerate(self.params) if p is param), None)
            if i is not None and fits(param):
                return i
        candidates = [j for j, p in enumerate(self.params) if fits(p)]
        if len(candidates) == 1:
            return candidates[0]
        raise LookupError(
            f"{self.owner}: compress() received a tensor that is not the .grad of any parameter given to it "
            f"(shape {tuple(tensor.shape)}){' nor the dense copy of one sparse gradient' if candidates else ''}. "
            "Pass the same model.named_parameters() to the compression and to hvd.DistributedOptimizer.")

    def end_step(self) -> None:
        """Forget the position in the hook order (called after each exchange)."""
        self._last = -1
