#!/usr/bin/env bash
# The README's main job: the three papers' figures and headline numbers on this host.
#   scripts/run-local.sh           sweeps/main.toml (63 minutes on a shared 2-core host at
#                                  load 4-11; the sweep prints its time left from measured
#                                  task costs scaled by the load, and the job what it took)
#   scripts/run-local.sh --quick   sweeps/quick.toml (fewer sizes, rounds and figures)
# First where the papers measured, 4 ranks on emulated 1 Gbit/s links (root, or
# unprivileged user namespaces; docs/emulated-cluster.md), then shared memory, then the
# codecs and the MG-WFBP simulation; one page: <output>/figures/index.html. Where no
# emulated cluster can be built, the link tasks are left out and the page says why.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
spec=sweeps/main.toml
if [ "${1:-}" = "--quick" ]; then
    spec=sweeps/quick.toml
    shift
fi
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
scripts/setup-system.sh iproute2
links=()
if ! why="$(ccbench cluster check 2>&1)"; then
    echo "emulated links left out: $why"
    links=(--no-links)
fi
ccbench sweep "$spec" "${links[@]}" "$@"
out="$(python -c "import sys, tomllib; print(tomllib.load(open(sys.argv[1], 'rb'))['sweep']['output'])" "$spec")"
# MG-WFBP's trace-based simulation to 2048 ranks (a model: seconds), in the sweep's run
CCBENCH_SWEEP_ID="$(cat "$out/.sweep-id")" ccbench simulate --quiet --csv "$out/simulate.csv"
# "Should you compress?": GPT-2 small's FSDP step, predicted from this run's parts, then
# checked by replaying the top options on a 1 Gbit/s emulated cluster (about 4 minutes);
# kept beside the results, not in them (its CSVs are not result rows)
advice=()
if [ ${#links[@]} -eq 0 ]; then
    rm -rf "$out-advice" && mkdir -p "$out-advice"
    advise=(ccbench advise --model gpt2-small --ranks 4 --results "$out"
            --csv "$out-advice/advise.csv")
    checked=("${advise[@]}" --network ccbadv --check --rounds 3 --steps 2)
    if ccbench cluster up --name ccbadv --ranks 4 --rate 1gbit \
            && ccbench cluster selfcheck --name ccbadv --step-only \
            && "${checked[@]}"; then
        echo "${checked[*]}" > "$out-advice/command.txt"
        advice=(--advice "$out-advice")
    elif "${advise[@]}"; then
        echo "the advice's check failed (above): the page gives the advice unchecked"
        echo "${advise[*]}" > "$out-advice/command.txt"
        advice=(--advice "$out-advice")
    else
        echo "advise failed (above): the page is drawn without 'Should you compress?'"
    fi
    ccbench cluster down --name ccbadv || true
fi
ccbench plot "$out" results/profiles -o "$out/figures" ${advice[@]+"${advice[@]}"}
echo "figures: $out/figures/index.html"
took=$((SECONDS - started))
echo "main job: $((took / 60)) min $((took % 60)) s on $(nproc) cores, load average now" \
    "$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"
