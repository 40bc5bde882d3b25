"""The one place that reads ccbench's `CCBENCH_*` environment variables (the options
layer, beside benchmarks/options.py): `read()` turns the environment into a frozen
`Switches`; `install()` reads it and hands it to the floors below (kernels/switches.py),
which never read the environment themselves. Every entry point installs them when it
starts, so a variable set for a run is read once, at its start; the tools of scripts/
read theirs through `read()` where they start.

`VARIABLES` is the documented list: docs/environment.md holds the same names (a test
compares them). CCBENCH_TEST_BACKENDS alone is read where it acts, by kernels/arrays.py
(the test backends' hook, registered before any option parser is built).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

from ccbench.kernels import switches as lower
from ccbench.kernels.switches import Switches

# name -> who consults it (the field of Switches is the name without CCBENCH_, lowercase)
VARIABLES: dict[str, str] = {
    "CCBENCH_CODEC_KERNELS": "kernels/codec_base.py",
    "CCBENCH_CORPUS": "kernels/inputs.py",
    "CCBENCH_GPU_AWARE": "collectives/comm.py, scripts/gpu/survey.py",
    "CCBENCH_RANKS_PER_NODE": "collectives/hierarchical.py, benchmarks/environment.py",
    "CCBENCH_NODES": "benchmarks/environment.py",
    "CCBENCH_TORCH_STAGE": "collectives/comm_torch.py, benchmarks/graphs.py",
    "CCBENCH_TORCH_TIMEOUT": "collectives/comm_torch.py",
    "CCBENCH_TORCH_BACKEND": "training/rendezvous.py",
    "CCBENCH_DEBUG": "benchmarks/agreement.py",
    "CCBENCH_TIMER": "benchmarks/timing_c.py",
    "CCBENCH_BARRIER": "benchmarks/timing.py",
    "CCBENCH_CACHE": "benchmarks/timing_c.py",
    "CCBENCH_INTRA_NODE_GBPS": "benchmarks/hierarchy.py",
    "CCBENCH_LINK_GBPS": "benchmarks/environment.py, benchmarks/compressed_base.py",
    "CCBENCH_LINK_GOODPUT_GBPS": "benchmarks/compressed_base.py",
    "CCBENCH_LINK_CEILING_GBPS": "benchmarks/environment.py, benchmarks/compressed_base.py",
    "CCBENCH_LINK_BURST_BYTES": "benchmarks/environment.py",
    "CCBENCH_LINK_STEP_US": "benchmarks/environment.py",
    "CCBENCH_GIT_SHA": "benchmarks/environment.py",
    "CCBENCH_SWEEP_ID": "benchmarks/environment.py, scripts/",
    "CCBENCH_MPIEXEC": "scripts/launchers.py",
    "CCBENCH_BIND": "scripts/launchers.py",
    "CCBENCH_SRUN_MPI": "scripts/sweeps/slurm.py",
    "CCBENCH_SRUN_ARGS": "scripts/sweeps/sweep.py",
    "CCBENCH_STATE": "scripts/comparisons/checkpoint.py",
    "CCBENCH_GPU_CHECK_TIMEOUT": "scripts/gpu/check.py",
}
# the hook that stays where it acts (kernels/arrays.py), documented with the others
TEST_BACKENDS = "CCBENCH_TEST_BACKENDS"


def read(environ: Mapping[str, str] | None = None) -> Switches:
    """The switches `environ` (default: this process's environment) sets."""
    env = os.environ if environ is None else environ
    return Switches(**{name[len("CCBENCH_") :].lower(): env.get(name, "") for name in VARIABLES})


@contextlib.contextmanager
def for_this_run(environ: Mapping[str, str] | None = None) -> Iterator[Switches]:
    """The switches read at a run's start, installed for the run; those in place before
    are put back after it (so a run inside a test's process leaves none behind)."""
    before = lower.current()
    try:
        yield install(environ)
    finally:
        lower.install(before)


def install(environ: Mapping[str, str] | None = None) -> Switches:
    """Read the switches and hand them to the floors below; returns them."""
    switches = read(environ)
    lower.install(switches)
    return switches
