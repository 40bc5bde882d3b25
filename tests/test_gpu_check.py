"""scripts/gpu-check.sh, the GPU acceptance run: on this machine (no GPU) it runs to the
end in seconds and says, per cell, why it skipped; its choices on GPU machines are
checked on described machines."""

from __future__ import annotations

import csv
import os
import subprocess

import pytest

from ccbench.scripts import gpu_check
from ccbench.scripts.gpu_check import Machine, cells, skip_reason
from tests.mpirun import REPO

pytestmark = pytest.mark.mpi  # a cell that runs launches ranks (mpiexec_command)


def without_gpus() -> dict:
    """This environment with no NVIDIA driver in sight (whatever the host has)."""
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if not (p and os.path.exists(os.path.join(p, "nvidia-smi"))))
    return {**os.environ, "PATH": path}


@pytest.mark.timeout(120)
def test_without_a_gpu_every_cell_is_skipped_with_its_reason(tmp_path):
    proc = subprocess.run([str(REPO / "scripts" / "gpu-check.sh"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=110, env=without_gpus(),
                          cwd=REPO, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nothing to install" in proc.stdout
    rows = list(csv.DictReader((tmp_path / "report.csv").open()))
    kinds = {r["kind"] for r in rows}
    assert kinds == {"collective", "codec", "training"}
    assert {r["status"] for r in rows} == {"skip"}
    assert all(r["reason"].startswith("no CUDA device") for r in rows), rows[0]
    # every variant, both device buffers, the three ways the bytes move
    cells_run = {(r["command"].split()[0], r["buffer"], r["transport"]) for r in rows}
    for variant in ("baseline", "p2p_compressed", "coll_compressed", "sparse_streaming"):
        for buffer in ("cupy", "torch-cuda"):
            for transport in ("mpi-staged", "mpi-gpu-aware", "nccl"):
                assert (variant, buffer, transport) in cells_run
    assert all(" -c" in r["command"] for r in rows if r["kind"] == "collective")
    report = (tmp_path / "report.md").read_text()
    assert report.count("| skip |") == len(rows)


def machine(**facts) -> Machine:
    m = Machine(gpus=4)
    for k, v in facts.items():
        setattr(m, k, v)
    return m


def reasons(m: Machine, ranks: int = 4) -> dict:
    return {c.name: skip_reason(c, m) for c in cells(ranks)}


def test_on_a_full_gpu_node_every_cell_runs():
    assert set(reasons(machine()).values()) == {""}


def test_one_gpu_runs_only_the_codec_cells():
    got = reasons(machine(gpus=1))
    ran = sorted(name for name, why in got.items() if not why)
    assert ran == ["codec_throughput / cupy", "codec_throughput / torch-cuda"]
    assert all("a device per rank" in why for why in got.values() if why)


def test_each_missing_piece_skips_only_what_needs_it():
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


def test_report_lines_of_a_cell_that_ran(tmp_path):
    """A cell's report line reads its CSV: busbw of the largest size, the failures."""
    folder = tmp_path / "runs"
    folder.mkdir()
    cell = gpu_check.Cell("baseline allreduce / numpy / mpi", "collective",
                          ["baseline", "--collective", "allreduce", "-m", "1K:4K", "-i", "2",
                           "-x", "1", "-c", "--data", "gradient-like"], "numpy", "mpi", 2)
    (line,) = gpu_check.run_cell(cell, folder)
    assert line["status"] == "pass", line
    assert line["size_bytes"] == "4096" and float(line["busbw_gbps"]) > 0
    text = gpu_check.markdown([line], machine())
    assert "| baseline allreduce / numpy / mpi | pass |" in text


def test_a_failing_cell_is_named_and_the_run_exits_1(tmp_path, monkeypatch, capsys):
    bad = gpu_check.Cell("baseline / numpy / mpi", "collective",
                         ["baseline", "--collective", "allreduce", "-m", "1K:1K", "-T",
                          "bogus"], "numpy", "mpi", 2)
    monkeypatch.setattr(gpu_check, "survey", lambda: machine())
    monkeypatch.setattr(gpu_check, "cells", lambda ranks: [bad])
    assert gpu_check.main(["--out", str(tmp_path)]) == 1
    (row,) = csv.DictReader((tmp_path / "report.csv").open())
    assert row["status"] == "fail" and "invalid choice: 'bogus'" in row["reason"]
    assert "fail  baseline / numpy / mpi" in capsys.readouterr().out
