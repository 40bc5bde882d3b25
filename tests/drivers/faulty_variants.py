"""Variants that misbehave on purpose, to test how the harness reports failures.

    python -m tests.drivers.faulty_variants wrong|die|raise [harness options]
"""

from __future__ import annotations

import os
import sys

from benchmarks.baseline import Baseline
from benchmarks.harness import Op, run_variant


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


class DyingRank(Baseline):
    """Rank 1 exits without a word in the middle of the timed loop."""

    name = "dying_rank"

    def make_op(self, ctx, case) -> Op:
        op = super().make_op(ctx, case)
        inner, calls = op.run, [0]

        def run():
            calls[0] += 1
            if ctx.comm.rank == 1 and calls[0] == 5:
                os._exit(9)
            inner()

        return Op(run=run, send=op.send, recv=op.recv, measures_wire=False)


class RaisingRank(Baseline):
    """Rank 1 raises an unexpected error in the middle of the timed loop."""

    name = "raising_rank"

    def make_op(self, ctx, case) -> Op:
        op = super().make_op(ctx, case)
        inner, calls = op.run, [0]

        def run():
            calls[0] += 1
            if ctx.comm.rank == 1 and calls[0] == 5:
                raise RuntimeError("injected failure")
            inner()

        return Op(run=run, send=op.send, recv=op.recv, measures_wire=False)


VARIANTS = {"wrong": WrongResult, "die": DyingRank, "raise": RaisingRank}

if __name__ == "__main__":
    sys.exit(run_variant(VARIANTS[sys.argv[1]](), sys.argv[2:]))
