"""The results model: what a result row is, and the one place rows are written and read.

Every CSV the suite writes holds rows of one *kind*: micro-benchmark rows of the harness,
interleaved comparisons, codec throughput, training steps, trace replays, MG-WFBP
iterations and simulations, the MG-WFBP cost-model fit, layer profiles, staging bounds.
Each kind has a `Schema` (benchmarks/schemas.py), its columns in order, each with a
*role* (setting, derived, measurement or provenance) and a *type*; the harness's variants
declare the columns they add there too.

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
from dataclasses import dataclass
from pathlib import Path

# The kinds of rows, their typed columns and the variants' own (benchmarks/schemas.py),
# and what a column and a schema are (benchmarks/schema_model.py), read through this
# module as well.
from ccbench.benchmarks.schema_model import (  # noqa: F401
    DERIVED,
    MEASUREMENT,
    PROVENANCE,
    SCHEMA,
    SETTING,
    Column,
    Schema,
)
from ccbench.benchmarks.schemas import (  # noqa: F401
    BY_KIND,
    CODEC,
    COMMON_COLUMNS,
    COMPARE,
    COSTFIT,
    HARNESS,
    MGWFBP,
    MGWFBP_COLUMNS,
    PROFILE,
    REPLAY,
    SCHEMAS,
    STAGING,
    TRAINING,
)
from ccbench.kernels.errors import UsageError


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


def schema_of(header: Sequence[str], first: Mapping | None = None) -> tuple[Schema, int] | None:
    """(schema, version) of a table with this header, or None when it is no ccbench
    result. A table names its own (`schema` column); older tables are told by columns."""
    if header and header[0] == SCHEMA and first is not None:
        kind, _, version = str(first.get(SCHEMA, "")).partition("/")
        if kind in BY_KIND and version.isdigit():
            schema = BY_KIND[kind]
            if int(version) > schema.version:
                raise UsageError(
                    f"rows of {kind} version {version}: this ccbench reads up "
                    f"to version {schema.version}; upgrade ccbench"
                )
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
    """(header, rows as dicts of strings) of a CSV written by write_csv_atomic. A row with
    more fields than the header (runs of other columns appended to one file) is refused:
    its values cannot be told apart."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            return [], []
        rows = []
        for values in reader:
            if len(values) > len(header):
                raise UsageError(
                    f"{path}: line {reader.line_num} has {len(values)} fields, "
                    f"its header {len(header)}"
                )
            rows.append(dict(zip(header, values, strict=False)))
        return header, rows


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
        document = (
            read_json_document(
                self.path,
                str(self.path),
                "repair or delete it (it records the runs of the CSV beside it)",
            )
            or {}
        )
        if not isinstance(document.get("runs", {}), dict):
            raise UsageError(f"{self.path} is not a ccbench sidecar (no 'runs' object)")
        version = document.get("sidecar", 1 if document else SIDECAR_VERSION)
        if not isinstance(version, int) or version > SIDECAR_VERSION:
            raise UsageError(
                f"{self.path}: sidecar version {version!r} is newer than this "
                f"ccbench reads ({SIDECAR_VERSION}); upgrade ccbench"
            )
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
