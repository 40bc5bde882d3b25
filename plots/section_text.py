"""The page's own sentences about this run, from its rows: each section's opening and the
footer under the headline tables. Nothing here states a rate, a winner or how the numbers
were measured unless the rows drawn say it (plots/page_check.py holds them to it)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ccbench.plots.base import rows
from ccbench.plots.claims import INTERLEAVED, SEPARATE_LAUNCHES


def busbw_span(data) -> tuple[float, float] | None:
    """The bus bandwidth (GB/s) of the dense collectives drawn: smallest and largest."""
    frame = rows(data, "harness")
    if frame.empty or "busbw_gbps" not in frame.columns:
        return None
    frame = frame[frame["variant"] != "sparse_streaming"]
    values = pd.to_numeric(frame["busbw_gbps"], errors="coerce").to_numpy(dtype=float)
    values = values[np.isfinite(values) & (values > 0)]
    return (float(values.min()), float(values.max())) if values.size else None


def rate_text(span: tuple[float, float]) -> str:
    low, high = span
    # printed a little outside the span so rounding never puts a point beyond it
    return f"{np.floor(low * 100) / 100:g}-{np.ceil(high * 100) / 100:g} GB/s"


def wins_text(claims) -> str:
    """Who won, by the notes' own comparisons against the uncompressed baseline."""
    against = [c for c in claims if c.a and c.a[0] == "baseline"]
    if not against:
        return ""
    faster = sum(1 for c in against if c.high < 1)
    slower = sum(1 for c in against if c.low > 1)
    rest = len(against) - faster - slower
    parts = [f"{faster} faster", f"{slower} slower"] + ([f"{rest} within noise"] if rest else [])
    return (
        f" Of the {len(against)} compressed latencies the notes below compare with the "
        f"uncompressed baseline, {', '.join(parts)} (by the whole interval)."
    )


def section_intro(key: str, data, figures, headlines, measured: str) -> str:
    """What a section says before its figures, from its rows. `measured`: the verdict a
    headline row has when nothing measured it."""
    claims = [c for f in figures for c in getattr(f, "claims", [])]
    span = busbw_span(data)
    rate = (
        f" The dense collectives drawn here run at {rate_text(span)} of bus bandwidth."
        if span
        else ""
    )
    if key == "links":
        done = [h for h in headlines if h.verdict != measured]
        return (
            "Each rank sits in a network namespace of its own, its link shaped by tc to "
            "the rate named in each panel: a bandwidth-limited network, the regime the "
            f"papers measured.{rate}{wins_text(claims)} The headline table below has "
            f"{len(done)} of its {len(headlines)} claims measured here."
        )
    if key == "shm":
        return (
            "Ranks on one host exchange bytes through shared memory: no network between "
            f"them, so a codec's work has no wire time to hide behind.{rate}"
            f"{wins_text(claims)} These runs check that everything works and show the "
            "codecs' costs."
        )
    titles = list(dict.fromkeys(f.title for f in figures))
    drawn = "; ".join(titles) if titles else "nothing"
    if key == "nodes":
        return (
            "A cluster of nodes: the ranks of one node share its memory and cores, nodes "
            "are joined by shaped links (on the emulated cluster, one per node, shared by "
            "its ranks). Hierarchical collectives send across nodes only what must cross "
            "and compress only there; flat ones send every hop alike. The papers measured "
            "flat collectives, so no headline claim is judged here; the comparisons carry "
            f"their own verdicts.{rate} Drawn here: {drawn}."
        )
    if key == "graphs":
        return (
            "Rows of --cuda-graph runs: each call captured once in a CUDA graph and "
            "replayed, so the host's launch cost per kernel and message is left out; drawn "
            f"apart from eager calls, never paired with them. Drawn here: {drawn}."
        )
    return f"Measured on no network. Drawn here: {drawn}."


def footer_text(claims) -> str:
    """The note under the headline tables: how the page's numbers were measured."""
    interleaved = sum(1 for c in claims if c.source == INTERLEAVED)
    apart = sum(1 for c in claims if c.source == SEPARATE_LAUNCHES)
    notes = (
        f" Of the {interleaved + apart} ratios the notes under the figures quote, "
        f"{interleaved} repeat such a comparison ('interleaved') and {apart} are ratios "
        "of separately launched points ('separate launches', with the widest bounds "
        "their two intervals allow, leaving out what varies from launch to launch)."
        if claims
        else ""
    )
    return (
        "Headline numbers are interleaved comparisons (B and A run in alternating "
        "rounds: ccbench compare, or MG-WFBP strategies taking turns step by step), "
        f"never a ratio of two separate runs.{notes} Verdict: B is faster or slower when "
        "the whole interval clears a margin around 1, otherwise no difference this run "
        "can show. The papers measured GPU clusters; numbers here come from the machine "
        "and link named in each row, so compare the shape, not the digits. The papers' "
        "numbers and where they are stated: docs/references.md."
    )
