/* bfp, the block floating point codec: one tile at a time (B x W values, 32 KiB at
 * B = 32, W = 256). The block maxima, then quantising and packing, read the tile twice,
 * the second time from cache. It quantises with the float32 add of codec_bfp.py's
 * array-API kernel and decodes with the same exact multiply. The format is documented
 * in codec_bfp.py; this file only follows it. Shared definitions: fused_kernels.h.
 */
#include <stdlib.h>

#include "fused_kernels.h"

/* ------------------------------------------------------------------ bfp, one tile */

/* The R bits of a value are stored in pieces of 16, 8, 4, 2 and 1 bits, from the low
 * bits, each where it fits in the bits left (R = 13: 8, 4 and 1 bits at offsets 0, 8 and
 * 12): the width of the piece at bit `offset`, 0 past the last. */
INLINE int piece_at(int rate, int offset) {
    int piece = 16;
    while (piece > rate - offset)
        piece >>= 1;
    return piece;
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
    for (int offset = 0, piece; (piece = piece_at(rate, offset)) != 0; offset += piece) {
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
    for (int offset = 0, piece; (piece = piece_at(rate, offset)) != 0; offset += piece) {
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
    }
}

/* ------------------------------------------------------------------ bfp, whole arrays */

int scratch_init(bfp_scratch *s, int64_t tile) {
    s->q = malloc(tile * sizeof(int32_t));
    s->tile = calloc(tile, sizeof(float));
    return s->q != NULL && s->tile != NULL;
}

void scratch_free(bfp_scratch *s) {
    free(s->q);
    free(s->tile);
}

static int64_t tile_nbytes(const bfp_format *f, int64_t width) {
    return width * (1 + f->block * f->rate / 8);
}

CLONED static int encode_bfp(const bfp_format *f, const float *x, int64_t n, uint8_t *out,
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

CLONED static void decode_bfp(const bfp_format *f, const uint8_t *payload, float *out,
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
CLONED static int decode_add_encode_bfp(const bfp_format *f, const uint8_t *payload,
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

/* ------------------------------------------------------------------ fused_kernels.h */

/* The cloned kernels above are static (GCC exports the resolver of a cloned function with
 * external linkage; the extension exports nothing but its module): these call them. */

int bfp_encode(const bfp_format *f, const float *x, int64_t n, uint8_t *out, bfp_scratch *s) {
    return encode_bfp(f, x, n, out, s);
}

void bfp_decode(const bfp_format *f, const uint8_t *payload, float *out, int64_t n,
                bfp_scratch *s) {
    decode_bfp(f, payload, out, n, s);
}

int bfp_decode_add_encode(const bfp_format *f, const uint8_t *payload, const float *own,
                          float *target, int64_t n, uint8_t *out, bfp_scratch *s) {
    return decode_add_encode_bfp(f, payload, own, target, n, out, s);
}
