"""Every codec x collective x variant of the compressed rings, in one launch.

Run under mpiexec; rank 0 prints one JSON line per case: {"case": id, "ok": bool, ...}.
Each case checks, on every rank:
  * the result against the uncompressed one computed here with numpy (float64, then
    rounded to the dtype as the buffer holds it): exact for lossless codecs (inputs are
    small integers, exact in any summation order), within the stated bound otherwise;
  * the bytes this rank put on the wire against an independent count from the codec's
    sizes (fixed-size codecs: exact; variable-size: between 1 byte per message and the
    codec's maximum);
  * a second call on the same buffers gives the same result;
  * collective-level allgather and allreduce leave the same bits on every rank.
Float32 numpy buffers run every codec x variant x collective at several counts; the
other options (one chunk per block, a p2p threshold), dtypes and torch buffers run on a
subset.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

from ccbench.kernels.vocabulary import COLLECTIVES, itemsize

CODECS = ("none", "fp16", "bf16", "bfp:rate=8", "bfp:rate=3,block=8", "zfp:rate=8",
          "zfp:tol=1e-3", "zstd")
VARIANTS = (("p2p", {}), ("coll", {"chunk_bytes": 4096}))
# per-rank counts for allgather / reduce_scatter, totals for allreduce: one element, a
# partial bfp tile, and two bfp tiles (8192 values) plus a tail; allreduce also with
# fewer elements than ranks (4) and counts that do not divide by the ranks
COUNTS = {"allgather": (1, 300, 16387), "reduce_scatter": (1, 300, 16387),
          "allreduce": (3, 301, 32775)}
# the other options: one chunk per block, and a threshold that leaves small blocks raw
OPTION_CASES = (("coll", {"chunk_bytes": 0}), ("p2p", {"threshold": 2048}))
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


def expected_wire(variant, options, collective, codec, dtype, rank, size, count):
    """(low, high) bytes this rank sends, from the codec's sizes alone."""
    from ccbench.collectives.compressed import chunk_count_for
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
        per_chunk = chunk_count_for(codec, dtype, options.get("chunk_bytes", 0))
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


def run_case(comm, variant, options, collective, spec, dtype, buffer, count):
    from ccbench.collectives.compressed import bind_compressed, error_bound
    from ccbench.kernels import arrays
    from ccbench.kernels.codecs import parse_codec

    size, rank = comm.size, comm.rank
    codec = parse_codec(spec)
    send_count = count * size if collective == "reduce_scatter" else count
    recv_count = {"allgather": count * size, "reduce_scatter": count,
                  "allreduce": count}[collective]  # fmt: skip
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
        reference = np.sum(inputs, axis=0)[rank * count:(rank + 1) * count]
    expected = held(reference, dtype)
    err = float(np.abs(got - expected).max()) if got.size else 0.0
    amaxes = [float(np.abs(held(x, dtype)).max()) for x in inputs]
    bound = error_bound(codec, variant, collective, amaxes, dtype)
    within = (err == 0.0) if bound is None else (err <= bound and bool(np.isfinite(got).all()))
    low, high = expected_wire(variant, options, collective, codec, dtype, rank, size, count)
    wire_ok = low <= wire <= high
    repeatable = bool(np.array_equal(first, got))
    must_match = variant == "coll" and collective in ("allgather", "allreduce")
    ok = within and wire_ok and repeatable
    detail = {"err": err, "bound": bound, "wire": wire, "wire_expected": [low, high],
              "repeatable": repeatable}
    return ok, detail, (got if must_match else None)


def main() -> int:
    from ccbench.collectives.comm import Communicator

    comm = Communicator(MPI.COMM_WORLD)
    only = sys.argv[1] if len(sys.argv) > 1 else ""
    for cid, params in cases():
        if only and only not in cid:
            continue
        ok, detail, result = run_case(comm, *params)
        # one collective per case: the checks and (where they must agree) the results
        gathered = comm.mpi.gather((ok, detail, result), root=0)
        if comm.rank == 0:
            oks, details, results = zip(*gathered, strict=True)
            identical = results[0] is None or all(
                np.array_equal(results[0], other) for other in results[1:])
            line = {"case": cid, "ok": all(oks) and identical, "identical": identical,
                    "detail": details}
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
