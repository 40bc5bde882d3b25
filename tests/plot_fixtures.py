"""The plotting tests' results folder and drawing helpers: `build_results` writes every
kind of CSV the plotting stage reads (rows from tests/plot_benchmark_rows.py and
tests/plot_training_rows.py, sidecars beside them; tests/conftest.py makes it a
fixture), `write` and `sidecar` write one, and `draw`, `note_lines` and `legend_labels`
draw one figure and read what it prints."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from ccbench.benchmarks.results import MGWFBP_COLUMNS as SIMULATE_COLUMNS
from ccbench.benchmarks.results import REPLAY
from ccbench.benchmarks.training import COLUMNS as TRAINING_COLUMNS
from ccbench.collectives.mgwfbp import PROFILE_COLUMNS
from ccbench.plots import cli
from ccbench.scripts.comparisons.rounds import COLUMNS as COMPARE_COLUMNS
from tests.plot_benchmark_rows import SWEEP, codec_rows, compare_rows, seed000_rows, seed001_rows
from tests.plot_training_rows import (
    mgwfbp_training_rows,
    profile_rows,
    replay_rows,
    seed002_rows,
    training_rows,
)


def write(path: Path, rows: list[dict], columns=None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = columns or list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def sidecar(path: Path, runs: dict[str, str]) -> None:
    """The JSON sidecar a producer writes beside its CSV: each launch's sweep."""
    Path(f"{path}.json").write_text(
        json.dumps(
            {"runs": {run: {"run_id": run, "sweep_id": sweep} for run, sweep in runs.items()}}
        )
    )


def build_results(root: Path, sizes=(1 << 16, 1 << 20, 1 << 24)) -> Path:
    """A results folder holding every kind of CSV the plotting stage reads."""
    write(root / "seed000_link.csv", seed000_rows(sizes, ranks=4, link=1.0))
    write(root / "seed000_shm.csv", seed000_rows(sizes[:2], ranks=2, link=0, run="run-b"))
    write(root / "sparse.csv", seed001_rows())
    for model, n, seed in (("resnet50", 24, 1), ("bert", 12, 2)):
        write(root / "profiles" / f"{model}.csv", profile_rows(model, n, seed), PROFILE_COLUMNS)
    fit, iteration, simulation = seed002_rows()
    write(root / "costfit.csv", fit)
    write(root / "mgwfbp.csv", iteration, SIMULATE_COLUMNS)
    write(root / "simulate.csv", simulation, SIMULATE_COLUMNS)
    sidecar(write(root / "codecs.csv", codec_rows()), {"codec-run": SWEEP})
    sidecar(
        write(root / "training.csv", training_rows(), TRAINING_COLUMNS),
        {"baseline": SWEEP, "p2p_compressed": SWEEP, "coll_compressed": SWEEP},
    )
    sidecar(
        write(root / "training-mgwfbp.csv", mgwfbp_training_rows(), TRAINING_COLUMNS), {"mg": SWEEP}
    )
    write(root / "compare.csv", compare_rows(), COMPARE_COLUMNS)
    write(root / "replay.csv", replay_rows(), REPLAY.names)
    return root


def draw(spec_name: str, data, style):
    spec = next(s for s in cli.all_figures() if s.name == spec_name)
    return spec.draw(data, style)


def note_lines(ax) -> list[str]:
    """The lines of the note beside a panel."""
    legend = ax.get_legend()
    return [t.get_text() for t in legend.get_texts()] if legend is not None else []


def legend_labels(fig) -> list[str]:
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]
