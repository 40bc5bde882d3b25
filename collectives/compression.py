"""A run's compression setting: the codec, the pipeline's chunk and error feedback.

The options layer parses it once (benchmarks/options.py: ``add_compression`` declares
``--codec``, ``--chunk-bytes`` and ``--error-feedback``; ``compression_of`` parses them)
and the run hands this object down (the compressed variants, ``TrainConfig``,
``GradientCommSpec``, ``ReplaySpec``); nothing below parses the codec again.

``--chunk-bytes`` means one thing everywhere: uncompressed bytes per pipelined chunk of
the collective-level compressed ring; ``0`` one chunk per ring block (no pipelining);
``auto`` chosen per size from rates measured at start-up (coll_compressed only); not
given, ``DEFAULT_CHUNK_BYTES`` (or auto for coll_compressed's ring over NCCL).
"""

from __future__ import annotations

from dataclasses import dataclass

from ccbench.collectives.chunking import DEFAULT_CHUNK_BYTES
from ccbench.kernels.codec_base import Codec

AUTO = "auto"  # --chunk-bytes auto


@dataclass(frozen=True)
class Compression:
    """``codec``: the parsed codec (None: the run sends uncompressed data); ``chunk_bytes``:
    --chunk-bytes as given (None: not given, the default; 0: one chunk per block; AUTO);
    ``error_feedback``: carry the gradient codec's error to the next step; ``hook``:
    ``--variant torch``'s own DDP compression hook (none, fp16, bf16, powersgd)."""

    codec: Codec | None = None
    chunk_bytes: int | str | None = None
    error_feedback: bool = False
    hook: str = "none"

    @property
    def spec(self) -> str:
        """The codec as the rows spell it: the canonical spec, torch's hook, or none."""
        return self.codec.spec if self.codec is not None else self.hook

    @property
    def lossy(self) -> bool:
        return self.codec is not None and self.codec.lossy

    def chunk(self, auto_default: bool = False) -> int | str:
        """The chunk the pipeline runs: --chunk-bytes, or the default when not given (the
        one place it is applied; ``auto_default``: the default is AUTO, coll_compressed's
        ring over NCCL)."""
        if self.chunk_bytes is not None:
            return self.chunk_bytes
        return AUTO if auto_default else DEFAULT_CHUNK_BYTES

    def bind_options(self, kind: str) -> dict:
        """bind_compressed's keyword options for this schedule: the collective-level ring's
        chunk (the other schedules do not pipeline)."""
        return {"chunk_bytes": self.chunk()} if kind == "coll" else {}


UNCOMPRESSED = Compression()  # no codec, the default chunk, no error feedback
