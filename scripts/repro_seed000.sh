#!/usr/bin/env bash
# Network-bound reproduction of seed 000 (compression-assisted Allgather / Reduce-Scatter)
# on the emulated cluster: 4 ranks, 64 KiB .. 16 MiB; allgather, reduce_scatter and
# allreduce; baseline (mpi, ring), point-to-point compressed and collective-level
# compressed with fp16, bfp:rate=8 and zfp:rate=8. Two links by default: 1 Gbit/s, and
# the paper's regime (the link rate at which bfp:rate=8 on this host is 6 times faster
# than the link; docs/emulated-cluster.md). Needs root or unprivileged user namespaces.
#
#   scripts/repro_seed000.sh [--out DIR] [--name NAME] [--iterations N] [--warmup N]
#                            [--sizes MIN:MAX] [--rate RATE]... [--codec-ratio R]...
#                            [--regime-codec SPEC] [--no-plot]
#
# --rate and --codec-ratio choose the links (each may be repeated; giving either replaces
# the default pair). One CSV per run in DIR/<link>/ (default DIR results/seed000); runs
# whose JSON sidecar exists are skipped, so an interrupted reproduction resumes. Prints the
# 16 MiB figures of the goals (also DIR/<link>/summary.txt), then draws the figures into
# DIR/<link>/figures. Runs scripts/setup.sh and uses .venv, unless CCBENCH_PYTHON names
# the Python to use. See docs/emulated-cluster.md.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${CCBENCH_PYTHON:-}" ]; then
    python="$CCBENCH_PYTHON"  # a Python that already has ccbench's dependencies
else
    "$repo/scripts/setup.sh"  # the project's .venv, as scripts/run-local.sh uses
    python="$repo/${CCBENCH_VENV:-.venv}/bin/python"
fi

out="$repo/results/seed000"
name=ccb
iterations=20
warmup=3
sizes=64K:16M
plot=1
ranks=4
regime_codec=bfp:rate=8
links=()
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        --name) name="$2"; shift 2 ;;
        --iterations) iterations="$2"; shift 2 ;;
        --warmup) warmup="$2"; shift 2 ;;
        --sizes) sizes="$2"; shift 2 ;;
        --rate) links+=("rate:$2"); shift 2 ;;
        --codec-ratio) links+=("ratio:$2"); shift 2 ;;
        --regime-codec) regime_codec="$2"; shift 2 ;;
        --no-plot) plot=0; shift ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "repro_seed000: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ ${#links[@]} -gt 0 ] || links=("rate:1gbit" "ratio:6")

cluster() { "$python" -m ccbench.scripts.cluster "$@"; }
if ! why=$(cluster check); then
    echo "repro_seed000: $why" >&2
    exit 2
fi

owned=0
cleanup() { [ "$owned" = 1 ] && cluster down --name "$name" >/dev/null || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# Bring cluster $name up for link $1 (rate:RATE or ratio:R); a cluster already up with
# that shape is used and left up, one with another shape is an error.
link_up() {
    local kind=${1%%:*} value=${1#*:} args have want
    if [ "$kind" = rate ]; then
        args=(--rate "$value")
    else
        args=(--codec "$regime_codec" --codec-ratio "$value")
    fi
    # the shape of the cluster that is up ("" when none) and the one this link wants
    have=$(cluster status --name "$name" --json 2>/dev/null | "$python" -c '
import json, sys
from ccbench.scripts.cluster.layout import format_rate
d = json.load(sys.stdin)
r = d.get("regime")
if d.get("up") and r:
    print(d["ranks"], "regime", r["codec"], "%g" % r["codec_link_ratio"])
elif d.get("up"):
    print(d["ranks"], "rate", format_rate(d["rate_bps"]))
' 2>/dev/null || true)
    want=$("$python" -c '
import sys
from ccbench.scripts.cluster.layout import format_rate, parse_rate
ranks, kind, value, codec = sys.argv[1:]
if kind == "ratio":
    print(ranks, "regime", codec, "%g" % float(value))
else:
    print(ranks, "rate", format_rate(parse_rate(value)))
' "$ranks" "$kind" "$value" "$regime_codec")
    if [ "$have" = "$want" ]; then
        return 0
    fi
    if [ -n "$have" ] && [ "$owned" = 0 ]; then
        echo "repro_seed000: cluster $name is up with another shape ($have); use --name" >&2
        exit 2
    fi
    cluster up --name "$name" --ranks "$ranks" "${args[@]}"
    owned=1
    cluster selfcheck --name "$name" --no-mpi --bytes 32m || true  # the floor's link rate
}

codecs=(fp16 bfp:rate=8 zfp:rate=8)
runs=()
for collective in allgather reduce_scatter allreduce; do
    for algorithm in mpi ring; do
        runs+=("baseline $collective --algorithm $algorithm")
    done
    for variant in p2p_compressed coll_compressed; do
        for codec in "${codecs[@]}"; do
            runs+=("$variant $collective --codec $codec")
        done
    done
done

failed=0
for link in "${links[@]}"; do
    label=${link/:/-}; label=${label//=/}; label=${label//:/-}  # rate-1gbit, ratio-6
    dir="$out/$label"
    mkdir -p "$dir"
    link_up "$link"
    n=0
    for run in "${runs[@]}"; do
        read -r variant collective flag value <<<"$run"
        n=$((n + 1))
        tag=${value//:/-}
        csv="$dir/${variant}-${tag//=/}_${collective}.csv"  # coll_compressed-bfp-rate8_allgather.csv
        if [ -e "$csv.json" ]; then
            echo "[$label $n/${#runs[@]}] $variant $collective $value: done ($csv)"
            continue
        fi
        rm -f "$csv"  # a run killed half-way: measure it again from the start
        echo "[$label $n/${#runs[@]}] $variant $collective $value"
        if ! cluster run --name "$name" -- "$python" -m "ccbench.benchmarks.$variant" \
                --collective "$collective" "$flag" "$value" -m "$sizes" \
                -i "$iterations" -x "$warmup" -c --csv "$csv"; then
            echo "repro_seed000: $label $variant $collective $value failed" >&2
            failed=$((failed + 1))
        fi
    done

    "$python" - "$dir" <<'EOF' | tee "$dir/summary.txt"
# The goals at the largest size: MPI baseline vs its wire floor; per codec the achieved
# ratio, the collective-level pipeline against its floor (overlap efficiency, goal
# <= 1.15), its speed-up over MPI (goal: 0.8 x the achieved ratio for allgather, 0.7 x
# for reduce-scatter and allreduce) and its latency below point-to-point compression
# (the paper: 30.3% allgather, 40.6% reduce-scatter). One run of each: the verdicts with
# intervals come from `ccbench compare` (the main job's sweeps/main.toml).
import sys

from ccbench.benchmarks.results import read_results
from ccbench.plots.base import floor_us  # the one floor (docs/compression.md)

frame = read_results([sys.argv[1]])
frame = frame[frame["ranks"] == 4]
size = int(frame["size_bytes"].max())
at = frame[frame["size_bytes"] == size]
link_gbps = float(at["link_gbps"].dropna().iloc[0])
SPEEDUP_GOAL = {"allgather": 0.8, "reduce_scatter": 0.7, "allreduce": 0.7}
PAPER = {"allgather": "30.3%", "reduce_scatter": "40.6%", "allreduce": "-"}


def row(variant, collective, **match):
    rows = at[(at["variant"] == variant) & (at["collective"] == collective)]
    for key, value in match.items():
        rows = rows[rows[key] == value]
    return rows.iloc[-1] if len(rows) else None  # the newest run


print(f"ccbench seed-000 reproduction: 4 ranks, {link_gbps:g} Gbit/s links, size {size} B")
for collective in ("allgather", "reduce_scatter", "allreduce"):
    mpi = row("baseline", collective, algorithm="mpi")
    if mpi is None:
        continue
    bound = float(floor_us(mpi.to_frame().T).iloc[0])
    print(f"\n{collective}: wire floor {bound / 1e3:.1f} ms; MPI {mpi['avg_us'] / 1e3:.1f} ms "
          f"({mpi['avg_us'] / bound:.3f} x floor)")
    print(f"  {'codec':<12} {'ratio':>6} {'p2p ms':>8} {'coll ms':>8} {'floor ms':>9} "
          f"{'eff':>5} {'speed-up':>9} {'goal':>6} {'below p2p':>10} {'paper':>6}")
    for codec in ("fp16", "bfp:rate=8", "zfp:rate=8"):
        p2p = row("p2p_compressed", collective, codec=codec)
        coll = row("coll_compressed", collective, codec=codec)
        if coll is None:
            continue
        ratio = coll["compression_ratio"]
        lower = f"{1 - coll['avg_us'] / p2p['avg_us']:.1%}" if p2p is not None else "-"
        print(f"  {codec:<12} {ratio:>6.2f} "
              f"{p2p['avg_us'] / 1e3 if p2p is not None else float('nan'):>8.1f} "
              f"{coll['avg_us'] / 1e3:>8.1f} {coll['floor_us'] / 1e3:>9.1f} "
              f"{coll['overlap_efficiency']:>5.2f} {mpi['avg_us'] / coll['avg_us']:>8.2f}x "
              f"{SPEEDUP_GOAL[collective] * ratio:>5.2f}x {lower:>10} {PAPER[collective]:>6}")
EOF

    if [ "$plot" = 1 ]; then
        "$python" -m ccbench.plots "$dir" -o "$dir/figures" || echo "repro_seed000: plotting failed" >&2
    fi
    echo "repro_seed000: CSVs in $dir (ccbench plot $dir -o DIR draws the figures)"
done
[ "$failed" = 0 ] || { echo "repro_seed000: $failed runs failed" >&2; exit 1; }
