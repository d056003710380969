"""NumPy kernels of the reductions op pack."""

KERNELS = {}
