"""The one description of each collective (collectives/spec.py), against hand-worked
values: counts of an OSU size, bus-bandwidth factors, the ring's wire bytes, references."""

from __future__ import annotations

import queue
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pytest

from ccbench.collectives import spec as spec_module
from ccbench.collectives.compressed import ring_raw_bytes
from ccbench.collectives.compressed_error import compressions_on_path
from ccbench.collectives.ring import block_bounds, ring_blocks, ring_collective, ring_scratch
from ccbench.collectives.spec import PIECES_WHOLE, SPECS, spec
from ccbench.kernels.errors import UsageError


def test_counts_of_an_osu_size_by_hand():
    # allgather: 4096 B float32 is what each of 4 ranks sends; 16 KiB gathered
    shape = spec("allgather").shape(4096, 4, "float32")
    assert (shape.count, shape.send_count, shape.recv_count) == (1024, 1024, 4096)
    assert (shape.bytes_per_rank, shape.total_bytes) == (4096, 16384)
    # reduce-scatter: 4096 B is the whole send buffer; each of 4 ranks keeps 256 values
    shape = spec("reduce_scatter").shape(4096, 4, "float32")
    assert (shape.recv_count, shape.bytes_per_rank, shape.total_bytes) == (256, 1024, 4096)
    assert spec("reduce_scatter").shape(8, 4, "float32") is None  # 2 values on 4 ranks
    with pytest.raises(UsageError, match="multiples of 12 B"):
        spec("reduce_scatter").shape(4096, 3, "float32")
    with pytest.raises(UsageError, match="unknown collective 'gather'"):
        spec("gather")


@pytest.mark.parametrize(
    "ranks, gather, reduce", [(2, 0.5, 1.0), (3, 2 / 3, 4 / 3), (4, 0.75, 1.5), (8, 0.875, 1.75)]
)
def test_bus_bandwidth_factors_are_nccl_tests(ranks, gather, reduce):
    assert SPECS["allgather"].busbw(ranks) == pytest.approx(gather, rel=1e-15)
    assert SPECS["reduce_scatter"].busbw(ranks) == pytest.approx(gather, rel=1e-15)
    assert SPECS["allreduce"].busbw(ranks) == pytest.approx(reduce, rel=1e-15)


def test_ring_wire_bytes_by_hand():
    # 4 ranks, 1 MiB: allgather forwards 3 blocks of 1 MiB; reduce-scatter 3 of 256 KiB;
    # allreduce 6 of 256 KiB
    mib = 1 << 20
    assert spec("allgather").ring_wire_bytes(mib, 4) == 3 * mib
    assert spec("reduce_scatter").ring_wire_bytes(mib, 4) == 3 * mib / 4
    assert spec("allreduce").ring_wire_bytes(mib, 4) == 6 * mib / 4
    # an allreduce of 10 values on 4 ranks: blocks of 3, 3, 2, 2, the largest 3
    assert spec("allreduce").ring_block_count(10, 4) == 3


def test_references_by_hand():
    a, b = np.array([1.0, 2.0, 3.0, 4.0]), np.array([10.0, 20.0, 30.0, 40.0])
    assert spec("allgather").reference([a, b], 1).tolist() == [1, 2, 3, 4, 10, 20, 30, 40]
    assert spec("allreduce").reference([a, b], 0).tolist() == [11, 22, 33, 44]
    assert spec("reduce_scatter").reference([a, b], 0).tolist() == [11, 22]
    assert spec("reduce_scatter").reference([a, b], 1).tolist() == [33, 44]


# A made-up fourth collective, described by one entry added to a copy of SPECS: every
# rank holds a whole buffer and contributes its own block of it; every rank ends with the
# blocks assembled (an allgather whose input is already laid out as the output, as FSDP's
# in-place all-gather). It reuses the gather phase on blocks of the send buffer.


def _own_blocks(inputs, rank):
    blocks = block_bounds(inputs[0].shape[0], len(inputs))
    return np.concatenate([x[a:b] for x, (a, b) in zip(inputs, blocks, strict=True)]).astype(
        np.float64
    )


GATHER_BLOCKS = replace(
    SPECS["allgather"],
    name="gather_blocks",
    osu_title="Gather_blocks",
    label="Gather blocks",
    size_convention="Size = the whole buffer",
    counts=SPECS["allreduce"].counts,
    recv_count=lambda sent, n: sent,
    reference=_own_blocks,
    ring_block_is_send=False,
    counts_of_whole=lambda n, p: (n, n),
    mpi_call="Allgather",
    torch_calls=(),
    staged_pieces=PIECES_WHOLE,
)


@pytest.fixture
def with_gather_blocks(monkeypatch):
    monkeypatch.setattr(spec_module, "SPECS", {**SPECS, "gather_blocks": GATHER_BLOCKS})
    return spec("gather_blocks")


class _RingOfThreads:
    """One rank of a ring of threads: sendrecv through queues, bytes sent counted."""

    def __init__(self, rank, size, queues):
        self.rank, self.size, self.queues, self.wire_bytes = rank, size, queues, 0

    def sendrecv(self, sendbuf, dest, recvbuf, source):
        self.queues[self.rank, dest].put(sendbuf.copy())
        self.wire_bytes += sendbuf.nbytes
        recvbuf[:] = self.queues[source, self.rank].get(timeout=10)


def _run_ring(described, inputs, recv_count):
    """ring.ring_collective on len(inputs) threads: (results, wire bytes) per rank."""
    size = len(inputs)
    queues = {(a, b): queue.Queue() for a in range(size) for b in range(size)}
    comms = [_RingOfThreads(r, size, queues) for r in range(size)]
    outs = [np.zeros(recv_count, dtype=np.float32) for _ in range(size)]

    def rank_main(r):
        ring_collective(
            comms[r], described, inputs[r], outs[r], ring_scratch(described, inputs[r], size)
        )

    with ThreadPoolExecutor(size) as pool:
        list(pool.map(rank_main, range(size)))
    return outs, [c.wire_bytes for c in comms]


def test_a_new_collective_is_one_entry(with_gather_blocks):
    described = with_gather_blocks
    # 7 float32 values on 3 ranks: blocks of 3, 2, 2 values
    shape = described.shape(28, 3, "float32")
    assert (shape.send_count, shape.recv_count, shape.total_bytes) == (7, 7, 28)
    assert described.fits(7, 7, 3) and not described.fits(7, 6, 3)
    assert described.counts_of_whole(7, 3) == (7, 7) and described.whole_count(7, 7) == 7
    # the ring forwards P-1 blocks of Size / P
    assert described.ring_wire_bytes(28, 3) == pytest.approx(2 * 28 / 3)
    assert ring_blocks(described, 7, 3) == [(0, 3), (3, 5), (5, 7)]
    inputs = [np.arange(7, dtype=np.float32) + 10 * r for r in range(3)]
    by_hand = [0, 1, 2, 13, 14, 25, 26]  # rank 0's block 0, rank 1's block 1, rank 2's 2
    assert described.reference(inputs, 1).tolist() == by_hand
    outs, wire = _run_ring(described, inputs, 7)
    for out in outs:
        assert out.tolist() == by_hand
    # rank r sends its own block, then the one it received: 3 + 2, 2 + 3, 2 + 2 values
    assert wire == [20, 20, 16]
    assert [
        ring_raw_bytes(described.phases, ring_blocks(described, 7, 3), r, 3, 4) for r in range(3)
    ] == wire
    # a gather phase: the collective-level ring encodes each block once, point-to-point
    # compression at each of the P-1 hops, the library once
    assert [compressions_on_path(v, "gather_blocks", 3) for v in ("coll", "p2p", "library")] == [
        1,
        2,
        1,
    ]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_ring_runs_each_collective_by_its_phases(name):
    described, ranks = spec(name), 3
    shape = described.shape(12 * 4, ranks, "float32")
    inputs = [np.arange(shape.send_count, dtype=np.float32) * (r + 1) - r for r in range(ranks)]
    outs, wire = _run_ring(described, inputs, shape.recv_count)
    for r, out in enumerate(outs):
        assert out.tolist() == described.reference(inputs, r).tolist()
    # each rank sends the ring's hops of one block (allgather: a send buffer, 12 values;
    # the others: 12 values in blocks of 4)
    assert wire == [described.ring_wire_bytes(48, ranks)] * ranks


@pytest.mark.parametrize(
    "name, by_rank",
    [
        # 3 ranks, 5 float32 each: every rank sends its own block to the 2 others
        ("allgather", [40, 40, 40]),
        # 6 values in, 2 out: the all-to-all sends the 2 blocks of the others (2 + 2)
        ("reduce_scatter", [16, 16, 16]),
        # 7 values in blocks of 3, 2, 2: the others' blocks, then the own block twice
        # rank 0: (2 + 2) + 2 x 3 = 10 values; ranks 1, 2: (3 + 2) + 2 x 2 = 9
        ("allreduce", [40, 36, 36]),
    ],
)
def test_the_library_algorithms_uncompressed_equivalent_by_hand(name, by_rank):
    """What the library's uncompressed calls would send from each rank (`raw_bytes`):
    every compression ratio and wire-byte row of --algorithm library divides by it."""
    from types import SimpleNamespace

    from ccbench.collectives.compressed_library import LibraryCompressed
    from ccbench.kernels.codecs import parse_codec

    send, recv = {"allgather": (5, 15), "reduce_scatter": (6, 2), "allreduce": (7, 7)}[name]
    raw = [
        LibraryCompressed(
            SimpleNamespace(rank=r, size=3),
            parse_codec("fp16"),
            name,
            np.zeros(send, np.float32),
            np.zeros(recv, np.float32),
        ).raw_bytes
        for r in range(3)
    ]
    assert raw == by_rank


@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
def test_the_collective_level_rings_codec_work_by_hand(ranks):
    """Blocks one rank encodes, decodes and hops (decode-add-encode) in the collective-level
    ring: allgather encodes its own block once and decodes the P-1 it receives;
    reduce-scatter encodes its own first block, hops the P-2 partial sums in between and
    decodes the last one into its result; allreduce is that reduce-scatter, then the
    allgather of the reduced block (encoded once more, P-1 more decodes)."""
    p = ranks
    assert spec("allgather").coll_codec_blocks(p) == (1, p - 1, 0)
    assert spec("reduce_scatter").coll_codec_blocks(p) == (1, 1, p - 2)
    assert spec("allreduce").coll_codec_blocks(p) == (2, p, p - 2)
    # a collective of phases does the work of its phases in turn
    by_phase = {described.phases: described.coll_codec_blocks(p) for described in SPECS.values()}
    both = by_phase[spec("allreduce").phases]
    parts = [by_phase[(phase,)] for phase in spec("allreduce").phases]
    assert both == tuple(sum(work) for work in zip(*parts, strict=True))
