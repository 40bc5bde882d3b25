"""Codecs: one interface for every compressor the collectives use, and one spec parser.

A codec turns a 1-D float array into a *payload*, a contiguous 1-D uint8 array of the
same backend (numpy, torch, cupy) that the Communicator sends as it is, and back.

    codec = parse_codec("bfp:rate=8")
    payload = codec.encode(x)            # or codec.encode(x, out=preallocated_uint8)
    codec.decode(payload, out)           # fills `out` (same length and dtype as x)

Fixed-size codecs (`fixed_size`) know the payload size from the element count alone
(`encoded_nbytes(count)`), so ranks never exchange sizes. Variable-size codecs frame
their payload with an 8-byte length header; a receiver posts a buffer of
`max_encoded_nbytes(count)` and reads the real size back with `payload_nbytes(buf)`,
so the size travels in-band with the data instead of in an extra message.

Lossy codecs state `error_bound(amax, dtype)`: the largest absolute error one
encode/decode round trip can add to data whose largest magnitude is `amax`, when the
result is stored in `dtype`. Collectives that compress more than once add these up
(see collectives/compressed.py). NaN, Inf or values outside a lossy codec's range raise
`DataError` instead of being silently corrupted.

Spec strings: `name` or `name:key=value[,key=value]`, e.g. `none`, `fp16`, `bf16`,
`bfp:rate=8`, `bfp:rate=4,block=64`, `zfp:rate=8`, `zfp:tol=1e-3`, `zstd:level=3`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import array_api_compat

from benchmarks.errors import UsageError

FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
HEADER_NBYTES = 8  # length prefix of variable-size payloads (little-endian uint64)

# Half a unit in the last place, relative, and half the smallest subnormal: the error
# of rounding a value to each dtype.
_HALF_ULP = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
_HALF_TINY = {"float64": 2.0**-1075, "float32": 2.0**-150, "float16": 2.0**-25,
              "bfloat16": 2.0**-134}


# ---------------------------------------------------------------- array helpers

def namespace(x):
    """The array-API namespace of `x` (numpy, torch or cupy through array-api-compat)."""
    return array_api_compat.array_namespace(x)


def dtype_name(x) -> str:
    """'float32', 'float16', 'bfloat16' or 'float64' for an array of any backend."""
    name = str(x.dtype).rsplit(".", 1)[-1]
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
    xp = namespace(like)
    return xp.empty((nbytes,), dtype=xp.uint8, device=array_api_compat.device(like))


def _amax(value) -> float:
    """Largest magnitude of an array, or the float itself."""
    if isinstance(value, (int, float)):
        return abs(float(value))
    xp = namespace(value)
    hi, lo = float(xp.max(value)), float(xp.min(value))
    return max(abs(hi), abs(lo))


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
    fixed_size: bool = True     # payload size known from the element count alone
    host_only: bool = False     # CPU library: numpy and torch-CPU buffers only
    granularity: int = 1        # chunks of a multiple of this many values encode best

    def __init__(self, spec: str):
        self.spec = spec

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
            raise UsageError(f"codec {self.spec} runs on the CPU only (numpy or torch "
                             f"buffers); use bfp, fp16 or bf16 with -d {buffer}")

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
            self._decode(payload[HEADER_NBYTES:HEADER_NBYTES + read_header(payload)], out)
        return out

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


def itemsize(dtype: str) -> int:
    return {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}[dtype]


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
        payload = out[:HEADER_NBYTES + n]
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

    def encode(self, x, out=None):
        data = byte_view(x)
        if out is None:
            return data
        payload = out[:data.shape[0]]
        payload[...] = data
        return payload

    def _decode(self, payload, out):
        view = byte_view(out)
        view[...] = payload[:view.shape[0]]


class CastCodec(Codec):
    """Cast to float16 or bfloat16 (2 bytes per value), the DDP / Horovod hooks' codec."""

    lossy = True

    def __init__(self, spec: str, target: str):
        super().__init__(spec)
        self.name = "fp16" if target == "float16" else "bf16"
        self.target = target

    def encoded_nbytes(self, count, dtype="float32"):
        return 2 * count

    def _encode_into(self, x, payload):
        from kernels import codec_cast

        codec_cast.cast_into(x, payload, self.target, self.spec)

    def _decode(self, payload, out):
        from kernels import codec_cast

        codec_cast.uncast_into(payload[:2 * out.shape[0]], out, self.target)

    def _error_bound(self, amax, dtype):
        err = rounding_error(self.target, amax)
        if self.target == "bfloat16" and dtype == "float64":
            err += rounding_error("float32", amax)  # bf16 of float64 goes through float32
        return err


# ---------------------------------------------------------------- spec parser

def _int_in(lo: int, hi: int, multiple: int = 1) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi or value % multiple:
            extra = f", a multiple of {multiple}" if multiple > 1 else ""
            raise ValueError(f"an integer in {lo}..{hi}{extra}")
        return value
    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise ValueError("a positive finite number")
    return value


def _make_bfp(spec, p):
    from kernels.codec_bfp import BfpCodec

    return BfpCodec(spec, rate=p["rate"], block=p["block"])


def _make_zfp(spec, p):
    from kernels import codec_host

    if ("rate" in p) == ("tol" in p):
        raise UsageError(f"codec '{spec}': zfp takes exactly one of rate=R (fixed rate, "
                         "3..32 bits per value) or tol=E (absolute error tolerance)")
    if "rate" in p:
        return codec_host.ZfpRateCodec(spec, rate=p["rate"])
    return codec_host.ZfpTolCodec(spec, tol=p["tol"])


def _make_zstd(spec, p):
    from kernels import codec_host

    return codec_host.ZstdCodec(spec, level=p["level"])


# name -> (constructor, {param: (parser, default or REQUIRED)}, help)
REQUIRED = object()
CODECS: dict[str, tuple[Callable[[str, dict], Codec], dict[str, tuple[Any, Any]], str]] = {
    "none": (lambda spec, p: NoneCodec(spec), {}, "no compression (bytes as they are)"),
    "fp16": (lambda spec, p: CastCodec(spec, "float16"), {}, "cast to float16"),
    "bf16": (lambda spec, p: CastCodec(spec, "bfloat16"), {}, "cast to bfloat16"),
    "bfp": (_make_bfp, {"rate": (_int_in(2, 16), REQUIRED),
                        "block": (_int_in(8, 256, multiple=8), 32)},
            "block floating point, R bits per value + one exponent byte per block"),
    "zfp": (_make_zfp, {"rate": (_int_in(3, 32), None), "tol": (_positive_float, None)},
            "ZFP (zfpy), fixed rate R bits per value or fixed accuracy tol=E"),
    "zstd": (_make_zstd, {"level": (_int_in(-7, 22), 1)},
             "lossless: byte shuffle + zstd (stands in for MPC)"),
}


def parse_codec(spec: str) -> Codec:
    """Build a codec from a spec string; raises UsageError on anything malformed."""
    text = (spec or "").strip()
    name, _, rest = text.partition(":")
    name = name.strip().lower()
    if name not in CODECS:
        raise UsageError(f"unknown codec '{spec}' (known: {', '.join(CODECS)})")
    make, params, _ = CODECS[name]
    given: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip().lower()
        if not eq or key not in params:
            known = ", ".join(params) or "none"
            raise UsageError(f"codec '{spec}': unknown parameter '{item}' "
                             f"(parameters of {name}: {known})")
        if key in given:
            raise UsageError(f"codec '{spec}': parameter '{key}' given twice")
        given[key] = value.strip()
    values: dict[str, Any] = {}
    for key, (parse, default) in params.items():
        if key in given:
            try:
                values[key] = parse(given[key])
            except ValueError as err:
                raise UsageError(f"codec '{spec}': {key} must be {err}, "
                                 f"got '{given[key]}'") from None
        elif default is REQUIRED:
            raise UsageError(f"codec '{spec}': {name} needs {key}=..., e.g. {name}:{key}=8")
        elif default is not None:
            values[key] = default
    # canonical spec (CSV `codec` column): given parameters that differ from the default
    shown = [k for k in params if k in given and values[k] != params[k][1]]
    canonical = name + "".join((":" if i == 0 else ",") + f"{k}={_format(values[k])}"
                               for i, k in enumerate(shown))
    return make(canonical, values)


def _format(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def describe_codecs() -> str:
    """One line per codec for --help texts."""
    lines = []
    for name, (_, params, text) in CODECS.items():
        keys = ",".join(f"{k}=..." for k in params)
        lines.append(f"{name}{':' + keys if keys else ''}  {text}")
    return "\n".join(lines)
