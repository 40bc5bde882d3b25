"""Point-to-point compressed ring collectives: every message compressed by its sender.

    mpiexec -n 4 python -m benchmarks.p2p_compressed --collective allgather \\
        --codec bfp:rate=8 -m 1K:16M -c

Each ring hop encodes the block it sends and decodes the block it receives (messages
under --threshold bytes travel uncompressed), as an MPI library compressing its
point-to-point messages would. Rows report the bytes each rank put on the wire, the
achieved compression ratio against the uncompressed ring, and the max absolute and
relative error against the uncompressed result (lossy codecs: on every size).

Codecs (--codec):
"""

from __future__ import annotations

import numpy as np

from benchmarks.errors import UsageError
from benchmarks.harness import Op, Variant, exact_input, gradient_like_input, run_variant
from benchmarks.options import parse_size
from collectives.compressed import (
    COLLECTIVES,
    bind_compressed,
    compressions_on_path,
    error_bound,
)
from kernels import arrays
from kernels.codecs import describe_codecs, parse_codec

DEFAULT_CODEC = "fp16"


def size_option(text: str) -> int:
    """A byte count with an optional K, M or G suffix (as -m takes)."""
    return parse_size(text)


class CompressedVariant(Variant):
    """What both compressed variants share: the codec, inputs, bounds and row stats."""

    kind = "p2p"  # collectives.compressed variant
    collectives = COLLECTIVES

    def __init__(self):
        self.codec = None
        self.ranks = 1

    def add_options(self, parser) -> None:
        group = parser.add_argument_group("compression")
        group.add_argument("--codec", default=DEFAULT_CODEC, metavar="SPEC",
                           help=f"codec spec (default {DEFAULT_CODEC}); see above")
        self.add_variant_options(group)

    def add_variant_options(self, group) -> None:
        """The variant's own options, in the compression group."""

    def check_options(self, opts, ranks: int) -> None:
        self.ranks = ranks
        self.codec = parse_codec(opts.codec)
        self.codec.check_supported(opts.buffer, opts.dtype)
        # lossy codecs: the error columns are filled on every size, not only with -c
        self.always_measure_error = self.codec.lossy

    def options(self, opts) -> dict:
        """Keyword options of the bound collective."""
        return {}

    def columns(self, opts) -> dict:
        # compressions: encode/decode round trips on the worst element's path
        return {"algorithm": "ring", "codec": self.codec.spec,
                "compressions": compressions_on_path(self.kind, opts.collective, self.ranks)}

    def stdout_columns(self, opts) -> list[tuple[str, str, str]]:
        columns = [("Ratio", "compression_ratio", ".3f")]
        if self.codec.lossy:
            columns.append(("MaxRelErr", "max_rel_err", ".3e"))
        return columns

    def make_op(self, ctx, case) -> Op:
        comm = ctx.comm
        send = arrays.empty(case.buffer, case.send_count, case.dtype)
        recv = arrays.empty(case.buffer, case.recv_count, case.dtype)
        run = bind_compressed(comm, self.kind, case.collective, self.codec, send, recv,
                              **self.options(ctx.opts))

        def stats() -> dict:
            # the harness ran one more call just before and left its bytes in the counter
            raw = comm.mpi.allreduce(run.raw_bytes)
            wire = comm.mpi.allreduce(comm.wire_bytes)
            return {"compression_ratio": raw / wire if wire else float("nan")}

        return Op(run=run, send=send, recv=recv, stats=stats)

    def make_input(self, case, rank: int) -> np.ndarray:
        # lossless codecs must reproduce the exact sum in any order: small integers;
        # lossy ones see gradient-like values, where their error shows
        if self.codec.lossy:
            return gradient_like_input(case, rank)
        return exact_input(case, rank)

    def error_bound(self, case, reference) -> float | None:
        if not self.codec.lossy:
            return None
        amaxes = [_amax_as(self.make_input(case, r), case.dtype) for r in range(case.ranks)]
        return error_bound(self.codec, self.kind, case.collective, amaxes, case.dtype)


def _amax_as(values: np.ndarray, dtype: str) -> float:
    """max|x| of the values as the benchmark buffer holds them (rounded to dtype)."""
    held = arrays.to_numpy(arrays.from_numpy("torch" if dtype == "bfloat16" else "numpy",
                                             values, dtype))
    return float(np.abs(held.astype(np.float64)).max()) if held.size else 0.0


class P2PCompressed(CompressedVariant):
    name = "p2p_compressed"
    description = __doc__ + describe_codecs()
    kind = "p2p"

    def add_variant_options(self, group) -> None:
        group.add_argument(
            "--threshold", type=size_option, default=0, metavar="BYTES",
            help="send messages smaller than this uncompressed (the product's default "
                 "is 1M; default here 0: compress everything)")

    def check_options(self, opts, ranks: int) -> None:
        super().check_options(opts, ranks)
        if opts.threshold < 0:
            raise UsageError("--threshold must not be negative")

    def options(self, opts) -> dict:
        return {"threshold": opts.threshold}

    def columns(self, opts) -> dict:
        return {**super().columns(opts), "threshold_bytes": opts.threshold}

if __name__ == "__main__":
    raise SystemExit(run_variant(P2PCompressed()))
