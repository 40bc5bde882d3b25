"""Every variant's validation matrix on the strict device double, in one launch.

    mpiexec -n 2 python -m mpi4py -m tests.drivers.double_cases

The double (tests/devicedouble.py) behaves as a GPU library: a host synchronisation it
sees inside a timed call is counted, and told apart from those ccbench declares (the
staging through host memory an MPI without GPU-awareness needs, the wait before a
GPU-aware MPI reads the device). Each case runs a variant with -c on -d double over MPI
staged, over a GPU-aware MPI and over torch.distributed (which reads the device's memory
itself, as NCCL does); rank 0 prints one JSON line with the rows and every rank's counts.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from mpi4py import MPI

from tests.drivers.transport_cases import COMMON, double_cases, rows_of, run_case, summary


def main() -> None:
    import tests.devicedouble as double
    from ccbench.collectives.comm import Communicator

    world = MPI.COMM_WORLD
    folder = Path(world.bcast(tempfile.mkdtemp(prefix="ccbench-double-")
                              if world.rank == 0 else None, root=0))
    comms: dict = {}
    for cid, entry, argv, options in double_cases():
        key = tuple(sorted(options.items()))
        if key not in comms:  # GPU-awareness is a property of the MPI communicator
            comms[key] = Communicator(world.Dup(), **options)
        out = folder / f"{cid}.csv"
        double.STATS.reset()
        status = run_case(entry, [*argv, *COMMON], out, comms[key])
        counts = world.allgather(double.STATS.snapshot())
        statuses = world.allgather(status)
        if world.rank == 0:
            line = {"case": cid, **summary(max(statuses), rows_of(out), entry),
                    "double": counts}
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("CCBENCH_TEST_BACKENDS", "tests.devicedouble")
    main()
