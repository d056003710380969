"""The sorting pack against NumPy: every dtype, axes, NaN order, stability, partition
invariants, topk, searchsorted, empty and 0-d arrays, non-contiguous buffers, errors."""

import numpy as np
import pytest

import lazyx.core as mx
from helpers import ALL_DTYPES, REAL_DTYPES, assert_close, check_op, random_array, rng, to_lazyx
from lazyx.array import from_buffer
from lazyx.errors import AxisError, DtypeError, ShapeError

ids = lambda d: d.name  # noqa: E731
needs_reshape = pytest.mark.skipif(not hasattr(mx, "reshape"),
                                   reason="needs mx.reshape from the shapes pack")


# -- sort, argsort -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=ids)
def test_sort_matches_numpy(dtype):
    x = random_array((3, 4, 5), dtype, rng(1))
    for axis in (0, 1, -1, -3):
        check_op(lambda a: mx.sort(a, axis), lambda a: np.sort(a, axis=axis), x, dtype=dtype,
                 upcast=False, msg=f"axis={axis}")
    check_op(mx.sort, lambda a: np.sort(a, axis=-1), x, dtype=dtype, upcast=False)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=ids)
def test_argsort_is_stable_and_uint32(dtype):
    # Few distinct values: many ties, which a stable sort keeps in index order.
    x = random_array((4, 6, 7), dtype, rng(2), low=-1, high=1)
    for axis in (0, -1, 1):
        check_op(lambda a: mx.argsort(a, axis=axis),
                 lambda a: np.argsort(a, axis=axis, kind="stable"), x, dtype=mx.uint32,
                 upcast=False, msg=f"axis={axis}")
    assert mx.argsort(mx.array([3, 1, 3, 1, 3])).tolist() == [1, 3, 0, 2, 4]


def test_sort_nan_order_matches_numpy():
    x = np.array([3.0, np.nan, 1.0, -np.inf, np.inf, 2.0, np.nan], np.float32)
    for d in (mx.float16, mx.bfloat16, mx.float32, mx.float64):
        xd = x.astype(d.np)
        # NaNs last, as MLX and NumPy order them (NumPy's own bfloat16 sort, through
        # ml_dtypes' comparisons, does not: the reference sorts bfloat16 as float32).
        wide = (lambda a: a.astype(np.float32)) if d is mx.bfloat16 else (lambda a: a)
        check_op(mx.sort, lambda a: np.sort(wide(a)).astype(a.dtype), xd, upcast=False,
                 msg=d.name)
        check_op(mx.argsort, lambda a: np.argsort(wide(a), kind="stable"), xd,
                 dtype=mx.uint32, upcast=False, msg=d.name)
    c = np.array([1 + 1j, 1 - 1j, 0.5, 1 + 0j], np.complex64)
    check_op(mx.sort, np.sort, c, upcast=False)


@needs_reshape
def test_sort_axis_none_flattens():
    x = random_array((3, 4), mx.int32, rng(3))
    check_op(lambda a: mx.sort(a, axis=None), lambda a: np.sort(a, axis=None), x)
    check_op(lambda a: mx.argsort(a, axis=None),
             lambda a: np.argsort(a, axis=None, kind="stable"), x, dtype=mx.uint32)
    s = mx.sort(mx.array(3), axis=None)
    assert s.shape == (1,) and s.tolist() == [3]


def test_sort_empty_zero_dim_and_bad_axes():
    e = np.zeros((0, 3), np.float32)
    check_op(lambda a: mx.sort(a, axis=0), lambda a: a, e)
    check_op(lambda a: mx.argsort(a, axis=1), lambda a: a.astype(np.uint32), e, dtype=mx.uint32)
    for fn in (mx.sort, mx.argsort):
        with pytest.raises(AxisError, match=r"axis -1 .*dimension 0"):
            fn(mx.array(3.0))
        with pytest.raises(AxisError, match=r"axis 2 .*dimension 2"):
            fn(mx.array(e), axis=2)
        with pytest.raises(AxisError):
            fn(mx.array(e), axis=1.0)
    a = mx.array([2.0, 1.0])
    assert mx.sort(a, axis=np.int64(0)).tolist() == [1.0, 2.0]
    assert mx.sort(a, axis=mx.array(0)).tolist() == [1.0, 2.0]


def test_sort_non_contiguous_inputs():
    base = random_array((6, 8, 5), mx.float32, rng(4))
    for view in (base.transpose(2, 0, 1), base[::2, 1::3, ::-1], base[:, 3]):
        assert not view.flags.c_contiguous
        a = from_buffer(view)
        for axis in (0, -1):
            assert_close(mx.sort(a, axis=axis), np.sort(view, axis=axis))
            assert_close(mx.argsort(a, axis=axis),
                         np.argsort(view, axis=axis, kind="stable").astype(np.uint32))
            assert_close(mx.topk(a, 2, axis=axis),
                         np.sort(np.sort(view, axis=axis), axis=axis).take(
                             range(view.shape[axis] - 2, view.shape[axis]), axis=axis))
    x = random_array((5, 7), mx.int16, rng(5)).T  # Fortran layout through to_lazyx
    check_op(lambda a: mx.sort(a, axis=0), lambda a: np.sort(a, axis=0), x)


# -- partition, argpartition -------------------------------------------------------
def _check_partition(values, x, kth, axis):
    """``values`` is a valid partition of ``x`` at ``kth`` along ``axis``."""
    n = x.shape[axis]
    k = kth % n
    srt = np.sort(x, axis=axis)
    v = np.moveaxis(values, axis, -1)
    s = np.moveaxis(srt, axis, -1)
    np.testing.assert_array_equal(v[..., k], s[..., k])
    pivot = v[..., k:k + 1]
    assert (v[..., :k] <= pivot).all() and (v[..., k + 1:] >= pivot).all()
    np.testing.assert_array_equal(np.sort(v, axis=-1), s)


@pytest.mark.parametrize("dtype", REAL_DTYPES, ids=ids)
def test_partition_and_argpartition(dtype):
    x = random_array((4, 5, 6), dtype, rng(6))
    for axis, kth in ((-1, 0), (-1, 3), (-1, -1), (0, 2), (1, -5), (1, 4)):
        p = mx.partition(to_lazyx(x), kth, axis=axis)
        assert p.dtype == dtype and p.shape == x.shape
        _check_partition(np.array(p), x, kth, axis)
        idx = mx.argpartition(to_lazyx(x), kth, axis)
        assert idx.dtype == mx.uint32 and idx.shape == x.shape
        got = np.take_along_axis(x, np.array(idx).astype(np.int64), axis=axis)
        _check_partition(got, x, kth, axis)


def test_partition_errors_and_kth_types():
    a = mx.array([5, 1, 4, 2, 3, 9, 0])
    for fn in (mx.partition, mx.argpartition):
        for kth in (7, -8):
            with pytest.raises(ShapeError, match=f"kth {kth}"):
                fn(a, kth)
        with pytest.raises(DtypeError, match="kth"):
            fn(a, 1.0)
        with pytest.raises(ShapeError):
            fn(mx.array(np.zeros((0,), np.float32)), 0)
        with pytest.raises(AxisError):
            fn(mx.array(3), 0)
    assert mx.partition(a, mx.array(6)).tolist()[-1] == 9
    assert mx.partition(a, np.int32(0)).tolist()[0] == 0


@needs_reshape
def test_partition_axis_none_flattens():
    x = random_array((3, 4), mx.float32, rng(7))
    _check_partition(np.array(mx.partition(to_lazyx(x), 5, axis=None)), x.reshape(-1), 5, 0)
    assert mx.argpartition(mx.array(3), 0, axis=None).tolist() == [0]


# -- topk --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", REAL_DTYPES, ids=ids)
def test_topk_returns_the_k_largest(dtype):
    x = random_array((4, 5, 6), dtype, rng(8))
    for axis in (-1, 0, 1):
        n = x.shape[axis]
        for k in (0, 1, 3, n):
            out = mx.topk(to_lazyx(x), k, axis=axis)
            expected_shape = list(x.shape)
            expected_shape[axis] = k
            assert out.dtype == dtype and out.shape == tuple(expected_shape)
            want = np.sort(x, axis=axis).take(range(n - k, n), axis=axis)
            np.testing.assert_array_equal(np.sort(np.array(out), axis=axis), want)


def test_topk_order_nan_and_errors():
    a = mx.array([5, 1, 4, 2, 3, 9, 0])
    assert sorted(mx.topk(a, 3).tolist()) == [4, 5, 9]
    assert mx.topk(a, 7).tolist() == [5, 1, 4, 2, 3, 9, 0]  # k == n: the input, as in MLX
    got = np.array(mx.topk(mx.array([1.0, float("nan"), 3.0, 2.0]), 2))
    assert np.isnan(got).sum() == 1 and 3.0 in got  # NaN counts as largest
    for k in (8, -1):
        with pytest.raises(ShapeError, match=f"k={k}"):
            mx.topk(a, k)
    with pytest.raises(DtypeError, match="k must be an integer"):
        mx.topk(a, 2.0)
    with pytest.raises(AxisError):
        mx.topk(mx.array(3), 1)
    assert mx.topk(mx.array(np.zeros((0,), np.float32)), 0).shape == (0,)
    assert mx.topk(mx.array(np.zeros((0, 4), np.float32)), 2, axis=1).shape == (0, 2)


@needs_reshape
def test_topk_axis_none():
    x = np.array([[5, 1, 4], [2, 3, 9]], np.int32)
    assert sorted(mx.topk(to_lazyx(x), 2, axis=None).tolist()) == [5, 9]


# -- searchsorted ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [d for d in ALL_DTYPES if d is not mx.bool_], ids=ids)
def test_searchsorted_matches_numpy(dtype):
    g = rng(9)
    seq = np.sort(random_array((12,), dtype, g))
    vals = random_array((3, 5), dtype, g)
    for side in ("left", "right"):
        check_op(lambda s, v: mx.searchsorted(s, v, side), lambda s, v:
                 np.searchsorted(s, v, side=side), seq, vals, dtype=mx.uint32, upcast=False,
                 msg=side)
        check_op(lambda s, v: mx.searchsorted(s, v, side=side),
                 lambda s, v: np.asarray(np.searchsorted(s, v, side=side)),
                 seq, vals[0, 0], dtype=mx.uint32, upcast=False)


def test_searchsorted_semantics():
    a = mx.array([1, 2, 2, 4])
    v = mx.array([0, 2, 3, 5])
    assert mx.searchsorted(a, v).tolist() == [0, 1, 3, 4]
    assert mx.searchsorted(a, v, side="right").tolist() == [0, 3, 3, 4]
    assert mx.searchsorted(a, mx.array([0.5, 2.5])).tolist() == [0, 3]  # promoted compare
    assert mx.searchsorted(mx.array([1, 2], mx.uint8), mx.array([-1, 300])).tolist() == [0, 2]
    assert mx.searchsorted(mx.array([1, 2], mx.uint8), 300).tolist() == 2
    n = mx.array([1.0, 2.0, float("nan")])
    q = mx.array([float("nan"), 3.0, 0.0])
    assert mx.searchsorted(n, q).tolist() == [2, 2, 0]
    assert mx.searchsorted(n, q, side="right").tolist() == [3, 2, 0]
    assert mx.searchsorted(mx.array(np.zeros((0,), np.float32)), q).tolist() == [0, 0, 0]
    assert mx.searchsorted(a, mx.array(np.zeros((2, 0), np.int32))).shape == (2, 0)
    strided = from_buffer(np.arange(20, dtype=np.float32)[::3])
    assert mx.searchsorted(strided, mx.array([4.0, 4.5])).tolist() == [2, 2]


def test_searchsorted_errors():
    a = mx.array([1, 2, 2, 4])
    with pytest.raises(ValueError, match="side"):
        mx.searchsorted(a, mx.array([2]), side="middle")
    with pytest.raises(ShapeError, match=r"1-D.*\(2, 2\)"):
        mx.searchsorted(mx.array([[1, 2], [2, 4]]), mx.array(2))
    with pytest.raises(ShapeError, match="1-D"):
        mx.searchsorted(mx.array(1), mx.array(2))
    assert mx.searchsorted(a, mx.array([3])).tolist() == [3]  # still usable


@pytest.mark.skipif(not hasattr(mx, "transpose"), reason="needs mx.transpose from the shapes pack")
def test_transposed_lazyx_inputs():
    x = random_array((4, 6, 5), mx.int32, rng(10))
    t = mx.transpose(to_lazyx(x), (2, 0, 1))
    xt = x.transpose(2, 0, 1)
    for axis in (0, -1):
        assert_close(mx.sort(t, axis=axis), np.sort(xt, axis=axis))
        assert_close(mx.argsort(t, axis=axis),
                     np.argsort(xt, axis=axis, kind="stable").astype(np.uint32))
        _check_partition(np.array(mx.partition(t, 2, axis=axis)), xt, 2, axis)
    s = to_lazyx(x)[1:, ::2]
    assert_close(mx.sort(s, axis=1), np.sort(x[1:, ::2], axis=1))
