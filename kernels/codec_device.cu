/* ccbench's device kernels of bfp, fp16 and bf16 (kernels/codec_device.py launches them;
 * tests/test_codec_device.py runs the same source on the CPU). */
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

/* cupy puts -ftz=true after the caller's NVRTC options, so __fadd_rn and __fmul_rn would
 * flush subnormals to zero where the host kernels keep them: PTX without .ftz keeps them
 * whatever the flag */
__device__ __forceinline__ float add_rn(float a, float b) {
    float r;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float mul_rn(float a, float b) {
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
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
                    q[c] = (__float_as_int(add_rn(v[c], magic[c])) >> offset) & 0xFFFF;
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
                    q[c] = __float_as_int(add_rn(v[c], magic[c])) >> offset;
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
                        packed[c] |= shl((__float_as_int(add_rn(v[c], magic[c])) >> offset)
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
        step[c] = mul_rn(__int_as_float((e[c] + 1) << 23), __int_as_float((128 - rate) << 23));
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
        y[c] = mul_rn(__int2float_rn(q[c]), step[c]);
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
                y[c] = add_rn(y[c], mine[c]);
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
    const float scaled = mul_rn(__int_as_float((int)min(a, 0x38800000u)), 16777216.0f);
    const unsigned tiny = (unsigned)__float_as_int(add_rn(scaled, 8388608.0f)) - 0x4B000000u;
    return (sign | (a >= 0x38800000u ? normal : tiny)) & 0xFFFFu;
}

__device__ __forceinline__ float from_half(unsigned h) {
    const unsigned sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    unsigned bits = ((e + 112) << 23) | (m << 13);
    if (e == 0)
        bits = (unsigned)__float_as_int(mul_rn(__uint2float_rn(m), 5.9604644775390625e-8f));
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
            t[k] = add_rn(t[k], mine[k]);
        store8(target, g, t);
        if (out) {
            for (int k = 0; k < 8; k++)
                worst = max(worst, magnitude(t[k]));
            encode8(out, g, t, bfloat);
        }
    }
    for (i64 i = 8 * groups + first_index(); i < n; i += grid_stride()) {
        const float t = add_rn(decode1(payload, i, bfloat), own[i]);
        target[i] = t;
        if (out) {
            worst = max(worst, magnitude(t));
            encode1(out, i, t, bfloat);
        }
    }
    vote_flag(flag, worst, limit);
}

}
