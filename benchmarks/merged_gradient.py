"""MG-WFBP execution benchmark: merged-gradient allreduces overlapped with a replayed backward.

    mpiexec -n 4 python -m ccbench.benchmarks.merged_gradient --model resnet50 --strategy all

1. Cost model: allreduce over a size sweep on this communicator, through the chosen
   group allreduce (--allreduce); ``alpha + beta * bytes`` is fitted and printed (never
   assumed).
2. Plans: every strategy of ``collectives.mgwfbp`` under that fit and the model's
   profile (``results/profiles/<model>.csv``), with its predicted iteration time.
3. Execution: iterations replay the profile's forward and backward times on the main
   thread (it sleeps until each group's last gradient is ready, as a device would be
   busy computing, leaving the host free) and hand each group, the moment it is
   complete, to a communication thread that allreduces the groups in order on slices
   of one flat gradient buffer (one stream, as Horovod's background thread and DDP's
   reducer). The strategies run round-robin, iteration by iteration, so load drifts hit
   all of them alike. Measured: barrier, then the iteration until the last allreduce
   returns; the slowest rank's time per iteration, averaged.
"""

from __future__ import annotations

from ccbench.benchmarks import request_thread_level

request_thread_level("multiple")  # the allreduce thread calls MPI beside the main thread

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ccbench.benchmarks import environment
from ccbench.benchmarks.agreement import agreed, run_main
from ccbench.benchmarks.harness import open_transport
from ccbench.benchmarks.options import (
    RankAwareParser,
    add_output,
    add_repetitions,
    add_seed,
    add_validate,
    parse_size,
    resolve_transport,
)
from ccbench.benchmarks.results import (
    COSTFIT,
    MGWFBP,
    MGWFBP_COLUMNS,
    PROFILE_DIR,
    append_rows,
    build_row,
    check_header,
    profile_names,
    write_csv_atomic,
)
from ccbench.benchmarks.timing import measure
from ccbench.collectives.baseline import bind_collective
from ccbench.collectives.communicator import BaseCommunicator as Communicator
from ccbench.collectives.costmodel import AlphaBeta, Fit, fit_cost_model, fit_sizes
from ccbench.collectives.mgwfbp import Profile, parse_strategies, plan, plan_columns, read_profile
from ccbench.collectives.overlap import CommThread, Schedule, make_schedule, replay_iteration
from ccbench.collectives.simulator import scale_compute
from ccbench.kernels.errors import UsageError
from ccbench.kernels.vocabulary import exact_amplitude, itemsize

GRADIENT_DTYPE = "float32"
ITEM = itemsize(GRADIENT_DTYPE)

# --allreduce: what allreduces every group, over which transport (mpi unless torch:)
ALLREDUCES = {
    "mpi": "the MPI library's MPI_Allreduce (default)",
    "ring": "the ring allreduce of collectives.ring, by hand over point-to-point calls",
    "coll:CODEC": "collective-level compressed ring allreduce (collectives.compressed), "
    "e.g. coll:fp16, coll:zfp:rate=8",
    "p2p:CODEC": "point-to-point compressed ring allreduce, e.g. p2p:bfp:rate=8",
    "torch": "torch.distributed's all_reduce (gloo; --backend)",
    "torch:ALLREDUCE": "ring, coll:CODEC or p2p:CODEC over torch.distributed, e.g. torch:coll:fp16",
}


def split_transport(name: str) -> tuple[str, str]:
    """An --allreduce name -> (the transport, the library that moves the bytes: mpi or
    torch; the allreduce run over it)."""
    if name == "torch":
        return "torch", "library"
    if name.startswith("torch:"):
        return "torch", name.split(":", 1)[1]
    return "mpi", name


# ---------------------------------------------------------------- group allreduce


@dataclass
class GroupAllreduce:
    """How every group is allreduced: ``bind(send, recv) -> run()``, set up in advance."""

    name: str
    bind: object
    codec: object = None  # kernels.codec_base.Codec of a compressed allreduce
    variant: str = ""  # "coll" or "p2p" for a compressed allreduce

    def error_bound(self, amaxes: list[float]) -> float | None:
        """Max abs error of a result (None: exact), for inputs of these magnitudes."""
        if self.codec is None:
            return None
        from ccbench.collectives.compressed_error import error_bound

        return error_bound(self.codec, self.variant, "allreduce", amaxes, GRADIENT_DTYPE)


def make_group_allreduce(name: str, comm: Communicator) -> GroupAllreduce:
    _, allreduce = split_transport(name)
    if allreduce in ("mpi", "library", "ring"):
        return GroupAllreduce(
            name, lambda s, r: bind_collective(comm, allreduce, "allreduce", s, r)
        )
    variant, sep, spec = allreduce.partition(":")
    if variant in ("coll", "p2p") and sep:
        from ccbench.benchmarks.options import compression_of
        from ccbench.collectives.compressed import bind_compressed

        codec = compression_of(spec).codec
        return GroupAllreduce(
            name,
            lambda s, r: bind_compressed(comm, variant, "allreduce", codec, s, r),
            codec,
            variant,
        )
    raise UsageError(f"unknown --allreduce {name!r}; choose from {', '.join(ALLREDUCES)}")


# ---------------------------------------------------------------- cost model


def measure_cost_model(
    comm: Communicator, bind, send, recv, sizes: list[int], seconds_per_size: float
) -> tuple[Fit, list[dict]]:
    """Time one allreduce per size, OSU style (the slowest rank's mean, OSU's "Max
    Latency": an iteration ends with its slowest rank), and fit alpha + beta * s."""
    return fit_cost_model(
        comm,
        bind,
        send,
        recv,
        sizes,
        seconds_per_size,
        lambda run, iters: measure(comm, run, iters, 1, "per-call")["max_us"],
    )


def run_strategies(
    comm: Communicator, schedules: list[Schedule], stream: CommThread, iterations: int, warmup: int
) -> np.ndarray:
    """Round-robin iterations; returns [strategy, iteration, (forward end, backward end,
    iteration end, time in allreduces)] of the slowest rank, in microseconds."""
    n = len(schedules)
    times = np.zeros((n, iterations, 4))
    for it in range(warmup + iterations):
        for k in range(n):
            j = (k + it) % n  # rotate the order so no strategy always follows another
            comm.barrier()
            result = replay_iteration(schedules[j], stream)
            if it >= warmup:
                times[j, it - warmup] = result
    return comm.allreduce_array(times, "max") * 1e6


def validate(
    comm: Communicator,
    schedules: list[Schedule],
    stream: CommThread,
    send: np.ndarray,
    recv: np.ndarray,
    seed: int,
    bound: float | None,
) -> list[bool]:
    """Check every strategy on integer inputs: each group reduced once, all covered.

    Exact for lossless allreduces; within ``bound`` (absolute) for lossy ones.
    """
    amplitude = exact_amplitude(comm.size)

    def inputs(rank):
        rng = np.random.default_rng([seed, rank, send.size])
        return rng.integers(-amplitude, amplitude + 1, send.size).astype(GRADIENT_DTYPE)

    send[:] = inputs(comm.rank)
    expected = np.zeros_like(send)
    for r in range(comm.size):
        expected += inputs(r)
    passed = []
    for s in schedules:
        recv.fill(np.nan)
        comm.barrier()
        replay_iteration(s, stream)
        if bound is None:
            ok = bool(np.array_equal(recv, expected))
        else:
            ok = bool(np.all(np.abs(recv - expected) <= bound))  # NaN (uncovered) fails
        passed.append(bool(comm.allreduce_value(int(ok), op="min")))
    return passed


# ---------------------------------------------------------------- driver


def build_parser(quiet: bool) -> argparse.ArgumentParser:
    parser = RankAwareParser(
        prog="python -m ccbench.benchmarks.merged_gradient",
        quiet=quiet,
        description=__doc__.split("\n\n")[0]
        + "\n\nprofiled models: "
        + ", ".join(profile_names())
        + "\nallreduces:\n"
        + "\n".join(f"  {k:15s} {v}" for k, v in ALLREDUCES.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model", default="resnet50", help=f"a model profiled in {PROFILE_DIR} (default resnet50)"
    )
    parser.add_argument(
        "--profile", metavar="CSV", help=f"profile CSV (default {PROFILE_DIR}/<model>.csv)"
    )
    parser.add_argument(
        "--strategy",
        default="all",
        help="comma-separated wfbp, single, fixed:BYTES, ddp:BYTES, mgwfbp, "
        "optimal, or all (default)",
    )
    parser.add_argument(
        "--allreduce",
        default="mpi",
        metavar="NAME",
        help="allreduce of every group: mpi (default), ring, coll:CODEC, "
        "p2p:CODEC, over MPI; torch, or torch: before the others, over "
        "torch.distributed (see above)",
    )
    # its former name, which the CSV's transport column still holds
    parser.add_argument("--transport", dest="allreduce", help=argparse.SUPPRESS)
    parser.add_argument(
        "--backend",
        choices=("gloo", "nccl"),
        default=None,
        help="torch: the torch.distributed backend (default gloo: the gradients are host buffers)",
    )
    add_repetitions(parser, 10, "training iterations per strategy", warmup_default=2)
    parser.add_argument(
        "--compute-speedup",
        type=float,
        default=1.0,
        help="replay the profile's compute this many times faster",
    )
    parser.add_argument(
        "--fit-min",
        default="4K",
        help="smallest size of the cost-model sweep (default 4K; the sweep "
        "doubles up to the whole gradient)",
    )
    parser.add_argument(
        "--fit-seconds",
        type=float,
        default=0.2,
        help="time spent per size of the sweep (default 0.2)",
    )
    add_validate(parser, "every strategy's result, exactly, on integer inputs")
    add_output(parser, "one row per strategy")
    parser.add_argument(
        "--fit-csv", metavar="PATH", help="write the cost-model sweep (size, measured, fitted)"
    )
    add_seed(parser, "the gradients")
    return parser


def _parse(argv, comm: Communicator):
    opts = build_parser(quiet=comm.rank != 0).parse_args(argv)
    opts.strategies = parse_strategies(opts.strategy)
    opts.fit_low = parse_size(opts.fit_min)
    if opts.compute_speedup <= 0 or opts.fit_seconds <= 0:
        raise UsageError("--compute-speedup and --fit-seconds must be positive")
    opts.transport, _ = split_transport(opts.allreduce)
    opts.buffer = "numpy"
    resolve_transport(opts)
    return opts


def _check_threaded(comm: Communicator) -> None:
    if not comm.threaded:
        raise UsageError("the communication thread needs MPI_THREAD_SERIALIZED or better")


def _load_profile(opts) -> Profile:
    path = Path(opts.profile) if opts.profile else PROFILE_DIR / f"{opts.model}.csv"
    profile = scale_compute(read_profile(path), opts.compute_speedup)
    if np.any(profile.nbytes % ITEM):
        raise UsageError(f"{path}: gradient sizes must be whole {GRADIENT_DTYPE} elements")
    return profile


def _report_fit(fit: Fit, points: list[dict], ranks: int, allreduce: str) -> None:
    print(f"# allreduce cost model on {ranks} ranks ({allreduce}): {fit.describe()}")
    print(f"# {'size_bytes':>12} {'measured_us':>12} {'fitted_us':>12} {'iters':>6}")
    for p in points:
        print(
            f"  {p['size_bytes']:>12} {p['measured_us']:>12.1f} {p['fitted_us']:>12.1f} "
            f"{p['iterations']:>6}"
        )


def _report(rows: list[dict]) -> None:
    print(
        f"# {'strategy':<12} {'groups':>6} {'predicted_ms':>12} {'measured_ms':>12} "
        f"{'+-std':>7} {'err%':>6} {'nonovl_pred':>11} {'nonovl_meas':>11} "
        f"{'comm_pred':>9} {'comm_meas':>9} {'check':>5}"
    )
    for r in rows:
        err = 100 * (r["predicted_us"] - r["measured_us"]) / r["measured_us"]
        print(
            f"  {r['strategy']:<12} {r['groups']:>6} {r['predicted_us'] / 1e3:>12.2f} "
            f"{r['measured_us'] / 1e3:>12.2f} {r['measured_std_us'] / 1e3:>7.2f} {err:>6.1f} "
            f"{r['nonoverlapped_us'] / 1e3:>11.2f} {r['measured_nonoverlapped_us'] / 1e3:>11.2f}"
            f" {r['comm_us'] / 1e3:>9.2f} {r['measured_comm_us'] / 1e3:>9.2f}"
            f" {r.get('validation', ''):>5}",
            flush=True,
        )


def _run(argv, launch: Communicator) -> int:
    opts = agreed(launch, lambda: _parse(argv, launch))
    comm = open_transport(launch, opts)
    agreed(comm, lambda: _check_threaded(comm))
    agreed(comm, lambda: check_header(opts.csv, MGWFBP_COLUMNS) if comm.rank == 0 else None)
    profile = agreed(comm, lambda: _load_profile(opts) if comm.rank == 0 else None)
    profile = comm.bcast_obj(profile, root=0)
    root = comm.rank == 0
    allreduce = agreed(comm, lambda: make_group_allreduce(opts.allreduce, comm))
    bind = allreduce.bind
    count = profile.total_bytes // ITEM
    rng = np.random.default_rng([opts.seed, comm.rank])
    send = rng.standard_normal(count, dtype=GRADIENT_DTYPE)  # gradient-like values
    recv = np.zeros_like(send)
    info = environment.run_info(comm, "merged_gradient")

    sizes = fit_sizes(profile.total_bytes, opts.fit_low, comm.size)
    fit, points = measure_cost_model(comm, bind, send, recv, sizes, opts.fit_seconds)
    cost: AlphaBeta = fit.model
    if root:
        print(
            f"# MG-WFBP execution: {profile.model}, {profile.ntensors} tensors, "
            f"{profile.total_bytes / 2**20:.2f} MiB, forward {profile.forward_us / 1e3:.2f} ms,"
            f" backward {profile.total_backward_us / 1e3:.2f} ms, {comm.size} ranks"
        )
        _report_fit(fit, points, comm.size, opts.allreduce)
        if opts.fit_csv:
            run = {"run_id": info["run_id"], "sweep_id": info["sweep_id"]}
            fit_columns = {
                "model": profile.model,
                "ranks": comm.size,
                "transport": opts.allreduce,
                "link_gbps": info["link_gbps"],
            }
            write_csv_atomic(
                opts.fit_csv,
                [build_row(COSTFIT, run, fit_columns, p) for p in points],
                COSTFIT.names,
            )

    plans = [plan(s, profile, cost) for s in opts.strategies]
    elements = profile.nbytes // ITEM
    schedules = [make_schedule(p, bind, send, recv, elements) for p in plans]
    stream = CommThread()
    try:
        times = run_strategies(comm, schedules, stream, opts.iterations, opts.warmup)
        checks = [None] * len(schedules)
        if opts.validate:
            bound = allreduce.error_bound([exact_amplitude(comm.size)] * comm.size)
            checks = validate(comm, schedules, stream, send, recv, opts.seed, bound)
    finally:
        stream.close()

    rows = []
    for p, t, ok in zip(plans, times, checks, strict=True):
        forward, backward, total, busy = t.T
        rows.append(
            build_row(
                MGWFBP,
                info,
                {
                    "model": profile.model,
                    "ranks": comm.size,
                    "transport": opts.allreduce,  # the column's former name of --allreduce
                    **plan_columns(p, cost),
                    "fit_r2": round(fit.r2, 6),
                    "measured_us": round(float(total.mean()), 3),
                    "measured_std_us": round(float(total.std()), 3),
                    "measured_backward_us": round(float((backward - forward).mean()), 3),
                    "measured_nonoverlapped_us": round(float((total - backward).mean()), 3),
                    "measured_comm_us": round(float(busy.mean()), 3),
                    "scaling_efficiency": None,
                    "iterations": opts.iterations,
                    "compute_speedup": opts.compute_speedup,
                    "validation": "" if ok is None else ("Pass" if ok else "Fail"),
                },
            )
        )
    if root:
        _report(rows)
        if opts.csv:
            append_rows(opts.csv, rows, MGWFBP_COLUMNS)
            environment.write_sidecar(opts.csv, info, argv, comm.size)
    return 1 if any(ok is False for ok in checks) else 0


def main(argv: list[str] | None = None) -> int:
    return run_main(_run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
