"""Shared checks for the test suite: random data per dtype and comparison with NumPy.

Every op test goes through :func:`check_op`: it builds lazyx inputs from NumPy
inputs, runs the lazyx op, runs the NumPy reference (in float64 for floating
inputs unless told otherwise), and compares shape, dtype and values with a
tolerance that depends on the result dtype.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

import lazyx.core as mx

ALL_DTYPES = [mx.bool_, mx.uint8, mx.uint16, mx.uint32, mx.uint64, mx.int8, mx.int16,
              mx.int32, mx.int64, mx.float16, mx.bfloat16, mx.float32, mx.float64, mx.complex64]
FLOAT_DTYPES = [mx.float16, mx.bfloat16, mx.float32, mx.float64]
INT_DTYPES = [mx.uint8, mx.uint16, mx.uint32, mx.uint64, mx.int8, mx.int16, mx.int32, mx.int64]
SIGNED_DTYPES = [mx.int8, mx.int16, mx.int32, mx.int64]
REAL_DTYPES = [mx.bool_] + INT_DTYPES + FLOAT_DTYPES
NUMERIC_DTYPES = INT_DTYPES + FLOAT_DTYPES

# (rtol, atol) by result dtype.
TOLERANCES = {
    "float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2), "float32": (2e-5, 1e-6),
    "float64": (1e-12, 1e-12), "complex64": (2e-5, 1e-6),
}


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def random_array(shape, dtype, gen=None, low=-4.0, high=4.0) -> np.ndarray:
    """Random NumPy data of lazyx dtype ``dtype`` (bool, ints in a safe range, floats in [low, high))."""
    gen = gen if gen is not None else rng()
    npd = dtype.np
    if dtype.kind == "b":
        return gen.random(shape) < 0.5
    if dtype.kind == "u":
        hi = max(1, min(int(high), 100)) if high > 0 else 10
        return gen.integers(0, hi + 1, size=shape).astype(npd)
    if dtype.kind == "i":
        lo, hi = int(np.floor(low)), int(np.ceil(high))
        return gen.integers(max(lo, -100), min(hi, 100) + 1, size=shape).astype(npd)
    if dtype.kind == "c":
        return (gen.uniform(low, high, size=shape) + 1j * gen.uniform(low, high, size=shape)).astype(npd)
    return gen.uniform(low, high, size=shape).astype(npd)


def reference_dtype(npd: np.dtype) -> np.dtype:
    """The dtype NumPy references are computed in for inputs of ``npd``."""
    if npd.kind == "f" or npd == np.dtype(ml_dtypes.bfloat16):
        return np.dtype(np.float64)
    if npd.kind == "c":
        return np.dtype(np.complex128)
    return npd


def to_lazyx(x: np.ndarray) -> mx.array:
    """A lazyx array with exactly ``x``'s dtype (float64 stays float64)."""
    from lazyx.dtypes import from_numpy
    return mx.array(x, dtype=from_numpy(x.dtype))


def assert_close(actual, expected, dtype=None, rtol=None, atol=None, msg=""):
    """Assert lazyx result ``actual`` equals NumPy ``expected`` in shape, dtype and value."""
    assert isinstance(actual, mx.array), f"{msg}: expected a lazyx array, got {type(actual)}"
    expected = np.asarray(expected)
    if dtype is not None:
        assert actual.dtype == dtype, f"{msg}: dtype {actual.dtype}, expected {dtype}"
    got = np.array(actual)
    assert got.shape == expected.shape, f"{msg}: shape {got.shape}, expected {expected.shape}"
    d = actual.dtype
    if d.kind in "fc":
        r, a = TOLERANCES[d.name]
        r = rtol if rtol is not None else r
        a = atol if atol is not None else a
        exp_cast = expected.astype(d.np).astype(np.complex128 if d.kind == "c" else np.float64)
        got64 = got.astype(np.complex128 if d.kind == "c" else np.float64)
        np.testing.assert_allclose(got64, exp_cast, rtol=r, atol=a, equal_nan=True, err_msg=msg)
    else:
        np.testing.assert_array_equal(got, expected.astype(d.np), err_msg=msg)


def check_op(lx_fn, np_fn, *inputs, dtype=None, rtol=None, atol=None, upcast=True, msg=""):
    """Run ``lx_fn`` on lazyx copies of NumPy ``inputs`` and compare with ``np_fn``.

    Args:
        lx_fn: the lazyx op (called with lazyx arrays).
        np_fn: the NumPy reference (called with NumPy arrays, upcast to float64
            for floating inputs when ``upcast``).
        inputs: NumPy arrays (or Python scalars, passed through unchanged).
        dtype: the lazyx dtype the result must have (None: not checked).
    Returns:
        the lazyx result.
    """
    lx_in = [to_lazyx(x) if isinstance(x, np.ndarray) else x for x in inputs]
    ref_in = [x.astype(reference_dtype(x.dtype)) if upcast and isinstance(x, np.ndarray) else x
              for x in inputs]
    with np.errstate(all="ignore"):
        expected = np_fn(*ref_in)
    out = lx_fn(*lx_in)
    if isinstance(out, (tuple, list)):
        for i, (o, e) in enumerate(zip(out, expected)):
            assert_close(o, e, None if dtype is None else (dtype[i] if isinstance(dtype, (list, tuple)) else dtype),
                         rtol, atol, f"{msg} output {i}")
    else:
        assert_close(out, expected, dtype, rtol, atol, msg)
    return out
