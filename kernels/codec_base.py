"""What a codec is: the interface every compressor implements, and the helpers they share.

A codec turns a 1-D float array into a *payload*, a contiguous 1-D uint8 array of the
same backend (numpy, torch, cupy) that the Communicator sends as it is, and back.

    payload = codec.encode(x)            # or codec.encode(x, out=preallocated_uint8)
    codec.decode(payload, out)           # fills `out` (same length and dtype as x)

Fixed-size codecs (`fixed_size`) know the payload size from the element count alone
(`encoded_nbytes(count)`), so ranks never exchange sizes. Variable-size codecs frame
their payload with an 8-byte length header; a receiver posts a buffer of
`max_encoded_nbytes(count)` and reads the real size back with `payload_nbytes(buf)`,
so the size travels in-band with the data instead of in an extra message.

On a device, a range check that raised at once would stall the host on every encode
(reading a flag back waits for the kernel). The device kernels vote into a range flag
instead, one per codec and device, allocated once (`_range_flag`); the array-API kernels
on a device keep a device scalar of the largest magnitude they saw (`_defer`).
`check_deferred()`, called outside the timed calls, reads both (and resets the flags) and
raises the same DataError the host would have.

Lossy codecs state `error_bound(amax, dtype)`: the largest absolute error one
encode/decode round trip can add to data whose largest magnitude is `amax`, when the
result is stored in `dtype`. Collectives that compress more than once add these up
(see collectives/compressed.py). NaN, Inf or values outside a lossy codec's range raise
`DataError` instead of being silently corrupted.

The codecs themselves live in codec_cast.py, codec_bfp.py and codec_host.py; codecs.py
builds them from spec strings.
"""

from __future__ import annotations

import array_api_compat

from ccbench.kernels import arrays, switches
from ccbench.kernels.errors import DataError, UsageError
from ccbench.kernels.reduce import add_into
from ccbench.kernels.vocabulary import FLOAT_DTYPES, itemsize
from ccbench.kernels.vocabulary import dtype_name as any_dtype_name

HEADER_NBYTES = 8  # length prefix of variable-size payloads (little-endian uint64)

# Which kernels the codecs with several implementations run (kernels/codec_fused.py):
# 'auto' picks the fused host or device kernels where they apply, 'reference' forces the
# array-API kernels.
KERNELS_ENV = "CCBENCH_CODEC_KERNELS"
KERNEL_MODES = ("auto", "reference")

# Half a unit in the last place, relative, and half the smallest subnormal: the error
# of rounding a value to each dtype.
_HALF_ULP = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
_HALF_TINY = {
    "float64": 2.0**-1075,
    "float32": 2.0**-150,
    "float16": 2.0**-25,
    "bfloat16": 2.0**-134,
}


# ---------------------------------------------------------------- array helpers


def namespace(x):
    """The array-API namespace of `x` (numpy, torch or cupy through array-api-compat)."""
    return array_api_compat.array_namespace(x)


def dtype_name(x) -> str:
    """'float32', 'float16', 'bfloat16' or 'float64' for a float array of any backend."""
    name = any_dtype_name(x)
    if name not in FLOAT_DTYPES:
        raise UsageError(f"codecs take float arrays ({', '.join(FLOAT_DTYPES)}), got {name}")
    return name


def is_host(x) -> bool:
    """True for arrays in host memory (numpy, torch CPU)."""
    if array_api_compat.is_numpy_array(x):
        return True
    if array_api_compat.is_torch_array(x):
        return x.device.type == "cpu"
    return False


def host_numpy(x):
    """Zero-copy numpy view of a host array (torch bfloat16 has none: viewed as uint16)."""
    if array_api_compat.is_numpy_array(x):
        return x
    if array_api_compat.is_torch_array(x) and x.device.type == "cpu":
        import torch

        t = x.detach()
        return t.view(torch.uint16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
    raise UsageError("this codec runs on the CPU only; use bfp, fp16 or bf16 for GPU buffers")


def byte_view(x):
    """The bytes of a contiguous 1-D array, as a uint8 array of the same backend (no copy)."""
    xp = namespace(x)
    return x.view(xp.uint8)


def empty_payload(like, nbytes: int):
    """An uninitialised uint8 payload buffer on the same backend and device as `like`."""
    return arrays.empty_like(like, nbytes, namespace(like).uint8)


def _amax(value) -> float:
    """Largest magnitude of an array, or the float itself."""
    if isinstance(value, (int, float)):
        return abs(float(value))
    xp = namespace(value)
    hi, lo = float(xp.max(value)), float(xp.min(value))
    return max(abs(hi), abs(lo))


def requested_kernels() -> str:
    """'auto' (default) or 'reference', from CCBENCH_CODEC_KERNELS."""
    mode = switches.current().codec_kernels.strip().lower() or "auto"
    if mode not in KERNEL_MODES:
        raise UsageError(f"{KERNELS_ENV}={mode!r}: choose one of {', '.join(KERNEL_MODES)}")
    return mode


def rounding_error(dtype: str, amax: float) -> float:
    """Largest error of rounding values of magnitude <= amax to `dtype`."""
    return _HALF_ULP[dtype] * amax + _HALF_TINY[dtype]


# ---------------------------------------------------------------- the interface


class Codec:
    """A compressor as the collectives see it.

    Subclasses set the class attributes and implement `_encode_into` / `_decode` (and,
    for variable-size codecs, `_encode_bytes`).
    """

    name: str = ""
    lossy: bool = False
    fixed_size: bool = True  # payload size known from the element count alone
    host_only: bool = False  # CPU library: numpy and torch-CPU buffers only
    granularity: int = 1  # chunks of a multiple of this many values encode best

    def __init__(self, spec: str):
        self.spec = spec
        # 'reference' forces the array-API kernels of codecs that have faster ones
        self.kernels = requested_kernels()
        self._worst: dict = {}  # array type -> device int32 scalar: the deferred check
        self._flags: dict = {}  # device -> (device kernels, their range flag there)

    # the deferred range check of device encodes ------------------------------------
    def _range_flag(self, kernels, x):
        """The range flag the device kernels' encodes of `x` vote into: one per codec and
        device, allocated on first use and kept (no allocation per call)."""
        key = kernels.flag_key(x)
        held = self._flags.get(key)
        if held is None:
            held = self._flags[key] = (kernels, kernels.new_flag(x))
        return held[1]

    def _defer(self, worst) -> None:
        """Keep `worst` (a device int32 scalar: the bits of the largest |x| seen, or the
        bits of Inf for a failed check) until check_deferred reads it."""
        kind = type(worst)
        held = self._worst.get(kind)
        self._worst[kind] = worst if held is None else namespace(worst).maximum(held, worst)

    def check_deferred(self) -> None:
        """Raise the DataError a device encode since the last check would have raised
        (one host synchronisation; call it outside the timed calls)."""
        if not (self._worst or self._flags):
            return
        pending, self._worst = list(self._worst.values()), {}
        with arrays.declared():
            worst = max(
                [int(value) for value in pending]
                + [kernels.read_flag(flag) for kernels, flag in self._flags.values()]
            )
        message = self._range_error(worst)
        if message is not None:
            raise DataError(message)

    def _range_error(self, worst: int) -> str | None:
        """The DataError message for a deferred `worst`, or None when it is in range."""
        return None

    def __repr__(self) -> str:
        return f"<codec {self.spec}>"

    # sizes -------------------------------------------------------------
    def encoded_nbytes(self, count: int, dtype: str = "float32") -> int | None:
        """Exact payload size for `count` values (fixed-size codecs), else None."""
        raise NotImplementedError

    def max_encoded_nbytes(self, count: int, dtype: str = "float32") -> int:
        """Receive-buffer size that holds any payload of `count` values."""
        return self.encoded_nbytes(count, dtype)

    def payload_nbytes(self, buf, count: int, dtype: str = "float32") -> int:
        """Size of the payload at the start of `buf` (reads the header if variable)."""
        if self.fixed_size:
            return self.encoded_nbytes(count, dtype)
        return HEADER_NBYTES + read_header(buf)

    def nominal_ratio(self, dtype: str = "float32") -> float:
        """Uncompressed over compressed bytes for a large buffer (fixed-size codecs)."""
        count = 1 << 20
        size = self.encoded_nbytes(count, dtype)
        return float("nan") if size is None else count * itemsize(dtype) / size

    # data --------------------------------------------------------------
    def check_supported(self, buffer: str, dtype: str) -> None:
        """Raise UsageError if this codec cannot run on `buffer` / `dtype`."""
        if dtype not in FLOAT_DTYPES:
            raise UsageError(f"codec {self.spec}: dtype {dtype} is not supported")
        if self.host_only and buffer not in ("numpy", "torch"):
            raise UsageError(
                f"codec {self.spec} runs on the CPU only (numpy or torch "
                f"buffers); use bfp, fp16 or bf16 with -d {buffer}"
            )

    def encode(self, x, out=None):
        """Compress the 1-D array `x`; returns the payload (a view of `out` if given)."""
        if self.fixed_size:
            nbytes = self.encoded_nbytes(x.shape[0], dtype_name(x))
            if out is None:
                out = empty_payload(x, nbytes)
            elif out.shape[0] < nbytes:
                raise ValueError(f"payload buffer of {out.shape[0]} B < {nbytes} B")
            payload = out[:nbytes]
            self._encode_into(x, payload)
            return payload
        body = self._encode_bytes(x)
        return frame(body, out, like=x)

    def decode(self, payload, out):
        """Decompress `payload` into the 1-D array `out` (its length is the count)."""
        if out.shape[0] == 0:
            return out
        if self.fixed_size:
            self._decode(payload, out)
        else:
            self._decode(payload[HEADER_NBYTES : HEADER_NBYTES + read_header(payload)], out)
        return out

    def decode_add_encode(self, payload, own, target, out=None, scratch=None):
        """The reduce-scatter hop: target = decode(payload) + own, then, with `out`, target
        encoded into it; returns that payload (None without `out`). `target` may be `own`.

        This is the reference, the three steps in turn (decoded into `scratch` if given);
        codecs with fused kernels do it in one pass, bit for bit the same.
        """
        n = target.shape[0]
        if scratch is not None:
            incoming = scratch[:n]
        else:
            xp = namespace(target)
            incoming = xp.empty((n,), dtype=target.dtype, device=array_api_compat.device(target))
        self.decode(payload, incoming)
        add_into(target, incoming, own)
        return None if out is None else self.encode(target, out)

    def kernel_path(self, x) -> str:
        """The kernels that encode and decode `x` here: 'fused' (compiled, host), 'device'
        (CUDA) or 'reference' (array-API) for bfp, fp16, bf16; 'library' for the codecs
        backed by a CPU library; 'copy' for none."""
        return "library" if self.host_only else "reference"

    def error_bound(self, x_or_amax, dtype: str | None = None) -> float:
        """Max abs error of one round trip of data with max|x| = amax, stored in dtype."""
        if not self.lossy:
            return 0.0
        dtype = dtype or (dtype_name(x_or_amax) if hasattr(x_or_amax, "dtype") else "float32")
        amax = _amax(x_or_amax)
        err = self._error_bound(amax, dtype)
        if dtype in ("float16", "bfloat16"):  # the decoded value is rounded once more
            err += rounding_error(dtype, amax + err)
        return err

    # hooks -------------------------------------------------------------
    def _encode_into(self, x, payload) -> None:
        raise NotImplementedError

    def _encode_bytes(self, x) -> bytes:
        raise NotImplementedError

    def _decode(self, body, out) -> None:
        raise NotImplementedError

    def _error_bound(self, amax: float, dtype: str) -> float:
        raise NotImplementedError


# ---------------------------------------------------------------- framing


def frame(body, out, like):
    """Payload = 8-byte little-endian length + body; written into `out` if given."""
    import numpy as np

    n = len(body)
    header = np.frombuffer(n.to_bytes(HEADER_NBYTES, "little"), dtype=np.uint8)
    data = np.frombuffer(body, dtype=np.uint8)
    if out is None:
        payload = np.empty(HEADER_NBYTES + n, dtype=np.uint8)
        if array_api_compat.is_torch_array(like):
            import torch

            payload = torch.from_numpy(payload)
    else:
        if out.shape[0] < HEADER_NBYTES + n:
            raise ValueError(f"payload buffer of {out.shape[0]} B < {HEADER_NBYTES + n} B")
        payload = out[: HEADER_NBYTES + n]
    view = host_numpy(payload)
    view[:HEADER_NBYTES] = header
    view[HEADER_NBYTES:] = data
    return payload


def read_header(buf) -> int:
    """Body length stored in the first 8 bytes of a framed payload."""
    head = host_numpy(buf[:HEADER_NBYTES])
    return int.from_bytes(head.tobytes(), "little")


# ---------------------------------------------------------------- simple codecs


class NoneCodec(Codec):
    """No compression: the payload is the data's own bytes (a view, or copied into out)."""

    name = "none"

    def encoded_nbytes(self, count, dtype="float32"):
        return count * itemsize(dtype)

    def kernel_path(self, x) -> str:
        return "copy"

    def encode(self, x, out=None):
        data = byte_view(x)
        if out is None:
            return data
        payload = out[: data.shape[0]]
        payload[...] = data
        return payload

    def _decode(self, payload, out):
        view = byte_view(out)
        view[...] = payload[: view.shape[0]]
