"""`ccbench advise`'s table: the options measured here ranked by predicted step time, the
ones with an input not measured on this link, rank count and codec listed apart (never
above a measured one), the ring and the library always among them; printed, and written
as CSV (docs/advise.md, "What it writes")."""

from __future__ import annotations

import math
from pathlib import Path

from ccbench.collectives import compression_model as cm


def main_collective(step) -> str:
    """The collective carrying most of the step's bytes (the break-even map's)."""
    volume: dict = {}
    for c in step.calls:
        volume[c.collective] = volume.get(c.collective, 0) + c.nbytes
    return max(volume, key=volume.get)


def split_order(predictions: dict, lacking: dict, excluded: dict) -> tuple[list, list]:
    """(the options measured here, fastest first; the others, fastest first), both
    without those over the error budget."""
    kept = {k: v for k, v in predictions.items() if k not in excluded}
    order = cm.rank_options(kept, {}, None)
    return [k for k in order if not lacking.get(k)], [k for k in order if lacking.get(k)]


def table_rows(
    options,
    predictions,
    ranges: dict,
    errors,
    measured: list,
    apart: list,
    network,
    step,
    ranks,
    share,
    assumed: dict,
    lacking: dict,
) -> list[dict]:
    """One row per option: the measured ones ranked 1, 2, ..., then the ones not measured
    here (no rank), each naming the inputs it lacks."""
    by_label = {o.label: o for o in options}
    ring = predictions.get(cm.RING)
    library = predictions.get(cm.LIBRARY)
    collective = main_collective(step)
    base = by_label.get(cm.LIBRARY) or by_label.get(cm.RING)
    rows = []
    for n, label in enumerate(measured + apart, 1):
        p, o = predictions[label], by_label[label]
        low, high = ranges[label]
        even = (
            cm.break_even_bytes(o, base, network, collective, ranks, share)
            if o.codec is not None and base is not None
            else None
        )
        rows.append(
            {
                "rank": n if label in measured else "",
                "option": label,
                **{f"{b}_ms": p.bucket_s[b] * 1e3 for b in cm.BUCKET_NAMES},
                "step_ms": p.step_s * 1e3,
                "step_low_ms": low * 1e3,
                "step_high_ms": high * 1e3,
                "exposed_comm_pct": 100 * p.exposed_s / p.step_s,
                "exposed_codec_pct": 100 * p.exposed_codec_s / p.step_s,
                "speedup_vs_ring": ring.step_s / p.step_s if ring else math.nan,
                "speedup_vs_library": library.step_s / p.step_s if library else math.nan,
                "rel_l2_per_step": errors[label],
                "break_even_bytes": ""
                if o.codec is None
                else ("never" if even is None else int(even)),
                "break_even_collective": collective if o.codec is not None else "",
                "measured_here": "no" if lacking.get(label) else "yes",
                "not_measured": ";".join(lacking.get(label, [])),
                "assumed_inputs": ";".join(assumed.get(label, [])),
            }
        )
    return rows


def _fmt_bytes(v) -> str:
    if v in ("", "never"):
        return v or "-"
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if v >= scale:
            return f"{v / scale:g}{unit}"
    return str(v)


def print_table(rows, excluded: dict) -> None:
    buckets = [f"{b}_ms" for b in cm.BUCKET_NAMES]
    header = (
        f"{'#':>2} {'option':<28}"
        + "".join(f"{b[:-3]:>9}" for b in buckets)
        + f" {'step ms':>9} {'range':>15} {'comm%':>6} {'codec%':>6} {'x ring':>7}"
        f" {'x lib':>6} {'rel L2':>9} {'break-even':>10}"
    )
    print(header)
    said = False
    for r in rows:
        if r["measured_here"] == "no" and not said:
            print("# not measured here (an input missing on this link, rank count or codec;")
            print("# never ranked above a measured option):")
            said = True
        mark = " *" if r["assumed_inputs"] else ""
        lacks = f"  lacks: {r['not_measured'].replace(';', ', ')}" if r["not_measured"] else ""
        span = f"{r['step_low_ms']:.0f}-{r['step_high_ms']:.0f}"
        print(
            f"{r['rank']!s:>2} {r['option']:<28}"
            + "".join(f"{r[b]:>9.1f}" for b in buckets)
            + f" {r['step_ms']:>9.1f} {span:>15} {r['exposed_comm_pct']:>6.1f} "
            f"{r['exposed_codec_pct']:>6.1f} {r['speedup_vs_ring']:>7.2f} "
            f"{r['speedup_vs_library']:>6.2f} {r['rel_l2_per_step']:>9.2e} "
            f"{_fmt_bytes(r['break_even_bytes']):>10}{mark}{lacks}"
        )
    print(
        "# range: the step with the lowest and highest efficiency measured over the sizes "
        "of its rows"
    )
    if any(r["assumed_inputs"] for r in rows):
        print("# * some inputs of this row were not measured (assumed): see the inputs CSV")
    for label, why in excluded.items():
        print(f"# left out: {label}: {why}")


def advice_line(rows: list[dict], verdict: str = "") -> str:
    """The advice in words: the fastest option measured here, its predicted step and range,
    its speed-up over the ring and the library; the check's verdict when one ran."""
    first = next((r for r in rows if r["measured_here"] == "yes"), None)
    if first is None:
        return (
            "advice: none: no option was measured on this link, rank count and codec "
            "(the table lists them apart, with what each lacks); measure their parts "
            "there first (docs/advise.md)"
        ) + (f"; {verdict}" if verdict else "")
    compressed = first["option"] not in cm.UNCOMPRESSED
    speedups = ", ".join(
        f"x{r:.2f} the {name}"
        for name, r in (
            ("ring", first["speedup_vs_ring"]),
            ("library", first["speedup_vs_library"]),
        )
        if isinstance(r, float) and math.isfinite(r) and first["option"] != name
    )
    return (
        f"advice: {first['option']} ({'compression pays' if compressed else 'do not compress'}):"
        f" predicted step {first['step_ms']:.0f} ms (range {first['step_low_ms']:.0f}-"
        f"{first['step_high_ms']:.0f} over its measured efficiencies)"
        + (f", {speedups}" if speedups else "")
        + (f"; {verdict}" if verdict else "; not checked against replays")
    )


def write_csv(path: Path, rows: list[dict]) -> None:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, index=False)
