"""The harness's time budget on ranks whose clocks disagree (run under mpiexec).

    mpiexec -n 2 python -m mpi4py -m tests.drivers.budget_cases

Rank 1's monotonic clock runs 1.5 times fast, as clocks of different hosts may. Calls
advance a fake clock by 1-3 ms and no interval meets the target, so rounds double until
the calls left in the budget limit them; every rank must then time the same number of
calls (rank 0's count), or gathering the samples fails. One JSON line from rank 0.
"""

from __future__ import annotations

import json
import time
import types

from mpi4py import MPI

from ccbench.benchmarks import timing
from ccbench.collectives.comm import Communicator
from tests.helpers.drivers import case_line


def main() -> None:
    comm = Communicator(MPI.COMM_WORLD)
    if comm.rank == 1:
        timing.time = types.SimpleNamespace(monotonic=lambda: 1.5 * time.monotonic())
    now, calls = [0.0], [0]

    def run():
        calls[0] += 1
        now[0] += 1e-3 * (1 + calls[0] % 3)  # varied: the interval never closes

    got = timing.measure(
        comm, run, 4, 1, "per-call", ci_target=1e-9, budget_s=3.0, clock=lambda: now[0]
    )
    counts = comm.mpi.gather(got["iterations"], root=0)
    if comm.rank == 0:
        checks = {
            "stopped by the budget": got["stopped_by"] == "budget",
            "the same iterations on every rank": len(set(counts)) == 1,
            "more than the minimum iterations": counts[0] > 4,
        }
        line = case_line("budget-clocks-apart", checks, iterations=counts)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
