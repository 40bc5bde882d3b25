"""Device kernels of bfp, fp16 and bf16: one CUDA kernel per encode, decode and hop.

The CUDA source is codec_device.cu; it follows the format of codec_bfp.py and the casts
of fused_cast.c line by line, and tests/test_codec_device.py checks it against the host
kernels on a GPU and, everywhere, compiled as C++ with each warp's lanes as coroutines.
Imported only when a cupy array or a torch CUDA tensor (float32, contiguous) is encoded
or decoded, and only with cupy installed; the kernels take the arrays' device addresses
and run on the stream their library queues work on (torch's current stream for a
tensor). CCBENCH_CODEC_KERNELS=reference keeps GPU buffers on the array-API kernels.

* bfp: one thread per group of 4 neighbouring blocks (tile columns), in a grid-stride
  loop: the block maxima, then the quantisation (x + 1.5 * 2**23 * step, rounded to
  nearest even), 16 bytes a row, the 4 exponent bytes and every plane in one store each.
* casts: one thread per 8 values (two 16-byte loads, one 16-byte store); the n % 8
  values after the last group, and every value of unaligned buffers, one at a time.
* the reduce-scatter hop (decode, add, encode) in one kernel.

Arithmetic is compiled with --fmad=false --prec-div=true, and every float add and multiply
is a PTX add.rn / mul.rn without .ftz: cupy appends -ftz=true to every compile, which would
flush subnormals in the _rn intrinsics. The range check (NaN, Inf, out of range) is a
warp vote at the end of each encode: a warp that met a bad value puts the largest |x|
bits it saw into the codec's range flag (one int32 per codec and device, allocated once)
with one atomicMax. Nothing waits for it: codec_base.Codec.check_deferred reads and
resets the flag on the encodes' streams outside the timed calls.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

THREADS = 256
MAX_BLOCKS = 1 << 16  # grid-stride loops beyond this many blocks
GROUP_COLUMNS = 4  # bfp columns per thread (must divide the tile width)
CAST_GROUP = 8  # cast values per thread and step
VECTOR_ALIGN = 16  # bytes: the vector loads and stores need every buffer on it
# the smallest |x| bits each cast refuses (fused_cast.c's, codec_cast.OVERFLOW_BITS)
F16_OVERFLOW_BITS = 0x477FF000  # 65520 rounds to Inf in float16
BF16_OVERFLOW_BITS = 0x7F7F8000  # 2**128 - 2**119 rounds to Inf in bfloat16

# the CUDA source, also compiled as C++ on the CPU by the tests' emulation
_SOURCE = (Path(__file__).with_name("codec_device.cu")).read_text()

_KERNEL_NAMES = (
    "bfp_encode",
    "bfp_decode",
    "bfp_decode_add_encode",
    "cast_encode",
    "cast_decode",
    "cast_decode_add_encode",
)
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
        _module = cupy.RawModule(
            code=_SOURCE, options=("--fmad=false", "--prec-div=true", "--prec-sqrt=true")
        )
        _resolve(_module)


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
        self.pointer = np.uint64(self.bits.data.ptr)
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
        last = streams[-1]  # asynchronously when given a stream)
        with last:
            flag.bits.fill(0)
        last.synchronize()
    return value


# ---------------------------------------------------------------- the launch path
# A call's host cost is what a caller pays before the device has the work: at tens of
# MiB a current GPU runs these kernels in tens of microseconds, so every per-call lookup
# counts. The functions are resolved once (check), array types and streams are looked up
# in dicts, a codec's constant arguments are packed once, and the stream goes to the
# launch as an argument (no `with stream:`).

_IS_TORCH: dict = {}  # array type -> whether it is a torch tensor


def _is_torch(a) -> bool:
    kind = type(a)
    known = _IS_TORCH.get(kind)
    if known is None:
        known = _IS_TORCH[kind] = kind.__module__.startswith("torch")
    return known


def _address(a) -> int:
    """The device address of a cupy array or a torch CUDA tensor. No cupy view is built:
    a view through __cuda_array_interface__ costs tens of microseconds of Python."""
    return a.data_ptr() if _is_torch(a) else a.data.ptr


_functions: dict = {}  # kernel name -> compiled function (check() resolves them all)
_streams: dict = {}  # torch stream handle -> cupy's handle on the same stream
_launcher: dict = {}  # "stream": whether a launch takes its stream as an argument
_torch_stream = []  # [torch's raw current-stream handle of a device index]


def _resolve(module) -> None:
    """Every kernel's function, and how a launch is given its stream (once)."""
    for name in _KERNEL_NAMES:
        _functions[name] = module.get_function(name)
    cupy = _cupy()
    try:  # an empty decode: n = 0 touches no memory
        _functions["cast_decode"](
            (1,),
            (THREADS,),
            (_NULL, np.int64(0), _NULL, np.int32(0), np.int32(0)),
            stream=cupy.cuda.get_current_stream(),
        )
        _launcher["stream"] = True
    except TypeError:  # an older cupy: the stream is the current one
        _launcher["stream"] = False


def _current_torch_stream(index: int) -> int:
    if not _torch_stream:
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _torch_stream.append(
            raw if raw is not None else lambda i: torch.cuda.current_stream(i).cuda_stream
        )
    return _torch_stream[0](index)


def _stream_of(x):
    """The stream `x`'s library queues work on: torch's current stream for a tensor (one
    cupy handle kept per stream), cupy's current stream for a cupy array."""
    if not _is_torch(x):
        return _cupy().cuda.get_current_stream()
    handle = _current_torch_stream(x.get_device())
    stream = _streams.get(handle)
    if stream is None:
        stream = _streams[handle] = _cupy().cuda.ExternalStream(handle)
    return stream


_BLOCK = (THREADS,)


def _launch(name: str, work: int, like, args, flag: Flag | None = None) -> None:
    """Launch `name` over `work` items on `like`'s stream; an encode's flag remembers the
    stream, for check_deferred to wait on."""
    stream = _stream_of(like)
    if flag is not None:
        flag.streams[stream.ptr] = stream
    blocks = (max(1, min(MAX_BLOCKS, -(-work // THREADS))),)
    if _launcher["stream"]:
        _functions[name](blocks, _BLOCK, args, stream=stream)
    else:
        with stream:
            _functions[name](blocks, _BLOCK, args)


def _vector(*addresses: int) -> np.int32:
    return _VECTOR[vector_ok(*addresses)]


_VECTOR = {True: np.int32(1), False: np.int32(0)}
_NULL = np.uint64(0)  # a NULL pointer argument
_BFP: dict = {}  # (block, tile width, rate, limit bits) -> those packed as arguments


def _bfp_constants(codec, tile_width: int) -> tuple:
    key = (codec.block, tile_width, codec.rate, codec.limit_bits)
    packed = _BFP.get(key)
    if packed is None:
        packed = _BFP[key] = (
            np.int32(codec.block),
            np.int32(tile_width),
            np.int32(codec.rate),
            np.int32(codec.limit_bits),
        )
    return packed


def bfp_encode(codec, x, payload, tile_width: int, flag: Flag) -> None:
    """Encode a float32 GPU array; the range check votes into `flag` (nothing waits)."""
    n = x.shape[0]
    if n == 0:
        return
    xa, pa = _address(x), _address(payload)
    block, width, rate, limit = _bfp_constants(codec, tile_width)
    _launch(
        "bfp_encode",
        bfp_groups(n, codec.block, tile_width),
        x,
        (
            np.uint64(xa),
            np.int64(n),
            np.uint64(pa),
            block,
            width,
            rate,
            _vector(xa, pa),
            limit,
            flag.pointer,
        ),
        flag,
    )


def bfp_decode(codec, payload, out, tile_width: int) -> None:
    n = out.shape[0]
    if n == 0:
        return
    pa, oa = _address(payload), _address(out)
    block, width, rate, _ = _bfp_constants(codec, tile_width)
    _launch(
        "bfp_decode",
        bfp_groups(n, codec.block, tile_width),
        out,
        (np.uint64(pa), np.int64(n), np.uint64(oa), block, width, rate, _vector(pa, oa)),
    )


def bfp_decode_add_encode(codec, payload, own, target, out, tile_width: int, flag: Flag) -> None:
    """target = decode(payload) + own, encoded into `out` if given (its range check votes
    into `flag`)."""
    n = target.shape[0]
    if n == 0:
        return
    pa, wa, ta = _address(payload), _address(own), _address(target)
    oa = 0 if out is None else _address(out)
    block, width, rate, limit = _bfp_constants(codec, tile_width)
    _launch(
        "bfp_decode_add_encode",
        bfp_groups(n, codec.block, tile_width),
        target,
        (
            np.uint64(pa),
            np.uint64(wa),
            np.uint64(ta),
            np.int64(n),
            np.uint64(oa),
            block,
            width,
            rate,
            _vector(pa, wa, ta, oa),  # NULL (0) is aligned
            limit,
            flag.pointer,
        ),
        flag,
    )


_LIMITS = {True: np.int32(BF16_OVERFLOW_BITS), False: np.int32(F16_OVERFLOW_BITS)}
_BFLOAT = {True: np.int32(1), False: np.int32(0)}


def _limit(bfloat: bool) -> np.int32:
    return _LIMITS[bool(bfloat)]


def cast_encode(x, payload, bfloat: bool, flag: Flag) -> None:
    """Cast a float32 GPU array; the range check votes into `flag` (nothing waits)."""
    n = x.shape[0]
    if n == 0:
        return
    xa, pa = _address(x), _address(payload)
    _launch(
        "cast_encode",
        cast_groups(n),
        x,
        (
            np.uint64(xa),
            np.int64(n),
            np.uint64(pa),
            _BFLOAT[bfloat],
            _vector(xa, pa),
            _LIMITS[bfloat],
            flag.pointer,
        ),
        flag,
    )


def cast_decode(payload, out, bfloat: bool) -> None:
    n = out.shape[0]
    if n == 0:
        return
    pa, oa = _address(payload), _address(out)
    _launch(
        "cast_decode",
        cast_groups(n),
        out,
        (np.uint64(pa), np.int64(n), np.uint64(oa), _BFLOAT[bfloat], _vector(pa, oa)),
    )


def cast_decode_add_encode(payload, own, target, out, bfloat: bool, flag: Flag) -> None:
    """target = decode(payload) + own, encoded into `out` if given."""
    n = target.shape[0]
    if n == 0:
        return
    pa, wa, ta = _address(payload), _address(own), _address(target)
    oa = 0 if out is None else _address(out)
    _launch(
        "cast_decode_add_encode",
        cast_groups(n),
        target,
        (
            np.uint64(pa),
            np.uint64(wa),
            np.uint64(ta),
            np.int64(n),
            np.uint64(oa),
            _BFLOAT[bfloat],
            _vector(pa, wa, ta, oa),
            _LIMITS[bfloat],
            flag.pointer,
        ),
        flag,
    )
