"""The `ccbench` command: lists the variants and dispatches the tool subcommands."""

from __future__ import annotations

import importlib
import sys

from benchmarks.errors import UsageError

# Variant scripts, run under mpiexec as `python -m benchmarks.<name>`.
VARIANTS = {
    "baseline": "the MPI library's collectives, and the same ring by hand",
    "p2p_compressed": "ring collectives compressing and decompressing at every hop",
    "coll_compressed": "compress once, forward compressed bytes, pipelined (seed 000)",
    "sparse_streaming": "OmniReduce: non-zero blocks streamed through aggregators (seed 001)",
    "merged_gradient": "MG-WFBP: layer gradients merged into optimal allreduces (seed 002)",
    "training": "sharded data-parallel training over the compressed collectives",
    "codec_throughput": "encode / decode throughput of every codec against a plain copy",
}

# Subcommands: name -> (module:function taking argv and returning an exit status, help)
SUBCOMMANDS = {
    "list": ("benchmarks.cli:list_variants", "list the benchmark variants"),
    "cluster": ("benchmarks.cluster:main", "emulated bandwidth-limited cluster on this host"),
    "sweep": ("benchmarks.sweep:main", "run a sweep spec on local ranks"),
    "merge": ("benchmarks.merge:main", "combine result CSVs of one schema"),
    "regress": ("benchmarks.regress:main", "compare results against a reference"),
    "plot": ("plots.cli:main", "draw the comparison figures from result CSVs"),
}


def list_variants(argv: list[str]) -> int:
    width = max(map(len, VARIANTS))
    print("Variants (run as: mpiexec -n N python -m benchmarks.<variant> --help):")
    for name, text in VARIANTS.items():
        print(f"  {name:<{width}}  {text}")
    return 0


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = ["usage: ccbench <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"ccbench: error: unknown command {name!r}\n{usage()}", file=sys.stderr)
        return 2
    module_name, function = SUBCOMMANDS[name][0].split(":")
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


def entry() -> int:
    """Console-script entry: `ccbench ... | head` ends quietly."""
    try:
        return main()
    except BrokenPipeError:
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(entry())
