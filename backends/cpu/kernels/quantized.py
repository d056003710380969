"""NumPy kernels of the ``quantized`` op pack (the cpu-reference backend)."""

KERNELS: dict = {}
