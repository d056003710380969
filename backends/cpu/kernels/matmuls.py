"""NumPy kernels of the ``matmuls`` op pack (the cpu-reference backend)."""

KERNELS: dict = {}
