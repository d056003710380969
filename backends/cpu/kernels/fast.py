"""NumPy kernels of the ``fast`` op pack (the cpu-reference backend)."""

KERNELS: dict = {}
