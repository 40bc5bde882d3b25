"""The documentation stays true: its commands run as shown, its links resolve.

Convention (docs/architecture.md, design decisions):

- A ```sh (or bash, shell) block is run: each command (backslash continuations joined,
  comment lines dropped) must exit 0. Other fences (text, console, toml, python, none)
  are shown only.
- `<!-- doc-test: skip (REASON) -->` on a line before a fence: not run, for REASON (root,
  a SLURM cluster, a long job, an install). `<!-- doc-test: run-by PATH -->`: a script
  runs these commands instead (CI's scripts/test.sh), so each must appear in PATH as is.
- Run blocks hold simple commands only (no pipes, redirections or variables), which run
  without a shell; `VAR=value` in front sets the environment.
- Commands run as a user would paste them, from the root of a scratch copy of the
  working tree, with this installation's `ccbench` importing the copy. Only what would
  take minutes is shrunk: message sizes above 256 KiB are cut to 256K, and each tool
  gets the few options of `TINY` appended (argparse keeps the last value given; for
  `ccbench compare`, before its `--`).
- Afterwards `git status` of the copy must be clean: no tracked file changed, no file
  outside the git-ignored `results/` written.
- Pages run in order (README first, then docs/ by name) in one copy, so later pages find
  what earlier ones built (the corpus of `ccbench corpus`).

Also checked everywhere: no `sudo` (root users often have none) or macOS-only `open`;
output options (`--csv`, `-o`, ...) write under `results/`; Python blocks import modules
that exist; links and backticked file names resolve.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.repo import git

REPO = Path(__file__).resolve().parent.parent
PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))]
ROOMS = ("kernels", "collectives", "training", "benchmarks", "plots", "scripts")
RUN_LANGS = {"sh", "bash", "shell"}
COMMAND_LANGS = RUN_LANGS | {"", "console", "text"}  # blocks that may show commands

TINY_BYTES = 256 * 1024
HARNESS_VARIANTS = ("baseline", "p2p_compressed", "coll_compressed", "sparse_streaming", "overhead")
TINY = {
    **{v: ["-i", "2", "-x", "1"] for v in HARNESS_VARIANTS},
    "codec_throughput": ["-i", "2"],
    "merged_gradient": ["-i", "1", "-x", "0", "--fit-seconds", "0.01"],
    "training": ["--steps", "4", "--warmup", "0"],
    "profile": ["--width", "0.05", "--batch", "2", "--warmup", "0", "--iterations", "1"],
    "corpus": ["--lm-model", "lm-tiny", "--steps", "2", "--ranks", "2", "--digits-model", "none"],
    "compare": ["--rounds", "2"],  # before its `--`: what follows goes to both sides
}
TINY_MGWFBP = ["--profile-iterations", "1", "--fit-seconds", "0.01"]  # training's mgwfbp
TINY_TRACE = {
    "capture": ["--steps", "4", "--warmup", "1"],  # ccbench trace ACTION
    "replay": ["--steps", "2", "--warmup", "0", "--fit-seconds", "0.01"],
}
OUTPUT_OPTIONS = (
    "--csv",
    "--json",
    "--fit-csv",
    "-o",
    "--outdir",
    "--out",
    "--out-dir",
    "--output-dir",
    "--merged",
)
COMMAND_TIMEOUT = 300  # a hang guard per command

FENCE = re.compile(r"^ {0,3}(`{3,})\s*([\w+-]*)\s*$")
MARKER = re.compile(r"^<!--\s*doc-test:\s*(.*?)\s*-->$")
SHELL_SYNTAX = re.compile(r"[|;&<>$`]")


@dataclass
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    body: list[str]
    marker: str | None = None

    def where(self, offset: int = 0) -> str:
        return f"{self.page}:{self.line + 1 + offset}"


def read_blocks(root: Path, page: str) -> list[Block]:
    lines = (root / page).read_text().splitlines()
    blocks, pending, i = [], None, 0
    while i < len(lines):
        marker, fence = MARKER.match(lines[i].strip()), FENCE.match(lines[i])
        if marker:
            pending = (marker.group(1), i + 1)
        elif fence:
            end = i + 1
            while end < len(lines) and lines[end].strip() != fence.group(1):
                end += 1
            block = Block(page, i + 1, fence.group(2).lower(), lines[i + 1 : end])
            if pending:
                block.marker = pending[0]
            blocks.append(block)
            pending, i = None, end
        elif lines[i].strip() and pending:
            raise AssertionError(
                f"{page}:{pending[1]}: a doc-test marker must come right before a fenced block"
            )
        i += 1
    return blocks


def commands(block: Block) -> list[tuple[str, str]]:
    """(where, command) for each command of a block: continuations joined, comments out."""
    out, text, start = [], "", None
    for n, raw in enumerate(block.body):
        line = raw.rstrip()
        if not text and (not line.strip() or line.lstrip().startswith("#")):
            continue
        start = n if start is None else start
        if line.endswith("\\"):
            text += line[:-1] + " "
            continue
        out.append((block.where(start), (text + line).strip()))
        text, start = "", None
    return out


def parse_size(text: str) -> int | None:
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip(), re.IGNORECASE)
    if not m:
        return None
    return int(m.group(1)) * 1024 ** " KMG".index((m.group(2) or " ").upper())


def cap_sizes(text: str) -> str:
    """`-m [MIN:]MAX` (or a list A,B,...) with sizes above TINY_BYTES cut to it."""

    def cap(part: str) -> str:
        size = parse_size(part)
        return part if size is None or size <= TINY_BYTES else f"{TINY_BYTES // 1024}K"

    if "," in text:
        return ",".join(dict.fromkeys(cap(p) for p in text.split(",")))
    low, colon, high = text.rpartition(":")
    return f"{cap(low)}{colon}{cap(high)}" if low else cap(high)


def tiny(argv: list[str]) -> list[str]:
    """The command as the test runs it: sizes capped, the tool's TINY options appended."""
    if "ccbench" not in argv[:-1]:
        return argv
    at = argv.index("ccbench")
    tool = argv[at + 1]
    out = list(argv)
    for i in range(at + 2, len(out) - 1):
        if out[i] in ("-m", "--message-size"):
            out[i + 1] = cap_sizes(out[i + 1])
    extra = list(TINY.get(tool, []))
    if tool == "training" and "mgwfbp" in argv:
        extra += TINY_MGWFBP
    if tool in ("trace", "trace_replay"):
        action = "replay" if tool == "trace_replay" else (argv[at + 2 :] or [""])[0]
        extra = list(TINY_TRACE.get(action, []))
    end = out.index("--", at) if tool == "compare" and "--" in out[at:] else len(out)
    return out[:end] + extra + out[end:]


def split(command: str) -> tuple[dict, list[str]]:
    """(environment, argv) of a simple command; AssertionError for shell syntax."""
    words = shlex.split(command, comments=True)
    assert words, command
    for word in words:
        assert not SHELL_SYNTAX.search(word), (
            f"`{command}`: not a simple command ({word!r}); mark the block "
            "<!-- doc-test: skip (REASON) --> or show it as text"
        )
    env = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return env, words


def tokens_after(words: list[str], options) -> list[str]:
    values = []
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if word in options and i + 1 < len(words):
            values.append(words[i + 1])
        elif eq and name in options and name.startswith("--"):
            values.append(value)
    return values


def placeholder(value: str) -> bool:
    return bool(re.search(r"[<\[$]", value)) or bool(re.fullmatch(r"[A-Z][A-Z_]*", value))


# ----------------------------------------------------------------------------- static checks


@pytest.mark.parametrize("page", PAGES)
def test_markers_commands_and_outputs(page):
    problems = []
    for block in read_blocks(REPO, page):
        if block.marker is not None:
            skip = re.fullmatch(r"skip \((.+)\)", block.marker)
            run_by = re.fullmatch(r"run-by (\S+)", block.marker)
            if run_by:
                script = REPO / run_by.group(1)
                text = " ".join(script.read_text().split()) if script.is_file() else ""
                problems += [
                    f"{where}: `{cmd}` is not in {run_by.group(1)}"
                    for where, cmd in commands(block)
                    if " ".join(shlex.split(cmd, comments=True)) not in text
                ]
            elif not skip:
                problems.append(
                    f"{block.where(-1)}: unknown marker {block.marker!r}; use "
                    "skip (REASON) or run-by PATH"
                )
        if block.lang in RUN_LANGS and block.marker is None:
            for where, cmd in commands(block):
                try:
                    split(cmd)
                except AssertionError as e:
                    problems.append(f"{where}: {e}")
        if block.lang not in COMMAND_LANGS:
            continue
        for where, cmd in commands(block):
            words = cmd.lstrip("$ ").split()
            if words[0] == "sudo":
                problems.append(f"{where}: `sudo` fails where root has no sudo; say 'as root'")
            if words[0] == "open":
                problems.append(f"{where}: `open` is macOS only; name the file to open")
            if "ccbench" in words or any(w.startswith("scripts/") for w in words):
                for value in tokens_after(words, OUTPUT_OPTIONS):
                    if not (value.startswith("results/") or placeholder(value)):
                        problems.append(
                            f"{where}: output {value!r} is not under results/ (git-ignored)"
                        )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES)
def test_python_blocks_compile_and_import_what_exists(page):
    problems = []
    for block in read_blocks(REPO, page):
        if block.lang != "python":
            continue
        try:
            tree = ast.parse("\n".join(block.body))
        except SyntaxError as e:
            problems.append(f"{block.where((e.lineno or 1) - 1)}: {e.msg}")
            continue
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module
                else []
            )
            for name in names:
                if importlib.util.find_spec(name.split(".")[0]) is None or (
                    importlib.util.find_spec(name) is None
                ):
                    problems.append(f"{block.where(node.lineno - 1)}: no module {name}")
    assert not problems, "\n".join(problems)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", text, re.M)}


TRACKED_TOP = (
    "kernels",
    "collectives",
    "training",
    "benchmarks",
    "plots",
    "scripts",
    "sweeps",
    "tests",
    "docs",
)


@pytest.mark.parametrize("page", PAGES)
def test_links_and_file_names_resolve(page):
    path = REPO / page
    text = path.read_text()
    problems = []
    for m in re.finditer(r"\[[^\]]*\]\(([^)\s]+)\)", text):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file) if file else path
        line = text.count("\n", 0, m.start()) + 1
        if not dest.exists():
            problems.append(f"{page}:{line}: link to {file}, which does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{page}:{line}: no heading #{anchor} in {file or page}")
    for m in re.finditer(r"`([^`\s]+)`", text):
        name = m.group(1).split(":")[0].rstrip(".,")
        if placeholder(name) or "*" in name or "{" in name:
            continue
        first = name.split("/")[0]
        if not (name.endswith(".md") or ("/" in name and first in TRACKED_TOP)):
            continue
        if not ((REPO / name).exists() or (path.parent / name).exists()):
            line = text.count("\n", 0, m.start()) + 1
            problems.append(f"{page}:{line}: `{name}` names no file of the project")
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------- running them


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A copy of the working tree (tracked and new files, not ignored ones), committed in
    a repository of its own, and an environment whose `ccbench` imports that copy."""
    console = Path(sys.executable).parent / "ccbench"
    if shutil.which("git") is None or not console.exists():
        pytest.skip("needs git and the installed `ccbench` console script")
    listing = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "-co", "--exclude-standard"],
        capture_output=True,
        timeout=120,
    )
    if listing.returncode != 0:
        pytest.skip("not a git checkout")
    base = tmp_path_factory.mktemp("docs")
    root = base / "tree"
    for name in filter(None, listing.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file() or source.is_symlink():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name, follow_symlinks=False)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(
        root,
        "-c",
        "user.name=doc-test",
        "-c",
        "user.email=doc-test@localhost",
        "commit",
        "-q",
        "-m",
        "the working tree",
    )
    package = base / "import" / "ccbench"  # `ccbench.<room>` is the copy's folder
    package.mkdir(parents=True)
    for room in ROOMS:
        (package / room).symlink_to(root / room)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("CCBENCH_") and k != "PYTHONPATH"
    }
    env.update(
        PATH=os.pathsep.join([str(console.parent), env.get("PATH", "")]),
        PYTHONPATH=str(package.parent),
        OMP_NUM_THREADS="1",
        MPLBACKEND="Agg",
    )
    return root, env


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("page", PAGES)
def test_commands_run_as_shown(page, scratch):
    root, env = scratch
    for block in read_blocks(root, page):
        if block.lang not in RUN_LANGS or block.marker is not None:
            continue
        for where, cmd in commands(block):
            extra, argv = split(cmd)
            argv = tiny(argv)
            proc = subprocess.run(
                argv,
                cwd=root,
                env={**env, **extra},
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT,
                stdin=subprocess.DEVNULL,
            )
            assert proc.returncode == 0, (
                f"{where}: `{cmd}` exited {proc.returncode} (run as: {shlex.join(argv)})\n"
                f"{(proc.stdout + proc.stderr)[-3000:]}"
            )
    changed = git(root, "status", "--porcelain", "--untracked-files=all").splitlines()
    assert not changed, f"{page}'s commands changed the tree:\n" + "\n".join(changed)


@pytest.mark.timeout(180)
def test_the_readmes_sample_output_is_the_tools_current_output():
    """The README's `Running a benchmark` sample, its command run again: every comment
    line as printed (the MPI library's own version words aside), the column header to the
    character, and the sample's data rows in the tool's format (OSU's widths)."""
    import re

    from tests.mpirun import mpirun

    text = (REPO / "README.md").read_text()
    block = text.split("## Running a benchmark", 1)[1].split("```", 2)[1]
    lines = [line for line in block.splitlines() if line.strip()]
    command = lines[0]
    assert command.startswith("$ mpiexec -bind-to core -n 2 ccbench baseline ")
    args = command.split("ccbench baseline ", 1)[1].split()
    sample = lines[1:]
    proc = mpirun(2, ["-m", "ccbench.benchmarks.baseline", *args, "-i", "5", "-x", "1"])
    assert proc.returncode == 0, proc.stderr
    printed = proc.stdout.splitlines()
    comments = [line for line in printed if line.startswith("#")]
    library = re.compile(r"^# .*?; 2 ranks; buffer numpy; timing per-call$")
    expected = [line for line in sample if line.startswith("#")]
    assert len(comments) == len(expected), (comments, expected)
    for got, want in zip(comments, expected, strict=True):
        if library.match(want):
            assert library.match(got), got
        else:
            assert got == want
    rows = [line for line in sample if not line.startswith("#") and line != "..."]
    pattern = re.compile(r"^\d+ {2,}(\s*-?\d+\.\d\d){3}\s+\d+\s+Pass(\s+-?\d+\.\d+)+$")
    assert rows and all(pattern.match(row) for row in rows), rows
    ours = [line for line in printed if not line.startswith("#")]
    assert all(pattern.match(row) for row in ours), ours
    # the same widths: each sample row is as long as the tool's row of its size
    for row in rows:
        size = row.split()[0]
        (mine,) = [line for line in ours if line.split()[0] == size]
        assert len(mine) == len(row), (mine, row)
