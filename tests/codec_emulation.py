"""The device kernels' CUDA source (kernels/codec_device.cu) compiled as C++ for the CPU,
with a prelude that stands in for CUDA's built-ins, and the launches of
kernels/codec_device.py on it (tests/test_codec_device.py runs them everywhere).

What cupy compiles is mirrored where it matters to the bits: the `_rn` intrinsics flush
subnormals, as cupy's `-ftz=true` makes them do on a GPU.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np

from ccbench.kernels import codec_device
from ccbench.kernels.codec_bfp import TILE_WIDTH
from ccbench.kernels.codecs import parse_codec

# CUDA's built-ins for the CPU. Each warp's 32 lanes are coroutines (ucontext) run one at
# a time: a lane runs until it reaches a warp intrinsic and parks there; when every lane
# has parked, each takes its result from what all lanes brought (its mask applied: a lane
# outside the mask does not contribute), so a wrong lane, offset or mask changes the
# result. A fault (lanes that finish while others wait at an intrinsic: a divergent warp;
# a lane outside its own mask; a vector access at an address not aligned to its size) is
# recorded and the run goes on; the launch then raises it.
_PRELUDE = r"""
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <ucontext.h>
using std::max;
using std::min;
#define CCBENCH_EMULATED 1
#define __global__
#define __device__
#define __forceinline__ inline
struct Dim { long long x; };
static Dim blockIdx, threadIdx, blockDim, gridDim;
struct float4 { float x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
/* what cupy compiles: -ftz=true flushes subnormal inputs and results of the _rn
 * intrinsics (sign kept); the source's add_rn / mul_rn are PTX without .ftz */
static inline float flush(float v) {
    const int bits = __float_as_int(v);
    return (bits & 0x7F800000) ? v : __int_as_float(bits & (int)0x80000000);
}
static inline float __fadd_rn(float a, float b) { return flush(flush(a) + flush(b)); }
static inline float __fmul_rn(float a, float b) { return flush(flush(a) * flush(b)); }
static inline float add_rn(float a, float b) { return a + b; }
static inline float mul_rn(float a, float b) { return a * b; }
static inline float __int2float_rn(int i) { return (float)i; }
static inline float __uint2float_rn(unsigned i) { return (float)i; }

static char fault[200];  /* the first fault of a launch, "" if none */
static void record_fault(const char *what, long long detail) {
    if (!fault[0])
        std::snprintf(fault, sizeof fault, "%s (%lld) in block %lld, thread %lld", what,
                      detail, blockIdx.x, threadIdx.x);
}
static void aligned_or_fault(const void *p, unsigned size) {
    if ((uintptr_t)p % size)
        record_fault("misaligned vector access of size", size);
}
template <typename T> static inline T load_at(const void *p) {
    aligned_or_fault(p, sizeof(T)); T v; std::memcpy(&v, p, sizeof(T)); return v;
}
template <typename T> static inline void store_at(void *p, T v) {
    aligned_or_fault(p, sizeof(T)); std::memcpy(p, &v, sizeof(T));
}
static inline float4 load_f4(const float *p) { return load_at<float4>(p); }
static inline void store_f4(float *p, float4 v) { store_at(p, v); }
static inline uint4 load_b16(const unsigned char *p) { return load_at<uint4>(p); }
static inline void store_b16(unsigned char *p, uint4 v) { store_at(p, v); }
static inline uint2 load_b8(const unsigned char *p) { return load_at<uint2>(p); }
static inline void store_b8(unsigned char *p, uint2 v) { store_at(p, v); }
static inline unsigned load_b4(const unsigned char *p) { return load_at<unsigned>(p); }
static inline void store_b4(unsigned char *p, unsigned v) { store_at(p, v); }

namespace warp {
const int LANES = 32;
static ucontext_t scheduler, lanes[LANES];
static char stacks[LANES][1 << 16];
static int current;                     /* the lane running */
static bool finished[LANES], parked[LANES];
static unsigned masks[LANES];
static int brought[LANES], seen[LANES];
static std::function<void()> body;
static long long first_thread;

static void lane_main() { body(); finished[current] = true; }

/* the running lane reaches an intrinsic with `value`: park until all have */
static void meet(unsigned mask, int value) {
    if (!((mask >> current) & 1u))
        record_fault("a lane calls a warp intrinsic outside its mask", current);
    masks[current] = mask;
    brought[current] = value;
    parked[current] = true;
    swapcontext(&lanes[current], &scheduler);
}

static void run(long long first) {
    first_thread = first;
    for (int l = 0; l < LANES; l++) {
        getcontext(&lanes[l]);
        lanes[l].uc_stack.ss_sp = stacks[l];
        lanes[l].uc_stack.ss_size = sizeof stacks[l];
        lanes[l].uc_link = &scheduler;
        makecontext(&lanes[l], lane_main, 0);
        finished[l] = parked[l] = false;
    }
    for (;;) {
        for (int l = 0; l < LANES; l++) {
            if (finished[l])
                continue;
            current = l;
            threadIdx.x = first + l;
            parked[l] = false;
            swapcontext(&scheduler, &lanes[l]);
        }
        int waiting = 0;
        for (int l = 0; l < LANES; l++)
            waiting += parked[l];
        if (waiting == 0)
            return;
        if (waiting != LANES)
            record_fault("divergent warp: lanes at an intrinsic", waiting);
        std::memcpy(seen, brought, sizeof seen);
    }
}
}

static long long atomics;  /* atomic operations so far (the tests read and reset it) */

static inline int __any_sync(unsigned mask, int predicate) {
    warp::meet(mask, predicate != 0);
    int any = 0;
    for (int l = 0; l < warp::LANES; l++)
        if ((mask >> l) & 1u)
            any |= warp::seen[l];
    return any;
}
static inline int __shfl_xor_sync(unsigned mask, int value, int lane_mask) {
    warp::meet(mask, value);
    const int source = warp::current ^ lane_mask;
    return source < warp::LANES && ((mask >> source) & 1u) ? warp::seen[source] : value;
}
static inline int atomicMax(int *address, int value) {
    atomics++;
    const int old = *address;
    *address = max(old, value);
    return old;
}
"""

_LAUNCHERS = r"""
static void launch(long long blocks, std::function<void()> kernel) {
    gridDim.x = blocks;
    blockDim.x = 256;
    warp::body = kernel;
    for (blockIdx.x = 0; blockIdx.x < blocks; blockIdx.x++)
        for (long long first = 0; first < 256; first += warp::LANES)
            warp::run(first);
}
extern "C" {
long long take_atomics(void) { const long long n = atomics; atomics = 0; return n; }
const char *take_fault(void) {
    static char copy[sizeof fault];
    std::memcpy(copy, fault, sizeof fault);
    fault[0] = 0;
    return copy;
}
void run_bfp_encode(const float *x, long long n, unsigned char *out, int block, int width,
                    int rate, int vector, int limit, int *flag, long long blocks) {
    launch(blocks, [=] { bfp_encode(x, n, out, block, width, rate, vector, limit, flag); });
}
void run_bfp_decode(const unsigned char *p, long long n, float *out, int block, int width,
                    int rate, int vector, long long blocks) {
    launch(blocks, [=] { bfp_decode(p, n, out, block, width, rate, vector); });
}
void run_bfp_decode_add_encode(const unsigned char *p, const float *own, float *target,
                               long long n, unsigned char *out, int block, int width,
                               int rate, int vector, int limit, int *flag, long long blocks) {
    launch(blocks, [=] { bfp_decode_add_encode(p, own, target, n, out, block, width, rate,
                                               vector, limit, flag); });
}
void run_cast_encode(const float *x, long long n, unsigned char *out, int bfloat, int vector,
                     int limit, int *flag, long long blocks) {
    launch(blocks, [=] { cast_encode(x, n, out, bfloat, vector, limit, flag); });
}
void run_cast_decode(const unsigned char *p, long long n, float *out, int bfloat, int vector,
                     long long blocks) {
    launch(blocks, [=] { cast_decode(p, n, out, bfloat, vector); });
}
void run_cast_decode_add_encode(const unsigned char *p, const float *own, float *target,
                                long long n, unsigned char *out, int bfloat, int vector,
                                int limit, int *flag, long long blocks) {
    launch(blocks, [=] { cast_decode_add_encode(p, own, target, n, out, bfloat, vector, limit,
                                                flag); });
}
}
"""

EMULATED_BLOCKS = 3  # a small grid: the kernels' grid-stride loops run several rounds


def _ptr(a):
    return ctypes.c_void_p(0 if a is None else a.ctypes.data)


def placed(values: np.ndarray, offset: int) -> np.ndarray:
    """A copy of `values` starting `offset` bytes past a 64-byte boundary."""
    raw = np.zeros(values.nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    out = raw[start : start + values.nbytes].view(values.dtype)
    out[...] = values
    return out


class Emulated:
    """codec_device's launches (geometry, alignment test, limits) on the emulation."""

    def __init__(self, lib):
        self.lib = lib
        self.blocks = EMULATED_BLOCKS
        lib.take_fault.restype = ctypes.c_char_p
        lib.take_atomics.restype = ctypes.c_longlong

    def _checked(self, name: str, *args) -> None:
        getattr(self.lib, name)(*args)
        fault = self.lib.take_fault().decode()
        assert not fault, f"{name}: {fault}"

    def _grid(self, work: int) -> ctypes.c_longlong:
        return ctypes.c_longlong(codec_device.grid(work, self.blocks))

    def atomics(self) -> int:
        return int(self.lib.take_atomics())

    @staticmethod
    def _vector(*arrays) -> int:
        return int(codec_device.vector_ok(*(a.ctypes.data for a in arrays if a is not None)))

    def encode(self, spec, x, payload, flag) -> None:
        codec, n = parse_codec(spec), ctypes.c_longlong(x.shape[0])
        if codec.name == "bfp":
            self._checked(
                "run_bfp_encode",
                _ptr(x),
                n,
                _ptr(payload),
                codec.block,
                TILE_WIDTH,
                codec.rate,
                self._vector(x, payload),
                codec.limit_bits,
                _ptr(flag),
                self._grid(codec_device.bfp_groups(x.shape[0], codec.block, TILE_WIDTH)),
            )
        else:
            self._checked(
                "run_cast_encode",
                _ptr(x),
                n,
                _ptr(payload),
                int(spec == "bf16"),
                self._vector(x, payload),
                int(codec_device._limit(spec == "bf16")),
                _ptr(flag),
                self._grid(codec_device.cast_groups(x.shape[0])),
            )

    def decode(self, spec, payload, out) -> None:
        codec, n = parse_codec(spec), ctypes.c_longlong(out.shape[0])
        if codec.name == "bfp":
            self._checked(
                "run_bfp_decode",
                _ptr(payload),
                n,
                _ptr(out),
                codec.block,
                TILE_WIDTH,
                codec.rate,
                self._vector(payload, out),
                self._grid(codec_device.bfp_groups(out.shape[0], codec.block, TILE_WIDTH)),
            )
        else:
            self._checked(
                "run_cast_decode",
                _ptr(payload),
                n,
                _ptr(out),
                int(spec == "bf16"),
                self._vector(payload, out),
                self._grid(codec_device.cast_groups(out.shape[0])),
            )

    def hop(self, spec, payload, own, target, out, flag) -> None:
        codec, n = parse_codec(spec), ctypes.c_longlong(target.shape[0])
        vector = self._vector(payload, own, target, out)
        if codec.name == "bfp":
            self._checked(
                "run_bfp_decode_add_encode",
                _ptr(payload),
                _ptr(own),
                _ptr(target),
                n,
                _ptr(out),
                codec.block,
                TILE_WIDTH,
                codec.rate,
                vector,
                codec.limit_bits,
                _ptr(flag),
                self._grid(codec_device.bfp_groups(target.shape[0], codec.block, TILE_WIDTH)),
            )
        else:
            self._checked(
                "run_cast_decode_add_encode",
                _ptr(payload),
                _ptr(own),
                _ptr(target),
                n,
                _ptr(out),
                int(spec == "bf16"),
                vector,
                int(codec_device._limit(spec == "bf16")),
                _ptr(flag),
                self._grid(codec_device.cast_groups(target.shape[0])),
            )


def build(root: Path):
    """The CUDA source as a CPU library (warps one after another, lanes as coroutines) in
    `root`; None where no C++ compiler is found."""
    compiler = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if compiler is None:
        return None
    source = root / "kernels.cpp"
    source.write_text(_PRELUDE + codec_device._SOURCE + _LAUNCHERS)
    library = root / "kernels.so"
    built = subprocess.run(
        [
            compiler,
            "-std=c++14",
            "-O1",
            "-ffp-contract=off",
            "-fno-strict-aliasing",
            "-fPIC",
            "-shared",
            "-o",
            str(library),
            str(source),
        ],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    return Emulated(ctypes.CDLL(str(library)))
