"""Emulated bandwidth-limited cluster on one host: ``ccbench cluster up|down|status|run|selfcheck``.

One network namespace per rank (``<name>-<i>``), each with one veth (``<name>-eth``) whose
peer (``<name>-p<i>``) is a port of a bridge (``<name>-br``) that lives in a namespace of
its own (``<name>-sw``), so the host's namespace, its links and its firewall are never
touched. Every link is shaped in both directions with a token bucket (``tc tbf``): the
rank side shapes what the rank sends, the switch side what it receives, so each rank has
a full-duplex link of the configured rate. Addresses (a private /24 chosen from the
name) exist only inside those namespaces.

``run`` starts the ``mpiexec`` next to the running Python (else the one on PATH) in the
host namespace; Hydra's proxy forks every rank as ``ip netns exec <name>-<i> COMMAND``.
The rank inherits its PMI connection to the proxy as a file descriptor (``PMI_FD``), so
the launch needs no network between namespaces, while MPI traffic is forced onto TCP over
``<name>-eth``. The cluster's layout is kept in ``<state dir>/<name>.json`` (root:
``/run/ccbench``).

Without root, where unprivileged user namespaces are allowed, ``up`` starts a keeper
process in a user, network and mount namespace of its own (``unshare -Urnm``) with a
private tmpfs on ``/run/netns``; it builds the same layout there and sleeps until
``down``. The other actions enter its namespaces with ``nsenter`` (``--preserve-
credentials``): the ranks are as isolated, and nothing on the host is touched.

``up --codec SPEC --codec-ratio R`` sets the link rate from the codec's throughput on
this host (one encode and one decode, CPU time, one core; shared by the ranks that share
a core) divided by R: the regime of a GPU codec R times faster than the network.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ccbench.kernels.errors import UsageError
from ccbench.scripts.launch import MPICH, find_mpiexec, placement_args, refuse_inside_mpi_launch

ROOT_STATE_DIR = Path("/run/ccbench")
ROOT, USERNS = "root", "userns"  # how a cluster was built: capabilities, or a user namespace
DEFAULT_NAME = "ccb"
DEFAULT_RATE = "1gbit"
NAME_RE = re.compile(r"[a-z][a-z0-9]{0,7}")  # keeps "<name>-p<rank>" within 15 characters
MAX_RANKS = 250  # one /24
SELFCHECK_PORT = 18515  # inside the cluster's namespaces only, so it never clashes

# Checked with the mpich wheel (MPICH 5, ch4:ucx,ofi): without NOLOCAL the ranks, all on
# one host as far as MPICH knows, talk through shared memory; without the ofi/tcp
# settings the ucx netmod bypasses the shaped interface. Either way no bytes cross tc.
MPICH_TCP_ENV = {
    "MPIR_CVAR_NOLOCAL": "1",
    "MPIR_CVAR_CH4_NETMOD": "ofi",
    "FI_PROVIDER": "tcp",
}

# CAP_NET_ADMIN for links and qdiscs, CAP_SYS_ADMIN for `ip netns add/exec` (mounts).
CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21


class ClusterError(Exception):
    """A system command failed while building or using the cluster."""


# ----------------------------------------------------------------------------- parsing

_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_TIME_UNITS = {"us": 1, "usec": 1, "ms": 1000, "msec": 1000, "s": 10**6, "sec": 10**6}
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2}


def _split_unit(text: str, what: str) -> tuple[float, str]:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*", text.lower())
    if not m:
        raise UsageError(f"bad {what} {text!r}")
    return float(m.group(1)), m.group(2)


def parse_rate(text: str) -> int:
    """Link rate in bit/s from tc-style text: 1gbit, 100mbit, 2.5gbit (SI prefixes)."""
    value, unit = _split_unit(text, "rate")
    if unit.endswith("bps"):
        raise UsageError(f"rate {text!r}: use bit units such as 1gbit (in tc, 'bps' is bytes/s)")
    if unit not in _RATE_UNITS:
        raise UsageError(f"rate {text!r}: unit must be one of {', '.join(_RATE_UNITS)}")
    bps = round(value * _RATE_UNITS[unit])
    if bps < 10**6:
        raise UsageError(f"rate {text!r} is below 1mbit")
    return bps


def parse_delay(text: str) -> int:
    """One-way delay in microseconds: 50us, 1ms, 0."""
    value, unit = _split_unit(text, "delay")
    if unit not in _TIME_UNITS and not (unit == "" and value == 0):
        raise UsageError(f"delay {text!r}: unit must be one of us, ms, s")
    return round(value * _TIME_UNITS.get(unit, 1))


def parse_bytes(text: str) -> int:
    """Byte count: 125000, 128k, 2mb (binary prefixes, as tc reads sizes)."""
    value, unit = _split_unit(text, "size")
    if unit not in _SIZE_UNITS:
        raise UsageError(f"size {text!r}: unit must be one of k, kb, m, mb")
    return int(value * _SIZE_UNITS[unit])


def format_rate(bps: int) -> str:
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps >= scale:
            return f"{bps / scale:g}{unit}"
    return f"{bps}bit"


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise UsageError(
            f"cluster name {name!r}: use 1-8 lower-case letters or digits, starting with a letter"
        )
    return name


# ----------------------------------------------------------------------------- layout


@dataclass
class Cluster:
    """What `up` built: names, addresses and shaping; saved as the state file."""

    name: str
    ranks: int
    rate_bps: int
    delay_us: int
    mtu: int
    burst_bytes: int
    limit_bytes: int
    created: str = ""
    mode: str = ROOT
    keeper_pid: int = 0  # userns mode: the process holding the namespaces
    goodput_bps: float = 0.0  # TCP payload rate measured by `selfcheck` (0: not yet)
    regime: dict | None = None  # --codec / --codec-ratio: how the rate was chosen
    # Derived from the name alone, so `down` finds leftovers without a state file, and a
    # hash of the name picks the subnet, so clusters of different names do not share one.
    subnet: str = field(init=False)
    namespaces: list[str] = field(init=False)
    addresses: list[str] = field(init=False)
    ports: list[str] = field(init=False)
    switch_namespace: str = field(init=False)
    bridge: str = field(init=False)
    rank_iface: str = field(init=False)

    def __post_init__(self):
        h = zlib.crc32(self.name.encode())
        self.subnet = f"10.{200 + h % 50}.{(h >> 8) % 256}.0/24"
        prefix = self.subnet.rsplit(".", 1)[0]
        self.namespaces = [f"{self.name}-{i}" for i in range(self.ranks)]
        self.addresses = [f"{prefix}.{i + 1}" for i in range(self.ranks)]
        self.ports = [f"{self.name}-p{i}" for i in range(self.ranks)]
        self.switch_namespace = f"{self.name}-sw"
        self.bridge = f"{self.name}-br"
        self.rank_iface = f"{self.name}-eth"

    @property
    def link_gbps(self) -> float:
        return self.rate_bps / 1e9

    def shaping(self) -> tuple:
        # a rate matched to a codec is measured anew each time: the regime names it
        rate = (self.regime["codec"], self.regime["codec_link_ratio"]) if self.regime \
            else self.rate_bps
        return (self.mode, self.ranks, rate, self.delay_us, self.mtu,
                None if self.regime else self.burst_bytes,
                None if self.regime else self.limit_bytes)  # fmt: skip

    def tcp_goodput_bps(self) -> float:
        """Rate left for TCP payload: tbf counts Ethernet (14 B) + IPv4 (20) + TCP (32) headers."""
        return self.rate_bps * (self.mtu - 52) / (self.mtu + 14)


def default_burst(rate_bps: int, mtu: int) -> int:
    # A bucket of 1 ms at the link rate: timer wake-ups of a qdisc come ~0.1 ms late on a
    # busy or virtual host, and a bucket much smaller than that caps throughput well below
    # the rate (measured: 16 KB at 1 Gbit/s gave 0.53 Gbit/s, 125 KB 0.955 = the header
    # bound). Idle time refills it, so a lone message below ~1 ms of line rate can pass
    # unshaped; back-to-back collectives keep it drained.
    return max(rate_bps // 8 // 1000, 4 * (mtu + 14))


def default_limit(rate_bps: int, burst: int) -> int:
    # Queue of 20 ms at the link rate (>= 1 MiB): several senders converging on one port
    # must queue, not drop, or TCP stalls on a retransmission timeout.
    return max(rate_bps // 8 // 50, 1 << 20, 2 * burst)


def state_dir() -> Path:
    """Root: /run/ccbench (a tmpfs, cleared at reboot as the namespaces are). Others:
    $XDG_RUNTIME_DIR/ccbench, else ccbench-<uid> in the temporary directory."""
    if os.geteuid() == 0:
        return ROOT_STATE_DIR
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.access(runtime, os.W_OK):
        return Path(runtime) / "ccbench"
    return Path(tempfile.gettempdir()) / f"ccbench-{os.getuid()}"


def state_path(name: str) -> Path:
    return state_dir() / f"{name}.json"


def load_state(name: str) -> Cluster | None:
    try:
        data = json.loads(state_path(name).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ClusterError(
            f"{state_path(name)}: unreadable ({exc}); run `ccbench cluster down`"
        ) from exc
    fields = {k: data[k] for k in ("name", "ranks", "rate_bps", "delay_us", "mtu",
                                   "burst_bytes", "limit_bytes", "created")}  # fmt: skip
    optional = ("mode", "keeper_pid", "goodput_bps", "regime")
    fields.update({k: data[k] for k in optional if k in data})
    return Cluster(**fields)


def save_state(cluster: Cluster) -> None:
    state_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
    path = state_path(cluster.name)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({**asdict(cluster), "link_gbps": cluster.link_gbps}, indent=2) + "\n")
    os.replace(tmp, path)


@contextlib.contextmanager
def state_lock():
    """Serialise `up` and `down` (two shells at once); one lock file for all names, as
    both take well under a second."""
    state_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(state_dir() / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


# ----------------------------------------------------------------------------- system


def require_tools_and_privileges(userns: bool = False) -> str:
    """ROOT or USERNS: how clusters are built here; UsageError (one line) when neither.
    `userns`: a user namespace even where root could build on the host."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise UsageError(
            f"ccbench cluster needs iproute2 ({' and '.join(missing)} not found); "
            "install it, e.g. apt-get install -y iproute2"
        )
    if has_privileges() and not userns:
        return ROOT
    why = userns_unavailable()
    if why:
        raise UsageError(
            "ccbench cluster needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) or unprivileged "
            f"user namespaces to create network namespaces, and {why}"
        )
    return USERNS


_USERNS_PROBE: dict[str, str] = {}


def userns_unavailable() -> str:
    """Why an unprivileged user namespace with its own network and mounts cannot be made
    here ('' when it can): `unshare -Urnm` must run and mount a tmpfs inside."""
    if "why" in _USERNS_PROBE:
        return _USERNS_PROBE["why"]
    missing = [tool for tool in ("unshare", "nsenter", "mount") if shutil.which(tool) is None]
    if missing:
        why = f"{' and '.join(missing)} (util-linux) not found"
    else:
        probe = subprocess.run(["unshare", "-Urnm", "mount", "-t", "tmpfs", "ccbench",
                                tempfile.gettempdir()], capture_output=True, text=True,
                               stdin=subprocess.DEVNULL, timeout=30, check=False)
        detail = (probe.stderr.strip().splitlines() or ["failed"])[-1]
        why = "" if probe.returncode == 0 else (
            f"unprivileged user namespaces are not allowed here (`unshare -Urnm`: {detail})")
    _USERNS_PROBE["why"] = why
    return why


def has_privileges() -> bool:
    try:
        status = Path("/proc/self/status").read_text()
        caps = int(re.search(r"^CapEff:\s*([0-9a-f]+)", status, re.MULTILINE).group(1), 16)
    except (OSError, AttributeError):
        return os.geteuid() == 0
    return all(caps >> bit & 1 for bit in (CAP_NET_ADMIN, CAP_SYS_ADMIN))


_ENTER: list[str] = []  # the nsenter prefix of a userns cluster's commands, else empty


def enter_command(cluster: Cluster) -> list[str]:
    """What runs a command in the cluster's user, mount and network namespaces."""
    if cluster.mode != USERNS:
        return []
    # --wd: the caller's directory (relative paths of the command), else the keeper's
    return ["nsenter", "-t", str(cluster.keeper_pid), "-U", "-m", "-n",
            "--preserve-credentials", f"--wd={os.getcwd()}", "--"]


@contextlib.contextmanager
def entered(cluster: Cluster | None):
    """Within this block, `sh` and the helpers run their commands inside `cluster`."""
    global _ENTER
    old = _ENTER
    _ENTER = enter_command(cluster) if cluster is not None else []
    try:
        yield
    finally:
        _ENTER = old


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    args = (*_ENTER, *args)
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines() or [str(proc.returncode)]
        raise ClusterError(f"`{' '.join(args)}` failed: {detail[-1]}")
    return proc


def list_namespaces() -> set[str]:
    out = sh("ip", "netns", "list").stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def leftover_namespaces(name: str) -> list[str]:
    """Namespaces of cluster `name` (exactly `<name>-sw` and `<name>-<digits>`)."""
    pattern = re.compile(rf"{re.escape(name)}-(sw|[0-9]+)")
    return sorted(ns for ns in list_namespaces() if pattern.fullmatch(ns))


def shape_link(netns: str, dev: str, cluster: Cluster, delay_us: int) -> None:
    """Token bucket on the egress of `dev`, after a netem delay stage when asked for one."""
    tbf = ["tbf", "rate", f"{cluster.rate_bps}bit", "burst", str(cluster.burst_bytes),
           "limit", str(cluster.limit_bytes)]  # fmt: skip
    if delay_us <= 0:
        sh("tc", "-n", netns, "qdisc", "replace", "dev", dev, "root", *tbf)
        return
    # netem holds each packet for the delay, then hands it to the tbf child (tc-netem(8)).
    packets = max(1000, 2 * cluster.limit_bytes // (cluster.mtu + 14))
    proc = sh("tc", "-n", netns, "qdisc", "replace", "dev", dev, "root", "handle", "1:",
              "netem", "delay", f"{delay_us}us", "limit", str(packets), check=False)  # fmt: skip
    if proc.returncode != 0:
        if "unknown" in proc.stderr.lower():
            raise UsageError("--delay needs the kernel's netem qdisc (CONFIG_NET_SCH_NETEM), "
                             "which this kernel lacks; run without --delay")  # fmt: skip
        raise ClusterError(f"tc netem on {netns}/{dev} failed: {proc.stderr.strip()}")
    sh("tc", "-n", netns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf)


def tsq_bytes(cluster: Cluster) -> int:
    # TCP Small Queues: how much one socket may have waiting in the qdisc. The default
    # (4 MB) lets one bulk stream fill the shaper's queue, i.e. 30 ms at 1 Gbit/s that
    # every other message of the rank waits behind; two buckets' worth keeps the link
    # just as busy (measured) with ~2 ms of queue, closer to a NIC with BQL.
    return max(2 * cluster.burst_bytes, 64 * 1024)


def set_sysctl(netns: str, key: str, value: int) -> None:
    """Write a per-namespace sysctl from inside the namespace (no procps needed)."""
    proc = subprocess.run([*_ENTER, "ip", "netns", "exec", netns, "tee", f"/proc/sys/{key}"],
                          input=f"{value}\n", capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ClusterError(f"setting {key} in {netns} failed: {proc.stderr.strip()}")


def build(cluster: Cluster) -> None:
    """Namespaces, bridge, veth pairs, addresses and shaping (the caller cleans up on error)."""
    sw, br, mtu = cluster.switch_namespace, cluster.bridge, str(cluster.mtu)
    sh("ip", "netns", "add", sw)
    sh("ip", "-n", sw, "link", "add", br, "mtu", mtu, "type", "bridge", "stp_state", "0")
    sh("ip", "-n", sw, "link", "set", br, "up")
    prefix_len = cluster.subnet.split("/")[1]
    for ns, port, addr in zip(cluster.namespaces, cluster.ports, cluster.addresses, strict=True):
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", sw, "link", "add", port, "mtu", mtu, "type", "veth",
           "peer", "name", cluster.rank_iface, "mtu", mtu, "netns", ns)  # fmt: skip
        sh("ip", "-n", sw, "link", "set", port, "master", br)
        sh("ip", "-n", sw, "link", "set", port, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        set_sysctl(ns, "net/ipv4/tcp_limit_output_bytes", tsq_bytes(cluster))
        sh("ip", "-n", ns, "addr", "add", f"{addr}/{prefix_len}", "dev", cluster.rank_iface)
        sh("ip", "-n", ns, "link", "set", cluster.rank_iface, "up")
        # Rank side: what the rank sends (plus the one-way delay); switch side: what it
        # receives. Together a full-duplex link of the configured rate.
        shape_link(ns, cluster.rank_iface, cluster, cluster.delay_us)
        shape_link(sw, port, cluster, 0)


def teardown(name: str, mode: str = ROOT) -> list[str]:
    """Delete every namespace of cluster `name` (links and qdiscs go with them). A
    userns cluster's namespaces live as long as its keeper: stopping it removes them."""
    if mode == USERNS:
        cluster = load_state(name)
        names = []
        if cluster is not None and cluster.mode == USERNS:
            if keeper_alive(cluster):
                names = [*cluster.namespaces, cluster.switch_namespace]
            stop_keeper(cluster.keeper_pid)
        state_path(name).unlink(missing_ok=True)
        state_path(name).with_suffix(".log").unlink(missing_ok=True)
        return names
    names = leftover_namespaces(name)  # the state's names all match this pattern
    for ns in names:
        proc = sh("ip", "netns", "del", ns, check=False)
        if proc.returncode != 0 and ns in list_namespaces():
            raise ClusterError(f"`ip netns del {ns}` failed: {proc.stderr.strip()}")
    state_path(name).unlink(missing_ok=True)
    return names


# ----------------------------------------------------------------------------- userns keeper


def keeper_alive(cluster: Cluster) -> bool:
    """The keeper of a userns cluster still runs (and is ours: its command line says so)."""
    if cluster.keeper_pid <= 0:
        return False
    try:
        cmdline = Path(f"/proc/{cluster.keeper_pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"_keeper" in cmdline and cluster.name.encode() in cmdline


def stop_keeper(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM the keeper, then SIGKILL if it lingers; its namespaces go with it."""
    if pid <= 0:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.waitpid(pid, os.WNOHANG)  # our child when `up` stops it on failure
            except ChildProcessError:
                pass
            if not Path(f"/proc/{pid}").exists() or _zombie(pid):
                return
            time.sleep(0.05)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def start_keeper(cluster: Cluster, timeout: float = 120.0) -> int:
    """Start the keeper of a userns cluster and wait until it has built the layout.
    Returns its pid (the process whose namespaces `nsenter` enters)."""
    log = state_path(cluster.name).with_suffix(".log")
    log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    layout = json.dumps({k: v for k, v in asdict(cluster).items()
                         if k in ("name", "ranks", "rate_bps", "delay_us", "mtu",
                                  "burst_bytes", "limit_bytes")})
    with open(log, "w") as err:
        proc = subprocess.Popen(
            ["unshare", "-Urnm", "--propagation", "private", sys.executable, "-m",
             "ccbench.scripts.cluster", "_keeper", layout],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
            start_new_session=True, text=True)  # fmt: skip
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline().strip() if ready else ""
    proc.stdout.close()
    if line != "ready":
        stop_keeper(proc.pid)
        tail = log.read_text().strip().splitlines() if log.exists() else []
        raise ClusterError("building the cluster in a user namespace failed: "
                           f"{tail[-1] if tail else 'no answer within ' + str(timeout) + ' s'}")
    return proc.pid


def keeper_main(argv: list[str]) -> int:
    """Inside `unshare -Urnm`: a private /run/netns, the layout, then sleep until told to
    stop (the namespaces live as long as this process)."""
    cluster = Cluster(**json.loads(argv[0]))
    netns_dir = Path("/run/netns")
    # `ip netns add` keeps its namespaces under /run/netns: a tmpfs of this mount
    # namespace's own, over it or, where it does not exist yet, over /run
    target = netns_dir if netns_dir.is_dir() else netns_dir.parent
    sh("mount", "-t", "tmpfs", "-o", "mode=755", "ccbench", str(target))
    netns_dir.mkdir(exist_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    build(cluster)
    print("ready", flush=True)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    while not stop.wait(3600):
        pass
    return 0


@contextlib.contextmanager
def terminate_as_interrupt():
    """Turn SIGTERM/SIGHUP into KeyboardInterrupt so a killed `up` still cleans up."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def intact(cluster: Cluster) -> bool:
    if cluster.mode == USERNS and not keeper_alive(cluster):
        return False
    with entered(cluster):
        return {*cluster.namespaces, cluster.switch_namespace} <= list_namespaces()


def require_cluster(name: str) -> Cluster:
    cluster = load_state(name)
    if cluster is None:
        raise UsageError(f"cluster {name!r} is not up; start it with `ccbench cluster up "
                         f"--name {name} --ranks N --rate 1gbit`")  # fmt: skip
    if not intact(cluster):
        raise UsageError(f"cluster {name!r} is broken (namespaces missing); run `ccbench "
                         f"cluster down --name {name}` and `up` again")  # fmt: skip
    return cluster


# ----------------------------------------------------------------------------- commands


def cmd_up(opts) -> int:
    mode = require_tools_and_privileges(opts.userns)
    if not 1 <= opts.ranks <= MAX_RANKS:
        raise UsageError(f"--ranks must be between 1 and {MAX_RANKS}")
    regime = None
    if (opts.codec is None) != (opts.codec_ratio is None):
        raise UsageError("--codec and --codec-ratio go together: the link rate is the "
                         "codec's throughput on this host divided by the ratio")
    if opts.codec is not None:
        if opts.rate is not None:
            raise UsageError("give --rate or --codec with --codec-ratio, not both")
        if not opts.codec_ratio > 0:
            raise UsageError("--codec-ratio must be positive")
        regime = regime_rate(opts.codec, opts.codec_ratio, opts.ranks)
        print(describe_regime(regime, opts.ranks))
        rate = regime["rate_bps"]
    else:
        rate = parse_rate(opts.rate or DEFAULT_RATE)
    delay = parse_delay(opts.delay)
    if not 576 <= opts.mtu <= 65000:
        raise UsageError("--mtu must be between 576 and 65000")
    burst = parse_bytes(opts.burst) if opts.burst else default_burst(rate, opts.mtu)
    limit = parse_bytes(opts.limit) if opts.limit else default_limit(rate, burst)
    if burst < opts.mtu + 14:
        raise UsageError(f"--burst must hold one frame ({opts.mtu + 14} bytes)")
    want = Cluster(opts.name, opts.ranks, rate, delay, opts.mtu, burst, limit,
                   created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), mode=mode,
                   regime=regime)  # fmt: skip
    with state_lock(), terminate_as_interrupt():
        have = load_state(opts.name)
        if have is not None and have.shaping() == want.shaping() and intact(have):
            print(f"cluster {opts.name} is already up: {describe(have)}")
            return 0
        stray = mode == ROOT and leftover_namespaces(opts.name)
        if have is not None or stray:
            removed = teardown(opts.name, have.mode if have is not None else mode)
            print(f"cluster {opts.name}: removed the previous layout ({len(removed)} namespaces)")
        try:
            if mode == USERNS:
                want.keeper_pid = start_keeper(want)
            else:
                build(want)
            save_state(want)
        except BaseException:
            if mode == USERNS:
                stop_keeper(want.keeper_pid)
                state_path(opts.name).unlink(missing_ok=True)
            else:
                teardown(opts.name)
            raise
    print(f"cluster {opts.name} is up: {describe(want)}")
    return 0


# ----------------------------------------------------------------------------- regime


def codec_throughput(spec: str, nbytes: int = 16 << 20, repeats: int = 5) -> dict:
    """The codec's encode and decode rates on this host, in bytes/s of uncompressed
    float32, from the CPU time of the best of `repeats` (one core; other jobs on the host
    do not slow a CPU clock the way they slow a wall clock)."""
    import numpy as np

    from ccbench.kernels.codec_base import empty_payload
    from ccbench.kernels.codecs import parse_codec

    codec = parse_codec(spec)
    if "torch" in sys.modules:  # the fp16/bf16 kernels: one thread, as each rank runs them
        sys.modules["torch"].set_num_threads(1)
    count = nbytes // 4
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(count) * 1e-3).astype(np.float32)  # gradient-sized values
    payload = empty_payload(x, codec.max_encoded_nbytes(count, "float32"))
    out = np.empty_like(x)
    encode, decode = [], []
    for _ in range(repeats):
        t0 = time.thread_time()
        encoded = codec.encode(x, out=payload)
        t1 = time.thread_time()
        codec.decode(encoded, out)
        t2 = time.thread_time()
        encode.append(t1 - t0)
        decode.append(t2 - t1)
    enc, dec = max(min(encode), 1e-9), max(min(decode), 1e-9)
    return {"encode_bps": count * 4 / enc, "decode_bps": count * 4 / dec,
            "round_trip_bps": count * 4 / (enc + dec)}


def regime_rate(spec: str, ratio: float, ranks: int, cores: int | None = None,
                measured: dict | None = None) -> dict:
    """The link rate at which the codec is `ratio` times faster than the link.

    codec rate per rank = round trip bytes/s on one core x min(1, cores / ranks) (ranks on
    one host share its cores); link bytes/s = that / ratio, rounded to 3 significant
    digits (at least 1 Mbit/s)."""
    cores = cores or len(os.sched_getaffinity(0))
    measured = measured or codec_throughput(spec)
    share = min(1.0, cores / ranks)
    per_rank = measured["round_trip_bps"] * share
    bps = per_rank * 8 / ratio
    digits = 2 - int(math.floor(math.log10(bps)))  # 3 significant digits
    rate = max(10**6, int(round(bps, digits)))
    return {"codec": spec, "codec_link_ratio": ratio, "cores": cores, "share": share,
            "encode_gbytes_per_s": measured["encode_bps"] / 1e9,
            "decode_gbytes_per_s": measured["decode_bps"] / 1e9,
            "round_trip_gbytes_per_s": measured["round_trip_bps"] / 1e9,
            "per_rank_gbytes_per_s": per_rank / 1e9, "rate_bps": rate}


def describe_regime(r: dict, ranks: int) -> str:
    return (f"codec {r['codec']} on this host (CPU time, one core): encode "
            f"{r['encode_gbytes_per_s']:.2f} GB/s, decode {r['decode_gbytes_per_s']:.2f} "
            f"GB/s, round trip {r['round_trip_gbytes_per_s']:.2f} GB/s; {ranks} ranks on "
            f"{r['cores']} cores: {r['per_rank_gbytes_per_s']:.3f} GB/s per rank; / "
            f"{r['codec_link_ratio']:g} -> links of {format_rate(r['rate_bps'])}")


def describe(c: Cluster) -> str:
    delay = f", +{c.delay_us} us one-way" if c.delay_us else ""
    regime = (f" (codec {c.regime['codec']} {c.regime['codec_link_ratio']:g}x the link)"
              if c.regime else "")
    where = f"; in a user namespace (keeper pid {c.keeper_pid})" if c.mode == USERNS else ""
    return (f"{c.ranks} ranks, {format_rate(c.rate_bps)} full-duplex links{regime}{delay}, "
            f"MTU {c.mtu}, subnet {c.subnet}, namespaces {c.namespaces[0]}.."
            f"{c.namespaces[-1]}{where}")  # fmt: skip


def cmd_down(opts) -> int:
    mode = require_tools_and_privileges()
    with state_lock(), terminate_as_interrupt():
        have = load_state(opts.name)
        removed = teardown(opts.name, have.mode if have is not None else mode)
    if removed:
        print(f"cluster {opts.name} is down ({len(removed)} namespaces removed)")
    else:
        print(f"cluster {opts.name} was not up; nothing to remove")
    return 0


def qdisc_stats(netns: str, dev: str) -> dict:
    proc = sh("tc", "-n", netns, "-s", "-j", "qdisc", "show", "dev", dev, check=False)
    try:
        qdiscs = json.loads(proc.stdout)
    except ValueError:
        return {}
    tbf = next((q for q in qdiscs if q.get("kind") == "tbf"), {})
    return {"bytes": tbf.get("bytes", 0), "drops": tbf.get("drops", 0)}


def cmd_status(opts) -> int:
    mode = require_tools_and_privileges()
    cluster = load_state(opts.name)
    if cluster is not None:
        with entered(cluster):
            return _status(opts, cluster)
    stray = leftover_namespaces(opts.name) if mode == ROOT else []
    if cluster is None:
        info = {"name": opts.name, "up": False, "stray_namespaces": stray}
        if opts.json:
            print(json.dumps(info))
        else:
            extra = f" (stray namespaces: {' '.join(stray)}; run `down`)" if stray else ""
            print(f"cluster {opts.name} is not up{extra}")
        return 1
    return _status(opts, cluster)


def _status(opts, cluster: Cluster) -> int:
    alive = cluster.mode != USERNS or keeper_alive(cluster)
    present = list_namespaces() if alive else set()
    ranks = []
    for i, (ns, port, addr) in enumerate(zip(cluster.namespaces, cluster.ports,
                                             cluster.addresses, strict=True)):  # fmt: skip
        ok = ns in present and cluster.switch_namespace in present
        ranks.append({
            "rank": i, "namespace": ns, "present": ns in present, "address": addr,
            "sent": qdisc_stats(ns, cluster.rank_iface) if ok else {},
            "received": qdisc_stats(cluster.switch_namespace, port) if ok else {},
        })  # fmt: skip
    up = intact(cluster)
    if opts.json:
        print(json.dumps({**asdict(cluster), "up": up, "link_gbps": cluster.link_gbps,
                          "ranks_detail": ranks}))  # fmt: skip
        return 0 if up else 1
    print(f"cluster {cluster.name}: {'up' if up else 'BROKEN (namespaces missing)'}, "
          f"{describe(cluster)}")
    print(f"  tbf burst {cluster.burst_bytes} B, queue limit {cluster.limit_bytes} B, "
          f"tcp_limit_output_bytes {tsq_bytes(cluster)}; "
          f"bridge {cluster.bridge} in {cluster.switch_namespace}; "
          f"rank interface {cluster.rank_iface}; state {state_path(cluster.name)}")
    print(f"  {'rank':>4}  {'namespace':<12} {'address':<15} {'sent B':>14} {'recv B':>14} drops")
    for r in ranks:
        drops = r["sent"].get("drops", 0) + r["received"].get("drops", 0)
        print(f"  {r['rank']:>4}  {r['namespace']:<12} {r['address']:<15} "
              f"{r['sent'].get('bytes', '-'):>14} {r['received'].get('bytes', '-'):>14} {drops}")
    return 0 if up else 1


def check_hydra(mpiexec: str) -> None:
    proc = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, check=False)
    if "HYDRA" not in proc.stdout:
        raise UsageError(f"{mpiexec} is not MPICH's Hydra; `ccbench cluster run` drives MPICH "
                         "(see docs/emulated-cluster.md for the Open MPI equivalent)")  # fmt: skip


def rank_environment(cluster: Cluster, nranks: int) -> dict[str, str]:
    # the payload rate the compressed variants' floor uses: measured by `selfcheck`,
    # else the TCP ceiling of the configured rate
    goodput = cluster.goodput_bps or cluster.tcp_goodput_bps()
    env = {
        **MPICH_TCP_ENV,
        "FI_TCP_IFACE": cluster.rank_iface,
        "CCBENCH_LINK_GBPS": f"{cluster.link_gbps:g}",
        "CCBENCH_LINK_GOODPUT_GBPS": f"{goodput / 1e9:.6g}",
    }
    if "OMP_NUM_THREADS" not in os.environ:
        # the emulated nodes share the host's cores: no rank should spawn a thread per core
        env["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // nranks))
    return env


def mpiexec_command(cluster: Cluster, command: list[str], nranks: int,
                    mpiexec: str, bind: bool | None = None) -> list[str]:  # fmt: skip
    """Hydra MPMD launch: segment i is rank i, run inside namespace i."""
    if command[0] in ("python", "python3"):
        command = [sys.executable, *command[1:]]  # the Python with mpi4py, even under sudo
    # Hydra binds each rank to a core of the host the emulated nodes share
    args = [*enter_command(cluster), mpiexec, "-launcher", "fork",
            *placement_args(MPICH, nranks, bind)]
    for key, value in rank_environment(cluster, nranks).items():
        args += ["-genv", key, value]
    for i in range(nranks):
        if i:
            args.append(":")
        args += ["-n", "1", "ip", "netns", "exec", cluster.namespaces[i], *command]
    return args


def launch(args: list[str]) -> int:
    """Run mpiexec in the foreground; on Ctrl-C let Hydra stop the ranks, then kill it."""
    proc = subprocess.Popen(args)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        # The terminal sent SIGINT to mpiexec too; Hydra forwards it to the ranks.
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.wait(timeout=10)
        proc.kill()
        proc.wait()
        return 130


def cmd_run(opts) -> int:
    require_tools_and_privileges()
    command = list(opts.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("nothing to run: ccbench cluster run [--name N] [-n K] -- COMMAND ...")
    cluster = require_cluster(opts.name)
    nranks = opts.np or cluster.ranks
    if not 1 <= nranks <= cluster.ranks:
        raise UsageError(f"-n {nranks}: cluster {cluster.name} has {cluster.ranks} ranks")
    mpiexec = find_mpiexec()
    check_hydra(mpiexec)
    args = mpiexec_command(cluster, command, nranks, mpiexec, bind=False if opts.no_bind else None)
    if opts.dry_run:
        print(shlex.join(args))
        return 0
    return launch(args)


def cmd_check(opts) -> int:
    """One line: how clusters are built here, or why they cannot be (exit 1)."""
    try:
        mode = require_tools_and_privileges()
    except UsageError as exc:
        print(str(exc))
        return 1
    print("root: namespaces on the host" if mode == ROOT else
          "unprivileged: namespaces inside a user namespace (unshare -Urnm)")
    return 0


# ----------------------------------------------------------------------------- selfcheck


def tcp_flows(cluster: Cluster, pairs: list[tuple[int, int]], nbytes: int) -> dict[int, float]:
    """Run TCP streams src -> dst (all at once); return bit/s per source rank."""
    receivers = sorted({dst for _, dst in pairs})
    senders = {src: dst for src, dst in pairs}
    procs = {}
    env = dict(os.environ)
    helper = [sys.executable, "-m", "ccbench.scripts.cluster", "_tcp-flow", "--bytes", str(nbytes)]
    for rank in sorted(set(receivers) | set(senders)):
        args = [*enter_command(cluster), "ip", "netns", "exec", cluster.namespaces[rank],
                *helper]
        if rank in receivers:
            args += ["--listen", cluster.addresses[rank],
                     "--peers", str(sum(1 for _, d in pairs if d == rank))]  # fmt: skip
        if rank in senders:
            args += ["--send-to", cluster.addresses[senders[rank]]]
        procs[rank] = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, env=env)  # fmt: skip
    timeout = 30 + 20 * nbytes * 8 / cluster.rate_bps
    results, errors = {}, []
    try:
        for rank, proc in procs.items():
            out, err = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                tail = err.strip().splitlines() or ["no output"]
                errors.append(f"rank {rank}: {tail[-1]}")
                continue
            report = json.loads(out.strip().splitlines()[-1])
            if "bps" in report:
                results[rank] = report["bps"]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if errors:
        raise ClusterError("TCP self-check failed: " + "; ".join(errors))
    return results


def tcp_flow_main(argv: list[str]) -> int:
    """Helper run inside a namespace: receive from --peers senders and/or send --bytes."""
    p = argparse.ArgumentParser(prog="ccbench.scripts.cluster _tcp-flow")
    p.add_argument("--bytes", type=int, required=True)
    p.add_argument("--listen")
    p.add_argument("--peers", type=int, default=1)
    p.add_argument("--send-to")
    a = p.parse_args(argv)
    server = None
    if a.listen:
        server = socket.create_server((a.listen, SELFCHECK_PORT), backlog=a.peers)
        sinks = [threading.Thread(target=_sink, args=(server,)) for _ in range(a.peers)]
        for t in sinks:
            t.start()
    report = {}
    if a.send_to:
        report["bps"] = _source(a.send_to, a.bytes)
    if server is not None:
        for t in sinks:
            t.join()
        server.close()
    print(json.dumps(report), flush=True)
    return 0


def _sink(server: socket.socket) -> None:
    conn, _ = server.accept()
    with conn:
        buf = memoryview(bytearray(1 << 20))
        while conn.recv_into(buf):
            pass
        conn.sendall(b"k")  # everything arrived: the sender stops its clock


def _source(host: str, nbytes: int) -> float:
    deadline = time.monotonic() + 10
    while True:  # the sink may still be starting
        try:
            conn = socket.create_connection((host, SELFCHECK_PORT), timeout=10)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with conn:
        conn.settimeout(None)
        data = memoryview(bytes(min(nbytes, 16 << 20)))
        start = time.perf_counter()
        left = nbytes
        while left:
            n = min(left, len(data))
            conn.sendall(data[:n])
            left -= n
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)
        return nbytes * 8 / (time.perf_counter() - start)


def mpi_allgather_main(argv: list[str]) -> int:
    """Helper run as an MPI job in the cluster: plain MPI_Allgather, best and mean time."""
    import numpy as np
    from mpi4py import MPI

    p = argparse.ArgumentParser(prog="ccbench.scripts.cluster _mpi-allgather")
    p.add_argument("--bytes", type=int, required=True)
    p.add_argument("--iterations", type=int, default=5)
    a = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    send = np.ones(a.bytes, np.uint8)
    recv = np.empty(a.bytes * comm.size, np.uint8)
    times = []
    comm.Allgather(send, recv)  # sets up the connections: not timed
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(a.iterations):
        comm.Barrier()
        t0 = MPI.Wtime()
        comm.Allgather(send, recv)
        times.append(MPI.Wtime() - t0)
    # CPU seconds per wall second of this rank: 1.0 = it busy-polled the whole time
    busy = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    mine = np.array([*times, busy])
    slowest = np.empty_like(mine)
    comm.Reduce(mine, slowest, op=MPI.MAX, root=0)
    if comm.rank == 0:
        print(json.dumps({"ranks": comm.size, "bytes": a.bytes, "mean_s": float(
            slowest[:-1].mean()), "min_s": float(slowest[:-1].min()),
            "cpu_busy": float(slowest[-1])}), flush=True)  # fmt: skip
    return 0


def cmd_selfcheck(opts) -> int:
    require_tools_and_privileges()
    cluster = require_cluster(opts.name)
    if cluster.ranks < 2:
        raise UsageError("the self-check needs a cluster of at least 2 ranks")
    nbytes = parse_bytes(opts.bytes)
    rate = cluster.rate_bps
    ceiling = cluster.tcp_goodput_bps()
    cores = len(os.sched_getaffinity(0))
    print(f"cluster {cluster.name}: {describe(cluster)}")
    print(f"configured rate {rate / 1e9:.3f} Gbit/s; TCP payload ceiling at MTU {cluster.mtu}: "
          f"{ceiling / 1e9:.3f} Gbit/s (Ethernet+IP+TCP headers)")
    ok = True

    def judge(bps: float) -> str:
        nonlocal ok
        good = 0.9 * ceiling <= bps <= 1.02 * ceiling
        ok &= good
        return f"{bps / 1e9:.3f} Gbit/s = {bps / rate:.1%} of rate  {'ok' if good else 'OFF'}"

    one = tcp_flows(cluster, [(0, 1)], nbytes)
    print(f"tcp  rank 0 -> 1, {nbytes} B:            {judge(one[0])}")
    ring = [(i, (i + 1) % cluster.ranks) for i in range(cluster.ranks)]
    worst = min(tcp_flows(cluster, ring, nbytes).values())
    print(f"tcp  ring of {cluster.ranks} (all at once), slowest: {judge(worst)}")
    # the compressed variants' floor uses this rate from now on (CCBENCH_LINK_GOODPUT_GBPS)
    with state_lock():
        current = load_state(cluster.name)
        if current is not None and current.keeper_pid == cluster.keeper_pid:
            current.goodput_bps = float(worst)
            save_state(current)
    if opts.mpi:
        size = parse_bytes(opts.mpi_bytes)
        bound = (cluster.ranks - 1) * size * 8 / rate
        out = subprocess.run(
            mpiexec_command(cluster, [sys.executable, "-m", "ccbench.scripts.cluster",
                                      "_mpi-allgather", "--bytes", str(size)],
                            cluster.ranks, find_mpiexec()),
            capture_output=True, text=True, env=dict(os.environ), check=False,
            timeout=120 + 40 * bound,
        )  # fmt: skip
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if out.returncode != 0 or not lines:
            tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
            raise ClusterError(f"MPI self-check failed: {tail}")
        res = json.loads(lines[-1])
        ratio = res["mean_s"] / bound
        good = ratio <= 1.10
        ok &= good
        print(f"mpi  MPI_Allgather {cluster.ranks} ranks x {size} B: mean {res['mean_s']:.4f} s, "
              f"link bound (n-1) x size / rate {bound:.4f} s, ratio {ratio:.3f}  "
              f"{'ok' if good else 'OFF'}")
        share = min(1.0, cores / cluster.ranks)
        print(f"     rank CPU busy {res['cpu_busy']:.2f} s/s (about {share:.2f} = ranks polling "
              "on all cores; much less = the host is busy with other work)")
    print("self-check passed" if ok else "self-check: measured rates are off the configuration")
    return 0 if ok else 1


# ----------------------------------------------------------------------------- entry


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ccbench cluster",
        description="Emulated bandwidth-limited cluster on one host (needs root and iproute2).",
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    def add(action: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(action, help=help_text, description=help_text)
        p.add_argument("--name", default=DEFAULT_NAME, type=check_name,
                       help=f"cluster name, prefix of its namespaces and links "
                            f"(default {DEFAULT_NAME})")  # fmt: skip
        return p

    up = add("up", "create the namespaces, bridge, veth links and tc shaping")
    up.add_argument("--ranks", "-n", type=int, required=True, help="number of ranks (namespaces)")
    up.add_argument("--rate", help=f"link rate per direction (default {DEFAULT_RATE})")
    up.add_argument("--codec", metavar="SPEC",
                    help="with --codec-ratio: set the rate from this codec's throughput here")
    up.add_argument("--codec-ratio", type=float, metavar="R",
                    help="the codec's throughput per rank over the link rate (the paper's "
                         "regime: a GPU codec several times faster than the network)")
    up.add_argument("--userns", action="store_true",
                    help="build inside a user namespace even as root (what users without "
                         "root get; nothing is added to the host's /run/netns)")
    up.add_argument("--delay", default="0", help="extra one-way delay, e.g. 50us (needs netem)")
    up.add_argument("--mtu", type=int, default=9000, help="link MTU (default 9000, jumbo frames)")
    up.add_argument("--burst", help="token bucket size in bytes (default: 1 ms at the rate)")
    up.add_argument("--limit", help="queue limit in bytes (default: 20 ms at the rate, >= 1 MiB)")
    add("down", "remove everything `up` created")
    add("check", "say whether clusters can be built here (root, user namespaces) or why not")
    st = add("status", "show the cluster, its addresses and per-link byte and drop counters")
    st.add_argument("--json", action="store_true", help="print one JSON object")
    run = add("run", "run COMMAND as an MPI job, one rank per namespace, MPICH over TCP")
    run.add_argument("-n", "--np", type=int, help="ranks to start (default: all)")
    run.add_argument("--dry-run", action="store_true", help="print the mpiexec command only")
    run.add_argument("--no-bind", action="store_true",
                     help="leave ranks unbound (default: each bound to a core, -bind-to core)")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    sc = add("selfcheck", "measure TCP (and MPI) throughput against the configured rate")
    sc.add_argument("--bytes", default="64m", help="bytes per TCP stream (default 64m)")
    sc.add_argument("--mpi-bytes", default="16m", help="MPI allgather bytes per rank (default 16m)")
    sc.add_argument("--no-mpi", dest="mpi", action="store_false",
                    help="skip the MPI_Allgather check")  # fmt: skip
    return parser


COMMANDS = {"up": cmd_up, "down": cmd_down, "status": cmd_status, "run": cmd_run,
            "check": cmd_check,
            "selfcheck": cmd_selfcheck}  # fmt: skip
HELPERS = {"_tcp-flow": tcp_flow_main, "_mpi-allgather": mpi_allgather_main,
           "_keeper": keeper_main}


def main(argv: list[str]) -> int:
    if argv and argv[0] in HELPERS:
        return HELPERS[argv[0]](argv[1:])
    refuse_inside_mpi_launch("ccbench cluster")
    try:
        opts = build_parser().parse_args(argv)
        return COMMANDS[opts.action](opts)
    except (UsageError, ClusterError) as exc:
        print(f"ccbench cluster: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1
    except KeyboardInterrupt:
        print("ccbench cluster: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
