"""torch.distributed on the ranks of an MPI launch.

The ranks are the ones ``mpiexec`` (or ``srun``) started; torch.distributed is set up
from the same launch (``init_torch_distributed``: gloo on the CPU, NCCL on a GPU), so
stock FSDP and DDP run unchanged beside ccbench's collectives over MPI.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct

import torch
import torch.distributed as dist
from mpi4py import MPI


def _interface_address(name: str) -> str:
    """IPv4 address of a network interface (SIOCGIFADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
    return socket.inet_ntoa(packed[20:24])


def rendezvous_address(comm) -> str:
    """Where rank 0's store listens: the emulated cluster's interface, loopback on one
    host, else this host's name."""
    iface = os.environ.get("GLOO_SOCKET_IFNAME") or os.environ.get("FI_TCP_IFACE")
    if iface:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)
        return _interface_address(iface)
    hosts = comm.mpi.allgather(MPI.Get_processor_name())
    if len(set(hosts)) == 1:
        return "127.0.0.1"
    return socket.gethostbyname(socket.gethostname())


def init_torch_distributed(comm, backend: str | None = None) -> str:
    """Initialise torch.distributed over the ranks of ``comm`` (an MPI launch).

    Rank 0 opens a TCPStore on a free port and broadcasts its address over MPI; every
    rank then joins the default process group with its MPI rank. ``backend``: gloo (the
    default, for models on the CPU, as the training benchmark's are) or nccl (models on a
    GPU; each rank takes device rank % devices); ``CCBENCH_TORCH_BACKEND`` sets the
    default. Returns the backend.
    """
    if dist.is_initialized():
        return dist.get_backend()
    backend = backend or os.environ.get("CCBENCH_TORCH_BACKEND", "gloo")
    address = comm.mpi.bcast(rendezvous_address(comm), root=0)
    store = None
    if comm.rank == 0:
        store = dist.TCPStore(address, 0, comm.size, is_master=True, wait_for_workers=False)
    port = comm.mpi.bcast(store.port if store is not None else None, root=0)
    if store is None:
        store = dist.TCPStore(address, port, comm.size, is_master=False)
    if backend == "nccl":
        torch.cuda.set_device(comm.rank % torch.cuda.device_count())
    dist.init_process_group(backend, store=store, rank=comm.rank, world_size=comm.size)
    return backend
