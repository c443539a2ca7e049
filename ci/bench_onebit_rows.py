"""onebit encode/decode time, rows vs columns mode (a benchmark line, not a test).

    PYTHONPATH=. .venv/bin/python ci/bench_onebit_rows.py

One thread, best of 7, fp32, with a residual (the error-feedback encode); prints the package
it imported, so that two builds can be compared.
"""
from __future__ import annotations

import time

import torch

import horovod_gradcomp as hgc

SHAPES = [(512, 4608), (1000, 2048)]


def best_ms(fn, repeat: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * min(times)


def main() -> None:
    torch.set_num_threads(1)
    print(f"# {hgc.__file__}, 1 thread, fp32, best of 7")
    for shape in SHAPES:
        g = torch.randn(shape, generator=torch.Generator().manual_seed(0))
        r = torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 0.1
        for scales in ("columns", "rows"):
            codec = hgc.get_codec("onebit", scales=scales)
            payload = codec.encode(g, residual=r.clone())
            enc = best_ms(lambda: codec.encode(g, residual=r))
            dec = best_ms(lambda: codec.decode(payload))
            print(f"{'x'.join(map(str, shape)):>10} {scales:>7}: encode {enc:6.2f} ms  decode {dec:6.2f} ms")


if __name__ == "__main__":
    main()
