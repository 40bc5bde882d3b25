"""The error of the compressed collectives: round trips on the worst element's path and
the bound on the result's error.

A lossy codec's error enters a compressed collective's result once per encode/decode
round trip the worst element goes through, and where the variant reduces, once more per
addition rounded in the dtype. The round trips depend on where the codec sits: the
point-to-point ring ("p2p", collectives/compressed.py) re-encodes at each of the P-1 hops
of every phase, the collective-level ring ("coll") encodes a gathered block once and
forwards it, and the library-backed collectives ("library",
collectives/compressed_library.py) encode each contribution once. `compressions_on_path`
counts them (the advice model's error estimate grows with its square root);
`error_bound` composes the codec's own bound over them into the maximum absolute error of
the result, against which the variants, training and the merged-gradient allreduce check
what they computed (docs/compression.md).
"""

from __future__ import annotations

from ccbench.collectives.phases import Phase
from ccbench.collectives.spec import spec
from ccbench.kernels.codec_base import Codec, rounding_error


def _round_trips(variant: str, phase: Phase, size: int) -> int:
    """Encode/decode round trips one phase puts on the worst element's path: the library
    encodes each contribution once; the collective-level ring encodes a block once where
    the phase's step forwards it unchanged (the gather phase); every other phase
    re-encodes at each hop of its path (the ring's P-1)."""
    if size == 1:
        return 0
    if variant == "library" or (variant == "coll" and phase.step.forwards):
        return 1
    return phase.path_hops(size)


def compressions_on_path(variant: str, collective: str, size: int) -> int:
    """How many encode/decode round trips the worst element of the result went through."""
    return sum(_round_trips(variant, phase, size) for phase in spec(collective).phases)


def error_bound(
    codec: Codec, variant: str, collective: str, amaxes: list[float], dtype: str
) -> float | None:
    """Max abs error of the result against the exact one (None: must be exact).

    `amaxes` are max|x| of every rank's input. One round trip adds at most
    e(a) = codec.error_bound(a, dtype) to values of magnitude a. Allgather: a block is
    encoded once (collective-level) or at each of up to P-1 hops (point-to-point), each
    time from the previous decoded values: err_k = err_(k-1) + e(M + err_(k-1)),
    M = max amax. Reduce-scatter (both variants): each of the P-1 hops recompresses a
    partial sum, of magnitude at most S = sum of amaxes, and adds in `dtype`:
    err_k = err_(k-1) + e(S + err_(k-1)) + round(S + err_(k-1)), plus the rounding of
    the inputs and of the reference to `dtype`. The bound grows linearly with P.
    Allreduce: the reduce-scatter bound, then the allgather chain on sums.
    Library-backed reduce-scatter (`variant` "library"): each of the other ranks'
    contributions passes one round trip at its own magnitude a_s, and P-1 additions
    round in `dtype`: sum of e(a_s) over all ranks but the one with the smallest
    amax (this rank's own block is not encoded, and e grows with a) + (P-1)
    round(S + err), plus the inputs' and the reference's rounding; it does not compound
    over hops, and it grows with the inputs, not with the partial sums.
    """
    if not codec.lossy:
        return None
    size = len(amaxes)

    def chain(magnitude: float, hops: int, reduce: bool, err: float = 0.0) -> float:
        for _ in range(hops):
            err += codec.error_bound(magnitude + err, dtype)
            if reduce:
                err += rounding_error(dtype, magnitude + err)
        return err

    # the phases in order, each adding to the error the previous left: a reducing step's
    # on partial sums (of magnitude up to the sum of amaxes from then on), a copying one's
    # round trips on the blocks it moves
    err, magnitude = 0.0, max(amaxes) if amaxes else 0.0
    for phase in spec(collective).phases:
        if not phase.step.reduces:
            err = chain(magnitude, _round_trips(variant, phase, size), False, err)
            continue
        total = magnitude = sum(amaxes)
        inputs = sum(rounding_error(dtype, a) for a in amaxes) + rounding_error(dtype, total)
        if variant == "library":
            decoded = 0.0
            if size > 1:
                decoded = sum(codec.error_bound(a, dtype) for a in amaxes) - codec.error_bound(
                    min(amaxes), dtype
                )
            err += decoded + (size - 1) * rounding_error(dtype, total + decoded) + inputs
        else:
            err = chain(total, phase.path_hops(size), True, err) + inputs
    return err


def hierarchical_error_bound(
    codec: Codec,
    variant: str,
    collective: str,
    amaxes: list[float],
    dtype: str,
    ranks_per_node: int,
) -> float | None:
    """Max abs error of a hierarchical collective's result (collectives/hierarchical.py):
    the inter-node collective's bound on N participants (error_bound), whose
    contributions are the nodes' (allgather: a rank's block, at most the largest of its
    node's; reducing: the node's partial sum, at most the sum of its ranks' amaxes),
    plus, where it reduces, the M-1 additions of the intra-node reduce-scatter rounded
    in `dtype`. Inside a node nothing is compressed."""
    if not codec.lossy:
        return None
    m = ranks_per_node
    nodes = [amaxes[i : i + m] for i in range(0, len(amaxes), m)]
    if not spec(collective).reduces:
        return error_bound(codec, variant, collective, [max(n) for n in nodes], dtype)
    sums = [sum(n) for n in nodes]
    intra = sum((m - 1) * rounding_error(dtype, s) for s in sums)
    return error_bound(codec, variant, collective, sums, dtype) + intra
