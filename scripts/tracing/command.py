"""`ccbench trace`: capture, build, show, convert and replay collective traces.

    mpiexec -n 2 ccbench trace capture -o results/traces/fsdp.json --framework fsdp
    ccbench trace build --model gpt2-small --framework fsdp --ranks 8 -o results/traces/g.json
    ccbench trace show results/traces/g.json
    ccbench trace convert results/traces/g.json results/traces/g-param.json --to param
    mpiexec -n 2 ccbench trace replay results/traces/g.json --variant coll_compressed \\
        --codec fp16 --csv results/replay.csv

``capture`` is the training benchmark (its options) recording the steps after --warmup;
``replay`` is the trace_replay benchmark (its options). Both run under mpiexec, srun or
``ccbench cluster run``; ``build``, ``show``, ``convert`` and ``check`` (which launches
its own ranks, scripts/tracing/check.py) run alone. docs/traces.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from ccbench.kernels.errors import UsageError

ACTIONS = {
    "capture": "record the collectives of real FSDP2 / DDP / MG-WFBP steps (under mpiexec)",
    "build": "build the trace of a model's configuration on the meta device",
    "replay": "replay a trace through any variant and codec (under mpiexec)",
    "show": "summarise a trace (ccbench's or PARAM's)",
    "convert": "write a trace in ccbench's format or PARAM's comms trace format",
    "check": "replay captured steps against the real ones, in interleaved rounds",
}


def usage() -> str:
    lines = ["usage: ccbench trace ACTION [options]", "", "actions:"]
    lines += [f"  {name:<8}  {text}" for name, text in ACTIONS.items()]
    return "\n".join(lines + ["", "ccbench trace ACTION --help for its options; docs/traces.md"])


def capture(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ccbench trace capture", add_help=False)
    parser.add_argument("-o", "--output", metavar="TRACE")
    own, rest = parser.parse_known_args(argv)
    from ccbench.benchmarks import training  # chooses MPI's thread level before MPI starts

    if own.output is None and not {"-h", "--help"} & set(rest):
        raise UsageError(
            "give the trace's path: -o TRACE (the other options are ccbench training's)"
        )
    extra = ["--trace", own.output] if own.output else []
    return training.main([*rest, *extra])


def replay(argv: list[str]) -> int:
    from ccbench.benchmarks import trace_replay

    return trace_replay.main(argv)


def build(argv: list[str]) -> int:
    from ccbench.training import trace_build

    parser = argparse.ArgumentParser(
        prog="ccbench trace build",
        description=(
            "The trace of one training step of a model, from its shapes on PyTorch's meta "
            "device (no weights allocated); docs/traces.md."
        ),
    )
    parser.add_argument(
        "--model",
        required=True,
        help="gpt2-small, gpt2-medium, llama-1b, llama-7b, this suite's "
        "training models (lm-small, ...) or MG-WFBP's (resnet50, ...)",
    )
    parser.add_argument("--framework", choices=trace_build.FRAMEWORKS, default="fsdp")
    parser.add_argument("--ranks", type=int, default=8, help="data-parallel ranks (8)")
    parser.add_argument(
        "--batch", type=int, default=None, help="samples per rank (default: 8192 tokens per rank)"
    )
    parser.add_argument("--seq", type=int, default=None, help="tokens per sample")
    parser.add_argument(
        "--flop-rate",
        default=trace_build.DEFAULT_GPU,
        help="achieved FLOP/s: a GPU's dense BF16 peak times --mfu ("
        + ", ".join(trace_build.GPUS)
        + "; default "
        f"{trace_build.DEFAULT_GPU}) or a number such as 125T",
    )
    parser.add_argument(
        "--mfu",
        type=float,
        default=trace_build.DEFAULT_MFU,
        help=f"fraction of a GPU's peak achieved (default {trace_build.DEFAULT_MFU})",
    )
    parser.add_argument(
        "--memory-rate",
        type=float,
        default=None,
        help="bytes/s for the optimizer (default: the GPU's bandwidth)",
    )
    parser.add_argument(
        "--bucket-mb",
        type=float,
        default=25.0,
        help="ddp: bucket size (25; 0: one allreduce per gradient)",
    )
    parser.add_argument(
        "--profile",
        metavar="CSV",
        help="a measured layer profile (ccbench profile) for the compute",
    )
    parser.add_argument("-o", "--output", required=True, metavar="TRACE")
    parser.add_argument(
        "--param", action="store_true", help="write PARAM's comms trace format instead of ccbench's"
    )
    opts = parser.parse_args(argv)
    from ccbench.collectives.trace_files import write

    started = time.perf_counter()
    trace = trace_build.build_trace(
        opts.model,
        opts.framework,
        opts.ranks,
        opts.batch,
        opts.seq,
        opts.flop_rate,
        opts.mfu,
        opts.memory_rate,
        opts.bucket_mb,
        opts.profile,
    )
    write(trace, opts.output, param=opts.param)
    print(
        f"{opts.output}: {trace.describe()}, {summary(trace)[0]}; built in "
        f"{time.perf_counter() - started:.1f} s"
    )
    return 0


def summary(trace) -> list[str]:
    """One line per step: calls by collective, bytes, compute."""
    lines = []
    for step in trace.steps:
        kinds = Counter(e.collective for e in step.calls)
        calls = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        measured = (
            f", measured step {step.measured['step_us'] / 1e3:.2f} ms"
            if step.measured.get("step_us")
            else ""
        )
        lines.append(
            f"{calls}, {step.nbytes / 2**20:.2f} MiB, compute "
            f"{step.compute_us / 1e3:.2f} ms{measured}"
        )
    return lines


def show(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ccbench trace show")
    parser.add_argument("trace")
    parser.add_argument(
        "--events",
        type=int,
        default=16,
        help="events of the first step to list (default 16; 0: all)",
    )
    opts = parser.parse_args(argv)
    from ccbench.collectives.trace_files import read

    trace = read(opts.trace)
    print(f"{opts.trace}: {trace.describe()}")
    for key, value in trace.source.items():
        if value not in ("", None):
            print(f"  {key}: {value}")
    for step, line in zip(trace.steps, summary(trace), strict=True):
        print(f"  step {step.number}: {line}")
    step = trace.steps[0]
    shown = step.events if opts.events <= 0 else step.events[: opts.events]
    print(f"  {'op':<6} {'id':>4} {'collective':<15} {'MiB':>9} {'async':>5} {'gap_ms':>9}  label")
    for e in shown:
        size = f"{e.nbytes / 2**20:9.3f}" if e.op == "call" else " " * 9
        sync = ("no" if e.blocking else "yes") if e.op == "call" else ""
        print(
            f"  {e.op:<6} {'' if e.id is None else e.id:>4} {e.collective:<15} {size} "
            f"{sync:>5} {e.gap_us / 1e3:>9.3f}  {e.label}"
        )
    if len(shown) < len(step.events):
        print(f"  ... {len(step.events) - len(shown)} more (--events 0 lists all)")
    print(f"  tail (after the last event) {step.tail_us / 1e3:.3f} ms")
    return 0


def convert(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ccbench trace convert")
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument(
        "--to",
        choices=("ccbench", "param"),
        default=None,
        help="the output's format (default: the other one)",
    )
    opts = parser.parse_args(argv)
    from ccbench.collectives.trace_files import read, write

    trace = read(opts.input)
    to = opts.to or ("ccbench" if trace.source.get("kind") == "param" else "param")
    write(trace, opts.output, param=to == "param")
    print(f"{opts.output}: {trace.describe()}, in {to}'s format")
    return 0


def check(argv: list[str]) -> int:
    from ccbench.scripts.tracing import check as trace_check

    return trace_check.main(argv)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    action, rest = argv[0], argv[1:]
    run = {
        "capture": capture,
        "build": build,
        "replay": replay,
        "show": show,
        "convert": convert,
        "check": check,
    }.get(action)
    if run is None:
        print(f"ccbench trace: error: unknown action {action!r}\n{usage()}", file=sys.stderr)
        return 2
    return run(rest)
