"""NumPy kernels of the indexing op pack."""

KERNELS = {}
