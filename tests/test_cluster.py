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

import pytest

from ccbench.kernels.errors import UsageError
from ccbench.scripts.cluster import command as cl
from ccbench.scripts.cluster import jobs as cluster_run
from ccbench.scripts.cluster import layout as cluster_layout
from ccbench.scripts.cluster import netns as cluster_netns
from ccbench.scripts.cluster import regime as cluster_regime
from ccbench.scripts.cluster import selfcheck as cluster_selfcheck
from tests.cluster_helpers import (
    NAME,
    RANKS,
    RATE,
    RATE_BPS,
    REPO,
    can_build,
    ccb,
    check_selfcheck_verdicts,
    down_and_check_gone,
    needs_hydra,
    needs_namespaces,
    sent_received,
    tbf,
)
from tests.mpirun import variant_module

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too


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


@pytest.mark.parametrize(
    "text, bps",
    [("1gbit", 10**9), ("100mbit", 10**8), ("2.5gbit", 25 * 10**8), ("500Mbit", 5 * 10**8)],
)
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
    c = cluster_layout.Cluster(
        "abcdefgh", cluster_layout.MAX_RANKS, 10**9, 0, 1500, 125000, 1 << 20
    )
    assert max(len(n) for n in [*c.ports, c.bridge, c.rank_iface]) <= 15
    assert len(set(c.addresses)) == cluster_layout.MAX_RANKS
    subnets = {
        cluster_layout.Cluster(n, 2, 10**9, 0, 1500, 1, 1).subnet
        for n in ("ccb", "ccbt", "ccbu", "ccbv", "cs0a1b2c")
    }
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
    assert pairs == {
        "MPIR_CVAR_NOLOCAL": "1",
        "MPIR_CVAR_CH4_NETMOD": "ofi",
        "FI_PROVIDER": "tcp",
        "FI_TCP_IFACE": "ccb-eth",
        "CCBENCH_LINK_GBPS": "1",
        # one rank per node: 3 ranks are 3 nodes
        "CCBENCH_NODES": "3",
        "CCBENCH_RANKS_PER_NODE": "1",
        "CCBENCH_LINK_GOODPUT_GBPS": ceiling,
        "CCBENCH_LINK_CEILING_GBPS": ceiling,
        "CCBENCH_LINK_BURST_BYTES": "125000",
    }
    c.goodput_bps = 0.9e9  # measured by selfcheck: that one
    args = cluster_run.mpiexec_command(c, ["python", "-m", "x"], 3, "/bin/mpiexec")
    assert args[args.index("CCBENCH_LINK_GOODPUT_GBPS") + 1] == "0.9"


def test_userns_commands_enter_the_keeper():
    c = cluster_layout.Cluster(
        "ccb", 2, 10**9, 0, 1500, 125000, 1 << 20, mode=cluster_layout.USERNS, keeper_pid=4242
    )
    enter = [
        "nsenter",
        "-t",
        "4242",
        "-U",
        "-m",
        "-n",
        "--preserve-credentials",
        f"--wd={os.getcwd()}",
        "--",
    ]
    assert cluster_run.mpiexec_command(c, ["x"], 2, "/bin/mpiexec")[: len(enter) + 1] == [
        *enter,
        "/bin/mpiexec",
    ]
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
        1_260_000_000
    )
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
    assert (
        cl.main(
            [
                "up",
                "--name",
                "ccbv",
                "--ranks",
                "2",
                "--rate",
                "1gbit",
                "--codec",
                "fp16",
                "--codec-ratio",
                "4",
            ]
        )
        == 2
    )
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
        timeout=60,
        env=dict(os.environ),
    )


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
    assert all(r["ok"] and r["link"] == "0.2" and r["iface"] == cluster.rank_iface for r in ranks)
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
    proc = ccb(
        "run",
        "--name",
        NAME,
        "-n",
        "2",
        "--",
        "python",
        "-c",
        "from mpi4py import MPI; print(f'size {MPI.COMM_WORLD.size}')",
    )
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
    proc = ccb(
        "run",
        "--name",
        NAME,
        "--",
        "python",
        *variant_module("coll_compressed"),
        "--collective",
        "allgather",
        "--codec",
        "fp16",
        "-m",
        "64K:256K",
        "-i",
        "3",
        "-x",
        "1",
        "-c",
        "--csv",
        str(csv),
        timeout=120,
    )
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
        r"(\d+) us, fixed cost (\d+) us per step$",
        proc.stdout,
        re.MULTILINE,
    ):
        assert int(n) == steps
        by_hand = max(steps * int(size) - burst, 0) * 8 / ceiling * 1e6
        assert abs(int(wire) - by_hand) <= 0.5, (wire, by_hand)
        assert abs(int(cost) - max(int(fastest) - by_hand, 0) / steps) <= 1, proc.stdout
        costs.append(int(cost))
    assert len(costs) == 3, proc.stdout
    assert abs(state.step_us - min(costs)) <= 1  # kept for `run` (CCBENCH_LINK_STEP_US)
    assert (
        cluster_run.rank_environment(state, RANKS)["CCBENCH_LINK_STEP_US"] == f"{state.step_us:.6g}"
    )


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
            300_000_000 // 8
        )
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
