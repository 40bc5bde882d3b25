"""A made-up addition of each kind, written into a scratch copy of the tree as a maintainer
would write it (tests/test_extension_cost.py counts the files each one touches).

Each addition is a list of edits: (file, anchor, text) inserts `text` after the first
`anchor` in an existing file (an anchor that is gone fails the test: the recipe in
docs/architecture.md has moved), (file, None, text) writes a new file.
"""

from __future__ import annotations

from pathlib import Path

# A collective built of existing phases: the allreduce's phases under a name of its own.
COLLECTIVE = [
    ("kernels/vocabulary.py", '"allreduce"', ', "sum_all"'),
    (
        "collectives/spec.py",
        'param_names=("all_reduce",),\n        ),',
        """
        CollectiveSpec(
            "sum_all",
            "Sum_all",
            "Sum-All",
            "Size = the whole buffer",
            reduces=True,
            busbw=lambda n: 2 * (n - 1) / n,
            ring_hops=lambda n: 2 * (n - 1),
            counts=_whole,
            recv_count=lambda sent, n: sent,
            reference=_sum,
            min_count=lambda n: 0,
            ring_block_is_send=False,
            coll_codec_blocks=lambda n: (2, n, n - 2),
            phases=(REDUCE, GATHER),
            counts_of_whole=lambda n, p: (n, n),
            send_multiple=lambda n: 1,
            mpi_call="Allreduce",
            mpi_arguments=MPI_ARGS_REDUCED,
            mpi_count=lambda send, recv, n: send,
            torch_calls=("all_reduce",),
            in_place=True,
            mpi_in_place=True,
            staged_pieces=PIECES_ELEMENTWISE,
            streams_sparse=False,
            param_names=("sum_all",),
        ),""",
    ),
]

# A new phase, alltoall's exchange (a new step: block d straight to rank d), and the
# collective made of it; the uncompressed ring walks it, the compressed walks refuse it.
PHASE = [
    (
        "collectives/phases.py",
        'COPY = Step("copy", reduces=False, forwards=True, holds_every_block=True)',
        '\nEXCHANGE = Step("exchange", reduces=False, forwards=False, holds_every_block=True)',
    ),
    (
        "collectives/phases.py",
        'GATHER = Phase("gather", gather_schedule, COPY, tag=1)',
        '''


def exchange_schedule(rank: int, size: int):
    """(step, send_block, recv_block): block d of the input straight to rank d, block s
    of the result from rank s."""
    for step in range(size - 1):
        yield step, (rank + step + 1) % size, (rank - step - 1) % size


EXCHANGE_PHASE = Phase(
    "exchange", exchange_schedule, EXCHANGE, path_hops=lambda size: 1, tag=2
)''',
    ),
    ("kernels/vocabulary.py", '"allreduce"', ', "alltoall"'),
    (
        "collectives/spec.py",
        "    return total[rank * block : (rank + 1) * block]\n",
        """

def _exchanged(inputs, rank: int, dtype=np.float64):
    \"\"\"Block `rank` of every rank's input, in rank order.\"\"\"
    block = inputs[0].shape[0] // len(inputs)
    return np.concatenate([x[rank * block : (rank + 1) * block] for x in inputs]).astype(dtype)
""",
    ),
    (
        "collectives/spec.py",
        'param_names=("all_reduce",),\n        ),',
        """
        CollectiveSpec(
            "alltoall",
            "Alltoall",
            "All-to-All",
            "Size = the whole send buffer; block d goes to rank d",
            reduces=False,
            busbw=lambda n: (n - 1) / n,
            ring_hops=lambda n: n - 1,
            counts=_whole,
            recv_count=lambda sent, n: sent,
            reference=_exchanged,
            min_count=lambda n: n,
            ring_block_is_send=False,
            coll_codec_blocks=lambda n: (n - 1, n - 1, 0),
            phases=(EXCHANGE_PHASE,),
            counts_of_whole=lambda n, p: (n, n),
            send_multiple=lambda n: n,
            mpi_call="Alltoall",
            mpi_arguments=MPI_ARGS_GATHERED,
            mpi_count=lambda send, recv, n: send // n,
            torch_calls=("all_to_all_single",),
            in_place=False,
            mpi_in_place=False,
            staged_pieces=PIECES_WHOLE,
            streams_sparse=False,
            param_names=("all_to_all",),
        ),""",
    ),
    (
        "collectives/spec.py",
        "from ccbench.collectives.phases import ",
        "EXCHANGE_PHASE, ",
    ),
    (
        "collectives/ring.py",
        "_WALKS = {REDUCE_INTO: _reduce_walk, COPY: _copy_walk}",
        '''


def _exchange_walk(comm, phase, sendbuf, recvbuf, bounds, held, own, scratch):
    """The exchange step's walk: this rank's own block in place, then block d of the
    input straight to rank d, block s of the result from rank s."""
    copy_into(own, held)
    for _, send_block, recv_block in phase.schedule(comm.rank, comm.size):
        s0, s1 = bounds[send_block]
        r0, r1 = bounds[recv_block]
        comm.sendrecv(sendbuf[s0:s1], send_block, recvbuf[r0:r1], recv_block)
    return recvbuf


_WALKS[EXCHANGE] = _exchange_walk''',
    ),
    ("collectives/ring.py", "from ccbench.collectives.phases import (", "\n    EXCHANGE,"),
]

# A variant registered in the registry: the hand-written ring of every collective.
VARIANT = [
    (
        "kernels/variants.py",
        "REGISTRY = (",
        """
    VariantInfo(
        "ring_echo",
        "ring echo",
        "echo",
        90,
        "a made-up variant: the hand-written ring",
        harness=True,
        rows="harness",
    ),""",
    ),
    (
        "benchmarks/ring_echo.py",
        None,
        '''"""A made-up variant: the hand-written ring of every collective."""

from __future__ import annotations

from ccbench.benchmarks.harness import Op, Variant, run_variant
from ccbench.collectives.baseline import bind_collective
from ccbench.kernels import arrays


class RingEcho(Variant):
    name = "ring_echo"
    description = __doc__

    def columns(self, opts) -> dict:
        return {"algorithm": "ring", "codec": "none"}

    def values_matter(self, opts) -> bool:
        return False

    def make_op(self, ctx, case) -> Op:
        send = arrays.empty(case.buffer, case.send_count, case.dtype)
        recv = arrays.empty(case.buffer, case.recv_count, case.dtype)
        run = bind_collective(ctx.comm, "ring", case.collective, send, recv)
        return Op(run=run, send=send, recv=recv, measures_wire=True)


def main(argv: list[str] | None = None) -> int:
    return run_variant(RingEcho(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
''',
    ),
    (
        "docs/exit-status.md",
        "| program | status | when | test |\n|---|---|---|---|\n",
        "| `ring_echo` | 0 | every size ran | "
        "`tests/test_harness_cli.py::test_full_validated_sweep_writes_osu_rows_csv_and_json` |\n",
    ),
]

# A transport: one rank looping its messages back, chosen by --transport loop.
TRANSPORT = [
    (
        "collectives/comm_loop.py",
        None,
        '''"""A made-up transport: one rank, whose messages come back to itself."""

from __future__ import annotations

import numpy as np

from ccbench.collectives.communicator import BaseCommunicator
from ccbench.kernels.reduce import copy_into
from ccbench.kernels.vocabulary import nbytes


class LoopCommunicator(BaseCommunicator):
    transport = "loop"
    backend = "loop"

    def __init__(self):
        super().__init__(0, 1, 0)

    def sendrecv(self, sendbuf, dest, recvbuf, source, tag=0):
        copy_into(recvbuf, sendbuf)
        self.wire_bytes += nbytes(sendbuf)

    def barrier(self):
        pass

    def allgather_obj(self, obj):
        return [obj]

    def allreduce_array(self, array, op="sum"):
        return np.array(array)
''',
    ),
    ("benchmarks/options.py", 'TRANSPORTS = ("mpi", "torch"', ', "loop"'),
    (
        "benchmarks/options.py",
        '    """opts.backend from --transport and the buffer; UsageError where it cannot run."""',
        """
    if opts.transport == "loop":
        opts.backend = "loop"
        return""",
    ),
    (
        "collectives/launch.py",
        '    from it (its rendezvous over MPI). Collective."""\n',
        """    if transport == "loop":
        from ccbench.collectives.comm_loop import LoopCommunicator

        return LoopCommunicator()
""",
    ),
]

ADDITIONS = {
    "collective": COLLECTIVE,
    "phase": PHASE,
    "variant": VARIANT,
    "transport": TRANSPORT,
}


def apply(root: Path, edits) -> set[str]:
    """Write `edits` into the tree at `root`; the files they touched."""
    touched = set()
    for name, anchor, text in edits:
        path = root / name
        if anchor is None:
            assert not path.exists(), f"{name} exists already"
            path.write_text(text)
        else:
            old = path.read_text()
            assert anchor in old, f"{name}: no {anchor!r} (the recipe has moved)"
            at = old.index(anchor) + len(anchor)
            path.write_text(old[:at] + text + old[at:])
        touched.add(name)
    return touched
