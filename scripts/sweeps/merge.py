"""`ccbench merge FILES... -o OUT`: combine result CSVs into one, de-duplicated, losslessly.

Each array task of a sweep writes its own CSV; this joins them. Values are copied as the
strings the benchmark wrote (no float re-formatting), and the runs recorded in the
sources' JSON sidecars are gathered into `OUT.json`.

Schemas (benchmarks/results.py). Files of one kind merge: micro-benchmark files may add
variant columns (the output holds their union, empty where a variant has none), but every
file of one variant alone (what a run writes) must carry the same columns; files of the
other kinds merge only with the same columns. Files of an older version of the kind are
brought to the current one. A file that breaks these rules is refused, with its name,
and nothing is written.

De-duplication. Rows that measured the same point (`results.point_identity`, as every
reader of results defines it) are one: the newest by timestamp is kept, when both were
measured where the point says they were. Two rows of one point whose checked provenance
differs (`CHECKED`: the host, the MPI library, the device) are refused, naming the field
and both values, as pyperf refuses runs whose checked metadata differ: keeping either
would silently mix machines in one point.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from ccbench.benchmarks.results import (
    Schema,
    Sidecar,
    Table,
    csv_files,
    point_identity,
    read_rows,
    read_table,
    write_csv_atomic,
)
from ccbench.kernels.errors import UsageError

CHECKED = ("hostname", "mpi_library", "device")  # what must agree within one point


def _table(path: Path) -> Table | None:
    table = read_table(path)
    if table is None:
        header, _ = read_rows(path)
        if header:  # not empty: some other CSV
            raise UsageError(
                f"{path} is not a ccbench result (columns: {', '.join(header[:4])}, ...)"
            )
    return table


def merge_rows(paths: Iterable[Path]) -> tuple[Schema, list[str], list[dict], dict]:
    """Read, check and de-duplicate. Returns (schema, columns, rows, summary)."""
    schema, first = None, None
    columns: list[str] = []
    declared: dict[str, tuple[tuple[str, ...], Path]] = {}
    tables, paths_read = [], []
    for path in paths:
        table = _table(path)
        if table is None:
            continue  # an empty file: nothing finished in it
        if schema is None:
            schema, first = table.schema, path
            columns = list(schema.names)
        elif table.schema is not schema:
            raise UsageError(
                f"{path} holds {table.schema.kind} rows but {first} holds "
                f"{schema.kind} rows; refusing to mix schemas"
            )
        missing = table.missing()
        if missing:
            raise UsageError(
                f"{path}: {table.schema.tag} rows without column(s) "
                f"{', '.join(missing)}; refusing to mix schemas"
            )
        extras = tuple(schema.extras(table.header))
        if not schema.open and extras:
            raise UsageError(
                f"{path}: {schema.kind} rows with columns {list(extras)} that "
                "its schema does not have; refusing to mix schemas"
            )
        variants = {r.get("variant") for r in table.rows}
        # a file of one variant (what a run writes) declares that variant's columns; a
        # merged file carries the union of several, checked when it was merged. A file
        # written before a column was added to its variant lacks it: its rows leave it
        # empty (every column it has is the variant's, in the variant's order)
        if schema.open and len(variants) == 1:
            (variant,) = variants
            now = tuple(schema.extras(schema.variant_columns(variant)))
            older = now and extras == tuple(c for c in now if c in set(extras))
            seen = declared.setdefault(variant, (now if older else extras, path))
            if seen[0] != (now if older else extras):
                raise UsageError(
                    f"{path}: variant {variant} has columns {list(extras)} but "
                    f"{seen[1]} has {list(seen[0])}; refusing to mix schemas"
                )
            extras = now if older else extras
        columns += [c for c in extras if c not in columns]
        tables.append(table)
        paths_read.append(path)
    if schema is None:
        raise UsageError("no result rows to merge")
    newest: dict[tuple[str, ...], tuple[dict, Path]] = {}
    read = 0
    for table, path in zip(tables, paths_read, strict=True):
        for row in table.current():
            read += 1
            key = point_identity(row, schema, columns)
            held = newest.get(key)
            if held is None:
                newest[key] = (row, path)
                continue
            check_provenance(held, (row, path))
            if row.get("timestamp", "") >= held[0].get("timestamp", ""):
                newest[key] = (row, path)
    merged = sorted(
        (row for row, _ in newest.values()), key=lambda r: _sort_key(r, schema, columns)
    )
    summary = {
        "files": len(tables),
        "rows_read": read,
        "rows_written": len(merged),
        "duplicates_dropped": read - len(merged),
        "schema": schema.tag,
    }
    return schema, columns, merged, summary


def check_provenance(a: tuple[dict, Path], b: tuple[dict, Path]) -> None:
    """Refuse two rows of one point measured on different hosts, MPI libraries or devices
    (a field one of them lacks, as older versions do, is not checked)."""
    (first, first_path), (second, second_path) = a, b
    for field in CHECKED:
        x, y = first.get(field) or "", second.get(field) or ""
        if x and y and x != y:
            point = ", ".join(
                f"{k}={first.get(k)}"
                for k in ("variant", "collective", "size_bytes")
                if first.get(k)
            )
            raise UsageError(
                f"{second_path}: the point {point} was measured with {field} "
                f"{y!r} there and {x!r} in {first_path}; refusing to merge rows "
                f"whose {field} differs"
            )


def _sort_key(row: dict, schema: Schema, columns: Sequence[str]):
    def num(v):
        try:
            return (0, float(v), "")
        except (TypeError, ValueError):
            return (1, 0.0, str(v or ""))

    return tuple(num(row.get(c)) for c in schema.identity_columns(columns))


def merge_files(inputs: Sequence, out, sidecar: bool = True) -> dict:
    """Merge the CSVs named or found under `inputs` into `out` (plus `out`.json)."""
    out = Path(out)
    paths = [p for p in csv_files(inputs) if p.resolve() != out.resolve()]
    if not paths:
        raise UsageError("no CSV files to merge")
    _, columns, rows, summary = merge_rows(paths)
    if not sidecar:
        write_csv_atomic(out, rows, columns)
        return summary
    # the sources' sidecars hold each run's environment, keyed by run id: keep them all
    runs = {}
    for p in paths:
        runs.update(Sidecar(p).runs())
    write_csv_atomic(out, rows, columns)
    Sidecar(out).write(runs, merge={**summary, "sources": [str(p) for p in paths]})
    return summary


def schema_groups(paths: Iterable[Path]) -> dict[str, list[Path]]:
    """Non-empty result files by kind (files that are no ccbench result are left out)."""
    groups: dict[str, list[Path]] = {}
    for path in paths:
        table = read_table(path)
        if table is not None and table.rows:
            groups.setdefault(table.schema.kind, []).append(path)
    return groups


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="ccbench merge",
        description="Combine result CSVs (files or folders) into one de-duplicated CSV.",
    )
    parser.add_argument("inputs", nargs="+", metavar="FILE", help="CSV files or folders")
    parser.add_argument("-o", "--output", required=True, type=Path, help="merged CSV to write")
    parser.add_argument(
        "--no-sidecar",
        action="store_true",
        help="write no OUT.json (the runs' environments: host paths, "
        "variables), e.g. for a reference tracked in git",
    )
    opts = parser.parse_args(argv)
    try:
        s = merge_files(opts.inputs, opts.output, sidecar=not opts.no_sidecar)
    except UsageError as e:
        print(f"ccbench merge: {e}", file=sys.stderr)
        return 2
    print(
        f"merged {s['files']} files, {s['rows_read']} rows -> {s['rows_written']} rows "
        f"({s['duplicates_dropped']} duplicates dropped) into {opts.output}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
