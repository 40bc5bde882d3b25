#!/usr/bin/env bash
# The README's main job: a sweep of every variant on local ranks, then the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
ccbench sweep sweeps/local.toml "$@"
ccbench plot results/local -o results/local/figures
echo "figures: results/local/figures/index.html"
# Seed 000 where the papers measure it: on a bandwidth-limited network (4 ranks, emulated
# 1 Gbit/s links; root or unprivileged user namespaces; docs/emulated-cluster.md). The
# sweep brings the cluster up and down, and ends with the verdicts of the paper's pair
# (collective level against point to point) from interleaved rounds, with intervals.
scripts/setup-system.sh iproute2
if why="$(ccbench cluster check 2>&1)"; then
    ccbench sweep sweeps/seed000-network.toml "$@"
    ccbench plot results/seed000-network -o results/seed000-network/figures
    echo "network-bound figures: results/seed000-network/figures/index.html"
else
    echo "network-bound sweep skipped: $why"
fi
