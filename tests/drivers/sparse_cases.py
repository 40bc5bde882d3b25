"""Every sparse-allreduce algorithm x density x overlap x block size, in one launch.

    mpiexec -n N python -m tests.drivers.sparse_cases [--aggregators K]

Rank 0 prints one JSON line per case: {"case": id, "ok": bool, "wire": bytes per rank
(mean over ranks, measured by the Communicator), "payload": the bytes of the blocks
that must move, "minimum": payload plus a 4-byte index per block, "detail": ...}.
The expected sums and the block counts are computed here with plain numpy from every
rank's (seeded, exactly summable) input, independently of kernels/sparse.py.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from mpi4py import MPI

DENSITIES = (0.0, 0.05, 0.3, 1.0)
OVERLAPS = ("random", "all", "none")
# (count, block size): dividing, not dividing, and a tensor smaller than one block
SHAPES = ((4096, 64), (5000, 100), (70, 128))
# (fusion, window): no fusion stop-and-wait, and fused with a window
PROTOCOLS = ((1, 1), (8, 3))
BASELINES = ("allgather-sparse", "dense", "dense-ring")


def cases(aggregators: int):
    """(case id, parameters); dedicated aggregators run omnireduce only."""
    for count, block in SHAPES:
        for density in DENSITIES:
            for overlap in OVERLAPS:
                fusion, window = PROTOCOLS[1]
                yield (f"omnireduce-{count}-{block}-{density}-{overlap}-f{fusion}w{window}",
                       ("omnireduce", count, block, density, overlap, fusion, window, 0.0))
    yield ("omnireduce-5000-100-0.3-random-f1w1",
           ("omnireduce", 5000, 100, 0.3, "random", 1, 1, 0.0))
    yield ("omnireduce-4096-64-0.3-random-f8w3-threshold1",
           ("omnireduce", 4096, 64, 0.3, "random", 8, 3, 1.0))
    if aggregators:
        return
    for algorithm in BASELINES:
        for count, block in SHAPES[:2]:
            for density in (0.0, 0.3, 1.0):
                yield (f"{algorithm}-{count}-{block}-{density}-random",
                       (algorithm, count, block, density, "random", 8, 3, 0.0))
    yield ("allgather-sparse-4096-64-0.3-random-threshold1",
           ("allgather-sparse", 4096, 64, 0.3, "random", 8, 3, 1.0))


def block_masks(x: np.ndarray, block: int, threshold: float) -> np.ndarray:
    padded = np.zeros(-(-x.size // block) * block)
    padded[: x.size] = np.abs(x)
    return (padded.reshape(-1, block) > threshold).any(axis=1)


def run_case(comm, aggregators, algorithm, count, block, density, overlap, fusion, window,
             threshold) -> dict:
    from ccbench.collectives.baseline import bind_collective
    from ccbench.collectives.omnireduce import OmniReduce, make_layout
    from ccbench.collectives.sparse_baselines import AllgatherSparse
    from ccbench.kernels.sparse_data import sparse_input

    size, rank = comm.size, comm.rank
    workers = size - aggregators
    inputs = [sparse_input(count, block, density, overlap, r, workers, seed=3)
              for r in range(workers)] + [np.zeros(count, np.float32)] * aggregators
    send = inputs[rank].copy()
    recv = np.full(count, np.nan, dtype=np.float32)  # every element must be written
    layout = None
    if algorithm == "omnireduce":
        layout = make_layout(count, block, size, aggregators, 2, fusion, window)
        call = OmniReduce(comm, send, recv, layout, threshold)
    elif algorithm == "allgather-sparse":
        call = AllgatherSparse(comm, send, recv, block, threshold)
    elif algorithm == "dense":
        call = comm.library_call("allreduce", send, recv)
    else:
        call = bind_collective(comm, "ring", "allreduce", send, recv)

    # the sum of what is kept: blocks with some |x| > threshold (all of them at 0)
    masks = [block_masks(x, block, threshold if algorithm in ("omnireduce",
                                                              "allgather-sparse") else 0.0)
             for x in inputs]  # fmt: skip
    keep = [np.repeat(m, block)[:count] for m in masks]
    expected = np.sum([np.where(k, x, 0.0) for k, x in zip(keep, inputs, strict=True)], axis=0)
    if rank >= workers:  # a dedicated aggregator holds the sums of its own streams
        share = np.zeros(layout.nblocks, dtype=bool)
        for s in layout.streams_of(rank):
            share[slice(*layout.streams[s])] = True
        expected = np.where(np.repeat(share, block)[:count], expected, 0.0)

    ok, wires = True, []
    for _ in range(2):  # twice: the second call reuses every buffer of the first
        recv[...] = np.nan
        before = comm.wire_bytes
        call()
        wires.append(comm.wire_bytes - before)
        ok &= bool(np.array_equal(recv.astype(np.float64), expected))
    dropped = float(sum(np.abs(np.where(k, 0.0, x)).sum()
                        for k, x in zip(keep, inputs, strict=True)))

    # the blocks that must move, counted from the masks
    block_bytes = np.full(masks[0].size, block * 4)
    if count % block:
        block_bytes[-1] = (count % block) * 4
    union = np.logical_or.reduce(masks)
    payload = index = 0
    if algorithm == "omnireduce":
        for r in range(size):
            mine = np.zeros(masks[0].size, dtype=bool)
            for s in layout.streams_of(r):
                mine[slice(*layout.streams[s])] = True
            remote_workers = workers - (1 if r < workers else 0)
            moved = masks[r] & ~mine if r < workers else np.zeros_like(mine)
            payload += block_bytes[moved].sum() + remote_workers * block_bytes[union & mine].sum()
            index += 4 * (moved.sum() + remote_workers * (union & mine).sum())
    elif algorithm == "allgather-sparse":
        payload = (size - 1) * sum(block_bytes[m].sum() for m in masks)
        index = (size - 1) * 4 * sum(m.sum() for m in masks)
    elif algorithm == "dense-ring":
        payload = 2 * (size - 1) * count * 4
    wire = comm.mpi.allreduce(wires[-1], op=MPI.SUM) / size
    everywhere = comm.mpi.allreduce(int(ok), op=MPI.MIN) == 1
    return {"ok": everywhere, "wire": wire, "payload": int(payload) / size,
            "minimum": int(payload + index) / size, "same_wire": wires[0] == wires[1],
            "union_blocks": int(union.sum()), "dropped": dropped,
            "streams": len(layout.streams) if layout else 0}


def main() -> int:
    from ccbench.collectives.comm import Communicator

    parser = argparse.ArgumentParser()
    parser.add_argument("--aggregators", type=int, default=0)
    args = parser.parse_args()
    comm = Communicator(MPI.COMM_WORLD)
    for case_id, params in cases(args.aggregators):
        result = run_case(comm, args.aggregators, *params)
        if comm.rank == 0:
            print(json.dumps({"case": case_id, **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
