"""The plotting stage from the command line: every figure drawn with an index (the
sections, the headline table's measured values), deterministic output, bad input files
named and the rest drawn, figures skipped for want of data or failing without stopping
the others, usage errors in one line, and `python -m plots`."""

from __future__ import annotations

from pathlib import Path

import pytest

from ccbench.benchmarks.results import COMMON_COLUMNS
from ccbench.benchmarks.training import COLUMNS as TRAINING_COLUMNS
from ccbench.plots import cli
from ccbench.plots.base import FigureSpec
from tests.plot_benchmark_rows import SWEEP, seed000_rows
from tests.plot_fixtures import sidecar, write
from tests.plot_training_rows import training_rows

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("close_figures")]


def test_cli_draws_every_figure_with_index(rendered):
    status, out = rendered
    assert status == 0
    index = (out / "index.html").read_text()
    names = [spec.name for spec in cli.all_figures()]
    # the fixture holds rows of every regime: each figure drawn in the sections of its rows
    # (the two-level figure in the section of the cluster of nodes)
    assert (
        index.index("bandwidth-limited links")
        < index.index("Shared memory")
        < index.index("Codecs, layer profiles and simulations")
    )
    for name in names:
        stems = (
            ["seed002_profile_bert", "seed002_profile_resnet50"]
            if name == "seed002_profile"
            else [name]
        )
        for stem in stems:
            drawn = [
                p
                for p in out.glob(f"{stem}_*.png")
                if p.stem.rsplit("_", 1)[1] in ("links", "nodes", "shm", "models")
            ]
            assert drawn, stem
            for path in drawn:
                assert path.stat().st_size > 5_000
                assert f"src='{path.name}'" in index
    assert "Not drawn" not in index
    # the headline table's measured values, worked by hand from compare_rows():
    # c1 B/A 0.3 [0.25, 0.36]; c2 has p2p as B: 1/1.5 [1/1.7, 1/1.3]; c4 dense/omni 1/0.5
    for measured in (
        "-70.0% (95% interval -75.0% to -64.0%)",
        "-33.3% (95% interval -41.2% to -23.1%)",
        "2.00x (95% interval 1.67x to 2.50x)",
    ):
        assert measured in index, measured
    # the fixture's comparisons ran on links: the shared-memory table points up to them
    links, shm = index.split("Headline numbers: measured")[1:3]
    assert "-70.0% (95% interval" in links
    assert "measured above" in shm and "in the section" in shm


def test_output_is_deterministic(rendered, results, tmp_path):
    _, first = rendered
    only = [
        "--only",
        "seed000_allgather_latency",
        "--only",
        "seed002_iteration_time",
        "--dpi",
        "60",
    ]
    names = ("seed000_allgather_latency_links", "seed002_iteration_time_links")
    assert cli.main([str(results), "-o", str(tmp_path / "a"), *only]) == 0
    assert cli.main([str(results), "-o", str(tmp_path / "b"), *only]) == 0
    for name in names:
        for ext in ("png", "pdf"):
            again = (tmp_path / "b" / f"{name}.{ext}").read_bytes()
            assert again == (tmp_path / "a" / f"{name}.{ext}").read_bytes(), name
        # and the same PNG as the full run: no state leaks from one figure to the next
        assert (tmp_path / "a" / f"{name}.png").read_bytes() == (first / f"{name}.png").read_bytes()
    pdf = (tmp_path / "a" / f"{names[0]}.pdf").read_bytes()
    assert pdf.startswith(b"%PDF") and b"CreationDate" not in pdf


def test_bad_csvs_are_named_and_the_rest_is_drawn(tmp_path, capsys):
    results = tmp_path / "results"
    write(results / "good.csv", seed000_rows([1 << 16, 1 << 20], ranks=2, link=0))
    (results / "empty.csv").write_text("")
    (results / "header_only.csv").write_text(",".join(COMMON_COLUMNS) + "\n")
    rows = seed000_rows([1 << 16], ranks=2, link=0)
    text = ",".join(COMMON_COLUMNS) + "\n" + ",".join(str(rows[0][c]) for c in COMMON_COLUMNS)
    (results / "mixed.csv").write_text(text + "\n" + text.splitlines()[1] + ",extra,fields\n")
    missing = [{k: v for k, v in r.items() if k != "avg_us"} for r in rows]
    write(results / "no_avg.csv", missing)
    typo = seed000_rows([1 << 18], ranks=2, link=0)
    typo[0]["avg_us"] = "n/a?"
    write(results / "typo.csv", typo)
    write(results / "notes.csv", [{"what": "a table of someone's notes", "when": 1}])
    stranger = write(tmp_path / "stranger.csv", [{"what": "not a result", "when": 1}])
    out = tmp_path / "out"
    status = cli.main(
        [str(results), str(stranger), "-o", str(out), "--format", "png", "--only", "allgather"]
    )
    captured = capsys.readouterr()
    assert status == 1
    errors = captured.err
    assert "empty.csv: empty file" in errors
    assert "header_only.csv: header only, no rows" in errors
    assert "mixed.csv: malformed CSV (line 3 has " in errors
    assert (
        "no_avg.csv: looks like micro-benchmark (harness) rows but lacks column(s) avg_us" in errors
    )
    assert "stranger.csv: not a ccbench result CSV" in errors
    assert "notes.csv" not in errors  # found in a folder: ignored, not an error
    assert "notes.csv: ignored, not a ccbench result CSV" in captured.out
    assert (
        f"typo.csv: {len(typo) - 1} rows of micro-benchmark (harness) rows (1 "
        "non-numeric value(s) in avg_us ignored; 1 row(s) without size_bytes/ranks/"
        "avg_us dropped)" in captured.out
    )
    assert (out / "seed000_allgather_latency.png").exists()
    index = (out / "index.html").read_text()
    assert "empty.csv" in index and "lacks column(s) avg_us" in index
    assert not list(out.glob("*.pdf"))


def test_missing_data_skips_only_the_figures_that_need_it(tmp_path, capsys):
    results = tmp_path / "results"
    sidecar(
        write(results / "training.csv", training_rows(steps=6), TRAINING_COLUMNS),
        {"baseline": SWEEP, "p2p_compressed": SWEEP, "coll_compressed": SWEEP},
    )
    out = tmp_path / "out"
    out.mkdir()
    (out / "seed001_wire_bytes.png").write_bytes(b"an old figure")  # from an earlier run
    (out / "seed002_profile_vgg16.pdf").write_bytes(b"an old figure")
    (out / "my_notes.png").write_bytes(b"not ours")
    assert cli.main([str(results), "-o", str(out), "--format", "png"]) == 0
    stdout = capsys.readouterr().out
    drawn = sorted(p.stem for p in out.glob("seed*.png")) + sorted(
        p.name for p in out.glob("*.pdf")
    )
    assert drawn == ["seed000_training_loss", "seed000_training_step_time"]
    assert (out / "my_notes.png").exists()
    assert "seed001_wire_bytes.png: left by an earlier run" in stdout
    index = (out / "index.html").read_text()
    for spec in cli.all_figures():
        if spec.needs != ("training",):
            assert f"skipped [{spec.paper}] {spec.title}: " in stdout
            assert f"Not drawn: <b>{spec.title}</b>" in index
    assert (
        "skipped [seed 001] Allreduce time vs sparsity: no micro-benchmark (harness) "
        "rows in the input" in stdout
    )


def test_a_failing_figure_is_reported_and_the_others_drawn(results, tmp_path, monkeypatch, capsys):
    def broken(data, style):
        raise ValueError("a bug")

    real = next(s for s in cli.all_figures() if s.name == "seed002_iteration_time")
    specs = [FigureSpec("broken", "general", "A broken figure", (), broken), real]
    monkeypatch.setattr(cli, "all_figures", lambda: specs)
    status = cli.main([str(results), "-o", str(tmp_path), "--format", "png", "--dpi", "40"])
    assert status == 1
    assert (
        "error: [general] A broken figure failed: ValueError: a bug (at test_plots_cli.py:"
        in capsys.readouterr().err
    )
    assert (tmp_path / "seed002_iteration_time_links.png").exists()
    assert "A broken figure</b>: failed: ValueError: a bug" in (tmp_path / "index.html").read_text()


def test_figure_needing_more_than_the_data_has_says_why(tmp_path, capsys):
    results = tmp_path / "results"
    only_fp16 = [
        r for r in seed000_rows([1 << 16], ranks=2, link=0) if r["codec"] in ("none", "fp16")
    ]
    write(results / "one_rate.csv", only_fp16)
    assert (
        cli.main([str(results), "-o", str(tmp_path / "out"), "--format", "png", "--only", "rate"])
        == 0
    )
    assert "needs compressed rows at two or more fixed rates" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["no/such/dir"], "no such file or folder"),
        (["EMPTY"], "no CSV files in"),
        (["RESULTS", "--format", "svg"], "--format takes png and/or pdf"),
        ([], "name at least one results CSV"),
        (["RESULTS", "--only", "seed009"], "--only seed009 matches no figure"),
    ],
)
def test_usage_errors_exit_2_with_one_line(argv, message, tmp_path, results, capsys):
    (tmp_path / "empty").mkdir()
    argv = [
        str(tmp_path / "empty") if a == "EMPTY" else str(results) if a == "RESULTS" else a
        for a in argv
    ]
    assert cli.main([*argv, "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ccbench plot: ") and message in err[0]


def test_python_dash_m_plots_lists_the_figures():
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-m", "plots", "--list"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    for spec in cli.all_figures():
        assert spec.name in proc.stdout
