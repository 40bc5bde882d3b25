"""Device kernels of bfp, fp16 and bf16: one CUDA kernel per encode and per decode.

NEVER RUN ON A GPU: no GPU was available where these were written. tests/test_codec_device.py
checks them against the host kernels wherever cupy sees a device; run it on a GPU node
(`pytest tests/test_codec_device.py`) before trusting GPU rows. Until then
CCBENCH_CODEC_KERNELS=reference keeps GPU buffers on the array-API kernels. What has run:
the same source compiled as C++ for the CPU, one thread after another (the test's
emulation, which checks the indexing and the bits, not the warp reduction or NVRTC).

Imported only when a cupy array or a torch CUDA tensor (float32, contiguous) is encoded
or decoded, and only with cupy installed (torch tensors are viewed through their
__cuda_array_interface__ and the kernels launched on torch's current stream). The CUDA
source below follows the format of codec_bfp.py and the casts of fused_cast.c line by
line:

* bfp: one thread per block (a tile column, B values W apart: neighbouring threads read
  neighbouring addresses). It reads its column once for the block maximum and once to
  quantise (x + 1.5 * 2**23 * step, rounded to nearest even, q in the low bits) and
  writes its exponent byte and its bits of every plane. Decoding is the reverse, one
  thread per column, q * step with the exact multiply.
* casts: one thread per value, the integer rounding of the host kernels.

Arithmetic is compiled with --fmad=false --ftz=false --prec-div=true and explicit _rn
intrinsics, so no contraction or flush changes a bit. NaN, Inf and values out of range
are found by a max over |x| (a warp reduction, then one atomicMax per warp): when set,
the caller reruns the reference, which raises its DataError.
"""

from __future__ import annotations

import numpy as np

THREADS = 256

_SOURCE = r"""
extern "C" {

#ifndef CCBENCH_EMULATED  /* the tests' CPU emulation has its own, thread by thread */
__device__ __forceinline__ void warp_max_into(int *worst, int a) {
    for (int d = 16; d > 0; d >>= 1)
        a = max(a, __shfl_down_sync(0xFFFFFFFFu, a, d));
    if ((threadIdx.x & 31) == 0)
        atomicMax(worst, a);
}
#endif

__device__ __forceinline__ int shl(int v, int by) { return (int)((unsigned)v << by); }

/* Column c of the payload: its tile t, column j, the tile's width w (W, or the last
 * tile's ceil(rest / B)), and where the tile's values and bytes start. */
struct Column { long long values, bytes; int j, w; bool active; };

__device__ Column column_of(long long n, int block, int width, int rate) {
    Column col;
    const long long tile = (long long)block * width, full = n / tile, rest = n - full * tile;
    const int last = rest ? (int)((rest + block - 1) / block) : 0;
    const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    col.active = c < full * width + last;
    long long t = c / width;
    col.j = (int)(c - t * width);
    col.w = width;
    if (t >= full) {
        t = full;
        col.j = (int)(c - full * width);
        col.w = last;
    }
    col.values = t * tile;
    col.bytes = t * (long long)width * (1 + block * rate / 8);
    return col;
}

__global__ void bfp_encode(const float *x, long long n, unsigned char *out, int block,
                           int width, int rate, int limit, const int *edge, int *worst) {
    const Column col = column_of(n, block, width, rate);
    int amax = 0;
    if (col.active)
        for (int i = 0; i < block; i++) {
            const long long k = col.values + (long long)i * col.w + col.j;
            if (k < n)
                amax = max(amax, __float_as_int(x[k]) & 0x7FFFFFFF);
        }
    warp_max_into(worst, amax);
    if (!col.active)
        return;
    const int e = (amax >> 23) + (amax >= edge[amax >> 23] ? 1 : 0);
    out[col.bytes + (long long)block * col.w * rate / 8 + col.j] = (unsigned char)e;
    if (amax >= limit)
        return;
    const float magic = __int_as_float(shl(e + 25 - rate, 23) | 0x400000);
    long long pos = col.bytes;
    int offset = 0;
    for (int piece = 16; piece >= 1; piece >>= 1) {
        if (rate - offset < piece)
            continue;
        const int rows = block * piece / 8, per_byte = piece < 8 ? 8 / piece : 1;
        const int mask = piece < 8 ? (1 << piece) - 1 : 0xFFFF;
        for (int r = 0; r < (piece < 8 ? rows : block); r++) {
            int packed = 0;
            for (int s = 0; s < per_byte; s++) {
                const long long k = col.values + (long long)(r + s * rows) * col.w + col.j;
                const float v = k < n ? x[k] : 0.0f;  /* the last tile is zero-padded */
                const int q = __float_as_int(__fadd_rn(v, magic)) >> offset;
                packed |= shl(q & mask, piece * s);
            }
            if (piece == 16) {
                const long long at = pos + 2LL * ((long long)r * col.w + col.j);
                out[at] = (unsigned char)(packed & 0xFF);
                out[at + 1] = (unsigned char)((packed >> 8) & 0xFF);
            } else {
                out[pos + (long long)r * col.w + col.j] = (unsigned char)(packed & 0xFF);
            }
        }
        pos += (long long)block * col.w * piece / 8;
        offset += piece;
    }
}

__global__ void bfp_decode(const unsigned char *payload, long long n, float *out, int block,
                           int width, int rate) {
    const Column col = column_of(n, block, width, rate);
    if (!col.active)
        return;
    const int e = payload[col.bytes + (long long)block * col.w * rate / 8 + col.j];
    /* step = 2**(E - 126) * 2**(1 - R): exact, also where it is subnormal */
    const float step = __fmul_rn(__int_as_float((e + 1) << 23),
                                 __int_as_float((128 - rate) << 23));
    for (int i = 0; i < block; i++) {
        const long long k = col.values + (long long)i * col.w + col.j;
        if (k >= n)
            break;
        long long pos = col.bytes;
        int offset = 0, q = 0;
        for (int piece = 16; piece >= 1; piece >>= 1) {
            if (rate - offset < piece)
                continue;
            const bool top = offset + piece == rate;
            int v;
            if (piece == 16) {
                const long long at = pos + 2LL * ((long long)i * col.w + col.j);
                v = payload[at] | (payload[at + 1] << 8);
                v = top ? (v ^ 0x8000) - 0x8000 : v;
            } else if (piece == 8) {
                v = payload[pos + (long long)i * col.w + col.j];
                v = top ? (v ^ 0x80) - 0x80 : v;
            } else {
                const int rows = block * piece / 8, half = 1 << (piece - 1);
                v = (payload[pos + (long long)(i % rows) * col.w + col.j] >> (piece * (i / rows)))
                    & ((1 << piece) - 1);
                v = top ? (v ^ half) - half : v;
            }
            q += shl(v, offset);
            pos += (long long)block * col.w * piece / 8;
            offset += piece;
        }
        out[k] = __fmul_rn(__int2float_rn(q), step);
    }
}

/* the casts of fused_cast.c: round to nearest even in integer arithmetic */
__device__ __forceinline__ unsigned short to_half(float x) {
    const unsigned b = (unsigned)__float_as_int(x), a = b & 0x7FFFFFFFu;
    const unsigned sign = (b >> 16) & 0x8000u;
    const unsigned normal = (a - 0x38000000u + 0xFFFu + ((a >> 13) & 1u)) >> 13;
    const float scaled = __fmul_rn(__int_as_float((int)min(a, 0x38800000u)), 16777216.0f);
    const unsigned tiny = (unsigned)__float_as_int(__fadd_rn(scaled, 8388608.0f)) - 0x4B000000u;
    return (unsigned short)(sign | (a >= 0x38800000u ? normal : tiny));
}

__device__ __forceinline__ float from_half(unsigned h) {
    const unsigned sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    unsigned bits = ((e + 112) << 23) | (m << 13);
    if (e == 0)
        bits = (unsigned)__float_as_int(__fmul_rn(__uint2float_rn(m), 5.9604644775390625e-8f));
    else if (e == 31)
        bits = 0x7F800000u | (m << 13);
    return __int_as_float((int)(sign | bits));
}

__device__ __forceinline__ unsigned short to_bfloat(float x) {
    const unsigned b = (unsigned)__float_as_int(x);
    return (unsigned short)((b + ((b >> 16) & 1u) + 0x7FFFu) >> 16);
}

__global__ void cast_encode(const float *x, long long n, unsigned char *out, int bfloat,
                            int *worst) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const float v = i < n ? x[i] : 0.0f;
    warp_max_into(worst, __float_as_int(v) & 0x7FFFFFFF);
    if (i >= n)
        return;
    const unsigned short h = bfloat ? to_bfloat(v) : to_half(v);
    out[2 * i] = (unsigned char)(h & 0xFF);
    out[2 * i + 1] = (unsigned char)(h >> 8);
}

__global__ void cast_decode(const unsigned char *payload, long long n, float *out, int bfloat) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const unsigned h = payload[2 * i] | (payload[2 * i + 1] << 8);
    out[i] = bfloat ? __int_as_float((int)(h << 16)) : from_half(h);
}

}
"""

_F16_OVERFLOW_BITS = 0x477FF000
_BF16_OVERFLOW_BITS = 0x7F7F8000
_module = None
_edges: dict = {}


def _cupy():
    import cupy

    return cupy


def check() -> None:
    """Raise unless cupy sees a device and the kernels compile (then they are used)."""
    global _module
    cupy = _cupy()
    if cupy.cuda.runtime.getDeviceCount() < 1:
        raise RuntimeError("cupy sees no CUDA device")
    if _module is None:
        _module = cupy.RawModule(code=_SOURCE, options=(
            "--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true"))
        for name in ("bfp_encode", "bfp_decode", "cast_encode", "cast_decode"):
            _module.get_function(name)


class _Launch:
    """cupy views of the arrays, on the stream their library queues work on."""

    def __init__(self, x):
        self.stream = None
        if type(x).__module__.startswith("torch"):
            import torch

            self.stream = _cupy().cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

    def __enter__(self):
        if self.stream is not None:
            self.stream.__enter__()
        return self

    def __exit__(self, *exc):
        if self.stream is not None:
            self.stream.__exit__(*exc)

    @staticmethod
    def view(a):
        return _cupy().asarray(a)

    @staticmethod
    def worst_of(kernel: str, threads: int, *args) -> int:
        """Run an encode kernel that reports the largest magnitude bits it met (through
        a trailing int* argument) and return them; 0 for an empty array."""
        worst = _cupy().zeros(1, dtype=_cupy().int32)
        if threads:
            _module.get_function(kernel)(_grid(threads), (THREADS,), (*args, worst))
        return int(worst.get()[0])


def _grid(threads: int) -> tuple[int]:
    return (max(1, -(-threads // THREADS)),)


def _edge_table(rate: int) -> np.ndarray:
    """edge[E]: 2**(E - 126) * (1 - 2**-R) as bits, computed as the array-API kernel
    computes it (a block whose max |x| reaches it takes exponent E + 1)."""
    biased = np.arange(256, dtype=np.int32)
    with np.errstate(over="ignore", invalid="ignore"):
        pow2 = ((biased + 1) << 23).view(np.float32)
        return (pow2 - pow2 * np.float32(2.0**-rate)).view(np.int32)


def _edge(rate: int):
    if rate not in _edges:
        _edges[rate] = _cupy().asarray(_edge_table(rate))
    return _edges[rate]


def _columns(n: int, block: int, width: int) -> int:
    tile = block * width
    full, rest = divmod(n, tile)
    return full * width + -(-rest // block)


def bfp_encode(codec, x, payload, tile_width: int) -> bool:
    """Encode a float32 GPU array; False: out of range (the reference must run)."""
    n = x.shape[0]
    with _Launch(x) as launch:
        worst = launch.worst_of(
            "bfp_encode", _columns(n, codec.block, tile_width) if n else 0,
            launch.view(x), np.int64(n), launch.view(payload), np.int32(codec.block),
            np.int32(tile_width), np.int32(codec.rate), np.int32(codec.limit_bits),
            _edge(codec.rate))
        return worst < codec.limit_bits


def bfp_decode(codec, payload, out, tile_width: int) -> None:
    n = out.shape[0]
    with _Launch(out) as launch:
        _module.get_function("bfp_decode")(
            _grid(_columns(n, codec.block, tile_width)), (THREADS,),
            (launch.view(payload), np.int64(n), launch.view(out), np.int32(codec.block),
             np.int32(tile_width), np.int32(codec.rate)))


def cast_encode(x, payload, bfloat: bool) -> bool:
    n = x.shape[0]
    with _Launch(x) as launch:
        worst = launch.worst_of("cast_encode", n, launch.view(x), np.int64(n),
                                launch.view(payload), np.int32(bfloat))
        return worst < (_BF16_OVERFLOW_BITS if bfloat else _F16_OVERFLOW_BITS)


def cast_decode(payload, out, bfloat: bool) -> None:
    n = out.shape[0]
    with _Launch(out) as launch:
        _module.get_function("cast_decode")(
            _grid(n), (THREADS,),
            (launch.view(payload), np.int64(n), launch.view(out), np.int32(bfloat)))
