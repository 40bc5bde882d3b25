#!/usr/bin/env bash
# `ccbench cluster` without an installed console script, from any directory:
#   scripts/cluster.sh up --ranks 4 --rate 1gbit
#   scripts/cluster.sh run -- python -m benchmarks.baseline -m 64K:16M
#   scripts/cluster.sh down
# Uses $PYTHON, else python3 on PATH (the one with mpi4py; under sudo, pass PYTHON=...).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$(command -v python3 || command -v python)}"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" -m benchmarks.cluster "$@"
