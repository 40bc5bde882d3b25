"""`python -m ccbench.scripts.cluster ACTION ...`, the same as `ccbench cluster ACTION ...`:
what cluster.sh and the processes the cluster starts of itself (the keeper, the self-check's
helpers in the ranks' namespaces) run."""

import sys

from ccbench.scripts.cluster.command import main

raise SystemExit(main(sys.argv[1:]))
