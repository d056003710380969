"""LAPACK kernels of the linalg op pack (SciPy's LAPACK wrappers and ``numpy.linalg``).

Every factorization is LAPACK, never a hand-written loop of arithmetic. The ones the
benchmarks measure (``inv``, ``solve``, ``cholesky``, ``qr``, ``svd``) call SciPy's
LAPACK wrappers (``scipy.linalg.lapack``) directly, one matrix at a time, on memory
the kernel owns: a C-ordered matrix is its transpose in Fortran order, so LAPACK works
on ``A^T`` in place where the algebra allows (``inv(A^T)^T = inv(A)``, ``A = L L^H``
from the upper factor of ``A^T``, the SVD of ``A^T`` transposed back) and the only
copy is the one LAPACK must overwrite (``qr`` and ``solve`` copy into Fortran order). That skips
``numpy.linalg``'s copies into and out of Fortran order and SciPy's input checks;
``numpy.linalg``'s batched gufuncs serve the rest (eigen-decompositions, determinants,
pseudo-inverse). They run on the calling thread with the BLAS/LAPACK SciPy links,
multi-threaded as its own calls are.

A failed factorization (a singular matrix to invert or solve with, a matrix that is
not positive definite, an SVD that does not converge) raises
:class:`~lazyx.errors.LinAlgError` naming the primitive and the shape, as MLX raises a
``RuntimeError``. Kernels return exactly the dtypes the primitives promise: LAPACK has
no half precision, so ``Det`` and ``SlogDet`` of float16/bfloat16 compute in float32;
``Eig`` is complex64 even when NumPy gives real eigenvalues.

:func:`per_matrix`, :func:`broadcast_batches`, :func:`eig_kernel` and :func:`lu_kernel`
are written over an array module (NumPy here, CuPy in ``lazyx.backends.cuda.linalg``), which shares them.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import lapack

from lazyx.errors import LinAlgError
from lazyx.plugins import linalg as la

_F32 = np.dtype(np.float32)
_C64 = np.dtype(np.complex64)
_U32 = np.dtype(np.uint32)

_routines: dict = {}
_workspaces: dict = {}


def _lapack(name: str, a):
    """SciPy's wrapper of LAPACK routine ``name`` for ``a``'s dtype (looked up once)."""
    key = (name, a.dtype.char)
    fn = _routines.get(key)
    if fn is None:
        fn = _routines[key] = lapack.get_lapack_funcs(name, (a,))
    return fn


def _lwork(name: str, a, *args, **kwargs) -> int:
    """The optimal workspace size LAPACK's ``name`` query reports (asked once per size)."""
    key = (name, a.dtype.char, args, tuple(kwargs.items()))
    n = _workspaces.get(key)
    if n is None:
        out = _lapack(name, a)(*args, **kwargs)
        n = _workspaces[key] = max(1, int(np.real(out[0]) * 1.01))
    return n


def _failed(p, a, what: str) -> LinAlgError:
    return LinAlgError(f"[{p.name}] {what} (input of shape {a.shape}, dtype {a.dtype}).")


def _matrices(x):
    """The matrices of ``x`` (C-contiguous, ``(..., M, N)``) as 2-D views."""
    return x.reshape((-1,) + x.shape[-2:])


def per_matrix(fn, a, *more, xp=np):
    """``fn(matrix, *matrices)`` over the leading axes of ``a`` (and of ``more``, already
    broadcast to ``a``'s batch), results stacked back with ``xp``: for LAPACK wrappers
    that take one matrix at a time."""
    batch = a.shape[:-2]
    if not batch:
        return fn(a, *more)
    flat = [x.reshape((-1,) + x.shape[-2:]) for x in (a, *more)]
    outs = [fn(*(x[i] for x in flat)) for i in range(flat[0].shape[0])]
    if not outs:
        return None
    if isinstance(outs[0], tuple):
        return tuple(xp.stack(o).reshape(batch + o[0].shape) for o in zip(*outs))
    return xp.stack(outs).reshape(batch + outs[0].shape)


def _inverse(p, ins):
    a = ins[0]
    if p.structure != "general":
        return _triangular_inverse(p, a)
    n = a.shape[-1]
    out = np.broadcast_to(np.eye(n, dtype=a.dtype), a.shape).copy()
    if out.size == 0:
        return out
    gesv = _lapack("gesv", out)
    for m, x in zip(_matrices(np.ascontiguousarray(a)), _matrices(out)):
        # m.T is A^T in Fortran order: solving A^T X = I in place of x.T leaves
        # X^T = inv(A) in x, C order (gesv's blocked solves beat getri's inversion).
        _, _, _, info = gesv(m.T, x.T, overwrite_b=True)
        if info > 0:
            raise _failed(p, a, "The matrix is singular and has no inverse")
    return out


def _triangular_inverse(p, a):
    lower = p.structure == "lower"
    if a.size == 0:
        return np.zeros_like(a)
    trtri = _lapack("trtri", a)

    def one(m):
        inv, info = trtri(m, lower=lower)
        if info > 0:
            raise _failed(p, a, "The triangular matrix is singular (a zero on its diagonal) "
                                "and has no inverse")
        # trtri leaves the other triangle of its input in place: clear it.
        return np.tril(inv) if lower else np.triu(inv)
    return per_matrix(one, a)


def _cholesky(p, ins):
    a = ins[0]
    out = np.array(a, order="C")
    potrf = _lapack("potrf", out)
    for m in _matrices(out):
        # A^T's upper triangle is A's lower one (upper=False, as NumPy and MLX read it),
        # and its upper factor U' (A^T = U'^H U') is L^T in Fortran order: L in C order.
        # upper=True is the same with the triangles swapped.
        _, info = potrf(m.T, lower=p.upper, clean=True, overwrite_a=True)
        if info > 0:
            raise _failed(p, a, "The matrix is not positive definite")
    return out


def _qr(p, ins):
    a = ins[0]
    *batch, m, n = a.shape
    k = min(m, n)
    if a.size == 0:
        return np.empty((*batch, m, k), a.dtype), np.empty((*batch, k, n), a.dtype)
    # Each matrix in Fortran order (C order of A^T): geqrf packs R and the reflectors
    # there, orgqr turns the first K columns into Q in place.
    f = np.swapaxes(a, -1, -2).copy()
    r = np.empty((*batch, k, n), a.dtype)
    geqrf, orgqr = _lapack("geqrf", f), _lapack("orgqr", f)
    work = _lwork("geqrf_lwork", f, m, n)  # n * block size: enough for orgqr's k columns too
    for x, ri in zip(_matrices(f), _matrices(r)):
        h, tau, _, _ = geqrf(x.T, lwork=work, overwrite_a=True)
        ri[...] = h[:k]
        orgqr(h[:, :k], tau, lwork=work, overwrite_a=True)
    q = np.swapaxes(f, -1, -2)[..., :k]
    return np.ascontiguousarray(q), np.triu(r)


def _svd(p, ins):
    a = ins[0]
    *batch, m, n = a.shape
    k = min(m, n)
    real = np.empty(0, a.dtype).real.dtype
    s = np.empty((*batch, k), real)
    if p.compute_uv:
        u = np.empty((*batch, m, m), a.dtype)
        vt = np.empty((*batch, n, n), a.dtype)
    if a.size == 0:
        if p.compute_uv:  # the factors of an empty matrix are identities
            u[...], vt[...] = np.eye(m, dtype=a.dtype), np.eye(n, dtype=a.dtype)
            return u, s, vt
        return s
    c = np.ascontiguousarray(a)
    gesdd = _lapack("gesdd", c)
    uv = int(p.compute_uv)
    work = _lwork("gesdd_lwork", c, n, m, compute_uv=uv, full_matrices=1)
    for i, x in enumerate(_matrices(c)):
        # x.T is A^T in Fortran order: A^T = U' S V'  means  A = V'^T S U'^T.
        u2, s2, v2, info = gesdd(x.T, compute_uv=uv, full_matrices=1, lwork=work)
        if info > 0:
            raise _failed(p, a, "The SVD did not converge")
        s.reshape(-1, k)[i] = s2
        if uv:
            u.reshape(-1, m, m)[i] = v2.T
            vt.reshape(-1, n, n)[i] = u2.T
    return (u, s, vt) if p.compute_uv else s


def _eigh(p, ins):
    a = ins[0]
    if p.compute_eigenvectors:
        return tuple(np.linalg.eigh(a, UPLO=p.uplo))
    return np.linalg.eigvalsh(a, UPLO=p.uplo)


def eig_kernel(linalg):
    """The kernel of ``Eig`` over a ``numpy.linalg``-like module (``eig``, ``eigvals``):
    complex64 values (and vectors) even where they are real."""
    def kernel(p, ins):
        a = ins[0]
        if p.compute_eigenvectors:
            w, v = linalg.eig(a)
            return w.astype(_C64, copy=False), v.astype(_C64, copy=False)
        return linalg.eigvals(a).astype(_C64, copy=False)
    return kernel


def lu_kernel(factor, xp=np, to_host=np.asarray):
    """The kernel of ``LUF`` over ``factor(a) -> (lu, pivots)`` (LAPACK's ``getrf`` on
    the leading axes, 0-based pivots) and an array module ``xp``: the packed factors,
    the pivots as uint32 and the row permutation of ``A = (L @ U)[rows]``."""
    def kernel(p, ins):
        a = ins[0]
        m, n = a.shape[-2:]
        k = min(m, n)
        if a.size == 0:
            lu, piv = xp.zeros_like(a), xp.zeros(a.shape[:-2] + (k,), np.int32)
        else:
            lu, piv = factor(a)
        # The permutation: apply the K swaps to the identity in order, vectorised over
        # the batch, on the host (K numbers a matrix).
        flat = to_host(piv).reshape(-1, k)
        perm = np.broadcast_to(np.arange(m), (flat.shape[0], m)).copy()
        rows = np.arange(flat.shape[0])
        for i in range(k):
            j = flat[:, i]
            perm[rows, i], perm[rows, j] = perm[rows, j], perm[rows, i].copy()
        inv = np.empty_like(perm)
        np.put_along_axis(inv, perm, np.arange(m)[None, :], axis=1)
        return (xp.ascontiguousarray(lu), piv.astype(_U32),
                xp.asarray(inv.reshape(a.shape[:-2] + (m,)).astype(_U32)))
    return kernel


def _getrf(a):
    getrf = _lapack("getrf", a)

    def one(x):
        lu, piv, _ = getrf(x)  # info > 0 is a zero pivot: U is singular, not an error
        return lu, piv
    return per_matrix(one, a)


def broadcast_batches(a, b, xp=np):
    """``a`` and ``b`` with their batch dimensions broadcast together."""
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return xp.broadcast_to(a, batch + a.shape[-2:]), xp.broadcast_to(b, batch + b.shape[-2:])


def _solve(p, ins):
    a, b = broadcast_batches(*ins)
    if b.size == 0:
        return np.empty(b.shape, b.dtype)
    # A and B in Fortran order (C order of their transposes), which gesv overwrites
    # with the LU factors and the solution.
    lu, x = np.swapaxes(a, -1, -2).copy(), np.swapaxes(b, -1, -2).copy()
    gesv = _lapack("gesv", lu)
    for m, y in zip(_matrices(lu), _matrices(x)):
        _, _, _, info = gesv(m.T, y.T, overwrite_a=True, overwrite_b=True)
        if info > 0:
            raise _failed(p, a, "The matrix is singular: the system has no unique solution")
    return np.ascontiguousarray(np.swapaxes(x, -1, -2))


def _solve_triangular(p, ins):
    a, b = broadcast_batches(*ins)
    if a.size == 0 or b.size == 0:
        return np.zeros(b.shape, np.result_type(a, b))
    trtrs = _lapack("trtrs", a)

    def one(x, y):
        out, info = trtrs(x, y, lower=not p.upper)
        if info > 0:
            raise _failed(p, a, "The triangular matrix is singular (a zero on its diagonal)")
        return out
    return per_matrix(one, a, b)


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
    la.Eig: eig_kernel(np.linalg),
    la.LUF: lu_kernel(_getrf),
    la.Solve: _solve,
    la.SolveTriangular: _solve_triangular,
    la.Det: _widened(np.linalg.det),
    la.SlogDet: _widened(lambda a: tuple(np.linalg.slogdet(a))),
    la.Pinv: lambda p, ins: np.linalg.pinv(ins[0]),
}
