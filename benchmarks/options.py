"""Command-line options, spelled as OSU Micro-Benchmarks 7.x spells them."""

from __future__ import annotations

import argparse

from ccbench.kernels.arrays import buffer_choices
from ccbench.kernels.errors import UsageError
from ccbench.kernels.host_memory import DEFAULT_HUGEPAGES, HUGEPAGE_POLICIES
from ccbench.kernels.inputs import DATA_KINDS
from ccbench.kernels.units import parse_size
from ccbench.kernels.vocabulary import BUFFERS, DTYPES

DEFAULT_DATA = "gradient"
FALLBACK_DATA = "gradient-like"  # seeded synthetic gradients: needs no corpus

LARGE_MESSAGE_SIZE = 8192  # OSU: above this, fewer iterations and warm-ups
ITERATIONS, ITERATIONS_LARGE = 1000, 100
WARMUP, WARMUP_LARGE = 100, 10
TIMINGS = ("per-call", "batch")


def parse_message_sizes(text: str) -> tuple[int, int]:
    """'-m [MIN:]MAX' -> (MIN, MAX); MIN defaults to 1 byte."""
    lo, sep, hi = text.partition(":")
    low, high = (parse_size(lo), parse_size(hi)) if sep else (1, parse_size(lo))
    if low < 1:
        raise UsageError(f"-m {text}: the minimum message size is 1 byte")
    if low > high:
        raise UsageError(f"-m {text}: MIN ({low}) is greater than MAX ({high})")
    return low, high


def message_sizes(low: int, high: int) -> list[int]:
    """OSU's sweep: MIN, 2 MIN, 4 MIN, ... up to MAX."""
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size *= 2
    return sizes


def size_list(text: str) -> list[int]:
    """-m as a range ('[MIN:]MAX', OSU's doubling sweep) or as sizes ('4K,1M,16M')."""
    if "," not in text:
        return message_sizes(*parse_message_sizes(text))
    sizes = [parse_size(item) for item in text.split(",") if item.strip()]
    if not sizes or min(sizes) < 1:
        raise UsageError(f"-m {text}: sizes must be at least 1 byte")
    if sizes != sorted(set(sizes)):
        raise UsageError(f"-m {text}: list the sizes once each, in increasing order")
    return sizes


def format_sizes(sizes: list[int]) -> str:
    """The -m text for these sizes: a range when they double from the first, else a list."""
    if sizes == message_sizes(sizes[0], sizes[-1]):
        return f"{sizes[0]}:{sizes[-1]}"
    return ",".join(map(str, sizes))


def iterations_for(size: int, opts) -> tuple[int, int]:
    """(iterations, warm-ups) for one message size: the user's, or OSU's defaults."""
    large = size > LARGE_MESSAGE_SIZE
    iters = (
        opts.iterations
        if opts.iterations is not None
        else (ITERATIONS_LARGE if large else ITERATIONS)
    )
    warmup = opts.warmup if opts.warmup is not None else (WARMUP_LARGE if large else WARMUP)
    return iters, warmup


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (value > 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (value >= 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r} must be a number, 0 or more")
    return value


class RankAwareParser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of exiting, and prints help from one rank."""

    def __init__(self, *args, quiet: bool = False, **kwargs):
        self.quiet = quiet
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise UsageError(message)

    def _print_message(self, message, file=None):
        if not self.quiet:
            super()._print_message(message, file)


# One option set for every entry point: a letter means the same thing everywhere. -m: the
# message sizes (OSU's), -i: timed repetitions of each measured point (what a repetition
# is, a call, a step, a round, each program says), -x: untimed warm-up repetitions,
# -c: validate, -d: buffer backend, -T: element type; --transport, --backend, --csv, --json,
# --seed.


def add_sizes(parser, default: str, note: str = "") -> None:
    parser.add_argument(
        "-m",
        "--message-size",
        default=default,
        metavar="[MIN:]MAX",
        help=f"message sizes: MIN, 2 MIN, ... MAX, or a list 4K,1M (K, M, G "
        f"suffixes; default {default}){note}",
    )


def add_repetitions(parser, default, repetition: str, warmup_default=None) -> None:
    """-i (and -x, when `warmup_default` is given) with `repetition` saying what one is."""
    shown = (
        default
        if default is not None
        else (f"{ITERATIONS}, {ITERATIONS_LARGE} above {LARGE_MESSAGE_SIZE} B")
    )
    parser.add_argument(
        "-i",
        "--iterations",
        type=positive_int,
        default=default,
        help=f"timed repetitions of each point: {repetition} (default {shown})",
    )
    if warmup_default is not False:
        shown = (
            warmup_default
            if warmup_default is not None
            else (f"{WARMUP}, {WARMUP_LARGE} above {LARGE_MESSAGE_SIZE} B")
        )
        parser.add_argument(
            "-x",
            "--warmup",
            type=non_negative_int,
            default=warmup_default,
            help=f"untimed warm-up repetitions of each point (default {shown})",
        )


def add_rounds(parser, default: int | None, what: str = "rounds") -> None:
    """--rounds: how many interleaved rounds a comparing tool runs. Each tool's default is
    its statistics' (a median of order statistics wants more rounds than a mean); None
    leaves it to the tool's spec."""
    shown = "the spec's" if default is None else default
    parser.add_argument(
        "--rounds", type=positive_int, default=default, help=f"{what} (default {shown})"
    )


def add_no_bind(parser) -> None:
    """--no-bind: leave ranks unbound (by default each rank is bound to one core)."""
    parser.add_argument(
        "--no-bind",
        action="store_true",
        help="leave ranks unbound (default: each bound to a core, "
        "-bind-to core / --cpu-bind=cores; also CCBENCH_BIND=0)",
    )


def add_validate(parser, what: str = "check results against a reference") -> None:
    parser.add_argument(
        "-c", "--validate", action="store_true", help=f"validate: {what}; exit 1 on any failure"
    )


def add_buffer(parser, default_dtype: str = "float32") -> None:
    parser.add_argument(
        "-d",
        "--buffer",
        choices=buffer_choices(),
        default="numpy",
        help=f"buffer backend: {', '.join(BUFFERS)} (default numpy); each "
        "rank takes the device of its node-local rank",
    )
    parser.add_argument(
        "--hugepages",
        choices=HUGEPAGE_POLICIES,
        default=DEFAULT_HUGEPAGES,
        help="numpy buffers: off (default) allocates as OSU's C benchmarks "
        "do; madvise asks for transparent huge pages, numpy's own "
        "default (faster large copies on some hosts)",
    )
    parser.add_argument(
        "-T",
        "--dtype",
        choices=DTYPES,
        default=default_dtype,
        help=f"element type (default {default_dtype})",
    )


TRANSPORTS = ("mpi", "torch")


def add_transport(parser) -> None:
    """--transport and --backend: which library moves the bytes (collectives/comm.py)."""
    parser.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default="mpi",
        help="mpi: mpi4py (default); torch: torch.distributed, the same "
        "algorithms over its collectives and point-to-point calls",
    )
    parser.add_argument(
        "--backend",
        choices=("gloo", "nccl"),
        default=None,
        help="--transport torch: nccl (default for -d torch-cuda and cupy) "
        "or gloo (default for host buffers)",
    )


def resolve_transport(opts) -> None:
    """opts.backend from --transport and the buffer; UsageError where it cannot run."""
    if opts.transport == "mpi":
        if opts.backend is not None:
            raise UsageError("--backend applies to --transport torch (MPI is its own backend)")
        opts.backend = "mpi"
        return
    from ccbench.collectives.comm_torch import check_backend, default_backend

    opts.backend = opts.backend or default_backend(opts.buffer)
    check_backend(opts.backend, opts.buffer)


def resolve_algorithm(algorithm: str | None, transport: str) -> str:
    """The library's collective is spelled mpi over MPI, library over the torch transport."""
    own = "mpi" if transport == "mpi" else "library"
    if algorithm is None:
        return own
    if algorithm in ("mpi", "library") and algorithm != own:
        raise UsageError(
            f"--algorithm {algorithm} with --transport {transport}: the "
            f"library's own collective is --algorithm {own} there"
        )
    return algorithm


# The compression setting: one declaration of --codec, --chunk-bytes and --error-feedback,
# one parse (collectives/compression.py has the object the run carries down).

TORCH_HOOKS = ("none", "fp16", "bf16", "powersgd")  # --variant torch: torch's DDP hooks


def chunk_option(text: str) -> int | str:
    """--chunk-bytes: bytes (K, M, G suffixes), 0, or auto."""
    from ccbench.collectives.compression import AUTO

    if text.strip().lower() == AUTO:
        return AUTO
    try:
        value = parse_size(text)
    except UsageError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


def add_compression(
    parser,
    *,
    default: str | None = "none",
    codec_help: str = "codec spec",
    many: bool = False,
    chunk: bool = False,
    auto: bool = False,
    error_feedback: bool = False,
) -> None:
    """--codec SPEC (``many``: repeatable, a list), and where the command pipelines or
    trains, --chunk-bytes (``auto``: the measured choice too) and --error-feedback."""
    shown = "" if default is None or many else f" (default {default})"
    parser.add_argument(
        "--codec",
        action="append" if many else "store",
        default=None if many else default,
        metavar="SPEC",
        help=codec_help + shown,
    )
    if chunk:
        from ccbench.collectives.chunking import DEFAULT_CHUNK_BYTES

        parser.add_argument(
            "--chunk-bytes",
            type=chunk_option,
            default=None,
            metavar="BYTES",
            help="collective-level compressed ring: uncompressed bytes per pipelined "
            f"chunk (default {DEFAULT_CHUNK_BYTES // 1024}K"
            + (", auto over NCCL" if auto else "")
            + "; 0: one chunk per ring block, no pipelining"
            + (
                "; auto: chosen per size from the block, the codec's rate and ratio and "
                "the transport's per-message cost and rate, measured at start-up; on a "
                "device never a chunk whose launches cost the host over 5%% of its wire "
                "time)"
                if auto
                else ")"
            ),
        )
    if error_feedback:
        parser.add_argument(
            "--error-feedback",
            action="store_true",
            help="carry the gradient codec's error to the next step (lossy codecs)",
        )


def compression_of(
    codec: str,
    *,
    variant: str | None = None,
    chunk_bytes: int | str | None = None,
    error_feedback: bool = False,
    auto: bool = False,
    hooks: bool = False,
):
    """The one parse of a run's compression setting. ``variant`` None: a compressed
    variant's own --codec (any codec, none included). Training's or trace replay's
    --variant: a compressed one needs one of ccbench's codecs, the others send
    uncompressed data (the registry says which is which); ``hooks`` (training): torch
    takes torch's own DDP hooks."""
    from ccbench.collectives.compression import AUTO, Compression
    from ccbench.kernels import variants
    from ccbench.kernels.codecs import parse_codec

    if chunk_bytes == AUTO and not auto:
        raise UsageError(
            "--chunk-bytes auto: coll_compressed measures the rates it needs at start-up; "
            "give a size here"
        )
    setting = dict(chunk_bytes=chunk_bytes, error_feedback=error_feedback)
    if variant is None:
        return Compression(parse_codec(codec), **setting)
    if variant == variants.TORCH and hooks:
        if codec not in TORCH_HOOKS:
            raise UsageError(f"--variant torch takes --codec {', '.join(TORCH_HOOKS)}")
        return Compression(None, hook=codec, **setting)
    if variants.schedule(variant) is None:
        if codec != "none":
            raise UsageError(
                f"the {variant} variant sends uncompressed data: use a "
                f"compressed variant for --codec {codec}"
            )
        return Compression(None, **setting)
    if codec == "none":
        raise UsageError(f"--variant {variant} needs a codec, e.g. --codec fp16")
    return Compression(parse_codec(codec), **setting)


def compression_from(opts, variant: str | None = None, auto: bool = False, hooks: bool = False):
    """compression_of the parsed options (--chunk-bytes and --error-feedback where the
    command declares them)."""
    return compression_of(
        opts.codec,
        variant=variant,
        chunk_bytes=getattr(opts, "chunk_bytes", None),
        error_feedback=getattr(opts, "error_feedback", False),
        auto=auto,
        hooks=hooks,
    )


def add_codec_list(parser, default: str) -> None:
    """--codecs A,B: the codecs a tool weighs (ccbench advise); codecs_from parses them."""
    parser.add_argument("--codecs", default=default, help=f"codecs ({default})")


def codecs_from(specs) -> list:
    """Several codecs (a repeated --codec, advise's --codecs list), parsed."""
    from ccbench.kernels.codecs import parse_codec

    return [parse_codec(spec.strip()) for spec in specs if spec.strip()]


def add_cuda_graph(parser) -> None:
    """--cuda-graph N: the timed call captured once into a CUDA graph, N replays timed per
    iteration (nccl-tests' -G); 0, the default: eager calls."""
    parser.add_argument(
        "--cuda-graph",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="device buffers: warm up eagerly, capture the timed call once in a CUDA "
        "graph, time N replays per iteration (0: eager calls, the default); only calls "
        "queued wholly on the device can be captured (docs/gpu.md)",
    )


def add_output(parser, rows: str, json: bool = False) -> None:
    parser.add_argument(
        "--csv",
        metavar="PATH",
        help=f"append {rows} to this CSV (its run's environment goes to PATH.json)",
    )
    if json:
        parser.add_argument(
            "--json",
            metavar="PATH",
            help="write this run's rows and environment as one JSON document",
        )


def add_seed(parser, what: str = "the generated inputs") -> None:
    parser.add_argument(
        "--seed", type=non_negative_int, default=0, help=f"seed of {what} (default 0)"
    )


def build_parser(prog: str, description: str, collectives, quiet: bool) -> RankAwareParser:
    parser = RankAwareParser(
        prog=prog,
        description=description,
        quiet=quiet,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    osu = parser.add_argument_group("OSU options")
    add_sizes(osu, "1:1M", note="; OSU's convention per collective (README)")
    add_repetitions(osu, None, "calls per size", warmup_default=None)
    osu.add_argument(
        "-f", "--full", action="store_true", help="print min, max, iterations, p50 and p99 too"
    )
    add_validate(osu)
    add_buffer(osu)
    common = parser.add_argument_group("ccbench options")
    common.add_argument(
        "--collective",
        choices=collectives,
        default=collectives[0],
        help=f"collective to run (default {collectives[0]})",
    )
    common.add_argument(
        "--timing",
        choices=TIMINGS,
        default="per-call",
        help="per-call: barrier, then Wtime around each call (OSU's C "
        "benchmarks); batch: Wtime around the back-to-back loop "
        "(OMB-Py), for small messages",
    )
    add_transport(common)
    add_cuda_graph(common)
    add_output(common, "one row per size", json=True)
    add_seed(common)
    common.add_argument(
        "--data",
        default=None,
        metavar="KIND",
        help=f"what the timed calls carry (default {DEFAULT_DATA}: real "
        f"gradients from the corpus; where values cannot change the "
        f"time, as uncompressed, {FALLBACK_DATA} until the corpus is "
        f"built); -c validates on exact integers in a pass of its own. "
        f"Kinds: {DATA_KINDS}",
    )
    common.add_argument(
        "--ci-target",
        type=positive_float,
        default=None,
        metavar="PCT",
        help="time each size in rounds of -i calls until the 95%% interval "
        "of the mean is within +-PCT%% (or --time-budget is spent)",
    )
    common.add_argument(
        "--time-budget",
        type=positive_float,
        default=None,
        metavar="SEC",
        help="with --ci-target: stop a size after SEC seconds of timing (default 10)",
    )
    return parser


def split_common(argv: list[str]) -> tuple[list[str], list[str]]:
    """(a tool's own arguments, the options after -- that both sides of a comparison get)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def launch_backend(argv: list[str]) -> str:
    """The torch backend a torchrun launch starts with, read from argv before it is
    parsed (--backend, else the default of -d); bad values are left to the parser."""
    peek = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    peek.add_argument("--backend", default=None)
    peek.add_argument("-d", "--buffer", default="numpy")
    try:
        known, _ = peek.parse_known_args(argv)
    except (argparse.ArgumentError, SystemExit):  # the real parser will say what is wrong
        return "gloo"
    if known.backend in ("gloo", "nccl"):
        return known.backend
    return "nccl" if known.buffer in ("cupy", "torch-cuda") else "gloo"
