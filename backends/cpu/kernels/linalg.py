"""LAPACK kernels of the linalg op pack (SciPy's LAPACK wrappers and ``numpy.linalg``).

Every factorization is LAPACK, never a hand-written loop of arithmetic. The ones the
benchmarks measure (``inv``, ``solve``, ``cholesky``, ``qr``, ``svd``) call SciPy's
LAPACK wrappers (``scipy.linalg.lapack``) directly, one matrix at a time, on memory
the kernel owns: a C-ordered matrix is its transpose in Fortran order, so LAPACK works
on ``A^T`` in place where the algebra allows (``inv(A^T)^T = inv(A)``, ``A = L L^H``
from the upper factor of ``A^T``, the SVD of ``A^T`` transposed back) and the only
copy is the one LAPACK must overwrite (``qr`` copies into Fortran order, ``solve`` factors ``A^T``). That skips
``numpy.linalg``'s copies into and out of Fortran order and SciPy's input checks;
``numpy.linalg``'s batched gufuncs serve the rest (eigen-decompositions, determinants,
pseudo-inverse). They run on the calling thread with the BLAS/LAPACK SciPy links,
multi-threaded as its own calls are. Where ``lazyx[mkl]`` is installed, the real ``qr``
of a matrix from :data:`MKL_QR_MIN` rows and columns runs on MKL's LAPACK instead
(:func:`_qr_mkl`): OpenBLAS carries reference LAPACK's Householder QR, MKL a faster one.

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

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
from scipy.linalg import lapack

from lazyx.errors import LinAlgError
from lazyx.plugins import linalg as la

_F32 = np.dtype(np.float32)
_C64 = np.dtype(np.complex64)
_U32 = np.dtype(np.uint32)

_routines: dict = {}
_workspaces: dict = {}

#: Cores a batch of matrices is split over (see :func:`_over_batch`).
WORKERS = os.cpu_count() or 1
_pool: list = []
_controller: list = []
_blas_lock = threading.Lock()
_blas_users = 0
_blas_limiter = None


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


def _blas_limit():
    """threadpoolctl's controller of the BLAS libraries loaded, made on first use (it
    scans them: ~15 ms); None where it fails (a dependency, but a BLAS it cannot
    control must not stop a factorization: the batch then runs on one thread)."""
    if not _controller:
        try:
            import threadpoolctl  # a scan of the loaded libraries: only when a batch needs it
            _controller.append(threadpoolctl.ThreadpoolController())
        except Exception:  # noqa: BLE001 - missing or failing: batches stay on one thread
            _controller.append(None)
    return _controller[0]


@contextmanager
def _one_blas_thread():
    """BLAS at one thread while any kernel runs a batch split over the cores, restored
    when the last one leaves (the setting is the process's, so it is counted)."""
    global _blas_users, _blas_limiter
    with _blas_lock:
        if _blas_users == 0:
            _blas_limiter = _blas_limit().limit(limits=1, user_api="blas")
        _blas_users += 1
    try:
        yield
    finally:
        with _blas_lock:
            _blas_users -= 1
            if _blas_users == 0:
                _blas_limiter.restore_original_limits()


def _over_batch(fn, count: int) -> None:
    """``fn(lo, hi)`` over chunks of ``range(count)``, one a core (the calling thread
    takes the first), with BLAS at one thread: a batch of small matrices runs LAPACK
    once per matrix, and a core a matrix beats BLAS's threads inside one (its
    threads spin on matrices of 64x64 and on a shared machine). ``fn`` must call code
    that lets go of the GIL."""
    workers = min(WORKERS, count)
    bounds = [count * i // workers for i in range(workers + 1)]
    with _one_blas_thread():
        if workers == 1:
            fn(0, count)
            return
        if not _pool:
            _pool.append(ThreadPoolExecutor(WORKERS - 1, thread_name_prefix="lazyx-linalg"))
        rest = [_pool[0].submit(fn, lo, hi) for lo, hi in zip(bounds[1:-1], bounds[2:])]
        try:
            fn(bounds[0], bounds[1])
        finally:
            for f in rest:  # wait for every chunk (they write into the outputs) ...
                f.exception()
        for f in rest:      # ... then raise the first error, if any
            f.result()


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


def _keep(place, got) -> None:
    """``got`` into ``place``, where a wrapper asked to overwrite ``place`` returned a
    copy instead (SciPy's wrappers copy a matrix of a batch whose address they deem
    misaligned): in place, nothing to do."""
    if not np.shares_memory(place, got):
        place[...] = got


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
        _, _, got, info = gesv(m.T, x.T, overwrite_b=True)
        if info > 0:
            raise _failed(p, a, "The matrix is singular and has no inverse")
        _keep(x.T, got)
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
        got, info = potrf(m.T, lower=p.upper, clean=True, overwrite_a=True)
        if info > 0:
            raise _failed(p, a, "The matrix is not positive definite")
        _keep(m.T, got)
    return out


def _qr(p, ins):
    a = ins[0]
    *batch, m, n = a.shape
    k = min(m, n)
    if a.size == 0:
        return np.empty((*batch, m, k), a.dtype), np.empty((*batch, k, n), a.dtype)
    if k >= MKL_QR_MIN and a.dtype.kind == "f" and _mkl_lapack("gelqf", a.dtype) is not None:
        return _qr_mkl(a, m, n, k)
    # Each matrix in Fortran order (C order of A^T): geqrf packs R and the reflectors
    # there, orgqr turns the first K columns into Q in place.
    f = np.swapaxes(a, -1, -2).copy()
    r = np.zeros((*batch, k, n), a.dtype)
    geqrf, orgqr = _lapack("geqrf", f), _lapack("orgqr", f)
    work = _lwork("geqrf_lwork", f, m, n)  # n * block size: enough for orgqr's k columns too
    upper = _upper_mask(k, n)
    q = np.empty((*batch, m, k), a.dtype)
    for x, ri, qi in zip(_matrices(f), _matrices(r), _matrices(q)):
        # The results as returned: SciPy's wrappers work on a copy (not in place) when a
        # matrix of the batch starts at an address they deem misaligned.
        h, tau, _, _ = geqrf(x.T, lwork=work, overwrite_a=True)
        np.copyto(ri, h[:k], where=upper)  # R: its triangle into zeros, in one pass
        qi[...], _, _ = orgqr(h[:, :k], tau, lwork=work, overwrite_a=True)
    return q, r


#: The smallest ``min(M, N)`` whose QR goes to MKL: below it, MKL's threads cost more
#: than its blocked QR saves (a batch of 64x64 matrices is faster on OpenBLAS).
MKL_QR_MIN = 128

#: Intel MKL's runtime library (``libmkl_rt``, the ``mkl`` package that ``lazyx[mkl]``
#: installs), loaded on first use; [None] where it is not installed.
_mkl_rt: list = []


def _mkl_lapack(name: str, dtype):
    """MKL's LAPACK routine ``name`` for ``dtype`` as a ctypes function (every argument
    a pointer; ctypes lets go of the GIL), or None without MKL. MKL's Householder QR
    runs 1.5x faster than the reference-LAPACK one SciPy's OpenBLAS carries (512x512,
    benchmarks/linalg.py), so ``qr`` takes it where it is installed."""
    if not _mkl_rt:
        _mkl_rt.append(_load_mkl())
    lib = _mkl_rt[0]
    return None if lib is None else getattr(lib, _PREFIX[dtype.char] + name + "_", None)


def _load_mkl():
    import ctypes  # only with MKL's QR: the first qr pays the import
    from importlib import metadata
    try:
        files = metadata.distribution("mkl").files or ()
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name.startswith("libmkl_rt.so") or f.name == "mkl_rt.2.dll":
            try:
                return ctypes.CDLL(str(f.locate()))
            except OSError:
                return None
    return None


def _qr_mkl(a, m: int, n: int, k: int):
    """The reduced QR of each real matrix through MKL, with no transposing copy: a
    C-ordered copy of ``A`` is ``A^T`` in Fortran order, whose LQ factorization
    ``A^T = L Q'`` (``gelqf``) is ``A = Q'^T L^T`` -- the same Householder reflectors
    as ``geqrf`` on ``A``, so the same signs. ``R = L^T`` is then the C order of the
    buffer's upper part, and ``orglq`` leaves ``Q'`` (``k`` rows, Fortran order) there:
    ``Q = Q'^T``, the buffer's first ``k`` columns in C order."""
    import ctypes  # loaded by _mkl_lapack

    gelqf, orglq = _mkl_lapack("gelqf", a.dtype), _mkl_lapack("orglq", a.dtype)
    c = np.array(a, order="C")
    cs = _matrices(c)
    batch = a.shape[:-2]
    q = np.empty((*batch, m, k), a.dtype)
    r = np.zeros((*batch, k, n), a.dtype)
    ref, ptr, I = ctypes.byref, ctypes.c_void_p, ctypes.c_int
    rows, cols, kk, info = I(n), I(m), I(k), I(0)
    tau = np.empty(k, a.dtype)
    lwork = _workspaces.get(("mkl-lq", a.dtype.char, m, n))
    if lwork is None:
        query = np.empty(2, a.dtype)
        gelqf(ref(rows), ref(cols), ptr(cs.ctypes.data), ref(rows), ptr(tau.ctypes.data),
              ptr(query.ctypes.data), ref(I(-1)), ref(info))
        orglq(ref(kk), ref(cols), ref(kk), ptr(cs.ctypes.data), ref(rows),
              ptr(tau.ctypes.data), ptr(query[1:].ctypes.data), ref(I(-1)), ref(info))
        lwork = _workspaces[("mkl-lq", a.dtype.char, m, n)] = max(1, int(query.max()))
    work = np.empty(lwork, a.dtype)
    lw = I(lwork)
    upper = _upper_mask(k, n)
    for x, ri, qi in zip(cs, _matrices(r), _matrices(q)):
        gelqf(ref(rows), ref(cols), ptr(x.ctypes.data), ref(rows), ptr(tau.ctypes.data),
              ptr(work.ctypes.data), ref(lw), ref(info))
        np.copyto(ri, x[:k], where=upper)  # L^T: the buffer's upper part, row by row
        orglq(ref(kk), ref(cols), ref(kk), ptr(x.ctypes.data), ref(rows),
              ptr(tau.ctypes.data), ptr(work.ctypes.data), ref(lw), ref(info))
        qi[...] = x[:, :k]
    return q, r


def _upper_mask(k: int, n: int):
    """True on and above the diagonal of a ``k`` by ``n`` matrix (kept for the size)."""
    key = ("triu", k, n)
    mask = _workspaces.get(key)
    if mask is None:
        mask = _workspaces[key] = np.triu(np.ones((k, n), bool))
    return mask


def _raw_lapack(name: str, dtype):
    """LAPACK routine ``name`` for ``dtype`` as a ctypes function that releases the GIL
    while it runs: the pointer SciPy exports for Cython (``scipy.linalg.cython_lapack``,
    the same library as :func:`_lapack`'s wrappers), every argument a pointer. None
    where SciPy does not export it."""
    key = ("raw", name, dtype.char)
    if key not in _routines:
        fn = None
        try:
            import ctypes  # only for batches: the first call pays the import

            from scipy.linalg import cython_lapack
            capsule = cython_lapack.__pyx_capi__[_PREFIX[dtype.char] + name]
            api = ctypes.pythonapi
            api.PyCapsule_GetName.restype, api.PyCapsule_GetName.argtypes = \
                ctypes.c_char_p, [ctypes.py_object]
            api.PyCapsule_GetPointer.restype, api.PyCapsule_GetPointer.argtypes = \
                ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
            address = api.PyCapsule_GetPointer(capsule, api.PyCapsule_GetName(capsule))
            fn = ctypes.CFUNCTYPE(None)(address)  # argtypes unset: pointers pass as given
        except Exception:  # noqa: BLE001 - no export: the caller takes SciPy's wrapper
            fn = None
        _routines[key] = fn
    return _routines[key]


#: LAPACK's letter of each NumPy dtype character.
_PREFIX = {"f": "s", "d": "d", "F": "c", "D": "z"}


def _gesdd_chunk(p, a, gesdd, xs, ss, us, vts, lo: int, hi: int) -> None:
    """The SVDs of matrices ``xs[lo:hi]`` (C order, overwritten) through the raw
    ``gesdd``: values into ``ss``, and ``U``/``Vt`` into ``us``/``vts`` unless they are
    None. Each C-ordered matrix is ``A^T`` in Fortran order, and ``A^T = U' S V'^H``
    gives ``A``'s ``U`` as the C order of the ``V'^H`` LAPACK writes and ``Vt`` as that
    of ``U'``: LAPACK writes the outputs where they belong, without a copy."""
    import ctypes  # already imported by _raw_lapack

    m, n = xs.shape[-2:]
    k = min(m, n)
    ref, ptr = ctypes.byref, ctypes.c_void_p
    dt = xs.dtype
    jobz = ctypes.c_char(b"A" if us is not None else b"N")
    rows, cols, info = ctypes.c_int(n), ctypes.c_int(m), ctypes.c_int(0)
    iwork = np.empty(8 * k, np.intc)
    rwork = None
    if dt.kind == "c":  # LAPACK 3.7's bound, and 3.6's for jobz='N'
        rwork = np.empty(max(7 * k, 5 * k * k + 5 * k, 2 * max(m, n) * k + 2 * k * k + k),
                         ss.dtype)
    one = ctypes.c_int(1)
    uv = us is not None
    ldu, ldvt = (rows, cols) if uv else (one, one)

    def call(x, s, u, v, work, lwork):
        args = [ref(jobz), ref(rows), ref(cols), ptr(x), ref(rows), ptr(s), ptr(u), ref(ldu),
                ptr(v), ref(ldvt), ptr(work), ref(lwork)]
        if rwork is not None:
            args.append(ptr(rwork.ctypes.data))
        gesdd(*args, ptr(iwork.ctypes.data), ref(info))

    query = np.empty(1, dt)  # the workspace query's answer, and the unused factors' place
    x0, sb, dummy = xs.ctypes.data, ss.ctypes.data, query.ctypes.data
    call(x0, sb, dummy, dummy, dummy, ctypes.c_int(-1))
    work = np.empty(max(1, int(query[0].real)), dt)
    lwork, w = ctypes.c_int(work.size), work.ctypes.data
    sx, sst = xs.strides[0], ss.strides[0]
    ub, su = (us.ctypes.data, us.strides[0]) if uv else (dummy, 0)
    vb, sv = (vts.ctypes.data, vts.strides[0]) if uv else (dummy, 0)
    for i in range(lo, hi):
        # LAPACK's U' (N x N in Fortran order) is Vt in C order, its V'^H is U.
        call(x0 + i * sx, sb + i * sst, vb + i * sv, ub + i * su, w, lwork)
        if info.value != 0:
            raise _failed(p, a, "The SVD did not converge")


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
    uv = int(p.compute_uv)
    xs, ss = _matrices(c), s.reshape(-1, k)
    if uv:
        us, vts = u.reshape(-1, m, m), vt.reshape(-1, n, n)
    raw = None
    if xs.shape[0] > 1 and _blas_limit() is not None:
        raw = _raw_lapack("gesdd", c.dtype)
    if raw is not None:
        # A batch: one chunk of matrices a core, each through the same LAPACK routine
        # as below (so the same signs) called without the GIL, which SciPy's wrapper of
        # gesdd holds, on a copy it may overwrite; the factors land in u and vt in place.
        xs = _matrices(np.array(a, order="C"))
        _over_batch(lambda lo, hi: _gesdd_chunk(p, a, raw, xs, ss, us if uv else None,
                                                vts if uv else None, lo, hi), xs.shape[0])
        return (u, s, vt) if p.compute_uv else s
    gesdd = _lapack("gesdd", c)
    work = _lwork("gesdd_lwork", c, n, m, compute_uv=uv, full_matrices=1)
    for i, x in enumerate(xs):
        # x.T is A^T in Fortran order: A^T = U' S V'  means  A = V'^T S U'^T.
        u2, s2, v2, info = gesdd(x.T, compute_uv=uv, full_matrices=1, lwork=work)
        if info > 0:
            raise _failed(p, a, "The SVD did not converge")
        ss[i] = s2
        if uv:
            us[i], vts[i] = v2.T, u2.T
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
    # A C-ordered copy of A is A^T in Fortran order: getrf factors it in place, and
    # getrs solves (A^T)^T X = B with it. A plain copy is a memcpy, where copying A into
    # Fortran order is a transpose as slow as a fifth of the factorization.
    lu = np.array(a, order="C")
    x = np.empty(b.shape, b.dtype)
    getrf, getrs = _lapack("getrf", lu), _lapack("getrs", lu)
    for m, y, out in zip(_matrices(lu), _matrices(b), _matrices(x)):
        f, piv, info = getrf(m.T, overwrite_a=True)
        if info > 0:
            raise _failed(p, a, "The matrix is singular: the system has no unique solution")
        out[...], _ = getrs(f, piv, y, trans=1)
    return x


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
