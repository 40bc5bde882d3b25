"""A comparison of two benchmarks in rounds: the sides, their times per point and round,
the ratio B/A with its interval and verdict (benchmarks/statistics.py), the rows.

A point is a size and a configuration (density, ...) within one launch of a side
(`results.point_key`); each round gives one time per side and point: the launch's
statistic (mean, fastest or median call) or, over the turns of an in-launch round, their
geometric mean. The interval is taken across rounds.
"""

from __future__ import annotations

import datetime
import math
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ccbench.benchmarks.results import COMPARE, HARNESS, SCHEMA, SETTING, new_run_id
from ccbench.benchmarks.statistics import Ratio, ratio_interval
from ccbench.kernels import variants
from ccbench.kernels.errors import UsageError

STATISTICS = {"avg": "avg_us", "fastest": "fastest_us", "p50": "p50_us"}
COLUMNS = COMPARE.names
IN_LAUNCH, LAUNCHES = "in-launch", "launches"  # the pairing column


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
        raise UsageError(
            f'{label}: give a variant and its options, e.g. "baseline --algorithm ring"'
        )
    from ccbench.scripts.cli import VARIANTS

    if words[0] not in VARIANTS:
        raise UsageError(f"{label}: unknown variant {words[0]!r} (variants: {', '.join(VARIANTS)})")
    for reserved in ("--csv", "--json", "-m", "--message-size"):
        if reserved in words:
            raise UsageError(f"{label}: {reserved} is set by ccbench compare for both sides")
    return words


# Benchmarks without message sizes: which rows they compare on, and their time per point.
# training and trace_replay: the summary row's mean step time over the timed steps (so a
# replay compares with the real steps it replays, and a replay with another);
# merged_gradient: each strategy's measured iteration time.
# By the kind of rows they write (the registry of variants says whose).
UNSIZED_READINGS = {
    "training": (lambda r: r.get("row") == "summary", lambda r: "step", "step_us", "steps"),
    "replay": (lambda r: r.get("row") == "summary", lambda r: "step", "step_us", "steps"),
    "mgwfbp": (
        lambda r: bool(r.get("measured_us")),
        lambda r: f"strategy={r['strategy']}",
        "measured_us",
        "iterations",
    ),
}
UNSIZED = {name: UNSIZED_READINGS[variants.rows_kind(name)] for name in variants.UNSIZED}


# One-process benchmarks that report rates: codec_throughput's best round per step, as a
# time per call of the measured size; a point per codec, kernel path, data kind and step.
RATED = {"codec_throughput": ("encode", "decode", "hop")}


def rated_points(variant: str, rows: list[dict]) -> list[tuple[tuple[int, str], float, int]]:
    """(point, time in us, rounds) of a rated benchmark's rows."""
    out = []
    for row in rows:
        size = int(row["size_bytes"])
        where = f"codec={row['codec']},kernels={row['kernels']},data={row['data']}"
        for step in RATED[variant]:
            text = row.get(f"{step}_gbps")
            gbps = float(text) if text not in ("", None) else math.nan
            us = size / (gbps * 1e3) if gbps > 0 else math.nan  # NaN: no rate (hop range)
            out.append(((size, f"{where},step={step}"), us, int(row.get("repeats") or 0)))
    if not out:
        raise UsageError(f"{variant} wrote no rows to compare")
    return out


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
    barriers: dict = field(default_factory=dict)  # point -> {"A": "blocking"|"yielding", ...}
    failed: dict = field(default_factory=dict)  # point -> sides that failed validation (-c)
    validated: bool = False  # some side ran its -c pass

    def add(self, side: Side, rows: list[dict]) -> None:
        if side.variant in UNSIZED:
            measured = unsized_points(side.variant, rows)
            checks = {
                point: row.get("validation", "")
                for (point, _, _), row in zip(
                    measured, filter(UNSIZED[side.variant][0], rows), strict=True
                )
            }
            timers = barriers = dict.fromkeys(checks, "")
        elif side.variant in RATED:
            measured = rated_points(side.variant, rows)
            checks = timers = barriers = {}
        else:
            columns = config_columns(rows)
            column = STATISTICS[self.statistic]
            measured = [
                (
                    point_of(row, columns),
                    float(row[column]) if row.get(column) not in ("", None) else math.nan,
                    int(row["iterations"]),
                )
                for row in rows
            ]
            checks = {point_of(row, columns): row.get("validation", "") for row in rows}
            timers = {point_of(row, columns): row.get("timer", "") for row in rows}
            barriers = {point_of(row, columns): row.get("barrier", "") for row in rows}
        for point, value, iterations in measured:
            self.times.setdefault(point, {"A": [], "B": []})[side.label].append(value)
            self.iterations.setdefault(point, {})[side.label] = iterations
            self._check_timer(point, side.label, timers.get(point, ""))
            self._record_barrier(point, side.label, barriers.get(point, ""))
            self._record_check(point, side.label, checks.get(point, ""))
        first = rows[0]
        self.info = {
            "collective": first.get("collective", ""),
            "ranks": first.get("ranks"),
            "link_gbps": first.get("link_gbps", ""),
        }

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
                values = [math.nan if v is None else float(v) for v in point["times"][s][column]]
                turns[s].append(values)
                slot[s].append(
                    float(np.exp(np.mean(np.log(values))))
                    if all(v > 0 for v in values)
                    else math.nan
                )
                self._check_timer(key, s, point.get("timers", {}).get(s, ""))
                self._record_barrier(key, s, point.get("barriers", {}).get(s, ""))
                self._record_check(key, s, point.get("validation", {}).get(s) or "")
            self.iterations[key] = dict(point["iterations"])
        self.info = {
            "collective": record["collective"],
            "ranks": record["ranks"],
            "link_gbps": record.get("link_gbps") or "",
        }

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
                "sides by the Python loop"
            )

    def _record_barrier(self, point, label: str, barrier: str) -> None:
        """The barrier between a side's timed calls (a comparison of the two barriers,
        across revisions, has sides that differ: recorded, not refused)."""
        if barrier:
            self.barriers.setdefault(point, {}).setdefault(label, barrier)

    def barrier(self, point) -> str:
        """The barrier both sides timed behind, 'A: x, B: y' where they differ, '' where
        the rows do not say."""
        seen = self.barriers.get(point, {})
        if len(set(seen.values())) == 1 and len(seen) == 2:
            return next(iter(seen.values()))
        return ", ".join(f"{s}: {seen.get(s) or '?'}" for s in ("A", "B")) if seen else ""

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

        return {
            "times": keyed(self.times),
            "turns": keyed(self.turns),
            "iterations": keyed(self.iterations),
            "info": self.info,
            "timers": keyed(self.timers),
            "barriers": keyed(self.barriers),
            "failed": keyed(self.failed),
            "validated": self.validated,
        }

    def restore(self, state: dict) -> None:
        def unkeyed(items):
            return {(int(p[0]), str(p[1])): value for p, value in items}

        self.times, self.turns = unkeyed(state["times"]), unkeyed(state["turns"])
        self.iterations, self.timers = unkeyed(state["iterations"]), unkeyed(state["timers"])
        self.failed, self.info = unkeyed(state["failed"]), dict(state["info"])
        self.barriers = unkeyed(state.get("barriers", []))  # a checkpoint from before: none
        self.validated = bool(state["validated"])

    def rounds_done(self) -> int:
        return max((len(v["A"]) for v in self.times.values()), default=0)

    def points(self) -> list[tuple]:
        """Points both sides measured in every round, in size order."""
        rounds = self.rounds_done()
        return sorted(
            p for p, v in self.times.items() if len(v["A"]) == len(v["B"]) == rounds and rounds > 0
        )

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
        if not (
            np.all(np.isfinite(a)) and np.all(np.isfinite(b)) and np.all(a > 0) and np.all(b > 0)
        ):
            return None
        return ratio_interval(a, b)


def run_round(
    jobs: list[tuple[Comparison, list[str]]],
    launcher,
    k: int,
    workdir: Path,
    progress=None,
    env: dict | None = None,
) -> None:
    """Round k of every comparison, each side a launch: A B (k even) or B A (k odd)."""
    for index, (comparison, common) in enumerate(jobs):
        order = (comparison.a, comparison.b) if k % 2 == 0 else (comparison.b, comparison.a)
        for side in order:
            csv = workdir / f"job{index}-round{k}-{side.label}.csv"
            comparison.add(side, launcher.run(side, common, csv, env))
            if progress is not None:
                progress.update(1)


def run_rounds(
    jobs: list[tuple[Comparison, list[str]]],
    launcher,
    rounds: int,
    workdir: Path,
    progress=None,
    first: int = 0,
    after_round=None,
) -> None:
    """Interleave every comparison's sides: all comparisons take their round k before any
    takes round k + 1. Rounds `first`..`rounds`-1; `after_round(k)` after each."""
    for k in range(first, rounds):
        run_round(jobs, launcher, k, workdir, progress)
        if after_round is not None:
            after_round(k)


def result_rows(comparison: Comparison, rounds: int, meta: dict, turns: int = 1) -> list[dict]:
    rows = []
    for point in comparison.points():
        size, config = point
        r = comparison.ratio(point)
        a, b = comparison.times[point]["A"], comparison.times[point]["B"]
        rows.append(
            {
                **meta,
                "a": comparison.a.text(),
                "b": comparison.b.text(),
                "a_rev": comparison.a.rev or "",
                "b_rev": comparison.b.rev or "",
                "collective": comparison.info.get("collective"),
                "ranks": comparison.info.get("ranks"),
                "size_bytes": size,
                "config": config,
                "statistic": comparison.statistic,
                "rounds": rounds,
                "a_us": float(np.exp(np.mean(np.log(a)))) if r else None,
                "b_us": float(np.exp(np.mean(np.log(b)))) if r else None,
                "ratio": r.ratio if r else None,
                "ratio_low": r.low if r else None,
                "ratio_high": r.high if r else None,
                "margin": comparison.margin,
                "verdict": r.verdict(comparison.margin) if r else "not measured",
                "a_iterations": comparison.iterations[point].get("A"),
                "b_iterations": comparison.iterations[point].get("B"),
                "link_gbps": comparison.info.get("link_gbps"),
                "pairing": comparison.pairing,
                "turns": turns,
                "ci_target_pct": meta.get("ci_target_pct"),
                "timer": comparison.timer(point),
                "validation": comparison.validation(point),
                "barrier": comparison.barrier(point),
            }
        )
    return rows


def print_table(rows: list[dict]) -> None:
    print(
        f"{'# Size':<10}{'config':>14}{'A (us)':>14}{'B (us)':>14}{'B/A':>9}"
        f"{'CI95 low':>10}{'CI95 high':>10}  verdict"
    )

    def num(r, key, spec, width):
        value = r[key]
        return f"{value:>{width}{spec}}" if value is not None else f"{'-':>{width}}"

    for r in rows:
        failed = r.get("validation", "").startswith("Fail")
        print(
            f"{r['size_bytes']:<10d}{r['config'] or '-':>14}{num(r, 'a_us', '.2f', 14)}"
            f"{num(r, 'b_us', '.2f', 14)}{num(r, 'ratio', '.3f', 9)}"
            f"{num(r, 'ratio_low', '.3f', 10)}{num(r, 'ratio_high', '.3f', 10)}"
            f"  {r['verdict']}" + (f"  (validation {r['validation']})" if failed else ""),
            flush=True,
        )


def run_meta() -> dict:
    now = datetime.datetime.now(datetime.timezone.utc)
    return {
        SCHEMA: COMPARE.tag,
        "compare_id": new_run_id(now),
        "timestamp": now.isoformat(timespec="seconds"),
        "load_start": round(os.getloadavg()[0], 2),
        "hostname": os.uname().nodename,
        "git_sha": environment_git_sha(),
    }


def environment_git_sha() -> str:
    from ccbench.benchmarks.environment import git_sha

    return git_sha()
