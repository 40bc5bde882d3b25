"""Reading result CSVs: find them, tell their kind by their columns, refuse bad ones.

Every CSV the suite writes is one of a few kinds (harness rows, codec throughput,
MG-WFBP profiles / fits / iterations / simulations, training steps, trace replays,
interleaved comparisons). The kind is told by the columns, never by the file name, so renamed or
merged files still plot. Files are read with `results.read_table` (older versions
upgraded) and each column as the type its schema declares (benchmarks/schemas.py). A file
that cannot be read (empty, malformed, a needed column missing) is reported with its name
and left out; everything else is still drawn.

Every row belongs to one *run*: the sweep that produced it (`sweep_id`, or its launch's
entry in the CSV's JSON sidecar), else its own launch (`run_id`, `compare_id`). Rows of
different runs are never paired: the command line draws one run, or each apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ccbench.benchmarks.results import (
    BY_KIND,
    Schema,
    Sidecar,
    csv_files,
    point_identity,
    read_rows,
    read_table,
    schema_of,
)
from ccbench.benchmarks.schema_model import NUMBER_TYPES
from ccbench.kernels.errors import UsageError


@dataclass(frozen=True)
class CsvKind:
    """What the plots need of a kind of row; which file is of which kind, which rows
    measured the same point and which columns are numbers, the results model says
    (benchmarks/results.py, benchmarks/schemas.py)."""

    name: str  # the model's kind
    title: str
    required: tuple[str, ...]  # needed to draw anything from it
    order: str | None = None  # column that orders repeated runs (latest wins)

    @property
    def schema(self) -> Schema:
        return BY_KIND[self.name]

    @property
    def numeric(self) -> tuple[str, ...]:
        """Parsed as numbers where present: the schema's numeric columns."""
        return self.schema.numeric()


KINDS = (
    CsvKind(
        "training",
        "training steps",
        required=("variant", "codec", "loss", "step_us"),
        order="timestamp",
    ),
    CsvKind(
        "replay",
        "trace replays (ccbench trace replay)",
        required=("trace", "variant", "codec", "step_us"),
        order="timestamp",
    ),
    # benchmarks.merged_gradient (measured_us set) and ccbench.scripts.simulate
    # (scaling_efficiency set) share one schema; load() splits the rows.
    CsvKind(
        "mgwfbp",
        "MG-WFBP iterations and simulations",
        required=("model", "strategy", "ranks", "predicted_us"),
        order="timestamp",
    ),
    CsvKind(
        "costfit",
        "allreduce cost-model fit",
        required=("ranks", "size_bytes", "measured_us", "fitted_us"),
    ),
    CsvKind("profile", "layer profiles", required=("model", "order", "bytes", "backward_us")),
    CsvKind(
        "codec",
        "codec throughput",
        required=("codec", "encode_gbps", "decode_gbps"),
        order="timestamp",
    ),
    CsvKind(
        "compare",
        "interleaved comparisons (ccbench compare)",
        required=("a", "b", "size_bytes", "ratio", "verdict"),
        order="timestamp",
    ),
    CsvKind(
        "harness",
        "micro-benchmark (harness) rows",
        required=("variant", "collective", "size_bytes", "ranks", "avg_us"),
        order="timestamp",
    ),
)
KIND_BY_NAME = {kind.name: kind for kind in KINDS}

# Kinds split out of another after loading: name -> (parent, column that marks the rows).
DERIVED = {
    "iteration": ("mgwfbp", "measured_us"),
    "simulation": ("mgwfbp", "scaling_efficiency"),
}
TITLES = {
    **{kind.name: kind.title for kind in KINDS},
    "iteration": "MG-WFBP measured iterations (benchmarks.merged_gradient)",
    "simulation": "MG-WFBP simulations (ccbench.scripts.simulate)",
}

# Kinds that describe inputs rather than measurements of a run: shared by every run.
INPUT_KINDS = ("profile",)
# Where rows were measured, in the order the report shows them (the papers measured
# bandwidth-limited networks: those first).
REGIMES = (
    ("links", "Where the papers measured: bandwidth-limited links"),
    ("nodes", "Two-level cluster: compress where the link is slow"),
    ("shm", "Shared memory: where compression cannot win, and why"),
    ("models", "Codecs, layer profiles and simulations"),
    ("graphs", "CUDA graphs: replayed calls, without the host's launch cost"),
)
# Kinds measured on no network at all.
MODEL_KINDS = ("profile", "codec", "simulation")


def regime_of(name: str, frame: pd.DataFrame) -> pd.Series:
    """Each row's regime: links (an emulated link rate), nodes (a cluster of nodes of
    several ranks each, or a comparison of hierarchical collectives over links), shm, or
    models; graphs for rows of replayed CUDA graphs (--cuda-graph), so no figure draws
    them with eager calls."""
    where = _regime_of(name, frame)
    where = where.where(~_two_level(frame, where), "nodes")
    if "cuda_graph" in frame.columns:
        graphed = pd.to_numeric(frame["cuda_graph"], errors="coerce").fillna(0) > 0
        where = where.where(~graphed, "graphs")
    return where


def _two_level(frame: pd.DataFrame, where: pd.Series) -> pd.Series:
    """Rows of a cluster of nodes with several ranks each (`nodes` above 1 and below
    `ranks`), and comparisons over links with a hierarchical side (compare rows record
    no layout)."""

    def number(column: str) -> pd.Series:
        if column not in frame.columns:
            return pd.Series(0.0, index=frame.index)
        return pd.to_numeric(frame[column], errors="coerce").fillna(0.0)

    nodes, ranks = number("nodes"), number("ranks")
    found = (nodes > 1) & (ranks > nodes)
    for side in ("a", "b"):
        if side in frame.columns:
            sides = frame[side].astype(str).str.contains("--hierarchy (?:node|leader)")
            found |= sides & (where == "links")
    return found


def _regime_of(name: str, frame: pd.DataFrame) -> pd.Series:
    if name in MODEL_KINDS:
        return pd.Series("models", index=frame.index)
    link = (
        pd.to_numeric(frame["link_gbps"], errors="coerce").fillna(0.0)
        if "link_gbps" in frame.columns
        else pd.Series(0.0, index=frame.index)
    )
    where = pd.Series("shm", index=frame.index).where(link <= 0, "links")
    if name == "mgwfbp" and "scaling_efficiency" in frame.columns:  # simulated: a model
        where = where.where(frame["scaling_efficiency"].isna(), "models")
    return where


# Kinds whose files may name no run at all (the fit CSV of benchmarks.merged_gradient):
# without a run column they are drawn on their own, in every run's report; no figure
# pairs their rows with another kind's.
UNTIED_KINDS = ("costfit",)
# The column naming a launch, per kind (run_id elsewhere).
LAUNCH_COLUMN = {"compare": "compare_id"}
RUN = "_run"  # the column every loaded frame gets: the run a row belongs to


@dataclass
class FileReport:
    path: Path
    kind: str | None = None
    rows: int = 0
    error: str | None = None
    ignored: str | None = None  # found in a folder but not a result CSV: not an error
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """What became of the file, without its name."""
        if self.error:
            return self.error
        if self.ignored:
            return f"ignored, {self.ignored}"
        extra = f" ({'; '.join(self.notes)})" if self.notes else ""
        return f"{self.rows} rows of {TITLES[self.kind]}{extra}"

    def line(self) -> str:
        return f"{self.path}: {self.describe()}"


@dataclass(frozen=True)
class Run:
    """One run in the inputs: a sweep, or a launch outside any sweep."""

    label: str  # "sweep ID", "run ID", "comparison ID" or "file NAME"
    rows: int
    files: tuple[str, ...]
    latest: str = ""  # the newest timestamp among its rows (ISO 8601, UTC)

    @property
    def id(self) -> str:
        return self.label.split(" ", 1)[1]

    def describe(self) -> str:
        first = self.files[0] + (f" and {len(self.files) - 1} more" if len(self.files) > 1 else "")
        return f"{self.label} ({self.rows} rows, {first})"


@dataclass
class Data:
    """The loaded results: one DataFrame per kind, plus what happened to every file."""

    frames: dict[str, pd.DataFrame]
    files: list[FileReport]
    notes: list[str] = field(default_factory=list)

    def has(self, kind: str) -> bool:
        return kind in self.frames and not self.frames[kind].empty

    def get(self, kind: str) -> pd.DataFrame:
        return self.frames.get(kind, pd.DataFrame())

    @property
    def bad_files(self) -> list[FileReport]:
        return [f for f in self.files if f.error]

    def runs(self) -> list[Run]:
        """The runs the measured rows belong to, in order of their labels."""
        rows: dict[str, int] = {}
        files: dict[str, set[str]] = {}
        latest: dict[str, str] = {}
        for name, frame in self.frames.items():
            if name in INPUT_KINDS or name in DERIVED or RUN not in frame.columns:
                continue
            for label, sub in frame.groupby(RUN, sort=True):
                if not label:
                    continue
                rows[label] = rows.get(label, 0) + len(sub)
                files.setdefault(label, set()).update(sub["source"].astype(str))
                stamps = [t for t in text_column(sub, "timestamp") if t]
                latest[label] = max([latest.get(label, ""), *stamps])
        return [
            Run(label, rows[label], tuple(sorted(files[label])), latest[label])
            for label in sorted(rows)
        ]

    def collisions(self) -> list[str]:
        """Points measured by more than one run, described: runs that cannot be drawn
        together without mixing them in one curve."""
        found = []
        for name, frame in self.frames.items():
            if name in INPUT_KINDS or name in DERIVED or RUN not in frame.columns:
                continue
            kind = KIND_BY_NAME[name]
            measured = frame[frame[RUN] != ""]
            key = identity_columns(kind, measured)
            if not key or measured.empty:
                continue
            points = identities(kind, measured)
            runs = measured[RUN].groupby(points).nunique()
            for point in runs[runs > 1].index[:1]:
                shown = ", ".join(f"{k}={v}" for k, v in zip(key, point, strict=True) if v)
                found.append(f"{TITLES[name]}: {shown}")
        return found

    def regimes(self) -> list[tuple[str, Data]]:
        """The rows split by where they were measured, as (regime, data), in REGIMES'
        order: emulated links, shared memory, then models and codecs (measured on no
        network). Only regimes that hold rows; shared inputs go with every regime."""
        split: dict[str, dict[str, pd.DataFrame]] = {key: {} for key, _ in REGIMES}
        for name, frame in self.frames.items():
            where = regime_of(name, frame)
            for key in split:
                split[key][name] = frame[where == key].reset_index(drop=True)
        out = []
        for key, _ in REGIMES:
            frames = split[key]
            if not any(not f.empty for n, f in frames.items() if n not in INPUT_KINDS):
                continue
            for name in INPUT_KINDS:  # layer profiles describe models: every regime's
                if name in self.frames:
                    frames[name] = self.frames[name]
            out.append((key, Data(frames=frames, files=self.files, notes=list(self.notes))))
        return out

    def only(self, label: str) -> Data:
        """The rows of one run, with the shared inputs (layer profiles)."""
        frames = {}
        for name, frame in self.frames.items():
            if name in INPUT_KINDS or RUN not in frame.columns:
                frames[name] = frame
            else:
                keep = (frame[RUN] == label) | (frame[RUN] == "")
                frames[name] = frame[keep].reset_index(drop=True)
        return Data(frames=frames, files=self.files, notes=list(self.notes))


def find_csvs(paths) -> list[tuple[Path, bool]]:
    """(file, named explicitly) for files as given and CSVs found in folders, each once."""
    found: dict[Path, bool] = {}
    for raw in paths:
        explicit = Path(raw).is_file()
        for path in csv_files([raw]):
            found[path] = found.get(path, False) or explicit
    if not found:
        raise UsageError(f"no CSV files in {', '.join(str(p) for p in paths)}")
    return list(found.items())


UNKNOWN = "not a ccbench result CSV"
UNDRAWN = "a ccbench result no figure draws"


def classify(columns, first: dict | None = None) -> tuple[CsvKind | None, int, str | None]:
    """(kind, schema version, None), or (None, 0, an error naming what is wrong): the
    results model tells the kind and version (benchmarks/results.py); the plots need some
    columns of it."""
    try:
        found = schema_of(list(columns), first)
    except UsageError as exc:
        return None, 0, str(exc)
    if found is None:
        return None, 0, unknown(columns)
    schema, version = found
    kind = KIND_BY_NAME.get(schema.kind)
    if kind is None:
        return None, 0, f"{UNDRAWN} ({schema.kind} rows)"
    missing = [c for c in kind.required if c not in set(columns)]
    if missing:
        return None, 0, f"looks like {kind.title} but lacks column(s) {', '.join(missing)}"
    return kind, version, None


def unknown(columns) -> str:
    shown = ", ".join(list(columns)[:8]) + (", ..." if len(columns) > 8 else "")
    return f"{UNKNOWN} (columns: {shown})"


def _cell(value):
    """A value as read: text stripped, and no value (NaN) where the cell is empty; the
    writer spells a missing float 'nan'."""
    if isinstance(value, str):
        value = value.strip()
        if value.lower() in ("", "nan"):
            return np.nan
    return value


def typed_frame(
    rows: list[dict], header: list[str], kind: CsvKind, report: FileReport
) -> pd.DataFrame:
    """Rows of strings as a frame, each column of the schema read as its type (text as
    pandas' text dtype, as its own reader gives it); a value that is not a number where
    the schema says one is noted and left out."""
    records = pd.DataFrame.from_records(rows)
    columns = {}
    for column in [*header, *(c for c in records.columns if c not in set(header))]:
        values = records[column].map(_cell).astype(object)
        wanted = kind.schema.type(column)
        if wanted in NUMBER_TYPES:
            columns[column] = pd.to_numeric(values, errors="coerce")
            bad = int((values.notna() & columns[column].isna()).sum())
            if bad:
                report.notes.append(f"{bad} non-numeric value(s) in {column} ignored")
        elif wanted is bool:
            columns[column] = values.map(lambda v: TRUTH.get(v, v)).astype(object)
        elif wanted is str and kind.schema.column(column) is not None:
            columns[column] = values  # declared text: an empty column is not a number
        else:
            columns[column] = values.infer_objects()
    return pd.DataFrame(columns, index=records.index)


TRUTH = {"True": True, "False": False}


def read_one(path: Path, explicit: bool = True) -> tuple[pd.DataFrame | None, FileReport]:
    """One file as a DataFrame of its kind, or None and the reason in the report.

    A CSV found in a folder that is not a result file at all (a sweep list, someone's
    notes) is ignored quietly; one named on the command line is an error. A result the
    figures do not draw (staging bounds) is ignored, named or not."""
    report = FileReport(path)
    try:
        table = read_table(path)
        header = table.header if table else read_rows(path)[0]
    except UsageError as exc:  # a newer version, or a line with more fields than its header
        text = str(exc).removeprefix(f"{path}: ")
        report.error = (
            f"malformed CSV ({text}); rows with a different number of fields "
            "usually mean runs with different columns were appended to one file"
            if "fields" in text
            else text
        )
        return None, report
    except (UnicodeDecodeError, OSError) as exc:
        report.error = f"cannot read ({type(exc).__name__}: {exc})"
        return None, report
    if not header:
        report.error = "empty file"
        return None, report
    first = table.rows[0] if table and table.rows else None
    kind, version, error = classify(header, first) if table else (None, 0, unknown(header))
    if error and (error.startswith(UNDRAWN) or error.startswith(UNKNOWN) and not explicit):
        report.ignored = error
        return None, report
    if error:
        report.error = error
        return None, report
    if not table.rows:
        report.error = "header only, no rows"
        return None, report
    report.kind = kind.name
    schema = kind.schema
    if version < schema.version:  # what an older version left implicit, filled in
        report.notes.append(f"{schema.kind} version {version}, read as {schema.version}")
    frame = typed_frame(table.current(), header, kind, report)
    needed = [c for c in kind.required if c in kind.numeric]
    keep = frame[needed].notna().all(axis=1) if needed else pd.Series(True, frame.index)
    if not keep.all():
        report.notes.append(f"{int((~keep).sum())} row(s) without {'/'.join(needed)} dropped")
        frame = frame[keep]
    if frame.empty:
        report.error = "no usable rows"
        report.kind = None
        return None, report
    frame["source"] = str(path)
    if kind.name not in INPUT_KINDS:
        try:
            frame[RUN] = run_labels(frame, kind.name, path)
        except UsageError as exc:  # a malformed sidecar: this file is bad, the rest drawn
            report.error, report.kind = str(exc), None
            return None, report
    report.rows = len(frame)
    return frame, report


def text_column(frame: pd.DataFrame, column: str) -> pd.Series:
    """A column as stripped text, '' where absent or empty."""
    if column not in frame.columns:
        return pd.Series("", index=frame.index)
    values = frame[column].astype(object).where(frame[column].notna(), "")
    return values.astype(str).str.strip().replace("nan", "")


def sidecar_sweeps(path: Path) -> dict[str, str]:
    """launch id -> sweep id, from the JSON sidecar the harness writes beside a CSV (files
    whose rows carry no sweep_id column, e.g. training steps, still name their sweep)."""
    runs = Sidecar(path).runs()
    return {str(k): str(v.get("sweep_id") or "") for k, v in runs.items() if isinstance(v, dict)}


def run_labels(frame: pd.DataFrame, kind: str, path: Path) -> pd.Series:
    """The run of each row: its sweep, else its own launch, else its file ('' for rows of
    an untied kind that name no run)."""
    launch_column = LAUNCH_COLUMN.get(kind, "run_id")
    if kind in UNTIED_KINDS and not {"sweep_id", launch_column} & set(frame.columns):
        return pd.Series("", index=frame.index)
    sweep = text_column(frame, "sweep_id")
    launch = text_column(frame, launch_column)
    if (sweep == "").any():
        known = sidecar_sweeps(path)
        sweep = sweep.where(sweep != "", launch.map(lambda r: known.get(r, "")))
    what = "comparison" if kind == "compare" else "run"
    labels = ("sweep " + sweep).where(sweep != "", what + " " + launch)
    return labels.where((sweep != "") | (launch != ""), f"file {path.name}")


def identity_columns(kind: CsvKind, frame: pd.DataFrame) -> list[str]:
    """The columns that say which point a row measured (not which run measured it): the
    results model's settings of the kind."""
    return BY_KIND[kind.name].identity_columns(c for c in frame.columns if c != "source")


def identities(kind: CsvKind, frame: pd.DataFrame) -> pd.Series:
    """Each row's point identity, as the results model defines it for every reader."""
    schema = BY_KIND[kind.name]
    columns = [c for c in frame.columns if c != "source"]  # the file: not the point
    return pd.Series(
        [point_identity(r, schema, columns) for r in frame.to_dict("records")],
        index=frame.index,
        dtype=object,
    )


def deduplicate(kind: CsvKind, frame: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """Keep one row per measured point: the latest run when several files repeat it."""
    if not identity_columns(kind, frame):
        return frame, None
    # Identical rows from two files (a merged file read with its parts) are one row.
    frame = frame[~frame.drop(columns="source").duplicated(keep="last")]
    if kind.order and kind.order in frame.columns:
        frame = frame.sort_values(kind.order, kind="stable")
    key = frame.assign(_point=identities(kind, frame))
    # a point measured by two runs stays in each
    duplicated = key.duplicated(
        subset=["_point", RUN] if RUN in frame.columns else ["_point"], keep="last"
    )
    if not duplicated.any():
        return frame, None
    note = (
        f"{kind.title}: {int(duplicated.sum())} row(s) repeat a point measured again "
        "later in the same run; the latest is drawn"
    )
    return frame[~duplicated], note


def load(paths) -> Data:
    """Read every CSV under `paths`; one DataFrame per kind, bad files reported."""
    files = find_csvs(paths)
    pieces: dict[str, list[pd.DataFrame]] = {}
    reports = []
    for path, explicit in files:
        frame, report = read_one(path, explicit)
        reports.append(report)
        if frame is not None:
            pieces.setdefault(report.kind, []).append(frame)
    frames, notes = {}, []
    for name, parts in pieces.items():
        kind = KIND_BY_NAME[name]
        frame = pd.concat(parts, ignore_index=True, sort=False)
        # text settings never NaN: pandas drops NaN groups silently
        for column, default in kind.schema.text_settings().items():
            if column not in frame.columns:
                frame[column] = default
            values = frame[column].astype(object)
            frame[column] = values.where(values.notna(), default).astype(str)
        frame, note = deduplicate(kind, frame)
        if note:
            notes.append(note)
        frames[name] = frame.reset_index(drop=True)
    for name, (parent, marker) in DERIVED.items():
        if parent in frames and marker in frames[parent].columns:
            part = frames[parent][frames[parent][marker].notna()]
            if not part.empty:
                frames[name] = part.reset_index(drop=True)
    return Data(frames=frames, files=reports, notes=notes)
