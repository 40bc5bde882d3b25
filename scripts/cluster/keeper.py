"""The keeper of a cluster built without root, where unprivileged user namespaces are
allowed.

``up`` starts a keeper process in a user, network and mount namespace of its own
(``unshare -Urnm``) with a private tmpfs on ``/run/netns``; it builds the same layout
there and sleeps until ``down``. The other actions enter its namespaces with ``nsenter``
(``--preserve-credentials``): the ranks are as isolated, and nothing on the host is
touched. The namespaces live as long as the keeper: stopping it removes them.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

from ccbench.scripts.cluster.layout import Cluster, ClusterError, state_path
from ccbench.scripts.cluster.netns import build, sh


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
    layout = json.dumps(
        {
            k: v
            for k, v in asdict(cluster).items()
            if k
            in (
                "name",
                "ranks",
                "rate_bps",
                "delay_us",
                "mtu",
                "burst_bytes",
                "limit_bytes",
                "ranks_per_node",
            )
        }
    )
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [
                "unshare",
                "-Urnm",
                "--propagation",
                "private",
                sys.executable,
                "-m",
                "ccbench.scripts.cluster",
                "_keeper",
                layout,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
            text=True,
        )
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline().strip() if ready else ""
    proc.stdout.close()
    if line != "ready":
        stop_keeper(proc.pid)
        tail = log.read_text().strip().splitlines() if log.exists() else []
        raise ClusterError(
            "building the cluster in a user namespace failed: "
            f"{tail[-1] if tail else 'no answer within ' + str(timeout) + ' s'}"
        )
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
