"""The launch check when two launchers' variables are set: an MPI launcher started inside
an srun step (Open MPI's mpirun, MPICH's mpiexec) leaves srun's step variables in every
process's environment; the MPI launcher started the processes, so its size and rank are
the job's, and a world that matches them runs."""

from __future__ import annotations

import csv

import pytest

from ccbench.collectives.launch import check_world, launched_rank, launched_size
from ccbench.kernels.errors import UsageError
from tests.mpirun import mpirun, variant_module

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too

# a one-task srun step, as `srun -n 1 mpirun -n 4 ...` leaves it in each of the 4
SRUN_STEP = {
    "SLURM_STEP_NUM_TASKS": "1",
    "SLURM_NTASKS": "1",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
}
OPEN_MPI = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3"}
HYDRA = {"PMI_SIZE": "4", "PMI_RANK": "3"}


@pytest.mark.parametrize("mpi", [OPEN_MPI, HYDRA], ids=["open-mpi", "hydra"])
def test_the_mpi_launcher_inside_an_srun_step_gives_size_and_rank(mpi):
    env = {**SRUN_STEP, **mpi}
    assert (launched_size(env), launched_rank(env)) == (4, 3)
    check_world(4, "MPI", env)  # the world mpirun started: runs
    with pytest.raises(
        UsageError, match="the launcher started 4 processes but MPI sees a world of 1"
    ):
        check_world(1, "MPI", env)  # an MPI that could not join mpirun's job


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_a_real_launch_inside_a_one_task_step_runs_on_all_its_ranks(tmp_path):
    """This MPI's own launcher of 2 ranks with a one-task srun step's variables set."""
    out = tmp_path / "b.csv"
    proc = mpirun(
        2,
        [*variant_module("baseline"), "-m", "4:4", "-i", "2", "-x", "0", "--csv", out],
        env=SRUN_STEP,
        timeout=80,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["ranks"] for r in csv.DictReader(out.open())] == ["2"]
