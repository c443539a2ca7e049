"""Tests of the slow-network harness (horovod_gradcomp/bench/slownet.py): the command
builders, and real runs showing that a link's rate limit holds (a few seconds each)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from horovod_gradcomp.bench import slownet

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(120)


# -- builders ---------------------------------------------------------------------------

def test_rates_in_tc_units():
    assert slownet.rate_bits_per_s("1gbit") == 1e9
    assert slownet.rate_bits_per_s("100mbit") == 1e8
    assert slownet.rate_bits_per_s("2.5Gbit") == 2.5e9
    assert slownet.rate_bits_per_s("10mbps") == 8e7     # tc's bps are bytes per second
    for bad in ("", "1", "fast", "1gb", "0mbit", "1gbit; reboot"):
        with pytest.raises(ValueError):
            slownet.rate_bits_per_s(bad)


def test_link_validates_and_builds_tbf():
    link = slownet.Link("100mbit", burst="256kb", latency="50ms")
    assert link.tbf("lo") == ["tc", "qdisc", "add", "dev", "lo", "root", "tbf",
                              "rate", "100mbit", "burst", "256kb", "latency", "50ms"]
    for kwargs in ({"rate": "x"}, {"rate": "1gbit", "burst": "lots"}, {"rate": "1gbit", "latency": "1 s"}):
        with pytest.raises(ValueError):
            slownet.Link(**kwargs)


def test_mpirun_command_per_mode():
    prog = ["python", "x.py"]
    loop = slownet.mpirun_command("loopback", 4, prog, ["PATH"])
    assert loop[:5] == ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4"]
    assert "btl_tcp_if_include" in loop and loop[loop.index("btl_tcp_if_include") + 1] == "lo"
    assert loop[loop.index("btl") + 1] == "tcp,self"          # no shared memory: traffic crosses lo
    assert loop[-4:] == ["-x", "PATH", "python", "x.py"]
    bridge = slownet.mpirun_command("bridge", 3, prog)
    assert bridge[bridge.index("--host") + 1] == "10.77.0.2:1,10.77.0.3:1,10.77.0.4:1"
    assert bridge[bridge.index("plm_rsh_agent") + 1] == "$agent"
    assert bridge[bridge.index("oob_tcp_if_include") + 1] == "10.77.0.0/24"
    # Workarounds for orted crashes / session-dir collisions / hangs (see mpirun_command).
    assert "--leave-session-attached" in bridge and bridge[bridge.index("rtc_hwloc_vmhole") + 1] == "none"
    plain = slownet.mpirun_command("none", 2, prog)
    assert "--mca" not in plain and plain[-2:] == prog
    with pytest.raises(ValueError):
        slownet.mpirun_command("wifi", 2, prog)


@pytest.mark.parametrize("mode", ["loopback", "bridge", "none"])
def test_scripts_parse_and_clean_up(mode):
    link = None if mode == "none" else slownet.Link("1gbit")
    script = slownet.build_script(mode, 2, link, ["python", "-c", "print(\"it's\")"], ["PATH"])
    assert subprocess.run(["bash", "-n", "-c", script], timeout=10).returncode == 0
    if mode == "none":
        assert "unshare" not in slownet.command_line(mode, script)
        return
    assert slownet.command_line(mode, script)[:1] == ["unshare"]
    assert "trap" in script and 'wait "$mpirun_pid"' in script
    if mode == "loopback":
        assert "tc qdisc add dev lo root tbf rate 1gbit" in script
    else:
        # Both ends of every veth are limited, the netns names live on a private tmpfs, and
        # cleanup deletes the namespaces and the bridge.
        for k in (0, 1):
            assert f"tc qdisc add dev hgcv{k} root tbf rate 1gbit" in script
            assert f"ip netns exec hgcns{k} tc qdisc add dev eth0 root tbf" in script
            assert f"10.77.0.{k + 2}) ns=hgcns{k} ;;" in script
        assert 'unshare --uts' in script and 'hostname "$1"' in script   # one host name per node
        assert "mount -t tmpfs hgc-slownet /run/netns" in script
        assert 'ip netns del "$ns"' in script and "ip link del hgcbr0" in script


def test_forwarded_env_and_bad_arguments():
    env = {"PATH": "/bin", "HOME": "/root", "HOROVOD_CYCLE_TIME": "1", "OMP_NUM_THREADS": "1", "SECRET": "x"}
    assert sorted(slownet.forwarded_env(env)) == ["HOROVOD_CYCLE_TIME", "OMP_NUM_THREADS", "PATH"]
    with pytest.raises(ValueError):
        slownet.build_script("loopback", 0, slownet.Link("1gbit"), ["true"])
    with pytest.raises(ValueError):
        slownet.build_script("loopback", 2, None, ["true"])
    with pytest.raises(SystemExit):
        slownet.parse_args(["loopback", "--", "true"])            # no rate
    with pytest.raises(SystemExit):
        slownet.parse_args(["loopback", "1gbit"])                 # no program
    args = slownet.parse_args(["--np", "3", "bridge", "1gbit", "--", "python", "-V"])
    assert (args.mode, args.rate, args.np, args.program) == ("bridge", "1gbit", 3, ["python", "-V"])


def test_missing_tools_are_named(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(slownet.SlownetUnavailable, match="mpirun.*unshare.*ip.*tc.*iproute2"):
        slownet.check_available("loopback")


def test_print_script_cli(capsys):
    assert slownet.main(["--np", "2", "loopback", "100mbit", "--print-script", "--", "true"]) == 0
    assert "tbf rate 100mbit" in capsys.readouterr().out


# -- real runs --------------------------------------------------------------------------

# Rank 1 times the arrival of NBYTES from rank 0 (after a barrier) and prints it as JSON.
TRANSFER = """
import json, time, numpy as np
from mpi4py import MPI
comm, n = MPI.COMM_WORLD, {nbytes}
buf = np.ones(n, np.uint8)
comm.Barrier()
t0 = time.perf_counter()
if comm.rank == 0:
    comm.Send(buf, dest=1)
elif comm.rank == 1:
    comm.Recv(buf, source=0)
    print(json.dumps({{"seconds": time.perf_counter() - t0, "bytes": n}}), flush=True)
"""


def _require_harness(mode):
    try:
        slownet.check_available(mode)
    except slownet.NamespacesNotPermitted as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("mode", ["loopback", "bridge"])
def test_rate_limit_is_real(mode):
    """5 MB at 100 Mbit/s needs 0.4 s (0.36 s after the 512 KiB tbf burst), where the
    unlimited loopback moves it in milliseconds."""
    _require_harness(mode)
    nbytes = 5_000_000
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    program = [sys.executable, "-c", TRANSFER.format(nbytes=nbytes)]
    try:
        res = slownet.run(mode, 2, program, "100mbit", timeout=60, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"slownet {mode} run timed out:\n{exc.stdout}\n{exc.stderr}")
    assert res.returncode == 0, f"rc {res.returncode}\n{res.stdout}\n{res.stderr}"
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    assert len(line) == 1, res.stdout + res.stderr
    seconds = json.loads(line[0])["seconds"]
    assert 0.35 <= seconds < 30.0, f"{nbytes} bytes at 100mbit took {seconds:.3f} s on {mode}"


def _alive(pid: int) -> bool:
    try:
        return "(zombie)" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("mode", ["loopback", "bridge", "none"])
def test_timeout_stops_the_run(mode):
    """A run past its timeout raises TimeoutExpired, and no rank survives it."""
    _require_harness(mode)
    program = [sys.executable, "-c", "import time, os; print(f'<pid {os.getpid()}>', flush=True); time.sleep(120)"]
    with pytest.raises(subprocess.TimeoutExpired) as info:
        slownet.run(mode, 2, program, "1gbit", timeout=10, env=dict(os.environ))
    # ranks share one stdout: two lines can arrive glued together, so match the markers anywhere
    pids = [int(p) for p in re.findall(r"<pid (\d+)>", info.value.stdout or "")]
    assert len(pids) == 2, f"ranks did not start within the timeout: {info.value.stdout}\n{info.value.stderr}"
    survivors = [p for p in pids if _alive(p)]
    for p in survivors:                      # do not leave them running, then fail
        os.kill(p, 9)
    assert not survivors, f"ranks {survivors} survived the timeout of a {mode} run"
