"""`ccbench compare A B`: two benchmarks in interleaved rounds, B's time over A's per size,
with a 95% interval and a verdict.

    ccbench compare "baseline --algorithm mpi" "coll_compressed --codec fp16" \\
        --collective allgather -n 4 -m 64K:16M --rounds 6 --cluster ccb --csv results/cmp.csv
    ccbench compare "coll_compressed --codec bfp:rate=8" --a-rev HEAD~3 -m 1M:16M

A and B are each a variant and its options. Both run on the same ranks with the same
common options, round after round, so that a load that comes and goes on a shared host
hits both alike. Two benchmarks with message sizes from this checkout share each round's
launch (benchmarks/paired.py): built on the same ranks, they take `--turns` turns, A B,
B A, ..., so a host whose speed shifts over seconds moves both alike. What one launch
fixes differs from launch to launch (docs/comparisons.md), so a round is a launch, and
the interval is taken across rounds.
`--separate-launches` gives each side a launch of its own in every round instead, in
the order A B, B A, ..., as revisions (`--a-rev` / `--b-rev`: a side from a git
revision, with the same command if B is left out), training, trace_replay and
merged_gradient always have.

Per size, each round gives one time per side (the launch's `--statistic`, default the
mean over calls; over a round's turns, their geometric mean); the ratio B/A is the
geometric mean of the per-round ratios, its interval the t interval of the mean log
ratio over rounds (benchmarks/statistics.py). The verdict: B is faster when the whole
interval lies below 1/(1+margin), slower when it lies above 1+margin, and otherwise no
difference this run can show.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from ccbench.benchmarks.options import add_no_bind, add_rounds, add_sizes, split_common
from ccbench.benchmarks.results import Sidecar, append_rows, check_header
from ccbench.benchmarks.statistics import DEFAULT_MARGIN
from ccbench.benchmarks.switches import read as read_switches
from ccbench.kernels.errors import UsageError
from ccbench.scripts.comparisons import checkpoint
from ccbench.scripts.comparisons.revisions import REPO, materialize, resolve_rev
from ccbench.scripts.comparisons.rounds import (
    COLUMNS,
    IN_LAUNCH,
    LAUNCHES,
    RATED,
    STATISTICS,
    UNSIZED,
    Comparison,
    Side,
    parse_side,
    print_table,
    result_rows,
    run_meta,
    run_round,
)
from ccbench.scripts.launchers import Launcher, binding_enabled, refuse_inside_mpi_launch

TIMERS = ("auto", "python")  # --timer: auto pairs like with like, python forces Python's loop


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ccbench compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("a", help='side A: "VARIANT [OPTIONS]"')
    p.add_argument("b", nargs="?", help="side B (default: A's command, with --a-rev/--b-rev)")
    p.add_argument("--a-rev", metavar="REV", help="run A from this git revision")
    p.add_argument("--b-rev", metavar="REV", help="run B from this git revision")
    p.add_argument("-n", "--ranks", type=int, default=2, help="MPI ranks (default 2)")
    add_rounds(p, 6, "rounds of A and B, a launch each; the interval is taken across rounds")
    p.add_argument(
        "--ci-target",
        type=float,
        metavar="PCT",
        help="after --rounds, add rounds until every size's ratio interval is "
        "within +-PCT percent, or --max-rounds are done",
    )
    p.add_argument(
        "--max-rounds", type=int, default=12, help="rounds at most with --ci-target (default 12)"
    )
    p.add_argument(
        "--turns",
        type=int,
        default=8,
        help="turns of A and B within each round's launch (default 8; "
        "even, so each side goes first as often)",
    )
    add_sizes(p, "64K:1M", note="; both sides run them")
    p.add_argument(
        "--statistic",
        choices=tuple(STATISTICS),
        default="avg",
        help="what each round contributes: avg (mean over calls, default), "
        "fastest (the fastest call), p50",
    )
    p.add_argument(
        "--margin",
        type=float,
        default=DEFAULT_MARGIN,
        help=f"ratios within 1+-margin count as no difference (default {DEFAULT_MARGIN})",
    )
    p.add_argument(
        "--cluster",
        metavar="NAME",
        help="run both sides inside this emulated cluster (ccbench cluster up)",
    )
    add_no_bind(p)
    p.add_argument(
        "--separate-launches",
        action="store_true",
        help="a launch per side and round, even where both sides could share "
        "one (revisions, training, trace_replay and merged_gradient "
        "always do)",
    )
    p.add_argument("--csv", metavar="PATH", help="append one row per size to this CSV")
    p.add_argument(
        "--timeout", type=float, default=1800.0, help="seconds one launch may take (default 1800)"
    )
    p.add_argument(
        "--timer",
        choices=TIMERS,
        default="auto",
        help="auto (default): in one launch, both sides by the C loop where both "
        "are the MPI library's own collectives, else both by the Python "
        "loop; in separate launches, each side's own choice, refused when "
        "they differ. python: both sides by the Python loop",
    )
    p.epilog = "Options after -- go to both sides, e.g. -- --collective allgather -i 20"
    return p


def sides_from(opts) -> tuple[Side, Side]:
    a = parse_side("A", opts.a)
    b = parse_side("B", opts.b) if opts.b else list(a)
    if not opts.b and not (opts.a_rev or opts.b_rev):
        raise UsageError("give two commands, or one with --a-rev and/or --b-rev")
    return Side("A", a, opts.a_rev), Side("B", b, opts.b_rev)


def check(opts) -> None:
    if opts.ranks < 1:
        raise UsageError("-n must be at least 1")
    if opts.rounds < 2:
        raise UsageError("--rounds must be at least 2: one round gives no interval")
    if opts.turns < 1:
        raise UsageError("--turns must be at least 1")
    if opts.ci_target is not None and not opts.ci_target > 0:
        raise UsageError("--ci-target must be a positive percentage")
    if opts.ci_target is not None and opts.max_rounds < opts.rounds:
        raise UsageError("--max-rounds must be at least --rounds")
    if not 0 <= opts.margin < 1:
        raise UsageError("--margin must be in [0, 1)")
    if opts.csv:
        check_header(opts.csv, COLUMNS)


def main(argv: list[str]) -> int:
    refuse_inside_mpi_launch("ccbench compare")
    own, common = split_common(argv)
    opts = build_parser().parse_args(own)
    check(opts)
    a, b = sides_from(opts)
    for reserved in ("--csv", "--json", "-m", "--message-size"):
        if reserved in common:
            raise UsageError(f"{reserved} after --: give it to ccbench compare itself")
    unsized = {a.variant in UNSIZED, b.variant in UNSIZED}
    if len(unsized) > 1:
        raise UsageError(
            "compare a benchmark with message sizes to one with sizes, and "
            "training, trace_replay or merged_gradient to one of the three"
        )
    if True not in unsized:
        common = [*common, "-m", opts.message_size]
    launcher = Launcher(
        opts.ranks, opts.cluster, binding_enabled(False if opts.no_bind else None), opts.timeout
    )
    one_process = a.variant in RATED or b.variant in RATED  # no MPI launch to share
    pairing = (
        LAUNCHES
        if (opts.separate_launches or a.rev or b.rev or True in unsized or one_process)
        else IN_LAUNCH
    )
    comparison = Comparison(a, b, opts.statistic, opts.margin, pairing)
    env = {"CCBENCH_TIMER": "python"} if opts.timer == "python" else {}
    meta = run_meta()
    meta["sweep_id"] = read_switches().sweep_id
    started = time.monotonic()
    identity = {
        "a": a.command,
        "b": b.command,
        "common": common,
        "ranks": opts.ranks,
        "cluster": opts.cluster,
        "bind": launcher.bind,
        "pairing": pairing,
        "turns": opts.turns,
        "statistic": opts.statistic,
        "timer": opts.timer,
        "a_rev": resolve_rev(a.rev),
        "b_rev": resolve_rev(b.rev),
        "sweep_id": meta["sweep_id"],
        "code": git_sha(),
        "edits": checkpoint.working_tree_digest(REPO),
    }
    saved_at = checkpoint.checkpoint_path("compare", identity)
    saved = checkpoint.load(saved_at, identity)
    if saved is not None:
        comparison.restore(saved["comparison"])
        meta.update(saved["meta"], load_start=meta["load_start"])
    done = comparison.rounds_done()
    target = opts.ci_target / 100 if opts.ci_target is not None else None
    last = opts.max_rounds if target is not None else opts.rounds
    how = f"{opts.turns} turns in one launch" if pairing == IN_LAUNCH else "a launch each"
    print(
        f"# ccbench compare: A = {a.text()}; B = {b.text()}; {opts.ranks} ranks, "
        f"{opts.rounds} rounds ({how}), statistic {opts.statistic}, timer {opts.timer}, "
        f"load {meta['load_start']}",
        flush=True,
    )
    if done:
        print(f"# resuming: {done} round(s) already measured ({saved_at})", flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="ccbench-compare-") as tmp:
            for side in (a, b):
                if side.rev:
                    side.import_root = materialize(side.rev, Path(tmp) / side.label)
            from ccbench.benchmarks.progress import progress_bar

            with progress_bar(last, "compare", unit="round", initial=done) as bar:
                # the first --rounds always; then, with a target, until every interval
                # meets it
                while done < opts.rounds or (done < last and comparison.widest() > target):
                    if pairing == IN_LAUNCH:
                        # odd rounds start with B: each side starts as many turns
                        first = "A" if done % 2 == 0 else "B"
                        comparison.add_paired(
                            launcher.run_paired(
                                a, b, common, opts.turns, Path(tmp) / "paired.json", env, first
                            )
                        )
                    else:
                        run_round([(comparison, common)], launcher, done, Path(tmp), env=env)
                    done += 1
                    checkpoint.save(
                        saved_at, identity, {"comparison": comparison.state(), "meta": meta}
                    )
                    bar.update(1)
    except KeyboardInterrupt:
        kept = f"; the {done} finished kept: run the same command to resume" if done else ""
        print(
            f"\nccbench compare: interrupted after {done} of {last} rounds{kept}",
            file=sys.stderr,
            flush=True,
        )
        return 130
    meta["load_end"] = round(os.getloadavg()[0], 2)
    turns = opts.turns if pairing == IN_LAUNCH else 1
    meta["ci_target_pct"] = opts.ci_target
    rows = result_rows(comparison, done, meta, turns)
    print_table(rows)
    failed = [r for r in rows if r["validation"].startswith("Fail")]
    print(
        f"# B/A < 1: B is faster. {time.monotonic() - started:.0f} s, load "
        f"{meta['load_start']} -> {meta['load_end']}",
        flush=True,
    )
    if opts.csv:
        append_rows(opts.csv, rows, COLUMNS)
        write_sidecar(
            opts.csv,
            meta["compare_id"],
            {
                "a": a.text(),
                "b": b.text(),
                "common": common,
                "rounds": done,
                "ranks": opts.ranks,
                "cluster": opts.cluster,
                "statistic": opts.statistic,
                "pairing": pairing,
                "turns": turns,
                "timer": opts.timer,
                "times": {f"{size}|{config}": v for (size, config), v in comparison.times.items()},
                "turn_times": {
                    f"{size}|{config}": v for (size, config), v in comparison.turns.items()
                },
            },
        )
    checkpoint.clear(saved_at)
    if failed:
        print(
            f"ccbench compare: validation failed at {len(failed)} of {len(rows)} points "
            "(the validation column names the side)",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


def git_sha() -> str:
    from ccbench.benchmarks.environment import git_sha as sha

    return sha()


def write_sidecar(csv: str, compare_id: str, record: dict) -> None:
    """`<csv>.json`: every comparison's per-round times, keyed by its id (as the harness
    keys its runs, so a sweep sees the comparison finished)."""
    Sidecar(csv).add(compare_id, record)


if __name__ == "__main__":  # errors as one line, as `ccbench compare` gives
    from ccbench.scripts.cli import main as ccbench

    raise SystemExit(ccbench(["compare", *sys.argv[1:]]))
