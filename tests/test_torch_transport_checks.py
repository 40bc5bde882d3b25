"""The torch transport (gloo) held to independent accounts of the same work: the MPI
transport's wire bytes and ratios on the same points, the peer's sends for every posted
receive, runs that stage every buffer (CCBENCH_TORCH_STAGE's mode, which a GPU needs and
a CPU never takes otherwise), the control plane with a value that differs by rank, and a
run where one rank's result is wrong. One launch on 2 ranks
(tests/drivers/torch_checks_cases.py)."""

from __future__ import annotations

import pytest

from tests.drivers.torch_checks_cases import POSTED, STAGED, WIRE
from tests.mpirun import case_results

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too

pytest.importorskip("torch")
pytest.importorskip("zstandard")


def results() -> dict:
    return case_results("tests.drivers.torch_checks_cases", 2, timeout=400)


def case(cid: str) -> dict:
    got = results().get(cid)
    assert got is not None, f"{cid} did not report"
    return got


@pytest.mark.timeout(420)
@pytest.mark.parametrize("cid", [c for c, _, _ in WIRE])
def test_torch_puts_on_the_wire_what_mpi_puts_on_the_same_points(cid):
    got = case(cid)
    assert got["status"] == {"mpi": 0, "torch": 0}, got
    mpi, torch = got["rows"]["mpi"], got["rows"]["torch"]
    assert [r["size_bytes"] for r in torch] == [r["size_bytes"] for r in mpi] and mpi
    for a, b in zip(mpi, torch, strict=True):
        assert (a["transport"], b["transport"]) == ("mpi", "torch")
        assert a["validation"] == b["validation"] == "Pass"
        assert b["wire_bytes_per_rank"] == a["wire_bytes_per_rank"] != "", (a, b)
        assert b["compression_ratio"] == a["compression_ratio"], (a, b)


def matched(logs: list) -> list[tuple]:
    """(sender, receiver, k, sent bytes, posted bytes) of the k-th message of each pair:
    the k-th send a posted to b matches the k-th receive b posted from a."""
    sends, recvs = {}, {}
    for rank, log in enumerate(logs):
        for kind, peer, size in log:
            if kind == "send":
                sends.setdefault((rank, peer), []).append(size)
            elif kind == "recv":
                recvs.setdefault((peer, rank), []).append(size)
    assert sends.keys() == recvs.keys()
    out = []
    for pair in sends:
        assert len(sends[pair]) == len(recvs[pair]), pair  # every send has its receive
        out += [
            (*pair, k, s, r) for k, (s, r) in enumerate(zip(sends[pair], recvs[pair], strict=True))
        ]
    return out


@pytest.mark.timeout(420)
@pytest.mark.parametrize("cid", [c for c, _, _ in POSTED])
def test_every_posted_receive_is_exactly_the_size_of_its_send(cid):
    """NCCL needs a receive of exactly the bytes sent (gloo accepts a larger one): every
    codec here is fixed-size, so every receive must post the peer's send size."""
    got = case(cid)
    assert got["status"] == 0 and {r["validation"] for r in got["rows"]} == {"Pass"}, got
    pairs = matched(got["logs"])
    assert pairs
    wrong = [p for p in pairs if p[3] != p[4]]
    assert not wrong, wrong[:5]


@pytest.mark.timeout(420)
@pytest.mark.parametrize("cid", [c for c, _, _ in POSTED])
def test_each_ranks_wire_bytes_are_the_bytes_it_sent(cid):
    """Since the harness's last reset (the row's call and -c's), each rank's count is
    the sum of the sends it posted, not of what it received."""
    got = case(cid)
    for rank, log in enumerate(got["logs"]):
        last = max(i for i, (kind, _, _) in enumerate(log) if kind == "reset")
        sent = sum(size for kind, _, size in log[last + 1 :] if kind == "send")
        assert got["wire"][rank] == sent > 0, (rank, got["wire"], sent)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("cid", [c for c, _, _ in STAGED])
def test_runs_that_stage_every_buffer_validate(cid):
    got = case(cid)
    assert got["status"] == 0, got
    assert got["rows"] and {r["validation"] for r in got["rows"]} == {"Pass"}, got


@pytest.mark.timeout(420)
def test_a_staged_call_copies_in_and_back_once_each():
    """allreduce of rank + 1 on 2 ranks: 1 + 2 = 3 everywhere; rank 0 receives rank 1's
    ones. Each staged call copies its input into the mirror and the result back."""
    got = case("staged-copies")
    assert got["library"] == [2, [3.0] * 6]
    assert got["exchange"] == [2, [1.0] * 3]


@pytest.mark.timeout(420)
def test_the_control_plane_reduces_as_asked():
    got = case("control")
    assert (got["sum"], got["min"], got["max"]) == (3, 1, 2)
    assert got["min_array"] == [1.5, -1.0]  # element-wise: rank 0's first, rank 1's second


@pytest.mark.timeout(420)
def test_one_rank_failing_validation_fails_the_run_over_torch():
    got = case("one-rank-wrong")
    assert got["status"] == 1
    assert [r["validation"] for r in got["rows"]] == ["Fail"]


@pytest.mark.timeout(420)
@pytest.mark.parametrize("transport", ["mpi", "torch"])
def test_every_control_plane_operation_over_each_transport(transport):
    """Two ranks; rank r gathers {rank: r, word: r + 1 x's}, broadcasts from rank 1 and
    reduces [[r + 0.5, -r], [2r, 7]]: worked by hand for r = 0, 1."""
    rank0, rank1 = case(f"control-plane-{transport}")["ranks"]
    assert rank1["gather"] == [{"rank": 0, "word": "x"}, {"rank": 1, "word": "xx"}]
    assert rank0["gather"] is None  # only the root receives
    assert rank0["gather_root0"] == [["r", 0], ["r", 1]] and rank1["gather_root0"] is None
    for got in (rank0, rank1):
        assert got["bcast"] == ["from", 1]
        assert got["allgather"] == [0, 10]
        assert got["sum"] == [[2.0, -1.0], [2.0, 14.0]]
        assert got["min"] == [[0.5, -1.0], [0.0, 7.0]]
        assert got["max"] == [[1.5, 0.0], [2.0, 7.0]]
        assert got["int_max"] == [3, 1] and got["dtype"] == "int64"
        assert got["shape"] == [2, 2]
        assert got["value_min"] == 1
        assert got["threaded"] is True  # mpi4py asks for MPI_THREAD_MULTIPLE by default
