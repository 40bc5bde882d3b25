#!/usr/bin/env bash
# Network-bound reproduction of seed 000 (compression-assisted Allgather / Reduce-Scatter)
# on the emulated cluster: 4 ranks, 1 Gbit/s links, 64 KiB .. 16 MiB; allgather,
# reduce_scatter and allreduce; baseline (mpi, ring), point-to-point compressed and
# collective-level compressed with fp16, bfp:rate=8 and zfp:rate=8. Needs root.
#
#   scripts/repro_seed000.sh [--out DIR] [--name NAME] [--iterations N] [--warmup N]
#                            [--sizes MIN:MAX] [--no-plot]
#
# One CSV per run in DIR (default results/seed000); runs whose JSON sidecar exists are
# skipped, so an interrupted reproduction resumes. Prints the 16 MiB figures of the goals
# (also DIR/summary.txt), then draws the figures into DIR/figures. Runs scripts/setup.sh
# and uses .venv, unless CCBENCH_PYTHON names the Python to use. See
# docs/emulated-cluster.md.
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
rate=1gbit
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        --name) name="$2"; shift 2 ;;
        --iterations) iterations="$2"; shift 2 ;;
        --warmup) warmup="$2"; shift 2 ;;
        --sizes) sizes="$2"; shift 2 ;;
        --no-plot) plot=0; shift ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "repro_seed000: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

cluster() { "$python" -m ccbench.scripts.cluster "$@"; }

# Use the cluster if it is up with this shape; otherwise bring it up, and down at the end.
owned=0
shape=$(cluster status --name "$name" --json 2>/dev/null | "$python" -c \
    'import json,sys; d=json.load(sys.stdin); print(d["ranks"], d["rate_bps"]) if d["up"] else None' \
    2>/dev/null || true)
if [ "$shape" != "$ranks 1000000000" ]; then
    if [ -n "$shape" ]; then
        echo "repro_seed000: cluster $name is up with another shape ($shape); use --name" >&2
        exit 2
    fi
    cluster up --name "$name" --ranks "$ranks" --rate "$rate"
    owned=1
fi
cleanup() { [ "$owned" = 1 ] && cluster down --name "$name" || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$out"
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
n=0
for run in "${runs[@]}"; do
    read -r variant collective flag value <<<"$run"
    n=$((n + 1))
    label=${value//:/-}
    csv="$out/${variant}-${label//=/}_${collective}.csv"  # e.g. coll_compressed-bfp-rate8_allgather.csv
    if [ -e "$csv.json" ]; then
        echo "[$n/${#runs[@]}] $variant $collective $value: done ($csv)"
        continue
    fi
    rm -f "$csv"  # a run killed half-way: measure it again from the start
    echo "[$n/${#runs[@]}] $variant $collective $value"
    if ! cluster run --name "$name" -- "$python" -m "ccbench.benchmarks.$variant" \
            --collective "$collective" "$flag" "$value" -m "$sizes" \
            -i "$iterations" -x "$warmup" -c --csv "$csv"; then
        echo "repro_seed000: $variant $collective $value failed" >&2
        failed=$((failed + 1))
    fi
done

"$python" - "$out" <<'EOF' | tee "$out/summary.txt"
# The goals at the largest size: MPI baseline vs link bound, compressed speed-ups (goal:
# 0.7 x the nominal ratio) and collective-level vs point-to-point latency, with the
# measured compression ratio and the paper's figures next to them.
import sys

from ccbench.benchmarks.results import read_results

frame = read_results([sys.argv[1]])
frame = frame[frame["ranks"] == 4]
size = int(frame["size_bytes"].max())
at = frame[frame["size_bytes"] == size]
link_gbps = float(at["link_gbps"].dropna().iloc[0])
NOMINAL = {"fp16": 2.0, "bfp:rate=8": 4.0, "zfp:rate=8": 4.0}
PAPER = {"allgather": "30.3%", "reduce_scatter": "40.6%", "allreduce": "-"}


def latency(variant, collective, column="avg_us", **match):
    rows = at[(at["variant"] == variant) & (at["collective"] == collective)]
    for key, value in match.items():
        rows = rows[rows[key] == value]
    return float(rows[column].iloc[-1]) if len(rows) else None  # the newest run


print(f"ccbench seed-000 reproduction: 4 ranks, {link_gbps:g} Gbit/s links, size {size} B")
for collective in ("allgather", "reduce_scatter", "allreduce"):
    mpi = latency("baseline", collective, algorithm="mpi")
    if mpi is None:
        continue
    ring = latency("baseline", collective, algorithm="ring")
    # wire bytes per rank of a ring: (n-1)/n of the buffer, twice for allreduce
    total = size * 4 if collective == "allgather" else size
    wire = (3 / 4) * total * (2 if collective == "allreduce" else 1)
    bound = wire * 8 / (link_gbps * 1e9) * 1e6
    print(f"\n{collective}: link bound {bound / 1e3:.1f} ms; MPI {mpi / 1e3:.1f} ms "
          f"({mpi / bound:.3f} x bound, goal <= 1.10)"
          + (f"; ring {ring / 1e3:.1f} ms" if ring else ""))
    print(f"  {'codec':<12} {'ratio':>6} {'p2p ms':>8} {'coll ms':>8} {'coll speed-up':>14} "
          f"{'goal':>6} {'coll vs p2p':>12} {'goal':>5} {'paper':>6}")
    for codec, ratio in NOMINAL.items():
        p2p = latency("p2p_compressed", collective, codec=codec)
        coll = latency("coll_compressed", collective, codec=codec)
        if coll is None:
            continue
        measured = latency("coll_compressed", collective, "compression_ratio", codec=codec)
        lower = f"{1 - coll / p2p:.1%}" if p2p else "-"
        print(f"  {codec:<12} {measured:>6.2f} {p2p / 1e3 if p2p else float('nan'):>8.1f} "
              f"{coll / 1e3:>8.1f} "
              f"{mpi / coll:>13.2f}x {0.7 * ratio:>5.1f}x {lower:>12} {'25%':>5} "
              f"{PAPER[collective]:>6}")
EOF

if [ "$plot" = 1 ]; then
    "$python" -m ccbench.plots "$out" -o "$out/figures" || echo "repro_seed000: plotting failed" >&2
fi
echo "repro_seed000: CSVs in $out (ccbench plot $out -o DIR draws the figures)"
[ "$failed" = 0 ] || { echo "repro_seed000: $failed runs failed" >&2; exit 1; }
