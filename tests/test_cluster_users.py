"""The emulated cluster without root: a user namespace held by a keeper process, and a user
who builds, uses and removes a cluster (tests/test_cluster.py has the root-built one)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ccbench.scripts.cluster import command as cl
from ccbench.scripts.cluster import keeper as cluster_keeper
from ccbench.scripts.cluster import layout as cluster_layout
from ccbench.scripts.cluster import netns as cluster_netns
from tests.cluster_helpers import (
    REPO,
    can_build,
    ccb,
    check_selfcheck_verdicts,
    needs_hydra,
    needs_namespaces,
)
from tests.mpirun import variant_module

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too


# ----------------------------------------------------------------------------- user namespace
# What a user without root gets: the same layout inside a user namespace held by a keeper
# process, entered with nsenter. Built here with `up --userns` (root could build on the
# host; the code path is the unprivileged one, the rate matched to a codec).

USERNS_NAME = "ccbw"
USERNS_RATIO = 40.0


@pytest.fixture(scope="module")
def userns_cluster():
    if can_build() is not None:
        pytest.skip(can_build())
    why = cluster_netns.userns_unavailable()
    if why:
        pytest.skip(why)
    ccb("down", "--name", USERNS_NAME)
    proc = ccb(
        "up",
        "--name",
        USERNS_NAME,
        "--ranks",
        "2",
        "--userns",
        "--codec",
        "bfp:rate=8",
        "--codec-ratio",
        str(USERNS_RATIO),
        timeout=120,
    )
    try:
        assert proc.returncode == 0, proc.stderr
        yield cluster_layout.load_state(USERNS_NAME), proc.stdout
    finally:
        proc = ccb("down", "--name", USERNS_NAME)
        assert proc.returncode == 0, proc.stderr
        assert not cluster_layout.state_path(USERNS_NAME).exists()


@needs_namespaces
def test_userns_cluster_leaves_the_host_alone(userns_cluster):
    c, printed = userns_cluster
    assert c.mode == cluster_layout.USERNS and cluster_keeper.keeper_alive(c) and cl.intact(c)
    assert not [ns for ns in cluster_netns.list_namespaces() if ns.startswith(f"{USERNS_NAME}-")]
    # the rate: the measured round trip, shared by 2 ranks on this host's cores, over 40
    r = c.regime
    share = min(1.0, len(os.sched_getaffinity(0)) / 2)
    bps = r["round_trip_gbytes_per_s"] * 1e9 * share * 8 / USERNS_RATIO
    assert c.rate_bps == pytest.approx(bps, rel=5e-3)
    assert f"/ {USERNS_RATIO:g} -> links of {cluster_layout.format_rate(c.rate_bps)}" in printed
    # the same regime again is the same cluster, though its measurement moved
    proc = ccb(
        "up",
        "--name",
        USERNS_NAME,
        "--ranks",
        "2",
        "--userns",
        "--codec",
        "bfp:rate=8",
        "--codec-ratio",
        str(USERNS_RATIO),
        timeout=120,
    )
    assert proc.returncode == 0 and "already up" in proc.stdout, proc.stdout + proc.stderr


@needs_namespaces
@needs_hydra
def test_userns_ranks_run_over_the_shaped_links(userns_cluster, tmp_path):
    c, _ = userns_cluster
    before = json.loads(ccb("status", "--name", USERNS_NAME, "--json").stdout)
    out = tmp_path / "b.csv"
    proc = ccb(
        "run",
        "--name",
        USERNS_NAME,
        "--",
        "python",
        *variant_module("baseline"),
        "--collective",
        "allgather",
        "-m",
        "1M:1M",
        "-i",
        "3",
        "-x",
        "1",
        "-c",
        "--csv",
        str(out),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    import pandas as pd

    rows = pd.read_csv(out)
    assert (rows["validation"] == "Pass").all()
    assert rows["link_gbps"].iloc[0] == pytest.approx(c.rate_bps / 1e9)
    after = json.loads(ccb("status", "--name", USERNS_NAME, "--json").stdout)
    for old, new in zip(before["ranks_detail"], after["ranks_detail"], strict=True):
        # 5 allgathers of 1 MiB (warm-up, 3 timed, 1 checked) left each rank's shaper
        assert new["sent"]["bytes"] - old["sent"]["bytes"] >= 5 * (1 << 20)
    proc = ccb("selfcheck", "--name", USERNS_NAME, "--no-mpi", "--bytes", "4m", timeout=120)
    check_selfcheck_verdicts(proc)
    assert "tcp  rank 0 -> 1" in proc.stdout
    assert cluster_layout.load_state(USERNS_NAME).goodput_bps > 0  # the floor's rate from now on


@needs_namespaces
def test_userns_down_stops_the_keeper():
    name = "ccbx"
    if cluster_netns.userns_unavailable():
        pytest.skip(cluster_netns.userns_unavailable())
    proc = ccb("up", "--name", name, "--ranks", "1", "--rate", "10mbit", "--userns")
    assert proc.returncode == 0, proc.stderr
    c = cluster_layout.load_state(name)
    assert cluster_keeper.keeper_alive(c)
    proc = ccb("down", "--name", name)
    assert proc.returncode == 0 and "is down" in proc.stdout, proc.stdout
    assert not Path(f"/proc/{c.keeper_pid}").exists() or cluster_keeper._zombie(c.keeper_pid)
    assert not cluster_layout.state_path(name).exists()
    assert not cluster_layout.state_path(name).with_suffix(".log").exists()


# ----------------------------------------------------------------------------- unprivileged


@pytest.mark.timeout(300)
@needs_hydra
def test_an_unprivileged_user_builds_uses_and_removes_a_cluster():
    """The user-namespace path as a user without root (nobody, no capabilities): `check`
    chooses it, `up` builds 2 shaped ranks inside one user namespace, a baseline run inside
    validates and records the link, `down` leaves nothing behind on the host."""
    import tempfile

    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv to become an unprivileged user")
    home = Path(tempfile.mkdtemp(prefix="ccbench-nobody-"))
    os.chmod(home, 0o755)
    os.chown(home, 65534, 65534)
    env = {
        **os.environ,
        "HOME": str(home),
        "TMPDIR": str(home),
        "XDG_CACHE_HOME": str(home / "cache"),
        "CCBENCH_STATE": str(home / "state"),
        "CCBENCH_CORPUS": str(home / "no-corpus"),
    }
    env.pop("XDG_RUNTIME_DIR", None)

    def as_nobody(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                setpriv,
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                sys.executable,
                "-m",
                "ccbench.scripts.cluster",
                *args,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            stdin=subprocess.DEVNULL,
        )

    check = as_nobody("check")
    if check.returncode != 0:
        pytest.skip(f"no unprivileged clusters here: {check.stdout.strip()}")
    opened = search_path_for_others(Path(os.path.realpath(sys.executable)))
    try:
        run_as_nobody(as_nobody, home, check)
    finally:
        for path, mode in opened:
            os.chmod(path, mode)
        shutil.rmtree(home, ignore_errors=True)


def search_path_for_others(target: Path) -> list[tuple[Path, int]]:
    """Let other users search the folders above `target` (this interpreter) for the test's
    length; returns (folder, old mode) to restore. A user's own Python lies in folders it
    can search; CI's may lie under root's home, which a user namespace cannot enter."""
    changed = []
    for folder in target.parents:
        mode = folder.stat().st_mode
        if not mode & 0o001:
            changed.append((folder, mode & 0o7777))
            os.chmod(folder, (mode | 0o001) & 0o7777)
    return changed


def run_as_nobody(as_nobody, home: Path, check) -> None:
    assert check.stdout.startswith("unprivileged: namespaces inside a user namespace")
    name, out = "ccbn", home / "out.csv"
    up = as_nobody("up", "--name", name, "--ranks", "2", "--rate", "200mbit")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        status = json.loads(as_nobody("status", "--name", name, "--json").stdout)
        assert status["mode"] == cluster_layout.USERNS and status["ranks"] == 2
        run = as_nobody(
            "run",
            "--name",
            name,
            "--",
            sys.executable,
            *variant_module("baseline"),
            "--collective",
            "allgather",
            "-m",
            "256K:256K",
            "-i",
            "3",
            "-x",
            "1",
            "-c",
            "--csv",
            str(out),
            timeout=180,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        import pandas as pd

        rows = pd.read_csv(out)
        assert (rows["validation"] == "Pass").all() and (rows["ranks"] == 2).all()
        assert rows["link_gbps"].iloc[0] == pytest.approx(0.2)
        assert rows["data"].iloc[0] == "gradient-like"  # no corpus needed for the baseline
    finally:
        down = as_nobody("down", "--name", name)
    assert down.returncode == 0 and "is down" in down.stdout, down.stdout + down.stderr
    # nothing was ever on the host: no namespaces, no links of this name
    assert not [ns for ns in cluster_netns.list_namespaces() if ns.startswith(f"{name}-")]
    host_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"{name}-" not in host_links
