"""ccbench benchmarks: the common harness and one thin script per variant."""
