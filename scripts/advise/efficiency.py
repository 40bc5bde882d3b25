"""An option's overlap efficiency on one collective, read from the harness rows (call
time over the model's floor of that call): the rows of its variant, codec and design at
the link rate and rank count nearest the ones asked, one value per size; assumed (and
never better than the worst measured) where none was measured here (docs/advise.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ccbench.collectives import compression_model as cm
from ccbench.collectives.costmodel import node_link_bytes
from ccbench.scripts.advise.parts import (
    ASSUMED_EFFICIENCY,
    MIN_EFFICIENCY_BYTES,
    Input,
    Tables,
    _number,
    _row_ranks_per_node,
    _row_share,
    _row_variant,
    _where,
    row_is_hierarchical,
    row_is_leaders,
    row_network,
)


def _link_ratio(row: dict) -> float:
    """A hierarchical row's codec ratio across nodes: the bytes the node's link would
    carry uncompressed (costmodel.node_link_bytes) over its `node_link_bytes`."""
    ranks, m = int(np.nan_to_num(_number(row, "ranks"))), _row_ranks_per_node(row)
    sent = _number(row, "node_link_bytes")
    if not (sent > 0 and ranks >= m >= 1):
        return math.nan
    size = _number(row, "size_bytes")
    return node_link_bytes(row.get("collective", ""), size, ranks // m, m, True) / sent


def _same_levels(row: dict, model, collective: str) -> bool:
    """Whether a hierarchical row ran its levels as the option's model has them (rows
    that do not say: yes); a flat row: yes."""
    recorded = str(row.get("levels") or "")
    if not model.hierarchical or recorded in ("", "nan"):
        return True
    return recorded == cm.hierarchical_levels(model, collective)


def _row_efficiency(
    row: dict, option: cm.Option, network: cm.Network | None, codec_share: float
) -> float:
    """A harness row's mean call over the model's floor of that call, with the codec
    rates of the prediction (as a step runs them) and the ranks sharing a core the row
    recorded (else the prediction's): what the floor leaves out (overlap lost, per-call
    costs) is in this ratio, once."""
    floor = _row_floor(row, option, network, codec_share)
    return _number(row, "avg_us") * 1e-6 / floor if floor > 0 else math.nan


def _row_floor(
    row: dict, option: cm.Option, network: cm.Network | None, codec_share: float
) -> float:
    """The model's floor of a harness row's call, seconds (nan where it has none)."""
    ranks, size = int(_number(row, "ranks")), _number(row, "size_bytes")
    if network is None or ranks < 2 or not math.isfinite(size):
        return math.nan
    if row_is_hierarchical(row) and network is not None and network.ranks_per_node == 1:
        network = replace(network, ranks_per_node=_row_ranks_per_node(row))
    if option.codec is not None:  # the ratio the row achieved
        ratio = _number(row, "compression_ratio")
        if row_is_hierarchical(row):  # its ratio counts the uncompressed intra bytes too
            ratio = _link_ratio(row)
        if math.isfinite(ratio) and ratio > 0:
            option = replace(option, codec=replace(option.codec, ratio=ratio))
    if option.codec is not None and (
        _number(row, "ranks_per_core") > 0 or _number(row, "ranks_per_device") > 0
    ):
        codec_share = _row_share(row)  # the sharing the row ran with, as its codec time had
    return float(
        cm.call_seconds(option, network, row.get("collective", ""), size, ranks, codec_share)[
            "floor"
        ]
    )


@dataclass(frozen=True)
class Efficiency:
    """An option's overlap efficiency on one collective: the median of ``values`` (one
    per harness row, its call over its floor ``floors``, at the OSU ``sizes``; the median
    of the rows of 1 MiB and up where there are any), ``here`` when they were measured at
    the link rate and rank count asked."""

    value: float
    input: Input
    values: tuple = ()
    here: bool = False
    sizes: tuple = ()
    floors: tuple = ()

    def for_model(self):
        """What the model takes: measured here at several sizes, each call's time over
        its floor interpolated between the sizes measured around it
        (cm.SizedEfficiency); else the one number."""
        if self.here and self.sizes:
            return cm.SizedEfficiency.of(self.sizes, self.values, self.floors or None)
        return self.value


def assumed(option: str, name: str, why: str) -> Efficiency:
    """The efficiency no row here measured: at the floor, labelled assumed."""
    return Efficiency(ASSUMED_EFFICIENCY, Input(option, name, ASSUMED_EFFICIENCY, why, True))


def efficiency(
    tables: Tables,
    model: cm.Option,
    collective: str,
    ranks: int,
    link_gbps: float,
    declared: cm.Network | None = None,
    codec_share: float = 1.0,
    ranks_per_node: int = 1,
) -> Efficiency:
    """The median call-over-floor of the harness rows of this variant, codec and collective
    on an emulated link (1 MiB and up), at the measured link rate nearest ``link_gbps``
    (same rank count first); with a ``declared`` network (a real cluster's, calibrated),
    its rows without an emulated link against that network's floor. Measured at another
    rate or rank count, or not at all: marked assumed (``worst_measured`` then replaces
    it by the worst efficiency measured of its collective). A hierarchical option's
    rows are the hierarchical ones (`algorithm` hierarchical-*) whose `levels`, where
    recorded, are the ones its model runs, measured here only at ``ranks_per_node``; a
    flat option's, the flat ones."""
    variant, option = model.variant, model.label
    wanted_codec = "none" if model.codec is None else model.codec.spec
    same = [
        (p, r)
        for p, r in tables.of("harness")
        if _row_variant(r) == variant
        and (r.get("codec") or "none") == wanted_codec
        and r.get("collective") == collective
        and row_is_hierarchical(r) == model.hierarchical
        and not row_is_leaders(r)
        and _same_levels(r, model, collective)
    ]
    rows = [(p, r) for p, r in same if _number(r, "link_gbps") > 0]
    layout = ranks_per_node if model.hierarchical else 1
    name = f"efficiency {collective}"
    real = [
        (p, r)
        for p, r in same
        if not _number(r, "link_gbps") > 0 and int(_number(r, "ranks")) == ranks
    ]
    if declared is not None and real:
        values = [
            v
            for v in (_row_efficiency(r, model, declared, codec_share) for _, r in large(real))
            if math.isfinite(v)
        ]
        if values:
            paths = sorted({p for p, _ in real})
            where = "; ".join(_where(p, [r for q, r in real if q == p]) for p in paths)
            value = float(np.median(values))
            return Efficiency(
                value,
                Input(
                    option, name, value, where + f" ({len(values)} sizes against the declared link)"
                ),
                tuple(values),
                True,
            )
    if not rows:
        return assumed(option, name, "assumed: no harness row on an emulated link")

    def layout_of(r: dict) -> int:
        return _row_ranks_per_node(r) if model.hierarchical else 1

    near = min(
        rows,
        key=lambda pr: (
            int(_number(pr[1], "ranks")) != ranks,
            layout_of(pr[1]) != layout,
            abs(math.log(_number(pr[1], "link_gbps") / link_gbps)),
        ),
    )
    at = _number(near[1], "link_gbps"), near[1].get("ranks"), layout_of(near[1])
    chosen = [
        (p, r) for p, r in rows if (_number(r, "link_gbps"), r.get("ranks"), layout_of(r)) == at
    ]
    # a step issues its calls back to back: rows timed so, where there are any
    back_to_back = [(p, r) for p, r in chosen if r.get("timing") == "batch"]
    chosen = back_to_back or chosen
    measured = [
        (_number(r, "size_bytes"), _row_floor(r, model, row_network(r), codec_share), r)
        for _, r in chosen
    ]
    measured = [(s, f, _number(r, "avg_us") * 1e-6 / f) for s, f, r in measured if f > 0]
    if not measured:
        return assumed(option, name, "assumed: harness rows lack the call's size or ranks")
    values = [v for s, _, v in measured if s >= MIN_EFFICIENCY_BYTES] or [v for _, _, v in measured]
    paths = sorted({p for p, _ in chosen})
    where = "; ".join(_where(p, [r for q, r in chosen if q == p]) for p in paths)
    per_node = f", {at[2]} per node" if model.hierarchical else ""
    timed = ", timed back to back" if back_to_back else ""
    note = f" ({len(measured)} rows at {at[0]:g} Gbit/s, {at[1]} ranks{per_node}{timed})"
    # another rate, rank count or layout than asked: measured, but not here
    off = abs(at[0] - link_gbps) > 0.05 * link_gbps or str(at[1]) != str(ranks) or at[2] != layout
    value = float(np.median(values))
    return Efficiency(
        value,
        Input(option, name, value, where + note + (" [other link]" if off else ""), off),
        tuple(v for _, _, v in measured),
        not off,
        tuple(s for s, _, _ in measured),
        tuple(f for _, f, _ in measured),
    )


def large(rows: list) -> list:
    """The (path, row) pairs of 1 MiB and up, where there are any; else all of them."""
    big = [(p, r) for p, r in rows if _number(r, "size_bytes") >= MIN_EFFICIENCY_BYTES]
    return big or rows


def worst_measured(found: dict) -> dict:
    """Every efficiency not measured here replaced by the worst (largest) one measured of
    its collective, by any option at any link (never assumed better than that); 1.0 (at
    the floor) only where nothing measured that collective. ``found``: (option label,
    collective) -> Efficiency; returns the same keys."""
    worst: dict = {}
    for (label, collective), e in found.items():
        if e.values and e.value > worst.get(collective, (0.0, ""))[0]:
            worst[collective] = (e.value, label)
    out = {}
    for (label, collective), e in found.items():
        if e.here or collective not in worst:
            out[label, collective] = e
            continue
        value, by = worst[collective]
        own = f"its own {e.value:.3g} at another link or rank count; " if e.values else ""
        out[label, collective] = Efficiency(
            max(value, e.value if e.values else 0.0),
            replace(
                e.input,
                value=max(value, e.value if e.values else 0.0),
                source=f"assumed: not measured here ({own}"
                f"{e.input.source.removeprefix('assumed: ')}); the worst "
                f"measured of {collective}, {by}'s",
            ),
            e.values,
            False,
        )
    return out


# ------------------------------------------------------------------------- the link
