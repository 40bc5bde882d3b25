"""Graph mode (--cuda-graph N) on the strict device double, and what it refuses.

The double (tests/devicedouble.py) models a CUDA graph as CUDA behaves: inside a capture
an allocation, a host synchronisation or a read of device memory raises; a replay is
one host launch whose work runs on the device. Every capturable variant then runs with
-c --cuda-graph 3 on 2 ranks over torch.distributed (tests/drivers/graph_cases.py) and
its counts are checked against the closed form of its options: per rank, every size's
ITERATIONS timed iterations of REPLAYS replays are the only launches inside the timed
regions, none of them allocates or waits for the host, and the replays validate.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import tests.devicedouble as double
from ccbench.kernels import arrays
from ccbench.kernels.codecs import parse_codec
from tests.drivers.graph_cases import ITERATIONS, REFUSED, REPLAYS, SIZES, graph_cases
from tests.mpirun import case_results

# the capturable variants' counts run on 2 ranks
pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("fresh_counts")]


def device(values) -> object:
    return arrays.from_numpy("double", np.asarray(values, np.float32), "float32")


# ---------------------------------------------------------------- the double's graphs


@pytest.mark.parametrize(
    "inside, what",
    [
        (lambda x: double.NAMESPACE.empty(4, dtype=np.float32), "a device allocation"),
        (lambda x: x + x, "a device allocation"),  # a result of its own: new storage
        (lambda x: x[:1].item(), ".item()"),  # a host read: the host waits for the device
        (lambda x: x.get(), ".get()"),
        (lambda x: arrays.synchronize("double"), "stream.synchronize()"),
        (lambda x: x.set(np.zeros(4, np.float32)), "a copy between host and device"),
    ],
)
def test_what_cuda_refuses_inside_a_capture_raises(inside, what):
    x = device([1, 2, 3, 4])
    graph = arrays.backend("double").graph()
    with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"):
        graph.capture(lambda: inside(x))
    with pytest.raises(RuntimeError, match=what.replace("(", r"\(").replace(")", r"\)")):
        graph.capture(lambda: inside(x))
    inside(x)  # outside a capture the same work is allowed


def test_a_replay_is_one_launch_without_allocations_or_waits_and_recomputes():
    """An fp16 round trip captured once: each replay is one host launch, allocates and
    waits for nothing, and gives the round trip of what the input holds at the replay."""
    codec = parse_codec("fp16")
    x, out = device(np.zeros(64)), device(np.zeros(64))
    payload = arrays.empty("double", 128, "uint8")

    def round_trip():
        codec.decode(codec.encode(x, out=payload), out)

    round_trip()  # eager warm-up: the range flag is allocated here
    graph = arrays.backend("double").graph()
    graph.capture(round_trip)
    eager = double.STATS.launches
    values = np.arange(64, dtype=np.float32) / 8  # exact in fp16
    x.set(values)
    before = double.STATS.snapshot()
    double.STATS.in_region = True
    for _ in range(5):
        graph.replay()
    double.STATS.in_region = False
    after = double.STATS.snapshot()
    assert after["timed_launches"] - before["timed_launches"] == 5
    assert after["timed_allocs"] == before["timed_allocs"] and after["timed"] == before["timed"]
    assert after["replays"] == 5
    assert eager >= 2  # the eager call launched its encode and its decode
    assert np.array_equal(arrays.to_numpy(out), values)
    codec.check_deferred()


def test_codec_throughput_graphed_rows_say_so_and_record_host_time():
    from ccbench.benchmarks.codec_throughput import measure_codec

    row = measure_codec(
        "bfp:rate=8", "gradient-like", "double", "float32", 1 << 12, 2, cuda_graph=4
    )
    assert row["cuda_graph"] == 4 and row["kernels"] == "device"
    assert row["host_us_per_call"] > 0 and row["encode_gbps"] > 0
    # 2 rounds of copy, encode, decode and hop, 4 replays each: the timed launches
    assert double.STATS.replays == 2 * 4 * 4 and double.STATS.timed_allocs == 0
    eager = measure_codec("fp16", "gradient-like", "numpy", "float32", 1 << 12, 1)
    assert eager["cuda_graph"] == 0 and eager["host_us_per_call"] is None  # on the host


def test_a_variable_size_codec_is_refused_for_its_host_read_lengths():
    from ccbench.benchmarks.graphs import codec_refusal

    why = codec_refusal(parse_codec("zstd"), "double", "float32")
    assert why.startswith("--codec zstd: a variable-size codec")
    assert codec_refusal(parse_codec("fp16"), "double", "float32") is None


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-d", "numpy", "--cuda-graph", "2"], "host buffers"),
        (["-d", "double", "--cuda-graph", "2", "--kernels", "reference"], "--kernels reference"),
    ],
)
def test_codec_throughput_refuses_what_it_cannot_capture(argv, message, capsys):
    from ccbench.benchmarks import codec_throughput

    status = codec_throughput.main([*argv, "--codec", "fp16", "-m", "4K", "--data", "exact"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and message in err[0], err


def test_compare_refuses_a_graphed_side():
    from types import SimpleNamespace

    from ccbench.benchmarks.paired import refuse_graph
    from ccbench.kernels.errors import UsageError

    refuse_graph("A", SimpleNamespace(cuda_graph=0))
    with pytest.raises(UsageError, match="B: --cuda-graph is a variant's own option"):
        refuse_graph("B", SimpleNamespace(cuda_graph=5))


# ---------------------------------------------------------------- every variant, graphed

CASES = [cid for cid, _, _ in graph_cases()]
REFUSALS = {
    "refused-mpi": "--transport mpi: MPI's calls run on the host",
    "refused-host": "-d numpy: host buffers",
    "refused-no-warmup": "at least one eager warm-up call",
    "refused-sparse": "--algorithm allgather-sparse: its block maps are read back on the host",
    "refused-staged": "CCBENCH_TORCH_STAGE=1: every buffer is staged through host memory",
    "refused-reference-kernels": "runs its reference kernels here",
}
SIZE_COUNT = len(SIZES.split(","))


@pytest.mark.mpi
@pytest.mark.timeout(400)
@pytest.mark.parametrize("case_id", CASES)
def test_every_capturable_variant_replays_one_launch_per_call_and_validates(case_id):
    got = case_results("tests.drivers.graph_cases", 2, timeout=360).get(case_id)
    assert got is not None and got["status"] == 0, got
    rows, counts = got["rows"], got["double"]
    assert len(rows) == SIZE_COUNT and {r["validation"] for r in rows} == {"Pass"}, rows
    assert {r["cuda_graph"] for r in rows} == {str(REPLAYS)}
    assert got["sidecar"] == [REPLAYS]  # the run's environment says so too
    assert {int(r["iterations"]) for r in rows} == {ITERATIONS * REPLAYS}  # calls timed
    assert {r["host_syncs"] for r in rows} == {"0.0"}
    for rank in counts:
        # the timed regions hold the replays alone: one host launch each
        assert rank["timed_launches"] == SIZE_COUNT * ITERATIONS * REPLAYS, rank
        assert (rank["timed_allocs"], rank["timed"]) == (0, 0), rank
        # and one more replay per size for the accuracy pass, one for -c
        assert rank["replays"] == SIZE_COUNT * (ITERATIONS * REPLAYS + 2), rank
    if case_id == "coll-ring-auto":  # graphed: no launch floor under the chunk
        assert {r["launch_us"] for r in rows} == {"0.0"}
    if "call_us" in rows[0]:  # replays run no Python: no breakdown of their time
        assert {r["call_us"] for r in rows} == {""}


@pytest.mark.mpi
@pytest.mark.timeout(400)
@pytest.mark.parametrize("case_id", [cid for cid, _, _ in REFUSED])
def test_what_graph_mode_cannot_capture_is_refused_in_one_line(case_id):
    got = case_results("tests.drivers.graph_cases", 2, timeout=360).get(case_id)
    assert got is not None and got["status"] == 2, got
    lines = got["stderr"].strip().splitlines()
    assert len(lines) == 1 and REFUSALS[case_id] in lines[0], lines
    assert got["rows"] == [] and all(c["replays"] == 0 for c in got["double"])


# ---------------------------------------------------------------- rows and figures


def test_graphed_rows_are_drawn_apart_from_eager_ones():
    from ccbench.plots.data import regime_of

    frame = pd.DataFrame({"link_gbps": [0.0, 1.0, 0.0, 1.0], "cuda_graph": ["0", "0", "20", "20"]})
    assert list(regime_of("harness", frame)) == ["shm", "links", "graphs", "graphs"]
    codec = pd.DataFrame({"cuda_graph": [0, 5]})
    assert list(regime_of("codec", codec)) == ["models", "graphs"]
    older = pd.DataFrame({"link_gbps": [1.0]})  # no graph column: eager rows
    assert list(regime_of("harness", older)) == ["links"]
