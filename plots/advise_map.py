"""The break-even map of `ccbench advise`: message size against link rate, each cell
coloured by the fastest option there (collectives/compression_model.fastest_map), with a
contour where compression starts to pay (docs/advise.md, "Reading the map").

In the page's style (plots/style.py): its fonts and widths, and its colours: the library
black, the ring grey, collective-level compression blue and point-to-point orange, each
codec of a variant a lighter shade of the variant's colour; the break-even line in the
colour of models."""

from __future__ import annotations

import numpy as np

from ccbench.collectives import compression_model as cm
from ccbench.plots import style  # selects the Agg backend before pyplot

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


# The page's colour of each way to run a collective (plots/style.py SERIES_COLORS).
VARIANT_COLOURS = {
    cm.LIBRARY: style.SERIES_COLORS[("baseline", "mpi")],
    cm.RING: style.SERIES_COLORS[("baseline", "ring")],
    cm.COLL: style.SERIES_COLORS[("coll_compressed", None)],
    cm.P2P: style.SERIES_COLORS[("p2p_compressed", None)],
}
NAMES = {cm.LIBRARY: "library (MPI)", cm.RING: "ring"}


def option_label(option: cm.Option) -> str:
    """The option as the page's legends name a series: 'collective compressed, fp16'
    ('..., hierarchical' for a hierarchical one)."""
    node = ", hierarchical" if option.hierarchical else ""
    if option.codec is None:
        return NAMES[option.variant] + node
    return style.series_label(option.variant, None, option.codec.spec) + node


def shades(colour, n: int) -> list:
    """n shades of one colour, from the colour itself towards white (never white)."""
    from matplotlib.colors import to_rgb

    rgb = np.asarray(to_rgb(colour))
    steps = np.linspace(0.0, 0.6, n) if n > 1 else [0.0] * n  # n = 0: none
    return [tuple(rgb + (1.0 - rgb) * t) for t in steps]


def page_colours(options: list[cm.Option]) -> list:
    """One colour per option: its variant's, a lighter shade per further codec (codecs in
    the page's order), so no two options share one and blue means collective-level."""
    out: list = [None] * len(options)
    for variant, colour in VARIANT_COLOURS.items():
        mine = [i for i, o in enumerate(options) if o.variant == variant]
        mine.sort(key=lambda i: style.codec_sort_key(options[i].label.split(":", 1)[-1]))
        for i, shade in zip(mine, shades(colour, len(mine)), strict=True):
            out[i] = shade
    return out


def draw_break_even_map(
    path,
    options: list[cm.Option],
    step_s: float,
    collective: str,
    ranks: int,
    codec_share: float = 1.0,
    title: str = "",
    marks: dict | None = None,
    levels: cm.Network | None = None,
) -> None:
    """Write the map to ``path`` (PNG or PDF). ``marks``: label -> (rate b/s, size) of
    points to show (the link advised for, the trace's largest call); ``levels``: the
    nodes' layout and intra-node rate (fixed; the rate across is the map's axis)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.patches import Patch

    grid = cm.fastest_map(
        options, MAP_RATES_BPS, MAP_SIZES, step_s, collective, ranks, codec_share, levels
    )
    used = sorted(set(grid.ravel().tolist()))  # the options fastest somewhere, coloured
    shown = np.searchsorted(used, grid)  # in that order, one colour each
    every = page_colours(options)
    colours = ListedColormap([every[i] for i in used])
    norm = BoundaryNorm(np.arange(len(used) + 1) - 0.5, len(used))
    pays = np.isin(grid, [i for i, o in enumerate(options) if o.codec is not None])
    style.apply_rc()
    fig, ax = plt.subplots(figsize=(style.FULL_WIDTH, 3.6), layout="constrained")
    x, y = MAP_SIZES, MAP_RATES_BPS / 1e9
    ax.pcolormesh(x, y, shown, cmap=colours, norm=norm, shading="nearest")
    model = style.ROLE_COLORS["model"]
    if pays.any() and not pays.all():
        ax.contour(x, y, pays.astype(float), levels=[0.5], colors=model, linewidths=1.6)
    for label, (rate, size) in (marks or {}).items():
        ax.plot(size, rate / 1e9, marker="o", color="white", markeredgecolor="black")
        ax.annotate(
            label,
            (size, rate / 1e9),
            textcoords="offset points",
            xytext=(6, 6),
            bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "0.7"},
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = MAP_SIZES[::4]
    ax.set_xticks(ticks, [_size_label(t) for t in ticks], rotation=45, ha="right")
    ax.set_xlabel(f"{collective} message size (OSU size, per call)")
    two_level = levels is not None and levels.ranks_per_node > 1
    ax.set_ylabel(
        "link payload rate between nodes (Gbit/s)" if two_level else "link payload rate (Gbit/s)"
    )
    ax.grid(False)
    style.tidy_log_axis(ax)
    layout = f"{ranks} ranks"
    if two_level:
        intra = levels.intra_rate_bps
        layout = f"{levels.nodes(ranks)} nodes x {levels.ranks_per_node} ranks, inside a node " + (
            f"{intra / 1e9:.3g} Gbit/s" if intra else "unknown rate"
        )
    ax.set_title(title or f"Fastest option, {layout}; red line: compression starts to pay")
    ax.legend(
        handles=[
            Patch(color=colours(k), label=option_label(options[i])) for k, i in enumerate(used)
        ]
        + (
            [plt.Line2D([], [], color=model, lw=1.6, label="model: break-even")]
            if pays.any() and not pays.all()
            else []
        ),
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
    )
    png = str(path).lower().endswith(".png")
    fig.savefig(path, dpi=style.PNG_DPI, **({"metadata": {"Software": None}} if png else {}))
    plt.close(fig)
