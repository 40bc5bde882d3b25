"""Every sparse-allreduce algorithm x density x overlap x block size, in one launch.

    mpiexec -n N python -m tests.drivers.sparse_cases [--aggregators K]

Rank 0 prints one JSON line per case: {"case": id, "ok": bool, "checks": {name: bool}
(tests/helpers/drivers.py), "wire": bytes per rank
(mean over ranks, measured by the Communicator), "payload": the bytes of the blocks
that must move, "minimum": payload plus a 4-byte index per block, "detail": ...}.
The expected sums and the block counts are computed here with plain numpy from every
rank's (seeded, exactly summable) input, independently of kernels/sparse.py.

Request-driven OmniReduce is deterministic: which packets every rank sends follows from
the inputs alone. `simulate_request_driven` replays the protocol here, in plain Python
loops over positions, and the case reports whether every rank's measured wire bytes,
the engine's packet and block counts, and the positions of every packet it sent are
exactly the replay's ("exact_wire", "exact_packets", "exact_positions"), and the
engine's own count of blocks sent without a request ("unrequested").
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from mpi4py import MPI

from tests.helpers.drivers import case_line

DENSITIES = (0.0, 0.05, 0.3, 1.0)
OVERLAPS = ("random", "all", "none")
# (count, block size): dividing, not dividing, and a tensor smaller than one block
SHAPES = ((4096, 64), (5000, 100), (70, 128))
# OmniReduce protocols: (protocol, fusion, window); the window is stream-ahead's only.
# Request-driven fusion 3: streams hold several rows of columns, the last row partial.
PROTOCOLS = (("request-driven", 3, 0), ("stream-ahead", 8, 3))
BASELINES = ("allgather-sparse", "dense", "dense-ring")


def cases(aggregators: int):
    """(case id, parameters); dedicated aggregators run omnireduce only."""
    for protocol, fusion, window in PROTOCOLS:
        tag = f"{protocol}-f{fusion}" + (f"w{window}" if window else "")
        for count, block in SHAPES:
            for density in DENSITIES:
                for overlap in OVERLAPS:
                    yield (
                        f"omnireduce-{tag}-{count}-{block}-{density}-{overlap}",
                        (
                            "omnireduce",
                            protocol,
                            count,
                            block,
                            density,
                            overlap,
                            fusion,
                            window,
                            0.0,
                        ),
                    )
        yield (
            f"omnireduce-{tag}-4096-64-0.3-random-threshold1",
            ("omnireduce", protocol, 4096, 64, 0.3, "random", fusion, window, 1.0),
        )
    # no fusion: the paper's one block per packet, and stream-ahead's stop-and-wait
    yield (
        "omnireduce-request-driven-f1-5000-100-0.3-random",
        ("omnireduce", "request-driven", 5000, 100, 0.3, "random", 1, 0, 0.0),
    )
    # long streams: many rounds, columns held by different workers at different rows
    for density in (0.1, 0.5):
        yield (
            f"omnireduce-request-driven-f8-20000-50-{density}-random",
            ("omnireduce", "request-driven", 20000, 50, density, "random", 8, 0, 0.0),
        )
    yield (
        "omnireduce-stream-ahead-f1w1-5000-100-0.3-random",
        ("omnireduce", "stream-ahead", 5000, 100, 0.3, "random", 1, 1, 0.0),
    )
    if aggregators:
        return
    for algorithm in BASELINES:
        for count, block in SHAPES[:2]:
            for density in (0.0, 0.3, 1.0):
                yield (
                    f"{algorithm}-{count}-{block}-{density}-random",
                    (algorithm, "", count, block, density, "random", 8, 3, 0.0),
                )
    yield (
        "allgather-sparse-4096-64-0.3-random-threshold1",
        ("allgather-sparse", "", 4096, 64, 0.3, "random", 8, 3, 1.0),
    )


def block_masks(x: np.ndarray, block: int, threshold: float) -> np.ndarray:
    padded = np.zeros(-(-x.size // block) * block)
    padded[: x.size] = np.abs(x)
    return (padded.reshape(-1, block) > threshold).any(axis=1)


def _align16(nbytes: int) -> int:
    return (nbytes + 15) // 16 * 16


def simulate_request_driven(masks, layout, count: int, block: int, itemsize: int = 4):
    """Replay request-driven OmniReduce from the block masks alone.

    Returns, per rank, the bytes it sends in one call, its worker packets and blocks,
    and the (stream, positions) of every worker packet. Written with plain loops over
    positions, apart from the engine's vectorised code; the message format (16-byte
    header, int32 position and next position per block, 16-byte aligned, then the
    blocks, a partial last block only its own elements) is the one documented there.
    """
    size = len(masks)
    nblocks = -(-count // block)
    tail = count % block

    def data_bytes(positions):
        return sum((tail if tail and p == nblocks - 1 else block) * itemsize for p in positions)

    def message(indices, positions=()):
        return _align16(4 * (4 + indices)) + data_bytes(positions)

    sent, packets, blocks = [0] * size, [0] * size, [0] * size
    log = {r: [] for r in range(size)}
    workers = list(layout.workers)
    for s, (start, stop) in enumerate(layout.streams):
        agg = layout.aggregator_of[s]
        columns = max(1, min(layout.fusion, stop - start))
        remote = [w for w in workers if w != agg]
        held = {
            w: [[p for p in range(start + c, stop, columns) if masks[w][p]] for c in range(columns)]
            for w in workers
        }
        taken = {w: [0] * columns for w in workers}

        def head(w, c, held=held, taken=taken, stop=stop):
            column = held[w][c]
            return column[taken[w][c]] if taken[w][c] < len(column) else stop

        for w in remote:  # first packets: every column's first position, no block
            sent[w] += message(columns)
        request = [min(head(w, c) for w in workers) for c in range(columns)]
        sent[agg] += len(remote) * message(columns)  # the first requests
        while any(r < stop for r in request):
            for w in workers:
                asked = [
                    c for c in range(columns) if request[c] < stop and head(w, c) == request[c]
                ]
                if asked and w in remote:
                    positions = sorted(request[c] for c in asked)
                    sent[w] += message(2 * len(asked), positions)
                    packets[w] += 1
                    blocks[w] += len(asked)
                    log[w].append((s, positions))
                for c in asked:
                    taken[w][c] += 1
            active = [c for c in range(columns) if request[c] < stop]
            sent[agg] += len(remote) * message(2 * len(active), [request[c] for c in active])
            for c in active:
                request[c] = min(head(w, c) for w in workers)
    return sent, packets, blocks, log


def run_case(
    comm,
    aggregators,
    algorithm,
    protocol,
    count,
    block,
    density,
    overlap,
    fusion,
    window,
    threshold,
) -> dict:
    from ccbench.collectives.baseline import bind_collective
    from ccbench.collectives.omnireduce import OmniReduce
    from ccbench.collectives.omnireduce_layout import make_layout
    from ccbench.collectives.sparse_baselines import AllgatherSparse
    from ccbench.kernels.sparse_data import sparse_input

    size, rank = comm.size, comm.rank
    workers = size - aggregators
    inputs = [
        sparse_input(count, block, density, overlap, r, workers, seed=3) for r in range(workers)
    ] + [np.zeros(count, np.float32)] * aggregators
    send = inputs[rank].copy()
    recv = np.full(count, np.nan, dtype=np.float32)  # every element must be written
    layout = None
    if algorithm == "omnireduce":
        layout = make_layout(count, block, size, aggregators, 2, fusion, max(1, window), protocol)
        call = OmniReduce(comm, send, recv, layout, threshold)
        call.sent = []
    elif algorithm == "allgather-sparse":
        call = AllgatherSparse(comm, send, recv, block, threshold)
    elif algorithm == "dense":
        call = comm.library_call("allreduce", send, recv)
    else:
        call = bind_collective(comm, "ring", "allreduce", send, recv)

    # the sum of what is kept: blocks with some |x| > threshold (all of them at 0)
    masks = [
        block_masks(x, block, threshold if algorithm in ("omnireduce", "allgather-sparse") else 0.0)
        for x in inputs
    ]
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
    dropped = float(
        sum(np.abs(np.where(k, 0.0, x)).sum() for k, x in zip(keep, inputs, strict=True))
    )

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
            per_block = 8 if protocol == "request-driven" else 4  # + its next position
            index += per_block * (moved.sum() + remote_workers * (union & mine).sum())
    elif algorithm == "allgather-sparse":
        payload = (size - 1) * sum(block_bytes[m].sum() for m in masks)
        index = (size - 1) * 4 * sum(m.sum() for m in masks)
    elif algorithm == "dense-ring":
        payload = 2 * (size - 1) * count * 4
    wire = comm.mpi.allreduce(wires[-1], op=MPI.SUM) / size
    oks = comm.mpi.allgather(ok)
    result = {
        "checks": {f"rank {r} sums the kept blocks": held for r, held in enumerate(oks)},
        "wire": wire,
        "payload": int(payload) / size,
        "minimum": int(payload + index) / size,
        "same_wire": wires[0] == wires[1],
        "union_blocks": int(union.sum()),
        "dropped": dropped,
        "streams": len(layout.streams) if layout else 0,
    }
    if protocol == "request-driven":
        sent, packets, blocks, log = simulate_request_driven(masks, layout, count, block)
        mine = (
            wires[-1],
            call.counters["packets"],
            call.counters["blocks"],
            call.counters["unrequested"],
            sorted((s, tuple(p)) for s, p in call.sent),
        )
        everyone = comm.mpi.allgather(mine)
        result.update(
            {
                "exact_wire": [e[0] for e in everyone] == sent,
                "exact_packets": (
                    [e[1] for e in everyone] == packets and [e[2] for e in everyone] == blocks
                ),
                "exact_positions": all(
                    e[4] == sorted((s, tuple(p)) for s, p in log[r]) for r, e in enumerate(everyone)
                ),
                "unrequested": sum(e[3] for e in everyone),
                "packets": sum(packets),
            }
        )
    return result


def main() -> int:
    from ccbench.collectives.comm import Communicator

    parser = argparse.ArgumentParser()
    parser.add_argument("--aggregators", type=int, default=0)
    args = parser.parse_args()
    comm = Communicator(MPI.COMM_WORLD)
    for case_id, params in cases(args.aggregators):
        result = run_case(comm, args.aggregators, *params)
        if comm.rank == 0:
            print(json.dumps(case_line(case_id, result.pop("checks"), **result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
