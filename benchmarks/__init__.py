"""ccbench benchmarks: the common harness and one short script per variant.

Importing this package chooses MPI's thread level, before any module below it imports
`mpi4py.MPI` (which initialises MPI). The variants call MPI from one thread only (a codec
thread never calls it), so they ask for MPI_THREAD_FUNNELED: mpi4py's default,
MPI_THREAD_MULTIPLE, makes MPICH lock around every call (docs/compression.md, "Against
OSU Micro-Benchmarks' own binaries", measures it). MPICH's progress thread
(`MPIR_CVAR_ASYNC_PROGRESS=1`) needs MULTIPLE, and so do
the entry points whose communication runs on a thread of its own (`training`,
`merged_gradient`): they ask for it before their own imports. `MPI4PY_RC_THREAD_LEVEL`
in the environment overrides all of this. The JSON sidecar records the level granted.
Under torchrun MPI is not started at all (the torch transport needs none).
"""

from __future__ import annotations

import os
import sys

import mpi4py


def request_thread_level(level: str) -> None:
    """Ask for MPI thread `level` ("single", "funneled", "serialized", "multiple") when MPI
    starts; nothing once it has started, or when MPI4PY_RC_THREAD_LEVEL is set."""
    if "mpi4py.MPI" in sys.modules or os.environ.get("MPI4PY_RC_THREAD_LEVEL"):
        return
    mpi4py.rc.thread_level = level


def _async_progress() -> bool:
    return os.environ.get("MPIR_CVAR_ASYNC_PROGRESS", "0").strip().lower() in (
        "1",
        "yes",
        "true",
        "on",
    )


def _without_mpi() -> None:
    """Under torchrun (or srun without an MPI plug-in) MPI is never started: importing
    mpi4py.MPI must not initialise it (collectives/launch.py tells the launches apart)."""
    from ccbench.collectives.launch import mpi_wanted

    if "mpi4py.MPI" not in sys.modules and not mpi_wanted():
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False


request_thread_level("multiple" if _async_progress() else "funneled")
_without_mpi()
