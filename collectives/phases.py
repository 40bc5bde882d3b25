"""The ring's phases, declared once: each is an object with its schedule (which block a
rank sends and receives at each step) and its step (what the rank does with a block it
receives). A collective is a list of phases (its `phases` in collectives/spec.py), and
every walk of them (the uncompressed ring, the compressed rings, the posting-order
pipeline, the library-backed collectives, the error model) reads these objects instead
of branching on a phase's name.

Rank r sends to r+1 and receives from r-1. The reduce phase (reduce-scatter's P-1 hops)
ends with rank r holding block r of the sum; the gather phase (allgather's P-1 hops)
forwards every rank's block around the ring. A new phase built of an existing step (a
new schedule of copies, say) needs its entry here only; one with a new step (alltoall's
exchange: each rank sends block d straight to rank d) also needs that step in each walk
that should run it, and a walk without it refuses the collective in one line
(`step_walk`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from ccbench.kernels.errors import UsageError


@dataclass(frozen=True)
class Step:
    """What a rank does with a block it receives at one step of a phase."""

    name: str
    # the received block is added to this rank's own input of it, and the sum is sent on
    # at the next step (the last step's sum is this rank's block of the result)
    reduces: bool
    # the received block is stored in its place in the result and sent on unchanged at
    # the next step (a compressed payload can be forwarded without decoding)
    forwards: bool
    # after the phase every rank holds every block of the result (the rank's own block
    # then lies in its place in the receive buffer, not over all of it)
    holds_every_block: bool


REDUCE_INTO = Step("reduce into", reduces=True, forwards=False, holds_every_block=False)
COPY = Step("copy", reduces=False, forwards=True, holds_every_block=True)

Schedule = Callable[[int, int], Iterator[tuple[int, int, int]]]


def gather_schedule(rank: int, size: int) -> Iterator[tuple[int, int, int]]:
    """(step, send_block, recv_block): forward the block received at the previous step."""
    for step in range(size - 1):
        yield step, (rank - step) % size, (rank - step - 1) % size


def reduce_schedule(rank: int, size: int) -> Iterator[tuple[int, int, int]]:
    """(step, send_block, recv_block): send a partial sum, receive the next one to add to."""
    for step in range(size - 1):
        yield step, (rank - step - 1) % size, (rank - step - 2) % size


@dataclass(frozen=True)
class Phase:
    """One phase of a ring collective: its schedule and its step."""

    name: str
    schedule: Schedule
    step: Step
    # hops a block travels from the rank it starts on to the last rank it reaches on P
    # ranks: a codec that re-encodes every message encodes it this many times
    path_hops: Callable[[int], int] = lambda size: size - 1
    # its messages' tag block, one per phase: collectives in flight at once on one
    # communicator (FSDP gathers the next layer while a reduce-scatter runs) never match
    # each other's messages, as they would if tags followed a phase's place in its call
    tag: int = 0

    def sent_blocks(self, rank: int, size: int) -> list[int]:
        """The blocks this rank sends, one per step."""
        return [send for _, send, _ in self.schedule(rank, size)]


REDUCE = Phase("reduce", reduce_schedule, REDUCE_INTO, tag=0)
GATHER = Phase("gather", gather_schedule, COPY, tag=1)
PHASES = {phase.name: phase for phase in (REDUCE, GATHER)}


def fuses(first: Phase, second: Phase) -> bool:
    """Whether `second` can start on each chunk `first` finishes: a reduce's last step
    leaves this rank's block of the sum, which a forwarding phase sends first."""
    return first.step.reduces and second.step.forwards


def step_walk(walks: Mapping[Step, Callable], phase: Phase, walker: str) -> Callable:
    """The walk of `phase`'s step in `walks` (one walker's table of steps); UsageError,
    naming the walker, the phase and its step, where the walker has none."""
    try:
        return walks[phase.step]
    except KeyError:
        raise UsageError(
            f"{walker} cannot run the {phase.name} phase (its step, {phase.step.name}, "
            f"has no walk there)"
        ) from None
