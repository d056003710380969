"""NumPy kernels of the sorting op pack."""

KERNELS = {}
