"""The break-even map of `ccbench advise`: message size against link rate, each cell
coloured by the fastest option there (collectives/compression_model.fastest_map), with a
contour where compression starts to pay (docs/advise.md, "Reading the map")."""

from __future__ import annotations

import numpy as np

from ccbench.collectives import compression_model as cm
from ccbench.plots import style  # noqa: F401  (selects the Agg backend before pyplot)

MAP_RATES_BPS = np.logspace(np.log10(0.1e9), np.log10(400e9), 48)  # 100 Mbit/s .. 400 Gbit/s
MAP_SIZES = 2.0 ** np.arange(12, 31, 0.5)  # 4 KiB .. 1 GiB


def _size_label(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def option_colours(n: int) -> list:
    """n colours, no two alike (tab10, or tab20 beyond ten options)."""
    import matplotlib.pyplot as plt

    palette = plt.get_cmap("tab10" if n <= 10 else "tab20").colors
    if n > len(palette):
        raise ValueError(f"{n} options on one map: at most {len(palette)} colours")
    return list(palette[:n])


def draw_break_even_map(
    path,
    options: list[cm.Option],
    step_s: float,
    collective: str,
    ranks: int,
    codec_share: float = 1.0,
    title: str = "",
    marks: dict | None = None,
) -> None:
    """Write the map to ``path`` (PNG or PDF). ``marks``: label -> (rate b/s, size) of
    points to show (the link advised for, the trace's largest call)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.patches import Patch

    grid = cm.fastest_map(options, MAP_RATES_BPS, MAP_SIZES, step_s, collective, ranks, codec_share)
    used = sorted(set(grid.ravel().tolist()))  # the options fastest somewhere, coloured
    shown = np.searchsorted(used, grid)  # in that order, one colour each
    colours = ListedColormap(option_colours(len(used)))
    norm = BoundaryNorm(np.arange(len(used) + 1) - 0.5, len(used))
    pays = np.isin(grid, [i for i, o in enumerate(options) if o.codec is not None])
    fig, ax = plt.subplots(figsize=(7.5, 5.0), layout="constrained")
    x, y = MAP_SIZES, MAP_RATES_BPS / 1e9
    ax.pcolormesh(x, y, shown, cmap=colours, norm=norm, shading="nearest")
    if pays.any() and not pays.all():
        ax.contour(x, y, pays.astype(float), levels=[0.5], colors="black", linewidths=2)
    for label, (rate, size) in (marks or {}).items():
        ax.plot(size, rate / 1e9, marker="o", color="white", markeredgecolor="black")
        ax.annotate(
            label, (size, rate / 1e9), textcoords="offset points", xytext=(6, 6), fontsize=8
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = MAP_SIZES[::4]
    ax.set_xticks(ticks, [_size_label(t) for t in ticks], rotation=45, ha="right")
    ax.set_xlabel(f"{collective} message size (OSU size, per call)")
    ax.set_ylabel("link payload rate (Gbit/s)")
    ax.set_title(
        title or f"Fastest option, {ranks} ranks; black line: compression starts to pay",
        fontsize=10,
    )
    ax.legend(
        handles=[Patch(color=colours(k), label=options[i].label) for k, i in enumerate(used)]
        + (
            [plt.Line2D([], [], color="black", lw=2, label="break-even")]
            if pays.any() and not pays.all()
            else []
        ),
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
    )
    fig.savefig(path, dpi=120)
    plt.close(fig)
