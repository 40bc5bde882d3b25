"""The performance goals of the GPU acceptance run (scripts/gpu/check.py): each figure
measured by its performance cells (scripts/gpu/plan.py) beside its bound and its goal
(GOALS). The codecs' encode, decode and reduce-scatter hop against the device copy
(codec_throughput), host staging against its bound of pinned copies (staging_bound), the
fp16-compressed allgather against NCCL's own; graph mode's: the host's time per eager
codec call, the codecs replayed from graphs at 1 MiB, the graphed compressed allgather
against NCCL's graphed one, a graphed pipeline in 1 MiB chunks against one chunk per
block. A goal whose cell was skipped or failed is skipped or failed with that cell's
reason, and one whose row is missing is not met.
"""

from __future__ import annotations

from ccbench.scripts.gpu.plan import (
    BUFFERS,
    CODECS,
    graph_compare_cell,
    graphed_codec_cell,
    pipeline_cell,
)

GOAL_BYTES = 16 << 20  # the staging and compressed-allgather goals' size
# (figure, goal): codec rates as a fraction of the device copy's; staging time over its
# bound of pinned copies; NCCL's own allgather time over the compressed one's
GOALS = {
    "encode_vs_copy": (">=", 0.8),
    "decode_vs_copy": (">=", 0.8),
    "hop_vs_copy": (">=", 0.5),
    "staged_vs_bound": ("<=", 1.3),
    "speedup_vs_nccl": (">=", 1.5),
    # graph mode: an eager codec call's host time; the graphed compressed allgather
    # against NCCL's own graphed; a graphed pipeline in 1 MiB chunks over one chunk
    "host_us_per_call": ("<=", 8.0),
    "graphed_speedup_vs_nccl": (">=", 1.5),
    "chunks_vs_whole": ("<=", 1.2),
}
GRAPHED_CODEC_BYTES = 1 << 20  # graphed, the codecs are held to their goals at 1 MiB


def _goal(
    name: str, figure: str, measured: float | None, bound: str, why: str = "", **base
) -> dict:
    """One goal's report row: `measured` against GOALS[figure]; skip when not measured."""
    sign, target = GOALS[figure]
    goal = f"{sign} {target:g}"
    row = {"cell": name, "kind": "goal", "figure": figure, "bound": bound, "goal": goal, **base}
    if measured is None:
        return {**row, "status": "skip", "reason": why}
    met = measured >= target if sign == ">=" else measured <= target
    return {
        **row,
        "status": "pass" if met else "fail",
        "measured": f"{measured:.3f}",
        "reason": why,
    }


def codec_goals(rows: list[dict], buffer: str, mode: str = "") -> list[dict]:
    """Encode, decode and the reduce-scatter hop of each codec_throughput row against the
    device copy of the same buffer (`mode`: ' / graphed' for replayed calls)."""
    out = []
    for r in rows:
        copy = float(r["copy_gbps"])
        for piece in ("encode", "decode", "hop"):
            figure = f"{piece}_vs_copy"
            ratio = float(r[figure])
            out.append(
                _goal(
                    f"codec {r['codec']} {piece} / {buffer}{mode}",
                    figure,
                    ratio,
                    f"device copy {copy:.1f} GB/s",
                    f"{piece} {float(r[f'{piece}_gbps']):.1f} GB/s = {ratio:.2f}x the copy "
                    f"({r.get('kernels', '')} kernels, {int(r['size_bytes']) >> 20} MiB)",
                    buffer=buffer,
                    codec=r["codec"],
                    size_bytes=r["size_bytes"],
                )
            )
    return out


def host_goals(rows: list[dict], buffer: str) -> list[dict]:
    """The host's time per eager codec call (the slowest of encode, decode and hop)."""
    out = []
    for r in rows:
        name = f"codec {r['codec']} host time / {buffer}"
        host = r.get("host_us_per_call") or ""
        if host == "":
            out.append({**_goal(name, "host_us_per_call", None, ""), "status": "fail"})
            out[-1]["reason"] = "its row has no host_us_per_call"
            continue
        out.append(
            _goal(
                name,
                "host_us_per_call",
                float(host),
                "a kernel's launch",
                f"{float(host):.1f} us of host time per eager call",
                buffer=buffer,
                codec=r["codec"],
            )
        )
    return out


def ratio_goal(slow: list[dict], fast: list[dict], name: str, figure: str, bound: str) -> dict:
    """slow's time over fast's at GOAL_BYTES (figure: a speedup, or a cost over a bound)."""

    def at(rows):
        got = [r for r in rows if int(float(r["size_bytes"])) == GOAL_BYTES]
        return float(got[-1]["avg_us"]) if got else None

    a, b = at(slow), at(fast)
    if a is None or b is None:
        return {
            **_goal(name, figure, None, ""),
            "status": "fail",
            "reason": f"no row at {GOAL_BYTES >> 20} MiB",
        }
    return _goal(
        name,
        figure,
        a / b,
        f"{bound} {b if figure == 'chunks_vs_whole' else a:.0f} us",
        f"{a:.0f} us against {b:.0f} us: {a / b:.2f}x",
        size_bytes=str(GOAL_BYTES),
    )


def staging_goal(rows: list[dict], name: str) -> dict:
    """Staged allgather time over its bound of pinned copies, at GOAL_BYTES on 2 ranks."""
    at = [
        r for r in rows if int(float(r["size_bytes"])) == GOAL_BYTES and int(float(r["ranks"])) == 2
    ]
    if not at:
        return {
            **_goal(name, "staged_vs_bound", None, ""),
            "status": "fail",
            "reason": f"no row at {GOAL_BYTES >> 20} MiB on 2 ranks",
        }
    r = at[-1]
    ratio = float(r["staged_vs_bound"])
    return _goal(
        name,
        "staged_vs_bound",
        ratio,
        f"d2h {float(r['d2h_pinned_us']):.0f} + host allgather "
        f"{float(r['host_allgather_us']):.0f} + h2d {float(r['h2d_pinned_us']):.0f}"
        f" = {float(r['bound_us']):.0f} us",
        f"staged {float(r['staged_us']):.0f} us = {ratio:.2f}x the bound",
        buffer=r["buffer"],
        size_bytes=str(GOAL_BYTES),
    )


def compressed_goal(nccl_rows: list[dict], compressed_rows: list[dict], name: str) -> dict:
    """NCCL's own allgather time over the fp16-compressed one's at GOAL_BYTES."""

    def at(rows):
        got = [r for r in rows if int(float(r["size_bytes"])) == GOAL_BYTES]
        return float(got[-1]["avg_us"]) if got else None

    own, compressed = at(nccl_rows), at(compressed_rows)
    if own is None or compressed is None:
        return {
            **_goal(name, "speedup_vs_nccl", None, ""),
            "status": "fail",
            "reason": f"no row at {GOAL_BYTES >> 20} MiB",
        }
    speedup = own / compressed
    return _goal(
        name,
        "speedup_vs_nccl",
        speedup,
        f"NCCL's allgather {own:.0f} us",
        f"compressed {compressed:.0f} us: {speedup:.2f}x faster",
        size_bytes=str(GOAL_BYTES),
    )


def goal_rows(results: dict[str, list[dict]], skipped: dict[str, str]) -> list[dict]:
    """The goals from the performance cells' report lines (by cell name); a goal whose
    cell was skipped or failed is skipped or failed with that cell's reason."""
    out = []
    for buffer in BUFFERS:
        name = f"codec_throughput / {buffer}"
        if name in skipped:
            out += [
                _goal(
                    f"codec {c} {piece} / {buffer}",
                    f"{piece}_vs_copy",
                    None,
                    "",
                    skipped[name],
                    buffer=buffer,
                    codec=c,
                )
                for c in CODECS
                for piece in ("encode", "decode", "hop")
            ]
            out += [
                _goal(
                    f"codec {c} host time / {buffer}",
                    "host_us_per_call",
                    None,
                    "",
                    skipped[name],
                    buffer=buffer,
                    codec=c,
                )
                for c in CODECS
            ]
            continue
        lines = results.get(name, [])
        if any(r["status"] == "fail" for r in lines) or not lines:
            out.append(
                {
                    **_goal(f"codec / {buffer}", "encode_vs_copy", None, ""),
                    "status": "fail",
                    "reason": "its cell failed",
                }
            )
            continue
        rows = [row for r in lines for row in r["rows"]]
        out += codec_goals(rows, buffer) + host_goals(rows, buffer)
    out += graphed_codec_goals(results, skipped)
    name = "staging / cupy / 16 MiB on 2 ranks"
    out.append(
        _outcome(
            name,
            ["staging_bound 16M / cupy / mpi-staged"],
            results,
            skipped,
            "staged_vs_bound",
            lambda rows: staging_goal(rows[0], name),
        )
    )
    name = "coll_compressed fp16 against NCCL's allgather / 16 MiB on 2 ranks"
    out.append(
        _outcome(
            name,
            [
                "baseline library allgather 16M / torch-cuda / nccl",
                "coll_compressed fp16 allgather 16M / torch-cuda / nccl",
            ],
            results,
            skipped,
            "speedup_vs_nccl",
            lambda rows: compressed_goal(rows[0], rows[1], name),
        )
    )
    name = "graphed coll_compressed fp16 against NCCL's graphed allgather / 16 MiB on 2 ranks"
    out.append(
        _outcome(
            name,
            [
                graph_compare_cell("baseline", "allgather", True),
                graph_compare_cell("fp16", "allgather", True),
            ],
            results,
            skipped,
            "graphed_speedup_vs_nccl",
            lambda rows: ratio_goal(
                rows[0], rows[1], name, "graphed_speedup_vs_nccl", "NCCL's graphed allgather"
            ),
        )
    )
    name = "graphed pipeline in 1 MiB chunks against one chunk per block / 16 MiB"
    out.append(
        _outcome(
            name,
            [pipeline_cell("1M"), pipeline_cell("0")],
            results,
            skipped,
            "chunks_vs_whole",
            lambda rows: ratio_goal(rows[0], rows[1], name, "chunks_vs_whole", "one chunk"),
        )
    )
    return out


def graphed_codec_goals(results: dict, skipped: dict) -> list[dict]:
    """The codec goals again, for calls replayed from CUDA graphs at 1 MiB."""
    out = []
    for buffer in BUFFERS:
        name = graphed_codec_cell(buffer)
        if name in skipped:
            out += [
                _goal(
                    f"codec {c} {piece} / {buffer} / graphed",
                    f"{piece}_vs_copy",
                    None,
                    "",
                    skipped[name],
                    buffer=buffer,
                    codec=c,
                )
                for c in CODECS
                for piece in ("encode", "decode", "hop")
            ]
            continue
        lines = results.get(name, [])
        rows = [row for r in lines for row in r.get("rows", [])]
        at = [r for r in rows if int(float(r["size_bytes"])) == GRAPHED_CODEC_BYTES]
        if any(r["status"] == "fail" for r in lines) or not at:
            out.append(
                {
                    **_goal(f"codec / {buffer} / graphed", "encode_vs_copy", None, ""),
                    "status": "fail",
                    "reason": "its cell failed" if lines else "its cell did not run",
                }
            )
            continue
        out += codec_goals(at, buffer, " / graphed")
    return out


def _outcome(goal: str, names: list[str], results, skipped, figure, measure) -> dict:
    """A goal from the cells `names`: skipped or failed as they were."""
    for name in names:
        if name in skipped:
            return _goal(goal, figure, None, "", skipped[name])
        lines = results.get(name, [])
        if not lines or lines[0]["status"] != "pass":
            return {
                **_goal(goal, figure, None, ""),
                "status": "fail",
                "reason": f"{name} failed: " + (lines[0]["reason"] if lines else ""),
            }
    return measure([results[name][0]["rows"] for name in names])
