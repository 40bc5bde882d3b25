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
import importlib.util
import itertools
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from ccbench.benchmarks.options import format_sizes, size_list
from ccbench.benchmarks.results import HARNESS, Sidecar, csv_files, read_rows
from ccbench.kernels.errors import UsageError
from ccbench.scripts.launch import (
    binding_enabled,
    kill_group,
    mpiexec_command,
    refuse_inside_mpi_launch,
    srun_placement_args,
)
from ccbench.scripts.merge import merge_files, schema_groups

REPO = Path(__file__).resolve().parent.parent
SBATCH_SCRIPT = REPO / "scripts" / "slurm" / "ccbench-array.sbatch"
BIND_GPU = REPO / "scripts" / "slurm" / "bind-gpu.sh"
CLUSTER_NAME = "ccbsweep"  # the emulated cluster the sweep brings up for link rates

# Spec keys with a meaning of their own; every other key of a [[points]] table is a
# variant option (a list: one task per value; a scalar: passed to every task).
RESERVED = {"variant", "ranks", "link_gbps", "sizes", "iterations", "warmup", "options"}
SWEEP_KEYS = RESERVED - {"variant"} | {"name", "output", "merge", "timeout"}
SLURM_KEYS = {"mpi", "tasks_per_node", "gpus_per_node", "partition", "time", "sbatch",
              "max_parallel"}  # fmt: skip
# A [[points]] table with variant = "compare" runs `ccbench compare` (one unsized task).
COMPARE = "compare"
# a compare table's own keys (ccbench compare's options); its other scalars go to both sides
COMPARE_OWN = ("rounds", "turns", "margin", "statistic", "ci_target", "max_rounds")
# Variants that do not sweep message sizes (no -m; their own CSV schema). A [[points]]
# table can say the same of any variant with `sizes = false`.
UNSIZED_VARIANTS = ("merged_gradient", "training")
# Axes named in the task's file name by value alone; others as key-value.
PLAIN_AXES = ("collective", "algorithm", "codec", "dtype", "buffer", "model", "strategy")


@dataclass(frozen=True)
class Task:
    """One launch of one variant: a group of points (its message sizes x configurations)."""

    index: int
    variant: str
    ranks: int
    link_gbps: float | None
    axes: tuple[tuple[str, str], ...]  # the values this task takes on the spec's lists
    args: tuple[str, ...]  # the variant's options, without --csv
    sizes: tuple[int, ...]  # empty: the variant sweeps no sizes; the task is one point
    slug: str = ""

    @property
    def points(self) -> int:
        return len(self.sizes) or 1


@dataclass
class Spec:
    path: Path
    name: str
    output: Path
    merged: Path
    timeout: float | None
    slurm: dict
    tasks: list[Task] = field(default_factory=list)


# ----------------------------------------------------------------------------- the spec


def _as_list(value, what: str) -> list:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise UsageError(f"{what}: empty list")
    return values


def option_args(key: str, value) -> list[str]:
    """A spec key and scalar value as command-line arguments: dtype = "float16" ->
    --dtype float16; a true boolean is a bare flag, a false one nothing. A quoted key that
    starts with '-' is the flag itself ("--variant" = ..., for a script option whose name
    is a reserved key)."""
    flag = key if key.startswith("-") else "--" + key.replace("_", "-")
    if isinstance(value, bool):
        return [flag] if value else []
    if isinstance(value, dict | list):
        raise UsageError(f"option {key}: nested values are not supported")
    return [flag, str(value)]


def _sanitize(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-")


def _slug(variant: str, axes, ranks: int, link: float | None) -> str:
    parts = [variant]
    for key, value in axes:
        parts.append(_sanitize(value if key in PLAIN_AXES else f"{key}-{value}"))
    parts.append(f"r{ranks}")
    if link is not None:
        parts.append(f"{link:g}gbps")
    return "_".join(parts)


def _expand_compare(table: dict, defaults: dict, where: str) -> list[dict]:
    """A `variant = "compare"` table: `ccbench compare A B` as one unsized task per value
    of its lists (collective, link rate, ranks); see docs/sweeps-slurm-regression.md."""
    from ccbench.scripts.compare import parse_side

    sides = []
    for key in ("a", "b"):
        if not isinstance(table.get(key), str):
            raise UsageError(f"{where}: a compare needs a = \"VARIANT ...\" and b = \"...\"")
        sides.append(parse_side(f"{where}: {key}", table[key])[0])
    if any(side in UNSIZED_VARIANTS for side in sides):
        # as for the unsized variants' own tasks: the sweep's iterations, warm-ups and
        # options are not theirs (training takes --steps, not -i, -x or -c)
        defaults = {k: v for k, v in defaults.items() if k in ("ranks", "link_gbps")}
    get = {**defaults, **table}.get
    own = [table["a"], table["b"], "-m", str(get("sizes", "64K:1M"))]
    for key in COMPARE_OWN:
        if key in table:
            own += option_args(key, table[key])
    common = []
    for key, flag in (("iterations", "-i"), ("warmup", "-x")):
        if get(key) is not None:
            common += [flag, str(int(get(key)))]
    axes = []
    for key, value in table.items():
        if key in RESERVED | {"a", "b", *COMPARE_OWN}:
            continue
        if isinstance(value, list):
            axes.append((key, [str(v) for v in _as_list(value, f"{where}: {key}")]))
        else:
            common += option_args(key, value)
    common += [str(a) for a in [*defaults.get("options", []), *table.get("options", [])]]
    ranks = [int(r) for r in _as_list(get("ranks", [2]), f"{where}: ranks")]
    links = [None if v in ("", None) else float(v)
             for v in _as_list(get("link_gbps") or [None], f"{where}: link_gbps")]  # fmt: skip
    out = []
    names = [k for k, _ in axes]
    for link, nranks, values in itertools.product(links, ranks,
                                                  itertools.product(*[v for _, v in axes])):
        chosen = tuple(zip(names, values, strict=True))
        args = list(common)
        for key, value in chosen:
            args += option_args(key, value)
        words = [w.lstrip("-") for w in f"{table['a']} vs {table['b']}".split()]
        label = (("cmp", _sanitize("-".join(words))[:80]),)
        out.append({"variant": COMPARE, "ranks": nranks, "link_gbps": link,
                    "axes": (*label, *((k, str(v)) for k, v in chosen)),
                    "args": (*own, "--", *args), "sizes": ()})
    return out


def _expand_table(table: dict, defaults: dict, where: str) -> list[dict]:
    if "variant" not in table or not isinstance(table["variant"], str):
        raise UsageError(f"{where}: needs variant = \"NAME\"")
    variant = table["variant"]
    if variant == COMPARE:
        return _expand_compare(table, defaults, where)
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", variant) or importlib.util.find_spec(
        f"ccbench.benchmarks.{variant}"
    ) is None:
        raise UsageError(f"{where}: no variant script benchmarks/{variant}.py")
    get = {**defaults, **table}.get
    if table.get("sizes", variant not in UNSIZED_VARIANTS) is not False:
        sizes_text = str(get("sizes", "1:1M"))
        sizes = tuple(size_list(sizes_text))
        base = ["-m", sizes_text]
        for key, flag in (("iterations", "-i"), ("warmup", "-x")):
            if get(key) is not None:
                base += [flag, str(int(get(key)))]
    else:  # the sweep's sizes, iterations, warm-ups and options are not this script's
        sizes, base = (), []
        defaults = {k: v for k, v in defaults.items() if k in ("ranks", "link_gbps")}
        for key in ("iterations", "warmup"):
            if key in table:
                base += option_args(key, table[key])
    constant, axes = [], []
    for key, value in table.items():
        if key in RESERVED:
            continue
        if isinstance(value, list):
            axes.append((key, [str(v) if not isinstance(v, bool) else v for v in
                               _as_list(value, f"{where}: {key}")]))  # fmt: skip
        else:
            constant += option_args(key, value)
    extra = [str(a) for a in [*defaults.get("options", []), *table.get("options", [])]]
    ranks = [int(r) for r in _as_list(get("ranks", [2]), f"{where}: ranks")]
    links = [None if v in ("", None) else float(v)
             for v in _as_list(get("link_gbps") or [None], f"{where}: link_gbps")]  # fmt: skip
    if any(r < 1 for r in ranks):
        raise UsageError(f"{where}: ranks must be at least 1")
    out = []
    names = [k for k, _ in axes]
    for link, nranks, values in itertools.product(links, ranks,
                                                  itertools.product(*[v for _, v in axes])):
        chosen = tuple(zip(names, values, strict=True))
        args = [*base, *constant]
        for key, value in chosen:
            args += option_args(key, value)
        out.append({"variant": variant, "ranks": nranks, "link_gbps": link,
                    "axes": tuple((k, str(v)) for k, v in chosen),
                    "args": (*args, *extra), "sizes": sizes})  # fmt: skip
    return out


def _option_pairs(args) -> set[tuple[str, ...]]:
    """'--codec fp16 -c' -> {('--codec', 'fp16'), ('-c',)}."""
    pairs, i = set(), 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("-"):
            pairs.add((args[i], args[i + 1]))
            i += 2
        else:
            pairs.add((args[i],))
            i += 1
    return pairs


def _unique_slugs(raw: list[dict]) -> list[str]:
    """File names of the tasks; tasks that differ only in constant options (two tables of
    one variant) get the options that set them apart appended, else a digest."""
    slugs = [_slug(t["variant"], t["axes"], t["ranks"], t["link_gbps"]) for t in raw]
    groups: dict[str, list[int]] = {}
    for i, slug in enumerate(slugs):
        groups.setdefault(slug, []).append(i)
    for slug, members in groups.items():
        if len(members) == 1:
            continue
        options = [_option_pairs(raw[i]["args"]) for i in members]
        shared = set.intersection(*options)
        tags = [_sanitize("-".join(p[-1].lstrip("-") for p in sorted(own - shared)))[:40]
                for own in options]  # fmt: skip
        for i, tag in zip(members, tags, strict=True):
            if not tag or tags.count(tag) > 1:
                tag = hashlib.sha1(" ".join(raw[i]["args"]).encode()).hexdigest()[:8]
            slugs[i] = f"{slug}_{tag}"
    return slugs


def load_spec(path, output: str | None = None, merged: str | None = None) -> Spec:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path}: no such sweep spec") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: not valid TOML ({e})") from None
    sweep, slurm = data.get("sweep", {}), data.get("slurm", {})
    for table, allowed, name in ((sweep, SWEEP_KEYS, "[sweep]"), (slurm, SLURM_KEYS, "[slurm]")):
        unknown = set(table) - allowed
        if unknown:
            raise UsageError(f"{path}: {name} has unknown keys {', '.join(sorted(unknown))}")
    unknown = set(data) - {"sweep", "slurm", "points"}
    if unknown:
        raise UsageError(f"{path}: unknown tables {', '.join(sorted(unknown))}")
    points = data.get("points", [])
    if not points:
        raise UsageError(f"{path}: no [[points]] tables")
    name = str(sweep.get("name", path.stem))
    out_dir = Path(output or sweep.get("output", f"results/{name}"))
    merged = Path(merged or sweep.get("merge") or out_dir.with_suffix(".csv"))
    defaults = {k: v for k, v in sweep.items() if k in RESERVED}
    timeout = float(sweep["timeout"]) if sweep.get("timeout") else None
    spec = Spec(path, name, out_dir, merged, timeout, dict(slurm))
    raw = []
    for i, table in enumerate(points):
        raw += _expand_table(table, defaults, f"{path}: [[points]] #{i + 1}")
    slugs = _unique_slugs(raw)
    if len(set(slugs)) != len(slugs):
        raise UsageError(f"{path}: two [[points]] entries describe the same task")
    spec.tasks = [Task(i, slug=s, **t) for i, (t, s) in enumerate(zip(raw, slugs, strict=True))]
    return spec


# ----------------------------------------------------------------------------- resume


def csv_path(spec: Spec, task: Task) -> Path:
    return spec.output / f"{task.slug}.csv"


def remaining_sizes(spec: Spec, task: Task) -> list:
    """The sizes of `task` still to measure, from what its CSV holds ([None] for a task
    without sizes that has not finished).

    The harness measures sizes in increasing order and appends each size's rows, and it
    records a run in `<csv>.json` only once the run has finished. So if the newest rows
    belong to a finished run, everything up to the largest size present is done; if not,
    that run was killed and its last size may lack some configurations: measure it again
    (the newer rows win when results are merged).
    """
    todo = list(task.sizes) or [None]
    path = csv_path(spec, task)
    if not path.exists():
        return todo
    _, rows = read_rows(path)
    if not rows:
        return todo
    last = rows[-1]
    finished = (last.get("run_id") or last.get("compare_id")) in _finished_runs(path)
    if not task.sizes:
        return [] if finished else todo
    largest = max(int(r["size_bytes"]) for r in rows)
    if finished:
        return [s for s in task.sizes if s > largest]
    return [s for s in task.sizes if s >= int(last["size_bytes"])]


def _finished_runs(path: Path) -> set[str]:
    return set(Sidecar(path).runs())


def resume_args(task: Task, todo: list[int]) -> list[str]:
    """The task's options with -m narrowed to the sizes still to measure."""
    args = list(task.args)
    if task.sizes and len(todo) < len(task.sizes):
        i = args.index("-m")
        args[i + 1] = format_sizes(todo)
    return args


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


def compare_command(task: Task, csv: Path, launcher: str) -> list[str]:
    """`ccbench compare` launches its ranks itself, on this host or the emulated cluster."""
    if launcher == "srun":
        raise UsageError(f"task {task.index} ({task.slug}): compare tasks run on local "
                         "ranks or the emulated cluster, not as SLURM array tasks")
    i = task.args.index("--")
    where = ["--cluster", CLUSTER_NAME] if task.link_gbps is not None else []
    unbound = [] if binding_enabled() else ["--no-bind"]
    return [sys.executable, "-m", "ccbench.scripts.compare", *task.args[:i], "-n",
            str(task.ranks), *where, *unbound, "--csv", str(csv), *task.args[i:]]


def launch_command(spec: Spec, task: Task, args: list[str], csv: Path, launcher: str) -> list[str]:
    if task.variant == COMPARE:
        return compare_command(task, csv, launcher)
    command = variant_command(task, args, csv)
    if task.link_gbps is not None:
        unbound = [] if binding_enabled() else ["--no-bind"]
        return [sys.executable, "-m", "ccbench.scripts.cluster", "run", "--name", CLUSTER_NAME,
                "-n", str(task.ranks), *unbound, "--", *command]  # fmt: skip
    if launcher == "srun":
        mpi, _ = srun_mpi(spec)
        srun = ["srun", f"--mpi={mpi}", *srun_placement_args(), "-n", str(task.ranks),
                *shlex.split(os.environ.get("CCBENCH_SRUN_ARGS", ""))]  # fmt: skip
        if int(spec.slurm.get("gpus_per_node", 0)) > 0:
            srun.append(str(BIND_GPU))
        return [*srun, *command]
    return mpiexec_command(task.ranks, command)


def srun_mpi(spec: Spec) -> tuple[str, str]:
    """srun's --mpi for the tasks, and where it came from: CCBENCH_SRUN_MPI, else the
    spec's [slurm] mpi, else pmix where it works in this allocation and pmi2 otherwise
    (Debian's SLURM lists pmix but has no PMIx library; the MPICH wheel speaks PMI-2)."""
    if os.environ.get("CCBENCH_SRUN_MPI"):
        return os.environ["CCBENCH_SRUN_MPI"], "from CCBENCH_SRUN_MPI"
    if spec.slurm.get("mpi"):
        return str(spec.slurm["mpi"]), f"from [slurm] mpi of {spec.path.name}"
    return _probe_srun_mpi()


_SRUN_MPI: list[tuple[str, str]] = []  # the probe's answer, once per process


def _probe_srun_mpi() -> tuple[str, str]:
    if _SRUN_MPI:
        return _SRUN_MPI[0]
    try:
        listed = subprocess.run(["srun", "--mpi=list"], capture_output=True, text=True,
                                timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip
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
            probe = subprocess.run(["srun", "--mpi=pmix", "-n", "1", "true"], capture_output=True,
                                   text=True, timeout=60, stdin=subprocess.DEVNULL)
            status, tail = probe.returncode, (probe.stderr.strip().splitlines() or [""])[-1]
        except (OSError, subprocess.TimeoutExpired) as e:
            status, tail = 1, str(e)
        answer = (("pmix", "srun --mpi=list offers pmix and a test step with it ran")
                  if status == 0 else
                  ("pmi2", f"srun --mpi=pmix lists but fails here ({tail.strip()})"))
    _SRUN_MPI.append(answer)
    return answer


def _cluster(action: str, *args: str) -> None:
    cmd = [sys.executable, "-m", "ccbench.scripts.cluster", action, "--name", CLUSTER_NAME, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        raise UsageError(f"`ccbench cluster {action}` failed: {tail[-1] if tail else '?'}")


def _osu_size(line: str) -> str | None:
    """The size of an OSU result line ('65536   12.3 ...'), None for other lines."""
    first = line.split(maxsplit=1)[0] if line.strip() else ""
    return first if first.isdigit() else None


def run_task(cmd: list[str], log: Path, timeout: float | None, echo: bool, on_row,
             note: str | None = None) -> int:
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
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=dict(os.environ), start_new_session=True)  # fmt: skip
        timed_out = threading.Event()

        def on_timeout():
            timed_out.set()
            kill_group(proc)

        timer = threading.Timer(timeout, on_timeout) if timeout else None
        if timer:
            timer.start()
        try:
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
            kill_group(proc)  # Ctrl-C or a signal: never leave ranks running
            raise
        finally:
            if timer:
                timer.cancel()
        if timed_out.is_set():
            f.write(f"ccbench sweep: killed after {timeout:g} s\n")
            return 124
    return status


# ----------------------------------------------------------------------------- progress


class Progress:
    """Points and tasks done, failures, time left: a tqdm bar on a terminal, and one log
    line per finished task when stderr is not a terminal (CI, SLURM output files)."""

    def __init__(self, total_points: int, total_tasks: int, stream=sys.stderr):
        from tqdm import tqdm

        self.total, self.tasks_total = total_points, total_tasks
        self.done = self.tasks_done = self.tasks_failed = 0
        self.measured = 0  # points measured by this process: the rate for the time left
        self.start = time.monotonic()
        self.stream = stream
        self.bar = tqdm(total=total_points, unit="point", file=stream, dynamic_ncols=True,
                        disable=None, leave=True, desc="sweep")
        self.tty = not self.bar.disable
        self.label = ""

    def _advance(self, points: int) -> None:
        points = max(0, min(points, self.total - self.done))
        self.done += points
        self.bar.update(points)  # a no-op when the bar is off

    def skipped(self, points: int) -> None:
        """Points found in the output already."""
        self._advance(points)

    def point(self) -> None:
        self.measured += 1
        self._advance(1)

    def task_done(self, points_not_seen: int = 0, failed: bool = False) -> None:
        # sizes a variant skips (too small for the ranks) print no row
        self._advance(points_not_seen)
        self.tasks_done += 1
        self.tasks_failed += int(failed)
        self.draw(final=not self.tty)

    def line(self) -> str:
        elapsed = time.monotonic() - self.start
        left = _clock(elapsed / self.measured * (self.total - self.done)) if self.measured else "?"
        failed = f", {self.tasks_failed} failed" if self.tasks_failed else ""
        return (f"sweep: {self.done}/{self.total} points, {self.tasks_done}/{self.tasks_total} "
                f"tasks{failed}, {_clock(elapsed)} elapsed, ~{left} left  {self.label}")

    def draw(self, final: bool = False) -> None:
        if self.tty:
            failed = f", {self.tasks_failed} failed" if self.tasks_failed else ""
            self.bar.set_postfix_str(f"{self.tasks_done}/{self.tasks_total} tasks{failed} "
                                     f"{self.label}")
        elif final:
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def close(self) -> None:
        self.bar.close()


class RowCounter:
    """Advances the bar once per new size in the OSU result lines (a variant with
    configurations prints several lines per size), at most once per size of the task."""

    def __init__(self, progress: Progress, sizes: int):
        self.progress, self.sizes, self.counted, self.last = progress, sizes, 0, None

    def __call__(self, size: str) -> None:
        if size != self.last and self.counted < self.sizes:
            self.last = size
            self.counted += 1
            self.progress.point()


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


# ----------------------------------------------------------------------------- running


def run_sweep(spec: Spec, selected: list[Task], launcher: str, echo: bool, fail_fast: bool,
              progress_stream=sys.stderr) -> tuple[list[Task], list[Task]]:  # fmt: skip
    """Run the tasks that still have sizes to measure. Returns (failed, validation_failed)."""
    spec.output.mkdir(parents=True, exist_ok=True)
    todo = {t.index: remaining_sizes(spec, t) for t in selected}
    # link-rate tasks last, grouped by rate, so the emulated cluster is rebuilt rarely
    order = sorted(selected, key=lambda t: (t.link_gbps is not None, t.link_gbps or 0, t.index))
    progress = Progress(sum(t.points for t in selected), len(selected), progress_stream)
    failed, invalid = [], []
    cluster_shape = None
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
            progress.draw()
            if task.link_gbps is not None:
                shape = (task.link_gbps, max(t.ranks for t in order
                                             if t.link_gbps == task.link_gbps))  # fmt: skip
                if shape != cluster_shape:
                    _cluster("up", "--ranks", str(shape[1]), "--rate", f"{shape[0]:g}gbit")
                    cluster_shape = shape
            csv = csv_path(spec, task).resolve()
            cmd = launch_command(spec, task, resume_args(task, sizes), csv, launcher)
            rows = RowCounter(progress, len(sizes) if task.sizes else 0)
            note = None
            if launcher == "srun" and cmd[0] == "srun":
                mpi, why = srun_mpi(spec)
                note = f"# srun --mpi={mpi}: {why}"
            status = run_task(cmd, spec.output / "logs" / f"{task.slug}.log", spec.timeout,
                              echo, rows, note)  # fmt: skip
            finished = not remaining_sizes(spec, task)
            if status == 1 and finished:
                invalid.append(task)  # finished; some sizes failed validation
            elif status != 0:
                failed.append(task)
            # a failed task's missing points are not progress: they stay to do
            progress.task_done(len(sizes) - rows.counted if status == 0 or finished else 0,
                               failed=status != 0 and not (status == 1 and finished))
            if failed and fail_fast:
                break
    finally:
        progress.close()
        if cluster_shape is not None:
            _cluster("down")
    if not ran and echo:
        print(f"ccbench sweep: nothing to do: the {progress.total} points of "
              f"{len(selected)} task(s) are already in {spec.output} (--rerun measures "
              "them again)", file=sys.stderr)
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
        cmd = launch_command(spec, task, resume_args(task, todo or list(task.sizes)),
                             csv_path(spec, task), launcher)  # fmt: skip
        print(f"{task.index:4d}  {state:7s}  {task.slug}\n      {shlex.join(cmd)}")


# ----------------------------------------------------------------------------- SLURM


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
        cmd = ["sbatch", "--parsable", f"--job-name=ccbench-{spec.name}",
               f"--array={ids}{limit}", f"--ntasks={ranks}",
               f"--output={out}/slurm/%x-%A_%a.out"]  # fmt: skip
        if per_node:
            cmd += [f"--nodes={math.ceil(ranks / per_node)}",
                    f"--ntasks-per-node={min(ranks, per_node)}"]
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
        [sys.executable, "-m", "ccbench.scripts.sweep", str(spec.path.resolve()), "--output-dir",
         str(out), "--merged", str(spec.merged.resolve()), "--merge-only"]
    )
    cmd = ["sbatch", "--parsable", f"--job-name=ccbench-{spec.name}-merge", "--ntasks=1",
           f"--output={out}/slurm/%x-%j.out"]  # fmt: skip
    if job_ids:
        cmd.append("--dependency=afterany:" + ":".join(job_ids))
    if spec.slurm.get("partition"):
        cmd.append(f"--partition={spec.slurm['partition']}")
    return [*cmd, *extra, f"--wrap={wrap}"]


def submit(spec: Spec, tasks: list[Task], extra: list[str], dry_run: bool) -> int:
    if any(t.link_gbps is not None for t in tasks):
        raise UsageError("link_gbps points run on the emulated cluster of one host; "
                         "run them with `ccbench sweep`, not --submit")  # fmt: skip
    if not SBATCH_SCRIPT.exists():
        raise UsageError(f"{SBATCH_SCRIPT} not found: submit from a ccbench checkout "
                         "(pip install -e .), whose scripts/slurm/ the jobs run")  # fmt: skip
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


# ----------------------------------------------------------------------------- entry


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ccbench sweep",
        description="Run a sweep spec (TOML): every task once, skipping what the output "
                    "already holds.",
    )  # fmt: skip
    p.add_argument("spec", type=Path, help="sweep spec, e.g. sweeps/local.toml")
    p.add_argument("-o", "--output-dir", help="folder of per-task CSVs (default: the spec's)")
    p.add_argument("--merged", metavar="CSV",
                   help="merged CSV to write (default: the spec's merge, else OUTPUT_DIR.csv)")
    p.add_argument("--list", action="store_true", help="list tasks, their state and commands")
    p.add_argument("--dry-run", action="store_true", help="print commands, run nothing")
    p.add_argument("--task", metavar="I[-J],...", help="run only these task indices")
    p.add_argument("--launcher", choices=("mpiexec", "srun"), default="mpiexec",
                   help="mpiexec (local ranks, default) or srun (inside a SLURM allocation; "
                        "--mpi from [slurm] mpi or CCBENCH_SRUN_MPI)")  # fmt: skip
    p.add_argument("--rerun", action="store_true",
                   help="delete the selected tasks' results first and measure them again")
    p.add_argument("--no-merge", action="store_true",
                   help="do not write the merged CSV at the end")
    p.add_argument("--merge-only", action="store_true",
                   help="only merge what the output folder holds (the SLURM merge job)")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failed task")
    p.add_argument("-v", "--verbose", action="store_true", help="show the variants' output")
    p.add_argument("--no-bind", action="store_true",
                   help="leave ranks unbound (default: bound to cores, -bind-to core / "
                        "--cpu-bind=cores; also CCBENCH_BIND=0)")
    p.add_argument("--submit", action="store_true",
                   help="submit the pending tasks to SLURM as job arrays (see --dry-run)")
    p.add_argument("--sbatch-arg", action="append", default=[], metavar="ARG",
                   help="extra sbatch argument for --submit, e.g. --sbatch-arg=--account=X")
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
        if opts.rerun and not opts.dry_run:
            for t in tasks:
                for path in (csv_path(spec, t), Path(f"{csv_path(spec, t)}.json")):
                    path.unlink(missing_ok=True)
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
        print("\nccbench sweep: interrupted; finished tasks are kept, rerun to resume",
              file=sys.stderr)  # fmt: skip
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


def report(spec: Spec, failed: list[Task], invalid: list[Task],
           merge_only: bool = False) -> None:
    logs = f"{spec.output}/slurm/" if merge_only else None
    for task in invalid:
        print(f"ccbench sweep: validation failed in task {task.index} {task.slug} "
              f"(see {logs or f'{spec.output}/logs/{task.slug}.log'})",
              file=sys.stderr)  # fmt: skip
    for task in failed:
        what = "did not finish" if merge_only else "failed"
        print(f"ccbench sweep: task {task.index} {task.slug} {what}; "
              f"see {logs or f'{spec.output}/logs/{task.slug}.log'}",
              file=sys.stderr)  # fmt: skip

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
