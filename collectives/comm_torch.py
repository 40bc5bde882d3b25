"""The torch transport: the algorithms' bytes over torch.distributed (NCCL or gloo).

`TorchCommunicator` fulfils collectives/comm.py's contract with torch.distributed: NCCL
for device buffers, gloo for host buffers (or `--backend`). The library's collectives are
torch's (`all_gather_single` / `all_gather_into_tensor`, `reduce_scatter_single` where
this torch has it, else `reduce_scatter_tensor`, `all_reduce`; the library-backed
compressed collectives' payloads: `all_gather_single`, `all_to_all_single`); the rings and
the pipelines run over `batch_isend_irecv` (each send batched with its receive, as NCCL needs
for a ring: on two ranks both directions share one stream). Messages are matched in
posting order per pair of ranks, without tags, as NCCL matches them, on gloo too, so
CI's gloo runs test the schedules NCCL runs. Requests are waited for, never tested
(gloo completes a receive only inside `wait()`; NCCL's wait makes the current stream
wait, not the host).

Buffers the backend cannot read (a CUDA buffer on gloo, a host buffer on NCCL) are
staged through a mirror kept per buffer: declared host synchronisations, as MPI's
staging. `CCBENCH_TORCH_STAGE=1` stages every buffer, readable or not, so that CPU runs
(gloo, the tests' device double) take the staged path: copy to the mirror, the library's
call, copy back. The control plane (agreement, statistics) runs on a gloo group of its
own, so it never waits behind device work.

Started from an MPI launch (rank, size, node-local rank from MPI; rank 0's TCPStore
address broadcast over MPI) or from torchrun / srun's environment (collectives/launch.py).
"""

from __future__ import annotations

import atexit
import datetime
import fcntl
import os
import socket
import struct
import time

import numpy as np

from ccbench.collectives.communicator import BaseCommunicator
from ccbench.collectives.spec import spec
from ccbench.kernels import arrays, switches
from ccbench.kernels.errors import UsageError
from ccbench.kernels.vocabulary import nbytes

BACKENDS = ("gloo", "nccl")
CUDA_BUFFERS = ("cupy", "torch-cuda")
TIMEOUT_ENV = "CCBENCH_TORCH_TIMEOUT"  # seconds a collective may wait for a peer
STAGE_ENV = "CCBENCH_TORCH_STAGE"  # "1": stage every buffer through a mirror (tests)
DEFAULT_TIMEOUT_S = 300

_COMMS: dict[str, TorchCommunicator] = {}
_CONTROL = None  # the gloo group of the control plane, shared by every TorchCommunicator


def default_backend(buffer: str) -> str:
    """NCCL for CUDA buffers, gloo for the others."""
    return "nccl" if buffer in CUDA_BUFFERS else "gloo"


def check_backend(backend: str, buffer: str) -> None:
    """Raise UsageError when `backend` cannot carry `buffer` here."""
    if backend not in BACKENDS:
        raise UsageError(f"--backend {backend}: choose one of {', '.join(BACKENDS)}")
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise UsageError("--transport torch needs torch (pip install 'ccbench[torch]')") from None
    if not dist.is_available():
        raise UsageError("--transport torch: this torch was built without torch.distributed")
    if backend == "nccl":
        if buffer not in CUDA_BUFFERS:
            raise UsageError(
                f"--backend nccl moves device buffers only: use -d torch-cuda "
                f"or -d cupy, or --backend gloo for -d {buffer}"
            )
        if not dist.is_nccl_available():
            raise UsageError("--backend nccl: this torch has no NCCL (a CPU build?)")
        if not torch.cuda.is_available():
            raise UsageError("--backend nccl: torch sees no CUDA device on this host")
    elif not dist.is_gloo_available():
        raise UsageError("--backend gloo: this torch has no gloo")


def stages(backend: str, buffer: str) -> bool:
    """Whether `backend` stages `buffer`'s arrays through a mirror (the host copies them
    inside each call): a CUDA buffer on gloo, every buffer with CCBENCH_TORCH_STAGE=1.
    As TorchCommunicator._reachable decides per tensor."""
    if switches.current().torch_stage == "1":
        return True
    return (buffer in CUDA_BUFFERS) != (backend == "nccl")


def _interface_address(name: str) -> str:
    """IPv4 address of a network interface (SIOCGIFADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
    return socket.inet_ntoa(packed[20:24])


def gloo_interface() -> str | None:
    """The interface gloo binds on this rank: GLOO_SOCKET_IFNAME, else the emulated
    cluster's (FI_TCP_IFACE, then also set as GLOO_SOCKET_IFNAME). Every rank needs it:
    inside a network namespace the host name resolves to that namespace's own loopback,
    where no other rank can reach it."""
    iface = os.environ.get("GLOO_SOCKET_IFNAME") or os.environ.get("FI_TCP_IFACE")
    if iface:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)
    return iface or None


def rendezvous_address(hosts: list[str]) -> str:
    """Where rank 0's store listens: the emulated cluster's interface, loopback when
    every rank runs on one host, else this host's name."""
    iface = gloo_interface()
    if iface:
        return _interface_address(iface)
    if len(set(hosts)) == 1:
        return "127.0.0.1"
    return socket.gethostbyname(socket.gethostname())


def _timeout() -> datetime.timedelta:
    given = switches.current().torch_timeout
    return datetime.timedelta(seconds=float(given or DEFAULT_TIMEOUT_S))


def nccl_identity(device_index: int) -> tuple[str, str]:
    """(this rank's host as NCCL tells hosts apart, its GPU): NCCL_HOSTID where set, else
    the host name; the GPU's UUID (what CUDA_VISIBLE_DEVICES left visible and the index,
    where torch gives none)."""
    import torch

    props = torch.cuda.get_device_properties(device_index)
    gpu = str(getattr(props, "uuid", "") or "")
    if not gpu:
        gpu = f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')}#{device_index}"
    return os.environ.get("NCCL_HOSTID") or socket.gethostname(), gpu


def refuse_shared_gpu(identities: list) -> None:
    """UsageError where two ranks' (host, GPU) are the same: NCCL would abort with
    'Duplicate GPU detected'. Each rank's own NCCL_HOSTID makes them two hosts to NCCL."""
    ranks: dict = {}
    for rank, identity in enumerate(identities):
        ranks.setdefault(tuple(identity), []).append(rank)
    shared = [(identity, r) for identity, r in ranks.items() if len(r) > 1]
    if not shared:
        return
    (host, _), together = shared[0]
    raise UsageError(
        _shared_gpu_message(f"ranks {', '.join(map(str, together))} share one GPU on {host}")
    )


def _shared_gpu_message(who: str) -> str:
    return (
        f"--backend nccl: {who}, which NCCL refuses (Duplicate GPU detected); run one "
        "rank per GPU, or --transport mpi (staged through host memory), or give each "
        "rank its own NCCL_HOSTID (NCCL then runs its socket transport: functional "
        "coverage only)"
    )


def init_default_group(
    backend: str,
    rank: int,
    size: int,
    local_rank: int,
    mpi_comm=None,
    master: tuple[str, int] | None = None,
) -> None:
    """The default process group, from an MPI launch (`mpi_comm`: rank 0's TCPStore
    address broadcast over MPI) or from torchrun / srun (`master`: MASTER_ADDR/PORT)."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    gloo_interface()  # on every rank, before gloo picks an address
    if mpi_comm is not None:
        hosts = mpi_comm.allgather(socket.gethostname())
        address = mpi_comm.bcast(rendezvous_address(hosts) if rank == 0 else None, root=0)
        store = None
        if rank == 0:
            store = dist.TCPStore(
                address, 0, size, is_master=True, wait_for_workers=False, timeout=_timeout()
            )
        port = mpi_comm.bcast(store.port if store is not None else None, root=0)
        if store is None:
            store = dist.TCPStore(address, port, size, is_master=False, timeout=_timeout())
    else:  # torchrun / srun: env:// (torchrun's agent hosts the store at MASTER_PORT)
        address, port = master
        os.environ.setdefault("MASTER_ADDR", address)
        os.environ.setdefault("MASTER_PORT", str(port))
        store = None
    kwargs = {"store": store} if store is not None else {"init_method": "env://"}
    if backend == "nccl":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        kwargs["device_id"] = torch.device("cuda", torch.cuda.current_device())
        # NCCL ends the job with its own abort on ranks that share a GPU: say it first
        if mpi_comm is not None:
            refuse_shared_gpu(mpi_comm.allgather(nccl_identity(torch.cuda.current_device())))
        elif int(
            os.environ.get("LOCAL_WORLD_SIZE") or 0
        ) > torch.cuda.device_count() and not os.environ.get("NCCL_HOSTID"):
            raise UsageError(
                _shared_gpu_message(
                    f"{os.environ['LOCAL_WORLD_SIZE']} ranks on {socket.gethostname()} share "
                    f"{torch.cuda.device_count()} GPU(s)"
                )
            )
    dist.init_process_group(backend, rank=rank, world_size=size, timeout=_timeout(), **kwargs)
    atexit.register(_destroy)


def _destroy() -> None:
    """At exit, while the interpreter still runs: every group's gloo threads joined. A
    group that something still holds keeps its threads after destroy_process_group, and
    a thread that drops a tensor once finalisation has begun aborts the process
    ("terminate called without an active exception"); so ours are let go first."""
    import gc

    import torch.distributed as dist

    global _CONTROL
    for comm in _COMMS.values():
        comm.group = comm.control = None
    _COMMS.clear()
    _CONTROL = None
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


def torch_communicator(
    backend: str, rank: int, size: int, local_rank: int, mpi_comm=None, master=None
) -> TorchCommunicator:
    """The communicator of `backend` (one per backend and process). Collective."""
    comm = _COMMS.get(backend)
    if comm is None:
        init_default_group(backend, rank, size, local_rank, mpi_comm, master)
        comm = _COMMS[backend] = TorchCommunicator(backend, local_rank, mpi_comm is not None)
    return comm


def torch_function(collective: str):
    """torch.distributed's function of a collective: the first name spec.py gives that
    this torch has (newer names first)."""
    import torch.distributed as dist

    return next(getattr(dist, name) for name in spec(collective).torch_calls if hasattr(dist, name))


def default_group_call(collective: str, sendbuf, recvbuf) -> None:
    """One call of torch.distributed's own collective on its default group (training's
    --variant torch): (out, in), or an in-place one on recvbuf, which holds its input."""
    function = torch_function(collective)
    if spec(collective).in_place:
        function(recvbuf)
    else:
        function(recvbuf, sendbuf)


class _Request:
    """Works of one send, receive or batch; `after` copies a staged receive in."""

    def __init__(self, works, after=None):
        self.works, self.after = works, after

    def Wait(self) -> None:
        for work in self.works:
            work.wait()
        self.works = []
        if self.after is not None:
            after, self.after = self.after, None
            after()


class TorchCommunicator(BaseCommunicator):
    """torch.distributed under the algorithms (module docstring)."""

    transport = "torch"
    tagged = False
    any_completion = False
    STAGING = 4096

    def __init__(self, backend: str, local_rank: int, mpi_launched: bool):
        import torch.distributed as dist

        global _CONTROL
        super().__init__(dist.get_rank(), dist.get_world_size(), local_rank)
        self.backend = self.torch_backend = backend
        self.dist = dist
        self.mpi_launched = mpi_launched
        # every rank creates the groups in the same order: the data group, then control
        self.group = None if dist.get_backend() == backend else dist.new_group(backend=backend)
        if _CONTROL is None:
            _CONTROL = dist.new_group(backend="gloo")
        self.control = _CONTROL
        self._mirrors: dict = {}
        import torch

        self.torch = torch
        self.cuda = backend == "nccl"
        # staging is otherwise only for buffers the backend cannot read (GPU runs)
        self.stage_all = switches.current().torch_stage == "1"

    # buffers --------------------------------------------------------------------------
    def _reachable(self, t) -> bool:
        return not self.stage_all and (t.device.type == "cuda") == self.cuda

    def _mirror(self, x, t):
        """The staging tensor of x on the side the backend reads (one per buffer)."""
        key = (t.data_ptr(), nbytes(x), t.dtype)  # t views x's memory, on any backend
        mirror = self._mirrors.get(key)
        if mirror is None:
            torch = self.torch
            where = torch.device("cuda", torch.cuda.current_device()) if self.cuda else "cpu"
            mirror = torch.empty(t.shape, dtype=t.dtype, device=where)
            if len(self._mirrors) >= self.STAGING:
                self._mirrors.pop(next(iter(self._mirrors)))
            self._mirrors[key] = mirror
        return mirror

    def _copy(self, dst, src) -> None:
        """A declared host transfer between a buffer and its mirror."""
        t0 = time.perf_counter()
        with arrays.declared():
            dst.copy_(src)
        self.stage_s += time.perf_counter() - t0

    def _outgoing(self, x):
        t = arrays.backend_of(x).tensor(x)
        if self._reachable(t):
            return t
        mirror = self._mirror(x, t)
        self._copy(mirror, t)
        return mirror

    def _incoming(self, out):
        """(the tensor the backend writes, the copy that completes the receive or None)."""
        t = arrays.backend_of(out).tensor(out)
        if self._reachable(t):
            return t, None
        mirror = self._mirror(out, t)
        return mirror, lambda: self._copy(t, mirror)

    # point to point -------------------------------------------------------------------
    def send(self, x, dest: int, tag: int = 0) -> None:
        self.isend(x, dest, tag).Wait()

    def recv(self, out, source: int, tag: int = 0) -> None:
        self.irecv(out, source, tag).Wait()

    def isend(self, x, dest: int, tag: int = 0):
        self.wire_bytes += nbytes(x)
        return _Request([self.dist.isend(self._outgoing(x), dest, group=self.group)])

    def irecv(self, out, source: int, tag: int = 0):
        t, after = self._incoming(out)
        return _Request([self.dist.irecv(t, source, group=self.group)], after)

    def exchange(self, sendbuf, dest: int, recvbuf, source: int, tag: int = 0) -> list:
        dist, ops, after = self.dist, [], None
        if recvbuf.shape[0]:
            t, after = self._incoming(recvbuf)
            ops.append(dist.P2POp(dist.irecv, t, source, group=self.group))
        if sendbuf.shape[0]:
            self.wire_bytes += nbytes(sendbuf)
            ops.append(dist.P2POp(dist.isend, self._outgoing(sendbuf), dest, group=self.group))
        if not ops:
            return []
        return [_Request(dist.batch_isend_irecv(ops), after)]

    # the library's collectives ----------------------------------------------------------
    def library_call(self, collective: str, sendbuf, recvbuf):
        """torch.distributed's own collective (collectives/spec.py names its function),
        bound to these buffers. An in-place one (all_reduce) copies the input into the
        output first."""
        group = self.group
        send_t = arrays.backend_of(sendbuf).tensor(sendbuf)
        recv_t = arrays.backend_of(recvbuf).tensor(recvbuf)
        s = send_t if self._reachable(send_t) else self._mirror(sendbuf, send_t)
        r = recv_t if self._reachable(recv_t) else self._mirror(recvbuf, recv_t)
        described = spec(collective)
        function = torch_function(collective)
        if described.in_place:

            def call():
                r.copy_(s)
                function(r, group=group)
        else:

            def call():
                function(r, s, group=group)

        if s is send_t and r is recv_t:
            return call

        def staged():
            if s is not send_t:
                self._copy(s, send_t)
            call()
            if r is not recv_t:
                self._copy(recv_t, r)

        return staged

    def allgather_bytes(self, sendbuf, recvbuf) -> None:
        self.wire_bytes += (self.size - 1) * nbytes(sendbuf)
        out, after = self._incoming(recvbuf)
        gather = getattr(self.dist, "all_gather_single", None) or self.dist.all_gather_into_tensor
        gather(out, self._outgoing(sendbuf), group=self.group)
        if after is not None:
            after()

    def alltoall_bytes(self, sendbuf, send_splits, recvbuf, recv_splits) -> None:
        self.wire_bytes += sum(send_splits) - send_splits[self.rank]
        out, after = self._incoming(recvbuf[: sum(recv_splits)])
        self.dist.all_to_all_single(
            out,
            self._outgoing(sendbuf[: sum(send_splits)]),
            list(recv_splits),
            list(send_splits),
            group=self.group,
        )
        if after is not None:
            after()

    def barrier(self) -> None:
        self.dist.barrier(group=self.control)

    # control plane (the gloo group) --------------------------------------------------------
    def allgather_obj(self, obj) -> list:
        out = [None] * self.size
        self.dist.all_gather_object(out, obj, group=self.control)
        return out

    def gather_obj(self, obj, root: int = 0) -> list | None:
        out = [None] * self.size if self.rank == root else None
        self.dist.gather_object(obj, out, dst=root, group=self.control)
        return out

    def bcast_obj(self, obj, root: int = 0):
        box = [obj]
        self.dist.broadcast_object_list(box, src=root, group=self.control)
        return box[0]

    def allreduce_array(self, array: np.ndarray, op: str = "sum") -> np.ndarray:
        ops = {
            "sum": self.dist.ReduceOp.SUM,
            "max": self.dist.ReduceOp.MAX,
            "min": self.dist.ReduceOp.MIN,
        }
        t = self.torch.from_numpy(np.array(array, copy=True))
        self.dist.all_reduce(t, op=ops[op], group=self.control)
        return t.numpy()

    def allgather_array(self, array: np.ndarray) -> np.ndarray:
        t = self.torch.from_numpy(np.ascontiguousarray(array).reshape(-1))
        out = self.torch.empty(self.size * t.numel(), dtype=t.dtype)
        gather = getattr(self.dist, "all_gather_single", None) or self.dist.all_gather_into_tensor
        gather(out, t, group=self.control)
        return out.numpy().reshape((self.size, *np.shape(array)))

    def abort(self, status: int) -> None:
        if self.mpi_launched:  # mpiexec ends every rank at once
            from mpi4py import MPI

            MPI.COMM_WORLD.Abort(status)
        os._exit(status)  # torchrun / srun end the others when one exits

    def describe(self) -> dict:
        torch = self.torch
        out = {
            "transport": "torch",
            "backend": self.backend,
            "torch": torch.__version__,
            "launch": "mpiexec" if self.mpi_launched else "torchrun/srun",
        }
        if self.cuda:
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            out["cuda"] = torch.version.cuda
        return out
