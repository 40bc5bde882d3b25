"""Every collective x algorithm x dtype x buffer x count of the baseline, in one launch.

Run under mpiexec; rank 0 prints one JSON line per case: {"case": id, "ok": bool,
"checks": {name: bool}, ...} (tests/helpers/drivers.py).
Inputs are seeded small integers, so every summation order gives the exact sum and the
check against numpy is exact.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

from ccbench.kernels.vocabulary import COLLECTIVES
from tests.helpers.drivers import case_line

ALGORITHMS = ("mpi", "ring")
# (dtype, buffer): numpy has no bfloat16, so that one runs on torch tensors
DTYPES = (
    ("float32", "numpy"),
    ("float64", "numpy"),
    ("float16", "numpy"),
    ("bfloat16", "torch"),
    ("float32", "torch"),
)
# element counts: per rank for allgather and reduce_scatter, total for allreduce;
# powers of two and not, and (allreduce) fewer elements than ranks
COUNTS = {
    "allgather": (1, 7, 1024, 1000),
    "reduce_scatter": (1, 7, 256, 300),
    "allreduce": (1, 3, 7, 1024, 4099),
}


def cases():
    for collective in COLLECTIVES:
        for algorithm in ALGORITHMS:
            for dtype, buffer in DTYPES:
                for count in COUNTS[collective]:
                    yield (
                        f"{collective}-{algorithm}-{dtype}-{buffer}-{count}",
                        (collective, algorithm, dtype, buffer, count),
                    )


def run_case(comm, collective, algorithm, dtype, buffer, count) -> tuple[bool, str]:
    from ccbench.collectives.baseline import bind_collective
    from ccbench.kernels import arrays

    size, rank = comm.size, comm.rank
    send_count = count * size if collective == "reduce_scatter" else count
    recv_count = {"allgather": count * size, "reduce_scatter": count, "allreduce": count}[
        collective
    ]
    inputs = [
        np.random.default_rng([7, r, send_count]).integers(-8, 9, send_count).astype(np.float64)
        for r in range(size)
    ]
    send = arrays.from_numpy(buffer, inputs[rank], dtype)
    recv = arrays.empty(buffer, recv_count, dtype)
    bind_collective(comm, algorithm, collective, send, recv)()
    if collective == "allgather":
        expected = np.concatenate(inputs)
    elif collective == "allreduce":
        expected = np.sum(inputs, axis=0)
    else:
        expected = np.sum(inputs, axis=0)[rank * count : (rank + 1) * count]
    got = arrays.to_numpy(recv).astype(np.float64)
    wrong = int(np.count_nonzero(got != expected))
    return wrong == 0, f"{wrong} wrong of {expected.size}"


def main() -> int:
    from ccbench.collectives.comm import Communicator

    comm = Communicator(MPI.COMM_WORLD)
    for case_id, params in cases():
        ok, detail = run_case(comm, *params)
        gathered = comm.mpi.gather((ok, detail), root=0)
        if comm.rank == 0:
            checks = {f"rank {r} equals numpy": ok for r, (ok, _) in enumerate(gathered)}
            details = [detail for _, detail in gathered]
            print(json.dumps(case_line(case_id, checks, detail=details)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
