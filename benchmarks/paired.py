"""Two benchmarks in one launch, taking turns on the same ranks (`ccbench compare`).

    mpiexec -bind-to core -n 4 python -m ccbench.benchmarks.paired --turns 8 \\
        --a "p2p_compressed --codec fp16" --b "coll_compressed --codec fp16" \\
        --json pairs.json -- --collective allgather -m 4M:4M -i 5

Both sides are built once per message size (each with its own options, plus the common
ones after --); then turn k times A and then B when k is even, B and then A when it is
odd, each with its warm-up calls and its iterations, as a run of the variant would. A
host whose speed shifts over seconds moves both sides of a turn alike. What a launch
fixes once is the same in every turn, so turns do not replace launches: `ccbench
compare` runs several such launches and takes its interval across them (docs/comparisons.md
gives what this host showed on both levels).
`--json` gets, per point, every turn's statistics of each side. With -c each side's -c
pass runs once after the turns (exit 1 when one fails).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import shlex

from ccbench.benchmarks import timing_c
from ccbench.benchmarks.agreement import agreed, run_main
from ccbench.benchmarks.environment import run_info
from ccbench.benchmarks.harness import (
    Context,
    Variant,
    check_deferred,
    open_transport,
    parse_options,
    plan_cases,
    prepare_case,
    validate_case,
)
from ccbench.benchmarks.options import positive_int, split_common
from ccbench.benchmarks.results import point_key, write_json_atomic
from ccbench.benchmarks.timing import measure
from ccbench.kernels.errors import UsageError

# what each turn keeps of a side's timing (the columns `ccbench compare --statistic` reads)
KEPT = ("avg_us", "fastest_us", "p50_us")


def variant_named(name: str) -> Variant:
    """The sized benchmark `name` (a module of this package defining its Variant)."""
    if not name.isidentifier():
        raise UsageError(f"unknown variant {name!r}")
    try:
        module = importlib.import_module(f"ccbench.benchmarks.{name}")
    except ImportError:
        raise UsageError(f"unknown variant {name!r}") from None
    for value in vars(module).values():
        if isinstance(value, type) and issubclass(value, Variant) and value.name == name:
            return value()
    raise UsageError(
        f"{name} has no message sizes to pair (paired runs take baseline, "
        "p2p_compressed, coll_compressed or sparse_streaming)"
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ccbench paired",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--a", required=True, metavar="COMMAND", help='"VARIANT [OPTIONS]"')
    p.add_argument("--b", required=True, metavar="COMMAND", help='"VARIANT [OPTIONS]"')
    p.add_argument("--turns", type=positive_int, default=8, help="turns of A and B (default 8)")
    p.add_argument("--json", required=True, metavar="PATH", help="every turn's times of both sides")
    p.add_argument(
        "--first",
        choices=("A", "B"),
        default="A",
        help="the side that starts the first turn (default A); ccbench compare "
        "alternates it from round to round",
    )
    p.epilog = "Options after -- go to both sides."
    return p


def _words(label: str, text: str) -> list[str]:
    words = shlex.split(text)
    if not words:
        raise UsageError(f"{label}: give a variant and its options")
    return words


class Side:
    """One side: its variant, options, transport and context (built on every rank)."""

    def __init__(self, label: str, text: str, common: list[str], comm):
        words = agreed(comm, lambda: _words(label, text))
        self.label, self.text = label, text
        self.variant = agreed(comm, lambda: variant_named(words[0]))
        self.opts = agreed(comm, lambda: parse_options(self.variant, [*words[1:], *common], comm))
        agreed(comm, lambda: refuse_graph(label, self.opts))
        # each side's own transport (A over MPI, B over torch.distributed, say)
        self.comm = open_transport(comm, self.opts)
        agreed(comm, lambda: self.variant.prepare(self.comm, self.opts))
        self.ctx = Context(self.comm, self.opts, self.variant)


def refuse_graph(label: str, opts) -> None:
    if opts.cuda_graph:
        raise UsageError(
            f"{label}: --cuda-graph is a variant's own option; ccbench compare times eager "
            "calls on both sides (run each side with --cuda-graph and read their rows)"
        )


def case_key(case) -> str:
    return point_key(case.size_bytes, case.config)


def paired_cases(sides: list[Side], comm) -> list[tuple]:
    """(A's case, B's case) of every point both sides run, in A's order."""
    a_cases, b_cases = (plan_cases(s.variant, s.opts, comm)[0] for s in sides)
    by_point = {case_key(c): c for c in b_cases}
    pairs = [(a, by_point[case_key(a)]) for a in a_cases if case_key(a) in by_point]
    if not pairs:
        raise UsageError("A and B share no message size and configuration")
    return pairs


def common_timer(asked: str, prepared: list) -> str:
    """The loop that times both sides: the C loop only where both sides are the MPI
    library's own collectives (and CCBENCH_TIMER, `asked`, allows it), else Python's for
    both, so a ratio never pairs two timing methods."""
    if asked == "python":
        return "python"
    able = [timing_c.library_collective(p.run) is not None for p in prepared]
    if all(able):
        return asked
    if asked == "c":
        raise UsageError(
            "CCBENCH_TIMER=c, but only the MPI library's own collectives can be timed by the C loop"
        )
    return "python"


def run_pairs(argv: list[str], comm) -> int:
    own, common = split_common(argv)
    opts = agreed(comm, lambda: build_parser().parse_args(own))
    sides = [Side("A", opts.a, common, comm), Side("B", opts.b, common, comm)]
    pairs = agreed(comm, lambda: paired_cases(sides, comm))
    info = run_info(comm, "paired")
    asked = agreed(comm, timing_c.requested_timer)
    points, failures = {}, 0
    for case_a, case_b in pairs:
        prepared = [
            prepare_case(s.variant, s.ctx, c) for s, c in zip(sides, (case_a, case_b), strict=True)
        ]
        kept = {s.label: {k: [] for k in KEPT} for s in sides}
        iterations, timers, barriers, checks = {}, {}, {}, {}
        timer = agreed(comm, functools.partial(common_timer, asked, prepared))
        start = 0 if opts.first == "A" else 1
        for k in range(opts.turns):
            order = (0, 1) if (k + start) % 2 == 0 else (1, 0)
            for i in order:
                side, p = sides[i], prepared[i]
                timing = measure(
                    side.comm,
                    p.run,
                    p.iterations,
                    p.warmup,
                    side.opts.timing,
                    timer=timer,
                    buffer=side.opts.buffer,
                )
                check_deferred(side.comm, p.op)
                iterations[side.label] = timing["iterations"]
                timers[side.label] = timing["timer"]
                barriers[side.label] = timing["barrier"]
                for key in KEPT:
                    kept[side.label][key].append(timing[key])
        for side, p, case in zip(sides, prepared, (case_a, case_b), strict=True):
            if not side.opts.validate:
                checks[side.label] = None
                continue
            passed = validate_case(side.variant, side.ctx, case, p.op)["passed"]
            checks[side.label] = "Pass" if passed else "Fail"
            if not passed:
                failures += 1
                if comm.rank == 0:
                    print(
                        f"# {side.label} ({side.text}): validation failed at "
                        f"{case.size_bytes} bytes",
                        flush=True,
                    )
        points[case_key(case_a)] = {
            "size_bytes": case_a.size_bytes,
            "config": dict(case_a.config),
            "times": kept,
            "iterations": iterations,
            "timers": timers,
            "barriers": barriers,
            "validation": checks,
        }
        del prepared
    if comm.rank == 0:
        write_json_atomic(
            opts.json,
            {
                "a": opts.a,
                "b": opts.b,
                "common": common,
                "turns": opts.turns,
                "collective": sides[0].opts.collective,
                "ranks": comm.size,
                "link_gbps": info.get("link_gbps"),
                "run_id": info.get("run_id"),
                "placement": info.get("placement"),
                "points": points,
            },
        )
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    return run_main(run_pairs, argv)


if __name__ == "__main__":
    raise SystemExit(main())
