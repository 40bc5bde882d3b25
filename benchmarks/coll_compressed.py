"""Collective-level compressed ring collectives (seed 000, a reconstruction).

    mpiexec -n 4 python -m ccbench.benchmarks.coll_compressed --collective reduce_scatter \\
        --codec bfp:rate=8 --chunk-bytes 1M -m 1K:16M -c

Allgather: each rank compresses its block once; the compressed bytes travel the ring
untouched and are decompressed while the next chunks are on the wire (every rank,
the owner included, ends with the same decoded values). Reduce-scatter: a chunked ring
that decompresses, reduces and recompresses partial sums, one chunk's codec work
overlapping other chunks' transfers (non-blocking sends and receives). Allreduce: one
pipeline of both (--no-fuse: that reduce-scatter, then that allgather). --chunk-bytes
sets the pipeline's chunk of uncompressed data (0: one chunk per block; auto: from the
block size, the codec's ratio and the emulated link rate). --progress and
--codec-threads choose how MPI keeps moving bytes while the codec works; MPICH's own
progress thread is asked for with MPIR_CVAR_ASYNC_PROGRESS=1 in the launch environment.
Every row carries the time breakdown of the timed calls on the critical rank and the
pipeline's floor (docs/compression.md).

Codecs (--codec):
"""

from __future__ import annotations

from ccbench.benchmarks.compressed_base import CompressedVariant, link_goodput_gbps, size_option
from ccbench.benchmarks.harness import run_variant
from ccbench.collectives.compressed import DEFAULT_CHUNK_BYTES, auto_chunk_bytes
from ccbench.collectives.pipeline import (
    DEFAULT_PROGRESS,
    DEFAULT_WAIT,
    PROGRESS_MODES,
    WAIT_MODES,
    async_progress,
)
from ccbench.kernels.codecs import describe_codecs
from ccbench.kernels.errors import UsageError
from ccbench.kernels.vocabulary import itemsize

AUTO = "auto"


def chunk_option(text: str):
    return AUTO if text.strip().lower() == AUTO else size_option(text)


def block_bytes(case) -> int:
    """Bytes of one ring block of this case (what the pipeline cuts into chunks)."""
    count = {"allgather": case.send_count, "reduce_scatter": case.recv_count,
             "allreduce": -(-case.send_count // case.ranks)}[case.collective]
    return count * itemsize(case.dtype)


class CollCompressed(CompressedVariant):
    name = "coll_compressed"
    description = __doc__ + describe_codecs()
    kind = "coll"

    def add_variant_options(self, group) -> None:
        group.add_argument(
            "--chunk-bytes", type=chunk_option, default=DEFAULT_CHUNK_BYTES, metavar="BYTES",
            help=f"uncompressed bytes per pipelined chunk (default "
                 f"{DEFAULT_CHUNK_BYTES // 1024}K; 0: one chunk per block; auto: chosen per "
                 "size from the block, the codec's ratio and the link rate)")
        group.add_argument(
            "--progress", choices=PROGRESS_MODES, default=DEFAULT_PROGRESS,
            help="how MPI progresses while the codec works: chunk (between chunks only) "
                 f"or testall (Testall between sub-chunks); default {DEFAULT_PROGRESS}")
        group.add_argument(
            "--codec-threads", type=int, choices=(0, 1), default=0,
            help="1: run the codec in a thread while this one polls MPI (default 0)")
        group.add_argument(
            "--wait", choices=WAIT_MODES, default=DEFAULT_WAIT,
            help="a rank with nothing to do: yield (poll, giving the core away) or sleep "
                 f"(after 200 us, poll every 50 us); default {DEFAULT_WAIT}")
        group.add_argument(
            "--no-fuse", dest="fused", action="store_false",
            help="allreduce: run the reduce-scatter, then the allgather, instead of one "
                 "pipeline of both")

    def check_options(self, opts, ranks: int) -> None:
        super().check_options(opts, ranks)
        if opts.chunk_bytes != AUTO and opts.chunk_bytes < 0:
            raise UsageError("--chunk-bytes must not be negative")

    def options(self, opts, case) -> dict:
        chunk = opts.chunk_bytes
        if chunk == AUTO:
            chunk = auto_chunk_bytes(self.codec, case.dtype, block_bytes(case), case.ranks,
                                     link_goodput_gbps())
        return {"chunk_bytes": chunk, "progress": opts.progress,
                "codec_threads": opts.codec_threads, "fused": opts.fused, "wait": opts.wait}

    def columns(self, opts) -> dict:
        return {**super().columns(opts), "chunk_bytes": opts.chunk_bytes,
                "chunk_used_bytes": None, "progress": opts.progress,
                "codec_threads": opts.codec_threads, "wait": opts.wait,
                "fused": opts.fused if opts.collective == "allreduce" else None,
                "async_progress": async_progress()}


def main(argv: list[str] | None = None) -> int:
    return run_variant(CollCompressed(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
