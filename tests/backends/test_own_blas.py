"""lazyx's own OpenBLAS (backends/cpu/blas.py): which CPUs get it, that its products
equal float64 NumPy's for every operand layout, and that the cpu backend's large
products run on it when it is loaded."""

import os
import subprocess
import sys

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.backends.cpu import blas

own = blas.open_library(None)
needs_library = pytest.mark.skipif(own is None, reason="the scipy-openblas32 wheel is not installed")

ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512bw

processor\t: 1
vendor_id\t: GenuineIntel
"""


def test_the_cpus_that_get_other_kernels():
    assert blas.core_for(ZEN4) == "Haswell"
    assert blas.core_for(ZEN4.replace("avx512f ", "")) is None  # Zen 3: OpenBLAS picks AVX2
    assert blas.core_for(ZEN4.replace("cpu family\t: 25", "cpu family\t: 26")) is None
    assert blas.core_for(ZEN4.replace("AuthenticAMD", "GenuineIntel")) is None
    assert blas.core_for("") is None
    assert blas.core_for("vendor_id : AuthenticAMD\ncpu family : x\n") is None


def _layouts(data):
    """``data`` (2-D) as NumPy arrays of several layouts with the same values."""
    r, c = data.shape
    yield "C", data
    yield "F", np.asfortranarray(data)
    yield "rows of a wider array", np.pad(data, ((0, 1), (0, 3)))[:r, :c]
    yield "columns of a taller array", np.asfortranarray(np.pad(data, ((0, 5), (0, 1))))[:r, :c]
    yield "every other column", np.repeat(data, 2, axis=1)[:, ::2]
    yield "reversed rows", np.ascontiguousarray(data[::-1])[::-1]
    yield "broadcast", np.broadcast_to(data[:1], data.shape) if r > 1 else data


@needs_library
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m, k, n", [(7, 5, 3), (1, 9, 4), (6, 1, 5), (5, 8, 1), (64, 33, 17)])
def test_products_equal_numpys_for_every_layout(m, k, n, dtype):
    gen = np.random.default_rng(m * 100 + k * 10 + n)
    a, b = gen.standard_normal((m, k)).astype(dtype), gen.standard_normal((k, n)).astype(dtype)
    for name_a, x in _layouts(a):
        for name_b, y in _layouts(b):
            want = x.astype(np.float64) @ y.astype(np.float64)
            got = own.gemm(x, y)
            assert got.dtype == dtype and got.shape == (m, n) and got.flags.c_contiguous
            tol = 1e-4 if dtype == np.float32 else 1e-12
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol * k,
                                       err_msg=f"a {name_a}, b {name_b}")


@needs_library
def test_empty_sides():
    z = np.zeros((0, 4), np.float32)
    assert own.gemm(z, np.ones((4, 3), np.float32)).shape == (0, 3)
    np.testing.assert_array_equal(own.gemm(np.ones((2, 0), np.float32), np.ones((0, 3), np.float32)),
                                  np.zeros((2, 3), np.float32))


@needs_library
def test_nan_and_inf_propagate_as_in_numpy():
    a = np.ones((4, 3), np.float32)
    a[1, 2] = np.nan
    a[2, 0] = np.inf
    b = np.ones((3, 5), np.float32)
    with np.errstate(invalid="ignore"):  # NumPy warns of the NaN it makes
        np.testing.assert_array_equal(own.gemm(a, b), a @ b)


@needs_library
@pytest.mark.parametrize("transposed", [False, True])
def test_large_products_of_the_backend_run_on_it(monkeypatch, transposed):
    calls = []

    class Spy:
        def gemm(self, a, b):
            calls.append((a.shape, b.shape))
            return own.gemm(a, b)

    monkeypatch.setattr(blas, "_loaded", [Spy()])
    gen = np.random.default_rng(0)
    a = gen.standard_normal((160, 128)).astype(np.float32)
    b = gen.standard_normal((128, 112)).astype(np.float32)
    assert a.shape[0] * a.shape[1] * b.shape[1] >= blas.MIN_WORK
    w = mx.array(np.ascontiguousarray(b.T)).T if transposed else mx.array(b)
    want = a.astype(np.float64) @ b  # sums of 128 products: float32 rounding, cancellation
    np.testing.assert_allclose(np.asarray(mx.array(a) @ w), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(mx.addmm(mx.ones((112,)), mx.array(a), w)), want + 1,
                               rtol=1e-4, atol=1e-4)
    assert calls == [((160, 128), (128, 112))] * 2
    calls.clear()
    mx.eval(mx.array(a[:8]) @ mx.array(b))  # below MIN_WORK: NumPy's product
    assert calls == []


def test_lazyx_blas_numpy_keeps_numpys_products():
    code = ("from lazyx.backends.cpu import blas; import lazyx.core as mx; "
            "mx.eval(mx.ones((4, 4)) @ mx.ones((4, 4))); print(blas.load())")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "LAZYX_BLAS": "numpy"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"


@needs_library
def test_the_core_type_applies_to_lazyxs_library_alone():
    """In a fresh process, loading lazyx's library with a core type leaves NumPy's
    OpenBLAS as it loaded, and the process's environment as it was."""
    code = ("import os, numpy, threadpoolctl\n"
            "before = {i['filepath']: i.get('architecture') for i in threadpoolctl.threadpool_info()}\n"
            "from lazyx.backends.cpu import blas\n"
            "lib = blas.open_library('Haswell')\n"
            "after = {i['filepath']: i.get('architecture') for i in threadpoolctl.threadpool_info()}\n"
            "assert all(after[p] == a for p, a in before.items()), (before, after)\n"
            "assert 'OPENBLAS_CORETYPE' not in os.environ\n"
            "assert 'OPENBLAS_THREAD_TIMEOUT' not in os.environ\n"
            "print(lib.core)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_THREAD_TIMEOUT")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "Haswell"
