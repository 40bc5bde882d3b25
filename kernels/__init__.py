"""ccbench kernels: array backends, compression and sparsity kernels."""
