"""One compression setting: --codec and --chunk-bytes are declared once, in the options
layer (benchmarks/options.py, add_compression), and a run's codec is parsed there only.

Counted over the package's source (the AST, so comments and strings that merely mention
an option do not count): every ``add_argument("--codec", ...)`` and every call of
``parse_codec``.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOORS = ("kernels", "collectives", "training", "benchmarks", "plots", "scripts")
OPTIONS = "benchmarks/options.py"

# parse_codec outside the options layer, each for a reason that is not a run's setting:
READS_DATA = {
    # the registry's own docstring example is no call; the registry itself defines it
    "kernels/codecs.py": "the codec registry",
    # a measured row builds its own codec from the canonical spec the options parsed:
    # it pins the kernel path (fused / reference) on that codec object
    "benchmarks/codec_throughput.py": "each measured row's own codec object",
    # plots and advise read a codec string back from result rows: data, not a setting
    "plots/headlines.py": "the nominal ratio of a row's codec",
    "plots/style.py": "whether a row's codec is lossless",
    "scripts/advise/parts.py": "a codec's rows and nominal ratio, by the rows' name",
}


@functools.cache
def _sources() -> tuple:
    return tuple(
        (path.relative_to(ROOT).as_posix(), ast.parse(path.read_text()))
        for floor in FLOORS
        for path in sorted((ROOT / floor).rglob("*.py"))
    )


def _declarations(flag: str) -> list[str]:
    found = []
    for name, tree in _sources():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
                and any(isinstance(a, ast.Constant) and a.value == flag for a in node.args)
            ):
                found.append(name)
    return found


def _callers(function: str) -> set[str]:
    found = set()
    for name, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if called == function:
                    found.add(name)
    return found


def test_codec_and_chunk_bytes_are_declared_once_in_the_options_layer():
    assert _declarations("--codec") == [OPTIONS]
    assert _declarations("--chunk-bytes") == [OPTIONS]
    assert _declarations("--error-feedback") == [OPTIONS]


def test_parse_codec_is_called_in_the_options_layer_and_where_it_reads_data():
    callers = _callers("parse_codec")
    assert OPTIONS in callers
    assert callers - {OPTIONS} <= set(READS_DATA), sorted(callers - {OPTIONS} - set(READS_DATA))


def test_nothing_below_the_options_layer_parses_a_codec():
    """Training and the collectives take the parsed object (TrainConfig,
    GradientCommSpec, ReplaySpec carry a Compression)."""
    callers = _callers("parse_codec")
    assert not {c for c in callers if c.split("/")[0] in ("training", "collectives")}


def test_the_chunk_default_is_written_once():
    """DEFAULT_CHUNK_BYTES is applied in Compression.chunk only (collectives/chunking.py
    defines it, and auto falls back to it; the ring's own default is it)."""
    users = set()
    for name, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id == "DEFAULT_CHUNK_BYTES":
                users.add(name)
    assert users <= {
        "collectives/chunking.py",  # defines it, and auto falls back to it
        "collectives/compressed.py",  # the collective-level ring's own default
        "collectives/compression.py",  # Compression.chunk: the default applied
        OPTIONS,  # the help text shows it
    }, sorted(users)
