"""scripts/gpu-check.sh, the GPU acceptance run: on this machine (no GPU) it runs to the
end in seconds and says, per cell and per goal, why it skipped; its choices on GPU
machines are checked on described machines, and its goals on constructed CSVs."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ccbench.scripts.gpu import check as gpu_check
from ccbench.scripts.gpu import plan as gpu_plan
from ccbench.scripts.gpu.goals import goal_rows
from ccbench.scripts.gpu.plan import Cell, cells, skip_reason
from ccbench.scripts.gpu.survey import Machine
from tests.mpirun import REPO

pytestmark = pytest.mark.mpi  # a cell that runs launches ranks (mpiexec_command)


def without_gpus() -> dict:
    """This environment with no NVIDIA driver in sight (whatever the host has), and this
    Python's folder (its MPI wheel's mpiexec) first on PATH."""
    path = [
        p
        for p in os.environ.get("PATH", "").split(os.pathsep)
        if not (p and os.path.exists(os.path.join(p, "nvidia-smi")))
    ]
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), *path]),
        "PYTHON": sys.executable,
    }
    env.pop("CCBENCH_MPIEXEC", None)
    return env


@pytest.mark.timeout(120)
def test_without_a_gpu_every_cell_is_skipped_with_its_reason(tmp_path):
    proc = subprocess.run(
        [str(REPO / "scripts" / "gpu-check.sh"), "--no-install", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=110,
        env=without_gpus(),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # what it uses, said first: the mpiexec of the environment (PATH), its MPI, torch
    mpiexec = Path(sys.executable).parent / "mpiexec"
    assert f"# mpiexec: {mpiexec}\n" in proc.stdout
    assert "# MPI library (mpi4py " in proc.stdout and "# torch: " in proc.stdout
    assert "nothing to install" not in proc.stdout
    rows = list(csv.DictReader((tmp_path / "report.csv").open()))
    kinds = {r["kind"] for r in rows}
    assert kinds == {"collective", "codec", "training", "tests", "staging", "compare", "goal"}
    assert {r["status"] for r in rows} == {"skip"}
    assert all(r["reason"].startswith("no CUDA device") for r in rows), rows[0]
    # every variant, both device buffers, the three ways the bytes move
    cells_run = {
        (r["command"].split()[0], r["buffer"], r["transport"]) for r in rows if r["kind"] != "goal"
    }
    for variant in ("baseline", "p2p_compressed", "coll_compressed", "sparse_streaming"):
        for buffer in ("cupy", "torch-cuda"):
            for transport in ("mpi-staged", "mpi-gpu-aware", "nccl"):
                assert (variant, buffer, transport) in cells_run
    assert all(" -c" in r["command"] for r in rows if r["kind"] == "collective")
    goals = {(r["cell"], r["figure"], r["goal"]) for r in rows if r["kind"] == "goal"}
    # per buffer and codec: encode, decode, hop eager and graphed, the host time; then
    # staging, NCCL's allgather eager and graphed, the graphed pipeline
    assert len(goals) == 2 * 3 * (3 + 3 + 1) + 4
    assert ("codec bfp:rate=8 hop / cupy", "hop_vs_copy", ">= 0.5") in goals
    assert ("codec fp16 encode / torch-cuda / graphed", "encode_vs_copy", ">= 0.8") in goals
    assert ("codec bf16 host time / cupy", "host_us_per_call", "<= 8") in goals
    figures = {figure: goal for _, figure, goal in goals}
    assert figures["graphed_speedup_vs_nccl"] == ">= 1.5"
    assert figures["chunks_vs_whole"] == "<= 1.2"
    # graph mode's cells: eager and graphed, NCCL's own and the compressed collectives
    graphed = [r["command"] for r in rows if "--cuda-graph 20" in r["command"]]
    assert len(graphed) == 2 + 2 * 3 + 2  # codecs, comparisons, the pipeline's two
    assert sum("reduce_scatter" in c for c in graphed) == 3
    report = (tmp_path / "report.md").read_text()
    assert report.count("| skip |") == len(rows)


def machine(**facts) -> Machine:
    m = Machine(gpus=4)
    for k, v in facts.items():
        setattr(m, k, v)
    return m


def reasons(m: Machine, ranks: int = 4) -> dict:
    return {c.name: skip_reason(c, m) for c in cells(ranks, m.gpus)}


def test_on_a_full_gpu_node_every_cell_runs_unshared(monkeypatch):
    monkeypatch.setattr(gpu_plan, "STAGING_MODULE", "ccbench.benchmarks.baseline")
    assert set(reasons(machine()).values()) == {""}
    assert not any(c.sharing or c.per_rank_hostid for c in cells(4, 4))


def test_one_gpu_shares_it_between_two_ranks(monkeypatch):
    monkeypatch.setattr(gpu_plan, "STAGING_MODULE", "ccbench.benchmarks.baseline")
    m = machine(gpus=1, no_gpu_aware="no CUDA support")
    got = reasons(m, ranks=2)
    assert {name for name, why in got.items() if why} == {
        name for name in got if name.endswith("/ mpi-gpu-aware")
    }
    plan = {c.name: c for c in cells(2, 1)}
    staged = plan["coll_compressed --codec fp16 allreduce / torch-cuda / mpi-staged"]
    assert staged.ranks == 2 and staged.sharing == "2 ranks share 1 GPU"
    assert not staged.per_rank_hostid and "NCCL_SOCKET_IFNAME" not in staged.env
    nccl = plan["baseline --algorithm library allgather / cupy / nccl"]
    assert nccl.per_rank_hostid and "functional only" in nccl.sharing
    assert nccl.env["NCCL_SOCKET_IFNAME"] == "lo" and nccl.env["NCCL_P2P_DISABLE"] == "1"
    assert plan["codec_throughput / cupy"].sharing == ""


def test_each_rank_gets_its_own_nccl_host_id(tmp_path):
    """The per-rank wrapper under the real launcher: one NCCL_HOSTID per rank."""
    (nccl,) = [c for c in cells(2, 1) if c.per_rank_hostid][:1]
    command = gpu_check.command_of(nccl, tmp_path / "x.csv")
    python = command.index(sys.executable)
    probe = [*command[:python], sys.executable, "-c", "import os; print(os.environ['NCCL_HOSTID'])"]
    out = subprocess.run(
        probe, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    # the launcher forwards the ranks' output in pieces that may interleave
    assert sorted(re.findall(r"ccb-r\d+", out.stdout)) == ["ccb-r0", "ccb-r1"], (
        out.stdout + out.stderr
    )


def test_each_missing_piece_skips_only_what_needs_it(monkeypatch):
    monkeypatch.setattr(gpu_plan, "STAGING_MODULE", "ccbench.benchmarks.baseline")
    got = reasons(machine(no_cupy="cupy is not installed"))
    assert all(bool(why) == ("/ cupy" in name) for name, why in got.items())
    got = reasons(machine(no_gpu_aware="no CUDA support"))
    assert all(bool(why) == name.endswith("mpi-gpu-aware") for name, why in got.items())
    got = reasons(machine(no_nccl="torch has no NCCL"))
    assert all(bool(why) == name.endswith("/ nccl") for name, why in got.items())
    # a CPU build of torch: torch-cuda buffers and NCCL (torch.distributed's) cannot run,
    # cupy over MPI can
    got = reasons(machine(no_torch="a CPU build"))
    assert got["baseline --algorithm mpi allreduce / cupy / mpi-staged"] == ""
    assert got["baseline --algorithm library allreduce / cupy / nccl"] == "a CPU build"
    assert got["codec_throughput / torch-cuda"] == "a CPU build"
    # no MPI: the one-process codec cells alone (the device tests launch ranks too)
    got = reasons(machine(no_mpi="mpiexec not found"))
    assert sorted(name for name, why in got.items() if not why) == [
        "codec_throughput / cupy",
        "codec_throughput / torch-cuda",
        "codec_throughput graphed / cupy",
        "codec_throughput graphed / torch-cuda",
    ]
    # a tree without the staging benchmark (before its merge): that cell alone
    monkeypatch.setattr(gpu_plan, "STAGING_MODULE", "ccbench.benchmarks.no_such_module")
    got = reasons(machine())
    assert {name: why for name, why in got.items() if why} == {
        "staging_bound 16M / cupy / mpi-staged": "skipped: benchmarks.staging_bound not available"
    }


def test_report_lines_of_a_cell_that_ran(tmp_path):
    """A cell's report line reads its CSV: busbw of the largest size, the failures."""
    folder = tmp_path / "runs"
    folder.mkdir()
    cell = Cell(
        "baseline allreduce / numpy / mpi",
        "collective",
        [
            "baseline",
            "--collective",
            "allreduce",
            "-m",
            "1K:4K",
            "-i",
            "2",
            "-x",
            "1",
            "-c",
            "--data",
            "gradient-like",
        ],
        "numpy",
        "mpi",
        2,
    )
    (line,) = gpu_check.run_cell(cell, folder)
    assert line["status"] == "pass", line
    assert line["size_bytes"] == "4096" and float(line["busbw_gbps"]) > 0
    text = gpu_check.markdown([line], machine())
    assert "| baseline allreduce / numpy / mpi | pass |" in text


def test_a_failing_cell_is_named_and_the_run_exits_1(tmp_path, monkeypatch, capsys):
    bad = Cell(
        "baseline / numpy / mpi",
        "collective",
        ["baseline", "--collective", "allreduce", "-m", "1K:1K", "-T", "bogus"],
        "numpy",
        "mpi",
        2,
    )
    monkeypatch.setattr(gpu_check, "survey", lambda: machine())
    monkeypatch.setattr(gpu_check, "cells", lambda ranks, gpus: [bad])
    assert gpu_check.main(["--out", str(tmp_path)]) == 1
    row = next(csv.DictReader((tmp_path / "report.csv").open()))
    assert row["status"] == "fail" and "invalid choice: 'bogus'" in row["reason"]
    assert "fail  baseline / numpy / mpi" in capsys.readouterr().out


# ------------------------------------------------------------------ the goals


def codec_row(codec, encode, decode, hop, copy=400.0, size=64 << 20, host_us=5.0):
    return {
        "codec": codec,
        "kernels": "device",
        "size_bytes": str(size),
        "host_us_per_call": host_us,
        "encode_gbps": encode * copy,
        "decode_gbps": decode * copy,
        "hop_gbps": hop * copy,
        "copy_gbps": copy,
        "encode_vs_copy": encode,
        "decode_vs_copy": decode,
        "hop_vs_copy": hop,
    }


def staging_row(ratio, size=16 << 20, ranks=2):
    bound = 1000.0
    return {
        "buffer": "cupy",
        "size_bytes": size,
        "ranks": ranks,
        "d2h_pinned_us": 300,
        "host_allgather_us": 400,
        "h2d_pinned_us": 300,
        "bound_us": bound,
        "staged_us": ratio * bound,
        "staged_vs_bound": ratio,
    }


def timing_row(avg_us, size=16 << 20):
    return {
        "size_bytes": size,
        "avg_us": avg_us,
        "algbw_gbps": 1.0,
        "busbw_gbps": 0.5,
        "validation": "",
    }


class FakeLaunches:
    """subprocess.run for gpu_check: each performance cell's CSV written as given (the
    correctness cells pass), so the run's parsing, goals, report and exit are real."""

    def __init__(
        self, codec, staging, nccl_us, compressed_us, graphed=None, chunks=1.1, graphed_nccl=1510.0
    ):
        self.codec, self.staging = codec, staging
        self.nccl_us, self.compressed_us = nccl_us, compressed_us
        # graphed: the codecs at 1 MiB; NCCL's graphed allgather and the compressed one
        # as eager; the pipeline in 1 MiB chunks `chunks` times one chunk per block
        self.graphed = graphed or [{**r, "size_bytes": str(1 << 20)} for r in GOOD_CODECS]
        self.chunks, self.graphed_nccl = chunks, graphed_nccl

    def __call__(self, command, **kwargs):
        text = " ".join(command)
        if command[:3] == [sys.executable, "-m", "pytest"]:
            return subprocess.CompletedProcess(command, 0, "3 passed in 1.0s\n", "")
        path = Path(command[command.index("--csv") + 1])
        graphed = "--cuda-graph" in text
        if "codec_throughput" in text:
            rows = self.graphed if graphed else self.codec
        elif "--chunk-bytes 1M" in text:
            rows = [timing_row(1000.0 * self.chunks)]
        elif "--chunk-bytes 0" in text:
            rows = [timing_row(1000.0)]
        elif graphed and "allgather" in text:
            rows = [timing_row(1000.0 if "coll_compressed" in text else self.graphed_nccl)]
        elif "staging_bound" in text:
            rows = self.staging
        elif "16M:16M" in text:
            rows = [timing_row(self.compressed_us if "coll_compressed" in text else self.nccl_us)]
        else:
            rows = [{**timing_row(10.0), "validation": "Pass"}]
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        return subprocess.CompletedProcess(command, 0, "", "")


def goals_of(tmp_path, monkeypatch, fake) -> tuple[int, dict]:
    monkeypatch.setattr(gpu_plan, "STAGING_MODULE", "ccbench.benchmarks.baseline")
    monkeypatch.setattr(
        gpu_check, "survey", lambda: machine(gpus=1, no_gpu_aware="no CUDA support")
    )
    monkeypatch.setattr(gpu_check.subprocess, "run", fake)
    status = gpu_check.main(["--out", str(tmp_path), "--jobs", "2"])
    rows = list(csv.DictReader((tmp_path / "report.csv").open()))
    return status, {(r["cell"], r["figure"]): r for r in rows if r["kind"] == "goal"}


GOOD_CODECS = [
    codec_row("fp16", 0.95, 0.9, 0.6),
    codec_row("bf16", 0.8, 0.8, 0.5),
    codec_row("bfp:rate=8", 0.85, 0.82, 0.55),
]


def test_goals_met_are_reported_beside_their_bounds(tmp_path, monkeypatch):
    fake = FakeLaunches(
        GOOD_CODECS,
        [staging_row(1.1, 8 << 20), staging_row(1.3)],
        nccl_us=1500.0,
        compressed_us=1000.0,
    )
    status, goals = goals_of(tmp_path, monkeypatch, fake)
    assert status == 0
    assert {r["status"] for r in goals.values()} == {"pass"}
    fp16 = goals[("codec fp16 encode / cupy", "encode_vs_copy")]
    assert fp16["measured"] == "0.950" and fp16["bound"] == "device copy 400.0 GB/s"
    assert fp16["goal"] == ">= 0.8" and "380.0 GB/s" in fp16["reason"]
    staging = goals[("staging / cupy / 16 MiB on 2 ranks", "staged_vs_bound")]
    assert staging["measured"] == "1.300" and staging["goal"] == "<= 1.3"  # the 16 MiB row
    assert "300 + host allgather 400 + h2d 300 = 1000 us" in staging["bound"]
    (nccl,) = [r for (name, fig), r in goals.items() if fig == "speedup_vs_nccl"]
    assert nccl["measured"] == "1.500" and nccl["bound"] == "NCCL's allgather 1500 us"
    report = (tmp_path / "report.md").read_text()
    assert (
        "| codec fp16 encode / cupy | encode_vs_copy | 0.950 | device copy 400.0 GB/s "
        "| >= 0.8 | pass |" in report
    )


MISSES = ["encode", "decode", "hop", "staging", "nccl", "host", "graphed", "graphed-nccl"]


@pytest.mark.parametrize("miss", [*MISSES, "chunks"])
def test_each_goal_missed_fails_alone(tmp_path, monkeypatch, miss):
    codecs = [dict(r) for r in GOOD_CODECS]
    graphed = [{**r, "size_bytes": str(1 << 20)} for r in GOOD_CODECS]
    figure = {
        "encode": "encode_vs_copy",
        "decode": "decode_vs_copy",
        "hop": "hop_vs_copy",
        "staging": "staged_vs_bound",
        "nccl": "speedup_vs_nccl",
        "host": "host_us_per_call",
        "graphed": "encode_vs_copy",
        "graphed-nccl": "graphed_speedup_vs_nccl",
        "chunks": "chunks_vs_whole",
    }[miss]
    if miss in ("encode", "decode"):
        codecs[1] = codec_row(
            "bf16", *(0.79 if p == miss else 0.8 for p in ("encode", "decode")), 0.5
        )
    elif miss == "hop":
        codecs[1] = codec_row("bf16", 0.8, 0.8, 0.49)
    elif miss == "host":
        codecs[1] = codec_row("bf16", 0.8, 0.8, 0.5, host_us=8.1)
    elif miss == "graphed":  # met eagerly at 64 MiB, missed replayed at 1 MiB
        graphed[1] = codec_row("bf16", 0.79, 0.8, 0.5, size=1 << 20)
    fake = FakeLaunches(
        codecs,
        [staging_row(1.31 if miss == "staging" else 1.29)],
        nccl_us=1490.0 if miss == "nccl" else 1510.0,
        compressed_us=1000.0,
        graphed=graphed,
        chunks=1.21 if miss == "chunks" else 1.19,
        graphed_nccl=1490.0 if miss == "graphed-nccl" else 1510.0,
    )
    status, goals = goals_of(tmp_path, monkeypatch, fake)
    assert status == 1
    failed = [key for key, r in goals.items() if r["status"] == "fail"]
    per_buffer = ("encode", "decode", "hop", "host", "graphed")
    assert len(failed) == (2 if miss in per_buffer else 1), failed  # both buffers
    assert {fig for _, fig in failed} == {figure}
    if miss == "graphed":
        assert {cell for cell, _ in failed} == {
            "codec bf16 encode / cupy / graphed",
            "codec bf16 encode / torch-cuda / graphed",
        }


def test_a_goal_without_its_row_or_its_cell_is_not_met(tmp_path, monkeypatch):
    # staging measured at 8 MiB only; the compressed cell's CSV without the 16 MiB row
    fake = FakeLaunches(
        GOOD_CODECS, [staging_row(1.0, 8 << 20)], nccl_us=1500.0, compressed_us=1000.0
    )
    fake.staging[0]["size_bytes"] = 8 << 20
    status, goals = goals_of(tmp_path, monkeypatch, fake)
    assert status == 1
    staging = goals[("staging / cupy / 16 MiB on 2 ranks", "staged_vs_bound")]
    assert staging["status"] == "fail" and "no row at 16 MiB on 2 ranks" in staging["reason"]


def test_goals_of_skipped_cells_are_skipped_with_the_reason():
    skipped = {name: "cupy is not installed" for name in ("codec_throughput / cupy",)}
    skipped["staging_bound 16M / cupy / mpi-staged"] = (
        "skipped: benchmarks.staging_bound not available"
    )
    skipped["baseline library allgather 16M / torch-cuda / nccl"] = "torch has no NCCL"
    results = {
        "codec_throughput / torch-cuda": [{"status": "pass", "rows": [r]} for r in GOOD_CODECS]
    }
    goals = goal_rows(results, skipped)
    by = {(r["cell"], r["figure"]): r for r in goals}
    assert by[("codec fp16 hop / cupy", "hop_vs_copy")]["status"] == "skip"
    assert by[("codec fp16 hop / torch-cuda", "hop_vs_copy")]["status"] == "pass"
    staging = by[("staging / cupy / 16 MiB on 2 ranks", "staged_vs_bound")]
    assert staging["status"] == "skip" and "not available" in staging["reason"]
    (nccl,) = [r for r in goals if r["figure"] == "speedup_vs_nccl"]
    assert nccl["status"] == "skip" and nccl["reason"] == "torch has no NCCL"


def test_the_staging_goal_reads_the_newest_row_at_its_size():
    """A rerun appends: of two rows at 16 MiB on 2 ranks, the later one (file order) is
    the goal's; rows at another size or rank count are not."""
    from ccbench.scripts.gpu.goals import staging_goal

    rows = [
        staging_row(2.0),
        staging_row(0.5, size=8 << 20),
        staging_row(1.1),
        staging_row(3.0, ranks=4),
    ]
    goal = staging_goal(rows, "staging")
    assert goal["measured"] == "1.100" and goal["status"] == "pass"
    assert staging_goal(rows[:1], "staging")["status"] == "fail"  # 2.0 > 1.3: the old row alone
