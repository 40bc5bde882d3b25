"""`ccbench gpu-check`: the GPU acceptance run and the survey of a node's GPU path."""
