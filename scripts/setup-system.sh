#!/usr/bin/env bash
# Debian packages the root-only tests use: iproute2 (namespaces, tc) for the emulated
# cluster, munge and SLURM for the job-array test. Skipped, with a reason, without root.
#   scripts/setup-system.sh [PACKAGE...]     default: all of them
set -euo pipefail
if [ "$(id -u)" != 0 ]; then
    echo "setup-system: not root; namespace and SLURM tests will be skipped"
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "setup-system: no apt-get; namespace and SLURM tests may be skipped"
    exit 0
fi
packages=(iproute2 munge slurmctld slurmd slurm-client)
if [ $# -gt 0 ]; then
    packages=("$@")
fi
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup-system: ${packages[*]} present"
