"""The emulated cluster: namespaces up and down, traffic through tc, MPI ranks inside.

The multi-rank tests need root and iproute2 and skip with a reason otherwise. They use
their own cluster names (ccbt, ccbu, ccbv) so they never touch a cluster someone else
has up, and every fixture tears its cluster down.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ccbench.kernels.errors import UsageError
from ccbench.scripts import cluster as cl
from ccbench.scripts import (
    cluster_keeper,
    cluster_layout,
    cluster_netns,
    cluster_regime,
    cluster_run,
    cluster_selfcheck,
)
from tests.mpirun import hydra_skip, variant_module

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too

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
    return subprocess.run([sys.executable, "-m", "ccbench.scripts.cluster", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ), stdin=subprocess.DEVNULL)  # fmt: skip


def tbf(netns: str, dev: str) -> dict:
    out = subprocess.run(["tc", "-n", netns, "-s", "-j", "qdisc", "show", "dev", dev],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return next(q for q in json.loads(out) if q["kind"] == "tbf")


def sent_received(c: cluster_layout.Cluster) -> list[tuple[int, int]]:
    """Bytes through each rank's shaper: (sent by the rank, received by the rank)."""
    return [(tbf(ns, c.rank_iface)["bytes"], tbf(c.switch_namespace, port)["bytes"])
            for ns, port in zip(c.namespaces, c.ports, strict=True)]  # fmt: skip


def down_and_check_gone(name: str) -> None:
    proc = ccb("down", "--name", name)
    assert proc.returncode == 0, proc.stderr
    assert cluster_netns.leftover_namespaces(name) == []
    assert not cluster_layout.state_path(name).exists()


@pytest.fixture(scope="module")
def cluster():
    if can_build() is not None:
        pytest.skip(can_build())
    ccb("down", "--name", NAME)  # leftovers of an interrupted earlier run
    proc = ccb("up", "--name", NAME, "--ranks", str(RANKS), "--rate", RATE)
    try:
        assert proc.returncode == 0, proc.stderr
        yield cluster_layout.load_state(NAME)
    finally:
        down_and_check_gone(NAME)


# ----------------------------------------------------------------------------- no root


@pytest.mark.parametrize("text, bps", [("1gbit", 10**9), ("100mbit", 10**8),
                                       ("2.5gbit", 25 * 10**8), ("500Mbit", 5 * 10**8)])
def test_parse_rate(text, bps):
    assert cluster_layout.parse_rate(text) == bps


@pytest.mark.parametrize("text", ["1gbps", "fast", "10kbit", "1 g bit", ""])
def test_parse_rate_rejects(text):
    with pytest.raises(UsageError):
        cluster_layout.parse_rate(text)


@pytest.mark.parametrize("text, us", [("0", 0), ("50us", 50), ("1.5ms", 1500), ("1s", 10**6)])
def test_parse_delay(text, us):
    assert cluster_layout.parse_delay(text) == us


@pytest.mark.parametrize("name", ["CCB", "1ab", "toolongnm", "a-b", ""])
def test_bad_names_rejected(name):
    with pytest.raises(UsageError):
        cluster_layout.check_name(name)


def test_interface_names_fit_and_subnets_differ():
    c = cluster_layout.Cluster("abcdefgh", cluster_layout.MAX_RANKS, 10**9, 0, 1500, 125000,
                               1 << 20)
    assert max(len(n) for n in [*c.ports, c.bridge, c.rank_iface]) <= 15
    assert len(set(c.addresses)) == cluster_layout.MAX_RANKS
    subnets = {cluster_layout.Cluster(n, 2, 10**9, 0, 1500, 1, 1).subnet
               for n in ("ccb", "ccbt", "ccbu", "ccbv", "ccbsweep")}
    assert len(subnets) == 5
    assert all(s.startswith("10.") and s.endswith(".0/24") for s in subnets)


def test_mpiexec_command_puts_each_rank_in_its_namespace():
    c = cluster_layout.Cluster("ccb", 4, 10**9, 0, 1500, 125000, 1 << 20)
    args = cluster_run.mpiexec_command(c, ["python", "-m", "x"], 3, "/bin/mpiexec")
    segments = " ".join(args).split(" : ")
    assert len(segments) == 3
    for i, seg in enumerate(segments):
        assert f"-n 1 ip netns exec ccb-{i} {sys.executable} -m x" in seg
    pairs = {args[k + 1]: args[k + 2] for k, a in enumerate(args) if a == "-genv"}
    pairs.pop("OMP_NUM_THREADS", None)  # set only when the caller has not
    # the floor's payload rate before any selfcheck: the TCP ceiling, 1448 of 1514 bytes
    ceiling = f"{(1500 - 52) / (1500 + 14):.6g}"
    # a transfer's lower bound: that ceiling, and the token bucket's burst as built
    assert pairs == {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ofi",
                     "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "ccb-eth", "CCBENCH_LINK_GBPS": "1",
                     "CCBENCH_LINK_GOODPUT_GBPS": ceiling,
                     "CCBENCH_LINK_CEILING_GBPS": ceiling, "CCBENCH_LINK_BURST_BYTES": "125000"}
    c.goodput_bps = 0.9e9  # measured by selfcheck: that one
    args = cluster_run.mpiexec_command(c, ["python", "-m", "x"], 3, "/bin/mpiexec")
    assert args[args.index("CCBENCH_LINK_GOODPUT_GBPS") + 1] == "0.9"


def test_userns_commands_enter_the_keeper():
    c = cluster_layout.Cluster("ccb", 2, 10**9, 0, 1500, 125000, 1 << 20,
                               mode=cluster_layout.USERNS, keeper_pid=4242)
    enter = ["nsenter", "-t", "4242", "-U", "-m", "-n", "--preserve-credentials",
             f"--wd={os.getcwd()}", "--"]
    assert cluster_run.mpiexec_command(c, ["x"], 2, "/bin/mpiexec")[:len(enter) + 1] == [
        *enter, "/bin/mpiexec"]
    assert cluster_netns.enter_command(cluster_layout.Cluster("ccb", 2, 10**9, 0, 1500, 1, 1)) == []


def test_state_dir_of_other_users(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert cluster_layout.state_path("ccb") == tmp_path / "ccbench" / "ccb.json"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert cluster_layout.state_dir().name == f"ccbench-{os.getuid()}"


def test_regime_rate_by_hand():
    # round trip 2 GB/s on a core; 4 ranks on 2 cores get half each: 1 GB/s = 8 Gbit/s;
    # a codec 8 times faster than the link: 1 Gbit/s
    two = {"encode_bps": 4e9, "decode_bps": 4e9, "round_trip_bps": 2e9}
    regime_rate = cluster_regime.regime_rate
    r = regime_rate("fp16", 8, ranks=4, cores=2, measured=two)
    assert r["share"] == 0.5 and r["rate_bps"] == 10**9
    assert r["per_rank_gbytes_per_s"] == pytest.approx(1.0)
    # 2.8389 GB/s / 2 x 8 / 9 = 1.26173 Gbit/s, kept to 3 significant digits
    odd = {**two, "round_trip_bps": 2.8389e9}
    assert regime_rate("bfp:rate=8", 9, ranks=4, cores=2, measured=odd)["rate_bps"] == (
        1_260_000_000)
    # fewer ranks than cores: each has a whole core, no more
    assert regime_rate("fp16", 8, ranks=1, cores=2, measured=two)["rate_bps"] == 2 * 10**9


def test_codec_throughput_is_measured():
    m = cluster_regime.codec_rates("fp16", nbytes=1 << 20, repeats=2)
    assert m["encode_bps"] > 0 and m["decode_bps"] > 0
    # one encode and one decode of the same bytes: the rates add harmonically
    assert m["round_trip_bps"] == pytest.approx(1 / (1 / m["encode_bps"] + 1 / m["decode_bps"]))


def test_up_refuses_rate_and_codec_together(capsys):
    if can_build() is not None:
        pytest.skip(can_build())
    assert cl.main(["up", "--name", "ccbv", "--ranks", "2", "--rate", "1gbit", "--codec",
                    "fp16", "--codec-ratio", "4"]) == 2
    assert "not both" in capsys.readouterr().err
    assert cl.main(["up", "--name", "ccbv", "--ranks", "2", "--codec", "fp16"]) == 2
    assert "go together" in capsys.readouterr().err


def test_default_bucket_and_queue():
    assert cluster_layout.default_burst(10**9, 1500) == 125_000  # 1 ms at 1 Gbit/s
    assert cluster_layout.default_burst(10**6, 1500) == 4 * 1514  # never below a few frames
    assert cluster_layout.default_limit(10**9, 125_000) == 2_500_000  # 20 ms at 1 Gbit/s


def unprivileged(*args: str) -> subprocess.CompletedProcess:
    """`ccbench cluster ARGS` as nobody, without capabilities."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv to drop privileges")
    return subprocess.run(
        [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
         "--bounding-set=-all", sys.executable, "-m", "ccbench.scripts.cluster", *args],
        cwd=REPO, capture_output=True, text=True, timeout=60, env=dict(os.environ),
    )  # fmt: skip


def test_without_privileges_one_line():
    """Without root: `check` says in one line how clusters would be built (a user
    namespace) or why they cannot be; then `up` fails in one line with status 2."""
    proc = unprivileged("check")
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and not proc.stderr, proc
    if proc.returncode == 0:
        assert lines[0].startswith("unprivileged: namespaces inside a user namespace")
        return
    assert proc.returncode == 1
    assert "needs root" in lines[0] or "iproute2" in lines[0]
    proc = unprivileged("up", "--name", "ccbv", "--ranks", "2")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "needs root" in proc.stderr or "iproute2" in proc.stderr


def test_check_as_root():
    if can_build() is not None:
        pytest.skip(can_build())
    proc = ccb("check")
    assert proc.returncode == 0 and proc.stdout.strip() == "root: namespaces on the host"


# ----------------------------------------------------------------------------- root


@needs_namespaces
def test_layout(cluster):
    assert cluster.ranks == RANKS
    assert {*cluster.namespaces, cluster.switch_namespace} <= cluster_netns.list_namespaces()
    host_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"{NAME}-" not in host_links  # nothing in the host's namespace
    for ns, port in zip(cluster.namespaces, cluster.ports, strict=True):
        for netns, dev in ((ns, cluster.rank_iface), (cluster.switch_namespace, port)):
            assert tbf(netns, dev)["options"]["rate"] == RATE_BPS // 8  # bytes/s in tc
    status = json.loads(ccb("status", "--name", NAME, "--json").stdout)
    assert status["up"] and status["link_gbps"] == 0.2
    assert [r["address"] for r in status["ranks_detail"]] == cluster.addresses


@needs_namespaces
def test_up_again_is_a_no_op(cluster):
    proc = ccb("up", "--name", NAME, "--ranks", str(RANKS), "--rate", RATE)
    assert proc.returncode == 0 and "already up" in proc.stdout
    assert cluster_layout.load_state(NAME).created == cluster.created


@needs_namespaces
def test_traffic_flows_and_is_shaped(cluster):
    before = sent_received(cluster)
    nbytes = 2 << 20
    bps = cluster_selfcheck.tcp_flows(cluster, [(0, 1)], nbytes)[0]
    after = sent_received(cluster)
    assert after[0][0] - before[0][0] >= nbytes  # left rank 0 through its shaper
    assert after[1][1] - before[1][1] >= nbytes  # reached rank 1 through the switch's
    # A token bucket never lets more through than rate x time + one bucket; unshaped
    # veths move several Gbit/s. (Only an upper bound: a busy host is merely slower.)
    assert 0 < bps <= RATE_BPS * (1 + cluster.burst_bytes / nbytes) * 1.01


@needs_namespaces
@needs_hydra
def test_mpi_ranks_run_in_their_namespaces_over_tcp(cluster):
    code = (
        "import json, os, numpy as np; from mpi4py import MPI; c = MPI.COMM_WORLD;"
        "s = np.full(1 << 18, c.rank, np.float32); r = np.empty(c.size * s.size, np.float32);"
        "c.Allgather(s, r); ok = bool((r.reshape(c.size, -1) == np.arange(c.size)[:, None]).all());"
        "print(json.dumps({'rank': c.rank, 'netns': os.readlink('/proc/self/ns/net'), 'ok': ok,"
        "'link': os.environ.get('CCBENCH_LINK_GBPS'), 'iface': os.environ.get('FI_TCP_IFACE')}))"
    )
    before = sent_received(cluster)
    proc = ccb("run", "--name", NAME, "--", "python", "-c", code, timeout=120)
    assert proc.returncode == 0, proc.stderr
    after = sent_received(cluster)
    # Hydra may merge the ranks' lines: take every JSON object wherever it sits.
    ranks = [json.loads(m) for m in re.findall(r"\{[^{}]*\}", proc.stdout)]
    assert sorted(r["rank"] for r in ranks) == list(range(RANKS))
    assert all(r["ok"] and r["link"] == "0.2" and r["iface"] == cluster.rank_iface
               for r in ranks)  # fmt: skip
    own = os.readlink("/proc/self/ns/net")
    assert len({r["netns"] for r in ranks} | {own}) == RANKS + 1
    # Every rank's 1 MiB block reached the other ranks through the shapers (no shared memory).
    block = 1 << 20
    sent = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    assert sent >= RANKS * (RANKS - 1) * block


@needs_namespaces
@needs_hydra
def test_torch_distributed_joins_every_namespace(cluster):
    # stock FSDP / DDP need gloo's default group; inside a namespace the host name is that
    # namespace's loopback, so every rank (not only the store's) must bind the link
    pytest.importorskip("torch")
    code = (
        "import json, torch, torch.distributed as dist; from mpi4py import MPI;"
        "from ccbench.collectives.comm import Communicator;"
        "from ccbench.training.rendezvous import init_torch_distributed;"
        "c = Communicator(MPI.COMM_WORLD); init_torch_distributed(c);"
        "t = torch.full((1 << 16,), float(c.rank + 1)); dist.all_reduce(t);"
        "print(json.dumps({'rank': c.rank, 'sum': float(t[0]), 'same': bool((t == t[0]).all()),"
        "'gloo': __import__('os').environ.get('GLOO_SOCKET_IFNAME')}))"
    )
    proc = ccb("run", "--name", NAME, "--", "python", "-c", code, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ranks = [json.loads(m) for m in re.findall(r"\{[^{}]*\}", proc.stdout)]
    assert sorted(r["rank"] for r in ranks) == list(range(RANKS))
    # 1 + 2 + ... + RANKS on every rank, over the cluster's interface
    assert all(r["sum"] == RANKS * (RANKS + 1) / 2 and r["same"] for r in ranks), ranks
    assert all(r["gloo"] == cluster.rank_iface for r in ranks), ranks


@needs_namespaces
@needs_hydra
def test_run_subset_and_errors(cluster):
    proc = ccb("run", "--name", NAME, "-n", "2", "--", "python", "-c",
               "from mpi4py import MPI; print(f'size {MPI.COMM_WORLD.size}')")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("size 2") == 2
    bad = ccb("run", "--name", NAME, "-n", str(RANKS + 1), "--", "true")
    assert bad.returncode == 2 and "has 3 ranks" in bad.stderr
    none = ccb("run", "--name", "ccbnone", "--", "true")
    assert none.returncode == 2 and "not up" in none.stderr
    status = ccb("status", "--name", "ccbnone")
    assert status.returncode == 1 and "not up" in status.stdout


@needs_namespaces
@needs_hydra
def test_compressed_allgather_validates_inside(cluster, tmp_path):
    csv = tmp_path / "cc.csv"
    proc = ccb("run", "--name", NAME, "--", "python", *variant_module("coll_compressed"),
               "--collective", "allgather", "--codec", "fp16", "-m", "64K:256K",
               "-i", "3", "-x", "1", "-c", "--csv", str(csv), timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    import pandas as pd

    rows = pd.read_csv(csv)
    assert len(rows) == 3
    assert (rows["validation"] == "Pass").all()
    assert (rows["link_gbps"] == 0.2).all() and (rows["ranks"] == RANKS).all()
    # the floor holds for every point measured on it (plots/base.py draws it)
    from ccbench.plots.base import below_floor, floor_us

    assert rows["link_ceiling_gbps"].notna().all() and rows["link_burst_bytes"].notna().all()
    assert (floor_us(rows) > 0).any()
    assert below_floor(rows).empty, rows[["size_bytes", "avg_us", "wire_bytes_per_rank"]]


def check_selfcheck_verdicts(proc) -> None:
    """Each printed verdict follows the documented rule applied to the printed numbers
    (TCP: 90-102% of the payload ceiling; MPI: mean at most 1.10 x the link bound), and
    the exit status is 0 exactly when every verdict is ok."""
    ceiling = float(re.search(r"TCP payload ceiling at MTU \d+: ([0-9.]+) Gbit/s",
                              proc.stdout).group(1))
    verdicts = []
    for gbps, verdict in re.findall(r"^tcp .*:\s+([0-9.]+) Gbit/s = .* (ok|OFF)$", proc.stdout,
                                    re.MULTILINE):
        low, high = 0.9 * ceiling, 1.02 * ceiling
        if min(abs(float(gbps) - low), abs(float(gbps) - high)) > 0.0015:  # not rounded away
            assert (verdict == "ok") == (low <= float(gbps) <= high), (gbps, verdict)
        verdicts.append(verdict)
    for ratio, verdict in re.findall(r"^mpi .* ratio ([0-9.]+)  (ok|OFF)$", proc.stdout,
                                     re.MULTILINE):
        if abs(float(ratio) - 1.10) > 0.0015:
            assert (verdict == "ok") == (float(ratio) <= 1.10), (ratio, verdict)
        verdicts.append(verdict)
    assert verdicts, proc.stdout
    assert proc.returncode == (0 if set(verdicts) == {"ok"} else 1), proc.stdout + proc.stderr


@needs_namespaces
@needs_hydra
def test_selfcheck_reports_against_the_rate(cluster):
    proc = ccb("selfcheck", "--name", NAME, "--bytes", "1m", "--mpi-bytes", "256k", timeout=120)
    check_selfcheck_verdicts(proc)
    assert "configured rate 0.200 Gbit/s" in proc.stdout
    assert "tcp  rank 0 -> 1" in proc.stdout and f"ring of {RANKS}" in proc.stdout
    assert f"MPI_Allgather {RANKS} ranks x 262144 B" in proc.stdout
    # the ring step's fixed cost, by hand from the printed times: P-1 steps of S bytes
    # after a pause, less (P-1) S past the burst at the payload ceiling, over P-1 steps
    state = cluster_layout.load_state(NAME)
    ceiling, burst, steps = state.tcp_goodput_bps(), state.burst_bytes, RANKS - 1
    costs = []
    for n, size, fastest, wire, cost in re.findall(
            r"^mpi  (\d+) ring steps of (\d+) B: fastest (\d+) us \(median \d+\), wire floor "
            r"(\d+) us, fixed cost (\d+) us per step$", proc.stdout, re.MULTILINE):
        assert int(n) == steps
        by_hand = max(steps * int(size) - burst, 0) * 8 / ceiling * 1e6
        assert abs(int(wire) - by_hand) <= 0.5, (wire, by_hand)
        assert abs(int(cost) - max(int(fastest) - by_hand, 0) / steps) <= 1, proc.stdout
        costs.append(int(cost))
    assert len(costs) == 3, proc.stdout
    assert abs(state.step_us - min(costs)) <= 1  # kept for `run` (CCBENCH_LINK_STEP_US)
    assert cluster_run.rank_environment(state, RANKS)["CCBENCH_LINK_STEP_US"] == \
        f"{state.step_us:.6g}"


@needs_namespaces
def test_second_cluster_coexists_and_reconfigures(cluster):
    other = "ccbu"
    try:
        assert ccb("up", "--name", other, "--ranks", "1", "--rate", "100mbit").returncode == 0
        first = cluster_layout.load_state(other)
        assert first.subnet != cluster.subnet
        proc = ccb("up", "--name", other, "--ranks", "2", "--rate", "300mbit")
        assert proc.returncode == 0 and "removed the previous layout" in proc.stdout
        again = cluster_layout.load_state(other)
        assert again.ranks == 2 and tbf(f"{other}-1", again.rank_iface)["options"]["rate"] == (
            300_000_000 // 8)
    finally:
        down_and_check_gone(other)
    assert cl.intact(cluster_layout.load_state(NAME))  # the other cluster was left alone
    proc = ccb("down", "--name", other)
    assert proc.returncode == 0 and "was not up" in proc.stdout


@needs_namespaces
@pytest.mark.parametrize("failure", [cluster_layout.ClusterError("tc broke"), KeyboardInterrupt()])
def test_failed_up_leaves_nothing(monkeypatch, capsys, failure):
    name = "ccbv"
    calls = []
    real = cluster_netns.shape_link

    def shape_then_fail(*args):
        calls.append(args)
        if len(calls) == 3:  # after the first rank's link is shaped
            raise failure
        return real(*args)

    monkeypatch.setattr(cluster_netns, "shape_link", shape_then_fail)
    try:
        status = cl.main(["up", "--name", name, "--ranks", "2", "--rate", "100mbit"])
        assert status == (1 if isinstance(failure, cluster_layout.ClusterError) else 130)
        assert cluster_netns.leftover_namespaces(name) == []
        assert not cluster_layout.state_path(name).exists()
    finally:
        cl.main(["down", "--name", name])


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
    proc = ccb("up", "--name", USERNS_NAME, "--ranks", "2", "--userns", "--codec", "bfp:rate=8",
               "--codec-ratio", str(USERNS_RATIO), timeout=120)
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
    proc = ccb("up", "--name", USERNS_NAME, "--ranks", "2", "--userns", "--codec",
               "bfp:rate=8", "--codec-ratio", str(USERNS_RATIO), timeout=120)
    assert proc.returncode == 0 and "already up" in proc.stdout, proc.stdout + proc.stderr


@needs_namespaces
@needs_hydra
def test_userns_ranks_run_over_the_shaped_links(userns_cluster, tmp_path):
    c, _ = userns_cluster
    before = json.loads(ccb("status", "--name", USERNS_NAME, "--json").stdout)
    out = tmp_path / "b.csv"
    proc = ccb("run", "--name", USERNS_NAME, "--", "python", *variant_module("baseline"),
               "--collective", "allgather", "-m", "1M:1M", "-i", "3", "-x", "1", "-c",
               "--csv", str(out), timeout=120)  # fmt: skip
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
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(home),
           "XDG_CACHE_HOME": str(home / "cache"), "CCBENCH_STATE": str(home / "state"),
           "CCBENCH_CORPUS": str(home / "no-corpus")}
    env.pop("XDG_RUNTIME_DIR", None)

    def as_nobody(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
             "--bounding-set=-all", sys.executable, "-m", "ccbench.scripts.cluster", *args],
            cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env,
            stdin=subprocess.DEVNULL)  # fmt: skip

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
        run = as_nobody("run", "--name", name, "--", sys.executable,
                        *variant_module("baseline"), "--collective", "allgather", "-m",
                        "256K:256K", "-i", "3", "-x", "1", "-c", "--csv", str(out), timeout=180)
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
