"""Sweep specs, resume after a kill, merge (de-duplication, refusing mixed schemas), and the
SLURM submit plan; one real sweep of a few tiny tasks on 2 local ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ccbench.benchmarks.results import (
    COMMON_COLUMNS,
    MGWFBP_COLUMNS,
    read_rows,
    write_csv_atomic,
)
from ccbench.kernels.errors import UsageError
from ccbench.scripts.sweeps import merge, slurm, sweep
from ccbench.scripts.sweeps import tasks as sweep_spec

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too

REPO = Path(__file__).resolve().parent.parent


def write_spec(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


SPEC = """
[sweep]
name = "t"
output = "{out}"
ranks = [2]
sizes = "1K:8K"
iterations = 3
warmup = 1
options = ["-c"]

[[points]]
variant = "baseline"
collective = ["allgather", "allreduce"]
algorithm = ["mpi", "ring"]
dtype = "float32"
"""


# ----------------------------------------------------------------------------- the spec


def test_spec_expands_lists_into_tasks_and_scalars_into_options(tmp_path):
    spec = sweep_spec.load_spec(
        write_spec(
            tmp_path / "s.toml",
            """
[sweep]
output = "out"
ranks = [2, 4]
sizes = "4K:64K"
iterations = 7
options = ["-f"]

[[points]]
variant = "baseline"
collective = ["allgather", "reduce_scatter"]
algorithm = "ring"
validate = true
full = false

[[points]]
variant = "baseline"
collective = ["allreduce"]
ranks = [3]
link_gbps = [1, 2.5]
options = ["-c"]
""",
        )
    )
    assert len(spec.tasks) == 2 * 2 + 2
    first = spec.tasks[0]
    assert first.slug == "baseline_allgather_r2"
    assert first.args == (
        "-m",
        "4K:64K",
        "-i",
        "7",
        "--algorithm",
        "ring",
        "--validate",
        "--collective",
        "allgather",
        "-f",
    )
    assert first.sizes == (4096, 8192, 16384, 32768, 65536)
    assert [t.ranks for t in spec.tasks[:4]] == [2, 2, 4, 4]
    last = spec.tasks[-1]
    assert (last.ranks, last.link_gbps, last.slug) == (3, 2.5, "baseline_allreduce_r3_2.5gbps")
    assert last.args[-2:] == ("-f", "-c")
    assert spec.merged == Path("out.csv")
    assert [t.index for t in spec.tasks] == list(range(6))


def test_same_axes_with_other_options_get_distinct_files(tmp_path):
    spec = sweep_spec.load_spec(
        write_spec(
            tmp_path / "s.toml",
            """
[[points]]
variant = "baseline"
collective = ["allgather"]
dtype = "float32"
[[points]]
variant = "baseline"
collective = ["allgather"]
dtype = "float64"
""",
        )
    )
    assert [t.slug for t in spec.tasks] == [
        "baseline_allgather_r2_float32",
        "baseline_allgather_r2_float64",
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        ("[[points]]\nvariant = 'nosuch'\n", "no variant script"),
        ("[[points]]\ncollective = ['allgather']\n", "needs variant"),
        ("[sweep]\nrank = [2]\n[[points]]\nvariant = 'baseline'\n", "unknown keys rank"),
        ("[sweep]\nname = 'x'\n", "no [[points]]"),
        ("[[points]\nvariant = 1", "not valid TOML"),
        ("[[points]]\nvariant = 'baseline'\nsizes = '8K:1K'\n", "greater than MAX"),
        ("[[points]]\nvariant = 'baseline'\ncodec = []\n", "empty list"),
    ],
)
def test_bad_specs_are_one_line_errors(tmp_path, text, message):
    with pytest.raises(UsageError, match=message.replace("[", r"\[")):
        sweep_spec.load_spec(write_spec(tmp_path / "s.toml", text))


def test_variants_without_sizes_get_no_size_options(tmp_path):
    spec = sweep_spec.load_spec(
        write_spec(
            tmp_path / "s.toml",
            """
[sweep]
sizes = "1K:4K"
iterations = 5
[[points]]
variant = "merged_gradient"
model = "resnet50"
strategy = "wfbp,mgwfbp"
iterations = 3
[[points]]
variant = "baseline"
sizes = false
[[points]]
variant = "training"
"--variant" = ["baseline", "coll_compressed"]   # the script's own --variant option
steps = 20
""",
        )
    )
    mg, base, train_base, train_coll = spec.tasks
    assert mg.args == ("--iterations", "3", "--model", "resnet50", "--strategy", "wfbp,mgwfbp")
    assert (mg.sizes, mg.points, base.args, base.sizes) == ((), 1, (), ())
    assert train_coll.args == ("--steps", "20", "--variant", "coll_compressed")
    assert train_coll.slug == "training_variant-coll_compressed_r2"


def test_compare_of_unsized_variants_takes_none_of_the_sweep_options(tmp_path):
    spec = sweep_spec.load_spec(
        write_spec(
            tmp_path / "s.toml",
            """
[sweep]
sizes = "1K:4K"
iterations = 5
warmup = 1
options = ["-c"]
[[points]]
variant = "compare"
a = "training --framework fsdp --variant baseline"
b = "training --framework fsdp --variant coll_compressed --codec fp16"
steps = 20
rounds = 3
[[points]]
variant = "compare"
a = "baseline --algorithm mpi"
b = "coll_compressed --codec fp16"
rounds = 3
""",
        )
    )
    training, micro = spec.tasks
    # what follows `--` goes to both sides: training takes --steps, not -i, -x or -c
    assert training.args[training.args.index("--") + 1 :] == ("--steps", "20")
    assert micro.args[micro.args.index("--") + 1 :] == ("-i", "5", "-x", "1", "-c")


def test_array_ranges():
    assert slurm.array_ranges([7, 0, 1, 2, 5, 8]) == "0-2,5,7-8"
    assert slurm.array_ranges([3]) == "3"


def test_submit_dry_run_prints_one_array_per_rank_count_and_a_merge(tmp_path, capsys):
    spec_path = write_spec(
        tmp_path / "s.toml",
        """
[sweep]
name = "gpu"
output = "OUT"
ranks = [8, 4]
[slurm]
mpi = "pmix"
tasks_per_node = 4
gpus_per_node = 4
partition = "gpu"
time = "00:20:00"
[[points]]
variant = "baseline"
collective = ["allgather", "allreduce"]
""".replace("OUT", str(tmp_path / "out")),
    )
    assert sweep.main([str(spec_path), "--submit", "--dry-run", "--sbatch-arg=--account=a1"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "sbatch" in ln]
    assert len(lines) == 3
    four, eight, merge_job = lines
    assert "--array=2-3 " in four and "--ntasks=4 " in four and "--nodes=1 " in four
    assert "--array=0-1 " in eight and "--ntasks=8 " in eight and "--nodes=2 " in eight
    for line in (four, eight):
        assert "--gpus-per-node=4" in line and "--partition=gpu" in line
        assert "--time=00:20:00" in line and "--account=a1" in line
        assert "ccbench-array.sbatch" in line and f"CCBENCH_PYTHON={sys.executable}" in line
        assert "%x-%A_%a.out" in line
    assert "--dependency=afterany:JOBID" in merge_job and "--merge-only" in merge_job


def test_srun_launch_uses_the_spec_mpi_unless_overridden(tmp_path, monkeypatch):
    spec = sweep_spec.load_spec(
        write_spec(
            tmp_path / "s.toml",
            """
[slurm]
mpi = "pmix"
gpus_per_node = 2
[[points]]
variant = "baseline"
""",
        )
    )
    task = spec.tasks[0]
    cmd = sweep.launch_command(spec, task, list(task.args), tmp_path / "x.csv", "srun")
    assert cmd[:5] == ["srun", "--mpi=pmix", "--cpu-bind=cores", "-n", "2"]
    assert cmd[5].endswith("bind-gpu.sh")
    monkeypatch.setenv("CCBENCH_BIND", "0")
    cmd = sweep.launch_command(spec, task, list(task.args), tmp_path / "x.csv", "srun")
    assert cmd[2] == "--cpu-bind=none"
    monkeypatch.setenv("CCBENCH_SRUN_MPI", "pmi2")
    cmd = sweep.launch_command(spec, task, list(task.args), tmp_path / "x.csv", "srun")
    assert cmd[1] == "--mpi=pmi2"
    assert cmd[-2:] == ["--csv", str(tmp_path / "x.csv")]


FAKE_SRUN = """#!/bin/sh
# srun --mpi=list prints the plugins; a step with --mpi=pmix fails as without libpmix
case "$1" in
    --mpi=list) printf 'MPI plugin types are...\\n\\tnone\\n\\tcray_shasta\\n%s' "$LISTED" ;;
    --mpi=pmix) [ "$PMIX_STATUS" = 0 ] || echo "srun: error: mpi/pmix: can not load PMIx \\
library" >&2; exit "$PMIX_STATUS" ;;
esac
"""


@pytest.mark.parametrize(
    "listed, pmix_status, job, expected, why",
    [
        (
            "\tpmi2\n\tpmix\nspecific pmix plugin versions available: pmix_v4\n",
            1,
            "7",
            "pmi2",
            "can not load PMIx library",
        ),
        ("\tpmi2\n\tpmix\n", 0, "7", "pmix", "a test step with it ran"),
        ("\tpmi2\n", 0, "7", "pmi2", "offers cray_shasta, none, pmi2; no pmix"),
        ("\tpmi2\n\tpmix\n", 1, None, "pmix", "not tried outside an allocation"),
    ],
)
def test_srun_mpi_prefers_pmix_only_where_it_works(
    tmp_path, monkeypatch, listed, pmix_status, job, expected, why
):
    fake = tmp_path / "bin" / "srun"
    fake.parent.mkdir()
    fake.write_text(FAKE_SRUN)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("LISTED", listed)
    monkeypatch.setenv("PMIX_STATUS", str(pmix_status))
    monkeypatch.delenv("CCBENCH_SRUN_MPI", raising=False)
    if job:  # inside an allocation the probe runs a one-task step
        monkeypatch.setenv("SLURM_JOB_ID", job)
    else:
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(slurm, "_SRUN_MPI", [])
    spec = sweep_spec.load_spec(
        write_spec(tmp_path / "s.toml", "[[points]]\nvariant = 'baseline'\n")
    )
    mpi, reason = slurm.srun_mpi(spec)
    assert mpi == expected and why in reason
    cmd = sweep.launch_command(
        spec, spec.tasks[0], list(spec.tasks[0].args), tmp_path / "x.csv", "srun"
    )
    assert cmd[:2] == ["srun", f"--mpi={expected}"]
    # the spec's [slurm] mpi, then CCBENCH_SRUN_MPI, win over the probe
    spec.slurm["mpi"] = "cray_shasta"
    assert slurm.srun_mpi(spec)[0] == "cray_shasta"
    monkeypatch.setenv("CCBENCH_SRUN_MPI", "none")
    assert slurm.srun_mpi(spec) == ("none", "from CCBENCH_SRUN_MPI")


@pytest.mark.parametrize(
    "visible, local_id, bind, expected",
    [
        ("0,1,2,3", "2", "local", "2"),
        ("4,5", "3", "local", "5"),  # more ranks than GPUs: round robin
        ("0,1", "1", "none", "0,1"),  # CCBENCH_GPU_BIND=none leaves it alone
        (None, "1", "local", "unset"),  # no GPU (and no nvidia-smi here): nothing changes
    ],
)
def test_bind_gpu_gives_each_local_rank_one_gpu(visible, local_id, bind, expected):
    if visible is None and shutil.which("nvidia-smi"):
        pytest.skip("this host has nvidia-smi")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update({"SLURM_LOCALID": local_id, "CCBENCH_GPU_BIND": bind})
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    out = subprocess.run(
        [str(sweep.BIND_GPU), "sh", "-c", "echo ${CUDA_VISIBLE_DEVICES-unset}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    ).stdout.strip()
    assert out == expected


# ----------------------------------------------------------------------------- resume


def fake_rows(sizes, run_id, variant="baseline", **extra):
    return [
        {c: "" for c in COMMON_COLUMNS}
        | {
            "run_id": run_id,
            "timestamp": f"t{run_id}",
            "variant": variant,
            "algorithm": "mpi",
            "collective": "allgather",
            "codec": "none",
            "dtype": "float32",
            "buffer": "numpy",
            "ranks": "2",
            "nodes": "1",
            "size_bytes": str(s),
            "avg_us": "1.5",
        }
        | extra
        for s in sizes
    ]


def test_remaining_sizes_follow_the_harness_files(tmp_path):
    spec = sweep_spec.load_spec(
        write_spec(
            tmp_path / "s.toml",
            f"""
[sweep]
output = "{tmp_path / "out"}"
sizes = "1K:16K"
[[points]]
variant = "baseline"
""",
        )
    )
    task = spec.tasks[0]
    path = sweep_spec.csv_path(spec, task)
    assert sweep_spec.remaining_sizes(spec, task) == [1024, 2048, 4096, 8192, 16384]
    # a run killed while measuring 4K: rows up to 4K, no record of the run finishing
    write_csv_atomic(path, fake_rows([1024, 2048, 4096], "a"), COMMON_COLUMNS)
    assert sweep_spec.remaining_sizes(spec, task) == [4096, 8192, 16384]
    assert sweep_spec.resume_args(task, [4096, 8192, 16384])[:2] == ["-m", "4096:16384"]
    # the same run had finished (its sidecar entry exists): 4K is complete
    Path(f"{path}.json").write_text(json.dumps({"runs": {"a": {}}}))
    assert sweep_spec.remaining_sizes(spec, task) == [8192, 16384]
    write_csv_atomic(path, fake_rows([1024, 2048, 4096, 8192, 16384], "a"), COMMON_COLUMNS)
    assert sweep_spec.remaining_sizes(spec, task) == []


def test_resume_counts_only_the_points_of_the_tasks_own_configuration(tmp_path):
    spec = sweep_spec.load_spec(
        write_spec(
            tmp_path / "s.toml",
            f"""
[sweep]
output = "{tmp_path / "out"}"
sizes = "1K:16K"
[[points]]
variant = "baseline"
collective = "allreduce"
""",
        )
    )
    task = spec.tasks[0]
    path = sweep_spec.csv_path(spec, task)
    allreduce = {"collective": "allreduce"}
    # finished runs: the task's own at 1K and 2K, then another collective and another
    # rank count at every size (newest): keyed on size alone, they would finish the task
    write_csv_atomic(
        path,
        [
            *fake_rows([1024, 2048], "mine", **allreduce),
            *fake_rows([1024, 2048, 4096, 8192, 16384], "gather"),
            *fake_rows([4096, 8192, 16384], "four", ranks="4", **allreduce),
        ],
        COMMON_COLUMNS,
    )
    Path(f"{path}.json").write_text(json.dumps({"runs": {"mine": {}, "gather": {}, "four": {}}}))
    assert sweep_spec.remaining_sizes(spec, task) == [4096, 8192, 16384]
    # a run of its own killed at 8K: 4K is done, 8K may lack rows
    rows = read_rows(path)[1] + fake_rows([4096, 8192], "killed", **allreduce)
    write_csv_atomic(path, rows, COMMON_COLUMNS)
    assert sweep_spec.remaining_sizes(spec, task) == [8192, 16384]


def test_a_task_without_sizes_is_done_when_its_last_run_finished(tmp_path):
    spec = sweep_spec.load_spec(
        write_spec(
            tmp_path / "s.toml",
            f"""
[sweep]
output = "{tmp_path / "out"}"
[[points]]
variant = "merged_gradient"
""",
        )
    )
    task = spec.tasks[0]
    path = sweep_spec.csv_path(spec, task)
    assert sweep_spec.remaining_sizes(spec, task) == [None]
    path.parent.mkdir()
    path.write_text("run_id,variant,strategy\na,merged_gradient,wfbp\n")
    assert sweep_spec.remaining_sizes(spec, task) == [None]
    assert sweep_spec.resume_args(task, [None]) == list(task.args)
    Path(f"{path}.json").write_text(json.dumps({"runs": {"a": {}}}))
    assert sweep_spec.remaining_sizes(spec, task) == []


# ----------------------------------------------------------------------------- merge


def test_merge_keeps_the_newest_of_duplicates_and_copies_values_verbatim(tmp_path):
    old = fake_rows([1024, 2048], "a", avg_us="1.0000000000000002")
    new = fake_rows([2048, 4096], "b", avg_us="2.5")
    write_csv_atomic(tmp_path / "in" / "a.csv", old, COMMON_COLUMNS)
    write_csv_atomic(tmp_path / "in" / "b.csv", new, COMMON_COLUMNS)
    Path(tmp_path / "in" / "a.csv.json").write_text(json.dumps({"runs": {"a": {"x": 1}}}))
    out = tmp_path / "merged.csv"
    assert merge.main([str(tmp_path / "in"), "-o", str(out)]) == 0
    header, rows = read_rows(out)
    assert header == list(COMMON_COLUMNS)
    assert [(r["size_bytes"], r["avg_us"]) for r in rows] == [
        ("1024", "1.0000000000000002"),
        ("2048", "2.5"),
        ("4096", "2.5"),
    ]
    sidecar = json.loads(Path(f"{out}.json").read_text())
    assert sidecar["merge"]["duplicates_dropped"] == 1 and sidecar["runs"] == {"a": {"x": 1}}


def test_merge_unions_variant_columns_and_remerges_its_own_output(tmp_path):
    base = fake_rows([1024], "a")
    sparse = fake_rows([1024], "b", variant="sparse_streaming", density="0.1")
    sparse += fake_rows([1024], "b", variant="sparse_streaming", density="0.5")
    write_csv_atomic(tmp_path / "a.csv", base, COMMON_COLUMNS)
    write_csv_atomic(tmp_path / "b.csv", sparse, [*COMMON_COLUMNS, "density"])
    first = tmp_path / "m1.csv"
    merge.merge_files([tmp_path / "a.csv", tmp_path / "b.csv"], first)
    header, rows = read_rows(first)
    assert header[-1] == "density" and len(rows) == 3  # densities are distinct points
    again = tmp_path / "again" / "m2.csv"
    summary = merge.merge_files([first, tmp_path / "a.csv", tmp_path / "b.csv"], again)
    assert summary["rows_written"] == 3


def test_merge_refuses_mixed_schemas(tmp_path, capsys):
    good = tmp_path / "good.csv"
    write_csv_atomic(good, fake_rows([1024], "a"), COMMON_COLUMNS)
    older = tmp_path / "older.csv"  # a file from a harness without the p99_us column
    columns = [c for c in COMMON_COLUMNS if c != "p99_us"]
    write_csv_atomic(older, fake_rows([2048], "b"), columns)
    out = tmp_path / "out.csv"
    assert merge.main([str(good), str(older), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "older.csv" in err and "p99_us" in err and not out.exists()
    # the same variant with other columns in another file
    other = tmp_path / "other.csv"
    write_csv_atomic(other, fake_rows([2048], "c", chunk="4"), [*COMMON_COLUMNS, "chunk"])
    assert merge.main([str(good), str(other), "-o", str(out)]) == 2
    assert "refusing to mix" in capsys.readouterr().err and not out.exists()


def test_sweep_merges_each_kind_of_file_separately_and_merge_refuses_to_mix(tmp_path, capsys):
    out = tmp_path / "out"
    write_csv_atomic(out / "baseline.csv", fake_rows([1024], "a"), COMMON_COLUMNS)
    write_csv_atomic(
        out / "merged_gradient_r2.csv",
        [
            {
                "schema": "mgwfbp/2",
                "run_id": "b",
                "timestamp": "t",
                "variant": "merged_gradient",
                "model": "m",
                "strategy": "wfbp",
                "measured_us": "3",
                "predicted_us": "2",
            }
        ],
        MGWFBP_COLUMNS,
    )
    spec = sweep_spec.load_spec(
        write_spec(
            tmp_path / "s.toml",
            f"""
[sweep]
output = "{out}"
[[points]]
variant = "baseline"
[[points]]
variant = "merged_gradient"
""",
        )
    )
    written = {p.name: s["rows_written"] for p, s in sweep.merge_outputs(spec)}
    assert written == {"out.csv": 1, "out-merged_gradient.csv": 1}
    assert merge.main([str(out), "-o", str(tmp_path / "all.csv")]) == 2
    assert "refusing to mix schemas" in capsys.readouterr().err


def test_merge_of_nothing_is_a_usage_error(tmp_path, capsys):
    assert merge.main([str(tmp_path), "-o", str(tmp_path / "m.csv")]) == 2
    assert "no CSV files" in capsys.readouterr().err


def test_a_file_written_before_a_variant_gained_columns_merges_with_newer_ones(tmp_path, capsys):
    from ccbench.benchmarks.results import HARNESS
    from tests.helpers.rows import harness_row

    now = HARNESS.variant_columns("coll_compressed")
    added = ("intra_us", "inter_us")  # columns coll_compressed gained later
    before = [c for c in now if c not in added]
    out = tmp_path / "out"
    new = harness_row(now, variant="coll_compressed", run_id="new", intra_us="5.0")
    old = harness_row(before, variant="coll_compressed", run_id="old", size_bytes="8192")
    write_csv_atomic(out / "new.csv", [new], now)
    write_csv_atomic(out / "old.csv", [old], before)
    assert merge.main([str(out), "-o", str(tmp_path / "all.csv")]) == 0
    header, rows = read_rows(tmp_path / "all.csv")
    assert header == list(now)  # the variant's columns in its order
    by_run = {r["run_id"]: r for r in rows}
    assert by_run["new"]["intra_us"] == "5.0" and by_run["old"]["intra_us"] == ""
    # a column the variant never declared is still another schema
    odd = harness_row([*now, "made_up_us"], variant="coll_compressed", run_id="odd")
    write_csv_atomic(out / "odd.csv", [odd], [*now, "made_up_us"])
    assert merge.main([str(out), "-o", str(tmp_path / "all2.csv")]) == 2
    assert "refusing to mix schemas" in capsys.readouterr().err
