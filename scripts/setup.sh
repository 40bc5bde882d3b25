#!/usr/bin/env bash
# Create .venv with ccbench and everything its tests and main job need.
# Idempotent: a second run only reinstalls when pyproject.toml or a C source changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${CCBENCH_VENV:-.venv}
EXTRAS=${CCBENCH_EXTRAS:-local,codecs,torch,dev}
# torch, pinned. Which build pip takes depends on the index: PyTorch's CPU wheel index
# (TORCH_INDEX, the --index-url its install selector gives for "Linux, Pip, CPU") has the
# CPU build; on Linux, PyPI's torch is a CUDA build of several GB. Without TORCH_INDEX, pip
# takes what its configured index offers (a local wheelhouse may hold the CPU build).
TORCH_SPEC=${CCBENCH_TORCH:-torch==2.13.0}
TORCH_INDEX=${TORCH_INDEX:-}

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.ccbench-installed"
# the C sources and headers too: pip install -e builds the codecs' fused kernels from them
want="$(cat pyproject.toml kernels/*.c kernels/*.h | sha256sum | cut -d' ' -f1) $EXTRAS $TORCH_SPEC${TORCH_INDEX:+ $TORCH_INDEX}"
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
torch_build() {
    "$VENV/bin/python" -c 'import torch; print(f"torch {torch.__version__}: " + (f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU build"))' 2>/dev/null || echo "torch: not importable"
}
if [[ ",$EXTRAS," == *",torch,"* ]]; then
    if [ -e /proc/driver/nvidia/version ] || nvidia-smi -L >/dev/null 2>&1; then
        why="an NVIDIA driver is present"
    else
        why="no NVIDIA driver found"
    fi
    if [ -n "$TORCH_INDEX" ]; then
        echo "setup: $why; installing $TORCH_SPEC from TORCH_INDEX ($TORCH_INDEX)"
        "$VENV/bin/python" -m pip install --quiet "$TORCH_SPEC" --index-url "$TORCH_INDEX"
    else
        if [ "$why" = "no NVIDIA driver found" ] && [ "$(uname -s)" = Linux ]; then
            echo "setup: $why and TORCH_INDEX is not set: installing $TORCH_SPEC from pip's" \
                 "configured index; from PyPI that is a CUDA build of several GB. For the" \
                 "CPU build, set TORCH_INDEX to PyTorch's CPU wheel index (README)."
        else
            echo "setup: $why; installing $TORCH_SPEC from pip's configured index"
        fi
        "$VENV/bin/python" -m pip install --quiet "$TORCH_SPEC"
    fi
    echo "setup: installed $(torch_build)"
fi
"$VENV/bin/python" -m pip install --quiet -e ".[$EXTRAS]"
echo "$want" > "$stamp"
echo "ccbench installed in $VENV"
corpus
