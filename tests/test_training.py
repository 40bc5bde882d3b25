"""The training benchmark on real ranks: sharded training against one process, every
variant for a few steps, convergence with lossy codecs, error feedback, and the CLI.

All training cases run in one 2-rank launch of this file as a driver
(``python -m tests.test_training``); rank 0 prints one JSON line per case.
"""

from __future__ import annotations

import csv
import json
import math

import pytest

from ccbench.benchmarks.options import compression_of
from tests.mpirun import mpirun, variant_module

pytestmark = pytest.mark.mpi  # launches MPI ranks: the Open MPI leg runs it too

# Sharded training without compression against one process training on the whole batch.
EQUIVALENCE = [
    (model, algorithm) for model in ("lm-tiny", "digits-cnn") for algorithm in ("mpi", "ring")
]
EQUIVALENCE_STEPS = 6
# Every variant for a few steps: (variant, codec, error feedback, what is compressed).
VARIANTS = [
    ("baseline", "none", False, "both"),
    ("p2p_compressed", "fp16", False, "both"),
    ("coll_compressed", "fp16", False, "both"),
    ("coll_compressed", "bfp:rate=8", True, "both"),
    ("coll_compressed", "bfp:rate=8", True, "grads"),
    ("p2p_compressed", "bf16", False, "params"),
]
RATIOS = {"none": 1.0, "fp16": 2.0, "bf16": 2.0, "bfp:rate=8": 32 / (8 + 8 / 32)}
# Convergence on digits: (variant, codec, error feedback).
CONVERGENCE = [
    ("baseline", "none", False),
    ("coll_compressed", "fp16", False),
    ("coll_compressed", "bfp:rate=8", False),
    ("coll_compressed", "bfp:rate=8", True),
    ("p2p_compressed", "bfp:rate=4", True),
]
CONVERGENCE_STEPS = 80


def _case_id(kind, *parts) -> str:
    return "-".join([kind, *map(str, parts)])


def have_sklearn() -> bool:
    import importlib.util

    return importlib.util.find_spec("sklearn") is not None


NO_SKLEARN = "the digits models need scikit-learn (not installed)"


# ----------------------------------------------------------------------- driver (ranks)


def _reference_training(task, steps: int):
    """Plain single-process torch training on the whole global batch: losses, params."""
    import torch

    from ccbench.training.models import build_model

    model = build_model(task, 0)
    optimizer = torch.optim.Adam(model.parameters(), lr=task.default_lr)
    losses = []
    for step in range(1, steps + 1):
        batch = task.batch(0, step, task.default_batch, 0, task.default_batch)
        loss = task.loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    return losses, params


def _equivalence_cases(comm, emit):
    import numpy as np

    from ccbench.benchmarks.training import TrainConfig, run_training
    from ccbench.training.models import make_task

    for model in sorted({m for m, _ in EQUIVALENCE}):
        if model.startswith("digits") and not have_sklearn():
            continue
        task = make_task(model)
        reference = _reference_training(task, EQUIVALENCE_STEPS) if comm.rank == 0 else None
        for m, algorithm in EQUIVALENCE:
            if m != model:
                continue
            config = TrainConfig(model=model, algorithm=algorithm, steps=EQUIVALENCE_STEPS)
            result = run_training(comm, config, task=task, keep_params=True)
            if comm.rank == 0:
                losses, params = reference
                emit(
                    _case_id("equivalence", model, algorithm),
                    {
                        "loss_diff": float(np.abs(np.array(losses) - result.loss).max()),
                        "param_diff": float(np.abs(params - result.final_params).max()),
                        "param_count": int(params.size),
                        "sharded_count": int(result.final_params.size),
                    },
                )


def _variant_cases(comm, emit):
    from ccbench.benchmarks.training import TrainConfig, run_training
    from ccbench.training.models import make_task

    task = make_task("lm-tiny")
    for variant, codec, feedback, compress in VARIANTS:
        algorithm = "ring"  # counts its wire bytes, as the compressed rings do
        config = TrainConfig(
            model="lm-tiny",
            variant=variant,
            algorithm=algorithm,
            compression=compression_of(codec, variant=variant, error_feedback=feedback),
            compress=compress,
            steps=4,
            warmup=1,
        )
        result = run_training(comm, config, task=task)
        emit(
            _case_id("variant", variant, codec, int(feedback), compress),
            {
                "losses": [float(x) for x in result.loss],
                "wire_bytes": float(result.wire_bytes[-1]),
                "shard_bytes": 4 * (-(-result.params // (comm.size * 256)) * 256),
                "ranks": comm.size,
                "times": {k: float(v.min()) for k, v in result.times.items()},
            },
        )


def _convergence_cases(comm, emit):
    from ccbench.benchmarks.training import TrainConfig, run_training
    from ccbench.training.models import make_task

    task = make_task("digits-mlp")
    for variant, codec, feedback in CONVERGENCE:
        config = TrainConfig(
            model="digits-mlp",
            variant=variant,
            compression=compression_of(codec, variant=variant, error_feedback=feedback),
            steps=CONVERGENCE_STEPS,
        )
        result = run_training(comm, config, task=task)
        summary = result.summary()
        emit(
            _case_id("converge", variant, codec, int(feedback)),
            {
                "first_loss": float(result.loss[0]),
                "final_loss": summary["loss"],
                "held_out_loss": summary["held_out_loss"],
                "held_out_accuracy": summary["held_out_accuracy"],
            },
        )


def _error_feedback_case(emit):
    """The residual memory on one rank: g += r; r = g - decode(encode(g))."""
    import numpy as np
    import torch
    from mpi4py import MPI

    from ccbench.collectives.comm import Communicator
    from ccbench.kernels.codecs import parse_codec
    from ccbench.training.sharded import ShardedTrainer

    comm = Communicator(MPI.COMM_SELF)
    torch.manual_seed(1)
    model = torch.nn.Linear(40, 30)
    trainer = ShardedTrainer(
        model,
        comm,
        variant="coll_compressed",
        compression=compression_of("bfp:rate=4", variant="coll_compressed", error_feedback=True),
    )
    rng = np.random.default_rng(3)
    grads = torch.from_numpy(rng.standard_normal(trainer.flat.padded).astype(np.float32))
    old = torch.from_numpy(rng.standard_normal(trainer.flat.padded).astype(np.float32) * 0.1)
    trainer.flat.grads.copy_(grads)
    trainer.residual.copy_(old)
    trainer.feedback.apply("flat", trainer.flat.grads, comm.size)  # as step() does
    compensated = (grads + old).numpy()
    codec = parse_codec("bfp:rate=4")
    decoded = np.empty_like(compensated)
    codec.decode(codec.encode(compensated), decoded)
    emit(
        "error-feedback",
        {
            "sent_diff": float(np.abs(trainer.flat.grads.numpy() - compensated).max()),
            "residual_diff": float(
                np.abs(trainer.residual.numpy() - (compensated - decoded)).max()
            ),
            "residual_max": float(np.abs(trainer.residual.numpy()).max()),
        },
    )


def driver() -> int:
    from mpi4py import MPI

    from ccbench.collectives.comm import Communicator

    comm = Communicator(MPI.COMM_WORLD)

    def emit(case: str, fields: dict) -> None:
        if comm.rank == 0:
            print(json.dumps({"case": case, **fields}), flush=True)

    _equivalence_cases(comm, emit)
    _variant_cases(comm, emit)
    if have_sklearn():
        _convergence_cases(comm, emit)
    if comm.rank == 0:
        _error_feedback_case(emit)
    return 0


# ----------------------------------------------------------------------- tests (pytest)


@pytest.fixture(scope="module")
def cases() -> dict:
    pytest.importorskip("torch")
    proc = mpirun(2, ["-m", "tests.test_training"], timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    return {line["case"]: line for line in lines}


def _get(cases, case_id) -> dict:
    assert case_id in cases, f"{case_id} did not report"
    return cases[case_id]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("model,algorithm", EQUIVALENCE)
def test_sharded_matches_single_process(cases, model, algorithm):
    if model.startswith("digits") and not have_sklearn():
        pytest.skip(NO_SKLEARN)
    got = _get(cases, _case_id("equivalence", model, algorithm))
    assert got["sharded_count"] == got["param_count"]
    # float32 sums in another order: loss within 1e-5, parameters within 2e-5 after 6
    # Adam steps (each step moves a parameter by at most lr = 1e-3 or 2e-3).
    assert got["loss_diff"] < 1e-5
    assert got["param_diff"] < 2e-5


@pytest.mark.timeout(200)
@pytest.mark.parametrize("variant,codec,feedback,compress", VARIANTS)
def test_every_variant_trains(cases, variant, codec, feedback, compress):
    got = _get(cases, _case_id("variant", variant, codec, int(feedback), compress))
    assert all(math.isfinite(x) for x in got["losses"])
    assert got["losses"][-1] < got["losses"][0]
    assert all(v >= 0 for v in got["times"].values())
    # Ring allgather and reduce-scatter each send P-1 shards per rank, through the codec
    # where it applies.
    per_collective = (got["ranks"] - 1) * got["shard_bytes"]
    ratio_params = RATIOS[codec] if compress in ("both", "params") else 1.0
    ratio_grads = RATIOS[codec] if compress in ("both", "grads") else 1.0
    expected = per_collective / ratio_params + per_collective / ratio_grads
    assert got["wire_bytes"] == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("variant,codec,feedback,compress", VARIANTS[1:])
def test_first_loss_sees_only_parameter_compression(cases, variant, codec, feedback, compress):
    """Step 1's loss sees compressed parameters only when the allgather compresses."""
    base = _get(cases, _case_id("variant", *VARIANTS[0][:2], 0, VARIANTS[0][3]))
    got = _get(cases, _case_id("variant", variant, codec, int(feedback), compress))
    delta = abs(got["losses"][0] - base["losses"][0])
    if compress == "grads":
        assert delta == 0.0  # same parameters, same forward
    else:
        assert 0.0 < delta < 0.02  # decoded parameters: a little off, not garbage


@pytest.mark.timeout(200)
@pytest.mark.parametrize("variant,codec,feedback", CONVERGENCE)
def test_compressed_training_converges(cases, variant, codec, feedback):
    if not have_sklearn():
        pytest.skip(NO_SKLEARN)
    got = _get(cases, _case_id("converge", variant, codec, int(feedback)))
    baseline = _get(cases, _case_id("converge", "baseline", "none", 0))
    assert got["final_loss"] < 0.25 * got["first_loss"]
    assert got["held_out_accuracy"] > 0.85
    # within 10% of the uncompressed run's final loss (+0.02 for near-zero losses)
    assert got["final_loss"] <= 1.10 * baseline["final_loss"] + 0.02


def test_error_feedback_keeps_the_codec_error(cases):
    got = _get(cases, "error-feedback")
    assert got["sent_diff"] == 0.0
    assert got["residual_diff"] < 1e-6
    assert got["residual_max"] > 0  # bfp at 4 bits is lossy: something was carried


@pytest.mark.timeout(120)
def test_cli_writes_step_and_summary_rows(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "train.csv"
    proc = mpirun(
        2,
        [
            *variant_module("training"),
            "--model",
            "lm-tiny",
            "--steps",
            "5",
            "--warmup",
            "1",
            "--csv",
            out,
            "--json",
            tmp_path / "train.json",
        ],
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "time per step" in proc.stdout and "held-out loss" in proc.stdout
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    steps = [r for r in rows if r["row"] == "step"]
    summary = [r for r in rows if r["row"] == "summary"]
    assert [int(r["step"]) for r in steps] == [1, 2, 3, 4, 5] and len(summary) == 1
    for r in steps:  # communication the step waited for is part of the step
        assert 0 < float(r["comm_us"]) < float(r["step_us"])
        assert float(r["forward_us"]) > 0 and float(r["backward_us"]) > 0
    s = summary[0]
    # the summary's time per step: the mean of the steps after the warm-up step
    timed = [float(r["step_us"]) for r in steps[1:]]
    assert float(s["step_us"]) == pytest.approx(sum(timed) / len(timed), rel=1e-9)
    assert s["ranks"] == "2" and s["model"] == "lm-tiny" and s["variant"] == "baseline"
    losses = [float(r["loss"]) for r in steps]
    assert float(s["loss"]) == pytest.approx(sum(losses) / 5, rel=1e-9)
    assert 0 <= float(s["held_out_accuracy"]) <= 1
    assert float(s["throughput"]) > 0 and s["throughput_unit"] == "tokens/s"
    sidecar = json.loads((tmp_path / "train.json").read_text())
    assert sidecar["summary"]["run_id"] == s["run_id"]


@pytest.mark.timeout(60)
def test_cli_usage_error_is_one_line(tmp_path):
    proc = mpirun(
        2,
        [*variant_module("training"), "--variant", "coll_compressed", "--codec", "bfp:rate=99"],
        timeout=50,
    )
    assert proc.returncode == 2
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "rate" in lines[0] and "Traceback" not in proc.stderr


if __name__ == "__main__":
    raise SystemExit(driver())
