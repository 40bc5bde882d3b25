"""The schemas (benchmarks/schemas.py) declare every column the variants write, with the
type their values have, and the plots read each column as that type.

The rows checked are a real run's: results/reference/ci.csv, the regression reference,
holds every harness variant's rows as `ccbench sweep` wrote them. Each value is parsed
here with Python's own int / float, independently of the readers under test."""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd

from ccbench.benchmarks.results import (
    BY_KIND,
    HARNESS,
    SCHEMAS,
    STAGING,
    build_row,
    read_table,
    write_csv_atomic,
)
from ccbench.kernels import variants
from ccbench.plots.data import KIND_BY_NAME, read_one

REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference" / "ci.csv"


def reference_rows() -> tuple[list[str], list[dict]]:
    with REFERENCE.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames), list(reader)


def parses_as(kind: type, text: str) -> bool:
    try:
        if kind is bool:
            return text in ("True", "False")
        kind(text)
        return True
    except ValueError:
        return False


def test_every_column_a_variant_writes_is_declared_by_its_table():
    header, rows = reference_rows()
    written = {row["variant"] for row in rows}
    assert written == set(variants.HARNESS_VARIANTS)  # every harness variant ran
    for row in rows:
        mine = set(HARNESS.variant_columns(row["variant"]))
        filled = {c for c, v in row.items() if v != ""}
        assert filled <= mine, (row["variant"], sorted(filled - mine))
    # and no table declares a column no variant writes
    assert {c.name for c in HARNESS.known()} == set(header)


def test_every_value_written_parses_as_its_declared_type():
    header, rows = reference_rows()
    for column in header:
        kind = HARNESS.type(column)
        bad = [r[column] for r in rows if r[column] != "" and not parses_as(kind, r[column])]
        assert not bad, (column, kind.__name__, bad[:3])
    # an int column holds no fractions; a number column holds numbers where filled
    assert HARNESS.type("size_bytes") is int and HARNESS.type("avg_us") is float
    assert not parses_as(int, "1.5") and parses_as(float, "1e-3")


def test_the_plots_read_exactly_the_schemas_numbers_as_numbers():
    frame, report = read_one(REFERENCE)
    assert report.error is None and report.kind == "harness"
    numbers = {c for c in frame.columns if pd.api.types.is_numeric_dtype(frame[c])}
    header, _ = reference_rows()
    declared = {c for c in header if HARNESS.type(c) in (int, float)}
    assert numbers == declared, (sorted(numbers - declared), sorted(declared - numbers))
    # text that looks like a number stays text where the schema says text
    assert frame["git_sha"].map(type).eq(str).all()
    for name, kind in KIND_BY_NAME.items():
        assert set(kind.numeric) == {
            c.name for c in BY_KIND[name].known() if c.type in (int, float)
        }


def test_every_kind_declares_each_column_once_with_a_role_and_a_type():
    for schema in SCHEMAS:
        for column in schema.known():
            assert column.role in ("setting", "derived", "measurement", "provenance")
            assert column.type in (str, int, float, bool), (schema.kind, column)
        names = [c.name for c in schema.known()]
        assert len(names) == len(set(names)), schema.kind


def test_staging_rows_are_built_on_their_schema(tmp_path):
    values = {
        "buffer": "cupy",
        "size_bytes": 4096,
        "ranks": 2,
        "d2h_pinned_us": 1.5,
        "host_allgather_us": 2.0,
        "h2d_pinned_us": 0.5,
        "bound_us": 4.0,
        "staged_us": 5.0,
        "staged_vs_bound": 1.25,
        "staged_whole_us": 6.0,
        "rounds": 3,
        "stage_chunk_bytes": 1 << 20,
        "device": "gpu0,gpu1",
    }
    path = tmp_path / "staging.csv"
    write_csv_atomic(path, [build_row(STAGING, values)], STAGING.names)
    assert path.read_text().splitlines()[1].split(",")[0] == "staging/2"
    table = read_table(path)
    assert table.schema is STAGING and not table.missing()
    assert table.identity(table.rows[0]) == ("cupy", "4096", "2", "3", "1048576")
    # a file written before rows named their schema is told by its columns
    old = tmp_path / "old.csv"
    write_csv_atomic(old, [values], list(values))
    assert read_table(old).schema is STAGING and read_table(old).version == 1
    # and the plots leave it out without calling it an error
    _, report = read_one(path)
    assert report.error is None and report.ignored


def test_an_older_files_undeclared_columns_take_their_role_from_their_name():
    """A column no table declares (only a file an older ccbench wrote holds one) is a
    measurement when its name says so (the suffixes that version wrote for times, rates,
    errors, ratios and byte counts, or a listed name), else a setting. So two rows of
    such a file that differ only in a measurement are the same point; a setting tells
    them apart."""
    from ccbench.benchmarks.results import point_identity

    by_hand = {
        "pack_us": "measurement",
        "link_gbps_seen": "setting",  # the suffix must end the name
        "bus_gbps": "measurement",
        "stage_err": "measurement",
        "pack_ratio": "measurement",
        "extra_wire_bytes": "measurement",
        "sent_per_rank": "measurement",
        "psnr_db": "measurement",
        "packing": "setting",
    }
    assert {name: HARNESS.role(name) for name in by_hand} == by_hand
    assert STAGING.role("pack_us") == "setting"  # a closed schema keeps no older columns
    header = [*HARNESS.names, "pack_us", "packing"]
    row = {c: "" for c in header} | {"variant": "baseline", "size_bytes": "4096"}
    same = point_identity(row | {"pack_us": "1.5"}, HARNESS, header)
    assert same == point_identity(row | {"pack_us": "9.0"}, HARNESS, header)
    assert same != point_identity(row | {"pack_us": "1.5", "packing": "tight"}, HARNESS, header)
