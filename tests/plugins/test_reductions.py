"""The reductions pack against NumPy float64 references: axes, keepdims, dtypes, empty
and 0-d arrays, non-contiguous buffers, half-precision accumulation, errors."""

import ml_dtypes
import numpy as np
import pytest

import lazyx.core as mx
from helpers import (ALL_DTYPES, FLOAT_DTYPES, INT_DTYPES, NUMERIC_DTYPES, REAL_DTYPES,
                     assert_close, check_op, random_array, rng, to_lazyx)
from lazyx.array import from_buffer
from lazyx.errors import AxisError, DtypeError, ShapeError

ids = lambda d: d.name  # noqa: E731


def _has(name):
    return hasattr(mx, name)


needs = {n: pytest.mark.skipif(not _has(n), reason=f"needs mx.{n} from another op pack")
         for n in ("reshape", "sqrt", "abs")}

# (axis, keepdims) cases on a 3-d input.
AXES = [None, 0, 1, -1, (0, 2), (-1, -3), [2, 0, 1], ()]
SUM_DTYPE = {mx.bool_: mx.int32, mx.int8: mx.int32, mx.int16: mx.int32,
             mx.uint8: mx.uint32, mx.uint16: mx.uint32}
NP_REDUCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min,
             "all": np.all, "any": np.any}


def _np_axis(axis):
    return tuple(axis) if isinstance(axis, list) else axis


def _reduce_dtype(op, d):
    if op in ("all", "any"):
        return mx.bool_
    if op in ("sum", "prod"):
        return SUM_DTYPE.get(d, d)
    return d


def _np_reduce(op):
    fn = NP_REDUCE[op]

    def ref(x, axis, keepdims):
        if op in ("sum", "prod") and x.dtype.kind in "bui":
            x = x.astype(np.int64 if x.dtype.kind != "u" else np.uint64)
        return fn(x, axis=_np_axis(axis), keepdims=keepdims)
    return ref


# -- Reduce ------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "all", "any"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=ids)
def test_reduce_matches_numpy(op, dtype):
    # Small magnitudes keep products exact in every dtype.
    x = random_array((2, 3, 4), dtype, rng(1), low=-2, high=2)
    ref = _np_reduce(op)
    lx = getattr(mx, op)
    for axis in AXES:
        for keepdims in (False, True):
            out_dtype = dtype if axis == () and op not in ("all", "any") else _reduce_dtype(op, dtype)
            check_op(lambda a: lx(a, axis=axis, keepdims=keepdims),
                     lambda a: ref(a, axis, keepdims), x, dtype=out_dtype,
                     msg=f"{op} axis={axis} keepdims={keepdims}")


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "all", "any"])
def test_reduce_positional_arguments_and_method(op):
    x = random_array((3, 5), mx.float32, rng(2), low=0.5, high=1.5)
    a = to_lazyx(x)
    ref = _np_reduce(op)
    assert_close(getattr(mx, op)(a, 1, True), ref(x.astype(np.float64), 1, True))
    assert_close(getattr(a, op)(0), ref(x.astype(np.float64), 0, False))
    assert_close(getattr(a, op)(axis=(0, 1), keepdims=True, stream=mx.cpu),
                 ref(x.astype(np.float64), (0, 1), True))


def test_reduce_of_empty_axes_gives_the_identity():
    e = np.zeros((0, 3), np.float32)
    for op, ident in (("sum", 0.0), ("prod", 1.0), ("all", True), ("any", False)):
        check_op(lambda a: getattr(mx, op)(a), lambda a: np.asarray(ident), e,
                 dtype=_reduce_dtype(op, mx.float32))
        check_op(lambda a: getattr(mx, op)(a, axis=0), lambda a: np.full((3,), ident), e)
        check_op(lambda a: getattr(mx, op)(a, axis=1, keepdims=True),
                 lambda a: np.zeros((0, 1)), e)
    # max/min over a non-empty axis of an empty array are empty, not an error.
    check_op(lambda a: mx.max(a, axis=1), lambda a: np.zeros((0,)), e)
    assert mx.sum(mx.array(np.zeros((0,), np.int8))).dtype == mx.int32


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_of_nothing_raise(op):
    a = mx.array(np.zeros((2, 0, 3), np.float32))
    for axis in (None, 1, (0, 1), -2):
        with pytest.raises(ShapeError, match=rf"\[{op}\].*axis 1 of size 0"):
            getattr(mx, op)(a, axis=axis)


def test_reduce_nan_and_integer_wrapping():
    x = np.array([[1.0, np.nan, 0.0], [2.0, 3.0, -1.0]], np.float32)
    check_op(mx.max, np.max, x)
    check_op(lambda a: mx.min(a, axis=1), lambda a: np.min(a, axis=1), x)
    check_op(mx.all, np.all, x)  # NaN is non-zero
    # int32 sums wrap as in MLX.
    assert mx.sum(mx.array([2**31 - 1, 1], mx.int32)).item() == -(2**31)
    assert mx.sum(mx.array([200, 100], mx.uint8)).item() == 300


def test_reduce_zero_dim():
    for op in ("sum", "prod", "max", "min", "all", "any"):
        x = np.array(2.5, np.float32)
        check_op(getattr(mx, op), lambda a: NP_REDUCE[op](a), x, msg=op)
        with pytest.raises(AxisError, match=r"axis 0 .*dimension 0"):
            getattr(mx, op)(mx.array(2.5), axis=0)


def test_reduce_half_precision_accumulates_in_float32():
    # 4096 * 0.1 in float16 arithmetic stalls far from 409.6.
    x = np.full((4096,), 0.1, np.float16)
    check_op(mx.sum, np.sum, x, dtype=mx.float16, rtol=1e-3)
    y = np.full((3000,), 0.01, ml_dtypes.bfloat16)
    check_op(mx.sum, np.sum, y, dtype=mx.bfloat16, rtol=8e-3)
    z = np.full((2000,), 1.001, np.float16)
    check_op(mx.prod, np.prod, z, dtype=mx.float16, rtol=3e-3)


def test_reduce_non_contiguous_inputs():
    base = random_array((6, 8, 5), mx.float32, rng(3))
    for view in (base.transpose(2, 0, 1), base[::2, 1::3, ::-1], base[:, 3]):
        a = from_buffer(view)
        assert not view.flags.c_contiguous
        for axis in (None, 0, -1, (0, 1)):
            assert_close(mx.sum(a, axis=axis), np.sum(view.astype(np.float64), axis=axis))
            assert_close(mx.max(a, axis=axis, keepdims=True),
                         np.max(view, axis=axis, keepdims=True))
            assert_close(mx.logsumexp(a, axis=axis),
                         _np_logsumexp(view.astype(np.float64), axis))
        assert_close(mx.argmin(a, axis=1), np.argmin(view, axis=1).astype(np.uint32))
        assert_close(mx.cumsum(a, axis=1, reverse=True),
                     np.flip(np.cumsum(np.flip(view.astype(np.float64), 1), 1), 1))


@pytest.mark.parametrize("fn", ["sum", "mean", "argmax", "logsumexp", "median", "var",
                                "count_nonzero", "cumsum"])
def test_bad_axes_raise_axis_error(fn):
    a = mx.array(np.ones((2, 3), np.float32))
    op = getattr(mx, fn)
    with pytest.raises(AxisError, match=r"axis 2 is out of bounds .*dimension 2"):
        op(a, axis=2)
    with pytest.raises(AxisError, match=r"-3"):
        op(a, axis=-3)
    with pytest.raises(AxisError):
        op(a, axis="x")
    if fn not in ("argmax", "cumsum"):
        with pytest.raises(AxisError, match="Repeated"):
            op(a, axis=(0, -2))
        with pytest.raises(AxisError, match="5"):
            op(a, axis=(0, 5))
    # The failed calls leave other arrays usable.
    assert a.sum().item() == 6.0


def test_axis_accepts_integer_like():
    a = mx.array(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert mx.sum(a, axis=np.int64(1)).tolist() == [3.0, 12.0]
    assert mx.sum(a, axis=mx.array(1)).tolist() == [3.0, 12.0]
    assert mx.argmax(a, axis=np.int32(0)).tolist() == [1, 1, 1]


# -- ArgReduce ---------------------------------------------------------------------
@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=ids)
def test_argreduce_matches_numpy(op, dtype):
    x = random_array((3, 4, 5), dtype, rng(4))
    ref = getattr(np, op)
    for axis in (None, 0, 1, -1):
        for keepdims in (False, True):
            check_op(lambda a: getattr(mx, op)(a, axis, keepdims),
                     lambda a: np.asarray(ref(a, axis=axis, keepdims=keepdims)),
                     x, dtype=mx.uint32, msg=f"{op} axis={axis} keepdims={keepdims}")


def test_argreduce_ties_nan_zero_dim_and_empty():
    assert mx.argmax(mx.array([1, 3, 3, 2])).item() == 1
    assert mx.argmin(mx.array([2, 0, 5, 0])).item() == 1
    x = mx.array([1.0, float("nan"), 0.0])
    assert mx.argmax(x).item() == 1 and mx.argmin(x).item() == 1
    z = mx.argmax(mx.array(3.0))
    assert z.shape == () and z.item() == 0
    assert mx.argmax(mx.array(np.ones((2, 3))), keepdims=True).shape == (1, 1)
    assert mx.array(np.ones((2, 3))).argmin(1, True).shape == (2, 1)
    with pytest.raises(ShapeError, match=r"\[argmax\].*size 0"):
        mx.argmax(mx.array(np.zeros((0, 3))), axis=1)
    with pytest.raises(AxisError):
        mx.argmin(mx.array(3.0), axis=0)


# -- mean, var, std ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", REAL_DTYPES + [mx.complex64], ids=ids)
def test_mean_matches_numpy(dtype):
    x = random_array((3, 4, 5), dtype, rng(5))
    out = mx.float32 if dtype.kind in "biu" else dtype
    for axis in AXES:
        for keepdims in (False, True):
            check_op(lambda a: mx.mean(a, axis, keepdims),
                     lambda a: np.mean(a.astype(np.float64) if a.dtype.kind != "c" else a,
                                       axis=_np_axis(axis), keepdims=keepdims),
                     x, dtype=out, msg=f"axis={axis} keepdims={keepdims}")


@pytest.mark.parametrize("dtype", REAL_DTYPES, ids=ids)
def test_var_matches_numpy(dtype):
    x = random_array((3, 4, 5), dtype, rng(6))
    out = mx.float32 if dtype.kind in "biu" else dtype
    for axis in (None, 0, -1, (0, 2), ()):
        for ddof in (0, 1):
            for keepdims in (False, True):
                check_op(lambda a: mx.var(a, axis, keepdims, ddof),
                         lambda a: np.var(a.astype(np.float64), axis=axis, ddof=ddof,
                                          keepdims=keepdims),
                         x, dtype=out, msg=f"axis={axis} ddof={ddof} keepdims={keepdims}")


@needs["sqrt"]
@pytest.mark.parametrize("dtype", REAL_DTYPES, ids=ids)
def test_std_matches_numpy(dtype):
    x = random_array((3, 4, 5), dtype, rng(7))
    out = mx.float32 if dtype.kind in "biu" else dtype
    for axis in (None, 1, (0, -1)):
        for ddof in (0, 2):
            check_op(lambda a: mx.std(a, axis, ddof=ddof),
                     lambda a: np.std(a.astype(np.float64), axis=axis, ddof=ddof),
                     x, dtype=out, msg=f"axis={axis} ddof={ddof}")
    a = to_lazyx(x)
    assert_close(a.std(axis=1, correction=1), np.std(x.astype(np.float64), axis=1, ddof=1))


@needs["abs"]
def test_var_of_complex_is_real():
    x = random_array((4, 6), mx.complex64, rng(8))
    check_op(lambda a: mx.var(a, axis=1), lambda a: np.var(a, axis=1), x, dtype=mx.float32)


def test_var_ddof_edge_cases_and_method():
    a = mx.array([1.0, 2.0, 3.0, 4.0])
    assert np.isinf(mx.var(a, ddof=4).item()) and np.isinf(mx.var(a, ddof=5).item())
    assert np.isnan(mx.var(mx.array([5.0]), ddof=1).item())
    assert abs(mx.var(a, ddof=-1).item() - 1.0) < 1e-6
    assert abs(a.var(correction=1).item() - 5 / 3) < 1e-6
    assert abs(a.var(ddof=2, correction=1).item() - 5 / 3) < 1e-6
    assert abs(a.var(0, False, 1).item() - 5 / 3) < 1e-6
    with pytest.raises(DtypeError, match="ddof"):
        mx.var(a, ddof=1.5)


def test_var_is_accurate_for_a_large_mean():
    x = (1e4 + np.arange(1, 5)).astype(np.float32)
    check_op(mx.var, np.var, x, dtype=mx.float32)
    y = (300 + rng(9).uniform(-1, 1, 5000)).astype(np.float16)
    check_op(mx.var, np.var, y, dtype=mx.float16, rtol=5e-3)


def test_mean_half_precision_and_empty():
    # The float16 sum of 100000 ones overflows; the mean is still 1.
    assert mx.mean(mx.array(np.ones(100000, np.float16))).item() == 1.0
    x = rng(10).uniform(0, 1, 50000).astype(np.float16)
    check_op(mx.mean, np.mean, x, dtype=mx.float16)
    y = rng(11).uniform(0, 1, 50000).astype(ml_dtypes.bfloat16)
    check_op(lambda a: mx.mean(a, keepdims=True), lambda a: np.mean(a, keepdims=True), y,
             dtype=mx.bfloat16)
    e = mx.mean(mx.array(np.zeros((0, 3), np.float32)), axis=0)
    assert e.shape == (3,) and np.isnan(np.array(e)).all()
    assert mx.mean(mx.array(np.zeros((0, 3), np.int32)), axis=1).shape == (0,)
    # ints are averaged in float32, without integer overflow.
    assert mx.mean(mx.array([2**31 - 1, 2**31 - 1])).item() == float(2**31)


# -- logsumexp ---------------------------------------------------------------------
def _np_logsumexp(x, axis=None, keepdims=False):
    # A real shift keeps complex results on the principal branch of log.
    m = np.max(x.real, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    r = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return r if keepdims else np.squeeze(r, axis=axis)


@pytest.mark.parametrize("dtype", REAL_DTYPES + [mx.complex64], ids=ids)
def test_logsumexp_matches_numpy(dtype):
    x = random_array((3, 4, 5), dtype, rng(12))
    out = mx.float32 if dtype.kind in "biu" else dtype
    for axis in (None, 0, -1, (0, 2), [1, 2]):
        for keepdims in (False, True):
            check_op(lambda a: mx.logsumexp(a, axis, keepdims),
                     lambda a: _np_logsumexp(a.astype(np.float64) if a.dtype.kind != "c" else a,
                                             _np_axis(axis), keepdims),
                     x, dtype=out, msg=f"axis={axis} keepdims={keepdims}")


def test_logsumexp_is_stable_and_handles_infinities():
    inf, nan = np.inf, np.nan
    cases = [([1000.0, 1000.0], 1000.0 + np.log(2)), ([-1000.0, -1000.0], -1000.0 + np.log(2)),
             ([inf, 1.0], inf), ([-inf, -inf], -inf), ([inf, -inf], inf), ([nan, 1.0], nan)]
    for vals, want in cases:
        for d in (mx.float32, mx.float16, mx.bfloat16):
            got = mx.logsumexp(mx.array(vals, d))
            np.testing.assert_allclose(float(got.item()), want, rtol=1e-2, err_msg=str(vals))
    big = np.full((2, 4096), 3.0, np.float16)
    check_op(lambda a: mx.logsumexp(a, axis=1), lambda a: _np_logsumexp(a, 1), big,
             dtype=mx.float16)


def test_logsumexp_empty_zero_dim_and_no_axes():
    with pytest.raises(ShapeError, match=r"\[logsumexp\].*empty"):
        mx.logsumexp(mx.array(np.zeros((3, 0), np.float32)), axis=0)
    check_op(mx.logsumexp, lambda a: a, np.array(1.5, np.float32))
    r = mx.logsumexp(mx.array([1, 2]), axis=())
    assert r.dtype == mx.float32 and r.tolist() == [1.0, 2.0]


# -- count_nonzero, median ---------------------------------------------------------
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=ids)
def test_count_nonzero_matches_numpy(dtype):
    x = random_array((3, 4, 5), dtype, rng(13), low=-1, high=1)
    for axis in (None, 0, (1, -1), ()):
        for keepdims in (False, True):
            check_op(lambda a: mx.count_nonzero(a, axis=axis, keepdims=keepdims),
                     lambda a: np.asarray(np.count_nonzero(a, axis=axis, keepdims=keepdims)
                                          if axis != () else (a != 0)),
                     x, dtype=mx.int32, msg=f"axis={axis} keepdims={keepdims}")
    with pytest.raises(TypeError):
        mx.count_nonzero(to_lazyx(x), 0)  # axis is keyword-only, as in MLX


@pytest.mark.parametrize("dtype", REAL_DTYPES, ids=ids)
def test_median_matches_numpy(dtype):
    x = random_array((4, 5, 6), dtype, rng(14))
    out = mx.float32 if dtype.kind in "biu" else dtype
    for axis in (None, 0, -1, (0, 2)):
        for keepdims in (False, True):
            check_op(lambda a: mx.median(a, axis, keepdims),
                     lambda a: np.median(a.astype(np.float64), axis=axis, keepdims=keepdims),
                     x, dtype=out, msg=f"axis={axis} keepdims={keepdims}")


def test_median_nan_even_and_empty():
    assert mx.median(mx.array([1, 2, 3, 4])).item() == 2.5
    assert np.isnan(mx.median(mx.array([1.0, float("nan"), 3.0])).item())
    check_op(lambda a: mx.median(a, axis=1),
             lambda a: np.median(a, axis=1),
             np.array([[1.0, np.nan, 3.0], [1.0, 2.0, 3.0]], np.float32))
    with pytest.raises(ShapeError, match=r"\[median\]"):
        mx.median(mx.array(np.zeros((0, 3), np.float32)), axis=0)
    assert mx.median(mx.array(np.zeros((0, 3), np.float32)), axis=1).shape == (0,)


# -- scans -------------------------------------------------------------------------
_IDENT = {"sum": 0, "prod": 1, "logaddexp": -np.inf}
_NP_SCAN = {"sum": np.cumsum, "prod": np.cumprod,
            "max": np.maximum.accumulate, "min": np.minimum.accumulate,
            "logaddexp": np.logaddexp.accumulate}
_SCAN_OPS = {"cumsum": "sum", "cumprod": "prod", "cummax": "max", "cummin": "min",
             "logcumsumexp": "logaddexp"}


def _np_scan(op, x, axis, reverse, inclusive):
    if axis is None:
        x, axis = x.reshape(-1), 0
    if reverse:
        x = np.flip(x, axis)
    if op in ("sum", "prod") and x.dtype.kind == "b":
        x = x.astype(np.int64)
    r = _NP_SCAN[op](x, axis=axis)
    if not inclusive:
        if op in _IDENT:
            ident = _IDENT[op]
        elif x.dtype.kind == "b":
            ident = op == "min"
        elif x.dtype.kind in "iu":
            ident = np.iinfo(x.dtype).min if op == "max" else np.iinfo(x.dtype).max
        else:
            ident = -np.inf if op == "max" else np.inf
        r = np.concatenate([np.full_like(np.take(r, [0], axis=axis), ident),
                            np.delete(r, -1, axis=axis)], axis=axis)
    return np.flip(r, axis) if reverse else r


def _scan_dtype(op, d):
    if op == "sum" and d is mx.bool_:
        return mx.int32
    if op == "logaddexp" and d.kind in "biu":
        return mx.float32
    return d


@pytest.mark.parametrize("name", list(_SCAN_OPS))
@pytest.mark.parametrize("dtype", REAL_DTYPES, ids=ids)
def test_scan_matches_numpy(name, dtype):
    op = _SCAN_OPS[name]
    x = random_array((3, 4, 5), dtype, rng(15), low=-2, high=2)
    if op == "logaddexp" and dtype.kind in "biu":
        x_ref = lambda a: a.astype(np.float64)  # noqa: E731
    else:
        x_ref = lambda a: a  # noqa: E731
    axes = [0, 1, -1] + ([None] if _has("reshape") else [])
    for axis in axes:
        for reverse in (False, True):
            for inclusive in (True, False):
                check_op(lambda a: getattr(mx, name)(a, axis, reverse=reverse, inclusive=inclusive),
                         lambda a: _np_scan(op, x_ref(a), axis, reverse, inclusive),
                         x, dtype=_scan_dtype(op, dtype),
                         msg=f"{name} axis={axis} reverse={reverse} inclusive={inclusive}")


def test_scan_values_match_mlx():
    a = mx.array([1, 2, 3])
    assert mx.cumsum(a, reverse=True, inclusive=False).tolist() == [5, 3, 0]
    assert mx.cumprod(a, inclusive=False).tolist() == [1, 1, 2]
    assert mx.cummax(a, inclusive=False).tolist() == [-(2**31), 1, 2]
    assert mx.cummin(a, inclusive=False).tolist() == [2**31 - 1, 1, 1]
    assert mx.cummax(mx.array([1, 2], mx.uint8), inclusive=False).tolist() == [0, 1]
    assert mx.cummin(mx.array([True, False]), inclusive=False).tolist() == [True, True]
    assert mx.cumsum(mx.array([200, 100], mx.uint8)).tolist() == [200, 44]  # wraps
    assert mx.cumsum(mx.array([True, True])).tolist() == [1, 2]
    assert mx.cumprod(mx.array([True, False])).dtype == mx.bool_
    assert mx.cumprod(mx.array([True, False]), inclusive=False).tolist() == [True, True]
    np.testing.assert_allclose(np.array(mx.logcumsumexp(mx.array([1.0, 2, 3]), inclusive=False)),
                               [-np.inf, 1.0, np.logaddexp(1.0, 2.0)], rtol=1e-6)
    np.testing.assert_allclose(np.array(mx.cummax(mx.array([1.0, float("nan"), 3.0]))),
                               [1.0, np.nan, np.nan])


def test_scan_dtype_argument():
    a = mx.array([1, 2], mx.int8)
    assert mx.cumsum(a, dtype=mx.int32).dtype == mx.int32
    assert mx.cumsum(a, dtype=mx.bool_).dtype == mx.int32
    assert mx.cumprod(a, dtype=mx.bool_).tolist() == [True, True]
    assert mx.cumsum(mx.array([1.5, 2.0]), dtype=mx.int32).tolist() == [1, 3]
    assert mx.cumsum(a, dtype=mx.float16).dtype == mx.float16


def test_scan_half_precision_and_stability():
    x = np.full((3000,), 0.1, np.float16)
    check_op(mx.cumsum, np.cumsum, x, dtype=mx.float16, rtol=1e-3)
    y = np.full((3000,), 0.1, ml_dtypes.bfloat16)
    check_op(mx.cumsum, np.cumsum, y, dtype=mx.bfloat16)
    z = np.array([-np.inf, -np.inf, 1000.0, 1000.0], np.float32)
    check_op(mx.logcumsumexp, np.logaddexp.accumulate, z)
    w = np.array([1 + 1j, 2, 3 - 1j], np.complex64)
    check_op(mx.logcumsumexp, lambda a: np.log(np.cumsum(np.exp(a))), w, dtype=mx.complex64)
    check_op(mx.cumsum, np.cumsum, w, dtype=mx.complex64)


def test_scan_empty_zero_dim_and_errors():
    e = np.zeros((0, 3), np.float32)
    for name in _SCAN_OPS:
        check_op(lambda a: getattr(mx, name)(a, axis=0, inclusive=False), lambda a: a, e)
        with pytest.raises(AxisError, match=rf"\[{name}\] axis 2"):
            getattr(mx, name)(mx.array(e), axis=2)
        with pytest.raises(AxisError, match="dimension 0"):
            getattr(mx, name)(mx.array(1.0), axis=0)


@needs["reshape"]
def test_scan_axis_none_flattens():
    x = random_array((2, 3), mx.int32, rng(16))
    check_op(mx.cumsum, lambda a: np.cumsum(a), x, dtype=mx.int32)
    z = mx.cumsum(mx.array(3.0))
    assert z.shape == (1,) and z.tolist() == [3.0]
    assert to_lazyx(x).cummax().shape == (6,)


def test_scan_methods():
    x = random_array((3, 4), mx.float32, rng(17))
    a = to_lazyx(x)
    x64 = x.astype(np.float64)
    assert_close(a.cumsum(1), np.cumsum(x64, 1))
    assert_close(a.cumprod(0, reverse=True), np.flip(np.cumprod(np.flip(x64, 0), 0), 0))
    assert_close(a.cummin(-1), np.minimum.accumulate(x, -1))
    assert_close(a.cummax(axis=0, inclusive=True), np.maximum.accumulate(x, 0))
    assert_close(a.logcumsumexp(1), np.logaddexp.accumulate(x64, 1))
    with pytest.raises(TypeError):
        a.cumsum(1, dtype=mx.float16)  # MLX's method takes no dtype


def test_methods_installed():
    a = mx.array(np.arange(1, 7, dtype=np.float32).reshape(2, 3))
    for name in ("sum", "prod", "max", "min", "mean", "var", "all", "any", "argmax", "argmin",
                 "logsumexp"):
        assert_close(getattr(a, name)(1), getattr(mx, name)(a, 1), msg=name)
    assert_close(a.mean(), np.array(3.5))


def test_transposed_input_through_check_op():
    # to_lazyx keeps a transposed NumPy array's (Fortran) layout.
    x = random_array((5, 7), mx.float32, rng(18)).T
    check_op(lambda a: mx.sum(a, axis=0), lambda a: np.sum(a, axis=0), x)
    check_op(lambda a: mx.var(a, axis=1), lambda a: np.var(a, axis=1), x)
    check_op(lambda a: mx.cumprod(a, axis=1), lambda a: np.cumprod(a, axis=1), x, rtol=1e-4)


@pytest.mark.skipif(not _has("transpose"), reason="needs mx.transpose from the shapes pack")
def test_transposed_lazyx_inputs():
    x = random_array((4, 6, 5), mx.float32, rng(19))
    t = mx.transpose(to_lazyx(x), (2, 0, 1))
    xt = x.transpose(2, 0, 1).astype(np.float64)
    for axis in (None, 0, -1, (0, 2)):
        assert_close(mx.sum(t, axis=axis), np.sum(xt, axis=axis))
        assert_close(mx.mean(t, axis=axis, keepdims=True), np.mean(xt, axis=axis, keepdims=True))
        assert_close(mx.logsumexp(t, axis=axis), _np_logsumexp(xt, axis))
        assert_close(mx.median(t, axis=axis), np.median(xt, axis=axis))
    assert_close(mx.argmax(t, axis=1), np.argmax(xt, axis=1).astype(np.uint32))
    assert_close(mx.cumsum(t, axis=2, inclusive=False),
                 _np_scan("sum", xt, 2, False, False))
    s = to_lazyx(x)[1:, ::2]
    xs = x[1:, ::2].astype(np.float64)
    assert_close(mx.var(s, axis=(0, 2)), np.var(xs, axis=(0, 2)))
    assert_close(mx.prod(s, axis=1), np.prod(xs, axis=1))
