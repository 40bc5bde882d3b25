"""The error bounds: what a lossy codec states (`Codec.error_bound`) and what a compressed
collective composes from it (`collectives.compressed_error.error_bound`, as
docs/compression.md writes it).

A codec's round trip stays within its bound on any float32 or float64 input (hypothesis
feeds zeros, subnormals, tiny and huge values), and bfp's bound is reached, not only
kept; the collectives' bounds (ring, point to point, library-backed) are worked by hand
for fp16 on float32 data; a variant that sends more error than it states fails
validation, with the bound's closed form in its row. The bound of the two-level
collectives: tests/test_hierarchical.py.
"""

from __future__ import annotations

import csv

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays as np_arrays

from ccbench.kernels.codecs import parse_codec
from tests.helpers.cli import parse_osu
from tests.helpers.codec_data import LOSSY, PROPERTY, float32_arrays, limit_of, max_err, roundtrip
from tests.mpirun import mpirun

# launches MPI ranks (a variant run beyond its bound): the Open MPI leg runs it too
pytestmark = pytest.mark.mpi

pytest.importorskip("torch")
pytest.importorskip("zfpy")
pytest.importorskip("zstandard")

QUICK = ["-i", "5", "-x", "1"]


# ------------------------------------------------------------ what a codec states


@pytest.mark.parametrize("spec", LOSSY)
@PROPERTY
@given(data=st.data())
def test_lossy_roundtrip_within_bound(spec, data):
    codec = parse_codec(spec)
    x = data.draw(float32_arrays(limit_of(spec)))
    _, y = roundtrip(codec, x)
    amax = float(np.abs(x.astype(np.float64)).max())
    assert np.isfinite(y).all()
    assert max_err(x, y) <= codec.error_bound(amax, "float32")


@pytest.mark.parametrize("spec", ["bfp:rate=8", "bfp:rate=3", "fp16", "zfp:rate=8"])
@PROPERTY
@given(data=st.data())
def test_lossy_roundtrip_float64_within_bound(spec, data):
    codec = parse_codec(spec)
    limit = min(limit_of(spec), 1e30)
    x = data.draw(
        np_arrays(
            np.float64,
            st.integers(1, 300),
            elements=st.floats(min_value=-limit, max_value=limit, allow_nan=False),
        )
    )
    _, y = roundtrip(codec, x)
    assert max_err(x, y) <= codec.error_bound(float(np.abs(x).max()), "float64")


@PROPERTY
@given(scale=st.integers(-140, 100), rate=st.integers(2, 16))
def test_bfp_bound_is_tight_and_exact(scale, rate):
    """The stated bound is reached (half a step) and never passed, at any magnitude."""
    codec = parse_codec(f"bfp:rate={rate}")
    x = np.random.default_rng(scale + 200).uniform(-1, 1, 4096) * 2.0**scale
    x = x.astype(np.float32)
    _, y = roundtrip(codec, x)
    bound = codec.error_bound(float(np.abs(x).max()))
    err = max_err(x, y)
    assert err <= bound
    if float(np.abs(x).max()) > 2.0**-120:  # away from the subnormal floor
        assert err >= bound / 4


# ------------------------------------------------------------ what a collective composes


def test_collective_error_bounds_hand_worked():
    """collectives.compressed_error.error_bound against docs/compression.md's composition, worked
    by hand for fp16 on float32 data: e(a) = 2^-11 a + 2^-25; rounding r(a) = 2^-24 a +
    2^-150."""
    from ccbench.collectives.compressed_error import error_bound

    fp16, none = parse_codec("fp16"), parse_codec("none")

    def e(a):
        return 2.0**-11 * a + 2.0**-25

    def r(a):
        return 2.0**-24 * a + 2.0**-150

    # allgather, collective level: one round trip of the largest input (M = 5)
    assert error_bound(fp16, "coll", "allgather", [3.0, 5.0], "float32") == pytest.approx(
        e(5.0), rel=1e-12
    )
    # point to point on 3 ranks: two hops, the second re-encodes the first's output
    first = e(4.0)
    assert error_bound(fp16, "p2p", "allgather", [1.0, 2.0, 4.0], "float32") == pytest.approx(
        first + e(4.0 + first), rel=1e-12
    )
    # reduce-scatter on 2 ranks (S = 3): one hop re-encodes the partial sum and adds in
    # float32, plus rounding the inputs (1, 2) and the reference (3)
    hop = e(3.0) + r(3.0)
    inputs = r(1.0) + r(2.0) + r(3.0)
    rs = error_bound(fp16, "p2p", "reduce_scatter", [1.0, 2.0], "float32")
    assert rs == pytest.approx(hop + inputs, rel=1e-6)
    # allreduce, collective level: that, then one more round trip of the sums
    assert error_bound(fp16, "coll", "allreduce", [1.0, 2.0], "float32") == pytest.approx(
        rs + e(3.0 + rs), rel=1e-12
    )
    assert error_bound(none, "coll", "allreduce", [1.0, 2.0], "float32") is None


def test_library_error_bounds_by_hand():
    """The library-backed collectives' bounds (collectives.compressed_error.error_bound), worked
    by hand for fp16 on float32 data, 3 ranks with max|x| 1, 2 and 4: one round trip of a
    value of magnitude a costs e(a) = 2^-11 a + 2^-25, a float32 rounding 2^-24 a +
    2^-150."""
    from ccbench.collectives.compressed_error import compressions_on_path, error_bound
    from ccbench.kernels.codecs import parse_codec

    fp16, amaxes = parse_codec("fp16"), [1.0, 2.0, 4.0]

    def e(a):
        return 2**-11 * a + 2**-25

    def r32(a):
        return 2**-24 * a + 2**-150

    # allgather: each block one round trip, at the largest magnitude
    assert error_bound(fp16, "library", "allgather", amaxes, "float32") == e(4.0)
    # reduce-scatter: the two largest contributions decoded (a rank's own is not encoded,
    # and the worst rank is the one with the smallest input), two float32 additions at
    # the sum's magnitude, the inputs' and the reference's roundings
    decoded = e(2.0) + e(4.0)
    inputs = r32(1.0) + r32(2.0) + r32(4.0) + r32(7.0)
    rs = decoded + 2 * r32(7.0 + decoded) + inputs
    got = error_bound(fp16, "library", "reduce_scatter", amaxes, "float32")
    assert got == pytest.approx(rs, rel=1e-12)
    # the ring's: each of the 2 hops re-encodes a partial sum of magnitude up to 7
    ring = e(7.0)
    ring += r32(7.0 + ring)
    ring += e(7.0 + ring)
    ring += r32(7.0 + ring)
    assert error_bound(fp16, "coll", "reduce_scatter", amaxes, "float32") == pytest.approx(
        ring + inputs, rel=1e-12
    )
    assert got < 0.7 * (ring + inputs)
    # allreduce: the reduce-scatter's, then the reduced block's one round trip
    got = error_bound(fp16, "library", "allreduce", amaxes, "float32")
    assert got == pytest.approx(rs + e(7.0 + rs), rel=1e-12)
    assert [
        compressions_on_path("library", c, 3) for c in ("allgather", "reduce_scatter", "allreduce")
    ] == [1, 1, 2]
    assert error_bound(parse_codec("zstd"), "library", "allreduce", amaxes, "float32") is None


# ------------------------------------------------------------ a variant beyond its bound


@pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too
@pytest.mark.timeout(60)
def test_lossy_error_beyond_its_bound_fails_and_exits_1(tmp_path):
    """A lossy variant that states fp16's bound but sends bf16 (4 to 8 times that error):
    every size fails validation, the run exits 1, and the row's bound is fp16's closed form
    2^-11 M + 2^-25 (M = the largest |x| of any rank's validation input, in float32)."""
    from ccbench.kernels.inputs import values

    out = tmp_path / "over.csv"
    proc = mpirun(
        2,
        [
            "-m",
            "tests.drivers.faulty_variants",
            "overbound",
            "--collective",
            "allgather",
            "-m",
            "4K:16K",
            "-c",
            "--data",
            "gradient-like",
            "--csv",
            out,
            *QUICK,
        ],
    )
    assert proc.returncode == 1, proc.stderr
    assert [r[2] for r in parse_osu(proc.stdout)] == ["Fail", "Fail", "Fail"]
    with open(out, newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["validation"] for r in table] == ["Fail"] * 3
    for row in table:
        count = int(row["size_bytes"]) // 4
        amax = max(
            float(np.abs(values("gradient-like", count, r, 2, 0).astype(np.float32)).max())
            for r in range(2)
        )
        bound = 2.0**-11 * amax + 2.0**-25
        assert float(row["error_bound"]) == pytest.approx(bound, rel=1e-9)
        # beyond the bound, and by less than 10x: a bound 10 times too loose would pass it
        assert bound < float(row["validation_err"]) < 10 * bound
