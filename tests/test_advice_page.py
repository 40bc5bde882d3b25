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


def test_an_option_not_measured_here_is_shown_in_the_check_but_not_counted(tmp_path):
    write_advice(tmp_path / "advice")
    common = {"rounds": "3", "suspect_input": "", "load_start": "3.0", "load_end": "3.5"}
    check = [
        {
            "option": ROWS[0]["option"],  # the advised option
            "predicted_ms": "2344",
            "measured_ms": "2439",
            "low_ms": "2357",
            "high_ms": "2522",
            "error_pct": "-3.9",
            "measured_here": "yes",
            **common,
        },
        {
            "option": "ring",
            "predicted_ms": "11515",
            "measured_ms": "8608",
            "low_ms": "8587",
            "high_ms": "8628",
            "error_pct": "33.8",
            "measured_here": "no",
            **common,
            "suspect_input": "efficiency",
        },
    ]
    with (tmp_path / "advice" / "advise-check.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(check[0]))
        writer.writeheader()
        writer.writerows(check)
    page = "\n".join(advice_html(read_advice(tmp_path / "advice", tmp_path / "out")))
    assert "<td>not measured here (inputs assumed; not counted), efficiency</td>" in page
    # 11515 / 8608 - 1 = +33.8%, named after the verdict, which passes on the one counted
    assert "Check passed" in page
    assert "not counted (not measured here, inputs assumed): ring +34%" in page


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


def ranked(option, rank, step_ms, measured="yes", lacks=""):
    return {
        "rank": rank,
        "option": option,
        "step_ms": step_ms,
        "step_low_ms": step_ms * 0.9,
        "step_high_ms": step_ms * 1.1,
        "speedup_vs_ring": "1",
        "speedup_vs_library": "1",
        "measured_here": measured,
        "not_measured": lacks,
        "assumed_inputs": lacks,
    }


def write_rows(folder, rows, check=None):
    folder.mkdir()
    with (folder / "advise.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    if check:
        with (folder / "advise-check.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(check[0]))
            writer.writeheader()
            writer.writerows(check)


def test_the_ring_and_the_library_are_shown_beyond_the_top_rows(tmp_path):
    # eight measured options, the ring 7th and the library 8th; one not measured here
    rows = [ranked(f"coll_compressed:c{k}", str(k), 100.0 * k) for k in range(1, 7)]
    rows += [ranked("ring", "7", 700.0), ranked("library", "8", 800.0)]
    rows += [ranked("coll_compressed:bf16", "", 50.0, "no", "efficiency allgather")]
    write_rows(tmp_path / "advice", rows)
    page = "\n".join(advice_html(read_advice(tmp_path / "advice", tmp_path / "out")))
    assert ">ring</td>" in page and ">library</td>" in page
    # the one not measured here is apart, below the ranked table, with what it lacks,
    # although its 50 ms is the fastest prediction; the advice is the first measured
    assert page.index(">library</td>") < page.index("Not measured here (not ranked")
    assert page.index("Not measured here (not ranked") < page.index(">coll_compressed:bf16 *<")
    assert "<td>efficiency allgather</td>" in page
    assert "Advice: coll_compressed:c1 (compression pays), predicted step 100 ms" in page
    assert "(range 90-110 ms over its measured efficiencies)" in page


def test_a_failed_check_is_said_at_the_top_of_the_section(tmp_path):
    rows = [ranked("coll_compressed:bfp:rate=4", "1", 1000.0), ranked("ring", "2", 2000.0)]
    check = [  # the advised option 28% slower than predicted, outside the fastest's interval
        {
            "option": "coll_compressed:bfp:rate=4",
            "predicted_ms": "1000",
            "measured_ms": "1280",
            "low_ms": "1220",
            "high_ms": "1340",
            "error_pct": "-21.9",
            "advised": "yes",
        },
        {
            "option": "ring",
            "predicted_ms": "1100",
            "measured_ms": "1000",
            "low_ms": "950",
            "high_ms": "1050",
            "error_pct": "10",
            "advised": "no",
        },
    ]
    write_rows(tmp_path / "advice", rows, check)
    page = advice_html(read_advice(tmp_path / "advice", tmp_path / "out"))
    verdict = page[1]  # right under the section's title, before any table
    assert "color:#b00020" in verdict and "Check failed: the advised option" in verdict
    assert "28% slower than predicted (1000 ms) and outside the interval of the " in verdict
    assert "measured fastest, ring (1000 ms, 950-1050)" in verdict
