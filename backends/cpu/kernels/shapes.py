"""NumPy kernels of the shapes op pack."""

KERNELS = {}
