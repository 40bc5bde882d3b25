"""Errors agreed by every rank: one line from rank 0, one exit status, never a hang.

Every phase outside the timed collectives (parsing, set-up, input generation, checks) runs
under `agreed`, which gathers each rank's outcome: a bad input found on any rank is
printed once by rank 0 and every rank exits 2 (3 for bad data). Inside a collective no
agreement is possible, so a rank-local failure prints one line naming the rank and ends
the job (`run_main`): `MPI_Abort` under an MPI launch, an exit that torchrun or srun
turns into the end of every rank otherwise. Both go through the communicator's control
plane, so they work over either transport (collectives/comm.py).
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable

from ccbench.benchmarks.switches import for_this_run as switches_for_this_run
from ccbench.collectives.communicator import BaseCommunicator
from ccbench.kernels import switches
from ccbench.kernels.errors import DataError, UsageError


class _AgreedError(Exception):
    """Every rank knows the phase failed; `message` is the lowest failing rank's."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def agreed(comm: BaseCommunicator, phase: Callable):
    """Run `phase` on every rank; if it raises on any rank, raise on all (no hang).

    Used around everything outside the timed collectives (parsing, set-up, checks),
    where an error on one rank would otherwise leave the others waiting.
    """
    result, message, status = None, None, 0
    try:
        result = phase()
    except UsageError as exc:
        message, status = str(exc), 2
    except DataError as exc:
        message, status = f"rank {comm.rank}: {exc}", 3
    failures = comm.allgather_obj((message, status) if status else None)
    failed = [f for f in failures if f is not None]
    if failed:
        raise _AgreedError(*failed[0])
    return result


def run_main(
    body: Callable[[list[str], BaseCommunicator], int],
    argv: list[str] | None = None,
    comm: BaseCommunicator | None = None,
) -> int:
    """`_run_main` with this run's CCBENCH_* variables, read once at its start."""
    with switches_for_this_run():
        return _run_main(body, argv, comm)


def _run_main(
    body: Callable[[list[str], BaseCommunicator], int],
    argv: list[str] | None = None,
    comm: BaseCommunicator | None = None,
) -> int:
    """Run `body(argv, comm)` on every rank with ccbench's error handling; `comm` is the
    launch's communicator (collectives/launch.py), made here when not given.

    Exit status: 0 success, 1 validation failure, 2 bad input (one line from rank 0),
    3 bad data. Errors raised inside `agreed` phases are known to every rank and end the
    run cleanly; an unexpected error on one rank aborts the whole job instead of hanging.
    """
    argv = sys.argv[1:] if argv is None else argv
    if comm is None:
        from ccbench.benchmarks.options import launch_backend
        from ccbench.collectives.launch import launch_communicator, launched_rank

        try:
            comm = launch_communicator(launch_backend(argv))
        except UsageError as exc:  # every rank reads the same argv and environment
            if launched_rank() == 0:
                print(f"ccbench: error: {exc}", file=sys.stderr, flush=True)
            return 2
    try:
        return body(argv, comm)
    except _AgreedError as exc:
        if comm.rank == 0:
            print(f"ccbench: error: {exc}", file=sys.stderr, flush=True)
        return exc.status
    except SystemExit:  # --help
        raise
    except BaseException as exc:  # noqa: BLE001 - any rank-local failure ends the job
        _abort(comm, exc)
        return 1


# What a transport raises on a rank whose peer went away (gloo's words, the socket's):
# that rank saw another fail, whose own line and abort are on their way, so it waits
# PEER_GONE_GRACE_S for the job to end before saying anything; a peer that went away
# without ending the job is then reported.
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
PEER_GONE_GRACE_S = 5.0


def peer_gone(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError | OSError) and any(w in str(exc) for w in PEER_GONE)


def _abort(comm: BaseCommunicator, exc: BaseException) -> None:
    if peer_gone(exc):
        time.sleep(PEER_GONE_GRACE_S)
    if isinstance(exc, DataError | UsageError):
        message = str(exc)
        status = 3 if isinstance(exc, DataError) else 2
    elif isinstance(exc, KeyboardInterrupt):
        message, status = "interrupted", 130
    else:
        message, status = f"{type(exc).__name__}: {exc}", 1
    print(f"ccbench: error: rank {comm.rank}: {message}", file=sys.stderr, flush=True)
    if switches.current().debug:
        traceback.print_exception(exc)
    sys.stderr.flush()
    time.sleep(0.05)  # let the line reach the launcher before the job is torn down
    comm.abort(status)
