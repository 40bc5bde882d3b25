"""Result files and the gate's rule at their edges: a CSV header of the same width with
other or reordered columns, numpy scalars in a row, and a ratio exactly at the threshold."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from ccbench.benchmarks.results import append_rows, check_header, read_rows, write_csv_atomic
from ccbench.kernels.errors import UsageError

COLUMNS = ("run_id", "size_bytes", "avg_us")
ROW = {"run_id": "r1", "size_bytes": 4096, "avg_us": 12.5}


# ----------------------------------------------------------------------------- CSV headers


@pytest.mark.parametrize(
    "other",
    [
        ("run_id", "avg_us", "size_bytes"),  # the same names, two swapped
        ("avg_us", "run_id", "size_bytes"),  # rotated
        ("run_id", "size_bytes", "p50_us"),  # one renamed, same width
    ],
)
def test_same_width_but_other_columns_is_refused_and_the_file_kept(tmp_path, other):
    path = tmp_path / "r.csv"
    append_rows(path, [ROW], COLUMNS)
    before = path.read_bytes()
    with pytest.raises(UsageError, match="other columns"):
        check_header(path, other)
    with pytest.raises(UsageError, match="other columns"):
        append_rows(path, [dict(zip(other, ("r2", 1, 2), strict=True))], other)
    assert path.read_bytes() == before  # a swapped header would put times under sizes


def test_the_same_columns_append_and_keep_the_earlier_rows(tmp_path):
    path = tmp_path / "r.csv"
    append_rows(path, [ROW], COLUMNS)
    append_rows(path, [{"run_id": "r2", "size_bytes": 8192, "avg_us": 20.0}], list(COLUMNS))
    header, rows = read_rows(path)
    assert header == list(COLUMNS)
    assert [(r["run_id"], r["size_bytes"], r["avg_us"]) for r in rows] == [
        ("r1", "4096", "12.5"),
        ("r2", "8192", "20.0"),
    ]


def test_a_tool_refuses_a_reordered_header_before_any_work(tmp_path, capsys):
    from ccbench.benchmarks.results import MGWFBP_COLUMNS
    from ccbench.scripts.simulate import main

    path = tmp_path / "sim.csv"
    swapped = list(MGWFBP_COLUMNS)
    swapped[0], swapped[1] = swapped[1], swapped[0]
    path.write_text(",".join(swapped) + "\n")
    before = path.read_bytes()
    assert main(["--ranks", "4", "--csv", str(path), "--quiet"]) == 2
    assert "other columns" in capsys.readouterr().err
    assert path.read_bytes() == before


def test_numpy_floats_are_written_as_numbers(tmp_path):
    # numpy 2 prints np.float64(0.1) as "np.float64(0.1)"; a CSV needs the number
    path = tmp_path / "n.csv"
    write_csv_atomic(
        path,
        [{"a": np.float64(0.1), "b": np.float32(2.5), "c": np.float64("nan"), "d": np.int64(3)}],
        ["a", "b", "c", "d"],
    )
    assert path.read_text() == "a,b,c,d\n0.1,2.5,nan,3\n"
    (row,) = csv.DictReader(path.open())
    assert float(row["a"]) == 0.1


# ----------------------------------------------------------------------------- the gate


def _row(ratio, low, high=None) -> dict:
    return {"ratio": ratio, "ratio_low": low, "ratio_high": high}


def test_the_gate_threshold_is_inclusive_and_the_interval_must_clear_1():
    from ccbench.scripts.comparisons.gate import DEFAULT_SPEC, failed, load_spec

    threshold = load_spec(DEFAULT_SPEC).threshold
    assert threshold == 1.3  # "fail at B/A >= 1.3 with the 95% interval above 1"
    below = float(np.nextafter(1.3, 0.0))
    # (row, fails): at the threshold with the interval above 1 it fails; an interval that
    # reaches 1 or a ratio a hair below the threshold passes
    for row, fails in [
        (_row(1.3, 1.05, 1.6), True),
        (_row(1.3, 1.3, 1.3), True),
        (_row(1.3, 1.0, 1.7), False),
        (_row(1.3, 0.9, 1.9), False),
        (_row(below, 1.2, 1.4), False),
        (_row(2.0, float(np.nextafter(1.0, 2.0)), 4.0), True),
        (_row(1.3, None), False),
        (_row(None, None), False),
    ]:
        assert failed(row, threshold) is fails, row


def test_a_comparison_exactly_at_the_threshold_fails_the_gate():
    from ccbench.scripts.comparisons.gate import failed
    from ccbench.scripts.comparisons.rounds import LAUNCHES, Comparison, Side, result_rows

    def gate_rows(a_us, b_us):
        comparison = Comparison(
            Side("A", ["baseline"]), Side("B", ["baseline"]), "p50", 0.03, LAUNCHES
        )
        for a, b in zip(a_us, b_us, strict=True):
            comparison.add(
                comparison.a, [{"size_bytes": "4096", "p50_us": str(a), "iterations": "10"}]
            )
            comparison.add(
                comparison.b, [{"size_bytes": "4096", "p50_us": str(b), "iterations": "10"}]
            )
        return result_rows(comparison, len(a_us), {})

    # every round 13 us against 10 us: B/A = 1.3 exactly, the interval [1.3, 1.3]
    (row,) = gate_rows([10.0] * 3, [13.0] * 3)
    assert (row["ratio"], row["ratio_low"]) == (1.3, 1.3)
    assert failed(row, 1.3)
    # 12.9 us: B/A = 1.29, below the threshold however sure
    (row,) = gate_rows([10.0] * 3, [12.9] * 3)
    assert not failed(row, 1.3)
    # rounds at 3 and 0.6: B/A = sqrt(1.8) = 1.34 but the interval reaches below 1
    (row,) = gate_rows([10.0, 10.0], [30.0, 6.0])
    assert row["ratio"] == pytest.approx(1.8**0.5) and row["ratio_low"] < 1
    assert not failed(row, 1.3)
