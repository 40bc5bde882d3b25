"""How close staging through host memory comes to its bound, measured in one launch.

    mpiexec -n 2 python -m ccbench.benchmarks.staging_bound -d cupy -m 16M [--rounds N] [--csv P]

An MPI that cannot read device memory gets device buffers staged through pinned host
buffers (collectives/comm.py). Without overlap, a staged allgather of SIZE bytes per
rank costs at least its three parts, each timed here on its own with the same pinned
buffers, the copy streams and the MPI library the staged call uses:

  d2h_pinned_us      the D2H copy of the SIZE bytes each rank sends, waited for
  host_allgather_us  MPI_Allgather of those bytes between pinned host buffers
  h2d_pinned_us      the H2D copy of the gathered ranks x SIZE bytes, waited for

bound_us is their sum; staged_us is ccbench's staged allgather through the communicator
(`baseline --algorithm mpi` on a device buffer, staged whatever CCBENCH_GPU_AWARE says),
waited for on the device, in pieces of --stage-chunk-bytes (the communicator's default);
staged_whole_us the same without pieces, which tells whether the pieces pay. Every rank
runs each measurement at once (a barrier before it), a measurement's time is its slowest
rank's, the methods take turns in every round (the order rotates), and each column is
the median over the rounds. One row per size;
staged_vs_bound = staged_us / bound_us (below 1: copies overlapped with MPI).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from ccbench.benchmarks.agreement import agreed, run_main
from ccbench.benchmarks.options import (
    RankAwareParser,
    add_rounds,
    parse_size,
    size_list,
)
from ccbench.benchmarks.results import STAGING, append_rows, build_row, check_header
from ccbench.collectives.comm import Communicator
from ccbench.kernels import arrays
from ccbench.kernels.errors import UsageError

COLUMNS = STAGING.names  # its schema tag, then the columns above and its settings
PARTS = ("d2h_pinned_us", "host_allgather_us", "h2d_pinned_us")


def build_parser(quiet: bool) -> RankAwareParser:
    parser = RankAwareParser(
        prog="staging_bound", quiet=quiet, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "-d",
        "--buffer",
        required=True,
        choices=arrays.buffer_choices(),
        help="buffer backend: a device's (cupy, torch-cuda)",
    )
    parser.add_argument(
        "-m",
        "--message-size",
        default="16M",
        metavar="SIZE",
        help="message sizes, the bytes each rank sends: one size (16M), a "
        "list (4M,16M) or a doubling range (1M:16M); default 16M",
    )
    add_rounds(parser, 12, "interleaved rounds; each column is their median")
    parser.add_argument(
        "--stage-chunk-bytes",
        type=parse_size,
        metavar="BYTES",
        default=Communicator.STAGE_CHUNK_BYTES,
        help=f"pieces of the staged call (default "
        f"{Communicator.STAGE_CHUNK_BYTES // 1024}K; 0: whole)",
    )
    parser.add_argument("--csv", help="append one row per size to this CSV")
    return parser


def parse(argv: list[str], quiet: bool):
    opts = build_parser(quiet).parse_args(argv)
    if not arrays.is_gpu(opts.buffer):
        raise UsageError(
            f"-d {opts.buffer}: staging_bound times device buffers staged "
            f"through host memory; use -d cupy or -d torch-cuda"
        )
    arrays.check_supported(opts.buffer, "int8")
    text = opts.message_size
    return opts, size_list(text) if "," in text or ":" in text else [parse_size(text)]


def _require_mpi(comm) -> None:
    if comm.mpi is None:
        raise UsageError("staging_bound times MPI's staging: start it under mpiexec")


class Setup:
    """Buffers, pinned mirrors, streams and the bound staged call for one size."""

    def __init__(self, comm, staged_comm, whole_comm, buffer: str, size: int):
        self.comm, self.buffer, self.size = comm, buffer, size
        ranks = comm.size
        self.pattern = [(np.arange(size) * 7 + 13 * r) % 127 for r in range(ranks)]
        self.send = arrays.from_numpy(buffer, self.pattern[comm.rank], "int8")
        self.recv = arrays.empty(buffer, size * ranks, "int8")
        b = self.backend = arrays.backend(buffer)
        self.send_bytes, self.recv_bytes = b.byte_view(self.send), b.byte_view(self.recv)
        self.host_send = b.pinned_empty(size)
        self.host_recv = b.pinned_empty(size * ranks)
        self.d2h, self.h2d = b.copy_stream(), b.copy_stream()
        self.done = b.copy_event()
        self.staged = staged_comm.library_call("allgather", self.send, self.recv)
        self.whole = whole_comm.library_call("allgather", self.send, self.recv)

    def d2h_pinned(self) -> None:
        b = self.backend
        b.copy_out_async(self.send_bytes, self.host_send, self.d2h)
        b.record(self.done, self.d2h)
        arrays.wait_copy(self.send, self.done)

    def host_allgather(self) -> None:
        self.comm.mpi.Allgather(self.host_send, self.host_recv)

    def h2d_pinned(self) -> None:
        b = self.backend
        b.copy_in_async(self.host_recv, self.recv_bytes, self.h2d)
        b.record(self.done, self.h2d)
        arrays.wait_copy(self.recv, self.done)

    def staged_allgather(self) -> None:
        self.staged()
        arrays.synchronize(self.buffer)  # the current stream waits for the H2D copies

    def staged_whole(self) -> None:
        self.whole()
        arrays.synchronize(self.buffer)

    def methods(self) -> dict:
        return {
            "d2h_pinned_us": self.d2h_pinned,
            "host_allgather_us": self.host_allgather,
            "h2d_pinned_us": self.h2d_pinned,
            "staged_us": self.staged_allgather,
            "staged_whole_us": self.staged_whole,
        }

    def check(self) -> bool:
        """The staged allgathers' results, against the inputs gathered on the host."""
        want = np.concatenate(self.pattern)
        for call in (self.staged_allgather, self.staged_whole):
            arrays.fill(self.recv, np.zeros(self.recv.shape[0]))
            call()
            if not np.array_equal(arrays.to_numpy(self.recv).astype(np.int64), want):
                return False
        return True


def timed(comm, method) -> float:
    """One call on every rank at once; the slowest rank's time in microseconds."""
    comm.barrier()
    t0 = time.perf_counter()
    method()
    elapsed = time.perf_counter() - t0
    return comm.allreduce_value(elapsed, "max") * 1e6


def measure(comm, setup: Setup, rounds: int) -> dict:
    methods = setup.methods()
    names = list(methods)
    for name in names:  # warm-up: first-use allocations, streams, the MPI connection
        methods[name]()
    samples: dict = {name: [] for name in names}
    for k in range(rounds):
        for name in names[k % len(names) :] + names[: k % len(names)]:
            samples[name].append(timed(comm, methods[name]))
    return {name: statistics.median(values) for name, values in samples.items()}


def row_of(opts, comm, staged_comm, size: int, medians: dict) -> dict:
    parts = {name: round(medians[name], 3) for name in PARTS}
    bound = round(sum(parts.values()), 3)
    staged = round(medians["staged_us"], 3)
    return build_row(
        STAGING,
        {
            "buffer": opts.buffer,
            "size_bytes": size,
            "ranks": comm.size,
            **parts,
            "bound_us": bound,
            "staged_us": staged,
            "staged_vs_bound": float(f"{staged / bound:.6g}") if bound > 0 else "",
            "staged_whole_us": round(medians["staged_whole_us"], 3),
            "rounds": opts.rounds,
            "stage_chunk_bytes": staged_comm.stage_chunk_bytes,
            "device": arrays.device_label(opts.buffer),
        },
    )


def table_line(row: dict) -> str:
    ratio = row["staged_vs_bound"] if row["staged_vs_bound"] != "" else float("nan")
    return (
        f"{row['size_bytes']:<10}{row['d2h_pinned_us']:>12.1f}"
        f"{row['host_allgather_us']:>12.1f}{row['h2d_pinned_us']:>12.1f}"
        f"{row['bound_us']:>12.1f}{row['staged_us']:>12.1f}{ratio:>10.4g}"
        f"{row['staged_whole_us']:>12.1f}"
    )


def body(argv: list[str], comm) -> int:
    opts, sizes = agreed(comm, lambda: parse(argv, comm.rank != 0))
    agreed(comm, lambda: _require_mpi(comm))
    # a file of other columns (one written before rows named their schema) is refused now
    agreed(comm, lambda: check_header(opts.csv, COLUMNS) if opts.csv and comm.rank == 0 else None)
    arrays.select_device(opts.buffer, comm.local_rank)
    staged_comm = Communicator(
        comm.mpi.Dup(), gpu_aware=False, stage_chunk_bytes=opts.stage_chunk_bytes
    )
    whole_comm = Communicator(comm.mpi.Dup(), gpu_aware=False, stage_chunk_bytes=0)
    root = comm.rank == 0
    if root:
        print(
            f"# ccbench staging_bound: allgather of int8 on {comm.size} ranks, "
            f"buffer {opts.buffer}, staged through pinned host memory in pieces of "
            f"{staged_comm.stage_chunk_bytes} B; medians of {opts.rounds} interleaved "
            f"rounds, slowest rank (us)",
            flush=True,
        )
        print(
            f"{'# Size':<10}{'D2H pinned':>12}{'MPI host':>12}{'H2D pinned':>12}"
            f"{'bound':>12}{'staged':>12}{'staged/bd':>10}{'whole':>12}",
            flush=True,
        )
    rows, status = [], 0
    for size in sizes:
        setup = agreed(
            comm, lambda size=size: Setup(comm, staged_comm, whole_comm, opts.buffer, size)
        )
        wrong = [r for r, ok in enumerate(comm.allgather_obj(setup.check())) if not ok]
        if wrong:
            if root:
                print(
                    f"# {size} B: the staged allgather gave a wrong result on ranks "
                    f"{wrong}: not timed",
                    flush=True,
                )
            status = 1
            continue
        row = row_of(opts, comm, staged_comm, size, measure(comm, setup, opts.rounds))
        rows.append(row)
        if root:
            print(table_line(row), flush=True)
    if root and opts.csv and rows:
        append_rows(opts.csv, rows, COLUMNS)
    return status


def main(argv: list[str] | None = None) -> int:
    return run_main(body, argv)


if __name__ == "__main__":
    raise SystemExit(main())
