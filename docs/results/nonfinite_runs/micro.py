"""One rank's non-finite check + encode of ResNet-50's gradients (onebit, error feedback on;
TernGrad local scales), old order (has_nonfinite, then the whole encode) against the new one
(measure, then the pack). torch threads 1; median of 15 after 3 warm-ups."""
import statistics, time, torch
import horovod_gradcomp as hgc
from horovod_gradcomp.bench.shapes import resnet50_shapes
from horovod_gradcomp.exchange.preamble import has_nonfinite
torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
grads = [torch.randn(s, generator=gen) for s in resnet50_shapes()]
named = {f"p{i}": g for i, g in enumerate(grads)}
res = [torch.randn(g.shape, generator=gen) * 0.1 for g in grads]
codec = hgc.get_codec("onebit")
tern = hgc.get_codec("terngrad")
def t(fn, n=15, w=3):
    for _ in range(w): fn()
    xs = []
    for _ in range(n):
        t0 = time.perf_counter(); fn(); xs.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(xs)
r1 = [r.clone() for r in res]
copy = t(lambda: [r.copy_(q) for r, q in zip(r1, res)])
check = t(lambda: has_nonfinite(named))
def old():
    for r, q in zip(r1, res): r.copy_(q)
    has_nonfinite(named)
    codec.encode_many(grads, r1)
def new():
    for r, q in zip(r1, res): r.copy_(q)
    s = codec.measure_many(grads, r1)
    bool(torch.isfinite(torch.cat(s)).all())
    codec.encode_many(grads, r1, [{"scales": x} for x in s])
def meas_only():
    for r, q in zip(r1, res): r.copy_(q)
    bool(torch.isfinite(torch.cat(codec.measure_many(grads, r1))).all())
o, n, m = t(old), t(new), t(meas_only)
tl = t(lambda: tern.local_scales_many(grads))
print(f"onebit old: has_nonfinite {check:.1f} + encode {o - copy - check:.1f} = {o - copy:.1f} ms")
print(f"onebit new: measure {m - copy:.1f} + pack {n - m:.1f} = {n - copy:.1f} ms (residual restore {copy:.1f} ms subtracted)")
print(f"terngrad: has_nonfinite {check:.1f} ms; local scales {tl:.1f} ms, computed once either way")
