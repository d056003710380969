"""Kernels of the ``matmuls`` op pack on the ``cpu`` backend.

``gather_mm`` groups the products by right-hand matrix: when few distinct ``b``
matrices serve many indices (mixture-of-experts routing, where ``sorted_indices`` is
the usual promise), the left-hand rows of one group are stacked and multiplied by that
matrix in ONE BLAS call, instead of gathering a copy of ``b`` per index. Grouping sorts
the indices when they are not (the result does not depend on the promise).

``hadamard_transform`` runs the C++ butterfly (``backends/cpu/native/matmuls.cpp``: a
row at a time in cache, both cores) for float32, float16 and bfloat16, given the
``H_m`` factor from the reference's table; float64 runs the NumPy kernel. The rest run
the NumPy reference kernels.
"""

from functools import lru_cache

import numpy as np

from lazyx.backends.cpu.kernels import matmuls as ref
from lazyx.dtypes import numpy_name
from lazyx.plugins import matmuls as mm

_u16 = np.dtype(np.uint16)
#: NumPy dtype -> (suffix of the native functions, view dtype or None)
#: By dtype name: ml_dtypes (bfloat16's NumPy dtype) loads only once a bfloat16 array exists.
_TYPES = {"float32": ("float32", None), "float16": ("float16", _u16),
          "bfloat16": ("bfloat16", _u16)}


@lru_cache(maxsize=None)
def _hm(m: int, transposed: bool):
    """H_m (or its transpose) as the float32 matrix the C++ kernel reads; None for m = 1."""
    return None if m == 1 else np.ascontiguousarray(ref.hadamard_matrix(m, 1, transposed),
                                                    np.float32)


def _grouped_gather_mm(p, ins):
    a3, b3, lhs, rhs = ref.gather_operands(p, ins)
    count = lhs.size
    M, K, N = a3.shape[1], a3.shape[2], b3.shape[2]
    if count < 8:
        return ref.narrow(np.matmul(a3[lhs], b3[rhs]).reshape(p.output_shapes(ins)[0]),
                          ins[0].dtype)
    order = np.arange(count) if p.sorted_indices and np.all(rhs[1:] >= rhs[:-1]) \
        else np.argsort(rhs, kind="stable")
    keys = rhs[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    if len(starts) * 4 > count:  # mostly distinct matrices: one batched product
        return ref.narrow(np.matmul(a3[lhs], b3[rhs]).reshape(p.output_shapes(ins)[0]),
                          ins[0].dtype)
    out = np.empty((count, M, N), np.result_type(a3, b3))
    ends = np.r_[starts[1:], count]
    for s, e in zip(starts, ends):
        rows = order[s:e]
        left = a3[lhs[rows]].reshape(-1, K)
        out[rows] = (left @ b3[keys[s]]).reshape(-1, M, N)
    return ref.narrow(out.reshape(p.output_shapes(ins)[0]), ins[0].dtype)


def kernels(native, reference) -> dict:
    def hadamard(p, ins):
        x = ins[0]
        kind = _TYPES.get(numpy_name(x.dtype))
        if kind is None:
            return reference[mm.Hadamard](p, ins)
        suffix, view = kind
        if not x.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d x 1-d)
            x = np.ascontiguousarray(x)
        n = x.shape[-1] if x.ndim else 1
        out = np.empty(x.shape, x.dtype)
        xv, ov = (x, out) if view is None else (x.view(view), out.view(view))
        getattr(native, f"hadamard_{suffix}")(xv.reshape(-1), ov.reshape(-1), n,
                                              _hm(mm.hadamard_factors(n)[0], p.transposed),
                                              p.scale)
        return out

    return {mm.GatherMM: _grouped_gather_mm, mm.Hadamard: hadamard}
