"""Seed 000's latency notes: the collective-level variant's change against the baseline
and point-to-point compression at one size of a panel, from the interleaved comparison
(`ccbench compare`) that measured it where there is one, else from the separately
launched points drawn; each with the claim it states (plots/claims.py), and the
interleaved rounds' mean times drawn beside the sweep's points."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from ccbench.plots.base import (
    change_text,
    link_of,
    newest_per,
    same_run,
    time_bounds,
)
from ccbench.plots.claims import (
    INTERLEAVED,
    SEPARATE_LAUNCHES,
    Point,
    RatioClaim,
    differs_text,
    opposite,
    separate_ratio,
)
from ccbench.plots.style import Style, codec_label, codec_sort_key, format_bytes

POINT_KEYS = ["variant", "algorithm", "codec", "size_bytes"]


def drawn_points(sub: pd.DataFrame) -> pd.DataFrame:
    """One row per (series, size) with its interval (_lo, _hi): what a panel draws."""
    sub = newest_per(sub, POINT_KEYS)
    low, high, _ = time_bounds(sub)
    return sub.assign(_lo=low, _hi=high)


def baseline_reference(frame: pd.DataFrame) -> tuple[str, pd.DataFrame]:
    """The baseline the paper compares with: the MPI library's collective, else the ring."""
    base = frame[frame["variant"] == "baseline"]
    for algorithm in ("mpi", "ring"):
        chosen = base[base["algorithm"] == algorithm]
        if not chosen.empty:
            return ("MPI" if algorithm == "mpi" else "ring"), chosen
    return "", base


def _at(frame: pd.DataFrame, size) -> pd.Series | None:
    hit = frame[frame["size_bytes"] == size]
    return None if hit.empty else hit.iloc[-1]


def interleaved(compares: pd.DataFrame, claim: str, codec: str, size, ranks, link):
    """The `ccbench compare` row that measured this claim for this codec, size, rank
    count and link: ((ratio, low, high) oriented as B = collective level, {variant: the
    mean time of its interleaved rounds}); or None."""
    from ccbench.plots.headlines import oriented_ratio, parse_side

    if compares.empty:
        return None
    for _, row in compares.iloc[::-1].iterrows():  # the newest first
        if (
            float(row["size_bytes"]) != float(size)
            or int(row["ranks"]) != int(ranks)
            or float(link_of(row.to_frame().T).iloc[0]) != float(link)
        ):
            continue
        got = oriented_ratio(row, claim, codec, str(row.get("collective", "")))
        if got is not None:
            times = {
                parse_side(row[side])["variant"]: float(row.get(f"{side}_us", np.nan))
                for side in ("a", "b")
            }
            return got, times
    return None


def _point(row) -> Point | None:
    if row is None:
        return None
    return Point(float(row["avg_us"]), float(row["_lo"]), float(row["_hi"]))


def reductions(
    points: pd.DataFrame,
    compares: pd.DataFrame | None = None,
    collective: str = "",
    ranks=0,
    link=0.0,
) -> list[dict]:
    """Per collective-level codec drawn in a panel: its latency over the baseline's and
    over point-to-point compression's (same codec), with bounds. One number per claim:
    where `ccbench compare` measured the claim at a size the panel draws, the note is at
    that size and quotes that measurement, the one the headline table quotes; otherwise
    it is the ratio of the separately launched points, at the largest size shared with
    the baseline, and says so. Each comparison (`vs_baseline`, `vs_p2p`) is a dict: the
    ratio (ratio, low, high), A's series, the drawn points of A and B, the interleaved
    rounds' mean times (variant -> us) when it is interleaved; or None."""
    compares = compares if compares is not None else pd.DataFrame()
    base_name, base = baseline_reference(points)
    coll = points[points["variant"] == "coll_compressed"]
    found = []
    for codec in sorted(coll["codec"].unique(), key=codec_sort_key):
        mine = coll[coll["codec"] == codec]
        sizes = set(mine["size_bytes"]) & set(base["size_bytes"])
        if not sizes:
            continue
        measured = {
            size: (
                interleaved(compares, f"{collective}_vs_baseline", codec, size, ranks, link),
                interleaved(compares, f"{collective}_vs_p2p", codec, size, ranks, link),
            )
            for size in sizes
        }
        compared = [size for size, pair in measured.items() if any(pair)]
        size = max(compared) if compared else max(sizes)
        b = _at(mine, size)
        entry = {
            "codec": codec,
            "size": size,
            "baseline": base_name,
            "vs_baseline": None,
            "vs_p2p": None,
            "interleaved": bool(compared),
            "b": ("coll_compressed", str(b["algorithm"]), codec),
        }
        p2p = points[(points["variant"] == "p2p_compressed") & (points["codec"] == codec)]
        for key, reference, got in (
            ("vs_baseline", _at(base, size), measured[size][0]),
            ("vs_p2p", _at(p2p, size), measured[size][1]),
        ):
            if reference is None and got is None:
                continue
            drawn = (_point(reference), _point(b))
            series = (
                None
                if reference is None
                else (str(reference["variant"]), str(reference["algorithm"]), str(codec))
            )
            if key == "vs_baseline" and reference is not None:
                series = (str(reference["variant"]), str(reference["algorithm"]), "none")
            if got is not None:
                entry[key] = {"ratio": got[0], "times": got[1], "a": series, "drawn": drawn}
            elif not compared and reference is not None and same_run(reference, b):
                # rows of two runs are never paired
                entry[key] = {
                    "ratio": separate_ratio(*drawn),
                    "times": None,
                    "a": series,
                    "drawn": drawn,
                }
        found.append(entry)
    return found


def reduction_text(
    entries: list[dict], figure: str = "", panel: str = "", where: dict | None = None
) -> tuple[str, list[RatioClaim]]:
    """The note and the claims it states (one per ratio quoted)."""
    if not entries:
        return "", []
    base = entries[0]["baseline"] or "baseline"
    any_p2p = any(e["vs_p2p"] is not None for e in entries)
    sizes = sorted({e["size"] for e in entries})
    how = {e["interleaved"] for e in entries}
    source = (
        "interleaved, ccbench compare"
        if how == {True}
        else "separate launches"
        if how == {False}
        else "see each line"
    )
    at = format_bytes(sizes[0]) if len(sizes) == 1 else "the sizes named"
    lines = [f"collective-level latency change at {at} [{source}]"]
    claims, explain = [], []
    for e in entries:
        at_size = "" if len(sizes) == 1 else f" at {format_bytes(e['size'])}"
        kind = "" if len(how) == 1 else (" (interleaved)" if e["interleaved"] else " (separate)")
        name = f"{codec_label(e['codec'])}{at_size}"
        if e["vs_baseline"] is None and not e["interleaved"]:
            text = f"{name}: {base} is another run's, not paired"
        elif e["vs_baseline"] is None:
            text = f"{name}: no comparison with {base}"
        else:
            text = f"{name}: {change_text(*e['vs_baseline']['ratio'])} vs {base}"
        if any_p2p:
            text += (
                "; " + change_text(*e["vs_p2p"]["ratio"]) + " vs p2p"
                if e["vs_p2p"] is not None
                else "; no p2p point"
            )
        lines.append(text + kind)
        for key, against in (("vs_baseline", base), ("vs_p2p", "p2p")):
            c = e[key]
            if c is None or c["a"] is None:
                continue
            differs = None
            a_drawn, b_drawn = c["drawn"]
            if e["interleaved"] and a_drawn is not None and b_drawn is not None:
                separate = separate_ratio(a_drawn, b_drawn)
                if opposite(c["ratio"][0], separate[0]):
                    differs = separate
                    explain.append(f"{name} vs {against}:" + differs_text(separate))
            claims.append(
                RatioClaim(
                    figure,
                    panel,
                    c["a"],
                    e["b"],
                    float(e["size"]),
                    *c["ratio"],
                    INTERLEAVED if e["interleaved"] else SEPARATE_LAUNCHES,
                    text + kind,
                    a_drawn,
                    b_drawn,
                    differs,
                    dict(where or {}),
                )
            )
    return "\n".join(lines + explain), claims


def draw_interleaved(ax, entries: list[dict], style: Style, scale: float) -> bool:
    """The interleaved rounds' mean times (`ccbench compare`) beside the sweep's points:
    a star of each side's colour, edged in black. Returns whether any was drawn."""
    drawn = False
    for e in entries:
        for key in ("vs_baseline", "vs_p2p"):
            c = e[key]
            if c is None or not c["times"]:
                continue
            for variant, us in c["times"].items():
                if not np.isfinite(us):
                    continue
                algorithm = c["a"][1] if c["a"] and variant == c["a"][0] else None
                ax.plot(
                    [e["size"]],
                    [us / scale],
                    linestyle="none",
                    marker="*",
                    markersize=7,
                    markeredgecolor="black",
                    markeredgewidth=0.5,
                    color=style.color(variant, algorithm),
                    zorder=4,
                    label="_interleaved",
                )
                drawn = True
    return drawn


def interleaved_handle() -> Line2D:
    return Line2D(
        [],
        [],
        linestyle="none",
        marker="*",
        markersize=7,
        markeredgecolor="black",
        markeredgewidth=0.5,
        color="0.6",
        label=INTERLEAVED_LABEL,
    )


INTERLEAVED_LABEL = "interleaved rounds (ccbench compare), mean"
