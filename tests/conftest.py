"""Shared parametrization and helpers of the single-process tests.

Parametrized fixtures (torch-scatter style axes): ``dtype`` x ``shape`` x ``device``, and
``impl`` (native / reference). A test narrows an axis by parametrizing the same name
directly (``@pytest.mark.parametrize("dtype", [...])`` overrides the fixture).
Helpers are fixtures returning functions (``make_grad``, ``stack_payloads``,
``assert_feedback_identity``), so test modules never import this file.

The MPI suites (tests/mpi/mpi_*.py) are launched by tests/test_mpi_suites.py. Keep this file free of side effects
(no autouse fixtures, no seeding): it is also loaded by the pytest runs under tests/mpi.
"""
from __future__ import annotations

import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line("markers", "requires_cuda: needs a CUDA device; skipped when torch sees none")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``requires_cuda`` are skipped (with the reason) when there is no GPU."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="CUDA is not available (torch.cuda.is_available() is False)")
    for item in items:
        if "requires_cuda" in item.keywords:
            item.add_marker(skip)


# -- axes ------------------------------------------------------------------------------

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                   reason="CUDA is not available (torch.cuda.is_available() is False)")
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]

IMPLS = ["native", "reference"]

SHAPES = [
    (),                                   # 0-d: one value, one column
    (0,), (1,), (7,), (8,), (8 * 37 + 1,),  # 1-D: one column; empty, < 1 byte, 1 byte, 8k+1
    (1, 1), (1, 13), (1, 16),             # rows = 1
    (13, 1),                              # cols = 1
    (5, 8), (6, 24),                      # cols multiple of 8
    (5, 7), (9, 13),                      # cols not a multiple of 8 (n not a multiple of 8)
    (2, 1029),                            # more columns than the kernels' column blocks
    (0, 5), (3, 0),                       # empty 2-D (with and without columns)
    (16, 3, 3, 3), (8, 16, 1, 1), (4, 0, 3, 3), (2, 3, 5, 7),  # conv-like
]


def dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def shape_id(shape) -> str:
    return "x".join(map(str, shape)) if len(shape) else "scalar"


@pytest.fixture(params=DTYPES, ids=dtype_id)
def dtype(request) -> torch.dtype:
    return request.param


@pytest.fixture(params=SHAPES, ids=shape_id)
def shape(request) -> tuple:
    return request.param


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    return torch.device(request.param)


@pytest.fixture(params=IMPLS)
def impl(request) -> str:
    return request.param


# -- helpers ---------------------------------------------------------------------------

def _make_grad(shape, dtype=torch.float32, device="cpu", seed=0, scale=1.0, shift=0.0) -> torch.Tensor:
    """Seeded ``shift + scale * randn(shape)`` (drawn in float64 on the CPU, then cast)."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=gen, dtype=torch.float64) * scale + shift
    return t.to(dtype).to(device)


@pytest.fixture
def make_grad():
    return _make_grad


def _stack_payloads(payloads, slack: int = 8):
    """K payloads of one tensor -> one stacked payload whose buffers are ``[K, numel]``
    strided views into the rows of a ``[K, S]`` uint8 receive buffer, as
    ``FusedLayout.unpack`` makes them: buffers by element size (largest first), ``S`` a
    multiple of 8 with ``slack`` extra bytes (filled with 0xAB, so that reading past a
    buffer shows)."""
    from horovod_gradcomp.codecs.base import Payload

    first = payloads[0]
    specs = sorted(((name, b.dtype, b.numel()) for name, b in first.buffers.items()),
                   key=lambda s: -torch.empty((), dtype=s[1]).element_size())
    offsets, off = {}, 0
    for name, dt, numel in specs:
        offsets[name] = off
        off += numel * torch.empty((), dtype=dt).element_size()
    row = (off + slack + 7) // 8 * 8
    recv = torch.full((len(payloads), row), 0xAB, dtype=torch.uint8)
    for k, p in enumerate(payloads):
        for name, dt, numel in specs:
            b = p.buffers[name].reshape(-1).cpu()
            assert b.dtype == dt and b.numel() == numel
            recv[k, offsets[name]:offsets[name] + b.numel() * b.element_size()] = b.view(torch.uint8)
    bufs = {}
    for name, dt, numel in specs:
        nb = numel * torch.empty((), dtype=dt).element_size()
        view = recv[:, offsets[name]:offsets[name] + nb].view(dt)
        bufs[name] = view if first.device.type == "cpu" else view.to(first.device)
    return Payload(bufs, first.shape, first.dtype, first.device)


@pytest.fixture
def stack_payloads():
    return _stack_payloads


def _assert_feedback_identity(g, r_old, decoded, r_new, atol64: float = 1e-12) -> None:
    """``g + r_old == decoded + r_new`` (the error-feedback identity), compared in float64:
    to ``atol64`` for float64 tensors, else to the rounding of the stored dtype (the new
    residual and the decoded values are each rounded once to it, ``g + r_old`` once to the
    arithmetic precision)."""
    lhs = g.double() + r_old.double()
    rhs = decoded.double() + r_new.double()
    assert lhs.shape == rhs.shape
    if g.dtype == torch.float64:
        torch.testing.assert_close(rhs, lhs, rtol=0, atol=atol64)
        return
    eps = torch.finfo(g.dtype).eps
    bound = eps * (lhs.abs() + decoded.double().abs() + r_new.double().abs()) + 1e-7
    err = (lhs - rhs).abs()
    bad = err > bound
    assert not bad.any(), (f"{int(bad.sum())}/{bad.numel()} values break g + r_old == decode + r_new "
                           f"({g.dtype}); worst error {err.max().item():.3g}")


@pytest.fixture
def assert_feedback_identity():
    return _assert_feedback_identity

