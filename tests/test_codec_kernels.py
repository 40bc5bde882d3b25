"""The fused host kernels against the array-API reference, byte for byte and bit for bit.

Every comparison runs the same codec spec twice, once forced onto the reference
(`kernels = "reference"`), once on the fused kernels, and asks for identical payload
bytes, identical decoded floats in both directions (fused encode -> reference decode and
reference encode -> fused decode), identical reduce-scatter hops, and the same
DataError for data neither may send. Inputs: random values of every scale, real
gradients, and the edges of each format (subnormals, zeros, the largest values each
codec takes, block exponent edges, rounding ties), at lengths that are not multiples of
a block or a tile.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays as np_arrays

from ccbench.kernels import codec_fused, switches
from ccbench.kernels.codec_bfp import TILE_WIDTH
from ccbench.kernels.codecs import parse_codec
from ccbench.kernels.errors import DataError, UsageError
from ccbench.kernels.inputs import values

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too

torch = pytest.importorskip("torch")

if codec_fused.host_kernels() is None:
    if shutil.which("cc") or shutil.which("gcc"):  # an install with a compiler builds them
        pytest.fail(f"fused host kernels missing: {codec_fused.note()}", pytrace=False)
    pytest.skip(codec_fused.note(), allow_module_level=True)

BFP_RATES = range(2, 17)  # every rate the parser accepts
BLOCKS = (8, 32, 64, 256)  # the smallest, default and largest blocks
CASTS = ("fp16", "bf16")
# lengths around a block (8..256 values) and a tile (B x 256 values)
LENGTHS = (1, 7, 9, 31, 33, 255, 257, 8191, 8193, 3 * 8192 + 100, 65536 + 300)
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def pair(spec: str):
    """(reference, fused) codecs of one spec."""
    ref, fast = parse_codec(spec), parse_codec(spec)
    ref.kernels = "reference"
    return ref, fast


def bfp_specs():
    for rate in BFP_RATES:
        yield f"bfp:rate={rate}"
    for rate in (3, 8, 12, 16):
        for block in BLOCKS:
            if block != 32:
                yield f"bfp:rate={rate},block={block}"


ALL_SPECS = [*CASTS, *bfp_specs()]


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def check_equivalent(spec: str, x: np.ndarray) -> None:
    """Payload bytes, both decode directions, and the hop, fused against reference."""
    ref, fast = pair(spec)
    assert fast.kernel_path(x) == "fused" and ref.kernel_path(x) == "reference"
    p_ref, p_fast = ref.encode(x), fast.encode(x)
    assert same_bits(p_fast, p_ref), f"{spec}: payloads differ"
    y_ref, y_fast = np.empty_like(x), np.empty_like(x)
    ref.decode(p_fast, y_ref)  # fused encode -> reference decode
    fast.decode(p_ref, y_fast)  # reference encode -> fused decode
    assert same_bits(y_fast, y_ref), f"{spec}: decoded values differ"


def check_hop(
    spec: str, payload_of: np.ndarray, own: np.ndarray, encode: bool = True, alias: bool = False
) -> None:
    """decode_add_encode, fused, against the reference's decode, add, encode."""
    ref, fast = pair(spec)
    payload = ref.encode(payload_of)
    results = []
    for codec in (ref, fast):
        mine = own.copy()
        target = mine if alias else np.full_like(own, np.nan)
        out = np.zeros(codec.encoded_nbytes(own.shape[0]) + 5, np.uint8) if encode else None
        sent = codec.decode_add_encode(payload, mine, target, out)
        results.append((target, None if sent is None else sent.copy()))
    (t_ref, s_ref), (t_fast, s_fast) = results
    assert same_bits(t_fast, t_ref), f"{spec}: sums differ"
    if encode:
        assert same_bits(s_fast, s_ref), f"{spec}: re-encoded sums differ"
    else:
        assert s_fast is None and s_ref is None


# ---------------------------------------------------------------- random and real data


def spread(count: int, seed: int, low: int = -60, high: int = 60) -> np.ndarray:
    """Normal values times 2**k, k uniform in [low, high): every block a different scale."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(count) * 2.0 ** rng.integers(low, high, count)).astype(np.float32)


@pytest.mark.parametrize("spec", ALL_SPECS)
@pytest.mark.parametrize("count", LENGTHS)
def test_random_values(spec, count):
    check_equivalent(spec, spread(count, count, *((-20, 15) if spec in CASTS else (-60, 60))))


@pytest.fixture(scope="module")
def real_gradients(tmp_path_factory):
    """Real gradients: the corpus if one is built here, else a tiny one made now."""
    from ccbench.kernels.inputs import parse_data_kind

    try:
        kind = parse_data_kind("gradient")
    except UsageError:
        from ccbench.scripts.cli import main

        root = tmp_path_factory.mktemp("corpus")
        assert (
            main(
                [
                    "corpus",
                    "--out",
                    str(root),
                    "--lm-model",
                    "lm-tiny",
                    "--digits-model",
                    "none",
                    "--steps",
                    "2",
                    "--ranks",
                    "2",
                ]
            )
            == 0
        )
        saved = switches.current()  # the corpus as CCBENCH_CORPUS would name it
        switches.install(dataclasses.replace(saved, corpus=str(root)))
        try:
            return values(parse_data_kind("gradient"), 300_000, 0, 1).astype(np.float32)
        finally:
            switches.install(saved)
    return values(kind, 300_000, 0, 1).astype(np.float32)


@pytest.mark.parametrize(
    "spec", ["fp16", "bf16", "bfp:rate=4", "bfp:rate=8", "bfp:rate=16", "bfp:rate=5,block=64"]
)
def test_real_gradients(spec, real_gradients):
    grads = real_gradients
    check_equivalent(spec, grads)
    check_equivalent(spec, grads[:100_003])
    check_hop(spec, grads[:100_003], grads[100_003:200_006])


@pytest.mark.parametrize("spec", ["fp16", "bf16", "bfp:rate=8", "bfp:rate=3,block=8"])
def test_gradient_like(spec):
    check_equivalent(spec, values("gradient-like", 50_000, 0, 1, seed=3).astype(np.float32))


@pytest.mark.parametrize("spec", ["fp16", "bf16", "bfp:rate=8", "bfp:rate=13"])
@PROPERTY
@given(
    x=np_arrays(
        np.float32,
        st.integers(1, 20_000),
        elements=st.floats(
            min_value=-6e4, max_value=6e4, width=32, allow_nan=False, allow_subnormal=True
        ),
    )
)
def test_property(spec, x):
    check_equivalent(spec, x)


# ---------------------------------------------------------------- the edges of each format


def test_zeros_and_subnormals():
    tiny = np.array(
        [
            0.0,
            -0.0,
            1e-45,
            -1e-45,
            1e-40,
            -3e-41,
            5e-39,
            1.1754942e-38,
            1.1754944e-38,
            -1.1754944e-38,
            2e-38,
        ],
        np.float32,
    )
    zeros = np.zeros(9000, np.float32)
    zeros[1::2] = -0.0
    rng = np.random.default_rng(7)
    sign = rng.integers(0, 2, 9000).astype(np.uint32) << 31
    subnormal = (rng.integers(1, 1 << 23, 9000).astype(np.uint32) | sign).view(
        np.float32
    )  # bit patterns below 2**-126, both signs
    for spec in ALL_SPECS:
        for x in (
            tiny,
            zeros,
            subnormal,
            np.concatenate([subnormal, tiny, [1.0]]).astype(np.float32),
        ):
            check_equivalent(spec, x)


def largest_taken(spec: str) -> float:
    """The largest float32 magnitude each codec sends (one ulp below its refusal)."""
    codec = parse_codec(spec)
    limit = {"fp16": 65520.0, "bf16": 2.0**128 - 2.0**119}.get(spec)
    if limit is None:
        limit = 2.0**codec.max_exponent
    return float(np.nextafter(np.float32(limit), np.float32(0)))


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_largest_values_taken(spec):
    big = np.float32(largest_taken(spec))
    x = spread(20_000, 11, -20, 15)
    x[::1000], x[5::1000] = big, -big
    check_equivalent(spec, x)
    check_equivalent(spec, np.array([big, -big, 1.0, 0.0], np.float32))


@pytest.mark.parametrize("spec", [s for s in ALL_SPECS if s.startswith("bfp")])
def test_block_exponent_edges(spec):
    """Blocks whose max |x| sits at 2**e (1 - 2**-R) and one ulp on either side: the
    exponent byte moves up at the edge, in the normal and the subnormal range."""
    codec = parse_codec(spec)
    edges = []
    for e in (-140, -126, -125, -100, -1, 0, 1, 30, codec.max_exponent - 1):
        edge = np.float32(2.0**e * (1 - 2.0**-codec.rate))
        for v in (np.nextafter(edge, np.float32(0)), edge, np.nextafter(edge, np.float32(1e38))):
            edges.append(v)
    rng = np.random.default_rng(codec.rate)
    x = np.zeros(len(edges) * codec.block * TILE_WIDTH, np.float32)
    for i, v in enumerate(edges):  # block i (column i of tile 0..): max |x| = v, rest below
        column = (i // TILE_WIDTH) * codec.block * TILE_WIDTH + i % TILE_WIDTH
        lanes = column + TILE_WIDTH * np.arange(codec.block)
        x[lanes] = v * rng.uniform(-1, 1, codec.block).astype(np.float32)
        x[lanes[rng.integers(codec.block)]] = v if i % 2 else -v
    check_equivalent(spec, x)


@pytest.mark.parametrize("spec", [s for s in ALL_SPECS if s.startswith("bfp")])
def test_bfp_rounding_ties(spec):
    """Values exactly halfway between two multiples of a block's step round to even."""
    codec = parse_codec(spec)
    count = codec.block * TILE_WIDTH
    x = np.zeros(count, np.float32)
    top = 2 ** (codec.rate - 1) - 1  # largest |q|
    # every block has max |x| = 1 - 2**-R... below the edge: emax 0, step 2**(1-R)
    step = 2.0 ** (1 - codec.rate)
    q = np.random.default_rng(codec.rate).integers(-top, top, count)
    x[:] = ((q + 0.5) * step).astype(np.float32)  # exact ties (fewer than 24 bits)
    x[:TILE_WIDTH] = np.float32((top - 0.5) * step)  # pins each block's exponent
    check_equivalent(spec, x)


def cast_bit_patterns() -> np.ndarray:
    """Every upper 16 bits of a float32 with low halves around each rounding boundary."""
    high = np.arange(1 << 16, dtype=np.uint32) << 16
    low = np.array(
        [
            0,
            1,
            0xFFF,
            0x1000,
            0x1001,
            0x1FFF,
            0x2000,
            0x2001,
            0x3000,
            0x4000,
            0x6000,
            0x7FFF,
            0x8000,
            0x8001,
            0xC000,
            0xFFFF,
        ],
        np.uint32,
    )
    return (high[:, None] | low[None, :]).ravel().view(np.float32)


@pytest.mark.parametrize("spec", CASTS)
def test_cast_bit_patterns(spec):
    """Every sign, exponent and top mantissa of a float32, with the rounding ties below
    them (subnormal halves included), through both kernels: identical bits."""
    x = cast_bit_patterns()
    x = x[np.isfinite(x) & (np.abs(x) <= largest_taken(spec))]
    check_equivalent(spec, x)
    # decoding every 16-bit pattern a payload may hold (finite ones: payloads hold no other)
    everything = np.arange(1 << 16, dtype=np.uint16)
    ref, fast = pair(spec)
    y_ref, y_fast = np.empty(1 << 16, np.float32), np.empty(1 << 16, np.float32)
    ref.decode(everything.view(np.uint8), y_ref)
    fast.decode(everything.view(np.uint8), y_fast)
    finite = np.isfinite(y_ref)
    assert same_bits(y_fast[finite], y_ref[finite])
    assert np.array_equal(np.isnan(y_fast), np.isnan(y_ref))
    assert np.array_equal(np.isinf(y_fast), np.isinf(y_ref))


@pytest.fixture(params=["f16c", "integer"])
def fp16_code(request):
    """The float16 kernels twice: with the F16C instructions (where the CPU has them) and
    with the portable integer rounding every other CPU runs."""
    kernels = codec_fused.host_kernels()
    was = kernels.f16c(request.param == "f16c")
    yield request.param
    kernels.f16c(was)


def test_fp16_both_code_paths(fp16_code):
    x = cast_bit_patterns()
    x = x[np.isfinite(x) & (np.abs(x) <= largest_taken("fp16"))]
    check_equivalent("fp16", x)
    for count in (1, 7, 8, 9, 15, 17, 1000):  # the 8-wide loop and its tail
        check_equivalent("fp16", spread(count, count, -26, 16))
        check_hop("fp16", spread(count, 1, -20, 12), spread(count, 2, -20, 12))
        check_hop("fp16", spread(count, 1, -20, 12), spread(count, 2, -20, 12), encode=False)
    for x in bad_inputs("fp16"):
        with pytest.raises(DataError):
            parse_codec("fp16").encode(x)


@pytest.mark.parametrize("spec", [s for s in ALL_SPECS if s.startswith("bfp")])
def test_bfp_decodes_any_payload(spec):
    """Random payload bytes (exponent bytes within the format's range) decode alike."""
    ref, fast = pair(spec)
    count = 2 * ref.block * TILE_WIDTH + 77
    rng = np.random.default_rng(ref.rate * 1000 + ref.block)
    payload = rng.integers(0, 256, ref.encoded_nbytes(count), dtype=np.uint8)
    tile = ref.block * TILE_WIDTH
    nbytes, planes = TILE_WIDTH * ref.block_nbytes, tile * ref.rate // 8
    for start in range(0, payload.shape[0], nbytes):  # exponent rows: E <= 102 + R + 126
        width = min(TILE_WIDTH, (payload.shape[0] - start) // ref.block_nbytes)
        at = start + (planes if width == TILE_WIDTH else width * ref.block * ref.rate // 8)
        payload[at : at + width] = rng.integers(0, 229 + ref.rate, width)
    y_ref, y_fast = np.empty(count, np.float32), np.empty(count, np.float32)
    ref.decode(payload, y_ref)
    fast.decode(payload, y_fast)
    assert same_bits(y_fast, y_ref)


# ---------------------------------------------------------------- bad data


def bad_inputs(spec: str):
    big = np.float32(largest_taken(spec))
    first_refused = np.nextafter(big, np.float32(np.inf))
    for value in (np.nan, np.inf, -np.inf, np.finfo(np.float32).max, -first_refused, first_refused):
        for at in (0, 8191, 20_000):
            x = spread(30_000, 5, -20, 15)
            x[at] = value
            yield x


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_bad_data_refused_alike(spec):
    """NaN, Inf, the largest float32 and the first value past each codec's range: both
    paths raise DataError, with the same message."""
    ref, fast = pair(spec)
    for x in bad_inputs(spec):
        with pytest.raises(DataError) as by_ref:
            ref.encode(x)
        with pytest.raises(DataError) as by_fast:
            fast.encode(x)
        assert str(by_fast.value) == str(by_ref.value)


@pytest.mark.filterwarnings("ignore:overflow encountered")  # numpy's add, reaching Inf
@pytest.mark.parametrize("spec", ["fp16", "bf16", "bfp:rate=8", "bfp:rate=2,block=8"])
def test_hop_sum_out_of_range_refused_alike(spec):
    """A sum that leaves the codec's range: the same DataError, fused or not."""
    big = np.float32(largest_taken(spec))
    x = np.full(20_000, big * np.float32(0.75), np.float32)
    ref, fast = pair(spec)
    payload = ref.encode(x)
    errors = []
    for codec in (ref, fast):
        out = np.empty(codec.encoded_nbytes(x.shape[0]), np.uint8)
        with pytest.raises(DataError) as caught:
            codec.decode_add_encode(payload, x, np.empty_like(x), out)
        errors.append(str(caught.value))
    assert errors[0] == errors[1]


# ---------------------------------------------------------------- the reduce-scatter hop


@pytest.mark.parametrize("spec", ALL_SPECS)
@pytest.mark.parametrize("count", [1, 33, 8193, 3 * 8192 + 100])
def test_decode_add_encode(spec, count):
    scales = (-20, 12) if spec in CASTS else (-40, 40)
    a, b = spread(count, 1, *scales), spread(count, 2, *scales)
    check_hop(spec, a, b)
    check_hop(spec, a, b, encode=False)  # the last hop: no re-encode
    check_hop(spec, a, b, alias=True)  # target is own itself


def test_hop_is_the_composition_of_the_three_steps():
    """The reference hop is decode, add, encode: the codec's own steps, in turn."""
    codec = parse_codec("bfp:rate=8")
    a, b = spread(9000, 3), spread(9000, 4)
    payload = codec.encode(a)
    decoded = np.empty_like(a)
    codec.decode(payload, decoded)
    expected = codec.encode(decoded + b)
    target = np.empty_like(a)
    got = codec.decode_add_encode(
        payload, b, target, np.empty(codec.encoded_nbytes(9000), np.uint8)
    )
    assert same_bits(target, decoded + b) and same_bits(got, expected)


# ---------------------------------------------------------------- buffers, dtypes, dispatch


@pytest.mark.parametrize("spec", ["fp16", "bf16", "bfp:rate=8", "bfp:rate=16"])
def test_torch_tensors_and_unaligned_payloads(spec):
    """torch CPU tensors run the fused kernels, into payloads at odd byte offsets too."""
    ref, fast = pair(spec)
    x = torch.from_numpy(spread(10_001, 9, -20, 15))
    assert fast.kernel_path(x) == "fused"
    buf = torch.zeros(fast.encoded_nbytes(10_001) + 1, dtype=torch.uint8)
    payload = fast.encode(x, out=buf[1:])
    assert isinstance(payload, torch.Tensor)
    assert same_bits(payload.numpy(), ref.encode(x.numpy()))
    out = torch.empty(10_001)
    fast.decode(payload, out)
    y = np.empty(10_001, np.float32)
    ref.decode(payload.numpy(), y)
    assert same_bits(out.numpy(), y)


@pytest.mark.parametrize("spec", ["bfp:rate=8", "bfp:rate=5,block=8"])
@pytest.mark.parametrize("dtype", ["float64", "float16", "bfloat16"])
def test_bfp_other_dtypes(spec, dtype):
    """bfp's fused kernels take every float dtype through float32, as the reference."""
    ref, fast = pair(spec)
    data = spread(9000, 8, -10, 10)
    x = torch.from_numpy(data).to(torch.bfloat16) if dtype == "bfloat16" else data.astype(dtype)
    assert fast.kernel_path(x) == "fused"
    p_ref, p_fast = ref.encode(x), fast.encode(x)
    assert same_bits(np.asarray(p_fast), np.asarray(p_ref))
    outs = [torch.empty_like(x) if dtype == "bfloat16" else np.empty_like(x) for _ in "ab"]
    ref.decode(p_ref, outs[0])
    fast.decode(p_ref, outs[1])
    if dtype == "bfloat16":
        outs = [o.view(torch.int16).numpy() for o in outs]
    assert same_bits(outs[1], outs[0])


def test_casts_of_other_dtypes_run_the_reference():
    codec = parse_codec("fp16")
    assert codec.kernel_path(np.zeros(4, np.float64)) == "reference"
    assert codec.kernel_path(np.zeros(4, np.float32)) == "fused"
    assert codec.kernel_path(np.zeros(8, np.float32)[::2]) == "reference"  # not contiguous


def test_environment_forces_the_reference(switch):
    switch("CCBENCH_CODEC_KERNELS", "reference")
    x = np.zeros(10, np.float32)
    assert parse_codec("bfp:rate=8").kernel_path(x) == "reference"
    assert parse_codec("bf16").kernel_path(x) == "reference"
    switch("CCBENCH_CODEC_KERNELS", "fastest")
    with pytest.raises(UsageError, match="CCBENCH_CODEC_KERNELS"):
        parse_codec("fp16")
    switch("CCBENCH_CODEC_KERNELS", None)
    assert parse_codec("fp16").kernel_path(x) == "fused"
    assert parse_codec("zstd").kernel_path(x) == "library"
    assert parse_codec("none").kernel_path(x) == "copy"


def test_without_the_extension_the_reference_runs(monkeypatch):
    """An install without a C compiler: the codecs work, and say which kernels ran."""
    import ccbench.kernels

    monkeypatch.setitem(sys.modules, "ccbench.kernels._fused", None)
    monkeypatch.delattr(ccbench.kernels, "_fused", raising=False)
    monkeypatch.setattr(codec_fused, "_host", None)
    x = spread(5000, 1)
    codec = parse_codec("bfp:rate=8")
    assert codec.kernel_path(x) == "reference"
    assert "not built" in codec_fused.note()
    y = np.empty_like(x)
    codec.decode(codec.encode(x), y)
    assert np.abs(y - x).max() <= codec.error_bound(x)
    from ccbench.kernels.codecs import describe_codecs

    assert "not built" in describe_codecs()


def test_kernels_check_buffer_sizes():
    """The compiled functions refuse buffers too small instead of writing past them."""
    kernels = codec_fused.host_kernels()
    x = np.ones(1000, np.float32)
    with pytest.raises(ValueError, match="needed"):
        kernels.bfp_encode(x, np.empty(10, np.uint8), 32, TILE_WIDTH, 8)
    with pytest.raises(ValueError, match="needed"):
        kernels.bfp_decode(np.empty(10, np.uint8), x, 32, TILE_WIDTH, 8)
    with pytest.raises(ValueError, match="needed"):
        kernels.cast_encode(x, np.empty(1999, np.uint8), False)
    with pytest.raises(ValueError, match="rate"):
        kernels.bfp_encode(x, np.empty(2000, np.uint8), 32, TILE_WIDTH, 17)


@pytest.mark.timeout(300)
def test_collectives_agree_on_both_paths():
    """4 ranks: collective-level reduce-scatter and allreduce (chunked, and in sub-chunks),
    fused against reference kernels, the same bits on every rank."""
    from tests.helpers.drivers import failed_checks
    from tests.mpirun import case_results

    results = case_results("tests.drivers.kernel_paths_cases", 4, timeout=280)
    assert len(results) == 20
    failed = {case: failed_checks(r) for case, r in results.items() if failed_checks(r)}
    assert failed == {}
