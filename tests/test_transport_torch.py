"""The torch transport (torch.distributed, gloo here) under every variant, on 2 and 4 ranks,
and what it shares with MPI: one line and the right status for bad input, a dead rank
ending the job, a torchrun launch without MPI.

The matrix runs in one mpiexec launch per rank count (tests/drivers/transport_cases.py).
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest

from tests.drivers.transport_cases import torch_cases
from tests.mpirun import REPO, case_results, mpirun, variant_module

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too

pytest.importorskip("torch")
pytest.importorskip("zstandard")

CASES = [cid for cid, _, _ in torch_cases("profile.csv")]


def results(nranks: int) -> dict:
    return case_results("tests.drivers.transport_cases", nranks, timeout=600)


@pytest.mark.timeout(660)
# 4 ranks add blocks of uneven sizes to the torch transport, the same under either MPI
@pytest.mark.parametrize("nranks", [2, pytest.param(4, marks=pytest.mark.one_mpi)])
@pytest.mark.parametrize("case_id", CASES)
def test_every_variant_validates_over_torch_gloo(nranks, case_id):
    got = results(nranks).get(case_id)
    assert got is not None, f"{case_id} did not report"
    assert got["status"] == 0, got
    rows = got["rows"]
    assert rows, got
    if got["entry"] == "training":  # no -c: it trains; its rows say what carried it
        assert {r["transport"] for r in rows} == {"torch"}
        assert {r["backend"] for r in rows} == {"gloo"}
        return
    assert {r["validation"] for r in rows} == {"Pass"}, rows
    if got["entry"] == "merged_gradient":
        assert all(r["transport"].startswith("torch") for r in rows)
        return
    over_mpi = case_id.startswith("mpi-")
    for r in rows:
        assert (r["transport"], r["backend"]) == (("mpi", "mpi") if over_mpi else ("torch", "gloo"))
        assert r["device"] == ",".join(["cpu"] * nranks)  # every rank's device, in order
        assert r["host_syncs"] == ""  # host buffers: nothing to wait for
        if "coll-library-" in case_id:  # the default over torch, named over MPI
            assert r["algorithm"] == "library"
            # the bytes counted by the library calls: fp16 and bf16 send half the float32
            # data (blocks differing by one element pad the allgather by 2 bytes)
            if ("-fp16-" in case_id or "-bf16-" in case_id) and "bfloat16" not in case_id:
                assert float(r["compression_ratio"]) == pytest.approx(2.0, rel=0.01)
        elif case_id.startswith("coll-"):
            assert r["algorithm"] == "ring"


# ---------------------------------------------------------------- as MPI does


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "args, words",
    [
        (["--transport", "torch", "--backend", "nccl"], "nccl moves device buffers only"),
        (["--backend", "gloo"], "--backend applies to --transport torch"),
        (["--transport", "torch", "--algorithm", "mpi"], "--algorithm library"),
        (["--transport", "torch", "-d", "torch-cuda"], "no CUDA device"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, words):
    proc = mpirun(2, [*variant_module("baseline"), "-m", "4K:4K", "-i", "2", *args])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], lines


@pytest.mark.timeout(120)
def test_omnireduce_over_torch_is_refused_in_one_line():
    proc = mpirun(
        2, [*variant_module("sparse_streaming"), "--transport", "torch", "-m", "64K:64K", "-i", "2"]
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--transport mpi" in lines[0], lines


@pytest.mark.timeout(90)
@pytest.mark.parametrize("fault", ["die", "raise"])
def test_a_failing_rank_ends_the_job_over_torch(fault):
    """Rank 1 fails in the middle of the timed loop, its peer waiting in gloo: the job
    ends (the timeout would tell a hang)."""
    proc = mpirun(
        2,
        [
            "-m",
            "tests.drivers.faulty_variants",
            fault,
            "-m",
            "4:4",
            "-i",
            "50",
            "--transport",
            "torch",
        ],
        timeout=80,
    )
    if fault == "raise":
        assert proc.returncode == 1, proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert lines == ["ccbench: error: rank 1: RuntimeError: injected failure"], lines
    else:
        assert proc.returncode not in (0, 1, 2, 3), proc.stderr
        assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------- torchrun, no MPI


def torchrun(args: list[str], port: int, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for name in ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_FD"):
        env.pop(name, None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(port),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.timeout(200)
def test_torchrun_runs_the_torch_transport_without_mpi(tmp_path):
    out = tmp_path / "b.csv"
    proc = torchrun(
        [
            "-m",
            "ccbench.benchmarks.coll_compressed",
            "--transport",
            "torch",
            "--codec",
            "fp16",
            "--collective",
            "allreduce",
            "-m",
            "4K,16388",
            "-i",
            "2",
            "-x",
            "1",
            "-c",
            "--csv",
            str(out),
        ],
        29561,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = list(csv.DictReader(out.open()))
    assert {r["validation"] for r in rows} == {"Pass"} and len(rows) == 2
    assert {(r["transport"], r["backend"], r["device"]) for r in rows} == {
        ("torch", "gloo", "cpu,cpu")
    }
    assert {r["mpi_library"] for r in rows} == {""}  # MPI was never started
    import json

    (run,) = json.loads(out.with_name("b.csv.json").read_text())["runs"].values()
    assert run["transport_info"]["transport"] == "torch"
    assert run["transport_info"]["backend"] == "gloo"
    assert run["transport_info"]["launch"] == "torchrun/srun"
    assert run["versions"]["torch"] and run["mpi_library_full"] == ""
    assert [run["devices"][r]["device"] for r in ("0", "1")] == ["cpu", "cpu"]
    assert [run["devices"][r]["local_rank"] for r in ("0", "1")] == [0, 1]


def test_the_launch_is_told_from_the_environment():
    from ccbench.collectives.launch import EnvLaunch, env_launch

    torchrun = {
        "RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "n0",
        "MASTER_PORT": "29400",
    }
    assert env_launch(torchrun) == EnvLaunch("torchrun", 3, 8, 1, "n0", 29400)
    srun = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "MASTER_ADDR": "n1"}
    assert env_launch(srun) == EnvLaunch("srun", 5, 8, 1, "n1", 29500)
    # an MPI launcher's variables: MPI starts, and gives rank, size and rendezvous
    assert env_launch({**srun, "PMI_RANK": "5"}) is None
    assert env_launch({**torchrun, "OMPI_COMM_WORLD_RANK": "3"}) is None
    assert env_launch({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}) is None  # no rendezvous


@pytest.mark.timeout(200)
def test_torchrun_refuses_the_mpi_transport_in_one_line():
    proc = torchrun(["-m", "ccbench.benchmarks.baseline", "-m", "4K:4K"], 29562)
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if line.startswith("ccbench:")]
    assert ours == [
        "ccbench: error: --transport mpi needs an MPI launch (mpiexec, or srun "
        "with MPI); under torchrun add --transport torch"
    ], proc.stderr


@pytest.mark.timeout(120)
def test_a_paired_launch_puts_mpi_beside_torch(tmp_path):
    """`ccbench compare "baseline" "baseline --transport torch"`: one launch, a transport
    per side, both validated."""
    import json

    out = tmp_path / "pairs.json"
    proc = mpirun(
        2,
        [
            *variant_module("paired"),
            "--turns",
            "2",
            "--a",
            "baseline",
            "--b",
            "baseline --transport torch",
            "--json",
            out,
            "--",
            "--collective",
            "allreduce",
            "-m",
            "4K:8K",
            "-i",
            "3",
            "-x",
            "1",
            "-c",
        ],
    )
    assert proc.returncode == 0, proc.stderr
    points = json.loads(out.read_text())["points"].values()
    assert sorted(p["size_bytes"] for p in points) == [4096, 8192]
    for point in points:
        assert point["validation"] == {"A": "Pass", "B": "Pass"}
        assert point["timers"] == {"A": "python", "B": "python"}  # like with like


_EXIT_THREADS = """
import atexit, os, socket
import torch
import torch.distributed  # noqa: F401

torch.ones(1 << 16).sum()  # the intra-op pool's threads, if any, start now


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


before = threads()
# registered before the communicator's own handler: runs after it
atexit.register(lambda: print("threads left", threads() - before, flush=True))
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
from ccbench.collectives.comm_torch import torch_communicator

comm = torch_communicator("gloo", 0, 1, 0, master=("127.0.0.1", port))
comm.barrier()
print("gathered", comm.allgather_obj(7), flush=True)
"""


def test_no_gloo_thread_outlives_the_exit_handler():
    """A group still held at exit keeps its gloo threads into the interpreter's
    finalisation, where one that drops a tensor aborts the rank ("terminate called
    without an active exception"): after the communicator's exit handler, none is left."""
    proc = subprocess.run(
        [sys.executable, "-c", _EXIT_THREADS],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "gathered [7]" in proc.stdout
    assert "threads left 0" in proc.stdout, proc.stdout
