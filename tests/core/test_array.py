import ml_dtypes
import numpy as np
import pytest

import lazyx.core as mx
from lazyx.errors import DtypeError, ShapeError


@pytest.mark.parametrize("value,dtype,shape", [
    (3, mx.int32, ()),
    (2.5, mx.float32, ()),
    (True, mx.bool_, ()),
    (1 + 2j, mx.complex64, ()),
    ([1, 2, 3], mx.int32, (3,)),
    ([[1.0, 2], [3, 4]], mx.float32, (2, 2)),
    ([True, 1], mx.int32, (2,)),
    ([1, 2.5], mx.float32, (2,)),
    ([], mx.float32, (0,)),
    ([[[]]], mx.float32, (1, 1, 0)),
    (np.arange(6, dtype=np.int64).reshape(2, 3), mx.int64, (2, 3)),
    (np.zeros(2, np.float64), mx.float32, (2,)),
    (np.zeros(2, np.uint16), mx.uint16, (2,)),
    (np.zeros(2, ml_dtypes.bfloat16), mx.bfloat16, (2,)),
    (np.float64(1.5), mx.float32, ()),
])
def test_construction_infers_mlx_dtypes(value, dtype, shape):
    a = mx.array(value)
    assert a.dtype is dtype and a.shape == shape
    np.testing.assert_array_equal(np.array(a), np.asarray(value).astype(dtype.np))


def test_construction_with_dtype_and_from_arrays():
    a = mx.array([1, 2, 3], dtype=mx.float16)
    assert a.dtype is mx.float16
    b = mx.array(a)
    assert b.dtype is mx.float16 and b.tolist() == [1.0, 2.0, 3.0]
    c = mx.array(a, dtype=mx.int8)
    assert c.dtype is mx.int8 and c.tolist() == [1, 2, 3]
    d = mx.array([a, a])
    assert d.shape == (2, 3) and d.dtype is mx.float16
    e = mx.array(np.arange(3.0), dtype=mx.float64)
    assert e.dtype is mx.float64
    assert mx.array(3, dtype="float32").dtype is mx.float32


def test_construction_copies_numpy_input():
    x = np.arange(4, dtype=np.float32)
    a = mx.array(x)
    x[0] = 100
    assert a.tolist()[0] == 0


def test_bad_construction():
    with pytest.raises(ShapeError, match="ragged"):
        mx.array([[1, 2], [3]])
    with pytest.raises(DtypeError):
        mx.array(object())
    with pytest.raises(DtypeError):
        mx.array(["a", "b"])


def test_metadata():
    a = mx.array(np.zeros((2, 3, 4), np.float16), dtype=mx.float16)
    assert a.shape == (2, 3, 4) and a.ndim == 3 and a.size == 24
    assert a.itemsize == 2 and a.nbytes == 48 and len(a) == 2
    with pytest.raises(TypeError):
        len(mx.array(1))


def test_numpy_export_is_zero_copy_and_writes_through():
    a = mx.array(np.arange(6, dtype=np.float32))
    v = np.asarray(a)
    assert np.shares_memory(v, a._data)
    v[0] = 5  # MLX's semantics: the export is the array's memory (tests/core/test_interop.py)
    assert a.tolist()[0] == 5
    v[0] = 0
    c = np.array(a)
    c[0] = 5  # a copy: the lazyx array is unaffected
    assert a.tolist()[0] == 0
    assert np.asarray(a, dtype=np.float64).dtype == np.float64


def test_scalar_conversions_evaluate():
    a = mx.array([2.5]) * 2
    assert a._data is None
    assert a.item() == 5.0 and isinstance(a.item(), float)
    assert float(a) == 5.0 and int(a) == 5 and bool(a)
    assert mx.array(3, dtype=mx.int8).item() == 3
    assert isinstance(mx.array([1], dtype=mx.bfloat16).item(), float)
    assert mx.array([[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
    assert mx.array(7).tolist() == 7
    with pytest.raises(ShapeError):
        mx.array([1, 2]).item()
    with pytest.raises(ValueError, match="ambiguous"):
        bool(mx.array([1, 2]))


@pytest.mark.parametrize("value,dtype,text", [
    ([1, 2, 3], None, "array([1, 2, 3], dtype=int32)"),
    ([[1.0, 2], [3, 4]], None, "array([[1, 2],\n       [3, 4]], dtype=float32)"),
    (1.5, None, "array(1.5, dtype=float32)"),
    ([True, False], None, "array([True, False], dtype=bool)"),
    ([0.1, 1e-8, 3], None, "array([0.1, 1e-08, 3], dtype=float32)"),
    ([1 + 2j], None, "array([1+2j], dtype=complex64)"),
    ([1.5], mx.bfloat16, "array([1.5], dtype=bfloat16)"),
    ([1, 2], mx.uint8, "array([1, 2], dtype=uint8)"),
    ([float("nan"), float("inf"), -float("inf")], None, "array([nan, inf, -inf], dtype=float32)"),
    ([1e10, 1.0], None, "array([1e+10, 1], dtype=float32)"),
])
def test_repr_matches_mlx(value, dtype, text):
    a = mx.array(value, dtype=dtype)
    assert repr(a) == text and str(a) == text


def test_repr_summarises_large_arrays():
    a = mx.array(np.arange(2000, dtype=np.float32))
    assert repr(a) == "array([0, 1, 2, ..., 1997, 1998, 1999], dtype=float32)"
    assert repr(mx.array(np.zeros((0, 3), np.float32))) == "array([], dtype=float32)"


def test_print_evaluates(capsys):
    a = mx.array([1.0, 2.0]) + 1
    print(a)
    assert capsys.readouterr().out.strip() == "array([2, 3], dtype=float32)"
    assert a._data is not None


def test_arrays_are_hashable_by_identity():
    a, b = mx.array(1), mx.array(1)
    d = {a: 1, b: 2}
    assert d[a] == 1 and d[b] == 2


def test_pickle_round_trip():
    import pickle
    a = mx.array([[1, 2], [3, 4]], dtype=mx.int16) * 2
    b = pickle.loads(pickle.dumps(a))
    assert b.dtype is mx.int16 and b.tolist() == [[2, 4], [6, 8]]
