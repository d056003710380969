"""Kernel wrappers shared by the NumPy kernels and the CUDA backend's CuPy kernels.

They use only array methods (``astype``, ``view``, ``dtype``), so the same
wrapper serves NumPy and CuPy arrays.
"""

import numpy as np

from lazyx import dtypes as _dt

_F32 = np.dtype(np.float32)
_BOOL = np.dtype(np.bool_)
_UINT8 = np.dtype(np.uint8)


def bf16_as_float32(fn):
    """Run ``fn`` with bfloat16 inputs widened to float32 (exact) and round its float32
    outputs back: for kernels whose bfloat16 loop is missing or wrong (NumPy's sorts
    through ml_dtypes' comparisons do not order NaNs last; CuPy has no bfloat16 sort)."""
    # Dtypes compared by name: ml_dtypes (bfloat16's NumPy dtype) loads only when a
    # bfloat16 array exists, not with the kernels (it costs more than NumPy's import).
    def back(o):
        return o.astype(_dt.bfloat16.np) if o.dtype == _F32 else o

    def kernel(p, ins):
        if not any(_dt.numpy_name(x.dtype) == "bfloat16" for x in ins):
            return fn(p, ins)
        out = fn(p, [x.astype(_F32) if _dt.numpy_name(x.dtype) == "bfloat16" else x for x in ins])
        return tuple(back(o) for o in out) if type(out) is tuple else back(out)
    return kernel


def bool_as_uint8(fn):
    """Run a binary integer kernel on bool inputs as uint8 and return bool, as MLX does."""
    def kernel(p, ins):
        if ins[0].dtype != _BOOL:
            return fn(p, ins)
        out = fn(p, [x.view(_UINT8) for x in ins])
        if type(out) is tuple:
            return tuple(o.astype(_BOOL) for o in out)
        return out.astype(_BOOL)
    return kernel
