"""CUDA kernels of the ``quantized`` op pack."""

KERNELS: dict = {}
