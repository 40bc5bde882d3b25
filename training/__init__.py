"""ccbench training: the models, the sharded trainer and the layer profiler (torch)."""
