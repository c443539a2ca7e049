"""The cases of the ThreadSanitizer driver (tests/test_twin_tsan.py, csrc/sanitize/): seeded
inputs and the outputs the native CPU kernels give for them, one directory per case.

Per tensor: onebit encode and decode-sum (both modes), TernGrad encode and decode-sum, DGC
selection and scatter-sum, QSGD fixed-width encode and Elias encode and decode. And every bucket
op of every codec (csrc/ops/schemas.h's ``*_many``), through the launchers its torch op calls
(csrc/device/<codec>_ops.cpp), over several tensors: onebit encode (both passes, the scales
alone, the pack alone, without residual, column windows) and decode-sum (whole tensors, column
windows of a full output); TernGrad scale statistics, encode, decode-sum; QSGD fixed and Elias
encode (fp32 and fp64 tensors in one bucket) and decode-sums; DGC selection (all three paths
and k >= n), decode-sums of absolute indices and of gap codes, momentum correction (plain and
Nesterov with clipping), masking (with and without u), index code.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from horovod_gradcomp.native import require_native
from horovod_gradcomp.ops import DTYPE_CODES

f32, f64 = torch.float32, torch.float64
DEV = {torch.float16: 0, torch.bfloat16: 1, f32: 2, f64: 3}  # csrc/device/context.h's DType codes


def write(dirpath: Path, op: str, params: dict, inputs: dict, expect: dict) -> str:
    """One case directory: case.txt (op, then key=value lines), <name> input files and
    <name>.expect output files (the tensors' bytes)."""
    dirpath.mkdir(parents=True)
    (dirpath / "case.txt").write_text(op + "\n" + "".join(f"{k}={v}\n" for k, v in params.items()))
    for name, t in inputs.items():
        (dirpath / name).write_bytes(_bytes(t))
    for name, t in expect.items():
        (dirpath / f"{name}.expect").write_bytes(_bytes(t))
    return str(dirpath)


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _items(prefix: str, values: list) -> dict:
    return {f"{prefix}{t}": v for t, v in enumerate(values)}


def _files(prefix: str, tensors: list) -> dict:
    return {f"{prefix}{t}.bin": x for t, x in enumerate(tensors)}


def _outs(prefix: str, tensors: list) -> dict:
    return {f"{prefix}{t}": x for t, x in enumerate(tensors)}


def _grads(gen, sizes, dtypes=(f32,), zeros=False):
    out = []
    for i, n in enumerate(sizes):
        g = torch.randn(n, generator=gen, dtype=f64)
        if zeros and n > 10:
            g[::7] = 0.0  # runs of zeros: the Elias gaps
        out.append(g.to(dtypes[i % len(dtypes)]))
    return out


def all_cases(base: Path) -> list:
    require_native()
    gen = torch.Generator().manual_seed(7)
    return onebit_cases(base, gen) + terngrad_cases(base, gen) + dgc_cases(base, gen) + qsgd_cases(base, gen)


def onebit_cases(base: Path, gen) -> list:
    C, ops = require_native(), torch.ops.hgc
    cases = []
    # (rows, cols, rows mode): `cols` below is the kernels' group count (rows mode: the rows)
    shapes = ((40, 25, 0), (70001, 1, 0), (13, 296, 0), (40, 25, 1), (13, 2049, 1))
    for rows, cols, by_rows in shapes:
        n, groups = rows * cols, rows if by_rows else cols
        g = torch.randn(n, generator=gen)
        r = torch.randn(n, generator=gen) * 0.1
        r_cpu = r.clone()
        bits, scales = C.onebit_encode(g, r_cpu, groups, None, bool(by_rows))
        cases.append(write(base / f"onebit_encode_{n}_{cols}_{by_rows}", "onebit_encode",
                           {"n": n, "cols": groups, "by_rows": by_rows}, {"grad.bin": g, "residual.bin": r},
                           {"bits": bits, "scales": scales, "residual": r_cpu}))
        pays = [C.onebit_encode(torch.randn(n, generator=gen), None, groups, None, bool(by_rows)) for _ in range(3)]
        b3, s3 = torch.stack([p[0] for p in pays]), torch.stack([p[1] for p in pays])
        cases.append(write(base / f"onebit_decode_{n}_{cols}_{by_rows}", "onebit_decode_sum",
                           {"n": n, "cols": groups, "K": 3, "scale": repr(1 / 3), "by_rows": by_rows},
                           {"bits.bin": b3, "scales.bin": s3},
                           {"out": C.onebit_decode_sum(b3, s3, n, groups, f32, 1 / 3, None, bool(by_rows))}))
    # the bucket ops over a matrix, a one-column tensor, a wide window's shape and two rows-mode tensors
    count = len(shapes)
    ns = [rows * cols for rows, cols, _ in shapes]
    groups = [rows if by_rows else cols for rows, cols, by_rows in shapes]
    modes = [bool(b) for _, _, b in shapes]
    params = {"count": count, **_items("n", ns), **_items("cols", groups), **_items("by_rows", map(int, modes))}
    grads = [torch.randn(n, generator=gen) for n in ns]
    res = [torch.randn(n, generator=gen) * 0.1 for n in ns]
    r_cpu = [r.clone() for r in res]
    bits, scales = ops.onebit_encode_many(grads, r_cpu, groups, None, modes)
    ins = {**_files("grad", grads), **_files("residual", res)}
    cases.append(write(base / "onebit_encode_many", "onebit_encode_many", params, ins,
                       {**_outs("bits", bits), **_outs("scales", scales), **_outs("residual", r_cpu)}))
    # the scales alone (onebit_scales_many: the residual read, not written)
    only = ops.onebit_scales_many(grads, res, groups, modes)
    cases.append(write(base / "onebit_scales_many", "onebit_encode_many", dict(params, passes=1), ins,
                       {**_outs("scales", only), **_outs("residual", res)}))
    # the pack alone, with those scales given
    r_cpu = [r.clone() for r in res]
    bits, _ = ops.onebit_encode_many(grads, r_cpu, groups, list(only), modes)
    cases.append(write(base / "onebit_pack_many", "onebit_encode_many", dict(params, passes=2),
                       {**ins, **_files("scales", only)}, {**_outs("bits", bits), **_outs("residual", r_cpu)}))
    # without residual
    bits, scales = ops.onebit_encode_many(grads, None, groups, None, modes)
    cases.append(write(base / "onebit_encode_many_nores", "onebit_encode_many", dict(params, no_residual=1),
                       _files("grad", grads), {**_outs("bits", bits), **_outs("scales", scales)}))
    # decode-sum of K = 3 payloads per tensor
    pays = [ops.onebit_encode_many([torch.randn(n, generator=gen) for n in ns], None, groups, None, modes)
            for _ in range(3)]
    b3 = [torch.stack([p[0][t] for p in pays]) for t in range(count)]
    s3 = [torch.stack([p[1][t] for p in pays]) for t in range(count)]
    outs = ops.onebit_decode_sum_many(b3, s3, ns, groups, [DTYPE_CODES[f32]] * count, 1 / 3, modes)
    cases.append(write(base / "onebit_decode_sum_many", "onebit_decode_sum_many",
                       dict(params, K=3, scale=repr(1 / 3)), {**_files("bits", b3), **_files("scales", s3)},
                       _outs("out", outs)))
    # column windows (the two-phase exchange's stripes): (rows, full columns, col0, col1)
    wins = ((40, 4, 1, 3), (700, 8, 0, 5), (13, 300, 2, 299))
    fulls = [torch.randn(rows * fc, generator=gen) for rows, fc, _, _ in wins]
    fres = [torch.randn(f.numel(), generator=gen) * 0.1 for f in fulls]
    fr_cpu = [r.clone() for r in fres]
    fc, c0, c1 = [w[1] for w in wins], [w[2] for w in wins], [w[3] for w in wins]
    bits, scales = ops.onebit_encode_columns_many(fulls, fr_cpu, fc, c0, c1, None)
    wparams = {"count": len(wins), **_items("n", [w[0] * (w[3] - w[2]) for w in wins]),
               **_items("cols", [w[3] - w[2] for w in wins]), **_items("ld", fc), **_items("off", c0)}
    cases.append(write(base / "onebit_encode_columns_many", "onebit_encode_many", wparams,
                       {**_files("grad", fulls), **_files("residual", fres)},
                       {**_outs("bits", bits), **_outs("scales", scales), **_outs("residual", fr_cpu)}))
    start = [torch.randn(f.numel(), generator=gen) for f in fulls]
    decoded = [s.clone() for s in start]
    ops.onebit_decode_columns_many(list(bits), list(scales), decoded, fc, c0, c1)
    cases.append(write(base / "onebit_decode_columns_many", "onebit_decode_sum_many",
                       dict(wparams, K=1, scale="1.0", **_items("out_given", [1] * len(wins))),
                       {**_files("bits", bits), **_files("scales", scales), **_files("out", start)},
                       _outs("out", decoded)))
    return cases


def terngrad_cases(base: Path, gen) -> list:
    C, ops = require_native(), torch.ops.hgc
    cases = []
    for n in (1, 33, 100003):
        g = torch.randn(n, generator=gen)
        scale = float(g.abs().max())
        codes, _ = C.terngrad_encode(g, scale, float("inf"), 5, 9)
        cases.append(write(base / f"terngrad_encode_{n}", "terngrad_encode",
                           {"n": n, "scale": repr(scale), "clip": "inf", "key0": 5, "key1": 9}, {"grad.bin": g},
                           {"codes": codes}))
        c3 = torch.stack([C.terngrad_encode(torch.randn(n, generator=gen), 1.5, float("inf"), k, 1)[0]
                          for k in range(3)])
        s3 = torch.full((3, 1), 1.5)
        cases.append(write(base / f"terngrad_decode_{n}", "terngrad_decode_sum",
                           {"n": n, "K": 3, "scale": repr(1 / 3)}, {"codes.bin": c3, "scales.bin": s3},
                           {"out": C.terngrad_decode_sum(c3, s3, n, f32, 1 / 3, None)}))
    ns = [1, 33, 5000, 100003]
    count = len(ns)
    grads = [torch.randn(n, generator=gen) for n in ns]
    cases.append(write(base / "terngrad_scale_stats_many", "terngrad_scale_stats_many",
                       {"count": count, **_items("n", ns)}, _files("grad", grads),
                       {"stats": ops.terngrad_scale_stats_many(grads, True)}))
    stats = ops.terngrad_scale_stats_many(grads, True)
    scales = [float(s) for s in stats[0]]
    clips = [math.inf, 2.5 * float(stats[1][1]), math.inf, 2.5 * float(stats[1][3])]
    keys0, keys1 = [3 + t for t in range(count)], [11] * count
    codes, _ = ops.terngrad_encode_many(grads, scales, clips, keys0, keys1)
    params = {"count": count, **_items("n", ns), **_items("scale", map(repr, scales)),
              **_items("clip", map(repr, clips)), **_items("key0", keys0), **_items("key1", keys1)}
    cases.append(write(base / "terngrad_encode_many", "terngrad_encode_many", params, _files("grad", grads),
                       _outs("codes", codes)))
    # K = 3 payloads per tensor; tensor 1's with three different scales (not the integer path)
    c3 = [torch.stack([ops.terngrad_encode(torch.randn(n, generator=gen), 1.5, math.inf, k, t)[0] for k in range(3)])
          for t, n in enumerate(ns)]
    s3 = [torch.full((3, 1), 1.5) for _ in ns]
    s3[1] = torch.tensor([[1.5], [0.75], [2.0]])
    outs = ops.terngrad_decode_sum_many(c3, s3, ns, [DTYPE_CODES[f32]] * count, 1 / 3)
    cases.append(write(base / "terngrad_decode_sum_many", "terngrad_decode_sum_many",
                       {"count": count, "K": 3, "scale": repr(1 / 3), **_items("n", ns)},
                       {**_files("codes", c3), **_files("scales", s3)}, _outs("out", outs)))
    return cases


def qsgd_cases(base: Path, gen) -> list:
    C, ops = require_native(), torch.ops.hgc
    cases = []
    for n, s, d, mx in ((100003, 15, 512, 0), (777, 255, 100, 1)):
        x = torch.randn(n, generator=gen)
        norms, packed = C.qsgd_encode_fixed(x, s, d, bool(mx), 11)
        cases.append(write(base / f"qsgd_fixed_{n}_{s}", "qsgd_encode_fixed",
                           {"n": n, "s": s, "d": d, "max_norm": mx, "key": 11}, {"x.bin": x},
                           {"norms": norms, "packed": packed}))
        x = _grads(gen, [n], zeros=True)[0]
        gb = 2
        en, nb, st = C.qsgd_encode_elias(x, s, d, bool(mx), 13, gb)
        p = {"n": n, "s": s, "d": d, "max_norm": mx, "key": 13, "gb": gb}
        cases.append(write(base / f"qsgd_elias_{n}_{s}", "qsgd_encode_elias", p, {"x.bin": x},
                           {"norms": en, "nbits": nb, "stream": st}))
        cases.append(write(base / f"qsgd_elias_decode_{n}_{s}", "qsgd_decode_elias", p,
                           {"norms.bin": en, "nbits.bin": nb, "stream.bin": st},
                           {"out": C.qsgd_decode_elias(en, nb, st, n, s, d, gb, f32, None)}))
    # the bucket ops: fp32 and fp64 tensors in one bucket
    ns, dts = [1, 7, 5000, 70001], [f32, f64, f32, f64]
    count, s, d, gb, K = len(ns), 15, 64, 3, 2
    codes = [DTYPE_CODES[t] for t in dts]
    xs = _grads(gen, ns, dts, zeros=True)
    keys = [17 + 7919 * t for t in range(count)]
    params = {"count": count, "s": s, "d": d, "max_norm": 1, "gb": gb, **_items("n", ns), **_items("key", keys),
              **_items("dt", [DEV[t] for t in dts])}
    norms, packed = ops.qsgd_encode_fixed_many(xs, s, d, True, keys)
    cases.append(write(base / "qsgd_encode_fixed_many", "qsgd_encode_fixed_many", params, _files("x", xs),
                       {**_outs("norms", norms), **_outs("packed", packed)}))
    en, nb, st = ops.qsgd_encode_elias_many(xs, s, d, True, keys, gb)
    cases.append(write(base / "qsgd_encode_elias_many", "qsgd_encode_elias_many", params, _files("x", xs),
                       {**_outs("norms", en), **_outs("nbits", nb), **_outs("stream", st)}))
    # decode-sums of K payloads per tensor
    fixed = [ops.qsgd_encode_fixed_many(_grads(gen, ns, dts), s, d, False, keys) for _ in range(K)]
    n3 = [torch.stack([f[0][t] for f in fixed]) for t in range(count)]
    p3 = [torch.stack([f[1][t] for f in fixed]) for t in range(count)]
    dparams = {"count": count, "K": K, "s": s, "d": d, "gb": gb, "scale": repr(1 / K), **_items("n", ns),
               **_items("dt", [DEV[t] for t in dts])}
    outs = ops.qsgd_decode_fixed_many(n3, p3, ns, s, d, codes, 1 / K)
    cases.append(write(base / "qsgd_decode_fixed_many", "qsgd_decode_fixed_many", dparams,
                       {**_files("norms", n3), **_files("packed", p3)}, _outs("out", outs)))
    elias = [ops.qsgd_encode_elias_many(_grads(gen, ns, dts, zeros=True), s, d, False, keys, gb) for _ in range(K)]
    ins, flat = {}, ([], [], [])
    for t in range(count):
        for r in range(K):
            for j, name in enumerate(("norms", "nbits", "stream")):
                ins[f"{name}{t}_{r}.bin"] = elias[r][j][t]
                flat[j].append(elias[r][j][t])
    outs = ops.qsgd_decode_elias_many(flat[0], [K] * count, flat[1], [K] * count, flat[2], [K] * count, ns, s, d, gb,
                                      codes, 1 / K)
    cases.append(write(base / "qsgd_decode_elias_many", "qsgd_decode_elias_many", dparams, ins, _outs("out", outs)))
    return cases


def dgc_cases(base: Path, gen) -> list:
    C, ops = require_native(), torch.ops.hgc
    cases = []
    for n, k, m in ((5000, 50, 500), (200003, 200, 2000), (1000, 10, 0)):
        x = torch.randn(n, generator=gen)
        idx, vals, _, _ = C.dgc_select(x, k, m, 3)
        cases.append(write(base / f"dgc_select_{n}_{m}", "dgc_select", {"n": n, "k": k, "sample_count": m, "key": 3},
                           {"x.bin": x}, {"idx": idx, "vals": vals}))
        sel = [C.dgc_select(torch.randn(n, generator=gen), k, m, 4 + r)[:2] for r in range(2)]
        ins = {}
        for r, (i, v) in enumerate(sel):
            ins[f"idx{r}.bin"], ins[f"vals{r}.bin"] = i, v
        cases.append(write(base / f"dgc_scatter_{n}_{m}", "dgc_scatter_sum", {"n": n, "K": 2, "scale": "0.5"}, ins,
                           {"out": C.dgc_scatter_sum([i for i, _ in sel], [v for _, v in sel], n, f32, 0.5, None)}))
    # selection: a sampled estimate within 2x (path 0), ties far above it (path 1, the device's
    # radix select), no samples (path 2), k >= n, an fp64 tensor (8 radix passes), a few nonzeros
    # among zeros (an estimate under k/2: path 2 by the radix select)
    n = 40_000
    ties = (1.0 + (torch.arange(n) % 2).double()).to(f32)
    sparse = torch.zeros(n, dtype=f32)
    sparse[::4000] = 2.5
    xs = [torch.randn(n, generator=gen), ties, torch.randn(3000, generator=gen), torch.randn(50, generator=gen),
          torch.randn(20_001, generator=gen, dtype=f64), sparse]
    ks, ms = [n // 100, n // 100, 30, 80, 200, n // 100], [n // 10, n // 100, 0, 10, 400, n // 100]
    keys = [5 + t for t in range(len(xs))]
    idx, vals, thr, paths = ops.dgc_select_many(xs, ks, ms, keys)
    assert {0, 1, 2} <= set(paths), paths
    cases.append(write(base / "dgc_select_many", "dgc_select_many",
                       {"count": len(xs), **_items("n", [x.numel() for x in xs]), **_items("k", ks), **_items("m", ms),
                        **_items("key", keys), **_items("dt", [DEV[x.dtype] for x in xs])},
                       _files("x", xs), {**_outs("idx", idx), **_outs("vals", vals),
                                         "paths": torch.tensor(paths, dtype=torch.int64),
                                         "thresholds": torch.tensor(thr, dtype=f64)}))
    # decode-sums, K = 2 payloads per tensor: absolute indices (w = 4), and gap codes of 1, 2 and
    # 4 bytes (dgc_index_encode's choice: gaps under 256, under 65536, wider: tensor 2's two
    # largest values 70000 and 229000 apart)
    ns, ks, dts = [5000, 200_003, 300_000], [500, 200, 2], [f32, f64, f32]
    count, K = len(ns), 2

    def sparse_source(t, r):
        x = torch.randn(ns[t], generator=gen, dtype=dts[t])
        if t == 2:
            x *= 0.01
            x[70_000 + r], x[299_000 - r] = 5.0, -6.0
        return x

    sel = [[ops.dgc_select(sparse_source(t, r), ks[t], 0, 0)[:2] for t in range(count)] for r in range(K)]
    sparams = {"count": count, "K": K, "scale": "0.5", **_items("n", ns), **_items("dt", [DEV[t] for t in dts])}
    codes = [DTYPE_CODES[t] for t in dts]
    for name, coded in (("dgc_scatter_sum_many", False), ("dgc_decode_sum_many", True)):
        ins, params, flat_i, flat_v = {}, dict(sparams), [], []
        for t in range(count):
            for r in range(K):
                i, v = sel[r][t]
                code = ops.dgc_index_encode(i, ns[t]) if coded else i
                ins[f"index{t}_{r}.bin"], ins[f"vals{t}_{r}.bin"] = code, v
                params[f"w{t}_{r}"] = code.numel() * code.element_size() // i.numel()
                flat_i.append(code)
                flat_v.append(v)
        if coded:
            assert {params[f"w{t}_0"] for t in range(count)} == {1, 2, 4}, params
        op = getattr(ops, name)
        outs = op(flat_i, [K] * count, flat_v, [K] * count, ns, codes, 0.5)
        cases.append(write(base / name, "dgc_sum_many", params, ins, _outs("out", outs)))
    # momentum correction: plain, and Nesterov with clipping; fp32 and fp64 tensors
    ns, dts = [1, 777, 30_001], [f32, f64, f32]
    us, vs, gs = (_grads(gen, ns, dts) for _ in range(3))
    for nesterov, coef in ((0, 1.0), (1, 0.5)):
        u2, v2 = [u.clone() for u in us], [v.clone() for v in vs]
        ops.dgc_accumulate_many(u2, v2, gs, 0.9, bool(nesterov), coef)
        cases.append(write(base / f"dgc_accumulate_many_{nesterov}", "dgc_accumulate_many",
                           {"count": len(ns), "momentum": "0.9", "nesterov": nesterov, "coef": repr(coef),
                            **_items("n", ns), **_items("dt", [DEV[t] for t in dts])},
                           {**_files("u", us), **_files("v", vs), **_files("g", gs)},
                           {**_outs("u", u2), **_outs("v", v2)}))
    # masking, with and without u; and the index code of those selections
    idx = [ops.dgc_select(v, max(1, v.numel() // 10), 0, 0)[0] for v in vs]
    for with_u in (1, 0):
        v2, u2 = [v.clone() for v in vs], [u.clone() for u in us]
        ops.dgc_mask_many(idx, v2, u2 if with_u else None)
        expect = {**_outs("v", v2), **(_outs("u", u2) if with_u else {})}
        cases.append(write(base / f"dgc_mask_many_{with_u}", "dgc_mask_many",
                           {"count": len(ns), "no_u": 1 - with_u, **_items("n", ns),
                            **_items("dt", [DEV[t] for t in dts])},
                           {**_files("idx", idx), **_files("v", vs), **_files("u", us)}, expect))
    idx = [sel[0][t][0] for t in range(count)] + idx
    n_all = [5000, 200_003, 300_000] + ns
    cases.append(write(base / "dgc_index_encode_many", "dgc_index_encode_many",
                       {"count": len(idx), **_items("n", n_all)}, _files("idx", idx),
                       _outs("code", ops.dgc_index_encode_many(idx, n_all))))
    return cases
