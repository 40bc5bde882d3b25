"""How much the Python harness adds to a small-message collective.

    python -m ccbench.benchmarks.overhead [--ranks 2] [--iterations 20000] [--rounds 5]

Runs, in one mpiexec launch, 1 B .. 4 KiB allgathers of int8 timed four ways: a bare
mpi4py loop with OSU's method (barrier outside, Wtime around each call), the harness's
per-call timing of the baseline variant's op, and both again in batch mode (Wtime
around back-to-back calls). Rounds alternate the methods and the best round counts, so
background noise hits all of them alike. Where mpicc is found beside the Python or on
PATH, OSU's C timing loop (benchmarks/osu_style_allgather.c) runs against the same MPI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SIZES = [2**k for k in range(13)]  # 1 B .. 4 KiB


def _worker(iterations: int, rounds: int) -> None:
    import numpy as np
    from mpi4py import MPI

    from ccbench.benchmarks.harness import measure
    from ccbench.collectives.baseline import bind_collective
    from ccbench.collectives.comm import Communicator

    comm = Communicator(MPI.COMM_WORLD)
    mpi, barrier, wtime = comm.mpi, comm.mpi.Barrier, MPI.Wtime
    warmup = iterations // 10

    def bare_per_call(send, recv):
        allgather = mpi.Allgather
        total = 0.0
        for i in range(iterations + warmup):
            t0 = wtime()
            allgather(send, recv)
            t1 = wtime()
            if i >= warmup:
                total += t1 - t0
            barrier()
        return mpi.allreduce(total / iterations, op=MPI.SUM) / comm.size * 1e6

    def bare_batch(send, recv):
        allgather = mpi.Allgather
        for _ in range(warmup):
            allgather(send, recv)
        barrier()
        t0 = wtime()
        for _ in range(iterations):
            allgather(send, recv)
        t1 = wtime()
        return mpi.allreduce((t1 - t0) / iterations, op=MPI.SUM) / comm.size * 1e6

    for size in SIZES:
        send = np.zeros(size, np.int8)
        recv = np.zeros(size * comm.size, np.int8)
        run = bind_collective(comm, "mpi", "allgather", send, recv)
        best = {"bare": [], "harness": [], "bare_batch": [], "harness_batch": []}
        for _ in range(rounds):
            best["bare"].append(bare_per_call(send, recv))
            best["harness"].append(measure(comm, run, iterations, warmup, "per-call")["avg_us"])
            best["bare_batch"].append(bare_batch(send, recv))
            best["harness_batch"].append(
                measure(comm, run, iterations, warmup, "batch")["avg_us"])
        if comm.rank == 0:
            print(json.dumps({"size": size, **{k: min(v) for k, v in best.items()}}), flush=True)


def _mpi_tool(name: str) -> str | None:
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


def _osu_c(ranks: int, iterations: int) -> dict[int, float]:
    mpicc, mpiexec = _mpi_tool("mpicc"), _mpi_tool("mpiexec")
    if mpicc is None:
        return {}
    source = Path(__file__).with_name("osu_style_allgather.c")
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "osu_style_allgather"
        built = subprocess.run([mpicc, "-O2", "-o", str(binary), str(source)],
                               capture_output=True, text=True)
        if built.returncode != 0:
            print(f"# mpicc failed, no C reference: {built.stderr.strip()[:200]}")
            return {}
        out = subprocess.run([mpiexec, "-n", str(ranks), str(binary), str(SIZES[0]),
                              str(SIZES[-1]), str(iterations), str(iterations // 10)],
                             capture_output=True, text=True, check=True)
    return {int(s): float(t) for s, t in (line.split() for line in out.stdout.splitlines())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ccbench.benchmarks.overhead",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.worker:
        _worker(opts.iterations, opts.rounds)
        return 0
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    proc = subprocess.run([_mpi_tool("mpiexec") or "mpiexec", "-n", str(opts.ranks),
                           sys.executable, "-m", "ccbench.benchmarks.overhead", "--worker",
                           "--iterations", str(opts.iterations), "--rounds", str(opts.rounds)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return proc.returncode
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    osu = _osu_c(opts.ranks, opts.iterations)
    print(f"# Harness overhead, allgather of int8 on {opts.ranks} ranks, best of "
          f"{opts.rounds} rounds x {opts.iterations} iterations (us)")
    print(f"{'# Size':<8}{'OSU C':>9}{'bare py':>10}{'harness':>10}{'overhead':>10}"
          f"{'bare batch':>12}{'batch':>10}{'overhead':>10}{'batch-C':>10}")
    for r in rows:
        c = osu.get(r["size"])
        c_text = f"{c:9.2f}" if c is not None else f"{'-':>9}"
        vs_c = f"{r['harness_batch'] - c:10.2f}" if c is not None else f"{'-':>10}"
        print(f"{r['size']:<8}{c_text}{r['bare']:10.2f}{r['harness']:10.2f}"
              f"{r['harness'] - r['bare']:10.2f}{r['bare_batch']:12.2f}"
              f"{r['harness_batch']:10.2f}{r['harness_batch'] - r['bare_batch']:10.2f}{vs_c}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
