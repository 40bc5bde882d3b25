"""SLURM for sweeps: srun's --mpi, one job array per rank count, and the merge job.

`ccbench sweep SPEC --submit` submits the pending tasks of a spec as job arrays (every
array task one `ccbench sweep SPEC --task I --launcher srun`), then a merge job that runs
once they have all ended, however they ended (docs/sweeps-slurm-regression.md).
"""

from __future__ import annotations

import itertools
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from ccbench.benchmarks.switches import read as read_switches
from ccbench.kernels.errors import UsageError
from ccbench.scripts.sweeps.tasks import Spec, Task, remaining_sizes

REPO = Path(__file__).resolve().parents[2]
SBATCH_SCRIPT = REPO / "scripts" / "slurm" / "ccbench-array.sbatch"
BIND_GPU = REPO / "scripts" / "slurm" / "bind-gpu.sh"


def srun_mpi(spec: Spec) -> tuple[str, str]:
    """srun's --mpi for the tasks, and where it came from: CCBENCH_SRUN_MPI, else the
    spec's [slurm] mpi, else pmix where it works in this allocation and pmi2 otherwise
    (Debian's SLURM lists pmix but has no PMIx library; the MPICH wheel speaks PMI-2)."""
    if read_switches().srun_mpi:
        return read_switches().srun_mpi, "from CCBENCH_SRUN_MPI"
    if spec.slurm.get("mpi"):
        return str(spec.slurm["mpi"]), f"from [slurm] mpi of {spec.path.name}"
    return _probe_srun_mpi()


_SRUN_MPI: list[tuple[str, str]] = []  # the probe's answer, once per process


def _probe_srun_mpi() -> tuple[str, str]:
    if _SRUN_MPI:
        return _SRUN_MPI[0]
    try:
        listed = subprocess.run(
            ["srun", "--mpi=list"],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        text = listed.stdout + listed.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        text = str(e)
    plugins = sorted(set(re.findall(r"\b(pmix\w*|pmi2|cray_shasta|none)\b", text)))
    if not any(p.startswith("pmix") for p in plugins):
        why = f"srun --mpi=list offers {', '.join(plugins) or 'nothing readable'}; no pmix"
        answer = ("pmi2", why)
    elif not os.environ.get("SLURM_JOB_ID"):  # a step here would ask for an allocation
        answer = ("pmix", "srun --mpi=list offers pmix (not tried outside an allocation)")
    else:
        # a listed plugin may still lack its library: try a one-task step
        try:
            probe = subprocess.run(
                ["srun", "--mpi=pmix", "-n", "1", "true"],
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
            status, tail = probe.returncode, (probe.stderr.strip().splitlines() or [""])[-1]
        except (OSError, subprocess.TimeoutExpired) as e:
            status, tail = 1, str(e)
        answer = (
            ("pmix", "srun --mpi=list offers pmix and a test step with it ran")
            if status == 0
            else ("pmi2", f"srun --mpi=pmix lists but fails here ({tail.strip()})")
        )
    _SRUN_MPI.append(answer)
    return answer


def array_ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8' (sbatch --array syntax)."""
    parts = []
    for _, run in itertools.groupby(enumerate(sorted(indices)), lambda p: p[1] - p[0]):
        run = [i for _, i in run]
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


def sbatch_commands(spec: Spec, tasks: list[Task], extra: list[str]) -> list[list[str]]:
    """One job array per rank count (every array task gets the same allocation)."""
    slurm = spec.slurm
    per_node = int(slurm.get("tasks_per_node", 0))
    gpus = int(slurm.get("gpus_per_node", 0))
    spec_path, out = str(spec.path.resolve()), spec.output.resolve()
    commands = []
    for ranks, group in itertools.groupby(sorted(tasks, key=lambda t: t.ranks), lambda t: t.ranks):
        ids = array_ranges([t.index for t in group])
        limit = f"%{int(slurm['max_parallel'])}" if slurm.get("max_parallel") else ""
        cmd = [
            "sbatch",
            "--parsable",
            f"--job-name=ccbench-{spec.name}",
            f"--array={ids}{limit}",
            f"--ntasks={ranks}",
            f"--output={out}/slurm/%x-%A_%a.out",
        ]
        if per_node:
            cmd += [
                f"--nodes={math.ceil(ranks / per_node)}",
                f"--ntasks-per-node={min(ranks, per_node)}",
            ]
        if gpus:
            cmd.append(f"--gpus-per-node={gpus}")
        if slurm.get("partition"):
            cmd.append(f"--partition={slurm['partition']}")
        if slurm.get("time"):
            cmd.append(f"--time={slurm['time']}")
        cmd += [str(a) for a in slurm.get("sbatch", [])] + extra
        cmd += [str(SBATCH_SCRIPT), spec_path, "--output-dir", str(out)]
        commands.append(cmd)
    return commands


def merge_command(spec: Spec, job_ids: list[str], extra: list[str]) -> list[str]:
    out = spec.output.resolve()
    wrap = f"cd {shlex.quote(str(REPO))} && " + shlex.join(
        [
            sys.executable,
            "-m",
            "ccbench.scripts.sweeps.sweep",
            str(spec.path.resolve()),
            "--output-dir",
            str(out),
            "--merged",
            str(spec.merged.resolve()),
            "--merge-only",
        ]
    )
    cmd = [
        "sbatch",
        "--parsable",
        f"--job-name=ccbench-{spec.name}-merge",
        "--ntasks=1",
        f"--output={out}/slurm/%x-%j.out",
    ]
    if job_ids:
        cmd.append("--dependency=afterany:" + ":".join(job_ids))
    if spec.slurm.get("partition"):
        cmd.append(f"--partition={spec.slurm['partition']}")
    return [*cmd, *extra, f"--wrap={wrap}"]


def submit(spec: Spec, tasks: list[Task], extra: list[str], dry_run: bool) -> int:
    if any(t.link_gbps is not None for t in tasks):
        raise UsageError(
            "link_gbps points run on the emulated cluster of one host; "
            "run them with `ccbench sweep`, not --submit"
        )
    if not SBATCH_SCRIPT.exists():
        raise UsageError(
            f"{SBATCH_SCRIPT} not found: submit from a ccbench checkout "
            "(pip install -e .), whose scripts/slurm/ the jobs run"
        )
    pending = [t for t in tasks if remaining_sizes(spec, t)]
    print(f"# {len(pending)} of {len(tasks)} tasks to run; results in {spec.output}/")
    if not pending:
        return 0
    env = {"CCBENCH_PYTHON": sys.executable, "CCBENCH_ROOT": str(REPO)}
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    (spec.output / "slurm").mkdir(parents=True, exist_ok=True)
    job_ids = []
    for cmd in [*sbatch_commands(spec, pending, extra), None]:
        if cmd is None:  # after the arrays: the merge, once they have all ended
            if dry_run:
                job_ids = ["JOBID"]
            cmd = merge_command(spec, job_ids, extra)
        print(f"{prefix} {shlex.join(cmd)}", flush=True)
        if dry_run:
            continue
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
        if proc.returncode != 0:
            raise UsageError(f"sbatch failed: {proc.stderr.strip() or proc.returncode}")
        job_ids.append(proc.stdout.strip().split(";")[0])
        print(f"# submitted job {job_ids[-1]}", flush=True)
    return 0
