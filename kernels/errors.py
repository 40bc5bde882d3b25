"""Errors that the harness reports as one line instead of a traceback."""


class UsageError(Exception):
    """Bad input from the user: an option value, a size, a codec spec.

    Raised identically on every rank (options are parsed everywhere), so the harness
    can print it once from rank 0 and exit with status 2 on every rank, no abort.
    """


class DataError(Exception):
    """Bad data reaching a kernel on one rank (NaN or Inf in a lossy codec).

    May be raised on one rank only, so the harness aborts the whole job with it.
    """
