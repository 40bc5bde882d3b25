"""bfp at the exponent edge: a block whose largest magnitude is exactly 2**e (1 - 2**-R).

There the shared exponent must step up to e + 1. Worked by hand for rate R:

* stepped up (right): step = 2**(e + 1 - R + 1) = 2**(e + 2 - R), and
  q = 2**e (1 - 2**-R) / step = 2**(R - 2) - 1/4, which rounds to 2**(R - 2): the value
  decodes to 2**(R - 2) * 2**(e + 2 - R) = 2**e, an error of 2**(e - R), which is the
  stated bound 2**(emax - R) with emax = e + 1 halved;
* not stepped up (the fault): step = 2**(e + 1 - R), q = 2**(R - 1) - 1/2, a tie that
  rounds to the even 2**(R - 1), one past the largest R-bit two's complement integer:
  it wraps to -2**(R - 1) and decodes to -2**e, an error of 2**(e + 1);
* one float32 ulp below the edge the exponent stays e: q = 2**(R - 1) - 1/2 - ulp / step
  rounds down to 2**(R - 1) - 1, which decodes to 2**e (1 - 2**(1 - R)); stepping up there
  (an edge placed too low) decodes to 2**e instead, past the bound 2**(e - R).

bfp has three implementations of this rule (kernels/codec_fused.py): the compiled host
kernels, the array-API reference (forced with a codec's `kernels = "reference"`, and what
torch or any other array library without fused kernels runs), and the fused
reduce-scatter hop (decode, add, encode in one pass). Each is checked here, because a
fault in one leaves the others right.
"""

from __future__ import annotations

import numpy as np
import pytest

from ccbench.kernels import codec_fused as fused
from ccbench.kernels.codec_bfp import TILE_WIDTH
from ccbench.kernels.codecs import parse_codec

# (exponent e, sign) of the edge value put in each block: large, unit, small, negative,
# and -126, whose edge is a subnormal float32 (the block steps up from E = 0 to E = 1)
EDGES = [(0, 1), (0, -1), (30, 1), (-20, 1), (-100, -1), (5, -1), (-126, 1)]
KERNELS = ["auto", "reference"]  # auto: the fused host kernels on numpy arrays


def edge(e: int, rate: int) -> float:
    return 2.0**e * (1 - 2.0**-rate)


def codec_with(rate: int, kernels: str):
    codec = parse_codec(f"bfp:rate={rate}")
    codec.kernels = kernels
    return codec


def edge_tile(rate: int, block: int, below: bool = False) -> np.ndarray:
    """One tile: block j is column j (elements j, j + W, j + 2W, ...); block j holds the
    edge value EDGES[j] alone (or the float32 just below it), every other element is 0."""
    x = np.zeros(block * TILE_WIDTH, dtype=np.float32)
    for j, (e, sign) in enumerate(EDGES):
        x[j] = sign * edge(e, rate)
        assert float(x[j]) == sign * edge(e, rate)  # exact in float32, subnormal included
        if below:
            x[j] = np.nextafter(x[j], np.float32(0))
    return x


def assert_powers_of_two(y, rate, where, below=False):
    for j, (e, sign) in enumerate(EDGES):
        # at the edge, sign * 2**e exactly (the wrapped fault gives -sign * 2**e); just
        # below it, the largest q of exponent e
        expected = sign * 2.0**e * ((1 - 2.0 ** (1 - rate)) if below else 1)
        assert float(y[j]) == expected, (where, rate, e, sign, below, float(y[j]))
    assert not np.any(np.asarray(y)[len(EDGES) :])


@pytest.mark.parametrize("below", [False, True], ids=["at", "below"])
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("rate", [2, 3, 4, 8, 12, 16])
def test_a_block_at_the_exponent_edge_decodes_to_the_power_of_two(rate, kernels, below):
    codec = codec_with(rate, kernels)
    x = edge_tile(rate, codec.block, below)
    if kernels == "reference" or fused.host_kernels():  # else auto is the reference too
        assert codec.kernel_path(x) == ("fused" if kernels == "auto" else "reference")
    y = np.empty_like(x)
    codec.decode(codec.encode(x), y)
    assert_powers_of_two(y, rate, codec.kernel_path(x), below)
    assert float(np.abs(y - x).max()) <= codec.error_bound(float(np.abs(x).max()))


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("rate", [2, 8, 16])
def test_the_reduce_scatter_hop_steps_up_at_the_edge(rate, kernels):
    # target = decode(payload) + own, then encoded: zeros arrive, so the sum is the edge
    codec = codec_with(rate, kernels)
    own = edge_tile(rate, codec.block)
    payload = codec.encode(np.zeros_like(own))
    target = np.empty_like(own)
    out = np.empty(codec.encoded_nbytes(own.shape[0]), dtype=np.uint8)
    sent = codec.decode_add_encode(payload, own, target, out)
    assert np.array_equal(target, own)
    y = np.empty_like(own)
    codec.decode(sent, y)
    assert_powers_of_two(y, rate, f"hop ({codec.kernel_path(own)})")


@pytest.mark.parametrize("kernels", KERNELS)
def test_a_torch_tensor_at_the_edge(kernels):
    torch = pytest.importorskip("torch")
    rate = 8
    codec = codec_with(rate, kernels)
    x = torch.from_numpy(edge_tile(rate, codec.block))
    y = torch.empty_like(x)
    codec.decode(codec.encode(x), y)
    assert_powers_of_two(y.numpy(), rate, f"torch ({codec.kernel_path(x)})")


@pytest.mark.parametrize("rate", [2, 8, 16])
def test_the_bound_at_the_edge_is_half_a_step_of_the_next_exponent(rate):
    codec = parse_codec(f"bfp:rate={rate}")
    for e in (0, 30, -20):
        # emax = e + 1 at the edge: half a step is 2**(e + 1 - R)
        assert codec.error_bound(edge(e, rate)) == 2.0 ** (e + 1 - rate)
        # just below the edge emax stays e: half a step is 2**(e - R)
        below = float(np.nextafter(np.float32(edge(e, rate)), np.float32(0)))
        assert codec.error_bound(below) == 2.0 ** (e - rate)


@pytest.mark.parametrize("kernels", KERNELS)
def test_rate_8_edge_neighbours_worked_by_hand(kernels):
    """Rate 8, block amax 1 - 2**-8 = 0.99609375: emax 1, step 2**-6, so 0.5 is q = 32,
    -0.25 is q = -16 and 2**-10 is q = 1/16, which rounds to 0; the edge itself decodes
    to 1.0 (an error of 2**-8 <= the bound 2**-7). Just below the edge (one float32 ulp,
    2**-24, less) emax stays 0, step 2**-7: q = 127.5 - 2**-17 rounds to 127, 0.9921875."""
    codec = codec_with(8, kernels)
    x = np.zeros(codec.block * TILE_WIDTH, dtype=np.float32)
    column = x.reshape(codec.block, TILE_WIDTH)  # row i, column j: element i * W + j
    column[:4, 0] = [0.99609375, 0.5, -0.25, 2.0**-10]
    column[0, 1] = 0.99609375 - 2.0**-24
    y = np.empty_like(x)
    codec.decode(codec.encode(x), y)
    out = y.reshape(codec.block, TILE_WIDTH)
    assert out[:4, 0].tolist() == [1.0, 0.5, -0.25, 0.0]
    assert float(out[0, 1]) == 0.9921875
    assert float(np.abs(y - x).max()) <= codec.error_bound(0.99609375) == 2.0**-7
