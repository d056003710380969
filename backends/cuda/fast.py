"""CUDA kernels of the ``fast`` op pack."""

KERNELS: dict = {}
