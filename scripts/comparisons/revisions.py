"""The code of a git revision, importable as ccbench beside the installed one: what
`ccbench compare --a-rev` and `ccbench gate` run their base from.

The revision is exported with `git archive`, its C extensions are built in place as its
install would build them, and its folders are linked under a `ccbench` package with the
mapping of folders to `ccbench.*` names that `pyproject.toml` declares (read there, not
repeated here).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from ccbench.kernels.errors import UsageError

REPO = Path(__file__).resolve().parents[2]


def rooms(source: Path = REPO) -> dict[str, str]:
    """`ccbench.<room>` -> its folder, as `source`'s pyproject.toml maps them."""
    try:
        config = tomllib.loads((source / "pyproject.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(
            f"{source / 'pyproject.toml'}: cannot read the package layout ({exc})"
        ) from None
    mapping = config.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    return {
        name.split(".", 1)[1]: folder
        for name, folder in mapping.items()
        if name.startswith("ccbench.")
    }


def materialize(rev: str, into: Path, repo: Path = REPO) -> Path:
    """The code of git revision `rev` of `repo` under `into`, importable as ccbench
    (put the returned folder on PYTHONPATH)."""
    source = into / "src"
    source.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", rev], capture_output=True
    )
    if archive.returncode != 0:
        raise UsageError(f"git revision {rev!r}: {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    build_extensions(source, rev)
    return link_rooms(source, into / "import")


def build_extensions(source: Path, rev: str) -> None:
    """Compile a revision's C extensions (the codecs' fused kernels) in place, as its
    install would: without them its codecs would run slower kernels than the installed
    tree's, and a comparison would measure that instead."""
    pyproject = source / "pyproject.toml"
    if not pyproject.exists() or "ext-modules" not in pyproject.read_text():
        return
    proc = subprocess.run(
        [sys.executable, "-c", "from setuptools import setup; setup()", "build_ext", "--inplace"],
        cwd=source,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    built = any(source.glob("*/*.so")) or any(source.glob("*/*.pyd"))
    if proc.returncode != 0 or not built:  # optional extensions fail with a warning only
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        print(
            f"ccbench: warning: revision {rev}: its C extensions did not build ({last}); "
            "its codecs run their array-API kernels",
            file=sys.stderr,
        )


# which host kernels a revision's codecs run, asked of its own code (kernels/codec_fused.py;
# a revision from before it has only the array-API kernels). An editable install's finder
# serves a module the revision lacks from the installed tree: a revision whose extension
# did not build would load the installed tree's compiled kernels, another revision's.
_KERNEL_PROBE = """
import os, sys
try:
    from ccbench.kernels import codec_fused
except ImportError:
    print("reference")
else:
    kernels = codec_fused.host_kernels()
    root = os.path.abspath(sys.argv[1]) + os.sep
    print("reference" if kernels is None else
          "fused" if os.path.abspath(kernels.__file__).startswith(root) else "borrowed")
"""
KERNEL_PATHS = ("fused", "reference", "borrowed")


def kernel_path(import_root: Path) -> str:
    """Which codec host kernels the code importable under `import_root` runs, as its
    benchmarks will (started with it on PYTHONPATH): 'fused' (its own compiled ones),
    'reference' (the array-API ones) or 'borrowed' (compiled ones from elsewhere)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(import_root), os.environ.get("PYTHONPATH")) if p
        ),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _KERNEL_PROBE, str(import_root)],
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    words = proc.stdout.split()
    if proc.returncode != 0 or len(words) != 1 or words[0] not in KERNEL_PATHS:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"cannot tell which codec kernels {import_root} runs ({last})")
    return words[0]


def link_rooms(source: Path, root: Path) -> Path:
    """A folder where `ccbench.<room>` is its folder of `source`: the layout an install
    maps (put the returned folder on PYTHONPATH)."""
    package = root / "ccbench"
    package.mkdir(parents=True)
    for room, folder in rooms(source).items():
        if (source / folder).is_dir():
            (package / room).symlink_to((source / folder).resolve())
    return root


def resolve_rev(rev: str | None, repo: Path = REPO) -> str:
    """The commit a revision names ('' for this installation), so that a checkpoint of
    `HEAD~1` is not resumed after HEAD moved."""
    if not rev:
        return ""
    proc = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise UsageError(f"git revision {rev!r} not found")
    return proc.stdout.strip()
