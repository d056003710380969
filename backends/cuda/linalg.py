"""CuPy kernels of the linalg op pack: cuSOLVER and cuBLAS through ``cupy.linalg`` and
``cupyx.scipy.linalg``.

The batched routines (``inv``, ``cholesky``, ``qr``, ``svd``, ``eigh``, ``solve``,
``det``, ``slogdet``, ``pinv``) take the whole stack in one call; ``getrf`` (LU) and
``trsm`` (triangular solves and inverses) go one matrix at a time as CuPy exposes them.
The kernels return the shapes and dtypes of the CPU kernels
(:mod:`lazyx.backends.cpu.kernels.linalg`, whose ``Eig`` and ``LUF`` kernels they
share, built over CuPy), and raise the same :class:`~lazyx.errors.LinAlgError` for
singular and indefinite matrices: CuPy checks cuSOLVER's ``info`` under
``cupyx.errstate(linalg="raise")`` and lazyx checks that finite input gave finite
output (one device synchronisation, the price of an error at the call), the
triangular ones check for zeros on the diagonal. ``eig`` needs CuPy's ``cupy.linalg.eig`` (cuSOLVER ``Xgeev``,
CUDA 12.6 and later); without it the kernel says so instead of computing on the host.
"""

from __future__ import annotations

import cupy as cp
import cupyx
import cupyx.scipy.linalg as csl
import numpy as np

from lazyx.backends.cpu.kernels import linalg as np_linalg
from lazyx.errors import HostOnlyKernelError, LinAlgError
from lazyx.plugins import linalg as la


def _checked(what: str, fn):
    """``fn(p, ins)`` with a failed factorization raised as :class:`LinAlgError`.

    CuPy raises ``LinAlgError`` for a nonzero cuSOLVER/cuBLAS ``info`` only under
    ``cupyx.errstate(linalg="raise")`` (it reads the info back: one synchronisation);
    ``info`` flags an exact zero pivot (or a non-positive one in Cholesky), while a
    pivot that rounding left tiny instead of zero gives infinities or NaNs without a
    flag. So the result is checked too: finite input, non-finite output is the same
    failure, found in the same synchronisation."""
    def kernel(p, ins):
        a = ins[0]
        try:
            with cupyx.errstate(linalg="raise"):
                out = fn(p, ins)
            finite = cp.isfinite(a).all()
            for x in ins[1:]:
                finite &= cp.isfinite(x).all()
            failed = bool(finite & ~cp.isfinite(out).all())
        except np.linalg.LinAlgError:
            failed = True
        if failed:
            raise LinAlgError(f"[{p.name}] {what} (input of shape {a.shape}, dtype "
                              f"{a.dtype}).") from None
        return out
    return kernel


def _per_matrix(fn, a, *more):
    return np_linalg.per_matrix(fn, a, *more, xp=cp)


def _nonsingular_triangle(p, a):
    if a.size and bool(cp.any(cp.diagonal(a, 0, -2, -1) == 0)):
        raise LinAlgError(f"[{p.name}] The triangular matrix is singular (a zero on its "
                          f"diagonal) (input of shape {a.shape}, dtype {a.dtype}).")


def _inverse(p, ins):
    a = ins[0]
    if p.structure == "general":
        return cp.linalg.inv(a)
    lower = p.structure == "lower"
    _nonsingular_triangle(p, a)
    if a.size == 0:
        return cp.zeros_like(a)
    eye = cp.eye(a.shape[-1], dtype=a.dtype)
    inv = _per_matrix(lambda m: csl.solve_triangular(m, eye, lower=lower), a)
    return cp.tril(inv) if lower else cp.triu(inv)


def _cholesky(p, ins):
    a = ins[0]
    if p.upper:
        return cp.ascontiguousarray(cp.swapaxes(cp.linalg.cholesky(cp.swapaxes(a, -1, -2)), -1, -2))
    return cp.linalg.cholesky(a)


def _no_eig(p, ins):
    raise HostOnlyKernelError(
        f"[{p.name}] linalg.eig needs cupy.linalg.eig (CuPy 14 with CUDA 12.6 or later); "
        f"this CuPy has none. Run it on the CPU: stream=lazyx.core.cpu.")


def _getrf(a):
    return _per_matrix(lambda x: csl.lu_factor(x, check_finite=False), a)


def _qr(p, ins):
    return tuple(cp.linalg.qr(ins[0], mode="reduced"))


def _phase(v, axis):
    """The unit phase (the sign, for real ``v``) of each vector's entry of largest
    magnitude along ``axis``, 1 for a zero vector; ``axis`` kept with size 1."""
    i = cp.expand_dims(cp.argmax(cp.abs(v), axis=axis), axis)
    x = cp.take_along_axis(v, i, axis=axis)
    mag = cp.abs(x)
    return cp.where(mag == 0, 1, x / cp.where(mag == 0, 1, mag)).astype(v.dtype, copy=False)


# cuSOLVER's batched routines (Jacobi: syevjBatched, gesvdjBatched) and its one-matrix
# ones (syevd, gesvd), which CuPy picks by the input's rank, choose different signs for
# the same vectors, so a vmap would disagree with a loop. Each vector is scaled so that
# its entry of largest magnitude is real and positive: one answer, however it was batched.
def _svd(p, ins):
    a = ins[0]
    if not p.compute_uv:
        return cp.linalg.svd(a, compute_uv=False)
    u, s, vt = cp.linalg.svd(a, full_matrices=True)
    if u.size == 0 or vt.size == 0:
        return u, s, vt
    k = s.shape[-1]
    c = _phase(u, -2)  # (..., 1, m): U's column j becomes u_j conj(c_j) ...
    d = _phase(vt, -1)  # (..., n, 1)
    d[..., :k, :] = cp.conj(cp.swapaxes(c[..., :, :k], -1, -2))  # ... and Vt's row j c_j v_j
    return u * cp.conj(c), s, vt * cp.conj(d)


def _eigh(p, ins):
    a = ins[0]
    if not p.compute_eigenvectors:
        return cp.linalg.eigvalsh(a, UPLO=p.uplo)
    w, v = cp.linalg.eigh(a, UPLO=p.uplo)
    return w, (v * cp.conj(_phase(v, -2)) if v.size else v)


def _solve(p, ins):
    a, b = np_linalg.broadcast_batches(*ins, xp=cp)
    return cp.linalg.solve(a, b)


def _solve_triangular(p, ins):
    a, b = np_linalg.broadcast_batches(*ins, xp=cp)
    _nonsingular_triangle(p, a)
    if a.size == 0 or b.size == 0:
        return cp.zeros(b.shape, b.dtype)
    return _per_matrix(lambda x, y: csl.solve_triangular(x, y, lower=not p.upper), a, b)


# Half precision computed in float32: the CPU kernels' wrapper (astype works on CuPy arrays).
_widened = np_linalg._widened


KERNELS = {
    la.Inverse: _checked("The matrix is singular and has no inverse", _inverse),
    la.Cholesky: _checked("The matrix is not positive definite", _cholesky),
    la.QR: _qr,
    la.SVD: _svd,
    la.Eigh: _eigh,
    la.Eig: np_linalg.eig_kernel(cp.linalg) if hasattr(cp.linalg, "eig") else _no_eig,
    la.LUF: np_linalg.lu_kernel(_getrf, cp, cp.asnumpy),
    la.Solve: _checked("The matrix is singular: the system has no unique solution", _solve),
    la.SolveTriangular: _solve_triangular,
    la.Det: _widened(cp.linalg.det),
    la.SlogDet: _widened(lambda a: tuple(cp.linalg.slogdet(a))),
    # NumPy's cutoff (max(M, N) * eps of the dtype); CuPy's default, 1e-15, keeps the
    # float32 noise of a singular matrix as huge values.
    la.Pinv: lambda p, ins: cp.linalg.pinv(
        ins[0], rcond=max(ins[0].shape[-2:]) * float(cp.finfo(ins[0].dtype).eps)),
}
