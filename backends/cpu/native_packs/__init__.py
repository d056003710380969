"""The Python side of the op packs' native kernels (``backends/cpu/native/<pack>.cpp``).

Each module has ``kernels(native, reference) -> {primitive_class: kernel}``: the
kernels that replace NumPy ones (``reference``, the ``cpu-reference`` table) on the
``cpu`` backend, given the loaded native module.
"""

from . import conv, fast, matmuls, quantized

PACKS = (conv, fast, matmuls, quantized)
