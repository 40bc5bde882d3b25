"""Conventions shared by every figure: sizes, colours, markers, axes, saving.

One colour per variant (and per algorithm inside a variant, e.g. the sparse baselines),
one marker per codec family with the fill style telling rates apart, log2 message-size
axes labelled in bytes (1K, 1M), figures sized for a paper column, and byte-for-byte
reproducible PNG and PDF files.
"""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path

import matplotlib

from ccbench.collectives.spec import SPECS
from ccbench.kernels import variants

matplotlib.use("Agg")  # files only, never a window; set before pyplot is imported

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import (  # noqa: E402
    FixedLocator,
    FuncFormatter,
    LogLocator,
    NullFormatter,
    NullLocator,
)

COLUMN_WIDTH = 3.5  # inches: one column of a two-column paper
FULL_WIDTH = 7.1  # inches: the full text width
PANEL_HEIGHT = 2.35
PNG_DPI = 200

RC = {
    "font.size": 7.5,
    "axes.titlesize": 7.5,
    "axes.labelsize": 7.5,
    "xtick.labelsize": 6.5,
    "ytick.labelsize": 6.5,
    "legend.fontsize": 6.2,
    "legend.frameon": False,
    "legend.handlelength": 2.2,
    "lines.linewidth": 1.1,
    "lines.markersize": 3.8,
    "axes.grid": True,
    "grid.linewidth": 0.4,
    "grid.alpha": 0.4,
    "axes.linewidth": 0.6,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    # no "tight" bbox: constrained layout already fits everything, and the figure keeps
    # its exact width (one paper column or the text width) at half the drawing cost
    "pdf.fonttype": 42,  # TrueType in the PDF: editable, embeds cleanly
    "svg.hashsalt": "ccbench",
    "path.simplify": False,
}

# Colours: fixed for the variants and algorithms the suite knows, so a variant keeps
# its colour from figure to figure and from report to report.
SERIES_COLORS = {
    ("baseline", "mpi"): "#000000",
    ("baseline", "ring"): "#7f7f7f",
    ("p2p_compressed", None): "#e6770b",
    ("coll_compressed", None): "#1f66b4",
    ("sparse_streaming", "omnireduce"): "#2a9d2a",
    ("sparse_streaming", "dense"): "#000000",
    ("sparse_streaming", "dense-ring"): "#7f7f7f",
    ("sparse_streaming", "allgather-sparse"): "#9a4fc4",
    ("sparse_streaming", "sparcml"): "#b5651d",
}
FALLBACK_COLORS = ("#800000", "#17a2b8", "#6b8e23", "#ff69b4", "#4b0082", "#556b2f")

# Merge strategies are not variants: colours of their own, none a variant's (blue stays
# collective-level, orange point-to-point across the page).
STRATEGY_COLORS = {
    "wfbp": "#17becf",
    "single": "#bcbd22",
    "fixed": "#e377c2",
    "ddp": "#8c564b",
    "mgwfbp": "#00876c",
    "optimal": "#ffb000",
}

# Colours of what is not a series: parts of a call or a step, and models. None is a
# variant's or a strategy's (tests/test_figure_checks.py holds the page to one meaning
# per colour).
ROLE_COLORS = {
    "encode": "#f2c12e",
    "decode": "#f4a582",
    "reduce": "#b2df8a",
    "wait": "#cab2d6",
    "idle": "#e0e0e0",
    "bytes": "#607d8b",
    "time": "#a1887f",
    "model": "#c0392b",
}

# Strategies often coincide (single = fixed:64MB on small models; optimal = mgwfbp):
# distinct markers keep every line visible where they overlap.
STRATEGY_MARKERS = {
    "wfbp": "o",
    "single": "s",
    "fixed": "^",
    "ddp": "v",
    "mgwfbp": "D",
    "optimal": "x",
}

CODEC_MARKERS = {
    "none": "o",
    "fp16": "s",
    "bf16": "D",
    "bfp": "^",
    "zfp": "v",
    "zstd": "P",
    "lossless": "P",
    "shuffle": "P",
    "lz4": "X",
}
FALLBACK_MARKERS = ("*", "h", "<", ">", "p", "8", "d", "H")
# Every codec and rate has a glyph of its own, all filled (hollow is point-to-point's): a
# family's first codec takes the family's marker, its other rates the first free glyph.
MARKER_POOL = ("o", "s", "D", "^", "v", "P", "X", "<", ">", "p", "h", "*", "8", "d", "H")

# Drawn with hollow markers (Style.marker with the variant), and the legend says so.
HOLLOW_VARIANTS = ("p2p_compressed",)

COLLECTIVE_LABELS = {name: spec.label for name, spec in SPECS.items()}


def apply_rc() -> None:
    """Install the shared matplotlib settings (idempotent)."""
    plt.rcParams.update(RC)


def codec_family(codec: str) -> str:
    """'zfp:rate=8' -> 'zfp'; 'fp16' -> 'fp16'."""
    return str(codec).split(":", 1)[0].strip().lower()


def codec_rate(codec: str) -> float | None:
    """The fixed rate in bits per value of a 'family:rate=R' spec, else None."""
    match = re.search(r"rate=([0-9.]+)", str(codec))
    return float(match.group(1)) if match else None


FAMILY_ORDER = ("none", "fp16", "bf16", "bfp", "zfp")


def codec_sort_key(codec: str):
    """Uncompressed, casts, fixed-rate (highest rate first), then the rest by name."""
    family = codec_family(codec)
    rank = FAMILY_ORDER.index(family) if family in FAMILY_ORDER else len(FAMILY_ORDER)
    return (rank, family, -(codec_rate(codec) or 0.0), str(codec))


_LOSSLESS: dict[str, bool | None] = {}


def is_lossless(codec: str) -> bool | None:
    """Whether a codec spec compresses without loss (None: not a codec ccbench knows;
    'none' is no compression, not a lossless codec)."""
    codec = str(codec)
    if codec not in _LOSSLESS:
        from ccbench.kernels.errors import UsageError

        try:
            from ccbench.kernels.codecs import parse_codec

            _LOSSLESS[codec] = (
                None if codec_family(codec) == "none" else not parse_codec(codec).lossy
            )
        except (UsageError, ImportError):
            _LOSSLESS[codec] = None
    return _LOSSLESS[codec]


def codec_label(codec: str) -> str:
    """A codec's name as figures show it: lossless codecs say so."""
    return f"{codec} (lossless)" if is_lossless(codec) else str(codec)


def series_label(variant: str, algorithm: str | None, codec: str | None = None) -> str:
    """Legend text: 'baseline (mpi)', 'collective compressed, fp16'."""
    name = variants.label(variant)
    if variant in ("baseline", "sparse_streaming") and algorithm:
        name = f"{name} ({algorithm})" if variant == "baseline" else str(algorithm)
    if codec and codec != "none":
        name = f"{name}, {codec_label(codec)}"
    return name


class Style:
    """Colour and marker assignment for one report.

    Built from every codec and series in the loaded data so a codec keeps its marker in
    every figure of the report, including codecs the suite does not know by name.
    """

    def __init__(self, codecs=(), series=()):
        self._markers = dict(CODEC_MARKERS)
        extra = sorted({codec_family(c) for c in codecs} - set(self._markers))
        for i, family in enumerate(extra):
            self._markers[family] = FALLBACK_MARKERS[i % len(FALLBACK_MARKERS)]
        self._glyph: dict[str, str] = {}
        known = sorted({str(c) for c in codecs} | {"none"}, key=codec_sort_key)
        # the families' own markers first, to rate 8 where measured (the reproduction's
        # codecs), so those keep their marker in every report
        for codec in sorted(known, key=lambda c: codec_rate(c) not in (None, 8)):
            family = self._markers[codec_family(codec)]
            if family not in self._glyph.values():
                self._glyph[codec] = family
        for codec in known:
            if codec not in self._glyph:
                free = [m for m in MARKER_POOL if m not in self._glyph.values()]
                self._glyph[codec] = (
                    free[0] if free else MARKER_POOL[hash_index(codec, len(MARKER_POOL))]
                )
        self._colors = dict(SERIES_COLORS)
        unknown = sorted({(str(v), str(a)) for v, a in series} - set(self._colors), key=str)
        unknown = [s for s in unknown if (s[0], None) not in self._colors]
        for i, key in enumerate(unknown):
            self._colors[key] = FALLBACK_COLORS[i % len(FALLBACK_COLORS)]

    def color(self, variant: str, algorithm: str | None = None) -> str:
        for key in ((variant, algorithm), (variant, None)):
            if key in self._colors:
                return self._colors[key]
        return FALLBACK_COLORS[hash_index(f"{variant}/{algorithm}", len(FALLBACK_COLORS))]

    def marker(self, codec: str, variant: str | None = None) -> dict:
        """Keyword arguments for plot(): the glyph of one codec and rate, filled, and
        hollow for point-to-point compression (HOLLOW_VARIANTS) where `variant` is given,
        so it shows where it meets the collective-level line."""
        marker = self._glyph.get(str(codec))
        if marker is None:  # a codec the report was not built with
            marker = (
                self._markers.get(codec_family(codec))
                or FALLBACK_MARKERS[hash_index(str(codec), len(FALLBACK_MARKERS))]
            )
        if variant in HOLLOW_VARIANTS:  # see-through and on top: a series under it shows
            return {"marker": marker, "fillstyle": "full", "markerfacecolor": "none", "zorder": 3}
        return {"marker": marker, "fillstyle": "full"}

    @staticmethod
    def strategy_line(strategy: str) -> dict:
        """Colour, marker and line style of one merge strategy."""
        family = str(strategy).split(":", 1)[0].lower()
        return {
            "color": Style.strategy_color(strategy),
            "marker": STRATEGY_MARKERS.get(family, "*"),
            "linestyle": "--" if family == "optimal" else "-",
            "fillstyle": "none" if family in ("single", "ddp") else "full",
            # hollow markers on top, so a line hidden under another still shows
            "zorder": 3 if family in ("single", "ddp") else 2,
        }

    @staticmethod
    def strategy_color(strategy: str) -> str:
        family = str(strategy).split(":", 1)[0].lower()
        if family in STRATEGY_COLORS:
            return STRATEGY_COLORS[family]
        return FALLBACK_COLORS[hash_index(family, len(FALLBACK_COLORS))]


def hash_index(text: str, modulo: int) -> int:
    """A stable index for a name (Python's hash() is salted per process)."""
    return sum(text.encode()) % modulo


def format_bytes(value: float) -> str:
    """1024 -> '1K', 3 * 2**20 -> '3M', 512 -> '512'."""
    if value <= 0 or not math.isfinite(value):
        return ""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        scaled = value / 2**shift
        if scaled >= 1:
            return f"{scaled:.3g}{unit}"
    return f"{value:.3g}"


def size_axis(ax, sizes, axis: str = "x", label: str | None = "Message size (bytes)") -> None:
    """A log2 axis over message sizes with byte labels at powers of two."""
    sizes = np.asarray([s for s in sizes if s and s > 0], dtype=float)
    if sizes.size == 0:
        return
    lo = math.floor(math.log2(sizes.min()))
    hi = math.ceil(math.log2(sizes.max()))
    step = max(1, math.ceil((hi - lo + 1) / 7))
    ticks = [2.0**e for e in range(lo, hi + 1) if (e - lo) % step == 0]
    target = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=2)
    target.set_major_locator(FixedLocator(ticks))
    target.set_major_formatter(FuncFormatter(lambda v, _pos: format_bytes(v)))
    target.set_minor_locator(NullLocator())
    if label:
        (ax.set_xlabel if axis == "x" else ax.set_ylabel)(label)


def plain_number(value: float, _pos=None) -> str:
    """Tick text without powers of ten: 0.02, 0.5, 3, 400, 2e+04."""
    return f"{value:g}"


def tidy_log_axis(ax, axis: str = "y") -> None:
    """Readable ticks on a log axis: 1-2-5 steps on short spans, plain numbers.

    Call after the data are drawn (the spacing follows the axis limits)."""
    target = ax.yaxis if axis == "y" else ax.xaxis
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    if lo <= 0 or hi <= 0:
        return
    decades = math.log10(hi / lo)
    # enough ticks inside a short span that the values drawn sit between labelled ones
    if decades <= 0.7:
        subs = tuple(float(k) for k in range(1, 10))
    elif decades <= 1.5:
        subs = (1.0, 2.0, 3.0, 5.0)
    else:
        subs = (1.0, 3.0) if decades <= 3 else (1.0,)
    target.set_major_locator(LogLocator(base=10, subs=subs))
    target.set_major_formatter(FuncFormatter(plain_number))
    target.set_minor_formatter(NullFormatter())


def y_scale_for(ax, values, ratio: float = 20.0) -> None:
    """Log y when the data span more than `ratio`; a linear axis from zero otherwise."""
    values = np.asarray([v for v in values if v is not None and np.isfinite(v) and v > 0])
    if values.size and values.max() / values.min() > ratio:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)


def spread(values, gap: float) -> list[float]:
    """Positions for labels at `values` (one axis, data units), each at least `gap` from
    its neighbours and as near its own value as that allows: labels that would touch form
    a run `gap` apart, centred on their values' mean (runs that then touch merge), so
    labels of lines that end together fan out around them instead of printing over one
    another. Same order as `values`."""
    runs: list[list[int]] = []  # indices into values, each run ascending

    def start(run):
        return sum(values[i] for i in run) / len(run) - (len(run) - 1) * gap / 2

    for i in sorted(range(len(values)), key=lambda i: values[i]):
        runs.append([i])
        while len(runs) > 1 and start(runs[-2]) + len(runs[-2]) * gap > start(runs[-1]):
            last = runs.pop()
            runs[-1].extend(last)
    out = [0.0] * len(values)
    for run in runs:
        for k, i in enumerate(run):
            out[i] = start(run) + k * gap
    return out


def time_unit(values_us) -> tuple[float, str]:
    """Divisor and unit name so the largest value reads between 1 and 1000."""
    values = np.asarray(values_us, dtype=float)
    top = np.nanmax(values) if values.size else 0.0
    if top >= 1e6:
        return 1e6, "s"
    if top >= 1e3:
        return 1e3, "ms"
    return 1.0, "µs"


def figure(
    npanels: int,
    ncols: int | None = None,
    width: float | None = None,
    panel_height: float = PANEL_HEIGHT,
    sharey: bool = False,
    sharex: bool = False,
):
    """A figure with `npanels` axes in a grid; column width for 1 panel, full width else."""
    apply_rc()
    if ncols is None:
        ncols = 1 if npanels == 1 else (2 if npanels in (2, 4) else 3)
    ncols = max(1, min(ncols, npanels))
    nrows = math.ceil(npanels / ncols)
    if width is None:
        width = COLUMN_WIDTH if ncols == 1 else (FULL_WIDTH if ncols >= 3 else 0.8 * FULL_WIDTH)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(width, panel_height * nrows + 0.35),
        squeeze=False,
        sharey=sharey,
        sharex=sharex,
        layout="constrained",
    )
    flat = list(axes.flat)
    for ax in flat[npanels:]:
        ax.set_visible(False)
    return fig, flat[:npanels]


def legend_below(fig, handles, labels, ncol: int | None = None) -> None:
    """One legend for the whole figure, under the panels (keeps the data unobstructed)."""
    if not handles:
        return
    unique = dict(zip(labels, handles, strict=True))
    if ncol is None:
        ncol = min(len(unique), 4 if fig.get_figwidth() > COLUMN_WIDTH + 0.1 else 2)
    # no wider than the figure: a column is the handle, the gaps and the longest label
    em = RC["legend.fontsize"] / 72.0
    column = (RC["legend.handlelength"] + 2.0) * em + 0.5 * em * max(map(len, unique))
    ncol = max(1, min(ncol, len(unique), int(fig.get_figwidth() // column)))
    fig.legend(
        list(unique.values()),
        list(unique.keys()),
        loc="outside lower center",
        ncol=ncol,
        columnspacing=1.2,
    )


def variant_codec_handles(style: Style, keys, hollow: bool = False) -> tuple[list, list]:
    """Legend entries that factor colour and marker: one line per variant (colour), one
    marker per codec, instead of one entry per combination. `hollow`: the figure drew
    HOLLOW_VARIANTS' markers hollow (Style.marker with the variant): the legend says so."""
    handles, labels = [], []
    seen_series, seen_codecs = {}, {}
    for variant, algorithm, codec in keys:
        algo = algorithm if variant in ("baseline", "sparse_streaming") else None
        seen_series.setdefault((variant, algo), None)
        seen_codecs.setdefault(codec, None)
    first_codec = {}
    for variant, _, codec in keys:
        first_codec.setdefault(variant, codec)
    for variant, algo in seen_series:
        label = series_label(variant, algo)
        face = {}
        if hollow and variant in HOLLOW_VARIANTS:  # its markers are drawn hollow: say so
            label += " (hollow markers)"
            face = style.marker(first_codec[variant], variant)
            face.pop("zorder", None)
        handles.append(Line2D([], [], color=style.color(variant, algo), label=label, **face))
        labels.append(label)
    for codec in sorted(seen_codecs, key=codec_sort_key):
        label = "uncompressed" if codec == "none" else codec_label(codec)
        handles.append(
            Line2D([], [], color="0.3", linestyle="none", label=label, **style.marker(codec))
        )
        labels.append(label)
    return handles, labels


def model_handle(label: str = "model: link-bound") -> Line2D:
    """Legend proxy for the dashed model lines."""
    return Line2D([], [], color="0.35", linestyle="--", linewidth=0.9, label=label)


def panel_note(ax, text: str, where: str = "below") -> None:
    """A small boxed note next to a panel (percentages, fit parameters), outside the
    axes so it never hides a point: under the axis's tick labels and label (placed when
    the figure is saved, once their size is known), or at the right of the panel."""
    lines = text.split("\n")
    handles = [Line2D([], [], linestyle="none", marker="none") for _ in lines]
    if where == "right":
        anchor, loc = (1.02, 1.0), "upper left"
    else:
        anchor, loc = (0.5, 0.0), "upper center"
    note = ax.legend(
        handles,
        lines,
        loc=loc,
        bbox_to_anchor=anchor,
        bbox_transform=ax.transAxes,
        handlelength=0,
        handletextpad=0,
        borderpad=0.35,
        labelspacing=0.15,
        fontsize=6,
        frameon=True,
        fancybox=True,
        framealpha=1.0,
        edgecolor="0.7",
        borderaxespad=0.0,
    )
    note.get_frame().set_linewidth(0.5)
    note.set_gid("note-below" if where != "right" else "note-right")


def place_notes(fig) -> None:
    """Move every note placed under a panel below that panel's x-axis decorations."""
    from matplotlib.transforms import offset_copy

    notes = [
        ax
        for ax in fig.axes
        if ax.get_legend() is not None and ax.get_legend().get_gid() == "note-below"
    ]
    if not notes:
        return
    fig.canvas.draw()  # lays the figure out: tick labels and x labels get their size
    renderer = fig.canvas.get_renderer()
    for ax in notes:
        below = ax.get_window_extent(renderer).y0 - ax.xaxis.get_tightbbox(renderer).y0
        gap = max(below, 0.0) * 72.0 / fig.dpi + 3.0  # points
        ax.get_legend().set_bbox_to_anchor(
            (0.5, 0.0), transform=offset_copy(ax.transAxes, fig=fig, y=-gap, units="points")
        )


def note_texts(ax) -> list[str]:
    """The lines of a panel's note (for tests and the report)."""
    legend = ax.get_legend()
    return [t.get_text() for t in legend.get_texts()] if legend is not None else []


def close_all() -> None:
    """Drop every open figure (after a figure function failed half-way)."""
    plt.close("all")


MIN_PANEL_HEIGHT = 1.2  # inches a panel keeps beside its legends and notes
MIN_PANEL_WIDTH = 1.2


def keep_panel_sizes(fig) -> None:
    """Grow the figure until every panel keeps MIN_PANEL_HEIGHT and MIN_PANEL_WIDTH: the
    constrained layout gives a figure legend, a note or a long label beside the panels
    the room it asks and the panels what is left, which may be nothing."""
    panels = [
        ax
        for ax in fig.axes
        if ax.get_visible() and ax.get_navigate() and ax.get_label() != "<colorbar>"
    ]
    if not panels:
        return
    rows = len({round(ax.get_subplotspec().rowspan.start) for ax in panels if ax.get_subplotspec()})
    cols = len({round(ax.get_subplotspec().colspan.start) for ax in panels if ax.get_subplotspec()})
    for _ in range(4):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "constrained_layout not applied"
            fig.draw_without_rendering()
        width, height = fig.get_size_inches()
        short = min(ax.get_position().height for ax in panels) * height
        narrow = min(ax.get_position().width for ax in panels) * width
        if short >= MIN_PANEL_HEIGHT - 0.01 and narrow >= MIN_PANEL_WIDTH - 0.01:
            return
        grow_h = max(0.0, MIN_PANEL_HEIGHT - max(short, 0.0)) * max(rows, 1)
        grow_w = max(0.0, MIN_PANEL_WIDTH - max(narrow, 0.0)) * max(cols, 1)
        fig.set_size_inches(width + grow_w, height + grow_h)


def save(fig, outdir: Path, name: str, formats=("png", "pdf"), dpi: int = PNG_DPI) -> list[Path]:
    """Write NAME.png and/or NAME.pdf with no timestamps: reruns give identical bytes."""
    outdir.mkdir(parents=True, exist_ok=True)
    keep_panel_sizes(fig)
    place_notes(fig)
    written = []
    # the saved image holds every label and note, however long (nothing clipped)
    tight = {"bbox_inches": "tight", "pad_inches": 0.04}
    if "png" in formats:
        written.append(outdir / f"{name}.png")
        fig.savefig(written[-1], dpi=dpi, metadata={"Software": None}, **tight)
    if "pdf" in formats:
        written.append(outdir / f"{name}.pdf")
        fig.savefig(
            written[-1],
            metadata={"CreationDate": None, "ModDate": None, "Producer": None, "Creator": None},
            **tight,
        )
    plt.close(fig)
    return written
