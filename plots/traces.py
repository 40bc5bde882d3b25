"""What compression saves on a model's training step: trace replays, stacked.

One panel per traced model (and framework), rank count and network rate. Each bar is
one replay (variant, codec, merge strategy): the step time, the mean over its timed
steps, stacked into compute (the emulated gaps and everything else the training thread
did), exposed communication (the waits for the stream) and, inside it, codec time (the
exposed share of the collectives' time spent encoding and decoding, pro rata), with the
95% interval of the step time. On FSDP panels, ticks mark where seed 000's FSDP numbers
would put the collective-level bar: 31.7% below the baseline, 12.5% below
point-to-point compression.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.patches import Patch

from ccbench.kernels import variants
from ccbench.plots import papers
from ccbench.plots.base import Figure, FigureSpec, Skip, link_of, newest_per, rows
from ccbench.plots.style import (
    ROLE_COLORS,
    Style,
    figure,
    legend_below,
    panel_note,
    series_label,
    time_unit,
)

MAX_PANELS = 6
BAR_KEYS = ("variant", "algorithm", "codec", "compress", "merge")
PANEL_KEYS = ("model", "framework", "trace", "ranks", "_link")


def summaries(data) -> pd.DataFrame:
    frame = rows(data, "replay")
    if frame.empty or "row" not in frame.columns:
        return frame.iloc[0:0]
    frame = frame[frame["row"] == "summary"].assign(_link=lambda f: link_of(f))
    for column in BAR_KEYS + ("model", "framework", "trace"):
        if column not in frame.columns:
            frame = frame.assign(**{column: ""})
        frame[column] = frame[column].astype(object).fillna("").astype(str)
    return newest_per(frame, PANEL_KEYS + BAR_KEYS)


def bar_label(row) -> str:
    label = series_label(row["variant"], row["algorithm"], row["codec"])
    if row["merge"]:
        label += f", merged {row['merge']}"
    return label


def panel_title(key) -> str:
    model, framework, trace, ranks, link = key
    where = f"{link:g} Gbit/s" if link > 0 else "shared memory"
    return f"{model or trace} {framework}".strip() + f", {int(ranks)} ranks, {where}"


def saving_text(bars: pd.DataFrame) -> str:
    """The collective-level bar's step time change against the baseline's and
    point-to-point's of the same codec, as the replays measured them (negative: faster,
    the headline table's sign)."""
    lines = []
    base = bars[bars["variant"] == "baseline"]
    for _, coll in bars[bars["variant"] == "coll_compressed"].iterrows():
        for name, other in (
            ("baseline", base),
            ("p2p", bars[(bars["variant"] == "p2p_compressed") & (bars["codec"] == coll["codec"])]),
        ):
            if not other.empty:
                # the headlines' convention: the change of B's (collective level's) time
                change = coll["step_us"] / float(other["step_us"].iloc[0]) - 1
                lines.append(f"coll {coll['codec']} vs {name}: {change:+.1%} step time")
    return "\n".join(lines[:4])


def step_stacks(data, style: Style) -> list[Figure]:
    frame = summaries(data)
    if frame.empty:
        raise Skip("no trace replay summary rows")
    groups = [(key, sub) for key, sub in frame.groupby(list(PANEL_KEYS), sort=True)]
    groups.sort(key=lambda g: (g[0][4] <= 0, -g[0][4], str(g[0][0]), str(g[0][1])))
    groups = groups[:MAX_PANELS]
    fig, axes = figure(len(groups), panel_height=2.9)
    claims = papers.CLAIMS
    paper = {"baseline": claims["training_vs_baseline"], "p2p": claims["training_vs_p2p"]}
    ticked, drawn_series = False, []
    for ax, (key, sub) in zip(axes, groups, strict=True):
        sub = sub.assign(_order=sub["variant"].map(variants.order)).sort_values(
            ["_order", "codec", "merge"], kind="stable"
        )
        scale, unit = time_unit(
            np.nanmax(sub[["step_us", "step_ci_high_us"]].to_numpy(dtype=float))
        )
        names = []
        for x, (_, r) in enumerate(sub.iterrows()):
            color = style.color(r["variant"], r["algorithm"])
            drawn_series.append((r["variant"], r["algorithm"]))
            step, exposed = float(r["step_us"]), float(r["comm_us"])
            codec = min(float(r.get("exposed_codec_us", 0.0) or 0.0), exposed)
            compute = step - exposed
            ax.bar(x, compute / scale, 0.6, color="0.82")
            ax.bar(x, (exposed - codec) / scale, 0.6, bottom=compute / scale, color=color)
            ax.bar(
                x,
                codec / scale,
                0.6,
                bottom=(step - codec) / scale,
                color=color,
                hatch="////",
                edgecolor="white",
                linewidth=0,
            )
            low, high = float(r["step_ci_low_us"]), float(r["step_ci_high_us"])
            if np.isfinite(low) and np.isfinite(high):
                ax.errorbar(
                    x,
                    step / scale,
                    yerr=[[(step - low) / scale], [(high - step) / scale]],
                    color="black",
                    capsize=2,
                    elinewidth=0.7,
                    linestyle="none",
                )
            names.append(bar_label(r))
            if r["variant"] == "coll_compressed" and key[1] == "fsdp":
                ticked |= _paper_ticks(ax, x, sub, r, scale)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=5.4)
        ax.grid(axis="x", visible=False)
        ax.set_ylabel(f"Time per step ({unit})")
        ax.set_title(panel_title(key))
        ax.set_ylim(bottom=0)
        text = saving_text(sub)
        if text:
            panel_note(ax, text)
    handles = [
        Patch(facecolor="0.82", label="compute"),
        *(
            Patch(facecolor=style.color(v, a), label=f"{series_label(v, a)}: exposed communication")
            for v, a in dict.fromkeys(drawn_series)
        ),
        Patch(facecolor="white", hatch="////", edgecolor="0.3", label="codec time in it"),
    ]
    if ticked:
        from matplotlib.lines import Line2D

        handles.append(
            Line2D(
                [],
                [],
                color=ROLE_COLORS["model"],
                linewidth=1.4,
                label="model: seed 000's FSDP saving applied to this panel",
            )
        )
    legend_below(fig, handles, [h.get_label() for h in handles], ncol=2)
    caption = (
        "Trace replays (ccbench trace replay): per traced model, framework, rank count and "
        "network rate (shared memory, or the emulated cluster's links), the step time of "
        "each variant, the mean over the timed steps, stacked into compute (grey: the "
        "emulated compute and the rest of the training thread's time), the communication "
        "the step waited for (coloured by variant) and, hatched, the codec's share of it "
        "(the exposed time split pro rata between the collectives' codec and wire time). "
        "Error bars: the 95% t interval of the step time over the timed steps of one "
        "replay; the notes give the collective-level replay's step time change (negative: "
        "faster, as in the headline table) against replays of one run, not interleaved "
        "(ccbench compare gives those verdicts). Red ticks on FSDP panels: the "
        "collective-level step time "
        f"seed 000 ({papers.PAPERS['seed 000'].short}) reports for FSDP on its GPU "
        f"cluster, {paper['baseline'].value} than the baseline and "
        f"{paper['p2p'].value} than point-to-point compression ({paper['baseline'].source})"
        ", applied to this panel's bars. The paper's regime is network-bound training "
        "on GPUs: panels on emulated links approach it, shared-memory panels do not."
    )
    return [Figure("traces_step_time", fig, caption)]


def _paper_ticks(ax, x: int, sub: pd.DataFrame, coll, scale: float) -> bool:
    """Where seed 000's savings would put the collective-level bar: solid against the
    baseline, dashed against point-to-point compression of the same codec."""
    drawn = False
    for name, fraction, other in (
        ("baseline", 0.317, sub[sub["variant"] == "baseline"]),
        ("p2p", 0.125, sub[(sub["variant"] == "p2p_compressed") & (sub["codec"] == coll["codec"])]),
    ):
        if other.empty:
            continue
        level = float(other["step_us"].iloc[0]) * (1 - fraction) / scale
        ax.plot(
            [x - 0.34, x + 0.34],
            [level, level],
            color=ROLE_COLORS["model"],
            linewidth=1.4,
            linestyle="-" if name == "baseline" else "--",
        )
        drawn = True
    return drawn


FIGURES = [
    FigureSpec(
        "traces_step_time",
        "seed 000",
        "What compression saves on a traced training step (replays)",
        ("replay",),
        step_stacks,
    ),
]
