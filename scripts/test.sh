#!/usr/bin/env bash
# The README's test command: set up on a fresh machine, then lint and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-system.sh
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
ruff check .
# The regression gate: a small sweep checked against results/reference (exact for
# validation, wire bytes and ratios; timings as ratios to the MPI baseline of the same run).
if [ "$#" -eq 0 ]; then
    ccbench sweep sweeps/ci.toml --rerun
    ccbench regress results/ci.csv --against results/reference
fi
exec python -m pytest "$@"
