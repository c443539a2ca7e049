"""onebit's dense warm-up (``warmup_steps``): the option, the dense pattern, the exchange.

Single process: the codec and compression layers directly (Horovod calls no hook with one
process); the dense pattern's K-rank arithmetic with K simulated ranks. The exchange under
mpirun is in tests/mpi/mpi_onebit_warmup.py.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs.base import Payload
from horovod_gradcomp.exchange.bucket import Bucket
from horovod_gradcomp.exchange.dense import DensePattern
from horovod_gradcomp.exchange.stripes import balanced_ranges
from horovod_gradcomp.exchange.stats import ExchangeStats
from horovod_gradcomp.state.compression_state import CompressionState
from horovod_gradcomp.state.error_feedback import ErrorFeedback


def test_option_is_validated_and_named_in_the_agreement_key():
    assert hgc.get_codec("onebit").warmup_steps == 0
    # checkpoints written when columns and no warm-up were the defaults name exactly the codec that resumes them
    assert repr(hgc.get_codec("onebit", scales="columns")) == "OneBitCodec(impl='native')"
    assert repr(hgc.get_codec("onebit")) == "OneBitCodec(impl='native', scales='rows')"   # no gradient scaling
    assert repr(hgc.get_codec("onebit", lr_warmup_steps=300)) == ("OneBitCodec(impl='native', scales='rows', "
                                                                  "lr_warmup_steps=300)")
    codec = hgc.get_codec("onebit", warmup_steps=7)
    assert codec.warmup_steps == 7 and "warmup_steps=7" in codec.agreement_key()
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="warmup_steps"):
            hgc.get_codec("onebit", warmup_steps=bad)


@pytest.mark.parametrize("n", [0, 1, 5, 12, 13])
def test_slices_cover_the_vector(n):
    for k in (1, 2, 3, 4):
        parts = balanced_ranges(n, k)
        assert len(parts) == k and parts[0][0] == 0 and parts[-1][1] == n
        assert all(a <= b for a, b in parts) and all(parts[j][1] == parts[j + 1][0] for j in range(k - 1))
        assert max(b - a for a, b in parts) - min(b - a for a, b in parts) <= 1


@pytest.mark.parametrize("k", [2, 3, 4])
def test_dense_pattern_gives_every_rank_the_rank_order_mean(k):
    """K ranks simulated in turn: each rank's results are bitwise the sum of the K gradients in
    rank order divided by K, cast to the gradient's dtype; bytes as a ring allreduce's."""
    shapes = {"a": (5, 3), "b": (7,), "h": (2, 2)}
    gen = torch.Generator().manual_seed(k)
    grads = [{n: torch.randn(s, generator=gen) for n, s in shapes.items()} for _ in range(k)]
    grads[0]["h"] = grads[0]["h"].half()
    for r in range(1, k):
        grads[r]["h"] = grads[r]["h"].half()
    names = sorted(shapes)
    comms = [SimpleNamespace(size=k, rank=r) for r in range(k)]
    buckets = [Bucket(names, grads[r], CompressionState(ErrorFeedback()), {n: i for i, n in enumerate(names)})
               for r in range(k)]
    stats = ExchangeStats()
    prepared = [DensePattern.prepare(comms[r], buckets[r], stats) for r in range(k)]
    parts = []
    for r in range(k):  # alltoallv: rank r receives slice r of every rank's vector, in rank order
        recv = []
        for flat, send, counts, _ in prepared:
            start = sum(counts[:r])
            recv.append(send[start:start + counts[r]])
        parts.append(DensePattern.reduce(comms[r], prepared[r][0], torch.cat(recv), stats)[0])
    for r in range(k):
        outcome = DensePattern.finish(comms[r], buckets[r], prepared[r][0], parts, stats)
        for n in names:
            total = grads[0][n].float().clone()
            for j in range(1, k):
                total += grads[j][n].float()
            expected = (total / k).to(grads[r][n].dtype)
            assert torch.equal(outcome.results[n], expected), (r, n)
        numel = sum(grads[r][n].numel() for n in names)
        assert outcome.payload == 4 * numel
        if numel % k == 0:
            assert outcome.sent == 2 * (k - 1) / k * 4 * numel
        assert numel * 4 * (k - 1) / k * 2 - 8 <= outcome.sent <= numel * 4 * (k - 1) / k * 2 + 8


def _linear_grads(step):
    gen = torch.Generator().manual_seed(100 + step)
    return {"bias": torch.randn(3, generator=gen), "weight": torch.randn(3, 5, generator=gen)}


@pytest.mark.parametrize("impl", ["native", "reference"])
def test_warmup_steps_are_exact_then_onebit_from_zero_residuals(impl):
    """One process: steps < N return the gradient itself (the mean over one rank), leave no
    residual and count dense bytes; step N is onebit's encode of the gradient with a zero residual."""
    model = torch.nn.Linear(5, 3)
    n_warm = 3
    comp = hgc.Compression.onebit(model.named_parameters(), warmup_steps=n_warm, impl=impl)
    ref = hgc.get_codec("onebit", impl="reference")
    numel = sum(p.numel() for p in model.parameters())
    for step in range(n_warm + 2):
        grads = _linear_grads(step)
        expected = {n: g.clone() for n, g in grads.items()}
        out = comp.exchange(grads)
        stats = comp.stats()
        if step < n_warm:
            assert all(torch.equal(out[n], expected[n]) for n in expected)
            assert comp.memory.residuals == {}
            assert stats["bytes_payload"] == 4 * numel * (step + 1)
        else:
            if step == n_warm:
                residual = {n: torch.zeros_like(g) for n, g in expected.items()}
            for n, g in expected.items():
                v = g + residual[n]
                decoded = ref.decode(ref.encode(v.clone()))
                torch.testing.assert_close(out[n], decoded, rtol=1e-6, atol=1e-7)
                residual[n] = v - decoded
                torch.testing.assert_close(comp.memory.residuals[n], residual[n], rtol=1e-6, atol=1e-6)
    onebit_bytes = sum(ref.payload_nbytes(p.shape, p.dtype) for p in model.parameters())
    per_step = (comp.stats()["bytes_payload"] - 4 * numel * n_warm) / 2  # the fused buffer, padded
    assert onebit_bytes <= per_step < onebit_bytes + 16 and per_step < 4 * numel
    assert comp.stats()["steps"] == n_warm + 2 and comp.stats()["bytes_payload_dense"] == 4 * numel * (n_warm + 2)


# -- scales="rows" ------------------------------------------------------------------------
@pytest.mark.parametrize("impl", ["native", "reference"])
@pytest.mark.parametrize("shape", [(6, 5), (4, 3, 2), (9,), (1, 7), (3, 0)])
def test_rows_mode_is_columns_mode_of_the_transpose(impl, shape):
    """Rows mode decodes and leaves the residual exactly as the reference's columns mode does
    on the transposed 2-D view (1-D tensors: one group, as in columns mode)."""
    rows_codec = hgc.get_codec("onebit", impl=impl, scales="rows")
    cols_codec = hgc.get_codec("onebit", impl="reference", scales="columns")
    gen = torch.Generator().manual_seed(len(shape))
    g = torch.randn(shape, generator=gen)
    g.view(-1)[::3] = 0.0  # zeros count as non-negative in both modes
    r = torch.randn(shape, generator=gen) * 0.1
    r_rows = r.clone()
    payload = rows_codec.encode(g, residual=r_rows)
    assert payload.nbytes == rows_codec.payload_nbytes(shape, g.dtype)
    decoded = rows_codec.decode(payload)
    if len(shape) >= 2:
        view_t = lambda t: t.reshape(shape[0], -1).t()  # noqa: E731
        r_t = view_t(r).contiguous()
        expected = cols_codec.decode(cols_codec.encode(view_t(g).contiguous(), residual=r_t)).t().reshape(shape)
        expected_r = r_t.t().reshape(shape)
        assert payload.buffers["scales"].numel() == 2 * shape[0]
    else:
        expected_r = r.clone()
        expected = cols_codec.decode(cols_codec.encode(g, residual=expected_r))
    torch.testing.assert_close(decoded, expected, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(r_rows, expected_r, rtol=1e-6, atol=1e-6)
    stacked = Payload({b: torch.stack([v, v]) for b, v in payload.buffers.items()}, payload.shape, payload.dtype,
                      payload.device)
    torch.testing.assert_close(rows_codec.decode_mean_stacked(stacked), decoded)


def test_rows_mode_option_and_no_column_windows():
    codec = hgc.get_codec("onebit", scales="rows")
    assert "scales='rows'" in codec.agreement_key()
    assert not codec.encodes_column_windows(torch.zeros(8, 8), 4)
    with pytest.raises(ValueError, match="scales"):
        hgc.get_codec("onebit", scales="diagonal")
