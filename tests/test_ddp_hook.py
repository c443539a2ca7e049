"""The DDP hook's suites (tests/mpi/mpi_ddp.py, mpi_ddp_sparse.py) launched alone under mpirun at 2
and 4 processes (torch.distributed on gloo over the mpirun ranks), each launch under a timeout; and
the pieces of the DDP bench rows that need no launch."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = int(os.environ.get("HGC_DDP_TEST_TIMEOUT", "420"))


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("np_", [2, 4])
def test_ddp_suite(np_):
    assert shutil.which("mpirun"), "mpirun not found: run ci/install_system.sh (Open MPI is required)"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_), "-x", "OMP_NUM_THREADS=1",
           "-x", "PYTHONPATH", sys.executable, "-m", "pytest", "-x", "-q", "--color=no", "-p", "no:cacheprovider",
           "-o", "python_files=mpi_*.py", "tests/mpi/mpi_ddp.py",
           "tests/mpi/mpi_ddp_sparse.py"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"mpirun -np {np_} tests/mpi/mpi_ddp*.py timed out after {TIMEOUT_S}s\n{exc.stdout}\n{exc.stderr}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mpirun -np {np_} failed (rc {proc.returncode}):\n{out[-8000:]}"
    summaries = re.findall(r"\d+ (?:passed|failed|skipped|error)[\w, ]* in [\d.]+s", out)
    assert len(summaries) == np_ and all("passed" in s and "failed" not in s for s in summaries), summaries


def test_resnet50_module_has_resnet50_shapes():
    from horovod_gradcomp.bench.resnet import resnet50
    from horovod_gradcomp.bench.shapes import RESNET50_NUMEL, resnet50_shapes
    model = resnet50()
    assert [tuple(p.shape) for p in model.parameters()] == [tuple(s) for s in resnet50_shapes()]
    assert sum(p.numel() for p in model.parameters()) == RESNET50_NUMEL


def test_ddp_row_names():
    from horovod_gradcomp.bench import ddp_rows
    assert ddp_rows.is_ddp("ddp") and ddp_rows.is_ddp("ddp_fp16") and ddp_rows.is_ddp("ddp_powersgd")
    assert ddp_rows.hgc_codec("ddp_onebit") == "onebit" and ddp_rows.hgc_codec("ddp_dgc") == "dgc"
    assert not ddp_rows.is_ddp("ddp_nope") and not ddp_rows.is_ddp("onebit")


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_bench_ddp_rows(tmp_path):
    """The DDP rows of ``bench exchange`` at 2 ranks (no rate limit): DDP's own hooks and this
    package's, per bucket and once per step, on a real ResNet-50 backward (tiny images)."""
    import json
    out = tmp_path / "rows.json"
    cmd = [sys.executable, "-m", "horovod_gradcomp.bench", "exchange", "--np", "2", "--net", "none",
           "--configs", "ddp,ddp_fp16,ddp_onebit,ddp_onebit:per_bucket=False,ddp_dgc:density=0.01",
           "--ddp-backward", "resnet50", "--ddp-batch", "2", "--ddp-image", "32",
           "--steps", "1", "--warmup", "0", "--json", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"bench exchange timed out after {TIMEOUT_S}s\n{exc.stdout}\n{exc.stderr}")
    assert proc.returncode == 0, proc.stderr[-6000:]
    rows = {r["config"]: r for r in json.loads(out.read_text())}
    assert not [r for r in rows.values() if "skipped" in r], rows
    assert "per bucket" in rows["ddp_onebit"]["factory"]
    assert "one exchange per step" in rows["ddp_onebit:per_bucket=False"]["factory"]
    # counted by the hook (onebit: 1 bit a value and two floats a column, K-1 = 1 copy sent)
    onebit = rows["ddp_onebit"]["bytes_sent_per_step"]
    assert 0 < onebit < rows["ddp_fp16"]["bytes_sent_per_step"] / 8
    assert onebit == rows["ddp_onebit:per_bucket=False"]["bytes_sent_per_step"] or abs(
        onebit - rows["ddp_onebit:per_bucket=False"]["bytes_sent_per_step"]) < 1e-3 * onebit
    assert rows["ddp_dgc:density=0.01"]["bytes_sent_per_step"] < onebit
