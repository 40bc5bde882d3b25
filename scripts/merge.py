"""`ccbench merge FILES... -o OUT`: combine result CSVs into one, de-duplicated, losslessly.

Each array task of a sweep writes its own CSV; this joins them. Values are copied as the
strings the benchmark wrote (no float re-formatting), and the runs recorded in the
sources' JSON sidecars are gathered into `OUT.json`.

Schemas. Micro-benchmark (harness) files start with `COMMON_COLUMNS`, in order, followed
by the variant's own columns; different variants may add different columns (the output
holds their union, empty where a variant has none), but every file of one variant alone
(what a run writes) must carry the same columns. Files of any other kind (merged_gradient's
iteration rows, training steps) merge only with files of exactly the same header. A file that breaks
these rules is refused, with its name, and nothing is written.

De-duplication. Harness rows with the same point key (`key_columns`) measured the same
point twice (a rerun, a resumed task): the newest by timestamp is kept. Rows of other
kinds are dropped only when identical.

The point key is defined here, once; the sweep's resume and the regression gate use it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from ccbench.benchmarks.results import (
    COMMON_COLUMNS,
    Sidecar,
    csv_files,
    is_setting,
    read_rows,
    write_csv_atomic,
)
from ccbench.kernels.errors import UsageError

# What identifies one measured point of the harness. The columns a variant adds after
# COMMON_COLUMNS (its settings and configuration axes: block size, density, chunk...) are
# part of the key too, except those that are measurements (below).
POINT_KEY_COLUMNS = (
    "variant", "algorithm", "collective", "codec", "dtype", "buffer",
    "ranks", "nodes", "size_bytes", "link_gbps",
)  # fmt: skip

HARNESS = "harness"


def extra_columns(header: Sequence[str]) -> list[str]:
    """The columns a variant added after the common ones."""
    return [c for c in header if c not in COMMON_COLUMNS]


def key_columns(header: Sequence[str]) -> list[str]:
    """The point-key columns of a harness table with this header."""
    extras = [c for c in extra_columns(header) if is_setting(c)]
    return [c for c in POINT_KEY_COLUMNS if c in header] + extras


def point_key(row: dict, columns: Sequence[str]) -> tuple[str, ...]:
    """A row's identity as a tuple of strings; absent columns count as empty."""
    return tuple(str(row.get(c, "") or "") for c in columns)


def schema_of(header: Sequence[str]):
    """HARNESS for micro-benchmark files, else the exact header (other kinds of CSV)."""
    return HARNESS if tuple(header[: len(COMMON_COLUMNS)]) == COMMON_COLUMNS else tuple(header)


def describe_schema(schema, header: Sequence[str]) -> str:
    if schema == HARNESS:
        return "micro-benchmark rows"
    missing = [c for c in COMMON_COLUMNS if c not in header]
    if len(missing) < len(COMMON_COLUMNS) // 2:
        return f"an older or other harness schema (no {', '.join(missing[:4]) or 'order'})"
    return f"other columns ({', '.join(header[:4])}, ...)"


def merge_rows(paths: Iterable[Path]) -> tuple[list[str], list[dict], dict]:
    """Read, check and de-duplicate. Returns (columns, rows, summary)."""
    schema = first_path = first_header = None
    columns: list[str] = []
    seen_columns: dict[str, tuple[tuple[str, ...], Path]] = {}
    tables = []
    for path in paths:
        header, rows = read_rows(path)
        if not header:
            continue  # an empty file: nothing finished in it
        this = schema_of(header)
        if schema is None:
            schema, first_path, first_header = this, path, header
            columns = list(COMMON_COLUMNS) if this == HARNESS else list(header)
        elif this != schema:
            raise UsageError(
                f"{path} holds {describe_schema(this, header)} but {first_path} holds "
                f"{describe_schema(schema, first_header)}; refusing to mix schemas"
            )
        if schema == HARNESS:
            variants = {r["variant"] for r in rows}
            # a file of one variant (what a run writes) declares that variant's columns;
            # a merged file carries the union of several, checked when it was merged
            if len(variants) == 1:
                (variant,) = variants
                extras = tuple(extra_columns(header))
                first = seen_columns.setdefault(variant, (extras, path))
                if first[0] != extras:
                    raise UsageError(
                        f"{path}: variant {variant} has columns {list(extras)} but "
                        f"{first[1]} has {list(first[0])}; refusing to mix schemas"
                    )
            columns += [c for c in extra_columns(header) if c not in columns]
        tables.append(rows)
    keys = key_columns(columns) if schema == HARNESS else columns
    newest: dict[tuple[str, ...], dict] = {}
    read = 0
    for rows in tables:
        for row in rows:
            read += 1
            k = point_key(row, keys)
            kept = newest.get(k)
            if kept is None or row.get("timestamp", "") >= kept.get("timestamp", ""):
                newest[k] = row
    merged = list(newest.values())
    if schema == HARNESS:
        merged.sort(key=_sort_key)
    summary = {"files": len(tables), "rows_read": read, "rows_written": len(merged),
               "duplicates_dropped": read - len(merged),
               "schema": "harness" if schema == HARNESS else "other"}  # fmt: skip
    return columns, merged, summary


def _sort_key(row: dict):
    def num(v):
        try:
            return float(v)
        except (TypeError, ValueError):
            return float("inf")

    return (row["variant"], row["algorithm"], row["collective"], row["codec"], row["dtype"],
            row["buffer"], num(row["ranks"]), num(row["link_gbps"]),
            num(row["size_bytes"]))  # fmt: skip


def merge_files(inputs: Sequence, out, sidecar: bool = True) -> dict:
    """Merge the CSVs named or found under `inputs` into `out` (plus `out`.json)."""
    out = Path(out)
    paths = [p for p in csv_files(inputs) if p.resolve() != out.resolve()]
    if not paths:
        raise UsageError("no CSV files to merge")
    columns, rows, summary = merge_rows(paths)
    write_csv_atomic(out, rows, columns)
    if not sidecar:
        return summary
    # the sources' sidecars hold each run's environment, keyed by run id: keep them all
    runs = {}
    for p in paths:
        runs.update(Sidecar(p).runs())
    Sidecar(out).write(runs, merge={**summary, "sources": [str(p) for p in paths]})
    return summary


def schema_groups(paths: Iterable[Path]) -> dict:
    """Non-empty files by schema: HARNESS, or the exact header of another kind of file."""
    groups: dict = {}
    for path in paths:
        header, _ = read_rows(path)
        if header:
            groups.setdefault(schema_of(header), []).append(path)
    return groups


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="ccbench merge",
        description="Combine result CSVs (files or folders) into one de-duplicated CSV.",
    )
    parser.add_argument("inputs", nargs="+", metavar="FILE", help="CSV files or folders")
    parser.add_argument("-o", "--output", required=True, type=Path, help="merged CSV to write")
    parser.add_argument("--no-sidecar", action="store_true",
                        help="write no OUT.json (the runs' environments: host paths, "
                             "variables), e.g. for a reference tracked in git")
    opts = parser.parse_args(argv)
    try:
        s = merge_files(opts.inputs, opts.output, sidecar=not opts.no_sidecar)
    except UsageError as e:
        print(f"ccbench merge: {e}", file=sys.stderr)
        return 2
    print(f"merged {s['files']} files, {s['rows_read']} rows -> {s['rows_written']} rows "
          f"({s['duplicates_dropped']} duplicates dropped) into {opts.output}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
