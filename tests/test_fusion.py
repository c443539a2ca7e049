"""FusedLayout: many payloads in one aligned uint8 buffer, and K received buffers cut back apart."""
from __future__ import annotations

import random

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs.base import Codec, Payload
from horovod_gradcomp.exchange.fusion import ALIGN, FusedLayout

pytestmark = pytest.mark.timeout(120)

ENTRIES = [
    ("conv", (16, 3, 3, 3), torch.float32),
    ("bias", (16,), torch.float16),
    ("fc", (10, 7), torch.bfloat16),
    ("empty", (4, 0, 3, 3), torch.float32),
    ("scalar", (), torch.float64),
    ("odd", (8 * 37 + 1,), torch.float64),
    ("column", (13, 1), torch.float32),
    ("one", (1,), torch.float16),
]


class MixedCodec(Codec):
    """Test-only codec (never registered) whose payloads mix four element sizes, listed
    smallest first so that the layout has to reorder them to align each one."""

    name = "test_fusion_mixed"

    def layout(self, shape, dtype):
        n = 1
        for s in shape:
            n *= s
        return [("flags", torch.uint8, n + 3), ("half", torch.float16, 2 * n + 1),
                ("idx", torch.int32, n % 5 + 1), ("wide", torch.float64, 3)]

    def encode(self, tensor, residual=None):
        flat = tensor.reshape(-1).double()
        n = flat.numel()
        specs = {name: (dt, numel) for name, dt, numel in self.layout(tensor.shape, tensor.dtype)}
        bufs = {
            "flags": torch.cat([(flat >= 0).to(torch.uint8), torch.tensor([7, 8, 9], dtype=torch.uint8)]),
            "half": torch.cat([flat, -flat, flat.sum().reshape(1)]).to(torch.float16),
            "idx": (torch.arange(specs["idx"][1], dtype=torch.int32) + int(flat.abs().sum() * 1000)),
            "wide": torch.stack([flat.sum(), flat.abs().sum(), torch.tensor(float(n), dtype=torch.float64)]),
        }
        return Payload(bufs, tensor.shape, tensor.dtype, tensor.device)

    def decode(self, payload, out=None):
        raise NotImplementedError


CODECS = {
    "onebit-native": lambda: hgc.get_codec("onebit", impl="native"),
    "onebit-reference": lambda: hgc.get_codec("onebit", impl="reference"),
    "mixed": lambda: MixedCodec(impl="reference"),
}


@pytest.fixture(params=list(CODECS))
def codec(request):
    return CODECS[request.param]()


def _itemsize(dtype):
    return torch.empty((), dtype=dtype).element_size()


def _grads(seed, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype).to(device)
            for k, shape, dtype in ENTRIES}


def _payloads(codec, seed, device="cpu"):
    return {k: codec.encode(g) for k, g in _grads(seed, device).items()}


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).contiguous().cpu().view(torch.uint8)


# -- the layout -----------------------------------------------------------------------------

def test_layout_is_aligned_and_complete(codec):
    layout = FusedLayout(codec, ENTRIES)
    assert layout.nbytes % ALIGN == 0 and ALIGN == 8
    assert layout.payload_bytes <= layout.nbytes < layout.payload_bytes + 8
    assert layout.payload_bytes == sum(codec.payload_nbytes(shape, dtype) for _, shape, dtype in ENTRIES)
    assert list(layout.slots) == [k for k, _, _ in ENTRIES]

    spans = []
    for k, shape, dtype in ENTRIES:
        specs = codec.layout(shape, dtype)
        assert set(layout.slots[k]) == {name for name, _, _ in specs}
        for name, dt, numel in specs:
            slot = layout.slots[k][name]
            assert (slot.key, slot.buffer, slot.dtype, slot.numel) == (k, name, dt, numel)
            assert slot.nbytes == numel * _itemsize(dt)
            assert slot.offset % _itemsize(dt) == 0, f"{k}/{name} ({dt}) at offset {slot.offset}"
            spans.append((slot.offset, slot.offset + slot.nbytes))
    # the buffers tile [0, payload_bytes): no overlap, no gap
    spans.sort()
    pos = 0
    for lo, hi in spans:
        assert lo == pos, f"gap or overlap at byte {pos}: next buffer starts at {lo}"
        pos = hi
    assert pos == layout.payload_bytes


def test_layout_groups_by_element_size_and_keeps_exchange_order(codec):
    layout = FusedLayout(codec, ENTRIES)
    slots = sorted((s for per_key in layout.slots.values() for s in per_key.values()), key=lambda s: s.offset)
    sizes = [_itemsize(s.dtype) for s in slots if s.numel]
    assert sizes == sorted(sizes, reverse=True)
    for name in {s.buffer for s in slots}:
        offsets = [layout.slots[k][name].offset for k, _, _ in ENTRIES]
        assert offsets == sorted(offsets), f"{name} buffers are not in exchange order"


def test_layout_is_deterministic(codec):
    a = FusedLayout(codec, ENTRIES)
    b = FusedLayout(codec, [(k, list(shape), dtype) for k, shape, dtype in ENTRIES])
    c = FusedLayout(codec, [(k, torch.Size(shape), dtype) for k, shape, dtype in ENTRIES])
    assert a.slots == b.slots == c.slots
    assert a.nbytes == b.nbytes == c.nbytes


def test_layout_of_nothing(codec):
    layout = FusedLayout(codec, [])
    assert layout.nbytes == 0 and layout.payload_bytes == 0
    assert layout.pack({}).shape == (0,)
    assert layout.unpack(torch.empty(3, 0, dtype=torch.uint8), {}) == []


# -- pack ---------------------------------------------------------------------------------

def test_pack_places_every_buffer_at_its_slot(codec):
    layout = FusedLayout(codec, ENTRIES)
    payloads = _payloads(codec, seed=0)
    buf = layout.pack(payloads)
    assert buf.dtype == torch.uint8 and buf.shape == (layout.nbytes,) and buf.is_contiguous()
    for k, slots in layout.slots.items():
        for name, slot in slots.items():
            assert torch.equal(buf[slot.offset:slot.offset + slot.nbytes], _as_bytes(payloads[k].buffers[name]))
    assert not buf[layout.payload_bytes:].any(), "padding bytes must be zero"


def test_pack_into_out_zeroes_the_padding(codec):
    layout = FusedLayout(codec, ENTRIES)
    payloads = _payloads(codec, seed=1)
    out = torch.full((layout.nbytes,), 0xFF, dtype=torch.uint8)
    result = layout.pack(payloads, out=out)
    assert result is out
    assert torch.equal(out, layout.pack(payloads))


def test_pack_ignores_payload_dict_order(codec):
    layout = FusedLayout(codec, ENTRIES)
    payloads = _payloads(codec, seed=2)
    expected = layout.pack(payloads)
    keys = list(payloads)
    for order in (keys[::-1], random.Random(0).sample(keys, len(keys)), random.Random(1).sample(keys, len(keys))):
        assert torch.equal(layout.pack({k: payloads[k] for k in order}), expected)
    # and a payload's buffers dict order does not matter either
    shuffled = {k: Payload(dict(reversed(list(p.buffers.items()))), p.shape, p.dtype, p.device)
                for k, p in payloads.items()}
    assert torch.equal(layout.pack(shuffled), expected)


def test_pack_rejects_mismatched_buffers(codec):
    layout = FusedLayout(codec, ENTRIES)
    payloads = _payloads(codec, seed=3)
    key = "conv"
    name, dt, numel = codec.layout(dict((k, s) for k, s, _ in ENTRIES)[key], torch.float32)[0]
    good = payloads[key].buffers[name]
    for bad in (torch.cat([good.reshape(-1), good.reshape(-1)[:1]]),            # one element too many
                good.reshape(-1)[:-1],                                           # one too few
                good.reshape(-1).to(torch.float64 if dt != torch.float64 else torch.float32)):  # wrong dtype
        broken = dict(payloads)
        broken[key] = Payload({**payloads[key].buffers, name: bad}, payloads[key].shape, payloads[key].dtype)
        with pytest.raises(ValueError, match=f"{key}/{name}"):
            layout.pack(broken)
    # a payload of another tensor's shape
    broken = dict(payloads)
    broken["conv"] = codec.encode(torch.randn(16, 3, 3, 4))
    with pytest.raises(ValueError):
        layout.pack(broken)


# -- unpack of K received buffers ----------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_unpack_returns_each_ranks_payloads(codec, k, device):
    layout = FusedLayout(codec, ENTRIES)
    ranks = [_payloads(codec, seed=10 + r, device=device) for r in range(k)]
    recv = torch.stack([layout.pack(p) for p in ranks])
    assert recv.shape == (k, layout.nbytes)
    devices = {key: device for key, _, _ in ENTRIES}
    unpacked = layout.unpack(recv, devices)
    assert [key for key, _ in unpacked] == [key for key, _, _ in ENTRIES]
    for (key, stacked), (_, shape, dtype) in zip(unpacked, ENTRIES):
        assert stacked.shape == torch.Size(shape) and stacked.dtype == dtype and stacked.device == device
        assert set(stacked.buffers) == set(ranks[0][key].buffers)
        for name, buf in stacked.buffers.items():
            src0 = ranks[0][key].buffers[name]
            assert buf.shape == (k, src0.numel()) and buf.dtype == src0.dtype and buf.device == device
            if device.type == "cpu":     # views into the receive buffer, no copies
                assert buf.untyped_storage().data_ptr() == recv.untyped_storage().data_ptr()
            for r in range(k):
                # bytewise, so that NaNs compare too
                assert torch.equal(_as_bytes(buf[r]), _as_bytes(ranks[r][key].buffers[name])), (key, name, r)
        assert stacked.nbytes == k * codec.payload_nbytes(shape, dtype)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_unpacked_onebit_payloads_decode_to_the_mean(k, device):
    """End to end on one process: K ranks' fused buffers -> unpack -> decode_mean_stacked."""
    codec = hgc.get_codec("onebit", impl="native")
    layout = FusedLayout(codec, ENTRIES)
    ranks = [_payloads(codec, seed=20 + r, device=device) for r in range(k)]
    recv = torch.stack([layout.pack(p) for p in ranks])
    for key, stacked in layout.unpack(recv, {key: device for key, _, _ in ENTRIES}):
        decodes = torch.stack([codec.decode(ranks[r][key]).double() for r in range(k)])
        got = codec.decode_mean_stacked(stacked)
        dtype = stacked.dtype
        eps = torch.finfo(dtype).eps if dtype != torch.float64 else 1e-15
        big = decodes.abs().max().item() if decodes.numel() else 0.0
        torch.testing.assert_close(got.double(), decodes.mean(0), rtol=2 * eps, atol=2 * eps * big + 1e-7)


def test_unpack_ignores_bytes_outside_the_slots():
    codec = hgc.get_codec("onebit", impl="native")
    layout = FusedLayout(codec, ENTRIES)
    ranks = [_payloads(codec, seed=30 + r) for r in range(3)]
    recv = torch.stack([layout.pack(p) for p in ranks])
    recv[:, layout.payload_bytes:] = 0xAB
    clean = torch.stack([layout.pack(p) for p in ranks])
    devices = {key: torch.device("cpu") for key, _, _ in ENTRIES}
    for (key, a), (_, b) in zip(layout.unpack(recv, devices), layout.unpack(clean, devices)):
        assert torch.equal(codec.decode_mean_stacked(a), codec.decode_mean_stacked(b))
