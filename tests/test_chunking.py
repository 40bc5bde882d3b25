"""Chunking: --chunk-bytes, the collective-level compressed ring's pipelined chunk.

One meaning everywhere (collectives/compression.py): uncompressed bytes per chunk; 0 one
chunk per ring block; auto chosen per size (coll_compressed only); not given, 1 MiB (auto
for coll_compressed's ring over NCCL). Expected chunk counts and sizes are worked by hand.
"""

from __future__ import annotations

import csv
import math
from types import SimpleNamespace

import pytest

from ccbench.benchmarks.options import compression_from, compression_of
from ccbench.kernels.errors import UsageError
from tests.mpirun import mpirun, variant_module

# launches MPI ranks (a coll_compressed run on 2 ranks): the Open MPI leg runs it too
pytestmark = pytest.mark.mpi

MIB = 1 << 20

# ------------------------------------------------------------------ elements per chunk


@pytest.mark.parametrize(
    ("codec", "chunk_bytes", "block_elements", "chunks"),
    [
        # fp16 takes any count: 64 KiB of float32 is 16384 values; a 1 MiB block
        # (262144 values) is 16 chunks
        ("fp16", 64 << 10, 262144, 16),
        # 100000 bytes: 25000 values; 262144 / 25000 = 10.49 -> 11 chunks, the last short
        ("fp16", 100000, 262144, 11),
        # 0: one chunk per block, whatever its length
        ("fp16", 0, 262144, 1),
        ("fp16", 0, 7, 1),
        # bfp encodes tiles of 8192 values: 64 KiB (16384 values) is 2 tiles; a chunk
        # below one tile is one tile, so a 20000-value block is 3 chunks of 8192 or fewer
        ("bfp:rate=8", 64 << 10, 262144, 16),
        ("bfp:rate=8", 4096, 20000, 3),
        # zfp's blocks of 4: 10 bytes -> 2 values -> rounded up to one block of 4
        ("zfp:rate=8", 10, 10, 3),
    ],
)
def test_a_block_is_cut_into_the_chunks_worked_by_hand(codec, chunk_bytes, block_elements, chunks):
    from ccbench.collectives.chunking import chunk_count_for, split_chunks

    parsed = compression_of(codec).codec
    per_chunk = chunk_count_for(parsed, "float32", chunk_bytes)
    pieces = split_chunks(0, block_elements, per_chunk)
    assert len(pieces) == chunks
    assert pieces[0][0] == 0 and pieces[-1][1] == block_elements  # covers the block
    assert all(b0 == a1 for (_, a1), (b0, _) in zip(pieces, pieces[1:], strict=False))


# ------------------------------------------------------------------ the option


def _training_options(*argv):
    from ccbench.benchmarks.training import build_parser

    return build_parser(quiet=True).parse_args(["--variant", "coll_compressed", *argv])


def _replay_options(*argv):
    from ccbench.benchmarks.trace_replay import build_parser

    return build_parser(quiet=True).parse_args(
        ["trace.json", "--variant", "coll_compressed", *argv]
    )


@pytest.mark.parametrize("options", [_training_options, _replay_options])
@pytest.mark.parametrize(
    ("given", "runs"),
    [([], MIB), (["--chunk-bytes", "0"], 0), (["--chunk-bytes", "64K"], 65536)],
)
def test_training_and_replay_read_chunk_bytes_as_the_ring_does(options, given, runs):
    opts = options("--codec", "fp16", *given)
    setting = compression_from(opts, variant="coll_compressed")
    assert setting.chunk() == runs
    assert setting.bind_options("coll") == {"chunk_bytes": runs}
    assert setting.bind_options("p2p") == {}  # the point-to-point ring does not pipeline


@pytest.mark.parametrize("options", [_training_options, _replay_options])
def test_chunk_bytes_auto_is_refused_where_nothing_measures_the_rates(options):
    opts = options("--codec", "fp16", "--chunk-bytes", "auto")
    with pytest.raises(UsageError, match="--chunk-bytes auto"):
        compression_from(opts, variant="coll_compressed")


@pytest.mark.parametrize("text", ["-1", "-4K", "1Q"])
def test_a_chunk_that_is_not_a_size_is_refused(text):
    with pytest.raises(UsageError):
        _training_options("--codec", "fp16", "--chunk-bytes", text)


def test_the_rings_default_chunk_over_nccl_is_auto():
    from ccbench.benchmarks.coll_compressed import auto_by_default
    from ccbench.collectives.compression import AUTO

    def chunk(algorithm, backend, given=None):
        opts = SimpleNamespace(algorithm=algorithm, backend=backend)
        return compression_of("fp16", chunk_bytes=given, auto=True).chunk(auto_by_default(opts))

    assert chunk("ring", "nccl") == AUTO
    assert chunk("ring", "gloo") == MIB
    assert chunk("ring", "mpi") == MIB
    assert chunk("library", "nccl") == MIB
    assert chunk("ring", "nccl", given=0) == 0  # given, it stands
    assert chunk("ring", "mpi", given=AUTO) == AUTO


# ------------------------------------------------------------------ training's binder


@pytest.mark.parametrize(
    ("variant", "chunk_bytes", "options"),
    [
        ("coll_compressed", None, {"chunk_bytes": MIB}),
        ("coll_compressed", 0, {"chunk_bytes": 0}),
        ("coll_compressed", 8192, {"chunk_bytes": 8192}),
        ("p2p_compressed", 8192, {}),
    ],
)
def test_the_gradient_communicator_binds_the_chunk_it_was_given(
    monkeypatch, variant, chunk_bytes, options
):
    torch = pytest.importorskip("torch")
    from mpi4py import MPI

    from ccbench.collectives import compressed
    from ccbench.collectives.comm import Communicator
    from ccbench.training.gradient_comm import GradientCommSpec, GradientCommunicator

    bound = []

    class Recorded:  # bind_compressed, recording what it was given
        def __init__(self, comm, kind, collective, codec, send, recv, **kwargs):
            bound.append((kind, collective, kwargs))
            self.recvbuf = recv

        def __call__(self):
            pass

    monkeypatch.setattr(compressed, "bind_compressed", Recorded)
    setting = compression_of("fp16", variant=variant, chunk_bytes=chunk_bytes)
    gradient_comm = GradientCommunicator(
        Communicator(MPI.COMM_SELF), GradientCommSpec(variant, "ring", setting)
    )
    gradient_comm.allreduce(torch.zeros(64))
    assert bound == [(variant.split("_")[0], "allreduce", options)]


# ------------------------------------------------------------------ auto's choice


def test_auto_chunk_bytes_by_hand():
    from ccbench.collectives.chunking import DEFAULT_CHUNK_BYTES, auto_chunk_bytes

    fp16 = compression_of("fp16").codec  # ratio 2: at 1 Gbit/s the link carries 2.5e8 B/s
    # B = 16 MiB allgather, 4 ranks, c = 1 GB/s, o = 1 ms per chunk and step, share 1:
    # W = 3 B / w = 201.33 ms; K = 3 B / c = 50.33 ms; C = 3 n ms; F = 33.55 / n ms;
    # T = max(W, K) + C + F: n = 2: 201.33 + 6 + 16.78 = 224.11; n = 4: 201.33 + 12 +
    # 8.39 = 221.72; n = 8: 201.33 + 24 + 4.19 = 229.52 ms -> 4 chunks of 4 MiB
    assert auto_chunk_bytes(fp16, "float32", 16 << 20, 4, 1.0, 1e9, 1e-3) == 4 << 20
    # a 1 MiB reduce-scatter on 4 ranks (B = 256 KiB), 2 ranks per core, c = 1 GB/s,
    # o = 100 us: B/w = 1.0486 ms, B/c = 0.2621 ms, W = 3.146 ms,
    # K = 2 x 3 x 0.2621 = 1.573 ms, C = 0.3 n ms, F = 0.524 / n ms,
    # G = 2 max(0, 1.3107 / n - 1.0486) ms:
    # n = 1: 3.146 + 0.3 + 0.524 + 0.524 = 4.494; n = 2: 3.146 + 0.6 + 0.262 + 0 = 4.008;
    # n = 4: 3.146 + 1.2 + 0.131 = 4.477 ms -> two chunks of 128 KiB per step
    rs = ("reduce_scatter", 2.0)
    assert auto_chunk_bytes(fp16, "float32", 256 << 10, 4, 1.0, 1e9, 1e-4, *rs) == 128 << 10
    # three times the chunk cost (300 us): C = 0.9 n ms; n = 1: 3.146 + 0.9 + 1.048 =
    # 5.094; n = 2: 3.146 + 1.8 + 0.262 = 5.208 ms -> one chunk per step, the block
    assert auto_chunk_bytes(fp16, "float32", 256 << 10, 4, 1.0, 1e9, 3e-4, *rs) == 256 << 10
    # a 16 KiB block: the 64 KiB least chunk, one chunk
    assert auto_chunk_bytes(fp16, "float32", 16 << 10, 4, 1.0, 1e9, 4e-3) == 64 << 10
    # 2 ranks over a transport with a costly chunk (2 ms, NCCL's socket transport), a
    # device codec at 200 GB/s, 10 Gbit/s: W = 6.711 ms, K = 0.084 ms, C = 2 n ms,
    # F = 0.168 / n ms; n = 1: 6.711 + 2 + 0.168 = 8.879; n = 2: 6.711 + 4 + 0.084 =
    # 10.795 ms -> one chunk of 16 MiB
    assert auto_chunk_bytes(fp16, "float32", 16 << 20, 2, 10.0, 2e11, 2e-3) == 16 << 20
    # no rate of the link (one rank) keeps the default
    assert auto_chunk_bytes(fp16, "float32", 16 << 20, 4, None, 1e9, 4e-3) == DEFAULT_CHUNK_BYTES


def test_auto_never_picks_a_chunk_whose_launches_cost_over_5_percent_of_its_wire():
    """By hand: fp16 halves the bytes; at 100 Gbit/s (12.5e9 B/s) two launches of 40 us
    are 5% of 1.6 ms of wire, 20e6 B of payload: 40e6 B of data. Graphed (no host cost)
    the same block is cut as before."""
    from ccbench.collectives.chunking import auto_chunk_bytes, launch_floor_bytes

    assert launch_floor_bytes(40e-6, 2.0, 12.5e9) == 40_000_000
    assert launch_floor_bytes(0.0, 2.0, 12.5e9) == 0
    codec = compression_of("fp16").codec
    block = 256 << 20
    args = (codec, "float32", block, 4, 100.0, 20e9, 20e-6, "allgather")
    eager = auto_chunk_bytes(*args, launch_s=40e-6)
    assert eager >= 40_000_000
    assert 2 * 40e-6 <= 0.05 * (eager / 2 / 12.5e9) * (1 + 1e-12)
    graphed = auto_chunk_bytes(*args, launch_s=0.0)
    assert graphed == auto_chunk_bytes(*args) and graphed < eager
    # a block below the floor travels whole
    small = auto_chunk_bytes(codec, "float32", 4 << 20, 4, 100.0, 20e9, 20e-6, launch_s=40e-6)
    assert small >= 4 << 20
    assert math.ceil((4 << 20) / small) == 1


# ------------------------------------------------------------------ a run's rows


@pytest.mark.timeout(120)
def test_coll_compressed_rows_record_the_chunk_setting_and_the_chunk_run(tmp_path):
    """2 ranks, fp16 allgather: 0 is recorded as 0 and runs one chunk per block (the
    rows validate); not given, the row says 1048576."""
    rows = {}
    for name, given in (("zero", ["--chunk-bytes", "0"]), ("default", [])):
        out = tmp_path / f"{name}.csv"
        argv = ["--codec", "fp16", "--data", "gradient-like", "-m", "4K:8K", "-i", "2", "-x", "1"]
        argv += ["-c", *given]
        proc = mpirun(2, [*variant_module("coll_compressed"), *argv, "--csv", str(out)])
        assert proc.returncode == 0, proc.stderr[-2000:]
        rows[name] = list(csv.DictReader(out.open()))
    assert [r["chunk_bytes"] for r in rows["zero"]] == ["0", "0"]
    assert [r["chunk_used_bytes"] for r in rows["zero"]] == ["0", "0"]
    assert [r["chunk_bytes"] for r in rows["default"]] == [str(MIB)] * 2
    assert all(r["validation"] == "Pass" for r in rows["zero"] + rows["default"])
