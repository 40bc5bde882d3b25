"""How this process was started: by an MPI launcher, or by torchrun / srun without MPI.

Read from the environment only (no MPI, no torch), so it can be asked before mpi4py
starts MPI: under torchrun, or srun without an MPI plug-in, ccbench must not start MPI
at all (benchmarks/mpi_start.py asks here first). The torch transport needs, without MPI,
what torchrun exports (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), or what
srun exports (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) plus MASTER_ADDR.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# Variables an MPI launcher (Hydra, Open MPI's prterun, srun --mpi=pmi2/pmix) gives each
# process: their presence means MPI_Init will find its job.
MPI_VARIABLES = (
    "PMI_RANK",
    "PMI_SIZE",
    "PMIX_RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_FD",
    "MPI_LOCALRANKID",
    "MPIRUN_RANK",
)
# What launchers tell each process of the job they started: its size and this process's
# rank (Hydra and srun --mpi=pmi2: PMI_*; Open MPI's prterun: OMPI_COMM_WORLD_*; any srun
# step: SLURM_*, which a batch script alone does not have; torchrun: RANK).
SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "RANK")
DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class EnvLaunch:
    """A launch without MPI: who this process is, and where the rendezvous is."""

    launcher: str  # "torchrun" or "srun"
    rank: int
    size: int
    local_rank: int
    master_addr: str
    master_port: int


def launched_size(environ=None) -> int | None:
    """How many processes the launcher says it started (None: no launcher says)."""
    env = os.environ if environ is None else environ
    return next((int(env[name]) for name in SIZE_VARIABLES if env.get(name, "").isdigit()), None)


def launched_rank(environ=None) -> int:
    """This process's rank as its launcher numbers it (0 without a launcher)."""
    env = os.environ if environ is None else environ
    return next((int(env[name]) for name in RANK_VARIABLES if env.get(name, "").isdigit()), 0)


def check_world(world_size: int, library: str, environ=None) -> None:
    """Refuse an MPI world that is not the job the launcher started: an MPI that cannot
    speak the launcher's process interface (srun --mpi=pmi2 with Open MPI 5, another MPI's
    mpiexec) makes every process a world of its own, and each would time itself alone."""
    from ccbench.kernels.errors import UsageError

    started = launched_size(environ)
    if started is not None and started != world_size:
        raise UsageError(
            f"the launcher started {started} processes but MPI sees a world of {world_size}: "
            f"this MPI ({library}) cannot join the launcher's job; start it with this MPI's "
            "own mpiexec, or srun with the --mpi plug-in it was built for (pmix for Open "
            "MPI 5)"
        )


def mpi_launched(environ=None) -> bool:
    env = os.environ if environ is None else environ
    return any(name in env for name in MPI_VARIABLES)


def env_launch(environ=None) -> EnvLaunch | None:
    """The torchrun or srun launch of this process when no MPI launcher started it."""
    env = os.environ if environ is None else environ
    if mpi_launched(env):
        return None
    port = int(env.get("MASTER_PORT", DEFAULT_MASTER_PORT) or DEFAULT_MASTER_PORT)
    if "RANK" in env and "WORLD_SIZE" in env and env.get("MASTER_ADDR"):
        return EnvLaunch(
            "torchrun",
            int(env["RANK"]),
            int(env["WORLD_SIZE"]),
            int(env.get("LOCAL_RANK", 0)),
            env["MASTER_ADDR"],
            port,
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and env.get("MASTER_ADDR"):
        return EnvLaunch(
            "srun",
            int(env["SLURM_PROCID"]),
            int(env["SLURM_NTASKS"]),
            int(env.get("SLURM_LOCALID", 0)),
            env["MASTER_ADDR"],
            port,
        )
    return None


def mpi_wanted(environ=None) -> bool:
    """False when this is a torchrun / srun launch without MPI: then MPI is never started."""
    return env_launch(environ) is None


def launch_communicator(backend: str = "gloo"):
    """The communicator of this launch, for the agreement on errors and the rendezvous:
    MPI's world under an MPI launcher (or none: one rank), else a torch communicator of
    `backend` from torchrun / srun's environment."""
    env = env_launch()
    if env is None:
        from mpi4py import MPI

        from ccbench.collectives.comm import Communicator

        library = " ".join(MPI.Get_library_version().splitlines()[0].split(",")[0].split())
        check_world(MPI.COMM_WORLD.Get_size(), library)
        return Communicator(MPI.COMM_WORLD)
    from ccbench.collectives.comm_torch import torch_communicator

    return torch_communicator(
        backend, env.rank, env.size, env.local_rank, master=(env.master_addr, env.master_port)
    )


def communicator_for(launch, transport: str, backend: str):
    """The communicator a run's algorithms use: the launch's own, or a torch one set up
    from it (its rendezvous over MPI). Collective."""
    from ccbench.kernels.errors import UsageError

    if transport == "mpi":
        if launch.transport != "mpi":
            raise UsageError(
                "--transport mpi needs an MPI launch (mpiexec, or srun with "
                "MPI); under torchrun add --transport torch"
            )
        return launch
    if launch.transport == "torch" and launch.backend == backend:
        return launch
    from ccbench.collectives.comm_torch import torch_communicator

    mpi = getattr(launch, "mpi", None)
    return torch_communicator(backend, launch.rank, launch.size, launch.local_rank, mpi_comm=mpi)
