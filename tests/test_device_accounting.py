"""Device accounting through the public codec API and the harness, on the host kernels
and on the strict device double (tests/devicedouble.py): the range check at exactly the
first value each cast refuses, on the last values of every tail length the vector loops
leave, dtypes the device kernels do not take, staging as the default for device buffers
over MPI, and host synchronisations per call when --ci-target decides the number of calls.

The edges are closed forms: float16's largest finite value is 65504 and its spacing
there 32, so 65520 (half a step above) rounds to Inf under round-to-nearest-even and the
float32 just below it rounds down to 65504; bfloat16's largest is 2**128 - 2**120 with
spacing 2**120, so 2**128 - 2**119 is the first that rounds to Inf.
"""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

import tests.devicedouble as double
from ccbench.kernels import arrays, codec_fused
from ccbench.kernels.codecs import parse_codec
from ccbench.kernels.errors import DataError

pytestmark = pytest.mark.usefixtures("fresh_counts")

F16_REFUSED = 65520.0
BF16_REFUSED = 2.0**128 - 2.0**119
EDGES = {"fp16": (F16_REFUSED, 65504.0), "bf16": (BF16_REFUSED, 2.0**128 - 2.0**120)}
# host: the compiled kernels (F16C and integer loops where the CPU has F16C), the
# array-API reference; the double: its device kernels and its array-API path
PATHS = ["fused-f16c", "fused-integer", "reference", "double", "double-reference"]


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    name = request.param
    kernels = codec_fused.host_kernels()
    if name.startswith("fused") or name == "double":
        if kernels is None:
            pytest.skip("the compiled kernels are not built")
    if name == "double-reference":
        monkeypatch.setenv("CCBENCH_DOUBLE_KERNELS", "0")
    if name.startswith("fused-"):
        was = kernels.f16c(name == "fused-f16c")
        if name == "fused-f16c" and not kernels.f16c(True):
            kernels.f16c(was)
            pytest.skip("this CPU has no F16C")
        yield name
        kernels.f16c(was)
        return
    yield name


def codec_on(path: str, spec: str):
    codec = parse_codec(spec)
    if path == "reference":
        codec.kernels = "reference"
    return codec


def array(path: str, values: np.ndarray):
    if path.startswith("double"):
        return arrays.from_numpy("double", values, "float32")
    return values.astype(np.float32)


def encode_checked(codec, x):
    """Encode as a timed call does, then the check a device defers past the timed calls."""
    payload = codec.encode(x)
    codec.check_deferred()
    return payload


def expected_path(path: str) -> str:
    return {
        "fused-f16c": "fused",
        "fused-integer": "fused",
        "reference": "reference",
        "double": "device",
        "double-reference": "reference",
    }[path]


@pytest.mark.parametrize("spec", ["fp16", "bf16"])
def test_the_first_refused_value_is_refused_and_the_one_below_it_kept(path, spec):
    refused, largest = EDGES[spec]
    codec = codec_on(path, spec)
    below = float(np.nextafter(np.float32(refused), np.float32(0)))
    for sign in (1.0, -1.0):
        values = np.array([0.5, sign * below, -1.0], np.float32)
        x = array(path, values)
        assert codec.kernel_path(x) == expected_path(path)
        out = array(path, np.zeros(3, np.float32))
        codec.decode(encode_checked(codec, x), out)
        assert arrays.to_numpy(out).tolist() == [0.5, sign * largest, -1.0]
        with pytest.raises(DataError, match="refusing to send"):
            encode_checked(codec, array(path, np.array([0.5, sign * refused, -1.0], np.float32)))


# every tail the 8-wide loops leave (n % 8 = 0..7), and arrays shorter than one vector
LENGTHS = [n for k in (0, 1, 2) for n in range(8 * k + 1, 8 * k + 9)]


@pytest.mark.parametrize("spec", ["fp16", "bf16"])
@pytest.mark.parametrize("bad", [F16_REFUSED, math.inf, math.nan])
def test_a_bad_last_value_is_refused_at_every_tail_length(path, spec, bad):
    bad = BF16_REFUSED if spec == "bf16" and bad == F16_REFUSED else bad
    codec = codec_on(path, spec)
    for n in LENGTHS:
        values = np.linspace(-1.0, 1.0, n).astype(np.float32)
        values[-1] = bad
        with pytest.raises(DataError):
            encode_checked(codec, array(path, values))
        codec.check_deferred()  # nothing left over for the next length


@pytest.mark.parametrize("spec", ["fp16", "bf16"])
def test_the_hop_refuses_a_sum_out_of_range_in_its_last_value(path, spec):
    """The reduce-scatter hop: target = decode(payload) + own, encoded; the sum of the
    last value reaches the first refused one (half of it from each side)."""
    refused, _ = EDGES[spec]
    codec = codec_on(path, spec)
    for n in LENGTHS:
        incoming = np.zeros(n, np.float32)
        incoming[-1] = refused / 2
        own = np.zeros(n, np.float32)
        own[-1] = refused / 2
        payload = codec.encode(array(path, incoming))
        codec.check_deferred()
        target = array(path, np.zeros(n, np.float32))
        out = (
            array(path, np.zeros(2 * n, np.float32)).view(np.uint8)
            if path.startswith("double")
            else np.zeros(2 * n, np.uint8)
        )
        with pytest.raises(DataError):
            codec.decode_add_encode(payload, array(path, own), target, out)
            codec.check_deferred()
        codec.check_deferred()


@pytest.mark.parametrize("spec", ["fp16", "bf16", "bfp:rate=8"])
@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_dtypes_the_device_kernels_do_not_take_run_the_array_api_path(spec, dtype):
    """The device kernels read float32; a float64 or float16 device array takes the
    array-API path and gives the host reference's bytes and values."""
    if codec_fused.host_kernels() is None:
        pytest.skip("the compiled kernels are not built")
    values = np.linspace(-3.0, 3.0, 37).astype(dtype)
    device = arrays.from_numpy("double", values, dtype)
    codec, reference = parse_codec(spec), parse_codec(spec)
    reference.kernels = "reference"
    assert codec.kernel_path(device) == "reference"
    payload = encode_checked(codec, device)
    want = reference.encode(values.copy())
    assert np.array_equal(arrays.to_numpy(payload), want)
    out = arrays.from_numpy("double", np.zeros(37), dtype)
    codec.decode(payload, out)
    host_out = np.zeros(37, dtype)
    reference.decode(want, host_out)
    assert np.array_equal(arrays.to_numpy(out), host_out)


# ---------------------------------------------------------------- MPI and the harness


@pytest.mark.mpi
def test_device_buffers_are_staged_unless_mpi_is_said_to_be_gpu_aware(switch):
    from mpi4py import MPI

    from ccbench.collectives.comm import Communicator

    switch("CCBENCH_GPU_AWARE", None)
    values = np.arange(8, dtype=np.float32)
    # staged (one piece): the input copied to its pinned mirror, the host waits for that
    # copy before MPI reads it, the result copied back without a host wait
    for aware, copies in ((None, 1), ("1", 0)):
        if aware:
            switch("CCBENCH_GPU_AWARE", aware)
        comm = Communicator(MPI.COMM_WORLD)
        assert comm.gpu_aware is bool(aware)
        assert comm.describe()["gpu_aware"] is bool(aware)
        send = arrays.from_numpy("double", values, "float32")
        recv = arrays.empty("double", 8, "float32")
        call = comm.library_call("allreduce", send, recv)
        double.STATS.reset()
        call()
        assert double.STATS.copies == {"d2h": copies, "h2d": copies}
        assert double.STATS.copy_waits == {"d2h": copies, "h2d": 0}
        assert np.array_equal(arrays.to_numpy(recv), values * comm.size)


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_host_syncs_are_per_call_when_the_interval_decides_the_calls(tmp_path, monkeypatch):
    """The staged library allreduce makes one declared host wait per call (for the
    input's copy to its pinned mirror, before MPI reads it; the result's copy back is
    not waited for): 1 per call however many calls --ci-target runs."""
    from ccbench.benchmarks import baseline

    monkeypatch.delenv("CCBENCH_GPU_AWARE", raising=False)
    out = tmp_path / "b.csv"
    argv = [
        "-d",
        "double",
        "--collective",
        "allreduce",
        "-m",
        "4K:4K",
        "-i",
        "3",
        "-x",
        "1",
        "--csv",
        str(out),
    ]
    assert baseline.main(argv) == 0
    assert baseline.main([*argv, "--ci-target", "0.0001", "--time-budget", "0.3"]) == 0
    fixed, adaptive = csv.DictReader(out.open())
    assert fixed["ci_target_pct"] == "" and int(fixed["iterations"]) == 3
    assert adaptive["stopped_by"] in ("budget", "target")
    assert int(adaptive["iterations"]) > 3  # the interval asked for more calls
    assert float(fixed["host_syncs"]) == float(adaptive["host_syncs"]) == 1.0
