"""ccbench benchmarks: the common harness and one short script per variant."""
