"""What a result row records about where and how it was measured."""

from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

from mpi4py import MPI

from ccbench.benchmarks.results import Sidecar, new_run_id
from ccbench.kernels import arrays, switches
from ccbench.kernels.host_memory import transparent_hugepages

_ENV_PREFIXES = re.compile(
    r"^(CCBENCH_|MPIR_|MPICH_|FI_|UCX_|OMPI_|PMIX_|SLURM_|CUDA_VISIBLE|NCCL_|GLOO_|TORCHELASTIC_|"
    r"MASTER_ADDR|MASTER_PORT|LOCAL_RANK|WORLD_SIZE)"
)
_REPO = Path(__file__).resolve().parent.parent


def git_sha() -> str:
    """The checkout's commit (CCBENCH_GIT_SHA overrides, for installed copies)."""
    if switches.current().git_sha:
        return switches.current().git_sha
    try:
        out = subprocess.run(
            ["git", "-C", str(_REPO), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def mpi_started() -> bool:
    """False under torchrun / srun without MPI, where ccbench never starts it."""
    return MPI.Is_initialized() and not MPI.Is_finalized()


def mpi_library() -> str:
    """The MPI library's name and version; '' where this launch never started MPI."""
    if not mpi_started():
        return ""
    # Open MPI ends its version string with a NUL
    return MPI.Get_library_version().replace("\0", "").strip().splitlines()[0].strip()


def link_gbps():
    """The emulated link rate in Gbit/s, set by `ccbench cluster run`; None on real links."""
    value = switches.current().link_gbps
    return float(value) if value else None


def link_bound() -> dict:
    """What a lower bound on an emulated transfer needs (`ccbench cluster run` sets it):
    the link's payload ceiling, its token bucket's burst and the fixed cost of a ring step
    that `ccbench cluster selfcheck` measured; empty on real links."""
    given = switches.current()
    ceiling, burst, step = given.link_ceiling_gbps, given.link_burst_bytes, given.link_step_us
    return {
        "link_ceiling_gbps": float(ceiling) if ceiling else None,
        "link_burst_bytes": int(burst) if burst else None,
        "link_step_us": float(step) if step else None,
    }


def node_layout_of_run(hosts: int, ranks: int) -> dict:
    """Nodes and ranks per node of this launch: the emulated cluster's (`ccbench cluster
    run` sets CCBENCH_NODES and CCBENCH_RANKS_PER_NODE; its ranks all run on one host),
    else SLURM's allocation (SLURM_NNODES, SLURM_NTASKS_PER_NODE where every node has as
    many: "4" or "4(x2)"), else the distinct hosts the ranks run on."""
    nodes = switches.current().nodes or os.environ.get("SLURM_NNODES") or ""
    per_node = switches.current().ranks_per_node
    if not per_node:
        match = re.fullmatch(r"(\d+)(\(x\d+\))?", os.environ.get("SLURM_NTASKS_PER_NODE", ""))
        per_node = match.group(1) if match else ""
    n = int(nodes) if nodes.isdigit() else hosts
    m = int(per_node) if per_node.isdigit() else (ranks // n if n and ranks % n == 0 else None)
    return {"nodes": n, "ranks_per_node": m}


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity; every core where there is none)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(os.cpu_count() or 1))


def crowded(ranks) -> dict[str, tuple[int, int]]:
    """{host: (ranks, cores)} for each host whose ranks outnumber the cores they may run
    on (the union of their CPU affinities); ``ranks``: (host, cpus) of every rank. The one
    definition of ranks sharing cores: the sidecar's `oversubscribed`, its warning, and
    the barrier between timed calls (benchmarks/timing.py)."""
    hosts: dict[str, tuple[int, set]] = {}
    for host, cpus in ranks:
        count, allowed = hosts.get(host, (0, set()))
        hosts[host] = (count + 1, allowed | set(cpus))
    return {h: (n, len(cpus)) for h, (n, cpus) in hosts.items() if n > len(cpus)}


def placement(comm, buffer: str | None = None) -> dict:
    """Where each rank runs: its host, CPU affinity and device, each host's cores and load
    average at the start, and whether ranks outnumber a host's cores. Collective."""
    device = arrays.backend(buffer).describe() if buffer else {"device": "cpu"}
    mine = {
        "host": comm.processor_name(),
        "affinity": allowed_cpus(),
        "cores": os.cpu_count() or 1,
        "load_average": list(os.getloadavg()),
        "local_rank": comm.local_rank,
        **device,
    }
    ranks = comm.allgather_obj(mine)
    hosts: dict[str, dict] = {}
    for r in ranks:
        host = hosts.setdefault(
            r["host"], {"cores": r["cores"], "ranks": 0, "load_average": r["load_average"]}
        )
        host["ranks"] += 1
    shared_cores = crowded((r["host"], r["affinity"]) for r in ranks)
    for host, (_, cores) in shared_cores.items():
        hosts[host]["shared_by"] = cores  # the cores its ranks may run on
    shared = len({tuple(r["affinity"]) for r in ranks if len(r["affinity"]) == 1}) < len(
        [r for r in ranks if len(r["affinity"]) == 1]
    )
    return {
        "affinity": {str(i): r["affinity"] for i, r in enumerate(ranks)},
        "devices": {
            str(i): {k: v for k, v in r.items() if k not in ("affinity", "cores", "load_average")}
            for i, r in enumerate(ranks)
        },
        "device": ",".join(r["device"] for r in ranks),
        "bound": all(len(r["affinity"]) == 1 for r in ranks),
        "hosts": hosts,
        "oversubscribed": bool(shared_cores),
        "cores_shared": bool(shared),
    }


def run_info(comm, variant: str, buffer: str | None = None) -> dict:
    """Columns shared by every row of one run; collective over `comm`.

    Also measures the placement (`info["placement"]`, for the JSON sidecar: each rank's
    host, cores and device) and warns in one line from rank 0 when ranks outnumber a
    host's cores. `device` is every rank's device, in rank order ("cuda:0,cuda:1").
    """
    where = placement(comm, buffer)
    hosts = list(where["hosts"])
    info = None
    if comm.rank == 0:
        now = datetime.datetime.now(datetime.timezone.utc)
        info = {
            "run_id": new_run_id(now),
            # the sweep this launch belongs to (`ccbench sweep` sets it): figures pair rows
            # of one sweep only
            "sweep_id": switches.current().sweep_id,
            "timestamp": now.isoformat(timespec="seconds"),
            "variant": variant,
            "nodes": node_layout_of_run(len(hosts), comm.size)["nodes"],
            "link_gbps": link_gbps(),
            **link_bound(),
            "mpi_library": mpi_library(),
            "hostname": comm.processor_name(),
            "git_sha": git_sha(),
            "device": where["device"],
            "transport_info": comm.describe(),
        }
        for host, v in where["hosts"].items():
            if "shared_by" not in v:
                continue
            print(
                f"ccbench: warning: {v['ranks']} ranks on {v['shared_by']} cores of {host}: "
                "ranks share cores, so timings measure the sharing too",
                file=sys.stderr,
                flush=True,
            )
    info = comm.bcast_obj(info, root=0)
    info["placement"] = where
    return info


def _versions() -> dict:
    versions = {"python": platform.python_version()}
    for name in ("mpi4py", "numpy", "torch", "cupy", "zfpy", "zstandard"):
        module = sys.modules.get(name)
        if module is not None:
            versions[name] = getattr(module, "__version__", "")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():  # only where it is in use already
        versions["cuda"] = torch.version.cuda
        versions["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return versions


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


THREAD_LEVELS = {
    MPI.THREAD_SINGLE: "single",
    MPI.THREAD_FUNNELED: "funneled",
    MPI.THREAD_SERIALIZED: "serialized",
    MPI.THREAD_MULTIPLE: "multiple",
}


def describe(info: dict, argv, ranks: int) -> dict:
    """The full environment of a run: the JSON sidecar's content."""
    started = mpi_started()
    return {
        **{k: v for k, v in info.items() if k != "placement"},
        "argv": list(argv),
        "ranks": ranks,
        "ranks_per_node": node_layout_of_run(info.get("nodes") or 1, ranks)["ranks_per_node"],
        "mpi_library_full": MPI.Get_library_version().replace("\0", "").strip() if started else "",
        "mpi_version": "{}.{}".format(*MPI.Get_version()) if started else "",
        "mpi_thread_level": THREAD_LEVELS.get(MPI.Query_thread(), str(MPI.Query_thread()))
        if started
        else "",
        "versions": _versions(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "transparent_hugepages": transparent_hugepages(),
        "cpu_count": os.cpu_count(),
        **info.get("placement", {}),
        "environment": {k: v for k, v in sorted(os.environ.items()) if _ENV_PREFIXES.match(k)},
    }


def write_sidecar(csv_path, info: dict, argv, ranks: int) -> None:
    """Add this run's environment to `<csv>.json`, keyed by run id (atomic rewrite)."""
    Sidecar(csv_path).add(info["run_id"], describe(info, argv, ranks))
