"""Cases for tests/test_retarget.py: a bound compressed collective retargeted to a fresh
receive buffer (as the gradient communicator does for each of FSDP's calls) writes its
whole result there, not into the buffer it was bound to.

Run on 2 ranks (``python -m tests.drivers.retarget_cases``); rank 0 prints one JSON line
per case: {"case": id, "ok": bool, "err": float}. Inputs are small integers, exact in
fp16 and in any summation order, so the expected result, computed here with numpy, is
exact. The fresh buffer is filled with a value no result holds beforehand.
"""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

GARBAGE = -1000.0
COUNT = 3000  # per-rank block: several 4 KiB chunks of the collective-level pipeline
KINDS = (("p2p", {}), ("coll", {"chunk_bytes": 4096}), ("library", {}))
COLLECTIVES = ("allgather", "reduce_scatter", "allreduce")


def rank_input(rank: int, count: int) -> np.ndarray:
    return (np.arange(count) % 5 + rank + 1).astype(np.float32)


def expected(collective: str, size: int, rank: int) -> np.ndarray:
    """The result on `rank`, from every rank's input."""
    if collective == "allgather":
        return np.concatenate([rank_input(r, COUNT) for r in range(size)])
    if collective == "reduce_scatter":
        total = sum(rank_input(r, COUNT * size) for r in range(size))
        return total[rank * COUNT : (rank + 1) * COUNT]
    return sum(rank_input(r, COUNT) for r in range(size))


def buffers(collective: str, size: int, rank: int, make):
    """(send, bound-to recv, fresh recv) for one call, made by `make(numpy array)`."""
    n_send = COUNT * size if collective == "reduce_scatter" else COUNT
    n_recv = COUNT * size if collective == "allgather" else COUNT
    send = make(rank_input(rank, n_send))
    first = make(np.zeros(n_recv, np.float32))
    fresh = make(np.full(n_recv, GARBAGE, np.float32))
    return send, first, fresh


def retargeted(comm, kind, options, collective, make, to_numpy) -> float:
    """Largest error of the second call, into the fresh buffer."""
    from ccbench.collectives.compressed import bind_compressed
    from ccbench.kernels.codecs import parse_codec

    send, first, fresh = buffers(collective, comm.size, comm.rank, make)
    bound = bind_compressed(comm, kind, collective, parse_codec("fp16"), send, first, **options)
    bound()
    bound.recvbuf = fresh
    bound()
    return float(np.abs(to_numpy(fresh) - expected(collective, comm.size, comm.rank)).max())


def fsdp_calls(comm) -> float:
    """The gradient communicator as FSDP calls it: a fresh output for every call."""
    import torch

    from ccbench.benchmarks.options import compression_of
    from ccbench.training.gradient_comm import GradientCommSpec, GradientCommunicator

    worst = 0.0
    for variant in ("p2p_compressed", "coll_compressed"):
        setting = compression_of("fp16", variant=variant, chunk_bytes=4096)
        gradient_comm = GradientCommunicator(comm, GradientCommSpec(variant, "ring", setting))
        for collective in ("allgather", "reduce_scatter"):
            send, _, _ = buffers(collective, comm.size, comm.rank, torch.from_numpy)
            for _ in range(2):
                _, _, fresh = buffers(collective, comm.size, comm.rank, torch.from_numpy)
                getattr(gradient_comm, collective)(send, fresh)
                want = expected(collective, comm.size, comm.rank)
                worst = max(worst, float(np.abs(fresh.numpy() - want).max()))
    return worst


def driver() -> int:
    from ccbench.collectives.comm import Communicator

    comm = Communicator(MPI.COMM_WORLD)

    def emit(case, err):
        if comm.rank == 0:
            print(json.dumps({"case": case, "ok": err == 0.0, "err": err}), flush=True)

    for kind, options in KINDS:
        for collective in COLLECTIVES:
            err = retargeted(comm, kind, options, collective, np.array, np.asarray)
            emit(f"mpi-{kind}-{collective}", err)
    emit("fsdp-gradient-comm", fsdp_calls(comm))
    # torch.distributed (gloo): the collective-level ring in posting order
    import torch

    from ccbench.collectives.comm_torch import torch_communicator

    gloo = torch_communicator("gloo", comm.rank, comm.size, 0, MPI.COMM_WORLD)
    for collective in COLLECTIVES:
        err = retargeted(
            gloo, "coll", {"chunk_bytes": 4096}, collective, torch.from_numpy, lambda t: t.numpy()
        )
        emit(f"gloo-coll-{collective}", err)
    return 0


CASES = [f"mpi-{kind}-{c}" for kind, _ in KINDS for c in COLLECTIVES]
CASES += ["fsdp-gradient-comm"] + [f"gloo-coll-{c}" for c in COLLECTIVES]

if __name__ == "__main__":
    raise SystemExit(driver())
