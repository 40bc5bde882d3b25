"""The harness's timing statistics on real ranks with a clock the test controls.

    mpiexec -n 3 python -m tests.drivers.statistics_cases

Each rank's "call" advances a fake clock by a duration known in advance (rank- and
call-dependent), so every statistic has an exact expected value, computed here with plain
numpy from the formulas in the README (not with ccbench's own statistics module). One JSON
line per case from rank 0.
"""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

from ccbench.benchmarks.timing import measure
from ccbench.collectives.comm import Communicator
from tests.helpers.drivers import case_line


class FakeClock:
    """clock() returns fake seconds; run() advances them by the next planned duration."""

    def __init__(self, durations):
        self.durations, self.now, self.calls = list(durations), 0.0, 0

    def __call__(self) -> float:
        return self.now

    def run(self) -> None:
        self.now += self.durations[self.calls % len(self.durations)]
        self.calls += 1


def durations(rank: int, calls: int) -> np.ndarray:
    # rank r takes (r + 1) ms, times 1, 2 or 4 by call: different on every rank and call
    return (rank + 1) * 1e-3 * np.array([1.0, 2.0, 4.0])[np.arange(calls) % 3]


def expected(size: int, calls: int) -> dict:
    t = np.array([durations(r, calls) for r in range(size)])  # [rank, call] in seconds
    means = [row.sum() / calls for row in t]
    slowest = [max(t[r][i] for r in range(size)) for i in range(calls)]
    per_call_avg = [sum(t[r][i] for r in range(size)) / size for i in range(calls)]
    m = sum(per_call_avg) / calls
    sd = (sum((x - m) ** 2 for x in per_call_avg) / (calls - 1)) ** 0.5
    t975 = {5: 2.5705818366, 8: 2.3060041350}[calls - 1]  # Student t table, 0.975 quantile
    return {
        "avg_us": sum(means) / size * 1e6,
        "min_us": min(means) * 1e6,
        "max_us": max(means) * 1e6,
        "fastest_us": min(slowest) * 1e6,
        "p50_us": float(np.median(slowest)) * 1e6,
        "ci_low_us": (m - t975 * sd / calls**0.5) * 1e6,
        "ci_high_us": (m + t975 * sd / calls**0.5) * 1e6,
    }


def main() -> None:
    comm = Communicator(MPI.COMM_WORLD)
    out = []
    for calls in (6, 9):
        clock = FakeClock(durations(comm.rank, calls))
        got = measure(comm, clock.run, calls, 0, "per-call", clock=clock)
        # the raw times kept beside the row are the durations each rank was given
        times = got.pop("times_us")
        raw = all(
            np.allclose(times[r], durations(r, calls) * 1e6, rtol=1e-12) for r in range(comm.size)
        )
        want = expected(comm.size, calls)
        # the t quantile is known to 11 digits: intervals to 1e-8, the rest exactly
        checks = {
            f"{k} as the formula": abs(got[k] - v)
            <= (1e-8 if k.startswith("ci_") else 1e-12) * abs(v)
            for k, v in want.items()
        }
        checks["raw times kept"] = raw
        checks["iterations"] = got["iterations"] == calls
        checks["stopped by iterations"] = got["stopped_by"] == "iterations"
        out.append(case_line(f"per-call-{calls}", checks, got=got, want=want))
    # constant durations: a zero-width interval meets any target after the first round
    clock = FakeClock([2e-3])
    got = measure(comm, clock.run, 6, 0, "per-call", ci_target=0.01, budget_s=30, clock=clock)
    got.pop("times_us")
    checks = {
        "stopped by the target": got["stopped_by"] == "target",
        "iterations": got["iterations"] == 6,
    }
    out.append(case_line("target-met", checks, got=got))
    # wildly varying durations and a target no run can meet: the budget ends it
    clock = FakeClock([1e-6, 1.0, 1e-6, 3.0])
    got = measure(comm, clock.run, 4, 0, "per-call", ci_target=1e-6, budget_s=0.3, clock=clock)
    got.pop("times_us")
    checks = {
        "stopped by the budget": got["stopped_by"] == "budget",
        "more than one round": got["iterations"] > 4,
    }
    out.append(case_line("budget-spent", checks, got=got))
    if comm.rank == 0:
        for line in out:
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
