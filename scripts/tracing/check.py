"""`ccbench trace check`: does replaying a captured trace give the real step's time, and
does replay predict what a compressed variant saves? Measured in interleaved rounds.

    ccbench trace check -n 2 --rounds 6 --variant "coll_compressed --codec fp16" \\
        --csv results/trace-check.csv -- --model lm-small --framework fsdp --algorithm ring

Each round, on the same ranks (each step a launch of its own):

1. the real training with the options after ``--``, capturing its trace (``--trace``);
2. the replay of that trace as captured (the training's own variant);
3. in an order that rotates from round to round, per ``--variant``: its replay through
   the variant and the real training with the variant;
4. the real training again.

The real step of a round is the geometric mean of 1 and 4 (a drift of the host's load
over the round cancels). Over the rounds (benchmarks/statistics.ratio_interval, the 95%
interval of the mean log ratio): the replay against the real step and against the run
it captured, and per variant the real saving (variant over real) next to the predicted
one (its replay over the replay).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ccbench.benchmarks.options import add_no_bind, add_rounds, split_common
from ccbench.benchmarks.results import Sidecar, append_rows, check_header
from ccbench.benchmarks.statistics import ratio_interval
from ccbench.benchmarks.switches import read as read_switches
from ccbench.kernels.errors import UsageError
from ccbench.scripts.comparisons.rounds import COLUMNS, LAUNCHES, Side, run_meta
from ccbench.scripts.launchers import Launcher, binding_enabled, refuse_inside_mpi_launch

REPLAYED = ("--variant", "--algorithm", "--codec", "--compress", "--chunk-bytes")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ccbench trace check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-n", "--ranks", type=int, default=2, help="MPI ranks (default 2)")
    add_rounds(p, 6)
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar='"VARIANT OPTIONS"',
        help='a variant to predict, e.g. "coll_compressed --codec fp16" (repeatable)',
    )
    p.add_argument(
        "--within",
        type=float,
        default=0.10,
        help="the replay agrees when its interval lies within 1 +- this (default 0.10)",
    )
    p.add_argument("--cluster", metavar="NAME", help="run inside this emulated cluster")
    add_no_bind(p)
    p.add_argument("--rev", metavar="REV", help="run every launch from this git revision")
    p.add_argument("--csv", metavar="PATH", help="append the comparisons (compare rows)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per launch")
    p.epilog = "Options after -- are the training's (ccbench training --help)"
    return p


def replay_options(training: list[str]) -> list[str]:
    """The training's variant options, for the replay of its trace as captured, and its
    timed steps (the trace holds the steps after the training's --warmup)."""
    parser = argparse.ArgumentParser(add_help=False)
    for option in REPLAYED:
        parser.add_argument(option)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=3)
    known, _ = parser.parse_known_args(training)
    out = []
    for option in REPLAYED:
        value = getattr(known, option.lstrip("-").replace("-", "_"))
        if value is not None:
            out += [option, value]
    return [*out, "--steps", str(max(1, known.steps - known.warmup)), "--warmup", "1"]


def without_variant(training: list[str]) -> list[str]:
    """The training options less the variant's (a --variant of the check replaces them)."""
    out, skip = [], False
    for word in training:
        if skip:
            skip = False
            continue
        if word in REPLAYED:
            skip = True
            continue
        out.append(word)
    return out


class Round:
    """One round's launches: each its summary's mean step time in us."""

    def __init__(self, launcher: Launcher, workdir: Path, rev: str | None, root):
        self.launcher, self.workdir, self.rev, self.root = launcher, workdir, rev, root

    def step_us(self, label: str, command: list[str]) -> float:
        side = Side(label, command, self.rev, self.root)
        csv = self.workdir / f"{label}.csv"
        rows = self.launcher.run(side, [], csv)
        summary = [r for r in rows if r.get("row") == "summary"]
        if not summary:
            raise UsageError(f"{side.text()} wrote no summary row")
        return float(summary[0]["step_us"])


def check_options(opts, training: list[str]) -> None:
    if opts.ranks < 1 or opts.rounds < 2:
        raise UsageError(
            "-n must be at least 1 and --rounds at least 2 (one round gives no interval)"
        )
    if not 0 < opts.within < 1:
        raise UsageError("--within must be in (0, 1)")
    if "--framework" not in training:
        raise UsageError(
            "give the training's options after --, with --framework fsdp, ddp or mgwfbp"
        )
    for reserved in ("--trace", "--csv", "--json"):
        if reserved in training:
            raise UsageError(f"{reserved} after --: the check sets it for every launch")
    if opts.csv:
        check_header(opts.csv, COLUMNS)


def main(argv: list[str]) -> int:
    refuse_inside_mpi_launch("ccbench trace check")
    own, training = split_common(argv)
    opts = build_parser().parse_args(own)
    check_options(opts, training)
    variants = [shlex.split(v) for v in opts.variant]
    if any(not v or v[0].startswith("-") for v in variants):
        raise UsageError(
            '--variant takes a variant and its options, e.g. "coll_compressed --codec fp16"'
        )
    launcher = Launcher(
        opts.ranks, opts.cluster, binding_enabled(False if opts.no_bind else None), opts.timeout
    )
    replay = replay_options(training)
    base = without_variant(training)
    meta = run_meta()
    meta["sweep_id"] = read_switches().sweep_id
    started = time.monotonic()
    times: dict[str, list[float]] = {"real": [], "replay": [], "captured": [], "again": []}
    for n in range(len(variants)):
        times[f"real{n}"], times[f"replay{n}"] = [], []
    print(
        f"# ccbench trace check: training {shlex.join(training)}; {opts.ranks} ranks, "
        f"{opts.rounds} rounds, load {meta['load_start']}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="ccbench-trace-check-") as tmp:
        root = None
        if opts.rev:
            from ccbench.scripts.comparisons.revisions import materialize

            root = materialize(opts.rev, Path(tmp) / "rev")
        for k in range(opts.rounds):
            work = Path(tmp) / f"round{k}"
            work.mkdir()
            trace = str(work / "trace.json")
            run = Round(launcher, work, opts.rev, root)
            first = run.step_us("real-1", ["training", *training, "--trace", trace])
            # the replay right after the run it captured; the variants rotate after it
            times["replay"].append(run.step_us("replay", ["trace_replay", trace, *replay]))
            middle = []
            for n, v in enumerate(variants):
                chosen = ["--variant", v[0], *v[1:]]
                middle.append((f"replay{n}", ["trace_replay", trace, *chosen, *replay[-4:]]))
                middle.append((f"real{n}", ["training", *base, *chosen]))
            shift = k % max(1, len(middle))
            for key, command in middle[shift:] + middle[:shift]:
                times[key].append(run.step_us(key, command))
            last = run.step_us("real-2", ["training", *training])
            times["captured"].append(first)
            times["again"].append(last)
            times["real"].append(math.sqrt(first * last))
            print(
                f"  round {k + 1}: "
                + ", ".join(f"{key} {v[-1] / 1e3:.1f} ms" for key, v in times.items()),
                flush=True,
            )
    meta["load_end"] = round(os.getloadavg()[0], 2)
    rows = report(opts, training, variants, times, meta)
    print(
        f"# {time.monotonic() - started:.0f} s, load {meta['load_start']} -> {meta['load_end']}",
        flush=True,
    )
    if opts.csv:
        append_rows(opts.csv, rows, COLUMNS)
        Sidecar(opts.csv).add(
            meta["compare_id"],
            {
                "training": training,
                "variants": opts.variant,
                "ranks": opts.ranks,
                "cluster": opts.cluster,
                "times": times,
            },
        )
    return 0


def report(opts, training, variants, times, meta) -> list[dict]:
    real = "training " + shlex.join(training)
    replayed = "trace_replay TRACE " + shlex.join(replay_options(training))
    pairs = [
        ("the replay of its trace", real, replayed, times["real"], times["replay"]),
        (
            "the replay against the run it captured",
            real + " --trace TRACE",
            replayed,
            times["captured"],
            times["replay"],
        ),
    ]
    for n, v in enumerate(variants):
        text = shlex.join(v)
        pairs.append(
            (
                f"real saving of {text}",
                real,
                f"training ... {text}",
                times["real"],
                times[f"real{n}"],
            )
        )
        pairs.append(
            (
                f"replayed saving of {text}",
                "trace_replay TRACE (as captured)",
                f"trace_replay TRACE {text}",
                times["replay"],
                times[f"replay{n}"],
            )
        )
    rows = []
    print(f"# {'comparison (B/A)':<44} {'A_ms':>9} {'B_ms':>9} {'B/A':>7} {'95% interval':>17}")
    for what, a_text, b_text, a, b in pairs:
        r = ratio_interval(a, b)
        a_mean, b_mean = (float(np.exp(np.mean(np.log(x)))) for x in (a, b))
        print(
            f"  {what:<44} {a_mean / 1e3:>9.1f} {b_mean / 1e3:>9.1f} {r.ratio:>7.3f} "
            f"{r.low:>8.3f}-{r.high:<8.3f}",
            flush=True,
        )
        rows.append(
            {
                **meta,
                "a": a_text,
                "b": b_text,
                "a_rev": opts.rev or "",
                "b_rev": opts.rev or "",
                "collective": "",
                "ranks": opts.ranks,
                "size_bytes": 0,
                "config": what,
                "statistic": "avg",
                "rounds": len(a),
                "a_us": a_mean,
                "b_us": b_mean,
                "ratio": r.ratio,
                "ratio_low": r.low,
                "ratio_high": r.high,
                "margin": opts.within,
                "verdict": r.verdict(opts.within),
                "a_iterations": None,
                "b_iterations": None,
                "link_gbps": read_switches().link_gbps or None,
                "pairing": LAUNCHES,
                "turns": 1,
                "timer": "",
                "validation": "",
            }
        )
    first = rows[0]
    inside = 1 / (1 + opts.within) <= first["ratio_low"] and first["ratio_high"] <= 1 + opts.within
    print(
        f"# the replay {'is' if inside else 'is not shown to be'} within "
        f"{opts.within:.0%} of the real step (its interval "
        f"{first['ratio_low']:.3f}-{first['ratio_high']:.3f})"
    )
    for n in range(len(variants)):
        real_row, replay_row = rows[2 + 2 * n], rows[3 + 2 * n]
        same_sign = (real_row["ratio"] < 1) == (replay_row["ratio"] < 1)
        within = real_row["ratio_low"] <= replay_row["ratio"] <= real_row["ratio_high"]
        print(
            f"# {opts.variant[n]}: replay predicts {1 - replay_row['ratio']:+.1%}, real "
            f"{1 - real_row['ratio']:+.1%}; sign {'agrees' if same_sign else 'differs'}, "
            f"prediction {'inside' if within else 'outside'} the real saving's interval"
        )
    return rows


if __name__ == "__main__":
    try:
        raise SystemExit(main(sys.argv[1:]))
    except UsageError as exc:
        print(f"ccbench trace check: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
