"""CUDA kernels of the ``conv`` op pack: cuDNN where CuPy exposes it, else im2col on cuBLAS.

A :class:`~lazyx.plugins.conv.Convolution` that cuDNN's forward convolution covers
(symmetric non-negative padding, no input dilation, float16/float32/float64) runs
through ``cupyx.cudnn.convolution_forward``: the channels-last input and weight are
transposed to the NCHW / OIHW layouts that call takes, a ``flip`` reverses the weight
first, a 1-D convolution gets a unit height. Everything else (input dilation, the
asymmetric or negative padding of gradients and transposed convolutions,
complex), and every convolution when CuPy has no cuDNN, runs the NumPy kernel's
im2col + batched matmul over CuPy (:func:`lazyx.backends.cpu.kernels.conv.convolution_kernel`),
whose matmul is cuBLAS.

Not yet run on a GPU (written from CuPy's documentation; the GPU test run covers it).
"""

from __future__ import annotations

import cupy as cp
import numpy as np
from lazyx.backends.cpu.kernels.common import bf16_as_float32
from lazyx.backends.cpu.kernels.conv import convolution_kernel
from lazyx.plugins import conv as cv

_im2col = convolution_kernel(cp)
_CUDNN_TYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
_cudnn: list = []  # [(cupyx.cudnn or None, the exception class of a rejected call)]


def _cudnn_module():
    """``(cupyx.cudnn, CuDNNError)``, or ``(None, None)`` when CuPy was built or
    installed without cuDNN."""
    if not _cudnn:
        try:
            import cupyx.cudnn as m  # optional: needs the cuDNN library at run time
            from cupy_backends.cuda.libs.cudnn import CuDNNError as err
            m.get_handle()
        except Exception:  # noqa: BLE001 - ImportError, or a CUDA error when libcudnn is missing
            m = err = None
        _cudnn.append((m, err))
    return _cudnn[0]


def _covered(p, x) -> bool:
    return (x.dtype in _CUDNN_TYPES and p.padding_lo == p.padding_hi and min(p.padding_lo) >= 0
            and all(d == 1 for d in p.input_dilation))


def _by_cudnn(cudnn, p, x, w):
    nd = x.ndim - 2
    out_shape = p.output_shapes((x, w))[0]
    pad, stride, dil = p.padding_lo, p.strides, p.kernel_dilation
    if p.flip:
        w = w[(slice(None),) + (slice(None, None, -1),) * nd]
    if nd == 1:  # cuDNN convolves 2-D and 3-D: a unit height
        x, w = x[:, None], w[:, None]
        pad, stride, dil = (0,) + pad, (1,) + stride, (1,) + dil
        nd = 2
    to_first = (0, nd + 1) + tuple(range(1, nd + 1))
    xc = cp.ascontiguousarray(x.transpose(to_first))
    wc = cp.ascontiguousarray(w.transpose(to_first))
    y = cp.empty((xc.shape[0], wc.shape[0]) + _spatial_out(xc.shape[2:], wc.shape[2:], pad, stride, dil),
                 x.dtype)
    cudnn.convolution_forward(xc, wc, None, y, tuple(pad), tuple(stride), tuple(dil), p.groups,
                              auto_tune=False, tensor_core="auto")
    back = (0,) + tuple(range(2, nd + 2)) + (1,)
    return cp.ascontiguousarray(y.transpose(back)).reshape(out_shape)


def _spatial_out(size, kernel, pad, stride, dil) -> tuple:
    return tuple((n + 2 * q - (k - 1) * d - 1) // s + 1
                 for n, k, q, s, d in zip(size, kernel, pad, stride, dil))


def _convolution(p, inputs):
    x, w = inputs
    if x.size and w.size and _covered(p, x):
        cudnn, rejected = _cudnn_module()
        if cudnn is not None:
            try:
                return _by_cudnn(cudnn, p, x, w)
            except rejected:  # a configuration cuDNN does not support: im2col serves
                pass
    return _im2col(p, inputs)


# bfloat16 (which cuDNN's CuPy binding does not take) widens to float32 exactly and rounds
# back once: cuDNN instead of im2col, at two extra element-wise passes.
KERNELS = {cv.Convolution: bf16_as_float32(_convolution)}
