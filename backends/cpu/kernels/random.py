"""NumPy kernels of the random op pack."""

KERNELS = {}
