"""The common driver of every ccbench variant (nccl-tests style).

A variant script says which collective it runs and how (a `Variant` with a few hooks);
this module does the rest: options, the message-size sweep, warm-up, timing, statistics
across ranks, validation, OSU-format output and CSV/JSON results.

The timed loops are in benchmarks/timing.py, the agreement on errors across ranks in
benchmarks/agreement.py; `measure`, `agreed` and `run_main` are named here too, as the
variants' entry points know them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ccbench.benchmarks import accuracy, environment, graphs, osu_format
from ccbench.benchmarks.agreement import agreed, run_main
from ccbench.benchmarks.options import (
    DEFAULT_DATA,
    FALLBACK_DATA,
    build_parser,
    iterations_for,
    resolve_transport,
    size_list,
)
from ccbench.benchmarks.results import (
    COMMON_COLUMNS,
    HARNESS,
    Samples,
    append_rows,
    build_row,
    check_header,
    point_key,
    write_json_atomic,
)
from ccbench.benchmarks.timing import measure, planned_barrier, planned_timer, requested_barrier
from ccbench.collectives.communicator import BaseCommunicator
from ccbench.collectives.launch import communicator_for
from ccbench.collectives.spec import spec
from ccbench.kernels import arrays, host_memory, inputs
from ccbench.kernels.errors import UsageError
from ccbench.kernels.inputs import DataKind, parse_data_kind
from ccbench.kernels.vocabulary import COLLECTIVES

DEFAULT_TIME_BUDGET_S = 10.0  # --ci-target without --time-budget


@dataclass
class Case:
    """One collective call's shape on this rank, for one message size and configuration."""

    collective: str
    dtype: str
    buffer: str
    ranks: int
    rank: int
    size_bytes: int  # OSU convention: allgather per-rank send; others the whole send buffer
    count: int  # elements in that OSU size
    send_count: int
    recv_count: int
    bytes_per_rank: int
    total_bytes: int  # nccl-tests' size: the whole gathered / reduced buffer
    seed: int = 0
    config: dict = field(default_factory=dict)
    data: DataKind | None = None  # what the timed calls carry (--data)


@dataclass
class Op:
    """What a variant hands the harness: one blocking collective and its buffers."""

    run: Callable[[], None]
    send: object
    recv: object
    stats: Callable[[], dict] | None = None
    # False when the bytes leave through the MPI library, where Python cannot count them
    measures_wire: bool = True
    # reads what device calls left for later (a codec's range check); outside the timing
    check: Callable[[], None] | None = None


@dataclass
class Context:
    comm: BaseCommunicator
    opts: object
    variant: Variant


class Variant:
    """Hooks a variant fills in; the defaults suit an uncompressed dense collective.

    Every size is timed on `make_input` (the --data kind: real gradients by default), and
    the result of one more call on that data is compared with the exact result for the
    row's accuracy columns. With -c, a separate pass checks one call on
    `validation_input` (small integers, whose sums are exact in any order) against
    `reference`, exactly or within `error_bound`.
    """

    name = "variant"
    description = ""
    collectives: tuple[str, ...] = COLLECTIVES

    def add_options(self, parser) -> None:
        """Add the variant's own options to the argparse parser."""

    def check_options(self, opts, ranks: int) -> None:
        """Raise UsageError for option values the variant cannot run."""

    def columns(self, opts) -> dict:
        """Constant CSV columns of this run: algorithm, codec, variant parameters."""
        return {}

    def configurations(self, opts) -> list[dict]:
        """An extra sweep axis (e.g. densities); each dict becomes CSV columns."""
        return [{}]

    def make_op(self, ctx: Context, case: Case) -> Op:
        raise NotImplementedError

    def make_input(self, case: Case, rank: int) -> np.ndarray:
        """The timed data of `rank`."""
        return inputs.values(case.data, case.send_count, rank, case.ranks, case.seed)

    def validation_input(self, case: Case, rank: int) -> np.ndarray:
        """The data of the validation pass (-c) on `rank`."""
        return inputs.values("exact", case.send_count, rank, case.ranks, case.seed)

    def reference(self, case: Case, inputs: list[np.ndarray]) -> np.ndarray:
        return dense_reference(case, inputs)

    def error_bound(
        self, case: Case, reference: np.ndarray, inputs: list[np.ndarray]
    ) -> float | None:
        """The absolute error the result of these inputs may have; None: it must be exact."""
        return None

    def stdout_columns(self, opts) -> list[tuple[str, str, str]]:
        """Extra stdout columns after OSU's: (header, row key, format)."""
        return []

    def prepare(self, comm: BaseCommunicator, opts) -> None:
        """Start-up work of a run, collective over `comm`, before the header is printed
        (e.g. rates measured for an automatic setting)."""

    def run_columns(self, opts) -> dict:
        """CSV columns known once `prepare` has run, the same for every row of the run."""
        return {}

    def values_matter(self, opts) -> bool:
        """Whether the values carried can change the time (a codec's work, a lossless
        ratio): such runs need the data asked for; the others may fall back to synthetic
        gradients when the real-data corpus is not built."""
        return True

    def own_data(self, opts) -> DataKind | None:
        """The inputs this variant times instead of --data (None: it times --data)."""
        return None

    def library_collectives(self, opts) -> bool:
        """True when every timed call is one of the MPI library's own collectives on host
        buffers: what OSU's C timing loop can time (benchmarks/timing_c.py)."""
        return False

    def graph_refusal(self, opts) -> str | None:
        """Why this run's call cannot be captured in a CUDA graph (--cuda-graph), where
        the transport could: the host inside the call. None: it can."""
        return None


# Inputs and references -------------------------------------------------------------------


def dense_reference(case: Case, inputs: list[np.ndarray]) -> np.ndarray:
    """The uncompressed result on this rank, in float64."""
    return spec(case.collective).reference(inputs, case.rank)


# Validation ---------------------------------------------------------------------------------


def fill(buffer_array, values: np.ndarray, case: Case) -> None:
    """Copy float64 host values into a benchmark buffer of any backend, cast to its dtype
    (on a device: one explicit copy from host memory)."""
    arrays.fill(buffer_array, values)


def held(values: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values as a buffer of `dtype` holds them (rounded to nearest)."""
    backend = "torch" if dtype == "bfloat16" else "numpy"
    return arrays.to_numpy(arrays.from_numpy(backend, values, dtype)).astype(np.float64)


def check_result(variant: Variant, case: Case, got, inputs: list[np.ndarray]) -> dict:
    """Compare this rank's result with the uncompressed reference (float64)."""
    reference = variant.reference(case, inputs)
    # the reference as the dtype holds it: what an exact collective of these inputs gives
    expected = held(reference, case.dtype)
    result = arrays.to_numpy(got).astype(np.float64)
    bound = variant.error_bound(case, reference, inputs)
    if result.shape != reference.shape:
        return {
            "max_abs_err": float("inf"),
            "max_rel_err": float("inf"),
            "wrong": 1,
            "error_bound": bound,
            "passed": False,
        }
    err = np.abs(result - expected.astype(np.float64))
    finite = bool(np.isfinite(result).all())
    max_abs = float(err.max()) if err.size else 0.0
    scale = float(np.abs(reference).max()) if reference.size else 0.0
    max_rel = max_abs / scale if scale > 0 else max_abs
    if bound is None:
        wrong = int(np.count_nonzero(err)) + (0 if finite else 1)
        passed = wrong == 0
    else:
        wrong = int(np.count_nonzero(err > bound)) + (0 if finite else 1)
        passed = wrong == 0
    return {
        "max_abs_err": max_abs,
        "max_rel_err": max_rel,
        "wrong": wrong,
        "error_bound": bound,
        "passed": passed,
    }


# The driver ---------------------------------------------------------------------------------


def parse_options(variant: Variant, argv, comm: BaseCommunicator):
    prog = f"ccbench {variant.name}"
    parser = build_parser(prog, variant.description, variant.collectives, quiet=comm.rank != 0)
    variant.add_options(parser)
    opts = parser.parse_args(argv)
    opts.sizes = size_list(opts.message_size)
    arrays.check_supported(opts.buffer, opts.dtype)
    resolve_transport(opts)
    # the buffer policy is part of what a row measures: set before any buffer exists
    opts.hugepages = host_memory.set_hugepages(opts.hugepages) if opts.buffer == "numpy" else ""
    opts.data_kind, opts.data_note = resolve_data(variant, opts)
    if opts.collective not in variant.collectives:
        raise UsageError(f"{variant.name} does not run {opts.collective}")
    if opts.time_budget is not None and opts.ci_target is None:
        raise UsageError("--time-budget applies to --ci-target runs; add --ci-target PCT")
    if opts.ci_target is not None and opts.time_budget is None:
        opts.time_budget = DEFAULT_TIME_BUDGET_S
    variant.check_options(opts, comm.size)
    if opts.cuda_graph:
        graphs.check_options(variant, opts)
    return opts


def resolve_data(variant: Variant, opts) -> tuple[DataKind, str | None]:
    """(what the timed calls carry, a note for the header when it is not what the user
    might expect). The default, real gradients, needs the corpus; a run whose time cannot
    depend on the values does not wait for it."""
    own = variant.own_data(opts)
    if own is not None:
        if opts.data is not None:
            raise UsageError(
                f"{variant.name} times its own inputs ({own.spec}); --data does not apply"
            )
        return own, None
    if opts.data is not None:
        return parse_data_kind(opts.data), None
    if inputs.corpus_built() or variant.values_matter(opts):
        if not inputs.corpus_built():
            raise UsageError(
                f"--data {DEFAULT_DATA} (the default) needs the real-data corpus, not built "
                f"here yet: run `{inputs.BUILD_COMMAND}` once (about a minute; it writes "
                f"{inputs.corpus_root()}), or time synthetic data with --data {FALLBACK_DATA}"
            )
        return parse_data_kind(DEFAULT_DATA), None
    return parse_data_kind(FALLBACK_DATA), (
        f"{FALLBACK_DATA}: no real-data corpus here (`{inputs.BUILD_COMMAND}` builds it); an "
        "uncompressed collective's time does not depend on the values"
    )


def open_transport(launch: BaseCommunicator, opts) -> BaseCommunicator:
    """This rank's device (its node-local rank's), then the communicator the run's
    algorithms use (--transport). Collective; errors agreed."""
    agreed(launch, lambda: arrays.select_device(opts.buffer, launch.local_rank))
    return agreed(launch, lambda: communicator_for(launch, opts.transport, opts.backend))


def plan_cases(variant: Variant, opts, comm: BaseCommunicator) -> list[tuple[Case, list[int]]]:
    cases, skipped = [], []
    for size in opts.sizes:
        shape = spec(opts.collective).shape(size, comm.size, opts.dtype)
        if shape is None:
            skipped.append(size)
            continue
        count, send_count, recv_count = shape.count, shape.send_count, shape.recv_count
        per_rank, total = shape.bytes_per_rank, shape.total_bytes
        for config in variant.configurations(opts):
            cases.append(
                Case(
                    opts.collective,
                    opts.dtype,
                    opts.buffer,
                    comm.size,
                    comm.rank,
                    size,
                    count,
                    send_count,
                    recv_count,
                    per_rank,
                    total,
                    opts.seed,
                    dict(config),
                    opts.data_kind,
                )
            )
    if not cases:
        raise UsageError(
            f"no size in -m {opts.message_size} holds one {opts.dtype} element per rank "
            f"for {opts.collective} on {comm.size} ranks"
        )
    return cases, skipped


def _row(
    run_info: dict,
    variant_columns: dict,
    case: Case,
    iters: int,
    warmup: int,
    timing: dict,
    check: dict | None,
    stats: dict,
    opts,
) -> dict:
    seconds = timing["avg_us"] * 1e-6
    algbw = case.total_bytes / seconds / 1e9 if seconds > 0 else 0.0
    row = build_row(
        HARNESS,
        run_info,
        {
            "collective": case.collective,
            "dtype": case.dtype,
            "buffer": case.buffer,
            "transport": opts.transport,
            "backend": opts.backend,
            "ranks": case.ranks,
            "size_bytes": case.size_bytes,
            "bytes_per_rank": case.bytes_per_rank,
            "total_bytes": case.total_bytes,
            "count": case.count,
            "iterations": iters,
            "warmup": warmup,
            "timing": opts.timing,
            "hugepages": opts.hugepages,
            "ci_target_pct": opts.ci_target,
            "time_budget_s": opts.time_budget,
            **timing,
            "algbw_gbps": algbw,
            "busbw_gbps": algbw * spec(case.collective).busbw(case.ranks),
            "validation": "",
        },
    )
    row.setdefault("codec", "none")
    row.update(variant_columns)
    row["data"] = case.data.spec
    if check is not None:
        row["validation_err"] = check["validation_err"]
        row["error_bound"] = check["error_bound"]
        row["validation"] = "Pass" if check["passed"] else "Fail"
    row.update(stats)
    row.update(case.config)
    return row


@dataclass
class Prepared:
    """A case ready to time: its op, the call the clock wraps, and every rank's data."""

    op: Op
    run: Callable[[], None]
    timed: list[np.ndarray]
    iterations: int
    warmup: int


def prepare_case(variant: Variant, ctx: Context, case: Case) -> Prepared:
    """Build the variant's op for `case` and fill its send buffer with the timed data."""
    comm, opts = ctx.comm, ctx.opts
    op = agreed(comm, lambda: variant.make_op(ctx, case))
    # every rank's timed data: the exact result of the accuracy pass needs them all
    timed = agreed(
        comm, lambda: [held(variant.make_input(case, r), case.dtype) for r in range(case.ranks)]
    )
    agreed(comm, lambda: fill(op.send, timed[case.rank], case))
    iters, warmup = iterations_for(case.size_bytes, opts)
    # device calls return once queued: the timing waits for the device outside the call
    return Prepared(op, op.run, timed, iters, warmup)


def check_deferred(comm: BaseCommunicator, op: Op) -> None:
    """What device calls left to check (a codec's range), agreed; outside the timing."""
    if op.check is not None:
        agreed(comm, op.check)


def validate_case(variant: Variant, ctx: Context, case: Case, op: Op, run=None) -> dict:
    """The -c pass: one call on integers whose sums are exact, checked on every rank
    (`run`: the call to check, the op's own by default; a graph's replay in graph mode)."""
    comm = ctx.comm
    exact = agreed(comm, lambda: [variant.validation_input(case, r) for r in range(case.ranks)])
    agreed(comm, lambda: fill(op.send, exact[case.rank], case))
    (run or op.run)()
    arrays.synchronize(case.buffer)
    check_deferred(comm, op)
    return _combine_checks(comm, agreed(comm, lambda: check_result(variant, case, op.recv, exact)))


def _run_case(variant: Variant, ctx: Context, case: Case):
    comm, opts = ctx.comm, ctx.opts
    prepared = prepare_case(variant, ctx, case)
    op, run, timed = prepared.op, prepared.run, prepared.timed
    graphed = graphs.GraphedCall(comm, case.buffer) if opts.cuda_graph else None
    timing = measure(
        comm,
        run,
        prepared.iterations,
        prepared.warmup,
        opts.timing,
        ci_target=opts.ci_target / 100 if opts.ci_target else None,
        budget_s=opts.time_budget,
        timer=getattr(opts, "timer", None),
        buffer=case.buffer,
        capture=graphed.capture if graphed else None,
        replays=opts.cuda_graph or 1,
        barrier=opts.barrier,
    )
    check_deferred(comm, op)
    iters = timing.pop("iterations")
    # one more call on the timed data: the wire volume, the ratio and the accuracy (graph
    # mode: a replay, and the bytes the captured call put on the wire)
    comm.reset_wire_bytes()
    if graphed is not None:
        run = graphed.replay_counted
    run()
    arrays.synchronize(case.buffer)
    check_deferred(comm, op)
    wire = comm.allreduce_value(comm.wire_bytes) / comm.size
    stats = {"wire_bytes_per_rank": int(round(wire)) if op.measures_wire else None}
    if op.stats is not None:
        stats.update(agreed(comm, op.stats))
    stats.update(_accuracy(comm, variant, case, op.recv, timed))
    check = None
    if opts.validate:  # its own pass, on integers whose sums are exact
        check = validate_case(variant, ctx, case, op, run)
    return iters, prepared.warmup, timing, check, stats


def _accuracy(comm: BaseCommunicator, variant: Variant, case: Case, got, timed) -> dict:
    """The accuracy columns of this call's result on the timed data (every rank's)."""
    mine = agreed(
        comm, lambda: accuracy.partial_sums(arrays.to_numpy(got), variant.reference(case, timed))
    )
    sums, maxima = accuracy.split(mine)
    total = comm.allreduce_array(sums, "sum")
    largest = comm.allreduce_array(maxima, "max")
    return accuracy.combine(total, largest, gradient=case.data.is_gradient)


def _combine_checks(comm: BaseCommunicator, mine: dict) -> dict:
    return {
        "validation_err": comm.allreduce_value(float(mine["max_abs_err"]), op="max"),
        "error_bound": mine["error_bound"],
        "passed": bool(comm.allreduce_value(int(mine["passed"]), op="min")),
    }


def _run(variant: Variant, argv, launch: BaseCommunicator) -> int:
    opts = agreed(launch, lambda: parse_options(variant, argv, launch))
    comm = open_transport(launch, opts)
    cases, skipped = agreed(comm, lambda: plan_cases(variant, opts, comm))
    opts.timer, timer_note = agreed(comm, lambda: planned_timer(variant, opts, comm))
    opts.barrier, barrier_note = planned_barrier(comm, agreed(comm, requested_barrier))
    if opts.cuda_graph:
        agreed(comm, lambda: graphs.check_run(variant, opts, comm))
    agreed(comm, lambda: variant.prepare(comm, opts))
    ctx = Context(comm, opts, variant)
    variant_columns = {**variant.columns(opts), **variant.run_columns(opts)}
    config_keys = list(dict.fromkeys(k for c in cases for k in c.config))
    extra = [k for k in [*variant_columns, *config_keys] if k not in COMMON_COLUMNS]
    columns = [*COMMON_COLUMNS, *extra]
    root = comm.rank == 0
    agreed(comm, lambda: check_header(opts.csv, columns) if root else None)
    run_info = environment.run_info(comm, variant.name, opts.buffer)
    run_info["cuda_graph"] = opts.cuda_graph  # in every row and the sidecar
    printer = osu_format.Printer(opts, variant, run_info) if root else None
    if printer:
        if comm.size == 1:
            print(
                "ccbench: warning: 1 rank: a collective on one rank moves no data; start "
                f"it under a launcher, e.g. mpiexec -n 2 ccbench {variant.name}",
                file=sys.stderr,
                flush=True,
            )
        printer.header(skipped, comm.size, timer_note, barrier_note)
    rows, failures = [], 0
    samples = {}
    for case in cases:
        iters, warmup, timing, check, stats = _run_case(variant, ctx, case)
        samples[point_key(case.size_bytes, case.config)] = timing.pop("times_us")
        row = _row(run_info, variant_columns, case, iters, warmup, timing, check, stats, opts)
        if check is not None and opts.validate and not check["passed"]:
            failures += 1
        if root:
            printer.row(row)
            rows.append(row)
            if opts.csv:
                append_rows(opts.csv, [row], columns)
    if root:
        if opts.csv:  # the raw times first: a run in the sidecar is a finished run
            Samples(opts.csv).write(run_info["run_id"], samples)
            environment.write_sidecar(opts.csv, run_info, argv, comm.size)
        if opts.json:
            described = environment.describe(run_info, argv, comm.size)
            write_json_atomic(opts.json, {"environment": described, "results": rows})
        if failures:
            print(f"# Validation failed at {failures} of {len(rows)} sizes", flush=True)
    return 1 if failures else 0


def run_variant(
    variant: Variant, argv: list[str] | None = None, comm: BaseCommunicator | None = None
) -> int:
    """Entry point of every variant script; returns the process exit status (run_main)."""
    return run_main(lambda args, c: _run(variant, args, c), argv, comm)
