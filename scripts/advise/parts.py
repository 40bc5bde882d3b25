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
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ccbench.benchmarks.results import read_table
from ccbench.collectives import compression_model as cm
from ccbench.kernels.codecs import parse_codec
from ccbench.kernels.vocabulary import HIERARCHY_MARKS

# Stand-ins where nothing was measured (each shown as "assumed" with its reason)
ASSUMED_CODEC_BPS = 1e9  # a single host core on a large buffer, order of magnitude
ASSUMED_EFFICIENCY = 1.0  # at the floor
MIN_EFFICIENCY_BYTES = 1 << 20  # smaller calls are dominated by per-call costs
RATES_IN_STEP = "codec rates in a step"  # the input that says where the rates came from


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


def _alone_rates(tables: Tables, spec: str, buffer: str) -> tuple[cm.CodecRates, str] | None:
    """The codec's rates alone on one core: its newest codec_throughput row (gradient
    data first, the fused kernels first, ``buffer`` first when given)."""
    rows = [(p, r) for p, r in tables.of("codec") if r.get("codec") == spec]

    def preference(item):
        r = item[1]
        return (
            r.get("data", "").startswith("grad"),
            r.get("kernels") == "fused",
            not buffer or r.get("buffer") == buffer,
            r.get("timestamp", ""),
        )

    if not rows:
        return None
    path, row = max(rows, key=preference)
    where = f"{_where(path, [row])} ({row.get('data')}, {row.get('buffer')}, {row.get('kernels')})"
    rates = cm.CodecRates(
        spec,
        _number(row, "ratio"),
        _number(row, "encode_gbps") * 1e9,
        _number(row, "decode_gbps") * 1e9,
        _number(row, "hop_gbps") * 1e9,
        _number(row, "rel_l2_err"),
    )
    if not math.isfinite(rates.hop_bps):  # no hop measured: a decode and an encode
        rates = replace(rates, hop_bps=1 / (1 / rates.encode_bps + 1 / rates.decode_bps))
    return rates, where


def in_step_codec_s(row: dict) -> float:
    """A compressed harness row's codec time of one call on its critical rank, seconds:
    encode, decode and (collective level: the reduce-scatter's fused decode-add-encode
    hop) reduce, wall time inside the call, as the replay's `codec_us` counts it."""
    parts = ["encode_us", "decode_us"] + (["reduce_us"] if row.get("variant") == cm.COLL else [])
    values = [_number(row, c) for c in parts]
    return sum(values) * 1e-6 if all(math.isfinite(v) for v in values) else math.nan


def _row_share(row: dict) -> float:
    share = _number(row, "ranks_per_device")
    share = share if math.isfinite(share) and share > 0 else _number(row, "ranks_per_core")
    return share if math.isfinite(share) and share > 0 else 1.0


def rows_share(tables: Tables) -> float:
    """The ranks sharing a codec's core in the compressed harness rows on an emulated link
    (their median `ranks_per_core`, or per device), 1.0 where none recorded one."""
    shares = [
        _row_share(r)
        for _, r in tables.of("harness")
        if r.get("variant") in (cm.COLL, cm.P2P)
        and _number(r, "link_gbps") > 0
        and (_number(r, "ranks_per_core") > 0 or _number(r, "ranks_per_device") > 0)
    ]
    return float(np.median(shares)) if shares else 1.0


def _in_step_rows(tables: Tables, spec: str, variant: str, ranks: int, link_gbps: float):
    """The compressed harness rows of this codec (1 MiB and up) with a codec time inside
    the call: this variant, rank count and the link rate nearest ``link_gbps`` first."""
    rows = [
        (p, r)
        for p, r in tables.of("harness")
        if r.get("variant") in (cm.COLL, cm.P2P)
        and r.get("codec") == spec
        and _number(r, "size_bytes") >= MIN_EFFICIENCY_BYTES
        and int(np.nan_to_num(_number(r, "ranks"))) >= 2
        and in_step_codec_s(r) > 0
        and not row_is_hierarchical(r)  # the codec's work as the flat model counts it
        and not row_is_leaders(r)
    ]
    if not rows:
        return []

    def key(pr):
        r = pr[1]
        link = _number(r, "link_gbps")
        off = abs(math.log(link / link_gbps)) if link > 0 and link_gbps > 0 else math.inf
        return (r.get("variant") != variant, int(_number(r, "ranks")) != ranks, off)

    best = key(min(rows, key=key))
    return [(p, r) for p, r in rows if key((p, r)) == best]


def codec_rates(
    tables: Tables,
    spec: str,
    option: str,
    buffer: str = "",
    variant: str = cm.COLL,
    ranks: int = 0,
    link_gbps: float = 0.0,
) -> tuple[cm.CodecRates, list[Input]]:
    """A codec's rates as a step runs them (ranks sharing a core, beside their transport),
    its ratio and its error on the user's data.

    The rates alone on one core (codec_throughput) scaled by the codec's slow-down inside
    real calls: the median, over the compressed harness rows of this codec (this variant,
    rank count and link first), of the row's codec time (encode_us + decode_us, and the
    collective level's reduce_us) over the model's codec time of that call from the alone
    rates and the row's ranks per core. Without codec_throughput rows, one rate from the
    harness rows alone (the call's codec bytes over its codec time, times its share);
    without harness rows the alone rates stand, marked assumed in a step."""
    spec = parse_codec(spec).spec
    alone = _alone_rates(tables, spec, buffer)
    steps = _in_step_rows(tables, spec, variant, ranks, link_gbps)
    where_rows = "; ".join(
        _where(p, [r for q, r in steps if q == p]) for p in sorted({p for p, _ in steps})
    )
    if steps:
        r0 = steps[0][1]
        link = r0.get("link_gbps") or "no emulated"
        at = f"{r0.get('variant')}, {r0.get('ranks')} ranks, {link} Gbit/s link"
    nominal = parse_codec(spec).nominal_ratio()
    if alone is not None:
        rates, where = alone
        inputs = [Input(option, "codec ratio", rates.ratio, where)]
        factors = [
            in_step_codec_s(r)
            / cm.codec_seconds(
                cm.Option(r["variant"], rates),
                r.get("collective", ""),
                _number(r, "size_bytes"),
                int(_number(r, "ranks")),
                _row_share(r),
            )
            for _, r in steps
        ]
        factors = [f for f in factors if math.isfinite(f) and f > 0]
        if factors:
            slow = float(np.median(factors))
            rates = replace(
                rates,
                encode_bps=rates.encode_bps / slow,
                decode_bps=rates.decode_bps / slow,
                hop_bps=rates.hop_bps / slow,
            )
            source = (
                f"in a step: {where} over {slow:.2f} (median in-call codec time over "
                f"the alone rates' of {len(factors)} rows: {where_rows}; {at})"
            )
            kind = Input(option, RATES_IN_STEP, "measured", source)
        else:
            source = f"alone on one core: {where}"
            kind = Input(
                option,
                RATES_IN_STEP,
                "alone on one core",
                "assumed in a step: no compressed harness row of this codec timed its "
                "codec inside a call",
                True,
            )
        inputs.append(kind)
        inputs += [
            Input(option, name, value, source)
            for name, value in (
                ("encode B/s", rates.encode_bps),
                ("decode B/s", rates.decode_bps),
                ("hop B/s", rates.hop_bps),
            )
        ]
        inputs.append(Input(option, "round-trip rel L2", rates.rel_l2, where))
        return rates, inputs
    if steps:
        per_byte = []
        for _, r in steps:
            work = cm.codec_work_bytes(
                r["variant"],
                r.get("collective", ""),
                _number(r, "size_bytes"),
                int(_number(r, "ranks")),
            )
            total = work["encode"] + work["decode"] + work["hop"]
            per_byte.append(total * _row_share(r) / in_step_codec_s(r))
        rate = float(np.median(per_byte))
        ratios = [_number(r, "compression_ratio") for _, r in steps]
        ratios = [x for x in ratios if math.isfinite(x) and x > 0]
        ratio = float(np.median(ratios)) if ratios else nominal
        rates = cm.CodecRates(spec, ratio, rate, rate, rate, math.nan)
        source = (
            f"in a step: {len(per_byte)} rows' codec bytes over their codec time "
            f"({where_rows}; {at})"
        )
        why = "assumed: no codec_throughput row for this codec"
        return rates, [
            Input(
                option,
                "codec ratio",
                ratio,
                source if ratios else why + " (nominal ratio)",
                not ratios,
            ),
            Input(option, RATES_IN_STEP, "measured", source),
            Input(option, "encode B/s", rate, source),
            Input(option, "decode B/s", rate, source),
            Input(option, "hop B/s", rate, source),
            Input(option, "round-trip rel L2", math.nan, why + " (unknown)", True),
        ]
    why = "assumed: no codec_throughput or compressed harness row for this codec"
    rates = cm.CodecRates(
        spec, nominal, ASSUMED_CODEC_BPS, ASSUMED_CODEC_BPS, ASSUMED_CODEC_BPS / 2, math.nan
    )
    return rates, [
        Input(option, "codec ratio", nominal, why + " (nominal ratio)", True),
        Input(option, RATES_IN_STEP, "assumed", why, True),
        Input(option, "encode B/s", ASSUMED_CODEC_BPS, why, True),
        Input(option, "decode B/s", ASSUMED_CODEC_BPS, why, True),
        Input(option, "hop B/s", ASSUMED_CODEC_BPS / 2, why, True),
        Input(option, "round-trip rel L2", math.nan, why + " (unknown)", True),
    ]


# ------------------------------------------------------------------------- overlap


HIERARCHICAL = HIERARCHY_MARKS["node"]  # the algorithm's mark on a `--hierarchy node` row
# through node leaders (`--hierarchy leader`): measured beside the per-local-rank design,
# not an option the advice ranks, so its rows feed no option's parts
LEADERS = HIERARCHY_MARKS["leader"]


def row_is_hierarchical(row: dict) -> bool:
    return (row.get("algorithm") or "").startswith(HIERARCHICAL)


def row_is_leaders(row: dict) -> bool:
    return (row.get("algorithm") or "").startswith(LEADERS)


def _row_variant(row: dict) -> str:
    variant = row.get("variant", "")
    if variant == "baseline":
        across = (row.get("algorithm") or "").removeprefix(HIERARCHICAL)
        return cm.RING if across == "ring" else cm.LIBRARY
    return variant


def _row_ranks_per_node(row: dict) -> int:
    """A row's ranks per node: its `ranks_per_node`, else its ranks over its `nodes`
    (the baseline's hierarchical rows record the layout that way only), else 1."""
    m = _number(row, "ranks_per_node")
    if math.isfinite(m) and m >= 1:
        return int(m)
    ranks, nodes = _number(row, "ranks"), _number(row, "nodes")
    if math.isfinite(nodes) and nodes >= 1 and math.isfinite(ranks) and ranks % nodes == 0:
        return int(ranks // nodes)
    return 1


def intra_rate_from_results(tables: Tables) -> tuple[float, str]:
    """The intra-node rate the newest hierarchical harness row's floor used (its
    `intra_node_gbps`, from `ccbench cluster selfcheck`), b/s, and where it came from;
    (0, "") where none recorded one."""
    rows = [(p, r) for p, r in tables.of("harness") if _number(r, "intra_node_gbps") > 0]
    if not rows:
        return 0.0, ""
    path, row = max(rows, key=lambda pr: pr[1].get("timestamp", ""))
    return _number(row, "intra_node_gbps") * 1e9, _where(path, [row]) + " (intra_node_gbps)"


def row_network(row: dict, declared: cm.Network | None = None) -> cm.Network | None:
    """The link a harness row ran on (its payload ceiling, step cost and burst, as
    `ccbench cluster run` recorded them); rows of a real network: the declared one."""
    rate = _number(row, "link_ceiling_gbps")
    rate = rate if math.isfinite(rate) else _number(row, "link_gbps")
    if not (math.isfinite(rate) and rate > 0):
        return declared
    intra = _number(row, "intra_node_gbps")
    return cm.Network(
        rate * 1e9,
        float(np.nan_to_num(_number(row, "link_step_us"))) * 1e-6,
        float(np.nan_to_num(_number(row, "link_burst_bytes"))),
        _row_ranks_per_node(row) if row_is_hierarchical(row) else 1,
        intra * 1e9 if math.isfinite(intra) and intra > 0 else 0.0,
    )


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
