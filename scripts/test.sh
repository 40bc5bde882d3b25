#!/usr/bin/env bash
# The README's test command: set up on a fresh machine, then lint and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-system.sh
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
ruff check .
exec python -m pytest "$@"
