"""What both compressed variants share: the codec option, inputs, error bounds, row stats.

A shared base beside the harness (nccl-tests' shape): `p2p_compressed` and
`coll_compressed` each only say which schedule they run and their own options.
"""

from __future__ import annotations

import numpy as np

from ccbench.benchmarks.harness import Op, Variant, held
from ccbench.benchmarks.options import parse_size
from ccbench.collectives.compressed import bind_compressed, compressions_on_path, error_bound
from ccbench.kernels import arrays, inputs
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

    def validation_input(self, case, rank: int) -> np.ndarray:
        # a lossy codec is exact on small integers, which would leave its bound untested:
        # it is validated on values spread over many magnitudes, against that bound
        kind = "gradient-like" if self.codec.lossy else "exact"
        return inputs.values(kind, case.send_count, rank, case.ranks, case.seed)

    def error_bound(self, case, reference, inputs) -> float | None:
        if not self.codec.lossy:
            return None
        amaxes = [float(np.abs(held(x, case.dtype)).max()) if x.size else 0.0 for x in inputs]
        return error_bound(self.codec, self.kind, case.collective, amaxes, case.dtype)
