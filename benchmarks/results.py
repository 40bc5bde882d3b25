"""The results model: what a result row is, and the one place rows are written and read.

Every CSV the suite writes holds rows of one *kind*: micro-benchmark rows of the harness,
interleaved comparisons, codec throughput, training steps, trace replays, MG-WFBP
iterations and simulations, the MG-WFBP cost-model fit, layer profiles. Each kind has a
`Schema`, its columns in order, each with a *role*:

* a **setting** says which point was measured and how (variant, codec, size, ranks,
  timer, data ...): rows that agree on every setting measured the same point;
* a **derived** column follows from the settings (the byte counts of a size);
* a **measurement** is what was measured (times, rates, errors, bytes on the wire, the
  validation verdict, the iterations it took);
* **provenance** says which run made the row and where (`schema`, run and sweep ids,
  time, host, commit, MPI library).

`point_identity` is the one definition of "the same point"; merge, regress, sweep
resume, the plots, compare and the gate all use it. Every row carries its schema as
`<kind>/<version>` in its first column; a reader accepts an older version by its number
(files written before there were versions are version 1, told by their columns) and
`upgrade` brings its rows to the current version. Beside a CSV, `Sidecar` (`<csv>.json`)
holds each run's environment and `Samples` (`<csv>.samples/<run id>.npz`) the raw
per-call times of every point, from which any statistic can be computed again.
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import math
import os
import tempfile
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ccbench.kernels.errors import UsageError

SETTING, DERIVED, MEASUREMENT, PROVENANCE = "setting", "derived", "measurement", "provenance"
SCHEMA = "schema"  # the first column of every row: "<kind>/<version>"

# A variant's own columns, after its schema's declared ones, are measurements when listed
# here or named with a measurement suffix, and settings otherwise.
MEASURED_EXTRAS = frozenset({
    "compression_ratio", "error_bound", "psnr_db", "cosine", "nonzero_density", "union_density",
    "overlap_efficiency", "chunk_used_bytes", "wire_min_bytes_per_rank", "wire_vs_min",
    "dropped_mass", "dropped_mass_rel", "min_wire_bytes_per_rank", "wire_over_min",
})  # fmt: skip
MEASUREMENT_SUFFIXES = ("_us", "_gbps", "_err", "_ratio", "_wire_bytes", "_per_rank")


def extra_role(column: str) -> str:
    """The role of a column a variant adds after its schema's declared ones."""
    if column in MEASURED_EXTRAS or column.endswith(MEASUREMENT_SUFFIXES):
        return MEASUREMENT
    return SETTING


@dataclass(frozen=True)
class Schema:
    """One kind of row: its columns in order with their roles, and its version."""

    kind: str
    version: int
    columns: tuple[tuple[str, str], ...]  # (name, role) in CSV order
    open: bool = False  # variants may add their own columns after the declared ones
    signature: tuple[str, ...] = ()  # columns that tell a version-1 file of this kind
    # per older version: values its rows lacked, as the code then wrote them implicitly
    defaults: Mapping[int, Mapping[str, object]] = field(default_factory=dict)
    # the same, for the rows of one variant only: {version: {variant: {column: value}}}
    variant_defaults: Mapping[int, Mapping[str, Mapping[str, object]]] = field(
        default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)

    @property
    def tag(self) -> str:
        return f"{self.kind}/{self.version}"

    def role(self, column: str) -> str:
        for name, role in self.columns:
            if name == column:
                return role
        return extra_role(column) if self.open else SETTING

    def identity_columns(self, header: Iterable[str]) -> list[str]:
        """The columns of a table with this header that say which point a row measured."""
        return [c for c in header if not c.startswith("_") and self.role(c) == SETTING]

    def extras(self, header: Iterable[str]) -> list[str]:
        """The columns a variant added after the declared ones."""
        declared = set(self.names)
        return [c for c in header if c not in declared]

    def header(self, extras: Iterable[str] = ()) -> list[str]:
        return [*self.names, *(c for c in extras if c not in set(self.names))]


def _columns(*groups: tuple[str, tuple[str, ...]]) -> tuple[tuple[str, str], ...]:
    return tuple((name, role) for role, names in groups for name in names)


RUN = ("run_id", "sweep_id", "timestamp")
WHERE = ("mpi_library", "hostname", "git_sha")

HARNESS = Schema("harness", 4, _columns(
    (PROVENANCE, (SCHEMA, *RUN)),
    (SETTING, ("variant", "algorithm", "collective", "codec", "dtype", "buffer",
               "transport", "backend", "ranks", "nodes", "size_bytes")),
    (DERIVED, ("bytes_per_rank", "total_bytes", "count")),
    (MEASUREMENT, ("iterations", "warmup")),
    (SETTING, ("timing", "timer", "hugepages", "ci_target_pct", "time_budget_s")),
    (MEASUREMENT, ("stopped_by", "avg_us", "min_us", "max_us", "p50_us", "p99_us",
                   "fastest_us", "ci_low_us", "ci_high_us", "algbw_gbps", "busbw_gbps",
                   "wire_bytes_per_rank", "compression_ratio", "host_syncs")),
    (SETTING, ("data",)),
    (MEASUREMENT, ("rel_l2_err", "max_abs_err", "max_rel_err", "psnr_db", "cosine",
                   "validation", "validation_err", "error_bound")),
    (SETTING, ("link_gbps",)),
    (PROVENANCE, ("link_ceiling_gbps", "link_burst_bytes", "link_step_us", *WHERE, "device")),
), open=True, signature=("variant", "collective", "size_bytes"), defaults={1: {
    # numpy's own default paging: huge pages advised for large arrays
    "hugepages": "madvise"}, 2: {
    # before the torch transport every row ran over MPI
    "transport": "mpi", "backend": "mpi"}, 3: {
    # before `cluster selfcheck` measured the fixed cost of a ring step: none known
    "link_step_us": ""}}, variant_defaults={1: {
    # sparse-streaming rows of version 1 left out what their defaults were
    "sparse_streaming": {"block_size": 256, "fusion": 1024, "overlap": "random",
                         "threshold": 0.0, "aggregators": 0}}})

COMPARE = Schema("compare", 2, _columns(
    (PROVENANCE, (SCHEMA, "compare_id", "sweep_id", "timestamp")),
    (SETTING, ("a", "b", "a_rev", "b_rev", "collective", "ranks", "size_bytes", "config",
               "statistic")),
    (MEASUREMENT, ("rounds", "a_us", "b_us", "ratio", "ratio_low", "ratio_high")),
    (SETTING, ("margin",)),
    (MEASUREMENT, ("verdict", "a_iterations", "b_iterations")),
    (SETTING, ("link_gbps",)),
    (PROVENANCE, ("load_start", "load_end", "hostname", "git_sha")),
    (SETTING, ("pairing", "turns", "ci_target_pct", "timer")),
    (MEASUREMENT, ("validation",)),
), signature=("compare_id", "ratio", "ratio_low", "ratio_high"),
    defaults={1: {"statistic": "avg", "timer": "", "validation": ""}})

CODEC = Schema("codec", 2, _columns(
    (PROVENANCE, (SCHEMA, *RUN)),
    (SETTING, ("codec", "kernels", "lossless", "data", "dtype", "buffer", "hugepages",
               "size_bytes")),
    (MEASUREMENT, ("repeats",)),
    (SETTING, ("clock",)),
    (MEASUREMENT, ("encode_gbps", "decode_gbps", "hop_gbps", "copy_gbps", "encode_vs_copy",
                   "decode_vs_copy", "hop_vs_copy", "ratio", "max_abs_err", "max_rel_err",
                   "rel_l2_err", "psnr_db", "cosine", "error_bound")),
    (PROVENANCE, ("hostname", "git_sha")),
), signature=("encode_gbps", "decode_gbps"), defaults={1: {
    "data": "random", "kernels": "reference", "hugepages": "madvise"}})

TRAINING = Schema("training", 3, _columns(
    (PROVENANCE, (SCHEMA, *RUN)),
    (SETTING, ("row", "framework", "variant", "algorithm", "codec", "compress",
               "error_feedback", "overlap", "strategy", "model", "dataset", "transport",
               "backend")),
    (MEASUREMENT, ("params",)),
    (SETTING, ("ranks", "nodes", "global_batch", "lr", "seed", "steps", "warmup_steps",
               "final_window", "step")),
    (MEASUREMENT, ("loss", "step_us", "compute_us", "comm_us", "forward_us", "backward_us",
                   "optimizer_us", "allgather_us", "reduce_scatter_us", "allreduce_us",
                   "comm_busy_us", "predicted_us", "predicted_exposed_us", "groups",
                   "max_step_us", "wire_bytes_per_rank", "throughput", "throughput_unit",
                   "held_out_loss", "held_out_accuracy")),
    (SETTING, ("link_gbps",)),
    (PROVENANCE, (*WHERE, "device")),
), signature=("step", "loss", "step_us"), defaults={1: {
    # the training loop's warm-up and final-loss window before rows recorded them
    "warmup_steps": 3, "final_window": 10, "framework": "own", "row": "step"}, 2: {
    # before the torch transport ccbench's collectives all ran over MPI
    "transport": "mpi", "backend": "mpi"}})

MGWFBP = Schema("mgwfbp", 2, _columns(
    (PROVENANCE, (SCHEMA, *RUN)),
    (SETTING, ("variant", "model", "strategy", "ranks", "nodes", "transport")),
    (MEASUREMENT, ("measured_us", "measured_std_us", "predicted_us", "forward_us",
                   "backward_us", "measured_backward_us", "nonoverlapped_us",
                   "measured_nonoverlapped_us", "comm_us", "measured_comm_us",
                   "scaling_efficiency", "groups", "plan", "tensors", "total_bytes",
                   "alpha_us", "beta_us_per_byte", "fit_r2")),
    (SETTING, ("link_gbps", "hop_latency_us", "algorithm", "compute_speedup")),
    (MEASUREMENT, ("iterations", "validation")),
    (PROVENANCE, WHERE),
), signature=("model", "strategy", "predicted_us"), defaults={1: {"transport": "",
                                                                  "variant": ""}})

COSTFIT = Schema("costfit", 2, _columns(
    (PROVENANCE, (SCHEMA, "run_id", "sweep_id")),
    (SETTING, ("model", "ranks", "transport", "link_gbps", "size_bytes")),
    (MEASUREMENT, ("measured_us", "fitted_us", "iterations")),
), signature=("size_bytes", "measured_us", "fitted_us"), defaults={1: {"model": "",
                                                                       "transport": ""}})

REPLAY = Schema("replay", 2, _columns(
    (PROVENANCE, (SCHEMA, *RUN)),
    (SETTING, ("row", "trace", "trace_id", "source", "framework", "model", "variant",
               "algorithm", "codec", "compress", "merge", "compute_wait", "compute_scale",
               "data", "ranks", "nodes", "traced_ranks", "steps", "warmup_steps", "step")),
    (DERIVED, ("trace_step", "calls", "step_bytes", "traced_compute_us", "traced_step_us")),
    (MEASUREMENT, ("step_us", "step_ci_low_us", "step_ci_high_us", "compute_us", "comm_us",
                   "codec_us", "exposed_codec_us", "allgather_us", "reduce_scatter_us",
                   "allreduce_us", "comm_busy_us", "emulated_us", "max_step_us",
                   "wire_bytes_per_rank", "validation")),
    (SETTING, ("link_gbps",)),
    (PROVENANCE, WHERE),
), signature=("trace_id", "traced_compute_us", "step_us"))

PROFILE = Schema("profile", 2, _columns(
    (PROVENANCE, (SCHEMA,)),
    (SETTING, ("model", "order", "param", "shape", "numel", "dtype", "bytes")),
    (MEASUREMENT, ("backward_us", "ready_us", "forward_us")),
    (SETTING, ("batch", "width", "device")),
    (MEASUREMENT, ("iterations",)),
), signature=("order", "bytes", "backward_us"))

# In the order a version-1 file is told by its columns: the first whose signature the
# header carries (a harness header also carries a compare's size_bytes, say).
SCHEMAS = (REPLAY, TRAINING, MGWFBP, COSTFIT, PROFILE, CODEC, COMPARE, HARNESS)
BY_KIND = {schema.kind: schema for schema in SCHEMAS}

# The harness columns every micro-benchmark row carries, in order (variants add theirs).
COMMON_COLUMNS = HARNESS.names
MGWFBP_COLUMNS = MGWFBP.names


def is_measurement(column: str) -> bool:
    """A harness row's column that holds a measurement (a time, a rate, an error...)."""
    return HARNESS.role(column) == MEASUREMENT


def is_setting(column: str) -> bool:
    """A harness row's column that says which point was measured (and how)."""
    return HARNESS.role(column) == SETTING


def build_row(schema: Schema, *parts: Mapping) -> dict:
    """A new row of `schema`: its tag, then `parts` in order (the run's columns first, as
    `environment.run_info` gives them; a later part's value wins). Every variant builds
    its rows here."""
    row = {SCHEMA: schema.tag}
    for part in parts:
        row.update(part)
    return row


# ------------------------------------------------------------------------- telling kinds


def schema_of(header: Sequence[str], first: Mapping | None = None
              ) -> tuple[Schema, int] | None:
    """(schema, version) of a table with this header, or None when it is no ccbench
    result. A table names its own (`schema` column); older tables are told by columns."""
    if header and header[0] == SCHEMA and first is not None:
        kind, _, version = str(first.get(SCHEMA, "")).partition("/")
        if kind in BY_KIND and version.isdigit():
            schema = BY_KIND[kind]
            if int(version) > schema.version:
                raise UsageError(f"rows of {kind} version {version}: this ccbench reads up "
                                 f"to version {schema.version}; upgrade ccbench")
            return schema, int(version)
    present = set(header)
    for schema in SCHEMAS:
        if set(schema.signature) <= present:
            return schema, 1 if SCHEMA not in present else schema.version
    return None


def upgrade(rows: Iterable[dict], schema: Schema, version: int) -> list[dict]:
    """Rows of an older version with what they left implicit filled in, tagged current."""
    fill: dict = {}
    by_variant: dict[str, dict] = {}
    for older in range(version, schema.version):
        fill.update(schema.defaults.get(older, {}))
        for variant, values in schema.variant_defaults.get(older, {}).items():
            by_variant.setdefault(variant, {}).update(values)
    out = []
    for row in rows:
        row = dict(row)
        for column, value in {**fill, **by_variant.get(row.get("variant"), {})}.items():
            if row.get(column) in (None, ""):
                row[column] = value
        row[SCHEMA] = schema.tag
        out.append(row)
    return out


# ------------------------------------------------------------------------- identity


def _canonical(value) -> str:
    """One spelling per value, whether read from text ('4096', '4096.0') or parsed."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int | float):
        number = float(value)
    else:
        text = str(value).strip()
        try:
            number = float(text)
        except ValueError:
            return text
    if math.isnan(number):
        return ""
    if math.isfinite(number) and number.is_integer() and abs(number) < 2**53:
        return str(int(number))
    return repr(number)


def point_identity(row: Mapping, schema: Schema, header: Iterable[str]) -> tuple[str, ...]:
    """Which point a row measured: its settings, spelled canonically. The one definition
    of "the same point" for every reader (merge, regress, sweep, plots, compare, gate)."""
    return tuple(_canonical(row.get(c)) for c in schema.identity_columns(header))


def new_run_id(now: datetime.datetime | None = None) -> str:
    """The id of one launch (or comparison): its UTC start time and a random suffix."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return f"{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"


# ------------------------------------------------------------------------- files


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write through a temporary file and a rename: never a torn file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    # mkstemp makes 0600 files; results on a shared file system should be readable
    os.chmod(tmp, 0o666 & ~_umask())
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _format(value) -> str:
    if value is None:
        return ""
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()  # a numpy scalar: written as the number it is
    if isinstance(value, float):
        return repr(value) if value == value else "nan"
    return str(value)


def write_csv_atomic(path, rows: Sequence[dict], columns: Sequence[str] | None = None) -> None:
    """Write rows to `path` through a temporary file and a rename: never a torn file."""
    if columns is None:
        columns = list(rows[0]) if rows else list(COMMON_COLUMNS)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_format(row.get(c)) for c in columns])
    atomic_write_bytes(Path(path), out.getvalue().encode())


def write_json_atomic(path, payload: dict) -> None:
    text = json.dumps(payload, indent=2, sort_keys=True, default=str)
    atomic_write_bytes(Path(path), (text + "\n").encode())


def read_json_document(path, label: str, remedy: str) -> dict | None:
    """The JSON object in `path`, or None when there is no file. A file that exists but
    cannot be read, or is not an object, is one error naming it (`label`) and the
    `remedy`: a damaged record is never taken for a missing one."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"{label}: cannot read it ({exc.strerror})") from None
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{label} is not valid JSON ({exc}); {remedy}") from None
    if not isinstance(document, dict):
        raise UsageError(f"{label} is not a JSON object; {remedy}")
    return document


def read_rows(path) -> tuple[list[str], list[dict]]:
    """(header, rows as dicts of strings) of a CSV written by write_csv_atomic."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            return [], []
        return header, [dict(zip(header, values, strict=False)) for values in reader]


@dataclass
class Table:
    """One result file: its schema and version, its header and its rows (strings)."""

    path: Path
    schema: Schema
    version: int
    header: list[str]
    rows: list[dict]

    def current(self) -> list[dict]:
        """The rows at the current version of their schema."""
        return upgrade(self.rows, self.schema, self.version)

    def identity(self, row: Mapping) -> tuple[str, ...]:
        return point_identity(row, self.schema, self.header)

    def missing(self) -> list[str]:
        """Declared columns of its version that the file lacks (a current-version file
        holds them all, first, in order; older versions are filled in by `upgrade`)."""
        if self.version < self.schema.version:
            return []
        names = self.schema.names
        if tuple(self.header[: len(names)]) == names:
            return []
        return [c for c in names if c not in self.header] or ["(columns out of order)"]


def read_table(path) -> Table | None:
    """A result file as a Table; None for an empty file or one that is no ccbench result."""
    header, rows = read_rows(path)
    if not header:
        return None
    found = schema_of(header, rows[0] if rows else None)
    if found is None:
        return None
    schema, version = found
    return Table(Path(path), schema, version, header, rows)


def check_header(path, columns: Sequence[str]) -> None:
    """Refuse, before any work, a results file written with other columns, or whose JSON
    sidecar could not be added to."""
    path = Path(path) if path else None
    if path and path.is_file() and path.stat().st_size > 0:
        header, _ = read_rows(path)
        if list(header) != list(columns):
            raise UsageError(
                f"{path} holds results with other columns; write to a new file "
                "(ccbench merge combines files of one schema)"
            )
    if path:
        Sidecar(path).check()


def append_rows(path, rows: Sequence[dict], columns: Sequence[str]) -> None:
    """Add rows to a CSV atomically; refuse a file whose columns differ (no mixed schemas)."""
    path = Path(path)
    check_header(path, columns)
    existing = read_rows(path)[1] if path.exists() and path.stat().st_size > 0 else []
    write_csv_atomic(path, [*existing, *rows], columns)


def csv_files(paths: Iterable) -> list[Path]:
    """The CSV files named, or found (recursively) in the folders named, sorted."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found.extend(sorted(p.rglob("*.csv")))
        elif p.exists():
            found.append(p)
        else:
            raise UsageError(f"{p}: no such file or folder")
    return found


# ------------------------------------------------------------------------- beside a CSV


SIDECAR_VERSION = 2  # 1: no "sidecar" key; 2: {"sidecar": 2, "runs": {...}, ...}


class Sidecar:
    """`<csv>.json` beside a results CSV: each run's environment (or a comparison's
    record), keyed by its run id. A run is recorded only once it has finished, so a sweep
    tells finished runs from killed ones by it. This class alone reads and writes it: a
    file that exists but cannot be read is an error naming it, never "no runs". It
    carries its version (`sidecar`); an older one is upgraded on read, as rows are, and
    one newer than this ccbench is refused."""

    def __init__(self, csv_path):
        self.path = Path(f"{csv_path}.json")

    def read(self) -> dict:
        """The whole document, at the current version ({} when there is no file)."""
        document = read_json_document(
            self.path, str(self.path),
            "repair or delete it (it records the runs of the CSV beside it)") or {}
        if not isinstance(document.get("runs", {}), dict):
            raise UsageError(f"{self.path} is not a ccbench sidecar (no 'runs' object)")
        version = document.get("sidecar", 1 if document else SIDECAR_VERSION)
        if not isinstance(version, int) or version > SIDECAR_VERSION:
            raise UsageError(f"{self.path}: sidecar version {version!r} is newer than this "
                             f"ccbench reads ({SIDECAR_VERSION}); upgrade ccbench")
        return {**document, "sidecar": SIDECAR_VERSION} if document else document

    def runs(self) -> dict:
        """run id -> record ({} when there is no file)."""
        return self.read().get("runs", {})

    def check(self) -> None:
        """Refuse, before any work, a sidecar that could not be added to."""
        self.read()

    def add(self, run_id: str, record: dict) -> None:
        """Record one finished run (atomic rewrite, the other runs kept)."""
        document = self.read() or {"sidecar": SIDECAR_VERSION}
        document.setdefault("runs", {})[run_id] = record
        write_json_atomic(self.path, document)

    def write(self, runs: dict, **sections) -> None:
        write_json_atomic(self.path, {**sections, "sidecar": SIDECAR_VERSION, "runs": runs})


class Samples:
    """The raw per-call times of a run's points, beside its CSV: `<csv>.samples/<run
    id>.npz`, one float32 array (ranks x calls, microseconds) per point, keyed like the
    paired runs' points ("<size>|<config>"). Written once per run, read only on demand."""

    def __init__(self, csv_path):
        self.folder = Path(f"{csv_path}.samples")

    def path(self, run_id: str) -> Path:
        return self.folder / f"{run_id}.npz"

    def write(self, run_id: str, points: Mapping[str, object]) -> None:
        import numpy as np

        buffer = io.BytesIO()
        arrays = {key: np.asarray(value, dtype=np.float32) for key, value in points.items()}
        np.savez_compressed(buffer, **arrays)
        atomic_write_bytes(self.path(run_id), buffer.getvalue())

    def read(self, run_id: str) -> dict:
        """point key -> (ranks x calls) microseconds; {} when the run kept none."""
        import numpy as np

        path = self.path(run_id)
        if not path.exists():
            return {}
        try:
            with np.load(path) as data:
                return {key: data[key] for key in data.files}
        except (OSError, ValueError) as exc:
            raise UsageError(f"{path}: not readable samples ({exc})") from None


def remove(csv_path) -> None:
    """Delete a results CSV and what lies beside it (its sidecar, its raw times)."""
    import shutil

    Path(csv_path).unlink(missing_ok=True)
    Sidecar(csv_path).path.unlink(missing_ok=True)
    shutil.rmtree(Samples(csv_path).folder, ignore_errors=True)


def point_key(size_bytes: int, config: Mapping) -> str:
    """A point of one run: its size and its configuration (density, ...), as text."""
    return f"{int(size_bytes)}|" + ",".join(f"{k}={v}" for k, v in sorted(config.items()))


# Where the layer profiles of MG-WFBP's models are read from (tracked, small).
PROFILE_DIR = Path("results") / "profiles"


def profile_names(profile_dir=PROFILE_DIR) -> tuple[str, ...]:
    """The models that have a layer profile in `profile_dir` (<model>.csv)."""
    return tuple(sorted(p.stem for p in Path(profile_dir).glob("*.csv")))
