"""torch.distributed on the ranks of the launch.

Stock FSDP and DDP need the default process group. Under the torch transport the
communicator has set it up already (collectives/comm_torch.py); under MPI it is set up
here from the same launch (``init_torch_distributed``: gloo, which the training loop
keeps on a GPU too), so stock FSDP and DDP run unchanged beside ccbench's collectives.
"""

from __future__ import annotations

import torch.distributed as dist

from ccbench.collectives.comm_torch import init_default_group
from ccbench.kernels import switches


def init_torch_distributed(comm, backend: str | None = None) -> str:
    """The default process group over the ranks of ``comm`` (its rendezvous over MPI, or
    torchrun's), and its backend. ``backend``: gloo, or nccl (each rank takes its
    node-local rank's device; ranks sharing one are refused); ``CCBENCH_TORCH_BACKEND``
    sets the default."""
    if dist.is_initialized():
        return dist.get_backend()
    backend = backend or switches.current().torch_backend or "gloo"
    init_default_group(
        backend, comm.rank, comm.size, comm.local_rank, mpi_comm=getattr(comm, "mpi", None)
    )
    return backend
