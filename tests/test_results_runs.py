"""The results model across several runs and schema versions: a sidecar that keeps every
run, a merge of files of three harness versions (older rows upgraded before they are
compared with current ones), and `ccbench regress` at the edge of each tolerance and with
a gated metric missing. Expected values are worked by hand below."""

from __future__ import annotations

import json

import pytest

from ccbench.benchmarks import results
from ccbench.benchmarks.results import COMMON_COLUMNS, HARNESS, Sidecar, write_csv_atomic
from ccbench.kernels.errors import UsageError
from ccbench.scripts.sweeps import merge
from tests.test_regress import edit, gate, is_zfp, result_rows

# ---------------------------------------------------------------- the sidecar


def test_a_sidecar_keeps_every_run_added_to_it(tmp_path):
    path = tmp_path / "b.csv"
    records = {f"r{k}": {"argv": ["-m", f"{k}K"], "ranks": k} for k in (1, 2, 3)}
    for run_id, record in records.items():
        Sidecar(path).add(run_id, record)
    assert Sidecar(path).runs() == records
    # a second writer of the same CSV (another launch) adds its run beside them
    Sidecar(path).add("r4", {"argv": [], "ranks": 4})
    assert list(Sidecar(path).runs()) == ["r1", "r2", "r3", "r4"]


# ---------------------------------------------------------------- merging versions


def row(**changes) -> dict:
    out = {c: "" for c in COMMON_COLUMNS}
    out.update(
        schema=HARNESS.tag,
        run_id="r3",
        timestamp="2026-03-01T00:00:00",
        variant="baseline",
        algorithm="ring",
        collective="allgather",
        codec="none",
        dtype="float32",
        buffer="numpy",
        ranks="2",
        nodes="1",
        size_bytes="4096",
        iterations="100",
        timing="per-call",
        timer="python",
        barrier="blocking",
        data="gradient",
        hugepages="madvise",
        transport="mpi",
        backend="mpi",
        cuda_graph="0",
        avg_us="30.0",
        validation="Pass",
    )
    out.update(changes)
    return out


def older(version: int, rows: list[dict]) -> tuple[list[str], list[dict]]:
    """Rows as a file of `version` writes them: version 1 had no schema, paging or
    transport columns, version 2 no transport; neither had graph mode or a barrier column."""
    gone = {
        1: (
            "schema",
            "hugepages",
            "transport",
            "backend",
            "host_syncs",
            "device",
            "cuda_graph",
            "barrier",
        ),
        2: ("transport", "backend", "host_syncs", "device", "cuda_graph", "barrier"),
    }[version]
    columns = [c for c in COMMON_COLUMNS if c not in gone]
    tag = {"schema": f"harness/{version}"} if version > 1 else {}
    return columns, [{**{k: v for k, v in r.items() if k in columns}, **tag} for r in rows]


def test_a_merge_of_three_versions_upgrades_before_it_keeps_the_newest(tmp_path):
    """Point 4096 B measured by a version-1 run (10 us), a version-2 run (20 us) and a
    current run (30 us, newest); point 8192 B by the version-1 run alone. Upgraded, the
    three 4096 B rows are one point (over MPI, paging madvise): the newest is kept."""
    v1 = tmp_path / "v1.csv"
    columns, rows = older(
        1,
        [
            row(run_id="r1", timestamp="2026-01-01T00:00:00", avg_us="10.0"),
            row(run_id="r1", timestamp="2026-01-01T00:00:01", size_bytes="8192", avg_us="11.0"),
        ],
    )
    write_csv_atomic(v1, rows, columns)
    v2 = tmp_path / "v2.csv"
    columns, rows = older(2, [row(run_id="r2", timestamp="2026-02-01T00:00:00", avg_us="20.0")])
    write_csv_atomic(v2, rows, columns)
    v3 = tmp_path / "v3.csv"
    write_csv_atomic(v3, [row()], COMMON_COLUMNS)
    for path, run in ((v1, "r1"), (v2, "r2"), (v3, "r3")):
        Sidecar(path).add(run, {"argv": [run]})
    assert [results.read_table(p).version for p in (v1, v2, v3)] == [1, 2, HARNESS.version]

    out = tmp_path / "merged.csv"
    summary = merge.merge_files([v1, v2, v3], out)
    assert (summary["rows_read"], summary["rows_written"], summary["duplicates_dropped"]) == (
        4,
        2,
        2,
    )
    merged = results.read_table(out)
    assert merged.version == 6
    by_size = {r["size_bytes"]: r for r in merged.rows}
    assert sorted(by_size) == ["4096", "8192"]
    assert float(by_size["4096"]["avg_us"]) == 30.0 and by_size["4096"]["run_id"] == "r3"
    assert float(by_size["8192"]["avg_us"]) == 11.0
    assert {(r["schema"], r["transport"], r["backend"], r["hugepages"]) for r in merged.rows} == {
        ("harness/6", "mpi", "mpi", "madvise")
    }
    assert list(json.loads(out.with_name("merged.csv.json").read_text())["runs"]) == [
        "r1",
        "r2",
        "r3",
    ]


# ---------------------------------------------------------------- regress at its edges


def test_exact_metrics_refuse_a_change_in_the_last_digits(tmp_path, capsys):
    """Exact means exact: one byte more of 4 KiB on the wire, a ratio 1e-9 off."""
    one_byte = edit(
        result_rows(),
        lambda r: is_zfp(r) and r["size_bytes"] == 4096,
        wire_bytes_per_rank=lambda w: w + 1,
    )
    assert gate(tmp_path / "a", one_byte) == 1
    assert "wire_bytes_per_rank" in capsys.readouterr().out
    ratio = edit(result_rows(), is_zfp, compression_ratio=lambda c: c * (1 + 1e-9))
    assert gate(tmp_path / "b", ratio) == 1
    # the same values written another way are the same
    respelled = edit(result_rows(), is_zfp, wire_bytes_per_rank=lambda w: float(w))
    assert gate(tmp_path / "c", respelled) == 0


def test_an_error_may_grow_by_exactly_its_tolerance_and_no_more(tmp_path):
    """max_rel_err's bound is +25%: from 0.5, 0.625 is on the bound (binary fractions,
    so the product is exact) and passes; the next float above it fails."""
    import math

    base = edit(result_rows(), is_zfp, max_rel_err=lambda e: 0.5)
    on_edge = edit(result_rows(), is_zfp, max_rel_err=lambda e: 0.625)
    assert gate(tmp_path / "a", on_edge, base) == 0
    past = edit(result_rows(), is_zfp, max_rel_err=lambda e: math.nextafter(0.625, 1))
    assert gate(tmp_path / "b", past, base) == 1


@pytest.mark.parametrize("metric", ["wire_bytes_per_rank", "compression_ratio"])
def test_a_gated_metric_missing_from_the_new_rows_fails(tmp_path, capsys, metric):
    rows = edit(result_rows(), is_zfp, **{metric: lambda v: None})
    assert gate(tmp_path, rows) == 1
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if metric in line]
    assert lines and all(line.startswith("FAIL") and "(missing)" in line for line in lines)


@pytest.mark.parametrize(
    "field, mine, theirs",
    [
        ("hostname", "node-a", "node-b"),
        ("mpi_library", "MPICH 5.0.2", "Open MPI 5.0.8"),
        ("device", "cuda:0", "cpu"),
    ],
)
def test_a_merge_refuses_one_point_measured_in_two_places(tmp_path, field, mine, theirs):
    """The same point (4096 B) from two files whose `field` differs: refused, naming the
    field and both values, and nothing is written; differing elsewhere (8192 B) is fine."""
    a, b, out = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "merged.csv"
    write_csv_atomic(a, [row(run_id="r1", **{field: mine})], COMMON_COLUMNS)
    write_csv_atomic(
        b, [row(run_id="r2", timestamp="2026-03-02T00:00:00", **{field: theirs})], COMMON_COLUMNS
    )
    with pytest.raises(UsageError, match=f"{field} '{theirs}' there and '{mine}'"):
        merge.merge_files([a, b], out)
    assert not out.exists()
    write_csv_atomic(b, [row(run_id="r2", size_bytes="8192", **{field: theirs})], COMMON_COLUMNS)
    assert merge.merge_files([a, b], out)["rows_written"] == 2


def test_a_sidecar_carries_its_version_and_upgrades_an_older_one(tmp_path):
    path = tmp_path / "b.csv"
    Sidecar(path).add("r1", {"ranks": 2})
    assert json.loads(path.with_name("b.csv.json").read_text()) == {
        "sidecar": 2,
        "runs": {"r1": {"ranks": 2}},
    }
    # version 1 (what earlier ccbench wrote): no version key; read as version 2, kept whole
    path.with_name("b.csv.json").write_text(json.dumps({"runs": {"r0": {"ranks": 4}}}))
    assert Sidecar(path).read() == {"sidecar": 2, "runs": {"r0": {"ranks": 4}}}
    Sidecar(path).add("r1", {"ranks": 2})
    assert json.loads(path.with_name("b.csv.json").read_text())["sidecar"] == 2
    path.with_name("b.csv.json").write_text(json.dumps({"sidecar": 3, "runs": {}}))
    with pytest.raises(UsageError, match="sidecar version 3 is newer"):
        Sidecar(path).runs()
