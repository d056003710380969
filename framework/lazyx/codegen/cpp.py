"""The C++ renderer: one kernel source per fused program.

A kernel exports four entry points (fixed, short names; the library file is
named by the source's hash):

* ``lazyx_contiguous(void** buffers, int64 n, int threads)``: every
  non-scalar input is C-contiguous with the loop's shape, so element ``i``
  of every buffer is at index ``i``;
* ``lazyx_strided(void** buffers, const int64* shape, const int64* strides,
  int ndim, int64 n, int threads)``: any layout and broadcasting. ``shape``
  is the loop's shape after the caller collapsed contiguous dimensions and
  ``strides`` holds ``ndim`` element strides per input (0 along a broadcast
  dimension).

Both split the loop over ``threads`` threads started per call. Two more,
``lazyx_contiguous_range(buffers, begin, end)`` and ``lazyx_strided_range(buffers,
shape, strides, ndim, begin, end)``, run one chunk of it on the calling thread:
the call shim (:mod:`lazyx.codegen.jit`) splits a loop over a thread pool with them.

``buffers`` holds the inputs then the outputs. The inputs of size 1 (the
*scalar mask*, part of the source) are loaded once, before the loop, in both
paths; inlined constants are literals. Outputs are always C-contiguous. A kernel
rendered with a *row mask* has a strided path for one family of layouts, every input
read at stride 1 or 0 along the loop's last dimension, that vectorises (see
:func:`render`).

Values are held in their compute type: float16 and bfloat16 buffers hold raw
``uint16`` bits, converted to ``float`` on load and back on store, and every
half-precision result is rounded to its dtype after each op, so that fused
and unfused results agree (NumPy's half-precision kernels compute each op in
float32 and round). Semantics that differ by type (integer floor division,
NumPy's float ``divmod``, shifts past the bit width, NaN-propagating
``maximum``, complex ordering) live once in the preamble as overloaded helpers,
so the renderer writes the same text for every dtype.

**Shared with the CUDA renderer** (:mod:`lazyx.codegen.cuda`): the op
templates (:data:`TEMPLATES`), the semantic helpers (:data:`HELPERS`) and the
statement writer (:class:`Dialect`). The helpers are written against a small
portability layer that each renderer's prologue supplies: ``LX_FN`` (the
qualifiers of a helper), the namespace ``lx_m`` (the math functions and type
traits of the standard library: an alias of ``std`` here, device code there),
the integer typedefs ``lx_i64``, ``lx_u8``, ``lx_u32``, a complex type ``c64``
with ``real()``/``imag()``, and ``lx_f2i<To>(x)``, a float-to-integer
conversion (as NumPy's casts behave on the host); optionally ``LX_THREAD``, the
address space of a pointer to a local (MSL's ``thread``, :mod:`lazyx.codegen.msl`).
"""

from __future__ import annotations

import math

from .. import dtypes as dt
from .ir import Expr, Program
from . import PREAMBLE_END

__all__ = ["render", "COMPUTE_TYPES", "STORAGE_TYPES", "TEMPLATES", "HELPERS", "Dialect",
           "CPP", "MAX_DIMS"]

#: C++ type that holds a value of each dtype during computation.
COMPUTE_TYPES = {
    dt.bool_: "bool", dt.uint8: "uint8_t", dt.uint16: "uint16_t", dt.uint32: "uint32_t",
    dt.uint64: "uint64_t", dt.int8: "int8_t", dt.int16: "int16_t", dt.int32: "int32_t",
    dt.int64: "int64_t", dt.float16: "float", dt.bfloat16: "float", dt.float32: "float",
    dt.float64: "double", dt.complex64: "c64",
}
#: C++ type of a buffer element of each dtype.
STORAGE_TYPES = dict(COMPUTE_TYPES)
STORAGE_TYPES.update({dt.float16: "uint16_t", dt.bfloat16: "uint16_t"})

_LOAD = {dt.float16: "lx_h2f({})", dt.bfloat16: "lx_b2f({})"}
_STORE = {dt.float16: "lx_f2h({})", dt.bfloat16: "lx_f2b({})"}
_ROUND = {dt.float16: "lx_rh({})", dt.bfloat16: "lx_rb({})"}

#: op -> expression; {0} {1} {2} are the operands (already in their compute type). The
#: same text serves every renderer: ``lx_m`` is ``std`` in C++, device math in CUDA.
TEMPLATES = {
    "neg": "lx_neg({0})", "abs": "lx_abs({0})", "sign": "lx_sign({0})",
    "square": "lx_square({0})", "conj": "lx_m::conj({0})", "real": "({0}).real()",
    "imag": "({0}).imag()",
    "exp": "lx_m::exp({0})", "expm1": "lx_m::expm1({0})", "log": "lx_m::log({0})",
    "log1p": "lx_log1p({0})", "log2": "lx_log2({0})", "log10": "lx_m::log10({0})",
    "sqrt": "lx_m::sqrt({0})", "rsqrt": "lx_rsqrt({0})",
    "sin": "lx_m::sin({0})", "cos": "lx_m::cos({0})", "tan": "lx_m::tan({0})",
    "asin": "lx_m::asin({0})", "acos": "lx_m::acos({0})", "atan": "lx_m::atan({0})",
    "sinh": "lx_m::sinh({0})", "cosh": "lx_m::cosh({0})", "tanh": "lx_tanh({0})",
    "asinh": "lx_m::asinh({0})", "acosh": "lx_m::acosh({0})", "atanh": "lx_m::atanh({0})",
    "erf": "lx_erf({0})", "erfinv": "lx_erfinv({0})", "sigmoid": "lx_sigmoid({0})",
    "floor": "lx_m::floor({0})", "ceil": "lx_m::ceil({0})", "trunc": "lx_m::trunc({0})",
    "rint": "lx_m::nearbyint({0})",
    "not": "lx_not({0})", "bitnot": "lx_bitnot({0})", "isnan": "lx_isnan({0})",
    "isinf": "lx_isinf({0})", "isfinite": "lx_isfinite({0})",
    "isposinf": "lx_isposinf({0})", "isneginf": "lx_isneginf({0})",
    "add": "({0} + {1})", "sub": "lx_sub({0}, {1})", "mul": "({0} * {1})",
    "div": "({0} / {1})", "floordiv": "lx_floordiv({0}, {1})", "mod": "lx_mod({0}, {1})",
    "pow": "lx_pow({0}, {1})", "max": "lx_max({0}, {1})", "min": "lx_min({0}, {1})",
    "logaddexp": "lx_logaddexp({0}, {1})", "atan2": "lx_m::atan2({0}, {1})",
    "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "lx_lt({0}, {1})",
    "le": "lx_le({0}, {1})", "gt": "lx_lt({1}, {0})", "ge": "lx_le({1}, {0})",
    "and": "(lx_nz({0}) && lx_nz({1}))", "or": "(lx_nz({0}) || lx_nz({1}))",
    "xor": "(lx_nz({0}) != lx_nz({1}))",
    "bitand": "({0} & {1})", "bitor": "({0} | {1})", "bitxor": "({0} ^ {1})",
    "shl": "lx_shl({0}, {1})", "shr": "lx_shr({0}, {1})",
    "select": "({0} ? {1} : {2})",
}

# Least-squares rational fits x P(x^2) / Q(x^2) in float32 (erf fitted on
# [-3.92, 3.92], tanh on [-7.9, 7.9]), saturating to +-1: relative error below
# 5e-7 over the whole line (about 8 ulp), and vectorisable, unlike
# libm's erff/tanhf. The degrees are the lowest that reach that accuracy (the
# tanh form of GELU is compute-bound on them). Coefficients lowest degree first.
_ERF_SATURATE = 3.68
_ERF_P = (1.1283791065216064, 0.20011022686958313, 0.050596706569194794,
          0.003707589814439416, 0.0001418438187101856, -1.9545116174413124e-06,
          1.986311026769272e-08)
_ERF_Q = (1.0, 0.510674774646759, 0.11507382988929749, 0.014367420226335526,
          0.0009569809772074223)
_TANH_SATURATE = 7.9
_TANH_P = (0.9999998807907104, 0.12929880619049072, 0.0029556730296462774,
           1.1481862202344928e-05)
_TANH_Q = (1.0, 0.4626309871673584, 0.023834241554141045, 0.0002393443719483912,
           2.4769744300101593e-07)


def _horner(coeffs, var: str) -> str:
    text = f"{coeffs[-1]!r}f"
    for c in reversed(coeffs[:-1]):
        text = f"({text} * {var} + {c!r}f)"
    return text


def _rational(name: str, saturate: float, p, q) -> str:
    return f"""static inline float {name}(float x) {{
  // +-1 from |x| >= saturate on (the function is within 2e-7 of it there), the fit
  // inside, where it stays in [-1, 1]. Selects only: the loop must vectorise. NaN
  // passes through; the fit's value for huge |x| (inf / inf) is never selected.
  const float t = x * x;
  const float r = x * {_horner(p, "t")} / {_horner(q, "t")};
  return x >= {saturate!r}f ? 1.0f : (x <= -{saturate!r}f ? -1.0f : r);
}}"""


def type_traits(integers, floats) -> str:
    """``lx_m``'s type traits, for a source without the standard library (CUDA's NVRTC,
    MSL): ``info<T>`` and the ``is_*_v``, ``is_same_v``, ``make_unsigned_t`` and
    ``conditional_t`` the helpers use. ``integers`` are (signed, unsigned) type-name pairs,
    narrowest first; ``floats`` the floating types. (C++ sources alias ``std``.)"""
    info = ["LX_INFO(bool, false, true, false)"]
    for signed, unsigned in integers:
        info += [f"LX_INFO({signed}, false, true, true)", f"LX_INFO({unsigned}, false, true, false)"]
    info += [f"LX_INFO({f}, true, false, true)" for f in floats]
    unsigned_of = [f"template <> struct make_unsigned<{s}> {{ typedef {u} type; }};"
                   for s, u in integers]
    return "\n".join([
        "template <class T> struct info { static constexpr bool fp = false, integral = false, "
        "sign = false; };",
        "#define LX_INFO(T, F, I, S) \\",
        "  template <> struct info<T> { static constexpr bool fp = F, integral = I, sign = S; };",
        *info,
        "#undef LX_INFO",
        "template <class T> constexpr bool is_floating_point_v = info<T>::fp;",
        "template <class T> constexpr bool is_integral_v = info<T>::integral;",
        "template <class T> constexpr bool is_signed_v = info<T>::sign;",
        "template <class T> constexpr bool is_unsigned_v = info<T>::integral && !info<T>::sign;",
        "template <class A, class B> struct same { static constexpr bool value = false; };",
        "template <class A> struct same<A, A> { static constexpr bool value = true; };",
        "template <class A, class B> constexpr bool is_same_v = same<A, B>::value;",
        "template <class T> struct make_unsigned { typedef T type; };",
        *unsigned_of,
        "template <class T> using make_unsigned_t = typename make_unsigned<T>::type;",
        "template <bool C, class A, class B> struct conditional { typedef A type; };",
        "template <class A, class B> struct conditional<false, A, B> { typedef B type; };",
        "template <bool C, class A, class B> using conditional_t = "
        "typename conditional<C, A, B>::type;"])


#: The semantic helpers every renderer shares (see the module docstring for what the
#: including source must define first). Each op's meaning is written here once.
HELPERS = r"""// -- lazyx semantic helpers (shared by the renderers; see lazyx/codegen/cpp.py) --------
// LX_THREAD: the address space of a pointer to a local (MSL's `thread`; nothing in C++).
#ifndef LX_THREAD
#define LX_THREAD
#endif
template <class T> struct lx_is_complex { static constexpr bool value = false; };
template <> struct lx_is_complex<c64> { static constexpr bool value = true; };
template <class T> constexpr bool lx_cplx = lx_is_complex<T>::value;
// Unsigned arithmetic of at least int's width: wraps, and no small type promotes to a
// signed int that could overflow (undefined behaviour that an optimiser may exploit).
template <class T> using lx_uint_for =
    lx_m::conditional_t<(sizeof(T) < 4), lx_u32, lx_m::make_unsigned_t<T>>;

// -- casts (astype's rules: complex to real keeps the real part) --------------------
template <class To, class From> LX_FN To lx_cast(From x) {
  if constexpr (lx_cplx<From> && !lx_cplx<To>) return lx_cast<To>(x.real());
  else if constexpr (lx_cplx<To>) return To((float)x, 0.0f);
  else if constexpr (lx_m::is_same_v<To, bool>) return x != From(0);
  else if constexpr (lx_m::is_floating_point_v<From> && lx_m::is_integral_v<To>) return lx_f2i<To>(x);
  // A select, not a conversion of the byte: a loop of compare, cast and multiply (a
  // mask's gradient) then vectorises.
  else if constexpr (lx_m::is_same_v<From, bool> && lx_m::is_floating_point_v<To>)
    return x ? To(1) : To(0);
  else return (To)x;
}
template <class T> LX_FN bool lx_nz(T a) { return a != T(0); }

// -- unary ------------------------------------------------------------------------
template <class T> LX_FN T lx_neg(T a) {
  if constexpr (lx_m::is_integral_v<T> && !lx_m::is_same_v<T, bool>)
    return (T)((lx_uint_for<T>)0 - (lx_uint_for<T>)a);
  else return (T)(-a);
}
template <class T> LX_FN auto lx_abs(T a) {
  if constexpr (lx_cplx<T>) return lx_m::abs(a);
  else if constexpr (lx_m::is_unsigned_v<T> || lx_m::is_same_v<T, bool>) return a;
  else if constexpr (lx_m::is_integral_v<T>) return (T)(a < 0 ? lx_neg(a) : a);
  else return lx_m::fabs(a);
}
template <class T> LX_FN T lx_sign(T a) {
  if constexpr (lx_cplx<T>) { float m = lx_m::abs(a); return m == 0.0f ? T(0) : a / m; }
  else if constexpr (lx_m::is_same_v<T, bool>) return a;
  else if constexpr (lx_m::is_unsigned_v<T>) return (T)(a > 0);
  else if constexpr (lx_m::is_integral_v<T>) return (T)((a > 0) - (a < 0));
  else return a > 0 ? T(1) : (a < 0 ? T(-1) : (a == 0 ? T(0) : a));
}
template <class T> LX_FN T lx_square(T a) {
  if constexpr (lx_m::is_integral_v<T> && !lx_m::is_same_v<T, bool>)
    return (T)((lx_uint_for<T>)a * (lx_uint_for<T>)a);
  else return (T)(a * a);
}
template <class T> LX_FN T lx_rsqrt(T a) { return T(1) / lx_m::sqrt(a); }
template <class T> LX_FN T lx_log1p(T a) {
  if constexpr (lx_cplx<T>) return lx_m::log(T(1) + a); else return lx_m::log1p(a);
}
template <class T> LX_FN T lx_log2(T a) {
  if constexpr (lx_cplx<T>) return lx_m::log(a) / 0.6931471805599453f; else return lx_m::log2(a);
}
template <class T> LX_FN T lx_sigmoid(T a) { return T(1) / (T(1) + lx_m::exp(-a)); }
template <class T> LX_FN bool lx_not(T a) { return a == T(0); }
template <class T> LX_FN T lx_bitnot(T a) {
  if constexpr (lx_m::is_same_v<T, bool>) return !a; else return (T)(~a);
}
template <class T> LX_FN bool lx_isnan(T a) {
  if constexpr (lx_cplx<T>) return lx_m::isnan(a.real()) || lx_m::isnan(a.imag());
  else if constexpr (lx_m::is_integral_v<T>) return false; else return lx_m::isnan(a);
}
template <class T> LX_FN bool lx_isinf(T a) {
  if constexpr (lx_cplx<T>) return lx_m::isinf(a.real()) || lx_m::isinf(a.imag());
  else if constexpr (lx_m::is_integral_v<T>) return false; else return lx_m::isinf(a);
}
template <class T> LX_FN bool lx_isfinite(T a) {
  if constexpr (lx_cplx<T>) return lx_m::isfinite(a.real()) && lx_m::isfinite(a.imag());
  else if constexpr (lx_m::is_integral_v<T>) return true; else return lx_m::isfinite(a);
}
template <class T> LX_FN bool lx_isposinf(T a) {
  if constexpr (lx_m::is_integral_v<T>) return false;
  else return a == lx_m::numeric_limits<T>::infinity();
}
template <class T> LX_FN bool lx_isneginf(T a) {
  if constexpr (lx_m::is_integral_v<T>) return false;
  else return a == -lx_m::numeric_limits<T>::infinity();
}

// -- binary -----------------------------------------------------------------------
// Integer sums and products wrap like the dtype (NumPy's), computed unsigned.
template <class T> LX_FN T lx_add(T a, T b) {
  if constexpr (lx_m::is_integral_v<T> && !lx_m::is_same_v<T, bool>)
    return (T)((lx_uint_for<T>)a + (lx_uint_for<T>)b);
  else return (T)(a + b);
}
template <class T> LX_FN T lx_mul(T a, T b) {
  if constexpr (lx_m::is_integral_v<T> && !lx_m::is_same_v<T, bool>)
    return (T)((lx_uint_for<T>)a * (lx_uint_for<T>)b);
  else return (T)(a * b);
}
template <class T> LX_FN T lx_sub(T a, T b) {
  if constexpr (lx_m::is_same_v<T, bool>) return a != b;
  else if constexpr (lx_m::is_integral_v<T>) return (T)((lx_uint_for<T>)a - (lx_uint_for<T>)b);
  else return (T)(a - b);
}
// NumPy's float divmod: the quotient is floored, the remainder has b's sign.
template <class T> LX_FN T lx_fdivmod(T a, T b, LX_THREAD T* rem) {
  T mod = lx_m::fmod(a, b);
  if (!b) { *rem = mod; return a / b; }
  T div = (a - mod) / b;
  if (mod) { if ((b < 0) != (mod < 0)) { mod += b; div -= T(1); } }
  else mod = lx_m::copysign(T(0), b);
  T q;
  if (div) { q = lx_m::floor(div); if (div - q > T(0.5)) q += T(1); }
  else q = lx_m::copysign(T(0), a / b);
  *rem = mod;
  return q;
}
// Integers: x // 0 == 0 and x % 0 == x (MLX); MIN // -1 wraps instead of trapping.
template <class T> LX_FN T lx_floordiv(T a, T b) {
  if constexpr (lx_m::is_same_v<T, bool>) return (bool)lx_floordiv<lx_u8>(a, b);
  else if constexpr (lx_cplx<T>) return a / b;
  else if constexpr (lx_m::is_floating_point_v<T>) { T r; return lx_fdivmod(a, b, &r); }
  else if constexpr (lx_m::is_unsigned_v<T>) return b == 0 ? T(0) : (T)(a / b);
  else {
    if (b == 0) return T(0);
    if (b == -1) return lx_neg(a);
    T q = (T)(a / b);
    return ((a % b != 0) && ((a < 0) != (b < 0))) ? (T)(q - 1) : q;
  }
}
template <class T> LX_FN T lx_mod(T a, T b) {
  if constexpr (lx_m::is_same_v<T, bool>) return (bool)lx_mod<lx_u8>(a, b);
  else if constexpr (lx_m::is_floating_point_v<T>) {
    if (!b) return lx_m::fmod(a, b);
    T r; lx_fdivmod(a, b, &r); return r;
  }
  else if constexpr (lx_m::is_unsigned_v<T>) return b == 0 ? a : (T)(a % b);
  else {
    if (b == 0) return a;
    if (b == -1) return T(0);
    T r = (T)(a % b);
    return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r;
  }
}
// Integer powers by squaring, wrapping like the dtype; negative exponents give 0.
template <class T> LX_FN T lx_pow(T a, T b) {
  if constexpr (lx_m::is_same_v<T, bool>) return (bool)lx_pow<lx_u8>(a, b);
  else if constexpr (lx_m::is_integral_v<T>) {
    if constexpr (lx_m::is_signed_v<T>) { if (b < 0) return T(0); }
    typedef lx_uint_for<T> U;
    U r = 1, x = (U)a, e = (U)b;
    while (e) { if (e & 1u) r = (U)(r * x); x = (U)(x * x); e >>= 1; }
    return (T)r;
  }
  else return lx_m::pow(a, b);
}
// NumPy's complex ordering: lexicographic, false when an operand holds a NaN.
template <class T> LX_FN bool lx_lt(T a, T b) {
  if constexpr (lx_cplx<T>)
    return (a.real() < b.real() && !lx_m::isnan(a.imag()) && !lx_m::isnan(b.imag())) ||
           (a.real() == b.real() && a.imag() < b.imag());
  else return a < b;
}
template <class T> LX_FN bool lx_le(T a, T b) {
  if constexpr (lx_cplx<T>)
    return (a.real() < b.real() && !lx_m::isnan(a.imag()) && !lx_m::isnan(b.imag())) ||
           (a.real() == b.real() && a.imag() <= b.imag());
  else return a <= b;
}
// maximum/minimum propagate NaN (the first operand's when both are NaN).
template <class T> LX_FN T lx_max(T a, T b) {
  if constexpr (lx_cplx<T>) return (lx_isnan(a) || lx_le(b, a)) ? a : b;
  else if constexpr (lx_m::is_floating_point_v<T>) return (a >= b || a != a) ? a : b;
  else return a >= b ? a : b;
}
template <class T> LX_FN T lx_min(T a, T b) {
  if constexpr (lx_cplx<T>) return (lx_isnan(a) || lx_le(a, b)) ? a : b;
  else if constexpr (lx_m::is_floating_point_v<T>) return (a <= b || a != a) ? a : b;
  else return a <= b ? a : b;
}
template <class T> LX_FN T lx_logaddexp(T a, T b) {
  if constexpr (lx_cplx<T>) {
    T hi = lx_max(a, b), lo = lx_min(a, b);
    return hi + lx_m::log(T(1) + lx_m::exp(lo - hi));
  } else {
    if (a == b) return a + T(0.6931471805599453);  // also inf + inf
    T d = a - b;
    if (d > 0) return a + lx_m::log1p(lx_m::exp(-d));
    if (d <= 0) return b + lx_m::log1p(lx_m::exp(d));
    return d;  // NaN
  }
}
// Shifts by the bit width or more give 0 (-1 for a negative number shifted right).
template <class T> LX_FN T lx_shl(T a, T b) {
  typedef lx_m::make_unsigned_t<T> U;
  return ((U)b < sizeof(T) * 8) ? (T)((lx_uint_for<T>)(U)a << (U)b) : T(0);
}
template <class T> LX_FN T lx_shr(T a, T b) {
  typedef lx_m::make_unsigned_t<T> U;
  if ((U)b < sizeof(T) * 8) return (T)(a >> (U)b);
  if constexpr (lx_m::is_signed_v<T>) return a < 0 ? T(-1) : T(0); else return T(0);
}
"""

_PROLOGUE = r"""// lazyx fused element-wise kernel (generated; see lazyx/codegen/cpp.py)
#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>
#include <type_traits>
#include <vector>
__LX_HEADER__
#define LX_FN static inline
// The element loops carry no dependence between iterations (an output may share its
// buffer with an input, a donated one, but only element for element): said to the
// compiler, it vectorises loops of many arrays without the runtime overlap checks it
// otherwise gives up on (GCC past 10 pointer pairs: an optimizer's update of 4 inputs
// and 3 outputs ran scalar).
#if defined(__clang__)
#define LX_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define LX_IVDEP _Pragma("GCC ivdep")
#else
#define LX_IVDEP
#endif
namespace lx_m = std;
typedef int64_t lx_i64;
typedef uint8_t lx_u8;
typedef uint32_t lx_u32;
typedef std::complex<float> c64;
// Float to integer: the host's own conversions (x86: out of range or NaN gives the most
// negative value), unsigned ones through int64 as NumPy's casts go (-3.0 becomes
// 2**bits - 3, not saturated).
template <class To, class From> LX_FN To lx_f2i(From x) {
  if constexpr (std::is_unsigned_v<To>) {
    if constexpr (sizeof(To) == 8) return x < (From)9.2233720368547758e18 ? (To)(int64_t)x : (To)x;
    else return (To)(int64_t)x;
  }
  else return (To)x;
}

// -- half precision: buffers hold raw bits, values are float ----------------------
static inline float lx_b2f(uint16_t h) {
  uint32_t u = (uint32_t)h << 16; float f; std::memcpy(&f, &u, 4); return f;
}
static inline uint16_t lx_f2b(float f) {  // round to nearest even; NaN stays NaN
  uint32_t u; std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
#if defined(__FLT16_MANT_DIG__) && !defined(LAZYX_SOFT_HALF)
static inline float lx_h2f(uint16_t h) { _Float16 v; std::memcpy(&v, &h, 2); return (float)v; }
static inline uint16_t lx_f2h(float f) {
  _Float16 v = (_Float16)f; uint16_t h; std::memcpy(&h, &v, 2); return h;
}
#else  // no _Float16: exact conversions by bit manipulation
static inline float lx_h2f(uint16_t h) {
  uint32_t em = h & 0x7fffu, bits = em << 13; float f;
  if (em >= 0x7c00u) { bits |= 0x7f800000u; std::memcpy(&f, &bits, 4); }
  else { std::memcpy(&f, &bits, 4); f *= 0x1p112f; }  // rebias normals and subnormals
  uint32_t u; std::memcpy(&u, &f, 4); u |= (uint32_t)(h & 0x8000u) << 16;
  std::memcpy(&f, &u, 4); return f;
}
static inline uint16_t lx_f2h(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u), h;
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) h = (uint16_t)(0x7e00u | ((u >> 13) & 0x3ffu));
  else if (u >= 0x477ff000u) h = 0x7c00u;  // rounds to infinity
  else if (u < 0x38800000u) {  // subnormal: let the FPU round at 2^-24
    float a; std::memcpy(&a, &u, 4); a += 0.5f;
    uint32_t v; std::memcpy(&v, &a, 4); h = (uint16_t)(v - 0x3f000000u);
  } else h = (uint16_t)((u + 0xc8000fffu + ((u >> 13) & 1u)) >> 13);
  return (uint16_t)(h | sign);
}
#endif
static inline float lx_rh(float x) { return lx_h2f(lx_f2h(x)); }
static inline float lx_rb(float x) { return lx_b2f(lx_f2b(x)); }

"""

def erfinv_source(name: str, float_name: str) -> str:
    """Host C++ of erfinv as functions ``name(double)`` and ``float_name(float)``: the
    C++ renderer's ``lx_erfinv``, and CUDA's ``erfinv``/``erfinvf`` in the host shim
    that runs generated CUDA on the CPU (``lazyx.backends.cuda.cuda_cpu``)."""
    return f"""static inline double {name}(double y) {{
  // A closed-form start (relative error ~2e-3) refined by Halley steps on erf(x) = y.
  const double a = 0.147, two_over_sqrt_pi = 1.1283791670955126;
  double l = std::log1p(-y * y), t = 2.0 / (3.141592653589793 * a) + 0.5 * l;
  double x = std::copysign(std::sqrt(std::sqrt(t * t - l / a) - t), y);
  for (int k = 0; k < 3; ++k) {{
    double f = std::erf(x) - y;
    x = x - f / (two_over_sqrt_pi * std::exp(-x * x) + x * f);
  }}
  return std::fabs(y) == 1.0 ? std::copysign(INFINITY, y) : x;
}}
static inline float {float_name}(float y) {{ return (float){name}((double)y); }}
"""


_EPILOGUE = r"""
// -- the C++ renderer's own functions ----------------------------------------------
__LX_RATIONALS__
static inline double lx_erf(double x) { return std::erf(x); }
static inline double lx_tanh(double x) { return std::tanh(x); }
static inline c64 lx_tanh(c64 x) { return std::tanh(x); }
__LX_ERFINV__
// -- threads ----------------------------------------------------------------------
// Split [0, n) into one chunk per thread (multiples of 64 elements, so no two
// threads write one cache line); the caller runs the first chunk.
template <class F> static void lx_parallel(int64_t n, int threads, F f) {
  int64_t chunk = threads > 1 ? ((n + threads - 1) / threads + 63) / 64 * 64 : n;
  if (threads <= 1 || chunk >= n) { f((int64_t)0, n); return; }
  std::vector<std::thread> pool;
  int64_t begin = chunk;
  try {
    for (; begin < n; begin += chunk) pool.emplace_back(f, begin, std::min(n, begin + chunk));
  } catch (...) {  // no thread to be had: run the rest here
    f(begin, n);
  }
  f((int64_t)0, std::min(n, chunk));
  for (auto& t : pool) t.join();
}
"""

_PREAMBLE = _PROLOGUE + HELPERS + _EPILOGUE.replace(
    "__LX_ERFINV__", erfinv_source("lx_erfinv", "lx_erfinv"))

# Integer results that C++ computes in a wider type.
_WIDENING = {"add", "mul", "bitand", "bitor", "bitxor"}


class Dialect:
    """What one C-family renderer writes differently: type names, op templates and the
    spelling of float literals. Everything else about a program's statements is shared.

    Args:
        compute_types: dtype -> the type holding a value during computation.
        storage_types: dtype -> the type of a buffer element.
        templates: op -> expression template (:data:`TEMPLATES` or a variant).
        hex_floats: write finite float literals in hexadecimal (exact); else as the
            shortest decimal that reads back as the same value.
    """

    def __init__(self, compute_types, storage_types, templates, hex_floats: bool):
        self.compute_types = compute_types
        self.storage_types = storage_types
        self.templates = templates
        self.hex_floats = hex_floats

    def literal(self, value, d) -> str:
        """A literal of ``value`` in ``d``'s compute type."""
        ct = self.compute_types[d]
        if d.kind == "b":
            return "true" if value else "false"
        if d.kind in "ui":
            if d is dt.int64 and value == -2**63:
                return "(-9223372036854775807LL - 1)"
            suffix = "ULL" if d.kind == "u" else "LL"
            return f"(({ct}){value}{suffix})"
        if d.kind == "c":
            return (f"c64({self.float_literal(value.real, 'float')}, "
                    f"{self.float_literal(value.imag, 'float')})")
        return self.float_literal(value, ct)

    def float_literal(self, v: float, ct: str) -> str:
        if math.isnan(v):
            return f"lx_m::numeric_limits<{ct}>::quiet_NaN()"
        if math.isinf(v):
            return f"{'-' if v < 0 else ''}lx_m::numeric_limits<{ct}>::infinity()"
        f = "f" if ct == "float" else ""
        if self.hex_floats:
            return f"{v.hex()}{f}"
        # repr reads back as the same double; for a float32 value the f literal then
        # reads as that float too (the decimal is far from any float32 midpoint).
        return f"{v!r}{f}"

    @staticmethod
    def load(d, text: str) -> str:
        """``text`` (a buffer element of dtype ``d``) in its compute type."""
        return _wrap(_LOAD, d, text)

    @staticmethod
    def store(d, text: str) -> str:
        """``text`` (a value of dtype ``d``) as a buffer element."""
        return _wrap(_STORE, d, text)

    def node_text(self, e: Expr, names: dict) -> str:
        """The expression of op node ``e`` in its compute type (rounded for halves)."""
        args = [names[id(a)] for a in e.args]
        ct = self.compute_types[e.dtype]
        if e.op == "cast":
            # bfloat16 is computed as float, so it converts to integers as float32 does
            # (MLX's rule).
            text = f"lx_cast<{ct}>({args[0]})"
        else:
            text = self.templates[e.op].format(*args)
            if e.dtype.kind in "biu" and e.op in _WIDENING:
                text = f"({ct}){text}"  # C++ promotes small integers to int
        rnd = _ROUND.get(e.dtype)
        return rnd.format(text) if rnd is not None else text

    def body(self, program: Program, scalar: tuple, load, inputs=None) -> tuple[list, list]:
        """Statements computing every output of ``program`` at one element, and the
        output values' names. ``load(k)`` is the expression of input ``k``'s buffer
        element; scalar inputs are the names ``s<k>``, loaded by the caller. Only the
        inputs in ``inputs`` (default: every one the program reads) are loaded."""
        ct = self.compute_types
        names, lines = {}, []
        for k, e in enumerate(program.nodes):
            if e.op == "input":
                names[id(e)] = f"s{e.value}" if scalar[e.value] else f"a{e.value}"
                continue
            if e.op == "const":
                names[id(e)] = self.literal(e.value, e.dtype)
                continue
            names[id(e)] = f"v{k}"
            lines.append(f"const {ct[e.dtype]} v{k} = {self.node_text(e, names)};")
        loads = []
        used = used_inputs(program) if inputs is None else inputs
        for k, d in enumerate(program.inputs):
            if k in used and not scalar[k]:
                loads.append(f"const {ct[d]} a{k} = {self.load(d, load(k))};")
        return loads + lines, [names[id(o)] for o in program.outputs]


def used_inputs(program: Program) -> set:
    """The indices of the inputs that ``program`` reads."""
    return {e.value for e in program.nodes if e.op == "input"}


#: The C++ renderer's dialect.
CPP = Dialect(COMPUTE_TYPES, STORAGE_TYPES, TEMPLATES, hex_floats=True)


def _wrap(table, d, text):
    f = table.get(d)
    return f.format(text) if f is not None else text


def render(program: Program, scalar: tuple, header: str = "", rows: tuple | None = None) -> str:
    """The C++ source of ``program``'s kernel.

    Args:
        program: the fused program.
        scalar: one bool per input: True for an input of one element (loaded once).
        header: declarations to insert after the includes (the JIT's vector math).
        rows: None, or the *row mask* of a kernel whose strided path runs rows: one bool
            per input, True for an input broadcast along the loop's last dimension
            (inner stride 0: loaded once per row); every other non-scalar input must
            have inner stride 1. The inner loop then reads plain pointers and
            vectorises (a bias added before a transcendental function: the strided
            path's runtime strides keep ``exp`` scalar, 3.7x slower).
    Returns:
        the source text; it exports ``lazyx_contiguous`` and ``lazyx_strided`` (the whole
        loop, on ``threads`` threads of its own) and ``lazyx_contiguous_range`` and
        ``lazyx_strided_range`` (one chunk of it, for the call shim's thread pool).
    """
    n_in, n_out = len(program.inputs), len(program.outputs)
    scalar = tuple(bool(s) for s in scalar)
    if len(scalar) != n_in:
        raise ValueError(f"scalar mask of {len(scalar)} entries for {n_in} inputs")
    if rows is not None:
        if len(rows) != n_in:
            raise ValueError(f"row mask of {len(rows)} entries for {n_in} inputs")
        rows = tuple(bool(r) and not sc for r, sc in zip(rows, scalar))
    ptrs = []
    for k, d in enumerate(program.inputs):
        st = STORAGE_TYPES[d]
        if scalar[k]:
            ptrs.append(f"const {COMPUTE_TYPES[d]} s{k} = "
                        f"{CPP.load(d, f'*static_cast<const {st}*>(buf[{k}])')};")
        else:
            ptrs.append(f"const {st}* p{k} = static_cast<const {st}*>(buf[{k}]);")
    for j, o in enumerate(program.outputs):
        # No __restrict: a donated output is its input's buffer (LX_IVDEP vectorises).
        st = STORAGE_TYPES[o.dtype]
        ptrs.append(f"{st}* o{j} = static_cast<{st}*>(buf[{n_in + j}]);")

    def stores(results, index):
        return [f"o{j}[{index}] = {CPP.store(o.dtype, r)};"
                for j, (o, r) in enumerate(zip(program.outputs, results))]

    body, results = CPP.body(program, scalar, lambda k: f"p{k}[i]")
    contiguous = _indent(ptrs, 1) + [
        "  LX_IVDEP",
        "  for (int64_t i = begin; i < end; ++i) {"] + _indent(body + stores(results, "i"), 2) + [
        "  }"]

    strided_inputs = [k for k in range(n_in) if not scalar[k]]
    row_start = []  # the rows kernel: per row, a value of each broadcast input, a pointer of each other
    if rows is None:
        sbody, sresults = CPP.body(program, scalar, lambda k: f"p{k}[q{k} + j * t{k}]")
    else:
        per_row = tuple(sc or r for sc, r in zip(scalar, rows))
        sbody, sresults = CPP.body(program, per_row, lambda k: f"r{k}[j]")
        used = used_inputs(program)
        for k, d in enumerate(program.inputs):
            if k not in used or scalar[k]:
                continue
            if rows[k]:
                row_start.append(f"const {COMPUTE_TYPES[d]} s{k} = {CPP.load(d, f'p{k}[q{k}]')};")
            else:
                row_start.append(f"const {STORAGE_TYPES[d]}* r{k} = p{k} + q{k};")
    offsets = [f"int64_t q{k} = 0;" for k in strided_inputs]
    inner = [f"const int64_t t{k} = st[{k} * nd + nd - 1];" for k in strided_inputs]
    advance = [f"q{k} += cnt * t{k};" for k in strided_inputs]
    strided = _indent(ptrs, 1) + [
        "  int64_t idx[LX_MAX_DIMS];",
        "  int64_t r = begin;",
        "  for (int d = nd - 1; d >= 0; --d) { idx[d] = r % shape[d]; r /= shape[d]; }",
    ] + _indent(offsets, 1) + [
        "  for (int d = 0; d < nd; ++d) {",
    ] + _indent([f"q{k} += idx[d] * st[{k} * nd + d];" for k in strided_inputs], 2) + [
        "  }",
    ] + _indent(inner, 1) + [
        "  const int64_t last = shape[nd - 1];",
        "  for (int64_t i = begin; i < end;) {",
        "    const int64_t cnt = std::min(last - idx[nd - 1], end - i);",
    ] + _indent(row_start, 2) + [
        "    LX_IVDEP",
        "    for (int64_t j = 0; j < cnt; ++j) {",
    ] + _indent(sbody + stores(sresults, "i + j"), 3) + [
        "    }",
        "    i += cnt;",
    ] + _indent(advance, 2) + [
        "    idx[nd - 1] += cnt;",
        # Carry into the outer dimensions; the last one's offset rewinds a full row.
        "    for (int d = nd - 1; d > 0 && idx[d] == shape[d]; --d) {",
        "      idx[d] = 0;",
        "      idx[d - 1] += 1;",
    ] + _indent([f"q{k} += st[{k} * nd + d - 1] - shape[d] * st[{k} * nd + d];"
                 for k in strided_inputs], 3) + [
        "    }",
        "  }",
    ]
    rationals = "\n".join([_rational("lx_erf", _ERF_SATURATE, _ERF_P, _ERF_Q),
                           _rational("lx_tanh", _TANH_SATURATE, _TANH_P, _TANH_Q)])
    return "\n".join([
        _PREAMBLE.replace("__LX_RATIONALS__", rationals).replace("__LX_HEADER__", header),
        PREAMBLE_END.rstrip("\n"),
        f"// program {program.digest}: {program.size} ops, {n_in} inputs, {n_out} outputs",
        f"#define LX_MAX_DIMS {MAX_DIMS}",
        "namespace {",
        "void lx_contiguous(void* const* buf, int64_t begin, int64_t end) {",
        *contiguous,
        "}",
        "void lx_strided(void* const* buf, const int64_t* shape, const int64_t* st, int nd,",
        "                int64_t begin, int64_t end) {",
        *strided,
        "}",
        "}  // namespace",
        'extern "C" {',
        "int lazyx_contiguous(void* const* buf, int64_t n, int threads) {",
        "  try { lx_parallel(n, threads, [buf](int64_t b, int64_t e) { lx_contiguous(buf, b, e); }); }",
        "  catch (...) { return 1; }",
        "  return 0;",
        "}",
        "int lazyx_strided(void* const* buf, const int64_t* shape, const int64_t* st, int nd,",
        "                  int64_t n, int threads) {",
        "  if (nd < 1 || nd > LX_MAX_DIMS) return 2;",
        "  try {",
        "    lx_parallel(n, threads, [=](int64_t b, int64_t e) { lx_strided(buf, shape, st, nd, b, e); });",
        "  } catch (...) { return 1; }",
        "  return 0;",
        "}",
        "// One chunk [begin, end) on the calling thread: the call shim splits a loop over",
        "// the backend's thread pool with these (nd already checked).",
        "void lazyx_contiguous_range(void* const* buf, int64_t begin, int64_t end) {",
        "  lx_contiguous(buf, begin, end);",
        "}",
        "void lazyx_strided_range(void* const* buf, const int64_t* shape, const int64_t* st,",
        "                         int nd, int64_t begin, int64_t end) {",
        "  lx_strided(buf, shape, st, nd, begin, end);",
        "}",
        "}",
        "",
    ])


#: The most dimensions the strided path takes (after merging; more is beyond any real
#: layout: 17 dimensions that cannot merge hold at least 2**17 elements).
MAX_DIMS = 16


def _indent(lines, level):
    pad = "  " * level
    return [pad + ln for ln in lines]


#: complex64's arithmetic where ``c64`` is a struct of two floats (the CUDA and MSL
#: prologues, each with its own ``LX_FN`` qualifier): NumPy's formulas, the product as
#: written and Smith's quotient.
C64_ARITHMETIC = r"""LX_FN c64 operator+(c64 a, c64 b) { return c64(a.re + b.re, a.im + b.im); }
LX_FN c64 operator-(c64 a, c64 b) { return c64(a.re - b.re, a.im - b.im); }
LX_FN c64 operator-(c64 a) { return c64(-a.re, -a.im); }
LX_FN c64 operator*(c64 a, c64 b) {
  return c64(a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re);
}
LX_FN c64 operator/(c64 a, c64 b) {  // NumPy's: Smith's method, x / 0 gives inf or nan parts
  const float ar = b.re < 0.0f ? -b.re : b.re, ai = b.im < 0.0f ? -b.im : b.im;
  if (ar >= ai) {
    if (ar == 0.0f && ai == 0.0f) return c64(a.re / ar, a.im / ar);
    const float rat = b.im / b.re, scl = 1.0f / (b.re + b.im * rat);
    return c64((a.re + a.im * rat) * scl, (a.im - a.re * rat) * scl);
  }
  const float rat = b.re / b.im, scl = 1.0f / (b.im + b.re * rat);
  return c64((a.re * rat + a.im) * scl, (a.im * rat - a.re) * scl);
}
LX_FN c64 operator/(c64 a, float b) { return c64(a.re / b, a.im / b); }
LX_FN bool operator==(c64 a, c64 b) { return a.re == b.re && a.im == b.im; }
LX_FN bool operator!=(c64 a, c64 b) { return !(a == b); }
"""
