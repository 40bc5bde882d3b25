"""The measured parts of `ccbench advise`, read from result CSVs, each with where it came
from (file, run id) or marked assumed where no row measured it (docs/advise.md).

- codec rates, ratio and error: `codec_throughput` rows (codec schema) on the user's data;
- overlap efficiency per variant, codec and collective: the harness rows' mean call over
  the model's floor of that call on the row's link (the emulated cluster's, or a declared
  one for a real cluster's rows), with the same codec rates as the prediction;
- the link (payload rate, fixed cost of a ring step, burst): the harness rows' `link_*`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ccbench.benchmarks.results import read_table
from ccbench.collectives import compression_model as cm
from ccbench.kernels.codecs import parse_codec

# Stand-ins where nothing was measured (each shown as "assumed" with its reason)
ASSUMED_CODEC_BPS = 1e9  # a single host core on a large buffer, order of magnitude
ASSUMED_EFFICIENCY = 1.0  # at the floor
MIN_EFFICIENCY_BYTES = 1 << 20  # smaller calls are dominated by per-call costs


@dataclass(frozen=True)
class Input:
    """One input of a prediction: its value and where it came from."""

    option: str  # the option it belongs to ("" for the network and the model)
    name: str
    value: float | str
    source: str
    assumed: bool = False

    def row(self) -> dict:
        value = f"{self.value:.6g}" if isinstance(self.value, float) else self.value
        return {
            "option": self.option,
            "input": self.name,
            "value": value,
            "source": self.source,
            "assumed": "yes" if self.assumed else "no",
        }


@dataclass
class Tables:
    """The rows of every result CSV found, by schema kind, each with its file."""

    rows: dict  # kind -> list of (path, row)

    def of(self, kind: str) -> list[tuple[Path, dict]]:
        return self.rows.get(kind, [])


def read_results(paths: list[str]) -> Tables:
    """Every ccbench result CSV under the given files or folders (missing ones: none)."""
    found: dict = {}
    for root in map(Path, paths):
        files = [root] if root.is_file() else sorted(root.rglob("*.csv")) if root.is_dir() else []
        for path in files:
            try:
                table = read_table(path)
            except (OSError, ValueError, KeyError):
                continue  # not a ccbench result: leave it
            if table is not None:
                found.setdefault(table.schema.kind, []).extend(
                    (path, row) for row in table.current()
                )
    return Tables(found)


def _number(row: dict, column: str) -> float:
    try:
        return float(row.get(column) or "nan")
    except ValueError:
        return math.nan


def _where(path: Path, rows: list[dict]) -> str:
    runs = sorted({r.get("run_id", "") for r in rows if r.get("run_id")})
    return f"{path.name} run {','.join(runs) or '?'}"


# ------------------------------------------------------------------------- codecs


def codec_rates(
    tables: Tables, spec: str, option: str, buffer: str = ""
) -> tuple[cm.CodecRates, list[Input]]:
    """A codec's rates, ratio and error from its newest codec_throughput rows (gradient
    data first, the fused kernels first, ``buffer`` first when given); assumed where none."""
    spec = parse_codec(spec).spec
    rows = [(p, r) for p, r in tables.of("codec") if r.get("codec") == spec]

    def preference(item):
        r = item[1]
        return (
            r.get("data", "").startswith("grad"),
            r.get("kernels") == "fused",
            not buffer or r.get("buffer") == buffer,
            r.get("timestamp", ""),
        )

    if rows:
        path, row = max(rows, key=preference)
        where = (
            f"{_where(path, [row])} ({row.get('data')}, {row.get('buffer')}, {row.get('kernels')})"
        )
        rates = cm.CodecRates(
            spec,
            _number(row, "ratio"),
            _number(row, "encode_gbps") * 1e9,
            _number(row, "decode_gbps") * 1e9,
            _number(row, "hop_gbps") * 1e9,
            _number(row, "rel_l2_err"),
        )
        if not math.isfinite(rates.hop_bps):  # no hop measured: a decode and an encode
            rates = cm.CodecRates(
                spec,
                rates.ratio,
                rates.encode_bps,
                rates.decode_bps,
                1 / (1 / rates.encode_bps + 1 / rates.decode_bps),
                rates.rel_l2,
            )
        return rates, [
            Input(option, name, value, where)
            for name, value in (
                ("codec ratio", rates.ratio),
                ("encode B/s", rates.encode_bps),
                ("decode B/s", rates.decode_bps),
                ("hop B/s", rates.hop_bps),
                ("round-trip rel L2", rates.rel_l2),
            )
        ]
    nominal = parse_codec(spec).nominal_ratio()
    why = "assumed: no codec_throughput row for this codec"
    rates = cm.CodecRates(
        spec, nominal, ASSUMED_CODEC_BPS, ASSUMED_CODEC_BPS, ASSUMED_CODEC_BPS / 2, math.nan
    )
    return rates, [
        Input(option, "codec ratio", nominal, why + " (nominal ratio)", True),
        Input(option, "encode B/s", ASSUMED_CODEC_BPS, why, True),
        Input(option, "decode B/s", ASSUMED_CODEC_BPS, why, True),
        Input(option, "hop B/s", ASSUMED_CODEC_BPS / 2, why, True),
        Input(option, "round-trip rel L2", math.nan, why + " (unknown)", True),
    ]


# ------------------------------------------------------------------------- overlap


def _row_variant(row: dict) -> str:
    variant = row.get("variant", "")
    if variant == "baseline":
        return cm.RING if row.get("algorithm") == "ring" else cm.LIBRARY
    return variant


def row_network(row: dict, declared: cm.Network | None = None) -> cm.Network | None:
    """The link a harness row ran on (its payload ceiling, step cost and burst, as
    `ccbench cluster run` recorded them); rows of a real network: the declared one."""
    rate = _number(row, "link_ceiling_gbps")
    rate = rate if math.isfinite(rate) else _number(row, "link_gbps")
    if not (math.isfinite(rate) and rate > 0):
        return declared
    return cm.Network(
        rate * 1e9,
        float(np.nan_to_num(_number(row, "link_step_us"))) * 1e-6,
        float(np.nan_to_num(_number(row, "link_burst_bytes"))),
    )


def _row_efficiency(
    row: dict, option: cm.Option, network: cm.Network | None, codec_share: float
) -> float:
    """A harness row's mean call over the model's floor of that call, with the same
    inputs (the codec's rates, the ranks sharing its core) as the prediction: what the
    floor leaves out (overlap lost, per-call costs, a codec slower in the call than
    alone) is in this ratio, once."""
    ranks, size = int(_number(row, "ranks")), _number(row, "size_bytes")
    if network is None or ranks < 2 or not math.isfinite(size):
        return math.nan
    if option.codec is not None:  # the ratio the row achieved
        ratio = _number(row, "compression_ratio")
        if math.isfinite(ratio) and ratio > 0:
            option = cm.Option(
                option.variant,
                cm.CodecRates(
                    option.codec.spec,
                    ratio,
                    option.codec.encode_bps,
                    option.codec.decode_bps,
                    option.codec.hop_bps,
                    option.codec.rel_l2,
                ),
            )
    floor = float(
        cm.call_seconds(option, network, row.get("collective", ""), size, ranks, codec_share)[
            "floor"
        ]
    )
    return _number(row, "avg_us") * 1e-6 / floor if floor > 0 else math.nan


def efficiency(
    tables: Tables,
    model: cm.Option,
    collective: str,
    ranks: int,
    link_gbps: float,
    declared: cm.Network | None = None,
    codec_share: float = 1.0,
) -> tuple[float, Input]:
    """The median call-over-floor of the harness rows of this variant, codec and collective
    on an emulated link (1 MiB and up), at the measured link rate nearest ``link_gbps``
    (same rank count first); with a ``declared`` network (a real cluster's, calibrated),
    its rows without an emulated link against that network's floor; assumed 1.0 (at the
    floor) where none."""
    variant, option = model.variant, model.label
    wanted_codec = "none" if model.codec is None else model.codec.spec
    same = [
        (p, r)
        for p, r in tables.of("harness")
        if _row_variant(r) == variant
        and (r.get("codec") or "none") == wanted_codec
        and r.get("collective") == collective
        and _number(r, "size_bytes") >= MIN_EFFICIENCY_BYTES
    ]
    rows = [(p, r) for p, r in same if _number(r, "link_gbps") > 0]
    name = f"efficiency {collective}"
    real = [
        (p, r)
        for p, r in same
        if not _number(r, "link_gbps") > 0 and int(_number(r, "ranks")) == ranks
    ]
    if declared is not None and real:
        values = [
            v
            for v in (_row_efficiency(r, model, declared, codec_share) for _, r in real)
            if math.isfinite(v)
        ]
        if values:
            paths = sorted({p for p, _ in real})
            where = "; ".join(_where(p, [r for q, r in real if q == p]) for p in paths)
            value = float(np.median(values))
            return value, Input(
                option, name, value, where + f" ({len(values)} sizes against the declared link)"
            )
    if not rows:
        return ASSUMED_EFFICIENCY, Input(
            option, name, ASSUMED_EFFICIENCY, "assumed: no harness row on an emulated link", True
        )
    near = min(
        rows,
        key=lambda pr: (
            int(_number(pr[1], "ranks")) != ranks,
            abs(math.log(_number(pr[1], "link_gbps") / link_gbps)),
        ),
    )
    at = _number(near[1], "link_gbps"), near[1].get("ranks")
    chosen = [(p, r) for p, r in rows if (_number(r, "link_gbps"), r.get("ranks")) == at]
    values = [
        v
        for v in (_row_efficiency(r, model, row_network(r), codec_share) for _, r in chosen)
        if math.isfinite(v)
    ]
    if not values:
        return ASSUMED_EFFICIENCY, Input(
            option,
            name,
            ASSUMED_EFFICIENCY,
            "assumed: harness rows lack the call's size or ranks",
            True,
        )
    paths = sorted({p for p, _ in chosen})
    where = "; ".join(_where(p, [r for q, r in chosen if q == p]) for p in paths)
    note = f" ({len(values)} sizes at {at[0]:g} Gbit/s, {at[1]} ranks)"
    # another rate or rank count than asked: measured, but not here
    off = abs(at[0] - link_gbps) > 0.05 * link_gbps or str(at[1]) != str(ranks)
    return float(np.median(values)), Input(
        option, name, float(np.median(values)), where + note + (" [other link]" if off else ""), off
    )


# ------------------------------------------------------------------------- the link


def link_from_results(tables: Tables) -> tuple[cm.Network, list[Input]] | None:
    """The link of the newest harness row on an emulated link: payload ceiling, step
    cost and burst, as `ccbench cluster run` recorded them; None where no row has one."""
    rows = [(p, r) for p, r in tables.of("harness") if _number(r, "link_gbps") > 0]
    if not rows:
        return None
    path, row = max(rows, key=lambda pr: pr[1].get("timestamp", ""))
    where = _where(path, [row])
    ceiling = _number(row, "link_ceiling_gbps")
    rate = ceiling if math.isfinite(ceiling) else _number(row, "link_gbps")
    step = _number(row, "link_step_us")
    burst = _number(row, "link_burst_bytes")
    inputs = [
        Input("", "link payload rate b/s", rate * 1e9, where, not math.isfinite(ceiling)),
        Input(
            "",
            "ring step cost s",
            np.nan_to_num(step) * 1e-6,
            where if math.isfinite(step) else "assumed 0: no selfcheck step cost",
            not math.isfinite(step),
        ),
        Input("", "burst bytes", float(np.nan_to_num(burst)), where),
    ]
    return cm.Network(
        rate * 1e9, float(np.nan_to_num(step)) * 1e-6, float(np.nan_to_num(burst))
    ), inputs
