"""NumPy kernels of the creation op pack."""

KERNELS = {}
