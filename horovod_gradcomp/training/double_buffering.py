"""Seide's double buffering with half minibatches (1-bit SGD paper, section 3.2), off by default.

:class:`DoubleBufferedStep` drives a training step itself: gradients come from
``torch.autograd.grad`` (no Horovod hooks: do NOT wrap the optimizer in
``hvd.DistributedOptimizer``), their mean over ranks from ``compression.exchange`` (any
``hgc.Compression``: none, fp16 or a codec), and the result goes into ``p.grad`` for the
plain torch ``optimizer.step()``.

Off (``double_buffering=False``, the default), a call is the ordinary synchronous step:
gradient of the whole minibatch at the current parameters, exchange, update.

On, every minibatch of N samples (per rank) is split into halves of N/2; halves are
numbered h = 0, 1, 2, ... across calls (minibatch t holds halves 2t and 2t+1). With
``w_0`` the initial parameters and ``w_{j+1} = optimizer_step(w_j, G_j)``:

* the gradient of half h is computed at ``w_{max(h-1, 0)}``: the update of half h-1 is
  still being exchanged while half h's forward/backward runs (a delay of exactly N/2
  samples, the same on every rank);
* ``G_h = half_weight * mean over ranks of grad(loss_fn(half h))``, through
  ``compression.exchange`` in a background thread, so it overlaps half h+1's compute;
* ``G_h`` is applied (``p.grad = G_h; optimizer.step()``) right after half h+1's
  gradient is computed and its exchange launched (so the update overlaps that exchange
  too; half h+1's gradient was taken before). A call returns with its second half's
  exchange in flight:
  :meth:`DoubleBufferedStep.flush` waits for it and applies it. After t calls and a flush,
  2t updates have been applied, in half order.

``half_weight`` (default 0.5) makes the two half-updates of a minibatch add up to one
whole-minibatch SGD step at the same learning rate (the per-sample learning rate is kept);
1.0 treats each half as a minibatch of its own. Error-feedback residuals of a codec carry
from half to half.

When to switch it on (the paper's section 3.3, :func:`double_buffering_pays`): with ``c``
the compute (forward + backward) of one whole minibatch, ``e`` one gradient exchange (the
same size for a half as for a whole minibatch) and ``f`` the fixed cost of one update
(writing ``p.grad``, post-processing, ``optimizer.step()``), a minibatch costs
``c + e + f`` off and at best ``max(c + 2f, 2e)`` on: two exchanges and two updates per
minibatch, the exchanges overlapped with the compute and the updates. When compute
dominates it pays only if ``e > f``: once the exchange is cheaper than the per-update fixed
cost (as with 1-bit SGD on a fast network) double buffering costs more than it hides.
When the exchange dominates it pays only if ``e < c + f``. The overlap is ideal only when
compute and exchange do not share the bottleneck resource: on a rank with one core,
encoding and decoding compete with the forward/backward pass, and so does an MPI wait
that spins (give a codec a :class:`~horovod_gradcomp.transports.mpi_polling.PollingCommunicator`)
and Horovod's own background thread (a codec's pipeline needs no ``hvd.init()``).
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from ..flags import require_flag

__all__ = ["DoubleBufferedStep", "double_buffering_pays", "predicted_step_s", "split_halves"]

Minibatch = Union[torch.Tensor, Sequence[torch.Tensor]]


def predicted_step_s(compute_s: float, exchange_s: float, update_s: float) -> Tuple[float, float]:
    """``(off, on)``: the cost model's seconds per minibatch without and with double
    buffering, ``c + e + f`` and ``max(c + 2f, 2e)`` (see the module doc; ``compute_s`` is
    one whole minibatch's forward/backward, ``exchange_s`` one gradient exchange,
    ``update_s`` one update's fixed cost). ``on`` assumes a perfect overlap."""
    for name, v in (("compute_s", compute_s), ("exchange_s", exchange_s), ("update_s", update_s)):
        if not v >= 0:
            raise ValueError(f"{name} must be a non-negative number of seconds, got {v!r}")
    return compute_s + exchange_s + update_s, max(compute_s + 2 * update_s, 2 * exchange_s)


def double_buffering_pays(compute_s: float, exchange_s: float, update_s: float) -> bool:
    """True when the cost model predicts a faster minibatch with double buffering. When
    compute dominates (``compute_s + 2 * update_s >= 2 * exchange_s``) this is
    ``exchange_s > update_s`` (Seide, section 3.3); when the exchange dominates,
    ``exchange_s < compute_s + update_s``."""
    off, on = predicted_step_s(compute_s, exchange_s, update_s)
    return on < off


def split_halves(minibatch: Minibatch) -> Tuple[Tuple[torch.Tensor, ...], Tuple[torch.Tensor, ...]]:
    """A tensor or a tuple/list of tensors sharing their first dimension N (even, >= 2) ->
    two tuples of views: samples ``[0, N/2)`` and ``[N/2, N)`` of every tensor. Raises
    TypeError / ValueError for anything else."""
    parts = _as_parts(minibatch)
    n = parts[0].shape[0]
    if n < 2 or n % 2:
        raise ValueError(f"double buffering splits each minibatch into two equal halves: need an even number of "
                         f"samples >= 2 (per rank), got {n}")
    return tuple(p[: n // 2] for p in parts), tuple(p[n // 2:] for p in parts)


def _as_parts(minibatch: Minibatch) -> Tuple[torch.Tensor, ...]:
    """The minibatch as a non-empty tuple of tensors with one shared first dimension."""
    parts = (minibatch,) if isinstance(minibatch, torch.Tensor) else minibatch
    if not isinstance(parts, (tuple, list)) or not parts or not all(isinstance(p, torch.Tensor) for p in parts):
        raise TypeError("minibatch must be a tensor or a non-empty tuple/list of tensors (e.g. (inputs, targets)), "
                        f"got {type(minibatch).__name__}")
    if any(p.dim() == 0 for p in parts):
        raise ValueError("minibatch tensors need a first (sample) dimension; got a 0-d tensor")
    sizes = {p.shape[0] for p in parts}
    if len(sizes) != 1:
        raise ValueError(f"minibatch tensors disagree on the number of samples (first dimension): {sorted(sizes)}")
    if parts[0].shape[0] < 1:
        raise ValueError("minibatch is empty")
    return tuple(parts)


class _Exchanger:
    """One daemon thread running ``fn(arg)`` for each submitted argument, in order."""

    def __init__(self, fn: Callable):
        self._fn = fn
        self._jobs: "queue.Queue" = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self.busy_s = 0.0  # seconds spent inside fn

    def submit(self, arg) -> Future:
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name="hgc-pipeline-exchange", daemon=True)
            self._thread.start()
        fut: Future = Future()
        self._jobs.put((fut, arg))
        return fut

    def _main(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fut, arg = job
            t0 = time.perf_counter()
            try:
                fut.set_result(self._fn(arg))
            except BaseException as exc:  # handed to whoever waits on the future
                fut.set_exception(exc)
            finally:
                self.busy_s += time.perf_counter() - t0

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None


def _done(value) -> Future:
    fut: Future = Future()
    fut.set_result(value)
    return fut


class DoubleBufferedStep:
    """A training step over ranks with optional double buffering (see the module doc).

    Args:
        named_parameters: (name, parameter) pairs, e.g. ``model.named_parameters()``; the
            same names, shapes and dtypes on every rank. Every one must require grad and
            belong to ``optimizer``.
        optimizer: any plain torch optimizer over those parameters (not a
            ``hvd.DistributedOptimizer``).
        compression: anything with ``exchange(grads: dict name -> tensor) -> dict name ->
            mean over ranks`` (every ``hgc.Compression`` factory's result). It is called
            with one gradient per parameter (zeros where ``loss_fn`` does not use it).
        double_buffering: False (default): the ordinary synchronous step. True: halves,
            overlap, one-half delay.
        half_weight: factor on each half's averaged gradient (0.5: two halves make one
            whole-minibatch step). Ignored when ``double_buffering`` is False.
        overlap: with double buffering, False runs the identical schedule (same delay,
            same parameters) but exchanges in the calling thread: for measurements.

    Every rank must call :meth:`step` the same number of times and :meth:`flush` together.
    """

    def __init__(self, named_parameters: Iterable[Tuple[str, torch.nn.Parameter]], optimizer: torch.optim.Optimizer,
                 compression, *, double_buffering: bool = False, half_weight: float = 0.5, overlap: bool = True):
        named = list(named_parameters)
        self.names: List[str] = [n for n, _ in named]
        self.params: List[torch.nn.Parameter] = [p for _, p in named]
        _check_parameters(named, optimizer)
        if not callable(getattr(compression, "exchange", None)):
            raise TypeError(f"compression must have an exchange(grads) method (an hgc.Compression result), got "
                            f"{type(compression).__name__}")
        if not (isinstance(half_weight, (int, float)) and half_weight > 0):
            raise ValueError(f"half_weight must be a positive number, got {half_weight!r}")
        self.optimizer = optimizer
        self.compression = compression
        self.double_buffering = require_flag("DoubleBufferedStep", "double_buffering", double_buffering)
        self.half_weight = float(half_weight)
        self.overlap = require_flag("DoubleBufferedStep", "overlap", overlap)
        self._exchanger = _Exchanger(self._exchange)
        self._pending: Optional[Future] = None
        self._broken: Optional[BaseException] = None
        self.halves = 0    # gradients computed (halves, or whole minibatches when off)
        self.updates = 0   # optimizer steps applied
        self._times = {"compute_s": 0.0, "wait_s": 0.0, "update_s": 0.0, "exchange_s": 0.0}

    # -- the public step ------------------------------------------------------------
    def step(self, loss_fn: Callable[..., torch.Tensor], minibatch: Minibatch) -> float:
        """One minibatch. ``minibatch``: a tensor or a tuple/list of tensors with a shared
        first dimension N (this rank's samples; N even and >= 2 with double buffering);
        ``loss_fn(*part)`` gets the same structure cut to the half (or the whole minibatch)
        and returns a scalar loss, normally the mean over its samples. Returns the mean of
        the losses computed (a float). With double buffering the second half's update is
        still outstanding on return (see :meth:`flush`)."""
        self._check_usable()
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
        parts = split_halves(minibatch) if self.double_buffering else (_as_parts(minibatch),)  # checks first
        if not self.double_buffering and self._pending is not None:
            self.flush()  # switched off mid-run: the outstanding update goes first
        try:
            losses = []
            for part in parts:
                loss, grads = self._gradient(loss_fn, part)  # overlaps the pending exchange
                losses.append(loss)
                if not self.double_buffering:
                    self._apply(self._exchange(grads), 1.0)
                    continue
                previous = self._wait_pending()
                # launch this half's exchange first: the update below then overlaps it too
                self._pending = self._exchanger.submit(grads) if self.overlap else _done(self._exchange(grads))
                if previous is not None:
                    self._apply(previous, self.half_weight)
            return sum(losses) / len(losses)
        except BaseException as exc:
            self._broken = exc  # the ranks' schedules may now differ: refuse to go on
            raise

    def flush(self) -> int:
        """Wait for the outstanding exchange and apply its update; returns the number of
        updates applied (0 or 1). Call on every rank, e.g. at the end of an epoch or
        before evaluating or checkpointing the parameters."""
        self._check_usable()
        if self._pending is None:
            return 0
        try:
            self._apply(self._wait_pending(), self.half_weight)
        except BaseException as exc:
            self._broken = exc
            raise
        return 1

    def close(self) -> None:
        """Flush (when usable) and stop the exchange thread."""
        try:
            if self._broken is None:
                self.flush()
        finally:
            self._exchanger.close()

    def __enter__(self) -> "DoubleBufferedStep":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:  # do not apply anything; let a running exchange end before the thread stops
            if self._pending is not None:
                self._pending.exception()
            self._exchanger.close()

    @property
    def pending(self) -> bool:
        """True while an exchanged update has not been applied yet."""
        return self._pending is not None

    def stats(self) -> dict:
        """Cumulative seconds on this rank: ``compute_s`` (forward/backward), ``wait_s``
        (the caller blocked on an exchange), ``update_s`` (writing p.grad + optimizer.step),
        ``exchange_s`` (inside compression.exchange, in whichever thread); and the counts
        ``halves`` and ``updates``."""
        times = dict(self._times)
        times["exchange_s"] += self._exchanger.busy_s
        return {**times, "halves": self.halves, "updates": self.updates}

    # -- pieces ---------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._broken is not None:
            raise RuntimeError(f"DoubleBufferedStep: an earlier step failed ({self._broken!r}); the pipeline cannot go "
                               "on consistently across ranks")

    def _gradient(self, loss_fn, parts) -> Tuple[float, Dict[str, torch.Tensor]]:
        """(loss, name -> gradient at the current parameters; zeros where unused)."""
        t0 = time.perf_counter()
        loss = loss_fn(*parts)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
            raise ValueError("loss_fn must return a one-element tensor that depends on the parameters, got "
                             f"{type(loss).__name__}{tuple(loss.shape) if isinstance(loss, torch.Tensor) else ''}")
        grads = torch.autograd.grad(loss.reshape(()), self.params, allow_unused=True)
        out = {n: (torch.zeros_like(p, memory_format=torch.contiguous_format) if g is None else g.detach().contiguous())
               for n, p, g in zip(self.names, self.params, grads)}
        self.halves += 1
        self._times["compute_s"] += time.perf_counter() - t0
        return float(loss.detach()), out

    def _exchange(self, grads: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        result = self.compression.exchange(grads)
        missing = [n for n in self.names if n not in result]
        if missing:
            raise RuntimeError(f"compression.exchange returned no result for {missing[:5]}")
        return result

    def _wait_pending(self) -> Optional[Dict[str, torch.Tensor]]:
        """The outstanding exchange's result (None when there is none); no longer pending."""
        if self._pending is None:
            return None
        t0 = time.perf_counter()
        fut, self._pending = self._pending, None
        result = fut.result()
        if self.overlap:
            self._times["wait_s"] += time.perf_counter() - t0
        return result

    def _apply(self, result: Dict[str, torch.Tensor], weight: float) -> None:
        """``p.grad = weight * result[name]`` for every parameter, then ``optimizer.step()``."""
        t0 = time.perf_counter()
        for n, p in zip(self.names, self.params):
            g = result[n]
            if g.shape != p.shape:
                raise RuntimeError(f"exchange result for {n!r} has shape {tuple(g.shape)}, parameter {tuple(p.shape)}")
            g = g.to(dtype=p.dtype, device=p.device)
            if weight != 1.0:
                g.mul_(weight)  # the result is ours (our gradient buffer or a fresh tensor)
            p.grad = g
        self.optimizer.step()
        self.updates += 1
        self._times["update_s"] += time.perf_counter() - t0


def _check_parameters(named, optimizer) -> None:
    """Names unique, tensors that require grad, each in ``optimizer``, which is a plain one."""
    if not named:
        raise ValueError("named_parameters is empty; pass model.named_parameters()")
    if any(not (isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) and isinstance(x[1], torch.Tensor))
           for x in named):
        raise TypeError("named_parameters must be (name, tensor) pairs, as model.named_parameters() gives")
    names = [n for n, _ in named]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"duplicate parameter names {dups}")
    if len({id(p) for _, p in named}) != len(named):
        raise ValueError("the same parameter is listed under two names")
    frozen = [n for n, p in named if not p.requires_grad]
    if frozen:
        raise ValueError(f"parameters that do not require grad: {frozen[:5]}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if hasattr(optimizer, "synchronize") and hasattr(optimizer, "skip_synchronize"):
        raise TypeError("pass the plain torch optimizer, not hvd.DistributedOptimizer: DoubleBufferedStep exchanges "
                        "the gradients itself (Horovod's hooks would exchange them a second time)")
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    outside = [n for n, p in named if id(p) not in held]
    if outside:
        raise ValueError(f"parameters not in the optimizer: {outside[:5]}")
