"""Codecs by name: one spec parser for every compressor the collectives use.

    codec = parse_codec("bfp:rate=8")
    payload = codec.encode(x)
    codec.decode(payload, out)

Spec strings: `name` or `name:key=value[,key=value]`, e.g. `none`, `fp16`, `bf16`,
`bfp:rate=8`, `bfp:rate=4,block=64`, `zfp:rate=8`, `zfp:tol=1e-3`, `zstd:level=3`.
The interface every codec implements is in codec_base.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ccbench.kernels import codec_fused
from ccbench.kernels.codec_base import Codec, NoneCodec
from ccbench.kernels.codec_bfp import BfpCodec
from ccbench.kernels.codec_cast import CastCodec
from ccbench.kernels.codec_host import ZfpRateCodec, ZfpTolCodec, ZstdCodec
from ccbench.kernels.errors import UsageError

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
    return BfpCodec(spec, rate=p["rate"], block=p["block"])


def _make_zfp(spec, p):
    if ("rate" in p) == ("tol" in p):
        raise UsageError(
            f"codec '{spec}': zfp takes exactly one of rate=R (fixed rate, "
            "3..32 bits per value) or tol=E (absolute error tolerance)"
        )
    if "rate" in p:
        return ZfpRateCodec(spec, rate=p["rate"])
    return ZfpTolCodec(spec, tol=p["tol"])


def _make_zstd(spec, p):
    return ZstdCodec(spec, level=p["level"])


# name -> (constructor, {param: (parser, default or REQUIRED)}, help)
REQUIRED = object()
CODECS: dict[str, tuple[Callable[[str, dict], Codec], dict[str, tuple[Any, Any]], str]] = {
    "none": (lambda spec, p: NoneCodec(spec), {}, "no compression (bytes as they are)"),
    "fp16": (lambda spec, p: CastCodec(spec, "float16"), {}, "cast to float16"),
    "bf16": (lambda spec, p: CastCodec(spec, "bfloat16"), {}, "cast to bfloat16"),
    "bfp": (
        _make_bfp,
        {"rate": (_int_in(2, 16), REQUIRED), "block": (_int_in(8, 256, multiple=8), 32)},
        "block floating point, R bits per value + one exponent byte per block",
    ),
    "zfp": (
        _make_zfp,
        {"rate": (_int_in(3, 32), None), "tol": (_positive_float, None)},
        "ZFP (zfpy), fixed rate R bits per value or fixed accuracy tol=E",
    ),
    "zstd": (
        _make_zstd,
        {"level": (_int_in(-7, 22), 1)},
        "lossless: byte shuffle + zstd (stands in for MPC)",
    ),
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
            raise UsageError(
                f"codec '{spec}': unknown parameter '{item}' (parameters of {name}: {known})"
            )
        if key in given:
            raise UsageError(f"codec '{spec}': parameter '{key}' given twice")
        given[key] = value.strip()
    values: dict[str, Any] = {}
    for key, (parse, default) in params.items():
        if key in given:
            try:
                values[key] = parse(given[key])
            except ValueError as err:
                raise UsageError(
                    f"codec '{spec}': {key} must be {err}, got '{given[key]}'"
                ) from None
        elif default is REQUIRED:
            raise UsageError(f"codec '{spec}': {name} needs {key}=..., e.g. {name}:{key}=8")
        elif default is not None:
            values[key] = default
    # canonical spec (CSV `codec` column): given parameters that differ from the default
    shown = [k for k in params if k in given and values[k] != params[k][1]]
    canonical = name + "".join(
        (":" if i == 0 else ",") + f"{k}={_format(values[k])}" for i, k in enumerate(shown)
    )
    return make(canonical, values)


def _format(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def describe_codecs() -> str:
    """One line per codec for --help texts."""
    lines = []
    for name, (_, params, text) in CODECS.items():
        keys = ",".join(f"{k}=..." for k in params)
        lines.append(f"{name}{':' + keys if keys else ''}  {text}")
    if codec_fused.note():
        lines.append(f"note: {codec_fused.note()}")
    return "\n".join(lines)
