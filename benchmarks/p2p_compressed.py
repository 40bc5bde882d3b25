"""Point-to-point compressed ring collectives: every message compressed by its sender.

    mpiexec -n 4 python -m ccbench.benchmarks.p2p_compressed --collective allgather \\
        --codec bfp:rate=8 -m 1K:16M -c

Each ring hop encodes the block it sends and decodes the block it receives (messages
under --threshold bytes travel uncompressed), as an MPI library compressing its
point-to-point messages would. Rows report the bytes each rank put on the wire, the
achieved compression ratio against the uncompressed ring, and the max absolute and
relative error against the uncompressed result (lossy codecs: on every size).

Codecs (--codec):
"""

from __future__ import annotations

from ccbench.benchmarks.compressed_base import CompressedVariant
from ccbench.benchmarks.harness import run_variant
from ccbench.benchmarks.options import parse_size
from ccbench.kernels.codecs import describe_codecs
from ccbench.kernels.errors import UsageError


class P2PCompressed(CompressedVariant):
    name = "p2p_compressed"
    description = __doc__ + describe_codecs()
    kind = "p2p"

    def add_variant_options(self, group) -> None:
        group.add_argument(
            "--threshold",
            type=parse_size,
            default=0,
            metavar="BYTES",
            help="send messages smaller than this uncompressed (the product's default "
            "is 1M; default here 0: compress everything)",
        )

    def check_options(self, opts, ranks: int) -> None:
        super().check_options(opts, ranks)
        if opts.threshold < 0:
            raise UsageError("--threshold must not be negative")

    def options(self, opts, case) -> dict:
        return {"threshold": opts.threshold}

    def columns(self, opts) -> dict:
        return {**super().columns(opts), "threshold_bytes": opts.threshold}


def main(argv: list[str] | None = None) -> int:
    return run_variant(P2PCompressed(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
