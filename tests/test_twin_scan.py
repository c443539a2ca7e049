"""The twin's forced parallel scan (csrc/device/scan.cuh; issue 32 item 4).

Thrust's OpenMP backend runs a scan as one left-to-right pass, so on the twin a scan operator
that is not associative would give the sequential result and a GPU's tiled scan another one:
the bitwise twin tests could not see the difference. Every scan of the device sources (DGC's and
QSGD's inclusive, exclusive and by-key scans) therefore goes through one wrapper, which on the
twin runs a hand-written two-level scan (blocks of ``scan_block`` values scanned in parallel,
the blocks' totals scanned, each block's prefix combined with its values) and on CUDA calls
Thrust. ``_C_twin.scan_probe`` runs that wrapper and a sequential scan side by side:

* with an associative operator (integer +) both agree, for every kind, at 1, 2 and 4 threads,
  with segments that start and end inside, at and across block boundaries (the two-level
  scan itself is right);
* with a non-associative operator (a - b) they differ: a scan operator that depends on the
  grouping would be caught by the twin's bitwise tests, which run every device scan through it.

The device sources' outputs through the two-level scan equal the CPU kernels bitwise: the
existing tests (tests/test_device_*.py, tests/test_cuda_codecs.py) are the judge of that.
"""
from __future__ import annotations

import random

import pytest

from device_helpers import threads, twin  # noqa: F401 (fixtures)

KINDS = ["inclusive", "exclusive", "inclusive_by_key", "exclusive_by_key"]


def _keys(n, seed):
    """Segment keys of n values: segments of 1, a block's size, runs across several blocks, and
    random lengths (the block boundaries at multiples of scan_block fall inside and between them)."""
    rng = random.Random(seed)
    keys, k = [], 0
    lengths = [1, 1, 64, 63, 65, 200, 3, 128]
    while len(keys) < n:
        length = lengths[len(keys) % len(lengths)] if seed % 2 else rng.randint(1, 150)
        keys += [k] * length
        k += 1 + rng.randint(0, 1)
    return keys[:n]


@pytest.mark.parametrize("nthreads", [1, 2, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_two_level_scan_equals_the_sequential_scan_for_plus(twin, threads, kind, nthreads):  # noqa: F811
    threads(nthreads)
    assert twin.scan_block >= 2
    for n in (0, 1, 2, twin.scan_block - 1, twin.scan_block, twin.scan_block + 1, 1000, 4099):
        for seed in (1, 2):
            rng = random.Random(100 * n + seed)
            values = [rng.randint(-1000, 1000) for _ in range(n)]
            two, seq = twin.scan_probe(kind, values, _keys(n, seed), 17, "plus")
            assert two == seq, f"{kind} n={n} seed={seed}: the two-level scan differs from the sequential one"


@pytest.mark.parametrize("kind", KINDS)
def test_a_non_associative_operator_is_caught(twin, kind):
    """a - b: the two-level scan groups the operands as a parallel scan does, so its result is
    not the sequential one (the probe would say equal if the twin scanned sequentially)."""
    n = 5 * twin.scan_block + 3
    values = [(7 * i) % 11 + 1 for i in range(n)]
    keys = [i // (3 * twin.scan_block) for i in range(n)]  # segments spanning several blocks
    two, seq = twin.scan_probe(kind, values, keys, 5, "minus")
    assert len(two) == len(seq) == n
    assert two != seq, f"{kind}: a non-associative scan gave the sequential result on the twin"
    # inside the first block nothing is regrouped: the difference comes from the block prefixes
    assert two[: twin.scan_block] == seq[: twin.scan_block]


def test_the_probe_refuses_bad_arguments(twin):
    with pytest.raises(ValueError, match="kind must be"):
        twin.scan_probe("sideways", [1], [], 0, "plus")
    with pytest.raises(ValueError, match="one key per value"):
        twin.scan_probe("inclusive_by_key", [1, 2], [0], 0, "plus")
    with pytest.raises(ValueError, match="op must be"):
        twin.scan_probe("inclusive", [1], [], 0, "times")
