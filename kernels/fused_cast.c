/* fp16 and bf16, the casts: value by value, rounding to nearest even as torch does,
 * decoding exactly. float16 uses the F16C instructions where the CPU has them. Shared
 * definitions: fused_kernels.h.
 */
#include "fused_kernels.h"

#define F16_OVERFLOW_BITS 0x477FF000  /* |x| >= 65520 rounds to Inf in float16 */
#define BF16_OVERFLOW_BITS 0x7F7F8000 /* |x| >= 2**128 - 2**119 rounds to Inf in bfloat16 */

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

/* ------------------------------------------------------------------ whole arrays */

/* The loops, written once for both formats: `bfloat` is a constant where they are inlined
 * (below), so each (direction, format) compiles to a loop of its own, no test inside. */
INLINE uint16_t to_bits(float x, const int bfloat) { return bfloat ? to_bfloat(x) : to_half(x); }

INLINE float from_bits(uint16_t h, const int bfloat) {
    return bfloat ? from_bfloat(h) : from_half(h);
}

INLINE int fits(int32_t worst, const int bfloat) {
    return worst < (bfloat ? BF16_OVERFLOW_BITS : F16_OVERFLOW_BITS);
}

INLINE int encode_as(const float *x, int64_t n, uint8_t *out, const int bfloat) {
    int32_t worst = 0;
    for (int64_t i = 0; i < n; i++) {
        worst = magnitude(x[i]) > worst ? magnitude(x[i]) : worst;
        store16(out + 2 * i, to_bits(x[i], bfloat));
    }
    return fits(worst, bfloat);
}

INLINE void decode_as(const uint8_t *payload, float *out, int64_t n, const int bfloat) {
    for (int64_t i = 0; i < n; i++)
        out[i] = from_bits(load16(payload + 2 * i), bfloat);
}

INLINE int decode_add_encode_as(const uint8_t *payload, const float *own, float *target,
                                int64_t n, uint8_t *out, const int bfloat) {
    if (out == NULL) {
        for (int64_t i = 0; i < n; i++)
            target[i] = from_bits(load16(payload + 2 * i), bfloat) + own[i];
        return 1;
    }
    int32_t worst = 0;
    for (int64_t i = 0; i < n; i++) {
        const float t = from_bits(load16(payload + 2 * i), bfloat) + own[i];
        target[i] = t;
        worst = magnitude(t) > worst ? magnitude(t) : worst;
        store16(out + 2 * i, to_bits(t, bfloat));
    }
    return fits(worst, bfloat);
}

CLONED static int encode_cast(const float *x, int64_t n, uint8_t *out, int bfloat) {
#ifdef F16C_PATH
    if (!bfloat && has_f16c())
        return f16c_encode(x, n, out);
#endif
    return bfloat ? encode_as(x, n, out, 1) : encode_as(x, n, out, 0);
}

CLONED static void decode_cast(const uint8_t *payload, float *out, int64_t n, int bfloat) {
#ifdef F16C_PATH
    if (!bfloat && has_f16c()) {
        f16c_decode(payload, out, n);
        return;
    }
#endif
    if (bfloat)
        decode_as(payload, out, n, 1);
    else
        decode_as(payload, out, n, 0);
}

CLONED static int decode_add_encode_cast(const uint8_t *payload, const float *own,
                                        float *target, int64_t n, uint8_t *out, int bfloat) {
#ifdef F16C_PATH
    if (!bfloat && has_f16c())
        return f16c_decode_add_encode(payload, own, target, n, out);
#endif
    return bfloat ? decode_add_encode_as(payload, own, target, n, out, 1)
                  : decode_add_encode_as(payload, own, target, n, out, 0);
}

/* ------------------------------------------------------------------ fused_kernels.h */

/* The cloned kernels above are static (GCC exports the resolver of a cloned function with
 * external linkage; the extension exports nothing but its module): these call them. */

int cast_encode(const float *x, int64_t n, uint8_t *out, int bfloat) {
    return encode_cast(x, n, out, bfloat);
}

void cast_decode(const uint8_t *payload, float *out, int64_t n, int bfloat) {
    decode_cast(payload, out, n, bfloat);
}

int cast_decode_add_encode(const uint8_t *payload, const float *own, float *target, int64_t n,
                           uint8_t *out, int bfloat) {
    return decode_add_encode_cast(payload, own, target, n, out, bfloat);
}

/* The tests compare the F16C path with the integer code. */
int cast_f16c(int enabled) {
#ifdef F16C_PATH
    int was = has_f16c();
    use_f16c = -1;
    use_f16c = enabled && has_f16c();
    return was;
#else
    (void)enabled;
    return 0;
#endif
}
