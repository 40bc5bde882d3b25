"""What a node offers ccbench's GPU path (scripts/gpu-check.sh): its GPUs, torch and cupy
with their CUDA, the MPI library and whether it reads device memory, each with the reason
where it does not."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ccbench.benchmarks.switches import read as read_switches
from ccbench.kernels.errors import UsageError
from ccbench.scripts.launchers import OPEN_MPI, find_mpiexec, mpi_family


@dataclass
class Machine:
    """What this node offers the GPU path, and why not where it does not."""

    gpus: int = 0
    no_gpu: str = ""  # why there is no CUDA device at all ('' when there is)
    no_torch: str = ""  # why torch cannot use the GPUs
    no_cupy: str = ""
    no_nccl: str = ""
    no_gpu_aware: str = ""
    no_mpi: str = ""
    facts: dict = field(default_factory=dict)


def _gpus() -> tuple[int, str]:
    """(CUDA devices the driver lists, why none)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0, "no CUDA device: nvidia-smi not found (no NVIDIA driver on this node)"
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0, "no CUDA device: nvidia-smi did not answer"
    listed = [line for line in out.splitlines() if line.startswith("GPU ")]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        listed = listed[: len([v for v in visible.split(",") if v.strip()])]
    return len(listed), "" if listed else "no CUDA device: nvidia-smi lists none visible"


def _torch_facts() -> tuple[str, str]:
    """(why torch cannot use the GPUs, why it has no NCCL)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return "torch is not installed", "torch is not installed"
    if torch.version.cuda is None:
        why = f"this torch ({torch.__version__}) is a CPU build"
        return why, why
    if not torch.cuda.is_available():
        why = "torch sees no CUDA device (driver, CUDA_VISIBLE_DEVICES)"
        return why, why
    return "", "" if dist.is_available() and dist.is_nccl_available() else "torch has no NCCL"


def _cupy_facts() -> str:
    try:
        import cupy
    except ImportError:
        return "cupy is not installed (pip install 'ccbench[gpu]')"
    except Exception as exc:  # noqa: BLE001 - cupy without CUDA fails in many ways
        return f"cupy cannot load ({type(exc).__name__})"
    try:
        return "" if cupy.cuda.runtime.getDeviceCount() > 0 else "cupy sees no CUDA device"
    except Exception as exc:  # noqa: BLE001
        return f"cupy sees no CUDA device ({type(exc).__name__})"


def _gpu_aware(mpiexec: str) -> str:
    """Why this MPI cannot read device memory ('' when it can)."""
    if read_switches().gpu_aware == "1":
        return ""
    if mpi_family(mpiexec) == OPEN_MPI:
        info = shutil.which("ompi_info", path=str(Path(mpiexec).parent)) or shutil.which(
            "ompi_info"
        )
        if info:
            out = subprocess.run(
                [info, "--parsable", "--all"], capture_output=True, text=True, timeout=60
            ).stdout
            if "mpi_built_with_cuda_support:value:true" in out:
                return ""
        return "this Open MPI was not built with CUDA support (ompi_info)"
    version = shutil.which("mpichversion", path=str(Path(mpiexec).parent))
    if version:
        out = subprocess.run([version], capture_output=True, text=True, timeout=60).stdout
        if "--with-cuda" in out or "with-device=ch4:ucx" in out and "cuda" in out:
            return ""
    return "this MPI does not say it reads device memory (set CCBENCH_GPU_AWARE=1 if it does)"


def survey() -> Machine:
    m = Machine()
    m.gpus, m.no_gpu = _gpus()
    if not m.no_gpu:
        m.no_torch, m.no_nccl = _torch_facts()
        m.no_cupy = _cupy_facts()
    try:
        mpiexec = find_mpiexec()
    except UsageError as exc:
        m.no_mpi = str(exc)
    if not m.no_mpi and not m.no_gpu:
        m.no_gpu_aware = _gpu_aware(mpiexec)
    m.facts = {
        "gpus": m.gpus,
        "python": sys.executable,
        "mpiexec": "" if m.no_mpi else mpiexec,
        **_versions(),
    }
    return m


# what this Python loads, in a process of its own (MPI is not started: rc.initialize)
VERSIONS = r"""
import json, os, sys
out = {"python_version": sys.version.split()[0]}
try:
    import mpi4py
    mpi4py.rc.initialize = mpi4py.rc.finalize = False
    from mpi4py import MPI
    out["mpi"] = " ".join(MPI.Get_library_version().splitlines()[0].split())
    out["mpi4py"] = mpi4py.__version__
except Exception as exc:
    out["mpi"] = f"mpi4py cannot load ({type(exc).__name__}: {exc})"
try:
    import torch
    out["torch"] = torch.__version__
    if torch.version.cuda is not None:
        out["torch_cuda"] = torch.version.cuda
    if torch.version.cuda is not None and torch.cuda.is_available():
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
except Exception as exc:
    out["torch"] = f"cannot load ({type(exc).__name__})"
try:
    import cupy
    out["cupy"] = cupy.__version__
    out["cuda_runtime"] = str(cupy.cuda.runtime.runtimeGetVersion())
except Exception as exc:
    out.setdefault("cupy", f"cannot load ({type(exc).__name__})")
print(json.dumps(out))
"""


def _versions() -> dict:
    """The MPI library mpi4py loads, torch (its CUDA and NCCL) and cupy, of this Python."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", VERSIONS],
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return {}


def describe(m: Machine) -> list[str]:
    """What this run uses, one line each (printed first, and the report's header)."""
    f = m.facts
    abi = " ".join(
        f"{k}={os.environ[k]}" for k in ("MPI4PY_MPIABI", "MPI4PY_LIBMPI") if os.environ.get(k)
    )
    torch = f.get("torch", "not installed")
    if "torch_cuda" in f:
        torch += f" (CUDA {f['torch_cuda']}" + (f", NCCL {f['nccl']})" if "nccl" in f else ")")
    elif "torch" in f and "cannot" not in f["torch"]:
        torch += " (a CPU build)"
    cupy = f.get("cupy", "not installed")
    if "cuda_runtime" in f:
        cupy += f" (CUDA runtime {f['cuda_runtime']})"
    return [
        f"python: {f.get('python')} ({f.get('python_version', '?')})",
        f"mpiexec: {f.get('mpiexec') or m.no_mpi}",
        f"MPI library (mpi4py {f.get('mpi4py', '?')}): {f.get('mpi', '?')}"
        + (f"; {abi}" if abi else ""),
        f"torch: {torch}",
        f"cupy: {cupy}",
        f"GPUs: {m.gpus}" + (f" ({m.no_gpu})" if m.no_gpu else ""),
    ]
