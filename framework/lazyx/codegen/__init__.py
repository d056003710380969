"""Code generation for fused element-wise kernels.

* :mod:`~lazyx.codegen.ir`: the one IR of fused element-wise expressions
  (:class:`~lazyx.codegen.ir.Expr`, :class:`~lazyx.codegen.ir.Program`);
* :mod:`~lazyx.codegen.cpp`: the C++ renderer (the ``cpu`` backend's kernels);
* :mod:`~lazyx.codegen.jit`: building C++ with the system compiler, loading
  with ctypes, the memory and disk caches;
* :mod:`~lazyx.codegen.lower`: a program written back as lazyx operations
  (the reference semantics, and the transform rules of fused nodes).

Renderers for other languages (CUDA C++, MSL) plug into the same IR.
"""

from . import ir

__all__ = ["ir", "PREAMBLE_END"]

#: The line a generated source's shared preamble ends with: renderers write it, and
#: :mod:`~lazyx.codegen.jit` precompiles what comes before it once for every kernel.
PREAMBLE_END = "// ---- end of the shared preamble ----\n"
