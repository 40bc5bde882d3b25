"""A real SLURM on this host: a sweep submitted as a job array, cancelled half-way,
resubmitted (only the unfinished tasks run), merged by the dependent merge job.

Needs root (the daemons) and either Slurm installed or apt-get to install it;
scripts/slurm/local-cluster.sh does both and the fixture always takes it down again.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SLURM = REPO / "scripts" / "slurm"

pytestmark = [pytest.mark.root, pytest.mark.mpi]


def have_slurm_or_apt() -> bool:
    sbin = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    installed = all(shutil.which(c, path=sbin) for c in ("slurmctld", "slurmd", "sbatch", "munged"))
    return installed or shutil.which("apt-get") is not None


def cluster(action: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SLURM / "local-cluster.sh"), action],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module")
def slurm():
    if os.geteuid() != 0:
        pytest.skip("needs root to run munge, slurmctld and slurmd")
    if not have_slurm_or_apt():
        pytest.skip("Slurm is not installed and apt-get is not available to install it")
    try:
        up = cluster("up", timeout=240)  # apt-get install counts here
        if up.returncode != 0:
            pytest.fail(f"local-cluster.sh up failed:\n{up.stderr}")
        yield
    finally:
        cluster("down", timeout=60)


@pytest.fixture(scope="module")
def srun_joins_mpi(slurm) -> None:
    """Skip unless srun can start this Python's MPI as one job with a plug-in this SLURM has
    (Debian's SLURM has PMI-2 but no PMIx library; Open MPI 5 speaks only PMIx, so there
    each srun task is a world of its own and ccbench refuses to run it)."""
    worlds = {}
    for plugin in ("pmi2", "pmix"):
        try:
            step = subprocess.run(
                [
                    "srun",
                    "-n",
                    "2",
                    f"--mpi={plugin}",
                    sys.executable,
                    "-c",
                    "from mpi4py import MPI; print(MPI.COMM_WORLD.Get_size())",
                ],
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            continue
        worlds[plugin] = step.stdout.split()
        if worlds[plugin] == ["2", "2"]:
            return
    pytest.skip(f"srun cannot start this MPI as one job here (worlds seen per --mpi: {worlds})")


def submit(spec: Path, srun_mpi: str | None = "pmi2") -> tuple[str, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "CCBENCH_SRUN_MPI"}
    env["CCBENCH_PYTHON"] = sys.executable
    if srun_mpi:
        env["CCBENCH_SRUN_MPI"] = srun_mpi
    proc = subprocess.run(
        [str(SLURM / "submit.sh"), str(spec)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=spec.parent,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, re.findall(r"^# submitted job (\d+)$", proc.stdout, re.MULTILINE)


def queued(job_ids: list[str]) -> list[str]:
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30
    ).stdout.split()
    return [j for j in out if j.split("_")[0] in job_ids]


def wait_gone(job_ids: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while queued(job_ids):
        assert time.monotonic() < deadline, f"jobs {job_ids} still queued after {timeout} s"
        time.sleep(0.5)


SPEC = """
[sweep]
name = "slurmtest"
output = "out"
ranks = [2]
sizes = "1K:8K"
iterations = 3
warmup = 1
options = ["-c"]
timeout = 90

[slurm]
mpi = "pmix"   # the site default; the test overrides it with CCBENCH_SRUN_MPI=pmi2

[[points]]
variant = "baseline"
collective = ["allgather", "allreduce"]
algorithm = ["mpi", "ring"]
"""


@pytest.mark.timeout(360)
def test_job_array_cancelled_resubmitted_and_merged(srun_joins_mpi, tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC)
    out = tmp_path / "out"
    printed, jobs = submit(spec)
    assert "# 4 of 4 tasks to run" in printed
    assert len(jobs) == 2  # the array, then the merge job that depends on it
    assert "--mpi=" not in printed  # srun's --mpi comes from the spec or the environment

    # cancel the array once its first task has finished (the harness's sidecar is there)
    first_done = out / "baseline_allgather_mpi_r2.csv.json"
    deadline = time.monotonic() + 120
    while not first_done.exists():
        assert time.monotonic() < deadline, "the first array task did not finish"
        assert queued(jobs), "the jobs ended without writing results; see " + str(out / "slurm")
        time.sleep(0.1)
    subprocess.run(["scancel", *jobs], check=True, timeout=30)
    wait_gone(jobs, timeout=60)
    assert not (tmp_path / "out.csv").exists()  # the merge job was cancelled with it

    printed, again = submit(spec)
    left = int(re.search(r"^# (\d+) of 4 tasks to run", printed, re.MULTILINE).group(1))
    assert 0 < left < 4, printed
    wait_gone(again, timeout=180)

    with open(tmp_path / "out.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 16, rows
    assert {r["validation"] for r in rows} == {"Pass"}
    assert {(r["collective"], r["algorithm"]) for r in rows} == {
        (c, a) for c in ("allgather", "allreduce") for a in ("mpi", "ring")
    }
    logs = sorted(p.name for p in (out / "slurm").iterdir())
    array_logs = [n for n in logs if re.fullmatch(rf"ccbench-slurmtest-{again[0]}_\d\.out", n)]
    assert len(array_logs) == left  # output named by job and array task
    text = "".join((out / "slurm" / n).read_text() for n in array_logs)
    assert "Pass" in text and ("MPICH" in text or "Open MPI" in text)
    assert any(n.startswith(f"ccbench-slurmtest-merge-{again[1]}") for n in logs)


FAILING = """
[sweep]
name = "slurmfail"
output = "out"
ranks = [2]
sizes = "1K:2K"
iterations = 2
warmup = 0
options = ["-c"]
timeout = 90

[[points]]
variant = "baseline"
collective = "allgather"
algorithm = ["mpi", "nosuch"]
"""


def completions() -> list[dict[str, str]]:
    """The job completion log local-cluster.sh configures, a dict per finished job."""
    log = Path(os.environ.get("CCBENCH_SLURM_DIR", "/var/tmp/ccbench-slurm")) / "jobcomp.log"
    return [
        dict(f.split("=", 1) for f in line.split() if "=" in f)
        for line in log.read_text().splitlines()
    ]


def job_states(array_job: str) -> dict[str, str]:
    """Array task id -> JobState of one job array."""
    return {
        f["ArrayTaskId"]: f["JobState"] for f in completions() if f.get("ArrayJobId") == array_job
    }


def job_state(job: str) -> str | None:
    return next((f["JobState"] for f in completions() if f.get("JobId") == job), None)


@pytest.mark.timeout(300)
def test_default_srun_mpi_works_and_a_failed_task_fails_its_array_task(srun_joins_mpi, tmp_path):
    """No [slurm] mpi, no CCBENCH_SRUN_MPI: the task picks a --mpi this SLURM can run (here
    pmi2: Debian's SLURM lists pmix but has no PMIx library) and says so in its log. A task
    that fails is shown as failed, counts no points and ends its array task with FAILED."""
    spec = tmp_path / "spec.toml"
    spec.write_text(FAILING)
    printed, jobs = submit(spec, srun_mpi=None)
    assert "# 2 of 2 tasks to run" in printed and len(jobs) == 2
    wait_gone(jobs, timeout=200)
    slurm_out = tmp_path / "out" / "slurm"
    good = (slurm_out / f"ccbench-slurmfail-{jobs[0]}_0.out").read_text()
    bad = (slurm_out / f"ccbench-slurmfail-{jobs[0]}_1.out").read_text()
    chosen = re.search(r"^# srun --mpi=(\w+): (.+)$", good, re.MULTILINE)
    assert chosen, good
    assert "Pass" in good and "sweep: 2/2 points, 1/1 tasks," in good and " failed" not in good
    assert "sweep: 0/2 points, 1/1 tasks, 1 failed," in bad, bad
    assert "task 1 baseline_nosuch_r2 failed" in bad
    deadline = time.monotonic() + 30  # slurmctld writes the log as jobs complete
    while (
        len(states := job_states(jobs[0])) < 2 or job_state(jobs[1]) is None
    ) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert states == {"0": "COMPLETED", "1": "FAILED"}, states
    with open(tmp_path / "out.csv", newline="") as f:  # the merge job still ran
        rows = list(csv.DictReader(f))
    assert [(r["algorithm"], r["validation"]) for r in rows] == [("mpi", "Pass")] * 2
    # ... and, merging what it has, says which task is missing and fails
    merge_log = (slurm_out / f"ccbench-slurmfail-merge-{jobs[1]}.out").read_text()
    assert "task 1 baseline_nosuch_r2 did not finish" in merge_log, merge_log
    assert job_state(jobs[1]) == "FAILED"


@pytest.mark.timeout(200)
def test_a_task_whose_mpi_cannot_join_srun_fails_in_one_line(slurm, tmp_path):
    """srun --mpi=none: every MPI makes each of the 2 tasks a world of 1. The task refuses
    to time one rank alone: one line from the step's rank 0, the array task FAILED."""
    spec = tmp_path / "spec.toml"
    spec.write_text(
        FAILING.replace('"slurmfail"', '"slurmnone"').replace(
            'algorithm = ["mpi", "nosuch"]', 'algorithm = "mpi"'
        )
    )
    printed, jobs = submit(spec, srun_mpi="none")
    assert "# 1 of 1 tasks to run" in printed and len(jobs) == 2
    wait_gone(jobs, timeout=150)
    log = (tmp_path / "out" / "slurm" / f"ccbench-slurmnone-{jobs[0]}_0.out").read_text()
    errors = [line for line in log.splitlines() if line.startswith("ccbench: error:")]
    assert len(errors) == 1, log
    assert "the launcher started 2 processes but MPI sees a world of 1" in errors[0]
    assert "sweep: 0/2 points, 1/1 tasks, 1 failed," in log, log
    deadline = time.monotonic() + 30
    while not job_states(jobs[0]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job_states(jobs[0]) == {"0": "FAILED"}
    assert not list((tmp_path / "out").glob("*.csv"))  # no rows of a lone rank
