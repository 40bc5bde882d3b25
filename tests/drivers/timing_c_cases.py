"""The compiled timing loop on real ranks: it runs the library's collective it is given.

Run under mpiexec; rank 0 prints one JSON line per case, its checks by name
(tests/helpers/drivers.py). Each case binds a collective as
`Communicator.library_call` does, checks that the harness recognises it, runs the C
warm-up and timed loops, and compares what landed in the receive buffer with the result
numpy computes from every rank's input (exact: small integers).
"""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

from tests.helpers.drivers import case_line, on_every_rank

CASES = (
    ("allgather", "per-call", np.float32),
    ("reduce_scatter", "batch", np.float64),
    ("allreduce", "per-call", np.int32),
    ("allgather", "batch", np.int8),
)


def run_case(comm, collective: str, timing: str, dtype) -> dict:
    from ccbench.benchmarks.timing_c import compiled_loop, library_collective

    size, rank, count = comm.size, comm.rank, 1000
    inputs = [
        np.random.default_rng([5, r]).integers(-9, 10, count * size).astype(dtype)
        for r in range(size)
    ]
    send = inputs[rank][:count] if collective == "allgather" else inputs[rank]
    recv_count = {"allgather": count * size, "reduce_scatter": count, "allreduce": count * size}[
        collective
    ]
    recv = np.zeros(recv_count, dtype)
    run = comm.library_call(collective, send, recv)
    recognised = library_collective(run) is not None
    loop, why = compiled_loop(comm.mpi, run, "auto")
    if loop is None:
        return {"checks": {"the C loop takes it": False}, "why": why}
    loop.warm_up(2, timing)
    warm = recv.copy()
    recv[:] = 0
    times = loop.timed(23, timing)
    if collective == "allgather":
        expected = np.concatenate([x[:count] for x in inputs])
    elif collective == "allreduce":
        expected = np.sum(inputs, axis=0).astype(dtype)
    else:
        expected = np.sum(inputs, axis=0).astype(dtype)[rank * count : (rank + 1) * count]
    checks = {
        "recognised as a library call": recognised,
        "warm-up result equals numpy": np.array_equal(warm, expected),
        "timed result equals numpy": np.array_equal(recv, expected),
        "one time per call or batch": times.shape == ((23,) if timing == "per-call" else (10,)),
        "times positive": bool(np.all(times > 0)),
    }
    return {"checks": {k: bool(v) for k, v in checks.items()}, "times": times.tolist()[:3]}


def main() -> int:
    from ccbench.benchmarks.timing_c import library_collective
    from ccbench.collectives.comm import Communicator

    comm = Communicator(MPI.COMM_WORLD)
    for collective, timing, dtype in CASES:
        result = run_case(comm, collective, timing, dtype)
        everyone = comm.mpi.gather(result, root=0)
        if comm.rank == 0:
            case = f"{collective}-{timing}-{np.dtype(dtype).name}"
            checks = on_every_rank([r.pop("checks") for r in everyone])
            print(json.dumps(case_line(case, checks, detail=everyone)), flush=True)
    # what the C loop must not take: a Python callable, a user-defined op (bfloat16 sums)
    send, recv = np.zeros(4, np.uint16), np.zeros(4 * comm.size, np.uint16)
    from functools import partial

    op = MPI.Op.Create(lambda a, b, t: None, commute=True)
    checks = {
        "a Python callable refused": library_collective(lambda: None) is None,
        "a user-defined op refused": (
            library_collective(partial(comm.mpi.Allreduce, send, send.copy(), op)) is None
        ),
        "a library allgather taken": (
            library_collective(partial(comm.mpi.Allgather, send, recv)) is not None
        ),
    }
    op.Free()
    if comm.rank == 0:
        print(json.dumps(case_line("recognises-only-library-calls", checks)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
