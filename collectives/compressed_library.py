"""Library-backed compressed collectives: encode once, one library collective of the
payloads, decode.

The ring of collectives/compressed.py (`CollCompressed`) makes one point-to-point call
per ring step and chunk, and hides codec work behind the transfers. Where each call has
a large fixed cost (torch.distributed over NCCL: a call per chunk on 2 ranks cost more
than the bytes it saved), one call per phase wins instead. Here:

* allgather: each rank encodes its block once; the library's allgather moves the
  payloads (`comm.allgather_bytes`); every rank, the owner included, decodes every
  rank's payload, so all ranks hold the same bits;
* reduce-scatter: each rank encodes the block of every other rank; the library's
  all-to-all moves them (`comm.alltoall_bytes`); each rank decodes the n-1 blocks it
  received and adds them to its own, uncompressed, block. Each contribution passes one
  encode / decode at its own magnitude, where the ring re-encodes the running partial
  sum at each of the n-1 hops (errors compounding on a sum up to n times larger);
* allreduce: that reduce-scatter, then the allgather of the reduced block, encoded once.

Departures from the ring (seed 000): no pipelining, so codec work and transfers do not
overlap (the library may still pipeline its own call); an all-to-all sends each rank's
n-1 blocks at once rather than one per step.

Sizes: fixed-size codecs (fp16, bf16, bfp, zfp:rate, none) know every payload's size
from the counts, so no sizes are exchanged. Where allreduce blocks differ by one
element, the allgather's blocks are padded to the longest payload (a few bytes; sent
and counted). Variable-size codecs (zfp:tol, zstd) first exchange their payloads'
lengths (8 bytes per block, counted on the wire, by the same library call), then move
the payloads: an all-to-all of the exact lengths, an allgather of blocks padded to the
longest payload. Lengths are read on the host, which these codecs run on anyway.

Nothing here waits for the host on a device beyond what the transport declares: the
library calls are stream-ordered over NCCL, and staged through host memory over an MPI
that cannot read the device (collectives/comm.py).
"""

from __future__ import annotations

from itertools import accumulate

import numpy as np

from ccbench.collectives.phases import COPY, REDUCE_INTO, step_walk
from ccbench.collectives.pipeline import DECODE, ENCODE, REDUCE, WAIT, Breakdown, timed
from ccbench.collectives.ring import ring_blocks
from ccbench.collectives.spec import spec
from ccbench.kernels import arrays
from ccbench.kernels.codec_base import Codec, dtype_name, empty_payload, host_numpy
from ccbench.kernels.reduce import copy_into
from ccbench.kernels.vocabulary import itemsize

LENGTH_NBYTES = 8  # a variable-size payload's length, as its own header holds it


class LibraryCompressed:
    """One library-backed compressed collective bound to its buffers (module docstring).

    Calling it runs one blocking collective from sendbuf into recvbuf. `raw_bytes` is
    what the same library calls would send uncompressed from this rank; the
    Communicator counts what was sent."""

    variant = "library"

    def __init__(self, comm, codec: Codec, collective: str, sendbuf, recvbuf):
        described = spec(collective)  # UsageError for an unknown collective
        self.comm, self.codec, self.collective = comm, codec, collective
        self.sendbuf, self.recvbuf = sendbuf, recvbuf
        self.rank, self.size = comm.rank, comm.size
        self.dtype = dtype_name(sendbuf)
        n_send, n_recv = sendbuf.shape[0], recvbuf.shape[0]
        if not described.fits(n_send, n_recv, self.size):
            raise ValueError(
                f"{collective} on {self.size} ranks: {n_send} values in, {n_recv} out do not fit"
            )
        # the ring's blocks: of recvbuf where a block is a rank's send buffer, else of
        # sendbuf (allreduce: blocks that differ by one element where the ranks do not
        # divide the count)
        self.phases = described.phases
        self.bounds = ring_blocks(described, n_send, self.size)
        self.described = described
        self.lengths = [stop - start for start, stop in self.bounds]
        self.fixed = codec.fixed_size
        # per kind of step: its library call (walk), what the same call would send
        # uncompressed (elements), and its buffers
        self.walks = {REDUCE_INTO: self._reduce_walk, COPY: self._copy_walk}
        raw_of = {REDUCE_INTO: self._reduce_raw, COPY: self._copy_raw}
        buffers_of = {REDUCE_INTO: self._reduce_buffers, COPY: self._copy_buffers}
        for phase in self.phases:  # UsageError for a phase of a step it has no walk of
            step_walk(self.walks, phase, "the library-backed compressed collectives")
        raw = sum(raw_of[phase.step]() for phase in self.phases)
        self.raw_bytes = raw * itemsize(self.dtype)
        self.breakdown = Breakdown(comm, sendbuf)
        if self.size == 1:
            return
        self.capacity = [self._capacity(n) for n in self.lengths]
        for phase in self.phases:
            buffers_of[phase.step]()
        if not self.fixed:  # payload lengths, exchanged before the payloads
            self.lengths_send = empty_payload(sendbuf, self.size * LENGTH_NBYTES)
            self.lengths_recv = empty_payload(sendbuf, self.size * LENGTH_NBYTES)

    def _reduce_raw(self) -> int:
        return sum(n for d, n in enumerate(self.lengths) if d != self.rank)

    def _copy_raw(self) -> int:
        return (self.size - 1) * self.lengths[self.rank]

    def _reduce_buffers(self) -> None:
        capacity, own = self.capacity, self.lengths[self.rank]
        self.send_capacity = [0 if d == self.rank else capacity[d] for d in range(self.size)]
        self.recv_capacity = [
            0 if s == self.rank else capacity[self.rank] for s in range(self.size)
        ]
        self.a2a_send = empty_payload(self.sendbuf, max(sum(self.send_capacity), 1))
        self.a2a_recv = empty_payload(self.sendbuf, max(sum(self.recv_capacity), 1))
        self.scratch = arrays.empty_like(self.sendbuf, max(own, 1))

    def _copy_buffers(self) -> None:
        self.slot = max(self.capacity)  # every rank's block padded to the longest payload
        self.ag_send = empty_payload(self.sendbuf, max(self.slot, 1))
        self.ag_recv = empty_payload(self.sendbuf, max(self.size * self.slot, 1))

    def _capacity(self, count: int) -> int:
        if count == 0:
            return 0
        if self.fixed:
            return self.codec.encoded_nbytes(count, self.dtype)
        return self.codec.max_encoded_nbytes(count, self.dtype)

    # views of the buffers as they are at the call (the gradient communicator retargets
    # `recvbuf` to each call's fresh output)
    @property
    def own_input(self):
        return self.described.own_block(self.sendbuf, *self.bounds[self.rank])

    @property
    def own_result(self):
        return self.described.result_block(self.recvbuf, *self.bounds[self.rank])

    def __call__(self) -> None:
        started = self.breakdown.start()
        if self.size == 1:
            copy_into(self.recvbuf, self.sendbuf)
        else:  # each phase from what the previous left: the reduce's block of the sum
            held = self.own_input
            for phase in self.phases:
                held = self.walks[phase.step](held)
        self.breakdown.finish(started)

    def _reduce_walk(self, held):
        own = self.own_result
        self._reduce_scatter(own)
        return own

    def _copy_walk(self, held):
        self._allgather(held)
        return self.recvbuf

    # allgather: encode once, the library's allgather, decode every block ---------------
    def _allgather(self, own) -> None:
        """recvbuf[block b] = rank b's block, decoded (this rank's too: the same bits on
        every rank). `own` is this rank's uncompressed block."""
        timing, codec, size = self.breakdown, self.codec, self.size
        length = 0
        if own.shape[0]:
            payload = timed(timing, ENCODE, codec.encode, own, self.ag_send)
            length = payload.shape[0]
        if self.fixed:
            slot, lengths = self.slot, self.capacity
        else:  # the payloads' lengths first, then blocks of the longest
            lengths = self._exchange_lengths([length] * size, allgather=True)
            slot = max(lengths)
        timed(
            timing,
            WAIT,
            self.comm.allgather_bytes,
            self.ag_send[:slot],
            self.ag_recv[: size * slot],
        )
        for b, (start, stop) in enumerate(self.bounds):
            if stop > start:
                payload = self.ag_recv[b * slot : b * slot + lengths[b]]
                timed(timing, DECODE, codec.decode, payload, self.recvbuf[start:stop])

    # reduce-scatter: encode each destination's block, the library's all-to-all, reduce
    def _reduce_scatter(self, out) -> None:
        """out = block `rank` of the sum: this rank's own block plus the n-1 decoded
        blocks the others sent, added in ring order from the right-hand neighbour."""
        timing, codec, rank, size = self.breakdown, self.codec, self.rank, self.size
        send_splits, offset = [0] * size, 0
        for d, (start, stop) in enumerate(self.bounds):
            if d == rank or stop == start:
                continue
            payload = timed(
                timing,
                ENCODE,
                codec.encode,
                self.sendbuf[start:stop],
                self.a2a_send[offset : offset + self.send_capacity[d]],
            )
            send_splits[d] = payload.shape[0]
            offset += send_splits[d]
        if self.fixed:
            recv_splits = self.recv_capacity
        else:
            recv_splits = self._exchange_lengths(send_splits, allgather=False)
        timed(
            timing,
            WAIT,
            self.comm.alltoall_bytes,
            self.a2a_send,
            send_splits,
            self.a2a_recv,
            recv_splits,
        )
        start, stop = self.bounds[rank]
        if stop == start:
            return
        offsets = _offsets(recv_splits)
        own = self.sendbuf[start:stop]
        hop = codec.decode_add_encode
        for k in range(1, size):
            s = (rank + k) % size
            payload = self.a2a_recv[offsets[s] : offsets[s] + recv_splits[s]]
            # out = decode(payload) + (own, then the running sum)
            timed(timing, REDUCE, hop, payload, own if k == 1 else out, out, None, self.scratch)

    def _exchange_lengths(self, lengths: list[int], allgather: bool) -> list[int]:
        """Variable-size codecs (host buffers): this rank's payload lengths to the others
        (`lengths[d]` to rank d; an allgather sends lengths[0] to all), theirs back, one
        per rank (0 for this rank's own in an all-to-all)."""
        sent = host_numpy(self.lengths_send).view(np.int64)
        if allgather:
            sent[0] = lengths[0]
            self.comm.allgather_bytes(self.lengths_send[:LENGTH_NBYTES], self.lengths_recv)
            return host_numpy(self.lengths_recv).view(np.int64).tolist()
        others = [d for d in range(self.size) if d != self.rank]
        sent[: len(others)] = [lengths[d] for d in others]  # packed in rank order
        splits = [0 if d == self.rank else LENGTH_NBYTES for d in range(self.size)]
        self.comm.alltoall_bytes(self.lengths_send, splits, self.lengths_recv, splits)
        got = host_numpy(self.lengths_recv).view(np.int64)[: len(others)].tolist()
        got.insert(self.rank, 0)
        return got


def _offsets(splits) -> list[int]:
    """Where each of these blocks starts, packed end to end."""
    return [0, *accumulate(splits)]
