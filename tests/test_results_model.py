"""The results model (benchmarks/results.py): one identity of a point for every reader,
versioned schemas, the sidecar in one module, the raw per-call times beside the rows."""

from __future__ import annotations

import csv
import re

import numpy as np
import pytest
from scipy import stats

from ccbench.benchmarks import results
from ccbench.benchmarks.results import (
    COMMON_COLUMNS,
    HARNESS,
    SCHEMAS,
    TRAINING,
    point_identity,
    write_csv_atomic,
)
from tests.helpers.rows import harness_row
from tests.mpirun import REPO, mpirun, variant_module

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too


@pytest.mark.parametrize(
    "column, other",
    [
        ("data", "gradient-like"),
        ("timing", "batch"),
        ("timer", "python"),
        ("ci_target_pct", "2.0"),
        ("time_budget_s", "5.0"),
        ("transport", "torch"),
        ("backend", "gloo"),
    ],
)
def test_merge_and_plots_keep_apart_rows_that_differ_in_one_setting(tmp_path, column, other):
    """Two rows of one run that differ in one setting measured two points; two that differ
    only in what was measured are one point. Merge and the plots must agree on both."""
    from ccbench.plots.data import load
    from ccbench.scripts.sweeps.merge import merge_rows

    rows = [
        harness_row(),
        harness_row(**{column: other}),
        # the first point again, later and slower: one point, the newest kept
        harness_row(avg_us="20.0", timestamp="2026-01-01T00:01:00"),
    ]
    path = tmp_path / "rows.csv"
    write_csv_atomic(path, rows, COMMON_COLUMNS)
    _, _, merged, _ = merge_rows([path])
    frame = load([path]).get("harness")
    assert len(merged) == len(frame) == 2
    # the other point (10 us) and the newest row of the repeated one (20 us)
    assert sorted(float(r["avg_us"]) for r in merged) == [10.0, 20.0]
    assert sorted(frame["avg_us"].astype(float)) == [10.0, 20.0]


def test_identity_spells_a_value_one_way():
    """'4096' read from text and 4096.0 parsed by pandas are one value; so are '' and NaN."""
    header = list(COMMON_COLUMNS)
    text = harness_row(size_bytes="4096", link_gbps="")
    parsed = harness_row(size_bytes=4096.0, link_gbps=float("nan"))
    assert point_identity(text, HARNESS, header) == point_identity(parsed, HARNESS, header)
    other = harness_row(size_bytes="8192")
    assert point_identity(text, HARNESS, header) != point_identity(other, HARNESS, header)


def test_roles_by_hand():
    # settings say which point, measurements what was measured, provenance which run
    assert HARNESS.role("codec") == "setting" and HARNESS.role("timer") == "setting"
    assert HARNESS.role("avg_us") == "measurement" and HARNESS.role("iterations") == "measurement"
    assert HARNESS.role("run_id") == "provenance" and HARNESS.role("schema") == "provenance"
    assert HARNESS.role("total_bytes") == "derived"
    # a variant's own columns, as its table declares them (benchmarks/schemas.py)
    assert HARNESS.role("density") == "setting" and HARNESS.role("call_us") == "measurement"
    assert HARNESS.role("overlap_efficiency") == "measurement"
    assert HARNESS.role("ranks_per_core") == "setting" and HARNESS.type("block_size") is int
    # a column no table declares (a file an older ccbench wrote): its rule by name
    assert HARNESS.column("old_us") is None and HARNESS.role("old_us") == "measurement"
    assert HARNESS.role("old_knob") == "setting"


def test_every_schema_names_itself_first_and_each_column_once():
    for schema in SCHEMAS:
        assert schema.names[0] == "schema", schema.kind
        assert len(set(schema.names)) == len(schema.names), schema.kind
        assert schema.tag == f"{schema.kind}/{schema.version}"


def test_the_profile_schema_is_the_planners_profile_format():
    from ccbench.collectives.mgwfbp import PROFILE_COLUMNS

    assert results.PROFILE.names[1:] == PROFILE_COLUMNS


def test_an_older_version_is_read_by_its_number_and_upgraded(tmp_path):
    """A training file from before schema versions (no schema column, no warm-up or window
    columns) is version 1; reading it fills in what that version left implicit."""
    from ccbench.plots.data import load

    v1 = [c for c in TRAINING.names if c not in ("schema", "warmup_steps", "final_window")]
    path = tmp_path / "old.csv"
    write_csv_atomic(
        path,
        [
            {
                "run_id": "r",
                "row": "step",
                "step": 1,
                "loss": 2.0,
                "step_us": 10.0,
                "variant": "baseline",
                "codec": "none",
            }
        ],
        v1,
    )
    table = results.read_table(path)
    assert (table.schema, table.version) == (TRAINING, 1)
    (row,) = table.current()
    assert (row["schema"], row["warmup_steps"], row["final_window"]) == (TRAINING.tag, 3, 10)
    assert (row["transport"], row["backend"]) == ("mpi", "mpi")  # before the torch transport
    frame = load([path]).get("training")
    assert frame["warmup_steps"].tolist() == [3]


def test_harness_rows_of_version_1_ran_over_mpi(tmp_path):
    """Before the torch transport every row ran over MPI: version-1 rows say so once
    upgraded; which device a rank used is provenance, not part of a point."""
    v1 = [
        c
        for c in COMMON_COLUMNS
        if c
        not in ("schema", "hugepages", "transport", "backend", "host_syncs", "device", "barrier")
    ]
    path = tmp_path / "old.csv"
    write_csv_atomic(path, [{k: v for k, v in harness_row().items() if k in v1}], v1)
    table = results.read_table(path)
    assert (table.schema, table.version) == (HARNESS, 1)
    (row,) = table.current()
    assert (row["schema"], row["transport"], row["backend"]) == ("harness/6", "mpi", "mpi")
    assert HARNESS.role("transport") == HARNESS.role("backend") == "setting"
    assert HARNESS.role("device") == "provenance"
    assert HARNESS.role("host_syncs") == "measurement"


def test_harness_rows_of_version_3_knew_no_step_cost(tmp_path):
    """Version 3 did not record the fixed cost of a ring step: its files read (and merge)
    as they are, upgraded with that cost unknown, never refused as a mixed schema."""
    v3 = [c for c in COMMON_COLUMNS if c not in ("link_step_us", "barrier")]
    path = tmp_path / "v3.csv"
    write_csv_atomic(path, [harness_row(schema="harness/3", link_step_us="7")], v3)
    table = results.read_table(path)
    assert (table.schema, table.version) == (HARNESS, 3) and table.missing() == []
    (row,) = table.current()
    assert (row["schema"], row["link_step_us"]) == ("harness/6", "")
    assert HARNESS.role("link_step_us") == "provenance"


def test_harness_rows_of_version_4_were_eager_and_never_pair_with_graphed_ones(tmp_path):
    """Version 4 knew no graph mode: its rows read as eager calls (cuda_graph 0), which
    is part of a point's identity, so a graphed row of the same point is another point."""
    v4 = [c for c in COMMON_COLUMNS if c not in ("cuda_graph", "barrier")]
    path = tmp_path / "v4.csv"
    write_csv_atomic(path, [harness_row(schema="harness/4")], v4)
    table = results.read_table(path)
    assert (table.schema, table.version) == (HARNESS, 4) and table.missing() == []
    (eager,) = table.current()
    assert (eager["schema"], eager["cuda_graph"]) == ("harness/6", 0)
    assert HARNESS.role("cuda_graph") == "setting"
    header = [*COMMON_COLUMNS]
    graphed = {**eager, "cuda_graph": "20"}
    assert results.point_identity(eager, HARNESS, header) != results.point_identity(
        graphed, HARNESS, header
    )
    assert results.point_identity(eager, HARNESS, header) == results.point_identity(
        {**eager, "cuda_graph": "0"}, HARNESS, header
    )


def test_harness_rows_of_version_5_had_the_blocking_barrier(tmp_path):
    """Version 5 timed every call behind the transport's own barrier: its rows read as
    `blocking`, which is part of a point's identity (a row timed behind the yielding
    barrier is another point)."""
    v5 = [c for c in COMMON_COLUMNS if c != "barrier"]
    path = tmp_path / "v5.csv"
    write_csv_atomic(path, [harness_row(schema="harness/5")], v5)
    table = results.read_table(path)
    assert (table.schema, table.version) == (HARNESS, 5) and table.missing() == []
    (row,) = table.current()
    assert (row["schema"], row["barrier"]) == ("harness/6", "blocking")
    assert HARNESS.role("barrier") == "setting"
    header = [*COMMON_COLUMNS]
    yielding = {**row, "barrier": "yielding"}
    assert results.point_identity(row, HARNESS, header) != results.point_identity(
        yielding, HARNESS, header
    )


def test_harness_rows_of_version_2_ran_over_mpi_and_keep_their_own_settings(tmp_path):
    """Version 2 recorded the paging and the sparse-streaming settings but not the
    transport: upgraded, its rows ran over MPI, and nothing they recorded is replaced
    (not their paging, not a sparse-streaming setting they gave, none added to a ring)."""
    v2 = [
        c
        for c in COMMON_COLUMNS
        if c not in ("transport", "backend", "host_syncs", "device", "barrier")
    ] + ["block_size"]
    ring = harness_row(schema="harness/2", hugepages="off")
    sparse = harness_row(
        schema="harness/2",
        variant="sparse_streaming",
        algorithm="omnireduce",
        collective="allreduce",
        hugepages="off",
        block_size="64",
    )
    path = tmp_path / "v2.csv"
    write_csv_atomic(path, [{k: r.get(k, "") for k in v2} for r in (ring, sparse)], v2)
    table = results.read_table(path)
    assert (table.schema, table.version) == (HARNESS, 2)
    ring_now, sparse_now = table.current()
    for row in (ring_now, sparse_now):
        assert (row["schema"], row["transport"], row["backend"], row["hugepages"]) == (
            "harness/6",
            "mpi",
            "mpi",
            "off",
        )
    assert ring_now["block_size"] == "" and "fusion" not in ring_now
    assert sparse_now["block_size"] == "64" and "fusion" not in sparse_now


def test_a_variants_own_older_defaults_fill_only_its_rows(tmp_path):
    """Version-1 harness rows: huge pages were numpy's default (madvise) for every row,
    the sparse-streaming settings only for sparse streaming's rows. Filling the latter into
    a ring's row would make it a different point from the same ring measured today."""
    v1 = [c for c in COMMON_COLUMNS if c not in ("schema", "hugepages", "transport", "backend")] + [
        "density"
    ]
    ring = {
        "variant": "p2p_compressed",
        "algorithm": "ring",
        "collective": "allgather",
        "size_bytes": 4096,
    }
    sparse = {
        "variant": "sparse_streaming",
        "algorithm": "omnireduce",
        "collective": "allreduce",
        "size_bytes": 4096,
        "density": 0.1,
    }
    path = tmp_path / "old.csv"
    write_csv_atomic(path, [ring, sparse], v1)
    table = results.read_table(path)
    assert (table.schema, table.version) == (HARNESS, 1)
    ring_now, sparse_now = table.current()
    assert ring_now["hugepages"] == sparse_now["hugepages"] == "madvise"
    assert "block_size" not in ring_now and "aggregators" not in ring_now
    assert (
        sparse_now["block_size"],
        sparse_now["fusion"],
        sparse_now["overlap"],
        sparse_now["threshold"],
        sparse_now["aggregators"],
    ) == (256, 1024, "random", 0.0, 0)


def test_a_newer_version_is_refused_in_one_line(tmp_path):
    path = tmp_path / "future.csv"
    write_csv_atomic(path, [harness_row(schema="harness/99")], COMMON_COLUMNS)
    with pytest.raises(results.UsageError, match="version 99: this ccbench reads up to"):
        results.read_table(path)


# JSON files that are no sidecar of a results CSV: the emulated cluster's state, the
# checkpoints of interrupted comparisons
NOT_SIDECARS = ("scripts/cluster/layout.py", "scripts/comparisons/checkpoint.py")


def test_sidecar_files_are_read_and_written_in_one_module():
    """No other module builds `<csv>.json` or parses it: they all go through Sidecar."""
    offenders = []
    for folder in ("kernels", "collectives", "training", "benchmarks", "plots", "scripts"):
        for path in (REPO / folder).rglob("*.py"):
            name = str(path.relative_to(REPO))
            if name == "benchmarks/results.py" or name in NOT_SIDECARS:
                continue
            text = path.read_text()
            if re.search(r"""\}\.json["']""", text) and "Sidecar" not in text:
                offenders.append(str(path.relative_to(REPO)))
    assert not offenders


@pytest.mark.timeout(120)
def test_the_raw_times_beside_a_run_give_back_its_statistics(tmp_path):
    """The per-call times kept in <csv>.samples/<run id>.npz, recomputed here with numpy
    and scipy alone, give each row's mean, percentiles, fastest call and interval."""
    out = tmp_path / "b.csv"
    proc = mpirun(
        2,
        [
            *variant_module("baseline"),
            "--algorithm",
            "ring",
            "-m",
            "4K:8K",
            "-i",
            "40",
            "-x",
            "2",
            "--csv",
            out,
        ],
    )
    assert proc.returncode == 0, proc.stderr
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    samples = results.Samples(out).read(rows[0]["run_id"])
    assert sorted(samples) == ["4096|", "8192|"]
    for row in rows:
        t = samples[f"{row['size_bytes']}|"].astype(np.float64)  # ranks x calls, us
        assert t.shape == (2, 40)
        slowest = t.max(axis=0)
        per_call = t.mean(axis=0)
        half = stats.t.ppf(0.975, 39) * per_call.std(ddof=1) / np.sqrt(40)
        expect = {
            "avg_us": t.mean(),
            "min_us": t.mean(axis=1).min(),
            "max_us": t.mean(axis=1).max(),
            "p50_us": np.percentile(slowest, 50),
            "p99_us": np.percentile(slowest, 99),
            "fastest_us": slowest.min(),
        }
        if per_call.mean() - half > 0:  # else a bootstrap interval (test_statistics)
            expect.update(ci_low_us=per_call.mean() - half, ci_high_us=per_call.mean() + half)
        else:
            low, high = float(row["ci_low_us"]), float(row["ci_high_us"])
            assert per_call.min() * 0.999 <= low < t.mean() < high <= per_call.max() * 1.001
        for column, value in expect.items():
            # float32 storage: 7 significant digits
            assert float(row[column]) == pytest.approx(value, rel=2e-6), column
