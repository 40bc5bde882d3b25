#!/usr/bin/env bash
# The GPU acceptance run, in one command: install what the GPU path needs where a GPU is
# present (the gpu extra: cupy; a CUDA build of torch where torch is a CPU build), then
# every variant with -c on -d cupy and -d torch-cuda over MPI (staged, and GPU-aware where
# the MPI is) and over NCCL, one FSDP and one DDP step, the device tests, and the
# performance goals (codecs against the device copy, staging against pinned copies, the
# compressed allgather against NCCL's). Writes results/gpu-check/report.md and report.csv
# (--out to change). Without a GPU it installs nothing, runs to the end and says, cell by
# cell, why it skipped.
#
#   scripts/gpu-check.sh [--no-install] [--out DIR] [--ranks N] [--jobs N]
#
# The Python is $PYTHON, else .venv's where there is one, else python3. --no-install:
# nothing is installed (ccbench importable from that Python, e.g. on PYTHONPATH), and
# mpiexec is $CCBENCH_MPIEXEC or the first on PATH.
# CCBENCH_TORCH_CUDA_INDEX: the wheel index of the CUDA torch build (default cu124's).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    if [ -x .venv/bin/python ]; then
        PYTHON=.venv/bin/python
    fi
fi
install=1
args=()
for arg in "$@"; do
    if [ "$arg" = "--no-install" ]; then install=0; else args+=("$arg"); fi
done

gpu_present() {
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

if [ "$install" = 1 ] && gpu_present; then
    if ! "$PYTHON" -c 'import sys, torch; sys.exit(torch.version.cuda is None)' 2>/dev/null; then
        echo "gpu-check: installing a CUDA build of torch"
        "$PYTHON" -m pip install --quiet --upgrade torch \
            --index-url "${CCBENCH_TORCH_CUDA_INDEX:-https://download.pytorch.org/whl/cu124}"
    fi
    if ! "$PYTHON" -c 'import cupy' 2>/dev/null; then
        echo "gpu-check: installing the gpu extra (cupy)"
        "$PYTHON" -m pip install --quiet -e ".[gpu]"
    fi
elif [ "$install" = 1 ]; then
    echo "gpu-check: no GPU here (nvidia-smi lists none): nothing to install"
fi

if [ "$install" = 0 ] && [ "$PYTHON" != .venv/bin/python ] && [ -z "${CCBENCH_MPIEXEC:-}" ] \
        && command -v mpiexec >/dev/null 2>&1; then
    # the environment's MPI (its mpi4py ABI and library set there), not one beside python3
    CCBENCH_MPIEXEC=$(command -v mpiexec)
    export CCBENCH_MPIEXEC
fi
if ! "$PYTHON" -c 'import ccbench.scripts.gpu.check' 2>/dev/null; then
    echo "gpu-check: $PYTHON cannot import ccbench (install it, or put it on PYTHONPATH)" >&2
    exit 2
fi
exec "$PYTHON" -m ccbench.scripts.gpu.check ${args[@]+"${args[@]}"}
