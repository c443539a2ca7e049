"""Compressed-momentum Adam in the manner of 1-bit Adam (Tang et al., 2021) and 0/1 Adam:
an optimizer that does its own exchange.

Adam's second moment v changes slowly once training has settled, and its first moment m is
a smoothed gradient, which a sign quantizer with error feedback carries well. So, for a
parameter with gradient g_k on rank k, K ranks, step t (from 1):

* warm-up, t <= W (``warmup_steps``): the exact mean g = (1/K) sum_k g_k is exchanged at full
  precision and the step is torch's Adam (or AdamW): m <- b1 m + (1-b1) g, v <- b2 v + (1-b2) g^2,
  p <- p - lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps).
* compressed, t > W: v and its bias correction are frozen at their step-W values. Each rank
  forms its own momentum m_k = b1 m + (1-b1) g_k from the shared m of the previous step, and
  the ranks average m_k through the onebit codec with error feedback (the package's onebit
  exchange: a residual per parameter on every rank and, in the two-phase pattern, on each
  stripe's owner): m <- onebit_mean_k(m_k), the same on every rank. Then
  p <- p - lr * (m / (1-b1^t)) / (sqrt(v_W / (1-b2^W)) + eps).

Choices made here (the papers leave them open or differ): torch's bias corrections in the
warm-up (so the warm-up *is* ``torch.optim.Adam`` on averaged gradients), the momentum's bias
correction kept after it (1-b1^t -> 1, harmless) and the variance's frozen with the variance,
so nothing jumps at t = W. Weight decay: Adam's L2 term (``weight_decay * p`` added to each
rank's gradient, before the momentum) or, with ``decoupled=True`` (:class:`OnebitAdamW`),
AdamW's ``p <- p * (1 - lr * weight_decay)``.

Bytes: each step one exchange of the parameters' size, through ``self.compression``
(a :class:`~horovod_gradcomp.hvd_adapter.compression.CodecCompression`, onebit, ``warmup_steps=W``):
its ``stats()`` counts the dense warm-up steps and the 1-bit steps alike.
"""
from __future__ import annotations

from typing import Iterable, Optional, Tuple

import torch

from ..flags import require_flag
from ..hvd_adapter.factories import Compression

_NAMED_HINT = "pass model.named_parameters() (the names key the exchange and its error feedback)"


class OnebitAdam(torch.optim.Optimizer):
    """Adam whose first moment is exchanged 1-bit with error feedback after a dense warm-up
    (see the module doc). It averages the gradients itself: do not wrap it in
    ``hvd.DistributedOptimizer``, and under DDP register ``hgc.ddp.register_local(ddp_model)``
    so that DDP leaves each rank's gradient local.

    Args:
        named_parameters: ``model.named_parameters()`` (the same names on every rank; parameters
            without ``requires_grad`` are left out).
        lr, betas, eps, weight_decay: as ``torch.optim.Adam``.
        warmup_steps: W, the steps of plain Adam on exactly averaged gradients before the
            variance is frozen (>= 1: the variance must come from some steps).
        decoupled: AdamW's weight decay instead of Adam's L2 term.
        scales: onebit's scale groups ("rows" or "columns", as ``hgc.Compression.onebit``).
        communicator: where the exchange runs (None: ``transport``'s rule, as the
            ``hgc.Compression`` factories: mpi4py under mpirun, Horovod's collectives on Gloo;
            a :class:`~horovod_gradcomp.transports.torch_dist.TorchDistributedCommunicator` for DDP).
        transport, process_set, pattern, bucket_bytes, timeout: the exchange's options, as
            :meth:`hgc.Compression.codec <horovod_gradcomp.hvd_adapter.factories.Compression.codec>`.

    Fields: ``compression`` (the exchange, with ``stats()``), ``names`` (name of each parameter),
    ``skipped_steps`` (steps not applied because some rank's gradient was not finite).
    """

    def __init__(self, named_parameters: Iterable[Tuple[str, torch.nn.Parameter]], lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0, *,
                 warmup_steps: int = 100, decoupled: bool = False, scales: str = "rows", communicator=None,
                 transport: str = "auto", process_set=None, pattern: Optional[str] = None,
                 bucket_bytes: Optional[int] = None, timeout: Optional[float] = None):
        owner = type(self).__name__
        if isinstance(named_parameters, torch.Tensor):
            raise TypeError(f"{owner}: got a tensor; {_NAMED_HINT}")
        named = list(named_parameters)
        if named and all(isinstance(x, dict) for x in named):
            raise TypeError(f"{owner}: got parameter groups, not (name, parameter) pairs: {_NAMED_HINT}. "
                            "(hvd.DistributedOptimizer rebuilds its optimizer from groups: {owner} averages the "
                            "gradients itself, do not wrap it in hvd.DistributedOptimizer)".replace("{owner}", owner))
        if not named or not all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in named):
            raise TypeError(f"{owner}: named_parameters must be a non-empty list of (name, parameter) pairs; "
                            f"{_NAMED_HINT}")
        named = [(n, p) for n, p in named if p.requires_grad]
        if not named:
            raise ValueError(f"{owner}: no parameter requires a gradient")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 1:
            raise ValueError(f"{owner}: warmup_steps must be an int >= 1 (the variance is frozen after them), "
                             f"got {warmup_steps!r}")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"{owner}: betas must be in [0, 1), got {betas!r}")
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"{owner}: lr, eps and weight_decay must be >= 0, got {lr}, {eps}, {weight_decay}")
        for n, p in named:
            if p.is_sparse or not p.is_floating_point():
                raise TypeError(f"{owner}: parameter {n!r} is not a dense floating-point tensor")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__([p for _, p in named], defaults)
        self.names = {p: n for n, p in named}
        self.warmup_steps, self.decoupled = warmup_steps, require_flag(owner, "decoupled", decoupled)
        exchange = dict(pattern=pattern, bucket_bytes=bucket_bytes, overlap=False, timeout=timeout)
        if communicator is not None:
            if transport != "auto" or process_set is not None:
                raise ValueError(f"{owner}: pass either communicator= or transport=/process_set=, not both")
            exchange["communicator"] = communicator
        else:
            exchange.update(transport=transport, process_set=process_set)
        self.compression = Compression.codec("onebit", named, warmup_steps=warmup_steps, scales=scales, **exchange)
        self.skipped_steps = 0

    def _check_not_wrapped(self) -> None:
        if hasattr(self, "_handles") and hasattr(self, "synchronize"):
            raise TypeError(f"{type(self).__name__} averages the gradients itself: do not wrap it in "
                            "hvd.DistributedOptimizer (pass it model.named_parameters() and call its step())")

    @torch.no_grad()
    def step(self, closure=None):
        """One step on every rank at once (a collective: every rank must call it). Returns the
        closure's loss, if given."""
        self._check_not_wrapped()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [p for g in self.param_groups for p in g["params"]]
        t = self.compression.state.step + 1   # the exchange's step counter: the same on every rank
        warm = t <= self.warmup_steps
        sent = {}
        for group in self.param_groups:
            b1 = group["betas"][0]
            for p in group["params"]:
                grad = p.grad if p.grad is not None else torch.zeros_like(p)
                if grad.is_sparse:
                    raise TypeError(f"{type(self).__name__}: parameter {self.names[p]!r} has a sparse gradient; "
                                    "use a dense one (nn.Embedding(sparse=False))")
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if warm:
                    sent[self.names[p]] = grad.detach().clone(memory_format=torch.contiguous_format)
                else:
                    if group["weight_decay"] and not self.decoupled:
                        grad = grad.add(p, alpha=group["weight_decay"])
                    # this rank's momentum from the shared one (b1 m + (1-b1) g_k)
                    sent[self.names[p]] = torch.lerp(st["exp_avg"], grad.to(st["exp_avg"].dtype), 1 - b1).contiguous()
        means = self.compression.exchange(sent)
        if not all(bool(torch.isfinite(m).all()) for m in means.values()):
            self.skipped_steps += 1   # every rank sees the same non-finite mean: all skip, state untouched
            return loss
        for group in self.param_groups:
            (b1, b2), lr, eps, wd = group["betas"], group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                st, mean = self.state[p], means[self.names[p]]
                st["step"] = t
                if warm:
                    g = mean.to(p.dtype)
                    if p.grad is not None:
                        p.grad.copy_(g)   # the user reads the averaged gradient, as under Horovod
                    if wd and not self.decoupled:
                        g = g.add(p, alpha=wd)
                    st["exp_avg"].lerp_(g, 1 - b1)
                    st["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
                    st["v_correction"] = 1 - b2 ** t   # frozen at its step-W value after the warm-up
                else:
                    st["exp_avg"].copy_(mean)
                if wd and self.decoupled:
                    p.mul_(1 - lr * wd)
                denom = (st["exp_avg_sq"] / st["v_correction"]).sqrt_().add_(eps)
                p.addcdiv_(st["exp_avg"], denom, value=-lr / (1 - b1 ** t))
        return loss

    # -- checkpoints -----------------------------------------------------------------
    def state_dict(self) -> dict:
        """torch's optimizer state plus this rank's exchange state (``"compression"``: the
        error-feedback residuals differ between ranks: save one per rank)."""
        state = super().state_dict()
        state["compression"] = self.compression.state_dict()
        state["skipped_steps"] = self.skipped_steps
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore :meth:`state_dict` of this same rank (refused for another rank or world size)."""
        state_dict = dict(state_dict)
        if "compression" not in state_dict:
            raise ValueError(f"{type(self).__name__}: this state dict has no 'compression' part; it was not written "
                             f"by {type(self).__name__}.state_dict()")
        self.compression.load_state_dict(state_dict.pop("compression"))
        self.skipped_steps = int(state_dict.pop("skipped_steps", 0))
        super().load_state_dict(state_dict)

    def stats(self) -> dict:
        """The exchange's counters (``self.compression.stats()``)."""
        return self.compression.stats()


class OnebitAdamW(OnebitAdam):
    """:class:`OnebitAdam` with AdamW's decoupled weight decay (default 0.01, as ``torch.optim.AdamW``)."""

    def __init__(self, named_parameters, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, **options):
        if "decoupled" in options:
            raise TypeError("OnebitAdamW: decoupled is always True here (use OnebitAdam for Adam's L2 term)")
        super().__init__(named_parameters, lr, betas, eps, weight_decay, decoupled=True, **options)

