"""CUDA kernels of the ``conv`` op pack."""

KERNELS: dict = {}
