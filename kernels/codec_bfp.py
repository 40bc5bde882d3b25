"""bfp: a fixed-rate block-floating-point codec, ZFP-like, written once for every backend.

Format (little-endian bytes, one source for numpy, torch, cupy and torch-CUDA):

* Values are cut into tiles of B x W (B = `block`, W = TILE_WIDTH = 256); the last
  tile keeps only ceil(rest / B) columns and is zero-padded. Inside a tile the value
  at row i, column j is element i * W + j, and a *block* is one column: B values
  that share one exponent. Columns rather than rows so that every kernel step is an
  elementwise operation over long contiguous rows (fast on CPUs and coalesced on
  GPUs) while a block still only spans B * W neighbouring values.
* Per block: one byte E and B integers q of R bits (two's complement). The block's
  values are x = q * step with step = 2**(emax - R + 1), emax = E - 126, where emax
  is the smallest exponent (>= -126) with max|x| < 2**emax * (1 - 2**-R): then
  |q| <= 2**(R-1) - 1 after rounding.
* A tile is stored as [bit planes][W exponent bytes], the R bits of each value split
  into pieces of 16, 8, 4, 2 and 1 bits (16-bit pieces little-endian). A piece of
  w < 8 bits is stored as B * w / 8 byte rows: bits j*w..(j+1)*w-1 of byte row r
  hold row r + j * B * w / 8 of the tile.

Size: ceil(count / B) * (1 + B * R / 8) bytes, for every input dtype (float16,
bfloat16 and float64 pass through float32). Error of one round trip: half a step,
|x - y| <= 2**(emax - R) <= 2**(1 - R) * max|x| of the block, computed exactly (the
rounding is one correctly rounded float32 add, decoding an exact multiply by a power
of two). With emax from the global max |x| this bounds the whole array. NaN, Inf and
|x| >= 2**(102 + R) raise DataError (on a device, when the codec's deferred check is
read: codec_base.Codec.check_deferred).

Quantising is one add: x + C with C = 1.5 * 2**23 * step lies in [2**23, 2**24) *
step, where float32 spacing is exactly `step`, so the sum is x rounded to a multiple
of step (ties to even) and its low mantissa bits hold q in two's complement.
"""

from __future__ import annotations

import math

import array_api_compat

from ccbench.kernels import codec_fused as fused
from ccbench.kernels.codec_base import Codec, is_host, namespace, rounding_error
from ccbench.kernels.errors import DataError
from ccbench.kernels.vocabulary import FLOAT_DTYPES

TILE_WIDTH = 256  # W: columns (blocks) per tile
SLAB_VALUES = 1 << 17  # values encoded per step: temporaries stay in cache


def rate_pieces(rate: int) -> list[tuple[int, int]]:
    """(bit offset, width) of the pieces the R bits of a value are stored in."""
    pieces, offset = [], 0
    for width in (16, 8, 4, 2, 1):
        if rate - offset >= width:
            pieces.append((offset, width))
            offset += width
    return pieces


class BfpCodec(Codec):
    """Fixed-rate block floating point: R bits per value + 1 exponent byte per block."""

    name = "bfp"
    lossy = True

    def __init__(self, spec: str, rate: int, block: int = 32):
        super().__init__(spec)
        self.rate = rate
        self.block = block
        self.max_exponent = 102 + rate  # |x| < 2**(102 + R): C stays finite
        self.limit_bits = (self.max_exponent + 127) << 23
        self.block_nbytes = 1 + block * rate // 8
        self.pieces = rate_pieces(rate)
        self.granularity = block * TILE_WIDTH  # whole tiles: no padding inside a chunk

    # sizes --------------------------------------------------------------
    def encoded_nbytes(self, count, dtype="float32"):
        return -(-count // self.block) * self.block_nbytes

    def _tile_nbytes(self, width: int) -> int:
        return width * self.block_nbytes

    # dispatch: fused host kernels, device kernels, or the array-API reference below
    def kernel_path(self, x) -> str:
        return fused.path(self, x, FLOAT_DTYPES)

    def _encode_into(self, x, payload):
        path = self.kernel_path(x)
        if path == "fused" and fused.bfp_encode(self, x, payload, TILE_WIDTH):
            return
        if path == "device":  # the range check is read later (check_deferred)
            kernels = fused.device_kernels(x)
            kernels.bfp_encode(self, x, payload, TILE_WIDTH, self._range_flag(kernels, x))
            return
        self._reference_encode(x, payload)  # also where the fast kernels refused the data

    def _decode(self, payload, out):
        path = self.kernel_path(out)
        if path == "fused":
            fused.bfp_decode(self, payload, out, TILE_WIDTH)
        elif path == "device":
            fused.device_kernels(out).bfp_decode(self, payload, out, TILE_WIDTH)
        else:
            self._reference_decode(payload, out)

    def decode_add_encode(self, payload, own, target, out=None, scratch=None):
        n = target.shape[0]
        path = fused.hop_path(self, payload, own, target) if n else "reference"
        if path == "reference":
            return super().decode_add_encode(payload, own, target, out, scratch)
        payload_out = None if out is None else out[: self.encoded_nbytes(n)]
        if path == "device":  # a sum's range check is read later (check_deferred)
            kernels = fused.device_kernels(target)
            kernels.bfp_decode_add_encode(
                self,
                payload,
                own,
                target,
                payload_out,
                TILE_WIDTH,
                self._range_flag(kernels, target),
            )
            return payload_out
        if not fused.bfp_decode_add_encode(self, payload, own, target, payload_out, TILE_WIDTH):
            self._reference_encode(target, payload_out)  # the sums: raises the reference's error
        return payload_out

    # encode (reference) ----------------------------------------------------
    def _reference_encode(self, x, payload):
        xp = namespace(x)
        scratch = None  # int32 work array, one slab long, reused across slabs
        for x3, region in self._tiles(xp, x, payload, encode=True):
            if scratch is None or scratch.shape[0] < x3.shape[0] * x3.shape[1] * x3.shape[2]:
                scratch = xp.empty(
                    (x3.shape[0] * x3.shape[1] * x3.shape[2],),
                    dtype=xp.int32,
                    device=array_api_compat.device(x3),
                )
            work = xp.reshape(scratch[: x3.shape[0] * x3.shape[1] * x3.shape[2]], x3.shape)
            self._encode_tiles(xp, x3, region, work)

    def _reference_decode(self, payload, out):
        xp = namespace(out)
        for out3, region, finish in self._tiles(xp, out, payload, encode=False):
            self._decode_tiles(xp, region, out3)
            finish()

    def _tiles(self, xp, arr, payload, encode: bool):
        """Yield (values (k, B, W) float32, payload region (k, tile bytes)) slab by slab.

        Encoding converts each slab to float32 if needed; decoding yields a float32
        destination and a `finish()` that stores it into `arr` (a no-op when `arr` is
        float32 itself and the slab is whole tiles).
        """
        n, block = arr.shape[0], self.block
        tile = block * TILE_WIDTH
        full = n // tile
        step = max(1, SLAB_VALUES // tile)
        tile_nbytes = self._tile_nbytes(TILE_WIDTH)
        direct = arr.dtype == xp.float32
        for first in range(0, full, step):
            k = min(step, full - first)
            values = arr[first * tile : (first + k) * tile]
            region = payload[first * tile_nbytes : (first + k) * tile_nbytes]
            region = xp.reshape(region, (k, tile_nbytes))
            if encode:
                x32 = values if direct else xp.astype(values, xp.float32)
                yield xp.reshape(x32, (k, block, TILE_WIDTH)), region
            elif direct:
                yield xp.reshape(values, (k, block, TILE_WIDTH)), region, _nothing
            else:
                tmp = xp.empty(
                    (k, block, TILE_WIDTH), dtype=xp.float32, device=array_api_compat.device(arr)
                )
                yield tmp, region, _copy_back(values, tmp)
        rest = n - full * tile
        if rest:
            width = -(-rest // block)
            values = arr[full * tile :]
            start = full * tile_nbytes
            region = xp.reshape(
                payload[start : start + self._tile_nbytes(width)], (1, self._tile_nbytes(width))
            )
            padded = xp.zeros(
                (block * width,), dtype=xp.float32, device=array_api_compat.device(arr)
            )
            if encode:
                padded[:rest] = values if direct else xp.astype(values, xp.float32)
                yield xp.reshape(padded, (1, block, width)), region
            else:
                finish = _copy_back(values, padded[:rest])
                yield xp.reshape(padded, (1, block, width)), region, finish

    def _encode_tiles(self, xp, x3, region, scratch):
        k, block, width = x3.shape
        # |x| as bits: the int32 max of (bits & 0x7fffffff) is the block's max |x|;
        # NaN and Inf sort above every finite value.
        xp.bitwise_and(x3.view(xp.int32), 0x7FFFFFFF, out=scratch)
        amax_bits = xp.max(scratch, axis=1)  # (k, W)
        if not is_host(x3):  # the device does not wait: checked later (check_deferred)
            self._defer(xp.max(amax_bits))
        elif not bool(xp.all(amax_bits < self.limit_bits)):
            raise DataError(_bad_message(int(xp.max(amax_bits)), self))
        biased = self._block_exponents(xp, amax_bits)
        region[:, region.shape[1] - width :] = biased
        # x + C, C = 1.5 * 2**23 * step: the sum is x rounded to a multiple of step, and
        # its low mantissa bits are q in two's complement (C's low 22 bits are zero)
        magic = (((biased + (25 - self.rate)) << 23) | 0x400000).view(xp.float32)
        xp.add(x3, xp.reshape(magic, (k, 1, width)), out=scratch.view(xp.float32))
        self._pack(xp, scratch, region, width)

    def _block_exponents(self, xp, amax_bits):
        """E = emax + 126 per block: the smallest emax >= -126 with
        max|x| < 2**emax * (1 - 2**-R), so that |q| <= 2**(R-1) - 1 after rounding."""
        biased = amax_bits >> 23  # max|x| < 2**(E - 126)
        pow2 = ((biased + 1) << 23).view(xp.float32)  # 2**(E - 126)
        edge = pow2 - pow2 * 2.0**-self.rate  # exact
        bump = xp.astype(amax_bits.view(xp.float32) >= edge, xp.int32)
        return biased + bump

    def _pack(self, xp, bits, region, width):
        """Store the low R bits of `bits` (k, B, W) into the planes of `region`.

        `bits` is scratch: shifted in place. Pieces narrower than a byte are cut down
        to one byte per value first, so the packing works on uint8, not int32.
        """
        k, block = bits.shape[0], bits.shape[1]
        start, shifted, byte = 0, 0, None
        for offset, piece in self.pieces:
            dest, start = self._plane(xp, region, start, k, block, width, piece)
            if offset > shifted:
                bits >>= offset - shifted
                shifted = offset
            if piece >= 8:
                _store(dest, bits)  # keeps the low 8 or 16 bits
                continue
            if byte is None:
                byte = xp.empty(bits.shape, dtype=xp.uint8, device=array_api_compat.device(bits))
            byte[...] = bits  # low byte
            # segment j of B / g consecutive rows goes to bits j*w.. of the packed rows
            mask, rows = (1 << piece) - 1, dest.shape[1]
            head = byte[:, :rows, :]
            head &= mask
            for j in range(1, 8 // piece):
                seg = byte[:, j * rows : (j + 1) * rows, :]
                seg &= mask
                seg <<= piece * j
                head |= seg
            dest[...] = head

    def _plane(self, xp, region, start, k, block, width, piece):
        """The (k, rows, W) view of one piece's plane in `region`, and the next offset.

        A 16-bit piece is a little-endian int16 plane; where the payload is not 2-byte
        aligned and the backend cannot view it as int16 (torch), it stays bytes
        (k, B, W, 2) and `_store` / `_load16` go through an int16 temporary.
        """
        nbytes = block * piece // 8 * width
        dest = region[:, start : start + nbytes]
        if piece == 16:
            try:
                return xp.reshape(dest.view(xp.int16), (k, block, width)), start + nbytes
            except (RuntimeError, ValueError):
                return xp.reshape(dest, (k, block, width, 2)), start + nbytes
        return xp.reshape(dest, (k, block * piece // 8, width)), start + nbytes

    def _decode_tiles(self, xp, region, out3):
        k, block, width = out3.shape
        biased = xp.astype(region[:, region.shape[1] - width :], xp.int32)
        # step = 2**(E - 126) * 2**(1 - R): exact, also where it is subnormal
        step = ((biased + 1) << 23).view(xp.float32) * 2.0 ** (1 - self.rate)
        # q = sum of pieces * 2**offset, summed in float32 (exact: |q| < 2**15)
        start = 0
        for i, (offset, piece) in enumerate(self.pieces):
            plane, start = self._plane(xp, region, start, k, block, width, piece)
            top = i == len(self.pieces) - 1
            for rows, part in _piece_values(xp, plane, piece, signed=top):
                dest = out3 if rows is None else out3[:, rows, :]
                if i == 0:
                    dest[...] = part
                else:
                    extra = xp.astype(part, xp.float32)
                    extra *= float(1 << offset)
                    dest += extra
        out3 *= xp.reshape(step, (k, 1, width))

    def _range_error(self, worst):
        return _bad_message(worst, self) if worst >= self.limit_bits else None

    # error --------------------------------------------------------------
    def _error_bound(self, amax, dtype):
        staged = amax * (1 + 2.0**-23) if dtype == "float64" else amax
        emax = max(math.frexp(staged)[1], -126) if staged > 0 else -126  # amax < 2**emax
        if staged >= 2.0**emax * (1 - 2.0**-self.rate):
            emax += 1
        err = 2.0 ** (emax - self.rate)  # half a step, exact arithmetic
        if dtype == "float64":  # float64 passes through float32
            err += rounding_error("float32", amax)
        return err


def _nothing():
    pass


def _store(dest, bits):
    """dest[...] = bits (low bits kept), for an 8/16-bit plane or a (..., 2) byte one."""
    if dest.ndim == bits.ndim:
        dest[...] = bits
        return
    xp = namespace(bits)
    dest[...] = xp.reshape(xp.astype(bits, xp.int16).view(xp.uint8), dest.shape)


def _piece_values(xp, plane, piece, signed):
    """(rows or None, integers) of one piece's plane; the top piece holds the sign."""
    if piece == 16:
        yield None, _load16(xp, plane)
        return
    if piece == 8:
        yield None, plane.view(xp.int8) if signed else plane
        return
    mask, half, rows = (1 << piece) - 1, 1 << (piece - 1), plane.shape[1]
    for j in range(8 // piece):
        part = (plane >> (piece * j)) & mask
        if signed:  # sign-extend the w-bit field
            part = xp.astype(part ^ half, xp.int8) - half
        yield slice(j * rows, (j + 1) * rows), part


def _load16(xp, plane):
    """A 16-bit plane as int16 (copied out of a (k, B, W, 2) byte plane if unaligned)."""
    if plane.ndim == 3:
        return plane
    flat = xp.empty(
        (plane.shape[0], plane.shape[1] * plane.shape[2] * 2),
        dtype=xp.uint8,
        device=array_api_compat.device(plane),
    )
    flat[...] = xp.reshape(plane, flat.shape)
    return xp.reshape(flat.view(xp.int16), plane.shape[:3])


def _copy_back(dest, src):
    """A finish() that copies the float32 result `src` into `dest` (other dtype)."""

    def finish():
        dest[...] = src.reshape(dest.shape)

    return finish


def _bad_message(worst: int, codec) -> str:
    """The DataError of data whose largest |x| has the float32 bits `worst`."""
    what = (
        "NaN"
        if worst > 0x7F800000
        else "Inf"
        if worst == 0x7F800000
        else f"|x| >= 2**{codec.max_exponent}"
    )
    return (
        f"codec {codec.spec}: input contains {what}, outside the codec's range "
        f"(finite, |x| < 2**{codec.max_exponent})"
    )
