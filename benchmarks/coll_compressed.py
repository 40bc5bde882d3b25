"""Collective-level compressed ring collectives (seed 000, a reconstruction).

    mpiexec -n 4 python -m ccbench.benchmarks.coll_compressed --collective reduce_scatter \\
        --codec bfp:rate=8 --chunk-bytes 1M -m 1K:16M -c

Allgather: each rank compresses its block once; the compressed bytes travel the ring
untouched and are decompressed while the next chunks are on the wire (every rank,
the owner included, ends with the same decoded values). Reduce-scatter: a chunked ring
that decompresses, reduces and recompresses partial sums, one chunk's codec work
overlapping other chunks' transfers (non-blocking sends and receives). Allreduce:
that reduce-scatter, then that allgather. --chunk-bytes sets the pipeline's chunk of
uncompressed data (0: one chunk per block).

Codecs (--codec):
"""

from __future__ import annotations

from ccbench.benchmarks.compressed_base import CompressedVariant, size_option
from ccbench.benchmarks.harness import run_variant
from ccbench.collectives.compressed import DEFAULT_CHUNK_BYTES
from ccbench.kernels.codecs import describe_codecs
from ccbench.kernels.errors import UsageError


class CollCompressed(CompressedVariant):
    name = "coll_compressed"
    description = __doc__ + describe_codecs()
    kind = "coll"

    def add_variant_options(self, group) -> None:
        group.add_argument(
            "--chunk-bytes", type=size_option, default=DEFAULT_CHUNK_BYTES, metavar="BYTES",
            help=f"uncompressed bytes per pipelined chunk (default "
                 f"{DEFAULT_CHUNK_BYTES // 1024}K; 0: one chunk per block)")

    def check_options(self, opts, ranks: int) -> None:
        super().check_options(opts, ranks)
        if opts.chunk_bytes < 0:
            raise UsageError("--chunk-bytes must not be negative")

    def options(self, opts) -> dict:
        return {"chunk_bytes": opts.chunk_bytes}

    def columns(self, opts) -> dict:
        return {**super().columns(opts), "chunk_bytes": opts.chunk_bytes}


def main(argv: list[str] | None = None) -> int:
    return run_variant(CollCompressed(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
