"""What every figure module shares: the figure record, skipping, harness-row helpers.

A figure function takes the loaded `Data` and the report's `Style` and returns one or
more `Figure`s, or raises `Skip` with the reason it cannot be drawn from this data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ccbench.collectives.costmodel import call_floor_s, floor_steps, wire_floor_s
from ccbench.collectives.spec import spec
from ccbench.kernels import variants
from ccbench.plots.claims import RatioClaim
from ccbench.plots.claims import change_text as claims_change_text
from ccbench.plots.data import RUN, Data
from ccbench.plots.style import Style, codec_sort_key


@dataclass
class Figure:
    name: str  # file stem of the PNG and PDF
    fig: object  # matplotlib Figure
    caption: str
    claims: list[RatioClaim] = field(default_factory=list)  # what its notes state


@dataclass(frozen=True)
class Headline:
    """One row of the headline table: an interleaved comparison next to the paper's
    number. `measured` carries the ratio and its 95% interval; `samples` the rounds and
    iterations behind it; `verdict` faster / slower / no difference (or why there is no
    measurement)."""

    paper: str
    claim: str
    measured: str
    verdict: str
    samples: str
    published: str
    where: str = ""
    margin: str = ""  # the verdict's margin around 1, as a percentage
    against_paper: str = ""  # reproduced / not reproduced / not comparable, and why
    # the interval's relative half-width (sqrt(high / low) - 1) and the target the rounds
    # aimed at, in percent (NaN: none); the page check holds `samples` to saying so when
    # the rounds stopped at their cap short of the target
    half_width_pct: float = float("nan")
    target_pct: float = float("nan")


class Skip(Exception):
    """This figure cannot be drawn from the data given; the message says why."""


@dataclass(frozen=True)
class FigureSpec:
    name: str
    paper: str  # "seed 000", "seed 001", "seed 002", "general"
    title: str
    needs: tuple[str, ...]  # CSV kinds (plots.data.KINDS) the figure cannot do without
    draw: Callable[[Data, Style], list[Figure]]
    alternatives: str = ""  # what it reads when `needs` is empty: several ways to draw it


def finite(values) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    return values[np.isfinite(values)]


def rows(data: Data, kind: str, **equal) -> pd.DataFrame:
    """Rows of one kind whose columns equal the given values (a value may be a tuple)."""
    frame = data.get(kind)
    for column, wanted in equal.items():
        if column not in frame.columns:
            return frame.iloc[0:0]
        wanted = wanted if isinstance(wanted, tuple) else (wanted,)
        frame = frame[frame[column].isin(wanted)]
    return frame


def link_of(frame: pd.DataFrame) -> pd.Series:
    """Emulated link rate in Gbit/s per row, 0 for shared-memory runs."""
    if "link_gbps" not in frame.columns:
        return pd.Series(0.0, index=frame.index)
    return frame["link_gbps"].fillna(0.0).astype(float)


def panel_title(ranks, link_gbps) -> str:
    where = f"{link_gbps:g} Gbit/s links" if link_gbps and link_gbps > 0 else "shared memory"
    return f"{int(ranks)} ranks, {where}"


def panels(frame: pd.DataFrame) -> list[tuple[tuple[int, float], pd.DataFrame]]:
    """(ranks, link rate) groups: emulated links first (the interesting ones), then ranks."""
    frame = frame.assign(_link=link_of(frame))
    groups = [
        ((int(r), float(link)), sub.drop(columns="_link"))
        for (r, link), sub in frame.groupby(["ranks", "_link"], sort=True)
    ]
    return sorted(groups, key=lambda g: (g[0][1] <= 0, -g[0][1], g[0][0]))


def newest_per(frame: pd.DataFrame, keys) -> pd.DataFrame:
    """The row a panel draws at each value of `keys` (a series and its x): the newest.

    This chooses among points, it does not decide which rows are one point: plots.data
    kept one row per point (`results.point_identity`) and run when it read them. Rows
    that still share `keys` are points the panel does not tell apart (another run, or a
    configuration `hold_configuration` holds and the caption names): one is drawn."""
    if "timestamp" in frame.columns:
        frame = frame.sort_values("timestamp", kind="stable")
    return frame.drop_duplicates(list(keys), keep="last")


def series_keys(frame: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(variant, algorithm, codec) combinations in a stable, readable order."""
    # the series a panel holds, not its points: each combination once
    keys = frame[["variant", "algorithm", "codec"]].drop_duplicates().itertuples(index=False)
    keys = [tuple(map(str, k)) for k in keys]
    return sorted(keys, key=lambda k: (variants.order(k[0]), k[0], k[1], codec_sort_key(k[2])))


# What an error bar is, by where it came from (captions quote it).
INTERVALS = {
    "ci": "error bars: the 95% t interval of the mean over the timed calls (ci_low_us, ci_high_us)",
    "ranks": "error bars: the fastest and slowest rank's average (min_us, max_us), the "
    "only spread these rows carry (no confidence interval recorded)",
}


def time_bounds(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, str | None]:
    """(low, high, kind) of each row's avg_us: the 95% t interval of the mean where the
    rows carry it, else the min/max across ranks, else none (NaN bounds)."""
    n = len(frame)
    for low, high, kind in (("ci_low_us", "ci_high_us", "ci"), ("min_us", "max_us", "ranks")):
        if {low, high} <= set(frame.columns):
            lo = frame[low].to_numpy(dtype=float)
            hi = frame[high].to_numpy(dtype=float)
            if np.isfinite(lo).any() and np.isfinite(hi).any():
                return lo, hi, kind
    return np.full(n, np.nan), np.full(n, np.nan), None


def interval_caption(kinds) -> str:
    """Caption text naming the intervals drawn (and saying so when there are none)."""
    kinds = {k for k in kinds if k}
    if not kinds:
        return " No interval: the rows carry none."
    return " " + "; ".join(INTERVALS[k][0].upper() + INTERVALS[k][1:] for k in sorted(kinds)) + "."


def separate_ratio(
    a: float, a_low: float, a_high: float, b: float, b_low: float, b_high: float
) -> tuple[float, float, float]:
    """B/A of two separately measured means and the widest ratio their intervals allow:
    [b_low / a_high, b_high / a_low]. A time's interval can reach below zero (few, noisy
    calls): the ratio is then unbounded on that side (0 or inf). NaN bounds when either
    interval is missing."""
    ratio = b / a
    if not all(np.isfinite(v) for v in (a_low, a_high, b_low, b_high)):
        return ratio, np.nan, np.nan
    low = max(b_low, 0.0) / a_high if a_high > 0 else np.inf
    high = b_high / a_low if a_low > 0 else np.inf
    return ratio, low, high


def change_text(ratio: float, low: float, high: float) -> str:
    """A ratio of times as a latency change with its interval: '-45% [-50, -39]' (never
    '-0': plots.claims.percent)."""
    return claims_change_text(ratio, low, high)


def draw_series(
    ax,
    frame: pd.DataFrame,
    x: str,
    y: str,
    scale: float = 1.0,
    low: str | None = None,
    high: str | None = None,
    **style,
):
    """One measured line with its interval as error bars: the columns `low` and `high`
    (in the units of `y`), or for avg_us the rows' own interval (time_bounds).
    Returns (line, interval kind or None)."""
    frame = frame.sort_values(x)
    xs = frame[x].to_numpy(dtype=float)
    ys = frame[y].to_numpy(dtype=float)
    if len(frame) == 1:  # a single point is drawn as a point, with a marker to show it
        style = {**style, "linestyle": "none", "marker": style.get("marker") or "o"}
    kind = None
    if low is not None and high is not None:
        lo, hi, kind = frame[low].to_numpy(dtype=float), frame[high].to_numpy(dtype=float), "ci"
    elif y == "avg_us":
        lo, hi, kind = time_bounds(frame)
    else:
        lo = hi = np.full(len(frame), np.nan)
    has = np.isfinite(lo) & np.isfinite(hi)
    if has.any():
        below = np.where(has, np.clip(ys - lo, 0, None), 0.0) / scale
        above = np.where(has, np.clip(hi - ys, 0, None), 0.0) / scale
        container = ax.errorbar(
            xs, ys / scale, yerr=[below, above], capsize=1.5, elinewidth=0.6, **style
        )
        line = container.lines[0]
        line.set_label(style.get("label", "_nolegend_"))  # the series, not the container
        return line, kind
    (line,) = ax.plot(xs, ys / scale, **style)
    return line, None


def drawn_values(ax) -> np.ndarray:
    """The y values of every line, marker and error bar drawn in a panel (axis units)."""
    values = [np.asarray(line.get_ydata(), dtype=float) for line in ax.lines]
    for collection in ax.collections:  # error bars' vertical segments
        for segment in getattr(collection, "get_segments", lambda: [])():
            values.append(np.asarray(segment, dtype=float)[:, 1])
    return np.concatenate(values) if values else np.array([])


def fit_axis_to_points(ax, values, scale: float = 1.0, factor: float = 1.6, also=()) -> bool:
    """A log y axis spanning the points drawn (a factor either side), and the values
    `also` drawn (floors, error bars; in axis units) that lie within `REACH` of them: one
    wide interval of a few noisy calls would otherwise squash every line. Returns whether
    something drawn now runs off the axis (the caption says so)."""
    values = np.asarray(values, dtype=float) / scale
    values = values[np.isfinite(values) & (values > 0)]
    if values.size == 0:
        return False
    low, high = values.min(), values.max()
    extra = np.asarray(also, dtype=float)
    extra = extra[np.isfinite(extra) & (extra > 0)]
    near = extra[(extra >= low / REACH) & (extra <= high * REACH)]
    if near.size:
        low, high = min(low, near.min()), max(high, near.max())
    ax.set_ylim(low / factor, high * factor)
    drawn = np.asarray(also, dtype=float)
    drawn = drawn[np.isfinite(drawn)]
    return bool(((drawn < low / factor * 0.999) | (drawn > high * factor * 1.001)).any())


REACH = 10.0  # how far beyond the points an error bar or floor may stretch the axis


def wire_measured(frame: pd.DataFrame) -> pd.Series:
    """Whether a row counted its wire bytes (False: wire_bytes falls back to a formula)."""
    if "wire_bytes_per_rank" not in frame.columns:
        return pd.Series(False, index=frame.index)
    return frame["wire_bytes_per_rank"].astype(float) > 0


def wire_bytes(frame: pd.DataFrame) -> pd.Series:
    """Bytes each rank puts on the wire: measured where the row has it, else the ring's
    (collectives/spec.py) for an uncompressed collective over the achieved ratio."""
    formula = pd.Series(
        [
            spec(c).ring_wire_bytes(float(s), int(n))
            for c, s, n in zip(
                frame["collective"], frame["size_bytes"], frame["ranks"], strict=True
            )
        ],
        index=frame.index,
        dtype=float,
    )
    if "compression_ratio" in frame.columns:
        ratio = frame["compression_ratio"].astype(float)
        formula = formula / ratio.where(ratio > 0, 1.0).fillna(1.0)
    measured = (
        frame["wire_bytes_per_rank"].astype(float)
        if "wire_bytes_per_rank" in frame.columns
        else pd.Series(np.nan, frame.index)
    )
    return measured.where(measured > 0, formula)


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    if name not in frame.columns:
        return pd.Series(np.nan, index=frame.index, dtype=float)
    return pd.to_numeric(frame[name], errors="coerce").astype(float)


def floor_parts_us(frame: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """(wire floor, codec floor) of each row, by the one definition
    (collectives/costmodel.py): the bytes each rank puts on the wire (measured where the
    row has them), less what the link's token bucket passes at once after a pause, at the
    link's payload ceiling (the configured rate less the frames' headers), plus each
    step's fixed cost (`cluster selfcheck`); and the codec's floor the row recorded
    (costmodel.codec_floor_s), NaN where it has none. Rows without the ceiling, burst or
    step cost (files from before they were recorded) fall back to the configured rate, no
    burst, no fixed cost: then not a strict bound. NaN off an emulated link."""
    link = link_of(frame)
    ceiling = _column(frame, "link_ceiling_gbps")
    rate_bps = ceiling.where(ceiling > 0, link) * 1e9
    algorithm = (
        frame["algorithm"] if "algorithm" in frame.columns else pd.Series("ring", index=frame.index)
    )
    steps = pd.Series(
        [
            floor_steps(c, int(n), str(a))
            for c, n, a in zip(frame["collective"], frame["ranks"], algorithm, strict=True)
        ],
        index=frame.index,
        dtype=float,
    )
    wire = (
        wire_floor_s(
            wire_bytes(frame),
            rate_bps,
            _column(frame, "link_burst_bytes").fillna(0.0),
            steps,
            _column(frame, "link_step_us").fillna(0.0) * 1e-6,
        )
        * 1e6
    )
    return wire.where(link > 0), _column(frame, "codec_floor_us").where(link > 0)


def floor_us(frame: pd.DataFrame) -> pd.Series:
    """Each row's floor on an emulated link (floor_parts_us): the wire's, or the codec's
    where the row has one and it is larger. NaN off an emulated link."""
    wire, codec = floor_parts_us(frame)
    return call_floor_s(wire, codec).where(wire.notna())


def strict_bound(frame: pd.DataFrame) -> bool:
    """Whether the rows carry what makes floor_us a strict bound."""
    return {"link_ceiling_gbps", "link_burst_bytes"} <= set(frame.columns) and bool(
        pd.to_numeric(frame["link_ceiling_gbps"], errors="coerce").notna().any()
    )


def below_floor(frame: pd.DataFrame, measured: str = "avg_us") -> pd.DataFrame:
    """Rows whose measured time lies below their floor: a wrong floor, wire count, link
    rate, step cost or codec time; the figures mark them in red with the reason
    (below_floor_text) and a test fails on them. The floor is a strict bound (no stated
    error: the codec's part is the fastest timed call's), so any point under it counts.
    `_bound` names the part that sets the floor: wire or codec."""
    wire, codec = floor_parts_us(frame)
    floor = call_floor_s(wire, codec).where(wire.notna())
    low = (_column(frame, measured) < floor * (1 - 1e-9)) & floor.notna()
    bound = pd.Series(np.where(codec.fillna(-np.inf) > wire, "codec", "wire"), frame.index)
    return frame[low].assign(_bound=bound[low])


BELOW_REASONS = {
    "wire": "the wire's floor: the wire count, the link rate, the burst or the step cost "
    "is wrong there",
    "codec": "the codec's floor (the fastest timed call's codec time of the ranks that "
    "share a core or device, times the ranks per core): that codec time was "
    "mis-measured there",
}


def below_floor_text(below: pd.DataFrame, what: str) -> str:
    """Caption text for the rows below_floor found: how many (`what`: how they are drawn),
    and the reason, by the part of the floor they are under."""
    if below.empty:
        return ""
    parts = [
        f"{int((below['_bound'] == part).sum())} under {reason}"
        for part, reason in BELOW_REASONS.items()
        if (below["_bound"] == part).any()
    ]
    return f" {len(below)} {what} measured BELOW their floor (red): " + "; ".join(parts) + "."


def same_run(*points) -> bool:
    """Whether rows come from one run: a note pairs two curves' points only then."""
    return len({str(p.get(RUN, "")) for p in points if p is not None}) <= 1


def run_labels_text(frame: pd.DataFrame) -> str:
    """Caption text naming each curve's run, when the rows come from several runs."""
    if RUN not in frame.columns or frame[RUN].astype(str).replace("", np.nan).nunique() < 2:
        return ""
    keys = [
        c
        for c in ("variant", "algorithm", "codec", "model", "strategy", "framework")
        if c in frame.columns
    ]
    parts = []
    for key, sub in frame.groupby(keys, sort=True) if keys else []:
        key = key if isinstance(key, tuple) else (key,)
        name = " ".join(str(k) for k in key if str(k) not in ("", "none", "nan"))
        parts.append(f"{name}: {', '.join(sorted(set(sub[RUN].astype(str))))}")
    return " Curves from several runs (not paired with each other): " + "; ".join(parts) + "."


def runs_note(frame: pd.DataFrame) -> str:
    """Caption text that warns when a figure mixes runs, hosts or code versions."""
    notes = []
    # Not run_id: every rank count or algorithm is its own mpiexec run by design.
    for column, what in (
        ("hostname", "hosts"),
        ("git_sha", "code versions"),
        ("mpi_library", "MPI libraries"),
    ):
        if column in frame.columns:
            count = frame[column].dropna().astype(str).nunique()
            if count > 1:
                notes.append(f"{count} {what}")
    text = f" Mixed data: {', '.join(notes)}." if notes else ""
    text += run_labels_text(frame)
    if "validation" in frame.columns:
        failed = int((frame["validation"].astype(str) == "Fail").sum())
        if failed:
            text += f" {failed} point(s) FAILED validation (-c)."
    return text


# The codecs of the seed 000 reproduction sweep: shown first when a figure must choose.
PREFERRED_CODECS = ("fp16", "bfp:rate=8", "zfp:rate=8")


def main_codecs(frame: pd.DataFrame, limit: int = 4) -> tuple[list[str], list[str]]:
    """(shown, left out): at most `limit` codecs of the compressed variants, those of the
    reproduction sweep first, then those measured at the most sizes."""
    compressed = frame[frame["codec"] != "none"]
    sizes = compressed.groupby("codec")["size_bytes"].nunique()
    ranked = sorted(
        sizes.index,
        key=lambda c: (
            c not in PREFERRED_CODECS,
            PREFERRED_CODECS.index(c) if c in PREFERRED_CODECS else 0,
            -sizes[c],
            codec_sort_key(c),
        ),
    )
    return ranked[:limit], ranked[limit:]


# Harness columns that place a row on a figure's axes or in its series; every other
# non-measured column (dtype, timing, chunk_bytes, ...) is a configuration.
SERIES_COLUMNS = ("variant", "algorithm", "codec", "collective", "ranks", "link_gbps")
AXIS_COLUMNS = frozenset({*SERIES_COLUMNS, "size_bytes", "nodes"})


def hold_configuration(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """One configuration per series: where a series was run with several values of a
    configuration column (two chunk sizes, two dtypes), keep its most common value (ties:
    the first in sorted order). Returns the rows and caption parts naming what was held."""
    from ccbench.benchmarks.results import is_setting

    keys = [c for c in SERIES_COLUMNS if c in frame.columns]
    extra = [
        c
        for c in frame.columns
        if is_setting(c) and c not in AXIS_COLUMNS and not c.startswith("_")
    ]
    held = []
    for column in extra:
        values = frame[column].astype(str)
        counts = values.groupby([frame[k].astype(str) for k in keys]).nunique()
        if counts.empty or counts.max() <= 1:
            continue
        keep = pd.Series(True, index=frame.index)
        chosen = set()
        for _, index in frame.groupby(keys, dropna=False).groups.items():
            mine = values.loc[index]
            if mine.nunique() > 1:
                tally = mine.value_counts()
                value = sorted(tally[tally == tally.max()].index)[0]
                keep.loc[index] = mine == value
                chosen.add(value)
        frame = frame[keep]
        held.append(f"{column} {'/'.join(sorted(chosen))}")
    return frame, held


def held_text(held: list[str]) -> str:
    if not held:
        return ""
    return " Series run with several configurations are drawn at one: " + ", ".join(held) + "."


# Said beside every note that quotes a ratio: which of the two measurements it is.
SEPARATE = (
    "Where the note says 'interleaved', its numbers are the ccbench compare "
    "measurement the headline table quotes (the ratio and its 95% interval over "
    "rounds); where it says 'separate launches', they are the widest ratio the two "
    "points' 95% intervals allow, which leaves out what varies from launch to "
    "launch."
)
