"""MG-WFBP trace-based simulation: iteration time and scaling efficiency per strategy.

    ccbench simulate --model all --ranks 4:2048 --strategy all \\
        --link-gbps 10 --hop-latency-us 5 --csv results/mgwfbp_sim.csv

Reads layer profiles (``results/profiles/<model>.csv``, from ``ccbench profile``), plans
every strategy under a ring-allreduce network model for each rank count, and prints
iteration time, non-overlapped communication, number of groups and scaling efficiency.
``--measured CSV`` takes the network from an alpha-beta fit measured by the
merged_gradient benchmark instead (per-hop latency = alpha / 2(p-1), link rate =
2(p-1)/p / beta). Needs no torch, no MPI.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

from ccbench.benchmarks.options import RankAwareParser
from ccbench.benchmarks.results import (
    MGWFBP,
    MGWFBP_COLUMNS,
    PROFILE_DIR,
    SCHEMA,
    append_rows,
    check_header,
    new_run_id,
    profile_names,
    read_rows,
)
from ccbench.benchmarks.switches import read as read_switches
from ccbench.collectives.costmodel import AlphaBeta, LinkModel
from ccbench.collectives.mgwfbp import parse_strategies, plan_columns, read_profile
from ccbench.collectives.simulator import powers_of_two, scale_compute, simulate
from ccbench.kernels.errors import UsageError


def parse_ranks(text: str) -> list[int]:
    """``4:2048`` (powers of two) or ``4,16,100``."""
    try:
        if ":" in text:
            lo, hi = (int(x) for x in text.split(":"))
            ranks = powers_of_two(lo, hi)
        else:
            ranks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"bad --ranks {text!r}: use MIN:MAX (powers of two) or a list") from None
    if not ranks or min(ranks) < 1:
        raise UsageError(f"bad --ranks {text!r}: rank counts must be >= 1")
    return ranks


def profile_paths(models, profiles, profile_dir: Path) -> list[Path]:
    paths = [Path(p) for p in profiles or []]
    for spec in models or ([] if paths else ["all"]):
        for name in profile_names(profile_dir) if spec == "all" else spec.split(","):
            paths.append(profile_dir / f"{name}.csv")
    return list(dict.fromkeys(paths))


def link_from_measurement(path) -> tuple[LinkModel, str]:
    """The link that explains the alpha-beta fit of a merged_gradient CSV (first row)."""
    if not Path(path).is_file():
        raise UsageError(f"--measured {path}: no such file")
    _, rows = read_rows(path)
    rows = [r for r in rows if r.get("alpha_us") and r.get("measured_us")]
    if not rows:
        raise UsageError(f"{path} has no measured rows with an alpha-beta fit")
    r = rows[0]
    fit = AlphaBeta(float(r["alpha_us"]), float(r["beta_us_per_byte"]))
    try:
        link = LinkModel.from_ring_allreduce(fit, int(r["ranks"]))
    except ValueError as exc:
        raise UsageError(f"--measured {path}: {exc}") from None
    return link, f"fit on {r['ranks']} ranks ({path})"


def build_parser() -> argparse.ArgumentParser:
    parser = RankAwareParser(
        prog="ccbench simulate",
        description=__doc__.split("\n\n")[0] + "\n\nprofiled models: " + ", ".join(profile_names()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model",
        action="append",
        metavar="NAME",
        help="profiled model, repeatable or comma-separated, or 'all' "
        "(every profile in --profile-dir); default all",
    )
    parser.add_argument(
        "--profile", action="append", metavar="CSV", help="a profile CSV by path (repeatable)"
    )
    parser.add_argument(
        "--profile-dir",
        type=Path,
        default=PROFILE_DIR,
        help=f"where --model profiles live (default {PROFILE_DIR})",
    )
    parser.add_argument(
        "--ranks",
        default="4:2048",
        help="rank counts: MIN:MAX in powers of two, or a list (default 4:2048)",
    )
    parser.add_argument(
        "--strategy", default="all", help="wfbp,single,fixed:BYTES,ddp:BYTES,mgwfbp,optimal or all"
    )
    net = parser.add_argument_group("network model")
    net.add_argument(
        "--link-gbps", type=float, default=10.0, help="link rate per rank in Gbit/s (default 10)"
    )
    net.add_argument(
        "--hop-latency-us",
        type=float,
        default=5.0,
        help="latency of one ring step in us (default 5)",
    )
    net.add_argument(
        "--measured",
        metavar="CSV",
        help="derive link rate and hop latency from a merged_gradient CSV's fit",
    )
    net.add_argument(
        "--algorithm",
        choices=("ring", "rabenseifner"),
        default="ring",
        help="allreduce algorithm of the model (default ring)",
    )
    parser.add_argument(
        "--compute-speedup",
        type=float,
        default=1.0,
        help="divide the profile's compute times by this (a faster device)",
    )
    parser.add_argument(
        "--show-groups", action="store_true", help="print every plan's group boundaries"
    )
    parser.add_argument(
        "--csv", metavar="PATH", help="append one row per (model, strategy, ranks) to this CSV"
    )
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    return parser


def run(opts) -> list[dict]:
    ranks = parse_ranks(opts.ranks)
    odd = [p for p in ranks if p & (p - 1)]
    if opts.algorithm == "rabenseifner" and odd:
        raise UsageError(f"--algorithm rabenseifner models a power of two ranks, not {odd[0]}")
    check_header(opts.csv, MGWFBP_COLUMNS)
    strategies = parse_strategies(opts.strategy)
    if opts.compute_speedup <= 0:
        raise UsageError("--compute-speedup must be positive")
    if opts.measured:
        link, source = link_from_measurement(opts.measured)
    else:
        if opts.link_gbps <= 0 or opts.hop_latency_us < 0:
            raise UsageError("--link-gbps must be positive and --hop-latency-us >= 0")
        link, source = LinkModel(opts.link_gbps, opts.hop_latency_us), "given"
    now = datetime.datetime.now(datetime.timezone.utc)
    common = {
        SCHEMA: MGWFBP.tag,
        "run_id": new_run_id(now),
        # a simulation run beside a sweep (the main job) belongs to it
        "sweep_id": read_switches().sweep_id,
        "timestamp": now.isoformat(timespec="seconds"),
        "variant": "mgwfbp_simulation",
        "link_gbps": link.link_gbps,
        "hop_latency_us": link.hop_latency_us,
        "algorithm": opts.algorithm,
        "compute_speedup": opts.compute_speedup,
    }
    say = (lambda *a: None) if opts.quiet else print
    say(
        f"# MG-WFBP simulation: {opts.algorithm} allreduce, link {link.link_gbps:.3f} Gbit/s, "
        f"hop latency {link.hop_latency_us:.2f} us ({source})"
    )
    rows = []
    for path in profile_paths(opts.model, opts.profile, opts.profile_dir):
        profile = scale_compute(read_profile(path), opts.compute_speedup)
        say(
            f"\n# {profile.model}: {profile.ntensors} tensors, "
            f"{profile.total_bytes / 2**20:.2f} MiB, forward {profile.forward_us / 1e3:.2f} ms, "
            f"backward {profile.total_backward_us / 1e3:.2f} ms"
        )
        say(
            f"{'ranks':>6} {'strategy':<12} {'groups':>6} {'iter_ms':>10} "
            f"{'nonovl_ms':>10} {'efficiency':>10}"
        )
        for sim in simulate(profile, link, ranks, strategies, opts.algorithm):
            p = sim.plan
            say(
                f"{sim.ranks:>6} {sim.strategy:<12} {p.ngroups:>6} {p.iteration_us / 1e3:>10.3f} "
                f"{p.nonoverlapped_us / 1e3:>10.3f} {sim.scaling_efficiency:>10.3f}"
            )
            if opts.show_groups:
                say(f"{'':>6} stops: {p.stops_text}")
            rows.append(
                {
                    **common,
                    "model": profile.model,
                    "ranks": sim.ranks,
                    **plan_columns(p, sim.cost),
                    "scaling_efficiency": round(sim.scaling_efficiency, 6),
                }
            )
    if opts.csv:
        append_rows(opts.csv, rows, MGWFBP_COLUMNS)
    return rows


def main(argv: list[str] | None = None) -> int:
    try:
        run(build_parser().parse_args(sys.argv[1:] if argv is None else argv))
    except UsageError as exc:
        print(f"ccbench: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
