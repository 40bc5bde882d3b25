"""Baseline: the MPI library's Allgather / Reduce_scatter_block / Allreduce, or the ring.

    mpiexec -n 2 python -m ccbench.benchmarks.baseline --collective allgather -m 1:1M -f -c
"""

from __future__ import annotations

from ccbench.benchmarks.harness import Op, Variant, run_variant
from ccbench.collectives.baseline import ALGORITHMS, bind_collective
from ccbench.kernels import arrays


class Baseline(Variant):
    name = "baseline"
    description = __doc__

    def add_options(self, parser) -> None:
        parser.add_argument("--algorithm", choices=ALGORITHMS, default="mpi",
                            help="mpi: the library's collective; ring: the textbook ring "
                                 "over point-to-point calls (default mpi)")

    def columns(self, opts) -> dict:
        return {"algorithm": opts.algorithm, "codec": "none"}

    def values_matter(self, opts) -> bool:
        return False

    def library_collectives(self, opts) -> bool:
        return opts.algorithm == "mpi" and opts.buffer == "numpy"

    def make_op(self, ctx, case) -> Op:
        send = arrays.empty(case.buffer, case.send_count, case.dtype)
        recv = arrays.empty(case.buffer, case.recv_count, case.dtype)
        algorithm = ctx.opts.algorithm
        run = bind_collective(ctx.comm, algorithm, case.collective, send, recv)
        return Op(run=run, send=send, recv=recv, measures_wire=algorithm != "mpi")


def main(argv: list[str] | None = None) -> int:
    return run_variant(Baseline(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
