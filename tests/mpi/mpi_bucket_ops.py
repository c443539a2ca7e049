"""The device kernels' path through a real exchange under mpirun: every codec built with
impl="twin" (the device sources on the CPU, with their bucket ops where the codec has them)
trains a model to bitwise the parameters of the same codec on the native CPU kernels, through
stock hvd.DistributedOptimizer, at every world size, in each exchange pattern it has."""
from __future__ import annotations

import horovod.torch as hvd
import pytest
import torch

import horovod_gradcomp as hgc

from .mpi_helpers import assert_identical_across_ranks, flat_params, init, needs_peers

RANK, SIZE = init()

CONFIGS = {
    "onebit-allgather": lambda named, impl: hgc.Compression.onebit(named, impl=impl, pattern="allgather"),
    "onebit-two_phase": lambda named, impl: hgc.Compression.onebit(named, impl=impl, pattern="two_phase"),
    "terngrad": lambda named, impl: hgc.Compression.terngrad(named, impl=impl),
    "qsgd-fixed": lambda named, impl: hgc.Compression.qsgd(named, impl=impl, coding="fixed"),
    "qsgd-elias": lambda named, impl: hgc.Compression.qsgd(named, impl=impl, coding="elias"),
    "dgc": lambda named, impl: hgc.Compression.dgc(named, impl=impl, density=0.05, momentum=0.9,
                                                   check_optimizer=False),
}


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(8 * 6 * 6, 33), torch.nn.Tanh(), torch.nn.Linear(33, 5))


def train(config: str, impl: str, steps: int = 3) -> torch.Tensor:
    model = make_model()
    comp = CONFIGS[config](model.named_parameters(), impl)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), compression=comp)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(steps):
        opt.zero_grad()
        g = torch.Generator().manual_seed(step * 31 + RANK)
        x, y = torch.randn(12, 3, 8, 8, generator=g), torch.randint(0, 5, (12,), generator=g)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    assert_identical_across_ranks(model)
    return flat_params(model)


@needs_peers
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_twin_trains_to_the_native_kernels_parameters_bitwise(config):
    twin, native = train(config, "twin"), train(config, "native")
    differ = int((twin.view(torch.uint8) != native.view(torch.uint8)).sum())
    assert differ == 0, f"{config}: {differ} bytes of the parameters differ between impl='twin' and 'native'"


def step_calls(config: str, layers: int) -> int:
    """Device algorithm calls of the twin in the second step of a model of ``layers`` equal
    Linear layers (the first step builds plans and state)."""
    twin = hgc.native.require_twin()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(layers)])
    comp = CONFIGS[config](model.named_parameters(), "twin")
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), compression=comp)
    calls = []
    for step in range(2):
        opt.zero_grad()
        g = torch.Generator().manual_seed(step * 31 + RANK)
        model(torch.randn(4, 16, generator=g)).square().sum().backward()
        before = twin.algorithm_calls()
        opt.step()
        calls.append(twin.algorithm_calls() - before)
    return calls[1]


@needs_peers
@pytest.mark.parametrize("config", ["onebit-allgather", "onebit-two_phase"])
def test_a_steps_device_calls_do_not_grow_with_the_tensor_count(config):
    """A step's exchange is a fixed number of bucket ops: 3 layers (6 tensors) and 12 layers (24
    tensors) of one shape cost the same device algorithm calls."""
    few, many = step_calls(config, 3), step_calls(config, 12)
    assert few > 0, f"{config}: the twin ran no device call"
    assert few == many, f"{config}: {few} device calls for 6 tensors, {many} for 24"
