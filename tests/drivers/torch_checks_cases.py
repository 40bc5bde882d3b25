"""Cases for tests/test_torch_transport_checks.py: the torch transport (gloo) held to the
MPI transport and to its peers; and for tests/test_trace_checks.py: the traces' steps
that need ranks. One launch on 2 ranks.

    mpiexec -n 2 python -m mpi4py -m tests.drivers.torch_checks_cases

Rank 0 prints one JSON line per case:

* ``wire-*``: one variant, codec and collective run over MPI and over torch on the same
  points (-c): each row's wire bytes, compression ratio and validation, per transport;
* ``posted-*``: a run over torch with every send and posted receive recorded on every
  rank (peer, bytes), and each rank's count of wire bytes over the run; the test matches
  the k-th receive rank b posted from a with the k-th send a posted to b (posting order,
  as NCCL matches them);
* ``staged-*``: runs with every buffer staged through a mirror (CCBENCH_TORCH_STAGE's
  mode), and the copies one staged call makes;
* ``control``: the control plane's sum, min and max of a value that differs by rank;
* ``control-plane-mpi``, ``control-plane-torch``: every control-plane operation of the
  contract on objects and arrays that differ by rank, over each transport;
* ``one-rank-wrong``: a run whose last rank spoils its result (tests/drivers/
  faulty_variants.WrongResult), over torch;
* ``replay-validate``: the replay's validation of a step's calls, as is and with rank 1's
  allreduce result spoiled, as each rank sees it;
* ``capture-means``: a trace gathered from recorders whose figures are set per rank;
  ``replay-validate-torch`` and ``capture-means-torch``: the same over gloo.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path

import numpy as np
from mpi4py import MPI

from tests.drivers.transport_cases import rows_of, run_case

COMMON = ["-i", "2", "-x", "1", "-c"]
ROW_KEYS = ("size_bytes", "validation", "wire_bytes_per_rank", "compression_ratio", "transport")
# (case, entry point, options): sizes with uneven blocks (16388 B: 4097 floats) and a
# lossless codec whose payloads differ in size from their slots
WIRE = [
    (
        "wire-baseline-ring-allreduce",
        "baseline",
        ["--algorithm", "ring", "--collective", "allreduce", "-m", "1K,16388"],
    ),
    (
        "wire-p2p-fp16-allreduce",
        "p2p_compressed",
        ["--codec", "fp16", "--collective", "allreduce", "-m", "16388:16388"],
    ),
    (
        "wire-p2p-zstd-allgather",
        "p2p_compressed",
        ["--codec", "zstd", "--collective", "allgather", "-m", "16K:16K"],
    ),
    (
        "wire-coll-bfp-allgather",
        "coll_compressed",
        [
            "--algorithm",
            "ring",
            "--codec",
            "bfp:rate=8",
            "--chunk-bytes",
            "4K",
            "--collective",
            "allgather",
            "-m",
            "1K,16K",
        ],
    ),
    (
        "wire-coll-zstd-allreduce",
        "coll_compressed",
        [
            "--algorithm",
            "ring",
            "--codec",
            "zstd",
            "--chunk-bytes",
            "4K",
            "--collective",
            "allreduce",
            "-m",
            "16388:16388",
        ],
    ),
    (
        "wire-library-zstd-allreduce",
        "coll_compressed",
        [
            "--algorithm",
            "library",
            "--codec",
            "zstd",
            "--collective",
            "allreduce",
            "-m",
            "16388:16388",
        ],
    ),
]
POSTED = [
    (
        "posted-coll-fp16-allreduce",
        "coll_compressed",
        [
            "--algorithm",
            "ring",
            "--codec",
            "fp16",
            "--chunk-bytes",
            "4K",
            "--collective",
            "allreduce",
            "-m",
            "16388:16388",
        ],
    ),
    (
        "posted-coll-bfp-reduce_scatter",
        "coll_compressed",
        [
            "--algorithm",
            "ring",
            "--codec",
            "bfp:rate=8",
            "--chunk-bytes",
            "4K",
            "--collective",
            "reduce_scatter",
            "-m",
            "16K:16K",
        ],
    ),
    (
        "posted-p2p-bf16-allreduce",
        "p2p_compressed",
        ["--codec", "bf16", "--collective", "allreduce", "-m", "16388:16388"],
    ),
    (
        "posted-baseline-ring-allgather",
        "baseline",
        ["--algorithm", "ring", "--collective", "allgather", "-m", "1K:1K"],
    ),
]
STAGED = [
    (
        f"staged-library-{c}",
        "baseline",
        [
            "--algorithm",
            "library",
            "--collective",
            c,
            "-m",
            "1K,16388" if c == "allreduce" else "16K:16K",
        ],
    )
    for c in ("allgather", "reduce_scatter", "allreduce")
] + [
    (
        "staged-ring-allreduce",
        "baseline",
        ["--algorithm", "ring", "--collective", "allreduce", "-m", "16388:16388"],
    ),
    (
        "staged-coll-fp16-allreduce",
        "coll_compressed",
        [
            "--algorithm",
            "ring",
            "--codec",
            "fp16",
            "--chunk-bytes",
            "4K",
            "--collective",
            "allreduce",
            "-m",
            "16388:16388",
        ],
    ),
]


class Log:
    """Every send and posted receive of the torch transport while `entries` is a list."""

    entries: list | None = None

    @classmethod
    def install(cls) -> None:
        from ccbench.collectives import comm_torch
        from ccbench.kernels.vocabulary import nbytes

        torch_comm = comm_torch.TorchCommunicator
        isend, irecv, exchange = torch_comm.isend, torch_comm.irecv, torch_comm.exchange
        reset = torch_comm.reset_wire_bytes

        def note(kind, peer, buf):
            if cls.entries is not None and buf.shape[0]:
                cls.entries.append((kind, int(peer), int(nbytes(buf))))

        def logged_isend(self, x, dest, tag=0):
            note("send", dest, x)
            return isend(self, x, dest, tag)

        def logged_irecv(self, out, source, tag=0):
            note("recv", source, out)
            return irecv(self, out, source, tag)

        def logged_exchange(self, sendbuf, dest, recvbuf, source, tag=0):
            note("recv", source, recvbuf)
            note("send", dest, sendbuf)
            return exchange(self, sendbuf, dest, recvbuf, source, tag)

        def logged_reset(self):
            if cls.entries is not None:
                cls.entries.append(("reset", -1, 0))
            reset(self)

        torch_comm.isend, torch_comm.irecv = logged_isend, logged_irecv
        torch_comm.exchange, torch_comm.reset_wire_bytes = logged_exchange, logged_reset


def gloo():
    from ccbench.collectives.comm_torch import _COMMS

    return _COMMS["gloo"]


def staged_copies(comm) -> dict:
    """The copies one staged library call and one staged exchange make, and their
    results (every buffer staged)."""
    import torch

    counted = [0]
    copy = type(comm)._copy

    def counting(self, dst, src):
        counted[0] += 1
        copy(self, dst, src)

    type(comm)._copy = counting
    try:
        rank, size = comm.rank, comm.size
        send = torch.full((6,), float(rank + 1))
        recv = torch.zeros(6)
        comm.library_call("allreduce", send, recv)()
        library = (counted[0], recv.tolist())
        counted[0] = 0
        got = torch.zeros(3)
        comm.sendrecv(torch.full((3,), float(rank)), (rank + 1) % size, got, (rank - 1) % size)
        exchange = (counted[0], got.tolist())
    finally:
        type(comm)._copy = copy
    return {"library": library, "exchange": exchange}


def main() -> None:
    from ccbench.benchmarks.harness import run_variant
    from ccbench.collectives.comm_torch import STAGE_ENV
    from tests.drivers.faulty_variants import WrongResult

    world = MPI.COMM_WORLD
    folder = Path(
        world.bcast(
            tempfile.mkdtemp(prefix="ccbench-torch-checks-") if world.rank == 0 else None, root=0
        )
    )
    Log.install()
    over = ["--transport", "torch"]

    def emit(case, **fields):
        if world.rank == 0:
            print(json.dumps({"case": case, **fields}), flush=True)

    def rows(path):
        return [{k: r.get(k, "") for k in ROW_KEYS} for r in rows_of(path)]

    for cid, entry, argv in WIRE:
        status = {}
        got = {}
        for transport in ("mpi", "torch"):
            out = folder / f"{cid}-{transport}.csv"
            status[transport] = max(
                world.allgather(run_case(entry, [*argv, *COMMON, "--transport", transport], out))
            )
            got[transport] = rows(out)
        emit(cid, status=status, rows=got)

    for cid, entry, argv in POSTED:
        out = folder / f"{cid}.csv"
        Log.entries = []
        status = run_case(entry, [*argv, *over, "-i", "1", "-x", "0", "-c"], out)
        log, Log.entries = Log.entries, None
        # each rank's count since the harness's last reset (the row's call and -c's)
        emit(
            cid,
            status=max(world.allgather(status)),
            logs=world.allgather(log),
            wire=world.allgather(gloo().wire_bytes),
            rows=rows(out),
        )

    comm = gloo()
    comm.stage_all = True
    try:
        for cid, entry, argv in STAGED:
            out = folder / f"{cid}.csv"
            status = run_case(entry, [*argv, *over, *COMMON], out)
            emit(cid, status=max(world.allgather(status)), rows=rows(out))
        emit("staged-copies", **staged_copies(comm))
    finally:
        comm.stage_all = False
    assert STAGE_ENV  # the mode the environment variable sets (documented in docs/gpu.md)

    emit(
        "control",
        sum=comm.allreduce_value(comm.rank + 1, "sum"),
        min=comm.allreduce_value(comm.rank + 1, "min"),
        max=comm.allreduce_value(comm.rank + 1, "max"),
        min_array=comm.allreduce_array(np.array([comm.rank + 1.5, -comm.rank]), "min").tolist(),
    )

    out = folder / "one-rank-wrong.csv"
    with contextlib.redirect_stdout(io.StringIO()):
        status = run_variant(
            WrongResult(),
            ["--collective", "allreduce", "-m", "1K:1K", *over, *COMMON, "--csv", str(out)],
        )
    emit("one-rank-wrong", status=max(world.allgather(status)), rows=rows(out))

    from ccbench.collectives.comm import Communicator

    launch = Communicator(world)
    emit("replay-validate", **replay_validation(launch))
    emit("capture-means", **capture_means(launch))
    emit("replay-validate-torch", **replay_validation(comm))
    emit("capture-means-torch", **capture_means(comm))
    emit("control-plane-mpi", **control_plane(launch))
    emit("control-plane-torch", **control_plane(comm))


def control_plane(comm) -> dict:
    """Rank r contributes objects and arrays made from r; every rank's answers."""
    r = comm.rank
    local = np.array([[r + 0.5, -r], [2.0 * r, 7.0]])
    answers = {
        "gather": comm.gather_obj({"rank": r, "word": "x" * (r + 1)}, root=1),
        "gather_root0": comm.gather_obj(("r", r), root=0),
        "bcast": comm.bcast_obj(["from", r] if r == 1 else None, root=1),
        "allgather": comm.allgather_obj(r * 10),
        "sum": comm.allreduce_array(local, "sum").tolist(),
        "min": comm.allreduce_array(local, "min").tolist(),
        "max": comm.allreduce_array(local, "max").tolist(),
        "int_max": comm.allreduce_array(np.array([3 - r, r], np.int64), "max").tolist(),
        "value_min": comm.allreduce_value(r + 1, "min"),
        "threaded": comm.threaded,
    }
    answers["shape"] = list(comm.allreduce_array(local, "sum").shape)
    answers["dtype"] = str(comm.allreduce_array(np.array([3 - r, r], np.int64), "max").dtype)
    return {"ranks": comm.allgather_obj(answers)}


class SpoiledAllreduce:
    """A transport whose allreduce result is off by one in its first element."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def allreduce(self, buf):
        self.inner.allreduce(buf)
        buf[0] += 1


def replay_validation(comm) -> dict:
    from ccbench.benchmarks.trace_replay import validate
    from ccbench.collectives.trace import Event, Step
    from ccbench.training.replay import ReplaySpec, Router

    steps = [
        Step(
            [
                Event("call", 1.0, None, 0, "allreduce", 4096),
                Event("call", 1.0, None, 1, "allgather", 2048),
                Event("drain", 1.0),
            ]
        )
    ]
    router = Router(comm, ReplaySpec("baseline", "ring"))
    honest = validate(comm, router, steps, seed=0)
    if comm.rank == 1:
        plain = router.gradient_comm
        router.gradient_comm = lambda e: (
            SpoiledAllreduce(plain(e)) if e.collective == "allreduce" else plain(e)
        )
    spoiled = validate(comm, router, steps, seed=0)
    return {"honest": comm.allgather_obj(honest), "spoiled": comm.allgather_obj(spoiled)}


def capture_means(comm) -> dict:
    """Rank r's figures are (r + 1) times a base: over 2 ranks every mean is 1.5 times
    it. One step of an async allreduce, its wait, and the tail."""
    from ccbench.collectives.trace import Event, Step
    from ccbench.training.trace_capture import Recorder, gather

    f = comm.rank + 1
    recorder = Recorder()
    for number in (1, 2):  # the first is skipped, as a warm-up step
        call = Event("call", 10.0 * f, 5.0 * f, 0, "allreduce", 1024, run_us=30.0 * f)
        wait = Event("wait", 20.0 * f, 8.0 * f, 0, waited_us=4.0 * f)
        recorder.steps.append(
            Step(
                [call, wait],
                tail_us=100.0 * f,
                tail_cpu_us=90.0 * f,
                number=number,
                measured={
                    "step_us": 1000.0 * f,
                    "comm_us": 40.0 * f,
                    "compute_us": 900.0 * f,
                    "comm_busy_us": 60.0 * f,
                },
            )
        )
    trace = gather(comm, recorder, {"kind": "captured"}, skip=1, overlap=True)
    if trace is None:
        return {}
    (step,) = trace.steps
    return {
        "events": [[e.gap_us, e.gap_cpu_us, e.run_us, e.waited_us] for e in step.events],
        "tail": [step.tail_us, step.tail_cpu_us],
        "measured": step.measured,
        "number": step.number,
        "ranks": trace.ranks,
    }


if __name__ == "__main__":
    main()
