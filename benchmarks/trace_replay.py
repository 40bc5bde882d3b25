"""Trace replay: a training step's collectives, replayed through any variant and codec.

    mpiexec -n 2 python -m ccbench.benchmarks.trace_replay results/traces/fsdp.json \\
        --variant coll_compressed --codec fp16 --csv results/replay.csv

The trace (``ccbench trace capture`` of a real FSDP2, DDP or MG-WFBP step, ``ccbench
trace build`` of a model's configuration, or PARAM's comms trace) is replayed event by
event on every rank: its compute gaps emulated (``--compute``), its collectives run
through the variant on the communication stream FSDP and DDP use here, its waits
waited (training/replay.py). ``--merge STRATEGY`` regroups the gradients' allreduces as
MG-WFBP's planner would, under an allreduce cost model measured through the variant.
One row per step (time, exposed communication, codec time, bytes on the wire) and a
summary row (means over the steps after --warmup, the step time's 95% interval);
docs/traces.md.
"""

from __future__ import annotations

from ccbench.benchmarks import request_thread_level

request_thread_level("multiple")  # the communication thread calls MPI beside the main one

import argparse
from pathlib import Path

import numpy as np

from ccbench.benchmarks import environment
from ccbench.benchmarks.agreement import agreed, run_main
from ccbench.benchmarks.hierarchy import (
    add_hierarchy_options,
    check_hierarchy,
    hierarchical_algorithm,
)
from ccbench.benchmarks.options import (
    FALLBACK_DATA,
    RankAwareParser,
    add_compression,
    add_output,
    add_seed,
    add_validate,
    compression_from,
    non_negative_float,
    non_negative_int,
    parse_size,
    positive_float,
    positive_int,
)
from ccbench.benchmarks.progress import progress_bar
from ccbench.benchmarks.results import REPLAY, append_rows, build_row, check_header
from ccbench.benchmarks.statistics import mean_interval
from ccbench.collectives.communicator import BaseCommunicator as Communicator
from ccbench.collectives.trace_files import trace_id
from ccbench.kernels import variants
from ccbench.kernels.errors import UsageError

COLUMNS = REPLAY.names
COMPUTE = ("auto", "busy", "busy-cpu", "sleep")
FIELDS = (
    "step_us",
    "comm_us",
    "emulated_us",
    "allgather_us",
    "reduce_scatter_us",
    "allreduce_us",
    "codec_us",
    "wire_bytes",
)


def build_parser(quiet: bool) -> RankAwareParser:
    from ccbench.training.gradient_comm import COMPRESS, VARIANTS

    parser = RankAwareParser(
        prog="python -m ccbench.benchmarks.trace_replay",
        quiet=quiet,
        description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "trace",
        help="a trace file (ccbench's or PARAM's comms trace), or "
        "model:NAME[:FRAMEWORK] to build one (ccbench trace "
        "build's defaults, for this launch's ranks)",
    )
    parser.add_argument(
        "--variant",
        choices=VARIANTS,
        default="baseline",
        help="what carries the collectives (default baseline); "
        "sparse_streaming sends the calls the trace marks sparse "
        "through OmniReduce, the others through the ring",
    )
    parser.add_argument(
        "--algorithm",
        choices=("mpi", "ring"),
        default="mpi",
        help="baseline only: the MPI library's collectives (default) or ccbench's ring",
    )
    add_compression(parser, codec_help="codec spec of the compressed variants", chunk=True)
    parser.add_argument(
        "--compress",
        choices=COMPRESS,
        default="both",
        help="what the compressed variants compress: parameters "
        "(allgather), gradients (reduce-scatter, allreduce) or both",
    )
    parser.add_argument(
        "--merge",
        metavar="STRATEGY",
        help="regroup each run of gradient allreduces: wfbp, single, "
        "fixed:BYTES, ddp:BYTES, mgwfbp or optimal (MG-WFBP's "
        "planner, under a cost model measured through the variant)",
    )
    parser.add_argument(
        "--fit-min",
        type=parse_size,
        default=4096,
        metavar="BYTES",
        help="--merge: smallest allreduce of the cost-model sweep (4K)",
    )
    parser.add_argument(
        "--fit-seconds",
        type=positive_float,
        default=0.1,
        help="--merge: seconds per size of the cost-model sweep (0.1)",
    )
    parser.add_argument(
        "--compute",
        choices=COMPUTE,
        default="auto",
        help="how compute gaps are emulated: busy (spin for the gap's "
        "wall time), busy-cpu (spin for its CPU time on the thread's "
        "clock), sleep; auto (default): busy for captured traces (CPU "
        "training), sleep for built and PARAM ones (an accelerator "
        "computes; the host core is free)",
    )
    parser.add_argument(
        "--compute-scale",
        type=non_negative_float,
        default=1.0,
        help="multiply every compute gap (0.5: compute twice as fast; 0: the calls "
        "alone, issued and waited as the trace does)",
    )
    parser.add_argument(
        "--steps",
        type=positive_int,
        default=10,
        help="timed steps (default 10), cycling through the trace's steps",
    )
    parser.add_argument(
        "--warmup", type=non_negative_int, default=2, help="untimed steps first (default 2)"
    )
    parser.add_argument(
        "--data",
        default=FALLBACK_DATA,
        metavar="KIND",
        help=f"values in the buffers (default {FALLBACK_DATA}; kernels/inputs.py)",
    )
    add_hierarchy_options(parser)
    add_validate(
        parser,
        "every distinct call of the trace once more, on exact inputs, "
        "against the sum (within the codec's bound)",
    )
    add_seed(parser, "the buffers' values")
    add_output(parser, "one row per step and a summary row", json=True)
    return parser


def parse_options(argv, comm: Communicator):
    from ccbench.collectives.mgwfbp import parse_strategy
    from ccbench.kernels.inputs import parse_data_kind

    opts = build_parser(quiet=comm.rank != 0).parse_args(argv)
    opts.data = parse_data_kind(opts.data).spec
    if opts.merge:
        opts.merge = parse_strategy(opts.merge).label
    opts.compression = compression_from(opts, variant=opts.variant)
    check_hierarchy(opts, comm.size)
    return opts


def _check_thread_level(comm) -> None:
    """The launch's, not the options': apart so that a sweep's tasks are checked without
    one (tests/test_sweep.py)."""
    if not comm.threaded:
        raise UsageError("the communication thread needs MPI_THREAD_SERIALIZED or better")


def load_trace(spec: str, ranks: int):
    """(trace, its name): a file, or model:NAME[:FRAMEWORK] built for ``ranks``."""
    from ccbench.collectives.trace_files import read

    if spec.startswith("model:"):
        from ccbench.training.trace_build import build_named

        return build_named(spec[len("model:") :], ranks), spec
    return read(spec), Path(spec).stem


def compute_mode(choice: str, trace) -> str:
    if choice != "auto":
        return choice
    return "busy" if trace.source.get("kind") == "captured" else "sleep"


def merged_steps(comm, opts, router, steps):
    """The steps with their gradient allreduces regrouped by ``--merge``."""
    import torch

    from ccbench.benchmarks.timing import measure
    from ccbench.collectives.costmodel import fit_cost_model, fit_sizes
    from ccbench.collectives.mgwfbp import Profile, plan
    from ccbench.collectives.spec import spec
    from ccbench.training.replay import merge_allreduces

    total = max(sum(e.nbytes for e in s.calls if spec(e.collective).elementwise) for s in steps)
    if total == 0:
        raise UsageError("--merge regroups allreduces: the trace has none")
    count = total // 4
    send = torch.randn(count, generator=torch.Generator().manual_seed(comm.rank))
    recv = send.clone()
    gcomm = router.main

    def bind(_, r):
        return lambda: (gcomm.allreduce(r), r.div_(comm.size))

    sizes = fit_sizes(total, opts.fit_min, comm.size)
    fit, _ = fit_cost_model(
        comm,
        bind,
        send,
        recv,
        sizes,
        opts.fit_seconds,
        lambda run, iters: measure(comm, run, iters, 1, "per-call")["max_us"],
    )

    def groups(nbytes, gaps):
        profile = Profile.from_arrays("trace", nbytes.astype(np.int64), gaps, 0.0)
        return plan(opts.merge, profile, fit.model).groups

    return [merge_allreduces(s, groups) for s in steps], fit


def validate(comm, router, steps, seed: int) -> bool:
    """Every distinct call once, on exact inputs, against the sum over every rank's."""
    import torch

    from ccbench.collectives.spec import spec
    from ccbench.kernels.inputs import values
    from ccbench.kernels.vocabulary import exact_amplitude
    from ccbench.training.replay import TORCH_DTYPES, call_counts, collective_method

    size, rank, ok, seen = comm.size, comm.rank, True, set()
    for e in (e for s in steps for e in s.calls):
        key = (e.collective, e.count, e.dtype, e.sparse, e.density)
        if key in seen:
            continue
        seen.add(key)
        described = spec(e.collective)
        _, each, received = call_counts(e, size)
        kind = f"sparse:{e.density or 1.0}" if e.sparse else "exact"
        inputs = [values(kind, each, r, size, seed) for r in range(size)]
        mine = torch.from_numpy(inputs[rank]).to(TORCH_DTYPES[e.dtype])
        gcomm = router.gradient_comm(e)
        run = collective_method(gcomm, e.collective)
        if described.in_place:
            out = mine.clone()
            run(out)
        else:
            out = torch.empty(received, dtype=mine.dtype)
            run(mine, out)
        expected = described.reference(inputs, rank, inputs[rank].dtype)
        amplitude = 4.0 if e.sparse else exact_amplitude(size)
        bound = gcomm.error_bound(e.collective, [amplitude] * size, e.dtype)
        err = np.abs(out.to(torch.float64).numpy() - expected)
        ok &= bool(np.all(err == 0) if bound is None else np.all(err <= bound))
    return bool(comm.allreduce_value(int(ok), op="min"))


def _rows(opts, trace, name, tid, mode, steps, local, info, comm, checks) -> list[dict]:
    mean = comm.allreduce_array(local, "sum") / comm.size
    slowest = comm.allreduce_array(np.ascontiguousarray(local[:, 0]), "max")
    source = trace.source
    constant = build_row(
        REPLAY,
        info,
        {
            "trace": name,
            "trace_id": tid,
            "source": source.get("kind", ""),
            "framework": source.get("framework", ""),
            "model": source.get("model", ""),
            "variant": opts.variant,
            "algorithm": _algorithm(opts),
            "codec": opts.compression.spec,
            "compress": opts.compress if opts.compression.spec != "none" else "",
            "merge": opts.merge or "",
            "compute_wait": mode,
            "compute_scale": opts.compute_scale,
            "data": opts.data,
            "ranks": comm.size,
            "traced_ranks": trace.ranks,
            "steps": opts.steps,
            "warmup_steps": opts.warmup,
        },
    )
    rows = []
    for i, values in enumerate(mean):
        step = steps[i % len(steps)]
        t = dict(zip(FIELDS, (float(v) for v in values), strict=True))
        busy = t["allgather_us"] + t["reduce_scatter_us"] + t["allreduce_us"]
        rows.append(
            {
                **constant,
                "row": "step",
                "step": i + 1,
                "trace_step": step.number,
                "calls": len(step.calls),
                "step_bytes": step.nbytes,
                "traced_compute_us": step.compute_us,
                "traced_step_us": step.measured.get("step_us"),
                **t,
                "compute_us": t["step_us"] - t["comm_us"],
                "comm_busy_us": busy,
                "exposed_codec_us": t["comm_us"] * t["codec_us"] / busy if busy else 0.0,
                "max_step_us": float(slowest[i]),
                "wire_bytes_per_rank": t["wire_bytes"] or None,
            }
        )
    timed = rows[opts.warmup :]
    summary = {
        k: float(np.mean([r[k] for r in timed]))
        for k in (
            "step_us",
            "compute_us",
            "comm_us",
            "codec_us",
            "exposed_codec_us",
            "allgather_us",
            "reduce_scatter_us",
            "allreduce_us",
            "comm_busy_us",
            "emulated_us",
            "max_step_us",
            "traced_compute_us",
            "calls",
            "step_bytes",
        )
    }
    _, low, high = mean_interval([r["step_us"] for r in timed])
    traced = [r["traced_step_us"] for r in timed if r["traced_step_us"] is not None]
    wire = [r["wire_bytes_per_rank"] or 0 for r in timed]
    rows.append(
        {
            **constant,
            "row": "summary",
            "step": None,
            **summary,
            "step_ci_low_us": low,
            "step_ci_high_us": high,
            "traced_step_us": float(np.mean(traced)) if traced else None,
            "wire_bytes_per_rank": float(np.mean(wire)) or None,
            "validation": "" if checks is None else ("Pass" if checks else "Fail"),
        }
    )
    for r in rows:
        r.pop("wire_bytes", None)
    return rows


def _algorithm(opts) -> str:
    return hierarchical_algorithm(opts, variants.gradient_algorithm(opts.variant, opts.algorithm))


def _report(rows: list[dict], trace, mode: str, compute) -> None:
    s = rows[-1]
    print(
        f"# {'step':>5} {'step_ms':>9} {'compute':>9} {'exposed':>9} {'codec':>8} "
        f"{'in_comm':>9} {'traced':>9} {'MB_sent':>8}"
    )
    for r in rows[:-1]:
        traced = r["traced_step_us"]
        print(
            f"  {r['step']:>5} {r['step_us'] / 1e3:>9.2f} {r['compute_us'] / 1e3:>9.2f} "
            f"{r['comm_us'] / 1e3:>9.2f} {r['codec_us'] / 1e3:>8.2f} "
            f"{r['comm_busy_us'] / 1e3:>9.2f} "
            f"{traced / 1e3 if traced is not None else float('nan'):>9.2f} "
            f"{(r['wire_bytes_per_rank'] or 0) / 1e6:>8.2f}"
        )
    note = f" (traced step {s['traced_step_us'] / 1e3:.2f} ms)" if s["traced_step_us"] else ""
    print(
        f"# step {s['step_us'] / 1e3:.2f} ms (95% interval {s['step_ci_low_us'] / 1e3:.2f}"
        f" .. {s['step_ci_high_us'] / 1e3:.2f}){note}: compute {s['compute_us'] / 1e3:.2f}"
        f" ms, exposed communication {s['comm_us'] / 1e3:.2f} ms (codec "
        f"{s['exposed_codec_us'] / 1e3:.2f}) of {s['comm_busy_us'] / 1e3:.2f} ms in "
        f"collectives; compute emulated by {mode} (spin op {compute.spin_op_us:.1f} us)"
    )
    if s["validation"]:
        print(f"# validation: {s['validation']}")


def _run(argv, comm: Communicator) -> int:
    from ccbench.training.comm_stream import CommStream
    from ccbench.training.replay import (
        Buffers,
        ComputeWait,
        ReplaySpec,
        Router,
        check_replayable,
        run_step,
    )

    root = comm.rank == 0
    opts = agreed(comm, lambda: parse_options(argv, comm))
    agreed(comm, lambda: _check_thread_level(comm))
    agreed(comm, lambda: check_header(opts.csv, COLUMNS) if root else None)
    loaded = agreed(comm, lambda: load_trace(opts.trace, comm.size) if root else None)
    trace, name = comm.bcast_obj(loaded, root=0)
    agreed(comm, lambda: check_replayable(trace))
    spec = ReplaySpec(
        opts.variant,
        opts.algorithm,
        opts.compression,
        opts.compress,
        opts.hierarchy,
        opts.ranks_per_node,
        opts.intra_node,
    )
    router = agreed(comm, lambda: Router(comm, spec))
    steps, fit = trace.steps, None
    if opts.merge:
        steps, fit = agreed(comm, lambda: merged_steps(comm, opts, router, steps))
    buffers = agreed(comm, lambda: Buffers(steps, comm, opts.data, opts.seed))
    mode = compute_mode(opts.compute, trace)
    compute = ComputeWait(mode, opts.compute_scale)
    info = environment.run_info(comm, "trace_replay")
    tid = trace_id(trace)
    if root:
        print(
            f"# ccbench trace replay: {name} ({trace.describe()}), {comm.size} ranks, "
            f"variant {opts.variant} ({_algorithm(opts)}), codec {opts.compression.spec}"
            + (f", merged by {opts.merge} ({fit.describe()})" if fit else "")
            + f", {opts.steps} steps after {opts.warmup}",
            flush=True,
        )
        if trace.ranks != comm.size:
            print(
                f"# note: traced on {trace.ranks} ranks, replayed on {comm.size}: each "
                "rank keeps the traced compute (weak scaling)",
                flush=True,
            )
    stream = CommStream(overlap=trace.overlap)
    total = opts.warmup + opts.steps
    local = np.zeros((total, len(FIELDS)))
    checks = None
    try:
        comm.barrier()
        with progress_bar(total, "replay", unit="step", rank=comm.rank) as bar:
            for i in range(total):
                t = run_step(steps[i % len(steps)], stream, router, buffers, compute)
                local[i] = (
                    t.step_us,
                    t.comm_us,
                    t.emulated_us,
                    t.busy.get("allgather", 0.0),
                    t.busy.get("reduce_scatter", 0.0),
                    t.busy.get("allreduce", 0.0),
                    t.codec_us,
                    t.wire_bytes,
                )
                bar.update(1)
        if opts.validate:
            checks = validate(comm, router, steps, opts.seed)
    finally:
        stream.close()
    rows = _rows(opts, trace, name, tid, mode, steps, local, info, comm, checks)
    if root:
        _report(rows, trace, mode, compute)
        if opts.csv:
            append_rows(opts.csv, rows, COLUMNS)
            environment.write_sidecar(
                opts.csv, {**info, "compute_spin_op_us": compute.spin_op_us}, argv, comm.size
            )
        if opts.json:
            from ccbench.benchmarks.results import write_json_atomic

            write_json_atomic(
                opts.json,
                {
                    "environment": environment.describe(info, argv, comm.size),
                    "trace": trace.source,
                    "summary": rows[-1],
                    "steps": rows[:-1],
                },
            )
    return 1 if checks is False else 0


def main(argv: list[str] | None = None) -> int:
    return run_main(_run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
