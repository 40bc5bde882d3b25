"""The barrier between timed calls (benchmarks/timing.py): MPI_Barrier, or, where ranks
outnumber a host's cores, MPI's nonblocking barrier tested with the core given away;
which one ran is in every row and the header, and a bad request is one line."""

from __future__ import annotations

import csv
import json
import os

import pytest

from ccbench.benchmarks import timing
from ccbench.benchmarks.switches import read as read_switches
from ccbench.kernels.errors import UsageError
from tests.helpers.drivers import failed_checks
from tests.mpirun import case_results, mpirun, variant_module

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too


class Placed:
    """A communicator whose ranks report the given (host, allowed cores)."""

    transport = "mpi"

    def __init__(self, places, any_completion=True):
        self.places, self.any_completion = places, any_completion

    def allgather_obj(self, obj):
        return list(self.places)

    def processor_name(self):
        return self.places[0][0]


def test_crowded_hosts_count_ranks_against_the_cores_they_may_use():
    # a: 3 ranks on cores {0, 1}; b: 2 ranks on {0, 1, 2, 3}; c: 2 ranks on core 5 alone
    places = [("a", [0]), ("a", [1]), ("a", [0, 1]), ("b", [0, 1]), ("b", [2, 3])]
    places += [("c", [5]), ("c", [5])]
    assert timing.crowded_hosts(Placed(places)) == {"a": (3, 2), "c": (2, 1)}
    assert timing.crowded_hosts(Placed([("a", [0]), ("a", [1])])) == {}


def test_planned_barrier():
    crowded = Placed([("h", [0]), ("h", [0])])
    roomy = Placed([("h", [0]), ("h", [1])])
    barrier, why = timing.planned_barrier(crowded, "auto")
    assert barrier == "yielding" and "2 ranks on the 1 cores of h" in why
    assert timing.planned_barrier(roomy, "auto")[0] == "blocking"
    assert timing.planned_barrier(roomy, "yielding") == ("yielding", "CCBENCH_BARRIER=yielding")
    assert timing.planned_barrier(crowded, "blocking")[0] == "blocking"
    torch_like = Placed([("h", [0]), ("h", [0])], any_completion=False)
    torch_like.transport = "torch"
    assert timing.planned_barrier(torch_like, "auto")[0] == "blocking"
    with pytest.raises(UsageError, match="torch transport's barrier is its own"):
        timing.planned_barrier(torch_like, "yielding")


def test_requested_barrier():
    assert timing.requested_barrier(read_switches({})) == "auto"
    assert timing.requested_barrier(read_switches({"CCBENCH_BARRIER": "Yielding"})) == "yielding"
    with pytest.raises(UsageError, match="CCBENCH_BARRIER='spin'"):
        timing.requested_barrier(read_switches({"CCBENCH_BARRIER": "spin"}))


@pytest.mark.timeout(200)
@pytest.mark.parametrize("case", ["yielding-python", "yielding-c"])
def test_the_yielding_barrier_waits_for_every_rank_without_taking_the_core(case):
    result = case_results("tests.drivers.barrier_cases", 2, timeout=180).get(case)
    if result is not None and "skip" in result:
        pytest.skip(f"no C loop: {result['skip']}")
    assert failed_checks(result) == [], json.dumps(result)


def baseline(tmp_path, algorithm: str, barrier: str | None, name: str):
    out = tmp_path / f"{name}.csv"
    args = [*variant_module("baseline"), "--algorithm", algorithm, "-T", "int8"]
    args += ["-m", "1:64", "-i", "20", "-x", "2", "-c", "--csv", str(out)]
    env = {"CCBENCH_CACHE": str(tmp_path / "cache")}
    if barrier is not None:
        env["CCBENCH_BARRIER"] = barrier
    proc = mpirun(2, args, env=env, timeout=120)
    rows = list(csv.DictReader(out.open())) if out.exists() else []
    return proc, rows


@pytest.mark.timeout(300)
def test_the_barrier_column_and_header(tmp_path):
    """Every row says which barrier ran between its calls, as the header does; auto yields
    where the 2 ranks outnumber the cores this process may run on (mpiexec does not bind
    them here), for the Python loop and the C loop alike."""
    cores = len(os.sched_getaffinity(0))
    expected = "yielding" if 2 > cores else "blocking"
    for algorithm in ("ring", "mpi"):
        proc, rows = baseline(tmp_path, algorithm, None, f"auto-{algorithm}")
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert {r["barrier"] for r in rows} == {expected}, (cores, rows[:1])
        assert f"# Barrier between calls: {expected}, " in proc.stdout
        assert {r["validation"] for r in rows} == {"Pass"}
        proc, rows = baseline(tmp_path, algorithm, "yielding", f"yielding-{algorithm}")
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert {r["barrier"] for r in rows} == {"yielding"}
        assert "# Barrier between calls: yielding, CCBENCH_BARRIER=yielding" in proc.stdout
        assert {r["validation"] for r in rows} == {"Pass"}


@pytest.mark.timeout(120)
def test_a_bad_barrier_request_is_one_line(tmp_path):
    proc, rows = baseline(tmp_path, "ring", "spin", "bad")
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "CCBENCH_BARRIER='spin'" in lines[0], proc.stderr
    assert rows == []
