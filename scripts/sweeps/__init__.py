"""Sweeps (`ccbench sweep`, locally or under SLURM) and their results: merge, regress."""
