"""ccbench benchmarks: the common harness and one short script per variant.

Importing this package imports no MPI: it arranges for mpi4py's rc options (MPI's thread
level) to be set just before `mpi4py.MPI` is first imported (benchmarks/mpi_start.py), and
reads the `CCBENCH_*` environment variables once for the floors below
(benchmarks/switches.py; each entry point reads them again when it starts).
"""

from __future__ import annotations

from ccbench.benchmarks import switches as _switches
from ccbench.benchmarks.mpi_start import request_thread_level, watch_for_mpi

__all__ = ["request_thread_level"]

watch_for_mpi()
_switches.install()
