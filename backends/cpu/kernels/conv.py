"""NumPy kernels of the ``conv`` op pack (the cpu-reference backend).

A :class:`~lazyx.plugins.conv.Convolution` is computed as im2col + matmul, written
once over an array module (NumPy here; CuPy in ``backends/cuda/conv.py``, as the
fallback of cuDNN):

1. :func:`virtual_input` materialises the virtual input ``xp``: ``x`` spread by the
   input dilation into a zero array with the padding around it (a negative padding
   crops it).
2. :func:`windows` views the windows of ``xp`` with ``as_strided``, every
   ``stride``-th window and every ``kernel_dilation``-th tap: ``(N, out..., K..., C)``,
   the taps-then-channels order of the weight ``(C_out, K..., C_in / groups)``.
3. One matmul per group (a batched matmul) multiplies the windows, copied into a
   column matrix, with the weight, flipped first when ``flip``.

float16 and bfloat16 accumulate in float32 (as MLX's kernels), float32 and float64
in their own precision (the BLAS), complex in complex.
"""

from __future__ import annotations

import numpy as np
from lazyx.plugins import conv as cv


def _accumulator(dtype: np.dtype):
    """The dtype the products accumulate in."""
    if dtype.kind in "fc" and dtype.itemsize > 2:
        return dtype
    return np.dtype(np.float32)  # float16 and bfloat16 (ml_dtypes' has kind "V")


def virtual_input(xp, p, x, dtype):
    """``x`` (as ``dtype``) dilated by ``p.input_dilation`` and padded by
    ``p.padding_lo/hi`` (a negative padding crops)."""
    nd = x.ndim - 2
    idil, lo, hi = p.input_dilation, p.padding_lo, p.padding_hi
    x = x.astype(dtype, copy=False)
    if all(d == 1 for d in idil) and not any(lo) and not any(hi):
        return x
    dilated = [(x.shape[i + 1] - 1) * idil[i] + 1 if x.shape[i + 1] else 0 for i in range(nd)]
    shape = [x.shape[0]] + [d + max(lo[i], 0) + max(hi[i], 0) for i, d in enumerate(dilated)]
    full = xp.zeros(shape + [x.shape[-1]], dtype)
    full[(slice(None),) + tuple(slice(max(lo[i], 0), max(lo[i], 0) + dilated[i], idil[i])
                                for i in range(nd))] = x
    return full[(slice(None),) + tuple(slice(max(-lo[i], 0), shape[i + 1] - max(-hi[i], 0))
                                       for i in range(nd))]


def windows(xp, p, v, kernel: tuple, out: tuple):
    """The windows of the virtual input ``v``: a view ``(N, out..., K..., C)``."""
    nd = v.ndim - 2
    st = v.strides
    strides = ((st[0],) + tuple(st[i + 1] * p.strides[i] for i in range(nd))
               + tuple(st[i + 1] * p.kernel_dilation[i] for i in range(nd)) + (st[-1],))
    return xp.lib.stride_tricks.as_strided(v, (v.shape[0],) + tuple(out) + tuple(kernel) + (v.shape[-1],),
                                           strides)


def convolution_kernel(xp):
    """The im2col + matmul kernel over array module ``xp`` (``numpy`` or ``cupy``)."""
    def convolution(p, inputs):
        x, w = inputs
        acc = _accumulator(x.dtype)
        nd = x.ndim - 2
        kernel, out_shape = w.shape[1:-1], p.output_shapes(inputs)[0]
        g, c_out, cg = p.groups, w.shape[0], w.shape[-1]
        v = windows(xp, p, virtual_input(xp, p, x, acc), kernel, out_shape[1:-1])
        m = int(np.prod(out_shape[:-1], dtype=np.int64))
        taps = int(np.prod(kernel, dtype=np.int64))
        if p.flip:
            w = w[(slice(None),) + (slice(None, None, -1),) * nd]
        # columns (G, M, taps * Cg) against weights (G, taps * Cg, Og)
        cols = v.reshape(m, taps, g, cg).transpose(2, 0, 1, 3).reshape(g, m, taps * cg)
        wk = w.astype(acc, copy=False).reshape(g, c_out // g, taps * cg).transpose(0, 2, 1)
        res = xp.matmul(cols, wk)  # (G, M, Og)
        return res.transpose(1, 0, 2).reshape(out_shape).astype(x.dtype, copy=False)
    return convolution


KERNELS: dict = {cv.Convolution: convolution_kernel(np)}
