"""The cluster's network namespaces: whether they can be made here, the commands run
inside them, and the layout built in them.

One network namespace per rank (``<name>-<i>``), each with one veth (``<name>-eth``) whose
peer (``<name>-p<i>``) is a port of a bridge (``<name>-br``) that lives in a namespace of
its own (``<name>-sw``), so the host's namespace, its links and its firewall are never
touched. Every link is shaped in both directions with a token bucket (``tc tbf``): the
rank side shapes what the rank sends, the switch side what it receives, so each rank has
a full-duplex link of the configured rate. Addresses (a private /24 chosen from the
name) exist only inside those namespaces.

Commands run on the host, or, for a cluster in a user namespace, inside its keeper's
namespaces (``entered``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from ccbench.kernels.errors import UsageError
from ccbench.scripts.cluster.layout import ROOT, USERNS, Cluster, ClusterError

# CAP_NET_ADMIN for links and qdiscs, CAP_SYS_ADMIN for `ip netns add/exec` (mounts).
CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21


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
        probe = subprocess.run(
            ["unshare", "-Urnm", "mount", "-t", "tmpfs", "ccbench", tempfile.gettempdir()],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=30,
            check=False,
        )
        detail = (probe.stderr.strip().splitlines() or ["failed"])[-1]
        why = (
            ""
            if probe.returncode == 0
            else (f"unprivileged user namespaces are not allowed here (`unshare -Urnm`: {detail})")
        )
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
    return [
        "nsenter",
        "-t",
        str(cluster.keeper_pid),
        "-U",
        "-m",
        "-n",
        "--preserve-credentials",
        f"--wd={os.getcwd()}",
        "--",
    ]


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
    tbf = [
        "tbf",
        "rate",
        f"{cluster.rate_bps}bit",
        "burst",
        str(cluster.burst_bytes),
        "limit",
        str(cluster.limit_bytes),
    ]
    if delay_us <= 0:
        sh("tc", "-n", netns, "qdisc", "replace", "dev", dev, "root", *tbf)
        return
    # netem holds each packet for the delay, then hands it to the tbf child (tc-netem(8)).
    packets = max(1000, 2 * cluster.limit_bytes // (cluster.mtu + 14))
    proc = sh(
        "tc",
        "-n",
        netns,
        "qdisc",
        "replace",
        "dev",
        dev,
        "root",
        "handle",
        "1:",
        "netem",
        "delay",
        f"{delay_us}us",
        "limit",
        str(packets),
        check=False,
    )
    if proc.returncode != 0:
        if "unknown" in proc.stderr.lower():
            raise UsageError(
                "--delay needs the kernel's netem qdisc (CONFIG_NET_SCH_NETEM), "
                "which this kernel lacks; run without --delay"
            )
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
    proc = subprocess.run(
        [*_ENTER, "ip", "netns", "exec", netns, "tee", f"/proc/sys/{key}"],
        input=f"{value}\n",
        capture_output=True,
        text=True,
        check=False,
    )
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
        sh(
            "ip",
            "-n",
            sw,
            "link",
            "add",
            port,
            "mtu",
            mtu,
            "type",
            "veth",
            "peer",
            "name",
            cluster.rank_iface,
            "mtu",
            mtu,
            "netns",
            ns,
        )
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


def qdisc_stats(netns: str, dev: str) -> dict:
    proc = sh("tc", "-n", netns, "-s", "-j", "qdisc", "show", "dev", dev, check=False)
    try:
        qdiscs = json.loads(proc.stdout)
    except ValueError:
        return {}
    tbf = next((q for q in qdiscs if q.get("kind") == "tbf"), {})
    return {"bytes": tbf.get("bytes", 0), "drops": tbf.get("drops", 0)}
