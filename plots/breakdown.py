"""Where the time of a compressed collective goes, across sizes: a row per collective.

For each message size, three bars side by side: the MPI library's call (its time only:
Python cannot see inside it), point-to-point compression and collective-level compression,
each stacked from the breakdown columns of its row (encode, decode, reduce, wait, idle on
the critical rank; docs/compression.md). Every bar is divided by the MPI call at that
size (1.0: as fast as the library; no MPI row: by the collective-level call), so sizes
of different magnitude share one axis; a black tick marks the collective-level
pipeline's floor (plots/base.py floor_us, the cost model's one definition), red with a
red x where the call was measured below it. One panel per codec, for the first (ranks,
link) setting, emulated links first.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ccbench.kernels import variants
from ccbench.plots.base import (
    Figure,
    FigureSpec,
    Skip,
    below_floor,
    below_floor_text,
    floor_us,
    link_of,
    main_codecs,
    newest_per,
    panel_title,
    panels,
    rows,
)
from ccbench.plots.style import (
    COLLECTIVE_LABELS,
    ROLE_COLORS,
    SERIES_COLORS,
    Style,
    codec_label,
    codec_sort_key,
    figure,
    format_bytes,
    legend_below,
    series_label,
)

PARTS = (
    ("encode_us", "encode", ROLE_COLORS["encode"]),
    ("decode_us", "decode", ROLE_COLORS["decode"]),
    ("reduce_us", "reduce", ROLE_COLORS["reduce"]),
    ("wait_us", "wait (wire)", ROLE_COLORS["wait"]),
    ("idle_us", "idle", ROLE_COLORS["idle"]),
)
# the MPI library's collective, then each compressed variant by its short name
BARS = ((variants.BASELINE, "MPI"), *((v, variants.kind(v)) for v in variants.COMPRESSED))
MAX_CODECS = 3
COLORS = {v: SERIES_COLORS[(v, None)] for v in variants.COMPRESSED}
BELOW_COLOR = ROLE_COLORS["model"]


def newest(frame):
    return newest_per(frame, ["variant", "algorithm", "codec", "size_bytes"])


def breakdown(data, style: Style) -> list[Figure]:
    frame = rows(data, "harness")
    compressed = frame[frame["variant"].isin(variants.COMPRESSED)]
    if compressed.empty:
        raise Skip("no p2p_compressed or coll_compressed rows")
    if "encode_us" not in compressed.columns:  # rows from before the breakdown existed
        compressed = compressed.assign(
            **{column: np.nan for column, _, _ in PARTS}, call_us=np.nan, floor_us=np.nan
        )
    mpi = frame[(frame["variant"] == "baseline") & (frame["algorithm"] == "mpi")]
    (ranks, link), _ = panels(compressed)[0]
    compressed = compressed[(compressed["ranks"] == ranks) & (link_of(compressed) == link)]
    mpi = mpi[(mpi["ranks"] == ranks) & (link_of(mpi) == link)]
    collectives = [c for c in COLLECTIVE_LABELS if c in set(compressed["collective"])]
    # the reproduction's codecs first (fp16, bfp:rate=8, zfp:rate=8), then the most sizes
    codecs, left_out = main_codecs(compressed, MAX_CODECS)
    codecs = sorted(codecs, key=codec_sort_key)
    # a panel per collective and codec that has rows: no empty panel
    shown = [
        (collective, codec)
        for collective in collectives
        for codec in codecs
        if ((compressed["collective"] == collective) & (compressed["codec"] == codec)).any()
    ]
    # the call the bar stacks up to (the critical rank's), else the average over ranks
    measured = compressed["call_us"].astype(float).fillna(compressed["avg_us"].astype(float))
    compressed = compressed.assign(_floor=floor_us(compressed), _measured=measured)
    below, drew = [], set()
    fig, axes = figure(len(shown), ncols=min(len(codecs), len(shown)), panel_height=2.2)
    for ax, (collective, codec) in zip(axes, shown, strict=True):
        base = newest(mpi[mpi["collective"] == collective]).set_index("size_bytes")["avg_us"]
        sub = newest(compressed[compressed["collective"] == collective])
        below.append(draw_panel(ax, sub[sub["codec"] == codec], base, drew))
        ax.set_title(f"{COLLECTIVE_LABELS[collective]}, {codec_label(codec)}")
        ax.set_ylabel("time / MPI's time" if not base.empty else "time / coll's time")
    handles = [Patch(color=color, label=label) for column, label, color in PARTS if column in drew]
    for variant, _ in BARS[1:]:  # calls without a breakdown: the variant's colour
        if variant in drew and "total" in drew:
            label = f"{series_label(variant, None)}: the call (no breakdown in the row)"
            handles.append(Patch(color=COLORS[variant], label=label))
    if "mpi" in drew:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="///", label="MPI call"))
    if "floor" in drew:
        handles.append(Line2D([], [], color="black", linewidth=1.4, label="coll floor"))
    legend_below(fig, handles, [h.get_label() for h in handles])
    caption = (
        f"{panel_title(ranks, link)}. Per collective and codec, per message size: "
        + bars_text(drew)
        + ", each divided by the MPI call at that size (or by coll where MPI was not run)."
    )
    if "floor" in drew:
        caption += (
            " Black tick: the collective-level pipeline's floor (docs/compression.md): its "
            "wire bytes less the shaper's burst at the link's payload rate plus each "
            "step's fixed cost, or its codec's floor where that is larger."
        )
    if left_out:
        caption += f" Also measured, left out for legibility: {', '.join(left_out)}."
    below = [b for b in below if not b.empty]
    if below:
        points = pd.concat(below)
        names = ", ".join(
            f"{COLLECTIVE_LABELS.get(r.collective, r.collective)} "
            f"{codec_label(r.codec)} at {format_bytes(r.size_bytes)}"
            for r in points.itertuples()
        )
        caption += below_floor_text(points, f"call(s) ({names}; red tick and x)")
    return [Figure("seed000_breakdown", fig, caption)]


def bars_text(drew: set) -> str:
    """What the bars are, of those drawn."""
    parts = []
    if "mpi" in drew:
        parts.append("the MPI library's call (hatched)")
    kinds = [name for variant, name in BARS[1:] if variant in drew]
    if kinds:
        names = {"p2p": "point-to-point (p2p)", "coll": "collective-level (coll)"}
        text = " and ".join(names.get(k, k) for k in kinds) + " compression"
        if drew & {column for column, _, _ in PARTS}:
            text += " stacked from the critical rank's breakdown"
        if "total" in drew:
            text += " (in the variant's colour: the whole call, where a row has no breakdown)"
        parts.append(text)
    return ", ".join(parts) if parts else "nothing"


def draw_panel(ax, sub, base, drew: set) -> pd.DataFrame:
    """Draws one collective and codec's bars; returns its collective-level rows measured
    below their floor (marked in red). Adds to `drew` what it drew: 'mpi', each variant,
    each breakdown column, 'total' (a call without breakdown), 'floor'."""
    below = below_floor(sub[sub["variant"] == "coll_compressed"], "_measured")
    sizes = sorted(set(sub["size_bytes"]))
    present = [(v, name) for v, name in BARS if v != "baseline" and (sub["variant"] == v).any()]
    bars = ([(variants.BASELINE, "MPI")] if not base.empty else []) + present
    width = 0.8 / max(len(bars), 1)
    for i, size in enumerate(sizes):
        at = sub[sub["size_bytes"] == size]
        coll = at[at["variant"] == "coll_compressed"]
        scale = base.get(size, np.nan)
        if not np.isfinite(scale) and not coll.empty:
            scale = float(coll["avg_us"].iloc[0])
        if not np.isfinite(scale) or scale <= 0:
            continue
        for k, (variant, _) in enumerate(bars):
            x = i + (k - (len(bars) - 1) / 2) * width
            if variant == "baseline":
                if size in base.index:
                    ax.bar(
                        x,
                        base[size] / scale,
                        width,
                        facecolor="white",
                        edgecolor="black",
                        hatch="///",
                        linewidth=0.6,
                    )
                    drew.add("mpi")
                continue
            row = at[at["variant"] == variant]
            if row.empty:
                continue
            row = row.iloc[0]
            drew.add(variant)
            bottom = 0.0
            if not np.isfinite(row["encode_us"]):  # no breakdown: the call as one part
                ax.bar(x, float(row["avg_us"]) / scale, width, color=COLORS[variant], linewidth=0)
                drew.add("total")
                continue
            for column, _, color in PARTS:
                value = float(row[column]) / scale if np.isfinite(row[column]) else 0.0
                ax.bar(x, value, width, bottom=bottom, color=color, linewidth=0)
                bottom += value
                if value > 0:
                    drew.add(column)
            if variant == "coll_compressed" and np.isfinite(row["_floor"]):
                floor = float(row["_floor"]) / scale
                low = size in set(below["size_bytes"])
                ax.plot(
                    [x - width / 2, x + width / 2],
                    [floor, floor],
                    color=BELOW_COLOR if low else "black",
                    linewidth=1.4,
                )
                drew.add("floor")
                if low:
                    ax.plot(
                        [x],
                        [float(row["_measured"]) / scale],
                        linestyle="none",
                        marker="x",
                        markersize=7,
                        color=BELOW_COLOR,
                        zorder=5,
                    )
    ax.set_xticks(range(len(sizes)))
    ax.set_xticklabels([format_bytes(s) for s in sizes], fontsize="small")
    ax.set_xlabel("Message size (bytes); bars: " + ", ".join(name for _, name in bars))
    ax.axhline(1.0, color="black", linewidth=0.5, linestyle=":")
    return below


FIGURES = [
    FigureSpec(
        "seed000_breakdown",
        "seed 000",
        "Where the time goes: encode, decode, reduce, wire",
        ("harness",),
        breakdown,
    ),
]
