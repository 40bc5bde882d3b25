/* Fused host kernels of the fixed-rate codecs: bfp, fp16, bf16 and the reduce-scatter hop.
 *
 * Each kernel is one pass over memory. bfp works tile by tile (B x W values, 32 KiB at
 * B = 32, W = 256): the block maxima, then quantising and packing, read the tile twice,
 * the second time from cache. The casts work value by value. They write the bytes the
 * array-API kernels of codec_bfp.py and codec_cast.py write (the reference and the device
 * path) and decode to the same floats: bfp quantises with the same float32 add and decodes
 * with the same exact multiply; the casts round to nearest even as torch does. What they
 * cannot carry (NaN, Inf, out of range) they report by returning False, and the Python
 * side reruns the reference, which raises the reference's DataError.
 *
 * The format is documented in codec_bfp.py; this file only follows it. Payloads are
 * little-endian: the 16-bit loads and stores below assume a little-endian host.
 *
 * Built by `pip install` as ccbench.kernels._fused (an optional extension: without a C
 * compiler the codecs run their array-API kernels). On x86-64 Linux the whole-array
 * kernels are cloned for AVX2 and chosen at load time (GCC/Clang target_clones), so one
 * build uses the wide vectors of the host it runs on.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Bit-identical results need float arithmetic evaluated in float precision. */
#if defined(__FLT_EVAL_METHOD__) && __FLT_EVAL_METHOD__ != 0
#error "float arithmetic must be evaluated in float precision (SSE, not x87)"
#endif
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the payload format is little-endian"
#endif

/* Raised when the format or an entry point changes; the Python side checks it, so a stale
 * build is never used. */
#define KERNELS_VERSION 1

#if defined(__linux__) && defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define CLONED __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef CLONED
#define CLONED
#endif
#define INLINE static inline __attribute__((always_inline))

#define F16_OVERFLOW_BITS 0x477FF000  /* |x| >= 65520 rounds to Inf in float16 */
#define BF16_OVERFLOW_BITS 0x7F7F8000 /* |x| >= 2**128 - 2**119 rounds to Inf in bfloat16 */

INLINE int32_t bits_of(float x) { int32_t b; memcpy(&b, &x, 4); return b; }
INLINE float float_of(int32_t b) { float x; memcpy(&x, &b, 4); return x; }
INLINE int32_t shl(int32_t v, int by) { return (int32_t)((uint32_t)v << by); }

/* ------------------------------------------------------------------ bfp, one tile */

typedef struct {
    int64_t block, width;   /* B, W of a whole tile */
    int rate;               /* R */
    int32_t limit;          /* bit pattern of 2**(102 + R): |x| must stay below */
} bfp_format;

static void bfp_format_init(bfp_format *f, int64_t block, int64_t width, int rate) {
    f->block = block;
    f->width = width;
    f->rate = rate;
    f->limit = (102 + rate + 127) << 23;
}

/* While a tile is quantised from the cache, the next one is fetched from memory into L2
 * (once, during the first piece): the hardware prefetcher alone leaves memory idle in
 * the second pass over each tile, and fetching into L1 would evict the tile in work. */
INLINE void prefetch_row(const float *next, int offset, int64_t i, int64_t width) {
    if (next == NULL || offset != 0)
        return;
    for (int64_t j = 0; j < width; j += 16)
        __builtin_prefetch(next + i * width + j, 0, 1);
}

/* Encode one tile of `width` columns (row i, column j at i * width + j; a block is a
 * column) into its payload bytes. 0 if a block is out of range. */
INLINE int encode_tile(const bfp_format *f, const float *restrict src, int64_t width,
                       uint8_t *restrict out, int32_t *restrict amax,
                       float *restrict magic, const float *next) {
    const int64_t block = f->block, tile = block * width;
    const int rate = f->rate;
    /* block maxima of |x| as bit patterns: NaN and Inf sort above every finite value */
    for (int64_t j = 0; j < width; j++)
        amax[j] = 0;
    for (int64_t i = 0; i < block; i++) {
        const float *row = src + i * width;
        for (int64_t j = 0; j < width; j++) {
            int32_t a = bits_of(row[j]) & 0x7FFFFFFF;
            amax[j] = a > amax[j] ? a : amax[j];
        }
    }
    /* E = the biased exponent of the block's max |x|, plus one where max|x| reaches
     * 2**(E - 126) * (1 - 2**-R), where |q| would round up to 2**(R-1). That edge's bit
     * pattern is computed here without a table lookup (so that the loop vectorises); it
     * equals the array-API kernel's float32 `pow2 - pow2 * 2**-R` for every E of a value
     * in range (E <= 253), subnormal E = 0 included (test_block_exponent_edges). */
    const int32_t mantissa = 0x800000 - (1 << (24 - rate));     /* E >= 1: normal */
    const int32_t subnormal = 0x800000 - (1 << (23 - rate));    /* E = 0 */
    int32_t worst = 0;
    uint8_t *exponents = out + tile * rate / 8;
    for (int64_t j = 0; j < width; j++) {
        const int32_t a = amax[j], e = a >> 23;
        const int32_t edge = e ? (int32_t)((uint32_t)e << 23) + mantissa : subnormal;
        worst = a > worst ? a : worst;
        exponents[j] = (uint8_t)(e + (a >= edge));
        amax[j] = e + (a >= edge);
    }
    if (worst >= f->limit)
        return 0;
    /* x + 1.5 * 2**23 * step rounds x to a multiple of step (to nearest even); q is in
     * the low bits of the sum. Each piece recomputes it from the tile, in cache. */
    for (int64_t j = 0; j < width; j++)
        magic[j] = float_of(shl(amax[j] + 25 - rate, 23) | 0x400000);
    int64_t pos = 0;
    int offset = 0;
    static const int pieces[5] = {16, 8, 4, 2, 1};
    for (int p = 0; p < 5; p++) {
        const int piece = pieces[p];
        if (rate - offset < piece)
            continue;
        if (piece == 16) {                    /* little-endian 16-bit values */
            for (int64_t i = 0; i < block; i++) {
                const float *row = src + i * width;
                uint8_t *dest = out + pos + 2 * i * width;
                for (int64_t j = 0; j < width; j++) {
                    uint16_t v = (uint16_t)(bits_of(row[j] + magic[j]) >> offset);
                    memcpy(dest + 2 * j, &v, 2);
                }
                prefetch_row(next, offset, i, width);
            }
            pos += 2 * tile;
        } else if (piece == 8) {
            for (int64_t i = 0; i < block; i++) {
                const float *row = src + i * width;
                uint8_t *dest = out + pos + i * width;
                for (int64_t j = 0; j < width; j++)
                    dest[j] = (uint8_t)(bits_of(row[j] + magic[j]) >> offset);
                prefetch_row(next, offset, i, width);
            }
            pos += tile;
        } else {
            /* segment s of `rows` consecutive rows goes to bits s*w.. of the packed rows */
            const int64_t rows = block * piece / 8;
            const int32_t mask = (1 << piece) - 1;
            for (int64_t r = 0; r < rows; r++) {
                uint8_t *dest = out + pos + r * width;
                const float *row = src + r * width;
                for (int s = 0; s < 8 / piece; s++)
                    prefetch_row(next, offset, r + s * rows, width);
                for (int64_t j = 0; j < width; j++)
                    dest[j] = (uint8_t)((bits_of(row[j] + magic[j]) >> offset) & mask);
                for (int s = 1; s < 8 / piece; s++) {
                    row = src + (r + s * rows) * width;
                    for (int64_t j = 0; j < width; j++) {
                        int32_t v = (bits_of(row[j] + magic[j]) >> offset) & mask;
                        dest[j] |= (uint8_t)(v << (piece * s));
                    }
                }
            }
            pos += rows * width;
        }
        offset += piece;
    }
    return 1;
}

/* Decode one tile of `width` columns from its payload bytes into `dst`. */
INLINE void decode_tile(const bfp_format *f, const uint8_t *restrict payload, int64_t width,
                        float *restrict dst, int32_t *restrict q, float *restrict step) {
    const int64_t block = f->block, tile = block * width;
    const int rate = f->rate;
    const uint8_t *exponents = payload + tile * rate / 8;
    const float scale = float_of((128 - rate) << 23);  /* 2**(1 - R) */
    /* step = 2**(E - 126) * 2**(1 - R): exact, also where it is subnormal */
    for (int64_t j = 0; j < width; j++)
        step[j] = float_of(((int32_t)exponents[j] + 1) << 23) * scale;
    /* q = the pieces' integers at their offsets; the top piece is signed and read last,
     * where q * step is written (q is kept in `q` only when there are several pieces) */
    int64_t pos = 0;
    int offset = 0;
    static const int pieces[5] = {16, 8, 4, 2, 1};
    for (int p = 0; p < 5; p++) {
        const int piece = pieces[p];
        if (rate - offset < piece)
            continue;
        const int top = offset + piece == rate, first = offset == 0;
        if (piece == 16) {                    /* R = 16: the one piece */
            for (int64_t i = 0; i < block; i++) {
                const uint8_t *source = payload + pos + 2 * i * width;
                float *row = dst + i * width;
                for (int64_t j = 0; j < width; j++) {
                    int16_t v;
                    memcpy(&v, source + 2 * j, 2);
                    row[j] = (float)v * step[j];
                }
            }
            pos += 2 * tile;
        } else if (piece == 8) {              /* the first piece: R = 8 alone, or R > 8 */
            for (int64_t i = 0; i < block; i++) {
                const uint8_t *plane = payload + pos + i * width;
                if (top) {
                    float *row = dst + i * width;
                    for (int64_t j = 0; j < width; j++)
                        row[j] = (float)(int8_t)plane[j] * step[j];
                } else {
                    int32_t *qrow = q + i * width;
                    for (int64_t j = 0; j < width; j++)
                        qrow[j] = plane[j];
                }
            }
            pos += tile;
        } else {
            const int64_t rows = block * piece / 8;
            const int32_t mask = (1 << piece) - 1, half = 1 << (piece - 1);
            for (int s = 0; s < 8 / piece; s++) {
                const int shift = piece * s;
                for (int64_t r = 0; r < rows; r++) {
                    const int64_t k = r + s * rows;
                    const uint8_t *packed = payload + pos + r * width;
                    int32_t *qrow = q + k * width;
                    float *row = dst + k * width;
                    if (top && first) {
                        for (int64_t j = 0; j < width; j++) {
                            int32_t v = (((packed[j] >> shift) & mask) ^ half) - half;
                            row[j] = (float)v * step[j];
                        }
                    } else if (top) {
                        for (int64_t j = 0; j < width; j++) {
                            int32_t v = (((packed[j] >> shift) & mask) ^ half) - half;
                            row[j] = (float)(qrow[j] + shl(v, offset)) * step[j];
                        }
                    } else if (first) {
                        for (int64_t j = 0; j < width; j++)
                            qrow[j] = (packed[j] >> shift) & mask;
                    } else {
                        for (int64_t j = 0; j < width; j++)
                            qrow[j] += ((packed[j] >> shift) & mask) << offset;
                    }
                }
            }
            pos += rows * width;
        }
        offset += piece;
    }
}

/* ------------------------------------------------------------------ bfp, whole arrays */

typedef struct {
    int32_t amax[256];
    float magic[256], step[256];
    int32_t *q;        /* one tile */
    float *tile;       /* one tile: the padded last tile, decoded values */
} bfp_scratch;

static int scratch_init(bfp_scratch *s, int64_t tile) {
    s->q = malloc(tile * sizeof(int32_t));
    s->tile = calloc(tile, sizeof(float));
    return s->q != NULL && s->tile != NULL;
}

static void scratch_free(bfp_scratch *s) {
    free(s->q);
    free(s->tile);
}

static int64_t tile_nbytes(const bfp_format *f, int64_t width) {
    return width * (1 + f->block * f->rate / 8);
}

CLONED static int bfp_encode(const bfp_format *f, const float *x, int64_t n, uint8_t *out,
                             bfp_scratch *s) {
    const int64_t tile = f->block * f->width, full = n / tile, rest = n - full * tile;
    const int64_t nbytes = tile_nbytes(f, f->width);
    for (int64_t t = 0; t < full; t++)
        if (!encode_tile(f, x + t * tile, f->width, out + t * nbytes, s->amax, s->magic,
                         t + 1 < full ? x + (t + 1) * tile : NULL))
            return 0;
    if (rest) {  /* the last tile: ceil(rest / B) columns, zero-padded */
        const int64_t width = (rest + f->block - 1) / f->block;
        memset(s->tile, 0, f->block * width * sizeof(float));
        memcpy(s->tile, x + full * tile, rest * sizeof(float));
        return encode_tile(f, s->tile, width, out + full * nbytes, s->amax, s->magic, NULL);
    }
    return 1;
}

CLONED static void bfp_decode(const bfp_format *f, const uint8_t *payload, float *out,
                              int64_t n, bfp_scratch *s) {
    const int64_t tile = f->block * f->width, full = n / tile, rest = n - full * tile;
    const int64_t nbytes = tile_nbytes(f, f->width);
    for (int64_t t = 0; t < full; t++)
        decode_tile(f, payload + t * nbytes, f->width, out + t * tile, s->q, s->step);
    if (rest) {
        const int64_t width = (rest + f->block - 1) / f->block;
        decode_tile(f, payload + full * nbytes, width, s->tile, s->q, s->step);
        memcpy(out + full * tile, s->tile, rest * sizeof(float));
    }
}

/* target = decode(payload) + own, then target encoded into out (when out is not NULL).
 * Decoded into scratch, not into target: target may be `own` itself. Where a sum is out
 * of range the sums are still all computed (the caller's reference encode of target then
 * raises the reference's error), only the encoding stops. */
CLONED static int bfp_decode_add_encode(const bfp_format *f, const uint8_t *payload,
                                        const float *own, float *target, int64_t n,
                                        uint8_t *out, bfp_scratch *s) {
    const int64_t tile = f->block * f->width, full = n / tile, rest = n - full * tile;
    const int64_t nbytes = tile_nbytes(f, f->width);
    int ok = 1;
    for (int64_t t = 0; t < full; t++) {
        float *sums = target + t * tile;
        const float *mine = own + t * tile;
        decode_tile(f, payload + t * nbytes, f->width, s->tile, s->q, s->step);
        for (int64_t k = 0; k < tile; k++)
            sums[k] = s->tile[k] + mine[k];
        if (out && ok)
            ok = encode_tile(f, sums, f->width, out + t * nbytes, s->amax, s->magic,
                             t + 1 < full ? own + (t + 1) * tile : NULL);
    }
    if (rest) {
        const int64_t width = (rest + f->block - 1) / f->block;
        float *pad = s->tile;
        decode_tile(f, payload + full * nbytes, width, pad, s->q, s->step);
        for (int64_t k = 0; k < rest; k++) {
            pad[k] += own[full * tile + k];
            target[full * tile + k] = pad[k];
        }
        for (int64_t k = rest; k < f->block * width; k++)
            pad[k] = 0;  /* the encoder pads the sum with zeros */
        if (out && ok)
            ok = encode_tile(f, pad, width, out + full * nbytes, s->amax, s->magic, NULL);
    }
    return ok;
}

/* ------------------------------------------------------------------ casts */

/* Where two results are computed and one kept, the choice is a bit mask, not a branch:
 * compilers then vectorise the loops (they do not speculate float operations). */
INLINE uint32_t pick(int take_a, uint32_t a, uint32_t b) {
    const uint32_t mask = 0u - (uint32_t)take_a;
    return (a & mask) | (b & ~mask);
}

/* float32 -> float16 bits, round to nearest even (finite results: |x| < 65520) */
INLINE uint16_t to_half(float x) {
    const uint32_t b = (uint32_t)bits_of(x), a = b & 0x7FFFFFFF;
    const uint32_t sign = (b >> 16) & 0x8000;
    /* normal halves: rebias the exponent (127 -> 15), round away 13 bits to nearest even */
    const uint32_t normal = (a - 0x38000000u + 0xFFFu + ((a >> 13) & 1u)) >> 13;
    /* below 2**-14 the half's step is 2**-24: |x| * 2**24 is exact, and adding 2**23
     * rounds it to an integer, to nearest even, in the low mantissa bits */
    const float scaled = float_of((int32_t)pick(a < 0x38800000u, a, 0x38800000u)) * 16777216.0f;
    const uint32_t tiny = (uint32_t)bits_of(scaled + 8388608.0f) - 0x4B000000u;
    return (uint16_t)(sign | pick(a >= 0x38800000u, normal, tiny));
}

/* float16 bits -> float32, exact */
INLINE float from_half(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    const uint32_t normal = ((e + 112) << 23) | (m << 13);
    const uint32_t special = 0x7F800000u | (m << 13);                          /* Inf, NaN */
    const uint32_t tiny = (uint32_t)bits_of((float)m * 5.9604644775390625e-8f); /* m 2**-24 */
    return float_of((int32_t)(sign | pick(e == 0, tiny, pick(e == 31, special, normal))));
}

/* float32 -> bfloat16 bits, round to nearest even (finite inputs) */
INLINE uint16_t to_bfloat(float x) {
    const uint32_t b = (uint32_t)bits_of(x);
    return (uint16_t)((b + ((b >> 16) & 1u) + 0x7FFFu) >> 16);
}

INLINE float from_bfloat(uint16_t h) { return float_of((int32_t)((uint32_t)h << 16)); }

INLINE uint16_t load16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
INLINE void store16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
INLINE int32_t magnitude(float x) { return bits_of(x) & 0x7FFFFFFF; }

/* float16 with the F16C instructions where the CPU has them (x86-64): 8 values per
 * instruction, rounding to nearest even like the integer code above, bit for bit on
 * every finite value (the integer code is kept for other CPUs and for the tails). */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define F16C_PATH 1
static int use_f16c = -1;   /* -1: not asked yet; the tests switch it to compare both */

static int has_f16c(void) {
    if (use_f16c < 0) {
        __builtin_cpu_init();
        use_f16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    }
    return use_f16c;
}

#define F16C __attribute__((target("avx2,f16c")))

F16C static int32_t lanes_max(__m256i v) {
    int32_t lanes[8], worst = 0;
    _mm256_storeu_si256((__m256i *)lanes, v);
    for (int k = 0; k < 8; k++)
        worst = lanes[k] > worst ? lanes[k] : worst;
    return worst;
}

F16C static int f16c_encode(const float *x, int64_t n, uint8_t *out) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
    __m256i worst8 = _mm256_setzero_si256();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        worst8 = _mm256_max_epi32(worst8, _mm256_and_si256(_mm256_castps_si256(v), abs_mask));
        _mm_storeu_si128((__m128i *)(out + 2 * i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
    int32_t worst = lanes_max(worst8);
    for (; i < n; i++) {
        worst = magnitude(x[i]) > worst ? magnitude(x[i]) : worst;
        store16(out + 2 * i, to_half(x[i]));
    }
    return worst < F16_OVERFLOW_BITS;
}

F16C static void f16c_decode(const uint8_t *payload, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i,
                         _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(payload + 2 * i))));
    for (; i < n; i++)
        out[i] = from_half(load16(payload + 2 * i));
}

F16C static int f16c_decode_add_encode(const uint8_t *payload, const float *own,
                                       float *target, int64_t n, uint8_t *out) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
    __m256i worst8 = _mm256_setzero_si256();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 t = _mm256_add_ps(
            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(payload + 2 * i))),
            _mm256_loadu_ps(own + i));
        _mm256_storeu_ps(target + i, t);
        if (out) {
            worst8 = _mm256_max_epi32(worst8,
                                      _mm256_and_si256(_mm256_castps_si256(t), abs_mask));
            _mm_storeu_si128((__m128i *)(out + 2 * i),
                             _mm256_cvtps_ph(t, _MM_FROUND_TO_NEAREST_INT));
        }
    }
    int32_t worst = lanes_max(worst8);
    for (; i < n; i++) {
        const float t = from_half(load16(payload + 2 * i)) + own[i];
        target[i] = t;
        if (out) {
            worst = magnitude(t) > worst ? magnitude(t) : worst;
            store16(out + 2 * i, to_half(t));
        }
    }
    return worst < F16_OVERFLOW_BITS;
}
#endif

/* One loop per (direction, format): no test inside the loops. */
CLONED static int cast_encode(const float *x, int64_t n, uint8_t *out, int bfloat) {
#ifdef F16C_PATH
    if (!bfloat && has_f16c())
        return f16c_encode(x, n, out);
#endif
    int32_t worst = 0;
    if (bfloat) {
        for (int64_t i = 0; i < n; i++) {
            worst = magnitude(x[i]) > worst ? magnitude(x[i]) : worst;
            store16(out + 2 * i, to_bfloat(x[i]));
        }
        return worst < BF16_OVERFLOW_BITS;
    }
    for (int64_t i = 0; i < n; i++) {
        worst = magnitude(x[i]) > worst ? magnitude(x[i]) : worst;
        store16(out + 2 * i, to_half(x[i]));
    }
    return worst < F16_OVERFLOW_BITS;
}

CLONED static void cast_decode(const uint8_t *payload, float *out, int64_t n, int bfloat) {
#ifdef F16C_PATH
    if (!bfloat && has_f16c()) {
        f16c_decode(payload, out, n);
        return;
    }
#endif
    if (bfloat)
        for (int64_t i = 0; i < n; i++)
            out[i] = from_bfloat(load16(payload + 2 * i));
    else
        for (int64_t i = 0; i < n; i++)
            out[i] = from_half(load16(payload + 2 * i));
}

CLONED static int cast_decode_add_encode(const uint8_t *payload, const float *own,
                                         float *target, int64_t n, uint8_t *out, int bfloat) {
#ifdef F16C_PATH
    if (!bfloat && has_f16c())
        return f16c_decode_add_encode(payload, own, target, n, out);
#endif
    int32_t worst = 0;
    if (out == NULL) {
        if (bfloat)
            for (int64_t i = 0; i < n; i++)
                target[i] = from_bfloat(load16(payload + 2 * i)) + own[i];
        else
            for (int64_t i = 0; i < n; i++)
                target[i] = from_half(load16(payload + 2 * i)) + own[i];
        return 1;
    }
    if (bfloat) {
        for (int64_t i = 0; i < n; i++) {
            const float t = from_bfloat(load16(payload + 2 * i)) + own[i];
            target[i] = t;
            worst = magnitude(t) > worst ? magnitude(t) : worst;
            store16(out + 2 * i, to_bfloat(t));
        }
        return worst < BF16_OVERFLOW_BITS;
    }
    for (int64_t i = 0; i < n; i++) {
        const float t = from_half(load16(payload + 2 * i)) + own[i];
        target[i] = t;
        worst = magnitude(t) > worst ? magnitude(t) : worst;
        store16(out + 2 * i, to_half(t));
    }
    return worst < F16_OVERFLOW_BITS;
}

/* ------------------------------------------------------------------ Python entry points */

/* Every entry point takes C-contiguous buffers (numpy arrays; torch tensors through their
 * numpy views), checks their sizes, and releases the GIL while it runs. */

static int check_bfp(Py_ssize_t block, Py_ssize_t width, int rate) {
    if (rate < 2 || rate > 16 || block < 8 || block > 256 || block % 8 || width < 1 ||
        width > 256) {
        PyErr_SetString(PyExc_ValueError, "bfp: rate 2..16, block 8..256 (multiple of 8), "
                                          "width 1..256");
        return 0;
    }
    return 1;
}

static int check_size(Py_ssize_t have, Py_ssize_t need, const char *what) {
    if (have < need) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, %zd needed", what, have, need);
        return 0;
    }
    return 1;
}

static Py_ssize_t bfp_nbytes(Py_ssize_t n, Py_ssize_t block, int rate) {
    return (n + block - 1) / block * (1 + block * rate / 8);
}

static PyObject *py_bfp_encode(PyObject *self, PyObject *args) {
    Py_buffer x, out;
    Py_ssize_t block, width;
    int rate, ok = 0;
    if (!PyArg_ParseTuple(args, "y*w*nni", &x, &out, &block, &width, &rate))
        return NULL;
    Py_ssize_t n = x.len / 4;
    bfp_scratch s;
    if (check_bfp(block, width, rate) &&
        check_size(out.len, bfp_nbytes(n, block, rate), "payload buffer")) {
        bfp_format f;
        bfp_format_init(&f, block, width, rate);
        if (!scratch_init(&s, block * width)) {
            PyErr_NoMemory();
        } else {
            Py_BEGIN_ALLOW_THREADS
            ok = bfp_encode(&f, x.buf, n, out.buf, &s);
            Py_END_ALLOW_THREADS
        }
        scratch_free(&s);
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    return PyErr_Occurred() ? NULL : PyBool_FromLong(ok);
}

static PyObject *py_bfp_decode(PyObject *self, PyObject *args) {
    Py_buffer payload, out;
    Py_ssize_t block, width;
    int rate;
    if (!PyArg_ParseTuple(args, "y*w*nni", &payload, &out, &block, &width, &rate))
        return NULL;
    Py_ssize_t n = out.len / 4;
    bfp_scratch s;
    if (check_bfp(block, width, rate) &&
        check_size(payload.len, bfp_nbytes(n, block, rate), "payload")) {
        bfp_format f;
        bfp_format_init(&f, block, width, rate);
        if (!scratch_init(&s, block * width)) {
            PyErr_NoMemory();
        } else {
            Py_BEGIN_ALLOW_THREADS
            bfp_decode(&f, payload.buf, out.buf, n, &s);
            Py_END_ALLOW_THREADS
        }
        scratch_free(&s);
    }
    PyBuffer_Release(&payload);
    PyBuffer_Release(&out);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_bfp_decode_add_encode(PyObject *self, PyObject *args) {
    Py_buffer payload, own, target, out;
    Py_ssize_t block, width;
    int rate, ok = 0;
    if (!PyArg_ParseTuple(args, "y*y*w*w*nni", &payload, &own, &target, &out, &block, &width,
                          &rate))
        return NULL;
    Py_ssize_t n = target.len / 4, nbytes = bfp_nbytes(n, block, rate);
    bfp_scratch s;
    if (check_bfp(block, width, rate) && check_size(payload.len, nbytes, "payload") &&
        check_size(own.len, target.len, "own") &&
        (out.len == 0 || check_size(out.len, nbytes, "payload buffer"))) {
        bfp_format f;
        bfp_format_init(&f, block, width, rate);
        if (!scratch_init(&s, block * width)) {
            PyErr_NoMemory();
        } else {
            uint8_t *dest = out.len ? out.buf : NULL;
            Py_BEGIN_ALLOW_THREADS
            ok = bfp_decode_add_encode(&f, payload.buf, own.buf, target.buf, n, dest, &s);
            Py_END_ALLOW_THREADS
        }
        scratch_free(&s);
    }
    PyBuffer_Release(&payload);
    PyBuffer_Release(&own);
    PyBuffer_Release(&target);
    PyBuffer_Release(&out);
    return PyErr_Occurred() ? NULL : PyBool_FromLong(ok);
}

static PyObject *py_cast_encode(PyObject *self, PyObject *args) {
    Py_buffer x, out;
    int bfloat, ok = 0;
    if (!PyArg_ParseTuple(args, "y*w*p", &x, &out, &bfloat))
        return NULL;
    Py_ssize_t n = x.len / 4;
    if (check_size(out.len, 2 * n, "payload buffer")) {
        Py_BEGIN_ALLOW_THREADS
        ok = cast_encode(x.buf, n, out.buf, bfloat);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    return PyErr_Occurred() ? NULL : PyBool_FromLong(ok);
}

static PyObject *py_cast_decode(PyObject *self, PyObject *args) {
    Py_buffer payload, out;
    int bfloat;
    if (!PyArg_ParseTuple(args, "y*w*p", &payload, &out, &bfloat))
        return NULL;
    Py_ssize_t n = out.len / 4;
    if (check_size(payload.len, 2 * n, "payload")) {
        Py_BEGIN_ALLOW_THREADS
        cast_decode(payload.buf, out.buf, n, bfloat);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&payload);
    PyBuffer_Release(&out);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_cast_decode_add_encode(PyObject *self, PyObject *args) {
    Py_buffer payload, own, target, out;
    int bfloat, ok = 0;
    if (!PyArg_ParseTuple(args, "y*y*w*w*p", &payload, &own, &target, &out, &bfloat))
        return NULL;
    Py_ssize_t n = target.len / 4;
    if (check_size(payload.len, 2 * n, "payload") && check_size(own.len, target.len, "own") &&
        (out.len == 0 || check_size(out.len, 2 * n, "payload buffer"))) {
        uint8_t *dest = out.len ? out.buf : NULL;
        Py_BEGIN_ALLOW_THREADS
        ok = cast_decode_add_encode(payload.buf, own.buf, target.buf, n, dest, bfloat);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&payload);
    PyBuffer_Release(&own);
    PyBuffer_Release(&target);
    PyBuffer_Release(&out);
    return PyErr_Occurred() ? NULL : PyBool_FromLong(ok);
}

/* f16c(enabled) -> bool: switch the F16C float16 path on or off (tests compare it with
 * the integer code); returns whether it was on. Off where the CPU lacks it. */
static PyObject *py_f16c(PyObject *self, PyObject *args) {
    int enabled;
    if (!PyArg_ParseTuple(args, "p", &enabled))
        return NULL;
#ifdef F16C_PATH
    int was = has_f16c();
    use_f16c = -1;
    use_f16c = enabled && has_f16c();
    return PyBool_FromLong(was);
#else
    (void)enabled;
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef methods[] = {
    {"bfp_encode", py_bfp_encode, METH_VARARGS,
     "bfp_encode(x, out, block, width, rate) -> False if a value is out of range"},
    {"bfp_decode", py_bfp_decode, METH_VARARGS, "bfp_decode(payload, out, block, width, rate)"},
    {"bfp_decode_add_encode", py_bfp_decode_add_encode, METH_VARARGS,
     "bfp_decode_add_encode(payload, own, target, out, block, width, rate): target = "
     "decode(payload) + own, encoded into out unless it is empty; False if out of range"},
    {"cast_encode", py_cast_encode, METH_VARARGS,
     "cast_encode(x, out, bfloat) -> False if a value does not fit"},
    {"cast_decode", py_cast_decode, METH_VARARGS, "cast_decode(payload, out, bfloat)"},
    {"cast_decode_add_encode", py_cast_decode_add_encode, METH_VARARGS,
     "cast_decode_add_encode(payload, own, target, out, bfloat) -> False if out of range"},
    {"f16c", py_f16c, METH_VARARGS,
     "f16c(enabled) -> whether the F16C float16 path was on (for tests)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fused",
    "Fused host kernels of the bfp, fp16 and bf16 codecs (see kernels/fused_kernels.c).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__fused(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "VERSION", KERNELS_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
