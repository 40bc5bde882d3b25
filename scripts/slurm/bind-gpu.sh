#!/usr/bin/env bash
# srun wrapper: one GPU per local rank. Rank SLURM_LOCALID gets the LOCALID-th GPU (modulo
# the count) of those the job sees, as CUDA_VISIBLE_DEVICES; without GPUs it changes
# nothing. The sweep puts it in front of the variant when [slurm] gpus_per_node > 0.
# CCBENCH_GPU_BIND=none leaves CUDA_VISIBLE_DEVICES alone (e.g. for an MPI that wants to
# see every GPU for CUDA IPC and picks the device itself).
set -euo pipefail
gpus=()
if [[ ${CCBENCH_GPU_BIND:-local} != none ]]; then
    if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
        IFS=, read -r -a gpus <<<"$CUDA_VISIBLE_DEVICES"
    elif command -v nvidia-smi >/dev/null 2>&1; then
        mapfile -t gpus < <(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null || true)
    fi
fi
if ((${#gpus[@]} > 0)); then
    export CUDA_VISIBLE_DEVICES=${gpus[$((${SLURM_LOCALID:-0} % ${#gpus[@]}))]}
fi
exec "$@"
