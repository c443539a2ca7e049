"""Decoder fuzzing driver (run as a script, in a subprocess: a crash must not take pytest down).

    python tests/fuzz_decoders.py --target TARGET --seed S --cases N [--impls native,reference]
                                  [--native-ext PATH] [--device cpu|cuda] [--kernels native|twin]

Targets: ``onebit``, ``terngrad``, ``qsgd_fixed``, ``qsgd_elias``, ``dgc`` (each codec's decode
paths, through the codec API, native and/or reference), ``raw`` (the native entry points of
``horovod_gradcomp._C`` called directly, so that the Python checks do not shield them) and
``unpack_variable`` (the parser of variable-size parts received from other ranks).

Every case starts from a valid payload (a seeded random tensor of random shape and dtype,
encoded) and applies one mutation: none, truncated / extended / random-bytes buffers, bit
flips, corrupt headers (Elias bit counts, DGC index codes and counts), wrong dtypes, dims,
strides, K stacking, buffer names, output tensors, size arguments. Expected: a clean
exception of an allowed type (through the codec API, its message names the codec), or an
output of the payload's shape and dtype; an unmutated payload decodes exactly as the
reference decoder does. Before each case a ``CASE`` line is printed and flushed, so the last
one names the case that crashed the process. The last line is a JSON summary; the exit
status is 1 when a case failed.

``--native-ext PATH`` loads that build of the extension as ``horovod_gradcomp._C`` (the
AddressSanitizer test uses it). ``--device cuda`` (``raw`` only): the mutated arguments are
moved to the GPU before the call, so that the CUDA entry points get the same corpus.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import traceback
from typing import Callable, Dict, List

import torch

ALLOWED = (RuntimeError, ValueError, TypeError)
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
BIG_INTS = [-1, 0, 1, 2 ** 31 - 1, 2 ** 31, 2 ** 32 + 3, 2 ** 56, 2 ** 56 + 1, 2 ** 62, 2 ** 63 - 1, -(2 ** 63)]


def load_native(path: str) -> None:
    """Make ``horovod_gradcomp._C`` the extension at ``path`` (before the package loads its own)."""
    spec = importlib.util.spec_from_file_location("horovod_gradcomp._C", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules["horovod_gradcomp._C"] = mod
    from horovod_gradcomp import native
    assert native._C is mod, "the extension given by --native-ext was not the one loaded"


class Fuzzer:
    def __init__(self, target: str, seed: int, impls: List[str], device: str = "cpu", kernels: str = "native"):
        from horovod_gradcomp.codecs import get_codec
        from horovod_gradcomp.codecs.base import Payload
        self.get_codec, self.Payload = get_codec, Payload
        self.target, self.seed, self.impls, self.device = target, seed, impls, torch.device(device)
        self.kernels = kernels
        self.failures: List[str] = []
        self.counts: Dict[str, int] = {}

    # -- random material ------------------------------------------------------------------
    def shape(self, r: random.Random):
        big = r.random() < 0.15
        dims = r.choice([0, 1, 1, 2, 2, 3, 4])
        top = 70 if big else 9
        shape = [r.choice([0, 1]) if r.random() < 0.05 else r.randint(1, top) for _ in range(dims)]
        return torch.Size(shape)

    def tensor(self, r: random.Random, shape, dtype):
        g = torch.Generator().manual_seed(r.getrandbits(31))
        x = torch.randn(shape, generator=g, dtype=torch.float64)
        if r.random() < 0.2:  # sparse-ish, with exact zeros
            x = x * (torch.rand(shape, generator=g, dtype=torch.float64) < 0.1)
        return x.to(dtype)

    @staticmethod
    def rand_bytes(r: random.Random, n: int) -> torch.Tensor:
        return torch.tensor(list(r.randbytes(n)), dtype=torch.uint8)

    def mutate_buffer(self, r: random.Random, b: torch.Tensor, kind: str) -> torch.Tensor:
        """One buffer, mutated (any dims: mutations act on the last one)."""
        if kind == "truncate":
            return b[..., :r.randint(0, max(0, b.shape[-1] - 1))] if b.dim() else b.reshape(0)
        if kind == "extend":
            extra = torch.zeros(*b.shape[:-1], r.randint(1, 9), dtype=b.dtype) if b.dim() else b
            return torch.cat([b, extra.fill_(r.choice([0, 1, 255]) if b.dtype == torch.uint8 else 1)], -1)
        raw = b.contiguous().view(torch.uint8).clone() if b.dim() else b.reshape(1).view(torch.uint8).clone()
        flat = raw.view(-1)
        if flat.numel() == 0:
            return b
        if kind == "random":
            flat.copy_(self.rand_bytes(r, flat.numel()))
        else:  # "bitflip"
            for _ in range(r.randint(1, 8)):
                j = r.randrange(flat.numel() * 8)
                flat[j // 8] ^= 1 << (j % 8)
        out = raw.view(b.dtype)
        return out.reshape(b.shape) if b.dim() else out.reshape(())

    def wrong_dtype(self, r: random.Random, b: torch.Tensor) -> torch.Tensor:
        choices = [d for d in [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.float32,
                               torch.float64, torch.bool] if d != b.dtype]
        return b.to(r.choice(choices))

    # -- checks -----------------------------------------------------------------------------
    def run(self, label: str, fn: Callable[[], object], want_shape, want_dtype, name_in_error: str | None,
            oracle: Callable[[], torch.Tensor] | None = None, valid: bool = False) -> None:
        """Call ``fn``; a finding unless it raises an allowed exception (naming ``name_in_error``)
        or returns a tensor of ``want_shape`` (None: any) and ``want_dtype`` (equal to ``oracle()``
        when given). ``valid``: the input is well-formed, so any exception is a finding."""
        try:
            got = fn()
        except ALLOWED as e:
            key = type(e).__name__
            self.counts[key] = self.counts.get(key, 0) + 1
            if valid:
                self.failures.append(f"{label}: a valid input was refused: {type(e).__name__}: "
                                     f"{str(e).splitlines()[0][:200]}")
            if name_in_error and name_in_error not in str(e):
                self.failures.append(f"{label}: {type(e).__name__} does not name {name_in_error!r}: "
                                     f"{str(e).splitlines()[0][:200]}")
            return
        except Exception as e:  # noqa: BLE001 - anything else is a finding
            self.failures.append(f"{label}: disallowed {type(e).__name__}: {str(e).splitlines()[0][:200]}\n"
                                 + "".join(traceback.format_exc().splitlines(True)[-4:]))
            return
        self.counts["output"] = self.counts.get("output", 0) + 1
        if not isinstance(got, torch.Tensor) or (want_shape is not None and (tuple(got.shape) != tuple(want_shape)
                                                                              or got.dtype != want_dtype)):
            desc = (tuple(got.shape), got.dtype) if isinstance(got, torch.Tensor) else type(got).__name__
            self.failures.append(f"{label}: output {desc}, expected {tuple(want_shape)} {want_dtype}")
            return
        if oracle is not None:
            want = oracle()
            if not torch.equal(torch.nan_to_num(got.double(), nan=7.5), torch.nan_to_num(want.double(), nan=7.5)):
                err = (got.double() - want.double()).abs().max().item()
                self.failures.append(f"{label}: a valid payload decodes differently from the reference "
                                     f"(max |diff| {err:g})")

    # -- codec targets --------------------------------------------------------------------------
    def codec_options(self, r: random.Random):
        """(codec name, options) of this target, options drawn at random."""
        if self.target == "onebit":  # both groupings: rows (the default) and the paper's columns
            return "onebit", {"scales": r.choice(["rows", "columns"])}
        if self.target == "terngrad":
            return "terngrad", {"seed": r.randint(0, 99)}
        if self.target.startswith("qsgd"):
            return "qsgd", {"levels": r.choice([1, 3, 7, 15, 127, 255, 1000]), "bucket": r.choice([1, 3, 8, 64, 512]),
                            "coding": self.target.split("_")[1], "seed": r.randint(0, 99),
                            "norm": r.choice(["l2", "max"])}
        return "dgc", {"density": r.choice([0.01, 0.1, 0.5, 1.0]), "seed": r.randint(0, 99)}

    def codec_case(self, r: random.Random, label: str) -> None:
        impl = r.choice(self.impls)
        name, opts = self.codec_options(r)
        codec = self.get_codec(name, impl=impl, **opts)
        ref = self.get_codec(name, impl="reference", **opts) if impl == "native" else None
        shape, dtype = self.shape(r), r.choice(FLOATS)
        x = self.tensor(r, shape, dtype)
        payload = codec.encode(x)
        k = r.choice([1, 1, 2, 3])
        variable = getattr(codec, "variable_size", False)
        kind = r.choice(["none", "none", "truncate", "extend", "random", "bitflip", "bitflip", "dtype", "dims",
                         "strided", "names", "k", "out", "header", "header", "shape"])
        label = f"{label} impl={impl} {codec!r} shape={tuple(shape)} {dtype} K={k} mutation={kind}"
        print("CASE", label, flush=True)
        bufs = dict(payload.buffers)
        names = list(bufs)
        victim = r.choice(names)
        stack_k = {n: k for n in names}
        out = None
        P = self.Payload
        if kind in ("truncate", "extend", "random", "bitflip"):
            bufs[victim] = self.mutate_buffer(r, bufs[victim], kind)
        elif kind == "dtype":
            bufs[victim] = self.wrong_dtype(r, bufs[victim])
        elif kind == "dims":
            bufs[victim] = r.choice([bufs[victim].unsqueeze(0), bufs[victim].reshape(-1, 1), bufs[victim][None, None]])
        elif kind == "strided":
            b = bufs[victim]
            bufs[victim] = torch.stack([b, b], -1).reshape(-1)[::2] if b.numel() else b
        elif kind == "names":
            op = r.choice(["drop", "rename", "extra", "reorder"])
            if op == "drop":
                del bufs[victim]
            elif op == "rename":
                bufs["x" + victim] = bufs.pop(victim)
            elif op == "extra":
                bufs["extra"] = torch.zeros(3, dtype=torch.uint8)
            else:
                bufs = dict(reversed(list(bufs.items())))
        elif kind == "k":
            stack_k[victim] = r.choice([0, k + 1, max(0, k - 1)])
            k = 0 if stack_k[victim] == 0 and len(names) == 1 else k
        elif kind == "out":
            out = r.choice([torch.empty(max(0, x.numel() - 1), dtype=dtype), torch.empty(shape, dtype=torch.int32),
                            torch.empty(tuple(shape) + (2,), dtype=dtype)[..., 0] if x.dim() else
                            torch.empty(2, dtype=dtype)[:1], torch.empty(shape, dtype=torch.float64 if dtype !=
                                                                             torch.float64 else torch.float32)])
        elif kind == "header":
            self.corrupt_header(r, bufs, payload)
        elif kind == "shape":
            other = self.shape(r)
            payload = P(payload.buffers, other, dtype)
            shape = other
        bad = P(bufs, shape, dtype)
        want_shape = tuple(shape)
        oracle = None
        if kind == "none" and ref is not None:
            oracle = lambda: ref.decode(bad)  # noqa: E731
        valid = kind == "none"
        self.run(label + " decode", lambda: codec.decode(bad, out=out), want_shape, dtype, name, oracle, valid)
        if variable:
            second = P(dict(payload.buffers), payload.shape, payload.dtype)
            many = [second, bad] if r.random() < 0.5 else [bad]
            self.run(label + " decode_mean_list", lambda: codec.decode_mean_list(many, out=out), want_shape, dtype, name,
                     valid=valid)
            if name == "dgc":
                self.run(label + " indices_of", lambda: codec.indices_of(bad), None, None, name, valid=valid)
        else:
            stacked = {}
            for n, b in bufs.items():
                kk = stack_k.get(n, k)
                stacked[n] = b.unsqueeze(0).expand(kk, *b.shape) if r.random() < 0.5 else \
                    torch.stack([b] * kk) if kk else b.unsqueeze(0)[:0]
            sp = P(stacked, shape, dtype)
            self.run(label + " decode_mean_stacked", lambda: codec.decode_mean_stacked(sp, out=out), want_shape, dtype, name,
                     valid=valid)

    def corrupt_header(self, r: random.Random, bufs, payload) -> None:
        """The fields a decoder trusts most: Elias bit counts, DGC index codes, value counts."""
        if "nbits" in bufs:
            nb = bufs["nbits"].clone()
            g = r.randrange(nb.numel())
            nb[g] = r.choice(BIG_INTS + [int(nb[g]) + r.randint(-9, 9), int(nb[g]) * 8])
            if r.random() < 0.5 and nb.numel() > 1:  # two counts that still sum to the stream's length
                h = (g + 1) % nb.numel()
                nb[h] = int(payload.buffers["nbits"][g]) + int(payload.buffers["nbits"][h]) - int(nb[g])
            bufs["nbits"] = nb
        elif "indices" in bufs:
            code, vals = bufs["indices"], bufs["values"]
            op = r.choice(["gap", "count", "abs"])
            if op == "gap" and code.numel():
                code = code.clone()
                code[r.randrange(code.numel())] = r.choice([0, 1, 127, 255])
            elif op == "count":
                vals = torch.cat([vals, vals[:1]]) if r.random() < 0.5 and vals.numel() else vals[:-1]
            else:  # absolute indices, possibly out of range or unsorted
                c = vals.numel()
                idx = torch.tensor([r.choice([-5, 0, 1, 2 ** 31 - 1, r.randint(0, 2 * max(1, payload.numel))])
                                    for _ in range(c)], dtype=torch.int64)
                code = idx.to(torch.int32).view(torch.uint8) if payload.numel < 2 ** 31 else idx.view(torch.uint8)
            bufs["indices"], bufs["values"] = code, vals
        else:  # fixed-size formats: scales / norms to extremes
            name = r.choice(list(bufs))
            b = bufs[name].clone()
            if b.dtype == torch.float32 and b.numel():
                b[r.randrange(b.numel())] = r.choice([float("nan"), float("inf"), -float("inf"), 0.0, 3e38])
            bufs[name] = b

    # -- raw native entry points -----------------------------------------------------------
    def raw_case(self, r: random.Random, label: str) -> None:
        from horovod_gradcomp.native import require_native
        C = require_native()
        fn = r.choice(["onebit_decode", "onebit_decode_sum", "terngrad_decode_sum", "qsgd_decode_fixed",
                       "qsgd_decode_elias", "dgc_scatter_sum", "dgc_index_decode"])
        shape, dtype = self.shape(r), r.choice(FLOATS)
        x = self.tensor(r, shape, dtype)
        n = x.numel()
        flat = x.reshape(-1).contiguous()
        if fn.startswith("onebit"):
            cols = 1 if x.dim() <= 1 else n // max(1, shape[0]) if n else 1
            if n and n % cols:
                cols = 1
            bits, scales = C.onebit_encode(flat, None, cols)
            if fn == "onebit_decode_sum":
                k = r.randint(1, 3)
                args = [bits.expand(k, -1), scales.expand(k, -1), n, cols, dtype, 1.0 / k, None]
            else:
                args = [bits, scales, n, cols, dtype, None]
            ints = [2, 3]
        elif fn == "terngrad_decode_sum":
            codes, sc = C.terngrad_encode(flat, float(flat.double().abs().max()) if n else 0.0, float("inf"), 1, 2)
            k = r.randint(1, 3)
            args = [codes.expand(k, -1), sc.expand(k, -1), n, dtype, 1.0, None]
            ints = [2]
        elif fn == "qsgd_decode_fixed":
            s, d = r.choice([1, 7, 127, 1000]), r.choice([1, 5, 64])
            norms, packed = C.qsgd_encode_fixed(flat, s, d, False, 3)
            args = [norms, packed, n, s, d, dtype, 1.0, None]
            ints = [2, 3, 4]
        elif fn == "qsgd_decode_elias":
            s, d = r.choice([1, 7, 127, 1000]), r.choice([1, 5, 64])
            gb = max(1, -(-(1 << 16) // d)) if r.random() < 0.5 else r.randint(1, 4)
            norms, nbits, stream = C.qsgd_encode_elias(flat, s, d, False, 3, gb)
            args = [norms, nbits, stream, n, s, d, gb, dtype, None]
            ints = [3, 4, 5, 6]
        elif fn == "dgc_scatter_sum":
            k = r.randint(1, 3)
            idx, vals, _, _ = C.dgc_select(flat, max(1, n // 3), 0, 5)
            args = [[idx] * k, [vals] * k, n, dtype, 1.0, None]
            ints = [2]
        else:
            idx, vals, _, _ = C.dgc_select(flat, max(1, n // 3), 0, 5)
            code = C.dgc_index_encode(idx, n)
            args = [code, idx.numel(), n]
            ints = [1, 2]
        kind = r.choice(["none", "int", "int", "truncate", "extend", "random", "bitflip", "dtype", "dims", "out"])
        tensor_slots = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        if fn == "dgc_scatter_sum":
            tensor_slots = [0, 1]
        label = f"{label} {fn} shape={tuple(shape)} {dtype} mutation={kind}"
        print("CASE", label, flush=True)
        if kind == "int":
            i = r.choice(ints)
            pool = BIG_INTS + [args[i] + r.randint(-9, 9), args[i] * 2]
            if fn == "dgc_scatter_sum":  # any n above the indices is valid: no 8 GB outputs
                pool.remove(2 ** 31 - 1)
            args[i] = r.choice(pool)
        elif kind == "out" and fn != "dgc_index_decode":
            args[-1] = r.choice([torch.empty(max(0, n - 1), dtype=dtype), torch.empty(n + 1, dtype=dtype),
                                 torch.empty(n, dtype=torch.int32), torch.empty(2 * n, dtype=dtype)[::2]])
        elif kind not in ("none", "int", "out"):
            i = r.choice(tensor_slots)
            mutate = (lambda b: self.mutate_buffer(r, b, kind)) if kind in ("truncate", "extend", "random",
                                                                             "bitflip") else \
                (lambda b: self.wrong_dtype(r, b)) if kind == "dtype" else \
                (lambda b: r.choice([b.unsqueeze(0), b.reshape(-1), b[None, None]]))
            if isinstance(args[i], list):
                j = r.randrange(len(args[i]))
                args[i] = list(args[i])
                args[i][j] = mutate(args[i][j])
            else:
                args[i] = mutate(args[i])
        if self.device.type != "cpu":  # built and mutated on the CPU, then moved (strides may not survive)
            def moved(a):
                if isinstance(a, torch.Tensor):
                    return a.to(self.device)
                return [moved(b) for b in a] if isinstance(a, list) else a
            args = [moved(a) for a in args]
        n_out = args[3 if fn == "qsgd_decode_elias" else 2]
        want_dtype = dtype if fn != "dgc_index_decode" else (torch.int32 if args[2] < 2 ** 31 else torch.int64)
        want_shape = (n_out,) if fn != "dgc_index_decode" else (args[1],)
        D = C
        if self.kernels == "twin":  # payloads built by the CPU kernels, decoded by the device sources' twin
            from horovod_gradcomp.native import require_twin
            D = require_twin()
        self.run(label, lambda: getattr(D, fn)(*args), want_shape, want_dtype, None, valid=kind == "none")

    # -- unpack_variable ------------------------------------------------------------------------
    def unpack_case(self, r: random.Random, label: str) -> None:
        from horovod_gradcomp.exchange.fusion import pack_variable, unpack_variable
        P = self.Payload
        names = [f"t{i}" for i in range(r.randint(1, 4))]
        templates = {}
        for n in names:
            bufs = {}
            for b in range(r.randint(1, 3)):
                dt = r.choice([torch.uint8, torch.float16, torch.float32, torch.int64, torch.float64])
                bufs[f"b{b}"] = torch.zeros(r.randint(0, 20), dtype=dt)
            templates[n] = P(bufs, torch.Size([3]), torch.float32)
        part = pack_variable(names, templates)
        kind = r.choice(["none", "truncate", "extend", "random", "bitflip", "header", "dtype", "dims"])
        label = f"{label} unpack_variable buffers={sum(len(t.buffers) for t in templates.values())} mutation={kind}"
        print("CASE", label, flush=True)
        if kind in ("truncate", "extend", "random", "bitflip"):
            part = self.mutate_buffer(r, part, kind)
        elif kind == "header":
            part = part.clone()
            hdr = part[:8 * sum(len(t.buffers) for t in templates.values())].view(torch.int64)
            hdr[r.randrange(hdr.numel())] = r.choice(BIG_INTS + [3, 7, 8, 16, 2 ** 20])
        elif kind == "dtype":
            part = self.wrong_dtype(r, part)
        elif kind == "dims":
            part = part.unsqueeze(0)

        def go():
            out = unpack_variable(part, names, templates)
            for n in names:
                for b, ref in templates[n].buffers.items():
                    got = out[n].buffers[b]
                    if got.dtype != ref.dtype or got.dim() != 1:
                        raise AssertionError(f"buffer {n}/{b} came back as {got.dtype} {tuple(got.shape)}")
            return torch.zeros(1)
        self.run(label, go, (1,), torch.float32, "unpack_variable", valid=kind == "none")

    def case(self, i: int) -> None:
        r = random.Random(self.seed * 1_000_003 + i)
        label = f"target={self.target} seed={self.seed} case={i}"
        if self.target == "raw":
            self.raw_case(r, label)
        elif self.target == "unpack_variable":
            self.unpack_case(r, label)
        else:
            self.codec_case(r, label)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True,
                    choices=["onebit", "terngrad", "qsgd_fixed", "qsgd_elias", "dgc", "raw", "unpack_variable"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--impls", default="native,reference")
    ap.add_argument("--native-ext", default=None)
    ap.add_argument("--device", default="cpu", help="where the raw target's arguments go (cpu or cuda)")
    ap.add_argument("--kernels", default="native", choices=["native", "twin"],
                    help="raw target: the module whose decoders are called (twin: _C_twin, CPU tensors)")
    args = ap.parse_args(argv)
    if args.device != "cpu" and args.target != "raw":
        ap.error("--device applies to the raw target only")
    torch.set_num_threads(1)
    if args.native_ext:
        load_native(args.native_ext)
    impls = args.impls.split(",")
    if "native" in impls or args.target == "raw":
        from horovod_gradcomp.native import require_native
        require_native()
    if args.kernels != "native" and (args.target != "raw" or args.device != "cpu"):
        ap.error("--kernels twin applies to the raw target on the cpu device only")
    f = Fuzzer(args.target, args.seed, impls, args.device, args.kernels)
    for i in range(args.cases):
        f.case(i)
    for line in f.failures[:50]:
        print("FAIL", line)
    print(json.dumps({"target": args.target, "seed": args.seed, "cases": args.cases, "outcomes": f.counts,
                      "failures": len(f.failures)}), flush=True)
    return 1 if f.failures else 0


if __name__ == "__main__":
    sys.exit(main())
