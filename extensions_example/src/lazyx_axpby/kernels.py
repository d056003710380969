"""The CPU kernels of :class:`~lazyx_axpby.ops.Axpby`.

``cpu_kernel`` runs the package's own C++ kernel (``lazyx_axpby._ext``, built
with nanobind): the output is allocated here with NumPy, so lazyx's memory
figures count it, and the C++ code fills it with the GIL released. float16 and
bfloat16 buffers cross as ``uint16`` views of their bits and are computed in
float32.

``reference_kernel`` is the same operation in NumPy. The plugin registers it
for lazyx's NumPy-only ``cpu-reference`` backend, so the two can be compared,
and it serves on ``cpu`` too when the native module cannot be imported (with
one warning saying why).
"""

from __future__ import annotations

import warnings

import numpy as np

from lazyx.extend import DtypeError, broadcast_shapes

try:
    from . import _ext
    NATIVE_ERROR = None
except ImportError as exc:  # a build for another Python or CPU: NumPy still works
    _ext = None
    NATIVE_ERROR = exc
    warnings.warn(f"lazyx-axpby: the native kernel could not be imported ({exc}); Axpby runs "
                  f"its NumPy kernel instead. Reinstall lazyx-axpby to rebuild it.",
                  RuntimeWarning, stacklevel=2)

_UINT16 = np.dtype(np.uint16)
_FLOAT32 = np.dtype(np.float32)
_HALVES = ("float16", "bfloat16")

#: NumPy dtype name -> (the dtype name the C++ kernel knows, the view it needs or None).
#: By name: bfloat16 is ml_dtypes' type, which lazyx imports only when it is used.
_NATIVE = {
    "float32": ("float32", None),
    "float64": ("float64", None),
    "complex64": ("complex64", None),
    "float16": ("float16", _UINT16),
    "bfloat16": ("bfloat16", _UINT16),
}


def _unsupported(dtype) -> DtypeError:
    return DtypeError(f"Axpby has no kernel for dtype {dtype}: the axpby op casts its inputs "
                      f"to float16, bfloat16, float32, float64 or complex64.")


def native_kernel(prim, inputs):
    """``alpha * x + beta * y`` by the C++ kernel, into a new array of the broadcast shape."""
    x, y = inputs
    dt = x.dtype
    kind = _NATIVE.get(dt.name)
    if kind is None or (y.dtype is not dt and y.dtype != dt):
        raise _unsupported(dt if kind is None else f"{dt} with {y.dtype}")
    name, view = kind
    out = np.empty(broadcast_shapes(x.shape, y.shape), dt)
    if view is None:
        _ext.axpby(x, y, out, prim.alpha, prim.beta, name)
    else:
        _ext.axpby(x.view(view), y.view(view), out.view(view), prim.alpha, prim.beta, name)
    return out


def reference_kernel(prim, inputs):
    """``alpha * x + beta * y`` in NumPy (float16 and bfloat16 computed in float32)."""
    x, y = inputs
    dt = x.dtype
    if dt.name not in _NATIVE:
        raise _unsupported(dt)
    if dt.name in _HALVES:
        x, y = x.astype(_FLOAT32), y.astype(_FLOAT32)
    # Python floats are weak in NumPy 2: a float32 array is scaled by float32(alpha).
    out = prim.alpha * x + prim.beta * y
    return np.asarray(out).astype(dt, copy=False)


cpu_kernel = native_kernel if _ext is not None else reference_kernel
