"""The `ccbench` command: runs a benchmark variant or one of the tools that drive runs.

    mpiexec -n 2 ccbench baseline --collective allgather -m 1:1M -f -c
    ccbench sweep sweeps/local.toml
    ccbench plot results/local -o results/local/figures

`ccbench VARIANT ...` is `python -m ccbench.benchmarks.VARIANT ...`: the same program,
started under `mpiexec` (or `srun`) for the MPI variants.
"""

from __future__ import annotations

import importlib
import sys

from ccbench.kernels import variants
from ccbench.kernels.errors import UsageError

# Benchmark variants, from the registry: name -> (needs MPI ranks, what it measures)
VARIANTS = {
    name: (variants.BY_NAME[name].needs_mpi, variants.BY_NAME[name].description)
    for name in variants.COMMANDS
}

# Tools: name -> (module:function taking argv and returning an exit status, help)
SUBCOMMANDS = {
    "list": ("ccbench.scripts.cli:list_variants", "list the benchmark variants"),
    "cluster": (
        "ccbench.scripts.cluster.command:main",
        "emulated bandwidth-limited cluster on this host",
    ),
    "sweep": ("ccbench.scripts.sweeps.sweep:main", "run a sweep spec on local ranks or SLURM"),
    "merge": ("ccbench.scripts.sweeps.merge:main", "combine result CSVs of one schema"),
    "regress": ("ccbench.scripts.sweeps.regress:main", "compare exact metrics against a reference"),
    "plot": ("ccbench.plots.cli:main", "draw the comparison figures from result CSVs"),
    "compare": (
        "ccbench.scripts.comparisons.compare:main",
        "two benchmarks in interleaved rounds: ratio, interval, verdict",
    ),
    "osu-check": (
        "ccbench.scripts.comparisons.osu_check:main",
        "the MPI baseline against OSU's own binaries, interleaved",
    ),
    "gate": (
        "ccbench.scripts.comparisons.gate:main",
        "fail when this tree makes a gated benchmark slower",
    ),
    "profile": ("ccbench.scripts.profile_layers:main", "profile MG-WFBP's models layer by layer"),
    "simulate": ("ccbench.scripts.simulate:main", "MG-WFBP trace-based simulation to 2048 ranks"),
    "corpus": ("ccbench.scripts.corpus:main", "capture real gradients, weights, activations"),
    "gpu-check": (
        "ccbench.scripts.gpu.check:main",
        "the GPU acceptance run: every variant on device buffers, MPI and NCCL, a report",
    ),
    "trace": (
        "ccbench.scripts.tracing.command:main",
        "capture, build, show, convert and replay training steps' collective traces",
    ),
    "advise": (
        "ccbench.scripts.advise.command:main",
        "should you compress? options ranked by predicted step time, checked by replays",
    ),
}


def list_variants(argv: list[str]) -> int:
    width = max(map(len, VARIANTS))
    print(
        "Variants (run as: mpiexec -n N ccbench <variant> --help, or "
        "python -m ccbench.benchmarks.<variant>):"
    )
    for name, (mpi, text) in VARIANTS.items():
        how = "" if mpi else "  [one process, no mpiexec]"
        print(f"  {name:<{width}}  {text}{how}")
    return 0


def usage() -> str:
    width = max(map(len, [*SUBCOMMANDS, *VARIANTS]))
    lines = ["usage: ccbench <command> [options]", "", "tools:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in SUBCOMMANDS.items()]
    lines += ["", "benchmark variants (under mpiexec):"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in VARIANTS.items()]
    return "\n".join(lines)


def _target(name: str) -> tuple[str, str]:
    if name in VARIANTS:
        return f"ccbench.benchmarks.{name}", "main"
    module, function = SUBCOMMANDS[name][0].split(":")
    return module, function


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS and name not in VARIANTS:
        print(f"ccbench: error: unknown command {name!r}\n{usage()}", file=sys.stderr)
        return 2
    module_name, function = _target(name)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        print(f"ccbench: error: {name} is not available in this installation", file=sys.stderr)
        return 2
    try:
        return int(getattr(module, function)(rest) or 0)
    except UsageError as exc:
        print(f"ccbench {name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # one line, never a traceback (tools keep what they finished)
        print(f"\nccbench {name}: interrupted", file=sys.stderr)
        return 130


def entry() -> int:
    """Console-script entry: `ccbench ... | head` ends quietly."""
    try:
        return main()
    except BrokenPipeError:
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(entry())
