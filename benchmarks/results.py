"""Result rows: the CSV schema, atomic writes and reading result sets back."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from ccbench.kernels.errors import UsageError

# The columns every micro-benchmark row carries, in this order; a variant's own columns
# and its configuration columns (density, block size, ...) follow.
COMMON_COLUMNS = (
    "run_id", "sweep_id", "timestamp", "variant", "algorithm", "collective", "codec", "dtype",
    "buffer", "ranks", "nodes", "size_bytes", "bytes_per_rank", "total_bytes", "count",
    "iterations", "warmup", "timing", "timer", "ci_target_pct", "time_budget_s", "stopped_by",
    "avg_us", "min_us", "max_us", "p50_us", "p99_us", "fastest_us", "ci_low_us", "ci_high_us",
    "algbw_gbps", "busbw_gbps", "wire_bytes_per_rank", "compression_ratio", "data", "rel_l2_err",
    "max_abs_err", "max_rel_err", "psnr_db", "cosine", "validation", "validation_err",
    "error_bound", "link_gbps", "mpi_library", "hostname", "git_sha",
)  # fmt: skip


# Which columns of a harness row are measurements or describe the run, not settings of the
# measured point: two rows that agree on every other column measured the same point.
# Variants' own measured columns end with a measurement suffix or are listed here.
RUN_COLUMNS = frozenset({
    "run_id", "sweep_id", "timestamp", "iterations", "warmup", "stopped_by", "validation",
    "mpi_library", "hostname", "git_sha", "source", "bytes_per_rank", "total_bytes", "count",
    "nodes",
})  # fmt: skip
MEASURED_COLUMNS = frozenset({
    "compression_ratio", "error_bound", "psnr_db", "cosine", "nonzero_density", "union_density",
    "overlap_efficiency", "chunk_used_bytes",
    "wire_min_bytes_per_rank", "wire_vs_min", "dropped_mass", "dropped_mass_rel",
    "min_wire_bytes_per_rank", "wire_over_min",
})  # fmt: skip
MEASUREMENT_SUFFIXES = ("_us", "_gbps", "_err", "_ratio", "_wire_bytes", "_per_rank")


def is_measurement(column: str) -> bool:
    """True for a measured column (a time, a rate, an error, bytes on the wire)."""
    return column in MEASURED_COLUMNS or column.endswith(MEASUREMENT_SUFFIXES)


def is_setting(column: str) -> bool:
    """True for a column that says which point was measured (and how)."""
    return not is_measurement(column) and column not in RUN_COLUMNS


# MG-WFBP rows: one schema for measured (benchmarks.merged_gradient) and simulated
# (`ccbench simulate`) iterations.
MGWFBP_COLUMNS = (
    "run_id", "sweep_id", "timestamp", "variant", "model", "strategy", "ranks", "nodes",
    "transport", "measured_us", "measured_std_us", "predicted_us", "forward_us", "backward_us",
    "measured_backward_us", "nonoverlapped_us", "measured_nonoverlapped_us", "comm_us",
    "measured_comm_us",
    "scaling_efficiency", "groups", "plan", "tensors", "total_bytes", "alpha_us",
    "beta_us_per_byte", "fit_r2", "link_gbps", "hop_latency_us", "algorithm",
    "compute_speedup", "iterations", "validation", "mpi_library", "hostname", "git_sha",
)  # fmt: skip


# Where the layer profiles of MG-WFBP's models are read from (tracked, small).
PROFILE_DIR = Path("results") / "profiles"


def profile_names(profile_dir=PROFILE_DIR) -> tuple[str, ...]:
    """The models that have a layer profile in `profile_dir` (<model>.csv)."""
    return tuple(sorted(p.stem for p in Path(profile_dir).glob("*.csv")))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    # mkstemp makes 0600 files; results on a shared file system should be readable
    os.chmod(tmp, 0o666 & ~_umask())
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _format(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):  # numpy's float64 too, whose repr is "np.float64(...)"
        return repr(float(value)) if value == value else "nan"
    return str(value)


def write_csv_atomic(path, rows: Sequence[dict], columns: Sequence[str] | None = None) -> None:
    """Write rows to `path` through a temporary file and a rename: never a torn file."""
    path = Path(path)
    if columns is None:
        columns = list(rows[0]) if rows else list(COMMON_COLUMNS)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_format(row.get(c)) for c in columns])
    _atomic_write_text(path, out.getvalue())


def read_rows(path) -> tuple[list[str], list[dict]]:
    """(header, rows as dicts of strings) of a CSV written by write_csv_atomic."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            return [], []
        return header, [dict(zip(header, values, strict=False)) for values in reader]


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


def write_json_atomic(path, payload: dict) -> None:
    text = json.dumps(payload, indent=2, sort_keys=True, default=str)
    _atomic_write_text(Path(path), text + "\n")


class Sidecar:
    """`<csv>.json` beside a results CSV: each run's environment (or a comparison's
    record), keyed by its run id. A run is recorded only once it has finished, so a sweep
    tells finished runs from killed ones by it. One class reads and writes it: a file
    that exists but cannot be read is an error naming it, never "no runs"."""

    def __init__(self, csv_path):
        self.path = Path(f"{csv_path}.json")

    def read(self) -> dict:
        """The whole document ({} when there is no file)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise UsageError(f"{self.path}: cannot read it ({exc.strerror})") from None
        try:
            document = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"{self.path} is not valid JSON ({exc}); repair or delete it "
                             "(it records the runs of the CSV beside it)") from None
        if not isinstance(document, dict) or not isinstance(document.get("runs", {}), dict):
            raise UsageError(f"{self.path} is not a ccbench sidecar (no 'runs' object)")
        return document

    def runs(self) -> dict:
        """run id -> record ({} when there is no file)."""
        return self.read().get("runs", {})

    def check(self) -> None:
        """Refuse, before any work, a sidecar that could not be added to."""
        self.read()

    def add(self, run_id: str, record: dict) -> None:
        """Record one finished run (atomic rewrite, the other runs kept)."""
        document = self.read()
        document.setdefault("runs", {})[run_id] = record
        write_json_atomic(self.path, document)

    def write(self, runs: dict, **sections) -> None:
        write_json_atomic(self.path, {**sections, "runs": runs})


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


def read_results(paths):
    """All rows of the CSV files (or folders of them) as one pandas DataFrame."""
    import pandas as pd

    frames = [pd.read_csv(p) for p in csv_files(paths)]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=list(COMMON_COLUMNS))
    return pd.concat(frames, ignore_index=True, sort=False)
