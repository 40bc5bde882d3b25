"""Hierarchical collectives, every design (per local rank, inside a node over MPI messages
or shared memory; node leaders) x collective x
inter-node algorithm x count, in one launch.

Run under mpiexec on 4 ranks (2 nodes x 2 ranks, faked on one host by the layout) or 6
(3 x 2 and 2 x 3); rank 0 prints one JSON line per case: {"case": id, "ok": bool,
"checks": {name: bool}, ...} (tests/helpers/drivers.py).
Uncompressed cases use small integers, whose sums are exact in any order, and must match
numpy exactly; compressed ones use values over many magnitudes and must lie within the
hierarchical error bound, computed here from the codec's own bound by hand. Each case
also reports the bytes this rank sent inside its node and across nodes.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

from ccbench.kernels.vocabulary import COLLECTIVES
from tests.helpers.drivers import case_line

# (variant, codec): the uncompressed baseline's library and ring, and compressed ones
INTER = (
    ("mpi", "none"),
    ("ring", "none"),
    ("coll", "fp16"),
    ("library", "bfp:rate=8"),
    ("p2p", "bf16"),
)
# element counts: per rank for allgather and reduce_scatter, total for allreduce; uneven,
# and (allreduce) fewer elements than ranks
COUNTS = {"allgather": (1, 7, 1000), "reduce_scatter": (1, 7, 300), "allreduce": (1, 3, 4099)}


# the case id's prefix: per local rank (its level inside a node over MPI's messages, or
# through shared memory), node leaders
DESIGNS = {"node": "", "shm": "shm", "leader": "leader"}


def cases(ranks_per_node: int):
    for design, prefix in DESIGNS.items():
        for collective in COLLECTIVES:
            for variant, codec in INTER:
                for count in COUNTS[collective]:
                    yield (
                        f"{prefix}{ranks_per_node}-{collective}-{variant}-{codec}-{count}",
                        (design, collective, variant, codec, count),
                    )
    # torch tensors on the host (the training loops' buffers) through shared memory
    for collective in COLLECTIVES:
        yield (
            f"shm-torch{ranks_per_node}-{collective}",
            ("shm-torch", collective, "ring", "none", 7),
        )


def bound(codec, collective: str, inputs: list, m: int) -> float:
    """The error a hierarchical call may carry, by hand for these variants (one round trip
    per node's contribution where N = 2, the ring's on N nodes otherwise)."""
    amax = [float(np.abs(x).max()) for x in inputs]
    nodes = [amax[i : i + m] for i in range(0, len(amax), m)]
    e = codec.error_bound
    if collective == "allgather":  # one round trip per hop across nodes, at most N-1
        return max(1, len(nodes) - 1) * e(2 * max(amax), "float32")
    sums = [sum(n) for n in nodes]
    total = sum(sums)
    eps = np.finfo(np.float32).eps
    # every node's partial sum encoded up to N-1 times at the total's magnitude, plus
    # float32 rounding of every addition and of the inputs: a loose bound that a wrong
    # result (a block in the wrong place, a missing contribution) exceeds by far
    err = len(nodes) * e(total, "float32") * max(1, len(nodes) - 1)
    err += 4 * len(amax) * eps * total
    if collective == "allreduce":
        err += e(total + err, "float32")
    return err


def run_case(comm, layout, design, collective, variant, codec_spec, count):
    from ccbench.collectives.baseline import bind_collective
    from ccbench.collectives.compressed import bind_compressed
    from ccbench.collectives.hierarchical import Hierarchical
    from ccbench.collectives.hierarchical_leader import LeaderHierarchical
    from ccbench.collectives.hierarchical_shared import SharedHierarchical
    from ccbench.kernels import inputs as kinds
    from ccbench.kernels.codecs import parse_codec

    size, rank = comm.size, comm.rank
    send_count = count * size if collective == "reduce_scatter" else count
    recv_count = {"allgather": count * size, "reduce_scatter": count, "allreduce": count}[
        collective
    ]
    codec = parse_codec(codec_spec)
    if codec.lossy:
        values = [kinds.values("gradient-like", send_count, r, size, 3) for r in range(size)]
    else:
        values = [
            np.random.default_rng([7, r, send_count]).integers(-8, 9, send_count)
            for r in range(size)
        ]
    values = [np.asarray(v, np.float32) for v in values]
    send = values[rank].copy()
    recv = np.empty(recv_count, np.float32)
    host = send, recv  # numpy views of the buffers, for the check
    if design == "shm-torch":
        import torch

        send, recv = torch.from_numpy(send), torch.from_numpy(recv)

    def bind_inter(inter, s, r):
        if codec_spec == "none":
            return bind_collective(inter, variant, collective, s, r)
        # the collective-level ring in chunks of 64 values: several per block, so that
        # shared memory's level inside the node streams them as they are decoded
        options = {"chunk_bytes": 64 * 4} if variant == "coll" else {}
        return bind_compressed(inter, variant, collective, codec, s, r, **options)

    bind = {
        "node": Hierarchical,
        "shm": SharedHierarchical,
        "shm-torch": SharedHierarchical,
        "leader": LeaderHierarchical,
    }[design]
    run = bind(comm, layout, collective, send, recv, bind_inter)
    run()
    run()  # twice: the second call's bytes alone are counted
    exact = [v.astype(np.float64) for v in values]
    if collective == "allgather":
        expected = np.concatenate(exact)
    elif collective == "allreduce":
        expected = np.sum(exact, axis=0)
    else:
        expected = np.sum(exact, axis=0)[rank * count : (rank + 1) * count]
    recv = host[1]
    err = float(np.abs(recv.astype(np.float64) - expected).max()) if expected.size else 0.0
    limit = bound(codec, collective, values, layout.ranks_per_node) if codec.lossy else 0.0
    # the shared designs must have run through shared memory (one host's ranks share it),
    # their allgather and reduce-scatter beside the collective-level ring across nodes
    through = run.intra_node == "shm" if design.startswith("shm") else True
    beside = design == "shm" and variant == "coll" and collective != "allreduce"
    through = through and run.levels == ("overlapped" if beside else "series")
    return err <= limit and through, {
        "err": err,
        "bound": float(limit),
        "intra": run.intra_wire_bytes,
        "inter": run.inter_wire_bytes,
        "total": comm.wire_bytes,
    }


def main() -> int:
    from ccbench.collectives.comm import Communicator
    from ccbench.collectives.hierarchical import node_layout

    comm = Communicator(MPI.COMM_WORLD)
    for m in [int(a) for a in sys.argv[1:]] or [2]:
        layout = node_layout(comm, m)
        for case_id, params in cases(m):
            comm.reset_wire_bytes()
            ok, detail = run_case(comm, layout, *params)
            gathered = comm.mpi.gather((ok, detail), root=0)
            if comm.rank == 0:
                checks = {f"rank {r} within the bound": ok for r, (ok, _) in enumerate(gathered)}
                line = case_line(case_id, checks, ranks=[detail for _, detail in gathered])
                print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
