#!/usr/bin/env bash
# The README's main job: a sweep of every variant on local ranks, then the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
ccbench sweep sweeps/local.toml "$@"
ccbench plot results/local -o results/local/figures
echo "figures: results/local/figures/index.html"
