"""NumPy kernels for every built-in primitive, one module per op pack.

Each module exports ``KERNELS = {primitive_class: kernel}`` with
``kernel(primitive, inputs) -> ndarray | tuple[ndarray, ...]``. These tables
are the whole ``cpu-reference`` backend; the ``cpu`` backend starts from them
and replaces some with native kernels.
"""

from . import (conv, creation, elementwise, fast, fft, indexing, linalg, matmuls, products, quantized, random,
               reductions, shapes, sorting)

_MODULES = (conv, creation, elementwise, fast, fft, indexing, linalg, matmuls, products, quantized, random,
            reductions, shapes, sorting)


def numpy_kernels() -> dict:
    table = {}
    for m in _MODULES:
        table.update(m.KERNELS)
    return table
