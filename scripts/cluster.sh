#!/usr/bin/env bash
# `ccbench cluster` without an installed console script, from any directory:
#   scripts/cluster.sh up --ranks 4 --rate 1gbit
#   scripts/cluster.sh run -- python -m ccbench.benchmarks.baseline -m 64K:16M
#   scripts/cluster.sh down
# Uses $CCBENCH_PYTHON, else the project's .venv (scripts/setup.sh), else python3 on PATH.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${CCBENCH_PYTHON:-}"
if [ -z "$python" ]; then
    python="$repo/${CCBENCH_VENV:-.venv}/bin/python"
    [ -x "$python" ] || python="$(command -v python3 || command -v python)"
fi
exec "$python" -m ccbench.scripts.cluster "$@"
