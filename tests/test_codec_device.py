"""The device kernels (kernels/codec_device.py) against the fused host kernels.

On a GPU (cupy sees a device): cupy arrays and torch CUDA tensors are encoded and decoded
by the CUDA kernels and must give the host kernels' payload bytes and floats, and refuse
what they refuse. This is the GPU check of the codecs: `pytest tests/test_codec_device.py`
on a GPU node.

Everywhere: the same CUDA source, compiled as C++ with a small prelude that stands in for
the CUDA built-ins, runs thread after thread on the CPU (`emulated`), so the indexing,
packing and rounding of the kernels are checked on every machine with a C++ compiler.
What the emulation cannot check: the warp reduction (replaced), NVRTC, the launch.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from ccbench.kernels import codec_device, codec_fused
from ccbench.kernels.codec_bfp import TILE_WIDTH
from ccbench.kernels.codecs import parse_codec
from ccbench.kernels.errors import DataError

SPECS = ["fp16", "bf16", *(f"bfp:rate={r}" for r in range(2, 17)), "bfp:rate=3,block=8",
         "bfp:rate=12,block=64", "bfp:rate=8,block=256"]
LENGTHS = (1, 33, 8193, 3 * 8192 + 100)


def spread(count: int, seed: int, low: int = -20, high: int = 15) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(count) * 2.0 ** rng.integers(low, high, count)).astype(np.float32)
    x[::97] = 0.0
    x[1::101] = np.float32(1e-41)                 # subnormals
    return x


def host(spec: str):
    codec = parse_codec(spec)
    if codec_fused.host_kernels() is None:
        codec.kernels = "reference"               # the reference: the same bytes
    return codec


# ---------------------------------------------------------------- on a GPU

def _device():
    try:
        import cupy
    except ImportError:
        return None
    try:
        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # noqa: BLE001 - a driver without a device
        return None


@pytest.fixture(scope="module")
def cupy():
    module = _device()
    if module is None:
        pytest.skip("no CUDA device seen by cupy (the device kernels run only on a GPU; "
                    "the emulated tests below check their source on the CPU)")
    return module


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("count", LENGTHS)
def test_device_kernels_match_the_host(cupy, spec, count):
    x = spread(count, count)
    codec, ref = parse_codec(spec), host(spec)
    xd = cupy.asarray(x)
    assert codec.kernel_path(xd) == "device"
    payload = codec.encode(xd)
    expected = ref.encode(x)
    assert np.array_equal(cupy.asnumpy(payload), expected)
    out = cupy.empty_like(xd)
    codec.decode(cupy.asarray(expected), out)
    y = np.empty_like(x)
    ref.decode(expected, y)
    assert np.array_equal(cupy.asnumpy(out).view(np.uint32), y.view(np.uint32))


@pytest.mark.parametrize("spec", ["fp16", "bf16", "bfp:rate=8", "bfp:rate=16"])
def test_device_kernels_on_torch_cuda_tensors(cupy, spec):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    x = spread(20_000, 4)
    codec, ref = parse_codec(spec), host(spec)
    xt = torch.from_numpy(x).cuda()
    assert codec.kernel_path(xt) == "device"
    payload = codec.encode(xt)
    assert np.array_equal(payload.cpu().numpy(), ref.encode(x))
    out = torch.empty_like(xt)
    codec.decode(payload, out)
    y = np.empty_like(x)
    ref.decode(ref.encode(x), y)
    assert np.array_equal(out.cpu().numpy().view(np.uint32), y.view(np.uint32))


@pytest.mark.parametrize("spec", ["fp16", "bf16", "bfp:rate=8"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e38])
def test_device_kernels_refuse_alike(cupy, spec, bad):
    """The device defers its check (no encode waits for its kernel); read, it refuses as
    the host does."""
    x = spread(10_000, 2)
    x[4321] = bad
    with pytest.raises(DataError) as on_host:
        host(spec).encode(x)
    codec = parse_codec(spec)
    codec.encode(cupy.asarray(x))
    with pytest.raises(DataError) as on_device:
        codec.check_deferred()
    assert str(on_device.value) == str(on_host.value)


# ---------------------------------------------------------------- emulated on the CPU

_PRELUDE = r"""
#include <algorithm>
#include <cstdint>
#include <cstring>
using std::max;
using std::min;
#define CCBENCH_EMULATED 1
#define __global__
#define __device__
#define __forceinline__ inline
struct Dim { long long x; };
static Dim blockIdx, threadIdx, blockDim;
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __int2float_rn(int i) { return (float)i; }
static inline float __uint2float_rn(unsigned i) { return (float)i; }
static inline void warp_max_into(int *worst, int a) { *worst = max(*worst, a); }
"""

_LAUNCHERS = r"""
extern "C" {
#define LAUNCH(threads, call)                                           \
    blockDim.x = 256;                                                   \
    for (blockIdx.x = 0; blockIdx.x * 256 < (threads); blockIdx.x++)    \
        for (threadIdx.x = 0; threadIdx.x < 256; threadIdx.x++) call;
void run_bfp_encode(const float *x, long long n, unsigned char *out, int block, int width,
                    int rate, int limit, const int *edge, int *worst, long long threads) {
    LAUNCH(threads, bfp_encode(x, n, out, block, width, rate, limit, edge, worst))
}
void run_bfp_decode(const unsigned char *p, long long n, float *out, int block, int width,
                    int rate, long long threads) {
    LAUNCH(threads, bfp_decode(p, n, out, block, width, rate))
}
void run_cast_encode(const float *x, long long n, unsigned char *out, int bfloat,
                     int *worst) {
    LAUNCH(n, cast_encode(x, n, out, bfloat, worst))
}
void run_cast_decode(const unsigned char *p, long long n, float *out, int bfloat) {
    LAUNCH(n, cast_decode(p, n, out, bfloat))
}
}
"""


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    """The CUDA source as a CPU library (threads run one after another)."""
    compiler = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler to build the CPU emulation of the device kernels")
    root = tmp_path_factory.mktemp("emulated")
    source = root / "kernels.cpp"
    source.write_text(_PRELUDE + codec_device._SOURCE + _LAUNCHERS)
    library = root / "kernels.so"
    subprocess.run([compiler, "-O1", "-ffp-contract=off", "-fPIC", "-shared", "-o",
                    str(library), str(source)], check=True, capture_output=True, text=True)
    return ctypes.CDLL(str(library))


def _ptr(a: np.ndarray):
    return ctypes.c_void_p(a.ctypes.data)


def emulated_encode(lib, spec: str, x: np.ndarray) -> tuple[np.ndarray, int]:
    codec = parse_codec(spec)
    n = x.shape[0]
    out = np.zeros(codec.encoded_nbytes(n), np.uint8)
    worst = np.zeros(1, np.int32)
    if codec.name == "bfp":
        edge = codec_device._edge_table(codec.rate)
        lib.run_bfp_encode(_ptr(x), ctypes.c_longlong(n), _ptr(out), codec.block, TILE_WIDTH,
                           codec.rate, codec.limit_bits, _ptr(edge), _ptr(worst),
                           ctypes.c_longlong(codec_device._columns(n, codec.block,
                                                                   TILE_WIDTH)))
    else:
        lib.run_cast_encode(_ptr(x), ctypes.c_longlong(n), _ptr(out), int(spec == "bf16"),
                            _ptr(worst))
    return out, int(worst[0])


def emulated_decode(lib, spec: str, payload: np.ndarray, n: int) -> np.ndarray:
    codec = parse_codec(spec)
    out = np.empty(n, np.float32)
    if codec.name == "bfp":
        lib.run_bfp_decode(_ptr(payload), ctypes.c_longlong(n), _ptr(out), codec.block,
                           TILE_WIDTH, codec.rate,
                           ctypes.c_longlong(codec_device._columns(n, codec.block, TILE_WIDTH)))
    else:
        lib.run_cast_decode(_ptr(payload), ctypes.c_longlong(n), _ptr(out),
                            int(spec == "bf16"))
    return out


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("count", LENGTHS)
def test_emulated_device_kernels_match_the_host(emulated, spec, count):
    x = spread(count, count + 1, *((-20, 15) if spec in ("fp16", "bf16") else (-60, 60)))
    codec = host(spec)
    expected = codec.encode(x)
    payload, worst = emulated_encode(emulated, spec, x)
    assert np.array_equal(payload, expected), spec
    assert worst == int(np.abs(x).view(np.int32).max())
    y = np.empty_like(x)
    codec.decode(expected, y)
    assert np.array_equal(emulated_decode(emulated, spec, expected, count).view(np.uint32),
                          y.view(np.uint32))


@pytest.mark.parametrize("spec", ["fp16", "bf16", "bfp:rate=8", "bfp:rate=2,block=8"])
def test_emulated_device_kernels_flag_bad_data(emulated, spec):
    """NaN, Inf and out-of-range values reach the max the caller checks."""
    codec = parse_codec(spec)
    limit = {"fp16": 0x477FF000, "bf16": 0x7F7F8000}.get(spec) or codec.limit_bits
    for bad in (np.nan, np.inf, np.finfo(np.float32).max):
        x = spread(9000, 3)
        x[1234] = bad
        assert emulated_encode(emulated, spec, x)[1] >= limit
    assert emulated_encode(emulated, spec, spread(9000, 3))[1] < limit
