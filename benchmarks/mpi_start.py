"""mpi4py's rc options, set where MPI is first needed: just before `mpi4py.MPI` (whose
import initialises MPI) is imported, so that importing ccbench.benchmarks, or a plot that
reads its results, imports no MPI.

The variants call MPI from one thread only (a codec thread never calls it), so they ask
for MPI_THREAD_FUNNELED: mpi4py's default, MPI_THREAD_MULTIPLE, makes MPICH lock around
every call (docs/compression.md, "Against OSU Micro-Benchmarks' own binaries", measures
it). MPICH's progress thread (`MPIR_CVAR_ASYNC_PROGRESS=1`) needs MULTIPLE, and so do the
entry points whose communication runs on a thread of its own (`training`,
`merged_gradient`, `trace_replay`): they call `request_thread_level` before their own
imports. `MPI4PY_RC_THREAD_LEVEL` in the environment overrides all of this. Under
torchrun (or srun without an MPI plug-in) MPI is not started at all (the torch transport
needs none): importing mpi4py.MPI then initialises nothing. The JSON sidecar records the
level granted.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

_requested: str | None = None
_configuring = False


def request_thread_level(level: str) -> None:
    """Ask for MPI thread `level` ("single", "funneled", "serialized", "multiple") when MPI
    starts; nothing once it has started, or when MPI4PY_RC_THREAD_LEVEL is set."""
    global _requested
    if "mpi4py.MPI" in sys.modules or os.environ.get("MPI4PY_RC_THREAD_LEVEL"):
        return
    _requested = level


def _async_progress() -> bool:
    return os.environ.get("MPIR_CVAR_ASYNC_PROGRESS", "0").strip().lower() in (
        "1",
        "yes",
        "true",
        "on",
    )


def configure_mpi() -> None:
    """Set mpi4py's rc options (thread level; no initialisation where the launch wants no
    MPI); nothing once mpi4py.MPI is imported."""
    global _configuring
    if "mpi4py.MPI" in sys.modules or _configuring:
        return
    _configuring = True
    try:
        import mpi4py

        from ccbench.collectives.launch import mpi_wanted

        if not os.environ.get("MPI4PY_RC_THREAD_LEVEL"):
            default = "multiple" if _async_progress() else "funneled"
            mpi4py.rc.thread_level = _requested or default
        if not mpi_wanted():
            mpi4py.rc.initialize = False
            mpi4py.rc.finalize = False
    finally:
        _configuring = False


class _BeforeMPI(importlib.abc.MetaPathFinder):
    """Sets the rc options when `mpi4py.MPI` is about to be imported; finds nothing."""

    def find_spec(self, name, path=None, target=None):
        if name == "mpi4py.MPI":
            configure_mpi()
        return None


def watch_for_mpi() -> None:
    """Set the rc options before whichever module first imports mpi4py.MPI (once)."""
    if "mpi4py.MPI" in sys.modules:
        return
    if not any(isinstance(finder, _BeforeMPI) for finder in sys.meta_path):
        sys.meta_path.insert(0, _BeforeMPI())
