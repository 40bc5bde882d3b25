"""A cluster's layout: its ranks' names, addresses and shaping, from the command line's
units to the state file that keeps what `up` built.

The state file is ``<state dir>/<name>.json`` (root: ``/run/ccbench``). The names and the
subnet follow from the cluster's name alone, so ``down`` finds what a lost state file
left behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ccbench.kernels.errors import UsageError

ROOT_STATE_DIR = Path("/run/ccbench")
ROOT, USERNS = "root", "userns"  # how a cluster was built: capabilities, or a user namespace
NAME_RE = re.compile(r"[a-z][a-z0-9]{0,7}")  # keeps "<name>-p<rank>" within 15 characters
MAX_RANKS = 250  # one /24
MAX_NODES = 250  # one address per node in the /24


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
    """What `up` built: names, addresses and shaping; saved as the state file. One
    namespace (an emulated node, one shaped link) per `ranks_per_node` consecutive ranks:
    the names, addresses and ports below are per node."""

    name: str
    ranks: int  # MPI ranks in all: nodes x ranks_per_node
    rate_bps: int
    delay_us: int
    mtu: int
    burst_bytes: int
    limit_bytes: int
    created: str = ""
    mode: str = ROOT
    keeper_pid: int = 0  # userns mode: the process holding the namespaces
    goodput_bps: float = 0.0  # TCP payload rate measured by `selfcheck` (0: not yet)
    step_us: float = 0.0  # fixed cost of a ring step measured by `selfcheck` (0: not yet)
    regime: dict | None = None  # --codec / --codec-ratio: how the rate was chosen
    ranks_per_node: int = 1  # ranks sharing one namespace (MPI between them: shared memory)
    intra_bps: float = 0.0  # TCP rate between two ranks of a node, measured by `selfcheck`
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
        self.namespaces = [f"{self.name}-{i}" for i in range(self.nodes)]
        self.addresses = [f"{prefix}.{i + 1}" for i in range(self.nodes)]
        self.ports = [f"{self.name}-p{i}" for i in range(self.nodes)]
        self.switch_namespace = f"{self.name}-sw"
        self.bridge = f"{self.name}-br"
        self.rank_iface = f"{self.name}-eth"

    @property
    def nodes(self) -> int:
        return self.ranks // self.ranks_per_node

    def node_of(self, rank: int) -> int:
        """The node (namespace index) of MPI rank `rank`: consecutive ranks share a node,
        as SLURM's default block distribution places them."""
        return rank // self.ranks_per_node

    @property
    def link_gbps(self) -> float:
        return self.rate_bps / 1e9

    def shaping(self) -> tuple:
        # a rate matched to a codec is measured anew each time: the regime names it
        rate = (
            (self.regime["codec"], self.regime["codec_link_ratio"])
            if self.regime
            else self.rate_bps
        )
        return (
            self.mode,
            self.ranks,
            self.ranks_per_node,
            rate,
            self.delay_us,
            self.mtu,
            None if self.regime else self.burst_bytes,
            None if self.regime else self.limit_bytes,
        )

    def tcp_goodput_bps(self) -> float:
        """Rate left for TCP payload: tbf counts Ethernet (14 B) + IPv4 (20) + TCP (32) headers."""
        return self.rate_bps * (self.mtu - 52) / (self.mtu + 14)


def describe(c: Cluster) -> str:
    """The cluster in one line, as `up`, `status` and `selfcheck` print it."""
    delay = f", +{c.delay_us} us one-way" if c.delay_us else ""
    regime = (
        f" (codec {c.regime['codec']} {c.regime['codec_link_ratio']:g}x the link)"
        if c.regime
        else ""
    )
    where = f"; in a user namespace (keeper pid {c.keeper_pid})" if c.mode == USERNS else ""
    nodes = (
        f" as {c.nodes} nodes x {c.ranks_per_node} ranks (a node's ranks share its "
        "namespace and talk through shared memory, unshaped)"
        if c.ranks_per_node > 1
        else ""
    )
    return (
        f"{c.ranks} ranks{nodes}, {format_rate(c.rate_bps)} full-duplex links{regime}{delay}, "
        f"MTU {c.mtu}, subnet {c.subnet}, namespaces {c.namespaces[0]}.."
        f"{c.namespaces[-1]}{where}"
    )


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
    fields = {
        k: data[k]
        for k in (
            "name",
            "ranks",
            "rate_bps",
            "delay_us",
            "mtu",
            "burst_bytes",
            "limit_bytes",
            "created",
        )
    }
    optional = (
        "mode",
        "keeper_pid",
        "goodput_bps",
        "step_us",
        "regime",
        "ranks_per_node",
        "intra_bps",
    )
    fields.update({k: data[k] for k in optional if k in data})
    return Cluster(**fields)


def save_state(cluster: Cluster) -> None:
    state_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
    path = state_path(cluster.name)
    tmp = path.with_suffix(".json.tmp")
    state = {**asdict(cluster), "link_gbps": cluster.link_gbps, "nodes": cluster.nodes}
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, path)


@contextlib.contextmanager
def state_lock():
    """Serialise `up` and `down` (two shells at once); one lock file for all names, as
    both take well under a second."""
    state_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(state_dir() / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield
