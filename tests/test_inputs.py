"""Benchmark inputs (kernels/inputs.py) and the real-data corpus (`ccbench corpus`).

A tiny corpus (lm-tiny and digits-mlp, 3 simulated ranks, 2 steps) is built once into a
temporary folder; its manifest is checked against the files with statistics computed
here independently (numpy's unique counts and scipy's entropy, hashlib, an integer
bfloat16 rounding), and its gradients against a torch gradient recomputed here.
"""

from __future__ import annotations

import hashlib
import json
import math
import os

import numpy as np
import pytest

from ccbench.kernels.errors import UsageError

torch = pytest.importorskip("torch")
scipy_stats = pytest.importorskip("scipy.stats")

TINY = [
    "--lm-model",
    "lm-tiny",
    "--digits-model",
    "digits-mlp",
    "--steps",
    "2",
    "--ranks",
    "3",
    "--seed",
    "5",
]
SYNTHETIC = ["exact", "normal", "gradient-like", "sparse:0.1"]


def have_sklearn() -> bool:
    import importlib.util

    return importlib.util.find_spec("sklearn") is not None


# Synthetic kinds ----------------------------------------------------------------------------


@pytest.mark.parametrize("spec", SYNTHETIC)
def test_synthetic_kinds_are_deterministic_and_differ_by_rank_and_seed(spec):
    from ccbench.kernels.inputs import values

    a = values(spec, 5000, 1, 4, seed=3)
    assert a.shape == (5000,)
    assert np.array_equal(a, values(spec, 5000, 1, 4, seed=3))
    assert not np.array_equal(a, values(spec, 5000, 2, 4, seed=3))
    assert not np.array_equal(a, values(spec, 5000, 1, 4, seed=4))


@pytest.mark.parametrize("ranks", [2, 4, 16, 127])
def test_exact_sums_are_exact_in_every_dtype(ranks):
    from ccbench.kernels.inputs import values

    inputs = [values("exact", 3000, r, ranks, seed=1) for r in range(ranks)]
    amplitude = max(1, min(8, 127 // ranks))
    for x in inputs:
        assert np.array_equal(x, np.round(x)) and np.abs(x).max() <= amplitude
    exact = [sum(int(x[i]) for x in inputs) for i in range(0, 3000, 7)]  # Python integers
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        partial = torch.zeros(3000, dtype=dtype)
        for x in inputs:  # accumulate in the dtype itself, rank by rank
            partial += torch.from_numpy(x).to(dtype)
        assert partial.double().numpy()[::7].tolist() == exact
    as_int8 = np.sum([x.astype(np.int8) for x in inputs], axis=0, dtype=np.int8)
    assert as_int8[::7].tolist() == exact


def test_gradient_like_has_a_scale_per_4096_values():
    from ccbench.kernels.inputs import values

    x = values("gradient-like", 4096 * 64, 0, 2, seed=0)
    blocks = x.reshape(64, 4096)
    rms = np.sqrt((blocks**2).mean(axis=1))
    assert rms.max() / rms.min() > 5  # log-normal scales, sigma 1 over 64 blocks
    standardized = (blocks / rms[:, None]).ravel()
    assert abs(standardized.mean()) < 0.01 and abs(standardized.std() - 1) < 0.01


@pytest.mark.parametrize("density", [0.0, 0.1, 1.0])
def test_sparse_kind_has_exactly_its_share_of_nonzero_blocks(density):
    from ccbench.kernels.inputs import parse_data_kind, values

    kind = parse_data_kind(f"sparse:{density}")
    assert kind.is_gradient and kind.spec == f"sparse:{density:g}"
    for rank in range(3):
        x = values(kind, 256 * 100 + 17, rank, 3)  # a partial last block
        padded = np.concatenate([x, np.zeros(256 - 17)]).reshape(101, 256)
        assert (padded != 0).any(axis=1).sum() == round(density * 101)


def test_normal_is_standard_normal():
    from ccbench.kernels.inputs import values

    x = values("normal", 200000, 0, 1)
    assert abs(x.mean()) < 0.01 and abs(x.std() - 1) < 0.01


@pytest.mark.parametrize(
    "spec",
    [
        "foo",
        "grad:",
        "grad",
        "grad:lm-tiny:late:x",
        "sparse:2",
        "sparse:x",
        "grad:lm-tiny:later",
        "act::late",
        "",
    ],
)
def test_bad_kinds_fail_with_one_line(spec, tmp_path, switch):
    from ccbench.kernels.inputs import parse_data_kind

    switch("CCBENCH_CORPUS", str(tmp_path))
    with pytest.raises(UsageError) as info:
        parse_data_kind(spec)
    assert "\n" not in str(info.value) and str(info.value)


@pytest.mark.parametrize(
    "spec", ["gradient", "weights", "activations", "grad:lm-small:late", "act:digits-cnn"]
)
def test_a_missing_corpus_names_the_command_that_builds_it(spec, tmp_path, switch):
    from ccbench.kernels.inputs import parse_data_kind

    switch("CCBENCH_CORPUS", str(tmp_path / "nowhere"))
    with pytest.raises(UsageError) as info:
        parse_data_kind(spec)
    message = str(info.value)
    assert "ccbench corpus" in message and str(tmp_path / "nowhere") in message
    assert "\n" not in message


# The corpus -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    if not have_sklearn():
        pytest.skip("the digits models need scikit-learn")
    from ccbench.scripts.cli import main

    root = tmp_path_factory.mktemp("corpus")
    assert main(["corpus", "--out", str(root), *TINY]) == 0
    return root


@pytest.fixture
def use_corpus(corpus, switch):
    switch("CCBENCH_CORPUS", str(corpus))
    return corpus


def manifest_of(root) -> dict:
    return json.loads((root / "manifest.json").read_text())


def independent_entropy(data: np.ndarray) -> float:
    _, counts = np.unique(data, return_counts=True)
    return float(scipy_stats.entropy(counts, base=2))


def bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16, nearest even, with integer arithmetic (finite values)."""
    bits = x.view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def test_manifest_matches_the_files(corpus):
    manifest = manifest_of(corpus)
    assert manifest["seed"] == 5 and "ccbench corpus" in manifest["command"]
    tensors = manifest["tensors"]
    kinds = {(t["model"], t["tensor"], t["phase"], t["dtype"]) for t in tensors}
    for model in ("lm-tiny", "digits-mlp"):
        for phase in ("early", "middle", "late"):
            assert (model, "grad", phase, "float32") in kinds
            assert (model, "weights", phase, "float32") in kinds
        for tensor in ("grad", "weights", "act"):
            assert (model, tensor, "late", "bfloat16") in kinds
    for t in tensors:
        path = corpus / t["file"]
        data = np.load(path)
        assert list(data.shape) == t["shape"] and data.size == t["count"]
        assert data.dtype == (np.float32 if t["dtype"] == "float32" else np.uint16)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == t["sha256"]
        raw = data.view(np.uint8)
        assert t["byte_entropy"] == pytest.approx(independent_entropy(raw), abs=1e-5)
        lanes = raw.reshape(-1, data.dtype.itemsize)
        for k, entropy in enumerate(t["lane_entropy"]):
            assert entropy == pytest.approx(independent_entropy(lanes[:, k]), abs=1e-5)
        bits = data.dtype.itemsize * 8
        assert t["lane_order0_ratio"] == pytest.approx(bits / sum(t["lane_entropy"]), rel=1e-5)
        values = (
            data if t["dtype"] == "float32" else (data.astype(np.uint32) << 16).view(np.float32)
        )
        assert t["max_abs"] == pytest.approx(float(np.abs(values).max()), rel=1e-6)
        assert t["zero_fraction"] == pytest.approx(float((values == 0).mean()))
        assert (t["rank"] is None) == (t["tensor"] == "weights")
    assert manifest["total_bytes"] == sum(os.path.getsize(corpus / t["file"]) for t in tensors)


def test_bfloat16_files_are_the_float32_tensors_rounded(corpus):
    for t in manifest_of(corpus)["tensors"]:
        if t["dtype"] != "bfloat16":
            continue
        twin = t["file"].replace(".bfloat16.npy", ".float32.npy")
        assert np.array_equal(np.load(corpus / t["file"]), bfloat16_bits(np.load(corpus / twin)))


def test_gradients_are_real_and_per_rank(corpus):
    """Early gradients: rank r's is the gradient of its slice of the first global batch,
    recomputed here with plain torch; the ranks' gradients differ."""
    from ccbench.training.models import build_model, make_task

    manifest = manifest_of(corpus)
    for model_name in ("lm-tiny", "digits-mlp"):
        info = manifest["models"][model_name]
        task = make_task(model_name)
        model = build_model(task, 5)
        flat_init = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
        weights = np.load(corpus / model_name / "weights-early.float32.npy")
        assert np.array_equal(weights, flat_init)
        micro, batch = info["micro_batch"], info["global_batch"]
        grads = []
        for rank in range(3):
            model.zero_grad()
            task.loss(model, task.batch(5, 0, batch, rank * micro, (rank + 1) * micro)).backward()
            expected = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy()
            got = np.load(corpus / model_name / f"grad-early-r{rank}.float32.npy")
            scale = np.abs(expected).max()
            assert np.abs(got - expected).max() <= 1e-5 * scale
            grads.append(got)
        assert not np.allclose(grads[0], grads[1])
        late = [np.load(corpus / model_name / f"grad-late-r{r}.float32.npy") for r in range(2)]
        assert not np.allclose(late[0], grads[0])  # training moved on


def test_rebuilding_is_skipped_when_up_to_date_and_deterministic(corpus, tmp_path, capsys):
    from ccbench.scripts.cli import main

    before = {p: p.stat().st_mtime_ns for p in corpus.rglob("*.npy")}
    assert main(["corpus", "--out", str(corpus), *TINY]) == 0
    assert "up to date" in capsys.readouterr().out
    assert before == {p: p.stat().st_mtime_ns for p in corpus.rglob("*.npy")}
    again = tmp_path / "again"
    assert main(["corpus", "--out", str(again), *TINY, "--digits-model", "none"]) == 0
    ours = {t["file"]: t["sha256"] for t in manifest_of(corpus)["tensors"]}
    for t in manifest_of(again)["tensors"]:
        assert t["sha256"] == ours[t["file"]], t["file"]  # same seed, same bits


def test_corpus_command_rejects_bad_options(tmp_path, capsys):
    from ccbench.scripts.cli import main

    assert main(["corpus", "--out", str(tmp_path), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--steps" in err


# Corpus kinds -----------------------------------------------------------------------------


def load(corpus, name):
    return np.load(corpus / name)


def test_aliases_resolve_to_the_corpus_language_model(use_corpus):
    from ccbench.kernels.inputs import parse_data_kind

    assert parse_data_kind("gradient").spec == "grad:lm-tiny"
    assert parse_data_kind("weights").spec == "weights:lm-tiny"
    assert parse_data_kind("activations").spec == "act:lm-tiny"
    assert parse_data_kind("grad:digits-mlp:late").spec == "grad:digits-mlp:late"
    assert parse_data_kind("gradient").is_gradient
    assert not parse_data_kind("weights").is_gradient
    assert not parse_data_kind("act:digits-mlp").is_gradient


def test_a_kind_the_corpus_lacks_says_what_it_holds(use_corpus):
    from ccbench.kernels.inputs import parse_data_kind

    with pytest.raises(UsageError) as info:
        parse_data_kind("grad:lm-small:late")
    assert "grad:lm-tiny:late" in str(info.value) and "\n" not in str(info.value)


def test_each_rank_takes_its_own_simulated_rank_first(use_corpus):
    from ccbench.kernels.inputs import parse_data_kind, values

    corpus = use_corpus
    kind = parse_data_kind("gradient")
    n = load(corpus, "lm-tiny/grad-late-r0.float32.npy").size
    for rank in range(2):  # two ranks: late, middle, early of their own simulated rank
        x = values(kind, 3 * n, rank, 2)
        assert x.dtype == np.float32
        for i, phase in enumerate(("late", "middle", "early")):
            own = load(corpus, f"lm-tiny/grad-{phase}-r{rank}.float32.npy")
            assert np.array_equal(x[i * n : (i + 1) * n], own)
        assert kind.fill_note(3 * n, rank, 2) is None
    # rank 0 of 2 also owns simulated rank 2 (0, 2, 4, ... are rank 0's)
    x = values(kind, 4 * n, 0, 2)
    assert np.array_equal(x[3 * n :], load(corpus, "lm-tiny/grad-late-r2.float32.npy"))
    # one rank (codec_throughput) takes every simulated rank, then repeats
    x = values(kind, 9 * n + 10, 0, 1)
    assert np.array_equal(x[3 * n : 4 * n], load(corpus, "lm-tiny/grad-late-r1.float32.npy"))
    assert np.array_equal(x[9 * n :], x[:10])
    assert "repeats" in kind.fill_note(9 * n + 10, 0, 1)
    assert kind.fill_note(9 * n, 0, 1) is None


def test_a_phase_kind_borrows_other_ranks_then_repeats(use_corpus):
    from ccbench.kernels.inputs import parse_data_kind, values

    corpus = use_corpus
    kind = parse_data_kind("grad:lm-tiny:middle")
    r0, r1, r2 = (load(corpus, f"lm-tiny/grad-middle-r{r}.float32.npy") for r in range(3))
    n = r0.size
    x = values(kind, 3 * n + 3, 1, 2)  # its own, then the others from rank 1 + 1 on
    assert np.array_equal(x[:n], r1) and np.array_equal(x[n : 2 * n], r2)
    assert np.array_equal(x[2 * n : 3 * n], r0) and np.array_equal(x[3 * n :], r1[:3])
    assert kind.fill_note(n, 1, 2) is None
    assert "other simulated ranks" in kind.fill_note(2 * n, 1, 2)
    # more ranks than simulated ones: rank 3 reuses rank 0's tensors at another offset
    z = values(kind, n, 3, 4)
    assert not np.array_equal(z, r0)
    assert np.isin(z, np.concatenate([r0, r1, r2])).all()
    assert "reuses" in kind.fill_note(n, 3, 4)


def test_weights_are_shards_of_one_sequence(use_corpus):
    from ccbench.kernels.inputs import parse_data_kind, values

    corpus = use_corpus
    kind = parse_data_kind("weights:digits-mlp")
    sequence = np.concatenate(
        [load(corpus, f"digits-mlp/weights-{p}.float32.npy") for p in ("late", "middle", "early")]
    )
    count = 1000
    for rank in range(3):
        assert np.array_equal(
            values(kind, count, rank, 3), sequence[rank * count : (rank + 1) * count]
        )
    big = sequence.size // 2 + 1
    assert kind.fill_note(big, 0, 2) is not None and kind.fill_note(big - 1, 0, 2) is None
    wrapped = values(kind, big, 1, 2)
    assert np.array_equal(wrapped[: big - 2], sequence[big:])
    assert np.array_equal(wrapped[big - 2 :], sequence[:2])


def test_activations_follow_the_manifest_layout(use_corpus):
    from ccbench.kernels.inputs import values

    corpus = use_corpus
    info = manifest_of(corpus)["models"]["lm-tiny"]
    names = [name for name, _, _ in info["activations"]]
    assert any(name.endswith("mlp.1") for name in names)  # GELU outputs
    total = sum(math.prod(shape) for _, _, shape in info["activations"])
    x = values("act:lm-tiny:late", total, 1, 3)
    assert np.array_equal(x, load(corpus, "lm-tiny/act-late-r1.float32.npy"))
