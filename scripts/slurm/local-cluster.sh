#!/usr/bin/env bash
# A throw-away single-host Slurm (munge + slurmctld + slurmd) for trying the ccbench
# sbatch scripts and for the CI test. Needs root; installs Debian's packages if missing.
#   local-cluster.sh up       install if needed, write the config, start the daemons
#   local-cluster.sh down     cancel jobs, stop what `up` started, remove the config
#   local-cluster.sh status   show the partition
# CCBENCH_SLURM_DIR (default /var/tmp/ccbench-slurm) holds state, logs and pid files.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
state=${CCBENCH_SLURM_DIR:-/var/tmp/ccbench-slurm}
conf=/etc/slurm/slurm.conf
marker="ccbench-local-cluster"

die() { echo "local-cluster.sh: $*" >&2; exit 1; }
log() { echo "local-cluster.sh: $*" >&2; }

install_packages() {
    local c missing=0
    for c in slurmctld slurmd sbatch munged; do
        command -v "$c" >/dev/null || missing=1
    done
    ((missing)) || return 0
    command -v apt-get >/dev/null || die "Slurm is not installed and apt-get is not available"
    export DEBIAN_FRONTEND=noninteractive
    # Refresh the package lists only when they do not know slurmctld yet (fresh images).
    apt-cache show slurmctld >/dev/null 2>&1 || apt-get update -qq
    log "installing slurmctld slurmd slurm-client munge"
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
}

munge_works() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    if munge_works; then return 0; fi
    [[ -s /etc/munge/munge.key ]] || runuser -u munge -- mungekey --create
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- munged
    touch "$state/started-munged"
    local i
    for i in $(seq 50); do munge_works && return 0; sleep 0.1; done
    die "munged did not start"
}

write_config() {
    if [[ -e $conf ]] && ! grep -q "$marker" "$conf"; then
        die "$conf exists and was not written by this script; refusing to replace it"
    fi
    local host node
    host=$(hostname -s)
    # `slurmd -C` prints this machine's real CPU/memory layout as a NodeName line.
    node=$(slurmd -C | head -n 1)
    mkdir -p /etc/slurm "$state/slurmctld" "$state/slurmd"
    sed -e "s|@HOST@|$host|g" -e "s|@STATE_DIR@|$state|g" -e "s|@NODE_LINE@|$node|" \
        "$here/slurm.conf.in" >"$conf.tmp"
    mv "$conf.tmp" "$conf"
}

pid_alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

wait_idle() {
    local host i st
    host=$(hostname -s)
    for i in $(seq 60); do
        st=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
        case $st in
            idle* | mixed* | allocated*) return 0 ;;
            down* | drain*) scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true ;;
        esac
        sleep 0.5
    done
    die "node $host did not become idle (state '$st'); see $state/slurmctld.log and $state/slurmd.log"
}

up() {
    [[ $(id -u) -eq 0 ]] || die "must run as root"
    install_packages
    mkdir -p "$state"
    start_munge
    write_config
    pid_alive "$state/slurmctld.pid" || slurmctld
    pid_alive "$state/slurmd.pid" || slurmd
    wait_idle
    log "up: $(sinfo -h -o '%P %D %T %N' | head -n 1)"
}

stop_pidfile() {
    local pidfile=$1 pid i
    pid_alive "$pidfile" || return 0
    pid=$(cat "$pidfile")
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
}

down() {
    # Best effort throughout: `down` must always leave the host clean.
    if command -v squeue >/dev/null && [[ -e $conf ]] && grep -q "$marker" "$conf"; then
        local jobs
        jobs=$(squeue -h -o %A 2>/dev/null || true)
        [[ -z $jobs ]] || scancel $jobs 2>/dev/null || true
    fi
    stop_pidfile "$state/slurmd.pid"
    stop_pidfile "$state/slurmctld.pid"
    if [[ -e $state/started-munged ]]; then
        stop_pidfile /run/munge/munged.pid
        rm -f "$state/started-munged"
    fi
    if [[ -e $conf ]] && grep -q "$marker" "$conf"; then rm -f "$conf"; fi
    log "down"
}

case ${1:-} in
    up) up ;;
    down) down ;;
    status) sinfo ;;
    *) die "usage: local-cluster.sh up|down|status" ;;
esac
