"""Checks of the drawn figures themselves (matplotlib Figure objects), one per kind of
defect a reader meets: a panel with nothing in it, a legend entry describing a marker no
series draws, a series hidden under another that coincides with it, one quantity in two
units within a figure, a series drawn off its axis, a panel squeezed by the text beside
it, and, across a page, one colour meaning two things. Each returns the problems it finds
as lines of text; `ccbench plot` runs them on every figure it draws and the tests on
every figure the fixtures draw."""

from __future__ import annotations

import re
import warnings

import numpy as np
from matplotlib.colors import to_hex, to_rgb, to_rgba
from matplotlib.lines import Line2D
from matplotlib.patches import Patch


def _data_axes(fig):
    return [
        ax
        for ax in fig.axes
        if ax.get_visible() and ax.get_label() != "<colorbar>" and ax.get_navigate()
    ]


def has_data(ax) -> bool:
    """Whether a panel draws anything of its data: a line in data coordinates (not a
    reference line across the panel, axhline's), a bar, a collection, an image."""
    lines = [
        ln
        for ln in ax.lines
        if ln.get_transform() is ax.transData and len(np.atleast_1d(ln.get_xdata())) > 0
    ]
    return bool(lines or ax.collections or ax.patches or ax.images)


def empty_panels(fig) -> list[str]:
    """Visible panels with nothing drawn in them."""
    return [
        f"panel {ax.get_title() or i!r} is empty"
        for i, ax in enumerate(_data_axes(fig))
        if not has_data(ax)
    ]


def _legends(fig):
    """The figure's legends of series (not the notes placed as legends beside panels)."""
    found = list(fig.legends)
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is not None and not str(legend.get_gid()).startswith("note"):
            found.append(legend)
    return found


def _hollow(line: Line2D) -> bool:
    """Markers drawn as rings: no face, or a white one."""
    face = line.get_markerfacecolor()
    if line.get_fillstyle() == "none" or (isinstance(face, str) and face.lower() == "none"):
        return True
    try:
        r, g, b, a = to_rgba(face)
    except ValueError:
        return False
    return a == 0 or min(r, g, b) > 0.99


def _edge(line: Line2D) -> str:
    try:
        return to_hex(line.get_markeredgecolor())
    except ValueError:
        return ""


def _drawn_lines(fig) -> list[Line2D]:
    return [ln for ax in _data_axes(fig) for ln in ax.lines if ln.get_visible()]


def _marker(line: Line2D):
    marker = line.get_marker()
    return None if marker in (None, "", " ", "None", "none") else marker


def legend_not_drawn(fig) -> list[str]:
    """Legend entries whose marker, or whose hollowness, no drawn series has; patches
    whose colour no drawn bar has."""
    lines = _drawn_lines(fig)
    patches = [p for ax in _data_axes(fig) for p in list(ax.patches) + list(ax.collections)]
    found = []
    for legend in _legends(fig):
        for handle, text in zip(legend.legend_handles, legend.get_texts(), strict=False):
            label = text.get_text()
            if isinstance(handle, Line2D) and _marker(handle) is not None:
                same = [ln for ln in lines if _marker(ln) == _marker(handle)]
                if not same:
                    found.append(f"legend '{label}': marker {_marker(handle)!r} is not drawn")
                    continue
            if "hollow" in label:
                colour = to_hex(handle.get_color()) if isinstance(handle, Line2D) else None
                if colour is not None and _neutral(colour):  # a proxy for every colour
                    colour = None
                hollow = [
                    ln
                    for ln in lines
                    if _hollow(ln)
                    and (colour is None or colour in {to_hex(ln.get_color()), _edge(ln)})
                ]
                if not hollow:
                    found.append(f"legend '{label}': says hollow, but its markers are filled")
            if isinstance(handle, Patch) and handle.get_fill():
                colour = to_hex(handle.get_facecolor())
                faces = set()
                for p in patches:
                    try:
                        faces.update(to_hex(c) for c in np.atleast_2d(p.get_facecolor()))
                    except (ValueError, TypeError):
                        continue
                if colour not in faces and to_hex(handle.get_facecolor()) != "#ffffff":
                    found.append(f"legend '{label}': no bar of its colour {colour} is drawn")
    return found


def hidden_series(fig) -> list[str]:
    """Two labelled series of a panel at the same points, the one on top drawn so that it
    covers the other (filled markers, a solid line): the one below cannot be seen."""
    found = []
    for ax in _data_axes(fig):
        series = [
            (i, ln)
            for i, ln in enumerate(ax.lines)
            if not str(ln.get_label()).startswith("_") and len(np.atleast_1d(ln.get_xdata()))
        ]
        for a in range(len(series)):
            for b in range(a + 1, len(series)):
                (ia, first), (ib, second) = series[a], series[b]
                xa, ya = (np.asarray(v, dtype=float) for v in first.get_data())
                xb, yb = (np.asarray(v, dtype=float) for v in second.get_data())
                if xa.shape != xb.shape or not (
                    np.allclose(xa, xb, equal_nan=True) and np.allclose(ya, yb, equal_nan=True)
                ):
                    continue
                (bottom, _), (top, _) = sorted(
                    ((first, ia), (second, ib)), key=lambda s: (s[0].get_zorder(), s[1])
                )
                shows = _hollow(top) or top.get_linestyle() not in ("-", "solid")
                if not shows and _marker(top) is not None:
                    found.append(
                        f"panel {ax.get_title()!r}: '{bottom.get_label()}' is hidden "
                        f"under '{top.get_label()}' (the same points)"
                    )
    return found


UNIT = re.compile(r"^(.*?)\s*\((s|ms|µs|us|ns)\)\s*$")


def mixed_units(fig) -> list[str]:
    """One quantity labelled in two time units across the panels of one figure."""
    units: dict[str, set[str]] = {}
    for ax in _data_axes(fig):
        label = ax.get_ylabel().split("\n")[-1]
        match = UNIT.match(label)
        if match:
            units.setdefault(match.group(1).strip().lower(), set()).add(match.group(2))
    return [
        f"'{quantity}' in {' and '.join(sorted(found))} across panels"
        for quantity, found in units.items()
        if len(found) > 1
    ]


def off_axis(fig) -> list[str]:
    """Points of a series (in data coordinates) outside its panel's axis limits."""
    found = []
    for ax in _data_axes(fig):
        for line in ax.lines:
            if line.get_transform() is not ax.transData or _marker(line) in ("_", "|"):
                continue
            if not line.get_visible() or str(line.get_label()) == "_nolegend_":
                continue
            x, y = (np.asarray(v, dtype=float) for v in line.get_data())
            if x.size == 0 or x.shape != y.shape:
                continue
            keep = np.isfinite(x) & np.isfinite(y)
            x, y = x[keep], y[keep]
            (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
            outside = (x < x0 * (1 - 1e-9) - 1e-12) | (x > x1 * (1 + 1e-9) + 1e-12)
            outside |= (y < y0 - 1e-9 * abs(y0) - 1e-12) | (y > y1 + 1e-9 * abs(y1) + 1e-12)
            if outside.any():
                found.append(
                    f"panel {ax.get_title()!r}: {int(outside.sum())} point(s) of "
                    f"'{line.get_label()}' off the axis"
                )
    return found


MIN_PANEL_INCHES = 0.6  # a panel narrower or shorter than this shows no reading
PAST_EDGE = 0.05  # of the figure's width or height: text this far out widens the image


def squeezed_panels(fig) -> list[str]:
    """Panels a legend or note beside them squeezed: the layout engine gave the text the
    room it asked and the panel what was left (under MIN_PANEL_INCHES), or, where even
    that was not enough, gave up and left the text past the figure's edge, which the
    saved image's tight box then widens to hold, shrinking every panel in it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "constrained_layout not applied"
        fig.draw_without_rendering()  # the layout engine places the axes at draw time
    width, height = fig.get_size_inches()
    found = []
    for i, ax in enumerate(_data_axes(fig)):
        box = ax.get_position()
        w, h = box.width * width, box.height * height
        if min(w, h) < MIN_PANEL_INCHES:
            found.append(
                f"panel {ax.get_title() or i!r} is {w:.2f} x {h:.2f} in: squeezed by the "
                "text beside it"
            )
    edge = fig.bbox
    for ax in [None, *fig.axes]:
        legends = fig.legends if ax is None else [ax.get_legend()]
        for legend in (lg for lg in legends if lg is not None and lg.get_visible()):
            box = legend.get_window_extent()  # the figure's own renderer
            past = max(
                (edge.x0 - box.x0) / edge.width,
                (box.x1 - edge.x1) / edge.width,
                (edge.y0 - box.y0) / edge.height,
                (box.y1 - edge.y1) / edge.height,
            )
            if past > PAST_EDGE:
                where = f"panel {ax.get_title()!r}" if ax is not None else "the figure"
                found.append(
                    f"{where}: a legend or note runs {past:.0%} of the figure past its "
                    "edge (the saved image widens to hold it and its panels shrink)"
                )
    return found


def check_figure(fig) -> list[str]:
    """Every check of one figure."""
    return (
        empty_panels(fig)
        + legend_not_drawn(fig)
        + hidden_series(fig)
        + mixed_units(fig)
        + off_axis(fig)
        + squeezed_panels(fig)
    )


def _neutral(colour) -> bool:
    r, g, b = to_rgb(colour)
    return max(r, g, b) - min(r, g, b) < 0.02  # black, greys, white: no meaning of their own


def meaning(label: str) -> str:
    """What a legend entry's colour stands for: the series (a model of a series stands
    for it too: 'model: wfbp' is wfbp's), not its codec or its notes; 'model' for a model
    of no series."""
    label = re.sub(r"\s*\((hollow markers|lossless)\)", "", label)
    if label.startswith("model"):
        rest = label.split(":", 1)[1].strip() if ":" in label else ""
        return "model: " + re.split(r"[,:\[(]", rest, maxsplit=1)[0].strip() if rest else "model"
    return re.split(r"[,:\[]", label, maxsplit=1)[0].strip()


def colour_meanings(figures) -> list[str]:
    """Across a page: a colour whose legend entries mean two different things."""
    seen: dict[str, dict[str, str]] = {}
    for name, fig in figures:
        for legend in _legends(fig):
            for handle, text in zip(legend.legend_handles, legend.get_texts(), strict=False):
                colour = (
                    handle.get_color()
                    if isinstance(handle, Line2D)
                    else handle.get_facecolor()
                    if isinstance(handle, Patch) and handle.get_fill()
                    else None
                )
                if colour is None or _neutral(colour):
                    continue
                seen.setdefault(to_hex(colour), {}).setdefault(meaning(text.get_text()), name)
    for meanings in seen.values():
        for name in [m for m in meanings if m.startswith("model: ")]:
            where = meanings.pop(name)
            # a model of a series drawn in its colour stands for that series; any other
            # model is one meaning: "a model"
            if name[len("model: ") :] not in meanings:
                meanings.setdefault("model", where)
    return [
        f"colour {colour} means {len(meanings)} things: "
        + "; ".join(f"'{m}' ({where})" for m, where in sorted(meanings.items()))
        for colour, meanings in sorted(seen.items())
        if len(meanings) > 1
    ]
