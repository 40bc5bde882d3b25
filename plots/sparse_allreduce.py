"""Seed 001 figures: OmniReduce sparse streaming allreduce against its baselines.

Time against sparsity, time against the number of workers, block size with and without
fusion, and the bytes on the wire against the minimum the data require.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ccbench.kernels.sparse_data import PAPER_DENSITIES
from ccbench.plots import papers
from ccbench.plots.base import (
    Figure,
    FigureSpec,
    Skip,
    draw_series,
    floor_us,
    interval_caption,
    link_of,
    newest_per,
    panel_title,
    rows,
    runs_note,
    same_run,
    separate_ratio,
    time_bounds,
    wire_bytes,
    wire_measured,
)
from ccbench.plots.style import (
    Style,
    figure,
    format_bytes,
    legend_below,
    model_handle,
    panel_note,
    plain_number,
    tidy_log_axis,
    time_unit,
)

ALGORITHM_ORDER = ("omnireduce", "dense", "dense-ring", "allgather-sparse")
# Configuration columns held at one value where not on an axis; the value preferred is
# the reproduction's setup (papers.OMNIREDUCE_SETUP).
CONFIG_COLUMNS = (
    "block_size",
    "fusion",
    "protocol",
    "slots",
    "overlap",
    "threshold",
    "aggregators",
    "window",
    "streams",
)
# Configuration columns each algorithm's time depends on (the others are recorded but
# ignored by it, so its rows are kept whatever their value).
MINIMUM = "wire_min_bytes_per_rank"  # the benchmark's count of the least wire volume
RELEVANT = {
    "omnireduce": set(CONFIG_COLUMNS),
    "allgather-sparse": {"block_size", "threshold", "overlap"},
    "dense": set(),
    "dense-ring": set(),
}


NO_ROWS = "no sparse_streaming rows (harness rows with a density column)"


def sparse_rows(data, required: bool = False) -> pd.DataFrame:
    """Harness rows of the sparse variant; with required=True, Skip when there are none."""
    frame = rows(data, "harness")
    if "density" in frame.columns:
        frame = frame[frame["density"].notna()]
    if "density" not in frame.columns or frame.empty:
        if required:
            raise Skip(NO_ROWS)
        return frame.iloc[0:0]
    return frame.assign(_link=link_of(frame))


def algorithms(frame: pd.DataFrame) -> list[str]:
    present = set(frame["algorithm"])
    return [a for a in ALGORITHM_ORDER if a in present] + sorted(present - set(ALGORITHM_ORDER))


def relevant(frame: pd.DataFrame, column: str) -> pd.Series:
    """Rows whose algorithm's time depends on `column` (unknown algorithms: all)."""
    return (
        frame["algorithm"]
        .map(lambda a: column in RELEVANT.get(a, set(CONFIG_COLUMNS)))
        .astype(bool)
    )


def pick(frame: pd.DataFrame, column: str, preferred=None):
    """The value of `column` to hold fixed: the preferred one if present, else the most
    common (ties: the smallest), so every figure compares like with like."""
    if column not in frame.columns or frame[column].isna().all():
        return None
    values = frame[column].dropna()
    if preferred is not None and (values == preferred).any():
        return preferred
    counts = values.value_counts()
    return sorted(counts[counts == counts.max()].index, key=str)[0]


def hold_fixed(
    frame: pd.DataFrame, columns=CONFIG_COLUMNS, keep=()
) -> tuple[pd.DataFrame, list[str]]:
    """Rows at one value of each configuration column not on an axis; caption parts.

    The value is chosen among the rows of algorithms that depend on it; rows of the
    others (the dense baselines ignore block size) are kept whatever they recorded."""
    fixed = []
    for column in columns:
        if column in keep or column not in frame.columns:
            continue
        matters = relevant(frame, column)
        default = papers.OMNIREDUCE_SETUP.get(column)
        value = pick(frame[matters], column, default)
        if value is None:
            continue
        varied = frame.loc[matters, column].nunique() > 1
        frame = frame[(frame[column] == value) | ~matters]
        if varied or value != default or column in ("block_size", "fusion"):
            fixed.append(f"{column.replace('_', ' ')} {fmt(value)}")
    return frame, fixed


def pick_densities(values: pd.Series, targets) -> list[float]:
    """The measured densities nearest (log scale) to the targets, largest first."""
    present = sorted(set(values.dropna()), reverse=True)
    if len(present) <= len(targets):
        return present
    logs = np.log10(np.maximum(present, 1e-9))
    chosen = {present[int(np.argmin(np.abs(logs - np.log10(t))))] for t in targets}
    return sorted(chosen, reverse=True)


def fmt(value) -> str:
    return f"{value:g}" if isinstance(value, (int, float, np.number)) else str(value)


def largest_size(frame: pd.DataFrame) -> float:
    return float(frame["size_bytes"].max())


def line_style(style: Style, algorithm: str) -> dict:
    return {
        "color": style.color("sparse_streaming", algorithm),
        "label": algorithm,
        "marker": {"omnireduce": "o", "dense": "s", "dense-ring": "D", "allgather-sparse": "^"}.get(
            algorithm, "v"
        ),
    }


def drawn_points(frame: pd.DataFrame, x: str) -> pd.DataFrame:
    """One row per (algorithm, x) with its interval (_lo, _hi): the points a panel draws.
    Rows of one run measure each point once; a point measured again keeps the latest."""
    frame = newest_per(frame, ["algorithm", x])
    low, high, _ = time_bounds(frame)
    return frame.assign(_lo=low, _hi=high)


def nearest(values, target: float) -> float:
    """The value nearest the target in log scale."""
    values = sorted(set(values))
    logs = np.abs(np.log10(np.maximum(values, 1e-12)) - np.log10(target))
    return values[int(np.argmin(logs))]


def speedup_at(points: pd.DataFrame, density: float) -> tuple[float, float, float] | None:
    """OmniReduce's speed-up over dense MPI Allreduce at one density drawn: dense time
    over OmniReduce time, with the widest bounds the two intervals allow."""
    omni = points[(points["algorithm"] == "omnireduce") & (points["density"] == density)]
    dense = points[(points["algorithm"] == "dense") & (points["density"] == density)]
    if omni.empty or dense.empty:
        return None
    o, d = omni.iloc[-1], dense.iloc[-1]
    if not same_run(o, d):  # rows of two runs are never paired
        return None
    # speed-up = dense / omni: the ratio with A = OmniReduce, B = dense
    return separate_ratio(o["avg_us"], o["_lo"], o["_hi"], d["avg_us"], d["_lo"], d["_hi"])


def interleaved_speedup(compares: pd.DataFrame, size, ranks, link, density: float):
    """OmniReduce's speed-up over dense allreduce (A/B, with its 95% interval) from the
    `ccbench compare` that measured it at this size, rank count, link and density (the
    number the headline table quotes); or None."""
    from ccbench.plots.headlines import claim_of, parse_side

    if compares is None or compares.empty:
        return None
    for _, row in compares.iloc[::-1].iterrows():  # the newest first
        if (
            float(row["size_bytes"]) != float(size)
            or int(row["ranks"]) != int(ranks)
            or float(link_of(row.to_frame().T).iloc[0]) != float(link)
        ):
            continue
        config = dict(
            item.split("=", 1) for item in str(row.get("config") or "").split(",") if "=" in item
        )
        try:
            if not np.isclose(float(config.get("density", "nan")), density):
                continue
        except ValueError:
            continue
        found = claim_of(parse_side(row["a"]), parse_side(row["b"]), "allreduce")
        if found is None or found[0] != "omnireduce_speedup":
            continue
        ratio, low, high = (float(row[c]) for c in ("ratio", "ratio_low", "ratio_high"))
        if not np.isfinite(ratio):
            continue
        return (ratio, low, high) if found[1] else (1 / ratio, 1 / high, 1 / low)
    return None


def speedup_text(value: tuple[float, float, float]) -> str:
    ratio, low, high = value
    bounds = ""
    if np.isfinite(low) and not np.isnan(high):
        bounds = f" [{low:.2f}, {high:.2f}]" if np.isfinite(high) else f" [{low:.2f}, inf]"
    return f"{ratio:.2f}x{bounds}"


def density_axis(ax, measured) -> None:
    """A log axis of density, sparsity growing to the right as in the paper; ticks at the
    paper's densities (labelled at the decades and wherever measured here)."""
    paper = PAPER_DENSITIES
    ticks = sorted(set(paper) | set(measured))
    ax.set_xscale("log")
    lo, hi = min(ticks), max(ticks)
    ax.set_xlim(hi * 1.25, lo / 1.25)  # inverted: density 1 (dense) on the left
    # labels at the decades, then at measured densities that have room (a quarter decade)
    labelled = [t for t in ticks if np.isclose(np.log10(t), round(np.log10(t)))]
    for value in sorted(measured, reverse=True):
        if all(abs(np.log10(value) - np.log10(t)) >= 0.25 for t in labelled):
            labelled.append(value)
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(
        FuncFormatter(
            lambda v, _pos: plain_number(v) if any(np.isclose(v, t) for t in labelled) else ""
        )
    )
    ax.xaxis.set_minor_locator(NullLocator())
    ax.tick_params(axis="x", labelsize=5.6)


def time_vs_sparsity(data, style: Style) -> list[Figure]:
    frame = sparse_rows(data, required=True)
    if frame["density"].nunique() < 2:
        raise Skip("needs sparse_streaming rows at two or more densities")
    frame, fixed = hold_fixed(frame, keep=("overlap",))
    settings = []
    for (ranks, link), sub in frame.groupby(["ranks", "_link"]):
        size = largest_size(sub)
        sub = sub[sub["size_bytes"] == size]
        for overlap in sorted(
            sub["overlap"].dropna().unique() if "overlap" in sub else [""],
            key=lambda o: (o != "random", str(o)),
        ):
            part = sub[sub["overlap"] == overlap] if overlap else sub
            dense = sub[sub["algorithm"].isin(("dense", "dense-ring"))]
            # the dense rows may be in `part` already: each row once (not a point's rows)
            part = pd.concat([part, dense]).drop_duplicates()
            settings.append(((ranks, link, overlap, size), part))
    settings.sort(key=lambda s: (s[0][1] <= 0, -s[0][1], s[0][0], s[0][2] != "random"))
    shown = settings[:4]
    fig, axes = figure(len(shown), panel_height=2.6)
    handles, labels, modelled, kinds, measured = [], [], False, set(), set()
    for ax, ((ranks, link, overlap, size), sub) in zip(axes, shown, strict=True):
        points = drawn_points(sub, "density")
        measured |= set(points["density"])
        scale, unit = time_unit(points["_hi"].fillna(points["avg_us"]))
        for algorithm in algorithms(points):
            series = points[points["algorithm"] == algorithm]
            kw = line_style(style, algorithm)
            line, kind = draw_series(
                ax, series, "density", "avg_us", scale, low="_lo", high="_hi", **kw
            )
            kinds.add(kind)
            handles.append(line)
            labels.append(algorithm)
            if link > 0:
                model = series.assign(
                    _model=floor_us(series.assign(collective="allreduce"))
                ).dropna(subset=["_model"])
                if not model.empty:
                    model = model.sort_values("density")
                    ax.plot(
                        model["density"],
                        model["_model"] / scale,
                        linestyle="--",
                        linewidth=0.8,
                        color=kw["color"],
                        alpha=0.75,
                    )
                    modelled = True
        ax.set_xlabel("Density (share of non-zero blocks; log scale)")
        ax.set_ylabel(f"Allreduce time ({unit})")
        ax.set_ylim(bottom=0)
        density_axis(ax, set(points["density"]))
        where = panel_title(ranks, link)
        ax.set_title(f"{where}, {format_bytes(size)}" + (f", {overlap} overlap" if overlap else ""))
        omni = points.loc[points["algorithm"] == "omnireduce", "density"]
        dense = points.loc[points["algorithm"] == "dense", "density"]
        common = set(omni) & set(dense)
        if common:
            density = nearest(common, 0.1)
            compared = interleaved_speedup(rows(data, "compare"), size, ranks, link, density)
            if compared is not None:
                panel_note(
                    ax,
                    f"OmniReduce over dense at density {density:g}:\n"
                    f"speed-up {speedup_text(compared)} [interleaved]",
                )
            else:
                panel_note(
                    ax,
                    f"OmniReduce over dense at density {density:g}:\nspeed-up "
                    f"{speedup_text(speedup_at(points, density))} [separate "
                    "launches]",
                )
    if modelled:
        proxy = model_handle()
        handles.append(proxy)
        labels.append(proxy.get_label())
    legend_below(fig, handles, labels)
    paper = PAPER_DENSITIES
    missing = [d for d in paper if not any(np.isclose(d, m) for m in measured)]
    caption = (
        "Allreduce time against density (share of non-zero blocks per worker; "
        "sparsity = 1 - density grows to the right) for OmniReduce and the "
        "baselines, at the largest tensor size of each run"
        + (f"; {', '.join(fixed)}" if fixed else "")
        + ". 'random' overlap: each "
        "worker's non-zero blocks are drawn independently; 'all': the same blocks "
        "on every worker; 'none': disjoint. Ticks: the densities of the paper's "
        f"micro-benchmark ({papers.PAPERS['seed 001'].short}: "
        f"{', '.join(f'{d:g}' for d in paper)})."
    )
    if missing:
        caption += (
            " Not measured here: "
            + ", ".join(f"{d:g}" for d in missing)
            + " (run the benchmark with --density paper)."
        )
    caption += (
        " The note gives OmniReduce's speed-up over dense MPI Allreduce at the "
        "drawn density nearest 0.1, dense time over OmniReduce time: 'interleaved', "
        "the ccbench compare the headline table quotes, with its 95% interval; "
        "'separate launches', the widest ratio the two points' 95% intervals "
        "allow."
    )
    if modelled:
        caption += (
            " Dashed: a model, the call's floor (docs/compression.md): each rank's "
            "wire bytes over the link rate, less the shaper's burst, plus each "
            "step's fixed cost."
        )
    caption += interval_caption(kinds)
    if len(settings) > len(shown):
        caption += f" {len(settings) - len(shown)} more setting(s) not shown."
    return [Figure("seed001_time_vs_sparsity", fig, caption + runs_note(frame))]


def time_vs_workers(data, style: Style) -> list[Figure]:
    frame = sparse_rows(data, required=True)
    if frame["ranks"].nunique() < 2:
        raise Skip("needs sparse_streaming rows at two or more rank counts")
    frame, fixed = hold_fixed(frame)
    link = pick(frame, "_link")
    frame = frame[frame["_link"] == link]
    # the largest size that every rank count ran
    sizes = set.intersection(*(set(s["size_bytes"]) for _, s in frame.groupby("ranks")))
    if not sizes:
        raise Skip("no tensor size was run at every rank count")
    size = max(sizes)
    frame = frame[frame["size_bytes"] == size]
    densities = pick_densities(frame["density"], (1.0, 0.4, 0.1, 0.01))
    fig, axes = figure(len(densities), sharey=False)
    handles, labels, kinds = [], [], set()
    for ax, density in zip(axes, densities, strict=True):
        sub = frame[frame["density"] == density]
        scale, unit = time_unit(sub["avg_us"])
        for algorithm in algorithms(sub):
            series = sub[sub["algorithm"] == algorithm]
            series = newest_per(series, ["ranks"])
            line, kind = draw_series(
                ax, series, "ranks", "avg_us", scale, **line_style(style, algorithm)
            )
            kinds.add(kind)
            handles.append(line)
            labels.append(algorithm)
        ranks = sorted(sub["ranks"].unique())
        ax.set_xscale("log", base=2)
        ax.set_xticks(ranks, [str(int(r)) for r in ranks])
        ax.minorticks_off()
        ax.set_xlabel("Workers (ranks)")
        ax.set_ylabel(f"Allreduce time ({unit})")
        ax.set_ylim(bottom=0)
        ax.set_title(f"density {density:g} ({100 * (1 - density):.0f}% sparse)")
    legend_below(fig, handles, labels)
    where = panel_title(2, link).split(", ", 1)[1]
    caption = (
        f"Allreduce time against the number of workers at several densities; "
        f"{format_bytes(size)} tensor, {where}"
        + (f"; {', '.join(fixed)}" if fixed else "")
        + ". The dense baselines were "
        "run at each density too (their time does not depend on it)." + interval_caption(kinds)
    )
    return [Figure("seed001_time_vs_workers", fig, caption + runs_note(frame))]


def block_size_fusion(data, style: Style) -> list[Figure]:
    frame = sparse_rows(data, required=True)
    frame = frame[frame["algorithm"] == "omnireduce"]
    if frame.empty or "block_size" not in frame or frame["block_size"].nunique() < 2:
        raise Skip("needs OmniReduce rows at two or more block sizes")
    frame, fixed = hold_fixed(frame, keep=("block_size", "fusion"))
    ranks, link = pick(frame, "ranks"), pick(frame, "_link")
    frame = frame[(frame["ranks"] == ranks) & (frame["_link"] == link)]
    size = largest_size(frame)
    frame = frame[frame["size_bytes"] == size]
    blocks_at = frame.groupby("density")["block_size"].nunique()  # a line, not a point
    if (blocks_at < 2).all():
        raise Skip("needs OmniReduce rows at two or more block sizes at one density")
    frame = frame[frame["density"].isin(blocks_at[blocks_at >= 2].index)]
    densities = pick_densities(frame["density"], (1.0, 0.1, 0.01))
    fusions = sorted(frame["fusion"].dropna().unique()) if "fusion" in frame else []
    fig, axes = figure(len(densities), ncols=min(3, len(densities)))
    scale, unit = time_unit(frame[frame["density"].isin(densities)]["avg_us"])
    handles, labels, kinds = [], [], set()
    styles = ("-", ":", "-.", (0, (3, 1, 1, 1, 1, 1)))  # dashed is kept for models
    markers = ("o", "s", "^", "D", "v")
    for ax, density in zip(axes, densities, strict=True):
        sub = frame[frame["density"] == density]
        for i, fusion in enumerate(fusions or [None]):
            series = sub if fusion is None else sub[sub["fusion"] == fusion]
            series = newest_per(series, ["block_size"])
            name = "no fusion" if fusion in (None, 0, 1) else f"fusion {fmt(fusion)}"
            label = f"omnireduce, {name}"
            line, kind = draw_series(
                ax,
                series,
                "block_size",
                "avg_us",
                scale,
                color=style.color("sparse_streaming", "omnireduce"),
                linestyle=styles[i % len(styles)],
                marker=markers[i % len(markers)],
                label=label,
            )
            kinds.add(kind)
            handles.append(line)
            labels.append(label)
        blocks = sorted(sub["block_size"].unique())
        ax.set_xscale("log", base=2)
        ax.set_xticks(blocks, [str(int(b)) for b in blocks])
        ax.minorticks_off()
        ax.set_xlabel("Block size (elements)")
        ax.set_ylabel(f"Allreduce time ({unit})")
        ax.set_ylim(bottom=0)
        ax.set_title(f"density {density:g}")
    legend_below(fig, handles, labels)
    caption = (
        f"OmniReduce allreduce time against block size, with and without block "
        f"fusion (several blocks per message); {format_bytes(size)} tensor, "
        f"{panel_title(ranks, link)}"
        + (f"; {', '.join(fixed)}" if fixed else "")
        + f". The paper's runs use blocks of {papers.OMNIREDUCE_BLOCK_SIZE}."
        + interval_caption(kinds)
    )
    return [Figure("seed001_block_size_fusion", fig, caption + runs_note(frame))]


def wire_vs_minimum(data, style: Style) -> list[Figure]:
    frame = sparse_rows(data, required=True)
    if "wire_bytes_per_rank" not in frame or frame["wire_bytes_per_rank"].notna().sum() == 0:
        raise Skip("needs sparse_streaming rows with measured wire_bytes_per_rank")
    frame, fixed = hold_fixed(frame)
    link = pick(frame, "_link")
    frame = frame[frame["_link"] == link]
    groups = list(frame.groupby("ranks"))[:4]
    fig, axes = figure(len(groups), panel_height=2.6)
    handles, labels, formula = [], [], False
    for ax, (ranks, sub) in zip(axes, groups, strict=True):
        size = largest_size(sub)
        sub = drawn_points(sub[sub["size_bytes"] == size], "density")
        sub = sub.assign(mib=wire_bytes(sub) / 2**20, _counted=wire_measured(sub))
        for algorithm in algorithms(sub):
            series = sub[sub["algorithm"] == algorithm].sort_values("density")
            kw = line_style(style, algorithm)
            counted = series[series["_counted"]]
            if not counted.empty:
                (line,) = ax.plot(counted["density"], counted["mib"], **kw)
                handles.append(line)
                labels.append(algorithm)
            model = series[~series["_counted"]]
            if not model.empty:
                # the MPI library's Allreduce cannot be counted: the ring's volume, a model
                label = f"model: {algorithm}, ring volume 2(n-1)/n x size"
                (line,) = ax.plot(
                    model["density"],
                    model["mib"],
                    color=kw["color"],
                    linestyle="--",
                    linewidth=0.9,
                    label=label,
                )
                handles.append(line)
                labels.append(label)
                formula = True
        omni = sub[sub["algorithm"] == "omnireduce"]
        if MINIMUM in omni and omni[MINIMUM].notna().any():
            least = omni[omni[MINIMUM] > 0].sort_values("density")
            label = "model: OmniReduce's minimum (from the inputs' block bitmaps)"
            (line,) = ax.plot(
                least["density"],
                least[MINIMUM] / 2**20,
                color="0.35",
                linestyle="--",
                linewidth=0.9,
                label=label,
            )
            handles.append(line)
            labels.append(label)
            over = least["wire_bytes_per_rank"] / least[MINIMUM]
            if over.notna().any():
                row = least.loc[over.idxmax()]
                ax.set_xlabel("Density (share of non-zero blocks)")
                panel_note(
                    ax,
                    f"OmniReduce: at most {100 * (over.max() - 1):.1f}% over "
                    f"its minimum (at density {row['density']:g})",
                )
        density_axis(ax, set(sub["density"]))  # as the sparsity figure: dense on the left
        ax.set_yscale("log")
        tidy_log_axis(ax, "y")
        ax.set_xlabel("Density (share of non-zero blocks; log scale)")
        ax.set_ylabel("Wire bytes per rank (MiB)")
        ax.set_title(f"{panel_title(ranks, link)}, {format_bytes(size)}")
    legend_below(fig, handles, labels, ncol=2)
    caption = (
        "Bytes each rank put on the wire against density, counted by the "
        "communicator (solid: exact counts of one run, so no interval). Dashed, "
        "models: the least OmniReduce can send, counted from the inputs' block "
        "bitmaps (each worker's non-zero blocks for other ranks' streams and every "
        "block of the union returned to each remote worker, with a 4-byte index "
        "per block)"
    )
    if formula:
        caption += (
            "; and, for the MPI library's Allreduce, whose bytes Python cannot "
            "count, the ring algorithm's volume 2(n-1)/n x size"
        )
    caption += (
        f"{'; ' + ', '.join(fixed) if fixed else ''}. The note gives OmniReduce's "
        "largest overhead over its minimum among the points drawn."
    )
    return [Figure("seed001_wire_bytes", fig, caption + runs_note(frame))]


FIGURES = [
    FigureSpec(
        "seed001_time_vs_sparsity",
        "seed 001",
        "Allreduce time vs sparsity",
        ("harness",),
        time_vs_sparsity,
    ),
    FigureSpec(
        "seed001_time_vs_workers",
        "seed 001",
        "Allreduce time vs workers",
        ("harness",),
        time_vs_workers,
    ),
    FigureSpec(
        "seed001_block_size_fusion",
        "seed 001",
        "Block size and fusion",
        ("harness",),
        block_size_fusion,
    ),
    FigureSpec(
        "seed001_wire_bytes",
        "seed 001",
        "Wire bytes against the minimum",
        ("harness",),
        wire_vs_minimum,
    ),
]
