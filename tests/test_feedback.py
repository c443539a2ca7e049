"""ErrorFeedback: residual memory per parameter name, with a fused and a non-fused codec."""
from __future__ import annotations

import io

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs import registry
from horovod_gradcomp.codecs.base import Codec, Payload
from horovod_gradcomp.state.error_feedback import ErrorFeedback

pytestmark = pytest.mark.timeout(120)


class SignMeanCodec(Codec):
    """Test-only, non-fused codec: ``sign(v) * mean|v|`` (never registered globally).

    Records what it was asked to encode, so tests can check that the memory hands it
    ``g + r``."""

    name = "test_sign_mean"
    fuses_feedback = False

    def __init__(self, impl: str = "reference"):
        super().__init__(impl)
        self.seen = []

    def layout(self, shape, dtype):
        n = 1
        for s in shape:
            n *= s
        return [("signs", torch.uint8, n), ("scale", torch.float32, 1)]

    def encode(self, tensor, residual=None):
        assert residual is None, "a non-fused codec is never handed the residual"
        self.seen.append(tensor.detach().clone())
        flat = tensor.reshape(-1)
        acc = torch.float64 if tensor.dtype == torch.float64 else torch.float32
        scale = flat.to(acc).abs().mean() if flat.numel() else torch.zeros((), dtype=acc, device=tensor.device)
        return Payload({"signs": (flat >= 0).to(torch.uint8), "scale": scale.reshape(1).to(torch.float32)},
                       tensor.shape, tensor.dtype, tensor.device)

    def decode(self, payload, out=None):
        s = payload.buffers["scale"].to(torch.float64 if payload.dtype == torch.float64 else torch.float32)
        flat = torch.where(payload.buffers["signs"].bool(), s, -s).to(payload.dtype)
        result = flat.view(payload.shape)
        return result if out is None else out.copy_(result)


CODECS = {
    "onebit-native": lambda: hgc.get_codec("onebit", impl="native"),
    "onebit-reference": lambda: hgc.get_codec("onebit", impl="reference"),
    "sign-mean": lambda: SignMeanCodec(),
}


@pytest.fixture(params=list(CODECS))
def codec(request):
    return CODECS[request.param]()


NAMES = {"w": (16, 3, 3, 3), "b": (16,), "fc": (5, 7), "s": ()}


def _step_grads(step, dtype, device, shapes=NAMES):
    gen = torch.Generator().manual_seed(1000 + step)
    return {name: (torch.randn(shape, generator=gen, dtype=torch.float64) + 0.2).to(dtype).to(device)
            for name, shape in shapes.items()}


# -- the identity ---------------------------------------------------------------------------

def test_identity_every_step(codec, dtype, device, assert_feedback_identity):
    ef = ErrorFeedback()
    first = {}
    for step in range(4):
        for name, g in _step_grads(step, dtype, device).items():
            r_old = ef.residuals[name].clone() if name in ef.residuals else torch.zeros_like(g)
            before = g.clone()
            payload = ef.encode(codec, name, g)
            assert torch.equal(g, before), "the gradient was changed"
            r_new = ef.residuals[name]
            first.setdefault(name, r_new)
            assert r_new is first[name], "the residual is updated in place, not replaced"
            assert r_new.shape == g.shape and r_new.dtype == dtype and r_new.device == g.device
            assert_feedback_identity(g, r_old, codec.decode(payload), r_new)
    assert set(ef.residuals) == set(NAMES)


def test_identity_for_every_shape(codec, shape, dtype, device, make_grad, assert_feedback_identity):
    ef = ErrorFeedback()
    for step in range(2):
        g = make_grad(shape, dtype, device, seed=step)
        r_old = ef.residuals["p"].clone() if "p" in ef.residuals else torch.zeros_like(g)
        payload = ef.encode(codec, "p", g)
        assert_feedback_identity(g, r_old, codec.decode(payload), ef.residuals["p"])


def test_non_fused_codec_is_handed_gradient_plus_residual(dtype, device, make_grad):
    codec = SignMeanCodec()
    ef = ErrorFeedback()
    g0, g1 = make_grad((6, 5), dtype, device, seed=0), make_grad((6, 5), dtype, device, seed=1)
    ef.encode(codec, "p", g0)
    r = ef.residuals["p"].clone()
    ef.encode(codec, "p", g1)
    assert torch.equal(codec.seen[0], g0)
    assert torch.equal(codec.seen[1], g1 + r)


def test_first_residual_is_the_quantization_error(codec, dtype, device, make_grad, assert_feedback_identity):
    ef = ErrorFeedback()
    g = make_grad((9, 13), dtype, device, seed=3)
    payload = ef.encode(codec, "p", g)
    assert ef.residuals["p"] is not g
    # the same payload as encoding the gradient alone (the residual starts at zero)
    alone = codec.encode(g)
    for name in payload.buffers:
        assert torch.equal(payload.buffers[name], alone.buffers[name])
    assert_feedback_identity(g, torch.zeros_like(g), codec.decode(payload), ef.residuals["p"])


def test_sum_of_sent_plus_residual_is_sum_of_gradients(codec, device):
    """Over T steps (float64): sum_t decode(payload_t) + r_T == sum_t g_t."""
    ef = ErrorFeedback()
    sent = {n: torch.zeros(s, dtype=torch.float64, device=device) for n, s in NAMES.items()}
    total = {n: torch.zeros(s, dtype=torch.float64, device=device) for n, s in NAMES.items()}
    for step in range(12):
        for name, g in _step_grads(step, torch.float64, device).items():
            total[name] += g
            sent[name] += codec.decode(ef.encode(codec, name, g))
    for name in NAMES:
        torch.testing.assert_close(sent[name] + ef.residuals[name], total[name], rtol=0, atol=1e-10)


# -- mismatches -----------------------------------------------------------------------------

def test_residual_shape_mismatch(codec, device):
    ef = ErrorFeedback()
    ef.encode(codec, "p", torch.randn(4, 5, generator=torch.Generator().manual_seed(0)).to(device))
    kept = ef.residuals["p"].clone()
    for bad in (torch.randn(5, 4), torch.randn(20), torch.randn(4, 5, 1)):
        with pytest.raises(ValueError, match="'p'"):
            ef.encode(codec, "p", bad.to(device))
    with pytest.raises(ValueError, match="'p'"):
        ef.encode(codec, "p", torch.randn(4, 5, dtype=torch.float64).to(device))
    assert torch.equal(ef.residuals["p"], kept), "a rejected gradient changed the residual"
    # another name is another residual
    ef.encode(codec, "q", torch.randn(5, 4).to(device))
    assert ef.residuals["q"].shape == (5, 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available (torch.cuda.is_available() is False)")
def test_residual_device_mismatch(codec):
    ef = ErrorFeedback()
    ef.encode(codec, "p", torch.randn(4, 5))
    with pytest.raises(ValueError, match="'p'"):
        ef.encode(codec, "p", torch.randn(4, 5, device="cuda"))


# -- checkpoints ----------------------------------------------------------------------------

def _run(ef, codec, steps, dtype, device):
    payloads = []
    for step in steps:
        for name, g in _step_grads(step, dtype, device).items():
            payloads.append((name, ef.encode(codec, name, g)))
    return payloads


@pytest.mark.parametrize("load_device", [None, "same"], ids=["no_device", "device"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_state_dict_round_trip(codec, dtype, device, load_device):
    ef = ErrorFeedback()
    _run(ef, codec, range(3), dtype, device)
    state = ef.state_dict()
    assert state["enabled"] is True and set(state["residuals"]) == set(NAMES)

    restored = ErrorFeedback(enabled=False)
    restored.load_state_dict(state, device=None if load_device is None else torch.device(device))
    assert restored.enabled is True
    for name in NAMES:
        r = restored.residuals[name]
        assert r.dtype == dtype and r.device == device and torch.equal(r, ef.residuals[name])

    # encoding continues identically
    a, b = _run(ef, codec, range(3, 6), dtype, device), _run(restored, codec, range(3, 6), dtype, device)
    for (name_a, pa), (name_b, pb) in zip(a, b):
        assert name_a == name_b
        for buf in pa.buffers:
            assert torch.equal(pa.buffers[buf], pb.buffers[buf]), (name_a, buf)
    for name in NAMES:
        assert torch.equal(ef.residuals[name], restored.residuals[name])


@pytest.mark.parametrize("load_device", [None, "same"], ids=["no_device", "device"])
def test_load_state_dict_does_not_alias_the_state(load_device, device):
    """A loaded memory owns its residuals: encoding with it afterwards leaves the state dict
    (which may be loaded again, or into another memory) as it was, whether or not
    ``load_state_dict`` was given a device."""
    codec = hgc.get_codec("onebit", impl="native")
    ef = ErrorFeedback()
    _run(ef, codec, range(2), torch.float32, device)
    state = ef.state_dict()
    snapshot = {k: v.clone() for k, v in state["residuals"].items()}
    restored = ErrorFeedback()
    restored.load_state_dict(state, device=None if load_device is None else torch.device(device))
    _run(restored, codec, range(2, 4), torch.float32, device)
    changed = [name for name in NAMES if not torch.equal(state["residuals"][name], snapshot[name])]
    assert not changed, (f"encoding after load_state_dict(state, device={load_device and str(device)!r}) changed "
                         f"the residuals {changed} of the state dict: the loaded residuals alias it")


def test_state_dict_survives_serialization(codec, device):
    ef = ErrorFeedback()
    _run(ef, codec, range(2), torch.float32, device)
    buf = io.BytesIO()
    torch.save(ef.state_dict(), buf)
    buf.seek(0)
    restored = ErrorFeedback()
    restored.load_state_dict(torch.load(buf, weights_only=True))
    for name in NAMES:
        assert torch.equal(restored.residuals[name], ef.residuals[name])
    a, b = _run(ef, codec, [5], torch.float32, device), _run(restored, codec, [5], torch.float32, device)
    for (_, pa), (_, pb) in zip(a, b):
        for name in pa.buffers:
            assert torch.equal(pa.buffers[name], pb.buffers[name])


def test_state_dict_does_not_alias_the_live_residuals(codec, device):
    ef = ErrorFeedback()
    _run(ef, codec, range(2), torch.float32, device)
    state = ef.state_dict()
    snapshot = {k: v.clone() for k, v in state["residuals"].items()}
    _run(ef, codec, range(2, 4), torch.float32, device)
    for name in NAMES:
        assert torch.equal(state["residuals"][name], snapshot[name])


# -- disabled -------------------------------------------------------------------------------

def test_disabled_keeps_no_residuals(codec, dtype, device):
    ef = ErrorFeedback(enabled=False)
    for step in range(3):
        for name, g in _step_grads(step, dtype, device).items():
            before = g.clone()
            payload = ef.encode(codec, name, g)
            alone = codec.encode(g)
            for buf in payload.buffers:
                assert torch.equal(payload.buffers[buf], alone.buffers[buf])
            assert torch.equal(g, before)
    assert ef.residuals == {}
    state = ef.state_dict()
    assert state == {"enabled": False, "residuals": {}}
    other = ErrorFeedback()
    other.load_state_dict(state)
    assert other.enabled is False and other.residuals == {}


def test_disabled_non_fused_codec_sees_the_bare_gradient(dtype, device, make_grad):
    codec = SignMeanCodec()
    ef = ErrorFeedback(enabled=False)
    grads = [make_grad((4, 4), dtype, device, seed=s) for s in range(3)]
    for g in grads:
        ef.encode(codec, "p", g)
    assert all(torch.equal(seen, g) for seen, g in zip(codec.seen, grads))


# -- the toy codec stays local ------------------------------------------------------------------

@pytest.fixture
def registered_sign_mean():
    """SignMeanCodec registered under a unique name for one test, removed afterwards."""
    name = "test_feedback_sign_mean_registered"
    cls = type("RegisteredSignMean", (SignMeanCodec,), {})
    registry.register_codec(name)(cls)
    try:
        yield name
    finally:
        registry._REGISTRY.pop(name, None)


def test_registered_toy_codec_works_through_get_codec(registered_sign_mean, assert_feedback_identity):
    assert registered_sign_mean in hgc.available_codecs()
    codec = hgc.get_codec(registered_sign_mean, impl="reference")
    assert codec.name == registered_sign_mean and not codec.fuses_feedback
    ef = ErrorFeedback()
    g = torch.randn(8, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    payload = ef.encode(codec, "p", g)
    assert_feedback_identity(g, torch.zeros_like(g), codec.decode(payload), ef.residuals["p"])
    with pytest.raises(ValueError, match="registered twice"):
        registry.register_codec(registered_sign_mean)(type("Again", (SignMeanCodec,), {}))


def test_toy_codecs_do_not_leak_into_the_registry():
    assert "test_sign_mean" not in hgc.available_codecs()
    assert not any(name.startswith("test_") for name in hgc.available_codecs())
