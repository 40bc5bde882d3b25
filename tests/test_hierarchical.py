"""Hierarchical collectives and the two-level floor: results on real MPI ranks (nodes
faked on one host by the layout), the bytes each level sends worked by hand, the floor
per level by hand, the options' refusals, and a cluster of nodes."""

from __future__ import annotations

import csv
import json

import pytest

from ccbench.collectives.compressed_error import hierarchical_error_bound
from ccbench.collectives.costmodel import hierarchical_floor, node_link_bytes
from ccbench.collectives.hierarchical import ranks_per_node_from_environment
from ccbench.kernels.codecs import parse_codec
from ccbench.scripts.cluster import jobs as cluster_run
from ccbench.scripts.cluster import layout as cluster_layout
from tests.cluster_helpers import ccb, down_and_check_gone, needs_hydra, needs_namespaces
from tests.cluster_helpers import sent_received as link_bytes
from tests.mpirun import mpirun, variant_module

pytestmark = pytest.mark.mpi  # the collectives run on 4 and 6 real ranks

MIB = 1 << 20

# ------------------------------------------------------------------------ no MPI


@pytest.mark.parametrize(
    "collective, flat, hierarchical",
    [
        # 2 nodes x 2 ranks, 16 MiB: the flat ring's 3 blocks cross a node's link; per
        # local index 1 block of the 2-node ring, 2 local indices
        ("allgather", 3 * 16 * MIB, 2 * 16 * MIB),
        # reduce-scatter: 3/4 of the buffer flat; 2 x (1/2 of the 8 MiB half) across
        ("reduce_scatter", 12 * MIB, 8 * MIB),
        ("allreduce", 24 * MIB, 16 * MIB),
    ],
)
def test_node_link_bytes_by_hand(collective, flat, hierarchical):
    assert node_link_bytes(collective, 16 * MIB, 2, 2, False) == flat
    assert node_link_bytes(collective, 16 * MIB, 2, 2, True) == hierarchical


def test_hierarchical_floor_by_hand():
    # 32 MiB inside the node at 40 Gbit/s: 6.7108864 ms; 8 MiB through the link, less a
    # 125000 B burst, at 1 Gbit/s: 66.108864 ms, plus one step of 1 ms
    f = hierarchical_floor(32 * MIB, 40e9, 8 * MIB, 1e9, 0.02, 1.0, 125000, 1, 1e-3)
    assert f["intra"] == pytest.approx(6.7108864e-3)
    assert f["inter"] == pytest.approx(67.108864e-3)
    assert f["wire"] == pytest.approx(73.8197504e-3)
    assert f["floor"] == pytest.approx(73.8197504e-3)
    # a codec slower than the link bounds the inter-node level instead
    slow = hierarchical_floor(32 * MIB, 40e9, 8 * MIB, 1e9, 0.1, 1.0, 125000, 1, 1e-3)
    assert slow["floor"] == pytest.approx(6.7108864e-3 + 0.1)
    # no intra-node rate known: that level counts nothing; no link: the codec's
    assert hierarchical_floor(32 * MIB, None, 0, None, 0.02, 1.0)["floor"] == pytest.approx(0.02)
    # the levels overlapped: the larger level bounds the call (67.1 ms across), and a
    # level inside the node slower than the one across (8 GiB at 40 Gbit/s) bounds it
    beside = hierarchical_floor(32 * MIB, 40e9, 8 * MIB, 1e9, 0.02, 1.0, 125000, 1, 1e-3, True)
    assert beside["wire"] == pytest.approx(67.108864e-3)
    assert beside["floor"] == pytest.approx(67.108864e-3)
    slow_inside = hierarchical_floor(8 * 1024 * MIB, 40e9, 8 * MIB, 1e9, 0.02, 1.0, 0, 0, 0, True)
    assert slow_inside["floor"] == pytest.approx(1.717986918)


def test_hierarchical_error_bound_allgather_is_one_round_trip():
    # a block crosses the nodes once on the collective-level ring: one round trip at the
    # largest magnitude, whatever the ranks per node
    codec = parse_codec("fp16")
    got = hierarchical_error_bound(codec, "coll", "allgather", [1.0, 3.0, 2.0, 0.5], "float32", 2)
    assert got == pytest.approx(codec.error_bound(3.0, "float32"))
    assert hierarchical_error_bound(parse_codec("none"), "coll", "allreduce", [1.0], "f", 1) is None


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({"CCBENCH_RANKS_PER_NODE": "2"}, 2),
        ({"SLURM_NTASKS_PER_NODE": "4"}, 4),
        ({"SLURM_NTASKS_PER_NODE": "4(x2)"}, 4),
        ({"SLURM_NTASKS_PER_NODE": "4,2"}, None),  # nodes of unequal counts: not one
        ({}, None),
    ],
)
def test_ranks_per_node_from_environment(monkeypatch, switch, environ, expected):
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    # as an entry point starts: the options layer reads the switches once
    switch("CCBENCH_RANKS_PER_NODE", environ.get("CCBENCH_RANKS_PER_NODE"))
    assert ranks_per_node_from_environment() == expected


def test_cluster_of_nodes_launch():
    c = cluster_layout.Cluster("ccb", 4, 10**9, 0, 1500, 125000, 1 << 20, ranks_per_node=2)
    assert c.nodes == 2 and c.namespaces == ["ccb-0", "ccb-1"] and len(c.addresses) == 2
    args = cluster_run.mpiexec_command(c, ["python", "-m", "x"], 4, "/bin/mpiexec", bind=False)
    segments = " ".join(args).split(" : ")
    # consecutive ranks share a node's namespace; Hydra's hosts say which ranks share one
    for i, seg in enumerate(segments):
        assert f"ip netns exec ccb-{i // 2} " in seg
    assert args[args.index("-hosts") + 1] == "ccb-0:2,ccb-1:2"
    pairs = {args[k + 1]: args[k + 2] for k, a in enumerate(args) if a == "-genv"}
    assert pairs["MPIR_CVAR_NOLOCAL"] == "0"  # shared memory inside a node
    assert pairs["CCBENCH_NODES"] == "2" and pairs["CCBENCH_RANKS_PER_NODE"] == "2"
    pinned = cluster_run.mpiexec_command(c, ["python"], 4, "/bin/mpiexec", bind=True)
    assert " ".join(pinned).count("taskset -c") == 4


# ------------------------------------------------------------------------ MPI ranks

_RESULTS: dict = {}


def cases(ranks: int, per_node: str) -> dict:
    key = (ranks, per_node)
    if key not in _RESULTS:
        proc = mpirun(ranks, ["-m", "tests.drivers.hierarchical_cases", *per_node.split()])
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
        _RESULTS[key] = {line["case"]: line for line in lines}
    return _RESULTS[key]


@pytest.mark.mpi
@pytest.mark.parametrize("ranks, per_node", [(4, "2"), (6, "2 3")])
def test_every_case_is_right(ranks, per_node):
    results = cases(ranks, per_node)
    # every design, and 3 cases of torch tensors through shared memory
    assert len(results) == (3 * 45 + 3) * len(per_node.split())
    wrong = {k: v["ranks"][0] for k, v in results.items() if not v["ok"]}
    assert not wrong


def expected_bytes(collective: str, count: int, m: int, n: int, item: float) -> tuple:
    """(intra, inter) bytes rank 0 sends, by hand: `item` bytes per value across nodes."""
    if collective == "allgather":  # M-1 slabs of N blocks inside; N-1 blocks across
        return (m - 1) * n * count * 4, (n - 1) * count * item
    if collective == "reduce_scatter":
        return (m - 1) * n * count * 4, (n - 1) * count * item
    # allreduce, 2 per node: rank 0 sends the other piece, then its own (c values);
    # across, the 2-node ring sends its piece's other half, then its own half
    piece = -(-count // 2)
    return count * 4, piece * item


def expected_leader_bytes(collective: str, count: int, rank: int, item: float) -> tuple:
    """(intra, inter) bytes a rank of a 2 x 2 layout sends through node leaders, by hand:
    rank 0 leads node 0, rank 1 is its other rank; float32 inside, `item` across."""
    if collective == "allgather":  # its block to the leader; the leader: the result back
        # to rank 1, and its 2-block slab across the 2-node ring once
        return (4 * count * 4, 2 * count * item) if rank == 0 else (count * 4, 0)
    if collective == "reduce_scatter":  # 4c values: pieces of 2c; the ring sends one
        if rank == 0:  # + rank 1's block back; across: half the node's sum (2c values)
            return 2 * count * 4 + count * 4, 2 * count * item
        return 2 * count * 4 + 2 * count * 4, 0  # its piece in the ring, its sum to rank 0
    # allreduce of c values: pieces of ceil(c/2) and floor(c/2); rank 0 sends piece 1 in
    # the ring and the whole result back; across, both halves (reduce, then gather)
    if rank == 0:
        return (count // 2) * 4 + count * 4, count * item
    return -(-count // 2) * 4 + (count // 2) * 4, 0


@pytest.mark.mpi
@pytest.mark.parametrize("collective", ["allgather", "reduce_scatter", "allreduce"])
@pytest.mark.parametrize("variant, item", [("ring-none", 4), ("coll-fp16", 2), ("p2p-bf16", 2)])
def test_leader_bytes_per_level_by_hand(collective, variant, item):
    results = cases(4, "2")
    for count in {"allgather": (7, 1000), "reduce_scatter": (7, 300), "allreduce": (3, 4099)}[
        collective
    ]:
        ranks = results[f"leader2-{collective}-{variant}-{count}"]["ranks"]
        for rank in (0, 1):
            intra, inter = expected_leader_bytes(collective, count, rank, item)
            assert (ranks[rank]["intra"], ranks[rank]["inter"]) == (intra, inter), rank


@pytest.mark.mpi
@pytest.mark.parametrize("collective", ["allgather", "reduce_scatter", "allreduce"])
@pytest.mark.parametrize("variant, item", [("ring-none", 4), ("coll-fp16", 2), ("p2p-bf16", 2)])
@pytest.mark.parametrize("design", ["", "shm"])  # shared memory: the bytes read, as received
def test_bytes_per_level_by_hand(collective, variant, item, design):
    results = cases(4, "2")
    for count in {"allgather": (7, 1000), "reduce_scatter": (7, 300), "allreduce": (3, 4099)}[
        collective
    ]:
        rank0 = results[f"{design}2-{collective}-{variant}-{count}"]["ranks"][0]
        intra, inter = expected_bytes(collective, count, 2, 2, item)
        assert (rank0["intra"], rank0["inter"]) == (intra, inter)
        assert rank0["total"] == 2 * (intra + inter)  # both levels, two calls


@pytest.mark.mpi
def test_rows_of_the_hierarchical_variant(tmp_path):
    common = ["--collective", "allgather", "-m", "4K:4K", "-i", "2", "-x", "1", "-c", "--csv"]
    proc = mpirun(
        4,
        [
            *variant_module("coll_compressed"),
            "--codec",
            "fp16",
            "--hierarchy",
            "node",
            "--ranks-per-node",
            "2",
            "--data",
            "gradient-like",
            *common,
            tmp_path / "c.csv",
        ],
    )
    assert proc.returncode == 0, proc.stderr
    proc = mpirun(
        4,
        [
            *variant_module("baseline"),
            "--hierarchy",
            "node",
            "--ranks-per-node",
            "2",
            *common,
            tmp_path / "b.csv",
        ],
    )
    assert proc.returncode == 0, proc.stderr
    coll = next(csv.DictReader((tmp_path / "c.csv").open()))
    base = next(csv.DictReader((tmp_path / "b.csv").open()))
    assert coll["algorithm"] == "hierarchical-ring" and coll["validation"] == "Pass"
    assert base["algorithm"] == "hierarchical-mpi" and base["validation"] == "Pass"
    assert coll["ranks_per_node"] == "2" and coll["compressions"] == "1"
    assert coll["intra_node"] == "shm"  # auto: the ranks of one host share memory
    # ... and with the collective-level ring across, the levels run beside each other
    assert coll["levels"] == "overlapped"
    # 1024 values per rank: 2 blocks of 4 KiB to the other rank of the node; 1 block in
    # fp16 (2 KiB) across; the node's two ranks share its link: 4 KiB through it
    assert int(coll["intra_wire_bytes"]) == 8192
    assert int(coll["inter_wire_bytes"]) == 2048
    assert int(coll["node_link_bytes"]) == 4096
    assert float(coll["floor_us"]) > 0
    # each level's measured time: both levels ran, and neither alone outlasts the call's
    # slowest rank over its timed iterations
    for level in ("intra_us", "inter_us"):
        assert 0 < float(coll[level]) <= float(coll["max_us"]) * 1.001


@pytest.mark.mpi
def test_rows_say_the_level_inside_a_node_went_through_shared_memory(tmp_path):
    proc = mpirun(
        4,
        [
            *variant_module("coll_compressed"),
            *("--codec", "fp16", "--collective", "reduce_scatter", "-m", "4K:4K", "-i", "2"),
            *("--hierarchy", "node", "--ranks-per-node", "2", "--intra-node", "shm", "-c"),
            *("--data", "gradient-like", "--csv", tmp_path / "s.csv"),
        ],
    )
    assert proc.returncode == 0, proc.stderr
    row = next(csv.DictReader((tmp_path / "s.csv").open()))
    assert row["intra_node"] == "shm" and row["validation"] == "Pass"
    assert row["algorithm"] == "hierarchical-ring" and row["levels"] == "overlapped"
    # 4 KiB reduce-scatter: 1024 values, blocks of 256; rank r reads its block of both
    # nodes' slabs from the node's other rank (2 x 1 KiB), as the ring would send it
    assert int(row["intra_wire_bytes"]) == 2048


# a host whose shared memory has no room: every reservation of a segment fails
NO_ROOM = """
import errno, os, runpy, sys
def full(fd, offset, length):
    raise OSError(errno.ENOSPC, "No space left on device")
os.posix_fallocate = full
sys.argv = ["coll_compressed", *sys.argv[1:]]
runpy.run_module("ccbench.benchmarks.coll_compressed", run_name="__main__")
"""


@pytest.mark.mpi
@pytest.mark.parametrize("intra", ["auto", "shm"])
def test_no_room_for_the_segments_falls_back_to_the_ring_or_is_one_line(tmp_path, intra):
    proc = mpirun(
        4,
        [
            *("-c", NO_ROOM, "--codec", "fp16", "--collective", "allgather", "-m", "4K:4K"),
            *("--hierarchy", "node", "--ranks-per-node", "2", "--intra-node", intra, "-c"),
            *("--csv", tmp_path / "r.csv"),
        ],
    )
    if intra == "auto":  # the ring inside the node, and the row says so
        assert proc.returncode == 0, proc.stderr
        row = next(csv.DictReader((tmp_path / "r.csv").open()))
        assert row["intra_node"] == "ring" and row["validation"] == "Pass"
        assert row["levels"] == "series"  # the ring: after the level across
        return
    assert proc.returncode == 2
    assert "no room for their segments" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.count("ccbench: error") == 1  # one line, from rank 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ranks-per-node", "2"], "--ranks-per-node goes with --hierarchy node"),
        (["--hierarchy", "node", "--ranks-per-node", "3"], "do not make whole nodes"),
        (["--hierarchy", "node", "-d", "torch"], "numpy buffers"),
        (
            ["--hierarchy", "leader", "--intra-node", "shm"],
            "--intra-node shm goes with --hierarchy node",
        ),
    ],
)
@pytest.mark.mpi
def test_refusals_are_one_line(args, message):
    proc = mpirun(4, [*variant_module("coll_compressed"), "-m", "4K", *args])
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


# ------------------------------------------------------------------------ a cluster of nodes


@needs_namespaces
@needs_hydra
@pytest.mark.mpi
def test_cluster_of_nodes_shares_memory_inside_and_shapes_across(tmp_path):
    name = "ccbw"
    ccb("down", "--name", name)
    proc = ccb("up", "--name", name, "--nodes", "2", "--ranks-per-node", "2", "--rate", "200mbit")
    try:
        assert proc.returncode == 0, proc.stderr
        cluster = cluster_layout.load_state(name)
        assert cluster.nodes == 2 and cluster.ranks == 4
        sent = {}
        for hierarchy in ("node", "flat"):
            before = link_bytes(cluster)
            out = tmp_path / f"{hierarchy}.csv"
            proc = ccb(
                "run", "--name", name, "--", "python", *variant_module("baseline"),
                "--algorithm", "ring", "--hierarchy", hierarchy, "--collective", "allgather",
                "-m", "2M:2M", "-i", "2", "-x", "0", "-c", "--csv", str(out), timeout=120,
            )  # fmt: skip
            assert proc.returncode == 0, proc.stderr
            after = link_bytes(cluster)
            sent[hierarchy] = [a[0] - b[0] for a, b in zip(after, before, strict=True)]
            row = next(csv.DictReader(out.open()))
            assert (row["nodes"], row["ranks"], row["validation"]) == ("2", "4", "Pass")
        # per call, 2 blocks leave each node hierarchically (one per local index), 3 in
        # the flat ring (one per step); inside a node nothing crosses the link. Both runs
        # make as many calls; the harness's own messages are small beside 2 MiB blocks
        for node, flat in zip(sent["node"], sent["flat"], strict=True):
            assert 0.62 <= node / flat <= 0.71, (sent, node / flat)
    finally:
        down_and_check_gone(name)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ranks", "4", "--nodes", "2"], "not both"),
        (["--ranks", "2", "--ranks-per-node", "2"], "goes with --nodes"),
        ([], "give --ranks N"),
        (["--nodes", "251"], "between 1 and 250"),
        (["--nodes", "2", "--ranks-per-node", "0"], "between 1 and 64"),
    ],
)
def test_cluster_up_refuses_a_layout_in_one_line(monkeypatch, capsys, args, message):
    from ccbench.scripts.cluster import command as cl

    # refused before anything is built, with or without privileges here
    monkeypatch.setattr(cl, "require_tools_and_privileges", lambda userns=False: "root")
    assert cl.main(["up", "--name", "ccbx", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


@pytest.mark.parametrize(
    "environ, hosts, ranks, expected",
    [
        # the emulated cluster: every rank on one host, the layout from `cluster run`
        ({"CCBENCH_NODES": "2", "CCBENCH_RANKS_PER_NODE": "2"}, 1, 4, (2, 2)),
        # SLURM's allocation: 3 nodes of 4 tasks
        ({"SLURM_NNODES": "3", "SLURM_NTASKS_PER_NODE": "4(x3)"}, 3, 12, (3, 4)),
        # nothing said: the hosts the ranks run on, ranks spread evenly
        ({}, 2, 8, (2, 4)),
        ({}, 3, 8, (3, None)),  # 8 ranks on 3 hosts: no one count per node
    ],
)
def test_rows_record_nodes_and_ranks_per_node(monkeypatch, switch, environ, hosts, ranks, expected):
    from ccbench.benchmarks.environment import node_layout_of_run

    for key in ("CCBENCH_NODES", "SLURM_NNODES", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    switch("CCBENCH_RANKS_PER_NODE", environ.get("CCBENCH_RANKS_PER_NODE"))
    got = node_layout_of_run(hosts, ranks)
    assert (got["nodes"], got["ranks_per_node"]) == expected
