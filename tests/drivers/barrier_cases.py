"""The yielding barrier between timed calls, on real ranks: a barrier (no rank leaves it
before the last one entered) that gives the core away while it waits.

Run under mpiexec; rank 0 prints one JSON line per case (tests/helpers/drivers.py). In
each case the last rank sleeps LATE_S, then writes a marker file, then enters; every
other rank enters at once. Each checks, after the barrier, that the marker exists, and
that its process used less than MAX_CPU_SHARE of the time it waited in CPU time (a
barrier that polls, as MPI_Barrier does, uses nearly all of it).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import numpy as np
from mpi4py import MPI

from tests.helpers.drivers import case_line, on_every_rank

LATE_S = 0.6
MAX_CPU_SHARE = 0.5


def waited(comm, enter, marker: str) -> dict:
    """Enter the barrier `enter` (the last rank late), and check what it did."""
    comm.mpi.Barrier()
    late = comm.rank == comm.size - 1
    if late:
        time.sleep(LATE_S)
        open(marker, "w").close()
    wall, cpu = time.perf_counter(), time.process_time()
    enter()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    checks = {
        "no rank leaves before the last one entered": os.path.exists(marker),
        # the late rank waits for none
        "its CPU time is under half its wait": late or cpu < MAX_CPU_SHARE * wall,
    }
    comm.mpi.Barrier()
    if comm.rank == 0:
        os.unlink(marker)
    return {"checks": checks, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3)}


def main() -> int:
    from ccbench.benchmarks.timing import yielding_barrier
    from ccbench.benchmarks.timing_c import compiled_loop
    from ccbench.collectives.comm import Communicator

    comm = Communicator(MPI.COMM_WORLD)
    folder = comm.mpi.bcast(tempfile.mkdtemp(prefix="ccbench-barrier-") if comm.rank == 0 else None)
    send, recv = np.zeros(4, np.int32), np.zeros(4 * comm.size, np.int32)
    loop, why = compiled_loop(comm.mpi, comm.library_call("allgather", send, recv), "auto")
    cases = {"python": yielding_barrier(comm)}
    if loop is not None:  # the C loop's barrier alone: a warm-up of no calls
        cases["c"] = lambda: loop.warm_up(0, "per-call", "yielding")
    for name, enter in cases.items():
        result = waited(comm, enter, os.path.join(folder, f"{name}-entered"))
        everyone = comm.mpi.gather(result, root=0)
        if comm.rank == 0:
            checks = on_every_rank([r.pop("checks") for r in everyone])
            print(json.dumps(case_line(f"yielding-{name}", checks, detail=everyone)), flush=True)
    if comm.rank == 0:
        if loop is None:
            print(json.dumps({"case": "yielding-c", "skip": why}), flush=True)
        os.rmdir(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
