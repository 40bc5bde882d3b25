"""The strict device double, and every variant on it: no timed call waits for the host.

The double (tests/devicedouble.py) stands in for a GPU library in CI. Its own behaviour
is checked first (what it refuses, what it counts); then the multi-rank validation
matrix of every variant runs on it (tests/drivers/double_cases.py) over MPI staged
through host memory, over a GPU-aware MPI and over torch.distributed: every result is
validated, every host synchronisation inside a timed call is one ccbench declared, and
over torch.distributed (reading the device as NCCL does) fp16, bf16 and bfp encode and
decode, the rings and the pipelines make none at all.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import tests.devicedouble as double
from ccbench.collectives.comm import Communicator
from ccbench.kernels import arrays, backends
from ccbench.kernels.codecs import parse_codec
from ccbench.kernels.errors import DataError
from tests.drivers.transport_cases import double_cases
from tests.mpirun import case_results

# launches MPI ranks: the Open MPI leg runs it too
pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("fresh_counts")]

CASES = [cid for cid, _, _, _ in double_cases()]
# what must not wait for the host at all over torch.distributed
SYNC_FREE = ("baseline", "p2p", "coll", "sparse-dense")


# ---------------------------------------------------------------- the double itself


def test_implicit_conversions_to_host_refuse_or_count():
    x = arrays.from_numpy("double", np.arange(4.0), "float32")
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(x)
    with pytest.raises(TypeError):
        x + np.ones(4, np.float32)  # device and host arrays do not mix
    with pytest.raises(TypeError):
        x[...] = np.ones(4, np.float32)
    double.STATS.in_region = True
    assert float(x[1]) == 1.0 and bool(x[2]) and int(x[3]) == 3 and x[0].item() == 0.0
    double.STATS.in_region = False
    assert double.STATS.timed == 4 and double.STATS.undeclared == 4
    assert "float()" in double.STATS.where[0]


def test_explicit_copies_follow_cupys_rules():
    x = arrays.empty("double", 3, "float32")
    x.set(np.array([1, 2, 3], np.float32))
    with pytest.raises(TypeError):
        x.set([1, 2, 3])  # set takes host arrays only
    assert np.array_equal(x.get(), [1, 2, 3])
    assert double.STATS.syncs == 1 and double.STATS.transfers == 2  # get waits; set not
    assert np.array_equal(arrays.to_numpy(x), [1, 2, 3])  # declared: the harness's copy


def test_declared_waits_are_counted_apart():
    x = arrays.from_numpy("double", np.ones(8), "float32")
    double.STATS.in_region = True
    arrays.host_sync(x)  # declared: a GPU-aware MPI's wait
    host = np.empty(32, np.uint8)
    arrays.to_host(x, host)  # declared: staging through host memory
    float(x[0])  # not declared
    double.STATS.in_region = False
    assert double.STATS.timed == 3 and double.STATS.undeclared == 1


def test_data_dependent_shapes_wait_for_the_device():
    x = arrays.from_numpy("double", np.array([0, 1, 0, 2]), "float32")
    xp = x.__array_namespace__()
    double.STATS.in_region = True
    xp.nonzero(x)
    x[x > 0]
    double.STATS.in_region = False
    assert double.STATS.timed == 2


# the device kernels' path (kernels/codec_device.py where cupy runs: emulated on the
# double) and the array-API kernels' (torch-CUDA without cupy)
KERNELS = [("auto", "device"), ("reference", "reference")]


@pytest.mark.parametrize("kernels, path", KERNELS)
@pytest.mark.parametrize("spec", ["fp16", "bf16", "bfp:rate=8", "bfp:rate=3,block=8"])
def test_codecs_never_wait_and_match_the_host_bit_for_bit(spec, kernels, path):
    codec = parse_codec(spec)
    codec.kernels = kernels
    x = np.random.default_rng(1).standard_normal(20_000).astype(np.float32)
    d = arrays.from_numpy("double", x, "float32")
    assert codec.kernel_path(d) == path
    out = arrays.empty("double", x.size, "float32")
    double.STATS.in_region = True
    payload = codec.encode(d)
    codec.decode(payload, out)
    double.STATS.in_region = False
    assert double.STATS.timed == 0
    assert np.array_equal(arrays.to_numpy(payload), codec.encode(x))
    y = np.empty_like(x)
    codec.decode(codec.encode(x), y)
    assert np.array_equal(arrays.to_numpy(out).view(np.uint32), y.view(np.uint32))


@pytest.mark.parametrize("kernels, path", KERNELS)
@pytest.mark.parametrize("spec", ["fp16", "bf16", "bfp:rate=8"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, float(np.finfo(np.float32).max)])
def test_a_device_range_check_is_deferred_and_refuses_as_the_host_does(spec, bad, kernels, path):
    x = np.random.default_rng(2).standard_normal(9000).astype(np.float32)
    x[1234] = bad
    with pytest.raises(DataError) as on_host:
        parse_codec(spec).encode(x)
    codec = parse_codec(spec)
    codec.kernels = kernels
    codec.encode(arrays.from_numpy("double", x, "float32"))  # no wait, no error yet
    with pytest.raises(DataError) as later:
        codec.check_deferred()
    assert str(later.value) == str(on_host.value)
    codec.check_deferred()  # read once


def test_the_timing_loop_finds_a_call_that_waits():
    """A call that reads a device scalar inside the timed region is caught, call by call;
    the events time it, and the loop's own waits lie outside the region."""
    from ccbench.benchmarks.timing import measure

    comm = Communicator(MPI.COMM_SELF)
    x = arrays.from_numpy("double", np.ones(16), "float32")
    got = measure(comm, lambda: float(x.sum()), 5, 2, "per-call", buffer="double")
    assert got["host_syncs"] == 0.0  # none declared
    assert double.STATS.timed == 5 and double.STATS.undeclared == 5


def test_codec_throughput_times_device_buffers_with_events():
    from ccbench.benchmarks.codec_throughput import measure_codec

    row = measure_codec("bfp:rate=8", "gradient-like", "double", "float32", 1 << 15, 2)
    assert row["buffer"] == "double" and row["kernels"] == "device"
    assert row["encode_gbps"] > 0 and row["ratio"] == pytest.approx(32 * 4 / 33)
    assert double.STATS.timed == 0  # encode, decode, hop and copy: nothing waits


# ---------------------------------------------------------------- every variant on it


@pytest.mark.timeout(660)
@pytest.mark.parametrize("case_id", CASES)
def test_every_variant_on_the_double_validates_without_waiting(case_id):
    got = case_results("tests.drivers.double_cases", 2, timeout=600).get(case_id)
    assert got is not None, f"{case_id} did not report"
    assert got["status"] == 0, got
    rows, counts = got["rows"], got["double"]
    assert rows and {r["validation"] for r in rows} == {"Pass"}, rows
    assert {r["device"] for r in rows} == {"double:0,double:1"}  # each rank its device
    # no timed call waited for the host where ccbench did not say it must
    assert [c["undeclared"] for c in counts] == [0, 0], counts
    transport, _, rest = case_id.partition("-")
    if transport == "torch" and rest.startswith(SYNC_FREE):
        assert [c["timed"] for c in counts] == [0, 0], counts
        assert {r["host_syncs"] for r in rows} == {"0.0"}
    elif case_id.startswith("mpi-"):  # staging, or a GPU-aware MPI's wait: counted
        assert all(float(r["host_syncs"]) > 0 for r in rows), rows


def test_bfloat16_on_a_device_reaches_mpi_only_where_mpi_can_reduce_it():
    """MPI has no bfloat16 datatype: ccbench's op adds it on the host (staged). A GPU-aware
    MPI would get device memory it cannot add: refused in one line, before any call."""
    from ccbench.kernels.errors import UsageError

    class Bf16:  # a device tensor's description is all the refusal reads
        dtype, shape = "torch.bfloat16", (8,)

    class Device(backends.Backend):
        name, device = "bf16-device", True

        def owns(self, x):
            return isinstance(x, Bf16)

    arrays.register(Device())
    try:
        comm = Communicator(MPI.COMM_SELF, gpu_aware=True)
        for collective in ("reduce_scatter", "allreduce"):
            with pytest.raises(UsageError, match="MPI has no bfloat16 datatype"):
                comm.library_call(collective, Bf16(), Bf16())
    finally:
        arrays._BACKENDS.pop("bf16-device")


def test_allocations_are_counted_in_and_out_of_timed_regions():
    """New storage counts as an allocation (in a timed region too); views and results
    written into `out=` do not."""
    xp = double.NAMESPACE
    x = xp.zeros(8, dtype=np.float32)
    before = double.STATS.snapshot()
    double.STATS.in_region = True
    try:
        x.view(np.uint8)
        x[2:4]
        xp.add(x, x, out=x)
        assert double.STATS.timed_allocs == before["timed_allocs"]
        y = x + x
        xp.empty(4, dtype=np.float32)
    finally:
        double.STATS.in_region = False
    assert double.STATS.timed_allocs - before["timed_allocs"] == 2
    assert double.STATS.allocs - before["allocs"] == 2
    assert "test_device_double.py" in double.STATS.alloc_where[-1]
    assert y.shape == (8,)
