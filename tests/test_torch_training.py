"""ccbench inside stock PyTorch: FSDP2 and DDP steps on every variant, 2 real ranks.

Every collective FSDP or DDP hands to ccbench is compared, on the same inputs, with
torch.distributed's own (gloo): within the codec's stated bound, exact for lossless
variants. Lossless variants must train exactly as torch's collectives do; MG-WFBP from
gradient hooks must train exactly as DDP does. Cases: tests/drivers/torch_cases.py.
"""

from __future__ import annotations

import csv
import math

import pytest

from tests.drivers.torch_cases import DDP_ONLY, STEPS, TORCH_HOOKS, VARIANTS, case_id
from tests.mpirun import case_results, mpirun, variant_module

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too

DRIVER = "tests.drivers.torch_cases"
FRAMEWORK_CASES = [("fsdp", *v) for v in VARIANTS] + [("ddp", *v) for v in VARIANTS + DDP_ONLY]
# bytes one rank sends per step on 2 ranks, relative to the uncompressed ring
RATIOS = {"none": 1.0, "fp16": 2.0, "bf16": 2.0, "bfp:rate=8": 32 / (8 + 8 / 32)}


@pytest.fixture(scope="module")
def cases() -> dict:
    pytest.importorskip("torch")
    return case_results(DRIVER, 2, timeout=280)


def _get(cases, case) -> dict:
    assert case in cases, f"{case} did not report"
    return cases[case]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("framework,variant,algorithm,codec,compress,feedback", FRAMEWORK_CASES)
def test_collectives_agree_with_torch_within_the_bound(
    cases, framework, variant, algorithm, codec, compress, feedback
):
    got = _get(cases, case_id(framework, variant, algorithm, codec, compress, feedback))
    expected = {"fsdp": ["allgather", "reduce_scatter"], "ddp": ["allreduce"]}[framework]
    assert got["kinds"] == expected
    # FSDP: one all-gather per unit in forward, again in backward (resharded), one
    # reduce-scatter per unit; DDP: one allreduce per bucket (lm-tiny fits one)
    assert got["calls"] >= STEPS * len(expected)
    assert got["worst_ratio"] <= 1.0
    assert all(math.isfinite(x) for x in got["losses"])
    if codec == "none":
        assert got["all_exact"]
        assert got["param_diff"] <= 1e-6  # trains as torch's own collectives do
    else:
        assert 0 < got["param_diff"] < 0.02  # lr 1e-3, 3 Adam steps: near, not equal


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "framework,variant,algorithm,codec,compress,feedback",
    [c for c in FRAMEWORK_CASES if c[2] == "ring"],
)
def test_wire_bytes_follow_the_codec(
    cases, framework, variant, algorithm, codec, compress, feedback
):
    base = _get(cases, case_id(framework, "baseline", "ring", "none"))["wire"][0]
    got = _get(cases, case_id(framework, variant, algorithm, codec, compress, feedback))
    wire = got["wire"][-1]
    if framework == "ddp" or compress == "both":
        ratio = RATIOS[codec]
        assert wire == pytest.approx(base / ratio, rel=0.02)
    else:  # FSDP, gradients only: the parameter all-gather stays uncompressed
        assert base / RATIOS[codec] < wire < base


@pytest.mark.timeout(300)
@pytest.mark.parametrize("framework", ["fsdp", "ddp"])
def test_without_the_communication_thread_results_are_the_same(cases, framework):
    threaded = _get(cases, case_id(framework, "coll_compressed", "ring", "fp16"))
    inline = _get(cases, case_id(framework, "coll_compressed", "ring", "fp16", overlap=False))
    assert inline["losses"] == threaded["losses"]
    assert inline["params_sum"] == threaded["params_sum"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hook", TORCH_HOOKS[1:])
def test_torch_hooks_train(cases, hook):
    got = _get(cases, case_id("ddp", "torch", "mpi", hook))
    assert all(math.isfinite(x) for x in got["losses"])
    assert 0 < got["param_diff"] < 0.02


@pytest.mark.timeout(300)
def test_fsdp_accumulates_gradients_as_torch_does(cases):
    got = _get(cases, "fsdp-accumulate")
    assert got["norm"] > 0 and got["diff"] <= 1e-6 * got["norm"]


@pytest.mark.timeout(300)
def test_mgwfbp_on_the_real_backward_trains_as_ddp(cases):
    got = _get(cases, "mgwfbp")
    assert got["strategies"] == ["wfbp", "single", "fixed:64MB", "ddp:25MB", "mgwfbp", "optimal"]
    assert got["per_step"] == list(range(6))  # steps rotate through the strategies
    assert got["tensors"] == got["nparams"]
    assert got["groups"][0] == got["tensors"] and got["groups"][1] == 1
    # same sums in another grouping: the ring adds 2 values in the same order
    assert got["losses"] == pytest.approx(got["ddp_losses"], abs=1e-6)
    assert got["param_diff"] <= 1e-6
    # every gradient allreduced once per step, whatever the grouping (+ padding per group)
    for wire in got["wire"]:
        assert wire == pytest.approx(got["ddp_wire"][0], rel=0.01)
    assert all(0 <= e <= s for e, s in zip(got["exposed"], got["steps"], strict=True))
    assert all(p > 0 for p in got["predicted"])


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    "framework,extra",
    [
        ("fsdp", ["--variant", "coll_compressed", "--codec", "fp16"]),
        ("ddp", ["--variant", "torch", "--codec", "fp16"]),
        ("mgwfbp", ["--strategy", "mgwfbp,ddp:25MB", "--fit-seconds", "0.02"]),
    ],
)
def test_cli_frameworks_write_rows(tmp_path, framework, extra):
    pytest.importorskip("torch")
    out = tmp_path / "train.csv"
    proc = mpirun(
        2,
        [
            *variant_module("training"),
            "--model",
            "lm-tiny",
            "--steps",
            "4",
            "--warmup",
            "1",
            "--framework",
            framework,
            *extra,
            "--csv",
            out,
        ],
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "communication exposed" in proc.stdout
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    steps = [r for r in rows if r["row"] == "step"]
    summaries = [r for r in rows if r["row"] == "summary"]
    assert len(steps) == 4 and {r["framework"] for r in rows} == {framework}
    assert len(summaries) == (2 if framework == "mgwfbp" else 1)
    for r in steps:  # the exposed communication is a part of the step
        assert 0 <= float(r["comm_us"]) < float(r["step_us"])
        assert float(r["forward_us"]) > 0 and float(r["backward_us"]) > 0
    if framework == "mgwfbp":
        assert [r["strategy"] for r in steps] == ["mgwfbp", "ddp:25MB"] * 2
        assert all(float(r["predicted_us"]) > 0 for r in summaries)
        assert "predicted_ms" in proc.stdout


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "args,words",
    [
        (["--framework", "fsdp", "--variant", "sparse_streaming"], "allreduce"),
        (["--framework", "fsdp", "--variant", "torch", "--codec", "fp16"], "DDP"),
        (["--framework", "own", "--variant", "torch"], "framework"),
        (["--framework", "ddp", "--variant", "torch", "--codec", "zfp:rate=8"], "powersgd"),
        (["--framework", "mgwfbp", "--strategy", "bogus"], "strategy"),
    ],
)
def test_cli_bad_combinations_are_one_line(args, words):
    proc = mpirun(
        2, [*variant_module("training"), "--model", "lm-tiny", "--steps", "1", *args], timeout=50
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [
        x
        for x in proc.stderr.splitlines()
        if x.strip() and "Warning" not in x and "warn" not in x and "return func" not in x
    ]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in proc.stderr
