"""The timed loops: OSU's per-call loop and OMB-Py's batch loop, in Python or compiled.

Timing follows OSU's C benchmarks: a barrier outside the timed region, the clock around
one blocking collective, then the statistics across ranks (benchmarks/statistics.py).
The clock is the transport's (`MPI.Wtime()` over MPI, the host's monotonic clock over
torch.distributed); on device buffers it is a pair of device events around the call, as
nccl-tests times, with the host waiting for the device only after the region
(kernels/stopwatch.py). The MPI library's own collectives on host buffers are timed by
the same loops compiled in C (benchmarks/timing_c.py) where the C loop is available;
`timer` says which loop ran, and a run decides it once, before its header
(`planned_timer`). Each region counts the host synchronisations declared inside it
(`host_syncs`, per call).

The barrier between timed calls (`planned_barrier`, the rows' `barrier` column) is the
transport's own ("blocking": MPI_Barrier, which polls) unless ranks outnumber a host's
cores, where it is MPI's nonblocking barrier tested with the core given away between
tests ("yielding", collectives/pipeline.idle_wait's waits): a rank done with its call
would otherwise poll in MPI_Barrier on a core that a rank still in the call needs, and
the call's time would measure the scheduler's time slices.
"""

from __future__ import annotations

import time

import numpy as np

from ccbench.benchmarks import timing_c
from ccbench.benchmarks.agreement import agreed
from ccbench.benchmarks.environment import allowed_cpus, crowded
from ccbench.benchmarks.statistics import relative_halfwidth, summarize, t_quantile
from ccbench.collectives.communicator import BaseCommunicator
from ccbench.collectives.pipeline import idle_wait
from ccbench.collectives.spec import spec
from ccbench.kernels import arrays, switches
from ccbench.kernels.errors import UsageError
from ccbench.kernels.stopwatch import Stopwatch

BATCH_BLOCKS = 10  # batch timing: blocks of back-to-back calls, for an interval
BARRIERS = ("auto", "blocking", "yielding")


def requested_barrier(given: switches.Switches | None = None) -> str:
    """CCBENCH_BARRIER: auto (default), blocking or yielding; from `given` switches, else
    those the options layer installed."""
    value = (given or switches.current()).barrier.strip().lower() or "auto"
    if value not in BARRIERS:
        raise UsageError(f"CCBENCH_BARRIER={value!r}: choose one of {', '.join(BARRIERS)}")
    return value


def crowded_hosts(comm: BaseCommunicator) -> dict[str, tuple[int, int]]:
    """{host: (ranks, cores)} for each host where `comm`'s ranks outnumber the cores they
    may run on (environment.crowded). Collective; the same on every rank."""
    return crowded(comm.allgather_obj((comm.processor_name(), allowed_cpus())))


def planned_barrier(comm: BaseCommunicator, asked: str | None = None) -> tuple[str, str]:
    """(barrier, why): the barrier between timed calls, "blocking" or "yielding" (module
    docstring), from CCBENCH_BARRIER (`asked`, default the installed switches). Collective
    under auto; the same on every rank."""
    asked = asked or requested_barrier()
    if not comm.any_completion:  # torch.distributed: its barrier is its own
        if asked == "yielding":
            raise UsageError(
                "CCBENCH_BARRIER=yielding tests MPI's nonblocking barrier; the "
                f"{comm.transport} transport's barrier is its own"
            )
        return "blocking", f"the {comm.transport} transport's barrier"
    if asked != "auto":
        return asked, f"CCBENCH_BARRIER={asked}"
    sharing = crowded_hosts(comm)
    if not sharing:
        return "blocking", "MPI_Barrier (no host has more ranks than cores)"
    host, (ranks, cores) = sorted(sharing.items())[0]
    return "yielding", (
        f"MPI_Ibarrier, the core given away between tests ({ranks} ranks on the {cores} "
        f"cores of {host}: a rank polling in MPI_Barrier takes a core from a rank still "
        "in its call)"
    )


def yielding_barrier(comm: BaseCommunicator):
    """The barrier that gives the core away while it waits: MPI's nonblocking barrier,
    tested between idle waits (collectives/pipeline.idle_wait: a short spin of yields,
    then sleeps)."""

    def barrier() -> None:
        request, since = comm.ibarrier(), time.perf_counter()
        while not comm.testall([request]):
            idle_wait(since)

    return barrier


def _warm_up(run, barrier, warmup: int, timing: str, watch: Stopwatch) -> None:
    for _ in range(warmup):
        run()
        if timing == "per-call":
            watch.settle()
            barrier()
    watch.settle()
    barrier()


def _timed_per_call(run, barrier, iterations: int, watch: Stopwatch) -> np.ndarray:
    """OSU's loop: the clock around each blocking call, the barrier outside it (on a
    device: the events around it, the wait for the device after it)."""
    watch.prepare(iterations)
    for i in range(iterations):
        watch.begin(i)
        run()
        watch.end(i)
        watch.settle()
        barrier()
    return watch.seconds(iterations)


def _timed_batch(run, barrier, iterations: int, watch: Stopwatch) -> np.ndarray:
    """OMB-Py's loop, cut into up to BATCH_BLOCKS blocks: the clock around back-to-back
    calls of each block. One value per block: its time per call."""
    blocks = np.array_split(np.arange(iterations), min(BATCH_BLOCKS, iterations))
    watch.prepare(len(blocks))
    for b, block in enumerate(blocks):
        watch.begin(b)
        for _ in range(block.size):
            run()
        watch.end(b)
        watch.settle()
        barrier()
    return watch.seconds(len(blocks)) / np.array([block.size for block in blocks])


def measure(
    comm: BaseCommunicator,
    run,
    iterations: int,
    warmup: int,
    timing: str,
    ci_target: float | None = None,
    budget_s: float | None = None,
    clock=None,
    timer: str | None = None,
    buffer: str | None = None,
    capture=None,
    replays: int = 1,
    barrier: str | None = None,
) -> dict:
    """Time `run` on every rank; the statistics across ranks (the same on every rank).

    Without `ci_target`, `iterations` calls are timed. With it, calls are timed in rounds
    of `iterations` until the 95% interval's half-width is at most `ci_target` of the
    mean, or `budget_s` seconds of timing have passed (all ranks stop together).

    `buffer`: the run's buffer backend; device buffers are timed with device events. The
    MPI library's own collectives on host buffers are timed by the same loops compiled
    in C (benchmarks/timing_c.py) when `timer` (default: CCBENCH_TIMER, else auto)
    allows and a compiler was found; the result's `timer` says which loop ran: c or
    python.

    `capture` (graph mode, --cuda-graph): called after the eager warm-up with `run`, it
    captures the call into a graph and returns its replay; each timed region is then
    `replays` replays back to back, and a call's time is the region's over `replays`.

    `barrier` between timed calls: "blocking" or "yielding" (default: `planned_barrier`'s
    choice); the result's `barrier` says which.
    """
    if barrier is None:
        asked = agreed(comm, requested_barrier)
        barrier, _ = planned_barrier(comm, asked)
    between = barrier
    barrier = yielding_barrier(comm) if between == "yielding" else comm.barrier
    watch = Stopwatch(buffer, clock or comm.clock)
    compiled = None
    # the C loop reads MPI_Wtime around MPI's own calls on host buffers only
    if clock is None and comm.mpi is not None and not watch.on_device:
        asked = timer or agreed(comm, timing_c.requested_timer)
        compiled, _ = agreed(comm, lambda: timing_c.compiled_loop(comm.mpi, run, asked))
    if compiled is not None:

        def timer_loop(run, barrier, calls, watch):
            return compiled.timed(calls, timing, between)
    else:
        timer_loop = _timed_batch if timing == "batch" else _timed_per_call
    barrier()
    if compiled is not None:
        compiled.warm_up(warmup, timing, between)
    else:
        _warm_up(run, barrier, warmup, timing, watch)
    if capture is not None:
        run = _replayed(capture(run), replays)
        barrier()
    if ci_target is not None:
        t_quantile(2)  # scipy's first import (seconds on a loaded host) is not the budget's
    rounds, stopped_by, start = [], "iterations", time.monotonic()
    stats: dict = {}
    while True:
        calls = iterations
        if rounds and timing == "per-call":
            # double the calls so far (the interval is recomputed O(log n) times), but
            # not past what the budget has left at the pace so far
            calls = max(iterations, sum(r.size for r in rounds))
            if budget_s is not None:
                left = budget_s - (time.monotonic() - start)
                calls = int(min(calls, max(iterations, left / (stats["avg_us"] * 1e-6 * replays))))
                # the clocks' start differs by rank: rank 0's count, or Allgather truncates
                calls = comm.bcast_obj(calls, root=0)
        rounds.append(timer_loop(run, barrier, calls, watch) / replays)
        mine = np.concatenate(rounds)
        everyone = comm.allgather_array(mine)
        stats = summarize(everyone)
        if ci_target is None:
            break
        if relative_halfwidth(stats) <= ci_target:
            stopped_by = "target"
        elif budget_s is not None and time.monotonic() - start >= budget_s:
            stopped_by = "budget"
        else:
            stopped_by = None
        # rank 0's clock decides, so no rank goes on alone
        stopped_by = comm.bcast_obj(stopped_by, root=0)
        if stopped_by is not None:
            break
    calls = sum(r.size for r in rounds) if timing == "per-call" else iterations * len(rounds)
    # the timed calls' declared host synchronisations, the most of any rank
    syncs = comm.allreduce_value(watch.syncs, op="max") if watch.on_device else 0
    calls *= replays  # graph mode: each timed call is `replays` replays
    stats.update(
        iterations=calls,
        stopped_by=stopped_by,
        timer="c" if compiled is not None else "python",
        barrier=between,
        host_syncs=syncs / calls if watch.on_device else None,
    )
    if timing == "batch":  # no single calls to rank: blocks are not calls
        stats.update(p50_us=None, p99_us=None)
    del stats["samples"]
    # every rank's every call (batch: every block's per-call time), kept beside the row
    stats["times_us"] = everyone * 1e6
    return stats


def _replayed(replay, replays: int):
    """`replays` replays of a captured call back to back: one timed region's work."""
    if replays == 1:
        return replay

    def run():
        for _ in range(replays):
            replay()

    return run


def planned_timer(variant, opts, comm: BaseCommunicator) -> tuple[str, str]:
    """(timer, why) of this run, decided before the header is printed: 'c' where the
    variant times the library's own collectives and the C loop is available, else
    'python'. Every case is timed by it, so the header and the rows agree."""
    asked = agreed(comm, timing_c.requested_timer)
    if arrays.is_gpu(opts.buffer):
        if asked == "c":
            raise UsageError("CCBENCH_TIMER=c: device buffers are timed with device events")
        return "python", "device events around each call (the host waits after it)"
    if asked == "python":
        return "python", "CCBENCH_TIMER=python"
    if comm.mpi is None:
        if asked == "c":
            raise UsageError(
                "CCBENCH_TIMER=c times MPI's own collectives only (this run's "
                f"transport is {comm.transport})"
            )
        return "python", "the Python loop (the torch transport)"
    if not variant.library_collectives(opts):
        if asked == "c":
            raise UsageError(
                "CCBENCH_TIMER=c, but only the MPI library's own collectives on "
                "numpy buffers can be timed by the C loop"
            )
        return "python", "the Python loop (not the library's own collectives)"
    refusal = timing_c.c_refusal(spec(opts.collective))
    if refusal is not None:  # a collective of the library the C loop has no call for
        if asked == "c":
            raise UsageError(f"CCBENCH_TIMER=c, but {refusal}")
        return "python", f"the Python loop ({refusal})"
    lib, why = timing_c.prepare(comm.mpi)
    if lib is None:
        if asked == "c":
            raise UsageError(f"CCBENCH_TIMER=c but the C timing loop is unavailable: {why}")
        return "python", f"the Python loop (no C loop: {why})"
    return "c", "OSU's C loop, compiled against this MPI"
