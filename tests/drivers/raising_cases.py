"""A case driver whose rank 1 raises in its first case while rank 0 waits for it in a
collective; tests/mpirun.py must end the whole launch at once (tests/test_harness_cli.py).

    mpiexec -n 2 python -m mpi4py -m tests.drivers.raising_cases
"""

from __future__ import annotations

import json
import sys

from mpi4py import MPI


def main() -> int:
    comm = MPI.COMM_WORLD
    if comm.rank == 1:
        raise RuntimeError("injected failure in a case")
    oks = comm.gather(True, root=0)  # rank 1 never arrives
    print(json.dumps({"case": "never-reached", "ok": all(oks)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
