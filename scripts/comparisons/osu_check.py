"""ccbench osu-check: the MPI baseline against OSU's own binaries on the same library.

A user who compares ccbench with OSU Micro-Benchmarks should see the collective, not the
harness. This tool runs OSU's `osu_allgather`, `osu_reduce_scatter` and `osu_allreduce`
and `ccbench baseline --algorithm mpi` at the same sizes, element type, iterations and
warm-ups, on the same bound ranks, in interleaved rounds (the first of the two alternates
from round to round, so background load hits both alike), and prints ccbench/OSU per
point: the median of the per-round ratios with its distribution-free 95% interval (a
shared host spoils a round now and then, OSU's as often as ccbench's; a median does not
follow one spoiled round, a mean does; the time columns are medians over rounds too):

    ccbench osu-check --osu OSU_BUILD/c/mpi/collective/blocking -n 2 -m 1,64K,1M,16M

Sizes of 4 bytes or more are float32 (OSU `-T mpi_float`); smaller sizes are one-byte
integers (OSU's default MPI_CHAR, ccbench `-T int8`). A point agrees when the ratio's
estimate lies within --tolerance of 1, differs when its whole interval lies outside, and
is inconclusive otherwise (rounds that scatter: a loaded host). Exit status: 0 when every
point agrees, 1 when one differs or is inconclusive, 2 on bad input (no OSU binary, fewer
than 6 rounds, a launch that fails).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ccbench.benchmarks.options import (
    add_no_bind,
    add_repetitions,
    add_rounds,
    add_sizes,
    iterations_for,
    size_list,
)
from ccbench.benchmarks.results import read_rows
from ccbench.benchmarks.statistics import Ratio, median_ratio_interval
from ccbench.collectives.spec import spec
from ccbench.kernels.errors import UsageError
from ccbench.kernels.vocabulary import COLLECTIVES
from ccbench.scripts.launchers import (
    binding_enabled,
    mpiexec_command,
    refuse_inside_mpi_launch,
    run_captured,
)

OSU_BINARIES = {c: f"osu_{c}" for c in COLLECTIVES}
MIN_ROUNDS = 6


@dataclass(frozen=True)
class Point:
    collective: str
    size: int

    @property
    def dtype(self) -> str:
        return "float32" if self.size >= 4 and self.size % 4 == 0 else "int8"


def osu_binary(directory: Path, collective: str) -> Path:
    """OSU's binary for `collective` in `directory` or below it (an OSU build tree)."""
    name = OSU_BINARIES[collective]
    for path in [directory / name, *sorted(directory.rglob(name))]:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise UsageError(
        f"--osu {directory}: no executable {name} in it or below it "
        "(build OSU Micro-Benchmarks against the MPI ccbench uses)"
    )


def osu_latency(stdout: str, size: int) -> float:
    """The average latency OSU printed for `size` (its '# Size  Avg Latency(us)' table)."""
    for line in stdout.splitlines():
        fields = line.split()
        if len(fields) >= 2 and not line.startswith("#") and fields[0] == str(size):
            return float(fields[1])
    raise ValueError(f"no line for size {size} in OSU's output")


def skipped(point: Point, ranks: int) -> str | None:
    """Why ccbench does not run this point (OSU would, on zero-element blocks)."""
    # sizes this small are int8 (Point.dtype): bytes are elements
    if point.size < spec(point.collective).min_count(ranks):
        return f"{point.size} B is fewer than one element per rank"
    return None


class Runner:
    """Runs one side of one point and returns its average latency in microseconds."""

    def __init__(self, opts, scratch: Path):
        self.opts, self.scratch = opts, scratch
        self.bind = binding_enabled(False if opts.no_bind else None)

    def counts(self, point: Point) -> list[str]:
        """The same timed calls and warm-ups for both: the user's, or OSU's defaults."""
        iterations, warmup = iterations_for(point.size, self.opts)
        return ["-i", str(iterations), "-x", str(warmup)]

    def _launch(self, program: list[str], what: str):
        proc = run_captured(
            mpiexec_command(self.opts.ranks, program, bind=self.bind), timeout=self.opts.timeout
        )
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()
            raise UsageError(
                f"{what} failed with status {proc.returncode}: {tail[-1] if tail else 'no output'}"
            )
        return proc

    def osu(self, point: Point) -> float:
        binary = osu_binary(self.opts.osu, point.collective)
        dtype = ["-T", "mpi_float"] if point.dtype == "float32" else []
        proc = self._launch(
            [str(binary), "-m", f"{point.size}:{point.size}", *self.counts(point), *dtype],
            binary.name,
        )
        try:
            return osu_latency(proc.stdout, point.size)
        except ValueError as exc:
            raise UsageError(f"{binary.name}: {exc}") from None

    def ccbench(self, point: Point) -> float:
        csv = self.scratch / "ccbench.csv"
        self._launch(
            [
                sys.executable,
                "-m",
                "ccbench.benchmarks.baseline",
                "--algorithm",
                "mpi",
                "--collective",
                point.collective,
                "-m",
                str(point.size),
                *self.counts(point),
                "-T",
                point.dtype,
                "--hugepages",
                self.opts.hugepages,
                "--csv",
                str(csv),
            ],
            "ccbench baseline",
        )
        rows = [r for r in read_rows(csv)[1] if int(r["size_bytes"]) == point.size]
        csv.unlink()
        if not rows:
            raise UsageError(f"ccbench baseline wrote no row for {point.size} B")
        return float(rows[-1]["avg_us"])


def measure(
    points: list[Point], rounds: int, runner: Runner, progress=print
) -> dict[Point, tuple[list[float], list[float]]]:
    """(OSU times, ccbench times) per point, one pair per round, the order alternating."""
    times = {p: ([], []) for p in points}
    for r in range(rounds):
        for point in points:
            osu_times, ours = times[point]
            if r % 2 == 0:
                osu_times.append(runner.osu(point))
                ours.append(runner.ccbench(point))
            else:
                ours.append(runner.ccbench(point))
                osu_times.append(runner.osu(point))
        progress(f"# round {r + 1}/{rounds} done")
    return times


AGREES, DIFFERS, INCONCLUSIVE = "agrees", "differs", "inconclusive"


def judge(ratio: Ratio, tolerance: float) -> str:
    """Agrees when the estimate lies within the tolerance of 1; differs when the whole
    interval lies outside it; else the rounds scatter too much to say (a loaded host)."""
    low, high = 1 - tolerance, 1 + tolerance
    if low <= ratio.ratio <= high:
        return AGREES
    if ratio.high < low or ratio.low > high:
        return DIFFERS
    return INCONCLUSIVE


def table(times: dict[Point, tuple[list[float], list[float]]], tolerance: float) -> list[str]:
    lines = [
        f"{'Collective':<14} {'Size':>9} {'OSU(us)':>11} {'ccbench(us)':>12} "
        f"{'ccbench/OSU':>12} {'CI95 low':>9} {'CI95 high':>9}  Verdict"
    ]
    for point, (osu_times, ours) in times.items():
        ratio = median_ratio_interval(osu_times, ours)
        lines.append(
            f"{point.collective:<14} {point.size:>9} "
            f"{np.median(osu_times):>11.2f} {np.median(ours):>12.2f} "
            f"{ratio.ratio:>12.3f} {ratio.low:>9.3g} {ratio.high:>9.3g}  "
            f"{judge(ratio, tolerance)}"
        )
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ccbench osu-check",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--osu",
        type=Path,
        required=True,
        help="OSU Micro-Benchmarks build (or the folder of its collective binaries)",
    )
    p.add_argument("-n", "--ranks", type=int, default=2, help="ranks (default 2)")
    add_sizes(p, default="1,64K,1M,16M")
    p.add_argument(
        "--collective",
        default=",".join(COLLECTIVES),
        help="comma-separated collectives (default all three)",
    )
    add_rounds(p, 12, f"interleaved rounds, at least {MIN_ROUNDS}")
    add_repetitions(p, None, "calls per size and side")
    p.add_argument(
        "--hugepages",
        choices=("off", "madvise"),
        default="off",
        help="ccbench's buffer policy (default off, as OSU's buffers)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=10.0,
        help="percent within which a point agrees (default 10)",
    )
    add_no_bind(p)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per launch (default 600)")
    return p


def main(argv: list[str]) -> int:
    refuse_inside_mpi_launch("ccbench osu-check")
    opts = build_parser().parse_args(argv)
    collectives = [c.strip() for c in opts.collective.split(",") if c.strip()]
    for name in collectives:
        if name not in COLLECTIVES:
            raise UsageError(f"--collective {name}: not one of {', '.join(COLLECTIVES)}")
    if opts.rounds < MIN_ROUNDS:
        raise UsageError(
            f"--rounds must be at least {MIN_ROUNDS} (a median's 95% interval needs that many)"
        )
    for name in collectives:
        osu_binary(opts.osu, name)  # refuse before any launch
    points, notes = [], []
    for name in collectives:
        for size in size_list(opts.message_size):
            point = Point(name, size)
            why = skipped(point, opts.ranks)
            if why:
                notes.append(f"# {spec(name).label} at {size} B left out: {why}")
            else:
                points.append(point)
    bound = binding_enabled(False if opts.no_bind else None)
    print(
        f"# ccbench osu-check: {opts.ranks} ranks, {opts.rounds} interleaved rounds, "
        f"ranks {'bound to cores' if bound else 'unbound'}, "
        f"ccbench --hugepages {opts.hugepages}, load average "
        f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}",
        flush=True,
    )
    for line in notes:
        print(line)
    with tempfile.TemporaryDirectory(prefix="ccbench-osu-") as scratch:
        times = measure(
            points,
            opts.rounds,
            Runner(opts, Path(scratch)),
            progress=lambda text: print(text, flush=True),
        )
    lines = table(times, opts.tolerance / 100)
    print("\n".join(lines))
    differing = sum(line.endswith(DIFFERS) for line in lines)
    unsure = sum(line.endswith(INCONCLUSIVE) for line in lines)
    if differing:
        print(
            f"# {differing} of {len(times)} points differ from OSU by more than {opts.tolerance:g}%"
        )
    if unsure:
        print(
            f"# {unsure} of {len(times)} points are inconclusive: their rounds scatter "
            "beyond the tolerance; rerun on a quieter host or with more --rounds"
        )
    return 1 if differing or unsure else 0
