"""What the Python harness adds to a small-message collective, and what the C loop saves.

    mpiexec -n 2 ccbench overhead [-m 1:4K] [--iterations 20000] [--rounds 5]

An MPI program like every other variant: in one launch, through one communicator, it
times int8 allgathers of each size six ways, in interleaved rounds (the order rotates
from round to round, so background load hits every method alike; the best round of each
counts):

  bare      a bare mpi4py loop with OSU's method: Wtime around each call, barrier outside
  harness   the harness's per-call loop (`measure`, Python timer) on the baseline's op
  C         the same loop compiled against this MPI (benchmarks/timing_c.py), as the
            harness runs it for the library's collectives
  bare batch, batch, C batch: the same three with one Wtime around back-to-back calls

OSU's own C benchmark runs in a launch of its own (benchmarks/osu_style_allgather.c is
its timing loop; see docs/compression.md, "Harness overhead"). Launches nothing itself.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from mpi4py import MPI

from ccbench.benchmarks.agreement import agreed, run_main
from ccbench.benchmarks.options import (
    RankAwareParser,
    add_repetitions,
    add_rounds,
    add_sizes,
    size_list,
)
from ccbench.benchmarks.timing import measure
from ccbench.benchmarks.timing_c import compiled_loop
from ccbench.collectives.baseline import bind_collective
from ccbench.kernels.errors import UsageError

METHODS = ("bare", "harness", "c", "bare_batch", "batch", "c_batch")


def build_parser(quiet: bool = False) -> RankAwareParser:
    parser = RankAwareParser(
        prog="ccbench overhead",
        description=__doc__,
        quiet=quiet,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_sizes(parser, "1:4K")
    add_repetitions(parser, 20000, "calls per method, size and round", warmup_default=False)
    add_rounds(parser, 5)
    parser.add_argument(
        "--json", metavar="PATH", help="write this run's rows and environment as one JSON document"
    )
    return parser


def bare_per_call(mpi, send, recv, iterations: int, warmup: int) -> float:
    """OSU's loop in plain mpi4py; this rank's mean seconds per call."""
    allgather, barrier, wtime = mpi.Allgather, mpi.Barrier, MPI.Wtime
    total = 0.0
    barrier()
    for i in range(iterations + warmup):
        t0 = wtime()
        allgather(send, recv)
        t1 = wtime()
        if i >= warmup:
            total += t1 - t0
        barrier()
    return total / iterations


def bare_batch(mpi, send, recv, iterations: int, warmup: int) -> float:
    allgather = mpi.Allgather
    for _ in range(warmup):
        allgather(send, recv)
    mpi.Barrier()
    t0 = MPI.Wtime()
    for _ in range(iterations):
        allgather(send, recv)
    return (MPI.Wtime() - t0) / iterations


def time_size(comm, size: int, iterations: int, rounds: int) -> dict:
    """Best round of each method at `size`, in microseconds (mean over ranks)."""
    mpi = comm.mpi
    warmup = max(1, iterations // 10)
    send = np.zeros(size, np.int8)
    recv = np.zeros(size * comm.size, np.int8)
    run = bind_collective(comm, "mpi", "allgather", send, recv)
    compiled, why = compiled_loop(mpi, run, "auto")

    def harness(timer: str, timing: str) -> float:
        return measure(comm, run, iterations, warmup, timing, timer=timer)["avg_us"] * 1e-6

    def mean_over_ranks(seconds: float) -> float:
        return comm.allreduce_value(seconds, "sum") / comm.size * 1e6

    methods = {
        "bare": lambda: mean_over_ranks(bare_per_call(mpi, send, recv, iterations, warmup)),
        "harness": lambda: harness("python", "per-call") * 1e6,
        "c": lambda: harness("c", "per-call") * 1e6,
        "bare_batch": lambda: mean_over_ranks(bare_batch(mpi, send, recv, iterations, warmup)),
        "batch": lambda: harness("python", "batch") * 1e6,
        "c_batch": lambda: harness("c", "batch") * 1e6,
    }
    if compiled is None:
        for name in ("c", "c_batch"):
            del methods[name]
    best = {name: [] for name in methods}
    names = list(methods)
    for k in range(rounds):
        for name in names[k % len(names) :] + names[: k % len(names)]:
            best[name].append(methods[name]())
    result = {"size": size, **{name: min(v) for name, v in best.items()}}
    if compiled is None:
        result["no_c"] = why
    return result


def table_line(row: dict) -> str:
    def cell(key, width=9):
        return f"{row[key]:{width}.2f}" if key in row else f"{'-':>{width}}"

    c_minus = f"{row['c'] - row['bare']:9.2f}" if "c" in row else f"{'-':>9}"
    return (
        f"{row['size']:<8}{cell('bare')}{cell('harness')}{cell('c')}"
        f"{row['harness'] - row['bare']:11.2f}{c_minus}{cell('bare_batch', 12)}"
        f"{cell('batch')}{cell('c_batch')}"
    )


def parse(argv: list[str], quiet: bool):
    opts = build_parser(quiet).parse_args(argv)
    if opts.iterations < 1 or opts.rounds < 1:
        raise UsageError("--iterations and --rounds must be at least 1")
    return opts, size_list(opts.message_size)


def _require_mpi(comm) -> None:
    if comm.mpi is None:
        raise UsageError("overhead times MPI's own loops: start it under mpiexec")


def body(argv: list[str], comm) -> int:
    opts, sizes = agreed(comm, lambda: parse(argv, comm.rank != 0))
    agreed(comm, lambda: _require_mpi(comm))
    root = comm.rank == 0
    rows = []
    if root:
        print(
            f"# ccbench overhead: allgather of int8 on {comm.size} ranks, best of "
            f"{opts.rounds} rounds x {opts.iterations} calls per method (us per call)",
            flush=True,
        )
        print(
            f"{'# Size':<8}{'bare':>9}{'harness':>9}{'C':>9}{'harn-bare':>11}{'C-bare':>9}"
            f"{'bare batch':>12}{'batch':>9}{'C batch':>9}",
            flush=True,
        )
    for size in sizes:
        row = time_size(comm, size, opts.iterations, opts.rounds)
        rows.append(row)
        if root:
            print(table_line(row), flush=True)
    if root:
        if "no_c" in rows[0]:
            print(f"# no C loop: {rows[0]['no_c']}", flush=True)
        if opts.json:
            with open(opts.json, "w") as f:
                json.dump(
                    {
                        "ranks": comm.size,
                        "iterations": opts.iterations,
                        "rounds": opts.rounds,
                        "rows": rows,
                    },
                    f,
                    indent=1,
                )
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(body, argv)


if __name__ == "__main__":
    raise SystemExit(main())
