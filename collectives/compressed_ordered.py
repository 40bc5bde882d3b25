"""Collective-level compression in posting order, for transports whose requests can only
be waited for: torch.distributed (NCCL, gloo).

The pipeline of collectives/compressed.py (`CollCompressed`) reacts to whichever
receive completes first and sends as soon as a chunk is ready, matching messages by tag.
NCCL has neither tags nor a test of a request: messages between two ranks match in the
order they were posted, a send waits on its stream for the matching receive, and on two
ranks both directions of the ring share one stream. So here every rank walks the same
schedule in the same order: at each step of the ring it posts, chunk by chunk, the send
of its outgoing chunk batched with the receive of the incoming one
(`comm.exchange`: one NCCL group each), then waits for the receives in that order and
does each chunk's codec work while the later chunks are still on the wire. Receives post
exactly the payload's bytes where the codec's size is fixed (NCCL needs equal counts).

On a device nothing here waits for the host: a wait makes the compute stream wait for
the communication stream, and the codec's kernels follow on it. The result and the wire
bytes are those of the tagged pipeline, chunk for chunk.
"""

from __future__ import annotations

from ccbench.collectives.phases import COPY, REDUCE_INTO, step_walk
from ccbench.collectives.pipeline import WAIT, timed


def run(bound) -> None:
    """One call of `bound`, a CollCompressed, in posting order: its phases walked by their
    steps, each from what the previous one left this rank (its block, or, fused, the
    payloads of its block encoded once)."""
    held, payloads = bound.own_input, None
    for _, phase, hands_on in bound.walk_plan(bound.fused):
        walk = step_walk(_WALKS, phase, "the collective-level ring in posting order")
        held, payloads = walk(bound, phase, held, payloads, hands_on)


def _reduce_walk(bound, phase, held, payloads, hands_on):
    start = bound.bounds[bound.rank][0]
    out = bound.own_result
    # handed on: the reduced chunks are encoded once, as the next phase's first messages
    encoded = _reduce_scatter(bound, phase, out, start, encode_into="ag" if hands_on else None)
    return (None, encoded) if hands_on else (out, None)


def _copy_walk(bound, phase, held, payloads, hands_on):
    _allgather(bound, phase, held, bound.recvbuf, bound.bounds[bound.rank][0], payloads)
    return bound.recvbuf, None


def _receive_view(bound, slot, count: int):
    """The bytes a receive posts: the payload's exact size where the codec's is fixed."""
    codec = bound.codec
    if codec.fixed_size:
        return slot[: codec.encoded_nbytes(count, bound.dtype)]
    return slot


def _post(bound, outgoing: list, incoming: list) -> list:
    """Exchange k: outgoing[k] to the right, incoming[k] from the left (either may be
    missing where the two blocks have different numbers of chunks)."""
    comm, posted = bound.comm, []
    if not (outgoing or incoming):
        return posted
    empty = (outgoing or incoming)[0][:0]
    for k in range(max(len(outgoing), len(incoming))):
        send = outgoing[k] if k < len(outgoing) else empty
        recv = incoming[k] if k < len(incoming) else empty
        posted.append(comm.exchange(send, bound.right, recv, bound.left))
    return posted


def _wait(bound, requests: list) -> None:
    timed(bound.breakdown, WAIT, bound.comm.waitall, requests)


def _reduce_scatter(bound, phase, out, out_start: int, encode_into: str | None = None) -> list:
    """out = block `rank` of the sum. With `encode_into`, each reduced chunk is also
    encoded into its allgather slot; those payloads are returned."""
    rank, last, send = bound.rank, bound.size - 2, bound.sendbuf
    schedule = list(phase.schedule(rank, bound.size))
    first = schedule[0][1]
    outgoing = [
        bound._encode(send[c0:c1], bound.slots["rs-out", 0, c])
        for c, (c0, c1) in enumerate(bound.chunks[first])
    ]
    payloads = []
    for step, _, recv_block in schedule:
        chunks = bound.chunks[recv_block]
        slots = [bound.slots["rs-in", step, c] for c in range(len(chunks))]
        posted = _post(
            bound,
            outgoing,
            [
                _receive_view(bound, slot, c1 - c0)
                for slot, (c0, c1) in zip(slots, chunks, strict=True)
            ],
        )
        outgoing = []
        for c, (c0, c1) in enumerate(chunks):
            _wait(bound, posted[c])
            if step == last:
                target = out[c0 - out_start : c1 - out_start]
                bound._decode_add(slots[c], send[c0:c1], target)
                if encode_into is not None:
                    payloads.append(bound._encode(target, bound.slots[encode_into, rank, c]))
            else:
                partial = bound.scratch.partial[: c1 - c0]
                outgoing.append(
                    bound._decode_add(
                        slots[c], send[c0:c1], partial, bound.slots["rs-out", step + 1, c]
                    )
                )
        for k in range(len(chunks), len(posted)):  # sends without a receive beside them
            _wait(bound, posted[k])
    return payloads


def _allgather(bound, phase, own, buf, own_start: int, payloads: list | None = None) -> None:
    """buf[block b] = decoded block of rank b. `own` is this rank's uncompressed block, or
    None with the `payloads` the fused reduce-scatter encoded."""
    rank, last = bound.rank, bound.size - 2
    mine = bound.chunks[rank]
    if own is not None:
        payloads = [
            bound._encode(own[c0 - own_start : c1 - own_start], bound.slots["ag", rank, c])
            for c, (c0, c1) in enumerate(mine)
        ]
    # every rank, the owner included, ends with the decoded values
    decodes = [(payload, buf[c0:c1]) for payload, (c0, c1) in zip(payloads, mine, strict=True)]
    outgoing = payloads
    for step, _, recv_block in phase.schedule(rank, bound.size):
        chunks = bound.chunks[recv_block]
        slots = [bound.slots["ag", recv_block, c] for c in range(len(chunks))]
        posted = _post(
            bound,
            outgoing,
            [
                _receive_view(bound, slot, c1 - c0)
                for slot, (c0, c1) in zip(slots, chunks, strict=True)
            ],
        )
        for payload, target in decodes:  # off the wire's path: while the chunks travel
            bound._decode(payload, target)
        decodes, outgoing = [], []
        for c, (c0, c1) in enumerate(chunks):
            _wait(bound, posted[c])
            payload = slots[c][: bound._payload_len(slots[c], c1 - c0)]
            if step < last:  # forwarded untouched at the next step
                outgoing.append(payload)
            decodes.append((payload, buf[c0:c1]))
        for k in range(len(chunks), len(posted)):
            _wait(bound, posted[k])
    for payload, target in decodes:
        bound._decode(payload, target)


_WALKS = {REDUCE_INTO: _reduce_walk, COPY: _copy_walk}
