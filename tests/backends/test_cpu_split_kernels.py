"""The CPU kernels that split one node's work over the cores: a single long 1-D complex
FFT (a radix step of Cooley-Tukey, ``backends/cpu/kernels/fft.py``) and a batch of SVDs
(GIL-free LAPACK calls with BLAS at one thread, ``backends/cpu/kernels/linalg.py``),
against NumPy's float64 results, for 2, 3 and 4 threads."""

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.backends.cpu.kernels import fft as kfft
from lazyx.backends.cpu.kernels import linalg as klinalg
from lazyx.errors import LinAlgError


@pytest.fixture(params=[2, 3, 4])
def workers(request, monkeypatch):
    """The kernels' thread counts set to ``request.param`` (fresh pools), the FFTs on
    pocketfft (MKL, where installed, splits a long transform itself)."""
    monkeypatch.setattr(kfft, "LIBRARY", "pocketfft")
    for mod in (kfft, klinalg):
        monkeypatch.setattr(mod, "WORKERS", request.param)
        monkeypatch.setattr(mod, "_pool", [])
    yield request.param
    for mod in (kfft, klinalg):
        for pool in mod._pool:
            pool.shutdown()


@pytest.mark.parametrize("name", ["fft", "ifft"])
@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
def test_split_fft_matches_numpy(workers, name, norm, monkeypatch):
    n = 3 * 4 * 5 * (1 << 12)  # divisible by 2, 3 and 4, above the split's threshold
    assert kfft._radix(n) == workers
    calls = []
    split = kfft._split
    monkeypatch.setattr(kfft, "_split", lambda *a: calls.append(1) or split(*a))
    rng = np.random.default_rng(workers)
    x = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64)
    want = getattr(np.fft, name)(x.astype(np.complex128), norm=norm)
    for got in (getattr(mx.fft, name)(mx.array(x), norm=norm),                # 1-D
                getattr(mx.fft, name)(mx.array(x[None]), norm=norm)[0],       # (1, n)
                getattr(mx.fft, name)(mx.array(np.stack([x, x]))[1], norm=norm)):  # a view
        got = np.asarray(got)
        assert got.dtype == np.complex64 and got.shape == (n,)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())
    assert len(calls) == 3


def test_fft_split_only_long_transforms_the_threads_divide(monkeypatch):
    monkeypatch.setattr(kfft, "WORKERS", 2)
    assert kfft._radix(kfft.SPLIT_MIN) == 2
    assert kfft._radix(kfft.SPLIT_MIN - 2) == 1   # too short
    assert kfft._radix(kfft.SPLIT_MIN + 1) == 1   # odd
    monkeypatch.setattr(kfft, "WORKERS", 4)
    assert kfft._radix(3 * kfft.SPLIT_MIN) == 4
    assert kfft._radix(3 * (kfft.SPLIT_MIN + 1)) == 3


@pytest.mark.parametrize("shape", [(7, 6, 6), (5, 4, 7), (4, 7, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_batched_svd_matches_one_matrix_at_a_time(workers, shape, dtype):
    rng = np.random.default_rng(1)
    a = rng.standard_normal(shape)
    if dtype is np.complex64:
        a = a + 1j * rng.standard_normal(shape)
    a = a.astype(dtype)
    x = mx.array(a)
    u, s, vt = (np.asarray(t) for t in mx.linalg.svd(x))
    k = min(shape[-2:])
    np.testing.assert_allclose(s, np.linalg.svd(a.astype(np.complex128), compute_uv=False),
                               rtol=0, atol=2e-5)
    np.testing.assert_allclose((u[..., :k] * s[..., None, :]) @ vt[..., :k, :], a, atol=2e-5)
    np.testing.assert_allclose(np.asarray(mx.linalg.svd(x, compute_uv=False)), s, atol=2e-6)
    for i in range(shape[0]):  # the same LAPACK routine: the same signs as one matrix alone
        ui, si, vti = (np.asarray(t) for t in mx.linalg.svd(mx.array(a[i])))
        np.testing.assert_array_equal(ui, u[i])
        np.testing.assert_array_equal(vti, vt[i])
    np.testing.assert_array_equal(np.asarray(x), a)  # the input is not overwritten


def test_batched_svd_failure_raises_and_restores_blas_threads(workers):
    if klinalg._blas_limit() is None:
        pytest.skip("threadpoolctl is not installed: batches run on the calling thread")
    before = [lib["num_threads"] for lib in klinalg._blas_limit().info()]
    a = np.random.default_rng(2).standard_normal((6, 5, 5)).astype(np.float32)
    a[4, 1, 2] = np.nan
    with pytest.raises(LinAlgError, match=r"\[SVD\].*\(6, 5, 5\)"):
        np.asarray(mx.linalg.svd(mx.array(a))[1])
    assert [lib["num_threads"] for lib in klinalg._blas_limit().info()] == before
