/* The fused host kernels of the fixed-rate codecs, shared by their files: the checks on
 * the compiler and the host, the CPU dispatch, the bit helpers, the bfp format, and the
 * whole-array kernels that fused_module.c (the Python entry points) calls.
 *
 * fused_bfp.c: bfp, tile by tile. fused_cast.c: fp16 and bf16, value by value.
 *
 * Each kernel is one pass over memory and writes the bytes the array-API kernels of
 * codec_bfp.py and codec_cast.py write (the reference and the device path), and decodes
 * to the same floats. What a kernel cannot carry (NaN, Inf, out of range) it reports by
 * returning 0, and the Python side reruns the reference, which raises the reference's
 * DataError. Payloads are little-endian: the 16-bit loads and stores assume a
 * little-endian host.
 *
 * On x86-64 Linux the whole-array kernels are cloned for AVX2 and chosen at load time
 * (GCC/Clang target_clones), so one build uses the wide vectors of the host it runs on.
 */
#ifndef CCBENCH_FUSED_KERNELS_H
#define CCBENCH_FUSED_KERNELS_H

#include <stdint.h>
#include <string.h>

/* Bit-identical results need float arithmetic evaluated in float precision. */
#if defined(__FLT_EVAL_METHOD__) && __FLT_EVAL_METHOD__ != 0
#error "float arithmetic must be evaluated in float precision (SSE, not x87)"
#endif
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the payload format is little-endian"
#endif

#if defined(__linux__) && defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define CLONED __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef CLONED
#define CLONED
#endif
#define INLINE static inline __attribute__((always_inline))
/* shared by this extension's files, not exported by it */
#define INTERNAL __attribute__((visibility("hidden")))

INLINE int32_t bits_of(float x) { int32_t b; memcpy(&b, &x, 4); return b; }
INLINE float float_of(int32_t b) { float x; memcpy(&x, &b, 4); return x; }
INLINE int32_t shl(int32_t v, int by) { return (int32_t)((uint32_t)v << by); }

/* ------------------------------------------------------------------ bfp (fused_bfp.c) */

typedef struct {
    int64_t block, width;   /* B, W of a whole tile */
    int rate;               /* R */
    int32_t limit;          /* bit pattern of 2**(102 + R): |x| must stay below */
} bfp_format;

INLINE void bfp_format_init(bfp_format *f, int64_t block, int64_t width, int rate) {
    f->block = block;
    f->width = width;
    f->rate = rate;
    f->limit = (102 + rate + 127) << 23;
}

typedef struct {
    int32_t amax[256];
    float magic[256], step[256];
    int32_t *q;        /* one tile */
    float *tile;       /* one tile: the padded last tile, decoded values */
} bfp_scratch;

/* 0 when an allocation failed; scratch_free after either way. */
INTERNAL int scratch_init(bfp_scratch *s, int64_t tile);
INTERNAL void scratch_free(bfp_scratch *s);

/* 0 if a value is out of range (nothing is promised about `out` then). */
INTERNAL int bfp_encode(const bfp_format *f, const float *x, int64_t n, uint8_t *out,
                        bfp_scratch *s);
INTERNAL void bfp_decode(const bfp_format *f, const uint8_t *payload, float *out, int64_t n,
                         bfp_scratch *s);
/* target = decode(payload) + own, encoded into out unless it is NULL; 0 if a sum is out of
 * range (target still holds all the sums). */
INTERNAL int bfp_decode_add_encode(const bfp_format *f, const uint8_t *payload,
                                   const float *own, float *target, int64_t n, uint8_t *out,
                                   bfp_scratch *s);

/* ------------------------------------------------------------------ casts (fused_cast.c) */

/* bfloat: 1 for bfloat16, 0 for float16. The same contracts as the bfp kernels. */
INTERNAL int cast_encode(const float *x, int64_t n, uint8_t *out, int bfloat);
INTERNAL void cast_decode(const uint8_t *payload, float *out, int64_t n, int bfloat);
INTERNAL int cast_decode_add_encode(const uint8_t *payload, const float *own, float *target,
                                    int64_t n, uint8_t *out, int bfloat);
/* Switch the F16C float16 path on or off (off where the CPU lacks it); returns whether it
 * was on. */
INTERNAL int cast_f16c(int enabled);

#endif
