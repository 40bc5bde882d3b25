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

import contextlib
import io
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
    folder = Path(
        world.bcast(tempfile.mkdtemp(prefix="ccbench-double-") if world.rank == 0 else None, root=0)
    )
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
            line = {"case": cid, **summary(max(statuses), rows_of(out), entry), "double": counts}
            print(json.dumps(line), flush=True)
    staging_cases(folder)


def staging_cases(folder: Path) -> None:
    """Staging counted by hand on 2 ranks (tests/test_staging.py): one call of each in a
    timed region after a warm-up call; each rank's counts and whether its result is
    right; the staging_bound benchmark's rows on the double."""
    import numpy as np

    import tests.devicedouble as double
    from ccbench.benchmarks import staging_bound
    from ccbench.benchmarks.switches import install as install_switches
    from ccbench.collectives.baseline import bind_collective
    from ccbench.collectives.comm import Communicator
    from ccbench.kernels import arrays

    world = MPI.COMM_WORLD
    rank, size = world.rank, world.size

    def device(values):
        return arrays.from_numpy("double", np.asarray(values), "float32")

    def counted(name, comm, call, check) -> None:
        call()  # warm-up: the mirrors
        double.STATS.reset()
        declared = arrays.SYNCS.count
        double.STATS.in_region = True
        call()
        double.STATS.in_region = False
        mine = {
            **double.STATS.snapshot(),
            "declared": arrays.SYNCS.count - declared,
            "ok": bool(check()),
            "gpu_aware": comm.gpu_aware,
        }
        ranks = world.allgather(mine)
        if rank == 0:
            print(json.dumps({"case": f"staging-{name}", "ranks": ranks}), flush=True)

    every = [np.arange(4097, dtype=np.float32) * (r + 1) for r in range(size)]
    chunked = Communicator(world.Dup(), gpu_aware=False, stage_chunk_bytes=4096)
    x, y = device(every[rank]), device(np.zeros(4097 * size))
    counted(
        "allgather",
        chunked,
        chunked.library_call("allgather", x, y),
        lambda: np.array_equal(y.get(), np.concatenate(every)),
    )

    ring = bind_collective(chunked, "ring", "allgather", x, y)
    y[...] = device(np.zeros(4097 * size))
    counted("ring", chunked, ring, lambda: np.array_equal(y.get(), np.concatenate(every)))

    pieces = [device(np.full(300, 10 * rank + k)) for k in range(6)]
    landed = [device(np.zeros(300)) for _ in range(6)]
    left, right = (rank - 1) % size, (rank + 1) % size

    def sends():
        requests = []
        for k in range(6):
            requests += [
                chunked.irecv(landed[k], left, 40 + k),
                chunked.isend(pieces[k], right, 40 + k),
            ]
        while not chunked.testall(requests):
            pass

    counted(
        "isend",
        chunked,
        sends,
        lambda: all(np.array_equal(landed[k].get(), np.full(300, 10 * left + k)) for k in range(6)),
    )

    os.environ.pop("CCBENCH_GPU_AWARE", None)
    install_switches()  # the communicator's default, as an entry point reads it
    default = Communicator(world.Dup())
    z = device(np.zeros(64 * size))
    counted(
        "default",
        default,
        default.library_call("allgather", x[:64], z),
        lambda: np.array_equal(z.get(), np.concatenate([e[:64] for e in every])),
    )

    out = folder / "staging-bound.csv"
    with contextlib.redirect_stdout(io.StringIO()):
        status = staging_bound.main(
            ["-d", "double", "-m", "4K,64K", "--rounds", "2", "--csv", str(out)]
        )
    statuses = world.allgather(status)
    if rank == 0:
        print(
            json.dumps(
                {
                    "case": "staging-bound",
                    "status": max(statuses),
                    "rows": rows_of(out),
                    "csv": str(out),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    os.environ.setdefault("CCBENCH_TEST_BACKENDS", "tests.devicedouble")
    main()
