"""The page's "Should you compress?" section, from a table and map `ccbench advise` wrote:
the ranked options in order, the assumed inputs marked, the map copied beside the page;
a folder without the table is refused in one line before anything is drawn."""

from __future__ import annotations

import csv

import pytest

from ccbench.plots import cli
from ccbench.plots.advice import advice_html, read_advice
from ccbench.plots.advise_map import option_colours

ROWS = [  # two options, worked by hand: 3.3 s against the ring's 8.6 s is x2.61
    {
        "rank": "1",
        "option": "coll_compressed bfp:rate=8",
        "step_ms": "3300.04",
        "exposed_comm_pct": "41.25",
        "exposed_codec_pct": "3.5",
        "speedup_vs_ring": "2.6060",
        "speedup_vs_library": "2.2",
        "rel_l2_per_step": "0.0097",
        "break_even_bytes": "65536",
        "assumed_inputs": "",
    },
    {
        "rank": "2",
        "option": "ring",
        "step_ms": "8600",
        "exposed_comm_pct": "80",
        "exposed_codec_pct": "0",
        "speedup_vs_ring": "1",
        "speedup_vs_library": "0.85",
        "rel_l2_per_step": "0",
        "break_even_bytes": "",
        "assumed_inputs": "link latency",
    },
]


def write_advice(folder):
    folder.mkdir()
    with (folder / "advise.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(ROWS[0]))
        writer.writeheader()
        writer.writerows(ROWS)
    (folder / "advise-map.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (folder / "command.txt").write_text("ccbench advise --model gpt2-small --ranks 4\n")


def test_the_section_ranks_the_options_and_marks_assumed_inputs(tmp_path):
    write_advice(tmp_path / "advice")
    page = "\n".join(advice_html(read_advice(tmp_path / "advice", tmp_path / "out")))
    assert page.index("coll_compressed bfp:rate=8") < page.index(">ring")
    assert "<td>3300.0</td>" in page and "<td>2.61</td>" in page and "<td>9.70e-03</td>" in page
    assert "ring *</td>" in page and "bfp:rate=8 *" not in page  # only the ring assumed one
    assert "ccbench advise --model gpt2-small --ranks 4" in page
    assert (tmp_path / "out" / "advise-map.png").read_bytes() == b"\x89PNG\r\n\x1a\n"


def test_the_check_puts_each_prediction_beside_its_measurement(tmp_path):
    write_advice(tmp_path / "advice")
    page = "\n".join(advice_html(read_advice(tmp_path / "advice", tmp_path / "out")))
    assert "Not checked against replays" in page
    check = [
        {
            "option": "coll_compressed:bfp:rate=8",
            "predicted_ms": "3319.4",
            "measured_ms": "3560.2",
            "low_ms": "3376",
            "high_ms": "3744",
            "rounds": "3",
            "error_pct": "-6.76",
            "suspect_input": "",
            "load_start": "7.35",
            "load_end": "6.70",
        }
    ]
    with (tmp_path / "advice" / "advise-check.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(check[0]))
        writer.writeheader()
        writer.writerows(check)
    page = "\n".join(advice_html(read_advice(tmp_path / "advice", tmp_path / "out")))
    row = "<td>3319</td><td><b>3560</b></td><td>3376-3744</td><td>-6.8%</td><td>3</td>"
    assert row in page and "load average 7.35 -&gt; 6.70" in page
    assert "Not checked" not in page


def test_plot_refuses_an_advice_folder_without_its_table(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert (
        cli.main([str(tmp_path), "--advice", str(tmp_path / "empty"), "-o", str(tmp_path / "figs")])
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no advise.csv there" in err[0]
    assert not (tmp_path / "figs").exists()


@pytest.mark.parametrize("n", [1, 6, 10, 12, 20])
def test_the_maps_options_never_share_a_colour(n):
    """Twelve options once drew the ring and p2p bfp:rate=4 both orange (tab10 wraps)."""
    colours = option_colours(n)
    assert len(colours) == n and len(set(colours)) == n
