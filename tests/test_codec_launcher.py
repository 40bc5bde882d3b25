"""The device codec kernels' launch path (kernels/codec_device.py) without a GPU.

cupy is replaced by a recorder: each call of an encode, decode or hop must be exactly one
launch of its kernel, on the array's stream, with the arguments packed as the CUDA
source declares them (codec_device.cu): addresses as uint64, the count as int64, flags
and limits as int32, the grid from the closed form (one thread per 8 values, 256 per
block). A cupy whose launch takes no stream gets the launch inside `with stream:`.
(--chunk-bytes auto's launch floor on a device: tests/test_chunking.py.)
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from ccbench.kernels import codec_device


class Stream:
    def __init__(self, ptr: int):
        self.ptr, self.entered = ptr, 0

    def __enter__(self):
        self.entered += 1
        return self

    def __exit__(self, *exc):
        return False


class Kernel:
    """A compiled function that records its launches (cupy's, with a stream argument)."""

    def __init__(self, name: str, calls: list):
        self.name, self.calls = name, calls

    def __call__(self, grid, block, args, stream=None):
        self.calls.append((self.name, grid, block, args, stream))


class OldKernel(Kernel):
    def __call__(self, grid, block, args):  # an older cupy: the current stream
        self.calls.append((self.name, grid, block, args, None))


class Array:
    """A cupy-like device array: its shape and its address."""

    def __init__(self, n: int, ptr: int):
        self.shape, self.data = (n,), SimpleNamespace(ptr=ptr)


@pytest.fixture
def launches(monkeypatch, request):
    kernel = getattr(request, "param", Kernel)
    calls: list = []
    stream = Stream(7)
    fake = SimpleNamespace(cuda=SimpleNamespace(get_current_stream=lambda: stream))
    monkeypatch.setattr(codec_device, "_cupy", lambda: fake)
    monkeypatch.setattr(codec_device, "_functions", {})
    monkeypatch.setattr(codec_device, "_launcher", {})
    module = SimpleNamespace(get_function=lambda name: kernel(name, calls))
    codec_device._resolve(module)
    calls.clear()  # the probe's empty launch
    return calls, stream


def test_a_cast_encode_is_one_launch_with_the_sources_arguments(launches):
    calls, stream = launches
    flag = SimpleNamespace(pointer=np.uint64(99), streams={})
    x, payload = Array(5000, 4096), Array(10000, 1 << 20 | 4)  # the payload off 16 bytes
    codec_device.cast_encode(x, payload, True, flag)
    ((name, grid, block, args, on),) = calls
    assert (name, grid, block, on) == ("cast_encode", (3,), (256,), stream)  # 625 groups
    want = (
        np.uint64(4096),
        np.int64(5000),
        np.uint64(1 << 20 | 4),
        np.int32(1),  # bfloat16
        np.int32(0),  # not every buffer on 16 bytes: no vector loads
        np.int32(0x7F7F8000),  # bfloat16's first refused |x| bits
        np.uint64(99),
    )
    assert [type(a) for a in args] == [type(w) for w in want]
    assert [int(a) for a in args] == [int(w) for w in want]
    assert flag.streams == {7: stream}  # check_deferred waits on it


def test_a_hop_without_out_passes_null_and_a_decode_takes_no_flag(launches):
    calls, _ = launches
    flag = SimpleNamespace(pointer=np.uint64(5), streams={})
    p, own, target = Array(2048, 0), Array(1024, 4096), Array(1024, 8192)
    codec_device.cast_decode_add_encode(p, own, target, None, False, flag)
    codec_device.cast_decode(p, target, False)
    (hop, decode) = calls
    assert hop[0] == "cast_decode_add_encode" and hop[1] == (1,)
    assert [int(a) for a in hop[3]] == [0, 4096, 8192, 1024, 0, 0, 1, 0x477FF000, 5]
    assert decode[0] == "cast_decode" and [int(a) for a in decode[3]] == [0, 1024, 8192, 0, 1]


def test_bfp_arguments_are_the_codecs_and_packed_once(launches):
    from ccbench.kernels.codecs import parse_codec

    calls, _ = launches
    codec = parse_codec("bfp:rate=8")
    flag = SimpleNamespace(pointer=np.uint64(3), streams={})
    x, payload, out = Array(4096, 0), Array(8192, 1 << 16), Array(4096, 1 << 17)
    codec_device.bfp_encode(codec, x, payload, 32, flag)
    codec_device.bfp_decode(codec, payload, out, 32)
    encode, decode = calls
    assert [int(a) for a in encode[3]] == [
        0,
        4096,
        1 << 16,
        codec.block,
        32,
        8,
        1,
        codec.limit_bits,
        3,
    ]
    assert [int(a) for a in decode[3]] == [1 << 16, 4096, 1 << 17, codec.block, 32, 8, 1]
    assert encode[3][3] is decode[3][3]  # the constants packed once, then reused


@pytest.mark.parametrize("launches", [OldKernel], indirect=True)
def test_a_cupy_whose_launch_takes_no_stream_launches_inside_it(launches):
    calls, stream = launches
    codec_device.cast_decode(Array(16, 0), Array(8, 64), False)
    assert len(calls) == 1 and stream.entered == 1
