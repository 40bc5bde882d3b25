"""Every codec x collective x variant of the compressed rings, in one launch.

Run under mpiexec; rank 0 prints one JSON line per case: {"case": id, "ok": bool,
"checks": {name: bool}, ...} (tests/helpers/drivers.py).
Each case checks, on every rank:
  * the result against the uncompressed one computed here with numpy (float64, then
    rounded to the dtype as the buffer holds it): exact for lossless codecs (inputs are
    small integers, exact in any summation order), otherwise within the bound that
    docs/compression.md states, computed here from its formulas (not with
    collectives.compressed_error.error_bound);
  * the bytes this rank put on the wire against an independent count from the codec's
    sizes and the documented chunking (fixed-size codecs: exact; variable-size: between
    1 byte per message and the codec's maximum; the library-backed collectives'
    variable-size payloads: exact where the codec's own payload of each block is known);
  * a second call on the same buffers gives the same result;
  * collective-level and library-backed allgather and allreduce leave the same bits on
    every rank.
Float32 numpy buffers run every codec x variant x collective at several counts; the
other options (one chunk per block, a p2p threshold), dtypes and torch buffers run on a
subset.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
from mpi4py import MPI

from ccbench.kernels.vocabulary import COLLECTIVES, itemsize
from tests.helpers.drivers import case_line, on_every_rank

CODECS = (
    "none",
    "fp16",
    "bf16",
    "bfp:rate=8",
    "bfp:rate=3,block=8",
    "zfp:rate=8",
    "zfp:tol=1e-3",
    "zstd",
)
VARIANTS = (("p2p", {}), ("coll", {"chunk_bytes": 4096}), ("library", {}))
# per-rank counts for allgather / reduce_scatter, totals for allreduce: one element, a
# partial bfp tile, and two bfp tiles (8192 values) plus a tail; allreduce also with
# fewer elements than ranks (4) and counts that do not divide by the ranks
COUNTS = {
    "allgather": (1, 300, 16387),
    "reduce_scatter": (1, 300, 16387),
    "allreduce": (3, 301, 32775),
}
# the other options: one chunk per block, a threshold that leaves small blocks raw, and
# the pipeline's progress modes: codec work cut into sub-chunks with Testall between them
# (4 KiB pieces of 64 KiB chunks: fp16 16 pieces, bfp 2 whole tiles, zstd never cut), a
# codec thread, allreduce as two collectives back to back, waits that only yield
OPTION_CASES = (
    ("coll", {"chunk_bytes": 0}),
    ("p2p", {"threshold": 2048}),
    ("coll", {"chunk_bytes": 65536, "progress": "testall", "sub_chunk_bytes": 4096}),
    ("coll", {"chunk_bytes": 4096, "codec_threads": 1}),
    ("coll", {"chunk_bytes": 4096, "fused": False}),
    ("coll", {"chunk_bytes": 4096, "wait": "yield"}),
)
OPTION_CODECS = ("fp16", "bfp:rate=8", "zstd")
DTYPE_CODECS = ("none", "bf16", "bfp:rate=8", "zfp:rate=8", "zstd")
DTYPES = (("float64", "numpy"), ("float16", "numpy"), ("bfloat16", "torch"))


def case_id(variant, options, collective, codec, dtype, buffer, count) -> str:
    opt = "".join(f"-{k}{v}" for k, v in options.items())
    return f"{variant}{opt}-{collective}-{codec}-{dtype}-{buffer}-{count}"


def cases():
    def case(variant, options, collective, codec, dtype, buffer, count):
        params = (variant, options, collective, codec, dtype, buffer, count)
        return case_id(*params), params

    for codec in CODECS:
        for variant, options in VARIANTS:
            for collective in COLLECTIVES:
                for count in COUNTS[collective]:
                    yield case(variant, options, collective, codec, "float32", "numpy", count)
    for codec in OPTION_CODECS:
        for variant, options in OPTION_CASES:
            for collective in COLLECTIVES:
                if "fused" in options and collective != "allreduce":
                    continue
                for count in (300, 16387):
                    yield case(variant, options, collective, codec, "float32", "numpy", count)
    for codec in DTYPE_CODECS:
        for dtype, buffer in DTYPES:
            for variant, options in VARIANTS:
                for collective in COLLECTIVES:
                    yield case(variant, options, collective, codec, dtype, buffer, 16387)
    for variant, options in VARIANTS:  # torch float32 buffers
        for collective in COLLECTIVES:
            yield case(variant, options, collective, "bfp:rate=4", "float32", "torch", 16387)


def make_inputs(lossy: bool, size: int, send_count: int) -> list[np.ndarray]:
    """Lossy codecs: normal values with per-1000 scales; lossless: small integers."""
    out = []
    for r in range(size):
        rng = np.random.default_rng([11, r, send_count])
        if lossy:
            scale = np.exp(rng.normal(0.0, 2.0, send_count // 1000 + 1))
            out.append(rng.standard_normal(send_count) * np.repeat(scale, 1000)[:send_count])
        else:
            out.append(rng.integers(-8, 9, send_count).astype(np.float64))
    return out


def held(values: np.ndarray, dtype: str) -> np.ndarray:
    """The values as a buffer of `dtype` holds them, back in float64."""
    from ccbench.kernels import arrays

    backend = "torch" if dtype == "bfloat16" else "numpy"
    return arrays.to_numpy(arrays.from_numpy(backend, values, dtype)).astype(np.float64)


# docs/compression.md: rounding to a dtype costs at most half an ulp plus half the
# smallest subnormal: (relative, absolute) per dtype
ROUNDING = {
    "float64": (2.0**-53, 2.0**-1075),
    "float32": (2.0**-24, 2.0**-150),
    "float16": (2.0**-11, 2.0**-25),
    "bfloat16": (2.0**-8, 2.0**-134),
}
LOSSLESS = ("none", "zstd")


def rounding(dtype: str, a: float) -> float:
    relative, absolute = ROUNDING[dtype]
    return relative * a + absolute


def parameters(spec: str) -> tuple[str, dict]:
    name, _, text = spec.partition(":")
    return name, dict(kv.split("=") for kv in text.split(",")) if text else {}


def round_trip_bound(spec: str, a: float, dtype: str) -> float:
    """e(a): the documented error of one encode / decode of values with max|x| = a."""
    name, params = parameters(spec)
    if name == "fp16":
        e = rounding("float16", a)
    elif name == "bf16":  # float64 data reaches bfloat16 through float32
        e = rounding("bfloat16", a) + (rounding("float32", a) if dtype == "float64" else 0.0)
    elif name == "bfp":  # half a step of 2^(emax - R + 1); float64 goes through float32
        rate = int(params["rate"])
        staged = float(np.float32(a))
        emax = -126
        while not staged < 2.0**emax * (1 - 2.0**-rate):
            emax += 1
        e = 2.0 ** (emax - rate) + (rounding("float32", a) if dtype == "float64" else 0.0)
    elif name == "zfp":  # values below the floor are flushed to zero
        floor = 2.0**-960 if dtype == "float64" else 2.0**-97
        exponent = math.frexp(a)[1]
        if a == 0:
            e = 0.0
        elif "rate" in params:
            e = 2.0 ** (exponent + 7 - int(params["rate"])) + floor
        else:
            e = float(params["tol"]) + 2.0 ** (exponent - (52 if dtype == "float64" else 24))
            e += floor
    else:
        raise ValueError(f"no stated bound for {spec}")
    if dtype in ("float16", "bfloat16"):  # the decoded value is rounded to the dtype again
        e += rounding(dtype, a + e)
    return e


def stated_bound(spec, variant, collective, amaxes, dtype, rank=None) -> float | None:
    """The result's bound as docs/compression.md composes it from e(a); None: exact.
    The library-backed reduce-scatter's is this rank's block's: the others'
    contributions one round trip each, at their own magnitudes (allreduce: the worst
    block's, as every rank ends with every block)."""
    if parameters(spec)[0] in LOSSLESS:
        return None
    ranks, big, total = len(amaxes), max(amaxes), sum(amaxes)
    gather_hops = 1 if variant in ("coll", "library") and ranks > 1 else ranks - 1
    err = 0.0
    if collective == "allgather":
        for _ in range(gather_hops):
            err += round_trip_bound(spec, big + err, dtype)
        return err
    if variant == "library":  # n-1 decoded contributions, then n-1 additions
        owners = [rank] if collective == "reduce_scatter" else range(ranks)
        err = max(
            sum(round_trip_bound(spec, a, dtype) for r, a in enumerate(amaxes) if r != owner)
            for owner in owners
        )
        err += (ranks - 1) * rounding(dtype, total + err)
    else:
        for _ in range(ranks - 1):  # each hop recompresses a partial sum, adds in the dtype
            err += round_trip_bound(spec, total + err, dtype) + rounding(dtype, total + err)
    err += sum(rounding(dtype, a) for a in amaxes) + rounding(dtype, total)
    if collective == "allreduce":
        for _ in range(gather_hops):
            err += round_trip_bound(spec, total + err, dtype)
    return err


def chunk_values(spec: str, dtype: str, chunk_bytes: int) -> int:
    """Values per pipelined chunk: --chunk-bytes rounded down to the codec's grain (bfp:
    whole tiles of block x 256 values, zfp: its 4-value blocks), at least one grain; 0 =
    one chunk per block."""
    if chunk_bytes <= 0:
        return 0
    name, params = parameters(spec)
    grain = {"bfp": int(params.get("block", 32)) * 256, "zfp": 4}.get(name, 1)
    return max(grain, chunk_bytes // itemsize(dtype) // grain * grain)


def expected_wire(variant, options, collective, codec, dtype, rank, size, count):
    """(low, high) bytes this rank sends, from the codec's sizes alone."""
    from ccbench.collectives.ring import block_bounds

    item = itemsize(dtype)
    if collective == "allreduce":
        lengths = [stop - start for start, stop in block_bounds(count, size)]
        # reduce-scatter sends every block but its own; allgather every block but r+1's
        sent = [lengths[b] for b in range(size) if b != rank]
        sent += [lengths[b] for b in range(size) if b != (rank + 1) % size]
    else:
        sent = [count] * (size - 1)
    if variant == "coll":
        per_chunk = chunk_values(codec.spec, dtype, options.get("chunk_bytes", 0))
        messages = []
        for n in filter(None, sent):
            step = per_chunk or n
            messages += [min(step, n - c) for c in range(0, n, step)]
    else:
        messages = [n for n in sent if n]
    low = high = 0
    threshold = options.get("threshold", 0)
    for n in messages:
        if variant == "p2p" and n * item < threshold:
            low += n * item
            high += n * item
        elif codec.fixed_size:
            low += codec.encoded_nbytes(n, dtype)
            high += codec.encoded_nbytes(n, dtype)
        else:
            low += 9  # the 8-byte header and at least one byte
            high += codec.max_encoded_nbytes(n, dtype)
    return low, high


def library_wire(collective, codec, dtype, buffer, rank, size, count, inputs, result):
    """(low, high) bytes the library-backed collective sends from this rank: the payloads
    of the all-to-all (every other rank's block once), and this rank's allgather block
    to each of the n-1 others, padded to the longest block's payload. Variable-size
    codecs add their 8-byte lengths per destination; their payloads' sizes are those of
    the codec on each block (every rank's input here; for the allreduce's allgather, the
    reduced blocks, known exactly where the codec is lossless: the result), else between
    the header plus one byte and the codec's maximum."""
    from ccbench.collectives.ring import block_bounds
    from ccbench.kernels import arrays

    if size == 1:
        return 0, 0
    bounds = (
        block_bounds(count, size)
        if collective == "allreduce"
        else [(b * count, (b + 1) * count) for b in range(size)]
    )

    def encoded(values):
        if not values.size:
            return 0, 0
        if codec.fixed_size:
            n = codec.encoded_nbytes(values.size, dtype)
            return n, n
        n = int(codec.encode(arrays.from_numpy(buffer, values, dtype)).shape[0])
        return n, n

    low = high = 0
    if collective in ("reduce_scatter", "allreduce"):
        for d, (start, stop) in enumerate(bounds):
            if d != rank:
                a, b = encoded(inputs[rank][start:stop])
                low, high = low + a, high + b
        if not codec.fixed_size:
            low, high = low + 8 * (size - 1), high + 8 * (size - 1)
    if collective in ("allgather", "allreduce"):
        if collective == "allgather":
            slots = [encoded(x) for x in inputs]
        elif codec.fixed_size or not codec.lossy:
            slots = [encoded(result[start:stop]) for start, stop in bounds]
        else:
            slots = [(9, codec.max_encoded_nbytes(stop - start, dtype)) for start, stop in bounds]
        longest = (max(a for a, _ in slots), max(b for _, b in slots))
        header = 0 if codec.fixed_size else 8
        low += (size - 1) * (header + longest[0])
        high += (size - 1) * (header + longest[1])
    return low, high


def run_case(comm, variant, options, collective, spec, dtype, buffer, count):
    from ccbench.collectives.compressed import bind_compressed
    from ccbench.kernels import arrays
    from ccbench.kernels.codecs import parse_codec

    size, rank = comm.size, comm.rank
    codec = parse_codec(spec)
    send_count = count * size if collective == "reduce_scatter" else count
    recv_count = {"allgather": count * size, "reduce_scatter": count, "allreduce": count}[
        collective
    ]
    inputs = make_inputs(codec.lossy, size, send_count)
    send = arrays.from_numpy(buffer, inputs[rank], dtype)
    recv = arrays.empty(buffer, recv_count, dtype)
    op = bind_compressed(comm, variant, collective, codec, send, recv, **options)
    comm.reset_wire_bytes()
    op()
    wire = comm.wire_bytes
    first = arrays.to_numpy(recv).astype(np.float64).copy()
    op()
    got = arrays.to_numpy(recv).astype(np.float64)
    if collective == "allgather":
        reference = np.concatenate(inputs)
    elif collective == "allreduce":
        reference = np.sum(inputs, axis=0)
    else:
        reference = np.sum(inputs, axis=0)[rank * count : (rank + 1) * count]
    expected = held(reference, dtype)
    err = float(np.abs(got - expected).max()) if got.size else 0.0
    amaxes = [float(np.abs(held(x, dtype)).max()) for x in inputs]
    bound = stated_bound(spec, variant, collective, amaxes, dtype, rank)
    within = (err == 0.0) if bound is None else (err <= bound and bool(np.isfinite(got).all()))
    if variant == "library":
        low, high = library_wire(collective, codec, dtype, buffer, rank, size, count, inputs, got)
    else:
        low, high = expected_wire(variant, options, collective, codec, dtype, rank, size, count)
    wire_ok = low <= wire <= high
    repeatable = bool(np.array_equal(first, got))
    must_match = variant in ("coll", "library") and collective in ("allgather", "allreduce")
    # (below a p2p threshold blocks travel raw: no codec work to see)
    timing = timing_ok(
        op.breakdown.rows,
        collective,
        size > 1 and not options.get("threshold"),
        hops_only=variant in ("coll", "library") and collective == "reduce_scatter",
        adds=not (
            variant == "library" and collective == "allreduce" and count < size and rank >= count
        ),
    )
    fusion = True
    if variant == "coll" and collective == "allreduce":
        # the fused pipeline and the two collectives back to back encode the same chunks
        # of the same sums once each: the same bits
        other = arrays.empty(buffer, recv_count, dtype)
        flipped = {**options, "fused": not options.get("fused", True)}
        bind_compressed(comm, variant, collective, codec, send, other, **flipped)()
        fusion = bool(np.array_equal(arrays.to_numpy(other).astype(np.float64), got))
    checks = {
        "within-bound": within,
        "wire-bytes": wire_ok,
        "repeatable": repeatable,
        "breakdown": timing,
        "fused-equal": fusion,
    }
    detail = {
        "err": err,
        "bound": bound,
        "wire": wire,
        "wire_expected": [low, high],
        "repeatable": repeatable,
        "timing": timing,
        "fused_equal": fusion,
    }
    return checks, detail, (got if must_match else None)


def timing_ok(
    rows, collective: str, moved: bool, hops_only: bool = False, adds: bool = True
) -> bool:
    """One breakdown row per call; its parts are times within the call: encode, decode,
    reduce, wait and host staging never negative and, being disjoint, adding up to at most the call
    (a codec thread's work lies within the call too). Where data moved, the codec ran
    (encode and decode), and the reducing collectives added. `hops_only`: the
    collective-level reduce-scatter decodes only inside its hops (decode, add, encode in
    one call), which are timed as the reduction. `adds`: False where this rank reduces
    nothing (the library-backed allreduce on a rank whose block is empty)."""
    if len(rows) != 2:
        return False
    for call, encode, decode, reduce, wait, cpu, stage in rows:
        if min(call, encode, decode, reduce, wait, cpu, stage) < 0:
            return False
        if encode + decode + reduce + wait + stage > call * 1.0001 + 1e-6:
            return False
        if moved and (encode <= 0 or (decode <= 0 and not hops_only)):
            return False
        if moved and adds and collective != "allgather" and reduce <= 0:
            return False
    return True


def main() -> int:
    from ccbench.collectives.comm import Communicator

    comm = Communicator(MPI.COMM_WORLD)
    only = sys.argv[1] if len(sys.argv) > 1 else ""
    for cid, params in cases():
        if only and only not in cid:
            continue
        checks, detail, result = run_case(comm, *params)
        # one collective per case: the checks and (where they must agree) the results
        gathered = comm.mpi.gather((checks, detail, result), root=0)
        if comm.rank == 0:
            per_rank, details, results = zip(*gathered, strict=True)
            identical = results[0] is None or all(
                np.array_equal(results[0], other) for other in results[1:]
            )
            checks = {**on_every_rank(per_rank), "identical-on-ranks": identical}
            print(json.dumps(case_line(cid, checks, detail=details)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
