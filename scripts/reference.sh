#!/usr/bin/env bash
# Regenerate the regression reference, results/reference/ci.csv, from sweeps/ci.toml, and
# record the load it was measured under in results/reference/ci.load. Run it on an
# otherwise idle host (the timing ratios of a loaded 2-core host are not an idle CI
# runner's), then commit both files.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
load() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?"; }
before="$(load)"
ccbench sweep sweeps/ci.toml --rerun
ccbench merge results/ci -o results/reference/ci.csv --no-sidecar
{
    echo "# the load average (1, 5, 15 minutes) while results/reference/ci.csv was measured"
    echo "commit $(git rev-parse HEAD 2>/dev/null || echo '?')"
    echo "cores $(nproc)"
    echo "load_start $before"
    echo "load_end $(load)"
} > results/reference/ci.load
cat results/reference/ci.load
