"""General figures: bus bandwidth against size, and codec throughput against a copy."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ccbench.plots.base import (
    Figure,
    FigureSpec,
    Skip,
    draw_series,
    held_text,
    hold_configuration,
    interval_caption,
    link_of,
    main_codecs,
    newest_per,
    panel_title,
    panels,
    rows,
    runs_note,
    series_keys,
    time_bounds,
)
from ccbench.plots.headlines import REAL_GRADIENT
from ccbench.plots.style import (
    COLLECTIVE_LABELS,
    ROLE_COLORS,
    Style,
    codec_label,
    codec_sort_key,
    figure,
    format_bytes,
    is_lossless,
    legend_below,
    series_label,
    size_axis,
    tidy_log_axis,
    variant_codec_handles,
)

MAX_ROWS = 3  # (ranks, link) settings shown in the bandwidth figure


def busbw_vs_size(data, style: Style) -> list[Figure]:
    frame = rows(data, "harness")
    sparse = frame["variant"] == "sparse_streaming"
    frame = frame[~sparse & frame["busbw_gbps"].notna()] if "busbw_gbps" in frame else None
    if frame is None or frame.empty:
        raise Skip("no dense harness rows with busbw_gbps")
    codecs, left_out = main_codecs(frame)
    frame = frame[frame["codec"].isin(["none", *codecs])]
    frame, held = hold_configuration(frame)
    collectives = [c for c in COLLECTIVE_LABELS if c in set(frame["collective"])]
    collectives += sorted(set(frame["collective"]) - set(collectives))
    settings = [key for key, _ in panels(frame)]
    shown = settings[:MAX_ROWS]
    fig, axes = figure(len(shown) * len(collectives), ncols=len(collectives), panel_height=2.1)
    keys, ceiling, kinds = [], None, set()
    for row, (ranks, link) in enumerate(shown):
        setting = frame[(frame["ranks"] == ranks) & (link_of(frame) == link)]
        for col, collective in enumerate(collectives):
            ax = axes[row * len(collectives) + col]
            sub = setting[setting["collective"] == collective]
            sub = newest_per(sub, ["variant", "algorithm", "codec", "size_bytes"])
            # busbw is inversely proportional to the time: the time's interval, inverted
            low, high, kind = time_bounds(sub)
            average = sub["avg_us"].to_numpy(dtype=float)
            sub = sub.assign(
                _lo=sub["busbw_gbps"] * average / high, _hi=sub["busbw_gbps"] * average / low
            )
            for variant, algorithm, codec in series_keys(sub):
                series = sub[
                    (sub["variant"] == variant)
                    & (sub["algorithm"] == algorithm)
                    & (sub["codec"] == codec)
                ]
                _, drawn = draw_series(
                    ax,
                    series,
                    "size_bytes",
                    "busbw_gbps",
                    low="_lo",
                    high="_hi",
                    color=style.color(variant, algorithm),
                    label=series_label(variant, algorithm, codec),
                    **style.marker(codec, variant),
                )
                kinds.add(kind if drawn else None)
                keys.append((variant, algorithm, codec))
            if link > 0:
                ceiling = ax.axhline(
                    link / 8.0,
                    color=ROLE_COLORS["model"],
                    linestyle="--",
                    linewidth=0.9,
                    label="model: link rate (ceiling)",
                )
            if sub.empty:
                ax.text(0.5, 0.5, "no rows", transform=ax.transAxes, ha="center")
            else:
                size_axis(ax, sub["size_bytes"])
                ax.set_yscale("log")
                tidy_log_axis(ax)
            # the setting labels the row once, the collective every column
            ax.set_ylabel(
                f"{panel_title(ranks, link)}\nBus bandwidth (GB/s)"
                if col == 0
                else "Bus bandwidth (GB/s)"
            )
            ax.set_title(COLLECTIVE_LABELS.get(collective, collective))
    handles, labels = variant_codec_handles(style, keys, hollow=True)
    if ceiling is not None:
        handles.append(ceiling)
        labels.append(ceiling.get_label())
    legend_below(fig, handles, labels)
    caption = (
        "Bus bandwidth (nccl-tests' busbw: algbw x (n-1)/n for Allgather and "
        "Reduce-Scatter, x 2(n-1)/n for Allreduce, in GB/s of uncompressed data) "
        "against message size; colour: variant, marker: codec."
    )
    if ceiling is not None:
        caption += (
            " Dashed red, a model: the emulated link rate, the ceiling of an "
            "uncompressed collective; compressed variants can pass it because busbw "
            "counts the bytes before compression."
        )
    caption += interval_caption(kinds).replace(
        "of the mean over the timed calls", "of the mean time, as bandwidth"
    )
    if sparse.any():
        caption += " Sparse-streaming rows are drawn in the seed 001 figures instead."
    if len(settings) > len(shown):
        caption += " Not shown: " + ", ".join(panel_title(*k) for k in settings[len(shown) :])
        caption += "."
    if left_out:
        others = ", ".join(map(codec_label, left_out))
        caption += f" Also measured, left out for legibility: {others}."
    return [Figure("general_busbw", fig, caption + held_text(held) + runs_note(frame))]


def codec_throughput(data, style: Style) -> list[Figure]:
    frame = rows(data, "codec")
    if frame.empty:
        raise Skip("no codec throughput rows")
    keys = [k for k in ("data", "buffer", "dtype") if k in frame.columns]
    settings = list(frame.groupby(keys, sort=True))[:4]
    varied = [k for k in keys if frame[k].nunique() > 1 and k != "data"]
    ncodecs = frame["codec"].nunique()
    fig, axes = figure(
        len(settings), ncols=min(2, len(settings)), panel_height=0.26 * ncodecs + 0.9
    )
    handles, labels = [], []
    # one scale for every panel, so bars compare across data kinds
    rates = frame[["encode_gbps", "decode_gbps"]].to_numpy(dtype=float)
    positive = rates[np.isfinite(rates) & (rates > 0)]
    every_top = float(positive.max()) if positive.size else 1.0
    if "copy_gbps" in frame and frame["copy_gbps"].notna().any():
        every_top = max(every_top, float(frame["copy_gbps"].max()))
    wide = positive.size > 0 and every_top / float(positive.min()) > 30
    # one pair of bars per codec and kernel path (fused, reference) where rows name it
    paths = ["codec", "kernels"] if "kernels" in frame.columns else ["codec"]
    for ax, (key, sub) in zip(axes, settings, strict=True):
        key = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
        sub = sub.groupby(paths, as_index=False).mean(numeric_only=True)
        sub = sub.iloc[
            sorted(
                range(len(sub)),
                key=lambda i: (codec_sort_key(sub["codec"][i]), str(sub[paths[-1]][i])),
            )
        ].reset_index(drop=True)
        y = np.arange(len(sub))[::-1]
        height = 0.38
        enc = ax.barh(
            y + height / 2, sub["encode_gbps"], height, color=ROLE_COLORS["encode"], label="encode"
        )
        dec = ax.barh(
            y - height / 2, sub["decode_gbps"], height, color=ROLE_COLORS["decode"], label="decode"
        )
        handles += [enc, dec]
        labels += ["encode", "decode"]
        top = every_top
        if "copy_gbps" in sub and sub["copy_gbps"].notna().any():
            copy = float(sub["copy_gbps"].median())
            line = ax.axvline(copy, color="black", linestyle=":", linewidth=0.9, label="plain copy")
            handles.append(line)
            labels.append("plain copy")
        ratios = sub["ratio"] if "ratio" in sub else pd.Series(np.nan, index=sub.index)
        names = [
            codec_label(c) + (f" [{k}]" if k in ("fused", "reference", "device") else "")
            for c, k in zip(sub["codec"], sub[paths[-1]], strict=True)
        ]
        ax.set_yticks(
            y,
            [
                f"{name} ({r:.3g}x)" if np.isfinite(r) else name
                for name, r in zip(names, ratios, strict=True)
            ],
        )
        if wide:
            ax.set_xscale("log")
            ax.set_xlim(float(positive.min()) / 2, top * 2)
            tidy_log_axis(ax, "x")
        else:
            ax.set_xlim(0, top * 1.1)
        ax.set_xlabel("Throughput (GB/s)")
        ax.set_title(", ".join([f"{key['data']} data"] + [str(key[k]) for k in varied]))
        ax.grid(axis="y", visible=False)
    legend_below(fig, handles, labels)
    caption = (
        "Codec throughput on one core: encode and decode rate in GB/s of "
        "uncompressed data, against a plain copy of the same buffer (dotted, the "
        "median over codecs); the achieved compression ratio follows each codec's "
        "name, and the kernels that ran in brackets (fused host kernels or the "
        "array-API reference). The suite's goals, fused kernels: bfp:rate=8 at least "
        "0.8x and the casts at least 0.9x the copy rate. A log axis when rates span "
        "more than 30x. No interval: "
        "the rows carry one rate per codec, not its spread over repeats."
    )
    return [Figure("general_codec_throughput", fig, caption + runs_note(frame))]


ACCURACY = (("rel_l2_err", "Relative L2 error", True), ("psnr_db", "PSNR (dB)", False))


def is_real_gradient(kinds: pd.Series) -> pd.Series:
    """Rows measured on the corpus's real gradients (data kind grad:MODEL[:PHASE])."""
    return kinds.astype(str).str.split(":").str[0] == REAL_GRADIENT


def ratio_vs_accuracy(data, style: Style) -> list[Figure]:
    frame = rows(data, "harness")
    metrics = [m for m in ACCURACY if m[0] in frame.columns and frame[m[0]].notna().any()]
    if "data" not in frame.columns or "compression_ratio" not in frame.columns or not metrics:
        raise Skip(
            "the harness rows carry no data kind and accuracy columns (data, "
            "compression_ratio, rel_l2_err or psnr_db)"
        )
    frame = frame[
        (frame["codec"] != "none")
        & is_real_gradient(frame["data"])
        & frame["compression_ratio"].notna()
    ]
    if frame.empty:
        raise Skip(
            f"no compressed rows measured on real gradients (a {REAL_GRADIENT}:MODEL "
            "data kind, e.g. --data gradient after ccbench corpus)"
        )
    frame, held = hold_configuration(frame)
    collectives = [c for c in COLLECTIVE_LABELS if c in set(frame["collective"])]
    fig, axes = figure(len(metrics) * len(collectives), ncols=len(collectives), panel_height=1.9)
    keys, lossless_shown, sizes = [], {}, {}
    lossless_off = {}  # lossless codec -> {collective: smallest error}, where not exactly 0
    for col, collective in enumerate(collectives):
        sub = frame[frame["collective"] == collective]
        # one point per (variant, codec): the row at the largest size measured (a choice
        # among the series' points, not "the same point")
        sub = newest_per(sub, ["variant", "algorithm", "codec", "size_bytes"])
        sub = sub.sort_values("size_bytes", kind="stable").drop_duplicates(
            ["variant", "algorithm", "codec"], keep="last"
        )
        sizes[collective] = sorted(set(sub["size_bytes"]))
        for row_index, (column, name, log) in enumerate(metrics):
            ax = axes[row_index * len(collectives) + col]
            values = sub[column].to_numpy(dtype=float)
            positive = values[np.isfinite(values) & (values > 0)]
            for _, point in sub.iterrows():
                value = float(point[column])
                lossless = bool(is_lossless(point["codec"]))
                kw = dict(
                    color=style.color(point["variant"], point["algorithm"]),
                    linestyle="none",
                    # p2p hollow and on top (Style.marker): it coincides with coll where
                    # both codecs see the same data, and must still show
                    **style.marker(point["codec"], point["variant"]),
                )
                if lossless and log and np.isfinite(value) and value > 0:
                    seen = lossless_off.setdefault(point["codec"], {})
                    seen[collective] = min(value, seen.get(collective, value))
                if lossless and log and value == 0:
                    lossless_shown.setdefault(point["codec"], set()).add(collective)
                    # error exactly 0: on the bottom edge of the log axis
                    ax.plot(
                        [point["compression_ratio"]],
                        [0.0],
                        clip_on=False,
                        transform=ax.get_xaxis_transform(),
                        **kw,
                    )
                elif np.isfinite(value):
                    ax.plot([point["compression_ratio"]], [value], **kw)
                keys.append((point["variant"], point["algorithm"], point["codec"]))
            if log and positive.size:
                ax.set_yscale("log")
                tidy_log_axis(ax)
            ax.set_xlabel("Compression ratio (achieved)")
            ax.set_ylabel(name)
            if row_index == 0:
                ax.set_title(COLLECTIVE_LABELS[collective])
    handles, labels = variant_codec_handles(style, keys, hollow=True)
    legend_below(fig, handles, labels)
    kinds = ", ".join(sorted(set(frame["data"].astype(str))))
    where = "; ".join(
        f"{COLLECTIVE_LABELS[c]} {', '.join(format_bytes(s) for s in v)}" for c, v in sizes.items()
    )
    caption = (
        "Compression ratio against accuracy on real gradients (data kind "
        f"{kinds}): one point per variant and codec, at the largest size measured "
        f"({where}). Colour: variant; marker: codec. The ratio and the errors are "
        "measured on the timed data against the uncompressed result; they are "
        "deterministic for the corpus, so no interval. Up and to the right is "
        "better for PSNR, down and to the right for the relative error."
    )
    names = lambda cs: ", ".join(COLLECTIVE_LABELS[c] for c in collectives if c in cs)  # noqa: E731
    for codec in sorted(set(lossless_shown) | set(lossless_off)):
        zero, off = lossless_shown.get(codec, set()), lossless_off.get(codec, {})
        if zero:
            caption += (
                f" {codec_label(codec)}: error exactly 0 in the {names(zero)}, drawn "
                "on the bottom edge of the error panel."
            )
        if off:
            caption += (
                f" {codec_label(codec)} in the {names(off)}: an error of "
                f"{min(off.values()):.1e} or more, the float32 sums' order of "
                "addition against the float64 reference, not the codec (lossless)."
            )
    return [Figure("general_ratio_vs_accuracy", fig, caption + held_text(held) + runs_note(frame))]


FIGURES = [
    FigureSpec(
        "general_busbw", "general", "Bus bandwidth vs message size", ("harness",), busbw_vs_size
    ),
    FigureSpec(
        "general_codec_throughput",
        "general",
        "Codec throughput against a copy",
        ("codec",),
        codec_throughput,
    ),
    FigureSpec(
        "general_ratio_vs_accuracy",
        "general",
        "Compression ratio against accuracy on real gradients",
        ("harness",),
        ratio_vs_accuracy,
    ),
]
