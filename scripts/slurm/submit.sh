#!/usr/bin/env bash
# Submit a sweep spec to SLURM: one job array per rank count (one array task per sweep
# task) plus a merge job that runs once they have all ended. Prints every sbatch command
# before running it; with --dry-run only prints them. Tasks already complete in the
# output folder are left out, so running this again after a failure resumes.
#   scripts/slurm/submit.sh SPEC [--dry-run] [-o OUTPUT_DIR] [--sbatch-arg=--account=X ...]
# CCBENCH_PYTHON selects the Python (default python3 on PATH).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
exec "${CCBENCH_PYTHON:-python3}" -m ccbench.scripts.sweeps.sweep --submit "$@"
