"""The page's "Should you compress?" section: `ccbench advise`'s table and break-even map,
read from the folder it wrote them to (`ccbench plot --advice DIR`)."""

from __future__ import annotations

import csv
import html
import shutil
from dataclasses import dataclass
from pathlib import Path

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
    except ValueError:
        return value or "-"


def advice_html(advice: Advice) -> list[str]:
    esc = html.escape
    out = [
        "<h2 id='advice'>Should you compress?</h2>",
        "<p>The options for this step ranked by the step time predicted from the parts "
        "this run measured (link rate and step cost, codec rates, the overlap each "
        "variant reached against its floor); an input marked * was assumed, not "
        f"measured (docs/advise.md). Made by <code>{esc(advice.command)}</code>; "
        "<code>ccbench advise --check</code> replays the top options on the emulated "
        "cluster and puts each prediction beside its measurement.</p>",
        "<table class='headlines'><tr><th>#</th><th>Option</th><th>Step (ms)</th>"
        "<th>Exposed comm %</th><th>Exposed codec %</th><th>x ring</th>"
        "<th>x library</th><th>Rel. L2 per step</th><th>Break-even</th></tr>",
    ]
    for r in advice.rows[:SHOWN]:
        mark = " *" if r.get("assumed_inputs") else ""
        out.append(
            f"<tr><td>{esc(r.get('rank', ''))}</td><td>{esc(r['option'])}{mark}</td>"
            f"<td>{_number(r['step_ms'], '.1f')}</td>"
            f"<td>{_number(r.get('exposed_comm_pct', ''), '.1f')}</td>"
            f"<td>{_number(r.get('exposed_codec_pct', ''), '.1f')}</td>"
            f"<td>{_number(r.get('speedup_vs_ring', ''), '.2f')}</td>"
            f"<td>{_number(r.get('speedup_vs_library', ''), '.2f')}</td>"
            f"<td>{_number(r.get('rel_l2_per_step', ''), '.2e')}</td>"
            f"<td>{esc(r.get('break_even_bytes') or '-')}</td></tr>"
        )
    out.append("</table>")
    if advice.check:
        first = advice.check[0]
        loads = f"{first.get('load_start', '?')} -> {first.get('load_end', '?')}"
        out += [
            "<h3>The advice checked: each option replayed on the emulated cluster</h3>",
            "<p>Interleaved rounds of GPT-2 small's step as a trace replay (mean step "
            f"time, 95% interval over rounds; load average {esc(loads)}). The goal: "
            "each prediction within 15% of its measurement, and the advised option the "
            "measured fastest or within the fastest one's interval.</p>",
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
                f"<td>{esc(r.get('suspect_input') or '-')}</td></tr>"
            )
        out.append("</table>")
    else:
        out.append("<p class='note'>Not checked against replays in this run.</p>")
    if advice.map_name:
        out.append(
            f"<figure><img src='{esc(advice.map_name)}' alt='break-even map'>"
            "<figcaption>Break-even map: message size against link rate, each cell "
            "coloured by its fastest option; the contour is where compression starts "
            "to pay.</figcaption></figure>"
        )
    return out
