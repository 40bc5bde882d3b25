"""`ccbench gate`: fail when this tree makes a gated benchmark slower than the accepted
revision.

    ccbench gate                      # the working tree against the accepted revision
    ccbench gate --base HEAD~1        # ... against another revision
    ccbench gate --accept             # make HEAD the accepted revision (then commit it)
    ccbench gate --list               # what is gated

Every benchmark of the gate spec (sweeps/gate.toml: the baseline, each compressed variant
with a codec, sparse streaming, at a small and a large size) runs from the base revision
(A) and from the working tree, committed or not (B), in interleaved rounds on the same
bound ranks, as `ccbench compare` does: round k runs every benchmark, A then B or B then
A by turn, before round k + 1 starts, so a load that comes and goes is shared by both
sides and spread over every benchmark. A point fails when B/A is at least the spec's
threshold (1.3) and its 95% interval lies above 1: slower beyond doubt, and by a lot. A
point past the threshold is first measured again: its benchmark takes as many rounds
more, and it fails only if it stays past the threshold over all of them.

The base is the accepted revision, recorded in the repository (results/reference/
gate-base), so a clean clone of main is timed against the code the gate last accepted,
never against itself. It moves only on purpose: `ccbench gate --accept [REV]` writes REV
(default HEAD) there, to be committed. Without the file the merge base of HEAD and its
upstream is used, and the gate says so. An interrupted gate keeps its finished rounds
(the same command resumes them).

Exit status: 0 all pass, 1 a point failed, 2 bad input (not a git checkout, bad spec, an
accepted revision this clone lacks), 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from ccbench.benchmarks.options import add_no_bind, add_rounds
from ccbench.benchmarks.progress import progress_bar
from ccbench.benchmarks.results import append_rows, check_header
from ccbench.kernels.errors import UsageError
from ccbench.scripts.comparisons import checkpoint
from ccbench.scripts.comparisons.revisions import REPO, kernel_path, link_rooms, materialize
from ccbench.scripts.comparisons.rounds import (
    COLUMNS,
    STATISTICS,
    Comparison,
    Side,
    parse_side,
    result_rows,
    run_meta,
    run_rounds,
)
from ccbench.scripts.launchers import Launcher, binding_enabled, refuse_inside_mpi_launch

DEFAULT_SPEC = REPO / "sweeps" / "gate.toml"
ACCEPTED = Path("results") / "reference" / "gate-base"  # under the gated checkout


@dataclass(frozen=True)
class Gated:
    name: str
    command: list[str]
    sizes: str
    options: list[str]


@dataclass(frozen=True)
class GateSpec:
    ranks: int
    rounds: int
    threshold: float
    margin: float
    statistic: str
    benchmarks: list[Gated]


def load_spec(path: Path) -> GateSpec:
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML ({exc})") from None
    gate = data.get("gate", {})
    benchmarks = []
    for i, entry in enumerate(data.get("benchmark", [])):
        if "command" not in entry or "sizes" not in entry:
            raise UsageError(f"{path}: [[benchmark]] {i + 1} needs command and sizes")
        command = parse_side(entry.get("name", f"benchmark {i + 1}"), entry["command"])
        benchmarks.append(
            Gated(
                entry.get("name", " ".join(command)),
                command,
                str(entry["sizes"]),
                [str(o) for o in entry.get("options", [])],
            )
        )
    if not benchmarks:
        raise UsageError(f"{path}: no [[benchmark]] to gate")
    spec = GateSpec(
        int(gate.get("ranks", 2)),
        int(gate.get("rounds", 5)),
        float(gate.get("threshold", 1.3)),
        float(gate.get("margin", 0.03)),
        str(gate.get("statistic", "p50")),
        benchmarks,
    )
    if spec.rounds < 2 or spec.ranks < 1 or spec.threshold <= 1:
        raise UsageError(f"{path}: needs rounds >= 2, ranks >= 1 and threshold > 1")
    if spec.statistic not in STATISTICS:
        raise UsageError(f"{path}: statistic must be one of {', '.join(STATISTICS)}")
    return spec


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UsageError(f"git {' '.join(args)}: {proc.stderr.strip() or 'failed'}")
    return proc.stdout.strip()


def merge_base(repo: Path) -> str:
    """The merge base of HEAD and its upstream (else origin/main, else main)."""
    for upstream in ("@{upstream}", "origin/main", "main"):
        ok = (
            subprocess.run(
                ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", upstream],
                capture_output=True,
            ).returncode
            == 0
        )
        if ok:
            return git(repo, "merge-base", "HEAD", upstream)
    return git(repo, "rev-parse", "HEAD")


def read_accepted(repo: Path) -> str | None:
    """The accepted revision recorded in `repo`, or None when none is recorded."""
    path = repo / ACCEPTED
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None
    words = [line.split()[0] for line in lines if line.strip() and not line.startswith("#")]
    if len(words) != 1 or not re.fullmatch(r"[0-9a-f]{40}", words[0]):
        raise UsageError(
            f"{ACCEPTED} must hold one full commit hash (write it with ccbench gate --accept)"
        )
    return words[0]


def write_accepted(repo: Path, rev: str) -> str:
    sha = git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}")
    subject = git(repo, "log", "-1", "--format=%s", sha)
    path = repo / ACCEPTED
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "# The revision `ccbench gate` times the working tree against; move it on "
        "purpose\n# with `ccbench gate --accept [REV]` and commit this file.\n"
        f"{sha}  {subject}\n"
    )
    return sha


def choose_base(repo: Path, asked: str | None) -> tuple[str, str]:
    """(revision, why it is the base): --base, else the accepted revision, else the merge
    base with the upstream."""
    if asked:
        return asked, "--base"
    accepted = read_accepted(repo)
    if accepted is None:
        return merge_base(repo), (
            f"merge base with the upstream: no accepted revision in "
            f"{ACCEPTED} (ccbench gate --accept)"
        )
    known = (
        subprocess.run(
            ["git", "-C", str(repo), "cat-file", "-e", f"{accepted}^{{commit}}"],
            capture_output=True,
        ).returncode
        == 0
    )
    if not known:
        raise UsageError(
            f"the accepted revision {accepted[:12]} ({ACCEPTED}) is not in this "
            "clone; fetch the full history (git fetch --unshallow) or accept "
            "another revision"
        )
    return accepted, f"the accepted revision ({ACCEPTED})"


def failed(row: dict, threshold: float) -> bool:
    low = row.get("ratio_low")
    return (
        row.get("ratio") is not None and row["ratio"] >= threshold and low is not None and low > 1
    )


def check_kernels(base: str, tree: str) -> None:
    """Print which codec kernels each side runs (scripts/revisions.kernel_path); refuse a
    base that does not run its own compiled kernels while the tree runs its own: every
    codec's B/A would then measure the kernels, and a slowdown could hide under it."""
    print(f"# codec kernels: base {base}, tree {tree}", flush=True)
    if base != "fused" and tree == "fused":
        runs = (
            "its array-API kernels"
            if base == "reference"
            else "compiled kernels of another tree (the installed one's)"
        )
        raise UsageError(
            f"the base revision's codecs run {runs}: its C extensions did not "
            "build, and the tree's run their own; the gate would time the "
            "kernels, not the change (a C compiler and setuptools build them)"
        )
    if base != tree:
        print(
            f"# warning: the tree runs the {tree} codec kernels, the base its own "
            "compiled ones: codecs' ratios measure that too (pip install -e . builds "
            "the tree's)",
            flush=True,
        )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ccbench gate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--base",
        metavar="REV",
        help=f"revision to compare with (default: the accepted revision in {ACCEPTED})",
    )
    p.add_argument(
        "--accept",
        nargs="?",
        const="HEAD",
        metavar="REV",
        help=f"record REV (default HEAD) as the accepted revision in {ACCEPTED}, "
        "then exit; commit that file",
    )
    p.add_argument(
        "--spec",
        type=Path,
        default=DEFAULT_SPEC,
        help="gated benchmarks (default sweeps/gate.toml)",
    )
    p.add_argument(
        "--repo",
        type=Path,
        default=REPO,
        help="the checkout whose working tree is gated (default: this one)",
    )
    add_rounds(p, None)
    p.add_argument("--only", metavar="TEXT", help="gate only benchmarks whose name has TEXT")
    p.add_argument("--list", action="store_true", help="print what is gated and exit")
    add_no_bind(p)
    p.add_argument("--csv", metavar="PATH", help="append every point's ratio to this CSV")
    return p


def main(argv: list[str]) -> int:
    refuse_inside_mpi_launch("ccbench gate")
    opts = build_parser().parse_args(argv)
    repo = opts.repo.resolve()
    if opts.accept:
        sha = write_accepted(repo, opts.accept)
        print(
            f"ccbench gate: {sha[:12]} is now the accepted revision ({ACCEPTED}); "
            "commit that file to keep it"
        )
        return 0
    spec = load_spec(opts.spec)
    benchmarks = [b for b in spec.benchmarks if not opts.only or opts.only in b.name]
    if not benchmarks:
        raise UsageError(f"--only {opts.only!r} matches no gated benchmark")
    rounds = opts.rounds or spec.rounds
    if rounds < 2:
        raise UsageError("--rounds must be at least 2")
    if opts.list:
        for b in benchmarks:
            print(f"{b.name:<40} {' '.join(b.command)} -m {b.sizes} {' '.join(b.options)}")
        return 0
    if opts.csv:
        check_header(opts.csv, COLUMNS)
    base, why = choose_base(repo, opts.base)
    base_sha = git(repo, "rev-parse", "--short=12", base)
    base_full = git(repo, "rev-parse", base)
    dirty = bool(git(repo, "status", "--porcelain", "--untracked-files=no"))
    head = git(repo, "rev-parse", "--short=12", "HEAD")
    tree = f"working tree ({head}{', uncommitted changes' if dirty else ''})"
    launcher = Launcher(spec.ranks, bind=binding_enabled(False if opts.no_bind else None))
    meta = run_meta()
    print(f"# ccbench gate: {tree} against {base_sha}, {why}", flush=True)
    print(
        f"# threshold: a point fails at B/A >= {spec.threshold:g} with its 95% interval "
        f"above 1; {rounds} rounds on {spec.ranks} "
        f"{'bound' if launcher.bind else 'unbound'} ranks; statistic {spec.statistic}; "
        f"{len(benchmarks)} benchmarks; load {meta['load_start']}",
        flush=True,
    )
    if git(repo, "rev-parse", "HEAD") == base_full and not dirty:
        print(
            "# note: the tree is the base revision itself: nothing here can be slower", flush=True
        )
    started = time.monotonic()
    identity = {
        "base": base_full,
        "head": git(repo, "rev-parse", "HEAD"),
        "edits": checkpoint.working_tree_digest(repo),
        "ranks": spec.ranks,
        "bind": launcher.bind,
        "statistic": spec.statistic,
        "margin": spec.margin,
        "benchmarks": [[b.command, b.sizes, b.options] for b in benchmarks],
    }
    saved_at = checkpoint.checkpoint_path("gate", identity)
    saved = checkpoint.load(saved_at, identity)
    with tempfile.TemporaryDirectory(prefix="ccbench-gate-") as tmp:
        base_root = materialize(base, Path(tmp) / "base", repo)
        tree_root = link_rooms(repo, Path(tmp) / "tree" / "import")
        check_kernels(kernel_path(base_root), kernel_path(tree_root))
        jobs = []
        for b in benchmarks:
            a = Side("A", b.command, base_sha, base_root)
            t = Side("B", b.command, "working-tree", tree_root)
            jobs.append(
                (Comparison(a, t, spec.statistic, spec.margin), [*b.options, "-m", b.sizes])
            )
        done = 0
        if saved is not None:
            for (comparison, _), state in zip(jobs, saved, strict=True):
                comparison.restore(state)
            done = min(c.rounds_done() for c, _ in jobs)
            print(f"# resuming: {done} round(s) already measured ({saved_at})", flush=True)

        def keep(k: int) -> None:
            checkpoint.save(saved_at, identity, [c.state() for c, _ in jobs])

        try:
            with progress_bar(
                2 * rounds * len(jobs), "gate", unit="launch", initial=2 * done * len(jobs)
            ) as bar:
                run_rounds(jobs, launcher, rounds, Path(tmp), bar, first=done, after_round=keep)
            # A point past the threshold is measured again before it fails the gate: its
            # benchmark takes as many rounds more, and the verdict is over all of them. A
            # real slowdown holds (and its interval narrows); a spell of the host that hit
            # a few microseconds of one side in a few rounds is diluted.
            suspects = [
                job
                for job in jobs
                if any(failed(row, spec.threshold) for row in result_rows(job[0], rounds, meta))
            ]
            if suspects:
                print(
                    f"# {len(suspects)} benchmark(s) past the threshold after {rounds} "
                    f"rounds: {rounds} more rounds of them; a point fails only if it stays "
                    f"past it over all {2 * rounds}",
                    flush=True,
                )
                first = min(c.rounds_done() for c, _ in suspects)
                with progress_bar(
                    2 * (2 * rounds - first) * len(suspects), "gate again", unit="launch"
                ) as bar:
                    run_rounds(
                        suspects,
                        launcher,
                        2 * rounds,
                        Path(tmp),
                        bar,
                        first=first,
                        after_round=keep,
                    )
        except KeyboardInterrupt:
            finished = min(c.rounds_done() for c, _ in jobs)
            kept = (
                f"; the {finished} finished kept: run the same command to resume"
                if finished
                else ""
            )
            print(
                f"\nccbench gate: interrupted after {finished} of {rounds} rounds{kept}",
                file=sys.stderr,
                flush=True,
            )
            return 130
    meta["load_end"] = round(os.getloadavg()[0], 2)
    failures, rows = 0, []
    print(
        f"{'# benchmark':<40}{'size':>10}{'base us':>12}{'tree us':>12}{'ratio':>8}"
        f"{'CI95':>16}  verdict"
    )
    for (comparison, _), b in zip(jobs, benchmarks, strict=True):
        for row in result_rows(comparison, comparison.rounds_done(), meta):
            bad = failed(row, spec.threshold)
            failures += bad
            rows.append(row)
            interval = (
                f"{row['ratio_low']:.2f}-{row['ratio_high']:.2f}"
                if row["ratio_low"] is not None
                else "-"
            )
            ratio = f"{row['ratio']:.3f}" if row["ratio"] is not None else "-"
            a_us = f"{row['a_us']:.1f}" if row["a_us"] is not None else "-"
            b_us = f"{row['b_us']:.1f}" if row["b_us"] is not None else "-"
            point = f"  ({row['config']})" if row.get("config") else ""
            print(
                f"{b.name:<40}{row['size_bytes']:>10}{a_us:>12}{b_us:>12}{ratio:>8}"
                f"{interval:>16}  {'FAIL: ' if bad else ''}{row['verdict']}{point}",
                flush=True,
            )
    if opts.csv:
        append_rows(opts.csv, rows, COLUMNS)
    checkpoint.clear(saved_at)
    print(
        f"# gate: {len(rows)} points, {failures} failed, {time.monotonic() - started:.0f} s, "
        f"load {meta['load_start']} -> {meta['load_end']}",
        flush=True,
    )
    return 1 if failures else 0


if __name__ == "__main__":  # errors as one line, as `ccbench gate` gives
    from ccbench.scripts.cli import main as ccbench

    raise SystemExit(ccbench(["gate", *sys.argv[1:]]))
