"""bfp at the exponent edge: a block whose largest magnitude is exactly 2**e (1 - 2**-R).

There the shared exponent must step up to e + 1. Worked by hand for rate R:

* stepped up (right): step = 2**(e + 1 - R + 1) = 2**(e + 2 - R), and
  q = 2**e (1 - 2**-R) / step = 2**(R - 2) - 1/4, which rounds to 2**(R - 2): the value
  decodes to 2**(R - 2) * 2**(e + 2 - R) = 2**e, an error of 2**(e - R), which is the
  stated bound 2**(emax - R) with emax = e + 1 halved;
* not stepped up (the fault): step = 2**(e + 1 - R), q = 2**(R - 1) - 1/2, a tie that
  rounds to the even 2**(R - 1), one past the largest R-bit two's complement integer:
  it wraps to -2**(R - 1) and decodes to -2**e, an error of 2**(e + 1).
"""

from __future__ import annotations

import numpy as np
import pytest

from ccbench.kernels.codec_bfp import TILE_WIDTH
from ccbench.kernels.codecs import parse_codec

# (exponent e, sign) of the edge value put in each block: large, unit, small, negative
EDGES = [(0, 1), (0, -1), (30, 1), (-20, 1), (-100, -1), (5, -1)]


def edge(e: int, rate: int) -> float:
    return 2.0**e * (1 - 2.0**-rate)


@pytest.mark.parametrize("rate", [2, 3, 4, 8, 12, 16])
def test_a_block_at_the_exponent_edge_decodes_to_the_power_of_two(rate):
    codec = parse_codec(f"bfp:rate={rate}")
    block = codec.block
    # one tile: block j is column j (elements j, j + W, j + 2W, ...); block j holds the
    # edge value alone, every other element is zero
    x = np.zeros(block * TILE_WIDTH, dtype=np.float32)
    for j, (e, sign) in enumerate(EDGES):
        x[j] = sign * edge(e, rate)
    assert all(float(x[j]) == sign * edge(e, rate) for j, (e, sign) in enumerate(EDGES))
    y = np.empty_like(x)
    codec.decode(codec.encode(x), y)
    for j, (e, sign) in enumerate(EDGES):
        # decoded to sign * 2**e exactly (the wrapped fault gives -sign * 2**e)
        assert float(y[j]) == sign * 2.0**e, (rate, e, sign, float(y[j]))
    assert not np.any(y[len(EDGES):])


@pytest.mark.parametrize("rate", [2, 8, 16])
def test_the_bound_at_the_edge_is_half_a_step_of_the_next_exponent(rate):
    codec = parse_codec(f"bfp:rate={rate}")
    for e in (0, 30, -20):
        # emax = e + 1 at the edge: half a step is 2**(e + 1 - R)
        assert codec.error_bound(edge(e, rate)) == 2.0 ** (e + 1 - rate)
        # just below the edge emax stays e: half a step is 2**(e - R)
        below = float(np.nextafter(np.float32(edge(e, rate)), np.float32(0)))
        assert codec.error_bound(below) == 2.0 ** (e - rate)


def test_rate_8_edge_neighbours_worked_by_hand():
    """Rate 8, block amax 1 - 2**-8 = 0.99609375: emax 1, step 2**-6, so 0.5 is q = 32,
    -0.25 is q = -16 and 2**-10 is q = 1/16, which rounds to 0; the edge itself decodes
    to 1.0 (an error of 2**-8 <= the bound 2**-7). Just below the edge (one float32 ulp,
    2**-24, less) emax stays 0, step 2**-7: q = 127.5 - 2**-17 rounds to 127, 0.9921875."""
    codec = parse_codec("bfp:rate=8")
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
