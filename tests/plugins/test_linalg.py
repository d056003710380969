"""``lazyx.core.linalg`` against NumPy/SciPy float64 references.

Values (batched over leading axes), result dtypes, the errors for bad input (named op,
argument and shape), singular matrices at evaluation, and a few transform checks on
top of the registry-wide rule test (tests/transforms/test_every_primitive.py), which
checks every linalg primitive's vjp, jvp and vmap on the pack's examples.
"""

import numpy as np
import pytest
import scipy.linalg as sl

import lazyx.core as mx
from helpers import assert_close, check_vjp_fd, check_vmap_loop, to_lazyx
from lazyx.errors import ArgumentError, AxisError, DtypeError, LinAlgError, ShapeError

L = mx.linalg
GEN = np.random.default_rng(7)


def _square(*shape):
    """Well-conditioned square matrices of shape ``(*batch, n, n)`` for ``shape = (*batch, n)``."""
    *batch, n = shape
    return GEN.standard_normal((*batch, n, n)) + 2 * n ** 0.5 * np.eye(n)


def _spd(*shape):
    """Symmetric positive definite matrices of shape ``(*batch, n, n)``."""
    *batch, n = shape
    x = GEN.standard_normal((*batch, n, n))
    return x @ np.swapaxes(x, -1, -2) + n * np.eye(n)


def _close(got, want, dtype="float64", **kw):
    if isinstance(got, np.ndarray):
        got = to_lazyx(got)
    assert_close(got, np.asarray(want), dtype=getattr(mx, dtype), **kw)


BATCHES = [(), (2,), (2, 3)]


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_inverse_solve_det(batch, dtype):
    a = _square(*batch, 4)
    b = GEN.standard_normal(batch + (4, 2))
    x = mx.array(a, dtype=getattr(mx, dtype))
    tol = dict(rtol=2e-4, atol=2e-5) if dtype == "float32" else {}
    out = L.inv(x)
    assert out.dtype == getattr(mx, dtype) and out.shape == a.shape
    _close(out, np.linalg.inv(a), dtype, **tol)
    _close(L.solve(x, mx.array(b, dtype=getattr(mx, dtype))), np.linalg.solve(a, b), dtype, **tol)
    _close(L.det(x), np.linalg.det(a), dtype, **tol)
    sign, logdet = L.slogdet(x)
    ws, wl = np.linalg.slogdet(a)
    _close(sign, ws, dtype)
    _close(logdet, wl, dtype, **tol)
    _close(L.pinv(x), np.linalg.pinv(a), dtype, **tol)


def test_solve_vector_and_broadcast_batches():
    a, b = _square(3, 4), GEN.standard_normal(4)
    _close(L.solve(to_lazyx(a), to_lazyx(b)), np.linalg.solve(a, b[:, None])[..., 0])
    a2, b2 = _square(4), GEN.standard_normal((2, 3, 4, 5))
    _close(L.solve(to_lazyx(a2), to_lazyx(b2)), np.linalg.solve(a2, b2))
    # Integer b promotes with a float32 a to float32, as in MLX.
    out = L.solve(mx.array(a2, dtype=mx.float32), mx.array([1, 2, 3, 4]))
    assert out.dtype == mx.float32


@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("batch", [(), (3,)])
def test_triangular(upper, batch):
    a = _square(*batch, 4)
    tri = np.triu(a) if upper else np.tril(a)
    b = GEN.standard_normal(batch + (4, 3))
    # Only the named triangle is read: the full matrix gives the triangle's results.
    _close(L.tri_inv(to_lazyx(a), upper=upper), np.linalg.inv(tri))
    _close(L.solve_triangular(to_lazyx(a), to_lazyx(b), upper=upper), np.linalg.solve(tri, b))
    if not batch:  # a 1-D b is one vector
        _close(L.solve_triangular(to_lazyx(a), to_lazyx(b[..., 0]), upper=upper),
               np.linalg.solve(tri, b[..., :1])[..., 0])


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_and_cholesky_inv(upper):
    s = _spd(2, 4)
    c = L.cholesky(to_lazyx(s), upper=upper)
    want = np.linalg.cholesky(s)
    _close(c, np.swapaxes(want, -1, -2) if upper else want)
    _close(L.cholesky_inv(c, upper=upper), np.linalg.inv(s))
    # The lower factor reads the lower triangle, the upper one the upper triangle.
    junk = np.triu(GEN.standard_normal((4, 4)), 1)
    s0 = s[0] + (junk.T if upper else junk)
    _close(L.cholesky(to_lazyx(s0), upper=upper), L.cholesky(to_lazyx(s[0]), upper=upper))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m,n", [(7, 5), (5, 7), (3, 3), (5, 5), (1, 3)])
def test_every_matrix_of_a_batch_of_odd_sizes(m, n, dtype):
    # Matrices of a float32 batch start at addresses SciPy's LAPACK wrappers take as
    # misaligned: they then factor a copy, and the kernels must use what they return.
    a = GEN.standard_normal((3, m, n)).astype(dtype)
    q, r = L.qr(mx.array(a))
    want_q, want_r = np.linalg.qr(a.astype(np.float64))
    assert_close(q, want_q, rtol=1e-4, atol=1e-4)
    assert_close(r, want_r, rtol=1e-4, atol=1e-4)
    if m == n:
        sq = (a + 4 * np.eye(n)).astype(dtype)
        spd = (sq @ np.swapaxes(sq, -1, -2) + np.eye(n)).astype(dtype)
        b = GEN.standard_normal((3, n, 2)).astype(dtype)
        assert_close(L.inv(mx.array(sq)), np.linalg.inv(sq.astype(np.float64)), rtol=1e-4, atol=1e-4)
        assert_close(L.cholesky(mx.array(spd)), np.linalg.cholesky(spd.astype(np.float64)),
                     rtol=1e-4, atol=1e-4)
        assert_close(L.solve(mx.array(sq), mx.array(b)),
                     np.linalg.solve(sq.astype(np.float64), b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5), (2, 4, 3)])
def test_qr_svd_lu_shapes_and_reconstruction(shape):
    a = GEN.standard_normal(shape)
    m, n = shape[-2:]
    k = min(m, n)
    q, r = L.qr(to_lazyx(a))
    assert q.shape == shape[:-2] + (m, k) and r.shape == shape[:-2] + (k, n)
    _close(mx.matmul(q, r), a)
    _close(np.triu(np.array(r)), np.array(r))
    u, s, vt = L.svd(to_lazyx(a))
    assert u.shape == shape[:-2] + (m, m) and vt.shape == shape[:-2] + (n, n)
    _close(s, np.linalg.svd(a, compute_uv=False))
    _close(L.svd(to_lazyx(a), compute_uv=False), np.linalg.svd(a, compute_uv=False))
    us = np.array(u)[..., :, :k] * np.array(s)[..., None, :]
    _close(us @ np.array(vt)[..., :k, :], a)
    p, low, up = L.lu(to_lazyx(a))
    assert p.dtype == mx.uint32 and p.shape == shape[:-1]
    rebuilt = np.take_along_axis(np.array(low) @ np.array(up), np.array(p)[..., None].astype(int), -2)
    _close(rebuilt, a)
    for i in np.ndindex(*shape[:-2]):
        lu_ref, piv_ref = sl.lu_factor(a[i])
        lu, piv = L.lu_factor(to_lazyx(a[i]))
        _close(lu, lu_ref)
        np.testing.assert_array_equal(np.array(piv), piv_ref)
        np.testing.assert_array_equal(np.array(p)[i], sl.lu(a[i], p_indices=True)[0])


def test_eigen():
    s = _spd(3, 4)
    for uplo in ("L", "U"):
        w, v = L.eigh(to_lazyx(s), UPLO=uplo)
        _close(w, np.linalg.eigvalsh(s))
        _close(np.array(v) * np.array(w)[..., None, :], s @ np.array(v))
        _close(L.eigvalsh(to_lazyx(s), UPLO=uplo), np.linalg.eigvalsh(s))
    a = GEN.standard_normal((2, 4, 4))
    w, v = L.eig(to_lazyx(a))
    assert w.dtype == mx.complex64 and v.dtype == mx.complex64
    wn, vn = np.array(w), np.array(v)
    np.testing.assert_allclose(a @ vn, vn * wn[..., None, :], atol=1e-4)
    np.testing.assert_allclose(np.sort_complex(np.array(L.eigvals(to_lazyx(a))).ravel()),
                               np.sort_complex(np.linalg.eigvals(a).ravel()), atol=1e-4)
    h = s[:2] + 1j * (a - np.swapaxes(a, -1, -2))  # Hermitian
    wc = L.eigvalsh(mx.array(h.astype(np.complex64)))
    assert wc.dtype == mx.float32
    np.testing.assert_allclose(np.array(wc), np.linalg.eigvalsh(h), rtol=1e-4, atol=1e-4)


ORDS = [None, 0, 1, -1, 2, -2, 3, 0.5, np.inf, -np.inf]


@pytest.mark.parametrize("ord", ORDS)
def test_vector_norms(ord):
    x = GEN.standard_normal((3, 5))
    for axis in (0, 1, -1):
        for keepdims in (False, True):
            _close(L.norm(to_lazyx(x), ord, axis, keepdims),
                   np.linalg.norm(x, ord, axis, keepdims))


@pytest.mark.parametrize("ord", [None, "fro", "nuc", 1, -1, 2, -2, np.inf, -np.inf])
def test_matrix_norms(ord):
    x = GEN.standard_normal((2, 3, 4))
    for axis in ((1, 2), (2, 1), (0, 2)):
        for keepdims in (False, True):
            _close(L.norm(to_lazyx(x), ord, axis, keepdims),
                   np.linalg.norm(x, ord, axis, keepdims))
    _close(L.norm(to_lazyx(x[0]), ord), np.linalg.norm(x[0], ord))


def test_norm_defaults_and_dtypes():
    x = GEN.standard_normal((2, 3, 4))
    _close(L.norm(to_lazyx(x)), np.linalg.norm(x.ravel()))
    assert L.norm(to_lazyx(x), keepdims=True).shape == (1, 1, 1)
    assert L.norm(mx.array([3, 4])).dtype == mx.float32
    assert L.norm(mx.array([3.0, 4.0], dtype=mx.float16)).dtype == mx.float16
    c = L.norm(mx.array(np.array([3 + 4j, 0], np.complex64)), np.inf)
    assert c.dtype == mx.float32 and float(c) == pytest.approx(5.0)


def test_cross():
    a, b = GEN.standard_normal((4, 3)), GEN.standard_normal((3,))
    _close(L.cross(to_lazyx(a), to_lazyx(b)), np.cross(a, b))
    _close(L.cross(to_lazyx(a.T), to_lazyx(a.T[:, ::-1]), axis=0), np.cross(a.T, a.T[:, ::-1], axis=0))
    two = GEN.standard_normal((4, 2))
    want = np.cross(np.pad(two, ((0, 0), (0, 1))), a)
    _close(L.cross(to_lazyx(two), to_lazyx(a)), want)


@pytest.mark.parametrize("op", ["inv", "cholesky", "qr", "lu", "lu_factor", "pinv", "tri_inv",
                                "cholesky_inv"])
def test_real_only_ops_refuse_other_dtypes(op):
    for d in (mx.int32, mx.float16, mx.bfloat16, mx.complex64, mx.bool_):
        with pytest.raises(DtypeError, match=rf"\[linalg.{op}\].*{d.name}"):
            getattr(L, op)(mx.ones((3, 3), dtype=d))


def test_bad_shapes_and_arguments():
    for op in ("inv", "cholesky", "det", "slogdet", "eig", "eigh", "eigvalsh", "tri_inv"):
        with pytest.raises(ShapeError, match=rf"\[linalg.{op}\].*\(3, 4\)"):
            getattr(L, op)(mx.ones((3, 4)))
        with pytest.raises(ShapeError, match=rf"\[linalg.{op}\].*>= 2 dimensions.*\(3,\)"):
            getattr(L, op)(mx.ones((3,)))
    with pytest.raises(ShapeError, match=r"\[linalg.solve\].*\(3, 3\).*\(4,\)"):
        L.solve(mx.eye(3), mx.ones((4,)))
    with pytest.raises(ShapeError, match=r"\[linalg.solve\].*batch"):
        L.solve(mx.ones((2, 3, 3)), mx.ones((4, 3, 1)))
    with pytest.raises(DtypeError, match=r"\[linalg.solve\].*int32"):
        L.solve(mx.ones((3, 3), dtype=mx.int32), mx.ones((3,), dtype=mx.int32))
    with pytest.raises(DtypeError, match=r"\[linalg.det\].*complex"):
        L.det(mx.ones((2, 2), dtype=mx.complex64))
    with pytest.raises(ArgumentError, match=r"\[linalg.eigh\] UPLO.*'X'"):
        L.eigh(mx.eye(2), UPLO="X")
    x = mx.ones((2, 3))
    with pytest.raises(ArgumentError, match=r"\[linalg.norm\].*'foo'"):
        L.norm(x, "foo")
    with pytest.raises(ArgumentError, match=r"\[linalg.norm\].*'fro'.*1 axis"):
        L.norm(x, "fro", axis=0)
    with pytest.raises(ArgumentError, match=r"\[linalg.norm\].*ord 0"):
        L.norm(x, 0)
    with pytest.raises(ArgumentError, match=r"\[linalg.norm\].*too many axes"):
        L.norm(mx.ones((2, 2, 2)), axis=(0, 1, 2))
    with pytest.raises(ArgumentError, match=r"\[linalg.norm\].*\(2, 2, 2\)"):
        L.norm(mx.ones((2, 2, 2)), 2)
    with pytest.raises(AxisError, match=r"\[linalg.norm\] axis 2"):
        L.norm(x, axis=2)
    with pytest.raises(AxisError, match=r"\[linalg.norm\] Repeated"):
        L.norm(x, None, axis=(1, 1))
    with pytest.raises(ShapeError, match=r"\[linalg.cross\].*size 2 or 3.*\(4,\)"):
        L.cross(mx.ones((4,)), mx.ones((3,)))
    with pytest.raises(AxisError, match=r"\[linalg.cross\] axis 2"):
        L.cross(mx.ones((3, 3)), mx.ones((3, 3)), axis=2)


def test_singular_matrices_raise_when_evaluated():
    sing = mx.array([[1.0, 2.0], [2.0, 4.0]])
    for f in (L.inv, lambda a: L.solve(a, mx.ones((2,))),
              lambda a: L.tri_inv(mx.zeros((2, 2))),
              lambda a: L.solve_triangular(mx.zeros((2, 2)), mx.ones((2,))),
              lambda a: L.cholesky(mx.array([[1.0, 2.0], [2.0, 1.0]]))):
        out = f(sing)
        with pytest.raises(LinAlgError, match=r"\[(Inverse|Solve|SolveTriangular|Cholesky)\]"):
            mx.eval(out)
    # Singular is fine where the result exists (as in MLX and NumPy).
    assert float(L.det(sing)) == 0.0
    sign, logdet = L.slogdet(sing)
    assert float(sign) == 0.0 and float(logdet) == -np.inf
    _close(L.pinv(sing), np.linalg.pinv(np.array([[1.0, 2.0], [2.0, 4.0]])), "float32")


def test_grad_of_compositions():
    # det through its primitive, norms through SVD, cholesky_inv through tri_inv.
    a = _square(3)
    g = mx.grad(lambda x: L.det(x))(to_lazyx(a))
    _close(g, np.linalg.det(a) * np.linalg.inv(a).T)
    check_vjp_fd(lambda x: L.norm(x, "nuc"), _square(3))
    check_vjp_fd(lambda x: L.norm(x, 2, axis=(0, 1)), GEN.standard_normal((3, 2)))
    check_vjp_fd(lambda x: L.cholesky_inv(x), np.linalg.cholesky(_spd(3)))
    check_vjp_fd(lambda x: L.cross(x, x[::-1]), GEN.standard_normal((2, 3)))
    check_vjp_fd(lambda a, b: L.solve(a, b), _square(2, 3), GEN.standard_normal(3))


def test_vmap_with_broadcast_batches():
    a = _square(3, 2, 3)   # per example (2, 3, 3)
    b = GEN.standard_normal((3, 2))  # per example (3, 2): broadcasts over a's batch of 2
    check_vmap_loop(L.solve, a, b, in_axes=[0, None])
    check_vmap_loop(lambda x: L.norm(x, "nuc", axis=(0, 1)), GEN.standard_normal((2, 3, 4)))
    check_vmap_loop(lambda x: list(L.lu(x)), _square(2, 3))


def test_streams_and_errors_of_rules():
    a = _square(3)
    out = L.inv(to_lazyx(a), stream=mx.cpu)
    _close(out, np.linalg.inv(a))
    with pytest.raises(Exception, match=r"\[QR\].*M >= N"):
        mx.grad(lambda x: mx.sum(L.qr(x)[1]))(mx.ones((2, 3)))
    with pytest.raises(Exception, match=r"\[SVD\].*square"):
        mx.grad(lambda x: mx.sum(L.svd(x)[0]))(mx.ones((2, 3)))
