"""Training benchmark: data-parallel training whose communication goes through ccbench.

    mpiexec -n 4 python -m ccbench.benchmarks.training --model lm-small \\
        --framework fsdp --variant coll_compressed --codec fp16 --steps 100 \\
        --csv results/training.csv

``--framework own`` is the compact ZeRO-3-style trainer (training/sharded.py); ``fsdp`` and
``ddp`` are stock PyTorch FSDP2 and DDP with ccbench's collectives plugged in (custom
all-gather / reduce-scatter, a comm hook); ``mgwfbp`` runs MG-WFBP's merged allreduces
from gradient-ready hooks of the real backward pass. ``--variant torch`` is
torch.distributed's own collectives (and, with DDP, torch's fp16 / bf16 / PowerSGD hooks).

Prints the loss and the time per step (forward, backward, exposed communication) as it
trains, then a summary: time per step, throughput, final training loss, held-out loss and
accuracy. With --csv, appends one row per step and one summary row (``row`` = step /
summary; MG-WFBP: one summary row per strategy).
"""

from __future__ import annotations

from ccbench.benchmarks import request_thread_level

request_thread_level("multiple")  # the communication thread calls MPI beside the training thread

from ccbench.benchmarks.options import (
    RankAwareParser,
    add_compression,
    add_output,
    add_seed,
    add_transport,
    compression_from,
    non_negative_int,
    parse_size,
    positive_int,
)
from ccbench.benchmarks.progress import progress_bar
from ccbench.benchmarks.results import TRAINING, build_row
from ccbench.kernels import variants
from ccbench.kernels.errors import UsageError
from ccbench.training.loop import (
    DEVICES,
    TrainConfig,
    TrainResult,
    build_trainer,
    run_training,
)

COLUMNS = TRAINING.names

# ----------------------------------------------------------------------- output


def result_rows(result: TrainResult, comm, meta: dict) -> list[dict]:
    c = result.config
    stream = c.framework != "own"
    constant = build_row(
        TRAINING,
        meta,
        {
            "framework": c.framework,
            "variant": c.variant,
            "algorithm": result_algorithm(c),
            "codec": c.compression.spec,
            "compress": c.compress if c.compression.spec != "none" and c.variant != "torch" else "",
            "error_feedback": int(c.compression.error_feedback),
            "overlap": int(c.overlap) if stream else "",
            "model": result.model_name,
            "dataset": result.dataset,
            "params": result.params,
            "ranks": comm.size,
            "global_batch": result.global_batch,
            "lr": result.lr,
            "seed": c.seed,
            "steps": c.steps,
            "warmup_steps": c.warmup,
            "final_window": c.final_window,
            "throughput_unit": f"{result.unit}/s",
        },
    )
    rows = []
    for i in range(len(result.loss)):
        step = i + 1
        held_out = result.evals.get(step, (None, None))
        strategy = {}
        if result.strategies:
            k = int(result.strategy[i])
            strategy = {
                "strategy": result.strategies[k],
                "predicted_us": result.predicted_us[k],
                "predicted_exposed_us": result.predicted_exposed_us[k],
                "groups": result.plan_groups[k],
            }
        rows.append(
            {
                **constant,
                "row": "step",
                "step": step,
                "loss": float(result.loss[i]),
                **{k: float(v[i]) for k, v in result.times.items()},
                **strategy,
                "max_step_us": float(result.max_step_us[i]),
                "wire_bytes_per_rank": float(result.wire_bytes[i]) or None,
                "held_out_loss": held_out[0],
                "held_out_accuracy": held_out[1],
            }
        )
    for summary in result.summaries():
        rows.append({**constant, "row": "summary", "step": None, **summary})
    return rows


def result_algorithm(config: TrainConfig) -> str:
    return variants.gradient_algorithm(config.variant, config.algorithm)


def print_steps(result: TrainResult, every: int) -> None:
    for i, loss in enumerate(result.loss):
        step = i + 1
        if step % every and step != len(result.loss) and step != 1:
            continue
        t = {k: v[i] / 1e3 for k, v in result.times.items()}
        print(
            f"  {step:>6} {loss:>9.4f} {t['step_us']:>9.2f} {t['forward_us']:>9.2f} "
            f"{t['backward_us']:>9.2f} {t['comm_us']:>9.2f} {t['comm_busy_us']:>9.2f}"
        )


def print_summary(result: TrainResult) -> None:
    s = result.summary()
    timed = len(result.loss) - result.timed().start
    print(
        f"# time per step {s['step_us'] / 1e3:.2f} ms over the last {timed} steps "
        f"(forward {s['forward_us'] / 1e3:.2f} ms, backward {s['backward_us'] / 1e3:.2f} "
        f"ms, optimizer {s['optimizer_us'] / 1e3:.2f} ms; communication exposed "
        f"{s['comm_us'] / 1e3:.2f} ms of {s['comm_busy_us'] / 1e3:.2f} ms in collectives: "
        f"allgather {s['allgather_us'] / 1e3:.2f}, reduce-scatter "
        f"{s['reduce_scatter_us'] / 1e3:.2f}, allreduce {s['allreduce_us'] / 1e3:.2f})"
    )
    print(f"# throughput {s['throughput']:.1f} {result.unit}/s")
    if s["wire_bytes_per_rank"]:
        print(f"# wire bytes per rank per step {s['wire_bytes_per_rank']:.0f}")
    window = min(result.config.final_window, len(result.loss))
    print(f"# final training loss {s['loss']:.4f} (mean of the last {window} steps)")
    if s["held_out_loss"] is not None:
        print(
            f"# held-out loss {s['held_out_loss']:.4f}, "
            f"held-out accuracy {s['held_out_accuracy']:.4f}"
        )
    if result.strategies:
        # the planner's iteration (forward + backward + non-overlapped communication)
        # against step - optimizer; its non-overlapped communication against the exposed
        print(
            f"# {'strategy':<12} {'groups':>6} {'predicted_ms':>12} {'measured_ms':>12} "
            f"{'err%':>6} {'pred_exposed':>12} {'exposed_ms':>10} {'step_ms':>8}"
        )
        for summary in result.summaries():
            measured = summary["step_us"] - summary["optimizer_us"]
            err = 100 * (summary["predicted_us"] - measured) / measured
            print(
                f"  {summary['strategy']:<12} {summary['groups']:>6} "
                f"{summary['predicted_us'] / 1e3:>12.2f} {measured / 1e3:>12.2f} "
                f"{err:>6.1f} {summary['predicted_exposed_us'] / 1e3:>12.2f} "
                f"{summary['comm_us'] / 1e3:>10.2f} {summary['step_us'] / 1e3:>8.2f}"
            )


# ----------------------------------------------------------------------- command line


def build_parser(quiet: bool) -> RankAwareParser:
    from ccbench.training.frameworks import FRAMEWORKS
    from ccbench.training.gradient_comm import COMPRESS, VARIANTS
    from ccbench.training.models import DEFAULT_MODEL, MODELS

    models = "\n".join(f"  {name:<11} {text}" for name, (_, text) in MODELS.items())
    parser = RankAwareParser(
        prog="python -m ccbench.benchmarks.training",
        quiet=quiet,
        description="Data-parallel training (the compact sharded trainer, stock PyTorch "
        "FSDP2 or DDP, or MG-WFBP on a real backward pass) whose communication "
        "goes through ccbench's collectives.",
        epilog=f"models:\n{models}",
        formatter_class=__import__("argparse").RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"default {DEFAULT_MODEL}")
    parser.add_argument(
        "--framework",
        choices=FRAMEWORKS,
        default="own",
        help="own: the compact sharded trainer (default); fsdp: PyTorch "
        "FSDP2 with custom all-gather / reduce-scatter; ddp: PyTorch DDP "
        "with a comm hook; mgwfbp: merged allreduces from gradient hooks",
    )
    parser.add_argument(
        "--variant",
        choices=VARIANTS,
        default="baseline",
        help="which collectives carry parameters and gradients; torch: "
        "torch.distributed's own (gloo / NCCL), with DDP also its "
        "fp16, bf16 and powersgd hooks (--codec)",
    )
    parser.add_argument(
        "--algorithm",
        choices=("mpi", "library", "ring"),
        default=None,
        help="baseline only: the transport library's own collectives (mpi "
        "over MPI, library with --transport torch: the default) or "
        "ccbench's ring",
    )
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default="auto",
        help="fsdp / ddp / mgwfbp: the model's device: cuda (the rank's "
        "node-local GPU), cpu, or auto (default: cuda where there is "
        "one)",
    )
    add_transport(parser)
    add_compression(
        parser,
        codec_help="codec spec of the compressed variants (fp16, bf16, bfp:rate=8, "
        "zfp:rate=8, ...; --variant torch: torch's DDP hooks none, fp16, bf16, powersgd); "
        "none with the baseline",
        chunk=True,
        error_feedback=True,
    )
    parser.add_argument(
        "--compress",
        choices=COMPRESS,
        default="both",
        help="what the compressed variants compress: parameters (allgather), "
        "gradients (reduce-scatter) or both (default)",
    )
    parser.add_argument("--steps", type=positive_int, default=100, help="default 100")
    parser.add_argument(
        "--batch",
        type=positive_int,
        default=None,
        help="global batch over all ranks (default: the model's)",
    )
    parser.add_argument("--lr", type=float, default=None, help="Adam learning rate")
    add_seed(parser, "the weights and of the batches")
    parser.add_argument(
        "--warmup",
        type=non_negative_int,
        default=3,
        help="first steps left out of the timing averages (default 3)",
    )
    parser.add_argument(
        "--clip",
        type=float,
        default=0.0,
        help="clip the global gradient norm to this (default 0: off)",
    )
    parser.add_argument(
        "--eval-every",
        type=non_negative_int,
        default=0,
        help="held-out evaluation every N steps (always after the last)",
    )
    parser.add_argument(
        "--final-window",
        type=positive_int,
        default=10,
        help="steps averaged into the final training loss (default 10)",
    )
    parser.add_argument(
        "--threads", type=positive_int, default=1, help="torch threads per rank (default 1)"
    )
    parser.add_argument(
        "--log-every", type=positive_int, default=10, help="print every N-th step (default 10)"
    )
    parser.add_argument(
        "--no-overlap",
        dest="overlap",
        action="store_false",
        help="fsdp / ddp / mgwfbp: run every collective on the training "
        "thread instead of the communication thread",
    )
    parser.add_argument(
        "--strategy",
        default="mgwfbp",
        help="mgwfbp: comma-separated wfbp, single, fixed:BYTES, ddp:BYTES, "
        "mgwfbp, optimal or all; steps rotate through them (default "
        "mgwfbp)",
    )
    parser.add_argument(
        "--bucket-cap-mb", type=float, default=None, help="ddp: bucket size (default DDP's 25)"
    )
    parser.add_argument(
        "--powersgd-rank",
        type=positive_int,
        default=4,
        help="--variant torch --codec powersgd: matrix rank (default 4)",
    )
    parser.add_argument(
        "--profile-iterations",
        type=positive_int,
        default=5,
        help="mgwfbp: backward passes profiled before training (default 5)",
    )
    parser.add_argument(
        "--fit-min",
        type=parse_size,
        default=4096,
        metavar="BYTES",
        help="mgwfbp: smallest allreduce of the cost-model sweep (default 4K)",
    )
    parser.add_argument(
        "--fit-seconds",
        type=float,
        default=0.2,
        help="mgwfbp: seconds per size of the cost-model sweep (default 0.2)",
    )
    add_output(parser, "per-step and summary rows", json=True)
    parser.add_argument(
        "--trace",
        metavar="PATH",
        help="fsdp / ddp / mgwfbp: record the collective sequence of the "
        "steps after --warmup into this trace (docs/traces.md)",
    )
    return parser


def config_from_options(opts) -> TrainConfig:
    if opts.lr is not None and not opts.lr > 0:
        raise UsageError("--lr must be positive")
    if opts.clip < 0:
        raise UsageError("--clip must not be negative")
    if opts.fit_seconds <= 0:
        raise UsageError("--fit-seconds must be positive")
    compression = compression_from(opts, variant=opts.variant, hooks=True)
    if opts.framework == "mgwfbp":
        from ccbench.collectives.mgwfbp import parse_strategies

        opts.strategy = ",".join(s.label for s in parse_strategies(opts.strategy))
    return TrainConfig(
        model=opts.model,
        framework=opts.framework,
        variant=opts.variant,
        algorithm=opts.algorithm,
        compression=compression,
        compress=opts.compress,
        steps=opts.steps,
        batch=opts.batch,
        lr=opts.lr,
        seed=opts.seed,
        warmup=opts.warmup,
        clip=opts.clip,
        eval_every=opts.eval_every,
        final_window=opts.final_window,
        threads=opts.threads,
        overlap=opts.overlap,
        strategy=opts.strategy,
        bucket_cap_mb=opts.bucket_cap_mb,
        powersgd_rank=opts.powersgd_rank,
        profile_iterations=opts.profile_iterations,
        device=opts.device,
    )


def cost_model(comm, opts, root: bool):
    """``cost(gradient_comm, profile) -> AlphaBeta`` for MG-WFBP: an allreduce size sweep
    through the gradient communicator, fitted as benchmarks.merged_gradient does, and
    printed."""

    def cost(gradient_comm, profile):
        import torch

        from ccbench.benchmarks.timing import measure
        from ccbench.collectives.costmodel import fit_cost_model, fit_sizes

        count = profile.total_bytes // 4
        send = torch.randn(count, generator=torch.Generator().manual_seed(comm.rank))
        if opts.buffer == "torch-cuda":  # the gradients' device
            send = send.to(torch.device("cuda", torch.cuda.current_device()))
        recv = send.clone()

        def bind(_, r):  # in place, as the trainer does; divided so values stay bounded
            return lambda: (gradient_comm.allreduce(r), r.div_(comm.size))

        sizes = fit_sizes(profile.total_bytes, opts.fit_min, comm.size)
        fit, _ = fit_cost_model(
            comm,
            bind,
            send,
            recv,
            sizes,
            opts.fit_seconds,
            lambda run, iters: measure(comm, run, iters, 1, "per-call")["max_us"],
        )
        if root:
            print(
                f"# allreduce cost model ({opts.variant}, "
                f"{gradient_comm.spec.compression.spec}): "
                f"{fit.describe()}",
                flush=True,
            )
        return fit.model

    return cost


def _setup(argv: list[str], comm):
    from ccbench.benchmarks.options import resolve_algorithm, resolve_transport
    from ccbench.training.models import make_task

    opts = build_parser(quiet=comm.rank != 0).parse_args(argv)
    opts.algorithm = resolve_algorithm(opts.algorithm, opts.transport)
    cuda = opts.device == "cuda" or (
        opts.device == "auto" and opts.framework != "own" and _cuda_available()
    )
    # the buffers the transport carries: the model's (NCCL by default on a GPU)
    opts.buffer = "torch-cuda" if cuda else "torch"
    resolve_transport(opts)
    config = config_from_options(opts)
    return opts, config, make_task(config.model)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _train_and_report(argv: list[str], launch) -> int:
    from ccbench.benchmarks import environment
    from ccbench.benchmarks.agreement import agreed
    from ccbench.benchmarks.results import append_rows, check_header, write_json_atomic
    from ccbench.collectives.launch import communicator_for

    opts, config, task = agreed(launch, lambda: _setup(argv, launch))
    comm = agreed(launch, lambda: communicator_for(launch, opts.transport, opts.backend))
    root = comm.rank == 0
    cost = cost_model(comm, opts, root) if config.framework == "mgwfbp" else None
    trainer = agreed(comm, lambda: build_trainer(comm, config, task, cost))
    recorder = agreed(comm, lambda: _recorder(opts, config, trainer))
    agreed(comm, lambda: check_header(opts.csv, COLUMNS) if root else None)
    info = environment.run_info(comm, config.variant, opts.buffer)
    info.update(transport=opts.transport, backend=opts.backend)
    if root:
        batch = config.batch or task.default_batch
        print(
            f"# ccbench training: model {task.name} on {task.dataset}, framework "
            f"{config.framework}, variant "
            f"{config.variant} ({result_algorithm(config)}), codec {config.compression.spec}"
            f"{', error feedback' if config.compression.error_feedback else ''}, "
            f"{comm.size} ranks, "
            f"global batch {batch}, {config.steps} steps",
            flush=True,
        )
    profile = getattr(trainer, "profile", None)
    if root and profile is not None:
        print(
            f"# profile of this model's backward (no communication): forward "
            f"{profile.forward_us / 1e3:.2f} ms, backward "
            f"{profile.total_backward_us / 1e3:.2f} ms, {profile.ntensors} gradients, "
            f"{profile.total_bytes / 2**20:.2f} MiB",
            flush=True,
        )
    with progress_bar(config.steps, "training", unit="step", rank=comm.rank) as bar:

        def advance(step: int, loss: float) -> None:
            bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            bar.update(1)

        result = run_training(comm, config, task=task, trainer=trainer, on_step=advance)
    if recorder is not None:
        _write_trace(comm, opts, config, result, recorder, info)
    if root:
        print(f"# {result.params} parameters")
        print(
            f"# {'step':>6} {'loss':>9} {'step_ms':>9} {'fwd_ms':>9} {'bwd_ms':>9} "
            f"{'exposed':>9} {'in_comm':>9}"
        )
        print_steps(result, opts.log_every)
        print_summary(result)
        rows = result_rows(result, comm, info)
        if opts.csv:
            append_rows(opts.csv, rows, COLUMNS)
            environment.write_sidecar(opts.csv, info, argv, comm.size)
        if opts.json:
            write_json_atomic(
                opts.json,
                {
                    "environment": environment.describe(info, argv, comm.size),
                    "config": vars(config),
                    "summary": rows[-1],
                    "summaries": [r for r in rows if r["row"] == "summary"],
                    "steps": [r for r in rows if r["row"] == "step"],
                },
            )
    return 0


def _recorder(opts, config: TrainConfig, trainer):
    """A Recorder bracketing every step, or None without --trace."""
    if not opts.trace:
        return None
    from ccbench.training.trace_capture import Recorder

    if config.framework == "own":
        raise UsageError(
            "--trace records FSDP, DDP and MG-WFBP steps: use --framework fsdp, ddp or mgwfbp"
        )
    if config.framework == "ddp" and config.variant == "torch":
        raise UsageError(
            "--trace records the collectives ccbench runs; torch's DDP hooks "
            "run on gloo's threads, out of its sight"
        )
    recorder = Recorder()
    recorder.wrap(trainer)
    return recorder


def _write_trace(comm, opts, config: TrainConfig, result: TrainResult, recorder, info) -> None:
    from ccbench.collectives.trace_files import write
    from ccbench.training.trace_capture import gather

    source = {
        "kind": "captured",
        "framework": config.framework,
        "model": result.model_name,
        "params": result.params,
        "global_batch": result.global_batch,
        "variant": config.variant,
        "algorithm": result_algorithm(config),
        "codec": config.compression.spec,
        "strategy": config.strategy if config.framework == "mgwfbp" else "",
        "threads": config.threads,
        "run_id": info["run_id"],
        "git_sha": info["git_sha"],
    }
    trace = gather(comm, recorder, source, config.warmup, config.overlap)
    if comm.rank == 0:
        write(trace, opts.trace)
        calls = len(trace.steps[0].calls)
        print(
            f"# trace: {len(trace.steps)} step(s), {calls} collectives per step, "
            f"written to {opts.trace}"
        )


def main(argv: list[str] | None = None) -> int:
    """Run on every rank, with the harness's error handling (benchmarks.agreement.run_main)."""
    from ccbench.benchmarks.agreement import run_main

    return run_main(_train_and_report, argv)


if __name__ == "__main__":
    raise SystemExit(main())
