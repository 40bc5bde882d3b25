"""`ccbench sweep SPEC`: run a TOML sweep spec, resumably, on local ranks or under SLURM.

A spec names variants x collectives x codecs x ... x rank counts x link rates. Each
combination is one *task*: one launch of a variant script over the spec's message-size
range, writing its own CSV `<output>/<task>.csv` (the harness appends one row per size and
configuration, atomically). Rerunning the spec skips what is already in the output: a task
whose sizes are all there is skipped, a task killed half-way restarts at the size it was
measuring. See docs/sweeps-slurm-regression.md for the spec format.

    ccbench sweep sweeps/local.toml              # run every task on local ranks
    ccbench sweep sweeps/local.toml --list       # tasks, their state and commands
    ccbench sweep SPEC --task 3 --launcher srun  # one task, inside a SLURM allocation
    ccbench sweep SPEC --submit [--dry-run]      # a SLURM job array per rank count
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ccbench.benchmarks.options import add_no_bind
from ccbench.benchmarks.results import HARNESS, csv_files, read_rows, remove
from ccbench.benchmarks.switches import read as read_switches
from ccbench.kernels.errors import UsageError
from ccbench.scripts.launchers import (
    binding_enabled,
    kill_group,
    mpiexec_command,
    refuse_inside_mpi_launch,
    srun_placement_args,
)
from ccbench.scripts.process_tree import stops_deferred
from ccbench.scripts.sweeps.merge import merge_files, schema_groups
from ccbench.scripts.sweeps.progress_report import (
    Progress,
    RowCounter,
    read_costs,
    record_cost,
)
from ccbench.scripts.sweeps.slurm import BIND_GPU, srun_mpi, submit
from ccbench.scripts.sweeps.tasks import (
    COMPARE,
    Spec,
    Task,
    csv_path,
    load_spec,
    remaining_sizes,
    resume_args,
)


def cluster_name(spec: Spec) -> str:
    """The emulated cluster this sweep brings up for its link rates: named after its
    output folder, so two sweeps into different folders, run at once, never take each
    other's cluster down (a cluster name: 8 lower-case letters or digits)."""
    folder = str(spec.output.resolve())
    return "cs" + hashlib.sha1(folder.encode()).hexdigest()[:6]


def sweep_id(spec: Spec, fresh: bool) -> str:
    """The id every row of this sweep's output carries (`sweep_id`): kept in the output
    folder, so a resumed sweep is still one run; a new one when all is measured again."""
    path = spec.output / ".sweep-id"
    if not fresh and path.exists() and path.read_text().strip():
        return path.read_text().strip()
    now = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    value = f"{spec.name}-{now}-{hashlib.sha1(os.urandom(8)).hexdigest()[:6]}"
    spec.output.mkdir(parents=True, exist_ok=True)
    path.write_text(value + "\n")
    return value


# ----------------------------------------------------------------------------- launching


def variant_command(task: Task, args: list[str], csv: Path) -> list[str]:
    return [sys.executable, "-m", f"ccbench.benchmarks.{task.variant}", *args, "--csv", str(csv)]


def compare_command(spec: Spec, task: Task, csv: Path, launcher: str) -> list[str]:
    """`ccbench compare` launches its ranks itself, on this host or the emulated cluster."""
    if launcher == "srun":
        raise UsageError(
            f"task {task.index} ({task.slug}): compare tasks run on local "
            "ranks or the emulated cluster, not as SLURM array tasks"
        )
    i = task.args.index("--")
    where = ["--cluster", cluster_name(spec)] if task.link_gbps is not None else []
    unbound = [] if binding_enabled() else ["--no-bind"]
    return [
        sys.executable,
        "-m",
        "ccbench.scripts.comparisons.compare",
        *task.args[:i],
        "-n",
        str(task.ranks),
        *where,
        *unbound,
        "--csv",
        str(csv),
        *task.args[i:],
    ]


def launch_command(spec: Spec, task: Task, args: list[str], csv: Path, launcher: str) -> list[str]:
    if task.variant == COMPARE:
        return compare_command(spec, task, csv, launcher)
    command = variant_command(task, args, csv)
    if task.link_gbps is not None:
        unbound = [] if binding_enabled() else ["--no-bind"]
        return [
            sys.executable,
            "-m",
            "ccbench.scripts.cluster",
            "run",
            "--name",
            cluster_name(spec),
            "-n",
            str(task.ranks),
            *unbound,
            "--",
            *command,
        ]
    if launcher == "srun":
        mpi, _ = srun_mpi(spec)
        srun = [
            "srun",
            f"--mpi={mpi}",
            *srun_placement_args(),
            "-n",
            str(task.ranks),
            *shlex.split(read_switches().srun_args),
        ]
        if int(spec.slurm.get("gpus_per_node", 0)) > 0:
            srun.append(str(BIND_GPU))
        return [*srun, *command]
    return mpiexec_command(task.ranks, command)


def _cluster(name: str, action: str, *args: str) -> None:
    cmd = [sys.executable, "-m", "ccbench.scripts.cluster", action, "--name", name, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        raise UsageError(f"`ccbench cluster {action}` failed: {tail[-1] if tail else '?'}")


def _osu_size(line: str) -> str | None:
    """The size of an OSU result line ('65536   12.3 ...'), None for other lines."""
    first = line.split(maxsplit=1)[0] if line.strip() else ""
    return first if first.isdigit() else None


def run_task(
    cmd: list[str], log: Path, timeout: float | None, echo: bool, on_row, note: str | None = None
) -> int:
    """Run one task, its output to `log` (and the terminal with `echo`); call on_row(size)
    for each OSU result line. `note` is a line said before the output. Returns the exit
    status (124 on timeout)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        if note:
            f.write(note + "\n")
            if echo:
                print(note, flush=True)
        f.flush()
        timed_out = threading.Event()
        proc = timer = None

        def on_timeout():
            timed_out.set()
            kill_group(proc)

        try:
            with stops_deferred():  # a stop that comes now finds `proc` held
                proc = subprocess.Popen(
                    cmd,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env=dict(os.environ),
                    start_new_session=True,
                )
            timer = threading.Timer(timeout, on_timeout) if timeout else None
            if timer:
                timer.start()
            for line in proc.stdout:
                f.write(line)
                if echo:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                size = _osu_size(line)
                if size is not None:
                    on_row(size)
            status = proc.wait()
        except BaseException:
            if proc is not None:
                kill_group(proc)  # Ctrl-C or a signal: never leave ranks running
            raise
        finally:
            if timer:
                timer.cancel()
        if timed_out.is_set():
            f.write(f"ccbench sweep: killed after {timeout:g} s\n")
            return 124
    return status


# ----------------------------------------------------------------------------- running


def run_sweep(
    spec: Spec,
    selected: list[Task],
    launcher: str,
    echo: bool,
    fail_fast: bool,
    progress_stream=sys.stderr,
) -> tuple[list[Task], list[Task]]:
    """Run the tasks that still have sizes to measure. Returns (failed, validation_failed)."""
    spec.output.mkdir(parents=True, exist_ok=True)
    todo = {t.index: remaining_sizes(spec, t) for t in selected}
    # link-rate tasks last, grouped by rate, so the emulated cluster is rebuilt rarely
    order = sorted(selected, key=lambda t: (t.link_gbps is not None, t.link_gbps or 0, t.index))
    # a task's cost on an idle host: what it took when this output folder last ran it,
    # else what the spec declares
    recorded = read_costs(spec.output)
    plan = [(t.kind, recorded.get(t.slug, t.cost_s)) for t in order if todo[t.index]]
    progress = Progress(sum(t.points for t in selected), len(selected), progress_stream, plan)
    failed, invalid = [], []
    cluster_shape = None
    cluster = cluster_name(spec)
    ran = 0
    try:
        for task in order:
            sizes = todo[task.index]
            progress.skipped(task.points - len(sizes))
            if not sizes:
                progress.tasks_done += 1
                continue
            ran += 1
            progress.label = task.slug
            progress.task_started_now()
            progress.draw()
            if task.link_gbps is not None:
                shape = (
                    task.link_gbps,
                    max(t.ranks for t in order if t.link_gbps == task.link_gbps),
                )
                if shape != cluster_shape:
                    m = spec.ranks_per_node
                    layout = (
                        ["--nodes", str(shape[1] // m), "--ranks-per-node", str(m)]
                        if m > 1
                        else ["--ranks", str(shape[1])]
                    )
                    _cluster(cluster, "up", *layout, "--rate", f"{shape[0]:g}gbit")
                    # the floor's fixed cost per step; with nodes, both levels (the rate
                    # inside a node is the hierarchical rows' intra-node floor)
                    _cluster(cluster, "selfcheck", *([] if m > 1 else ["--step-only"]))
                    cluster_shape = shape
            csv = csv_path(spec, task).resolve()
            cmd = launch_command(spec, task, resume_args(task, sizes), csv, launcher)
            rows = RowCounter(progress, len(sizes) if task.sizes else 0)
            note = None
            if launcher == "srun" and cmd[0] == "srun":
                mpi, why = srun_mpi(spec)
                note = f"# srun --mpi={mpi}: {why}"
            elif task.link_gbps is not None:
                note = (
                    f"# emulated cluster {cluster} ({task.link_gbps:g} Gbit/s): this sweep's "
                    "own, taken down when the sweep ends"
                )
            status = run_task(
                cmd, spec.output / "logs" / f"{task.slug}.log", spec.timeout, echo, rows, note
            )
            finished = not remaining_sizes(spec, task)
            if status == 1 and finished:
                invalid.append(task)  # finished; some sizes failed validation
            elif status != 0:
                failed.append(task)
            # a failed task's missing points are not progress: they stay to do
            progress.task_done(
                len(sizes) - rows.counted if status == 0 or finished else 0,
                failed=status != 0 and not (status == 1 and finished),
            )
            if finished and len(sizes) == task.points and progress.last_task:
                record_cost(spec.output, task.slug, *progress.last_task)
            if failed and fail_fast:
                break
    finally:
        progress.close()
        if cluster_shape is not None:
            _cluster(cluster, "down")
    if not ran and echo:
        print(
            f"ccbench sweep: nothing to do: the {progress.total} points of "
            f"{len(selected)} task(s) are already in {spec.output} (--rerun measures "
            "them again)",
            file=sys.stderr,
        )
    return failed, invalid


def merge_outputs(spec: Spec) -> list[tuple[Path, dict]]:
    """Merge the task CSVs: micro-benchmark rows into spec.merged; the files of a script
    with its own schema (merged_gradient, training) into `<merged stem>-<script>.csv`."""
    files = csv_files([spec.output]) if spec.output.is_dir() else []
    script = {csv_path(spec, t).resolve(): t.variant for t in spec.tasks}
    done = []
    for kind, paths in schema_groups(files).items():
        if kind == HARNESS.kind:
            out = spec.merged
        else:
            name = script.get(paths[0].resolve(), paths[0].stem)
            out = spec.merged.with_name(f"{spec.merged.stem}-{name}.csv")
            if any(out == o for o, _ in done):  # the same script with two schemas
                out = out.with_name(f"{out.stem}-{len(done)}.csv")
        done.append((out, merge_files(paths, out)))
    return done


def _select(spec: Spec, text: str | None) -> list[Task]:
    if text is None:
        return spec.tasks
    chosen = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise UsageError(f"--task {text!r}: use indices like 3 or 0-4,7") from None
        if not 0 <= first <= last < len(spec.tasks):
            raise UsageError(f"--task {part}: the spec has tasks 0..{len(spec.tasks) - 1}")
        chosen += spec.tasks[first : last + 1]
    return chosen


def list_tasks(spec: Spec, launcher: str) -> None:
    for task in spec.tasks:
        todo = remaining_sizes(spec, task)
        state = "done" if not todo else ("partial" if len(todo) < task.points else "todo")
        cmd = launch_command(
            spec, task, resume_args(task, todo or list(task.sizes)), csv_path(spec, task), launcher
        )
        print(f"{task.index:4d}  {state:7s}  {task.slug}\n      {shlex.join(cmd)}")


# ----------------------------------------------------------------------------- entry


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ccbench sweep",
        description="Run a sweep spec (TOML): every task once, skipping what the output "
        "already holds.",
    )
    p.add_argument("spec", type=Path, help="sweep spec, e.g. sweeps/local.toml")
    p.add_argument("-o", "--output-dir", help="folder of per-task CSVs (default: the spec's)")
    p.add_argument(
        "--merged",
        metavar="CSV",
        help="merged CSV to write (default: the spec's merge, else OUTPUT_DIR.csv)",
    )
    p.add_argument("--list", action="store_true", help="list tasks, their state and commands")
    p.add_argument("--dry-run", action="store_true", help="print commands, run nothing")
    p.add_argument("--task", metavar="I[-J],...", help="run only these task indices")
    p.add_argument(
        "--launcher",
        choices=("mpiexec", "srun"),
        default="mpiexec",
        help="mpiexec (local ranks, default) or srun (inside a SLURM allocation; "
        "--mpi from [slurm] mpi or CCBENCH_SRUN_MPI)",
    )
    p.add_argument(
        "--rerun",
        action="store_true",
        help="delete the selected tasks' results first and measure them again",
    )
    p.add_argument("--no-merge", action="store_true", help="do not write the merged CSV at the end")
    p.add_argument(
        "--merge-only",
        action="store_true",
        help="only merge what the output folder holds (the SLURM merge job)",
    )
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failed task")
    p.add_argument(
        "--no-links",
        action="store_true",
        help="leave out the tasks on emulated links (where no cluster can be "
        "built: no root and no unprivileged user namespaces)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="show the variants' output")
    add_no_bind(p)
    p.add_argument(
        "--submit",
        action="store_true",
        help="submit the pending tasks to SLURM as job arrays (see --dry-run)",
    )
    p.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra sbatch argument for --submit, e.g. --sbatch-arg=--account=X",
    )
    return p


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str]) -> int:
    refuse_inside_mpi_launch("ccbench sweep")
    opts = build_parser().parse_args(argv)
    if opts.no_bind:
        os.environ["CCBENCH_BIND"] = "0"  # read by every launcher this sweep builds
    # scancel and kill send SIGTERM: stop the running task's ranks too, keep finished files
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    try:
        spec = load_spec(opts.spec, opts.output_dir, opts.merged)
        tasks = _select(spec, opts.task)
        if opts.no_links:
            left = [t for t in tasks if t.link_gbps is not None]
            tasks = [t for t in tasks if t.link_gbps is None]
            if left:
                print(
                    f"ccbench sweep: {len(left)} task(s) on emulated links left out (--no-links)",
                    file=sys.stderr,
                )
        if opts.rerun and not opts.dry_run:
            for t in tasks:
                remove(csv_path(spec, t))
        if not (opts.list or opts.dry_run or opts.submit or opts.merge_only):
            fresh = opts.rerun and opts.task is None
            os.environ["CCBENCH_SWEEP_ID"] = sweep_id(spec, fresh)
        if opts.submit:
            return submit(spec, tasks, opts.sbatch_arg, opts.dry_run)
        if opts.list or opts.dry_run:
            list_tasks(spec, opts.launcher)
            return 0
        if opts.merge_only:  # the SLURM merge job: the array tasks have ended, somehow
            failed, invalid = outcomes(spec, tasks)
        else:
            echo = opts.verbose or opts.task is not None  # an array task logs to SLURM's file
            failed, invalid = run_sweep(spec, tasks, opts.launcher, echo, opts.fail_fast)
        report(spec, failed, invalid, merge_only=opts.merge_only)
        if opts.task is None and not opts.no_merge:
            for out, s in merge_outputs(spec):
                print(f"ccbench sweep: {s['rows_written']} rows in {out}")
    except UsageError as e:
        print(f"ccbench sweep: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `--list | head`
        sys.stdout = open(os.devnull, "w")  # silence the flush at exit
        return 0
    except KeyboardInterrupt:
        print(
            "\nccbench sweep: interrupted; finished tasks are kept, rerun to resume",
            file=sys.stderr,
        )
        return 130
    return 1 if failed or invalid else 0


def outcomes(spec: Spec, tasks: list[Task]) -> tuple[list[Task], list[Task]]:
    """(tasks whose results are incomplete, finished tasks with a row that failed
    validation), read from the output folder alone: what the SLURM merge job, which ran
    none of them, can tell."""
    failed, invalid = [], []
    for task in tasks:
        if remaining_sizes(spec, task):
            failed.append(task)
            continue
        _, rows = read_rows(csv_path(spec, task))
        if any(str(r.get("validation") or "").startswith("Fail") for r in rows):
            invalid.append(task)
    return failed, invalid


def report(spec: Spec, failed: list[Task], invalid: list[Task], merge_only: bool = False) -> None:
    logs = f"{spec.output}/slurm/" if merge_only else None
    for task in invalid:
        print(
            f"ccbench sweep: validation failed in task {task.index} {task.slug} "
            f"(see {logs or f'{spec.output}/logs/{task.slug}.log'})",
            file=sys.stderr,
        )
    for task in failed:
        what = "did not finish" if merge_only else "failed"
        print(
            f"ccbench sweep: task {task.index} {task.slug} {what}; "
            f"see {logs or f'{spec.output}/logs/{task.slug}.log'}",
            file=sys.stderr,
        )


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
