"""`python -m plots RESULTS... -o OUTDIR`: the same as `ccbench plot`."""

import sys

from ccbench.plots.cli import main

raise SystemExit(main(sys.argv[1:]))
