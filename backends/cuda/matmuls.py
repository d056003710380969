"""CUDA kernels of the ``matmuls`` op pack."""

KERNELS: dict = {}
