"""The CUDA kernel of :class:`~lazyx_axpby.ops.Axpby`: ``axpby.cu`` compiled by NVRTC
through lazyx's CUDA backend (:class:`lazyx.backends.cuda.CudaKernel`).

The plugin registers :func:`cuda_kernel` for the backend ``"cuda"`` through the
``lazyx_kernels`` hook. Nothing here imports CuPy until a kernel runs, so the
package imports on machines without a GPU.
"""

from __future__ import annotations

from importlib import resources

import numpy as np

from lazyx.extend import CudaKernel, broadcast_shapes, cuda_launch_config

from .kernels import _unsupported

#: NumPy dtype name -> the template argument of axpby.cu and the dtype its buffers are
#: viewed as (by name: ml_dtypes' bfloat16 is imported only when it is used).
_TYPES = {
    "float32": ("F32", None),
    "float64": ("F64", None),
    "float16": ("F16", np.dtype(np.uint16)),
    "bfloat16": ("BF16", np.dtype(np.uint16)),
    "complex64": ("C64", None),
}

_kernel = None


def _source():
    global _kernel
    if _kernel is None:
        src = resources.files("lazyx_axpby").joinpath("axpby.cu").read_text()
        names = [f"axpby_{path}<{t}>" for path in ("contiguous", "strided")
                 for t, _ in _TYPES.values()]
        _kernel = CudaKernel(src, "lazyx_axpby/axpby.cu", name_expressions=names)
    return _kernel


def cuda_kernel(prim, inputs):
    """``alpha * x + beta * y`` on the GPU, into a new CuPy array of the broadcast shape."""
    import cupy as cp  # only where a kernel runs: the package imports without a GPU

    x, y = inputs
    dt = x.dtype
    kind = _TYPES.get(dt.name)
    if kind is None or y.dtype != dt:
        raise _unsupported(dt if kind is None else f"{dt} with {y.dtype}")
    tag, view = kind
    shape = broadcast_shapes(x.shape, y.shape)
    out = cp.empty(shape, dt)
    n = out.size
    if n == 0:
        return out
    xs, ys, os_ = (a if view is None else a.view(view) for a in (x, y, out))
    grid, block = cuda_launch_config(n)
    alpha, beta = np.float64(prim.alpha), np.float64(prim.beta)
    if x.shape == shape and y.shape == shape and x.flags.c_contiguous and y.flags.c_contiguous:
        fn = _source().function(f"axpby_contiguous<{tag}>")
        fn(grid, block, (xs, ys, os_, alpha, beta, np.int64(n)))
        return out
    nd = len(shape)
    item = dt.itemsize

    def strides(a):
        # element strides of a broadcast to `shape` (0 where broadcast)
        pad = nd - a.ndim
        st = [0] * pad + [s // item for s in a.strides]
        return [0 if (i >= pad and a.shape[i - pad] == 1 and shape[i] != 1) else st[i]
                for i in range(nd)]
    meta = cp.asarray(np.array([list(shape), strides(x), strides(y)], np.int64))
    fn = _source().function(f"axpby_strided<{tag}>")
    fn(grid, block, (xs, ys, os_, alpha, beta, np.int64(n), np.int32(nd),
                     meta[0], meta[1], meta[2]))
    return out
