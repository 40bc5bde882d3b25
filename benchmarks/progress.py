"""Progress bars for long runs (sweeps, training, profiling): tqdm, shown by rank 0 only
and only when stderr is a terminal, so logs, CI output and SLURM files stay clean."""

from __future__ import annotations

import sys


def progress_bar(total: int, desc: str, unit: str = "it", rank: int = 0, **options):
    """A tqdm bar on stderr; disabled on ranks other than 0 and when stderr is no terminal.

    Use it as a context manager and call `update(n)`; every call is a no-op when disabled.
    """
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        dynamic_ncols=True,
        disable=True if rank != 0 else None,
        leave=False,
        **options,
    )
