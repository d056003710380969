"""CuPy kernels of the linalg op pack: cuSOLVER and cuBLAS through ``cupy.linalg`` and
``cupyx.scipy.linalg``.

The batched routines (``inv``, ``cholesky``, ``qr``, ``svd``, ``eigh``, ``solve``,
``det``, ``slogdet``, ``pinv``) take the whole stack in one call; ``getrf`` (LU) and
``trsm`` (triangular solves and inverses) go one matrix at a time as CuPy exposes them.
The kernels return the shapes and dtypes of the NumPy kernels
(:mod:`lazyx.backends.cpu.kernels.linalg`), and raise the same
:class:`~lazyx.errors.LinAlgError` for singular and indefinite matrices: CuPy checks
cuSOLVER's ``info`` under ``cupyx.errstate(linalg="raise")`` (one device
synchronisation, the price of an error at the call), the triangular ones check for
zeros on the diagonal. ``eig`` needs CuPy's ``cupy.linalg.eig`` (cuSOLVER ``Xgeev``,
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

_C64 = np.dtype(np.complex64)
_U32 = np.dtype(np.uint32)


def _checked(what: str, fn):
    """``fn(p, ins)`` with cuSOLVER's failures raised as :class:`LinAlgError`."""
    def kernel(p, ins):
        try:
            with cupyx.errstate(linalg="raise"):
                return fn(p, ins)
        except np.linalg.LinAlgError:
            a = ins[0]
            raise LinAlgError(f"[{p.name}] {what} (input of shape {a.shape}, dtype "
                              f"{a.dtype}).") from None
    return kernel


def _per_matrix(fn, a, *more):
    batch = a.shape[:-2]
    if not batch:
        return fn(a, *more)
    flat = [x.reshape((-1,) + x.shape[-2:]) for x in (a, *more)]
    outs = [fn(*(x[i] for x in flat)) for i in range(flat[0].shape[0])]
    if isinstance(outs[0], tuple):
        return tuple(cp.stack(o).reshape(batch + o[0].shape) for o in zip(*outs))
    return cp.stack(outs).reshape(batch + outs[0].shape)


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


def _eig(p, ins):
    a = ins[0]
    eig = getattr(cp.linalg, "eig", None)
    if eig is None:
        raise HostOnlyKernelError(
            f"[{p.name}] linalg.eig needs cupy.linalg.eig (CuPy 14 with CUDA 12.6 or later); "
            f"this CuPy has none. Run it on the CPU: stream=lazyx.core.cpu.")
    if p.compute_eigenvectors:
        w, v = eig(a)
        return w.astype(_C64, copy=False), v.astype(_C64, copy=False)
    return cp.linalg.eigvals(a).astype(_C64, copy=False)


def _luf(p, ins):
    a = ins[0]
    m, n = a.shape[-2:]
    k = min(m, n)
    if a.size == 0:
        lu, piv = cp.zeros_like(a), cp.zeros(a.shape[:-2] + (k,), cp.int32)
    else:
        lu, piv = _per_matrix(lambda x: csl.lu_factor(x, check_finite=False), a)
    # The row permutation from the pivots: K swaps per matrix, on the host (K numbers).
    host = cp.asnumpy(piv).reshape(-1, k)
    perm = np.broadcast_to(np.arange(m), (host.shape[0], m)).copy()
    rows = np.arange(host.shape[0])
    for i in range(k):
        j = host[:, i]
        perm[rows, i], perm[rows, j] = perm[rows, j], perm[rows, i].copy()
    inv = np.empty_like(perm)
    np.put_along_axis(inv, perm, np.arange(m)[None, :], axis=1)
    return (cp.ascontiguousarray(lu), piv.astype(_U32),
            cp.asarray(inv.reshape(a.shape[:-2] + (m,)).astype(_U32)))


def _broadcast(a, b):
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return cp.broadcast_to(a, batch + a.shape[-2:]), cp.broadcast_to(b, batch + b.shape[-2:])


def _solve(p, ins):
    a, b = _broadcast(*ins)
    return cp.linalg.solve(a, b)


def _solve_triangular(p, ins):
    a, b = _broadcast(*ins)
    _nonsingular_triangle(p, a)
    if a.size == 0 or b.size == 0:
        return cp.zeros(b.shape, b.dtype)
    return _per_matrix(lambda x, y: csl.solve_triangular(x, y, lower=not p.upper), a, b)


# Half precision computed in float32: the CPU kernels' wrapper (astype works on CuPy arrays).
_widened = np_linalg._widened


KERNELS = {
    la.Inverse: _checked("The matrix is singular and has no inverse", _inverse),
    la.Cholesky: _checked("The matrix is not positive definite", _cholesky),
    # QR, SVD and Eigh: the NumPy kernels dispatch to cupy.linalg as written.
    la.QR: np_linalg.KERNELS[la.QR],
    la.SVD: np_linalg.KERNELS[la.SVD],
    la.Eigh: np_linalg.KERNELS[la.Eigh],
    la.Eig: _eig,
    la.LUF: _luf,
    la.Solve: _checked("The matrix is singular: the system has no unique solution", _solve),
    la.SolveTriangular: _solve_triangular,
    la.Det: _widened(cp.linalg.det),
    la.SlogDet: _widened(lambda a: tuple(cp.linalg.slogdet(a))),
    la.Pinv: lambda p, ins: cp.linalg.pinv(ins[0]),
}
