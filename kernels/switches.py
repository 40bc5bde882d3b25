"""The switches of this process: the `CCBENCH_*` environment variables, as the options
layer read them once (benchmarks/switches.py) and handed down.

Nothing here reads the environment: floors below the options layer consult `current()`,
which the options layer sets with `install()` at each entry point; a process that never
installed any (a unit test of a kernel) sees every variable unset. The one exception is
the test backends' hook, CCBENCH_TEST_BACKENDS, which kernels/arrays.py reads where it
registers backends (docs/environment.md).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Switches:
    """One field per variable, its text as set ("" where unset); each floor parses the
    fields it uses, where it did when it read the variable itself."""

    codec_kernels: str = ""  # CCBENCH_CODEC_KERNELS
    corpus: str = ""  # CCBENCH_CORPUS
    gpu_aware: str = ""  # CCBENCH_GPU_AWARE
    ranks_per_node: str = ""  # CCBENCH_RANKS_PER_NODE
    nodes: str = ""  # CCBENCH_NODES
    torch_stage: str = ""  # CCBENCH_TORCH_STAGE
    torch_timeout: str = ""  # CCBENCH_TORCH_TIMEOUT
    torch_backend: str = ""  # CCBENCH_TORCH_BACKEND
    debug: str = ""  # CCBENCH_DEBUG
    timer: str = ""  # CCBENCH_TIMER
    barrier: str = ""  # CCBENCH_BARRIER
    cache: str = ""  # CCBENCH_CACHE
    intra_node_gbps: str = ""  # CCBENCH_INTRA_NODE_GBPS
    link_gbps: str = ""  # CCBENCH_LINK_GBPS
    link_goodput_gbps: str = ""  # CCBENCH_LINK_GOODPUT_GBPS
    link_ceiling_gbps: str = ""  # CCBENCH_LINK_CEILING_GBPS
    link_burst_bytes: str = ""  # CCBENCH_LINK_BURST_BYTES
    link_step_us: str = ""  # CCBENCH_LINK_STEP_US
    git_sha: str = ""  # CCBENCH_GIT_SHA
    sweep_id: str = ""  # CCBENCH_SWEEP_ID
    mpiexec: str = ""  # CCBENCH_MPIEXEC
    bind: str = ""  # CCBENCH_BIND
    srun_mpi: str = ""  # CCBENCH_SRUN_MPI
    srun_args: str = ""  # CCBENCH_SRUN_ARGS
    state: str = ""  # CCBENCH_STATE
    gpu_check_timeout: str = ""  # CCBENCH_GPU_CHECK_TIMEOUT


UNSET = Switches()
_current = UNSET


def install(switches: Switches) -> None:
    """Make `switches` the ones every floor below the options layer consults."""
    global _current
    _current = switches


def current() -> Switches:
    """The switches installed last (all unset where none was)."""
    return _current
