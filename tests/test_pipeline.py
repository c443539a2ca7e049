"""DoubleBufferedStep in one process (no MPI): input checks, the schedule with a one-rank
exchange, the overlap itself, errors, and the cost rule. The multi-rank checks against a
reference recurrence are in tests/mpi/mpi_pipeline.py."""
from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

from horovod_gradcomp.training.double_buffering import DoubleBufferedStep, double_buffering_pays, predicted_step_s, split_halves

pytestmark = pytest.mark.timeout(60)


class OneRank:
    """compression.exchange of a single rank: the mean is the gradient itself."""

    def __init__(self):
        self.calls = []

    def exchange(self, grads):
        self.calls.append({n: g.clone() for n, g in grads.items()})
        return grads


def model_and_opt(lr=0.1):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).double()
    return model, torch.optim.SGD(model.parameters(), lr=lr)


def batch(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, generator=g, dtype=torch.float64), torch.randn(n, 2, generator=g, dtype=torch.float64)


def mse(model):
    return lambda x, y: F.mse_loss(model(x), y)


def pipeline(**kw):
    model, opt = model_and_opt()
    return model, DoubleBufferedStep(model.named_parameters(), opt, kw.pop("compression", OneRank()),
                                     double_buffering=kw.pop("double_buffering", True), **kw)


# -- bad input ----------------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, 3, 5])
def test_odd_or_too_small_minibatch(n):
    model, step = pipeline()
    x = torch.zeros(n, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="even|empty"):
        step.step(mse(model), (x, torch.zeros(n, 2, dtype=torch.float64)))
    assert step.updates == 0 and not step.pending
    step.step(mse(model), batch())  # a bad minibatch is refused before anything changes


def test_odd_minibatch_is_fine_when_off():
    model, step = pipeline(double_buffering=False)
    step.step(mse(model), batch(3))
    assert step.updates == 1 and not step.pending


@pytest.mark.parametrize("minibatch, err", [
    ([], TypeError), ("abc", TypeError), ((torch.zeros(4, 3), [1, 2]), TypeError),
    (torch.tensor(1.0), ValueError), ((torch.zeros(4, 3), torch.zeros(6, 2)), ValueError),
])
def test_malformed_minibatch(minibatch, err):
    model, step = pipeline()
    with pytest.raises(err):
        step.step(mse(model), minibatch)


def test_loss_fn_must_return_a_scalar_then_the_pipeline_stops():
    model, step = pipeline()
    with pytest.raises(ValueError, match="one-element"):
        step.step(lambda x, y: model(x), batch())
    with pytest.raises(RuntimeError, match="earlier step failed"):
        step.step(mse(model), batch())
    with pytest.raises(TypeError, match="callable"):
        pipeline()[1].step(None, batch())


def test_constructor_checks():
    model, opt = model_and_opt()
    named = list(model.named_parameters())
    comp = OneRank()
    with pytest.raises(ValueError, match="empty"):
        DoubleBufferedStep([], opt, comp)
    with pytest.raises(TypeError, match="pairs"):
        DoubleBufferedStep(list(model.parameters()), opt, comp)
    with pytest.raises(ValueError, match="duplicate"):
        DoubleBufferedStep([named[0], ("weight", named[1][1])], opt, comp)
    with pytest.raises(ValueError, match="two names"):
        DoubleBufferedStep([named[0], ("other", named[0][1])], opt, comp)
    with pytest.raises(ValueError, match="not in the optimizer"):
        DoubleBufferedStep(named, torch.optim.SGD([named[0][1]], lr=0.1), comp)
    with pytest.raises(ValueError, match="double_buffering must be True or False, got 'false'"):
        DoubleBufferedStep(named, opt, comp, double_buffering="false")
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        DoubleBufferedStep(named, object(), comp)
    with pytest.raises(TypeError, match="exchange"):
        DoubleBufferedStep(named, opt, object())
    with pytest.raises(ValueError, match="half_weight"):
        DoubleBufferedStep(named, opt, comp, half_weight=0)
    frozen = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
    with pytest.raises(ValueError, match="require grad"):
        DoubleBufferedStep([("f", frozen)], torch.optim.SGD([frozen], lr=0.1), comp)


def test_refuses_a_horovod_distributed_optimizer():
    class LooksDistributed(torch.optim.SGD):  # what hvd.DistributedOptimizer adds
        def synchronize(self):
            pass

        def skip_synchronize(self):
            pass

    model, _ = model_and_opt()
    with pytest.raises(TypeError, match="DistributedOptimizer"):
        DoubleBufferedStep(model.named_parameters(), LooksDistributed(model.parameters(), lr=0.1), OneRank())


# -- the schedule ---------------------------------------------------------------------------

def test_each_half_is_computed_one_update_late():
    model, step = pipeline()
    w = [{n: p.detach().clone() for n, p in model.named_parameters()}]
    minibatches = [batch(4, seed) for seed in range(3)]
    for mb in minibatches:
        step.step(mse(model), mb)
    step.flush()
    halves = [(x[lo:lo + 2], y[lo:lo + 2]) for x, y in minibatches for lo in (0, 2)]
    for h, (x, y) in enumerate(halves):  # w_{h+1} = w_h - lr * 0.5 * grad(w_{max(h-1, 0)})
        at = {n: v.clone().requires_grad_(True) for n, v in w[max(h - 1, 0)].items()}
        F.mse_loss(x @ at["weight"].T + at["bias"], y).backward()
        w.append({n: w[h][n] - 0.1 * 0.5 * at[n].grad for n in at})
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), w[-1][n], rtol=1e-12, atol=1e-14)
    assert step.updates == 6 and step.halves == 6 and step.flush() == 0


def test_an_unused_parameter_is_exchanged_as_zeros():
    model, opt = model_and_opt()
    extra = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    opt.add_param_group({"params": [extra]})
    comp = OneRank()
    step = DoubleBufferedStep([*model.named_parameters(), ("extra", extra)], opt, comp, double_buffering=True)
    step.step(mse(model), batch())
    assert set(comp.calls[0]) == {"weight", "bias", "extra"}
    assert torch.equal(comp.calls[0]["extra"], torch.zeros(3, dtype=torch.float64))


def test_the_exchange_overlaps_the_next_half():
    """The exchange of half h finishes only once half h+1's loss_fn has started: this can
    complete only if they run at the same time."""
    started = threading.Event()

    class WaitsForNextHalf(OneRank):
        def exchange(self, grads):
            if len(self.calls) % 2 == 0 and not started.wait(timeout=20):
                raise TimeoutError("the next half's compute never started during the exchange")
            started.clear()
            return super().exchange(grads)

    model, step = pipeline(compression=WaitsForNextHalf())

    def loss(x, y):
        started.set()
        return mse(model)(x, y)

    for seed in range(2):
        step.step(loss, batch(4, seed))
    step.close()
    assert step.updates == 4


def test_an_exchange_error_reaches_the_caller_and_stops_the_pipeline():
    class Fails:
        def exchange(self, grads):
            raise OSError("link down")

    model, step = pipeline(compression=Fails())
    with pytest.raises(OSError, match="link down"):
        step.step(mse(model), batch())
    with pytest.raises(RuntimeError, match="earlier step failed"):
        step.flush()
    step.close()  # does not raise again


def test_context_manager_flushes():
    model, opt = model_and_opt()
    with DoubleBufferedStep(model.named_parameters(), opt, OneRank(), double_buffering=True) as step:
        step.step(mse(model), batch())
        assert step.pending
    assert not step.pending and step.updates == 2


# -- helpers and the cost rule ------------------------------------------------------------

def test_split_halves_gives_views():
    x, y = batch(6)
    (xa, ya), (xb, yb) = split_halves((x, y))
    assert xa.shape == (3, 3) and yb.shape == (3, 2) and xa.data_ptr() == x.data_ptr()
    (only,), _ = split_halves(x)
    assert only.shape == (3, 3)


def test_cost_rule():
    assert predicted_step_s(10, 3, 1) == (14, 12)
    assert double_buffering_pays(10, 3, 1)          # compute-bound, exchange above the fixed cost
    assert not double_buffering_pays(10, 0.5, 1)    # exchange below the fixed cost: stop (Seide 3.3)
    assert double_buffering_pays(6, 4, 0.5)         # exchange-bound: max(7, 8) < 10.5
    assert not double_buffering_pays(2, 4, 0.5)     # little compute to hide behind: 8 > 6.5
    with pytest.raises(ValueError):
        predicted_step_s(-1, 0, 0)


def test_switching_off_applies_the_outstanding_update_first():
    model, step = pipeline()
    step.step(mse(model), batch(4, 0))
    step.double_buffering = False
    step.step(mse(model), batch(3, 1))
    assert step.updates == 3 and not step.pending
