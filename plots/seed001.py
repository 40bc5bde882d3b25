"""Seed 001 figures: OmniReduce sparse streaming allreduce against its baselines.

Time against sparsity, time against the number of workers, block size with and without
fusion, and the bytes on the wire against the minimum the data require.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ccbench.plots.base import (
    Figure,
    FigureSpec,
    Headline,
    Skip,
    draw_series,
    link_bound_us,
    link_of,
    panel_title,
    rows,
    runs_note,
    wire_bytes,
)
from ccbench.plots.style import (
    Style,
    figure,
    format_bytes,
    legend_below,
    model_handle,
    panel_note,
    tidy_log_axis,
    time_unit,
)

ALGORITHM_ORDER = ("omnireduce", "dense", "dense-ring", "allgather-sparse")
# benchmarks.sparse_streaming's defaults (block 256 as the paper's runs)
CONFIG_DEFAULTS = {"block_size": 256, "fusion": 64, "overlap": "random", "threshold": 0,
                   "aggregators": 0, "window": 8, "streams": 2}
CONFIG_COLUMNS = tuple(CONFIG_DEFAULTS)
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
    return frame["algorithm"].map(
        lambda a: column in RELEVANT.get(a, set(CONFIG_COLUMNS))).astype(bool)


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


def hold_fixed(frame: pd.DataFrame, columns=CONFIG_COLUMNS, keep=()) -> tuple[pd.DataFrame,
                                                                            list[str]]:
    """Rows at one value of each configuration column not on an axis; caption parts.

    The value is chosen among the rows of algorithms that depend on it; rows of the
    others (the dense baselines ignore block size) are kept whatever they recorded."""
    fixed = []
    for column in columns:
        if column in keep or column not in frame.columns:
            continue
        matters = relevant(frame, column)
        value = pick(frame[matters], column, CONFIG_DEFAULTS.get(column))
        if value is None:
            continue
        varied = frame.loc[matters, column].nunique() > 1
        frame = frame[(frame[column] == value) | ~matters]
        if varied or value != CONFIG_DEFAULTS.get(column) or column in ("block_size",
                                                                          "fusion"):
            fixed.append(f"{column.replace('_', ' ')} {fmt(value)}")
    return frame, fixed


def pick_densities(values: pd.Series, targets) -> list[float]:
    """The measured densities nearest (in log scale) to the targets, largest first: the
    panels of a figure that cannot show every density."""
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
    return {"color": style.color("sparse_streaming", algorithm), "label": algorithm,
            "marker": {"omnireduce": "o", "dense": "s", "dense-ring": "D",
                       "allgather-sparse": "^"}.get(algorithm, "v")}


def speedups(frame: pd.DataFrame) -> pd.DataFrame:
    """OmniReduce against dense MPI allreduce, per (ranks, link, overlap, size, density)."""
    keys = ["ranks", "_link", "overlap", "size_bytes", "density"]
    keys = [k for k in keys if k in frame.columns]
    omni = frame[frame["algorithm"] == "omnireduce"]
    dense = frame[frame["algorithm"] == "dense"]
    if omni.empty or dense.empty:
        return pd.DataFrame()
    omni = omni.groupby(keys, as_index=False)["avg_us"].min()
    # dense time does not depend on the data: match it on everything but density
    dense_keys = [k for k in keys if k not in ("density", "overlap")]
    dense = dense.groupby(dense_keys, as_index=False)["avg_us"].min()
    merged = omni.merge(dense, on=dense_keys, suffixes=("", "_dense"))
    return merged.assign(speedup=merged["avg_us_dense"] / merged["avg_us"])


def time_vs_sparsity(data, style: Style) -> list[Figure]:
    frame = sparse_rows(data, required=True)
    if frame["density"].nunique() < 2:
        raise Skip("needs sparse_streaming rows at two or more densities")
    frame, fixed = hold_fixed(frame, keep=("overlap",))
    settings = []
    for (ranks, link), sub in frame.groupby(["ranks", "_link"]):
        size = largest_size(sub)
        sub = sub[sub["size_bytes"] == size]
        for overlap in sorted(sub["overlap"].dropna().unique() if "overlap" in sub else [""],
                              key=lambda o: (o != "random", str(o))):
            part = sub[sub["overlap"] == overlap] if overlap else sub
            dense = sub[sub["algorithm"].isin(("dense", "dense-ring"))]
            part = pd.concat([part, dense]).drop_duplicates()
            settings.append(((ranks, link, overlap, size), part))
    settings.sort(key=lambda s: (s[0][1] <= 0, -s[0][1], s[0][0], s[0][2] != "random"))
    shown = settings[:4]
    fig, axes = figure(len(shown))
    handles, labels, modelled = [], [], False
    for ax, ((ranks, link, overlap, size), sub) in zip(axes, shown, strict=True):
        scale, unit = time_unit(sub["avg_us"])
        for algorithm in algorithms(sub):
            series = sub[sub["algorithm"] == algorithm]
            series = series.assign(sparsity=100.0 * (1.0 - series["density"]))
            series = series.groupby("sparsity", as_index=False).mean(numeric_only=True)
            kw = line_style(style, algorithm)
            line = draw_series(ax, series, "sparsity", "avg_us", scale, errorbars=False, **kw)
            handles.append(line)
            labels.append(algorithm)
            if link > 0:
                model = link_bound_us(sub[sub["algorithm"] == algorithm].assign(
                    collective="allreduce"))
                series_model = pd.DataFrame({"sparsity": 100.0 * (1.0 - sub.loc[
                    sub["algorithm"] == algorithm, "density"]), "model": model})
                series_model = series_model.dropna().groupby("sparsity")["model"].mean()
                if not series_model.empty:
                    ax.plot(series_model.index, series_model / scale, linestyle="--",
                            linewidth=0.8, color=kw["color"], alpha=0.75)
                    modelled = True
        found = speedups(sub)
        if not found.empty:
            target = found.iloc[(found["density"] - 0.1).abs().argsort()[:1]]
            s = target.iloc[0]
            panel_note(ax, f"OmniReduce at {100 * (1 - s['density']):.0f}% sparsity:\n"
                           f"{s['speedup']:.2f}x vs dense", "best")
        ax.set_xlabel("Sparsity (% zero blocks)")
        ax.set_ylabel(f"Allreduce time ({unit})")
        ax.set_ylim(bottom=0)
        ax.set_xlim(-2, 102)
        where = panel_title(ranks, link)
        ax.set_title(f"{where}, {format_bytes(size)}" + (f", {overlap} overlap"
                                                           if overlap else ""))
    if modelled:
        proxy = model_handle()
        handles.append(proxy)
        labels.append(proxy.get_label())
    legend_below(fig, handles, labels)
    caption = ("Allreduce time against sparsity (share of all-zero blocks per worker) for "
               "OmniReduce and the baselines, at the largest tensor size of each run"
               + (f"; {', '.join(fixed)}" if fixed else "") + ". 'random' overlap: each "
               "worker's non-zero blocks are drawn independently; 'all': the same blocks "
               "on every worker; 'none': disjoint.")
    if modelled:
        caption += " Dashed: link-bound model, each rank's wire bytes over the link rate."
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
    handles, labels = [], []
    for ax, density in zip(axes, densities, strict=True):
        sub = frame[(frame["density"] == density) | frame["algorithm"].isin(("dense",
                                                                               "dense-ring"))]
        scale, unit = time_unit(sub["avg_us"])
        for algorithm in algorithms(sub):
            series = sub[sub["algorithm"] == algorithm]
            series = series.groupby("ranks", as_index=False).mean(numeric_only=True)
            line = draw_series(ax, series, "ranks", "avg_us", scale, errorbars=False,
                               **line_style(style, algorithm))
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
    caption = (f"Allreduce time against the number of workers at several densities; "
               f"{format_bytes(size)} tensor, {where}"
               + (f"; {', '.join(fixed)}" if fixed else "") + ". The dense baselines do "
               "not depend on the density and repeat in every panel.")
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
    densities = pick_densities(frame["density"], (1.0, 0.1, 0.01))
    fusions = sorted(frame["fusion"].dropna().unique()) if "fusion" in frame else []
    fig, axes = figure(len(densities), ncols=min(3, len(densities)))
    handles, labels = [], []
    styles = ("-", "--", ":", "-.")
    markers = ("o", "s", "^", "D", "v")
    for ax, density in zip(axes, densities, strict=True):
        sub = frame[frame["density"] == density]
        scale, unit = time_unit(sub["avg_us"])
        for i, fusion in enumerate(fusions or [None]):
            series = sub if fusion is None else sub[sub["fusion"] == fusion]
            series = series.groupby("block_size", as_index=False).mean(numeric_only=True)
            label = "no fusion" if fusion in (None, 0, 1) else f"fusion {fmt(fusion)}"
            (line,) = ax.plot(series["block_size"], series["avg_us"] / scale,
                              color=style.color("sparse_streaming", "omnireduce"),
                              linestyle=styles[i % len(styles)],
                              marker=markers[i % len(markers)], label=label)
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
    caption = (f"OmniReduce allreduce time against block size, with and without block "
               f"fusion (several blocks per message); {format_bytes(size)} tensor, "
               f"{panel_title(ranks, link)}" + (f"; {', '.join(fixed)}" if fixed else "")
               + ".")
    return [Figure("seed001_block_size_fusion", fig, caption + runs_note(frame))]


def wire_vs_minimum(data, style: Style) -> list[Figure]:
    frame = sparse_rows(data, required=True)
    if "wire_bytes_per_rank" not in frame or \
            frame["wire_bytes_per_rank"].notna().sum() == 0:
        raise Skip("needs sparse_streaming rows with measured wire_bytes_per_rank")
    frame, fixed = hold_fixed(frame)
    link = pick(frame, "_link")
    frame = frame[frame["_link"] == link]
    groups = list(frame.groupby("ranks"))[:4]
    fig, axes = figure(len(groups))
    handles, labels = [], []
    for ax, (ranks, sub) in zip(axes, groups, strict=True):
        size = largest_size(sub)
        sub = sub[sub["size_bytes"] == size]
        # the MPI library's Allreduce cannot be counted: its ring volume stands in
        sub = sub.assign(mib=wire_bytes(sub) / 2**20)
        for algorithm in algorithms(sub):
            series = sub[sub["algorithm"] == algorithm]
            series = series.groupby("density", as_index=False).mean(numeric_only=True)
            line = draw_series(ax, series, "density", "mib", errorbars=False,
                               **line_style(style, algorithm))
            handles.append(line)
            labels.append(algorithm)
        omni = sub[(sub["algorithm"] == "omnireduce")]
        if MINIMUM in omni and omni[MINIMUM].notna().any():
            least = omni.groupby("density")[MINIMUM].mean() / 2**20
            least = least[least > 0]
            (line,) = ax.plot(least.index, least.to_numpy(), color="black", linestyle="--",
                              linewidth=0.9, label="OmniReduce minimum")
            handles.append(line)
            labels.append(line.get_label())
            ratio = omni["wire_bytes_per_rank"] / omni[MINIMUM].where(omni[MINIMUM] > 0)
            worst = ratio.max()
            if np.isfinite(worst):
                panel_note(ax, f"OmniReduce: at most\n{100 * (worst - 1):.1f}% over its "
                           "minimum", "best")
        ax.set_xscale("log")
        ax.set_yscale("log")
        tidy_log_axis(ax, "x")
        tidy_log_axis(ax, "y")
        ax.set_xlabel("Density (share of non-zero blocks)")
        ax.set_ylabel("Wire bytes per rank (MiB)")
        ax.set_title(f"{panel_title(ranks, link)}, {format_bytes(size)}")
    legend_below(fig, handles, labels)
    caption = ("Bytes each rank put on the wire (counted by the communicator; for the MPI "
               "library's Allreduce, which Python cannot count, the ring's 2(n-1)/n x "
               "size) against density. Dashed: the least OmniReduce can send, counted "
               "from the inputs' "
               "block bitmaps: each worker's non-zero blocks for other ranks' streams and "
               "every block of the union returned to each remote worker, with a 4-byte "
               "index per block" + (f"; {', '.join(fixed)}" if fixed else "") + ".")
    return [Figure("seed001_wire_bytes", fig, caption + runs_note(frame))]


def headlines(data) -> list[Headline]:
    frame = sparse_rows(data)
    if frame.empty:
        return []
    found = speedups(hold_fixed(frame, keep=("overlap",))[0])
    if found.empty:
        return []
    out = []
    near = found.iloc[(found["density"] - 0.1).abs().argsort()]
    near = near[near["density"] == near["density"].iloc[0]]
    best = near.loc[near["speedup"].idxmax()]
    overall = found.loc[found["speedup"].idxmax()]
    for label, row in ((f"at density {best['density']:g}", best),
                       ("best over all densities", overall)):
        overlap = f", {row['overlap']} overlap" if "overlap" in row else ""
        out.append(Headline(
            "seed 001", f"OmniReduce speed-up over dense allreduce, {label}",
            f"{row['speedup']:.2f}x", "1.4-2.9x at 100 Gbps for network-bound models, "
            "up to 8.2x (end-to-end training, not a micro-benchmark)",
            f"density {row['density']:g}{overlap}, {format_bytes(row['size_bytes'])}, "
            f"{panel_title(row['ranks'], row['_link'])}"))
    return out


FIGURES = [
    FigureSpec("seed001_time_vs_sparsity", "seed 001", "Allreduce time vs sparsity",
               ("harness",), time_vs_sparsity),
    FigureSpec("seed001_time_vs_workers", "seed 001", "Allreduce time vs workers",
               ("harness",), time_vs_workers),
    FigureSpec("seed001_block_size_fusion", "seed 001", "Block size and fusion",
               ("harness",), block_size_fusion),
    FigureSpec("seed001_wire_bytes", "seed 001", "Wire bytes against the minimum",
               ("harness",), wire_vs_minimum),
]
