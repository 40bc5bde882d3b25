"""Baseline: the library's own Allgather / Reduce_scatter_block / Allreduce, or the ring.

    mpiexec -n 2 python -m ccbench.benchmarks.baseline --collective allgather -m 1:1M -f -c
    mpiexec -n 2 python -m ccbench.benchmarks.baseline --transport torch -m 1:1M -c

The library is the transport's: MPI's (--algorithm mpi, the default over MPI) or
torch.distributed's (--algorithm library, the default with --transport torch: NCCL's or
gloo's all-gather, reduce-scatter and all-reduce).
"""

from __future__ import annotations

from ccbench.benchmarks.harness import Op, Variant, run_variant
from ccbench.benchmarks.hierarchy import (
    add_hierarchy_options,
    bind_hierarchical,
    check_hierarchy,
    hierarchical_algorithm,
    is_hierarchical,
)
from ccbench.benchmarks.options import resolve_algorithm
from ccbench.collectives.baseline import ALGORITHMS, bind_collective
from ccbench.kernels import arrays


class Baseline(Variant):
    name = "baseline"
    description = __doc__

    def add_options(self, parser) -> None:
        parser.add_argument(
            "--algorithm",
            choices=ALGORITHMS,
            default=None,
            help="mpi: MPI's own collective (the default over MPI); library: "
            "the transport library's own (the default with --transport "
            "torch); ring: the textbook ring over point-to-point calls; with "
            "--hierarchy node or leader, the collective across nodes",
        )
        add_hierarchy_options(parser)

    def check_options(self, opts, ranks: int) -> None:
        opts.algorithm = resolve_algorithm(opts.algorithm, opts.transport)
        check_hierarchy(opts, ranks)

    def columns(self, opts) -> dict:
        return {"algorithm": hierarchical_algorithm(opts, opts.algorithm), "codec": "none"}

    def values_matter(self, opts) -> bool:
        return False

    def library_collectives(self, opts) -> bool:
        return opts.algorithm == "mpi" and opts.buffer == "numpy" and opts.hierarchy == "flat"

    def make_op(self, ctx, case) -> Op:
        send = arrays.empty(case.buffer, case.send_count, case.dtype)
        recv = arrays.empty(case.buffer, case.recv_count, case.dtype)
        algorithm = ctx.opts.algorithm
        if is_hierarchical(ctx.opts):  # the same shape as the compressed one's, uncompressed

            def bind_inter(inter, s, r):
                return bind_collective(inter, algorithm, case.collective, s, r)

            run = bind_hierarchical(ctx.comm, ctx.opts, case.collective, send, recv, bind_inter)
        else:
            run = bind_collective(ctx.comm, algorithm, case.collective, send, recv)
        return Op(run=run, send=send, recv=recv, measures_wire=algorithm == "ring")


def main(argv: list[str] | None = None) -> int:
    return run_variant(Baseline(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
