"""Replay a trace's steps on this launch's ranks through any variant and codec.

Each rank runs the trace's events in order on its training thread: the compute gap
before an event is emulated (``ComputeWait``), a call goes to the communication stream
(training/comm_stream.py, the thread FSDP and DDP use here) through a ccbench variant
(training/gradient_comm.py, the one FSDP and DDP use), a wait or a drain waits on the
stream. So what the replay overlaps is what the real step would overlap, and its
collectives are the real step's, on buffers of the traced sizes.

Compute emulation (``--compute``):

- ``busy``: spin for the gap's wall time, keeping the core busy as CPU training's
  compute did. The spin runs small torch operations, which release the GIL as
  training's operations do, so the communication thread runs beside it as in training.
  The captured wall time holds what slowed the real compute (the communication thread
  on the same core, other processes): the replay reproduces the traced step.
- ``busy-cpu``: spin until the thread's CPU clock has advanced by the gap's traced CPU
  time: compute that today's load and the replayed communication slow down (the
  development host's measurements in docs/traces.md: it ran short of the real steps).
- ``sleep``: sleep for the gap's wall time, freeing the core: compute on an
  accelerator, which leaves the host core to communication.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from ccbench.collectives.compression import Compression
from ccbench.collectives.spec import spec
from ccbench.collectives.trace import Event, Step, Trace
from ccbench.kernels.errors import UsageError

COMPUTE_MODES = ("busy", "busy-cpu", "sleep")
TORCH_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int8": torch.int8,
}
FILL_TILE = 1 << 20  # buffers are filled by tiling this many values of the data kind


class ComputeWait:
    """Emulated compute of a given length; calibrated once (``spin_op_us``,
    ``sleep_overshoot_us``)."""

    def __init__(self, mode: str, scale: float = 1.0):
        if mode not in COMPUTE_MODES:
            raise UsageError(f"--compute must be one of {', '.join(COMPUTE_MODES)}")
        self.mode, self.scale = mode, scale
        self._a = torch.ones(2048)
        self._b = torch.empty(2048)
        self.spin_op_us = self._calibrate_spin()
        self.sleep_overshoot_us = self._calibrate_sleep() if mode == "sleep" else 0.0

    def _op(self) -> None:
        torch.mul(self._a, 1.0, out=self._b)  # releases the GIL, as training's ops do

    def _calibrate_spin(self) -> float:
        for _ in range(200):
            self._op()
        t0, n = time.perf_counter(), 2000
        for _ in range(n):
            self._op()
        return (time.perf_counter() - t0) / n * 1e6

    def _calibrate_sleep(self) -> float:
        overshoot = []
        for _ in range(20):
            t0 = time.perf_counter()
            time.sleep(200e-6)
            overshoot.append((time.perf_counter() - t0) * 1e6 - 200)
        return float(np.median(overshoot))

    def __call__(self, wall_us: float, cpu_us: float | None) -> None:
        wall_us *= self.scale
        if self.mode == "sleep":
            if wall_us > self.sleep_overshoot_us:
                time.sleep((wall_us - self.sleep_overshoot_us) / 1e6)
            return
        use_cpu = self.mode == "busy-cpu" and cpu_us is not None
        clock = time.thread_time if use_cpu else time.perf_counter
        target = (cpu_us * self.scale if use_cpu else wall_us) / 1e6
        slack = self.spin_op_us / 2e6
        end = clock() + target - slack
        while clock() < end:
            self._op()


@dataclass
class ReplaySpec:
    variant: str = "baseline"
    algorithm: str = "ring"
    compression: Compression = Compression()  # the parsed --codec and --chunk-bytes
    compress: str = "both"
    hierarchy: str = "flat"  # GradientCommSpec's
    ranks_per_node: int | None = None
    intra_node: str = "auto"


class Router:
    """The gradient communicator each call runs through. Sparse streaming sends the calls
    the trace marks sparse through OmniReduce; the others through the uncompressed ring."""

    def __init__(self, comm, spec: ReplaySpec):
        from ccbench.training.gradient_comm import GradientCommSpec, GradientCommunicator

        self.comm = comm
        self.main = GradientCommunicator(
            comm,
            GradientCommSpec(
                spec.variant,
                spec.algorithm,
                spec.compression,
                spec.compress,
                hierarchy=spec.hierarchy,
                ranks_per_node=spec.ranks_per_node,
                intra_node=spec.intra_node,
            ),
        )
        self.dense = (
            GradientCommunicator(comm, GradientCommSpec("baseline", "ring"))
            if spec.variant == "sparse_streaming"
            else self.main
        )
        if spec.variant == "torch":
            from ccbench.training.rendezvous import init_torch_distributed

            init_torch_distributed(comm)

    def gradient_comm(self, event: Event):
        if self.main is self.dense or (event.sparse and spec(event.collective).streams_sparse):
            return self.main
        return self.dense

    def codec_s(self) -> float:
        """Seconds the codecs have worked inside the collectives so far (encode, decode,
        and the collective-level reduce-scatter's fused decode-add-encode hop)."""
        total = 0.0
        for gcomm in {id(self.main): self.main, id(self.dense): self.dense}.values():
            for bound in list(gcomm._bound.values()):
                rows = getattr(bound, "breakdown", None)
                if rows is None or not rows.rows:
                    continue
                parts = np.sum(rows.rows, axis=0)
                total += parts[1] + parts[2] + (parts[3] if gcomm.kind == "coll" else 0)
        return float(total)


def padded(count: int, ranks: int) -> int:
    """FSDP pads every parameter group to a multiple of the ranks."""
    return -(-count // ranks) * ranks


def call_counts(e: Event, ranks: int) -> tuple[int, int, int]:
    """(whole, send, receive) counts of a traced call on `ranks` ranks: its whole buffer
    padded to a multiple of the ranks where the collective needs equal blocks (FSDP's
    all-gather and reduce-scatter), as traced otherwise (an allreduce)."""
    described = spec(e.collective)
    n = e.count
    if not described.fits(*described.counts_of_whole(n, ranks), ranks):
        n = padded(n, ranks)
    return (n, *described.counts_of_whole(n, ranks))


class Buffers:
    """One buffer per collective and dtype, as long as its longest call; each call works
    on a view of it (FSDP's all-gather in place, its input this rank's block). Calls the
    trace marks sparse get their own buffer, filled at their density."""

    def __init__(self, steps: list[Step], comm, data: str, seed: int):
        from ccbench.kernels.inputs import values

        self.rank, self.ranks = comm.rank, comm.size
        longest: dict = {}
        for e in (e for s in steps for e in s.calls):
            key = (e.collective, e.dtype)
            longest[key] = max(longest.get(key, 0), padded(e.count, self.ranks))
        tile = torch.from_numpy(
            values(data, FILL_TILE, self.rank, self.ranks, seed).astype(np.float32)
        )
        self.pools = {}
        for (collective, dtype), n in longest.items():
            pool = torch.empty(n, dtype=TORCH_DTYPES[dtype])
            _tile_into(pool, tile)
            self.pools[(collective, dtype)] = pool
            _, out = spec(collective).counts_of_whole(n, self.ranks)
            if out != n:  # the output is a share of the whole: a buffer of its own
                self.pools[("out", collective, dtype)] = torch.empty(out, dtype=TORCH_DTYPES[dtype])
        self.sparse: dict = {}  # (count, dtype, density) -> (buffer, its sparse input)
        for e in (
            e for s in steps for e in s.calls if e.sparse and spec(e.collective).streams_sparse
        ):
            key = (e.count, e.dtype, e.density)
            if key not in self.sparse:
                kind = f"sparse:{e.density if e.density is not None else 1.0}"
                fresh = torch.from_numpy(values(kind, e.count, self.rank, self.ranks, seed)).to(
                    TORCH_DTYPES[e.dtype]
                )
                self.sparse[key] = (fresh.clone(), fresh)

    def views(self, e: Event):
        """(send, recv) of one call: one buffer where the result lands on the input; the
        input this rank's block of the output where the output is the whole buffer (FSDP's
        all-gather in place); else the input whole and the output a buffer of its own."""
        n, send, recv = call_counts(e, self.ranks)
        if e.sparse and spec(e.collective).streams_sparse:
            return self.sparse[(e.count, e.dtype, e.density)]
        whole = self.pools[(e.collective, e.dtype)][:n]
        if send == recv == n:
            return whole, whole
        if recv == n:
            return whole[self.rank * send : (self.rank + 1) * send], whole
        return whole, self.pools[("out", e.collective, e.dtype)][:recv]


def _tile_into(out: torch.Tensor, tile: torch.Tensor) -> None:
    for start in range(0, out.numel(), tile.numel()):
        part = out[start : start + tile.numel()]
        part.copy_(tile[: part.numel()])


def collective_call(e: Event, router: Router, buffers: Buffers):
    """The call a stream runs for event ``e``: the collective, then the division by the
    ranks FSDP (AVG) and DDP do, which also keeps the values from growing step by step."""
    gcomm = router.gradient_comm(e)
    send, recv = buffers.views(e)
    size = router.comm.size
    described = spec(e.collective)
    run = collective_method(gcomm, e.collective)
    if e.sparse and described.streams_sparse:  # the sum lands on the input: the next call
        # gets the sparse gradient again, as a step of training would (a copy, inside the
        # call's time)
        return lambda: (run(send), send.copy_(recv))
    call = (lambda: run(recv)) if described.in_place else (lambda: run(send, recv))
    if not described.reduces:
        return call
    return lambda: (call(), recv.div_(size))


def collective_method(gcomm, collective: str):
    """A gradient communicator's call of a collective: its methods are named by the collectives and
    take (send, recv), or the one buffer of an in-place collective (spec.in_place)."""
    return getattr(gcomm, collective)


@dataclass
class StepTimes:
    step_us: float
    comm_us: float  # exposed: the training thread waited
    emulated_us: float  # wall time in the compute emulation
    busy: dict
    codec_us: float
    wire_bytes: int


def run_step(
    step: Step, stream, router: Router, buffers: Buffers, compute: ComputeWait
) -> StepTimes:
    """One step on this rank (collective over the ranks, through the stream)."""
    comm = router.comm
    stream.reset_counters()
    comm.reset_wire_bytes()
    codec0 = router.codec_s()
    tickets, emulated = {}, 0.0
    t0 = time.perf_counter()
    for e in step.events:
        c0 = time.perf_counter()
        compute(e.gap_us, e.gap_cpu_us)
        emulated += time.perf_counter() - c0
        if e.op == "call":
            tickets[e.id] = ticket = stream.submit(
                collective_call(e, router, buffers), e.collective
            )
            if e.blocking:
                stream.wait(ticket)
        elif e.op == "wait":
            stream.wait(tickets[e.id])
        else:
            stream.drain()
    c0 = time.perf_counter()
    compute(step.tail_us, step.tail_cpu_us)
    emulated += time.perf_counter() - c0
    stream.drain()
    total = time.perf_counter() - t0
    return StepTimes(
        step_us=total * 1e6,
        comm_us=stream.waited_s * 1e6,
        emulated_us=emulated * 1e6,
        busy={k: v * 1e6 for k, v in stream.busy.items()},
        codec_us=(router.codec_s() - codec0) * 1e6,
        wire_bytes=comm.wire_bytes,
    )


def check_replayable(trace: Trace) -> None:
    """Refuse calls on a process group of some ranks only (HSDP's, pipeline stages'):
    the replay runs collectives over every rank."""
    for e in (e for s in trace.steps for e in s.calls):
        members = trace.groups.get(e.group)
        if members is not None:
            raise UsageError(
                f"call {e.id} runs on process group {e.group} (ranks "
                f"{members}); the replay runs collectives over every rank only"
            )


# ----------------------------------------------------------------------------- merging


def merge_allreduces(step: Step, plan_groups) -> Step:
    """The step with each run of consecutive async allreduces (gradients handed over as
    backward produces them) regrouped: ``plan_groups(nbytes, gaps_us)`` returns the
    groups [(a, b), ...] of the run, in order. A group's allreduce is issued when its
    last member would have been, after the members' gaps; waits on a member wait on
    its group."""
    events, out, i = step.events, [], 0
    position: dict[int, int] = {}  # a call's id in the step -> its place in `out`
    while i < len(events):
        j = i
        while (
            j < len(events)
            and _mergeable(events[j])
            and events[j].dtype == events[i].dtype
            and events[j].collective == events[i].collective
        ):
            j += 1
        if j - i < 2:
            if events[i].op == "call":
                position[events[i].id] = len(out)
            out.append(replace(events[i]))
            i += 1
            continue
        run = events[i:j]
        groups = plan_groups(np.array([e.nbytes for e in run]), np.array([e.gap_us for e in run]))
        for a, b in groups:
            members = run[a:b]
            for e in members:
                position[e.id] = len(out)
            out.append(
                replace(
                    members[-1],
                    gap_us=sum(e.gap_us for e in members),
                    gap_cpu_us=None
                    if any(e.gap_cpu_us is None for e in members)
                    else sum(e.gap_cpu_us for e in members),
                    count=sum(e.count for e in members),
                    label=f"{members[0].label} .. {members[-1].label}"
                    if b - a > 1
                    else members[0].label,
                    sparse=all(e.sparse for e in members),
                    density=None,
                    run_us=None,
                    start_us=None,
                    waited_us=None,
                )
            )
        i = j
    # consecutive ids; a wait on a call already waited for keeps only its compute
    new_id = {n: k for k, n in enumerate(n for n, e in enumerate(out) if e.op == "call")}
    events, waited, carry, carry_cpu = [], set(), 0.0, 0.0
    for n, e in enumerate(out):
        e.gap_us += carry
        if e.gap_cpu_us is not None:
            e.gap_cpu_us += carry_cpu
        carry = carry_cpu = 0.0
        if e.op == "call":
            e.id = new_id[n]
        elif e.op == "wait":
            e.id = new_id[position[e.id]]
            if e.id in waited:  # already waited for: only its compute remains
                carry, carry_cpu = e.gap_us, e.gap_cpu_us or 0.0
                continue
            waited.add(e.id)
        events.append(e)
    tail_cpu = None if step.tail_cpu_us is None else step.tail_cpu_us + carry_cpu
    return Step(
        events=events,
        tail_us=step.tail_us + carry,
        tail_cpu_us=tail_cpu,
        number=step.number,
        measured=step.measured,
    )


def _mergeable(e: Event) -> bool:
    return e.op == "call" and spec(e.collective).elementwise and not e.blocking
