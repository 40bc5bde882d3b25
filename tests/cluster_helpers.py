"""What the emulated-cluster tests share: their names, the can-it-run checks, `ccbench
cluster` in a subprocess, and reading the shapers' counters."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ccbench.scripts.cluster import layout as cluster_layout
from ccbench.scripts.cluster import netns as cluster_netns
from tests.mpirun import hydra_skip

REPO = Path(__file__).resolve().parent.parent
NAME = "ccbt"
RANKS = 3
RATE = "200mbit"
RATE_BPS = 200_000_000


def can_build() -> str | None:
    """Why the namespace tests cannot run here, or None."""
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        return f"needs iproute2 ({', '.join(missing)} missing)"
    if not cluster_netns.has_privileges():
        return "needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) for network namespaces"
    return None


def needs_namespaces(test):
    """Root-only test with a deadline: a hung mpiexec fails instead of blocking CI."""
    test = pytest.mark.timeout(150)(test)
    return pytest.mark.skipif(can_build() is not None, reason=str(can_build()))(test)


def needs_hydra(test):
    return pytest.mark.skipif(hydra_skip() is not None, reason=str(hydra_skip()))(test)


def ccb(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`ccbench cluster ARGS` in a subprocess, from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "ccbench.scripts.cluster", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
        stdin=subprocess.DEVNULL,
    )


def tbf(netns: str, dev: str) -> dict:
    out = subprocess.run(
        ["tc", "-n", netns, "-s", "-j", "qdisc", "show", "dev", dev],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return next(q for q in json.loads(out) if q["kind"] == "tbf")


def sent_received(c: cluster_layout.Cluster) -> list[tuple[int, int]]:
    """Bytes through each rank's shaper: (sent by the rank, received by the rank)."""
    return [
        (tbf(ns, c.rank_iface)["bytes"], tbf(c.switch_namespace, port)["bytes"])
        for ns, port in zip(c.namespaces, c.ports, strict=True)
    ]


def down_and_check_gone(name: str) -> None:
    proc = ccb("down", "--name", name)
    assert proc.returncode == 0, proc.stderr
    assert cluster_netns.leftover_namespaces(name) == []
    assert not cluster_layout.state_path(name).exists()


def check_selfcheck_verdicts(proc) -> None:
    """Each printed verdict follows the documented rule applied to the printed numbers
    (TCP: 90-102% of the payload ceiling; MPI: mean at most 1.10 x the link bound), and
    the exit status is 0 exactly when every verdict is ok."""
    ceiling = float(
        re.search(r"TCP payload ceiling at MTU \d+: ([0-9.]+) Gbit/s", proc.stdout).group(1)
    )
    verdicts = []
    for gbps, verdict in re.findall(
        r"^tcp .*:\s+([0-9.]+) Gbit/s = .* (ok|OFF)$", proc.stdout, re.MULTILINE
    ):
        low, high = 0.9 * ceiling, 1.02 * ceiling
        if min(abs(float(gbps) - low), abs(float(gbps) - high)) > 0.0015:  # not rounded away
            assert (verdict == "ok") == (low <= float(gbps) <= high), (gbps, verdict)
        verdicts.append(verdict)
    for ratio, verdict in re.findall(
        r"^mpi .* ratio ([0-9.]+)  (ok|OFF)$", proc.stdout, re.MULTILINE
    ):
        if abs(float(ratio) - 1.10) > 0.0015:
            assert (verdict == "ok") == (float(ratio) <= 1.10), (ratio, verdict)
        verdicts.append(verdict)
    assert verdicts, proc.stdout
    assert proc.returncode == (0 if set(verdicts) == {"ok"} else 1), proc.stdout + proc.stderr
