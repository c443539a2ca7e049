"""``hgc.ddp.hold_backward_context`` and ``keep_until_exit``, single process: during a backward
of a marked module one more reference to the context PyTorch stashes is held, until the next
backward replaces it; gradients are unchanged; a second call returns the first hook; kept
tensors gain a C++ reference; bad input is refused.

Why they exist (an abort of gloo jobs at exit) is in horovod_gradcomp/ddp/gloo_exit.py; a docs
block of docs/guide/ddp.md runs the first under torchrun on a plain DDP model."""
from __future__ import annotations

import sys

import pytest
import torch
import torch.nn as nn

import horovod_gradcomp as hgc
from horovod_gradcomp.native import _C

STASHES = hasattr(torch._C, "_get_obj_in_tls")


def _stashed_context_after_backward(model: nn.Module):
    """Run a backward through ``model``; return (the context stashed during it, the gradients)."""
    seen = []

    def look(grad):
        if torch._C._is_key_in_tls("context"):
            seen.append(torch._C._get_obj_in_tls("context"))
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), requires_grad=True)
    x.register_hook(look)            # runs last: after the model's output hook
    model.zero_grad()
    model(x).square().sum().backward()
    return (seen[0] if seen else None), [p.grad.clone() for p in model.parameters()]


@pytest.mark.skipif(not STASHES, reason="this PyTorch has no thread-local Python objects")
def test_the_backward_context_is_held_until_the_next_backward():
    torch.manual_seed(0)
    plain, marked = nn.Linear(3, 2), nn.Linear(3, 2)
    marked.load_state_dict(plain.state_dict())
    hgc.ddp.hold_backward_context(marked)
    ctx_plain, grads_plain = _stashed_context_after_backward(plain)
    ctx_marked, grads_marked = _stashed_context_after_backward(marked)
    if ctx_plain is None:
        pytest.skip("this PyTorch does not stash a context during backward")
    # the caller's name, the getrefcount argument, and (marked only) the native holder
    assert sys.getrefcount(ctx_marked) == sys.getrefcount(ctx_plain) + 1
    assert all(torch.equal(a, b) for a, b in zip(grads_plain, grads_marked)), "gradients unchanged"
    before = sys.getrefcount(ctx_marked)
    _stashed_context_after_backward(marked)
    assert sys.getrefcount(ctx_marked) == before - 1, "the next backward releases the previous context"


def test_outside_a_backward_nothing_is_stashed_to_hold():
    assert _C.retain_backward_context() is False


def test_a_second_call_returns_the_first_hook_and_remove_undoes_it():
    model = nn.Linear(3, 2)
    first = hgc.ddp.hold_backward_context(model)
    assert hgc.ddp.hold_backward_context(model) is first and len(model._forward_hooks) == 1
    first.remove()
    assert len(model._forward_hooks) == 0
    again = hgc.ddp.hold_backward_context(model)
    assert again is not first and len(model._forward_hooks) == 1


def test_outputs_without_grad_and_nested_outputs():
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, x):
            return {"ids": torch.arange(2), "out": [self.lin(x)]}
    model = Pair()
    hgc.ddp.hold_backward_context(model)
    with torch.no_grad():
        model(torch.randn(4, 3))       # nothing requires grad: no hook, no error
    model(torch.randn(4, 3))["out"][0].sum().backward()
    assert model.lin.weight.grad is not None


def test_refuses_what_is_not_a_module():
    with pytest.raises(TypeError, match="nn.Module"):
        hgc.ddp.hold_backward_context(lambda x: x)


def test_keep_until_exit_refuses_what_is_not_a_tensor():
    with pytest.raises(TypeError, match="expected tensors"):
        hgc.ddp.keep_until_exit(torch.ones(2), [1, 2])


def test_keep_until_exit_holds_a_cpp_reference():
    """While C++ holds a tensor, PyTorch holds its Python object: one more reference."""
    plain, kept = torch.ones(2), torch.ones(2)
    hgc.ddp.keep_until_exit(kept)
    assert sys.getrefcount(kept) == sys.getrefcount(plain) + 1


def test_hold_latest_holds_one_set_per_slot():
    """Each call holds its tensors (one more reference each) and releases the slot's previous
    ones; slots are independent."""
    plain, first, second, other = torch.ones(2), torch.ones(2), torch.ones(2), torch.ones(2)
    hgc.ddp.hold_latest("test slot", first)
    hgc.ddp.hold_latest("other test slot", other)
    assert sys.getrefcount(first) == sys.getrefcount(plain) + 1
    hgc.ddp.hold_latest("test slot", second)
    assert sys.getrefcount(first) == sys.getrefcount(plain)
    assert sys.getrefcount(second) == sys.getrefcount(plain) + 1
    assert sys.getrefcount(other) == sys.getrefcount(plain) + 1
    with pytest.raises(TypeError, match="expected tensors"):
        hgc.ddp.hold_latest("test slot", "not a tensor")
