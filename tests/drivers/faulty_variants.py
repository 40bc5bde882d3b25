"""Variants that misbehave on purpose, to test how the harness reports failures.

python -m tests.drivers.faulty_variants wrong|die|raise|overbound [harness options]
"""

from __future__ import annotations

import os
import sys

from ccbench.benchmarks.baseline import Baseline
from ccbench.benchmarks.coll_compressed import CollCompressed
from ccbench.benchmarks.harness import Op, run_variant
from ccbench.kernels.codecs import parse_codec


class WrongResult(Baseline):
    """The library's collective, then one element spoiled on the last rank."""

    name = "wrong_result"

    def make_op(self, ctx, case) -> Op:
        op = super().make_op(ctx, case)
        inner, recv, last = op.run, op.recv, ctx.comm.rank == ctx.comm.size - 1

        def run():
            inner()
            if last:
                recv[0] += 1

        return Op(run=run, send=op.send, recv=recv, measures_wire=False)


class FailingRank(Baseline):
    """Rank 1 fails at its fifth call, in the middle of the timed loop."""

    name = "failing_rank"

    def __init__(self, fail):
        self.fail = fail

    def make_op(self, ctx, case) -> Op:
        op = super().make_op(ctx, case)
        inner, calls, fail = op.run, [0], self.fail

        def run():
            calls[0] += 1
            if ctx.comm.rank == 1 and calls[0] == 5:
                fail()
            inner()

        return Op(run=run, send=op.send, recv=op.recv, measures_wire=False)


class OverBound(CollCompressed):
    """States fp16's error bound (the --codec default) but sends bf16: 3 fewer mantissa
    bits, so its error is 4 to 8 times that bound, never 10 (a wiring bug, not a crash)."""

    name = "over_bound"

    def make_op(self, ctx, case) -> Op:
        stated, self.codec = self.codec, parse_codec("bf16")
        try:
            return super().make_op(ctx, case)
        finally:
            self.codec = stated


def _die():
    os._exit(9)  # no word, no MPI_Finalize: as a killed rank


def _raise():
    raise RuntimeError("injected failure")


def _interrupt():
    raise KeyboardInterrupt  # Ctrl-C reaching one rank


VARIANTS = {
    "wrong": WrongResult,
    "die": lambda: FailingRank(_die),
    "raise": lambda: FailingRank(_raise),
    "interrupt": lambda: FailingRank(_interrupt),
    "overbound": OverBound,
}

if __name__ == "__main__":
    sys.exit(run_variant(VARIANTS[sys.argv[1]](), sys.argv[2:]))
