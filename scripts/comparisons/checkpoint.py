"""Finished rounds kept across an interruption, so `ccbench compare` and `ccbench gate`
resume where they stopped, as a sweep does.

After every round the tool writes what it has measured to a checkpoint named by a hash
of everything that decides the measurement (the sides, their revisions' commits, the
working tree's content, the options, ranks and launcher). Run the same command again
and it starts at the next round; change anything that matters and the checkpoint no
longer matches (it is left alone, and a new one is started). A finished run deletes its
checkpoint. Checkpoints live in `$CCBENCH_STATE`, else `results/.checkpoints` under the
current directory.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ccbench.benchmarks.results import read_json_document, write_json_atomic
from ccbench.benchmarks.switches import read as read_switches
from ccbench.kernels.errors import UsageError

DEFAULT_STATE = Path("results") / ".checkpoints"
FORMAT = 1


def state_dir() -> Path:
    return Path(read_switches().state or DEFAULT_STATE)


def checkpoint_path(tool: str, identity: dict) -> Path:
    """Where the checkpoint of this exact measurement lives."""
    text = json.dumps(identity, sort_keys=True, default=str)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return state_dir() / f"{tool}-{digest}.json"


def load(path: Path, identity: dict) -> dict | None:
    """The saved state, or None when there is none. A checkpoint that cannot be read, or
    that was written for another measurement, is an error naming the file."""
    saved = read_json_document(path, f"checkpoint {path}", "delete it to start again")
    if saved is None:
        return None
    if saved.get("format") != FORMAT:
        raise UsageError(f"checkpoint {path} has an unknown format; delete it to start again")
    if saved.get("identity") != json.loads(json.dumps(identity, default=str)):
        raise UsageError(
            f"checkpoint {path} belongs to another measurement; delete it to start again"
        )
    return saved.get("state")


def save(path: Path, identity: dict, state: dict) -> None:
    write_json_atomic(path, {"format": FORMAT, "identity": identity, "state": state})


def clear(path: Path) -> None:
    path.unlink(missing_ok=True)


def working_tree_digest(repo: Path) -> str:
    """A hash of the checkout's uncommitted changes to tracked files ('' when clean)."""
    import subprocess

    proc = subprocess.run(["git", "-C", str(repo), "diff", "HEAD", "--binary"], capture_output=True)
    if proc.returncode != 0 or not proc.stdout:
        return ""
    return hashlib.sha256(proc.stdout).hexdigest()[:16]
