"""Seed 000 figures: compression-assisted Allgather / Reduce-Scatter (and Allreduce).

Latency against message size for the uncompressed baseline, point-to-point compression
and collective-level compression; sensitivity to the fixed rate. The training run's
figures are in training_runs.
Every note beside a panel is computed from the points drawn in that panel.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ccbench.kernels import variants
from ccbench.plots import papers
from ccbench.plots.base import (
    SEPARATE,
    Figure,
    FigureSpec,
    Skip,
    below_floor,
    below_floor_text,
    draw_series,
    drawn_values,
    fit_axis_to_points,
    floor_us,
    held_text,
    hold_configuration,
    interval_caption,
    link_of,
    main_codecs,
    panel_title,
    panels,
    rows,
    runs_note,
    series_keys,
    strict_bound,
)
from ccbench.plots.compression_notes import (  # noqa: F401 (reductions: the notes' numbers)
    INTERLEAVED_LABEL,
    baseline_reference,
    draw_interleaved,
    drawn_points,
    interleaved_handle,
    reduction_text,
    reductions,
)
from ccbench.plots.style import (
    COLLECTIVE_LABELS,
    ROLE_COLORS,
    Style,
    codec_family,
    codec_label,
    codec_rate,
    figure,
    format_bytes,
    legend_below,
    model_handle,
    panel_note,
    series_label,
    size_axis,
    tidy_log_axis,
    time_unit,
    variant_codec_handles,
)

VARIANTS = (variants.BASELINE, *variants.COMPRESSED)
MAX_PANELS = 4


def draw_model_lines(
    ax, sub: pd.DataFrame, style: Style, scale: float
) -> tuple[bool, pd.DataFrame]:
    """The floor (plots/base.py, the cost model's) next to the baseline and
    collective-level measurements; returns whether anything was drawn (only emulated-link
    rows have it) and the rows measured below their floor, marked with a red x."""
    drawn = False
    below = below_floor(sub)
    if not below.empty:
        ax.plot(
            below["size_bytes"],
            below["avg_us"].astype(float) / scale,
            linestyle="none",
            marker="x",
            markersize=7,
            color=ROLE_COLORS["model"],
            zorder=5,
        )
    _, base = baseline_reference(sub)
    coll = sub[sub["variant"] == "coll_compressed"]
    candidates = [(base, "baseline")] + [
        (coll[coll["codec"] == c], "coll_compressed")
        for c in sorted(coll["codec"].unique(), key=str)
    ]
    for frame, variant in candidates:
        if frame.empty:
            continue
        frame = frame.assign(_model=floor_us(frame)).dropna(subset=["_model"])
        frame = frame.groupby("size_bytes", as_index=False)["_model"].min()
        # a bound of 0 (the shaper's burst covers the message) has no place on a log
        # axis: the line starts at the first size it bounds, not off the bottom
        frame = frame[frame["_model"] > 0]
        if frame.empty:
            continue
        algorithm = base["algorithm"].iloc[0] if variant == "baseline" else None
        ax.plot(
            frame["size_bytes"],
            frame["_model"] / scale,
            linestyle="--",
            linewidth=0.8,
            color=style.color(variant, algorithm),
            alpha=0.75,
            zorder=1,
        )
        drawn = True
    return drawn, below


def paper_numbers(collective: str) -> str:
    keys = {"allgather": "allgather", "reduce_scatter": "reduce_scatter"}
    if collective not in keys:
        return (
            " The paper states no Allreduce numbers; this figure shows the same "
            "comparison for the collective FSDP does not use."
        )
    base = papers.CLAIMS[f"{keys[collective]}_vs_baseline"]
    p2p = papers.CLAIMS[f"{keys[collective]}_vs_p2p"]
    return (
        f" The paper ({papers.PAPERS['seed 000'].short}, {base.source}): "
        f"{base.value} than the baseline, {p2p.value} than point-to-point compression."
    )


def latency_vs_size(data, style: Style, collective: str) -> list[Figure]:
    frame = rows(data, "harness", collective=collective, variant=VARIANTS)
    if frame.empty:
        raise Skip(
            f"no {collective} rows from the baseline, p2p_compressed or coll_compressed variants"
        )
    codecs, left_out = main_codecs(frame)
    frame = frame[frame["codec"].isin(["none", *codecs])]
    frame, held = hold_configuration(frame)
    groups = panels(frame)
    shown, omitted = groups[:MAX_PANELS], groups[MAX_PANELS:]
    fig, axes = figure(len(shown), panel_height=2.35 + 0.12 * (len(codecs) + 1))
    keys, modelled, kinds, no_p2p, flagged, clipped = [], False, set(), False, [], False
    claims, rounds_drawn = [], False
    # one time unit for every panel: the page check refuses a quantity in two units
    scale, unit = time_unit(np.concatenate([drawn_points(sub)["avg_us"] for _, sub in shown]))
    for ax, ((ranks, link), sub) in zip(axes, shown, strict=True):
        points = drawn_points(sub)
        for variant, algorithm, codec in series_keys(points):
            series = points[
                (points["variant"] == variant)
                & (points["algorithm"] == algorithm)
                & (points["codec"] == codec)
            ]
            marker = style.marker(codec, variant)  # p2p hollow: seen where it meets coll
            _, kind = draw_series(
                ax,
                series,
                "size_bytes",
                "avg_us",
                scale,
                low="_lo",
                high="_hi",
                color=style.color(variant, algorithm),
                label=series_label(variant, algorithm, codec),
                **marker,
            )
            kinds.add(kind)
            keys.append((variant, algorithm, codec))
        if link > 0:
            drawn, below = draw_model_lines(ax, points, style, scale)
            modelled |= drawn
            flagged.append(below)
        size_axis(ax, points["size_bytes"])
        ax.set_yscale("log")
        ax.set_ylabel(f"Latency ({unit})")
        ax.set_title(panel_title(ranks, link))
        entries = reductions(points, rows(data, "compare"), collective, ranks, link)
        no_p2p |= bool(entries) and all(e["vs_p2p"] is None for e in entries)
        rounds_drawn |= draw_interleaved(ax, entries, style, scale)
        # the points, floors, stars and error bars drawn, unless a bar of a few noisy
        # calls reaches a decade beyond them
        stars = [
            us
            for e in entries
            for k in ("vs_baseline", "vs_p2p")
            if e[k] and e[k]["times"]
            for us in e[k]["times"].values()
        ]
        clipped |= fit_axis_to_points(ax, [*points["avg_us"], *stars], scale, also=drawn_values(ax))
        tidy_log_axis(ax)
        text, stated = reduction_text(
            entries,
            f"seed000_{collective}_latency",
            panel_title(ranks, link),
            {"collective": collective, "ranks": ranks, "link": link},
        )
        claims += stated
        if text:
            panel_note(ax, text)
    handles, labels = variant_codec_handles(style, keys, hollow=True)
    if modelled:
        proxy = model_handle("model: the floor")
        handles.append(proxy)
        labels.append(proxy.get_label())
    if rounds_drawn:
        handles.append(interleaved_handle())
        labels.append(INTERLEAVED_LABEL)
    legend_below(fig, handles, labels)
    name = COLLECTIVE_LABELS.get(collective, collective)
    caption = (
        f"{name} latency (average over ranks, log scale) against message size "
        "(OSU convention: per-rank send size for Allgather, whole buffer "
        "otherwise). Colour: variant; marker: codec. The note under each panel "
        "gives, from the points drawn, the collective-level variant's latency change "
        "at the largest size it shares with the baseline: against the baseline and "
        "against point-to-point compression with the same codec. "
        + SEPARATE
        + paper_numbers(collective)
    )
    if rounds_drawn:
        caption += (
            " Stars edged in black: the mean times of the interleaved rounds that "
            "measured the note's comparison (ccbench compare), in the colour of each "
            "side, beside the sweep's separately launched points; where the two point "
            "different ways the note says so."
        )
    if no_p2p:
        caption += " No point-to-point compressed rows were drawn, so there is no 'vs p2p'."
    if modelled:
        caption += (
            " Dashed: a model, the call's floor (docs/compression.md): the bytes "
            "each rank puts on the wire (counted), less the burst its shaper passes "
            "at once, at the link's payload rate, plus each step's fixed cost; the "
            "codec's floor where that is larger."
        )
        if not strict_bound(frame):
            caption += (
                " These rows do not record the link's burst and payload ceiling: "
                "the dashed line uses the configured rate and is not a strict "
                "bound."
            )
    below = pd.concat(flagged) if flagged else pd.DataFrame()
    if not below.empty:
        caption += below_floor_text(below, "point(s) (red x)")
    caption += interval_caption(kinds)
    if clipped:
        caption += (
            " The axis spans the points and what is drawn within a decade of them: "
            "an error bar that runs off it belongs to a point of few, noisy calls."
        )
    if omitted:
        caption += " Not shown: " + ", ".join(panel_title(*k) for k, _ in omitted) + "."
    if left_out:
        others = ", ".join(map(codec_label, left_out))
        caption += (
            f" Also measured, left out for legibility: {others} (see the rate-sensitivity figure)."
        )
    caption += held_text(held) + runs_note(frame)
    return [Figure(f"seed000_{collective}_latency", fig, caption, claims)]


def rate_sensitivity(data, style: Style) -> list[Figure]:
    frame = rows(data, "harness", variant=variants.COMPRESSED)
    if frame.empty:
        raise Skip("no rows from the compressed variants")
    frame, held = hold_configuration(frame)
    frame = frame.assign(
        rate=frame["codec"].map(codec_rate), family=frame["codec"].map(codec_family)
    ).dropna(subset=["rate"])
    if frame["rate"].nunique() < 2:
        raise Skip("needs compressed rows at two or more fixed rates (zfp:rate=R, bfp:rate=R)")
    # One (ranks, link) setting: the one with most rate points.
    groups = panels(frame)
    (ranks, link), sub = max(groups, key=lambda g: g[1]["codec"].nunique())
    collectives = [c for c in COLLECTIVE_LABELS if c in set(sub["collective"])]
    fig, axes = figure(
        2 * len(collectives),
        ncols=len(collectives),
        panel_height=1.9,
        width=None if len(collectives) > 1 else 3.5,
    )
    handles, labels, kinds = [], [], set()
    everything = rows(data, "harness", collective=tuple(collectives))
    everything = everything[(everything["ranks"] == ranks) & (link_of(everything) == link)]
    for col, collective in enumerate(collectives):
        ax_time, ax_err = axes[col], axes[len(collectives) + col]
        part = sub[sub["collective"] == collective]
        counts = part.groupby("size_bytes")["codec"].nunique()
        size = max(counts[counts == counts.max()].index)
        part = drawn_points(part[part["size_bytes"] == size]).assign(
            rate=lambda f: f["codec"].map(codec_rate), family=lambda f: f["codec"].map(codec_family)
        )
        scale, unit = time_unit(part["avg_us"])
        for (variant, family), series in part.groupby(["variant", "family"], sort=True):
            # p2p hollow, on top, dash-dotted (dashed is for models): its error often
            # equals coll's, and must show
            marker = style.marker(series["codec"].iloc[0], variant)
            label = f"{series_label(variant, None)}, {family}"
            hollow = variant == "p2p_compressed"
            kw = dict(
                color=style.color(variant),
                label=label,
                linestyle="-." if hollow else "-",
                **{"zorder": 2, **marker},
            )
            line, kind = draw_series(
                ax_time, series, "rate", "avg_us", scale, low="_lo", high="_hi", **kw
            )
            kinds.add(kind)
            if "max_rel_err" in series and series["max_rel_err"].notna().any():
                ax_err.plot(
                    series.sort_values("rate")["rate"],
                    series.sort_values("rate")["max_rel_err"],
                    **kw,
                )
            handles.append(line)
            labels.append(label)
        _, base = baseline_reference(
            everything[
                (everything["collective"] == collective) & (everything["size_bytes"] == size)
            ]
        )
        if not base.empty:
            row = drawn_points(base).iloc[-1]
            line = ax_time.axhline(
                row["avg_us"] / scale,
                color="black",
                linestyle=":",
                linewidth=0.9,
                label="uncompressed baseline",
            )
            if np.isfinite(row["_lo"]) and np.isfinite(row["_hi"]):
                ax_time.axhspan(
                    row["_lo"] / scale, row["_hi"] / scale, color="black", alpha=0.12, linewidth=0
                )
            handles.append(line)
            labels.append("uncompressed baseline")
        ax_time.set_title(f"{COLLECTIVE_LABELS[collective]}, {format_bytes(size)}")
        ax_time.set_ylabel(f"Latency ({unit})")
        ax_time.set_ylim(bottom=0)
        errors = part["max_rel_err"].to_numpy(dtype=float) if "max_rel_err" in part else []
        if np.isfinite(errors).any() and (np.asarray(errors) > 0).any():
            ax_err.set_yscale("log")
            tidy_log_axis(ax_err)
        ax_err.set_ylabel("Max relative error")
        ax_err.set_xlabel("Rate (bits per value)")
        ax_time.set_xlabel("Rate (bits per value)")
        for ax in (ax_time, ax_err):
            ax.set_xticks(sorted(sub["rate"].unique()))
    fig.suptitle(panel_title(ranks, link), fontsize=7.5)
    legend_below(fig, handles, labels)
    caption = (
        "Sensitivity to the fixed rate of the lossy codecs: latency (top) and "
        "max relative error against the uncompressed result (bottom) as a "
        "function of the bits per value; the dotted line is the uncompressed "
        "baseline at the same size, its shaded band its interval. "
        + error_text(sub)
        + " Errors are measured once on the run's inputs (deterministic: no interval)."
        + interval_caption(kinds)
        + held_text(held)
        + runs_note(sub)
    )
    return [Figure("seed000_rate_sensitivity", fig, caption)]


def error_text(frame: pd.DataFrame) -> str:
    """What the error panels show of point-to-point against collective-level compression,
    from the rows: equal errors (one line over the other), or where p2p's is larger."""
    if "max_rel_err" not in frame.columns:
        return ""
    table = frame.pivot_table(
        index=["collective", "codec", "size_bytes"],
        columns="variant",
        values="max_rel_err",
        aggfunc="last",
    )
    if not {"p2p_compressed", "coll_compressed"} <= set(table.columns):
        return ""
    both = table[["p2p_compressed", "coll_compressed"]].dropna()
    if both.empty:
        return ""
    larger = both[both["p2p_compressed"] > both["coll_compressed"] * (1 + 1e-9)]
    if larger.empty:
        return (
            "Point-to-point and collective-level compression have the same error at "
            "every rate drawn here (hollow, dash-dotted p2p over solid coll): recompressing "
            "at every hop added none on these inputs."
        )
    return (
        f"Point-to-point compression recompresses at every hop: its error is larger "
        f"than collective-level's at {len(larger)} of the {len(both)} rates and "
        "collectives drawn."
    )


FIGURES = [
    FigureSpec(
        "seed000_allgather_latency",
        "seed 000",
        "Allgather latency vs message size",
        ("harness",),
        lambda d, s: latency_vs_size(d, s, "allgather"),
    ),
    FigureSpec(
        "seed000_reduce_scatter_latency",
        "seed 000",
        "Reduce-Scatter latency vs message size",
        ("harness",),
        lambda d, s: latency_vs_size(d, s, "reduce_scatter"),
    ),
    FigureSpec(
        "seed000_allreduce_latency",
        "seed 000",
        "Allreduce latency vs message size",
        ("harness",),
        lambda d, s: latency_vs_size(d, s, "allreduce"),
    ),
    FigureSpec(
        "seed000_rate_sensitivity",
        "seed 000",
        "Sensitivity to the codec rate",
        ("harness",),
        rate_sensitivity,
    ),
]
