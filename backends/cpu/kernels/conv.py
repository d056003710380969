"""NumPy kernels of the ``conv`` op pack (the cpu-reference backend)."""

KERNELS: dict = {}
