"""NumPy kernels of the products op pack."""

KERNELS = {}
