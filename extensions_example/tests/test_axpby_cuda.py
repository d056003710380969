"""Axpby's CUDA kernel (``axpby.cu`` through lazyx's CUDA backend) on the GPU.

The eager tests of ``test_axpby_eager.py`` run on every available backend, the
``cuda`` one included on a GPU machine; these add what is GPU-specific: who
provides the kernel, both of its paths for every dtype against NumPy, and the
transforms on a GPU stream. They skip where the cuda backend is unavailable.
"""

import ml_dtypes
import numpy as np
import pytest

import lazyx.core as mx
from lazyx.backend import backends

pytest.importorskip("lazyx_axpby", reason="lazyx-axpby is not installed: pip install ./extensions_example")
from lazyx_axpby import axpby  # noqa: E402

CUDA = backends()["cuda"]
pytestmark = pytest.mark.skipif(not CUDA.is_available(),
                                reason=f"cuda backend unavailable: {CUDA.unavailable_reason()}")

DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.complex64]
TOL = {np.float32: 1e-6, np.float64: 1e-12, np.float16: 1e-3, ml_dtypes.bfloat16: 8e-3,
       np.complex64: 1e-6}


def test_the_plugin_provides_the_cuda_kernel():
    assert "axpby" in mx.kernel_provider("cuda", "Axpby")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", ["contiguous", "broadcast", "transposed", "reversed"])
def test_both_paths_every_dtype(dtype, case):
    gen = np.random.default_rng(3)

    def data(shape):
        a = gen.uniform(-2, 2, shape)
        if np.dtype(dtype).kind == "c":
            a = a + 1j * gen.uniform(-2, 2, shape)
        return a.astype(dtype)
    x, y = data((37, 53)), data((37, 53))
    if case == "broadcast":
        y = data((53,))
    lx, ly = mx.array(x, dtype=mx.float64) if dtype is np.float64 else mx.array(x), \
        mx.array(y, dtype=mx.float64) if dtype is np.float64 else mx.array(y)
    if case == "transposed":
        x, y = x.T, y.T
        lx, ly = mx.transpose(lx, stream=mx.gpu), mx.transpose(ly, stream=mx.gpu)
    if case == "reversed":
        x = x[::-1, ::2]
        y = y[::-1, ::2]
        lx, ly = lx[::-1, ::2], ly[::-1, ::2]
    out = axpby(lx, ly, 1.75, -0.5, stream=mx.gpu)
    mx.eval(out)
    assert CUDA.is_buffer(out._data)
    want = 1.75 * x.astype(np.complex128 if np.dtype(dtype).kind == "c" else np.float64) \
        - 0.5 * y.astype(np.complex128 if np.dtype(dtype).kind == "c" else np.float64)
    got = np.asarray(out)
    assert got.dtype == np.dtype(dtype) and got.shape == want.shape
    np.testing.assert_allclose(got.astype(want.dtype), want, rtol=TOL[dtype], atol=TOL[dtype])


def test_transforms_on_the_gpu():
    gen = np.random.default_rng(4)
    x = gen.standard_normal((5, 7)).astype(np.float32)
    y = gen.standard_normal((7,)).astype(np.float32)

    def f(a, b):
        return mx.sum(mx.sin(axpby(a, b, 2.0, -3.0)))

    got = {}
    for dev in (mx.cpu, mx.gpu):
        with mx.stream(dev):
            v, (gx, gy) = mx.value_and_grad(f, argnums=(0, 1))(mx.array(x), mx.array(y))
            bv = mx.vmap(lambda a: axpby(a, mx.array(y), 0.5, 1.5))(mx.array(x))
            cv = mx.compile(f)(mx.array(x), mx.array(y))
            mx.eval(v, gx, gy, bv, cv)
            got[dev] = [np.asarray(t) for t in (v, gx, gy, bv, cv)]
    c = np.cos(2 * x - 3 * y)
    np.testing.assert_allclose(got[mx.gpu][1], 2 * c, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[mx.gpu][2], -3 * c.sum(0), rtol=1e-5, atol=1e-5)
    for a, b in zip(got[mx.cpu], got[mx.gpu]):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
