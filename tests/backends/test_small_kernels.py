"""The cpu backend's small element-wise kernels (backends/cpu/native/small.cpp), which
the scheduler's native loop calls instead of NumPy's ufunc for small arrays: the same
bits as the ufunc for every op, dtype and layout they take, and a clean decline for
the rest (the ufunc then runs)."""

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.backends.cpu import native_kernels

native = native_kernels.load()
pytestmark = pytest.mark.skipif(native is None, reason="the native kernels are not built")

SPECIAL = [0.0, -0.0, 1.5, -2.25, np.inf, -np.inf, np.nan, 1e-40, 3.4e38, -1e-30]


def _call(name, *xs):
    """The kernel's result, or None where it declines (the ufunc would run)."""
    return native.small_call(name, *xs)


BINARY = {"Add": np.add, "Subtract": np.subtract, "Multiply": np.multiply, "Divide": np.divide}
UNARY = {"Negative": np.negative, "Square": np.square, "Abs": np.abs}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_float_bits_equal_the_ufunc(name, dtype):
    rng = np.random.default_rng(1)
    a = np.array(SPECIAL + list(rng.standard_normal(22)), dtype)
    b = np.array(list(rng.standard_normal(22)) + SPECIAL[::-1], dtype)
    with np.errstate(all="ignore"):
        for x, y in ((a, b), (a, b[3:4]), (a[5:6], b), (a.reshape(4, 8), b.reshape(4, 8)),
                     (a.reshape(4, 8), np.asarray(b[0])), (np.asarray(a[0]), np.asarray(b[1]))):
            want = BINARY[name](x, y)
            got = _call(name, x, y)
            assert got is not None and got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got.reshape(-1).view(np.uint8), want.reshape(-1).view(np.uint8))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("name", ["Add", "Subtract", "Multiply"])
def test_binary_integers_wrap_as_numpy(name, dtype):
    info = np.iinfo(dtype)
    a = np.array([info.max, info.min, -1, 7, 0, 123456], dtype)
    b = np.array([1, -1, info.min, 3, info.max, 98765], dtype)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(_call(name, a, b), BINARY[name](a, b))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_bits_equal_the_ufunc(name, dtype):
    if np.dtype(dtype).kind == "i" and name != "Negative":
        assert _call(name, np.arange(4, dtype=dtype)) is None  # declined: the ufunc runs
        return
    a = np.array(SPECIAL, dtype) if np.dtype(dtype).kind == "f" else \
        np.array([np.iinfo(dtype).min, -3, 0, 5, np.iinfo(dtype).max], dtype)
    with np.errstate(all="ignore"):
        want = UNARY[name](a)
    got = _call(name, a)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_declines_what_it_does_not_take():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert _call("Add", a, a) is not None
    assert _call("Add", a, a.T.copy().T) is None  # Fortran order
    assert _call("Add", a[:, ::2], a[:, ::2]) is None  # strided
    assert _call("Add", a, a[0]) is None  # broadcasting a row
    assert _call("Add", a, a.astype(np.float64)) is None  # mixed dtypes
    assert _call("Add", a.astype(np.float16), a.astype(np.float16)) is None
    assert _call("Add", a.astype(">f4"), a.astype(">f4")) is None  # byte-swapped
    assert _call("Divide", a.astype(np.int32), a.astype(np.int32)) is None
    assert _call("Add", a) is None and _call("Negative", a, a) is None
    assert native.small_kernel("Exp") is None


def test_eager_small_ops_match_numpy_through_the_scheduler():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 5)).astype(np.float32)
    b = rng.standard_normal((3, 5)).astype(np.float32)
    x, y = mx.array(a), mx.array(b)
    got = (x + y) * y - x / (y * y) + (-x)
    np.testing.assert_array_equal(np.asarray(got), (a + b) * b - a / (b * b) + (-a))
    np.testing.assert_array_equal(np.asarray(mx.abs(x) + mx.square(y) * 2), np.abs(a) + np.square(b) * 2)
    i = mx.array(np.array([2**31 - 1, 5], np.int32))
    assert (i + 1).tolist() == [-2**31, 6]
    before = mx.get_active_memory()
    z = x * y
    mx.eval(z)
    assert mx.get_active_memory() >= before + a.nbytes  # counted like any kernel output
