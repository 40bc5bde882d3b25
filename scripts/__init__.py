"""ccbench scripts: the tools that drive runs (the `ccbench` command, sweeps, the emulated
cluster, SLURM, merge, the regression and timing gates, comparisons)."""
