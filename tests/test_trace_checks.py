"""Traces: the replay's validation with one failing rank, capture's per-step figures as
means over ranks (against figures set per rank: rank r's are r + 1 times a base, so each
mean over 2 ranks is 1.5 times it), and the PARAM export's timestamps against a timeline
worked by hand. The ranks' cases run in tests/drivers/torch_checks_cases.py's launch."""

from __future__ import annotations

import pytest

from ccbench.collectives.trace import Event, Step, Trace
from ccbench.collectives.trace_param import from_param, to_param
from tests.mpirun import case_results

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too


def case(cid: str) -> dict:
    got = case_results("tests.drivers.torch_checks_cases", 2, timeout=400).get(cid)
    assert got is not None, f"{cid} did not report"
    return got


OVER = {"mpi": "", "torch": "-torch"}  # the communicator the ranks' case ran over


@pytest.mark.mpi
@pytest.mark.timeout(420)
@pytest.mark.parametrize("transport", OVER)
def test_replay_validation_fails_on_every_rank_when_one_ranks_result_is_wrong(transport):
    pytest.importorskip("torch")
    got = case("replay-validate" + OVER[transport])
    assert got["honest"] == [True, True]
    assert got["spoiled"] == [False, False]  # rank 0's own result was right


@pytest.mark.mpi
@pytest.mark.timeout(420)
@pytest.mark.parametrize("transport", OVER)
def test_capture_keeps_the_mean_over_ranks_of_every_figure(transport):
    pytest.importorskip("torch")
    got = case("capture-means" + OVER[transport])
    assert got["ranks"] == 2 and got["number"] == 2  # the step after the skipped one
    # call: gap, gap's CPU time, run; wait: gap, CPU time, waited
    assert got["events"] == [[15.0, 7.5, 45.0, None], [30.0, 12.0, None, 6.0]]
    assert got["tail"] == [150.0, 135.0]
    assert got["measured"] == {
        "step_us": 1500.0,
        "comm_us": 60.0,
        "compute_us": 1350.0,
        "comm_busy_us": 90.0,
    }


def worked_trace() -> Trace:
    """Step 1: A (async allreduce) after 10 us, B (blocking allgather, runs 40 us) after
    5, the wait for A after 20 (waits 7), C (async reduce-scatter) after 3, a drain after
    2 (waits 4), a tail of 50. Step 2: D (async allreduce) after 9, a drain after 1
    (waits 2), a tail of 10. Async calls' own run times (30, 25, 12) are off the
    training thread: they move no later timestamp."""
    one = Step(
        [
            Event("call", 10.0, None, 0, "allreduce", 1024, run_us=30.0),
            Event("call", 5.0, None, 1, "allgather", 2048, blocking=True, run_us=40.0),
            Event("wait", 20.0, None, 0, waited_us=7.0),
            Event("call", 3.0, None, 2, "reduce_scatter", 4096, run_us=25.0),
            Event("drain", 2.0, waited_us=4.0),
        ],
        tail_us=50.0,
        number=1,
    )
    two = Step(
        [
            Event("call", 9.0, None, 0, "allreduce", 512, run_us=12.0),
            Event("drain", 1.0, waited_us=2.0),
        ],
        tail_us=10.0,
        number=2,
    )
    return Trace(ranks=2, steps=[one, two], source={"kind": "handmade"})


def test_param_export_timestamps_follow_the_worked_timeline():
    records = [r for r in to_param(worked_trace()) if r["comms"] != "init"]
    got = [(r["comms"], r["req"], r["startTime_ns"]) for r in records]
    # A at 10; B at 15, ends 55; wait(A) at 75, ends 82; C at 85; drain (C) at 87, ends
    # 91; tail to 141. D at 150; drain (D) at 151.
    assert got == [
        ("all_reduce", 0, 10_000),
        ("all_gather", 1, 15_000),
        ("wait", 0, 75_000),
        ("reduce_scatter", 2, 85_000),
        ("wait", 2, 87_000),
        ("all_reduce", 3, 150_000),
        ("wait", 3, 151_000),
    ]
    # and PARAM's record reads back as the same steps
    back = from_param(to_param(worked_trace()), "export")
    assert [[(e.op, e.gap_us, e.collective, e.count) for e in s.events] for s in back.steps] == [
        [(e.op, e.gap_us, e.collective, e.count) for e in s.events] for s in worked_trace().steps
    ]
