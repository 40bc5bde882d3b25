"""Error feedback's residual, worked by hand: r = g + r_old - decode(encode(g + r_old)), not
its negation, in both places that keep one (the FSDP / DDP / MG-WFBP trainers'
`ErrorFeedback` and the sharded trainer).

Over steps, what was sent plus the last residual is what was computed: the sum of the
decoded gradients plus r_T equals the sum of the true gradients (the residuals telescope).
A flipped sign adds the codec's error twice instead of carrying it.

And on real ranks, each trainer that keeps the memory (FSDP2's reduce-scatter hook, DDP's
comm hook, MG-WFBP's merged allreduces) hands every gradient element to it once per step.
"""

from __future__ import annotations

import numpy as np
import pytest

from ccbench.benchmarks.options import compression_of

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.mpi  # one test launches MPI ranks: the Open MPI leg runs them too


class QuarterGradientComm:
    """Its decode(encode(x)) rounds to a multiple of 1/4 (no ties below)."""

    def __init__(self):
        self.blocks: list[int] = []

    def roundtrip(self, x, out, blocks):
        self.blocks.append(blocks)
        torch.round(x * 4, out=out)
        out /= 4


def quarters(x):
    return torch.round(torch.as_tensor(x) * 4) / 4


def test_error_feedback_carries_the_codec_error_with_its_sign():
    from ccbench.training.gradient_comm import ErrorFeedback

    gradient_comm = QuarterGradientComm()
    feedback = ErrorFeedback(gradient_comm)
    # step 1, r = 0: g1 x 4 = 1.25, 1.75, -2.75, 0.25 rounds to 1, 2, -3, 0
    g1 = [0.3125, 0.4375, -0.6875, 0.0625]
    grad = torch.tensor(g1)
    feedback.apply("bucket0", grad, 2)
    assert grad.tolist() == g1  # nothing carried yet: g1 itself goes out
    r1 = [0.0625, -0.0625, 0.0625, 0.0625]  # g1 - (0.25, 0.5, -0.75, 0)
    assert feedback.residuals["bucket0"].tolist() == r1
    # step 2: g2 + r1 = 0.25, 0.1875, -0.25, 0.1875; x 4 = 1, 0.75, -1, 0.75 -> 1, 1, -1, 1
    g2 = [0.1875, 0.25, -0.3125, 0.125]
    grad = torch.tensor(g2)
    feedback.apply("bucket0", grad, 2)
    assert grad.tolist() == [0.25, 0.1875, -0.25, 0.1875]  # compensated: g2 + r1
    r2 = [0.0, -0.0625, 0.0, -0.0625]  # minus (0.25, 0.25, -0.25, 0.25)
    assert feedback.residuals["bucket0"].tolist() == r2
    # what the receivers decode, summed over the steps, plus r2 is g1 + g2
    sent = quarters(g1) + quarters(grad)
    assert (sent + torch.tensor(r2)).tolist() == (torch.tensor(g1) + torch.tensor(g2)).tolist()
    # another buffer has its own residual, and the block count reaches the codec
    feedback.apply("bucket1", torch.tensor(g1), 3)
    assert feedback.residuals["bucket1"].tolist() == r1
    assert feedback.residuals["bucket0"].tolist() == r2
    assert gradient_comm.blocks == [2, 2, 3]


# fp16 around 1 has a step of 2**-10: 1 + 2**-12 rounds down to 1, 1 + 3 * 2**-12 up to
# 1 + 2**-10, 0.5 is exact (no ties)
E = 2.0**-12
G = [1.0, 1.0, 0.5, -1.0]
OLD = [E, 3 * E, 0.0, -E]
COMPENSATED = [1 + E, 1 + 3 * E, 0.5, -(1 + E)]
RESIDUAL = [E, -E, 0.0, -E]  # minus (1, 1 + 2**-10, 0.5, -1)


def _tiled(values, n):
    return torch.tensor(values * (n // len(values)) + values[: n % len(values)])


def test_error_feedback_through_the_fp16_transport():
    from mpi4py import MPI

    from ccbench.collectives.comm import Communicator
    from ccbench.training.gradient_comm import ErrorFeedback, GradientCommSpec, GradientCommunicator

    gradient_comm = GradientCommunicator(
        Communicator(MPI.COMM_SELF),
        GradientCommSpec(
            variant="coll_compressed",
            compression=compression_of("fp16", variant="coll_compressed", error_feedback=True),
        ),
    )
    feedback = ErrorFeedback(gradient_comm)
    grad = torch.tensor(G)
    feedback.residuals["b"] = torch.tensor(OLD)
    feedback.apply("b", grad, 1)
    assert grad.tolist() == COMPENSATED
    assert feedback.residuals["b"].tolist() == RESIDUAL


def test_sharded_trainer_error_feedback_worked_by_hand():
    """One step of the compact trainer on one rank: its gradients (G on the model's 18
    values, 0 on the padding) go out compensated by the old residual, and the residual
    left is fp16's error on what went out (the padding's OLD values are exact in fp16)."""
    from mpi4py import MPI

    from ccbench.collectives.comm import Communicator
    from ccbench.training.sharded import ShardedTrainer

    torch.manual_seed(0)
    trainer = ShardedTrainer(
        torch.nn.Linear(5, 3),
        Communicator(MPI.COMM_SELF),
        variant="coll_compressed",
        compression=compression_of("fp16", variant="coll_compressed", error_feedback=True),
    )
    n, k = trainer.flat.grads.numel(), trainer.flat.numel  # 256 padded, 18 trained
    g = _tiled(G, k)
    trainer.residual.copy_(_tiled(OLD, n))

    def loss(model):  # d loss / d (weight, bias) = g, in the flat buffer's order
        return (model.weight * g[:15].view(3, 5)).sum() + (model.bias * g[15:]).sum()

    trainer.step(loss)
    sent = _tiled(COMPENSATED, k).tolist() + _tiled(OLD, n)[k:].tolist()
    assert trainer.flat.grads.tolist() == sent
    assert trainer.residual.tolist() == _tiled(RESIDUAL, k).tolist() + [0.0] * (n - k)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("framework", ["fsdp", "ddp", "mgwfbp"])
def test_every_trainer_compensates_every_gradient_element_each_step(framework):
    # tests/drivers/feedback_cases.py counts the elements ErrorFeedback.apply is given on
    # 2 ranks: with feedback on, each step compensates every trainable parameter's
    # gradient once (FSDP: each unit's unsharded gradient before its reduce-scatter; DDP:
    # every bucket; MG-WFBP: every merged group), with it off none
    from tests.mpirun import case_results

    cases = case_results("tests.drivers.feedback_cases", 2, timeout=280)
    on, off = cases.get(f"{framework}-1"), cases.get(f"{framework}-0")
    assert on is not None and off is not None, sorted(cases)
    assert on["calls"] > 0
    assert on["applied"] == on["steps"] * on["params"], on
    assert off["applied"] == off["calls"] == 0, off


def test_error_feedbacks_round_trip_is_per_rank_block():
    """The residual is what the ring's codec loses, block by block as the ring encodes:
    with a block-scaled codec a value shares its scale only with its own rank block.

    bfp's blocks are tile columns (256 wide): element j and element 256 + j share one
    exponent. Rank blocks of 256 values, 2**-10 in the first and 2**6 in the second: each
    block alone holds one power of two, exact, so the residual is 0. Encoded as one block,
    column j holds 2**-10 beside 2**6, whose step (2**(7 - 8 + 1) = 1 at rate 8) rounds
    2**-10 to 0: the residual is 2**-10 there."""
    from mpi4py import MPI

    from ccbench.collectives.comm import Communicator
    from ccbench.training.gradient_comm import ErrorFeedback, GradientCommSpec, GradientCommunicator

    gradient_comm = GradientCommunicator(
        Communicator(MPI.COMM_SELF),
        GradientCommSpec(
            variant="coll_compressed",
            compression=compression_of(
                "bfp:rate=8", variant="coll_compressed", error_feedback=True
            ),
        ),
    )
    values = [2.0**-10] * 256 + [2.0**6] * 256
    feedback = ErrorFeedback(gradient_comm)
    feedback.apply("two ranks", torch.tensor(values), 2)
    assert feedback.residuals["two ranks"].tolist() == [0.0] * 512
    feedback.apply("one rank", torch.tensor(values), 1)
    assert feedback.residuals["one rank"].tolist() == [2.0**-10] * 256 + [0.0] * 256


def test_sparse_streaming_carries_gradients_through_omnireduce(monkeypatch):
    """Training and replay name the algorithm their rows ran: sparse streaming's is
    OmniReduce, and its allreduces go through the OmniReduce engine, not the ring."""
    from mpi4py import MPI

    from ccbench.collectives import omnireduce
    from ccbench.collectives.comm import Communicator
    from ccbench.kernels import variants
    from ccbench.training.gradient_comm import GradientCommSpec, GradientCommunicator

    assert variants.gradient_algorithm("sparse_streaming", "ring") == "omnireduce"
    engines = []

    class Counted(omnireduce.OmniReduce):
        def __call__(self, *args, **kwargs):
            engines.append(self)
            return super().__call__(*args, **kwargs)

    monkeypatch.setattr(omnireduce, "OmniReduce", Counted)
    gradient_comm = GradientCommunicator(
        Communicator(MPI.COMM_SELF), GradientCommSpec(variant="sparse_streaming")
    )
    buf = torch.zeros(1024)
    buf[300:310] = 1.5
    gradient_comm.allreduce(buf)
    assert len(engines) == 1
    assert buf[300:310].tolist() == [1.5] * 10 and float(buf.abs().sum()) == 15.0


def test_host_tensors_reach_ccbenchs_collectives_as_numpy_views_of_their_memory():
    from ccbench.training.gradient_comm import host_view

    t = torch.arange(8, dtype=torch.float32)
    view = host_view(t)
    assert isinstance(view, np.ndarray) and view.dtype == np.float32
    view[3] = 42.0  # the same memory: a write lands in the tensor
    assert t[3].item() == 42.0
    needs_grad = torch.ones(4, requires_grad=True)
    assert host_view(needs_grad).ctypes.data == needs_grad.data_ptr()
    half = torch.zeros(4, dtype=torch.float16)
    assert host_view(half).dtype == np.float16
    brain = torch.zeros(4, dtype=torch.bfloat16)  # numpy has no bfloat16: as it is
    assert host_view(brain) is brain
