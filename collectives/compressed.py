"""Compressed ring collectives: point-to-point compression and collective-level compression.

Both walk a collective's phases (collectives/phases.py: each phase's schedule, and a walk
per kind of step); they differ in where the codec sits.

* Point-to-point (`P2PCompressed`, the earlier design the seed compares against): every
  message is compressed by its sender and decompressed by its receiver, as if the MPI
  library compressed each point-to-point message above a size threshold. A ring
  allgather therefore re-encodes a block at each of the P-1 hops.
* Collective-level (`CollCompressed`, seed 000, a reconstruction): allgather encodes
  each rank's block once and forwards the compressed bytes untouched; reduce-scatter
  decompresses, reduces and recompresses the running partial sums. Blocks are cut into
  chunks, every chunk travels with non-blocking sends and receives, and the codec works
  on one chunk while others are on the wire.

`bind_compressed` also binds the library-backed collectives of
collectives/compressed_library.py (variant "library": encode once, one library
allgather / all-to-all of the payloads, decode). The error each variant's result may
carry, and the round trips behind it, are collectives/compressed_error.py's.

Bound objects are built once per buffer set (payload slots, scratch, schedules); calling
one runs one blocking collective from sendbuf into recvbuf. `raw_bytes` is what the
uncompressed ring sends per call on this rank; the Communicator counts what was sent.
"""

from __future__ import annotations

import time

from ccbench.collectives import compressed_ordered
from ccbench.collectives.chunking import DEFAULT_CHUNK_BYTES, chunk_count_for, split_chunks
from ccbench.collectives.compressed_library import LibraryCompressed
from ccbench.collectives.phases import COPY, REDUCE_INTO, fuses, step_walk
from ccbench.collectives.pipeline import (
    DECODE,
    DEFAULT_PROGRESS,
    DEFAULT_WAIT,
    ENCODE,
    PROGRESS_MODES,
    REDUCE,
    SUB_CHUNK_BYTES,
    WAIT,
    WAIT_MODES,
    Breakdown,
    Engine,
    idle_wait,
    splittable,
    sub_ranges,
    timed,
)
from ccbench.collectives.ring import RingScratch, ring_blocks, ring_neighbors
from ccbench.collectives.spec import spec
from ccbench.kernels import arrays
from ccbench.kernels.codec_base import Codec, dtype_name, empty_payload
from ccbench.kernels.errors import UsageError
from ccbench.kernels.reduce import add_into, copy_into
from ccbench.kernels.vocabulary import itemsize, nbytes

SLOT_ALIGN = 64  # payload slots start on cache-line boundaries
_TAG_P2P = 7100
_TAG_BASE = 7200  # collective-level: one tag per (phase, step), by the phase's tag block


# ------------------------------------------------------------------------------- helpers


def _round_up(n: int, align: int = SLOT_ALIGN) -> int:
    return -(-n // align) * align


def _wait(comm, requests, mode: str = DEFAULT_WAIT) -> None:
    """Wait, giving the core away between progress polls instead of spinning in MPI.

    Ranks often outnumber cores (4 ranks on 2 cores on an emulated cluster): a rank
    spinning in MPI_Wait takes the core from a rank that is encoding. Each test drives
    MPI's progress engine; in between, pipeline.idle_wait yields or sleeps. A transport
    whose requests cannot be tested (torch.distributed) is waited for.
    """
    if not comm.any_completion:
        comm.waitall(requests)
        return
    since = time.perf_counter()
    while not comm.testall(requests):
        idle_wait(since, mode)


def ring_raw_bytes(phases, bounds, rank: int, size: int, itemsize: int) -> int:
    """Bytes this rank's uncompressed ring sends per call (the schedules' blocks)."""
    total = sum(
        bounds[sb][1] - bounds[sb][0] for phase in phases for sb in phase.sent_blocks(rank, size)
    )
    return total * itemsize


class _Bound:
    """What both variants share: codec, ring neighbours, block layout, byte counts."""

    def __init__(self, comm, codec: Codec, collective: str, sendbuf, recvbuf):
        described = spec(collective)  # UsageError for an unknown collective
        self.comm, self.codec, self.collective = comm, codec, collective
        self.sendbuf, self.recvbuf = sendbuf, recvbuf
        self.rank, self.size = comm.rank, comm.size
        self.left, self.right = ring_neighbors(self.rank, self.size)
        self.dtype = dtype_name(sendbuf)
        n_send, n_recv = sendbuf.shape[0], recvbuf.shape[0]
        if not described.fits(n_send, n_recv, self.size):
            raise ValueError(
                f"{collective} on {self.size} ranks: {n_send} values in, {n_recv} out do not fit"
            )
        self.phases = described.phases
        self.bounds = ring_blocks(described, n_send, self.size)
        self.described = described
        self.raw_bytes = ring_raw_bytes(
            self.phases, self.bounds, self.rank, self.size, itemsize(self.dtype)
        )

    # Views of the buffers as they are at the call, not at binding: the gradient
    # communicator retargets `recvbuf` to each call's fresh output (FSDP's).
    @property
    def own_input(self):
        return self.described.own_block(self.sendbuf, *self.bounds[self.rank])

    @property
    def own_result(self):
        """Where this rank's block of the result lands (all of it where nothing gathers)."""
        return self.described.result_block(self.recvbuf, *self.bounds[self.rank])

    def walk_plan(self, fused: bool) -> list[tuple[int, object, object]]:
        """(tag block, phase, handed to) per phase, in order: `handed to` is the next phase
        where, fused, it starts on each chunk this one finishes (collectives/phases.fuses),
        else None."""
        after = [*self.phases[1:], None]
        return [
            (phase.tag, phase, nxt if fused and nxt is not None and fuses(phase, nxt) else None)
            for phase, nxt in zip(self.phases, after, strict=True)
        ]

    def _slot_nbytes(self, count: int) -> int:
        return _round_up(self.codec.max_encoded_nbytes(count, self.dtype))

    def _payload_len(self, slot, count: int) -> int:
        return self.codec.payload_nbytes(slot, count, self.dtype)


# ------------------------------------------------------------------ point-to-point


class P2PCompressed(_Bound):
    """Ring collective in which every message above `threshold` bytes is compressed."""

    variant = "p2p"

    def __init__(self, comm, codec: Codec, collective: str, sendbuf, recvbuf, threshold: int = 0):
        super().__init__(comm, codec, collective, sendbuf, recvbuf)
        self.threshold = threshold
        longest = max(stop - start for start, stop in self.bounds)
        self.send_payload = empty_payload(sendbuf, self._slot_nbytes(longest))
        self.recv_payload = empty_payload(sendbuf, self._slot_nbytes(longest))
        self.scratch = RingScratch(sendbuf, longest)
        self.breakdown = Breakdown(comm, sendbuf)
        self.walks = {REDUCE_INTO: self._reduce_walk, COPY: self._copy_walk}
        for phase in self.phases:  # UsageError for a phase of a step it has no walk of
            step_walk(self.walks, phase, "the point-to-point compressed ring")

    def __call__(self) -> None:
        started = self.breakdown.start()
        if self.size == 1:
            copy_into(self.recvbuf, self.sendbuf)
        else:  # ring.ring_collective's walk, each hop compressed
            held, own = self.own_input, self.own_result
            for phase in self.phases:
                held = self.walks[phase.step](phase, held, own)
        self.breakdown.finish(started)

    def _reduce_walk(self, phase, held, own):
        self._reduce_scatter(phase, own)
        return own

    def _copy_walk(self, phase, held, own):
        if held is not own:
            copy_into(own, held)
        self._allgather(phase, self.recvbuf)
        return self.recvbuf

    def _hop(self, data, out) -> None:
        """Send `data` right and receive `out` from the left, each compressed if large
        enough. Either may be empty (fewer elements than ranks): then it is skipped, as
        the neighbour's matching side is empty too."""
        timing = self.breakdown
        if data.shape[0] and nbytes(data) >= self.threshold:
            data = timed(timing, ENCODE, self.codec.encode, data, self.send_payload)
        compressed = out.shape[0] and nbytes(out) >= self.threshold
        incoming = out
        if compressed:
            capacity = self.codec.max_encoded_nbytes(out.shape[0], self.dtype)
            incoming = self.recv_payload[:capacity]
        # one exchange: a batch where the transport needs one (NCCL); the transport waits
        # for the device where it must (staging, GPU-aware MPI) and counts it
        requests = self.comm.exchange(data, self.right, incoming, self.left, _TAG_P2P)
        timed(timing, WAIT, _wait, self.comm, requests)
        if compressed:
            timed(timing, DECODE, self.codec.decode, incoming, out)

    def _allgather(self, phase, buf) -> None:
        for _, send_block, recv_block in phase.schedule(self.rank, self.size):
            s0, s1 = self.bounds[send_block]
            r0, r1 = self.bounds[recv_block]
            self._hop(buf[s0:s1], buf[r0:r1])

    def _reduce_scatter(self, phase, out) -> None:
        outgoing = None
        for step, send_block, recv_block in phase.schedule(self.rank, self.size):
            s0, s1 = self.bounds[send_block]
            r0, r1 = self.bounds[recv_block]
            if outgoing is None:  # the first hop sends this rank's own contribution
                outgoing = self.sendbuf[s0:s1]
            incoming = self.scratch.incoming[: r1 - r0]
            self._hop(outgoing, incoming)
            target = out if step == self.size - 2 else self.scratch.partial[: r1 - r0]
            timed(self.breakdown, REDUCE, add_into, target, incoming, self.sendbuf[r0:r1])
            outgoing = target


# ------------------------------------------------------------------ collective level


class _Slots:
    """One payload slot per (key, chunk) in a single preallocated uint8 buffer."""

    def __init__(self, like, sizes: dict):
        offsets, total = {}, 0
        for key, size in sizes.items():
            offsets[key] = (total, size)
            total += _round_up(size)
        self.buffer = empty_payload(like, max(total, 1))
        self.views = {key: self.buffer[start : start + n] for key, (start, n) in offsets.items()}

    def __getitem__(self, key):
        return self.views[key]


class CollCompressed(_Bound):
    """Collective-level compression with chunked, non-blocking pipelining.

    `progress` and `codec_threads` choose how MPI keeps moving bytes while the codec
    works (collectives/pipeline.py). `fused` (allreduce only) runs reduce-scatter and
    allgather as one pipeline: the last reduce-scatter step of a chunk encodes the reduced
    chunk once and sends it on as the allgather's first message at once, while later
    chunks are still being reduced; without it the allgather starts once the whole
    reduce-scatter has finished (two collectives back to back).
    """

    variant = "coll"

    def __init__(
        self,
        comm,
        codec: Codec,
        collective: str,
        sendbuf,
        recvbuf,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        progress: str = DEFAULT_PROGRESS,
        codec_threads: int = 0,
        fused: bool = True,
        sub_chunk_bytes: int = SUB_CHUNK_BYTES,
        wait: str = DEFAULT_WAIT,
    ):
        super().__init__(comm, codec, collective, sendbuf, recvbuf)
        if progress not in PROGRESS_MODES:
            raise UsageError(f"progress {progress!r}: choose one of {', '.join(PROGRESS_MODES)}")
        if codec_threads not in (0, 1):
            raise UsageError(f"codec threads must be 0 or 1, got {codec_threads}")
        if wait not in WAIT_MODES:
            raise UsageError(f"wait {wait!r}: choose one of {', '.join(WAIT_MODES)}")
        if codec_threads and arrays.is_device_array(sendbuf):
            raise UsageError(
                "--codec-threads 1 runs the codec on a host thread; a device's "
                "codec kernels run beside the transfers already"
            )
        if not comm.any_completion and (codec_threads or progress != DEFAULT_PROGRESS):
            raise UsageError(
                f"--progress testall and --codec-threads 1 drive MPI's progress "
                f"engine; the {comm.transport} transport's pipeline runs in "
                f"posting order"
            )
        self.progress, self.codec_threads, self.fused = progress, codec_threads, fused
        self.wait = wait
        self.chunk_count = chunk_count_for(codec, self.dtype, chunk_bytes)
        self.chunks = [split_chunks(start, stop, self.chunk_count) for start, stop in self.bounds]
        sizes = {}
        self.walks = {REDUCE_INTO: self._reduce_walk, COPY: self._copy_walk}
        slot_sizes = {REDUCE_INTO: self._reduce_slots, COPY: self._copy_slots}
        for phase in self.phases:  # UsageError for a phase of a step it has no walk of
            step_walk(self.walks, phase, "the collective-level compressed ring")
            slot_sizes[phase.step](phase, sizes)
        self.slots = _Slots(sendbuf, sizes)
        # codec work is cut into sub-chunks, with MPI progress in between, when asked for
        # and when the codec's payloads concatenate
        piece = 0
        if progress == "testall" and not codec_threads:
            grain = codec.granularity
            piece = max(grain, sub_chunk_bytes // itemsize(self.dtype) // grain * grain)
            if not splittable(codec, self.dtype, piece):
                piece = 0
        self.piece = piece
        self.breakdown = Breakdown(comm, sendbuf)
        self.engine: Engine | None = None
        # a caller's hooks (the hierarchical collectives' level inside a node, which
        # runs beside this call; inline progress only): needs(c0, c1) before sendbuf[c0:c1]
        # is first read (it may fill it then), delivered(c0, c1) once recvbuf[c0:c1] holds
        # its final values, and side work where the call would wait (Engine's `side`)
        self.needs = None
        self.delivered = None
        self.side_work = None

    def _reduce_slots(self, phase, sizes: dict) -> None:
        """Partial sums: one receive and one send slot per (step, chunk)."""
        for step, send_block, recv_block in phase.schedule(self.rank, self.size):
            for c, (c0, c1) in enumerate(self.chunks[recv_block]):
                sizes["rs-in", step, c] = self._slot_nbytes(c1 - c0)
            for c, (c0, c1) in enumerate(self.chunks[send_block]):
                sizes["rs-out", step, c] = self._slot_nbytes(c1 - c0)
        longest = max(stop - start for start, stop in self.bounds)
        self.scratch = RingScratch(self.sendbuf, min(longest, self.chunk_count or longest))

    def _copy_slots(self, phase, sizes: dict) -> None:
        """Every block's compressed chunks, own block included."""
        for b, chunks in enumerate(self.chunks):
            for c, (c0, c1) in enumerate(chunks):
                sizes["ag", b, c] = self._slot_nbytes(c1 - c0)

    def __call__(self) -> None:
        started = self.breakdown.start()
        if self.size == 1:
            copy_into(self.recvbuf, self.sendbuf)
        elif not self.comm.any_completion:  # torch.distributed: in posting order
            compressed_ordered.run(self)
        else:  # fused: one pipeline, each phase starting on what the previous finished;
            # else one pipeline per phase, back to back
            plan = self.walk_plan(self.fused)
            self._held = self.own_input
            for part in [plan] if self.fused else [[placed] for placed in plan]:
                self._run(lambda e, part=part: self._walk(e, part))
        self.breakdown.finish(started)

    def _walk(self, engine, plan) -> None:
        """Post the walks of `plan`'s phases on `engine`, each from the block the previous
        one left this rank (`_held`)."""
        for place, phase, hands_on in plan:
            self._held = self.walks[phase.step](engine, place, phase, self._held, hands_on)

    def _reduce_walk(self, engine, place, phase, held, hands_on):
        """This rank's block of the sum into its place in the result; handed on, each
        reduced chunk is the next phase's first message (its payload, encoded once)."""
        start = self.bounds[self.rank][0]
        fuse_into = self.recvbuf if hands_on else None
        handed_tag = hands_on.tag if hands_on else None
        self._reduce_scatter(engine, phase, place, self.own_result, start, fuse_into, handed_tag)
        return None if hands_on else self.own_result

    def _copy_walk(self, engine, place, phase, held, hands_on):
        """Every rank's block into the result, from the block this rank holds (None: the
        previous phase encodes and sends it chunk by chunk)."""
        self._allgather(engine, phase, place, held, self.recvbuf, self.bounds[self.rank][0])
        return self.recvbuf

    def _run(self, build) -> None:
        self.engine = Engine(
            self.comm, self.breakdown, self.codec_threads, self.wait, self.side_work
        )
        build(self.engine)
        self.engine.run()

    def _tag(self, phase: int, step: int) -> int:
        # per-step tags: a neighbour may send step s+1 chunks before its last step-s chunk
        return _TAG_BASE + phase * self.size + step

    def _send(self, payload, tag: int):
        return self.comm.isend(payload, self.right, tag)

    # codec work, in sub-chunks with MPI progress between them ------------------------

    def _pieces(self, count: int) -> list[tuple[int, int]]:
        return sub_ranges(count, self.piece) if self.piece else [(0, count)]

    def _offset(self, count: int) -> int:
        return self.codec.encoded_nbytes(count, self.dtype) if count else 0

    def _encode(self, x, slot):
        """Encode x into slot; the payload (a view of slot)."""
        pieces = self._pieces(x.shape[0])
        if len(pieces) == 1:
            return timed(self.breakdown, ENCODE, self.codec.encode, x, slot)
        for a, b in pieces:
            timed(self.breakdown, ENCODE, self.codec.encode, x[a:b], slot[self._offset(a) :])
            self.engine.poke()
        return slot[: self._offset(x.shape[0])]

    def _decode(self, payload, out) -> None:
        pieces = self._pieces(out.shape[0])
        if len(pieces) == 1:
            timed(self.breakdown, DECODE, self.codec.decode, payload, out)
            return
        for a, b in pieces:
            timed(
                self.breakdown,
                DECODE,
                self.codec.decode,
                payload[self._offset(a) : self._offset(b)],
                out[a:b],
            )
            self.engine.poke()

    def _decode_add(self, payload, own, target, slot=None):
        """target = decode(payload) + own, piece by piece; with `slot`, the target is also
        encoded into it (the partial sum sent on) and that payload returned. One call of
        the codec's decode_add_encode per piece (one pass over memory where the codec has
        fused kernels), timed whole as the reduction."""
        n = target.shape[0]
        incoming = self.scratch.incoming[:n]
        hop = self.codec.decode_add_encode
        pieces = self._pieces(n)
        if len(pieces) == 1:
            return timed(self.breakdown, REDUCE, hop, payload, own, target, slot, incoming)
        for a, b in pieces:
            timed(
                self.breakdown,
                REDUCE,
                hop,
                payload[self._offset(a) : self._offset(b)],
                own[a:b],
                target[a:b],
                None if slot is None else slot[self._offset(a) :],
                incoming[a:b],
            )
            self.engine.poke()
        return None if slot is None else slot[: self._offset(n)]

    # allgather: compress once, forward compressed bytes, decompress off the critical path
    def _allgather(self, engine, phase, place: int, own, buf, own_start: int) -> None:
        """buf[block b] = decoded block of rank b. `own` is this rank's uncompressed block,
        or None when the fused reduce-scatter encodes it chunk by chunk."""
        rank, last = self.rank, self.size - 2
        for step, _, recv_block in phase.schedule(rank, self.size):
            for c in range(len(self.chunks[recv_block])):
                slot = self.slots["ag", recv_block, c]
                request = self.comm.irecv(slot, self.left, self._tag(place, step))
                engine.post(request, lambda s=step, b=recv_block, c=c: arrived(s, b, c))

        def arrived(step, block, c):
            c0, c1 = self.chunks[block][c]
            slot = self.slots["ag", block, c]
            if step < last:  # forward the compressed bytes untouched, then decode
                engine.send(
                    self._send,
                    slot[: self._payload_len(slot, c1 - c0)],
                    self._tag(place, step + 1),
                )
            engine.local.append(lambda: self._decode_result(slot, buf[c0:c1], c0, c1))

        if own is None:
            return
        for c, (c0, c1) in enumerate(self.chunks[rank]):
            engine.first.append(
                lambda c=c, c0=c0, c1=c1: self._own_chunk(
                    engine, own[c0 - own_start : c1 - own_start], buf[c0:c1], c, place
                )
            )

    def _own_chunk(self, engine, data, result, c, place: int) -> None:
        """Encode one chunk of this rank's block once, send it as the first message of the
        phase at `place`, and decode it back later (every rank ends with the same decoded
        values, the owner included)."""
        payload = self._encode(data, self.slots["ag", self.rank, c])
        engine.send(self._send, payload, self._tag(place, 0))
        c0, c1 = self.chunks[self.rank][c]
        engine.local.append(lambda: self._decode_result(payload, result, c0, c1))

    def _decode_result(self, payload, out, c0: int, c1: int) -> None:
        """out (recvbuf[c0:c1]) = the decoded payload: final values, announced."""
        self._decode(payload, out)
        if self.delivered is not None:
            self.delivered(c0, c1)

    def _input(self, c0: int, c1: int):
        """sendbuf[c0:c1], once the caller's `needs` hook has seen it asked for."""
        if self.needs is not None:
            self.needs(c0, c1)
        return self.sendbuf[c0:c1]

    def input_order(self, phase) -> list[int]:
        """The blocks of sendbuf in the order a reduce-scatter phase first reads them: the
        block it sends first, then each block as a partial sum arrives for it."""
        schedule = list(phase.schedule(self.rank, self.size))
        order = [schedule[0][1], *(recv for _, _, recv in schedule)] if schedule else []
        return list(dict.fromkeys(order))

    # reduce-scatter: decompress, reduce, recompress, chunk by chunk
    def _reduce_scatter(
        self, engine, phase, place: int, out, out_start: int, fuse_into=None, handed_tag=None
    ) -> None:
        """out = block `rank` of the sum; out_start is its offset in the buffer. With
        `fuse_into` (the allreduce's result), each reduced chunk starts the next phase."""
        rank, last = self.rank, self.size - 2
        schedule = list(phase.schedule(rank, self.size))
        for step, _, recv_block in schedule:
            for c in range(len(self.chunks[recv_block])):
                slot = self.slots["rs-in", step, c]
                request = self.comm.irecv(slot, self.left, self._tag(place, step))
                engine.post(
                    request,
                    lambda s=step, b=recv_block, c=c: engine.wire.append(lambda: reduce(s, b, c)),
                )

        def reduce(step, block, c):
            c0, c1 = self.chunks[block][c]
            incoming = self.slots["rs-in", step, c]
            if step == last:
                target = out[c0 - out_start : c1 - out_start]
                self._decode_add(incoming, self._input(c0, c1), target)
                if fuse_into is not None:
                    self._own_chunk(engine, target, target, c, handed_tag)
                return
            partial = self.scratch.partial[: c1 - c0]
            payload = self._decode_add(
                incoming, self._input(c0, c1), partial, self.slots["rs-out", step + 1, c]
            )
            engine.send(self._send, payload, self._tag(place, step + 1))

        first_block = schedule[0][1]
        for c, (c0, c1) in enumerate(self.chunks[first_block]):
            engine.first.append(
                lambda c=c, c0=c0, c1=c1: engine.send(
                    self._send,
                    self._encode(self._input(c0, c1), self.slots["rs-out", 0, c]),
                    self._tag(place, 0),
                )
            )


VARIANTS = {"p2p": P2PCompressed, "coll": CollCompressed, "library": LibraryCompressed}


def bind_compressed(comm, variant: str, collective: str, codec: Codec, sendbuf, recvbuf, **options):
    """A bound compressed collective (callable) for `variant` 'p2p', 'coll' (the ring) or
    'library' (collectives/compressed_library.py)."""
    if variant not in VARIANTS:
        raise UsageError(f"unknown compressed variant {variant!r}; choose {', '.join(VARIANTS)}")
    return VARIANTS[variant](comm, codec, collective, sendbuf, recvbuf, **options)
