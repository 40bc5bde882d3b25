"""`ccbench regress NEW --against REF`: the gate of exact metrics over two result sets.

Tolerances follow ReFrame's reference tuples: each metric has bounds (lower, upper) given
as fractions of the reference value (-0.1 = 10% below it; None = unbounded). Exact metrics
have (0, 0): validation, sizes, wire bytes, compression ratios; errors may grow by 25%.

Timings are not gated here by default: two runs on a shared host differ by more than any
useful bound, and `ccbench gate` compares timings the trustworthy way (interleaved rounds
against the merge base). `--tolerance time_vs_baseline=LO:HI` turns the old check on:
timings are never compared across machines: each point's time is divided by
the baseline's time (variant `baseline`, algorithm `mpi` unless told otherwise) for the same
collective, size, dtype, buffer, ranks and link *within its own result set* (median
per-call times where the rows have them, else means); the new ratio over the reference's,
median over the message sizes of a series, must stay within a wide bound. A slower
machine moves both times; a variant that becomes slower than the library moves its ratio.

Prints a table of what moved and exits 1 on a regression, 0 otherwise, 2 on bad input.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ccbench.benchmarks.results import HARNESS, csv_files, point_identity
from ccbench.kernels.errors import UsageError
from ccbench.scripts.sweeps.merge import merge_rows, schema_groups

# settings always named in a point's description; a variant's own only where they vary
SHOWN_COLUMNS = (
    "variant",
    "algorithm",
    "collective",
    "codec",
    "dtype",
    "buffer",
    "ranks",
    "nodes",
    "size_bytes",
    "link_gbps",
)


@dataclass(frozen=True)
class Tolerance:
    """Bounds around a reference value, as fractions of it; None means unbounded."""

    lower: float | None
    upper: float | None

    def bounds(self, ref: float) -> tuple[float, float]:
        lo = -math.inf if self.lower is None else ref * (1 + self.lower)
        hi = math.inf if self.upper is None else ref * (1 + self.upper)
        return min(lo, hi), max(lo, hi)

    def __str__(self) -> str:
        def pct(x):
            return "-" if x is None else f"{x:+.0%}"

        if self.lower == self.upper == 0:
            return "exact"
        if self.lower is None:
            return f"<= {pct(self.upper)}"
        if self.upper is None:
            return f">= {pct(self.lower)}"
        return f"{pct(self.lower)}..{pct(self.upper)}"


# Per-metric defaults. Sizes, wire bytes and ratios are deterministic: exact. Errors of lossy
# codecs are deterministic for seeded data too, but may move a little with a library version.
# Timings: ratio to the baseline in the same run, median over sizes, wide bound.
TOLERANCES = {
    "bytes_per_rank": Tolerance(0.0, 0.0),
    "total_bytes": Tolerance(0.0, 0.0),
    "wire_bytes_per_rank": Tolerance(0.0, 0.0),
    "compression_ratio": Tolerance(0.0, 0.0),
    "max_abs_err": Tolerance(None, 0.25),
    "max_rel_err": Tolerance(None, 0.25),
}
# Checked only when asked for with --tolerance time_vs_baseline=LO:HI.
OPTIONAL_TOLERANCES = {"time_vs_baseline": Tolerance(None, 1.0)}
# Timing moves inside the bound are noise; the table shows those larger than this.
TIMING_REPORT_THRESHOLD = 0.25
# Floating-point values written with repr() read back exactly; this only absorbs the last
# bit when a CSV went through another writer.
EXACT_RTOL = 1e-12


def load(paths) -> pd.DataFrame:
    """One result set: its micro-benchmark CSVs, checked and de-duplicated as `ccbench
    merge` does, as strings. Files of other kinds (merged_gradient, training) are not
    gated here."""
    files = schema_groups(csv_files(paths)).get(HARNESS.kind, [])
    if not files:
        raise UsageError(f"no micro-benchmark CSV files in {' '.join(map(str, paths))}")
    _, columns, rows, _ = merge_rows(files)
    return pd.DataFrame(rows, columns=columns).fillna("")


def describe_points(df: pd.DataFrame, keys: list[str]) -> pd.Series:
    """A short readable name per row: the non-empty key values; a variant's own columns
    only where they take more than one value in the comparison (density, not block size)."""
    shown = [c for c in keys if c not in ("buffer", "nodes")]
    parts = []
    for c in shown:
        col = df[c].astype(str)
        if c not in SHOWN_COLUMNS:
            varies = col.groupby(df["variant"]).transform("nunique") > 1
            col = col.where(varies, "")
        if c == "ranks":
            col = "r" + col
        elif c == "size_bytes":
            col = col.where(col == "", col + "B").where(col != "", "(all sizes)")
        elif c == "link_gbps":
            col = col.where(col == "", col + "Gb/s")
        elif c not in SHOWN_COLUMNS:
            col = col.where(col == "", c + "=" + col)
        parts.append(col)
    joined = parts[0].str.cat(parts[1:], sep=" ")
    return joined.str.replace(r"\s+", " ", regex=True).str.strip()


def _show(value) -> str:
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.4g}"
    return str(value)


def _finding(status, metric, point, ref, new, change, tol) -> dict:
    return {
        "status": status,
        "metric": metric,
        "point": point,
        "reference": _show(ref),
        "new": _show(new),
        "change": change,
        "bounds": str(tol) if tol is not None else "",
    }


def _change(ref: float, new: float) -> str:
    if ref == 0:
        return "" if new == 0 else "from 0"
    return f"{new / ref - 1:+.1%}"


def check_validation(both: pd.DataFrame) -> list[dict]:
    out = []
    columns = both["point"], both["validation_ref"], both["validation_new"]
    for point, ref, new in zip(*columns, strict=True):
        if new == "Fail":
            out.append(_finding("FAIL", "validation", point, ref, new, "failed", "exact"))
        elif ref and new != ref:
            out.append(_finding("FAIL", "validation", point, ref, new or "(not run)", "", "exact"))
        elif new != ref:
            out.append(_finding("ok", "validation", point, ref or "(not run)", new, "", "exact"))
    return out


def check_metric(both: pd.DataFrame, metric: str, tol: Tolerance) -> list[dict]:
    ref = pd.to_numeric(both[f"{metric}_ref"], errors="coerce")
    new = pd.to_numeric(both[f"{metric}_new"], errors="coerce")
    exact = tol.lower == tol.upper == 0
    out = []
    for point, r, n in zip(both["point"], ref, new, strict=True):
        if math.isnan(r) and math.isnan(n):
            continue
        if math.isnan(n):
            out.append(_finding("FAIL", metric, point, r, "(missing)", "", tol))
            continue
        if math.isnan(r):
            out.append(_finding("ok", metric, point, "(missing)", n, "new", tol))
            continue
        if exact:
            moved = not math.isclose(r, n, rel_tol=EXACT_RTOL, abs_tol=0.0)
            inside = not moved
        else:
            lo, hi = tol.bounds(r)
            moved = n != r
            inside = lo <= n <= hi
        if moved:
            status = "ok" if inside else "FAIL"
            out.append(_finding(status, metric, point, r, n, _change(r, n), tol))
    return out


def baseline_ratios(df: pd.DataFrame, baseline: tuple[str, str]) -> pd.DataFrame:
    """Rows of `df` (not the baseline itself) with `ratio` = time / the baseline's time for
    the same collective, size, dtype, buffer, ranks, nodes and link, in the same set.

    The time is the median per-call time (p50_us: robust to a rank being descheduled on a
    busy machine) where both rows have it, else the mean (avg_us; batch timing has no p50).
    """
    match = ["collective", "dtype", "buffer", "ranks", "nodes", "size_bytes", "link_gbps"]
    t = df.assign(
        avg=pd.to_numeric(df["avg_us"], errors="coerce"),
        p50=pd.to_numeric(df["p50_us"], errors="coerce"),
    )
    is_base = (t["variant"] == baseline[0]) & (t["algorithm"] == baseline[1])
    # the baseline's row each row is divided by (the rows are one per point already)
    base = t.loc[is_base, match + ["avg", "p50"]].drop_duplicates(match, keep="last")
    joined = t.loc[~is_base].merge(base, on=match, suffixes=("", "_base"))
    median = joined["p50"] / joined["p50_base"]
    joined["ratio"] = median.where(
        np.isfinite(median) & (median > 0), joined["avg"] / joined["avg_base"]
    )
    return joined[np.isfinite(joined["ratio"]) & (joined["ratio"] > 0)]


def check_timing(ref, new, keys, tol, baseline, show_all) -> list[dict]:
    """Per series, the median over sizes of (new ratio / reference ratio) against the
    bound; the median, not a mean, so one size hit by a noisy neighbour cannot fail it."""
    series = [k for k in keys if k != "size_bytes"]
    r = baseline_ratios(ref, baseline)[keys + ["ratio"]]
    n = baseline_ratios(new, baseline)[keys + ["ratio"]]
    both = r.merge(n, on=keys, suffixes=("_ref", "_new"))
    if both.empty:
        return []
    both["factor"] = both["ratio_new"] / both["ratio_ref"]
    cols = ["ratio_ref", "ratio_new", "factor"]
    groups = both.groupby(series, sort=True, dropna=False)[cols].median().reset_index()
    groups["point"] = describe_points(groups.assign(size_bytes=""), series + ["size_bytes"])
    out = []
    for point, ref_ratio, new_ratio, factor in zip(
        *(groups[c] for c in ["point", *cols]), strict=True
    ):
        lo, hi = tol.bounds(1.0)
        inside = lo <= factor <= hi
        if not inside or abs(factor - 1) >= TIMING_REPORT_THRESHOLD or show_all:
            status = (
                "FAIL" if not inside else ("info" if lo == -math.inf and hi == math.inf else "ok")
            )
            out.append(
                _finding(
                    status,
                    "time_vs_baseline",
                    point,
                    ref_ratio,
                    new_ratio,
                    f"{factor - 1:+.1%}",
                    tol,
                )
            )
    return out


def compare(
    ref: pd.DataFrame,
    new: pd.DataFrame,
    tolerances: dict[str, Tolerance],
    baseline=("baseline", "mpi"),
    allow_missing=False,
    show_all=False,
):
    """Findings (list of dicts) and a summary dict for two result sets."""
    columns = list(dict.fromkeys([*ref.columns, *new.columns]))
    ref = ref.reindex(columns=columns, fill_value="")
    new = new.reindex(columns=columns, fill_value="")
    keys = HARNESS.identity_columns(columns)
    # the one identity of a point (benchmarks/results.py), the same for both sets
    ref["_point"] = [point_identity(r, HARNESS, columns) for r in ref.to_dict("records")]
    new["_point"] = [point_identity(r, HARNESS, columns) for r in new.to_dict("records")]
    merged = ref.merge(
        new.drop(columns=keys), on="_point", how="outer", suffixes=("_ref", "_new"), indicator=True
    )
    # points only in NEW: their settings from NEW
    only_new = merged["_merge"] == "right_only"
    if only_new.any():
        settings = new.set_index("_point")[keys]
        merged.loc[only_new, keys] = settings.loc[merged.loc[only_new, "_point"]].to_numpy()
    # an outer merge orders keys as text; show sizes in numeric order
    merged["_size"] = pd.to_numeric(merged["size_bytes"], errors="coerce")
    merged = merged.sort_values([k for k in keys if k != "size_bytes"] + ["_size"], kind="stable")
    merged["point"] = describe_points(merged, keys)
    both = merged[merged["_merge"] == "both"]
    findings: list[dict] = []
    for point in merged.loc[merged["_merge"] == "left_only", "point"]:
        status = "ok" if allow_missing else "FAIL"
        findings.append(_finding(status, "point", point, "present", "(missing)", "", None))
    findings += check_validation(both)
    for metric, tol in tolerances.items():
        if metric != "time_vs_baseline" and f"{metric}_ref" in both:
            findings += check_metric(both, metric, tol)
    if "time_vs_baseline" in tolerances:
        findings += check_timing(ref, new, keys, tolerances["time_vs_baseline"], baseline, show_all)
    summary = {
        "compared": len(both),
        "missing": int((merged["_merge"] == "left_only").sum()),
        "new_points": int((merged["_merge"] == "right_only").sum()),
        "moved": len(findings),
        "regressions": sum(f["status"] == "FAIL" for f in findings),
    }
    return findings, summary


def format_table(findings: list[dict]) -> str:
    """Aligned text: names left, numbers right."""
    columns = list(findings[0])
    numeric = {"reference", "new", "change"}
    widths = {c: max(len(c), *(len(str(f[c])) for f in findings)) for c in columns}

    def cell(values, c):
        text = str(values[c])
        return text.rjust(widths[c]) if c in numeric else text.ljust(widths[c])

    def line(values):
        return "  ".join(cell(values, c) for c in columns).rstrip()

    return "\n".join([line({c: c for c in columns}), *map(line, findings)])


def parse_tolerance(text: str) -> tuple[str, Tolerance]:
    """'metric=LOWER:UPPER' with fractions, an empty side unbounded: 'max_rel_err=:0.5'."""
    metric, sep, rng = text.partition("=")
    lo, sep2, hi = rng.partition(":")
    if not sep or not sep2 or metric not in {**TOLERANCES, **OPTIONAL_TOLERANCES}:
        raise UsageError(
            f"--tolerance {text!r}: use METRIC=LOWER:UPPER with METRIC one of "
            f"{', '.join([*TOLERANCES, *OPTIONAL_TOLERANCES])}"
        )
    try:
        return metric, Tolerance(float(lo) if lo else None, float(hi) if hi else None)
    except ValueError:
        raise UsageError(f"--tolerance {text!r}: bounds must be numbers") from None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="ccbench regress",
        description="Compare a result set with a reference; exit 1 on a regression.",
    )
    parser.add_argument("new", nargs="+", metavar="NEW", help="CSV files or folders to check")
    parser.add_argument(
        "--against",
        nargs="+",
        required=True,
        metavar="REF",
        help="reference CSV files or folders (e.g. results/reference)",
    )
    parser.add_argument(
        "--tolerance",
        action="append",
        default=[],
        metavar="METRIC=LO:HI",
        help="override a bound, as fractions of the reference "
        "(e.g. max_rel_err=:0.5); time_vs_baseline=LO:HI also checks "
        "timings relative to the MPI baseline; repeatable",
    )
    parser.add_argument(
        "--baseline",
        default="baseline:mpi",
        metavar="VARIANT:ALGORITHM",
        help="what timings are divided by (default baseline:mpi)",
    )
    parser.add_argument(
        "--allow-missing",
        action="store_true",
        help="points of the reference absent from NEW are not a regression",
    )
    parser.add_argument("--all", action="store_true", help="list every timing ratio too")
    opts = parser.parse_args(argv)
    try:
        tolerances = dict(TOLERANCES)
        tolerances.update(parse_tolerance(t) for t in opts.tolerance)
        variant, sep, algorithm = opts.baseline.partition(":")
        if not sep:
            raise UsageError(f"--baseline {opts.baseline!r}: use VARIANT:ALGORITHM")
        ref, new = load(opts.against), load(opts.new)
        findings, summary = compare(
            ref, new, tolerances, (variant, algorithm), opts.allow_missing, opts.all
        )
    except UsageError as e:
        print(f"ccbench regress: {e}", file=sys.stderr)
        return 2
    if findings:
        print(format_table(sorted(findings, key=lambda f: (f["status"], f["metric"]))))
    print(
        f"regress: {summary['compared']} points compared, {summary['missing']} missing, "
        f"{summary['new_points']} new, {summary['moved']} moved, "
        f"{summary['regressions']} regressions"
    )
    return 1 if summary["regressions"] else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
