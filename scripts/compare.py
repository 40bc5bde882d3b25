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
fixes (a side was seen 2x slower in every turn of one launch only) differs from launch
to launch, so a round is a launch, and the interval is taken across rounds.
`--separate-launches` gives each side a launch of its own in every round instead, in
the order A B, B A, ..., as revisions (`--a-rev` / `--b-rev`: a side from a git
revision, with the same command if B is left out), training and merged_gradient always
have.

Per size, each round gives one time per side (the launch's `--statistic`, default the
mean over calls; over a round's turns, their geometric mean); the ratio B/A is the
geometric mean of the per-round ratios, its interval the t interval of the mean log
ratio over rounds (benchmarks/statistics.py). The verdict: B is faster when the whole
interval lies below 1/(1+margin), slower when it lies above 1+margin, and otherwise no
difference this run can show.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ccbench.benchmarks.options import split_common
from ccbench.benchmarks.results import (
    COMPARE,
    HARNESS,
    SCHEMA,
    SETTING,
    Sidecar,
    append_rows,
    check_header,
    new_run_id,
    read_rows,
)
from ccbench.benchmarks.statistics import DEFAULT_MARGIN, Ratio, ratio_interval
from ccbench.kernels.errors import UsageError
from ccbench.scripts import checkpoint
from ccbench.scripts.launch import (
    binding_enabled,
    mpiexec_command,
    refuse_inside_mpi_launch,
    run_captured,
)

REPO = Path(__file__).resolve().parent.parent
ROOMS = ("kernels", "collectives", "training", "benchmarks", "plots", "scripts")
STATISTICS = {"avg": "avg_us", "fastest": "fastest_us", "p50": "p50_us"}

COLUMNS = COMPARE.names
TIMERS = ("auto", "python")  # --timer: auto pairs like with like, python forces Python's loop
IN_LAUNCH, LAUNCHES = "in-launch", "launches"  # the pairing column


# ----------------------------------------------------------------------------- sides


@dataclass
class Side:
    """One side of a comparison: a variant command and the code it runs."""

    label: str  # "A" or "B"
    command: list[str]  # variant name and its options
    rev: str | None = None  # git revision; None: this installation
    import_root: Path | None = None  # the revision's code, importable as ccbench

    @property
    def variant(self) -> str:
        return self.command[0]

    def text(self) -> str:
        return shlex.join(self.command) + (f" @ {self.rev}" if self.rev else "")


def parse_side(label: str, text: str) -> list[str]:
    words = shlex.split(text)
    if not words:
        raise UsageError(f"{label}: give a variant and its options, e.g. \"baseline "
                         "--algorithm ring\"")
    from ccbench.scripts.cli import VARIANTS

    if words[0] not in VARIANTS:
        raise UsageError(f"{label}: unknown variant {words[0]!r} (variants: "
                         f"{', '.join(VARIANTS)})")
    for reserved in ("--csv", "--json", "-m", "--message-size"):
        if reserved in words:
            raise UsageError(f"{label}: {reserved} is set by ccbench compare for both sides")
    return words


def materialize(rev: str, into: Path, repo: Path = REPO) -> Path:
    """The code of git revision `rev` of `repo` under `into`, importable as ccbench
    (put the returned folder on PYTHONPATH)."""
    source = into / "src"
    source.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", rev],
                             capture_output=True)
    if archive.returncode != 0:
        raise UsageError(f"git revision {rev!r}: "
                         f"{archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    build_extensions(source, rev)
    return link_rooms(source, into / "import")


def build_extensions(source: Path, rev: str) -> None:
    """Compile a revision's C extensions (the codecs' fused kernels) in place, as its
    install would: without them its codecs would run slower kernels than the installed
    tree's, and a comparison would measure that instead."""
    pyproject = source / "pyproject.toml"
    if not pyproject.exists() or "ext-modules" not in pyproject.read_text():
        return
    proc = subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()",
                           "build_ext", "--inplace"], cwd=source, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)
    built = any(source.glob("*/*.so")) or any(source.glob("*/*.pyd"))
    if proc.returncode != 0 or not built:  # optional extensions fail with a warning only
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"ccbench: warning: revision {rev}: its C extensions did not build ({last}); "
              "its codecs run their array-API kernels", file=sys.stderr)


def link_rooms(source: Path, root: Path) -> Path:
    """A folder where `ccbench.<room>` is `source/<room>`: the layout an install maps."""
    package = root / "ccbench"
    package.mkdir(parents=True)
    for room in ROOMS:
        if (source / room).is_dir():
            (package / room).symlink_to((source / room).resolve())
    return root


# ----------------------------------------------------------------------------- launching


@dataclass
class Launcher:
    ranks: int
    cluster: str | None = None
    bind: bool = True
    timeout: float = 1800.0

    def command(self, side: Side, common: list[str], csv: Path) -> list[str]:
        return self.launch([sys.executable, "-m", f"ccbench.benchmarks.{side.variant}",
                            *side.command[1:], *common, "--csv", str(csv)])

    def launch(self, program: list[str]) -> list[str]:
        """`program` on this launcher's ranks: in the emulated cluster, or mpiexec."""
        if self.cluster:
            unbound = [] if self.bind else ["--no-bind"]
            return [sys.executable, "-m", "ccbench.scripts.cluster", "run", "--name",
                    self.cluster, "-n", str(self.ranks), *unbound, "--", *program]
        return mpiexec_command(self.ranks, program, bind=self.bind)

    def run(self, side: Side, common: list[str], csv: Path,
            env: dict | None = None) -> list[dict]:
        env = {**os.environ, **(env or {})}
        if side.import_root is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(side.import_root), env.get("PYTHONPATH")) if p)
            env["CCBENCH_GIT_SHA"] = side.rev or ""
        proc = self._run(self.command(side, common, csv), env, f"{side.label} ({side.text()})")
        if proc.returncode not in (0, 1):  # 1: a validation failure, still timed
            tail = (proc.stderr or proc.stdout).strip().splitlines()
            raise UsageError(f"{side.label} ({side.text()}) failed with status "
                             f"{proc.returncode}: {tail[-1] if tail else 'no output'}")
        rows = read_rows(csv)[1] if csv.exists() else []
        csv.unlink(missing_ok=True)
        Path(f"{csv}.json").unlink(missing_ok=True)
        if not rows:
            raise UsageError(f"{side.label} ({side.text()}) wrote no results")
        return rows

    def run_paired(self, a: Side, b: Side, common: list[str], turns: int, out: Path,
                   env: dict | None = None, first: str = "A") -> dict:
        """Both sides in one launch (benchmarks/paired.py), `first` starting the first
        turn; its per-round record."""
        program = [sys.executable, "-m", "ccbench.benchmarks.paired", "--a",
                   shlex.join(a.command), "--b", shlex.join(b.command), "--turns",
                   str(turns), "--first", first, "--json", str(out), "--", *common]
        out.unlink(missing_ok=True)
        proc = self._run(self.launch(program), {**os.environ, **(env or {})},
                         "A and B in one launch")
        if proc.returncode not in (0, 1):  # 1: a validation failure, still timed
            tail = (proc.stderr or proc.stdout).strip().splitlines()
            raise UsageError(f"A and B in one launch failed with status "
                             f"{proc.returncode}: {tail[-1] if tail else 'no output'}")
        if not out.exists():
            raise UsageError("A and B in one launch wrote no results")
        return json.loads(out.read_text())

    def _run(self, command: list[str], env: dict, what: str):
        try:
            return run_captured(command, env, self.timeout)
        except subprocess.TimeoutExpired:
            raise UsageError(f"{what} took longer than {self.timeout:g} s (--timeout); "
                             "stopped") from None


# ----------------------------------------------------------------------------- rounds


# Benchmarks without message sizes: which rows they compare on, and their time per point.
# training: the summary row's mean step time over the timed steps; merged_gradient: each
# strategy's measured iteration time.
UNSIZED = {
    "training": (lambda r: r.get("row") == "summary", lambda r: "step", "step_us", "steps"),
    "merged_gradient": (lambda r: bool(r.get("measured_us")),
                        lambda r: f"strategy={r['strategy']}", "measured_us", "iterations"),
}


def unsized_points(variant: str, rows: list[dict]) -> list[tuple[tuple[int, str], float, int]]:
    """(point, time in us, iterations) of an unsized benchmark's rows."""
    keep, name, column, count = UNSIZED[variant]
    out = []
    for row in filter(keep, rows):
        value = float(row[column]) if row.get(column) not in ("", None) else math.nan
        out.append(((0, name(row)), value, int(row.get(count) or 0)))
    if not out:
        raise UsageError(f"{variant} wrote no rows to compare")
    return out


def point_of(row: dict, config_columns: list[str]) -> tuple[int, str]:
    """A row's point: its size and its configuration (density, ...) as text."""
    config = ",".join(f"{c}={row[c]}" for c in config_columns if row.get(c, "") != "")
    return int(row["size_bytes"]), config


def config_columns(rows: list[dict]) -> list[str]:
    """Settings columns a variant adds that vary within one launch (sweep axes)."""
    extra = [c for c in HARNESS.extras(rows[0]) if HARNESS.role(c) == SETTING]
    return [c for c in extra if len({r.get(c) for r in rows}) > 1]


@dataclass
class Comparison:
    a: Side
    b: Side
    statistic: str
    margin: float
    pairing: str = LAUNCHES
    times: dict = field(default_factory=dict)  # point -> {"A": [...], "B": [...]}, a round each
    turns: dict = field(default_factory=dict)  # in-launch: point -> side -> rounds' turns
    iterations: dict = field(default_factory=dict)  # point -> {"A": n, "B": n}
    info: dict = field(default_factory=dict)  # collective, ranks, link_gbps from rows
    timers: dict = field(default_factory=dict)  # point -> {"A": "c"|"python", "B": ...}
    failed: dict = field(default_factory=dict)  # point -> sides that failed validation (-c)
    validated: bool = False  # some side ran its -c pass

    def add(self, side: Side, rows: list[dict]) -> None:
        if side.variant in UNSIZED:
            measured = unsized_points(side.variant, rows)
            checks = {point: row.get("validation", "") for (point, _, _), row
                      in zip(measured, filter(UNSIZED[side.variant][0], rows), strict=True)}
            timers = dict.fromkeys(checks, "")
        else:
            columns = config_columns(rows)
            column = STATISTICS[self.statistic]
            measured = [(point_of(row, columns),
                         float(row[column]) if row.get(column) not in ("", None) else math.nan,
                         int(row["iterations"])) for row in rows]
            checks = {point_of(row, columns): row.get("validation", "") for row in rows}
            timers = {point_of(row, columns): row.get("timer", "") for row in rows}
        for point, value, iterations in measured:
            self.times.setdefault(point, {"A": [], "B": []})[side.label].append(value)
            self.iterations.setdefault(point, {})[side.label] = iterations
            self._check_timer(point, side.label, timers.get(point, ""))
            self._record_check(point, side.label, checks.get(point, ""))
        first = rows[0]
        self.info = {"collective": first.get("collective", ""), "ranks": first.get("ranks"),
                     "link_gbps": first.get("link_gbps", "")}

    def add_paired(self, record: dict) -> None:
        """One round from a launch of both sides: per side, the geometric mean over its
        turns (whose log ratio is the mean of the turns' log ratios)."""
        column = STATISTICS[self.statistic]
        for point in record["points"].values():
            config = ",".join(f"{k}={v}" for k, v in point["config"].items())
            key = (int(point["size_bytes"]), config)
            turns = self.turns.setdefault(key, {"A": [], "B": []})
            slot = self.times.setdefault(key, {"A": [], "B": []})
            for s in ("A", "B"):
                values = [math.nan if v is None else float(v)
                          for v in point["times"][s][column]]
                turns[s].append(values)
                slot[s].append(float(np.exp(np.mean(np.log(values))))
                               if all(v > 0 for v in values) else math.nan)
                self._check_timer(key, s, point.get("timers", {}).get(s, ""))
                self._record_check(key, s, point.get("validation", {}).get(s) or "")
            self.iterations[key] = dict(point["iterations"])
        self.info = {"collective": record["collective"], "ranks": record["ranks"],
                     "link_gbps": record.get("link_gbps") or ""}

    def _check_timer(self, point, label: str, timer: str) -> None:
        """Refuse to pair times taken by different loops (C and Python): not like with like."""
        seen = self.timers.setdefault(point, {})
        if timer:
            seen.setdefault(label, timer)
        known = {v for v in seen.values() if v}
        if len(known) > 1:
            size, config = point
            where = f"{size} B" + (f" ({config})" if config else "")
            raise UsageError(
                f"at {where}, A was timed by the {seen.get('A')} loop and B by the "
                f"{seen.get('B')} loop: not like with like; add --timer python to time both "
                "sides by the Python loop")

    def _record_check(self, point, label: str, validation: str) -> None:
        if validation:
            self.validated = True
        if validation == "Fail":
            failed = self.failed.setdefault(point, [])
            if label not in failed:
                failed.append(label)

    def timer(self, point) -> str:
        return next((t for t in self.timers.get(point, {}).values() if t), "")

    def validation(self, point) -> str:
        """'' (no -c), 'Pass', or 'Fail: A', 'Fail: B', 'Fail: A, B'."""
        failed = sorted(self.failed.get(point, []))
        if failed:
            return "Fail: " + ", ".join(failed)
        return "Pass" if self.validated else ""

    def state(self) -> dict:
        """What the finished rounds measured, as JSON (a checkpoint)."""
        def keyed(mapping):
            return [[list(point), value] for point, value in mapping.items()]

        return {"times": keyed(self.times), "turns": keyed(self.turns),
                "iterations": keyed(self.iterations), "info": self.info,
                "timers": keyed(self.timers), "failed": keyed(self.failed),
                "validated": self.validated}

    def restore(self, state: dict) -> None:
        def unkeyed(items):
            return {(int(p[0]), str(p[1])): value for p, value in items}

        self.times, self.turns = unkeyed(state["times"]), unkeyed(state["turns"])
        self.iterations, self.timers = unkeyed(state["iterations"]), unkeyed(state["timers"])
        self.failed, self.info = unkeyed(state["failed"]), dict(state["info"])
        self.validated = bool(state["validated"])

    def rounds_done(self) -> int:
        return max((len(v["A"]) for v in self.times.values()), default=0)

    def points(self) -> list[tuple]:
        """Points both sides measured in every round, in size order."""
        rounds = self.rounds_done()
        return sorted(p for p, v in self.times.items()
                      if len(v["A"]) == len(v["B"]) == rounds and rounds > 0)

    def widest(self) -> float:
        """The largest relative half-width of any point's ratio interval: sqrt(high/low)
        - 1, as the interval is symmetric in log(B/A); inf where there is none yet."""
        widths = []
        for point in self.points() or [None]:
            r = self.ratio(point) if point is not None else None
            ok = r is not None and math.isfinite(r.low) and math.isfinite(r.high)
            widths.append(math.sqrt(r.high / r.low) - 1 if ok else math.inf)
        return max(widths)

    def ratio(self, point) -> Ratio | None:
        a, b = (np.array(self.times[point][s]) for s in ("A", "B"))
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))
                and np.all(a > 0) and np.all(b > 0)):
            return None
        return ratio_interval(a, b)


def run_round(jobs: list[tuple[Comparison, list[str]]], launcher: Launcher, k: int,
              workdir: Path, progress=None, env: dict | None = None) -> None:
    """Round k of every comparison, each side a launch: A B (k even) or B A (k odd)."""
    for index, (comparison, common) in enumerate(jobs):
        order = (comparison.a, comparison.b) if k % 2 == 0 else (comparison.b, comparison.a)
        for side in order:
            csv = workdir / f"job{index}-round{k}-{side.label}.csv"
            comparison.add(side, launcher.run(side, common, csv, env))
            if progress is not None:
                progress.update(1)


def run_rounds(jobs: list[tuple[Comparison, list[str]]], launcher: Launcher, rounds: int,
               workdir: Path, progress=None, first: int = 0, after_round=None) -> None:
    """Interleave every comparison's sides: all comparisons take their round k before any
    takes round k + 1. Rounds `first`..`rounds`-1; `after_round(k)` after each."""
    for k in range(first, rounds):
        run_round(jobs, launcher, k, workdir, progress)
        if after_round is not None:
            after_round(k)


# ----------------------------------------------------------------------------- output


def result_rows(comparison: Comparison, rounds: int, meta: dict, turns: int = 1) -> list[dict]:
    rows = []
    for point in comparison.points():
        size, config = point
        r = comparison.ratio(point)
        a, b = comparison.times[point]["A"], comparison.times[point]["B"]
        rows.append({
            **meta, "a": comparison.a.text(), "b": comparison.b.text(),
            "a_rev": comparison.a.rev or "", "b_rev": comparison.b.rev or "",
            "collective": comparison.info.get("collective"),
            "ranks": comparison.info.get("ranks"), "size_bytes": size, "config": config,
            "statistic": comparison.statistic, "rounds": rounds,
            "a_us": float(np.exp(np.mean(np.log(a)))) if r else None,
            "b_us": float(np.exp(np.mean(np.log(b)))) if r else None,
            "ratio": r.ratio if r else None, "ratio_low": r.low if r else None,
            "ratio_high": r.high if r else None, "margin": comparison.margin,
            "verdict": r.verdict(comparison.margin) if r else "not measured",
            "a_iterations": comparison.iterations[point].get("A"),
            "b_iterations": comparison.iterations[point].get("B"),
            "link_gbps": comparison.info.get("link_gbps"), "pairing": comparison.pairing,
            "turns": turns, "ci_target_pct": meta.get("ci_target_pct"),
            "timer": comparison.timer(point), "validation": comparison.validation(point),
        })  # fmt: skip
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'# Size':<10}{'config':>14}{'A (us)':>14}{'B (us)':>14}{'B/A':>9}"
          f"{'CI95 low':>10}{'CI95 high':>10}  verdict")
    def num(r, key, spec, width):
        value = r[key]
        return f"{value:>{width}{spec}}" if value is not None else f"{'-':>{width}}"

    for r in rows:
        failed = r.get("validation", "").startswith("Fail")
        print(f"{r['size_bytes']:<10d}{r['config'] or '-':>14}{num(r, 'a_us', '.2f', 14)}"
              f"{num(r, 'b_us', '.2f', 14)}{num(r, 'ratio', '.3f', 9)}"
              f"{num(r, 'ratio_low', '.3f', 10)}{num(r, 'ratio_high', '.3f', 10)}"
              f"  {r['verdict']}" + (f"  (validation {r['validation']})" if failed else ""),
              flush=True)


def run_meta() -> dict:
    now = datetime.datetime.now(datetime.timezone.utc)
    return {SCHEMA: COMPARE.tag, "compare_id": new_run_id(now),
            "timestamp": now.isoformat(timespec="seconds"),
            "load_start": round(os.getloadavg()[0], 2),
            "hostname": os.uname().nodename, "git_sha": git_sha()}


# ----------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ccbench compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", help='side A: "VARIANT [OPTIONS]"')
    p.add_argument("b", nargs="?", help='side B (default: A\'s command, with --a-rev/--b-rev)')
    p.add_argument("--a-rev", metavar="REV", help="run A from this git revision")
    p.add_argument("--b-rev", metavar="REV", help="run B from this git revision")
    p.add_argument("-n", "--ranks", type=int, default=2, help="MPI ranks (default 2)")
    p.add_argument("--rounds", type=int, default=6,
                   help="rounds of A and B, a launch each (default 6); the interval is "
                        "taken across rounds")
    p.add_argument("--ci-target", type=float, metavar="PCT",
                   help="after --rounds, add rounds until every size's ratio interval is "
                        "within +-PCT percent, or --max-rounds are done")
    p.add_argument("--max-rounds", type=int, default=12,
                   help="rounds at most with --ci-target (default 12)")
    p.add_argument("--turns", type=int, default=8,
                   help="turns of A and B within each round's launch (default 8; "
                        "even, so each side goes first as often)")
    p.add_argument("-m", "--message-size", default="64K:1M",
                   help="sizes for both sides, as the variants' -m (default 64K:1M)")
    p.add_argument("--statistic", choices=tuple(STATISTICS), default="avg",
                   help="what each round contributes: avg (mean over calls, default), "
                        "fastest (the fastest call), p50")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                   help=f"ratios within 1+-margin count as no difference "
                        f"(default {DEFAULT_MARGIN})")
    p.add_argument("--cluster", metavar="NAME",
                   help="run both sides inside this emulated cluster (ccbench cluster up)")
    p.add_argument("--no-bind", action="store_true", help="leave ranks unbound")
    p.add_argument("--separate-launches", action="store_true",
                   help="a launch per side and round, even where both sides could share "
                        "one (revisions, training and merged_gradient always do)")
    p.add_argument("--csv", metavar="PATH", help="append one row per size to this CSV")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds one launch may take (default 1800)")
    p.add_argument("--timer", choices=TIMERS, default="auto",
                   help="auto (default): in one launch, both sides by the C loop where both "
                        "are the MPI library's own collectives, else both by the Python "
                        "loop; in separate launches, each side's own choice, refused when "
                        "they differ. python: both sides by the Python loop")
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
        raise UsageError("compare a benchmark with message sizes to one with sizes, and "
                         "training or merged_gradient to one of the two")
    if True not in unsized:
        common = [*common, "-m", opts.message_size]
    launcher = Launcher(opts.ranks, opts.cluster, binding_enabled(False if opts.no_bind
                                                                   else None), opts.timeout)
    pairing = LAUNCHES if (opts.separate_launches or a.rev or b.rev or True in unsized) \
        else IN_LAUNCH
    comparison = Comparison(a, b, opts.statistic, opts.margin, pairing)
    env = {"CCBENCH_TIMER": "python"} if opts.timer == "python" else {}
    meta = run_meta()
    meta["sweep_id"] = os.environ.get("CCBENCH_SWEEP_ID", "")
    started = time.monotonic()
    identity = {"a": a.command, "b": b.command, "common": common, "ranks": opts.ranks,
                "cluster": opts.cluster, "bind": launcher.bind, "pairing": pairing,
                "turns": opts.turns, "statistic": opts.statistic, "timer": opts.timer,
                "a_rev": resolve_rev(a.rev), "b_rev": resolve_rev(b.rev),
                "sweep_id": meta["sweep_id"], "code": git_sha(),
                "edits": checkpoint.working_tree_digest(REPO)}
    saved_at = checkpoint.checkpoint_path("compare", identity)
    saved = checkpoint.load(saved_at, identity)
    if saved is not None:
        comparison.restore(saved["comparison"])
        meta.update(saved["meta"], load_start=meta["load_start"])
    done = comparison.rounds_done()
    target = opts.ci_target / 100 if opts.ci_target is not None else None
    last = opts.max_rounds if target is not None else opts.rounds
    how = f"{opts.turns} turns in one launch" if pairing == IN_LAUNCH else "a launch each"
    print(f"# ccbench compare: A = {a.text()}; B = {b.text()}; {opts.ranks} ranks, "
          f"{opts.rounds} rounds ({how}), statistic {opts.statistic}, timer {opts.timer}, "
          f"load {meta['load_start']}", flush=True)
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
                        comparison.add_paired(launcher.run_paired(
                            a, b, common, opts.turns, Path(tmp) / "paired.json", env, first))
                    else:
                        run_round([(comparison, common)], launcher, done, Path(tmp),
                                  env=env)
                    done += 1
                    checkpoint.save(saved_at, identity,
                                    {"comparison": comparison.state(), "meta": meta})
                    bar.update(1)
    except KeyboardInterrupt:
        kept = f"; the {done} finished kept: run the same command to resume" if done else ""
        print(f"\nccbench compare: interrupted after {done} of {last} rounds{kept}",
              file=sys.stderr, flush=True)
        return 130
    meta["load_end"] = round(os.getloadavg()[0], 2)
    turns = opts.turns if pairing == IN_LAUNCH else 1
    meta["ci_target_pct"] = opts.ci_target
    rows = result_rows(comparison, done, meta, turns)
    print_table(rows)
    failed = [r for r in rows if r["validation"].startswith("Fail")]
    print(f"# B/A < 1: B is faster. {time.monotonic() - started:.0f} s, load "
          f"{meta['load_start']} -> {meta['load_end']}", flush=True)
    if opts.csv:
        append_rows(opts.csv, rows, COLUMNS)
        write_sidecar(opts.csv, meta["compare_id"], {
            "a": a.text(), "b": b.text(), "common": common, "rounds": done,
            "ranks": opts.ranks, "cluster": opts.cluster, "statistic": opts.statistic,
            "pairing": pairing, "turns": turns, "timer": opts.timer,
            "times": {f"{size}|{config}": v for (size, config), v in comparison.times.items()},
            "turn_times": {f"{size}|{config}": v
                           for (size, config), v in comparison.turns.items()},
        })
    checkpoint.clear(saved_at)
    if failed:
        print(f"ccbench compare: validation failed at {len(failed)} of {len(rows)} points "
              "(the validation column names the side)", file=sys.stderr, flush=True)
        return 1
    return 0


def resolve_rev(rev: str | None, repo: Path = REPO) -> str:
    """The commit a revision names ('' for this installation), so that a checkpoint of
    `HEAD~1` is not resumed after HEAD moved."""
    if not rev:
        return ""
    proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet",
                           f"{rev}^{{commit}}"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UsageError(f"git revision {rev!r} not found")
    return proc.stdout.strip()


def git_sha() -> str:
    from ccbench.benchmarks.environment import git_sha as sha

    return sha()


def write_sidecar(csv: str, compare_id: str, record: dict) -> None:
    """`<csv>.json`: every comparison's per-round times, keyed by its id (as the harness
    keys its runs, so a sweep sees the comparison finished)."""
    Sidecar(csv).add(compare_id, record)


def entry(argv: list[str]) -> int:
    """`python -m ccbench.scripts.compare`: errors as one line, as `ccbench compare` gives."""
    try:
        return main(argv)
    except UsageError as exc:
        print(f"ccbench compare: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(entry(sys.argv[1:]))
