"""NumPy/SciPy (LAPACK) kernels of the linalg op pack.

Every factorization is LAPACK, never a hand-written loop of arithmetic:
``numpy.linalg``'s batched gufuncs where NumPy has the routine (inverse, Cholesky,
QR, SVD, eigen-decompositions, solve, determinants, pseudo-inverse), SciPy's LAPACK
wrappers (``trtri``, ``getrf``, ``trtrs``) called once per matrix of the batch where
NumPy has none. They run on the calling thread with the BLAS/LAPACK NumPy links,
multi-threaded as NumPy's own calls are.

A failed factorization (a singular matrix to invert or solve with, a matrix that is
not positive definite) raises :class:`~lazyx.errors.LinAlgError` naming the primitive
and the shape, as MLX raises a ``RuntimeError``. Kernels return exactly the dtypes the
primitives promise: LAPACK has no half precision, so ``Det`` and ``SlogDet`` of
float16/bfloat16 compute in float32; ``Eig`` is complex64 even when NumPy gives real
eigenvalues.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import lapack

from lazyx.errors import LinAlgError
from lazyx.plugins import linalg as la

_F32 = np.dtype(np.float32)
_C64 = np.dtype(np.complex64)
_U32 = np.dtype(np.uint32)


def _failed(p, a, what: str) -> LinAlgError:
    return LinAlgError(f"[{p.name}] {what} (input of shape {a.shape}, dtype {a.dtype}).")


def _per_matrix(fn, a, *more):
    """``fn(matrix, *matrices)`` over the leading axes of ``a`` (and of ``more``, already
    broadcast to ``a``'s batch), results stacked back: for SciPy's LAPACK wrappers,
    which take one matrix at a time."""
    batch = a.shape[:-2]
    if not batch:
        return fn(a, *more)
    flat = [x.reshape((-1,) + x.shape[-2:]) for x in (a, *more)]
    outs = [fn(*(x[i] for x in flat)) for i in range(flat[0].shape[0])]
    if not outs:
        return None
    if isinstance(outs[0], tuple):
        return tuple(np.stack(o).reshape(batch + o[0].shape) for o in zip(*outs))
    return np.stack(outs).reshape(batch + outs[0].shape)


def _inverse(p, ins):
    a = ins[0]
    if p.structure == "general":
        try:
            return np.linalg.inv(a)
        except np.linalg.LinAlgError:
            raise _failed(p, a, "The matrix is singular and has no inverse") from None
    lower = p.structure == "lower"
    trtri = lapack.get_lapack_funcs("trtri", (a,))
    if a.shape[-1] == 0 or a.size == 0:
        return np.zeros_like(a)

    def one(m):
        inv, info = trtri(m, lower=lower)
        if info > 0:
            raise _failed(p, a, "The triangular matrix is singular (a zero on its diagonal) "
                                "and has no inverse")
        # trtri leaves the other triangle of its input in place: clear it.
        return np.tril(inv) if lower else np.triu(inv)
    return _per_matrix(one, a)


def _cholesky(p, ins):
    a = ins[0]
    try:
        # NumPy reads the lower triangle; the upper factor of A is the transposed lower
        # factor of A^T, which reads A's upper triangle (as MLX does).
        if p.upper:
            return np.swapaxes(np.linalg.cholesky(np.swapaxes(a, -1, -2)), -1, -2).copy()
        return np.linalg.cholesky(a)
    except np.linalg.LinAlgError:
        raise _failed(p, a, "The matrix is not positive definite") from None


def _qr(p, ins):
    return tuple(np.linalg.qr(ins[0], mode="reduced"))


def _svd(p, ins):
    a = ins[0]
    if p.compute_uv:
        return tuple(np.linalg.svd(a, full_matrices=True))
    return np.linalg.svd(a, compute_uv=False)


def _eigh(p, ins):
    a = ins[0]
    if p.compute_eigenvectors:
        return tuple(np.linalg.eigh(a, UPLO=p.uplo))
    return np.linalg.eigvalsh(a, UPLO=p.uplo)


def _eig(p, ins):
    a = ins[0]
    if p.compute_eigenvectors:
        w, v = np.linalg.eig(a)
        return w.astype(_C64, copy=False), v.astype(_C64, copy=False)
    return np.linalg.eigvals(a).astype(_C64, copy=False)


def _luf(p, ins):
    a = ins[0]
    m, n = a.shape[-2:]
    k = min(m, n)
    getrf = lapack.get_lapack_funcs("getrf", (a,))

    def one(x):
        lu, piv, info = getrf(x)  # info > 0 is a zero pivot: U is singular, not an error
        return lu, piv
    if a.size == 0:
        lu, piv = np.zeros_like(a), np.zeros(a.shape[:-2] + (k,), np.int32)
    else:
        lu, piv = _per_matrix(one, a)
    # The row permutation of A = (L @ U)[rows]: apply the swaps to the identity in
    # order (vectorised over the batch; K steps).
    flat = piv.reshape(-1, k)
    perm = np.broadcast_to(np.arange(m), (flat.shape[0], m)).copy()
    rows = np.arange(flat.shape[0])
    for i in range(k):
        j = flat[:, i]
        perm[rows, i], perm[rows, j] = perm[rows, j], perm[rows, i].copy()
    inv = np.empty_like(perm)
    np.put_along_axis(inv, perm, np.arange(m)[None, :], axis=1)
    return (np.ascontiguousarray(lu), piv.astype(_U32),
            inv.reshape(a.shape[:-2] + (m,)).astype(_U32))


def _solve(p, ins):
    a, b = ins
    try:
        return np.linalg.solve(a, b)
    except np.linalg.LinAlgError:
        raise _failed(p, a, "The matrix is singular: the system has no unique solution") from None


def _solve_triangular(p, ins):
    a, b = ins
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = np.broadcast_to(a, batch + a.shape[-2:])
    b = np.broadcast_to(b, batch + b.shape[-2:])
    if a.size == 0 or b.size == 0:
        return np.zeros(batch + b.shape[-2:], np.result_type(a, b))
    trtrs = lapack.get_lapack_funcs("trtrs", (a, b))

    def one(x, y):
        out, info = trtrs(x, y, lower=not p.upper)
        if info > 0:
            raise _failed(p, a, "The triangular matrix is singular (a zero on its diagonal)")
        return out
    return _per_matrix(one, a, b)


def _widened(fn):
    """``fn`` computed in float32 for half-precision inputs (LAPACK has none)."""
    def kernel(p, ins):
        a = ins[0]
        if a.dtype.itemsize >= 4:
            return fn(a)
        out = fn(a.astype(_F32))
        return tuple(o.astype(a.dtype) for o in out) if isinstance(out, tuple) else out.astype(a.dtype)
    return kernel


KERNELS = {
    la.Inverse: _inverse,
    la.Cholesky: _cholesky,
    la.QR: _qr,
    la.SVD: _svd,
    la.Eigh: _eigh,
    la.Eig: _eig,
    la.LUF: _luf,
    la.Solve: _solve,
    la.SolveTriangular: _solve_triangular,
    la.Det: _widened(np.linalg.det),
    la.SlogDet: _widened(lambda a: tuple(np.linalg.slogdet(a))),
    la.Pinv: lambda p, ins: np.linalg.pinv(ins[0]),
}
