"""Device kernels of bfp, fp16 and bf16: one CUDA kernel per encode, decode and hop.

Run on a GPU once, at the revision before this design (one NVIDIA H100: 176 of the 177
tests of tests/test_codec_device.py passed; the one that failed expected bf16 to refuse
1e38, which bf16 holds: the test was wrong). This revision's kernels (vectorised, the
range flag, the fused hop) have not run on a GPU: tests/test_codec_device.py checks them
against the host kernels wherever cupy sees a device (`pytest tests/test_codec_device.py`
on a GPU node). What has run: the same source compiled as C++ for the CPU, each warp's
lanes as coroutines that meet at every warp intrinsic (the test's emulation: indexing,
bits, alignment of the vector accesses, the warp vote). Until a GPU has run it,
CCBENCH_CODEC_KERNELS=reference keeps GPU buffers on the array-API kernels.

Imported only when a cupy array or a torch CUDA tensor (float32, contiguous) is encoded
or decoded, and only with cupy installed (torch tensors are viewed through their
__cuda_array_interface__ and the kernels launched on torch's current stream). The CUDA
source below follows the format of codec_bfp.py and the casts of fused_cast.c line by
line:

* bfp: one thread per group of 4 neighbouring blocks (tile columns), in a grid-stride
  loop. It reads its 4 columns once for the block maxima and once to quantise
  (x + 1.5 * 2**23 * step, rounded to nearest even, q in the low bits), 16 bytes a row,
  and writes the 4 exponent bytes and the 4 columns' bytes of every plane in one store
  each. Decoding is the reverse, q * step with the exact multiply. In the last tile
  (fewer columns, not 16-byte aligned) and where a buffer is not 16-byte aligned, the
  same code loads and stores column by column.
* casts: one thread per 8 values (two 16-byte loads, one 16-byte store), the integer
  rounding of the host kernels; the n % 8 values after the last group, and every value
  of unaligned buffers, one at a time.
* the reduce-scatter hop (decode, add, encode) of both in one kernel: the sums are
  written to `target` and encoded from there (bfp re-reads its own columns).

Arithmetic is compiled with --fmad=false --ftz=false --prec-div=true and explicit _rn
intrinsics, so no contraction or flush changes a bit. The range check (NaN, Inf, values
out of range) is a warp vote at the end of each encode: a warp whose values are all in
range does nothing; one that met a bad value puts the largest |x| bits it saw into the
codec's range flag (one int32 per codec and device, allocated once) with one atomicMax.
Nothing waits for it: codec_base.Codec.check_deferred reads and resets the flag on the
encodes' streams outside the timed calls and raises the reference's DataError.
"""

from __future__ import annotations

import numpy as np

THREADS = 256
MAX_BLOCKS = 1 << 16      # grid-stride loops beyond this many blocks
GROUP_COLUMNS = 4         # bfp columns per thread (must divide the tile width)
CAST_GROUP = 8            # cast values per thread and step
VECTOR_ALIGN = 16         # bytes: the vector loads and stores need every buffer on it
# the smallest |x| bits each cast refuses (fused_cast.c's, codec_cast.OVERFLOW_BITS)
F16_OVERFLOW_BITS = 0x477FF000   # 65520 rounds to Inf in float16
BF16_OVERFLOW_BITS = 0x7F7F8000  # 2**128 - 2**119 rounds to Inf in bfloat16

_SOURCE = r"""
#define FULL_MASK 0xFFFFFFFFu
#define COLS 4    /* bfp columns per thread: GROUP_COLUMNS */
typedef long long i64;

/* 16-, 8- and 4-byte accesses; the callers only use them where the launcher found every
 * buffer 16-byte aligned (the emulation checks each address) */
#ifndef CCBENCH_EMULATED
__device__ __forceinline__ float4 load_f4(const float *p) { return *(const float4 *)p; }
__device__ __forceinline__ void store_f4(float *p, float4 v) { *(float4 *)p = v; }
__device__ __forceinline__ uint4 load_b16(const unsigned char *p) { return *(const uint4 *)p; }
__device__ __forceinline__ void store_b16(unsigned char *p, uint4 v) { *(uint4 *)p = v; }
__device__ __forceinline__ uint2 load_b8(const unsigned char *p) { return *(const uint2 *)p; }
__device__ __forceinline__ void store_b8(unsigned char *p, uint2 v) { *(uint2 *)p = v; }
__device__ __forceinline__ unsigned load_b4(const unsigned char *p) {
    return *(const unsigned *)p;
}
__device__ __forceinline__ void store_b4(unsigned char *p, unsigned v) { *(unsigned *)p = v; }
#endif

/* vector values built field by field (no dependence on the make_* helpers' headers) */
__device__ __forceinline__ float4 pack_f4(float a, float b, float c, float d) {
    float4 v;
    v.x = a; v.y = b; v.z = c; v.w = d;
    return v;
}

__device__ __forceinline__ uint4 pack_u4(unsigned a, unsigned b, unsigned c, unsigned d) {
    uint4 v;
    v.x = a; v.y = b; v.z = c; v.w = d;
    return v;
}

__device__ __forceinline__ uint2 pack_u2(unsigned a, unsigned b) {
    uint2 v;
    v.x = a; v.y = b;
    return v;
}

__device__ __forceinline__ int shl(int v, int by) { return (int)((unsigned)v << by); }
__device__ __forceinline__ int magnitude(float v) { return __float_as_int(v) & 0x7FFFFFFF; }

/* The range check: every lane of every warp calls this once, at the end of its kernel
 * (blocks are whole warps, and no lane returns early). A warp whose values were all below
 * `limit` votes no and does nothing; one that met a value at or above it puts its largest
 * |x| bits into the flag (the message tells NaN, Inf and too large apart). */
__device__ __forceinline__ void vote_flag(int *flag, int worst, int limit) {
    if (__any_sync(FULL_MASK, worst >= limit)) {
        for (int d = 16; d > 0; d >>= 1)
            worst = max(worst, __shfl_xor_sync(FULL_MASK, worst, d));
        if ((threadIdx.x & 31) == 0)
            atomicMax(flag, worst);
    }
}

__device__ __forceinline__ i64 first_index() {
    return (i64)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ i64 grid_stride() { return (i64)gridDim.x * blockDim.x; }

extern "C" {

/* ------------------------------------------------------------------ bfp */

/* Group g: columns j .. j + COLS - 1 of tile t (width w: W, or the last tile's
 * ceil(rest / B)); `valid` of them exist (the last tile's last group may have fewer). The
 * tile's values start at `values`, its bytes at `bytes`; `vec`: 16-byte accesses. */
struct Group { i64 values, bytes; int j, w, valid; bool vec; };

__device__ Group group_of(i64 g, i64 full, int last, int block, int width, int rate,
                          int vector) {
    Group grp;
    const int per_tile = width / COLS;
    i64 t = g / per_tile;
    if (t >= full) {
        t = full;
        grp.j = (int)(g - full * per_tile) * COLS;
        grp.w = last;
    } else {
        grp.j = (int)(g - t * per_tile) * COLS;
        grp.w = width;
    }
    grp.valid = min(COLS, grp.w - grp.j);
    grp.vec = vector && grp.w == width;  /* whole tiles: every row and plane aligned */
    grp.values = t * block * width;
    grp.bytes = t * (i64)width * (1 + block * rate / 8);
    return grp;
}

__device__ __forceinline__ i64 bfp_groups(i64 n, int block, int width, i64 *full, int *last) {
    const i64 tile = (i64)block * width;
    *full = n / tile;
    const i64 rest = n - *full * tile;
    *last = (int)((rest + block - 1) / block);
    return *full * (width / COLS) + (*last + COLS - 1) / COLS;
}

/* row i of the group's columns; values past n (the last tile's padding) read as zero */
__device__ __forceinline__ void load_row(const float *x, i64 n, const Group &grp, int i,
                                         float v[COLS]) {
    const i64 at = grp.values + (i64)i * grp.w + grp.j;
    if (grp.vec) {
        const float4 a = load_f4(x + at);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        return;
    }
    for (int c = 0; c < COLS; c++)
        v[c] = c < grp.valid && at + c < n ? x[at + c] : 0.0f;
}

__device__ __forceinline__ void store_row(float *out, i64 n, const Group &grp, int i,
                                          const float v[COLS]) {
    const i64 at = grp.values + (i64)i * grp.w + grp.j;
    if (grp.vec) {
        store_f4(out + at, pack_f4(v[0], v[1], v[2], v[3]));
        return;
    }
    for (int c = 0; c < COLS; c++)
        if (c < grp.valid && at + c < n)
            out[at + c] = v[c];
}

/* one byte per column at `at`: 4 bytes in one store where aligned */
__device__ __forceinline__ void store_bytes(unsigned char *out, i64 at, const Group &grp,
                                            const int b[COLS]) {
    if (grp.vec) {
        store_b4(out + at, (unsigned)(b[0] & 0xFF) | (unsigned)(b[1] & 0xFF) << 8 |
                           (unsigned)(b[2] & 0xFF) << 16 | (unsigned)(b[3] & 0xFF) << 24);
        return;
    }
    for (int c = 0; c < grp.valid; c++)
        out[at + c] = (unsigned char)(b[c] & 0xFF);
}

__device__ __forceinline__ void load_bytes(const unsigned char *payload, i64 at,
                                           const Group &grp, int b[COLS]) {
    if (grp.vec) {
        const unsigned v = load_b4(payload + at);
        for (int c = 0; c < COLS; c++)
            b[c] = (int)((v >> (8 * c)) & 0xFF);
        return;
    }
    for (int c = 0; c < COLS; c++)
        b[c] = c < grp.valid ? payload[at + c] : 0;
}

/* Encode the group's columns of `src` (their maxima of |x| bits in `amax`): exponent
 * bytes, then the planes, as fused_bfp.c's encode_tile. Returns the largest of `amax`. */
__device__ int encode_group(const float *src, i64 n, unsigned char *out, const Group &grp,
                            int block, int rate, int limit, const int amax[COLS]) {
    /* E: the max's biased exponent, plus one where it reaches 2**(E - 126) * (1 - 2**-R)
     * (fused_bfp.c's edge bits: the reference's float32 computation, subnormal E = 0 too) */
    const int mantissa = 0x800000 - (1 << (24 - rate)), subnormal = 0x800000 - (1 << (23 - rate));
    int e[COLS], worst = 0;
    float magic[COLS];
    for (int c = 0; c < COLS; c++) {
        const int a = amax[c], b = a >> 23;
        e[c] = b + (a >= (b ? shl(b, 23) + mantissa : subnormal) ? 1 : 0);
        worst = max(worst, a);
        magic[c] = __int_as_float(shl(e[c] + 25 - rate, 23) | 0x400000);
    }
    store_bytes(out, grp.bytes + (i64)block * grp.w * rate / 8 + grp.j, grp, e);
    if (worst >= limit)
        return worst;  /* the payload is not used: check_deferred raises */
    i64 pos = grp.bytes;
    int offset = 0;
    for (int piece = 16; piece >= 1; piece >>= 1) {
        if (rate - offset < piece)
            continue;
        if (piece == 16) {                      /* little-endian 16-bit values */
#pragma unroll 4
            for (int i = 0; i < block; i++) {
                float v[COLS];
                int q[COLS];
                load_row(src, n, grp, i, v);
                for (int c = 0; c < COLS; c++)
                    q[c] = (__float_as_int(__fadd_rn(v[c], magic[c])) >> offset) & 0xFFFF;
                const i64 at = pos + 2 * ((i64)i * grp.w + grp.j);
                if (grp.vec) {
                    store_b8(out + at, pack_u2((unsigned)q[0] | (unsigned)q[1] << 16,
                                              (unsigned)q[2] | (unsigned)q[3] << 16));
                } else {
                    for (int c = 0; c < grp.valid; c++) {
                        out[at + 2 * c] = (unsigned char)(q[c] & 0xFF);
                        out[at + 2 * c + 1] = (unsigned char)(q[c] >> 8);
                    }
                }
            }
        } else if (piece == 8) {
#pragma unroll 4
            for (int i = 0; i < block; i++) {
                float v[COLS];
                int q[COLS];
                load_row(src, n, grp, i, v);
                for (int c = 0; c < COLS; c++)
                    q[c] = __float_as_int(__fadd_rn(v[c], magic[c])) >> offset;
                store_bytes(out, pos + (i64)i * grp.w + grp.j, grp, q);
            }
        } else {
            /* segment s of `rows` consecutive rows goes to bits s*piece.. of the byte rows */
            const int rows = block * piece / 8, mask = (1 << piece) - 1;
            for (int r = 0; r < rows; r++) {
                int packed[COLS] = {0, 0, 0, 0};
                for (int s = 0; s < 8 / piece; s++) {
                    float v[COLS];
                    load_row(src, n, grp, r + s * rows, v);
                    for (int c = 0; c < COLS; c++)
                        packed[c] |= shl((__float_as_int(__fadd_rn(v[c], magic[c])) >> offset)
                                         & mask, piece * s);
                }
                store_bytes(out, pos + (i64)r * grp.w + grp.j, grp, packed);
            }
        }
        pos += (i64)block * grp.w * piece / 8;
        offset += piece;
    }
    return worst;
}

/* step = 2**(E - 126) * 2**(1 - R) of each column: exact, also where it is subnormal */
__device__ __forceinline__ void group_steps(const unsigned char *payload, const Group &grp,
                                            int block, int rate, float step[COLS]) {
    int e[COLS];
    load_bytes(payload, grp.bytes + (i64)block * grp.w * rate / 8 + grp.j, grp, e);
    for (int c = 0; c < COLS; c++)
        step[c] = __fmul_rn(__int_as_float((e[c] + 1) << 23), __int_as_float((128 - rate) << 23));
}

/* row i of the group, decoded: the pieces' integers at their offsets, the top one signed */
__device__ __forceinline__ void decode_row(const unsigned char *payload, const Group &grp,
                                           int i, int block, int rate, const float step[COLS],
                                           float y[COLS]) {
    int q[COLS] = {0, 0, 0, 0};
    i64 pos = grp.bytes;
    int offset = 0;
    for (int piece = 16; piece >= 1; piece >>= 1) {
        if (rate - offset < piece)
            continue;
        const bool top = offset + piece == rate;
        int v[COLS];
        if (piece == 16) {
            const i64 at = pos + 2 * ((i64)i * grp.w + grp.j);
            if (grp.vec) {
                const uint2 b = load_b8(payload + at);
                v[0] = (int)(b.x & 0xFFFF); v[1] = (int)(b.x >> 16);
                v[2] = (int)(b.y & 0xFFFF); v[3] = (int)(b.y >> 16);
            } else {
                for (int c = 0; c < COLS; c++)
                    v[c] = c < grp.valid ? payload[at + 2 * c] | (payload[at + 2 * c + 1] << 8) : 0;
            }
            for (int c = 0; c < COLS; c++)
                v[c] = top ? (v[c] ^ 0x8000) - 0x8000 : v[c];
        } else if (piece == 8) {
            load_bytes(payload, pos + (i64)i * grp.w + grp.j, grp, v);
            for (int c = 0; c < COLS; c++)
                v[c] = top ? (v[c] ^ 0x80) - 0x80 : v[c];
        } else {
            const int rows = block * piece / 8, half = 1 << (piece - 1);
            load_bytes(payload, pos + (i64)(i % rows) * grp.w + grp.j, grp, v);
            for (int c = 0; c < COLS; c++) {
                v[c] = (v[c] >> (piece * (i / rows))) & ((1 << piece) - 1);
                v[c] = top ? (v[c] ^ half) - half : v[c];
            }
        }
        for (int c = 0; c < COLS; c++)
            q[c] += shl(v[c], offset);
        pos += (i64)block * grp.w * piece / 8;
        offset += piece;
    }
    for (int c = 0; c < COLS; c++)
        y[c] = __fmul_rn(__int2float_rn(q[c]), step[c]);
}

__global__ void bfp_encode(const float *x, i64 n, unsigned char *out, int block, int width,
                           int rate, int vector, int limit, int *flag) {
    i64 full;
    int last, worst = 0;
    const i64 groups = bfp_groups(n, block, width, &full, &last);
    for (i64 g = first_index(); g < groups; g += grid_stride()) {
        const Group grp = group_of(g, full, last, block, width, rate, vector);
        int amax[COLS] = {0, 0, 0, 0};
#pragma unroll 4
        for (int i = 0; i < block; i++) {
            float v[COLS];
            load_row(x, n, grp, i, v);
            for (int c = 0; c < COLS; c++)
                amax[c] = max(amax[c], magnitude(v[c]));
        }
        worst = max(worst, encode_group(x, n, out, grp, block, rate, limit, amax));
    }
    vote_flag(flag, worst, limit);
}

__global__ void bfp_decode(const unsigned char *payload, i64 n, float *out, int block,
                           int width, int rate, int vector) {
    i64 full;
    int last;
    const i64 groups = bfp_groups(n, block, width, &full, &last);
    for (i64 g = first_index(); g < groups; g += grid_stride()) {
        const Group grp = group_of(g, full, last, block, width, rate, vector);
        float step[COLS];
        group_steps(payload, grp, block, rate, step);
#pragma unroll 4
        for (int i = 0; i < block; i++) {
            float y[COLS];
            decode_row(payload, grp, i, block, rate, step, y);
            store_row(out, n, grp, i, y);
        }
    }
}

/* target = decode(payload) + own, then, where out is not NULL, target encoded into out.
 * Each thread reads its own values and bytes before it writes them, so target may be
 * own and out may be payload. */
__global__ void bfp_decode_add_encode(const unsigned char *payload, const float *own,
                                      float *target, i64 n, unsigned char *out, int block,
                                      int width, int rate, int vector, int limit, int *flag) {
    i64 full;
    int last, worst = 0;
    const i64 groups = bfp_groups(n, block, width, &full, &last);
    for (i64 g = first_index(); g < groups; g += grid_stride()) {
        const Group grp = group_of(g, full, last, block, width, rate, vector);
        float step[COLS];
        int amax[COLS] = {0, 0, 0, 0};
        group_steps(payload, grp, block, rate, step);
#pragma unroll 4
        for (int i = 0; i < block; i++) {
            float y[COLS], mine[COLS];
            decode_row(payload, grp, i, block, rate, step, y);
            load_row(own, n, grp, i, mine);
            for (int c = 0; c < COLS; c++) {
                y[c] = __fadd_rn(y[c], mine[c]);
                amax[c] = max(amax[c], magnitude(y[c]));
            }
            store_row(target, n, grp, i, y);
        }
        if (out)  /* padding reads back as zero from target: the encoder's zero padding */
            worst = max(worst, encode_group(target, n, out, grp, block, rate, limit, amax));
    }
    vote_flag(flag, worst, limit);
}

/* ------------------------------------------------------------------ casts */

/* the casts of fused_cast.c: round to nearest even in integer arithmetic */
__device__ __forceinline__ unsigned to_half(float x) {
    const unsigned b = (unsigned)__float_as_int(x), a = b & 0x7FFFFFFFu;
    const unsigned sign = (b >> 16) & 0x8000u;
    const unsigned normal = (a - 0x38000000u + 0xFFFu + ((a >> 13) & 1u)) >> 13;
    const float scaled = __fmul_rn(__int_as_float((int)min(a, 0x38800000u)), 16777216.0f);
    const unsigned tiny = (unsigned)__float_as_int(__fadd_rn(scaled, 8388608.0f)) - 0x4B000000u;
    return (sign | (a >= 0x38800000u ? normal : tiny)) & 0xFFFFu;
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

__device__ __forceinline__ unsigned to_bfloat(float x) {
    const unsigned b = (unsigned)__float_as_int(x);
    return ((b + ((b >> 16) & 1u) + 0x7FFFu) >> 16) & 0xFFFFu;
}

__device__ __forceinline__ unsigned cast_to(float v, int bfloat) {
    return bfloat ? to_bfloat(v) : to_half(v);
}

__device__ __forceinline__ float cast_from(unsigned h, int bfloat) {
    return bfloat ? __int_as_float((int)(h << 16)) : from_half(h);
}

__device__ __forceinline__ void load8(const float *x, i64 g, float v[8]) {
    const float4 a = load_f4(x + 8 * g), b = load_f4(x + 8 * g + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

__device__ __forceinline__ void store8(float *x, i64 g, const float v[8]) {
    store_f4(x + 8 * g, pack_f4(v[0], v[1], v[2], v[3]));
    store_f4(x + 8 * g + 4, pack_f4(v[4], v[5], v[6], v[7]));
}

__device__ __forceinline__ void encode8(unsigned char *out, i64 g, const float v[8], int bfloat) {
    unsigned h[8];
    for (int k = 0; k < 8; k++)
        h[k] = cast_to(v[k], bfloat);
    store_b16(out + 16 * g, pack_u4(h[0] | h[1] << 16, h[2] | h[3] << 16,
                                       h[4] | h[5] << 16, h[6] | h[7] << 16));
}

__device__ __forceinline__ void decode8(const unsigned char *payload, i64 g, float v[8],
                                        int bfloat) {
    const uint4 w = load_b16(payload + 16 * g);
    const unsigned h[4] = {w.x, w.y, w.z, w.w};
    for (int k = 0; k < 4; k++) {
        v[2 * k] = cast_from(h[k] & 0xFFFFu, bfloat);
        v[2 * k + 1] = cast_from(h[k] >> 16, bfloat);
    }
}

__device__ __forceinline__ void encode1(unsigned char *out, i64 i, float v, int bfloat) {
    const unsigned h = cast_to(v, bfloat);
    out[2 * i] = (unsigned char)(h & 0xFF);
    out[2 * i + 1] = (unsigned char)(h >> 8);
}

__device__ __forceinline__ float decode1(const unsigned char *payload, i64 i, int bfloat) {
    return cast_from(payload[2 * i] | (payload[2 * i + 1] << 8), bfloat);
}

/* Groups of 8 values while the buffers are aligned (`vector`), then one value at a time:
 * the n % 8 after the last group, or all of them. */
__global__ void cast_encode(const float *x, i64 n, unsigned char *out, int bfloat,
                            int vector, int limit, int *flag) {
    int worst = 0;
    const i64 groups = vector ? n / 8 : 0;
    for (i64 g = first_index(); g < groups; g += grid_stride()) {
        float v[8];
        load8(x, g, v);
        for (int k = 0; k < 8; k++)
            worst = max(worst, magnitude(v[k]));
        encode8(out, g, v, bfloat);
    }
    for (i64 i = 8 * groups + first_index(); i < n; i += grid_stride()) {
        const float v = x[i];
        worst = max(worst, magnitude(v));
        encode1(out, i, v, bfloat);
    }
    vote_flag(flag, worst, limit);
}

__global__ void cast_decode(const unsigned char *payload, i64 n, float *out, int bfloat,
                            int vector) {
    const i64 groups = vector ? n / 8 : 0;
    for (i64 g = first_index(); g < groups; g += grid_stride()) {
        float v[8];
        decode8(payload, g, v, bfloat);
        store8(out, g, v);
    }
    for (i64 i = 8 * groups + first_index(); i < n; i += grid_stride())
        out[i] = decode1(payload, i, bfloat);
}

/* target = decode(payload) + own, encoded into out where out is not NULL (as the host
 * kernel: no range check without it). target may be own, out may be payload. */
__global__ void cast_decode_add_encode(const unsigned char *payload, const float *own,
                                       float *target, i64 n, unsigned char *out, int bfloat,
                                       int vector, int limit, int *flag) {
    int worst = 0;
    const i64 groups = vector ? n / 8 : 0;
    for (i64 g = first_index(); g < groups; g += grid_stride()) {
        float t[8], mine[8];
        decode8(payload, g, t, bfloat);
        load8(own, g, mine);
        for (int k = 0; k < 8; k++)
            t[k] = __fadd_rn(t[k], mine[k]);
        store8(target, g, t);
        if (out) {
            for (int k = 0; k < 8; k++)
                worst = max(worst, magnitude(t[k]));
            encode8(out, g, t, bfloat);
        }
    }
    for (i64 i = 8 * groups + first_index(); i < n; i += grid_stride()) {
        const float t = __fadd_rn(decode1(payload, i, bfloat), own[i]);
        target[i] = t;
        if (out) {
            worst = max(worst, magnitude(t));
            encode1(out, i, t, bfloat);
        }
    }
    vote_flag(flag, worst, limit);
}

}
"""

_KERNEL_NAMES = ("bfp_encode", "bfp_decode", "bfp_decode_add_encode", "cast_encode",
                 "cast_decode", "cast_decode_add_encode")
_module = None


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
        for name in _KERNEL_NAMES:
            _module.get_function(name)


# ---------------------------------------------------------------- launch geometry
# (shared with the tests' CPU emulation, which launches the same source)

def grid(work: int, max_blocks: int = MAX_BLOCKS) -> int:
    """Blocks of THREADS threads for `work` items (the kernels stride over the rest)."""
    return max(1, min(max_blocks, -(-work // THREADS)))


def bfp_groups(n: int, block: int, width: int) -> int:
    """Threads' work items of a bfp kernel: groups of GROUP_COLUMNS columns."""
    tile = block * width
    full, rest = divmod(n, tile)
    last = -(-rest // block)
    return full * (width // GROUP_COLUMNS) + -(-last // GROUP_COLUMNS)


def cast_groups(n: int) -> int:
    return -(-n // CAST_GROUP)


def vector_ok(*addresses: int) -> bool:
    """The kernels' 16-byte loads and stores need every buffer on a 16-byte boundary."""
    return all(a % VECTOR_ALIGN == 0 for a in addresses)


# ---------------------------------------------------------------- the range flag

class Flag:
    """One codec's range flag on one device: an int32 that stays 0 while the encodes meet
    only values in range, else holds the largest |x| bits of a warp that met a bad one.
    Allocated once; `streams`: those the encodes ran on since it was last read."""

    def __init__(self, device_id: int):
        cupy = _cupy()
        self.device_id = device_id
        with cupy.cuda.Device(device_id):
            self.bits = cupy.zeros(1, dtype=cupy.int32)
        self.streams: dict = {}


def _device_id(x) -> int:
    if type(x).__module__.startswith("torch"):
        return x.device.index
    return x.device.id


def flag_key(x):
    """The flag an encode of `x` votes into: one per device."""
    return ("cuda", _device_id(x))


def new_flag(x) -> Flag:
    return Flag(_device_id(x))


def read_flag(flag: Flag) -> int:
    """The flag's value once every encode that voted into it has finished; then reset, on
    the encodes' stream and before any later encode (the host waits for the reset too).
    0 without a wait when nothing voted since the last read."""
    if not flag.streams:
        return 0
    cupy = _cupy()
    streams = list(flag.streams.values())
    flag.streams = {}
    with cupy.cuda.Device(flag.device_id):
        for stream in streams:
            stream.synchronize()
        value = int(flag.bits.get()[0])  # a synchronous copy (older cupy copies
        last = streams[-1]               # asynchronously when given a stream)
        with last:
            flag.bits.fill(0)
        last.synchronize()
    return value


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
    def vector(*views) -> np.int32:
        return np.int32(vector_ok(*(v.data.ptr for v in views)))

    @staticmethod
    def run(name: str, work: int, args, flag: Flag | None = None) -> None:
        """Launch `name` on the current stream; an encode's flag remembers that stream."""
        if flag is not None:
            stream = _cupy().cuda.get_current_stream()
            flag.streams[stream.ptr] = stream
        _module.get_function(name)((grid(work),), (THREADS,), args)


_NULL = np.uint64(0)  # a NULL pointer argument


def bfp_encode(codec, x, payload, tile_width: int, flag: Flag) -> None:
    """Encode a float32 GPU array; the range check votes into `flag` (nothing waits)."""
    n = x.shape[0]
    if n == 0:
        return
    with _Launch(x) as launch:
        xv, pv = launch.view(x), launch.view(payload)
        launch.run("bfp_encode", bfp_groups(n, codec.block, tile_width),
                   (xv, np.int64(n), pv, np.int32(codec.block), np.int32(tile_width),
                    np.int32(codec.rate), launch.vector(xv, pv), np.int32(codec.limit_bits),
                    flag.bits), flag)


def bfp_decode(codec, payload, out, tile_width: int) -> None:
    n = out.shape[0]
    if n == 0:
        return
    with _Launch(out) as launch:
        pv, ov = launch.view(payload), launch.view(out)
        launch.run("bfp_decode", bfp_groups(n, codec.block, tile_width),
                   (pv, np.int64(n), ov, np.int32(codec.block), np.int32(tile_width),
                    np.int32(codec.rate), launch.vector(pv, ov)))


def bfp_decode_add_encode(codec, payload, own, target, out, tile_width: int,
                          flag: Flag) -> None:
    """target = decode(payload) + own, encoded into `out` if given (its range check votes
    into `flag`)."""
    n = target.shape[0]
    if n == 0:
        return
    with _Launch(target) as launch:
        views = [launch.view(a) for a in (payload, own, target)]
        ov = None if out is None else launch.view(out)
        launch.run("bfp_decode_add_encode", bfp_groups(n, codec.block, tile_width),
                   (*views, np.int64(n), _NULL if ov is None else ov,
                    np.int32(codec.block), np.int32(tile_width), np.int32(codec.rate),
                    launch.vector(*views, *([] if ov is None else [ov])),
                    np.int32(codec.limit_bits), flag.bits), flag)


def _limit(bfloat: bool) -> np.int32:
    return np.int32(BF16_OVERFLOW_BITS if bfloat else F16_OVERFLOW_BITS)


def cast_encode(x, payload, bfloat: bool, flag: Flag) -> None:
    """Cast a float32 GPU array; the range check votes into `flag` (nothing waits)."""
    n = x.shape[0]
    if n == 0:
        return
    with _Launch(x) as launch:
        xv, pv = launch.view(x), launch.view(payload)
        launch.run("cast_encode", cast_groups(n),
                   (xv, np.int64(n), pv, np.int32(bfloat), launch.vector(xv, pv),
                    _limit(bfloat), flag.bits), flag)


def cast_decode(payload, out, bfloat: bool) -> None:
    n = out.shape[0]
    if n == 0:
        return
    with _Launch(out) as launch:
        pv, ov = launch.view(payload), launch.view(out)
        launch.run("cast_decode", cast_groups(n),
                   (pv, np.int64(n), ov, np.int32(bfloat), launch.vector(pv, ov)))


def cast_decode_add_encode(payload, own, target, out, bfloat: bool, flag: Flag) -> None:
    """target = decode(payload) + own, encoded into `out` if given."""
    n = target.shape[0]
    if n == 0:
        return
    with _Launch(target) as launch:
        views = [launch.view(a) for a in (payload, own, target)]
        ov = None if out is None else launch.view(out)
        launch.run("cast_decode_add_encode", cast_groups(n),
                   (*views, np.int64(n), _NULL if ov is None else ov, np.int32(bfloat),
                    launch.vector(*views, *([] if ov is None else [ov])), _limit(bfloat),
                    flag.bits), flag)
