"""index.html: every figure with its caption, the headline table, and what was skipped.

Static HTML next to the images (no server, no scripts, no timestamps), so the folder
can be zipped, mailed or served as it is and two renders of the same CSVs are equal.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from pathlib import Path

from ccbench.plots import regime, two_level
from ccbench.plots.advice import Advice, advice_html
from ccbench.plots.base import Headline
from ccbench.plots.headlines import REPRODUCTION_RULE

PAPERS = {
    "seed 000": "Seed 000: compression-assisted Allgather and Reduce-Scatter",
    "seed 001": "Seed 001: OmniReduce, sparse streaming aggregation",
    "seed 002": "Seed 002: MG-WFBP, merged-gradient wait-free backpropagation",
    "general": "General: bandwidth and codec throughput",
}

CSS = """
body { font-family: sans-serif; max-width: 60em; margin: 1.5em auto; padding: 0 1em;
       color: #222; line-height: 1.4; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left;
         vertical-align: top; }
th { background: #f2f2f2; }
figure { margin: 1em 0 2.5em; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.92em; color: #333; }
.note { color: #8a5a00; }
ul.notes { font-size: 0.85em; color: #333; }
.rule { font-size: 0.88em; }
.error { color: #b00020; }
code { background: #f4f4f4; padding: 0 0.2em; }
"""


@dataclass
class RenderedFigure:
    name: str
    paper: str
    title: str
    caption: str
    files: list[Path]
    notes: list[tuple[str, list[str]]] = field(default_factory=list)  # (panel, lines)
    claims: list = field(default_factory=list)  # what the notes state (plots/claims.py)
    problems: list[str] = field(default_factory=list)  # plots/figure_check.py's findings
    drawn: object = None  # the matplotlib Figure (closed), for the page-wide checks


@dataclass
class Section:
    """The figures and headline numbers of one regime (links, shared memory, models)."""

    key: str
    heading: str
    figures: list[RenderedFigure]
    headlines: list[Headline]
    intro: str = ""  # what it says before its figures, from its rows (section_text.py)


@dataclass
class ReportContent:
    inputs: list[tuple[str, str, str]]  # (file, what, status class)
    figures: list[RenderedFigure] = field(default_factory=list)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # (paper, title, why)
    headlines: list[Headline] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    run: str = ""  # the run every figure is drawn from
    runs: tuple[str, ...] = ()  # or the runs drawn together, each curve from one
    sections: list[Section] = field(default_factory=list)  # by regime, when several
    advice: Advice | None = None  # `ccbench advise`'s table and map, when given
    footer: str = ""  # under the headline tables: how the numbers were measured
    # the page check's findings (plots/page_check.py), None when it did not run
    contradictions: list[str] | None = None


def esc(text) -> str:
    return html.escape(str(text), quote=True)


def headline_table(headlines: list[Headline]) -> list[str]:
    if not headlines:
        return [
            "<p class='note'>No headline numbers: the results hold none of the "
            "comparisons the papers quote.</p>"
        ]
    out = [
        "<table class='headlines'>",
        "<tr><th>Paper</th><th>Claim</th><th>The paper</th>"
        "<th>Measured here: change of B against A (95% interval)</th><th>Margin</th>"
        "<th>Verdict</th><th>Against the paper</th><th>Rounds x iterations</th>"
        "<th>Where measured</th></tr>",
    ]
    for h in headlines:
        out.append(
            f"<tr><td>{esc(h.paper)}</td><td>{esc(h.claim)}</td>"
            f"<td>{esc(h.published)}</td><td><b>{esc(h.measured)}</b></td>"
            f"<td>{esc(h.margin or '-')}</td><td>{esc(h.verdict)}</td>"
            f"<td><b>{esc(h.against_paper or '-')}</b></td><td>{esc(h.samples)}</td>"
            f"<td>{esc(h.where)}</td></tr>"
        )
    out.append("</table>")
    out.append(f"<p class='rule'>{REPRODUCTION_RULE}</p>")
    return out


def write_index(outdir: Path, content: ReportContent) -> Path:
    """Write OUTDIR/index.html and return its path."""
    out = [
        "<!DOCTYPE html>",
        "<html lang='en'><head><meta charset='utf-8'>",
        "<title>ccbench figures</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>ccbench figures</h1>",
    ]
    if content.run:
        out.append(
            f"<p>Every figure and number below comes from one run: <b>{esc(content.run)}</b>.</p>"
        )
    elif content.runs:
        out.append(
            f"<p>{len(content.runs)} runs drawn together, each curve from one of them "
            f"({esc('; '.join(content.runs))}); notes that pair two curves (ratios, "
            "speed-ups) pair rows of one run only.</p>"
        )
    if content.sections:
        out += sectioned(content)
    else:
        out += unsectioned(content)
    if content.advice is not None:
        out += advice_html(content.advice)
    out += check_html(content.contradictions)
    out.append("<h2>Inputs</h2><table><tr><th>File</th><th>Read as</th></tr>")
    for name, what, status in content.inputs:
        out.append(
            f"<tr><td><code>{esc(name)}</code></td><td class='{esc(status)}'>{esc(what)}</td></tr>"
        )
    out.append("</table>")
    if content.notes:
        out.append("<h2>Notes</h2><ul>")
        out += [f"<li class='note'>{esc(n)}</li>" for n in content.notes]
        out.append("</ul>")
    out.append("</body></html>")
    path = outdir / "index.html"
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path


def footer_html(content: ReportContent) -> list[str]:
    return [f"<p>{esc(content.footer)}</p>"] if content.footer else []


def check_html(contradictions: list[str] | None) -> list[str]:
    """The page check's verdict on this page: every note, caption and section text that
    states a direction or a number, compared with the rows drawn."""
    if contradictions is None:
        return []
    out = ["<h2 id='page-check'>Page check</h2>"]
    if not contradictions:
        return out + [
            "<p>Every note, caption and section text that states a direction or a "
            "number agrees with the rows drawn (plots/page_check.py), and no figure has "
            "an empty panel, a legend entry for a marker it does not draw, a series "
            "hidden under another, one quantity in two units, a series off its axis, "
            "or a colour that means two things on this page "
            "(plots/figure_check.py).</p>"
        ]
    out.append(
        f"<p class='error'>{len(contradictions)} sentence(s) of this page disagree with "
        "the rows drawn, or figure(s) hide or mislabel what they draw:</p><ul>"
    )
    out += [f"<li class='error'>{esc(c)}</li>" for c in contradictions]
    return out + ["</ul>"]


def contents_items(figures) -> list[str]:
    """One link per figure; a title several figures share names each by its file."""
    counts: dict[str, int] = {}
    for f in figures:
        counts[f.title] = counts.get(f.title, 0) + 1
    return [
        f"<li><a href='#{esc(f.name)}'>{esc(f.title)}"
        + (f" ({esc(f.name)})" if counts[f.title] > 1 else "")
        + "</a></li>"
        for f in figures
    ]


def sentences(text: str) -> list[str]:
    return [part for part in re.split(r"(?<=\.)\s+(?=[A-Z])", text.strip()) if part]


def shared_sentences(figures: list[RenderedFigure]) -> list[str]:
    """Sentences that two or more captions of these figures share (long ones: the
    explanations, not a short 'Not shown: ...'), in the order they first appear."""
    seen: dict[str, int] = {}
    for fig in figures:
        for sentence in dict.fromkeys(sentences(fig.caption)):
            seen[sentence] = seen.get(sentence, 0) + 1
    return [s for s, n in seen.items() if n >= 2 and len(s) >= 60]


def shared_html(shared: list[str]) -> list[str]:
    if not shared:
        return []
    return [
        "<p class='shared'><b>In the captions below:</b> "
        + esc(" ".join(shared))
        + " (said once here, left out of each caption)</p>"
    ]


def figure_html(fig: RenderedFigure, shared=()) -> list[str]:
    caption = " ".join(s for s in sentences(fig.caption) if s not in shared)
    png = next((p for p in fig.files if p.suffix == ".png"), None)
    others = " ".join(
        f"<a href='{esc(p.name)}'>{esc(p.suffix[1:].upper())}</a>"
        for p in fig.files
        if p.suffix != ".png"
    )
    out = [f"<figure id='{esc(fig.name)}'><h3>{esc(fig.title)}</h3>"]
    if png is not None:
        out.append(f"<img src='{esc(png.name)}' alt='{esc(fig.title)}'>")
    out.append(f"<figcaption>{esc(caption)} {others}</figcaption>")
    if fig.notes:  # the notes drawn under the panels, as text to read and copy
        out.append("<ul class='notes'>")
        out += [
            f"<li><i>{esc(panel)}</i>: " + "<br>".join(esc(line) for line in lines) + "</li>"
            for panel, lines in fig.notes
        ]
        out.append("</ul>")
    out.append("</figure>")
    return out


# sections where no paper's claim is judged: models (no network), nodes (the papers'
# collectives are flat)
NO_HEADLINES = ("models", "nodes")


def sectioned(content: ReportContent) -> list[str]:
    """The page by regime: each with its headline numbers, then its figures by paper."""
    out = ["<h2>Contents</h2><ul>"]
    for section in content.sections:
        out.append(f"<li><a href='#{esc(section.key)}'>{esc(section.heading)}</a><ul>")
        out += contents_items(section.figures)
        out.append("</ul></li>")
    out += contents_tail(content)
    out.append("</ul>")
    for section in content.sections:
        out.append(f"<h2 id='{esc(section.key)}'>{esc(section.heading)}</h2>")
        if section.intro:
            out.append(f"<p>{esc(section.intro)}</p>")
        if section.key not in NO_HEADLINES:
            out.append("<h3>Headline numbers: measured next to the papers'</h3>")
            out += headline_table(section.headlines)
            out += regime.page_link(section.figures, section.headlines)
            out += two_level.page_link(section.figures)
        shared = shared_sentences(section.figures)
        out += shared_html(shared)
        for paper in PAPERS:
            out += [
                line
                for fig in section.figures
                if fig.paper == paper
                for line in figure_html(fig, shared)
            ]
    if content.skipped:
        out.append("<h2>Not drawn</h2>")
        out += [
            f"<p class='note'><b>{esc(title)}</b>: {esc(why)}</p>"
            for _, title, why in content.skipped
        ]
    out += footer_html(content)
    return out


def contents_tail(content: ReportContent) -> list[str]:
    """The contents' entries after the figures: the advice and the page check."""
    out = []
    if content.advice is not None:
        out.append("<li><a href='#advice'>Should you compress?</a></li>")
    if content.contradictions is not None:
        out.append("<li><a href='#page-check'>Page check</a></li>")
    return out


def unsectioned(content: ReportContent) -> list[str]:
    out = ["<h2>Headline numbers: measured next to the papers'</h2>"]
    out += headline_table(content.headlines)
    out += regime.page_link(content.figures, content.headlines)
    out += two_level.page_link(content.figures)
    out += footer_html(content)
    if content.figures:
        out.append("<h2>Contents</h2><ul>")
        out += contents_items(content.figures) + contents_tail(content)
        out.append("</ul>")
    shared = shared_sentences(content.figures)
    out += shared_html(shared)
    for paper, heading in PAPERS.items():
        figures = [f for f in content.figures if f.paper == paper]
        skipped = [s for s in content.skipped if s[0] == paper]
        if not figures and not skipped:
            continue
        out.append(f"<h2>{esc(heading)}</h2>")
        for fig in figures:
            out += figure_html(fig, shared)
        for _, title, why in skipped:
            out.append(f"<p class='note'>Not drawn: <b>{esc(title)}</b>: {esc(why)}</p>")
    return out


def write_runs_index(outdir: Path, runs: list[tuple[str, str, str]]) -> Path:
    """OUTDIR/index.html when each run is drawn apart: one link per run's own report.
    `runs`: (run label, sub-folder, what became of it)."""
    out = [
        "<!DOCTYPE html>",
        "<html lang='en'><head><meta charset='utf-8'>",
        "<title>ccbench figures: runs</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>ccbench figures, one report per run</h1>",
        "<p>The inputs hold several runs. Rows of different runs are never drawn "
        "together: each run has its own figures and headline table.</p>",
        "<table><tr><th>Run</th><th>Report</th></tr>",
    ]
    for label, folder, what in runs:
        out.append(
            f"<tr><td>{esc(label)}</td><td><a href='{esc(folder)}/index.html'>"
            f"{esc(folder)}/</a> {esc(what)}</td></tr>"
        )
    out.append("</table></body></html>")
    path = outdir / "index.html"
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path
