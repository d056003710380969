"""NumPy kernels of the element-wise op pack.

The op functions have already cast the inputs to the dtype each kernel works
in, so most kernels are one ufunc. The exceptions are MLX semantics NumPy does
not share (bool arithmetic, integer division by zero, integer powers with
negative exponents) and ``erf``/``erfinv``, which NumPy lacks.

The CPU backends silence NumPy's floating point warnings (overflow, x / 0,
inf * 0) for the whole of an evaluation, as MLX never warns, so the kernels
need no ``np.errstate`` of their own.
"""

import functools
import math

import numpy as np

from lazyx.dtypes import numpy_name
from lazyx.plugins import elementwise as ew

from .common import bool_as_uint8

#: The half-precision dtypes by name (ml_dtypes, bfloat16's NumPy dtype, loads only once a
#: bfloat16 array exists).
_HALVES = ("float16", "bfloat16")
_BOOL = np.dtype(np.bool_)


def _in_float32(fn):
    """Compute a float16/bfloat16 input in float32 and round the result back."""
    def kernel(p, ins):
        x = ins[0]
        if numpy_name(x.dtype) in _HALVES:
            return fn(p, [x.astype(np.float32)]).astype(x.dtype)
        return fn(p, ins)
    return kernel


# The ufunc stays readable (``.ufunc``): the cpu backend's size check in front of a
# generated kernel calls it directly, so a small op costs no extra call (compiled.py).
# ``small_ufunc`` tells the scheduler's native loop that the kernel is that ufunc at
# every size (lazyx.backend.Backend), so it calls the ufunc without this lambda.
_ANY_SIZE = 1 << 62


def _unary(ufunc):
    kernel = lambda p, ins: ufunc(ins[0])  # noqa: E731
    kernel.ufunc = kernel.small_ufunc = ufunc
    kernel.small_limit = _ANY_SIZE
    return kernel


def _binary(ufunc):
    kernel = lambda p, ins: ufunc(ins[0], ins[1])  # noqa: E731
    kernel.ufunc = kernel.small_ufunc = ufunc
    kernel.small_limit = _ANY_SIZE
    return kernel


def _is_integral(x) -> bool:
    return x.dtype.kind in "biu"


# -- casts -------------------------------------------------------------------
def _astype(p, ins):
    x = ins[0]
    to = p.dtype
    if x.dtype.kind == "c" and to.kind != "c":
        x = x.real
    elif numpy_name(x.dtype) == "bfloat16" and to.kind in "iu":
        # As MLX (and float32): through float32, so -3 wraps to 253 in uint8; ml_dtypes'
        # own conversion gives 0 or wraps depending on its version.
        x = x.astype(np.float32)
    return x.astype(to.np, copy=False)


# -- rounding ----------------------------------------------------------------
@_in_float32
def _round(p, ins):
    x = ins[0]
    if p.decimals == 0:
        return np.rint(x)
    return np.round(x, p.decimals)


# -- erf and erfinv ----------------------------------------------------------
# erf(x) = x * P(x^2) for |x| <= 1 and erfc(x) = exp(-x^2) * Q(x) for 1 < x < 6
# (erf is +-1 in float64 beyond 6). P and Q are Chebyshev interpolants of the
# reference values from math.erf/math.erfc, built once on first use; both are
# accurate to a few units in the last place of float64.
_ERF_SMALL_DEGREE = 10
_ERFC_DEGREE = 25
_ERF_SATURATES = 6.0
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


@functools.cache
def _erf_interpolants():
    from numpy.polynomial import chebyshev

    def erf_over_x(t):
        r = np.sqrt(t)
        return np.array([_TWO_OVER_SQRT_PI if v == 0 else math.erf(v) / v for v in r])

    def scaled_erfc(x):
        return np.array([math.erfc(v) * math.exp(v * v) for v in x])

    p = chebyshev.Chebyshev.interpolate(erf_over_x, _ERF_SMALL_DEGREE, domain=[0.0, 1.0])
    q = chebyshev.Chebyshev.interpolate(scaled_erfc, _ERFC_DEGREE, domain=[1.0, _ERF_SATURATES])
    return p, q


def _erf64(x: np.ndarray) -> np.ndarray:
    """erf of a float64 array (vectorised)."""
    p, q = _erf_interpolants()
    ax = np.abs(x)
    out = np.sign(x)  # the saturated region, infinities included; NaN stays NaN
    small = ax <= 1.0
    if small.all():
        return x * p(x * x)
    xs = x[small]
    out[small] = xs * p(xs * xs)
    mid = (ax > 1.0) & (ax < _ERF_SATURATES)
    am = ax[mid]
    out[mid] = np.copysign(1.0 - np.exp(-am * am) * q(am), x[mid])
    return out


# Starting point of the erfinv iteration: a closed-form approximation
# (relative error about 2e-3), refined by Halley steps on erf(x) - y = 0.
_ERFINV_A = 0.147
_ERFINV_STEPS = 3


def _erfinv64(y: np.ndarray) -> np.ndarray:
    """erfinv of a float64 array (vectorised)."""
    l = np.log1p(-y * y)
    t = 2.0 / (math.pi * _ERFINV_A) + 0.5 * l
    x = np.copysign(np.sqrt(np.sqrt(t * t - l / _ERFINV_A) - t), y)
    for _ in range(_ERFINV_STEPS):
        f = _erf64(x) - y
        # Halley: erf'' = -2x erf', so the step is f / (erf' + x f).
        x = x - f / (_TWO_OVER_SQRT_PI * np.exp(-x * x) + x * f)
    ends = np.abs(y) == 1.0
    if ends.any():
        x = np.where(ends, np.copysign(np.inf, y), x)
    return x


def _in_float64(fn):
    """Compute a real function in float64 on a flat copy; round back to the input dtype."""
    def kernel(p, ins):
        x = ins[0]
        return fn(x.astype(np.float64).reshape(-1)).astype(x.dtype).reshape(x.shape)
    return kernel


# -- other unary -------------------------------------------------------------
@_in_float32
def _sigmoid(p, ins):
    return 1.0 / (1.0 + np.exp(-ins[0]))


def _rsqrt(p, ins):
    return np.reciprocal(np.sqrt(ins[0]))


def _is_posinf(p, ins):
    x = ins[0]
    return np.zeros(x.shape, _BOOL) if _is_integral(x) else np.equal(x, np.inf)


def _is_neginf(p, ins):
    x = ins[0]
    return np.zeros(x.shape, _BOOL) if _is_integral(x) else np.equal(x, -np.inf)


def _nan_to_num(p, ins):
    x = ins[0]
    out = np.array(x, copy=True)
    np.copyto(out, p.nan, casting="unsafe", where=np.isnan(x))
    np.copyto(out, p.posinf, casting="unsafe", where=np.equal(x, np.inf))
    np.copyto(out, p.neginf, casting="unsafe", where=np.equal(x, -np.inf))
    return out


def _stop_gradient(p, ins):
    return ins[0]  # buffers are immutable: the same data serves


# -- binary with MLX's own semantics ----------------------------------------
def _subtract(p, ins):
    x, y = ins
    if x.dtype == _BOOL:
        return np.logical_xor(x, y)  # MLX's bool subtraction
    return np.subtract(x, y)


def _floor_divide(p, ins):
    x, y = ins
    if x.dtype.kind == "c":
        return np.divide(x, y)  # MLX divides complex numbers without flooring
    return np.floor_divide(x, y)  # integers: x // 0 == 0, as in MLX


def _int_remainder_fix(x, y, r):
    # MLX leaves x % 0 == x for integers (so that (x // y) * y + x % y == x).
    zero = np.equal(y, 0)
    if zero.any():
        return np.where(zero, x, r)
    return r


def _remainder(p, ins):
    x, y = ins
    r = np.remainder(x, y)
    return _int_remainder_fix(x, y, r) if _is_integral(x) else r


def _divmod(p, ins):
    x, y = ins
    q, r = np.divmod(x, y)
    if _is_integral(x):
        r = _int_remainder_fix(x, y, r)
    return (q, r)


def _power(p, ins):
    x, y = ins
    if x.dtype.kind == "i":
        neg = np.less(y, 0)
        if neg.any():
            # NumPy refuses negative integer exponents; MLX gives 0 for them.
            return np.where(neg, 0, np.power(x, np.where(neg, 0, y))).astype(x.dtype)
    return np.power(x, y)


def _logaddexp(p, ins):
    x, y = ins
    if x.dtype.kind != "c":
        return np.logaddexp(x, y)
    hi, lo = np.maximum(x, y), np.minimum(x, y)
    return hi + np.log1p(np.exp(lo - hi))


def _isclose(p, ins):
    return np.isclose(ins[0], ins[1], rtol=p.rtol, atol=p.atol, equal_nan=p.equal_nan)


def _allclose(p, ins):
    return np.asarray(np.all(_isclose(p, ins)))


def _array_equal(p, ins):
    return np.asarray(np.array_equal(ins[0], ins[1], equal_nan=p.equal_nan))


# -- derivative products -----------------------------------------------------
# The ufuncs of the unfused graph, in its order and dtype (so the results are the
# same bits), the later ones in the buffer the first one allocated (``out`` given
# positionally: keyword arguments cost a ufunc call more than a small array's loop).
_ndarray = np.ndarray
_ONE = {np.dtype(t): np.dtype(t).type(1) for t in (np.float16, np.float32, np.float64)}


def _one(d):
    """1 of float dtype ``d`` (bfloat16's added on first use)."""
    one = _ONE.get(d)
    if one is None:
        one = _ONE[d] = d.type(1)
    return one


def _times(g, d):
    """``g * d``, in ``d``'s buffer when it is an array of the result's shape."""
    if type(d) is _ndarray and d.shape == g.shape:
        return np.multiply(g, d, d)
    return np.multiply(g, d)


def _tanh_grad(p, ins):
    g, y = ins
    d = np.square(y)
    if type(d) is _ndarray:
        np.subtract(_one(y.dtype), d, d)
    else:
        d = np.subtract(_one(y.dtype), d)
    return _times(g, d)


def _sigmoid_grad(p, ins):
    g, y = ins
    d = np.subtract(_one(y.dtype), y)
    if type(d) is _ndarray and d.shape == y.shape:
        np.multiply(y, d, d)
    else:
        d = np.multiply(y, d)
    return _times(g, d)


def _sin_grad(p, ins):
    return _times(ins[0], np.cos(ins[1]))


def _cos_grad(p, ins):
    d = np.sin(ins[1])
    if type(d) is _ndarray:
        np.negative(d, d)
    else:
        d = np.negative(d)
    return _times(ins[0], d)


# x + x is x * 2 exactly (doubling only moves the exponent), and one pass cheaper.
def _square_grad(p, ins):
    x = ins[1]
    return _times(ins[0], np.add(x, x))


KERNELS = {
    ew.AsType: _astype,
    ew.Abs: _unary(np.abs),
    ew.Sign: _unary(np.sign),
    ew.Negative: _unary(np.negative),
    ew.Exp: _unary(np.exp),
    ew.Expm1: _unary(np.expm1),
    ew.Log: _unary(np.log),
    ew.Log1p: _unary(np.log1p),
    ew.Log2: _unary(np.log2),
    ew.Log10: _unary(np.log10),
    ew.Sqrt: _unary(np.sqrt),
    ew.Rsqrt: _rsqrt,
    ew.Square: _unary(np.square),
    ew.Sin: _unary(np.sin),
    ew.Cos: _unary(np.cos),
    ew.Tan: _unary(np.tan),
    ew.ArcSin: _unary(np.arcsin),
    ew.ArcCos: _unary(np.arccos),
    ew.ArcTan: _unary(np.arctan),
    ew.Sinh: _unary(np.sinh),
    ew.Cosh: _unary(np.cosh),
    ew.Tanh: _unary(np.tanh),
    ew.ArcSinh: _unary(np.arcsinh),
    ew.ArcCosh: _unary(np.arccosh),
    ew.ArcTanh: _unary(np.arctanh),
    ew.Floor: _unary(np.floor),
    ew.Ceil: _unary(np.ceil),
    ew.Trunc: _unary(np.trunc),
    ew.Round: _round,
    ew.Erf: _in_float64(_erf64),
    ew.ErfInv: _in_float64(_erfinv64),
    ew.Sigmoid: _sigmoid,
    ew.LogicalNot: _unary(np.logical_not),
    ew.IsNan: _unary(np.isnan),
    ew.IsInf: _unary(np.isinf),
    ew.IsFinite: _unary(np.isfinite),
    ew.IsPosInf: _is_posinf,
    ew.IsNegInf: _is_neginf,
    ew.NanToNum: _nan_to_num,
    ew.Conjugate: _unary(np.conjugate),
    ew.Real: _unary(np.real),
    ew.Imag: _unary(np.imag),
    ew.BitwiseInvert: _unary(np.invert),
    ew.StopGradient: _stop_gradient,
    ew.Add: _binary(np.add),
    ew.Subtract: _subtract,
    ew.Multiply: _binary(np.multiply),
    ew.Divide: _binary(np.divide),
    ew.FloorDivide: bool_as_uint8(_floor_divide),
    ew.Remainder: bool_as_uint8(_remainder),
    ew.DivMod: bool_as_uint8(_divmod),
    ew.Power: bool_as_uint8(_power),
    ew.Maximum: _binary(np.maximum),
    ew.Minimum: _binary(np.minimum),
    ew.LogAddExp: _logaddexp,
    ew.ArcTan2: _binary(np.arctan2),
    ew.Equal: _binary(np.equal),
    ew.NotEqual: _binary(np.not_equal),
    ew.Less: _binary(np.less),
    ew.LessEqual: _binary(np.less_equal),
    ew.Greater: _binary(np.greater),
    ew.GreaterEqual: _binary(np.greater_equal),
    ew.LogicalAnd: _binary(np.logical_and),
    ew.LogicalOr: _binary(np.logical_or),
    ew.LogicalXor: _binary(np.logical_xor),
    ew.BitwiseAnd: _binary(np.bitwise_and),
    ew.BitwiseOr: _binary(np.bitwise_or),
    ew.BitwiseXor: _binary(np.bitwise_xor),
    ew.LeftShift: _binary(np.left_shift),
    ew.RightShift: _binary(np.right_shift),
    ew.IsClose: _isclose,
    ew.AllClose: _allclose,
    ew.ArrayEqual: _array_equal,
    ew.Select: lambda p, ins: np.where(ins[0], ins[1], ins[2]),
    ew.TanhGrad: _tanh_grad,
    ew.SigmoidGrad: _sigmoid_grad,
    ew.SinGrad: _sin_grad,
    ew.CosGrad: _cos_grad,
    ew.SquareGrad: _square_grad,
}
