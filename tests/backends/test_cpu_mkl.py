"""The CPU kernels that take Intel MKL where ``lazyx[mkl]`` installed it: ``qr``
through MKL's LAPACK (an LQ factorization of the C-ordered buffer, see
``backends/cpu/kernels/linalg.py``) against NumPy's float64 QR and against the
OpenBLAS path (the same reflectors, so the same signs). The FFTs run on both
libraries throughout tests/plugins/test_fft.py."""

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.backends.cpu.kernels import linalg as klinalg

pytestmark = pytest.mark.skipif(klinalg._mkl_lapack("gelqf", np.dtype(np.float32)) is None,
                                reason="MKL (pip install 'lazyx[mkl]') is not installed")


def _qr(a):
    q, r = mx.linalg.qr(mx.array(a), stream=mx.cpu)
    return np.asarray(q), np.asarray(r)


@pytest.mark.parametrize("shape", [(6, 6), (9, 4), (4, 9), (3, 7, 5), (2, 2, 5, 8), (1, 1),
                                   (130, 129), (129, 300)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_qr_through_mkl_matches_numpy_and_openblas(shape, dtype, monkeypatch):
    monkeypatch.setattr(klinalg, "MKL_QR_MIN", 1)  # every size through MKL
    a = np.random.default_rng(len(shape)).standard_normal(shape).astype(dtype)
    calls = []
    real = klinalg._qr_mkl
    monkeypatch.setattr(klinalg, "_qr_mkl", lambda *args: calls.append(1) or real(*args))
    q, r = _qr(a)
    assert calls, "MKL's QR did not run"
    k = min(shape[-2:])
    assert q.shape == (*shape[:-1], k) and r.shape == (*shape[:-2], k, shape[-1])
    tol = 2e-5 * max(shape[-2:])
    np.testing.assert_allclose(q @ r, a, atol=tol)
    np.testing.assert_allclose(np.swapaxes(q, -1, -2) @ q, np.broadcast_to(np.eye(k), (*shape[:-2], k, k)),
                               atol=tol)
    assert np.all(np.tril(r, -1) == 0)
    # The same factorization (signs included) as NumPy's geqrf, and as the OpenBLAS path.
    want_q, want_r = np.linalg.qr(a.astype(np.float64))
    np.testing.assert_allclose(r, want_r, atol=tol * max(1, np.abs(want_r).max()))
    np.testing.assert_allclose(q, want_q, atol=tol * 10)
    monkeypatch.setattr(klinalg, "_mkl_rt", [None])
    q0, r0 = _qr(a)
    np.testing.assert_allclose(q, q0, atol=tol * 10)


def test_small_matrices_stay_on_openblas(monkeypatch):
    calls = []
    real = klinalg._qr_mkl
    monkeypatch.setattr(klinalg, "_qr_mkl", lambda *args: calls.append(1) or real(*args))
    _qr(np.eye(klinalg.MKL_QR_MIN - 1, dtype=np.float32))
    assert not calls
    _qr(np.eye(klinalg.MKL_QR_MIN, dtype=np.float32))
    assert calls
