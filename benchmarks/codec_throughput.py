"""Codec throughput on one core: encode and decode rate against a plain copy.

    ccbench codec_throughput -m 16M:16M --csv results/codecs.csv      # real gradients and weights
    ccbench codec_throughput --data gradient,gradient-like,exact --codec zstd
    ccbench codec_throughput --kernels fused --codec bfp:rate=8    # one kernel path only

For each codec, kernel path and data kind, times encode (into a preallocated payload),
decode (into a preallocated array), the reduce-scatter hop (decode, add a second array,
re-encode: Codec.decode_add_encode) and a plain copy of the same buffer, interleaved round
by round so that background load hits them alike, and reports the best round of each in
GB/s of uncompressed data, the ratio to the copy, the achieved compression ratio and the
round-trip error (max abs, max relative, relative L2, PSNR, and the cosine similarity
for gradient kinds; benchmarks/accuracy.py, as in the variants' rows). Lossless codecs
are marked so. bfp, fp16 and bf16 are measured twice by default, on their fused kernels
and on the array-API reference (`kernels` column; codecs with one implementation once).
Data kinds are kernels/inputs.py's: the default is real data from the corpus (`ccbench
corpus`), gradients and weights of its language model. torch runs on one thread; the
other kernels are single-threaded. Pin the process to a core (taskset -c N) to measure.
Goals (fused kernels): bfp:rate=8 encode and decode >= 0.8x, fp16 and bf16 >= 0.9x the
copy rate.

On a device, `host_us_per_call` is the host's time to issue one call (the slowest of
encode, decode and hop; the best batch of each): what a caller pays before the device
has the work. `--cuda-graph N` captures each call once in a CUDA graph after the eager
warm-up and times N replays per batch (fixed-size codecs on their device kernels only);
its `host_us_per_call` is then a replay's.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from ccbench.benchmarks import accuracy, graphs
from ccbench.benchmarks.options import (
    RankAwareParser,
    add_buffer,
    add_compression,
    add_cuda_graph,
    add_output,
    add_repetitions,
    add_seed,
    add_sizes,
    codecs_from,
    size_list,
)
from ccbench.benchmarks.results import CODEC, build_row
from ccbench.kernels import arrays, codec_fused, host_memory
from ccbench.kernels.codec_base import empty_payload
from ccbench.kernels.codecs import describe_codecs, parse_codec
from ccbench.kernels.errors import DataError, UsageError
from ccbench.kernels.inputs import DATA_KINDS, DataKind, parse_data_kind, values
from ccbench.kernels.reduce import copy_into
from ccbench.kernels.stopwatch import Stopwatch
from ccbench.kernels.vocabulary import itemsize

DEFAULT_CODECS = (
    "fp16",
    "bf16",
    "bfp:rate=16",
    "bfp:rate=8",
    "bfp:rate=4",
    "zfp:rate=16",
    "zfp:rate=8",
    "zfp:tol=1e-3",
    "zstd",
)
DEFAULT_DATA = ("gradient", "weights")
KERNEL_CHOICES = ("fused", "reference")  # `auto` (fused or device) and the array-API path
COLUMNS = CODEC.names


def round_trip_accuracy(got: np.ndarray, ref: np.ndarray, gradient: bool) -> dict:
    """The harness's accuracy columns (benchmarks/accuracy.py) of one round trip."""
    sums, maxima = accuracy.split(accuracy.partial_sums(got, ref))
    return accuracy.combine(sums, maxima, gradient)


def _copy_fn(buffer: str, src, dst):
    if buffer == "numpy":
        return lambda: np.copyto(dst, src)
    return lambda: copy_into(dst, src)  # torch's copy_, cupy's assignment


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
DEVICE_BATCH = 10  # calls per timed batch on a device buffer


def measure_codec(
    spec: str,
    kind: DataKind | str,
    buffer: str,
    dtype: str,
    count: int,
    repeats: int,
    seed: int = 0,
    clock: str = "wall",
    kernels: str = "fused",
    cuda_graph: int = 0,
) -> dict:
    """One row: best-of-`repeats` encode, decode, hop and copy rates, ratio and error.

    clock 'cpu' times this thread's CPU time instead of wall time: on a loaded host it
    leaves out the time other processes hold the core (not for GPU buffers). Device
    buffers are timed by events around batches of DEVICE_BATCH calls (stopwatch.py). `kernels`
    'reference' forces the array-API kernels; 'fused' takes what the codec picks (the
    fused or device kernels where it has them); the row's `kernels` says what ran.
    `cuda_graph` N > 0: each call captured in a graph after the warm-up, N replays timed
    per batch (device buffers; run() refuses what cannot be captured).
    """
    now = CLOCKS[clock]
    codec = parse_codec(spec)  # its own codec: the row pins its kernel path on it
    codec.check_supported(buffer, dtype)
    if kernels == "reference":
        codec.kernels = "reference"
    kind = parse_data_kind(kind) if isinstance(kind, str) else kind
    x = arrays.from_numpy(buffer, values(kind, count, 0, 1, seed), dtype)
    out = arrays.empty(buffer, count, dtype)
    copy_dst = arrays.empty(buffer, count, dtype)
    # the hop: the received partial sum plus this rank's own data (another rank's values)
    own = arrays.from_numpy(buffer, values(kind, count, 0, 1, seed + 1), dtype)
    target = arrays.empty(buffer, count, dtype)
    payload = empty_payload(x, codec.max_encoded_nbytes(count, dtype))
    sent = empty_payload(x, codec.max_encoded_nbytes(count, dtype))
    nbytes = count * itemsize(dtype)
    copy = _copy_fn(buffer, x, copy_dst)
    state = {}

    def encode():
        state["payload"] = codec.encode(x, out=payload)

    def decode():
        codec.decode(state["payload"], out)

    def hop():
        codec.decode_add_encode(state["payload"], own, target, sent, out)

    steps = [("copy", copy), ("encode", encode), ("decode", decode), ("hop", hop)]
    best = {name: float("inf") for name, _ in steps}
    for name, fn in list(steps):
        try:
            fn()
            codec.check_deferred()  # a device's range check, read back here
        except DataError:
            if name != "hop":
                raise
            steps.pop()  # a sum past the codec's range: no hop rate (NaN)
    encode()  # the hop's scratch is `out`: the round trip below reads the decode
    decode()
    # device buffers: events around DEVICE_BATCH calls queued back to back, as nccl-tests
    # times its iterations, so a call's launch overlaps the kernel before it and the rate
    # is the device's, not the Python dispatch's (a rate the host cannot feed is still
    # seen: the batch then waits on the host)
    watch = Stopwatch(buffer, now)
    watch.prepare(1)
    calls = DEVICE_BATCH if watch.on_device else 1
    if cuda_graph:
        steps, calls = captured(buffer, steps), cuda_graph
    host = {name: float("inf") for name, _ in steps}
    clock_s = time.perf_counter
    for _ in range(repeats):
        for name, fn in steps:
            watch.begin(0)
            t0 = clock_s()
            for _ in range(calls):
                fn()
            host[name] = min(host[name], (clock_s() - t0) / calls)
            watch.end(0)
            best[name] = min(best[name], float(watch.seconds(1)[0]) / calls)
    codec.check_deferred()
    decode()
    got = arrays.to_numpy(out).astype(np.float64)
    ref = arrays.to_numpy(x).astype(np.float64)  # the input as the dtype holds it
    rate = {name: nbytes / t / 1e9 for name, t in best.items()}
    return {
        "codec": codec.spec,
        "kernels": codec.kernel_path(x),
        "lossless": not codec.lossy,
        "data": kind.spec,
        "dtype": dtype,
        "buffer": buffer,
        "size_bytes": nbytes,
        "repeats": repeats,
        "clock": clock,
        "cuda_graph": cuda_graph,
        # the host's time to issue a call (a device's only: on the host it is the call)
        "host_us_per_call": max(host[n] for n in host if n != "copy") * 1e6
        if watch.on_device
        else None,
        "encode_gbps": rate["encode"],
        "decode_gbps": rate["decode"],
        "hop_gbps": rate["hop"],
        "copy_gbps": rate["copy"],
        "encode_vs_copy": rate["encode"] / rate["copy"],
        "decode_vs_copy": rate["decode"] / rate["copy"],
        "hop_vs_copy": rate["hop"] / rate["copy"],
        "ratio": nbytes / state["payload"].shape[0],
        **round_trip_accuracy(got, ref, kind.is_gradient),
        "error_bound": codec.error_bound(float(np.abs(ref).max()) if count else 0.0, dtype),
    }


def captured(buffer: str, steps: list) -> list:
    """(name, replay) of each step captured once in its own graph (after the warm-up)."""
    backend = arrays.backend(buffer)
    out = []
    for name, fn in steps:
        graph = backend.graph()
        graph.capture(fn)
        out.append((name, graph.replay))
    return out


def check_graph(opts, codecs: list, kernels: list[str]) -> None:
    """--cuda-graph: refuse in one line what cannot be captured."""
    if not arrays.backend(opts.buffer).device:
        raise UsageError(
            f"{graphs.REFUSED} -d {opts.buffer}: host buffers, no device work to capture "
            "(use -d torch-cuda or -d cupy)"
        )
    if "reference" in kernels:
        raise UsageError(
            f"{graphs.REFUSED} --kernels reference: the array-API kernels allocate "
            "temporaries inside the call (use --kernels fused)"
        )
    for codec in codecs:
        why = graphs.codec_refusal(codec, opts.buffer, opts.dtype)
        if why:
            raise UsageError(f"{graphs.REFUSED} {why}")


def build_parser() -> argparse.ArgumentParser:
    parser = RankAwareParser(
        prog="ccbench codec_throughput",
        description=__doc__ + "\nCodecs:\n" + describe_codecs(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_compression(
        parser,
        many=True,
        codec_help="codec to measure (repeat for several; default: "
        + ", ".join(DEFAULT_CODECS)
        + ")",
    )
    add_sizes(parser, "16M:16M", note="; each size is one buffer encoded whole")
    add_buffer(parser)
    parser.add_argument(
        "--data",
        default=",".join(DEFAULT_DATA),
        help="data kinds, comma-separated (default "
        f"{','.join(DEFAULT_DATA)}: real data, see ccbench corpus): " + DATA_KINDS,
    )
    add_repetitions(
        parser, 20, "rounds of encode, decode and copy, the best kept", warmup_default=False
    )
    parser.add_argument(
        "--kernels",
        default=None,
        metavar="PATHS",
        help="kernel paths, comma-separated: fused (the codec's fastest: "
        "fused host or device kernels), reference (array-API); "
        "default both (with --cuda-graph: fused). Codecs with one implementation run once",
    )
    add_cuda_graph(parser)
    parser.add_argument(
        "--clock",
        choices=tuple(CLOCKS),
        default="wall",
        help="wall: elapsed time (default); cpu: this thread's CPU time, "
        "for hosts where other jobs compete for the cores",
    )
    add_seed(parser, "the synthetic data kinds")
    add_output(parser, "one row per codec, kernel path, data kind and size")
    return parser


def set_one_thread() -> None:
    """torch's kernels on one thread, as each rank runs them (numpy's are single-threaded)."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)


HEADER = (
    f"{'# codec':<24}{'kernels':>10}{'data':>22}{'encode GB/s':>13}{'decode GB/s':>13}"
    f"{'hop GB/s':>10}{'copy GB/s':>11}{'enc/copy':>10}{'dec/copy':>10}{'hop/copy':>10}"
    f"{'ratio':>9}{'max rel err':>13}{'rel L2 err':>12}{'PSNR dB':>9}{'cosine':>12}"
)


def _print_row(r: dict) -> None:
    label = r["codec"] + (" (lossless)" if r["lossless"] else "")
    cosine = "" if r["cosine"] is None else f"{r['cosine']:.9f}"
    print(
        f"{label:<24}{r['kernels']:>10}{r['data']:>22}{r['encode_gbps']:>13.3f}"
        f"{r['decode_gbps']:>13.3f}{r['hop_gbps']:>10.3f}{r['copy_gbps']:>11.3f}"
        f"{r['encode_vs_copy']:>10.3f}{r['decode_vs_copy']:>10.3f}{r['hop_vs_copy']:>10.3f}"
        f"{r['ratio']:>9.3f}{r['max_rel_err']:>13.3e}{r['rel_l2_err']:>12.3e}"
        f"{r['psnr_db']:>9.1f}{cosine:>12}",
        flush=True,
    )


def kernel_paths(codec, buffer: str, dtype: str, wanted: list[str]) -> list[str]:
    """The `--kernels` choices that run different kernels for this codec and buffer."""
    probe = arrays.empty(buffer, 1, dtype)
    paths, seen = [], set()
    for choice in wanted:
        codec.kernels = "reference" if choice == "reference" else "auto"
        ran = codec.kernel_path(probe)
        if ran not in seen:
            seen.add(ran)
            paths.append(choice)
    codec.kernels = "auto"
    return paths


def run(argv: list[str]) -> int:
    opts = build_parser().parse_args(argv)
    specs_of_data = [k.strip() for k in opts.data.split(",") if k.strip()]
    if not specs_of_data:
        raise UsageError(f"--data needs at least one kind: {DATA_KINDS}")
    kinds = [parse_data_kind(k) for k in specs_of_data]  # bad kinds fail before any timing
    arrays.check_supported(opts.buffer, opts.dtype)
    hugepages = host_memory.set_hugepages(opts.hugepages) if opts.buffer == "numpy" else ""
    if opts.clock == "cpu" and arrays.is_gpu(opts.buffer):
        raise UsageError("--clock cpu does not see GPU time; use --clock wall")
    # as every variant: sizes too small for one element are skipped, and named
    skipped = [size for size in size_list(opts.message_size) if size < itemsize(opts.dtype)]
    sizes = [size for size in size_list(opts.message_size) if size not in skipped]
    if not sizes:
        raise UsageError(f"-m {opts.message_size}: no size holds one {opts.dtype} element")
    counts = [size // itemsize(opts.dtype) for size in sizes]
    specs = opts.codec or list(DEFAULT_CODECS)
    codecs = codecs_from(specs)  # bad specs fail before any timing
    for codec in codecs:
        codec.check_supported(opts.buffer, opts.dtype)
    kernels = opts.kernels or ("fused" if opts.cuda_graph else ",".join(KERNEL_CHOICES))
    wanted = [k.strip() for k in kernels.split(",") if k.strip()]
    if not wanted or any(k not in KERNEL_CHOICES for k in wanted):
        raise UsageError(f"--kernels {kernels!r}: comma-separated, of {', '.join(KERNEL_CHOICES)}")
    if opts.cuda_graph:
        check_graph(opts, codecs, wanted)
    set_one_thread()
    info = _run_info() if opts.csv else {}
    if info:
        info["cuda_graph"] = opts.cuda_graph  # the sidecar says so too
    shown = ", ".join(f"{size} B" for size in sizes)
    print(
        f"# ccbench codec throughput: {opts.dtype} buffers of {shown}, buffer "
        f"{opts.buffer}, best of {opts.iterations} rounds, {opts.clock} clock, one thread"
        + (f", {opts.cuda_graph} graph replays per batch" if opts.cuda_graph else ""),
        flush=True,
    )
    if skipped:
        print(
            f"# Skipped sizes too small for one element: {', '.join(map(str, skipped))}", flush=True
        )
    for kind in kinds:
        note = kind.fill_note(max(counts), 0, 1)
        if note:
            print(f"# note: {note}", flush=True)
    if codec_fused.note():
        print(f"# note: {codec_fused.note()}", flush=True)
    print(HEADER, flush=True)
    rows = []
    paths = {codec.spec: kernel_paths(codec, opts.buffer, opts.dtype, wanted) for codec in codecs}
    if codec_fused.device_note():
        print(f"# note: {codec_fused.device_note()}", flush=True)
    for count in counts:
        for codec in codecs:
            for kernels in paths[codec.spec]:
                for kind in kinds:
                    row = measure_codec(
                        codec.spec,
                        kind,
                        opts.buffer,
                        opts.dtype,
                        count,
                        opts.iterations,
                        opts.seed,
                        opts.clock,
                        kernels,
                        opts.cuda_graph,
                    )
                    rows.append(build_row(CODEC, info, row, {"hugepages": hugepages}))
                    _print_row(row)
    if opts.csv:
        from ccbench.benchmarks import environment
        from ccbench.benchmarks.results import append_rows

        append_rows(opts.csv, rows, list(COLUMNS))
        environment.write_sidecar(opts.csv, info, argv, 1)
    return 0


def _run_info() -> dict:
    from ccbench.benchmarks import environment
    from ccbench.collectives.comm import Communicator

    return environment.run_info(Communicator(), "codec_throughput")


def main(argv: list[str] | None = None) -> int:
    from ccbench.benchmarks.switches import for_this_run

    try:
        with for_this_run():  # this run's CCBENCH_* variables, read once at its start
            return run(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        print(f"ccbench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
