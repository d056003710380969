"""Native kernels of the ``conv`` op pack on the ``cpu`` backend.

A :class:`~lazyx.plugins.conv.Convolution` with one group in float32 (float16 and
bfloat16 computed in float32, as the NumPy kernel accumulates them) runs as an
implicit GEMM in C++ (``backends/cpu/native/conv.cpp``) on lazyx's thread pool,
with no column matrix:

1. The C++ ``conv_im2col`` with a one-tap geometry materialises the virtual input
   (padding, input dilation) when there is any; a channels-last input is read in place.
2. ``conv_direct_float32`` convolves it with the weight, rearranged to
   ``(K..., C_in, C_out)`` (flipped first when ``flip``): register-blocked tiles of
   consecutive outputs by output channels, reduced over taps and channels.
3. A convolution whose kernel has more positions than its output (a weight
   gradient: the vjp convolves the input, batch and channels swapped, with the output
   cotangent as its kernel) runs ``conv_swapped_float32`` instead, on the operands
   with batch and channels swapped back, which are the forward's channels-last
   input and the cotangent themselves (no copies).

Spatial axes pass as three, the missing leading ones of size 1, so that the
kernels' innermost axis is the input's last spatial one.

The rest (float64, groups) runs as blocked
im2col + GEMM: for each block of output positions, the C++ ``conv_im2col``
(``backends/cpu/native/conv.cpp``, both cores) writes the block's column matrix
``(rows, groups, taps * C_in / groups)`` into one reused buffer, and ``np.matmul``
(NumPy's threaded OpenBLAS, which the C++ cannot link) multiplies it with the weight
``(groups, taps * C_in / groups, C_out / groups)`` straight into the output. Blocks of
a few MB keep the column matrix in cache between the copy and the GEMM and bound the
scratch memory, however large the convolution. A 1x1 convolution without padding,
strides or dilation needs no columns: the input is the matrix.

Other dtypes (complex; float16 and bfloat16 with groups) take the NumPy kernel,
which accumulates them in complex / float32.
"""

from __future__ import annotations

import numpy as np
from lazyx.dtypes import numpy_name
from lazyx.plugins.conv import Convolution

_NATIVE = (np.dtype(np.float32), np.dtype(np.float64))
#: The dtypes of the implicit-GEMM kernels (float32; the half types computed in it).
#: By name: ml_dtypes (bfloat16's NumPy dtype) loads only once a bfloat16 array exists.
_DIRECT = ("float32", "float16", "bfloat16")
#: Elements of the column matrix per block (float32: 16 MB), and the fewest rows of
#: a block: OpenBLAS slows down tenfold on products of few rows with a long inner
#: dimension (64 x 32768 by 32768 x 64, a weight gradient's shape), measured.
BLOCK, MIN_ROWS = 1 << 22, 512


def _geometry(p, x: np.ndarray, w: np.ndarray, out_shape: tuple) -> list:
    """``conv_im2col``'s geometry: n, c, groups, then per axis (three, the missing
    trailing ones of size 1) in, out, k, stride, padding_lo, kernel and input dilation."""
    nd = x.ndim - 2
    geo = [x.shape[0], x.shape[-1], p.groups]
    for i in range(3):
        if i < nd:
            geo += [x.shape[i + 1], out_shape[i + 1], w.shape[i + 1], p.strides[i], p.padding_lo[i],
                    p.kernel_dilation[i], p.input_dilation[i]]
        else:
            geo += [1, 1, 1, 1, 0, 1, 1]
    return geo


def _pointwise(p, kernel: tuple) -> bool:
    """Whether every window is one input element, the output position's own."""
    return (all(k == 1 for k in kernel) and all(s == 1 for s in p.strides) and not any(p.padding_lo)
            and not any(p.padding_hi) and all(d == 1 for d in p.input_dilation))


def kernels(native, reference) -> dict:
    im2col = getattr(native, "conv_im2col", None)
    if im2col is None:
        return {}
    fallback = reference[Convolution]
    direct, swapped = native.conv_direct_float32, native.conv_swapped_float32

    def virtual(p, x: np.ndarray) -> np.ndarray:
        """The channels-last ``x`` (float32) padded and dilated as ``p`` says."""
        x = np.ascontiguousarray(x)
        nd = x.ndim - 2
        if not any(p.padding_lo) and not any(p.padding_hi) and all(d == 1 for d in p.input_dilation):
            return x
        size = [(x.shape[i + 1] - 1) * p.input_dilation[i] + 1 + p.padding_lo[i] + p.padding_hi[i]
                for i in range(nd)]
        out = np.empty((x.shape[0], *size, x.shape[-1]), x.dtype)
        # a one-tap im2col: row (n, position) = x at the position, or zeros
        geo = [x.shape[0], x.shape[-1], 1]
        for i in range(3):
            j = i - (3 - nd)
            geo += ([x.shape[j + 1], size[j], 1, 1, p.padding_lo[j], 1, p.input_dilation[j]] if j >= 0
                    else [1, 1, 1, 1, 0, 1, 1])
        rows = out.size // x.shape[-1]
        im2col(x.reshape(-1).view(np.uint8), out.reshape(-1).view(np.uint8), geo, 0, rows, x.itemsize)
        return out

    def implicit(p, x: np.ndarray, w: np.ndarray, out_shape: tuple) -> np.ndarray:
        """The one-group convolution in float32 by ``conv_direct``/``conv_swapped``."""
        nd = x.ndim - 2
        kernel, spatial = w.shape[1:-1], out_shape[1:-1]
        if p.flip:
            w = w[(slice(None),) + (slice(None, None, -1),) * nd]
        lead = [1] * (3 - nd)
        if np.prod(kernel) > np.prod(spatial):
            # out[b, t, o] = sum_{n, k} xp[n, k*d + t*s, b] g[n, k, o], the batch and the
            # channels swapped back: views of contiguous arrays in a weight gradient
            xp = virtual(p, np.swapaxes(x, 0, -1))
            g = np.ascontiguousarray(np.swapaxes(w, 0, -1), np.float32)
            out = np.empty(out_shape, np.float32)
            geo = [xp.shape[0], xp.shape[-1], g.shape[-1], *lead, *xp.shape[1:-1], *lead, *spatial,
                   *lead, *kernel, *lead, *p.strides, *lead, *p.kernel_dilation]
            swapped(xp, g, out, geo)
            return out
        xp = virtual(p, x)
        wm = np.ascontiguousarray(np.moveaxis(w, 0, -1), np.float32)  # (K..., C_in, C_out)
        out = np.empty(out_shape, np.float32)
        geo = [x.shape[0], x.shape[-1], w.shape[0], *lead, *xp.shape[1:-1], *lead, *spatial,
               *lead, *kernel, *lead, *p.strides, *lead, *p.kernel_dilation]
        direct(xp, wm.reshape(-1, w.shape[0]), out, geo)
        return out

    def convolution(p, inputs):
        x, w = inputs
        if (p.groups == 1 and numpy_name(x.dtype) in _DIRECT and w.dtype == x.dtype and x.size and w.size):
            out_shape = p.output_shapes(inputs)[0]
            if x.dtype != np.float32:  # float16, bfloat16: as the NumPy kernel, in float32
                return implicit(p, x.astype(np.float32), w.astype(np.float32),
                                out_shape).astype(x.dtype)
            return implicit(p, x, w, out_shape)
        if x.dtype not in _NATIVE or w.dtype != x.dtype or x.size == 0 or w.size == 0:
            return fallback(p, inputs)
        nd = x.ndim - 2
        kernel = w.shape[1:-1]
        out_shape = p.output_shapes(inputs)[0]
        g, c_out = p.groups, w.shape[0]
        og = c_out // g
        if p.flip:
            w = w[(slice(None),) + (slice(None, None, -1),) * nd]
        # (G, Og, taps * Cg), the columns' order, transposed for the product
        wk = np.ascontiguousarray(w).reshape(g, og, -1).transpose(0, 2, 1)
        width = wk.shape[1] * g
        rows = int(np.prod(out_shape[:-1], dtype=np.int64))
        out = np.empty((rows, c_out), x.dtype)
        if _pointwise(p, kernel):
            _product(np.ascontiguousarray(x).reshape(rows, width), wk, out, g)
            return out.reshape(out_shape)
        x = np.ascontiguousarray(x)
        geo = _geometry(p, x, w, out_shape)
        blocks = max(1, min(-(-rows * width // BLOCK), rows // MIN_ROWS))
        block = -(-rows // blocks)
        cols = np.empty((block, width), x.dtype)
        xb, cb, size = x.reshape(-1).view(np.uint8), cols.reshape(-1).view(np.uint8), x.itemsize
        for r0 in range(0, rows, block):
            r = min(block, rows - r0)
            im2col(xb, cb, geo, r0, r, size)
            _product(cols[:r], wk, out[r0:r0 + r], g)
        return out.reshape(out_shape)

    convolution.reference = fallback
    return {Convolution: convolution}


def _product(cols: np.ndarray, wk: np.ndarray, out: np.ndarray, groups: int) -> None:
    """``out = cols @ wk`` group by group: cols ``(rows, G * width)``, wk ``(G, width, Og)``."""
    if groups == 1:
        np.matmul(cols, wk[0], out=out)
        return
    rows = cols.shape[0]
    per_group = np.matmul(cols.reshape(rows, groups, -1).transpose(1, 0, 2), wk)  # (G, rows, Og)
    out.reshape(rows, groups, -1)[...] = per_group.transpose(1, 0, 2)
