"""Option parsing and the size conventions, without MPI ranks."""

from __future__ import annotations

import pytest

from ccbench.benchmarks.options import message_sizes, parse_message_sizes, parse_size
from ccbench.collectives.spec import spec
from ccbench.kernels.errors import UsageError


def case_shape(collective, size, ranks, dtype):
    shape = spec(collective).shape(size, ranks, dtype)
    return (
        None
        if shape is None
        else (
            shape.count,
            shape.send_count,
            shape.recv_count,
            shape.bytes_per_rank,
            shape.total_bytes,
        )
    )


@pytest.mark.parametrize(
    ("text", "value"),
    [("1", 1), ("4K", 4096), ("4k", 4096), ("1M", 1 << 20), ("2G", 2 << 30), ("8KiB", 8192)],
)
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "K", "1.5", "-4", "4P", "1:2"])
def test_parse_size_rejects(text):
    with pytest.raises(UsageError):
        parse_size(text)


def test_message_size_range_is_osu_sweep():
    assert parse_message_sizes("1M") == (1, 1 << 20)
    assert parse_message_sizes("4:64") == (4, 64)
    assert message_sizes(4, 64) == [4, 8, 16, 32, 64]
    assert message_sizes(3, 20) == [3, 6, 12]
    with pytest.raises(UsageError, match="greater than MAX"):
        parse_message_sizes("64:4")
    with pytest.raises(UsageError, match="minimum"):
        parse_message_sizes("0:4")


def test_case_shapes_follow_osu_and_nccl_tests():
    # allgather: size is what each rank sends; nccl-tests' size is the gathered buffer
    assert case_shape("allgather", 4096, 4, "float32") == (1024, 1024, 4096, 4096, 16384)
    # reduce_scatter: size is the whole send buffer; each rank receives size / ranks
    assert case_shape("reduce_scatter", 4096, 4, "float32") == (1024, 1024, 256, 1024, 4096)
    assert case_shape("allreduce", 4096, 4, "float16") == (2048, 2048, 2048, 4096, 4096)
    assert case_shape("allreduce", 12, 4, "float32") == (3, 3, 3, 12, 12)  # fewer than ranks
    assert case_shape("allgather", 2, 4, "float32") is None  # below one element
    assert case_shape("reduce_scatter", 8, 4, "float32") is None
    with pytest.raises(UsageError, match="cannot be split over 3 ranks"):
        case_shape("reduce_scatter", 4096, 3, "float32")
    with pytest.raises(UsageError, match="whole number"):
        case_shape("allgather", 6, 2, "float32")


def entry_point_parsers() -> dict:
    """Every ccbench program's option parser."""
    from ccbench.benchmarks import (
        codec_throughput,
        merged_gradient,
        overhead,
        staging_bound,
        training,
    )
    from ccbench.benchmarks.options import build_parser
    from ccbench.scripts import corpus, profile_layers, simulate
    from ccbench.scripts.comparisons import compare, gate
    from ccbench.scripts.sweeps import sweep

    return {
        "variant": build_parser("ccbench baseline", "", ("allgather",), quiet=True),
        "merged_gradient": merged_gradient.build_parser(True),
        "overhead": overhead.build_parser(True),
        "staging_bound": staging_bound.build_parser(True),
        "codec_throughput": codec_throughput.build_parser(),
        "training": training.build_parser(True),
        "compare": compare.build_parser(),
        "gate": gate.build_parser(),
        "sweep": sweep.build_parser(),
        "simulate": simulate.build_parser(),
        "profile": profile_layers.build_parser(),
        "corpus": corpus.build_parser(),
    }


def test_a_letter_means_the_same_thing_in_every_program():
    """-m, -i, -x, -c, -d, -T (and --csv, --json, --seed) are declared once
    (benchmarks/options.py): wherever a program has one, it has the same long name, and its
    help opens with the same words."""
    opening = {
        "-m": "message sizes",
        "-i": "timed repetitions of each point",
        "-x": "untimed warm-up repetitions of each point",
        "-c": "validate:",
        "-d": "buffer backend",
        "-T": "element type",
        "--csv": "append ",
        "--json": "write this run's rows and environment",
        "--seed": "seed of ",
    }
    long_names = {
        "-m": "--message-size",
        "-i": "--iterations",
        "-x": "--warmup",
        "-c": "--validate",
        "-d": "--buffer",
        "-T": "--dtype",
    }
    seen = {}
    for program, parser in entry_point_parsers().items():
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in opening:
                    continue
                seen.setdefault(flag, []).append(program)
                assert (action.help or "").startswith(opening[flag]), (program, flag, action.help)
                if flag in long_names:
                    assert long_names[flag] in action.option_strings, (program, flag)
    # the letters that several programs share are indeed shared
    assert len(seen["-m"]) >= 4 and len(seen["-i"]) >= 4 and len(seen["--csv"]) >= 5


@pytest.mark.parametrize(
    ("variant", "codec", "canonical"),
    [
        ("baseline", "none", "none"),
        ("sparse_streaming", "none", "none"),
        ("torch", "none", "none"),
        ("coll_compressed", "fp16", "fp16"),
        ("p2p_compressed", "FP16", "fp16"),
        ("p2p_compressed", "bfp:rate=08", "bfp:rate=8"),
    ],
)
def test_a_gradient_variant_takes_the_codec_its_registry_entry_says(variant, codec, canonical):
    from ccbench.benchmarks.options import compression_of

    assert compression_of(codec, variant=variant).spec == canonical


@pytest.mark.parametrize(
    ("variant", "codec", "said"),
    [
        ("baseline", "fp16", "sends uncompressed data"),
        ("sparse_streaming", "bf16", "sends uncompressed data"),
        ("torch", "fp16", "sends uncompressed data"),
        ("coll_compressed", "none", "needs a codec"),
        ("p2p_compressed", "nosuch", "nosuch"),
    ],
)
def test_a_gradient_variant_refuses_a_codec_it_cannot_take(variant, codec, said):
    from ccbench.benchmarks.options import compression_of

    with pytest.raises(UsageError, match=said):
        compression_of(codec, variant=variant)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("4096", 4096),
        ("4K", 4096),
        ("4kib", 4096),
        ("1M", 1 << 20),
        ("64MB", 64 << 20),
        ("2GiB", 2 << 30),
        ("1.5K", 1536),
        ("0.5M", 512 << 10),
        (" 8 K ", 8192),
    ],
)
def test_every_size_option_reads_a_size_alike(text, expected):
    """-m, --fit-min, --chunk-bytes and MG-WFBP's thresholds share one reading of a size."""
    from ccbench.collectives.mgwfbp import parse_bytes
    from ccbench.kernels.units import parse_size

    assert parse_size(text) == expected
    assert parse_bytes(text) == expected
    assert parse_message_sizes(f"{text}:{text}") == (expected, expected)


@pytest.mark.parametrize("text", ["1Q", "K", "1.3", "-4K", "1.0000001K"])
def test_a_size_that_is_not_whole_bytes_is_refused(text):
    from ccbench.kernels.units import parse_size

    with pytest.raises(UsageError):
        parse_size(text)
