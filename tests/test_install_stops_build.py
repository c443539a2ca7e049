"""A failed ``ci/install_python.sh`` stops the native build it started in the background.

The script starts ``setup.py build_ext`` (and with it ninja and the compilers) in the
background, then installs the other dependencies. Here the build is a stand-in ``setup.py`` whose
child sleeps (as ninja's compilers run on), and a later pip step fails (a wheel that does not
exist): the script must exit non-zero and leave no process of that build behind.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_SETUP = """\
import subprocess, sys
# stands in for the extension build: a child that runs on, as ninja and its compilers do
child = subprocess.Popen([sys.executable, "-c", "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); "
                          "time.sleep(600)", sys.argv[0] + ".child.pid"])
child.wait()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:   # a zombie waiting for its reaper is gone too
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.skipif(shutil.which("bash") is None or not Path("/proc").is_dir(), reason="needs bash and /proc")
def test_a_failed_install_stops_the_background_build(tmp_path):
    root = tmp_path / "clone"
    (root / "ci").mkdir(parents=True)
    for name in ("env.sh", "install_python.sh", "build_horovod.sh"):
        shutil.copy(ROOT / "ci" / name, root / "ci" / name)
    (root / "csrc").mkdir()
    (root / "setup.py").write_text(FAKE_SETUP, encoding="utf-8")
    pid_file = root / "setup.py.child.pid"
    # A venv whose python is this one, except that installing the missing wheel fails, once the
    # stand-in build's child runs (so that the failure surely comes while the build is running).
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f"""#!/usr/bin/env bash
if [[ "$*" == *no-such-mpi4py* ]]; then
    for _ in $(seq 300); do [ -f {pid_file} ] && break; sleep 0.1; done
    echo "ERROR: no such wheel (the test's failing step)" >&2
    exit 1
fi
exec {sys.executable} "$@"
""", encoding="utf-8")
    python.chmod(0o755)
    env = dict(os.environ, VENV=str(venv), HGC_INSTALL_EXTRAS="0", HGC_CCACHE="0",
               MPI4PY_SPEC="no-such-mpi4py")   # the dependencies step fails
    proc = subprocess.run(["bash", str(root / "ci" / "install_python.sh")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "stopping the background build" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    deadline = time.monotonic() + 30
    while not pid_file.exists() and time.monotonic() < deadline:   # written as soon as the child runs
        time.sleep(0.2)
    assert pid_file.exists(), "the stand-in build never started: " + proc.stdout + proc.stderr
    pid = int(pid_file.read_text())
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = _alive(pid)
    if alive:
        os.kill(pid, 9)
    assert not alive, "the background build's child outlived the failed install"
