"""Sizes as users write them: one parser for every size option and spec.

'4096', '4K', '1M', '2GiB', '64MB', '1.5K' -> bytes, in binary multiples as OSU's -m reads
them (a B or iB after the unit changes nothing). A fraction is allowed where it makes
whole bytes.
"""

from __future__ import annotations

import re

from ccbench.kernels.errors import UsageError

_SHIFT = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes of a size written with an optional K, M, G or T (binary multiples)."""
    match = _SIZE.match(text)
    if not match:
        raise UsageError(
            f"bad message size {text!r}: use a number with an optional K, M or G (e.g. 4K, 64MB)"
        )
    value = float(match.group(1)) * (1 << _SHIFT[match.group(2).upper()])
    if value != int(value):
        raise UsageError(f"bad message size {text!r}: not a whole number of bytes")
    return int(value)
