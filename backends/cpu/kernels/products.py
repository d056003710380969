"""NumPy kernels of the products op pack.

float32, float64 and complex64 products go straight to ``np.matmul`` (BLAS,
which also takes transposed operands without a copy), or, for large float32 and
float64 ones on CPUs where it is faster, to lazyx's own OpenBLAS (:mod:`..blas`). NumPy has no BLAS for
float16 and bfloat16, and its own loop is orders of magnitude slower, so
those operands are widened to float32 and the result narrowed back.
"""

import numpy as np

from lazyx.plugins import products as pr

from .. import blas, blas_threads, native_kernels

#: Sends the native thread pool's spinning helpers to sleep before a BLAS product that
#: runs on OpenBLAS's own threads: they spin ~1 ms after a kernel for the next one, and
#: would take a core from BLAS's threads (2-4% of the MLP training step on 2 cores,
#: measured). Where BLAS runs on the pool (``blas_threads.on_pool``) they run it.
_park_threads = getattr(native_kernels.load(), "park_threads", None) or (lambda: None)


def _park():
    if not blas_threads.on_pool:
        _park_threads()

#: Products smaller than this many multiply-adds run on one BLAS thread: no parking.
_PARK_WORK = 1 << 18

_f32 = np.dtype(np.float32)
_BLAS = frozenset((np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.complex64)))


_skinny = getattr(native_kernels.load(), "skinny_matmul_float32", None)
#: The largest small side of a skinny product, and the fewest multiply-adds worth the
#: native loops (below, NumPy's call is as quick).
_SKINNY = 16
_SKINNY_WORK = 1 << 15


def _skinny_product(a, b):
    """``a @ b`` for float32 matrices with a side of at most :data:`_SKINNY` on the native
    module's skinny loops (a training step's last layer: 256x512x10 took OpenBLAS 45-150
    µs in each of its three orientations on 2 cores, the loops 20-26), or None. The small
    operand is copied into the layout its loop reads; a large one must already be in it."""
    m, k = a.shape
    n = b.shape[1]
    if m * n * k < _SKINNY_WORK:
        return None
    if k <= _SKINNY:  # each output row sums k rows of b: b's rows contiguous
        if b.strides[1] != 4:
            b = np.ascontiguousarray(b)
    elif m <= _SKINNY:  # the same sums over b's (large) rows, read once
        if b.strides[1] != 4:
            return None
    elif n <= _SKINNY:  # dot products of a's rows with b's columns: both contiguous
        if a.strides[1] != 4:
            return None
        if b.strides != (4, 4 * k):
            b = np.ascontiguousarray(b.T).T
    else:
        return None
    out = np.empty((m, n), _f32)
    return out if _skinny(a, b, out) else None


def _product(a, b):
    """``a @ b`` in a dtype BLAS handles, and the dtype to return."""
    d = a.dtype
    if d == _f32 and _skinny is not None and a.ndim == 2 and b.ndim == 2 and b.dtype == _f32 \
            and min(a.shape[0], a.shape[1], b.shape[1]) <= _SKINNY:
        out = _skinny_product(a, b)
        if out is not None:
            return out, d
    if b.ndim == 2 and a.ndim > 2 and a.flags.c_contiguous and a.size:
        # One matrix b for a stack of a's (a Linear layer on a batch of sequences): one
        # gemm over all the rows, where NumPy's stacked loop calls one per matrix.
        out, d = _product(a.reshape(-1, a.shape[-1]), b)
        return out.reshape(*a.shape[:-1], b.shape[-1]), d
    if a.ndim > 1 and b.ndim > 1 and a.shape[-2] * a.shape[-1] * b.shape[-1] >= _PARK_WORK:
        _park()
    if d in _BLAS:
        if a.ndim == 2 and b.ndim == 2 and b.dtype == d and d in blas.DTYPES \
                and a.shape[0] * a.shape[1] * b.shape[1] >= blas.MIN_WORK:
            own = blas.load()  # lazyx's OpenBLAS where its kernels are faster (cpu/blas.py)
            if own is not None:
                return own.gemm(a, b), d
        return np.matmul(a, b), d
    return np.matmul(a.astype(_f32), b.astype(_f32)), d


def _matmul(p, ins):
    out, d = _product(ins[0], ins[1])
    return out if out.dtype == d else out.astype(d)


def _addmm(p, ins):
    c, a, b = ins
    out, d = _product(a, b)
    out = np.asarray(out)
    if p.alpha != 1.0:
        out *= p.alpha
    # As with BLAS gemm, beta == 0 ignores c entirely (NaNs in c do not leak).
    if p.beta != 0.0:
        if c.dtype != out.dtype:
            c = c.astype(out.dtype)
        out += c if p.beta == 1.0 else p.beta * c
    return out if out.dtype == d else out.astype(d)


def _softmax(p, ins):
    x = ins[0]
    if x.size == 0:
        return x
    d = x.dtype
    if d.kind not in "fc" or d.itemsize < 4:  # float16 and bfloat16 accumulate in float32
        x = x.astype(_f32)
    axes = p.axes
    m = np.max(x.real if x.dtype.kind == "c" else x, axis=axes, keepdims=True)
    e = np.exp(x - m)
    e /= np.sum(e, axis=axes, keepdims=True)
    return e if e.dtype == d else e.astype(d)


KERNELS = {
    pr.Matmul: _matmul,
    pr.AddMM: _addmm,
    pr.Softmax: _softmax,
}
