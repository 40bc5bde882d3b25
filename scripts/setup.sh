#!/usr/bin/env bash
# Create .venv with ccbench and everything its tests and main job need.
# Idempotent: a second run only reinstalls when pyproject.toml or a C source changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${CCBENCH_VENV:-.venv}
EXTRAS=${CCBENCH_EXTRAS:-local,codecs,torch,dev}
# A pinned CPU build of torch: an unpinned torch pulls a multi-GB CUDA build.
TORCH_SPEC=${CCBENCH_TORCH:-torch==2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.ccbench-installed"
# the C sources and headers too: pip install -e builds the codecs' fused kernels from them
want="$(cat pyproject.toml kernels/*.c kernels/*.h | sha256sum | cut -d' ' -f1) $EXTRAS $TORCH_SPEC"
corpus() {
    # The real tensors benchmarks time by default (--data gradient): built once, then
    # "up to date" in seconds. Needs torch; without it, benchmarks need --data normal.
    if [[ ",$EXTRAS," == *",torch,"* ]]; then
        "$VENV/bin/ccbench" corpus
    fi
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    corpus
    exit 0
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
if [[ ",$EXTRAS," == *",torch,"* ]]; then
    "$VENV/bin/python" -m pip install --quiet "$TORCH_SPEC"
fi
"$VENV/bin/python" -m pip install --quiet -e ".[$EXTRAS]"
echo "$want" > "$stamp"
echo "ccbench installed in $VENV"
corpus
