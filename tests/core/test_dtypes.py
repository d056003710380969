import itertools

import ml_dtypes
import numpy as np
import pytest

import lazyx.core as mx
from lazyx.errors import DtypeError
from helpers import ALL_DTYPES


# Cases of MLX's promotion table that differ from NumPy's.
@pytest.mark.parametrize("a,b,expected", [
    (mx.int8, mx.uint8, mx.int16),
    (mx.uint64, mx.int8, mx.float32),
    (mx.int64, mx.uint64, mx.float32),
    (mx.float16, mx.bfloat16, mx.float32),
    (mx.int64, mx.float16, mx.float16),
    (mx.uint32, mx.bfloat16, mx.bfloat16),
    (mx.float64, mx.complex64, mx.complex64),
    (mx.bool_, mx.bool_, mx.bool_),
    (mx.bool_, mx.int8, mx.int8),
    (mx.uint16, mx.int8, mx.int32),
])
def test_promotion_table_cases(a, b, expected):
    assert mx.promote_types(a, b) is expected
    assert mx.promote_types(b, a) is expected


def test_promotion_is_symmetric_and_ops_follow_it():
    for a, b in itertools.product(ALL_DTYPES, ALL_DTYPES):
        d = mx.promote_types(a, b)
        assert mx.promote_types(b, a) is d
        x = mx.zeros((2,), dtype=a) if hasattr(mx, "zeros") else mx.array(np.zeros(2, a.np))
        y = mx.array(np.ones(2, b.np), dtype=b)
        assert (x + y).dtype is d, (a, b)


@pytest.mark.parametrize("dtype,scalar,expected", [
    (mx.int8, 1, mx.int8),
    (mx.uint8, 255, mx.uint8),
    (mx.float16, 2.0, mx.float16),
    (mx.bfloat16, 3, mx.bfloat16),
    (mx.int32, 2.5, mx.float32),
    (mx.int64, 2.5, mx.float32),
    (mx.bool_, 1, mx.int32),
    (mx.bool_, True, mx.bool_),
    (mx.bool_, 1.5, mx.float32),
    (mx.float32, 1j, mx.complex64),
    (mx.float64, 1.0, mx.float64),
])
def test_python_scalars_are_weak(dtype, scalar, expected):
    a = mx.array(np.ones(3, dtype.np), dtype=dtype)
    assert (a + scalar).dtype is expected
    assert (scalar + a).dtype is expected


def test_weak_int_out_of_range_is_an_error_like_mlx():
    from lazyx.errors import ArgumentError
    a = mx.array([1, 2], dtype=mx.uint8)
    for v in (300, -1):
        with pytest.raises(ArgumentError, match=f"Converting {v} to uint8 would result in overflow"):
            a + v
    with pytest.raises(ValueError, match="int32"):
        mx.array([1], dtype=mx.int32) + 2**40
    # The constructor wraps, as MLX's does.
    assert mx.array(300, dtype=mx.uint8).item() == 44
    assert a.tolist() == [1, 2]


def test_large_python_ints_become_int64():
    assert mx.array(2**40).dtype is mx.int64 and mx.array(2**40).item() == 2**40
    assert mx.array([2**40, 1]).dtype is mx.int64
    assert mx.array([-2**31, 1]).dtype is mx.int32
    assert mx.full((2,), 2**40).tolist() == [2**40, 2**40]
    with pytest.raises(DtypeError):
        mx.array(2**70)


def test_result_type_of_arrays_and_dtypes():
    assert mx.result_type(mx.bool_) is mx.bool_
    assert mx.result_type(mx.int8, mx.float16, mx.uint8) is mx.float16
    assert mx.result_type(mx.array([1]), mx.array([1.0], dtype=mx.float16)) is mx.float16
    # As MLX: arrays or dtypes only (a Python scalar's type depends on what it meets).
    for bad in [(), (1, 2), ("float32",)]:
        with pytest.raises(ValueError):
            mx.result_type(*bad)


def test_category_tree():
    assert mx.issubdtype(mx.float16, mx.floating)
    assert mx.issubdtype(mx.bfloat16, mx.inexact)
    assert mx.issubdtype(mx.complex64, mx.complexfloating)
    assert mx.issubdtype(mx.complex64, mx.number)
    assert mx.issubdtype(mx.int8, mx.signedinteger)
    assert not mx.issubdtype(mx.uint8, mx.signedinteger)
    assert mx.issubdtype(mx.uint8, mx.integer)
    assert mx.issubdtype(mx.floating, mx.number)
    assert not mx.issubdtype(mx.bool_, mx.number)
    assert mx.issubdtype(mx.bool_, mx.generic)
    assert mx.issubdtype(mx.float32, mx.float32)
    assert not mx.issubdtype(mx.float32, mx.float16)
    assert not mx.issubdtype(mx.floating, mx.float32)


@pytest.mark.parametrize("dtype", [mx.float16, mx.float32, mx.float64, mx.bfloat16], ids=str)
def test_finfo_matches_numpy(dtype):
    ref = ml_dtypes.finfo(ml_dtypes.bfloat16) if dtype is mx.bfloat16 else np.finfo(dtype.np)
    f = mx.finfo(dtype)
    assert f.max == float(ref.max) and f.min == float(ref.min) and f.eps == float(ref.eps)
    assert f.dtype is dtype


@pytest.mark.parametrize("dtype", [mx.uint8, mx.int8, mx.int16, mx.uint32, mx.int64, mx.uint64], ids=str)
def test_iinfo_matches_numpy(dtype):
    assert (mx.iinfo(dtype).min, mx.iinfo(dtype).max) == (np.iinfo(dtype.np).min, np.iinfo(dtype.np).max)


def test_info_rejects_wrong_kinds():
    with pytest.raises(DtypeError, match="inexact"):
        mx.finfo(mx.int32)
    with pytest.raises(DtypeError, match="integer"):
        mx.iinfo(mx.float32)


def test_can_cast():
    assert mx.can_cast(mx.int8, mx.int16)
    assert mx.can_cast(mx.float16, mx.float32)
    assert not mx.can_cast(mx.float32, mx.int32)
    assert not mx.can_cast(mx.int32, mx.int8)
    assert not mx.can_cast(mx.complex64, mx.float64)
    assert mx.can_cast(mx.array([1]), mx.float32) and not mx.can_cast(mx.array([1.0]), mx.int32)
    with pytest.raises(ValueError):
        mx.can_cast(1, mx.float32)


def test_constants():
    assert mx.pi == np.pi and mx.e == np.e and mx.inf == np.inf and np.isnan(mx.nan)
    assert mx.newaxis is None


def test_dtype_objects():
    assert mx.float32.size == 4 and mx.bfloat16.size == 2 and mx.complex64.size == 8
    assert repr(mx.int32) == "lazyx.core.int32" and str(mx.bool_) == "lazyx.core.bool"
    assert repr(mx.floating) == "DtypeCategory.floating"
    assert mx.float32 == mx.float32 and mx.float32 != mx.float16
    assert len({mx.float32, mx.float32, mx.int8}) == 2


def test_unknown_dtype():
    with pytest.raises(DtypeError, match="float128"):
        mx.array([1.0], dtype="float128")
    with pytest.raises(DtypeError):
        mx.array(np.array(["a"]))


def test_a_float32_program_does_not_import_ml_dtypes():
    # ml_dtypes (bfloat16's NumPy dtype) costs more to import than NumPy: it loads only
    # once a bfloat16 array exists, not with lazyx or its CPU kernels.
    import subprocess
    import sys
    code = ("import sys, lazyx.core as mx, lazyx.nn as nn\n"
            "x = mx.ones((4, 8))\n"
            "mx.eval(mx.softmax(mx.exp(x) + 1, axis=-1), mx.sum(x, axis=0), nn.Linear(8, 3)(x))\n"
            "f = mx.compile(lambda a: mx.exp(a) * 2 + 1)\n"
            "mx.eval(f(x))\n"
            "print('ml_dtypes' in sys.modules)\n"
            "mx.eval(mx.ones(3, dtype=mx.bfloat16) + 1)\n"
            "print('ml_dtypes' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "True"], out.stdout + out.stderr[-2000:]
