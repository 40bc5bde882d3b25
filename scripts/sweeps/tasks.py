"""A sweep spec (TOML): its tasks, expanded from the [[points]] tables, and what of each
task its output already holds (so a rerun resumes).

A spec names variants x collectives x codecs x ... x rank counts x link rates. Each
combination is one *task*: one launch of a variant over the spec's message sizes, whose
results go to `<output>/<task slug>.csv`. See docs/sweeps-slurm-regression.md.
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from ccbench.benchmarks.options import format_sizes, size_list
from ccbench.benchmarks.results import Sidecar, Table, point_identity, read_rows, read_table
from ccbench.kernels import variants
from ccbench.kernels.errors import UsageError

# Spec keys with a meaning of their own; every other key of a [[points]] table is a
# variant option (a list: one task per value; a scalar: passed to every task).
# cost_s: a task's declared time in seconds (what it took on a 2-core host), for the
# sweep's time-left estimate until a task of its kind has been measured
RESERVED = {"variant", "ranks", "link_gbps", "sizes", "iterations", "warmup", "options", "cost_s"}
# ranks_per_node: the emulated cluster's ranks per node (namespace) for link_gbps tasks
SWEEP_KEYS = RESERVED - {"variant"} | {"name", "output", "merge", "timeout", "ranks_per_node"}
SLURM_KEYS = {
    "mpi",
    "tasks_per_node",
    "gpus_per_node",
    "partition",
    "time",
    "sbatch",
    "max_parallel",
}
# A [[points]] table with variant = "compare" runs `ccbench compare` (one unsized task).
COMPARE = "compare"
# a compare table's own keys (ccbench compare's options); its other scalars go to both sides
COMPARE_OWN = ("rounds", "turns", "margin", "statistic", "ci_target", "max_rounds")
# Variants that do not sweep message sizes (no -m; their own CSV schema). A [[points]]
# table can say the same of any variant with `sizes = false`.
UNSIZED_VARIANTS = variants.UNSIZED
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
    cost_s: float | None = None  # declared seconds (the spec's cost_s), for the estimate

    @property
    def kind(self) -> tuple:
        """Tasks that cost alike: the variant (a comparison's: its first side's), and
        whether it runs on emulated links."""
        variant = self.args[0].split()[0] if self.variant == "compare" else self.variant
        return self.variant, variant, self.link_gbps is not None

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
    ranks_per_node: int = 1  # the emulated cluster's layout for the link_gbps tasks


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
    from ccbench.scripts.comparisons.rounds import parse_side

    sides = []
    for key in ("a", "b"):
        if not isinstance(table.get(key), str):
            raise UsageError(f'{where}: a compare needs a = "VARIANT ..." and b = "..."')
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
    links = [
        None if v in ("", None) else float(v)
        for v in _as_list(get("link_gbps") or [None], f"{where}: link_gbps")
    ]
    out = []
    names = [k for k, _ in axes]
    for link, nranks, values in itertools.product(
        links, ranks, itertools.product(*[v for _, v in axes])
    ):
        chosen = tuple(zip(names, values, strict=True))
        args = list(common)
        for key, value in chosen:
            args += option_args(key, value)
        words = [w.lstrip("-") for w in f"{table['a']} vs {table['b']}".split()]
        label = (("cmp", _sanitize("-".join(words))[:80]),)
        out.append(
            {
                "variant": COMPARE,
                "ranks": nranks,
                "link_gbps": link,
                "axes": (*label, *((k, str(v)) for k, v in chosen)),
                "args": (*own, "--", *args),
                "sizes": (),
            }
        )
    return out


def _expand_table(table: dict, defaults: dict, where: str) -> list[dict]:
    cost = table.get("cost_s", defaults.get("cost_s"))
    if cost is not None and not (isinstance(cost, (int, float)) and cost > 0):
        raise UsageError(f"{where}: cost_s must be a positive number of seconds")
    return [
        dict(entry, cost_s=None if cost is None else float(cost))
        for entry in _expand_points(table, defaults, where)
    ]


def _expand_points(table: dict, defaults: dict, where: str) -> list[dict]:
    if "variant" not in table or not isinstance(table["variant"], str):
        raise UsageError(f'{where}: needs variant = "NAME"')
    variant = table["variant"]
    if variant == COMPARE:
        return _expand_compare(table, defaults, where)
    if (
        not re.fullmatch(r"[a-z_][a-z0-9_]*", variant)
        or importlib.util.find_spec(f"ccbench.benchmarks.{variant}") is None
    ):
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
            axes.append(
                (
                    key,
                    [
                        str(v) if not isinstance(v, bool) else v
                        for v in _as_list(value, f"{where}: {key}")
                    ],
                )
            )
        else:
            constant += option_args(key, value)
    extra = [str(a) for a in [*defaults.get("options", []), *table.get("options", [])]]
    ranks = [int(r) for r in _as_list(get("ranks", [2]), f"{where}: ranks")]
    links = [
        None if v in ("", None) else float(v)
        for v in _as_list(get("link_gbps") or [None], f"{where}: link_gbps")
    ]
    if any(r < 1 for r in ranks):
        raise UsageError(f"{where}: ranks must be at least 1")
    out = []
    names = [k for k, _ in axes]
    for link, nranks, values in itertools.product(
        links, ranks, itertools.product(*[v for _, v in axes])
    ):
        chosen = tuple(zip(names, values, strict=True))
        args = [*base, *constant]
        for key, value in chosen:
            args += option_args(key, value)
        out.append(
            {
                "variant": variant,
                "ranks": nranks,
                "link_gbps": link,
                "axes": tuple((k, str(v)) for k, v in chosen),
                "args": (*args, *extra),
                "sizes": sizes,
            }
        )
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
        tags = [
            _sanitize("-".join(p[-1].lstrip("-") for p in sorted(own - shared)))[:40]
            for own in options
        ]
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
    m = sweep.get("ranks_per_node", 1)
    if not isinstance(m, int) or m < 1:
        raise UsageError(f"{path}: [sweep] ranks_per_node must be a positive integer")
    uneven = [t.slug for t in spec.tasks if t.link_gbps is not None and t.ranks % m]
    if uneven:
        raise UsageError(f"{path}: task {uneven[0]}: its ranks do not make whole nodes of {m}")
    spec.ranks_per_node = m
    return spec


def csv_path(spec: Spec, task: Task) -> Path:
    return spec.output / f"{task.slug}.csv"


def remaining_sizes(spec: Spec, task: Task) -> list:
    """The sizes of `task` still to measure, from what its CSV holds ([None] for a task
    without sizes that has not finished).

    Only the task's own rows count: those whose point (`results.point_identity`) agrees
    with the task on every setting it fixes (`task_settings`); a row of another
    configuration in the same file measured another point. The harness measures sizes in
    increasing order and appends each size's rows, and it records a run in `<csv>.json`
    only once the run has finished. So every size of a finished run is done; a run that
    was killed may lack some configurations of its largest size: that size is measured
    again (the newer rows win when results are merged), its smaller ones are done.
    """
    todo = list(task.sizes) or [None]
    path = csv_path(spec, task)
    if not path.exists():
        return todo
    finished = _finished_runs(path)  # a sidecar that cannot be read is refused here
    if not task.sizes:
        _, rows = read_rows(path)
        if not rows:
            return todo
        last = rows[-1]
        return [] if (last.get("run_id") or last.get("compare_id")) in finished else todo
    table = read_table(path)
    rows = own_rows(table, task) if table else []
    sizes: dict[str, set[int]] = {}
    for row in rows:
        sizes.setdefault(row.get("run_id", ""), set()).add(int(row["size_bytes"]))
    done = set()
    for run, measured in sizes.items():
        done |= measured if run in finished else measured - {max(measured)}
    return [s for s in task.sizes if s not in done]


# Options whose column holds the value as the command line spells it: they tell a task's
# rows from another configuration's. (Others are resolved or split before they are
# written: --timer auto becomes the timer used, --density 0.1,1 one row per density.)
AS_GIVEN = (
    "collective",
    "algorithm",
    "dtype",
    "buffer",
    "transport",
    "backend",
    "model",
    "strategy",
)


def task_settings(task: Task) -> dict[str, str]:
    """The settings every row of `task` holds: its variant, ranks, link rate and the
    options spelled in their columns as given."""
    settings = {"variant": task.variant, "ranks": str(task.ranks)}
    if task.link_gbps is not None:
        settings["link_gbps"] = str(task.link_gbps)
    for flag, value in itertools.pairwise(task.args):
        key = flag[2:].replace("-", "_") if flag.startswith("--") else ""
        if key in AS_GIVEN and not value.startswith("-"):
            settings[key] = value
    return settings


def own_rows(table: Table, task: Task) -> list[dict]:
    """The rows of `table` that measured a point of `task`: their identity, on the
    settings the task fixes, is the task's."""
    settings = task_settings(task)
    fixed = [c for c in table.schema.identity_columns(table.header) if c in settings]
    mine = point_identity(settings, table.schema, fixed)
    return [r for r in table.current() if point_identity(r, table.schema, fixed) == mine]


def _finished_runs(path: Path) -> set[str]:
    return set(Sidecar(path).runs())


def resume_args(task: Task, todo: list[int]) -> list[str]:
    """The task's options with -m narrowed to the sizes still to measure."""
    args = list(task.args)
    if task.sizes and len(todo) < len(task.sizes):
        i = args.index("-m")
        args[i + 1] = format_sizes(todo)
    return args
