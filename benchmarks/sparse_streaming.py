"""Sparse streaming allreduce (OmniReduce) against its baselines, swept over densities.

    mpiexec -n 4 python -m ccbench.benchmarks.sparse_streaming -m 1M:64M --density 1,0.1,0.01 -c
    mpiexec -n 4 python -m ccbench.benchmarks.sparse_streaming --protocol stream-ahead --window 4
    mpiexec -n 4 python -m ccbench.benchmarks.sparse_streaming --algorithm dense --density paper
    mpiexec -n 6 python -m ccbench.benchmarks.sparse_streaming --aggregators 2 --density 0.1 -c

Inputs have exactly round(density x blocks) non-zero blocks per rank (--overlap random:
chosen per rank; all: the same on every rank; none: disjoint). Algorithms: omnireduce
(blocks streamed through aggregators; --protocol request-driven, the paper's, where the
aggregator asks for every block and each of its --slots slots aggregates one fused
packet at a time, or stream-ahead, where workers stream up to --window messages ahead
of the aggregator's answers), dense (the MPI library's Allreduce), dense-ring (the ring
over point-to-point calls), allgather-sparse (every rank gathers everyone's non-zero
blocks and adds them).
"""

from __future__ import annotations

import numpy as np

from ccbench.benchmarks.harness import Op, Variant, dense_reference, run_variant
from ccbench.benchmarks.options import non_negative_int, positive_int
from ccbench.benchmarks.schema_model import MEASUREMENT
from ccbench.benchmarks.schemas import SPARSE_STREAMING
from ccbench.collectives.baseline import bind_collective
from ccbench.collectives.omnireduce import OmniReduce
from ccbench.collectives.omnireduce_layout import PROTOCOLS, make_layout, stream_share
from ccbench.collectives.sparse_baselines import AllgatherSparse
from ccbench.kernels import arrays
from ccbench.kernels.errors import UsageError
from ccbench.kernels.inputs import DataKind
from ccbench.kernels.sparse import block_mask, dropped_abs_sum
from ccbench.kernels.sparse_data import OVERLAP_MODES, PAPER_DENSITIES, sparse_input
from ccbench.kernels.vocabulary import FLOAT_DTYPES, SPARSE_INDEX_BYTES, itemsize

ALGORITHMS = ("omnireduce", "dense", "dense-ring", "allgather-sparse")
SPARSE_ALGORITHMS = ("omnireduce", "allgather-sparse")
# OmniReduce's micro-benchmark densities (Fei et al. 2021)
# omnireduce defaults: slots per aggregator (request-driven); window and streams per
# aggregator (stream-ahead)
DEFAULT_SLOTS, DEFAULT_WINDOW, DEFAULT_STREAMS = 2, 4, 2
# what each call measured beyond the harness's columns: the measurements its schema table
# declares (benchmarks/schemas.py), in the table's order
STATS_COLUMNS = tuple(c.name for c in SPARSE_STREAMING.columns if c.role == MEASUREMENT)


def parse_densities(values: list[str]) -> list[float]:
    """'--density 0.1 0.5', '--density 1,0.1,0.01' or '--density paper' -> floats in [0, 1]."""
    densities: list[float] = []
    for value in values:
        for item in filter(None, (v.strip() for v in value.split(","))):
            if item == "paper":
                densities.extend(PAPER_DENSITIES)
                continue
            try:
                density = float(item)
            except ValueError:
                raise UsageError(f"--density: {item!r} is not a number") from None
            if not 0.0 <= density <= 1.0:
                raise UsageError(f"--density: {item} is outside [0, 1]")
            densities.append(density)
    if not densities:
        raise UsageError("--density needs at least one value")
    return list(dict.fromkeys(densities))


class SparseStreaming(Variant):
    name = "sparse_streaming"
    description = __doc__
    collectives = ("allreduce",)

    def add_options(self, parser) -> None:
        group = parser.add_argument_group("sparse streaming options")
        group.add_argument(
            "--algorithm", choices=ALGORITHMS, default="omnireduce", help="default omnireduce"
        )
        group.add_argument(
            "--density",
            nargs="+",
            default=["0.1"],
            metavar="D",
            help="fractions of non-zero blocks per rank, a sweep axis: "
            "'0.1', '1,0.1,0.01' or 'paper' (OmniReduce's nine; "
            "default 0.1)",
        )
        group.add_argument(
            "--block-size",
            type=positive_int,
            default=256,
            help="elements per block (default 256, as the paper)",
        )
        group.add_argument(
            "--fusion",
            type=positive_int,
            default=1024,
            help="blocks per message (default 1024; 1 = no fusion)",
        )
        group.add_argument(
            "--protocol",
            choices=PROTOCOLS,
            default="request-driven",
            help="omnireduce: request-driven (default; the paper's: a worker "
            "sends a block only when the aggregator asks for it) or "
            "stream-ahead (workers stream --window messages ahead)",
        )
        group.add_argument(
            "--slots",
            type=positive_int,
            default=None,
            help="request-driven: slots per aggregator, each aggregating one "
            f"fused packet at a time (default {DEFAULT_SLOTS})",
        )
        group.add_argument(
            "--window",
            type=positive_int,
            default=None,
            help="stream-ahead: messages in flight per stream and worker "
            f"(default {DEFAULT_WINDOW})",
        )
        group.add_argument(
            "--streams",
            type=positive_int,
            default=None,
            help=f"stream-ahead: streams per aggregator (default {DEFAULT_STREAMS})",
        )
        group.add_argument(
            "--overlap",
            choices=OVERLAP_MODES,
            default="random",
            help="which blocks are non-zero: random per rank (default), "
            "all the same, or none shared",
        )
        group.add_argument(
            "--threshold",
            type=float,
            default=0.0,
            help="a block travels only if some |x| > T (default 0: lossless)",
        )
        group.add_argument(
            "--aggregators",
            type=non_negative_int,
            default=0,
            help="omnireduce: the last K ranks only aggregate (default 0: "
            "every rank aggregates a share of the streams)",
        )

    def check_options(self, opts, ranks: int) -> None:
        opts.densities = parse_densities(opts.density)
        if opts.dtype not in FLOAT_DTYPES:
            raise UsageError(
                f"sparse_streaming sums floating-point gradients: -T one of "
                f"{', '.join(FLOAT_DTYPES)}"
            )
        if not opts.threshold >= 0:
            raise UsageError(f"--threshold must be >= 0, got {opts.threshold}")
        driven = opts.protocol == "request-driven"
        for name, value, applies in (
            ("--slots", opts.slots, driven),
            ("--window", opts.window, not driven),
            ("--streams", opts.streams, not driven),
        ):
            if value is not None and not applies:
                raise UsageError(
                    f"{name} applies to --protocol "
                    f"{'request-driven' if name == '--slots' else 'stream-ahead'} "
                    f"only (this run: {opts.protocol})"
                )
        if driven:
            opts.slots = opts.slots or DEFAULT_SLOTS
        else:
            opts.window = opts.window or DEFAULT_WINDOW
            opts.streams = opts.streams or DEFAULT_STREAMS
        if opts.aggregators:
            if opts.algorithm != "omnireduce":
                raise UsageError("--aggregators applies to --algorithm omnireduce only")
            if opts.aggregators >= ranks:
                raise UsageError(
                    f"--aggregators {opts.aggregators} leaves no worker among {ranks} ranks"
                )
        self.opts, self.ranks = opts, ranks

    def graph_refusal(self, opts) -> str | None:
        if opts.algorithm == "omnireduce":
            return "--algorithm omnireduce: its streams' headers are read on the host"
        if opts.algorithm == "allgather-sparse":
            return (
                "--algorithm allgather-sparse: its block maps are read back on the host at "
                "every step"
            )
        return None

    def columns(self, opts) -> dict:
        omni = opts.algorithm == "omnireduce"  # the protocol columns are omnireduce's only
        constant = {
            "algorithm": opts.algorithm,
            "codec": "none",
            "block_size": opts.block_size,
            "fusion": opts.fusion,
            "protocol": opts.protocol if omni else None,
            "slots": opts.slots if omni else None,
            "window": opts.window if omni else None,
            "streams": opts.streams if omni else None,
            "overlap": opts.overlap,
            "threshold": opts.threshold,
            "aggregators": opts.aggregators,
        }
        # declared here so the CSV has them; each row's values come from `stats`
        return {**constant, **dict.fromkeys(STATS_COLUMNS)}

    def configurations(self, opts) -> list[dict]:
        return [{"density": d} for d in opts.densities]

    def own_data(self, opts) -> DataKind:
        # block-sparse values made by kernels/sparse_data.py (density: its own column)
        return DataKind(f"block-sparse:overlap={opts.overlap}", "sparse", is_gradient=True)

    def values_matter(self, opts) -> bool:
        return True

    def stdout_columns(self, opts) -> list[tuple[str, str, str]]:
        extra = [
            ("Density", "density", ".4f"),
            ("Union density", "union_density", ".4f"),
            ("Wire B/rank", "wire_bytes_per_rank", ".0f"),
            ("Wire/minimum", "wire_vs_min", ".4f"),
        ]
        if opts.threshold > 0:
            extra.append(("Dropped mass", "dropped_mass_rel", ".3e"))
        return extra

    # Who holds data ------------------------------------------------------------------------

    def workers(self, ranks: int) -> int:
        return ranks - self.opts.aggregators

    def layout(self, case):
        opts = self.opts
        driven = opts.protocol == "request-driven"
        return make_layout(
            case.count,
            opts.block_size,
            case.ranks,
            opts.aggregators,
            opts.slots if driven else opts.streams,
            opts.fusion,
            opts.window or DEFAULT_WINDOW,
            opts.protocol,
        )

    def make_input(self, case, rank: int) -> np.ndarray:
        opts = self.opts
        if rank >= self.workers(case.ranks):  # a dedicated aggregator holds no data
            return np.zeros(case.send_count, dtype=np.float32)
        return sparse_input(
            case.send_count,
            opts.block_size,
            case.config["density"],
            opts.overlap,
            rank,
            self.workers(case.ranks),
            case.seed,
        )

    def validation_input(self, case, rank: int) -> np.ndarray:
        # the sparse inputs are exactly summable: -c checks the protocol on them, sparsity
        # and dedicated aggregators included (dense integers never leave a block out)
        return self.make_input(case, rank)

    def reference(self, case, inputs: list[np.ndarray]) -> np.ndarray:
        total = dense_reference(case, inputs)
        if case.rank >= self.workers(case.ranks):  # a dedicated aggregator: its streams only
            share = np.repeat(stream_share(self.layout(case), case.rank), self.opts.block_size)
            total = np.where(share[: case.count], total, 0.0)
        return total

    def error_bound(self, case, reference: np.ndarray, inputs) -> float | None:
        opts = self.opts
        if opts.threshold > 0 and opts.algorithm in SPARSE_ALGORITHMS:
            # every rank drops at most |x| <= T at any element
            return self.workers(case.ranks) * opts.threshold
        return None

    # The op --------------------------------------------------------------------------------

    def make_op(self, ctx, case) -> Op:
        comm, opts = ctx.comm, ctx.opts
        send = arrays.empty(case.buffer, case.send_count, case.dtype)
        recv = arrays.empty(case.buffer, case.recv_count, case.dtype)
        layout = self.layout(case) if opts.algorithm == "omnireduce" else None
        if opts.algorithm == "dense":
            call = comm.library_call("allreduce", send, recv)
        elif opts.algorithm == "dense-ring":
            call = bind_collective(comm, "ring", "allreduce", send, recv)
        elif opts.algorithm == "allgather-sparse":
            call = AllgatherSparse(comm, send, recv, opts.block_size, opts.threshold)
        else:
            call = OmniReduce(comm, send, recv, layout, opts.threshold)
        measured = opts.algorithm != "dense"
        last = {"wire": 0}
        run = call
        if measured:

            def run():
                before = comm.wire_bytes
                call()
                last["wire"] = comm.wire_bytes - before

        return Op(
            run=run,
            send=send,
            recv=recv,
            measures_wire=measured,
            stats=lambda: self.stats(comm, case, send, layout, last["wire"] if measured else None),
        )

    def stats(self, comm, case, send, layout, wire: int | None) -> dict:
        """Density, union density, the minimum wire volume and the dropped mass.

        Counted from the input's block bitmaps, independently of the algorithm's code.
        """
        opts = self.opts
        sparse = opts.algorithm in SPARSE_ALGORITHMS
        threshold = opts.threshold if sparse else 0.0
        block_bytes = opts.block_size * itemsize(case.dtype)
        mask_xp = block_mask(send, opts.block_size, threshold)
        mask = arrays.to_numpy(mask_xp).astype(np.uint8)
        union = comm.allreduce_array(mask, "max")
        nblocks = mask.shape[0]
        nnz = int(np.count_nonzero(mask))
        # bytes one block puts on the wire: its elements (a partial tail block only its
        # own) and its int32 position; request-driven omnireduce also its column's next
        # position (the next index each block of the paper's packets carries)
        index = SPARSE_INDEX_BYTES * (
            2 if opts.algorithm == "omnireduce" and opts.protocol == "request-driven" else 1
        )
        per_block = np.full(nblocks, block_bytes + index, dtype=np.int64)
        if case.count % opts.block_size:
            per_block[-1] = (case.count % opts.block_size) * itemsize(case.dtype) + index
        mine_min = 0
        if opts.algorithm == "omnireduce" and nblocks:
            share = stream_share(layout, comm.rank)
            if comm.rank in layout.workers:  # my blocks for other ranks' streams
                mine_min += int(per_block[mask.astype(bool) & ~share].sum())
            remote_workers = len([w for w in layout.workers if w != comm.rank])
            # every block anyone holds in my streams goes back to every remote worker
            mine_min += int(per_block[union.astype(bool) & share].sum()) * remote_workers
        nnz_bytes = int(per_block[mask.astype(bool)].sum())
        dropped = total_abs = 0.0
        if threshold > 0:
            dropped = dropped_abs_sum(send, mask_xp, opts.block_size)
            total_abs = float(np.abs(arrays.to_numpy(send).astype(np.float64)).sum())
        sums = np.array([nnz, nnz_bytes, mine_min, dropped, total_abs, wire or 0], dtype=np.float64)
        sums = comm.allreduce_array(sums, "sum")
        total_nnz, total_nnz_bytes, total_min, dropped, total_abs, total_wire = sums.tolist()
        ranks = case.ranks
        if opts.algorithm == "omnireduce":
            min_per_rank = total_min / ranks
        elif opts.algorithm == "allgather-sparse":
            # each rank's blocks cross P-1 links of the ring
            min_per_rank = (ranks - 1) * total_nnz_bytes / ranks
        else:
            min_per_rank = 2 * (ranks - 1) / ranks * case.count * itemsize(case.dtype)
        data_ranks = self.workers(ranks)
        return {
            "nonzero_density": total_nnz / (data_ranks * nblocks) if nblocks else 0.0,
            "union_density": float(np.count_nonzero(union)) / nblocks if nblocks else 0.0,
            "wire_min_bytes_per_rank": int(round(min_per_rank)),
            "wire_vs_min": (
                total_wire / ranks / min_per_rank if wire is not None and min_per_rank > 0 else None
            ),
            "dropped_mass": dropped if threshold > 0 else None,
            "dropped_mass_rel": (dropped / total_abs if total_abs > 0 else 0.0)
            if threshold > 0
            else None,
        }


def main(argv: list[str] | None = None) -> int:
    return run_variant(SparseStreaming(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
