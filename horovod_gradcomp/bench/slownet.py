"""A slow network on one machine: mpirun inside private network namespaces with tbf-limited links.

Two layouts (see "Measuring on a slow network" in the design brief):

* ``loopback``: one private network namespace whose ``lo`` carries a tbf qdisc; mpirun and
  every rank run inside it and Open MPI uses TCP on ``lo``. All ranks share one link.
* ``bridge``: one namespace per rank, each with a veth pair into a bridge in a parent
  namespace and a tbf on both ends of every veth: one full-duplex limited link per rank,
  as on a switch. Open MPI cannot simply start ranks in other namespaces (its PMIx server
  listens on the loopback of mpirun's namespace, which the ranks could not reach), so
  each namespace is a "node": mpirun, in the parent namespace, starts one ``orted`` per
  node through an rsh agent that enters the node's namespace (and a UTS namespace with
  the node's own host name), and ranks run next to their daemon. OOB and BTL traffic use
  the bridge's subnet. Note: with Open MPI's defaults the TCP BTL sends large messages
  with its emulated RDMA put, and two ranks sending to each other at once then get about
  half the full-duplex rate (measured here: 10 MB each way at 100mbit took 1.5 s instead
  of 0.8 s; a 100 MB fp32 Horovod allreduce at 2 ranks and 1gbit, 1.43 s instead of
  1.05 s). ``OMPI_MCA_btl_tcp_links=2`` (or ``btl_tcp_flags`` without ``put``) in the
  environment restores it; the harness leaves Open MPI's defaults alone.
  With ``per_node=L`` (``--per-node L``) each namespace is a node of L ranks (ceil(K/L)
  namespaces, the last one smaller when L does not divide K): its ranks share the node's
  daemon, its loopback and shared memory (``btl`` ``tcp,vader,self``: Open MPI's shared-memory
  transport between ranks of one node, unlimited, as NVLink would be), and only the veth links
  between nodes are limited. mpirun sees each namespace as its own host, so
  ``Split_type(COMM_TYPE_SHARED)`` finds the nodes without any override
  (:mod:`horovod_gradcomp.exchange.topology`).
* ``none``: plain mpirun (shared memory, no limit), for tests and reference runs.

Everything runs under ``unshare -n -m`` (``-r`` too when not root): the namespaces, the
bridge and the named namespaces (on a private tmpfs over ``/run/netns``) vanish with the
run, and a trap tears them down early on exit or signal. :func:`build_script` returns the
bash script (``--print-script`` shows it); :func:`run` runs it with a timeout.

Command line (``ci/slownet.sh`` wraps it)::

    python -m horovod_gradcomp.bench.slownet [--np K] MODE RATE -- PROGRAM [ARGS...]

runs ``mpirun -np K ... PROGRAM ARGS`` on the slow network (``RATE`` as tc writes it:
``1gbit``, ``100mbit``, ...).
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable, List, Mapping, Optional, Sequence

MODES = ("loopback", "bridge", "none")
#: Subnet of the bridge layout: the parent namespace is .1, rank k's namespace .(k + 2).
BRIDGE_PREFIX = "10.77.0"
BRIDGE_NAME, VETH_PREFIX, NETNS_PREFIX = "hgcbr0", "hgcv", "hgcns"
#: Environment variables forwarded to the ranks (``-x``) when set, plus HOROVOD_* / HGC_*.
FORWARD_ENV = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "OMP_NUM_THREADS")
#: tc rate units, in bits per second (tc reads "bps" as *bytes* per second).
_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}
_SIZE_RE = re.compile(r"^\d+(\.\d+)?(b|k|kb|m|mb|g|gb|kbit|mbit|gbit)?$", re.IGNORECASE)
_TIME_RE = re.compile(r"^\d+(\.\d+)?(s|ms|us)$", re.IGNORECASE)


class SlownetUnavailable(RuntimeError):
    """The harness cannot run here (a tool is missing or namespaces are not permitted)."""


class NamespacesNotPermitted(SlownetUnavailable):
    """``unshare -n -m`` is refused on this machine (no root, no user namespaces)."""


@dataclass(frozen=True)
class Link:
    """One tbf-limited link: ``rate``/``burst``/``latency`` in tc's syntax (validated)."""

    rate: str
    burst: str = "512kb"
    latency: str = "100ms"

    def __post_init__(self):
        rate_bits_per_s(self.rate)
        if not _SIZE_RE.match(self.burst):
            raise ValueError(f"bad tbf burst {self.burst!r} (e.g. 512kb)")
        if not _TIME_RE.match(self.latency):
            raise ValueError(f"bad tbf latency {self.latency!r} (e.g. 100ms)")

    def tbf(self, dev: str) -> List[str]:
        """``tc`` arguments putting this link's tbf on ``dev``."""
        return ["tc", "qdisc", "add", "dev", dev, "root", "tbf",
                "rate", self.rate, "burst", self.burst, "latency", self.latency]


def rate_bits_per_s(rate: str) -> float:
    """``"1gbit"`` -> 1e9, ``"100mbit"`` -> 1e8, ``"10mbps"`` -> 8e7 (tc's units); ValueError
    for anything tc would not read as a rate."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]+)", rate.strip().lower())
    if not m or m.group(2) not in _RATE_UNITS or float(m.group(1)) <= 0:
        raise ValueError(f"bad rate {rate!r}: expected a number and one of {', '.join(_RATE_UNITS)} (e.g. 1gbit)")
    return float(m.group(1)) * _RATE_UNITS[m.group(2)]


# -- command lines ----------------------------------------------------------------------

def forwarded_env(env: Mapping[str, str]) -> List[str]:
    """Names of ``env`` to forward to the ranks: :data:`FORWARD_ENV` and HOROVOD_* / HGC_*."""
    return [k for k in env if k in FORWARD_ENV or k.startswith(("HOROVOD_", "HGC_"))]


def mpirun_command(mode: str, np_: int, program: Sequence[str], env_names: Sequence[str] = (),
                   agent: str = "$agent", extra: Sequence[str] = (), per_node: int = 1) -> List[str]:
    """The mpirun line of ``mode`` running ``program`` on ``np_`` ranks, forwarding
    ``env_names``. In bridge mode ``agent`` is the rsh agent's path (a shell variable of the
    script by default: :func:`build_script` quotes every other word), and ``per_node`` ranks
    share each namespace (node)."""
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_)]
    if mode == "loopback":
        cmd += ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]
    elif mode == "bridge":
        subnet = f"{BRIDGE_PREFIX}.0/24"
        cmd += ["--host", ",".join(f"{bridge_address(k)}:{per_node}" for k in range(num_nodes(np_, per_node))),
                "--mca", "plm_rsh_agent", agent, "--mca", "plm_rsh_no_tree_spawn", "1",
                # orted maps hwloc's topology into a "hole" of its address space for its ranks;
                # that crashed about 1 orted start in 10 here (hwloc_shmem_topology_write).
                # Without the shared copy each rank reads the topology itself.
                "--mca", "rtc_hwloc_vmhole", "none",
                # No --daemonize for orted: a daemon that dies early then fails the run at once
                # (with its output) instead of leaving mpirun waiting for it forever.
                "--leave-session-attached",
                "--mca", "btl", "tcp,vader,self" if per_node > 1 else "tcp,self", "--mca", "btl_tcp_if_include", subnet,
                "--mca", "oob_tcp_if_include", subnet]
    elif mode != "none":
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    for name in env_names:
        cmd += ["-x", name]
    return cmd + list(extra) + list(program)


def num_nodes(np_: int, per_node: int) -> int:
    """Namespaces of the bridge layout: one per ``per_node`` ranks (ValueError below 1)."""
    if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
        raise ValueError(f"per_node must be a positive int, got {per_node!r}")
    return -(-np_ // per_node)


def bridge_address(k: int) -> str:
    """Address of rank ``k``'s namespace on the bridge subnet."""
    if not 0 <= k < 250:
        raise ValueError(f"bridge mode supports up to 250 ranks, not rank {k}")
    return f"{BRIDGE_PREFIX}.{k + 2}"


def _sh(words: Sequence[str]) -> str:
    """Shell-quoted command line; the word ``$agent`` stays a variable reference."""
    return " ".join('"$agent"' if w == "$agent" else shlex.quote(w) for w in words)


_PRELUDE = r"""set -euo pipefail
say() { echo "[slownet] $*" >&2; }
fail() { say "$*"; exit 3; }
mpirun_pid=""
# One SIGTERM only: a second one makes mpirun exit at once, leaving its ranks running.
stop_mpirun() {
    if [ -n "$mpirun_pid" ] && kill -0 "$mpirun_pid" 2>/dev/null; then
        kill -TERM "$mpirun_pid" 2>/dev/null || true
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$mpirun_pid" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$mpirun_pid" 2>/dev/null || true
    fi
}
# Every other process of this (private) network namespace: ranks or daemons mpirun left behind.
kill_leftovers() {
    local me p
    me=$(readlink /proc/$$/ns/net)
    for p in /proc/[0-9]*; do
        [ "${p#/proc/}" = "$$" ] && continue
        [ "$(readlink "$p/ns/net" 2>/dev/null)" = "$me" ] && kill -KILL "${p#/proc/}" 2>/dev/null
    done
    return 0
}
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP
ip link set lo up || fail "cannot bring lo up in the new network namespace (ip link set lo up failed)"
"""

_LAUNCH = """{mpirun} &
mpirun_pid=$!
wait "$mpirun_pid"
"""


def _loopback_body(np_: int, link: Link, mpirun: str) -> str:
    return ("trap 'set +e; stop_mpirun; kill_leftovers' EXIT\n"
            f"{_sh(link.tbf('lo'))} || fail \"tc could not add a tbf qdisc on lo (is sch_tbf available?)\"\n"
            f"say \"loopback: {np_} ranks share lo limited to {link.rate}\"\n"
            + _LAUNCH.format(mpirun=mpirun))


def _bridge_body(np_: int, link: Link, mpirun: str, per_node: int = 1) -> str:
    nodes = num_nodes(np_, per_node)
    ns = [f"{NETNS_PREFIX}{k}" for k in range(nodes)]
    cases = "\n".join(f"    {bridge_address(k)}) ns={ns[k]} ;;" for k in range(nodes))
    lines = [
        'agent=""',
        "cleanup() {",
        "    set +e",
        "    stop_mpirun",
        "    kill_leftovers",
        f"    for ns in {' '.join(ns)}; do",
        '        ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null',
        '        ip netns del "$ns" 2>/dev/null',
        "    done",
        f"    ip link del {BRIDGE_NAME} 2>/dev/null",
        '    [ -n "$agent" ] && rm -f "$agent"',
        "}",
        "trap cleanup EXIT",
        # Named namespaces on a tmpfs of this private mount namespace: nothing leaks to the host.
        "mkdir -p /run/netns && mount -t tmpfs hgc-slownet /run/netns "
        '|| fail "cannot mount a private /run/netns (needs a private mount namespace: unshare -m)"',
        f"ip link add {BRIDGE_NAME} type bridge || fail \"cannot create a bridge (kernel bridge support missing?)\"",
        f"ip addr add {BRIDGE_PREFIX}.1/24 dev {BRIDGE_NAME}",
        f"ip link set {BRIDGE_NAME} up",
    ]
    for k, name in enumerate(ns):
        veth = f"{VETH_PREFIX}{k}"
        lines += [
            f"ip netns add {name}",
            f"ip link add {veth} type veth peer name eth0 netns {name} "
            '|| fail "cannot create a veth pair (kernel veth support missing?)"',
            f"ip link set {veth} master {BRIDGE_NAME} up",
            f"ip -n {name} addr add {bridge_address(k)}/24 dev eth0",
            f"ip -n {name} link set eth0 up",
            f"ip -n {name} link set lo up",
            f"{_sh(link.tbf(veth))} || fail \"tc could not add a tbf qdisc on {veth} (is sch_tbf available?)\"",
            f"ip netns exec {name} {_sh(link.tbf('eth0'))}",
        ]
    lines += [
        # The rsh agent mpirun calls as `agent HOST COMMAND...`: run the daemon in HOST's namespace.
        "agent=$(mktemp /tmp/hgc-slownet-agent.XXXXXX)",
        "cat > \"$agent\" <<'AGENT'",
        "#!/bin/bash",
        'host=$1; shift',
        'case "$host" in',
        cases,
        '    *) echo "[slownet agent] unknown host $host" >&2; exit 1 ;;',
        "esac",
        # Its own UTS namespace and host name too: daemons sharing one host name share their
        # session directory under /tmp and now and then collide there (orte_init fails).
        'exec ip netns exec "$ns" unshare --uts /bin/sh -c \'hostname "$1" && exec /bin/sh -c "$2"\' '
        'agent "$ns" "$*"',
        "AGENT",
        'chmod +x "$agent"',
        (f"say \"bridge: {np_} ranks, one namespace each, every link limited to {link.rate}\"" if per_node == 1 else
         f"say \"bridge: {np_} ranks as {nodes} nodes of {per_node} (one namespace each), links between nodes "
         f"limited to {link.rate}\""),
    ]
    return "\n".join(lines) + "\n" + _LAUNCH.format(mpirun=mpirun)


def build_script(mode: str, np_: int, link: Optional[Link], program: Sequence[str],
                 env_names: Sequence[str] = (), mpirun_extra: Sequence[str] = (), per_node: int = 1) -> str:
    """The bash script that sets up ``mode``'s network (``link`` on every link), runs
    ``program`` under mpirun on ``np_`` ranks, waits for it, and on exit or signal stops
    mpirun and tears the network down. Meant to run inside ``unshare -n -m``
    (:func:`namespace_prefix`); mode ``none`` needs no namespace and ignores ``link``."""
    if np_ < 1:
        raise ValueError(f"need at least one rank, got np={np_}")
    if not program:
        raise ValueError("no program to run")
    if per_node != 1 and mode != "bridge":
        raise ValueError(f"per_node={per_node}: nodes of several ranks are a layout of mode bridge, not {mode!r}")
    mpirun = _sh(mpirun_command(mode, np_, program, env_names, extra=mpirun_extra, per_node=per_node))
    if mode == "none":
        return "set -euo pipefail\nexec " + mpirun + "\n"
    if link is None:
        raise ValueError(f"mode {mode!r} needs a link rate")
    if mode == "loopback":
        return _PRELUDE + _loopback_body(np_, link, mpirun)
    return _PRELUDE + _bridge_body(np_, link, mpirun, per_node)


def namespace_prefix() -> List[str]:
    """``unshare`` in a new network and mount namespace (and user namespace when not root)."""
    return ["unshare"] + (["-r"] if os.geteuid() != 0 else []) + ["-n", "-m"]


def command_line(mode: str, script: str) -> List[str]:
    """The argv running ``script``: under :func:`namespace_prefix` unless mode is ``none``."""
    prefix = [] if mode == "none" else namespace_prefix()
    return prefix + ["bash", "-c", script]


# -- checks -----------------------------------------------------------------------------

def check_available(mode: str) -> None:
    """Raise :class:`SlownetUnavailable` saying what is missing when ``mode`` cannot run here:
    mpirun, unshare, ip or tc not on PATH, or (:class:`NamespacesNotPermitted`)
    ``unshare -n -m`` refused."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    tools = ["mpirun"] + ([] if mode == "none" else ["unshare", "ip", "tc"])
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        hint = " (iproute2 provides ip and tc: ci/install_system.sh installs it)" if {"ip", "tc"} & set(missing) else ""
        raise SlownetUnavailable(f"slownet {mode}: not on PATH: {', '.join(missing)}{hint}")
    if mode == "none":
        return
    probe = namespace_prefix() + ["true"]
    try:
        res = subprocess.run(probe, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        raise SlownetUnavailable(f"slownet {mode}: {' '.join(probe)} hung for 20 s") from None
    if res.returncode != 0:
        raise NamespacesNotPermitted(f"slownet {mode}: `{' '.join(probe)}` is not permitted here "
                                 f"({res.stderr.strip() or 'rc ' + str(res.returncode)}); it needs root or "
                                 "unprivileged user namespaces (CAP_SYS_ADMIN and CAP_NET_ADMIN)")


# -- running ----------------------------------------------------------------------------

def _stop(proc: subprocess.Popen, grace_s: float):
    """SIGTERM ``proc`` alone (the script's trap stops mpirun, kills what is left in the
    namespaces and tears them down; in mode none ``proc`` is mpirun, which stops its ranks),
    then SIGKILL its process group after ``grace_s``; returns the rest of its (stdout, stderr).
    Signalling the whole group at once would hand mpirun two SIGTERMs, and on the second it
    exits leaving its ranks behind."""
    proc.terminate()
    try:
        return proc.communicate(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return proc.communicate()


def run(mode: str, np_: int, program: Sequence[str], rate: Optional[str] = None, *, timeout: float = 600,
        burst: str = "512kb", latency: str = "100ms", env: Optional[Mapping[str, str]] = None,
        mpirun_extra: Sequence[str] = (), capture: bool = True, cwd: Optional[str] = None,
        check: bool = True, per_node: int = 1) -> subprocess.CompletedProcess:
    """Run ``program`` under mpirun on ``np_`` ranks on ``mode``'s network limited to ``rate``.

    Returns the CompletedProcess (output captured as text unless ``capture`` is False).
    Raises :class:`SlownetUnavailable` when the harness cannot run here (checked first) and
    ``subprocess.TimeoutExpired`` after ``timeout`` seconds, having stopped mpirun and torn
    the network down. ``env`` (default: this process's) gets OMP_NUM_THREADS=1 unless set;
    its PATH/PYTHONPATH/HOROVOD_*/... are forwarded to the ranks. ``per_node``: ranks per
    namespace in mode bridge (nodes, see the module doc)."""
    if check:
        check_available(mode)
    env = dict(os.environ if env is None else env)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    link = None if mode == "none" else Link(rate or "", burst, latency)
    script = build_script(mode, np_, link, program, forwarded_env(env), mpirun_extra, per_node)
    pipe = subprocess.PIPE if capture else None
    proc = subprocess.Popen(command_line(mode, script), stdout=pipe, stderr=pipe, text=True, env=env, cwd=cwd,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = _stop(proc, grace_s=20.0)
        raise subprocess.TimeoutExpired(proc.args, timeout, output=out, stderr=err) from None
    except BaseException:
        _stop(proc, grace_s=20.0)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# -- command line -----------------------------------------------------------------------

def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """``[options] MODE RATE -- PROGRAM...`` (RATE is omitted for mode none)."""
    argv = list(argv)
    program: List[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, program = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(prog="python -m horovod_gradcomp.bench.slownet",
                                     description="run PROGRAM under mpirun on a rate-limited network in "
                                                 "private namespaces (see the module docstring)")
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("rate", nargs="?", default=None, help="tc rate of every link, e.g. 1gbit, 100mbit")
    parser.add_argument("--np", type=int, default=2, help="number of ranks (2)")
    parser.add_argument("--per-node", type=int, default=1,
                        help="bridge: ranks per namespace (node); only links between nodes are limited (1)")
    parser.add_argument("--burst", default="512kb", help="tbf burst (512kb)")
    parser.add_argument("--latency", default="100ms", help="tbf latency: the queue limit in time (100ms)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds before the run is stopped (3600)")
    parser.add_argument("--print-script", action="store_true", help="print the bash script and exit")
    args = parser.parse_args(argv)
    if not program:
        parser.error("no program: give it after --, e.g. -- python train.py")
    if args.mode != "none" and not args.rate:
        parser.error(f"mode {args.mode} needs a RATE, e.g. 1gbit")
    args.program = program
    return args


#: What a bench on the harness reports as its own error (exit status :func:`error_status`), not a crash.
HARNESS_ERRORS = (ValueError, RuntimeError, OSError, KeyError, SlownetUnavailable)


def error_status(tag: str, exc: BaseException) -> int:
    """Print ``exc`` as the ``[tag]`` command's error; the exit status: 4 when the harness is
    unavailable, 2 for anything else (bad options, a failed run)."""
    print(f"[{tag}] error: {exc}", file=sys.stderr)
    return 4 if isinstance(exc, SlownetUnavailable) else 2


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; the exit status is mpirun's (3 for a failed network setup,
    4 when the harness is unavailable, 124 on timeout)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.print_script:
            link = None if args.mode == "none" else Link(args.rate, args.burst, args.latency)
            env_names = forwarded_env(dict(os.environ, OMP_NUM_THREADS="1"))
            print(build_script(args.mode, args.np, link, args.program, env_names, per_node=args.per_node))
            return 0
        res = run(args.mode, args.np, args.program, args.rate, timeout=args.timeout, burst=args.burst,
                  latency=args.latency, capture=False, per_node=args.per_node)
    except (SlownetUnavailable, ValueError) as exc:
        return error_status("slownet", exc)
    except subprocess.TimeoutExpired:
        print(f"[slownet] stopped after {args.timeout:g} s (--timeout)", file=sys.stderr)
        return 124
    return res.returncode


if __name__ == "__main__":
    sys.exit(main())


def run_rows(mode: str, np_: int, argv_for: Callable[[str], List[str]], rate: Optional[str], *, label: str,
             timeout: float, env: Mapping[str, str], per_node: int = 1, burst: str = "512kb", hint: str = ""):
    """What the ranks of one harness run write as JSON: :func:`run` of ``argv_for(json_path)``
    (``json_path`` in a temporary folder) at ``rate``. RuntimeError naming ``label`` (the run's
    rate as the bench calls it) when the run times out, fails or writes nothing; ``hint`` is
    appended to the failure's message."""
    with tempfile.TemporaryDirectory(prefix="hgc-run-") as tmp:
        out = os.path.join(tmp, "rows.json")
        try:
            res = run(mode, np_, argv_for(out), rate, timeout=timeout, env=env, capture=False, per_node=per_node,
                      burst=burst)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the run at {label} took over {timeout:g} s (--timeout)") from None
        if res.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"the run at {label} failed (rc {res.returncode}){hint}")
        with open(out) as f:
            return json.load(f)
