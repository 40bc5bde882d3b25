"""The page's "Should you compress?" section: `ccbench advise`'s table and break-even map,
read from the folder it wrote them to (`ccbench plot --advice DIR`)."""

from __future__ import annotations

import csv
import html
import shutil
from dataclasses import dataclass
from pathlib import Path

from ccbench.collectives.compression_model import UNCOMPRESSED, check_verdict
from ccbench.kernels.errors import UsageError

TABLE, MAP, CHECK = "advise.csv", "advise-map.png", "advise-check.csv"
SHOWN = 6  # options in the page's table, best first


@dataclass
class Advice:
    rows: list[dict]  # advise.csv's rows, ranked
    map_name: str  # the break-even map, copied beside index.html ('' if none)
    command: str  # how it was made, for the reader to run again
    check: list[dict]  # advise --check's rows: predicted beside measured ([] if none)


def read_advice(folder: Path, outdir: Path) -> Advice:
    """advise.csv (and its map, copied into `outdir`) from `folder`."""
    table = Path(folder) / TABLE
    if not table.is_file():
        raise UsageError(
            f"--advice {folder}: no {TABLE} there (run `ccbench advise --csv {table}` first)"
        )
    with table.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or "option" not in rows[0] or "step_ms" not in rows[0]:
        raise UsageError(f"{table} is not a table `ccbench advise` wrote")
    map_name = ""
    if (Path(folder) / MAP).is_file():
        outdir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(folder) / MAP, outdir / MAP)
        map_name = MAP
    command_file = Path(folder) / "command.txt"
    command = command_file.read_text().strip() if command_file.is_file() else "ccbench advise"
    check = []
    if (Path(folder) / CHECK).is_file():
        with (Path(folder) / CHECK).open(newline="") as f:
            check = list(csv.DictReader(f))
    return Advice(rows, map_name, command, check)


def _number(value: str, digits: str) -> str:
    try:
        return format(float(value), digits)
    except (TypeError, ValueError):
        return value or "-"


def measured_here(row: dict) -> bool:
    """Whether every input of the row's option was measured on the link, rank count and
    codec asked (tables written before the column: yes)."""
    return (row.get("measured_here") or "yes") == "yes"


def shown_rows(rows: list[dict], shown: int = SHOWN) -> list[dict]:
    """The rows the page's table shows: the first ``shown`` measured ones, then the ring
    and the library wherever they rank (the speed-ups are over them)."""
    measured = [r for r in rows if measured_here(r)]
    keep = measured[:shown]
    keep += [r for r in measured[shown:] if r["option"] in UNCOMPRESSED]
    return keep


def advised_option(advice: Advice) -> str:
    """The option advised: the check's row marked so, else the first one measured here."""
    marked = [r["option"] for r in advice.check if r.get("advised") == "yes"]
    if marked:
        return marked[0]
    first = next((r for r in advice.rows if measured_here(r)), None)
    return first["option"] if first else ""


def advice_words(advice: Advice) -> tuple[str, bool | None]:
    """(the advice in words with its uncertainty and its check's verdict; whether the
    check passed, None when none ran)."""
    advised = advised_option(advice)
    row = next((r for r in advice.rows if r["option"] == advised), None)
    if row is None:
        text = (
            "No option was measured on this link, rank count and codec: nothing is "
            "advised (the options below lack the inputs named)."
        )
    else:
        pays = "compression pays" if advised not in UNCOMPRESSED else "do not compress"
        span = ""
        if row.get("step_low_ms") not in (None, ""):
            span = (
                f" (range {_number(row['step_low_ms'], '.0f')}-"
                f"{_number(row['step_high_ms'], '.0f')} ms over its measured efficiencies)"
            )
        text = (
            f"Advice: {advised} ({pays}), predicted step "
            f"{_number(row['step_ms'], '.0f')} ms{span}, "
            f"x{_number(row.get('speedup_vs_ring', ''), '.2f')} the ring, "
            f"x{_number(row.get('speedup_vs_library', ''), '.2f')} the library."
        )
    if not advice.check:
        return text + " Not checked against replays in this run.", None
    if not advised:
        return text, None
    passed, verdict = check_verdict(advice.check, advised)
    return f"{text} {verdict[0].upper()}{verdict[1:]}.", passed


def _misses(row: dict) -> str:
    """The check table's last cell: the input a miss points at, and whether the option
    was measured here (check CSVs before the column: yes)."""
    said = row.get("suspect_input") or "-"
    if (row.get("measured_here") or "yes") == "no":
        said = "not measured here (inputs assumed; not counted)" + (
            f", {said}" if said != "-" else ""
        )
    return said


def _row_html(r: dict, esc) -> str:
    mark = " *" if r.get("assumed_inputs") else ""
    span = (
        f"{_number(r['step_low_ms'], '.0f')}-{_number(r['step_high_ms'], '.0f')}"
        if r.get("step_low_ms") not in (None, "")
        else "-"
    )
    lacks = esc((r.get("not_measured") or "").replace(";", ", ")) or "-"
    return (
        f"<tr><td>{esc(r.get('rank') or '-')}</td><td>{esc(r['option'])}{mark}</td>"
        f"<td>{_number(r['step_ms'], '.1f')}</td><td>{span}</td>"
        f"<td>{_number(r.get('exposed_comm_pct', ''), '.1f')}</td>"
        f"<td>{_number(r.get('exposed_codec_pct', ''), '.1f')}</td>"
        f"<td>{_number(r.get('speedup_vs_ring', ''), '.2f')}</td>"
        f"<td>{_number(r.get('speedup_vs_library', ''), '.2f')}</td>"
        f"<td>{_number(r.get('rel_l2_per_step', ''), '.2e')}</td>"
        f"<td>{esc(r.get('break_even_bytes') or '-')}</td><td>{lacks}</td></tr>"
    )


HEADER = (
    "<table class='headlines'><tr><th>#</th><th>Option</th><th>Step (ms)</th>"
    "<th>Range (ms)</th><th>Exposed comm %</th><th>Exposed codec %</th><th>x ring</th>"
    "<th>x library</th><th>Rel. L2 per step</th><th>Break-even</th>"
    "<th>Not measured here</th></tr>"
)


def advice_html(advice: Advice) -> list[str]:
    esc = html.escape
    words, passed = advice_words(advice)
    # a failed check in red at the top of the section, where it cannot be missed
    style = "" if passed is None else (" verdict-passed" if passed else " verdict-failed")
    colour = " style='color:#b00020'" if passed is False else ""
    shown = shown_rows(advice.rows)
    apart = [r for r in advice.rows if not measured_here(r)]
    out = [
        "<h2 id='advice'>Should you compress?</h2>",
        f"<p class='verdict{style}'{colour}><b>{esc(words)}</b></p>",
        "<p>The options for this step ranked by the step time predicted from the parts "
        "this run measured (link rate and step cost, codec rates as a step runs them, "
        "the overlap each variant reached against its floor); the range is the step at "
        "the lowest and highest efficiency measured over sizes. An option with an input "
        "not measured on this link, rank count and codec is never ranked: it is listed "
        "apart with what it lacks, and an input marked * was assumed "
        f"(docs/advise.md). Made by <code>{esc(advice.command)}</code>.</p>",
        HEADER,
    ]
    out += [_row_html(r, esc) for r in shown]
    out.append("</table>")
    if apart:
        out += [
            "<p>Not measured here (not ranked; their efficiency is taken as the worst "
            "measured of its collective, never better):</p>",
            HEADER,
            *[_row_html(r, esc) for r in apart],
            "</table>",
        ]
    if advice.check:
        first = advice.check[0]
        loads = f"{first.get('load_start', '?')} -> {first.get('load_end', '?')}"
        out += [
            "<h3>The advice checked: each option replayed on the emulated cluster</h3>",
            "<p>Interleaved rounds of the step as a trace replay (mean step time, 95% "
            f"interval over rounds; load average {esc(loads)}). The goals: each "
            "prediction of an option measured here within 15% of its measurement, and the "
            "advised option the measured fastest or within the fastest one's interval. "
            "An option not measured here was predicted from assumed inputs: its row is "
            "shown, not counted.</p>",
            "<table class='headlines'><tr><th>Option</th><th>Predicted (ms)</th>"
            "<th>Measured (ms)</th><th>95% interval</th><th>Prediction off by</th>"
            "<th>Rounds</th><th>Where it misses</th></tr>",
        ]
        for r in advice.check:
            out.append(
                f"<tr><td>{esc(r['option'])}</td>"
                f"<td>{_number(r['predicted_ms'], '.0f')}</td>"
                f"<td><b>{_number(r['measured_ms'], '.0f')}</b></td>"
                f"<td>{_number(r['low_ms'], '.0f')}-{_number(r['high_ms'], '.0f')}</td>"
                f"<td>{_number(r['error_pct'], '+.1f')}%</td>"
                f"<td>{esc(r.get('rounds', ''))}</td>"
                f"<td>{esc(_misses(r))}</td></tr>"
            )
        out.append("</table>")
    if advice.map_name:
        out.append(
            f"<figure><img src='{esc(advice.map_name)}' alt='break-even map'>"
            "<figcaption>Break-even map: message size against link rate, each cell "
            "coloured by its fastest option measured here; the contour is where "
            "compression starts to pay.</figcaption></figure>"
        )
    return out
