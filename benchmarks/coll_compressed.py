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
block, the codec's rate and ratio and the transport's per-message cost and rate, measured
at start-up). --progress and --codec-threads choose how MPI keeps moving bytes while the
codec works; MPICH's own progress thread is asked for with MPIR_CVAR_ASYNC_PROGRESS=1 in
the launch environment.
Every row carries the time breakdown of the timed calls on the critical rank and the
pipeline's floor (docs/compression.md).

--algorithm library (the default with --transport torch) runs none of that ring: each
rank encodes once, one library allgather / all-to-all moves the payloads, and each rank
decodes (and, reducing, adds the n-1 decoded blocks to its own): one call per phase
instead of one per ring step and chunk, with no overlap of codec and transfers.

Codecs (--codec):
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from ccbench.benchmarks.compressed_base import (
    CompressedVariant,
    codec_share,
    floor_link_gbps,
    rank_device,
)
from ccbench.benchmarks.harness import run_variant
from ccbench.benchmarks.options import compression_from
from ccbench.collectives.chunking import auto_chunk_bytes
from ccbench.collectives.compressed import bind_compressed
from ccbench.collectives.compression import AUTO
from ccbench.collectives.pipeline import (
    DEFAULT_PROGRESS,
    DEFAULT_WAIT,
    PROGRESS_MODES,
    WAIT_MODES,
    async_progress,
)
from ccbench.collectives.spec import spec
from ccbench.kernels import arrays, inputs
from ccbench.kernels.codec_base import empty_payload
from ccbench.kernels.codecs import describe_codecs
from ccbench.kernels.errors import UsageError
from ccbench.kernels.vocabulary import itemsize

# --algorithm: the pipelined ring (seed 000), or one library call per phase
ALGORITHMS = ("ring", "library")
# the ring's pipeline options, which a library call has no use for: (option, default)
RING_OPTIONS = (
    ("chunk_bytes", None),  # not given: Compression.chunk applies the default
    ("progress", DEFAULT_PROGRESS),
    ("codec_threads", 0),
    ("wait", DEFAULT_WAIT),
    ("fused", True),
)
RATE_SAMPLE_BYTES = 1 << 20  # data the codec's rate is measured on
# the ring exchanges that measure the transport: the smallest for its per-message cost,
# the two others (both past an emulated shaper's burst) for its rate
MESSAGE_BYTES = 4 << 10
RATE_BYTES = (256 << 10, 4 << 20)
RATE_REPEATS = 5
# the pipeline's own cost per chunk: allgathers of blocks of CHUNK_PROBE_CHUNKS chunks of
# CHUNK_PROBE_BYTES each, against the same blocks in one chunk
CHUNK_PROBE_BYTES = 32 << 10
CHUNK_PROBE_CHUNKS = 4
EXCHANGE_REPEATS = 9  # ranks that share cores are descheduled for milliseconds at times


@dataclass(frozen=True)
class MeasuredRates:
    """What --chunk-bytes auto chooses from, measured on the ranks at start-up (outside
    the timed calls), agreed by every rank and recorded in every row."""

    codec_bps: float  # data bytes/s through one encode and one decode: the slowest rank's
    message_s: float  # the transport's per-message cost (alpha)
    chunk_s: float  # the pipeline's own cost (wall) of one chunk in one ring step
    codec_share: float  # ranks per core (device buffers: per device), the most of any rank
    transport_gbps: float | None  # the transport's rate (1/beta); None on one rank
    link_gbps: float | None  # the rate the chunk is chosen for: the emulated link's where
    # known (the floor's rate), else the transport's
    launch_s: float | None = None  # a device launch's host cost: eager, the slowest
    # rank's; 0 graphed (replays launch nothing); None on host buffers


def _best(function, repeats: int = RATE_REPEATS) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - t0)
    return best


def codec_rate(codec, buffer: str, dtype: str) -> float:
    """Bytes/s of data through one encode and one decode on this rank (best of rounds), on
    gradient-like values: what the pipeline's fill and drain cost per byte."""
    count = max(codec.granularity, RATE_SAMPLE_BYTES // itemsize(dtype))
    x = arrays.from_numpy(buffer, inputs.values("gradient-like", count, 0, 1, 0), dtype)
    out = arrays.empty(buffer, count, dtype)
    payload = empty_payload(x, codec.max_encoded_nbytes(count, dtype))

    def encode():
        codec.encode(x, out=payload)
        arrays.synchronize(buffer)

    def decode():
        codec.decode(payload, out)
        arrays.synchronize(buffer)

    encode()
    seconds = _best(encode) + _best(decode)
    codec.check_deferred()
    return 2 * count * itemsize(dtype) / seconds


LAUNCH_PROBE_CALLS = 20  # eager encodes queued back to back, per round


def launch_host_s(codec, buffer: str, dtype: str) -> float:
    """The host's time per eager launch on a device: encodes of one granule queued back to
    back (the host does not wait for them), the best round's time per call."""
    count = codec.granularity
    x = arrays.from_numpy(buffer, inputs.values("gradient-like", count, 0, 1, 0), dtype)
    payload = empty_payload(x, codec.max_encoded_nbytes(count, dtype))

    def calls():
        for _ in range(LAUNCH_PROBE_CALLS):
            codec.encode(x, out=payload)

    calls()
    seconds = _best(calls) / LAUNCH_PROBE_CALLS
    arrays.synchronize(buffer)
    codec.check_deferred()
    return seconds


def ring_exchange_s(comm, nbytes: int, buffer: str) -> float:
    """Seconds of a ring exchange of `nbytes` (each rank sends to the next and receives
    from the previous, after a barrier) through the run's transport and buffers: the best
    of EXCHANGE_REPEATS on each rank (a rank descheduled by another's work adds only to
    the others), the slowest rank's. Collective."""
    size, rank = comm.size, comm.rank
    send = arrays.from_numpy(buffer, np.zeros(nbytes, np.int8), "int8")
    recv = arrays.empty(buffer, nbytes, "int8")
    comm.sendrecv(send, (rank + 1) % size, recv, (rank - 1) % size)  # connects: not timed
    arrays.synchronize(buffer)
    times = []
    for _ in range(EXCHANGE_REPEATS):
        comm.barrier()
        t0 = time.perf_counter()
        comm.sendrecv(send, (rank + 1) % size, recv, (rank - 1) % size)
        arrays.synchronize(buffer)
        times.append(time.perf_counter() - t0)
    return comm.allreduce_value(min(times), op="max")


def transport_alpha_beta(comm, buffer: str = "numpy") -> tuple[float, float | None]:
    """(per-message seconds, Gbit/s) of the transport in use: the rate from the ring
    exchanges at the two RATE_BYTES (their times' difference, so neither the per-message
    cost nor an emulated shaper's burst enters it; where noise made the larger one no
    slower, the larger one's bytes over its whole time, a lower rate), the per-message
    cost from the MESSAGE_BYTES exchange less its bytes at that rate; (0, None) on one
    rank. Collective."""
    if comm.size < 2:
        return 0.0, None
    small = ring_exchange_s(comm, MESSAGE_BYTES, buffer)
    (s1, s2) = RATE_BYTES
    t1, t2 = (ring_exchange_s(comm, n, buffer) for n in RATE_BYTES)
    seconds_per_byte = (t2 - t1) / (s2 - s1) if t2 > t1 else t2 / s2
    return max(small - MESSAGE_BYTES * seconds_per_byte, 0.0), 8 / seconds_per_byte / 1e9


def pipeline_call_s(comm, codec, buffer: str, dtype: str, chunk_bytes: int) -> float:
    """Seconds of one pipelined allgather (the ring of collectives/compressed.py) of
    blocks of CHUNK_PROBE_CHUNKS x CHUNK_PROBE_BYTES in chunks of `chunk_bytes` (0: one
    chunk per block), through the run's codec, transport and buffers: the best of
    EXCHANGE_REPEATS on each rank, the slowest rank's. Collective."""
    count = CHUNK_PROBE_CHUNKS * max(codec.granularity, CHUNK_PROBE_BYTES // itemsize(dtype))
    send = arrays.from_numpy(
        buffer, inputs.values("gradient-like", count, comm.rank, comm.size, 0), dtype
    )
    recv = arrays.empty(buffer, count * comm.size, dtype)
    run = bind_compressed(comm, "coll", "allgather", codec, send, recv, chunk_bytes=chunk_bytes)
    run()  # connects and warms: not timed
    times = []
    for _ in range(EXCHANGE_REPEATS):
        comm.barrier()
        t0 = time.perf_counter()
        run()
        arrays.synchronize(buffer)
        times.append(time.perf_counter() - t0)
    codec.check_deferred()
    return comm.allreduce_value(min(times), op="max")


def pipeline_chunk_s(comm, codec, buffer: str, dtype: str) -> float:
    """The pipeline's own cost of one chunk in one ring step, in wall time, measured as
    the transport's alpha is, from the difference of two calls that move the same bytes:
    an allgather of blocks in CHUNK_PROBE_CHUNKS chunks against the same blocks in one
    chunk, over the (P-1) x (chunks - 1) chunk-steps the first has more (posting,
    polling, a codec call, a message and the wake-up of the rank it is for, each); 0 on
    one rank. Collective."""
    if comm.size < 2:
        return 0.0
    chunk = max(codec.granularity, CHUNK_PROBE_BYTES // itemsize(dtype)) * itemsize(dtype)
    whole = pipeline_call_s(comm, codec, buffer, dtype, 0)
    cut = pipeline_call_s(comm, codec, buffer, dtype, chunk)
    return max(cut - whole, 0.0) / ((comm.size - 1) * (CHUNK_PROBE_CHUNKS - 1))


def measure_rates(comm, codec, buffer: str, dtype: str, graphed: bool = False) -> MeasuredRates:
    """The rates --chunk-bytes auto uses, agreed by every rank. Collective."""
    rate = comm.allreduce_value(codec_rate(codec, buffer, dtype), op="min")
    launch_s = None
    if arrays.is_gpu(buffer):
        eager = 0.0 if graphed else launch_host_s(codec, buffer, dtype)
        launch_s = comm.allreduce_value(eager, op="max")
    message_s, transport_gbps = transport_alpha_beta(comm, buffer)
    # a chunk costs at least the message it is sent in
    chunk_s = max(pipeline_chunk_s(comm, codec, buffer, dtype), message_s)
    link = floor_link_gbps()
    return MeasuredRates(
        rate,
        message_s,
        chunk_s,
        codec_sharing(comm, buffer),
        transport_gbps,
        link if link else transport_gbps,
        launch_s,
    )


def codec_sharing(comm, buffer: str) -> float:
    """The most ranks that share one core (device buffers: one device), over every rank
    (compressed_base.codec_share, as the floor counts them). Collective."""
    on_device = arrays.is_gpu(buffer)
    places = comm.allgather_obj(
        (comm.processor_name(), sorted(os.sched_getaffinity(0)), rank_device(buffer))
    )
    shares = [codec_share(places, r, on_device) for r in range(len(places))]
    return max(device if on_device else core for core, device in shares)


def auto_by_default(opts) -> bool:
    """--chunk-bytes not given means auto for the ring over NCCL, where every chunk costs
    the host its launches (docs/gpu.md, "Chunks on a device"); else the default size."""
    return opts.algorithm == "ring" and opts.backend == "nccl"


def block_bytes(case) -> int:
    """Bytes of one ring block of this case (what the pipeline cuts into chunks)."""
    return spec(case.collective).ring_block_count(case.count, case.ranks) * itemsize(case.dtype)


class CollCompressed(CompressedVariant):
    name = "coll_compressed"
    description = __doc__ + describe_codecs()
    kind = "coll"
    chunked = {"chunk": True, "auto": True}

    def add_variant_options(self, group) -> None:
        group.add_argument(
            "--algorithm",
            choices=ALGORITHMS,
            default=None,
            help="ring: compress once, forward compressed chunks around a ring, pipelining "
            "codec work with the transfers (seed 000; the default over MPI); library: "
            "encode once, one library allgather / all-to-all of the payloads, decode, "
            "not pipelined; its reduce-scatter decodes each contribution once instead "
            "of re-encoding partial sums (the default with --transport torch, where "
            "each call has a large fixed cost)",
        )
        group.add_argument(
            "--progress",
            choices=PROGRESS_MODES,
            default=DEFAULT_PROGRESS,
            help="how MPI progresses while the codec works: chunk (between chunks only) "
            f"or testall (Testall between sub-chunks); default {DEFAULT_PROGRESS}",
        )
        group.add_argument(
            "--codec-threads",
            type=int,
            choices=(0, 1),
            default=0,
            help="1: run the codec in a thread while this one polls MPI (default 0)",
        )
        group.add_argument(
            "--wait",
            choices=WAIT_MODES,
            default=DEFAULT_WAIT,
            help="a rank with nothing to do: yield (poll, giving the core away) or sleep "
            f"(after 200 us, poll every 50 us); default {DEFAULT_WAIT}",
        )
        group.add_argument(
            "--no-fuse",
            dest="fused",
            action="store_false",
            help="allreduce: run the reduce-scatter, then the allgather, instead of one "
            "pipeline of both",
        )

    def parse_compression(self, opts):
        return compression_from(opts, auto=True)

    def check_options(self, opts, ranks: int) -> None:
        super().check_options(opts, ranks)
        if opts.algorithm is None:
            opts.algorithm = "library" if opts.transport == "torch" else "ring"
        self.algorithm = opts.algorithm
        self.kind = "library" if opts.algorithm == "library" else "coll"
        if opts.algorithm == "library":
            given = [name for name, default in RING_OPTIONS if getattr(opts, name) != default]
            if given:
                names = ", ".join(
                    "--no-fuse" if n == "fused" else "--" + n.replace("_", "-") for n in given
                )
                raise UsageError(
                    f"{names}: the ring's pipeline options; --algorithm library "
                    f"makes one library call per phase (use --algorithm ring)"
                )
        self.chunk = self.compression.chunk(auto_default=auto_by_default(opts))

    def options(self, opts, case) -> dict:
        if opts.algorithm == "library":
            return {}
        chunk = self.chunk
        if chunk == AUTO:
            rates = self.rates[case.dtype]
            chunk = auto_chunk_bytes(
                self.codec,
                case.dtype,
                block_bytes(case),
                case.ranks,
                rates.link_gbps,
                rates.codec_bps,
                rates.chunk_s,
                case.collective,
                rates.codec_share,
                rates.launch_s or 0.0,
            )
        return {
            "chunk_bytes": chunk,
            "progress": opts.progress,
            "codec_threads": opts.codec_threads,
            "fused": opts.fused,
            "wait": opts.wait,
        }

    def prepare(self, comm, opts) -> None:
        self.rates = {}
        if self.chunk == AUTO:
            self.rates[opts.dtype] = measure_rates(
                comm, self.codec, opts.buffer, opts.dtype, graphed=bool(opts.cuda_graph)
            )

    def run_columns(self, opts) -> dict:
        rates = self.rates.get(opts.dtype)
        if rates is None:
            return {}
        return {
            "auto_codec_gbps": rates.codec_bps * 8 / 1e9,
            "transport_message_us": rates.message_s * 1e6,
            "pipeline_chunk_us": rates.chunk_s * 1e6,
            "transport_gbps": rates.transport_gbps,
            "auto_link_gbps": rates.link_gbps,
            "launch_us": None if rates.launch_s is None else rates.launch_s * 1e6,
        }

    def columns(self, opts) -> dict:
        fuses = spec(opts.collective).fusible  # fusing joins a reduce phase to a gather phase
        columns = {
            **super().columns(opts),
            "chunk_bytes": self.chunk,
            "chunk_used_bytes": None,
            "auto_codec_gbps": None,
            "transport_message_us": None,
            "pipeline_chunk_us": None,
            "transport_gbps": None,
            "auto_link_gbps": None,
            "launch_us": None,
            "progress": opts.progress,
            "codec_threads": opts.codec_threads,
            "wait": opts.wait,
            "fused": opts.fused if fuses else None,
            "async_progress": async_progress(),
        }
        if opts.algorithm == "library":  # no pipeline: its options are left empty
            columns.update(dict.fromkeys(name for name, _ in RING_OPTIONS))
        return columns


def main(argv: list[str] | None = None) -> int:
    return run_variant(CollCompressed(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
