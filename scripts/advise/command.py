"""`ccbench advise`: should this training step compress, and how? The options (the
library's collective, ccbench's ring, the compressed variants with each codec) ranked by
the predicted step time on a network, from measured parts, each named (docs/advise.md).

    ccbench advise --model gpt2-small --ranks 4 --link 1gbit --latency 200us
    ccbench advise --model gpt2-small --ranks 4 --network measured --max-error 1e-3
    ccbench advise --model results/traces/step.json --network results --results results/main
    ccbench advise --model gpt2-small --ranks 4 --network adv --check     # replays it

Writes the table (CSV), the inputs of every prediction with their sources (CSV) and the
break-even map (PNG). Inputs no result measured are marked assumed, in both.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import replace
from pathlib import Path

from ccbench.benchmarks.options import add_codec_list, codecs_from
from ccbench.collectives import compression_model as cm
from ccbench.collectives import trace_files as tracefile
from ccbench.kernels.errors import UsageError
from ccbench.scripts.advise import efficiency, parts, turns
from ccbench.scripts.advise import table as tables_out

DEFAULT_CODECS = "fp16,bf16,bfp:rate=16,bfp:rate=8,bfp:rate=4"
DEFAULT_RESULTS = "results/main"
DEFAULT_RANKS = 8
# The error budget unless --max-error says otherwise: the per-step error of the runs
# docs/training.md shows within 1% of the uncompressed loss (bfp:rate=8 on lm-small's
# gradients, early ones the worst, 4 ranks, a reduce-scatter's 3 round trips:
# 1.17e-2 x sqrt(3); docs/advise.md)
DEFAULT_MAX_ERROR = 2.03e-2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ccbench advise",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        required=True,
        metavar="TRACE|NAME[:FRAMEWORK]",
        help="a trace file, or a model `ccbench trace build` knows (gpt2-small, "
        "gpt2-small:ddp ...), built for --ranks",
    )
    p.add_argument(
        "--ranks",
        type=int,
        help=f"ranks (default: the trace's, or {DEFAULT_RANKS} for a model name)",
    )
    net = p.add_argument_group("network (one of)")
    net.add_argument(
        "--network",
        default="results",
        metavar="results|measured|CLUSTER",
        help="results (default): the link the harness rows under --results "
        "ran on; measured: the emulated cluster `ccbench cluster` built "
        "(its self-check); or that cluster's name",
    )
    net.add_argument("--link", metavar="RATE", help="a declared link, e.g. 10gbit (with --latency)")
    net.add_argument(
        "--latency",
        metavar="TIME",
        help="with --link, required: the fixed cost of one ring step (hop latency plus "
        "the transport's per-message cost), e.g. 5us (`ccbench cluster selfcheck` "
        "measures it on an emulated link; docs/advise.md fits it on a real one)",
    )
    levels = p.add_argument_group("nodes (two levels)")
    levels.add_argument(
        "--ranks-per-node",
        type=int,
        metavar="M",
        help="M consecutive ranks per node (default: the emulated cluster's layout, else "
        "1): adds the hierarchical options (uncompressed inside a node, the variant "
        "across nodes); --link is then the link between nodes",
    )
    levels.add_argument(
        "--intra-link",
        metavar="RATE",
        help="with --ranks-per-node: the rate between two ranks of a node, e.g. 300gbit "
        "(default: what `ccbench cluster selfcheck` measured, or the harness rows' "
        "intra_node_gbps)",
    )
    p.add_argument(
        "--results",
        nargs="+",
        default=[DEFAULT_RESULTS],
        metavar="PATH",
        help=f"result CSVs or folders to read the parts from ({DEFAULT_RESULTS})",
    )
    add_codec_list(p, DEFAULT_CODECS)
    p.add_argument(
        "--variants",
        default=",".join(cm.VARIANTS),
        help=f"ways to run the collectives ({','.join(cm.VARIANTS)})",
    )
    p.add_argument(
        "--max-error",
        metavar="REL_L2|CODECS",
        help="the relative L2 error a step may carry (default "
        f"{DEFAULT_MAX_ERROR:g}: what the training runs showed harmless, docs/advise.md; "
        "inf: no bound), or the codecs allowed",
    )
    p.add_argument(
        "--buffer",
        default="",
        help="codec rates of this buffer kind first (numpy, torch, torch-cuda)",
    )
    p.add_argument(
        "--ranks-per-core",
        type=float,
        metavar="N",
        help="ranks sharing a codec's core or device (default 1; on the emulated "
        "cluster ranks / this host's cores)",
    )
    p.add_argument(
        "--csv",
        default="advise.csv",
        help="the table (default advise.csv); its inputs go to <stem>-inputs.csv",
    )
    p.add_argument("--map", help="the break-even map (default <csv stem>-map.png)")
    p.add_argument("--top", type=int, default=3, help="options --check replays (3)")
    check = p.add_argument_group("check (replays on the emulated cluster)")
    check.add_argument(
        "--check",
        action="store_true",
        help="replay the top options and the uncompressed ring in "
        "interleaved rounds; predicted against measured",
    )
    check.add_argument(
        "--measure",
        action="store_true",
        help="first measure, on the emulated cluster at these ranks, the parts of the "
        "options not measured here (harness rows at 4-32 MiB into <csv stem>-parts/, "
        "codec_throughput for a codec without a row), then rank",
    )
    check.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    check.add_argument("--steps", type=int, default=2, help="timed steps per replay (2)")
    return p


# ------------------------------------------------------------------------ inputs


def load_step(model: str, ranks: int | None) -> tuple:
    """(trace, its ranks, where it came from)."""
    if Path(model).is_file():
        trace = tracefile.read(model)
        return trace, ranks or trace.ranks, model
    if "/" in model or model.endswith(".json"):
        raise UsageError(f"--model {model}: no such trace file")
    from ccbench.training.trace_build import build_named

    ranks = ranks or DEFAULT_RANKS
    return build_named(model, ranks), ranks, f"built: {model} on {ranks} ranks"


def network_of(opts, tables) -> tuple[cm.Network, list, float, str, float]:
    """(network, its inputs, default ranks per core, cluster name or '', the link's
    nominal rate in Gbit/s: the one the efficiency rows are matched on)."""
    from ccbench.scripts.cluster.command import DEFAULT_NAME
    from ccbench.scripts.cluster.layout import load_state, parse_delay, parse_rate

    if opts.link:
        rate = parse_rate(opts.link)
        if opts.latency is None:
            raise UsageError(
                "--link needs --latency: the fixed cost of one ring step (e.g. 5us; "
                "`ccbench cluster selfcheck` measures it on an emulated link, "
                "fit_alpha_beta on a real one: docs/advise.md)"
            )
        step = parse_delay(opts.latency) * 1e-6
        return (
            cm.Network(rate, step),
            [
                parts.Input("", "link payload rate b/s", float(rate), "declared (--link)"),
                parts.Input("", "ring step cost s", step, "declared (--latency)"),
            ],
            1.0,
            "",
            rate / 1e9,
        )
    if opts.latency is not None:
        raise UsageError("--latency goes with --link (a declared link)")
    if opts.network == "results":
        found = parts.link_from_results(tables)
        if found is None:
            raise UsageError(
                f"no harness row on an emulated link under "
                f"{' '.join(opts.results)}; give --link RATE --latency TIME "
                "or --network measured"
            )
        return (*found, parts.rows_share(tables), "", found[0].rate_bps / 1e9)
    name = DEFAULT_NAME if opts.network == "measured" else opts.network
    cluster = load_state(name)
    if cluster is None:
        raise UsageError(f"no emulated cluster {name!r} (ccbench cluster up --name {name})")
    where = f"cluster {name} (ccbench cluster selfcheck)"
    # R is the floor's: the shaped rate less the frames' headers, as the rows' floors
    # (and so their efficiencies) have it; what TCP reached is in the efficiencies
    rate = cluster.tcp_goodput_bps()
    inputs = [
        parts.Input(
            "",
            "link payload rate b/s",
            float(rate),
            f"cluster {name}: {cluster.link_gbps:g} Gbit/s shaped, less the frames' headers",
        ),
        parts.Input(
            "",
            "TCP goodput b/s (not used)",
            float(cluster.goodput_bps),
            where if cluster.goodput_bps else "selfcheck not run",
        ),
        parts.Input(
            "",
            "ring step cost s",
            cluster.step_us * 1e-6,
            where if cluster.step_us else "assumed 0: selfcheck not run",
            not cluster.step_us,
        ),
        parts.Input("", "burst bytes", float(cluster.burst_bytes), f"cluster {name}"),
    ]
    share = max(1.0, cluster.ranks / (os.cpu_count() or 1))
    return (
        cm.Network(float(rate), cluster.step_us * 1e-6, float(cluster.burst_bytes)),
        inputs,
        share,
        name,
        cluster.link_gbps,
    )


def with_levels(opts, network: cm.Network, tables, cluster_name: str, ranks_hint):
    """The network with its nodes (--ranks-per-node, else the emulated cluster's layout)
    and its intra-node rate (--intra-link, else the cluster's self-check, else the
    hierarchical harness rows'), and the inputs saying where they came from; refusals
    for a layout that does not fit. The intra-node rate is an input of the hierarchical
    options only: unknown, it is assumed (costed 0) and sets them apart."""
    from ccbench.scripts.cluster.layout import load_state, parse_rate

    cluster = load_state(cluster_name) if cluster_name else None
    m, where = opts.ranks_per_node, "--ranks-per-node"
    if m is not None and m < 1:
        raise UsageError(f"--ranks-per-node {m}: must be at least 1")
    if cluster is not None:
        if m is not None and m != cluster.ranks_per_node:
            raise UsageError(
                f"--ranks-per-node {m}: cluster {cluster_name} has {cluster.ranks_per_node} "
                "ranks per node (ccbench cluster up --ranks-per-node)"
            )
        m, where = cluster.ranks_per_node, f"cluster {cluster_name}"
    m = m or 1
    if opts.intra_link and m == 1:
        raise UsageError("--intra-link goes with --ranks-per-node M (M > 1): one rank per node")
    if ranks_hint is not None and ranks_hint % m:
        raise UsageError(f"--ranks-per-node {m}: {ranks_hint} ranks do not make whole nodes")
    if m == 1:
        return network, [], None
    inputs = [parts.Input("", "ranks per node", float(m), where)]
    if opts.intra_link:
        intra, source = float(parse_rate(opts.intra_link)), "declared (--intra-link)"
    elif cluster is not None and cluster.intra_bps:
        intra = float(cluster.intra_bps)
        source = f"cluster {cluster_name} (ccbench cluster selfcheck, between two ranks of a node)"
    else:
        intra, source = parts.intra_rate_from_results(tables)
    intra_input = parts.Input(
        "", "intra-node rate b/s", intra, source or "assumed 0: not measured", not source
    )
    return replace(network, ranks_per_node=m, intra_rate_bps=intra), inputs, intra_input


def variants_and_codecs(opts) -> tuple[list[str], list[str]]:
    """--variants and --codecs, checked (UsageError for an unknown one)."""
    variants = [v.strip() for v in opts.variants.split(",") if v.strip()]
    for v in variants:
        if v not in cm.VARIANTS:
            raise UsageError(f"unknown variant {v!r} (variants: {', '.join(cm.VARIANTS)})")
    return variants, [codec.spec for codec in codecs_from(opts.codecs.split(","))]


def options_of(
    opts,
    tables,
    ranks: int,
    link_gbps: float,
    collectives,
    declared: cm.Network | None = None,
    share: float = 1.0,
    network: cm.Network | None = None,
    intra_input=None,
) -> tuple:
    """(options, their inputs, their efficiencies: (label, collective) -> Efficiency).
    An efficiency not measured here is never better than the worst measured one of its
    collective (efficiency.worst_measured). On a network of nodes every option also runs
    hierarchical (label `...@node`), with the intra-node rate among its inputs."""
    variants, codecs = variants_and_codecs(opts)
    made, inputs, found = [], [], {}
    m = network.ranks_per_node if network is not None else 1
    for variant in variants:
        for spec in [""] if variant in cm.UNCOMPRESSED else codecs:
            flat = variant if not spec else f"{variant}:{spec}"
            rates, got = None, []
            if spec:  # one codec's rates in a step, from its flat rows, for both shapes
                rates, got = parts.codec_rates(
                    tables, spec, flat, opts.buffer, variant, ranks, link_gbps
                )
            for hierarchical in (False, True) if m > 1 else (False,):
                option = cm.Option(variant, rates, hierarchical=hierarchical)
                label = option.label
                inputs += [replace(i, option=label) for i in got]
                if hierarchical and intra_input is not None:
                    inputs.append(replace(intra_input, option=label))
                for c in collectives:
                    found[label, c] = efficiency.efficiency(
                        tables, option, c, ranks, link_gbps, declared, share, m
                    )
                made.append((variant, rates, label, hierarchical))
    found = efficiency.worst_measured(found)
    options = [
        cm.Option(
            variant, rates, {c: found[label, c].for_model() for c in collectives}, hierarchical
        )
        for variant, rates, label, hierarchical in made
    ]
    inputs += [e.input for e in found.values()]
    return options, inputs, found


def error_budget(text: str | None) -> tuple[float | None, set | None]:
    """--max-error: (a relative L2 bound, or None; the codecs allowed, or None); the
    default budget when not given."""
    if text is None:
        return DEFAULT_MAX_ERROR, None
    try:
        return float(text), None
    except ValueError:
        return None, {codec.spec for codec in codecs_from(text.split(","))}


def over_budget(options, errors: dict, max_error: str | None) -> dict:
    """The options the error budget (--max-error, or the default) leaves out, each with
    why."""
    bound, allowed = error_budget(max_error)
    name = "--max-error" if max_error is not None else "the default budget"
    excluded = {}
    for o in options:
        err = errors[o.label]
        if allowed is not None and o.codec is not None and o.codec.spec not in allowed:
            excluded[o.label] = "codec not in --max-error's list"
        elif bound is not None and math.isnan(err):
            excluded[o.label] = "error not measured (no codec_throughput row)"
        elif bound is not None and err > bound:
            excluded[o.label] = f"error {err:.2e} per step over {name} {bound:g}"
    return excluded


def assumed_by_option(inputs, labels: list[str]) -> dict:
    """Option label -> the names of its inputs that were assumed (the network's and the
    model's count for every option)."""
    assumed: dict = {}
    for i in inputs:
        if i.assumed:
            for label in [i.option] if i.option else labels:
                assumed.setdefault(label, []).append(i.name)
    return assumed


def lacking_by_option(inputs) -> dict:
    """Option label -> its own inputs not measured on this link, rank count and codec
    (the network's, shared by every option, do not set one option apart)."""
    lacking: dict = {}
    for i in inputs:
        if i.assumed and i.option:
            lacking.setdefault(i.option, []).append(i.name)
    return lacking


# ------------------------------------------------------------------------ the table


def advise(options, network, step, ranks, share) -> tuple[dict, dict]:
    predictions = {o.label: cm.predict_step(o, network, step, ranks, share) for o in options}
    errors = {o.label: cm.step_error(o, step, ranks, network.ranks_per_node) for o in options}
    return predictions, errors


def step_ranges(options, found: dict, network, step, ranks, share) -> dict:
    """Label -> (low, high) predicted step, seconds: every collective at the lowest and
    at the highest efficiency its rows measured (the median's spread over sizes)."""
    ranges = {}
    for o in options:
        ends = []
        for pick in (min, max):
            eff = {
                c: pick(e.values) if e.here and e.values else e.value
                for (label, c), e in found.items()
                if label == o.label
            }
            ends.append(cm.predict_step(replace(o, efficiency=eff), network, step, ranks, share))
        ranges[o.label] = (ends[0].step_s, ends[1].step_s)
    return ranges


def measure_then_run(opts, cluster, ranks, apart, lacking, step, unknown_error, unturned=()) -> int:
    """--measure: codec_throughput for the codecs without an error first (that may bring
    their options into the table), then the harness rows of the options not measured
    here and the step's collectives in turn of the options without them; then the advice
    again, from the parts with these added."""
    from ccbench.scripts.advise import measure

    out = Path(opts.csv)
    folder = str(out.with_name(out.stem + "-parts"))
    if folder not in opts.results:
        opts.results = [*opts.results, folder]
    if unknown_error and not getattr(opts, "codecs_measured", False):
        measure.measure_codecs(unknown_error, folder)
        opts.codecs_measured = True
        return run(opts)
    measure.measure_harness(
        cluster,
        ranks,
        {label: lacking[label] for label in apart},
        measure.step_sizes(step, ranks),
        folder,
    )
    measure.measure_turns(cluster, ranks, list(unturned), step, folder)
    opts.measure = False
    return run(opts)


def levels_text(network: cm.Network, ranks: int) -> str:
    if network.ranks_per_node == 1:
        return ""
    intra = network.intra_rate_bps
    rate = f"{intra / 1e9:.3g} Gbit/s" if intra else "unknown (costed 0)"
    return f"{network.nodes(ranks)} nodes x {network.ranks_per_node} ranks, inside a node {rate}; "


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))


def run(opts) -> int:
    if opts.ranks is not None and opts.ranks < 2:
        raise UsageError("--ranks must be at least 2")
    if opts.top < 1 or opts.rounds < 1 or opts.steps < 1:
        raise UsageError("--top, --rounds and --steps must be positive")
    tables = parts.read_results(opts.results)
    network, inputs, share, cluster, link_gbps = network_of(opts, tables)
    for flag, wanted in (("--check replays", opts.check), ("--measure measures", opts.measure)):
        if wanted and not cluster:
            raise UsageError(
                f"{flag} on the emulated cluster: give --network measured or --network CLUSTER"
            )
    variants_and_codecs(opts)  # refused before a model is built
    error_budget(opts.max_error)
    network, level_inputs, intra_input = with_levels(opts, network, tables, cluster, opts.ranks)
    inputs += level_inputs
    trace, ranks, trace_source = load_step(opts.model, opts.ranks)
    if ranks % network.ranks_per_node:
        raise UsageError(
            f"--ranks-per-node {network.ranks_per_node}: {ranks} ranks do not make whole nodes"
        )
    step = trace.steps[0]
    if not step.calls:
        raise UsageError(f"--model {opts.model}: its first step has no collectives")
    share = opts.ranks_per_core or share
    if opts.ranks_per_core:
        where = "--ranks-per-core"
    elif cluster:
        where = "this host's cores"
    elif not opts.link and share != 1.0:
        where = "the compressed harness rows' ranks_per_core (median) on the link advised for"
    else:
        where = "assumed: one rank per core or device"
    inputs.append(
        parts.Input("", "ranks per codec core", share, where, where.startswith("assumed"))
    )
    inputs.append(parts.Input("", "trace", f"{trace.describe()}", trace_source))
    collectives = sorted({c.collective for c in step.calls})
    options, found, efficiencies = options_of(
        opts,
        tables,
        ranks,
        link_gbps,
        collectives,
        network if opts.link else None,
        share,
        network,
        intra_input,
    )
    inputs += found
    in_step, turn_inputs, unturned = turns.step_factors(
        tables, options, step, ranks, link_gbps, network, share
    )
    options = [replace(o, **in_step.get(o.label, {})) for o in options]
    inputs += turn_inputs
    predictions, errors = advise(options, network, step, ranks, share)
    excluded = over_budget(options, errors, opts.max_error)
    lacking = lacking_by_option(inputs)
    measured, apart = tables_out.split_order(predictions, lacking, excluded)
    unknown_error = sorted(
        {o.codec.spec for o in options if o.codec is not None and math.isnan(errors[o.label])}
    )
    unturned = [label for label in unturned if label not in excluded]
    if opts.measure and (apart or unknown_error or unturned):
        return measure_then_run(opts, cluster, ranks, apart, lacking, step, unknown_error, unturned)
    if not measured + apart:
        raise UsageError(
            "every option is over the error budget; allow more error (--max-error) or add "
            "uncompressed variants"
        )
    rows = tables_out.table_rows(
        options,
        predictions,
        step_ranges(options, efficiencies, network, step, ranks, share),
        errors,
        measured,
        apart,
        network,
        step,
        ranks,
        share,
        assumed_by_option(inputs, measured + apart),
        lacking,
    )
    bound, _ = error_budget(opts.max_error)
    print(
        f"# ccbench advise: {trace.describe()} ({trace_source}); {ranks} ranks; link "
        f"{network.rate_bps / 1e9:.3g} Gbit/s payload, ring step {network.step_s * 1e6:.0f}"
        f" us; {levels_text(network, ranks)}{share:g} ranks per codec core; error budget "
        + (
            f"{bound:g} per step"
            + (" (the default, docs/advise.md)" if opts.max_error is None else "")
            if bound is not None
            else opts.max_error
        )
    )
    tables_out.print_table(rows, excluded)
    out = Path(opts.csv)
    tables_out.write_csv(out, rows)
    inputs_path = out.with_name(out.stem + "-inputs.csv")
    tables_out.write_csv(inputs_path, [i.row() for i in inputs])
    map_path = Path(opts.map) if opts.map else out.with_name(out.stem + "-map.png")
    from ccbench.plots.advise_map import draw_break_even_map

    largest = max(step.calls, key=lambda c: c.nbytes)
    draw_break_even_map(
        map_path,
        [o for o in options if o.label in measured] or [o for o in options if o.label in apart],
        network.step_s,
        tables_out.main_collective(step),
        ranks,
        share,
        levels=network,
        marks={
            "this link, largest call": (
                network.rate_bps,
                cm.osu_size(largest.collective, largest.nbytes, ranks),
            )
        },
    )
    print(f"# wrote {out}, {inputs_path}, {map_path}")
    if not opts.check:
        print(f"# {tables_out.advice_line(rows)}")
        return 0
    from ccbench.scripts.advise.check import run_check

    advised = measured[0] if measured else ""
    verdict = run_check(
        opts, cluster, trace, ranks, measured + apart, advised, predictions, out, set(apart)
    )
    print(f"# {tables_out.advice_line(rows, verdict)}")
    return 0
