"""The element-wise pack against NumPy float64 references: every op over every dtype
(MLX's output dtype, or a DtypeError for dtypes MLX refuses), broadcasting, 0-d,
empty and non-contiguous inputs, MLX's own integer/bool semantics, erf accuracy."""

import math

import numpy as np
import pytest

import lazyx.core as mx
from helpers import (ALL_DTYPES, FLOAT_DTYPES, assert_close,
                     check_op, random_array, rng, to_lazyx)
from lazyx.errors import ArgumentError, DtypeError, ShapeError

ids = lambda d: d.name  # noqa: E731


# -- expected output dtypes (MLX 0.32) ----------------------------------------
def same(d):
    return d


def to_float(d):
    return mx.float32 if d.kind in "biu" else d


def to_bool(d):
    return mx.bool_


def abs_dtype(d):
    return mx.float32 if d.kind == "c" else d


def shift_dtype(d):
    return mx.uint8 if d.kind == "b" else d


def _f64(fn):
    """A NumPy reference that computes integer and bool inputs in float64."""
    def ref(*xs):
        return fn(*(x.astype(np.float64) if isinstance(x, np.ndarray) and x.dtype.kind in "biu"
                    else x for x in xs))
    return ref


_verf = np.vectorize(math.erf, otypes=[np.float64])


def _erfinv_ref(y):
    # Bisection on math.erf: slow but independent of the kernel under test.
    y = np.asarray(y, np.float64)
    lo, hi = np.full(y.shape, -7.0), np.full(y.shape, 7.0)
    for _ in range(80):
        mid = (lo + hi) / 2
        below = _verf(mid) < y
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    out = (lo + hi) / 2
    out = np.where(y >= 1, np.inf, np.where(y <= -1, -np.inf, out))
    return np.where(np.abs(y) > 1, np.nan, out)


def _sigmoid_ref(x):
    return 1 / (1 + np.exp(-x))


def _sign_ref(x):
    return np.sign(x.astype(np.int8)).astype(bool) if x.dtype.kind == "b" else np.sign(x)


ALL = "buifc"
REAL = "buif"
INTS = "bui"

# name: (numpy reference, accepted kinds, output dtype rule, input range)
UNARY = {
    "abs": (np.abs, ALL, abs_dtype, (-4, 4)),
    "sign": (_sign_ref, ALL, same, (-4, 4)),
    "negative": (np.negative, "uifc", same, (-4, 4)),
    "positive": (np.asarray, ALL, same, (-4, 4)),
    "exp": (_f64(np.exp), ALL, to_float, (-4, 4)),
    "expm1": (_f64(np.expm1), REAL, to_float, (-4, 4)),
    "log": (_f64(np.log), ALL, to_float, (0.1, 4)),
    "log1p": (_f64(np.log1p), ALL, to_float, (-0.9, 4)),
    "log2": (_f64(np.log2), ALL, to_float, (0.1, 4)),
    "log10": (_f64(np.log10), ALL, to_float, (0.1, 4)),
    "sqrt": (_f64(np.sqrt), ALL, to_float, (0.1, 4)),
    "rsqrt": (_f64(lambda x: 1 / np.sqrt(x)), ALL, to_float, (0.1, 4)),
    "square": (np.square, ALL, same, (-4, 4)),
    "reciprocal": (_f64(np.reciprocal), ALL, to_float, (0.5, 4)),
    "sin": (_f64(np.sin), ALL, to_float, (-4, 4)),
    "cos": (_f64(np.cos), ALL, to_float, (-4, 4)),
    "tan": (_f64(np.tan), ALL, to_float, (-1.2, 1.2)),
    "arcsin": (_f64(np.arcsin), ALL, to_float, (-0.95, 0.95)),
    "arccos": (_f64(np.arccos), ALL, to_float, (-0.95, 0.95)),
    "arctan": (_f64(np.arctan), ALL, to_float, (-4, 4)),
    "sinh": (_f64(np.sinh), ALL, to_float, (-3, 3)),
    "cosh": (_f64(np.cosh), ALL, to_float, (-3, 3)),
    "tanh": (_f64(np.tanh), ALL, to_float, (-3, 3)),
    "arcsinh": (_f64(np.arcsinh), ALL, to_float, (-4, 4)),
    "arccosh": (_f64(np.arccosh), ALL, to_float, (1.05, 4)),
    "arctanh": (_f64(np.arctanh), ALL, to_float, (-0.95, 0.95)),
    "floor": (np.floor, REAL, same, (-4, 4)),
    "ceil": (np.ceil, REAL, same, (-4, 4)),
    "trunc": (np.trunc, REAL, same, (-4, 4)),
    "round": (np.round, ALL, same, (-4, 4)),
    "erf": (_f64(_verf), REAL, to_float, (-3, 3)),
    "erfinv": (_f64(_erfinv_ref), REAL, to_float, (-0.99, 0.99)),
    "sigmoid": (_f64(_sigmoid_ref), REAL, to_float, (-6, 6)),
    "logical_not": (np.logical_not, ALL, to_bool, (-2, 2)),
    "isnan": (np.isnan, ALL, to_bool, (-4, 4)),
    "isinf": (np.isinf, ALL, to_bool, (-4, 4)),
    "isfinite": (np.isfinite, ALL, to_bool, (-4, 4)),
    "isposinf": (lambda x: x == np.inf, ALL, to_bool, (-4, 4)),
    "isneginf": (lambda x: x == -np.inf, ALL, to_bool, (-4, 4)),
    "conj": (np.conj, ALL, same, (-4, 4)),
    "conjugate": (np.conj, ALL, same, (-4, 4)),
    "real": (np.real, ALL, abs_dtype, (-4, 4)),
    "imag": (np.imag, ALL, abs_dtype, (-4, 4)),
    "degrees": (_f64(lambda x: x * (180 / np.pi)), ALL, to_float, (-4, 4)),
    "radians": (_f64(lambda x: x * (np.pi / 180)), ALL, to_float, (-4, 4)),
    "bitwise_invert": (np.invert, INTS, same, (-50, 50)),
    "stop_gradient": (np.asarray, ALL, same, (-4, 4)),
}


def _unary_input(name, d, shape=(3, 4), seed=0):
    lo, hi = UNARY[name][3]
    return random_array(shape, d, rng(seed), low=lo, high=hi)


@pytest.mark.parametrize("d", ALL_DTYPES, ids=ids)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_matches_numpy(name, d):
    ref, kinds, rule, _ = UNARY[name]
    fn = getattr(mx, name)
    x = _unary_input(name, d)
    if d.kind not in kinds:
        with pytest.raises(DtypeError, match=name if name != "conjugate" else "conj"):
            fn(to_lazyx(x))
        return
    check_op(fn, ref, x, dtype=rule(d), msg=f"{name} {d.name}")


@pytest.mark.parametrize("name", ["exp", "sin", "abs", "erf", "sigmoid", "isnan", "round",
                                  "bitwise_invert", "real", "sqrt"])
def test_unary_shapes_0d_empty_and_transposed(name):
    ref, kinds, rule, _ = UNARY[name]
    d = mx.int32 if name == "bitwise_invert" else mx.float32
    fn = getattr(mx, name)
    for shape in [(), (0,), (2, 0, 3)]:
        check_op(fn, ref, _unary_input(name, d, shape), dtype=rule(d), msg=f"{name} {shape}")
    x = _unary_input(name, d, (4, 5)).T
    out = check_op(fn, ref, x, dtype=rule(d), msg=f"{name} transposed")
    assert out.shape == (5, 4)


def test_unary_accepts_python_scalars():
    assert_close(mx.exp(1), np.float32(math.e), mx.float32)
    assert_close(mx.abs(-3), np.int32(3), mx.int32)
    assert_close(mx.sqrt(2.0), np.float32(math.sqrt(2)), mx.float32)


def test_aliases_are_the_same_functions():
    pairs = {"acos": "arccos", "acosh": "arccosh", "asin": "arcsin", "asinh": "arcsinh",
             "atan": "arctan", "atan2": "arctan2", "atanh": "arctanh", "pow": "power",
             "bitwise_left_shift": "left_shift", "bitwise_right_shift": "right_shift"}
    for alias, name in pairs.items():
        assert getattr(mx, alias) is getattr(mx, name), alias
    x = to_lazyx(np.array([1 + 2j, 3 - 4j], np.complex64))
    assert_close(mx.conjugate(x), np.conj(np.array([1 + 2j, 3 - 4j])), mx.complex64)


@pytest.mark.parametrize("d", FLOAT_DTYPES + [mx.complex64], ids=ids)
def test_round_decimals(d):
    x = random_array((20,), d, rng(3), -40, 40)
    check_op(lambda a: mx.round(a, 1), lambda a: np.round(a, 1), x, dtype=d,
             atol=0.051 if d in (mx.float16, mx.bfloat16) else None)
    check_op(lambda a: mx.round(a, decimals=-1), lambda a: np.round(a, -1), x, dtype=d,
             atol=10.01 if d is mx.bfloat16 else None)


def test_round_halves_to_even_and_integers():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 3.7], np.float32)
    check_op(mx.round, np.round, x, dtype=mx.float32)
    assert mx.round(to_lazyx(np.array([15, 25, 123], np.int32)), -1).tolist() == [20, 20, 120]
    ints = to_lazyx(np.array([1, 2], np.int16))
    assert mx.round(ints) is ints and mx.round(ints, 2) is ints
    with pytest.raises(DtypeError, match="decimals"):
        mx.round(ints, 1.5)


def test_integral_ops_are_identity_on_integers():
    a = to_lazyx(np.array([1, -2], np.int8))
    for fn in (mx.floor, mx.ceil, mx.trunc, mx.conj, mx.real, mx.positive, mx.nan_to_num):
        assert fn(a) is a, fn.__name__
    u = to_lazyx(np.array([1, 2], np.uint8))
    assert mx.abs(u) is u


def test_erf_accuracy_float64():
    x = np.concatenate([np.linspace(-7, 7, 4001), [0.0, -0.0, 1e-300, 1.0, -1.0, 5.99, 6.0]])
    check_op(mx.erf, _verf, x, dtype=mx.float64, rtol=1e-14, atol=1e-15)
    special = to_lazyx(np.array([np.inf, -np.inf, np.nan]))
    np.testing.assert_array_equal(np.array(mx.erf(special)), [1.0, -1.0, np.nan])


def test_erfinv_accuracy_and_ends():
    y = np.concatenate([np.linspace(-0.999999, 0.999999, 2001), [0.0, 1e-300]])
    out = np.array(mx.erfinv(to_lazyx(y)))
    np.testing.assert_allclose(_verf(out), y, rtol=1e-14, atol=1e-15)
    ends = np.array(mx.erfinv(to_lazyx(np.array([1.0, -1.0, 1.5, -2.0, np.nan]))))
    np.testing.assert_array_equal(ends, [np.inf, -np.inf, np.nan, np.nan, np.nan])
    assert mx.erfinv(to_lazyx(np.array([0.5], np.float16))).dtype is mx.float16


def test_nan_to_num():
    x = np.array([np.nan, np.inf, -np.inf, 1.5, -2.0])
    for d in FLOAT_DTYPES:
        big = float(mx.finfo(d).max)
        out = mx.nan_to_num(to_lazyx(x.astype(d.np)))
        assert out.dtype is d
        np.testing.assert_array_equal(np.array(out).astype(np.float64), [0, big, -big, 1.5, -2.0])
    out = mx.nan_to_num(to_lazyx(x.astype(np.float32)), nan=1.0, posinf=2, neginf=-3.5)
    assert out.tolist() == [1.0, 2.0, -3.5, 1.5, -2.0]
    with pytest.raises(DtypeError, match="nan_to_num"):
        mx.nan_to_num(to_lazyx(np.array([1j], np.complex64)))
    with pytest.raises(DtypeError, match="posinf"):
        mx.nan_to_num(to_lazyx(x), posinf="big")


def test_classification_of_special_values():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -1.0])
    for d in (mx.float16, mx.bfloat16, mx.float32):
        a = to_lazyx(x.astype(d.np))
        for name, ref in [("isnan", np.isnan), ("isinf", np.isinf), ("isfinite", np.isfinite),
                          ("isposinf", np.isposinf), ("isneginf", np.isneginf)]:
            assert_close(getattr(mx, name)(a), ref(x), mx.bool_, msg=f"{name} {d.name}")
    c = to_lazyx(np.array([complex(np.inf, 0), complex(1, np.nan), 1j], np.complex64))
    assert mx.isnan(c).tolist() == [False, True, False]
    assert mx.isposinf(c).tolist() == [True, False, False]


def test_complex_results():
    z = np.array([3 + 4j, -1 - 1j, 0j], np.complex64)
    check_op(mx.abs, np.abs, z, dtype=mx.float32)
    check_op(mx.sign, np.sign, z, dtype=mx.complex64)
    check_op(mx.real, np.real, z, dtype=mx.float32)
    check_op(mx.imag, np.imag, z, dtype=mx.float32)
    # The real part is a strided view of the complex buffer: it feeds further ops.
    check_op(lambda a: mx.add(mx.real(a), mx.imag(a)), lambda a: a.real + a.imag, z,
             dtype=mx.float32)


def test_sigmoid_saturates_without_nan():
    x = np.array([-1000.0, -100.0, 0.0, 100.0, 1000.0], np.float32)
    check_op(mx.sigmoid, _sigmoid_ref, x, dtype=mx.float32)
    h = to_lazyx(np.array([-12.0, 12.0], np.float16))
    assert_close(mx.sigmoid(h), _sigmoid_ref(np.array([-12.0, 12.0])), mx.float16)


# -- binary ops -----------------------------------------------------------------
def _mlx_remainder(a, b):
    r = np.remainder(a, b)
    return np.where(b == 0, a, r).astype(r.dtype) if a.dtype.kind in "biu" else r


def _mlx_power(a, b):
    if a.dtype.kind == "i":
        return np.where(b < 0, 0, np.power(a, np.maximum(b, 0)))
    return np.power(a, b)


def _logaddexp_ref(a, b):
    return np.log(np.exp(a) + np.exp(b)) if a.dtype.kind == "c" else np.logaddexp(a, b)


def _subtract_ref(a, b):
    return np.logical_xor(a, b) if a.dtype.kind == "b" else np.subtract(a, b)


def _shift_ref(fn):
    return lambda a, b: fn(a.astype(np.uint8), b.astype(np.uint8)) if a.dtype.kind == "b" \
        else fn(a, b)


NO_COMPLEX = "buif"
BITS = "bui"
BIG = (-4, 4)

# name: (reference, accepted kinds, output dtype rule, range of a, range of b)
BINARY = {
    "add": (np.add, ALL, same, BIG, BIG),
    "subtract": (_subtract_ref, ALL, same, BIG, BIG),
    "multiply": (np.multiply, ALL, same, BIG, BIG),
    "divide": (_f64(np.divide), ALL, to_float, BIG, (0.5, 4)),
    "floor_divide": (np.floor_divide, NO_COMPLEX, same, (-20, 20), (1, 4)),
    "remainder": (_mlx_remainder, NO_COMPLEX, same, (-20, 20), (1, 4)),
    "power": (_mlx_power, ALL, same, (0.5, 3), (0, 3)),
    "maximum": (np.maximum, ALL, same, BIG, BIG),
    "minimum": (np.minimum, ALL, same, BIG, BIG),
    "logaddexp": (_f64(_logaddexp_ref), ALL, to_float, (-1, 1), (-1, 1)),
    "arctan2": (_f64(np.arctan2), NO_COMPLEX, to_float, BIG, BIG),
    "equal": (np.equal, ALL, to_bool, (-2, 2), (-2, 2)),
    "not_equal": (np.not_equal, ALL, to_bool, (-2, 2), (-2, 2)),
    "less": (np.less, ALL, to_bool, (-2, 2), (-2, 2)),
    "less_equal": (np.less_equal, ALL, to_bool, (-2, 2), (-2, 2)),
    "greater": (np.greater, ALL, to_bool, (-2, 2), (-2, 2)),
    "greater_equal": (np.greater_equal, ALL, to_bool, (-2, 2), (-2, 2)),
    "logical_and": (np.logical_and, ALL, to_bool, (-1, 1), (-1, 1)),
    "logical_or": (np.logical_or, ALL, to_bool, (-1, 1), (-1, 1)),
    "logical_xor": (np.logical_xor, ALL, to_bool, (-1, 1), (-1, 1)),
    "bitwise_and": (np.bitwise_and, BITS, same, (-60, 60), (-60, 60)),
    "bitwise_or": (np.bitwise_or, BITS, same, (-60, 60), (-60, 60)),
    "bitwise_xor": (np.bitwise_xor, BITS, same, (-60, 60), (-60, 60)),
    "left_shift": (_shift_ref(np.left_shift), BITS, shift_dtype, (-60, 60), (0, 7)),
    "right_shift": (_shift_ref(np.right_shift), BITS, shift_dtype, (-60, 60), (0, 7)),
}


def _binary_inputs(name, d, sa=(3, 4), sb=(4,), seed=1):
    _, _, _, ra, rb = BINARY[name]
    g = rng(seed)
    return random_array(sa, d, g, *ra), random_array(sb, d, g, *rb)


@pytest.mark.parametrize("d", ALL_DTYPES, ids=ids)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_matches_numpy(name, d):
    ref, kinds, rule, _, _ = BINARY[name]
    fn = getattr(mx, name)
    a, b = _binary_inputs(name, d)
    if d.kind not in kinds:
        with pytest.raises(DtypeError, match=name):
            fn(to_lazyx(a), to_lazyx(b))
        return
    check_op(fn, ref, a, b, dtype=rule(d), msg=f"{name} {d.name}")
    # the other broadcasting direction
    check_op(fn, ref, b[:, None][:3], a.T[:, :3].T, dtype=rule(d), msg=f"{name} {d.name} T")


@pytest.mark.parametrize("d", ALL_DTYPES, ids=ids)
def test_divmod_is_floor_divide_and_remainder(d):
    a, b = _binary_inputs("remainder", d)
    if d.kind == "c":
        with pytest.raises(DtypeError, match="divmod"):
            mx.divmod(to_lazyx(a), to_lazyx(b))
        return
    out = check_op(mx.divmod, lambda x, y: (np.floor_divide(x, y), _mlx_remainder(x, y)),
                   a, b, dtype=(d, d))
    assert isinstance(out, list) and len(out) == 2 and out[0].shape == (3, 4)


@pytest.mark.parametrize("name", ["add", "divide", "less", "power", "bitwise_and", "maximum"])
def test_binary_shapes_0d_empty_and_transposed(name):
    ref, _, rule, ra, rb = BINARY[name]
    fn = getattr(mx, name)
    d = mx.int32 if name == "bitwise_and" else mx.float32
    g = rng(5)
    cases = [((), ()), ((), (3,)), ((0,), (1,)), ((2, 0), (2, 1)), ((4, 1, 3), (5, 1)),
             ((0, 3), ())]
    for sa, sb in cases:
        check_op(fn, ref, random_array(sa, d, g, *ra), random_array(sb, d, g, *rb),
                 dtype=rule(d), msg=f"{name} {sa} {sb}")
    a = random_array((5, 3), d, g, *ra).T
    b = random_array((3, 5), d, g, *rb)
    check_op(fn, ref, a, b, dtype=rule(d), msg=f"{name} transposed")


def test_broadcast_error_names_both_shapes():
    a = mx.ones((2, 3))
    b = mx.ones((4,))
    with pytest.raises(ShapeError, match=r"\(2, 3\).*\(4,\)"):
        mx.add(a, b)
    with pytest.raises(ShapeError, match=r"\(2, 3\).*\(4,\)"):
        mx.where(mx.ones((2, 3), mx.bool_), a, b)
    with pytest.raises(ShapeError):
        mx.divmod(a, b)
    with pytest.raises(ShapeError):
        mx.allclose(a, b)
    # the arrays involved are unaffected
    assert_close(a + 1, np.full((2, 3), 2.0), mx.float32)


def test_mixed_dtype_promotion():
    i8 = to_lazyx(np.array([1, -2, 3], np.int8))
    u8 = to_lazyx(np.array([1, 2, 3], np.uint8))
    f16 = to_lazyx(np.array([0.5, 1.5, 2.5], np.float16))
    bf16 = to_lazyx(np.array([0.5, 1.5, 2.5], np.float32).astype(mx.bfloat16.np))
    assert mx.add(i8, u8).dtype is mx.int16
    assert mx.multiply(u8, f16).dtype is mx.float16
    assert mx.add(f16, bf16).dtype is mx.float32
    assert mx.divide(i8, u8).dtype is mx.float32
    assert mx.floor_divide(i8, u8).dtype is mx.int16
    assert mx.equal(i8, f16).dtype is mx.bool_
    assert_close(mx.subtract(i8, u8), np.array([0, -4, 0]), mx.int16)
    with pytest.raises(DtypeError, match="bitwise_or"):
        mx.bitwise_or(i8, f16)


def test_integer_division_by_zero_is_quiet_and_matches_mlx(recwarn):
    a = to_lazyx(np.array([7, -7, 0, 5], np.int32))
    z = to_lazyx(np.array([2, 0, 0, 0], np.int32))
    assert mx.floor_divide(a, z).tolist() == [3, 0, 0, 0]
    assert mx.remainder(a, z).tolist() == [1, -7, 0, 5]
    q, r = mx.divmod(a, z)
    assert q.tolist() == [3, 0, 0, 0] and r.tolist() == [1, -7, 0, 5]
    d = np.array(mx.divide(a, z))
    assert d[1] == -np.inf and np.isnan(d[2]) and d[3] == np.inf
    m = to_lazyx(np.array([-128], np.int8))
    assert mx.floor_divide(m, to_lazyx(np.array([-1], np.int8))).tolist() == [-128]
    f = to_lazyx(np.array([1.0, -1.0, 0.0], np.float32))
    mx.eval(mx.floor_divide(f, 0.0), mx.remainder(f, 0.0), mx.log(f), mx.sqrt(f), mx.exp(f * 1e4),
            mx.power(f, -1.0), mx.arctanh(f * 2), mx.erfinv(f * 3))
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_bool_arithmetic_follows_mlx():
    t = to_lazyx(np.array([True, True, False, False]))
    f = to_lazyx(np.array([True, False, True, False]))
    assert mx.add(t, f).tolist() == [True, True, True, False]
    assert mx.subtract(t, f).tolist() == [False, True, True, False]
    assert mx.multiply(t, f).tolist() == [True, False, False, False]
    assert mx.floor_divide(t, f).tolist() == [True, False, False, False]
    assert mx.remainder(t, f).tolist() == [False, True, False, False]
    assert mx.power(t, f).tolist() == [True, True, False, True]
    assert mx.left_shift(t, f).tolist() == [2, 1, 0, 0]
    assert mx.left_shift(t, f).dtype is mx.uint8
    assert mx.divide(t, f).dtype is mx.float32
    with pytest.raises(DtypeError, match="logical_not"):
        mx.negative(t)


def test_integer_power_with_negative_exponent_gives_zero():
    a = to_lazyx(np.array([2, 2, 0, -2, 1, -1], np.int32))
    b = to_lazyx(np.array([3, -1, 0, -2, -5, -3], np.int32))
    assert mx.power(a, b).tolist() == [8, 0, 1, 0, 0, 0]
    assert mx.power(to_lazyx(np.array([2], np.uint8)), 9).tolist() == [0]  # wraps


def test_maximum_minimum_propagate_nan():
    a = to_lazyx(np.array([1.0, np.nan, 2.0], np.float32))
    b = to_lazyx(np.array([np.nan, 0.0, 1.0], np.float32))
    np.testing.assert_array_equal(np.array(mx.maximum(a, b)), [np.nan, np.nan, 2.0])
    np.testing.assert_array_equal(np.array(mx.minimum(a, b)), [np.nan, np.nan, 1.0])


def test_logaddexp_is_stable():
    a = np.array([-np.inf, np.inf, 1000.0, -1000.0, 1.0], np.float32)
    b = np.array([-np.inf, np.inf, 1000.0, -1000.0, 2.0], np.float32)
    check_op(mx.logaddexp, np.logaddexp, a, b, dtype=mx.float32)


# -- where, clip, isclose, allclose, array_equal ------------------------------
@pytest.mark.parametrize("d", ALL_DTYPES, ids=ids)
def test_where_matches_numpy(d):
    g = rng(7)
    c = random_array((3, 1), mx.bool_, g)
    x = random_array((3, 4), d, g)
    y = random_array((4,), d, g)
    check_op(mx.where, np.where, c, x, y, dtype=d)


def test_where_dtypes_and_conditions():
    x = to_lazyx(np.array([1, 2, 3], np.int32))
    assert mx.where(x > 1, 1, 2.0).dtype is mx.float32
    assert mx.where(x > 1, x, 2.0).dtype is mx.float32
    assert mx.where(x > 1, x, 7).dtype is mx.int32
    i8 = to_lazyx(np.array([1], np.int8))
    assert mx.where(x, i8, 1.5).dtype is mx.float32
    out = mx.where(to_lazyx(np.array([1.5, 0.0, -2.0], np.float32)), 1, 2)
    assert out.tolist() == [1, 2, 1] and out.dtype is mx.int32
    assert mx.where(1, 2, 3).tolist() == 2


@pytest.mark.parametrize("d", [mx.int8, mx.uint16, mx.float16, mx.bfloat16, mx.float32],
                         ids=ids)
def test_clip(d):
    x = random_array((3, 5), d, rng(8), -10, 10)
    lo = random_array((5,), d, rng(9), 0, 2)
    check_op(lambda a: mx.clip(a, 1, 5), lambda a: np.clip(a, 1, 5), x, dtype=d)
    check_op(lambda a, b: mx.clip(a, b, None), lambda a, b: np.maximum(a, b), x, lo, dtype=d)
    check_op(lambda a: mx.clip(a, a_min=None, a_max=3), lambda a: np.minimum(a, 3), x, dtype=d)


def test_clip_promotes_and_refuses_no_bounds():
    i8 = to_lazyx(np.array([1, 5], np.int8))
    out = mx.clip(i8, 1.5, 3)
    assert out.dtype is mx.float32 and out.tolist() == [1.5, 3.0]
    with pytest.raises(ArgumentError, match="a_min and a_max"):
        mx.clip(i8, None, None)


@pytest.mark.parametrize("d", [mx.int32, mx.uint8, mx.float16, mx.float32, mx.float64,
                               mx.complex64], ids=ids)
def test_isclose_and_allclose(d):
    g = rng(11)
    a = random_array((4, 6), d, g, 1, 4)
    b = a.copy()
    b[::2] = (b[::2] + 1).astype(b.dtype)  # far
    if d.kind in "fc":
        b[1] = (b[1] * (1 + 1e-6)).astype(b.dtype)  # close
    check_op(mx.isclose, np.isclose, a, b, dtype=mx.bool_)
    check_op(lambda x, y: mx.isclose(x, y, rtol=0.5, atol=1.0),
             lambda x, y: np.isclose(x, y, rtol=0.5, atol=1.0), a, b, dtype=mx.bool_)
    check_op(mx.allclose, np.allclose, a, b, dtype=mx.bool_)
    check_op(mx.allclose, np.allclose, a, a, dtype=mx.bool_)
    assert mx.allclose(to_lazyx(a), to_lazyx(a)).item() is True
    assert mx.allclose(to_lazyx(a), to_lazyx(a[:1])).shape == ()


def test_isclose_nan_and_inf():
    x = to_lazyx(np.array([1.0, np.nan, np.inf, -np.inf], np.float32))
    y = to_lazyx(np.array([1.0, np.nan, np.inf, np.inf], np.float32))
    assert mx.isclose(x, y).tolist() == [True, False, True, False]
    assert mx.isclose(x, y, equal_nan=True).tolist() == [True, True, True, False]
    assert mx.allclose(x, y).item() is False
    assert mx.allclose(y, y, equal_nan=True).item() is True
    assert mx.isclose(to_lazyx(np.array([1, 2], np.uint32)),
                      to_lazyx(np.array([2, 1], np.uint32)), atol=2).tolist() == [True, True]
    assert mx.allclose(mx.zeros((0,)), mx.zeros((0,))).item() is True


def test_array_equal():
    a = to_lazyx(np.array([1, 2], np.int32))
    assert mx.array_equal(a, to_lazyx(np.array([1.0, 2.0], np.float32))).item() is True
    assert mx.array_equal(a, to_lazyx(np.array([1, 2], np.uint8))).item() is True
    assert mx.array_equal(a, to_lazyx(np.array([1, 3], np.int32))).item() is False
    assert mx.array_equal(a, to_lazyx(np.array([[1, 2]], np.int32))).item() is False
    assert mx.array_equal(a, to_lazyx(np.array([1, 2, 3], np.int32))).item() is False
    n = to_lazyx(np.array([1.0, np.nan]))
    assert mx.array_equal(n, n).item() is False
    assert mx.array_equal(n, n, equal_nan=True).item() is True
    assert mx.array_equal(1, 1.0).item() is True
    out = mx.array_equal(mx.zeros((0, 2)), mx.zeros((0, 2)))
    assert out.dtype is mx.bool_ and out.shape == () and out.item() is True


# -- astype --------------------------------------------------------------------
@pytest.mark.parametrize("src", ALL_DTYPES, ids=ids)
def test_astype_to_every_dtype(src):
    x = random_array((3, 4), src, rng(12), -50, 50)
    for dst in ALL_DTYPES:
        def ref(a, dst=dst):
            if a.dtype.kind == "c" and dst.kind != "c":
                a = a.real
            elif src is mx.bfloat16 and dst.kind in "iu":
                a = a.astype(np.float32)  # MLX converts bfloat16 to integers as float32
            with np.errstate(all="ignore"):
                return a.astype(dst.np)
        out = check_op(lambda a: mx.astype(a, dst), ref, x, dtype=dst, upcast=False,
                       msg=f"{src.name}->{dst.name}")
        assert out.shape == (3, 4)


def test_astype_forms():
    a = to_lazyx(np.array([1.7, -2.7], np.float32))
    same = mx.astype(a, mx.float32)
    assert same is not a and same.tolist() == a.tolist()
    same[0] = 9.0  # a new object: assigning into it leaves a alone
    assert a.tolist()[0] == np.float32(1.7)
    assert mx.astype(a, mx.int32).tolist() == [1, -2]
    assert a.astype(dtype=mx.int8).tolist() == [1, -2]
    assert a.astype("float16").dtype is mx.float16
    with pytest.raises(DtypeError):
        mx.astype(a, "float128")
    nan = to_lazyx(np.array([np.nan, np.inf], np.float32))
    assert mx.astype(nan, mx.bool_).tolist() == [True, True]


def test_stop_gradient_is_a_node_with_the_same_values():
    a = mx.ones((2, 2)) * 3
    b = mx.stop_gradient(a)
    assert b is not a and b.dtype is a.dtype
    assert b.tolist() == [[3.0, 3.0], [3.0, 3.0]]


def test_kernel_error_leaves_other_arrays_valid():
    a = mx.ones((2,), mx.float32)
    good = mx.exp(a)
    with pytest.raises(DtypeError):
        mx.bitwise_and(a, a)
    assert_close(good, np.exp(np.ones(2)), mx.float32)
