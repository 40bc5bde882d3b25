"""`ccbench plot RESULTS... -o OUTDIR`: redraw the seed papers' figures from CSVs.

Reads result CSVs only (never reruns a benchmark), draws every figure the data allow as
PNG and PDF, skips the others with the reason, and writes OUTDIR/index.html. The rows
of one run only (one sweep, or one launch outside a sweep) are drawn together: inputs
holding several runs are refused unless --run picks one or --each-run draws each apart.
Exit status: 0 all inputs read; 1 some input file was bad or a figure failed (the rest
are still drawn); 2 usage error (no such path, no CSV at all, several runs).
"""

from __future__ import annotations

import argparse
import re
import sys
import traceback
from dataclasses import replace
from pathlib import Path

from ccbench.kernels.errors import UsageError
from ccbench.plots import (
    breakdown,
    compression,
    general,
    gradient_merging,
    headlines,
    regime,
    sparse_allreduce,
    traces,
    training_runs,
    two_level,
)
from ccbench.plots.advice import read_advice
from ccbench.plots.base import Skip
from ccbench.plots.data import MODEL_KINDS, REGIMES, RUN, TITLES, Data, Run, load
from ccbench.plots.figure_check import check_figure, colour_meanings, has_data
from ccbench.plots.page_check import check_page
from ccbench.plots.report import (
    NO_HEADLINES,
    RenderedFigure,
    ReportContent,
    Section,
    write_index,
    write_runs_index,
)
from ccbench.plots.section_text import footer_text, section_intro
from ccbench.plots.style import PNG_DPI, Style, close_all, note_texts, save

REGIME_HEADINGS = dict(REGIMES)

MODULES = (
    compression,
    training_runs,
    sparse_allreduce,
    gradient_merging,
    general,
    breakdown,
    traces,
    regime,
    two_level,
)
DEFAULT_OUTDIR = "results/figures"
FORMATS = ("png", "pdf")


def all_figures():
    return [spec for module in MODULES for spec in module.FIGURES]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ccbench plot",
        description="Draw the seed papers' figures from ccbench result CSVs "
        "(files or folders searched recursively).",
        epilog="Exit status: 0 all inputs read, 1 a bad input file or a failed figure "
        "(the others are still drawn), 2 usage error.",
    )
    parser.add_argument(
        "results", nargs="*", metavar="RESULTS", help="CSV files or folders of them"
    )
    parser.add_argument(
        "-o",
        "--outdir",
        default=DEFAULT_OUTDIR,
        help=f"where figures and index.html go (default {DEFAULT_OUTDIR})",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="TEXT",
        default=[],
        help="draw only figures whose name contains TEXT (repeatable)",
    )
    parser.add_argument(
        "--format",
        default=",".join(FORMATS),
        help="comma-separated image formats, of png and pdf (default both)",
    )
    parser.add_argument(
        "--dpi",
        type=int,
        default=PNG_DPI,
        help=f"PNG resolution (default {PNG_DPI}: sharp at paper column width)",
    )
    parser.add_argument(
        "--run",
        metavar="ID",
        help="draw the run (sweep id, or launch id outside a sweep) whose id "
        "is or contains ID; 'latest': the run with the newest row",
    )
    parser.add_argument(
        "--each-run",
        action="store_true",
        help="draw every run apart, each in OUTDIR/<run id>/ with its own "
        "index.html, linked from OUTDIR/index.html",
    )
    parser.add_argument(
        "--advice",
        metavar="DIR",
        help="add the page's 'Should you compress?' section from the table "
        "and map `ccbench advise` wrote in DIR",
    )
    parser.add_argument(
        "--list",
        action="store_true",
        help="list the figures and the CSV kinds they need, then exit",
    )
    return parser


def list_figures() -> None:
    for spec in all_figures():
        needs = ", ".join(TITLES[k] for k in spec.needs) or spec.alternatives
        print(f"{spec.name:34s} {spec.title}  [needs {needs}]")


def make_style(data: Data) -> Style:
    codecs, series = set(), set()
    for kind in ("harness", "codec", "training"):
        frame = data.get(kind)
        if "codec" in frame.columns:
            codecs |= set(frame["codec"].dropna().astype(str))
        if {"variant", "algorithm"} <= set(frame.columns):
            series |= set(map(tuple, frame[["variant", "algorithm"]].astype(str).values))
    return Style(codecs=codecs, series=series)


def draw_all(
    data: Data,
    outdir: Path,
    only: list[str],
    formats: tuple[str, ...],
    dpi: int = PNG_DPI,
    suffix: str = "",
    regime: str | None = None,
):
    """Draw each selected figure (file names ending in `suffix`); (rendered, skipped,
    failed) with reasons. A figure of model kinds alone (profiles, codec throughput,
    simulations) is drawn in the models regime only."""
    style = make_style(data)
    rendered, skipped, failed = [], [], []
    for spec in all_figures():
        if only and not any(text in spec.name for text in only):
            continue
        if (
            regime is not None
            and spec.needs
            and set(spec.needs) <= set(MODEL_KINDS)
            and regime not in ("models", "graphs")
        ):
            continue
        missing = [TITLES[k] for k in spec.needs if not data.has(k)]
        if missing:
            skipped.append((spec.paper, spec.title, f"no {' or '.join(missing)} in the input"))
            continue
        try:
            figures = spec.draw(data, style)
        except Skip as why:
            skipped.append((spec.paper, spec.title, str(why)))
            continue
        except Exception as exc:  # one broken figure must not cost the others
            failed.append((spec.paper, spec.title, describe_failure(exc)))
            close_all()
            continue
        for figure in figures:
            empty = [ax for ax in figure.fig.axes if ax.get_visible() and not has_data(ax)]
            if empty and len(empty) < len(figure.fig.axes):  # nothing drawn there
                for ax in empty:
                    ax.set_visible(False)
                figure = replace(
                    figure,
                    caption=figure.caption + f" {len(empty)} panel(s) with no points left out.",
                )
            notes = [
                (ax.get_title() or spec.title, note_texts(ax))
                for ax in figure.fig.axes
                if ax.get_visible()
                and ax.get_legend() is not None
                and str(ax.get_legend().get_gid()).startswith("note")
            ]
            files = save(figure.fig, outdir, figure.name + suffix, formats, dpi)
            claims = [replace(c, figure=figure.name + suffix) for c in figure.claims]
            problems = check_figure(figure.fig)
            rendered.append(
                RenderedFigure(
                    figure.name + suffix,
                    spec.paper,
                    spec.title,
                    figure.caption,
                    files,
                    notes,
                    claims,
                    problems,
                    figure.fig,
                )
            )
    return rendered, skipped, failed


def remove_stale(outdir: Path, specs, written: set[Path]) -> list[Path]:
    """Delete figures an earlier run left in OUTDIR for the figures drawn or skipped now,
    so the folder shows what index.html shows. Only files named like our figures."""
    stale = []
    for spec in specs:
        for pattern in (f"{spec.name}.*", f"{spec.name}_*.*"):
            for path in outdir.glob(pattern):
                if path.suffix[1:] in FORMATS and path not in written:
                    path.unlink()
                    stale.append(path)
    return stale


def describe_failure(exc: Exception) -> str:
    """One line: the exception and where it was raised, for a bug report."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def collect_headlines(data: Data) -> tuple[list, list[str], list[str]]:
    """(headlines, notes, problems): a failing headline must not cost the figures."""
    try:
        found, notes = headlines.collect(data)
    except Exception as exc:
        return [], [], [f"headlines: {describe_failure(exc)}"]
    return found, notes, []


def choose_runs(data: Data, opts) -> list[Run]:
    """The runs to draw: one, picked or alone, or every one with --each-run; several
    without either is a usage error naming them."""
    runs = data.runs()
    if opts.run == "latest" and runs:
        return [max(runs, key=lambda r: (r.latest, r.label))]
    if opts.run:
        exact = [r for r in runs if r.id == opts.run]
        chosen = exact or [r for r in runs if opts.run in r.id]
        if len(chosen) != 1:
            what = (
                "matches no run"
                if not chosen
                else f"matches {len(chosen)} runs ({', '.join(r.id for r in chosen)})"
            )
            raise UsageError(
                f"--run {opts.run} {what}; the inputs hold: "
                + "; ".join(r.describe() for r in runs)
            )
        return chosen
    if len(runs) > 1 and not opts.each_run:
        clash = data.collisions()
        if clash:
            raise UsageError(
                f"the inputs hold {len(runs)} runs that measured the same point "
                f"({clash[0]}), which one curve would mix: pick one with --run "
                "ID, draw each apart with --each-run, or pair them with "
                "ccbench compare"
            )
    return runs


def folder_name(run: Run) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", run.id).strip("-") or "run"


def point_to_earlier(claims: list, sections: list[Section]) -> list:
    """A claim this regime did not measure but a section above did reads "measured
    above", naming that section, rather than "not measured" on the same page."""
    earlier = {
        h.claim.split(": against", 1)[0]: section.heading
        for section in sections
        for h in section.headlines
        if h.verdict != headlines.NOT_MEASURED
    }
    out = []
    for h in claims:
        heading = earlier.get(h.claim)
        if h.verdict == headlines.NOT_MEASURED and heading:
            h = replace(
                h, verdict=headlines.MEASURED_ABOVE, where=f'in the section "{heading}" above'
            )
        out.append(h)
    return out


def render(
    data: Data, outdir: Path, opts, formats, run: Run | None, together: list[Run] | None = None
) -> int:
    """Draw one run's figures (or those of several runs `together`) and index.html into
    outdir; the exit status. Rows measured on emulated links, in shared memory and on no
    network at all (codecs, profiles, simulations) are drawn in sections of their own, in
    that order: the papers measured bandwidth-limited networks."""
    regimes = data.regimes() or [("shm", data)]
    several = len(regimes) > 1
    sections, rendered, skipped, failed, found, problems, headline_notes = (
        [],
        [],
        [],
        [],
        [],
        [],
        [],
    )
    checked = []  # what the page check reads: each section's text, figures, headlines
    for key, subset in regimes:
        drawn, missed, broken = draw_all(
            subset,
            outdir,
            opts.only,
            formats,
            opts.dpi,
            f"_{key}" if several else "",
            key if several else None,
        )
        claims, notes, trouble = ([], [], []) if key in NO_HEADLINES else collect_headlines(subset)
        claims = point_to_earlier(claims, sections)
        intro = section_intro(key, subset, drawn, claims, headlines.NOT_MEASURED)
        sections.append(Section(key, REGIME_HEADINGS[key], drawn, claims, intro))
        checked.append((REGIME_HEADINGS[key], subset, intro if several else "", drawn, claims))
        rendered += drawn
        skipped += missed
        failed += broken
        found += claims
        problems += trouble
        headline_notes += [n for n in notes if n not in headline_notes]
    drawn_titles = {f.title for f in rendered}
    # a figure drawn in one section is not "not drawn" because another lacks its rows
    skipped = list(dict.fromkeys(s for s in skipped if s[1] not in drawn_titles))
    selected = [
        spec
        for spec in all_figures()
        if not opts.only or any(text in spec.name for text in opts.only)
    ]
    written = {path for figure in rendered for path in figure.files}
    for path in remove_stale(outdir, selected, written):
        print(f"removed {path}: left by an earlier run, not drawn from these inputs")
    for paper, title, why in skipped:
        print(f"skipped [{paper}] {title}: {why}")
    for paper, title, why in failed:
        print(f"error: [{paper}] {title} failed: {why}", file=sys.stderr)
    for text in problems:
        print(f"error: {text}", file=sys.stderr)
    notes = list(data.notes) + headline_notes
    for note in notes:
        print(f"note: {note}")
    shared = set()  # files every run draws: layer profiles, fits that name no run
    for frame in data.frames.values():
        if "source" in frame.columns:
            mine = frame if RUN not in frame.columns else frame[frame[RUN] == ""]
            shared |= set(mine["source"].astype(str))
    inputs = []
    for r in data.files:
        what, status = r.describe(), "error" if r.error else ("note" if r.ignored else "")
        if run is not None and r.kind and str(r.path) not in set(run.files) | shared:
            what, status = f"{what}; another run's, not drawn here", "note"
        inputs.append((str(r.path), what, status))
    footer = footer_text([c for f in rendered for c in f.claims])
    contradictions = [c.line() for c in check_page(checked, footer)]
    contradictions += [f"figure {f.name}: {p}" for f in rendered for p in f.problems]
    contradictions += [f"page: {p}" for p in colour_meanings([(f.name, f.drawn) for f in rendered])]
    for line in contradictions:
        print(f"page check: {line}", file=sys.stderr)
    print(
        f"page check: {len(contradictions)} contradiction(s) between the page and its rows "
        "or defect(s) in its figures"
    )
    content = ReportContent(
        inputs=inputs,
        figures=rendered,
        headlines=found,
        skipped=skipped + [(p, t, f"failed: {w}") for p, t, w in failed],
        notes=notes + [f"error: {t}" for t in problems],
        run=run.label if run is not None else "",
        runs=tuple(r.label for r in together or ()),
        sections=sections if several else [],
        advice=read_advice(Path(opts.advice), outdir) if opts.advice else None,
        footer=footer,
        contradictions=contradictions,
    )
    outdir.mkdir(parents=True, exist_ok=True)
    index = write_index(outdir, content)
    print(f"{len(rendered)} figure(s) written to {outdir}; open {index}")
    return 1 if data.bad_files or failed or problems else 0


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if opts.list:
        list_figures()
        return 0
    try:
        if not opts.results:
            raise UsageError("name at least one results CSV or folder (see --help)")
        formats = tuple(f.strip().lower() for f in opts.format.split(",") if f.strip())
        unknown = [f for f in formats if f not in FORMATS]
        if unknown or not formats:
            raise UsageError(f"--format takes png and/or pdf, not {opts.format!r}")
        names = [spec.name for spec in all_figures()]
        unmatched = [t for t in opts.only if not any(t in name for name in names)]
        if unmatched:
            raise UsageError(f"--only {unmatched[0]} matches no figure (see --list)")
        if not 30 <= opts.dpi <= 1200:
            raise UsageError(f"--dpi must be between 30 and 1200, not {opts.dpi}")
        if opts.run and opts.each_run:
            raise UsageError("--run and --each-run exclude each other")
        if opts.advice and opts.each_run:
            raise UsageError("--advice draws one page: not with --each-run")
        if opts.advice:
            read_advice(Path(opts.advice), Path(opts.outdir))  # refused before any drawing
        data = load(opts.results)
        runs = choose_runs(data, opts)
    except UsageError as exc:
        print(f"ccbench plot: {exc}", file=sys.stderr)
        return 2
    outdir = Path(opts.outdir)
    for report in data.files:
        print(
            ("error: " if report.error else "") + report.line(),
            file=sys.stderr if report.error else sys.stdout,
        )
    if not opts.each_run:
        if len(runs) > 1:  # distinct points of several runs: one drawing, nothing paired
            print(
                f"note: {len(runs)} runs drawn together, each curve from its own run; "
                "ratios, speed-up notes and headlines pair rows of one run only"
            )
            return render(data, outdir, opts, formats, None, runs)
        run = runs[0] if runs else None
        return render(data.only(run.label) if run else data, outdir, opts, formats, run)
    status, made = 0, []
    for run in runs:
        folder = folder_name(run)
        print(f"{run.label}: drawn into {outdir / folder}")
        status = max(status, render(data.only(run.label), outdir / folder, opts, formats, run))
        made.append((run.label, folder, f"{run.rows} rows"))
    index = write_runs_index(outdir, made)
    print(f"{len(made)} run(s) drawn apart under {outdir}; open {index}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
