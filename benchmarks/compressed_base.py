"""What both compressed variants share: the codec option, inputs, error bounds, row stats.

A shared base beside the harness (nccl-tests' shape): `p2p_compressed` and
`coll_compressed` each only say which schedule they run and their own options.
"""

from __future__ import annotations

import numpy as np

from ccbench.benchmarks.harness import Op, Variant, exact_input, gradient_like_input
from ccbench.benchmarks.options import parse_size
from ccbench.collectives.compressed import bind_compressed, compressions_on_path, error_bound
from ccbench.kernels import arrays
from ccbench.kernels.codecs import parse_codec
from ccbench.kernels.vocabulary import COLLECTIVES

DEFAULT_CODEC = "fp16"


def size_option(text: str) -> int:
    """A byte count with an optional K, M or G suffix (as -m takes)."""
    return parse_size(text)


class CompressedVariant(Variant):
    """What both compressed variants share: the codec, inputs, bounds and row stats."""

    kind = ""  # the collectives.compressed schedule: "p2p" or "coll"
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
