"""The device kernels (kernels/codec_device.py) against the fused host kernels.

On a GPU (cupy sees a device): cupy arrays and torch CUDA tensors are encoded, decoded
and summed in a hop by the CUDA kernels and must give the host kernels' payload bytes and
floats, and refuse what they refuse. This is the GPU check of the codecs: `pytest
tests/test_codec_device.py` on a GPU node.

Everywhere: the same CUDA source, compiled as C++ with a small prelude that stands in for
the CUDA built-ins, runs on the CPU (`emulated`): warp after warp, each warp's lanes as
coroutines that meet at every warp intrinsic, so the indexing, packing, rounding, the
vector accesses' alignment and the range vote are checked on every machine with a C++
compiler. What the emulation cannot check: NVRTC, the launch, timing. And on the strict
device double (tests/devicedouble.py): timed codec calls allocate nothing and wait for
nothing, and the deferred range check raises after them.
"""

from __future__ import annotations

import numpy as np
import pytest

from ccbench.kernels import codec_device, codec_fused
from ccbench.kernels.codec_bfp import TILE_WIDTH
from ccbench.kernels.codecs import parse_codec
from ccbench.kernels.errors import DataError
from ccbench.kernels.inputs import values
from tests import codec_emulation
from tests.codec_emulation import placed

SPECS = [
    "fp16",
    "bf16",
    *(f"bfp:rate={r}" for r in range(2, 17)),
    "bfp:rate=3,block=8",
    "bfp:rate=12,block=64",
    "bfp:rate=8,block=256",
]
LENGTHS = (1, 33, 8193, 3 * 8192 + 100)


def spread(count: int, seed: int, low: int = -20, high: int = 15) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(count) * 2.0 ** rng.integers(low, high, count)).astype(np.float32)
    x[::97] = 0.0
    x[1::101] = np.float32(1e-41)  # subnormals
    return x


def host(spec: str):
    codec = parse_codec(spec)
    if codec_fused.host_kernels() is None:
        codec.kernels = "reference"  # the reference: the same bytes
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
        pytest.skip(
            "no CUDA device seen by cupy (the device kernels run only on a GPU; "
            "the emulated tests below check their source on the CPU)"
        )
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


REFUSAL_SPECS = ["fp16", "bf16", "bfp:rate=8"]


def refusal_inputs(spec: str) -> list[np.ndarray]:
    """Arrays with one value the codec refuses: NaN, Inf, the first magnitude past its
    range (refused_from), in the middle, the last whole group of 8 and the last value."""
    out = []
    for bad in (np.float32(np.nan), np.float32(np.inf), refused_from(spec)):
        for where in (4321, 9992 - 1, 9999):
            x = spread(10_000, 2, -20, 10)
            x[where] = bad if where % 2 else -bad
            out.append(x)
    return out


@pytest.mark.parametrize("spec", REFUSAL_SPECS)
def test_device_kernels_refuse_alike(cupy, spec):
    """The device defers its check (no encode waits for its kernel); read, it refuses as
    the host does, and the flag is reset: the largest value taken then passes."""
    codec = parse_codec(spec)
    for x in refusal_inputs(spec):
        with pytest.raises(DataError) as on_host:
            host(spec).encode(x)
        codec.encode(cupy.asarray(x))
        with pytest.raises(DataError) as on_device:
            codec.check_deferred()
        assert str(on_device.value) == str(on_host.value)
    taken = spread(10_000, 2, -20, 10)
    taken[[0, 9999]] = accepted_below(spec), -accepted_below(spec)
    payload = codec.encode(cupy.asarray(taken))
    codec.check_deferred()
    assert np.array_equal(cupy.asnumpy(payload), host(spec).encode(taken))


@pytest.mark.parametrize("spec", REFUSAL_SPECS)
def test_device_hop_on_cupy_matches_the_host(cupy, spec):
    fast, codec = host(spec), parse_codec(spec)
    x, own = spread(3 * 8192 + 5, 9, -20, 10), spread(3 * 8192 + 5, 10, -20, 10)
    payload = fast.encode(x)
    summed, resent = np.empty_like(x), np.zeros_like(payload)
    fast.decode_add_encode(payload, own, summed, resent)
    target, sent = cupy.empty_like(cupy.asarray(x)), cupy.zeros_like(cupy.asarray(payload))
    codec.decode_add_encode(cupy.asarray(payload), cupy.asarray(own), target, sent)
    codec.check_deferred()
    assert np.array_equal(cupy.asnumpy(target).view(np.uint32), summed.view(np.uint32))
    assert np.array_equal(cupy.asnumpy(sent), resent)


@pytest.mark.parametrize("spec", REFUSAL_SPECS)
def test_host_refusal_edges(spec):
    """The host half of the refusals above, on both host paths: the first magnitude past
    the range is refused with the reference's message, the largest one taken passes."""
    for x in refusal_inputs(spec):
        messages = []
        for codec in (host(spec), reference(spec)):
            with pytest.raises(DataError) as caught:
                codec.encode(x)
            messages.append(str(caught.value))
        assert messages[0] == messages[1]
    taken = spread(10_000, 2, -20, 10)
    taken[[0, 9999]] = accepted_below(spec), -accepted_below(spec)
    assert np.array_equal(host(spec).encode(taken), reference(spec).encode(taken))


DEVICE_SPECS = ["fp16", "bf16", "bfp:rate=8", "bfp:rate=3,block=8", "bfp:rate=16"]


@pytest.mark.parametrize("spec", DEVICE_SPECS)
def test_timed_device_codec_calls_neither_allocate_nor_wait(spec):
    """On the strict device double (tests/devicedouble.py, whose Kernels play the device
    kernels): encode, decode and hop inside a timed region allocate nothing and wait for
    nothing, and give the host's bytes and floats; a refused value is raised by
    check_deferred after the region, with the host's message, and the flag is reset."""
    import tests.devicedouble as double
    from ccbench.kernels import arrays
    from ccbench.kernels.codec_base import empty_payload

    codec, fast = parse_codec(spec), host(spec)
    n = 3 * 8192 + 5
    x, own = spread(n, 11, -20, 10), spread(n, 12, -20, 10)
    dx, down = (arrays.from_numpy("double", a, "float32") for a in (x, own))
    payload = empty_payload(dx, codec.encoded_nbytes(n))
    sent = empty_payload(dx, codec.encoded_nbytes(n))
    out, target = arrays.empty("double", n, "float32"), arrays.empty("double", n, "float32")
    assert codec.kernel_path(dx) == "device"
    codec.encode(dx, out=payload)  # the flag is allocated here, once per codec and device
    codec.check_deferred()

    def timed(*calls):
        double.STATS.reset()
        double.STATS.in_region = True
        try:
            for call in calls:
                call()
        finally:
            double.STATS.in_region = False
        assert double.STATS.timed_allocs == 0, double.STATS.alloc_where
        assert double.STATS.timed == 0, double.STATS.where

    timed(
        lambda: codec.encode(dx, out=payload),
        lambda: codec.decode(payload, out),
        lambda: codec.decode_add_encode(payload, down, target, sent),
    )
    codec.check_deferred()
    expected = fast.encode(x)
    decoded, summed, resent = np.empty_like(x), np.empty_like(x), np.zeros_like(expected)
    fast.decode(expected, decoded)
    fast.decode_add_encode(expected, own, summed, resent)
    assert np.array_equal(arrays.to_numpy(payload), expected)
    assert np.array_equal(arrays.to_numpy(out).view(np.uint32), decoded.view(np.uint32))
    assert np.array_equal(arrays.to_numpy(target).view(np.uint32), summed.view(np.uint32))
    assert np.array_equal(arrays.to_numpy(sent), resent)

    bad = x.copy()
    bad[n - 3] = -refused_from(spec)  # in the last n % 8 values
    with pytest.raises(DataError) as on_host:
        fast.encode(bad)
    dbad = arrays.from_numpy("double", bad, "float32")
    timed(lambda: codec.encode(dbad, out=payload))  # no error yet, no wait
    with pytest.raises(DataError) as later:
        codec.check_deferred()
    assert str(later.value) == str(on_host.value)
    timed(lambda: codec.encode(dx, out=payload))
    codec.check_deferred()  # the flag was reset: the good data passes

    big = arrays.from_numpy(
        "double", np.full(n, accepted_below(spec) * np.float32(0.75), np.float32), "float32"
    )
    codec.encode(big, out=payload)
    codec.check_deferred()
    timed(lambda: codec.decode_add_encode(payload, big, target, sent))  # sums past the range
    with pytest.raises(DataError):
        codec.check_deferred()
    codec.check_deferred()


# ---------------------------------------------------------------- emulated on the CPU


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    """The CUDA source as a CPU library (warps one after another, lanes as coroutines)."""
    kernels = codec_emulation.build(tmp_path_factory.mktemp("emulated"))
    if kernels is None:
        pytest.skip("no C++ compiler to build the CPU emulation of the device kernels")
    return kernels


def reference(spec: str):
    codec = parse_codec(spec)
    codec.kernels = "reference"
    return codec


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32)


EMULATED_LENGTHS = (1, 13, 8193, 3 * 8192 + 100)  # n % 8 of 1, 5, 1 and 4: tails everywhere


def test_emulated_vector_path_needs_every_buffer_on_16_bytes():
    """The launcher's rule for the kernels' 16-byte loads and stores, by hand: every
    address a multiple of 16; 8-byte alignment is not enough."""
    assert codec_device.vector_ok(0, 16, 4096)
    assert not codec_device.vector_ok(8)
    assert not codec_device.vector_ok(16, 24)
    assert not codec_device.vector_ok(32, 4)
    assert codec_device.vector_ok()  # no buffer: nothing to misalign


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("count", EMULATED_LENGTHS)
def test_emulated_device_kernels_match_the_host(emulated, spec, count):
    """Encode, decode and hop, 16-byte aligned (vector accesses) and not (scalar ones):
    the host kernels' bytes and floats, the reference's too; no vote on good data."""
    scales = (-20, 15) if spec in ("fp16", "bf16") else (-60, 60)
    fast, ref = host(spec), reference(spec)
    x, own = spread(count, count + 1, *scales), spread(count, count + 2, *scales)
    expected = fast.encode(x)
    assert np.array_equal(expected, ref.encode(x))
    decoded = np.empty_like(x)
    fast.decode(expected, decoded)
    summed, resent = np.empty_like(x), np.zeros_like(expected)
    fast.decode_add_encode(expected, own, summed, resent)
    # 4 and 8: no buffer on 16 bytes, every access one value at a time (8: aligned for an
    # 8-byte access, yet a 16-byte vector access there is misaligned; the emulation faults)
    for offset in (0, 4, 8):
        payload, flag = placed(np.zeros_like(expected), offset), np.zeros(1, np.int32)
        emulated.encode(spec, placed(x, offset), payload, flag)
        assert np.array_equal(payload, expected), (spec, offset)
        out = placed(np.zeros_like(x), offset)
        emulated.decode(spec, placed(expected, offset), out)
        assert np.array_equal(bits(out), bits(decoded)), (spec, offset)
        target, sent = placed(np.zeros_like(x), offset), placed(np.zeros_like(expected), offset)
        emulated.hop(spec, placed(expected, offset), placed(own, offset), target, sent, flag)
        assert np.array_equal(bits(target), bits(summed)), (spec, offset)
        assert np.array_equal(sent, resent), (spec, offset)
        in_place = placed(own, offset)  # target is own, no payload out: the sums alone
        emulated.hop(spec, placed(expected, offset), in_place, in_place, None, flag)
        assert np.array_equal(bits(in_place), bits(summed)), (spec, offset)
        assert flag[0] == 0 and emulated.atomics() == 0


@pytest.mark.parametrize(
    "spec", ["fp16", "bf16", "bfp:rate=8", "bfp:rate=16", "bfp:rate=3", "bfp:rate=13,block=8"]
)
def test_emulated_kernels_on_gradient_like_data_and_a_payload_written_in_place(emulated, spec):
    """Gradient-like values; the hop writing its payload over the one it reads."""
    x = values("gradient-like", 5 * 8192 + 37, 0, 2, 3).astype(np.float32)
    own = values("gradient-like", x.shape[0], 1, 2, 3).astype(np.float32)
    fast = host(spec)
    expected = fast.encode(x)
    payload, flag = placed(np.zeros_like(expected), 0), np.zeros(1, np.int32)
    emulated.encode(spec, placed(x, 0), payload, flag)
    assert np.array_equal(payload, expected)
    summed, resent = np.empty_like(x), np.zeros_like(expected)
    fast.decode_add_encode(expected, own, summed, resent)
    target = placed(np.zeros_like(x), 0)
    emulated.hop(spec, payload, placed(own, 0), target, payload, flag)  # out is payload
    assert np.array_equal(bits(target), bits(summed))
    assert np.array_equal(payload, resent)
    assert flag[0] == 0 and emulated.atomics() == 0


def refused_from(spec: str) -> np.float32:
    """The smallest magnitude each codec refuses, from the codec's own definition: fp16
    and bf16 round it to Inf (half an ulp above the largest finite value, to even), bfp's
    range ends at 2**(102 + R) (codec_bfp: C = 1.5 * 2**23 * step stays finite below)."""
    codec = parse_codec(spec)
    if codec.name == "bfp":
        return np.float32(2.0 ** (102 + codec.rate))
    largest = {"fp16": np.finfo(np.float16).max, "bf16": np.float32(3.3895313892515355e38)}
    mantissa = {"fp16": 10, "bf16": 7}[spec]
    return np.float32(
        float(largest[spec]) + 2.0 ** (np.floor(np.log2(float(largest[spec]))) - mantissa - 1)
    )


def accepted_below(spec: str) -> np.float32:
    """The largest magnitude each codec takes: one float32 ulp below its refusal."""
    return np.nextafter(refused_from(spec), np.float32(0))


def test_refusal_edges_are_the_formats():
    """refused_from by hand: 65520 = 65504 + 16 (fp16); 2**128 - 2**119 (bf16, as bits
    0x7F7F8000); 2**110 for bfp at R = 8."""
    assert refused_from("fp16") == 65520.0
    assert np.array(refused_from("bf16")).view(np.int32) == 0x7F7F8000
    assert refused_from("bfp:rate=8") == 2.0**110
    assert np.float16(accepted_below("fp16")) == np.float16(65504)


def bad_places(count: int) -> list[int]:
    """Where a bad value is put: the first value, a high lane of a warp, the last whole
    group of 8, the last n % 8 values, the last bfp tile's tail."""
    return sorted({0, 8 * 29 + 3, 8 * 62 + 7, count - count % 8 - 1, count - 1, count - 3})


@pytest.mark.parametrize("spec", ["fp16", "bf16", "bfp:rate=8", "bfp:rate=2,block=8"])
def test_emulated_vote_flags_bad_data_alone(emulated, spec):
    """NaN, Inf, the largest float32 and the first refused value, one at a time in each
    bad place, aligned or not: the flag holds the largest |x| bits, as the host reference
    sees them (so the message is the reference's), set with one atomic per bad warp; the
    largest value taken leaves it at 0, with no atomic, on both paths."""
    count = 9 * 1024 + 5
    taken = accepted_below(spec)
    good = spread(count, 3)
    good[-2] = taken
    for offset in (0, 4):
        flag = np.zeros(1, np.int32)
        emulated.encode(
            spec,
            placed(good, offset),
            placed(np.zeros(host(spec).encoded_nbytes(count), np.uint8), offset),
            flag,
        )
        assert flag[0] == 0 and emulated.atomics() == 0
    host(spec).encode(good)  # the host takes it too
    for bad in (
        np.float32(np.nan),
        np.float32(np.inf),
        np.finfo(np.float32).max,
        refused_from(spec),
    ):
        for where in bad_places(count):
            x = good.copy()
            x[where] = -bad
            with pytest.raises(DataError):
                host(spec).encode(x)
            expected = int(np.abs(x).view(np.int32).max())
            for offset in (0, 4):
                flag = np.zeros(1, np.int32)
                payload = placed(np.zeros(host(spec).encoded_nbytes(count), np.uint8), offset)
                emulated.encode(spec, placed(x, offset), payload, flag)
                assert flag[0] == expected, (bad, where, offset)
                assert emulated.atomics() == 1


@pytest.mark.parametrize("spec", ["fp16", "bfp:rate=8"])
def test_emulated_hop_votes_on_its_sums(emulated, spec):
    """A sum past the range sets the flag with the sums' largest |x| bits; without a
    payload out (the sums alone) nothing is checked, as on the host."""
    count = 4 * 8192 + 9
    big = accepted_below(spec) * np.float32(0.75)
    x, own = spread(count, 5, -20, 10), spread(count, 6, -20, 10)
    x[-1] = own[-1] = big  # the sum is 1.5x the largest taken: refused
    fast = host(spec)
    payload = fast.encode(x)
    summed = np.empty_like(x)
    fast.decode_add_encode(payload, own, summed)
    flag = np.zeros(1, np.int32)
    target = placed(np.zeros_like(x), 0)
    emulated.hop(
        spec, placed(payload, 0), placed(own, 0), target, placed(np.zeros_like(payload), 0), flag
    )
    assert (
        flag[0]
        == int(np.abs(summed).view(np.int32).max())
        >= int(np.array(refused_from(spec)).view(np.int32))
    )
    assert emulated.atomics() == 1
    flag[0] = 0
    emulated.hop(spec, placed(payload, 0), placed(own, 0), target, None, flag)
    assert flag[0] == 0 and emulated.atomics() == 0


@pytest.mark.parametrize("spec", ["fp16", "bfp:rate=8"])
def test_codec_throughput_times_the_device_hop_on_the_double(spec, monkeypatch):
    """ccbench codec_throughput on device buffers (the double in CI): its hop runs the
    device kernels' fused hop, and no timed call allocates or waits."""
    import tests.devicedouble as double
    from ccbench.benchmarks.codec_throughput import measure_codec

    name = "bfp_decode_add_encode" if spec.startswith("bfp") else "cast_decode_add_encode"
    hops = []
    fused_hop = getattr(double.Kernels, name)
    monkeypatch.setattr(
        double.Kernels, name, lambda self, *args: hops.append(1) or fused_hop(self, *args)
    )
    double.STATS.reset()
    row = measure_codec(spec, "gradient-like", "double", "float32", 1 << 14, 2)
    assert row["kernels"] == "device" and row["hop_gbps"] > 0
    assert len(hops) >= 3  # the untimed try, then one per timed round
    assert double.STATS.timed == 0 and double.STATS.timed_allocs == 0, double.STATS.alloc_where


def edge_values(spec: str) -> np.ndarray:
    """Edge cases for the emulation: bfp blocks whose max |x| sits at 2**e (1 - 2**-R) and
    one ulp on either side (normal and subnormal exponents), zeros and the largest value
    taken; for the casts, random float32 bit patterns of every exponent the cast takes,
    rounding ties (the half-way bits), subnormals and the largest value taken."""
    rng = np.random.default_rng(7)
    codec = parse_codec(spec)
    top = accepted_below(spec)
    if codec.name != "bfp":
        patterns = rng.integers(0, 1 << 32, 40_000, dtype=np.uint64).astype(np.uint32)
        x = patterns.view(np.float32)
        x = x[np.isfinite(x) & (np.abs(x) <= top)]
        ties = (x.view(np.uint32) & np.uint32(0xFFFF0000)) | np.uint32(0x8000)  # bf16's
        half = (x.view(np.uint32) & np.uint32(0xFFFFE000)) | np.uint32(0x1000)  # fp16's
        both = np.concatenate([x, ties.view(np.float32), half.view(np.float32)])
        both = both[np.isfinite(both) & (np.abs(both) <= top)]
        return np.concatenate([both, [top, -top, 0.0, -0.0, 1e-45]]).astype(np.float32)
    edges = []
    for e in (-140, -126, -125, -1, 0, 30, codec.max_exponent - 1):
        edge = np.float32(2.0**e * (1 - 2.0**-codec.rate))
        edges += [np.nextafter(edge, np.float32(0)), edge, np.nextafter(edge, np.float32(1e38))]
    edges.append(top)
    x = np.zeros(len(edges) * codec.block * TILE_WIDTH // 8 + 29, np.float32)
    for i, v in enumerate(edges):  # column i of tile 0: max |x| = v, the rest below
        lanes = i + TILE_WIDTH * np.arange(codec.block)
        x[lanes] = v * rng.uniform(-1, 1, codec.block).astype(np.float32)
        x[lanes[rng.integers(codec.block)]] = v if i % 2 else -v
    x[-1] = -top  # the last tile's last block
    return x


@pytest.mark.parametrize(
    "spec", ["fp16", "bf16", "bfp:rate=8", "bfp:rate=16", "bfp:rate=2", "bfp:rate=5,block=8"]
)
def test_emulated_kernels_on_edge_values(emulated, spec):
    x = edge_values(spec)
    fast = host(spec)
    expected = fast.encode(x)
    assert np.array_equal(expected, reference(spec).encode(x))
    decoded = np.empty_like(x)
    fast.decode(expected, decoded)
    for offset in (0, 4):
        payload, flag = placed(np.zeros_like(expected), offset), np.zeros(1, np.int32)
        emulated.encode(spec, placed(x, offset), payload, flag)
        assert np.array_equal(payload, expected), offset
        assert flag[0] == 0 and emulated.atomics() == 0
        out = placed(np.zeros_like(x), offset)
        emulated.decode(spec, placed(expected, offset), out)
        assert np.array_equal(bits(out), bits(decoded)), offset
