"""Codec throughput on one core: encode and decode rate against a plain copy.

    ccbench codec_throughput -m 16M --csv results/codecs.csv      # real gradients and weights
    ccbench codec_throughput --data gradient,gradient-like,exact --codec zstd

For each codec and data kind, times encode (into a preallocated payload), decode (into a
preallocated array) and a plain copy of the same buffer, interleaved round by round so
that background load hits all three alike, and reports the best round of each in GB/s
of uncompressed data, the ratio to the copy, the achieved compression ratio and the
round-trip error (max abs, max relative, relative L2, PSNR, and the cosine similarity
for gradient kinds; benchmarks/accuracy.py, as in the variants' rows). Lossless codecs
are marked so. Data kinds are kernels/inputs.py's: the default is real data from the
corpus (`ccbench corpus`), gradients and weights of its language model. torch runs on
one thread; numpy's kernels are single-threaded.
Goals: casts (fp16, bf16) >= 0.5x and bfp >= 0.25x the copy rate.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from ccbench.benchmarks import accuracy
from ccbench.benchmarks.options import RankAwareParser, parse_size, positive_int
from ccbench.kernels import arrays
from ccbench.kernels.codec_base import empty_payload
from ccbench.kernels.codecs import describe_codecs, parse_codec
from ccbench.kernels.errors import UsageError
from ccbench.kernels.inputs import DATA_KINDS, DataKind, parse_data_kind, values
from ccbench.kernels.vocabulary import DTYPES, itemsize

DEFAULT_CODECS = ("fp16", "bf16", "bfp:rate=16", "bfp:rate=8", "bfp:rate=4", "zfp:rate=16",
                  "zfp:rate=8", "zfp:tol=1e-3", "zstd")
DEFAULT_DATA = ("gradient", "weights")
COLUMNS = ("run_id", "sweep_id", "timestamp", "codec", "lossless", "data", "dtype", "buffer",
           "size_bytes",
           "repeats", "clock", "encode_gbps", "decode_gbps", "copy_gbps", "encode_vs_copy",
           "decode_vs_copy", "ratio", "max_abs_err", "max_rel_err", "rel_l2_err", "psnr_db",
           "cosine", "error_bound", "hostname", "git_sha")  # fmt: skip


def round_trip_accuracy(got: np.ndarray, ref: np.ndarray, gradient: bool) -> dict:
    """The harness's accuracy columns (benchmarks/accuracy.py) of one round trip."""
    sums, maxima = accuracy.split(accuracy.partial_sums(got, ref))
    return accuracy.combine(sums, maxima, gradient)


def _copy_fn(buffer: str, src, dst):
    if buffer == "numpy":
        return lambda: np.copyto(dst, src)
    return lambda: dst.copy_(src)


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def measure_codec(spec: str, kind: DataKind | str, buffer: str, dtype: str, count: int,
                  repeats: int, seed: int = 0, clock: str = "wall") -> dict:
    """One row: best-of-`repeats` encode, decode and copy rates, ratio and error.

    clock 'cpu' times this thread's CPU time instead of wall time: on a loaded host it
    leaves out the time other processes hold the core (not for GPU buffers).
    """
    now = CLOCKS[clock]
    codec = parse_codec(spec)
    codec.check_supported(buffer, dtype)
    kind = parse_data_kind(kind) if isinstance(kind, str) else kind
    x = arrays.from_numpy(buffer, values(kind, count, 0, 1, seed), dtype)
    out = arrays.empty(buffer, count, dtype)
    copy_dst = arrays.empty(buffer, count, dtype)
    payload = empty_payload(x, codec.max_encoded_nbytes(count, dtype))
    nbytes = count * itemsize(dtype)
    copy = _copy_fn(buffer, x, copy_dst)
    state = {}

    def encode():
        state["payload"] = codec.encode(x, out=payload)

    def decode():
        codec.decode(state["payload"], out)

    best = {"encode": float("inf"), "decode": float("inf"), "copy": float("inf")}
    encode()
    decode()
    copy()
    for _ in range(repeats):
        for name, fn in (("copy", copy), ("encode", encode), ("decode", decode)):
            t0 = now()
            fn()
            arrays.synchronize(buffer)
            best[name] = min(best[name], now() - t0)
    got = arrays.to_numpy(out).astype(np.float64)
    ref = arrays.to_numpy(x).astype(np.float64)  # the input as the dtype holds it
    rate = {name: nbytes / t / 1e9 for name, t in best.items()}
    return {
        "codec": codec.spec, "lossless": not codec.lossy, "data": kind.spec, "dtype": dtype,
        "buffer": buffer,
        "size_bytes": nbytes, "repeats": repeats, "clock": clock,
        "encode_gbps": rate["encode"], "decode_gbps": rate["decode"],
        "copy_gbps": rate["copy"],
        "encode_vs_copy": rate["encode"] / rate["copy"],
        "decode_vs_copy": rate["decode"] / rate["copy"],
        "ratio": nbytes / state["payload"].shape[0],
        **round_trip_accuracy(got, ref, kind.is_gradient),
        "error_bound": codec.error_bound(float(np.abs(ref).max()) if count else 0.0, dtype),
    }  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = RankAwareParser(prog="ccbench codec_throughput",
                             description=__doc__ + "\nCodecs:\n" + describe_codecs(),
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--codec", action="append", metavar="SPEC",
                        help="codec to measure (repeat for several; default: "
                             + ", ".join(DEFAULT_CODECS) + ")")
    parser.add_argument("-m", "--message-size", default="16M", metavar="BYTES",
                        help="buffer size in bytes, K/M/G suffixes (default 16M)")
    parser.add_argument("-T", "--dtype", choices=DTYPES, default="float32")
    parser.add_argument("-d", "--buffer", choices=("numpy", "torch", "cupy", "torch-cuda"),
                        default="numpy")
    parser.add_argument("--data", default=",".join(DEFAULT_DATA),
                        help="data kinds, comma-separated (default "
                             f"{','.join(DEFAULT_DATA)}: real data, see ccbench corpus): "
                             + DATA_KINDS)
    parser.add_argument("-i", "--iterations", type=positive_int, default=20,
                        help="timed rounds; the best is kept (default 20)")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                        help="wall: elapsed time (default); cpu: this thread's CPU time, "
                             "for hosts where other jobs compete for the cores")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", metavar="PATH", help="append one row per codec and data kind")
    return parser


def set_one_thread() -> None:
    """torch's kernels on one thread, as each rank runs them (numpy's are single-threaded)."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)


HEADER = (f"{'# codec':<24}{'data':>22}{'encode GB/s':>13}{'decode GB/s':>13}"
          f"{'copy GB/s':>11}{'enc/copy':>10}{'dec/copy':>10}{'ratio':>9}{'max rel err':>13}"
          f"{'rel L2 err':>12}{'PSNR dB':>9}{'cosine':>12}")


def _print_row(r: dict) -> None:
    label = r["codec"] + (" (lossless)" if r["lossless"] else "")
    cosine = "" if r["cosine"] is None else f"{r['cosine']:.9f}"
    print(f"{label:<24}{r['data']:>22}{r['encode_gbps']:>13.3f}{r['decode_gbps']:>13.3f}"
          f"{r['copy_gbps']:>11.3f}{r['encode_vs_copy']:>10.3f}{r['decode_vs_copy']:>10.3f}"
          f"{r['ratio']:>9.3f}{r['max_rel_err']:>13.3e}{r['rel_l2_err']:>12.3e}"
          f"{r['psnr_db']:>9.1f}{cosine:>12}", flush=True)


def run(argv: list[str]) -> int:
    opts = build_parser().parse_args(argv)
    specs_of_data = [k.strip() for k in opts.data.split(",") if k.strip()]
    if not specs_of_data:
        raise UsageError(f"--data needs at least one kind: {DATA_KINDS}")
    kinds = [parse_data_kind(k) for k in specs_of_data]  # bad kinds fail before any timing
    arrays.check_supported(opts.buffer, opts.dtype)
    if opts.clock == "cpu" and arrays.is_gpu(opts.buffer):
        raise UsageError("--clock cpu does not see GPU time; use --clock wall")
    size = parse_size(opts.message_size)
    count = size // itemsize(opts.dtype)
    if count < 1:
        raise UsageError(f"-m {opts.message_size}: smaller than one {opts.dtype} element")
    specs = opts.codec or list(DEFAULT_CODECS)
    codecs = [parse_codec(spec) for spec in specs]  # bad specs fail before any timing
    for codec in codecs:
        codec.check_supported(opts.buffer, opts.dtype)
    set_one_thread()
    info = _run_info() if opts.csv else {}
    print(f"# ccbench codec throughput: {count} {opts.dtype} values ({size} B), buffer "
          f"{opts.buffer}, best of {opts.iterations} rounds, {opts.clock} clock, one thread",
          flush=True)
    for kind in kinds:
        note = kind.fill_note(count, 0, 1)
        if note:
            print(f"# note: {note}", flush=True)
    print(HEADER, flush=True)
    rows = []
    for codec in codecs:
        for kind in kinds:
            row = measure_codec(codec.spec, kind, opts.buffer, opts.dtype, count,
                                opts.iterations, opts.seed, opts.clock)
            rows.append({**info, **row})
            _print_row(row)
    if opts.csv:
        from ccbench.benchmarks import environment
        from ccbench.benchmarks.results import append_rows

        append_rows(opts.csv, rows, list(COLUMNS))
        environment.write_sidecar(opts.csv, info, argv, 1)
    return 0


def _run_info() -> dict:
    from mpi4py import MPI

    from ccbench.benchmarks import environment
    from ccbench.collectives.comm import Communicator

    return environment.run_info(Communicator(MPI.COMM_WORLD), "codec_throughput")


def main(argv: list[str] | None = None) -> int:
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        print(f"ccbench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
