"""The Metal Shading Language renderer: one MSL source per fused program.

A source (one per program and *scalar mask*, the inputs of one element) defines
two ``kernel`` functions over the same buffers: the inputs
``device const T* p<k> [[buffer(k)]]``, then the outputs
``device T* o<j> [[buffer(n_in + j)]]`` (C-contiguous), then the element count
``constant uint& lx_n [[buffer(n_in + n_out)]]``; one element per thread of a
one-dimensional grid (``uint i [[thread_position_in_grid]]``, threads past
``lx_n`` return):

* ``lx_contiguous``: every non-scalar input is C-contiguous with the loop's
  shape, so element ``i`` of every buffer is at index ``i``;
* ``lx_strided``: any layout and broadcasting. Two more buffers follow
  ``lx_n``: ``constant int& lx_nd`` and ``constant long* lx_layout``, the
  collapsed loop shape (``nd`` values) followed by ``nd`` element strides per
  input (0 along broadcast dimensions): the format of the C++ and CUDA kernels,
  made by the same collapse code (:func:`lazyx.backends.cpu.compiled.collapse`).
  Offsets are 64-bit.

:func:`buffer_count` says how many buffers a launch binds (Metal's argument
table holds 31: :func:`render` refuses a program that needs more).

**Semantics are the C++ renderer's**: the op templates
(:data:`lazyx.codegen.cpp.TEMPLATES`, with CUDA's unsigned sums and products),
the semantic helpers (:data:`lazyx.codegen.cpp.HELPERS`) and the statement
writer (:class:`lazyx.codegen.cpp.Dialect`) are shared text; this module's
prologue supplies their portability layer in MSL: ``lx_m`` over Metal's
``metal::precise`` math (exact functions from ``metal::``), the type traits, the
functions Metal lacks (``expm1`` and ``log1p`` by Kahan's corrections, ``erf``
by the C++ renderer's rational fit, ``erfinv`` by Giles' single-precision
approximation), and float-to-integer conversions that behave as NumPy's casts
on x86-64 (as :mod:`lazyx.codegen.cuda`'s). float16 and bfloat16 buffers are
Metal's ``half`` and ``bfloat``; values are computed in float and rounded to
their dtype after every op. Integer sums and products are computed unsigned, so
they wrap as NumPy's do.

**complex64** is ``c64``, two floats (NumPy's layout), and is computed in float
only (the C++ and CUDA renderers compute its functions in double; Metal has
none). Arithmetic is NumPy's: the product as written, Smith's quotient, NumPy's
power (1 for a zero exponent, 0 or NaN for a zero base, repeated products for
integer exponents below 100 in magnitude, else ``exp(b log a)``). The functions
follow C99 (principal branches, signed zeros on the cuts, its special values
for infinities and NaN; NumPy's choices where C99 leaves a sign unspecified,
except a few of those) and are written so that each part is within a few
float ulps of the exact value (measured through the shim against complex128,
|z| from 1e-10 to 1e10: abs 1.1, sqrt and exp 2, sin/cos/sinh/cosh 3, log and
log2 3, log10, log1p and the inverse functions 4, tan and tanh 5, rsqrt 6):

* ``abs``: a hypot scaled by a power of two (no overflow or underflow, ~1 ulp);
* ``log``: near ``|z| = 1``, ``log1p(x*x + y*y - 1) / 2`` with that sum exact
  but for its last rounding (Dekker's products by Veltkamp's split and Knuth's
  TwoSum: no fma is needed, only no contraction, which the source asks for);
  elsewhere ``log(hypot)``; ``log1p`` the same way around ``z = 0``;
* ``sqrt``: Kahan's ``sqrt((|x| + |z|) / 2)``, scaled by a power of 4 at the
  ends of the range; ``exp``, ``sinh``, ``cosh`` by parts, in halves where
  ``e**|x|`` overflows but the result does not; ``sin``, ``cos``, ``tan`` from
  the hyperbolic ones; ``tanh`` by Kahan's formula;
* ``asin``, ``acos``, ``asinh``, ``acosh``, ``atan``, ``atanh``: Hull,
  Fairgrieve and Tang's algorithm as FreeBSD's ``catrigf.c`` writes it in
  float (real functions of well-conditioned intermediates), ``atanh``'s
  ``1 - |z|**2`` computed exactly near the unit circle.

Not exact in float: ``power`` with a non-integer exponent (its error grows with
``|b log a|``, about ``|b log a|`` ulps, as MLX's and glibc's ``cpowf``), and
products and quotients whose parts cancel (as NumPy's complex64 ones). The
accuracy through the shim uses the host's float functions; on a GPU, Metal's
``metal::precise`` ones (a few ulp) add theirs.

Not rendered (:class:`lazyx.errors.DtypeError`, so the caller falls back to
another kernel): float64 (Metal has no double precision).

The sources compile as MSL on a Mac (not yet run there: see docs/codegen.md,
"Metal") and as C++17 through lazyx's MSL shim
(:mod:`lazyx.backends.metal.msl_cpu`), which is how they are tested on Linux.
The Metal compiler must not use fast math (``MTLCompileOptions.mathMode =
MTLMathModeSafe``): divisions and the exact functions then round as the C++
kernels do.
"""

from __future__ import annotations

from .. import dtypes as dt
from ..errors import DtypeError
from .cpp import (
    C64_ARITHMETIC,
    _ERF_P,
    _ERF_Q,
    _ERF_SATURATE,
    HELPERS,
    TEMPLATES,
    Dialect,
    _rational,
    type_traits,
    used_inputs,
)
from .ir import Program

__all__ = [
    "COMPUTE_TYPES",
    "KERNELS",
    "MAX_BUFFERS",
    "MSL",
    "STORAGE_TYPES",
    "buffer_count",
    "render",
    "supports",
]

#: Type holding a value of each dtype during computation (lazyx's typedefs: Metal's
#: ``char`` .. ``ulong`` on a GPU, ``<cstdint>``'s through the shim).
COMPUTE_TYPES = {
    dt.bool_: "bool", dt.uint8: "lx_u8", dt.uint16: "lx_u16", dt.uint32: "lx_u32",
    dt.uint64: "lx_u64", dt.int8: "lx_i8", dt.int16: "lx_i16", dt.int32: "lx_i32",
    dt.int64: "lx_i64", dt.float16: "float", dt.bfloat16: "float", dt.float32: "float",
    dt.complex64: "c64",
}
#: Type of a buffer element of each dtype: Metal's 16-bit float types.
STORAGE_TYPES = dict(COMPUTE_TYPES)
STORAGE_TYPES.update({dt.float16: "half", dt.bfloat16: "bfloat"})

#: Why a dtype has no MSL kernel (the caller runs another backend's kernel instead).
UNSUPPORTED = {
    dt.float64: "Metal has no double precision (MSL has no `double` type)",
}

#: The kernels a source defines.
KERNELS = ("lx_contiguous", "lx_strided")

#: Buffers in Metal's argument table.
MAX_BUFFERS = 31

_TEMPLATES = dict(TEMPLATES)
# Integer sums and products through the helpers, which compute them unsigned (NumPy wraps;
# signed overflow is undefined in MSL as in C++).
_TEMPLATES.update({"add": "lx_add({0}, {1})", "mul": "lx_mul({0}, {1})"})


class _MSLDialect(Dialect):
    """The shared statement writer with MSL's integer literals: ``long`` is 64-bit and
    ``long long`` does not exist in MSL (``L``/``UL`` suffixes, not ``LL``)."""

    def literal(self, value, d) -> str:
        if d.kind in "iu":
            if d is dt.int64 and value == -2**63:
                return "(-9223372036854775807L - 1)"
            return f"(({self.compute_types[d]}){value}{'UL' if d.kind == 'u' else 'L'})"
        return super().literal(value, d)


#: The MSL renderer's dialect (decimal float literals: MSL is C++14, without hex floats).
MSL = _MSLDialect(COMPUTE_TYPES, STORAGE_TYPES, _TEMPLATES, hex_floats=False)


def supports(program: Program) -> str | None:
    """None when ``program`` can be rendered, else the reason it cannot."""
    for d in [*program.inputs, *(e.dtype for e in program.nodes)]:
        if d in UNSUPPORTED:
            return f"{d.name}: {UNSUPPORTED[d]}"
    if buffer_count(program, strided=True) > MAX_BUFFERS:
        return (f"{len(program.inputs)} inputs and {len(program.outputs)} outputs need "
                f"{buffer_count(program, strided=True)} buffers; Metal binds {MAX_BUFFERS}")
    return None


def buffer_count(program: Program, strided: bool) -> int:
    """How many buffers a launch of ``program``'s kernel binds (inputs, outputs, ``lx_n``,
    and for ``lx_strided`` ``lx_nd`` and ``lx_layout``)."""
    return len(program.inputs) + len(program.outputs) + (3 if strided else 1)


_PROLOGUE = r"""// lazyx fused element-wise kernel, Metal Shading Language (generated; see lazyx/codegen/msl.py)
#include <metal_stdlib>
#ifdef __METAL_VERSION__
#pragma METAL fp math_mode(safe)
#pragma METAL fp contract(off)
typedef char lx_i8;
typedef uchar lx_u8;
typedef short lx_i16;
typedef ushort lx_u16;
typedef int lx_i32;
typedef uint lx_u32;
typedef long lx_i64;
typedef ulong lx_u64;
#else  // lazyx's MSL shim (C++ on the CPU): char's signedness is the platform's there
typedef int8_t lx_i8;
typedef uint8_t lx_u8;
typedef int16_t lx_i16;
typedef uint16_t lx_u16;
typedef int32_t lx_i32;
typedef uint32_t lx_u32;
typedef int64_t lx_i64;
typedef uint64_t lx_u64;
#endif
#define LX_FN inline
#define LX_THREAD thread

// -- complex64: two floats (its arithmetic and functions follow the standard library's part)
struct c64 {
  float re, im;
  c64() = default;
  constexpr c64(float r, float i = 0.0f) : re(r), im(i) {}
  constexpr float real() const { return re; }
  constexpr float imag() const { return im; }
};

// -- the standard library's part: type traits and math --------------------------------
namespace lx_m {
""" + type_traits([("lx_i8", "lx_u8"), ("lx_i16", "lx_u16"), ("lx_i32", "lx_u32"),
                ("lx_i64", "lx_u64")], ["float"]) + r"""

template <class T> struct numeric_limits {};
template <> struct numeric_limits<float> {
  static LX_FN float infinity() { return metal::as_type<float>(0x7f800000u); }
  static LX_FN float quiet_NaN() { return metal::as_type<float>(0x7fc00000u); }
};

// Transcendental functions from metal::precise (correct to a few ulp whatever the compile
// options); exact ones from metal::.
#define LX_PRECISE(name) LX_FN float name(float x) { return metal::precise::name(x); }
#define LX_EXACT(name) LX_FN float name(float x) { return metal::name(x); }
LX_PRECISE(exp) LX_PRECISE(log) LX_PRECISE(log2) LX_PRECISE(log10) LX_PRECISE(sqrt)
LX_PRECISE(sin) LX_PRECISE(cos) LX_PRECISE(tan) LX_PRECISE(asin) LX_PRECISE(acos)
LX_PRECISE(atan) LX_PRECISE(sinh) LX_PRECISE(cosh) LX_PRECISE(tanh) LX_PRECISE(asinh)
LX_PRECISE(acosh) LX_PRECISE(atanh)
LX_EXACT(floor) LX_EXACT(ceil) LX_EXACT(trunc) LX_EXACT(fabs)
#undef LX_PRECISE
#undef LX_EXACT
LX_FN float nearbyint(float x) { return metal::rint(x); }  // to nearest even
LX_FN float atan2(float y, float x) { return metal::precise::atan2(y, x); }
LX_FN float fmod(float x, float y) { return metal::precise::fmod(x, y); }
LX_FN float pow(float x, float y) { return metal::precise::pow(x, y); }
LX_FN float copysign(float x, float y) { return metal::copysign(x, y); }
LX_FN bool isnan(float x) { return x != x; }
LX_FN bool isinf(float x) { return metal::fabs(x) == numeric_limits<float>::infinity(); }
LX_FN bool isfinite(float x) { return metal::fabs(x) < numeric_limits<float>::infinity(); }
// Metal has no expm1 and log1p: Kahan's corrections of exp(x) - 1 and log(1 + x), which
// cancel the rounding error of the exp / the sum near 0 (a few ulp, also for tiny x).
LX_FN float expm1(float x) {
  const float u = exp(x);
  if (u == 1.0f) return x;
  const float um1 = u - 1.0f;
  // Away from 0, u - 1 is exact (or u is far from 1): no cancellation to correct.
  if (fabs(x) > 0.5f) return um1;
  return um1 * x / log(u);
}
LX_FN float log1p(float x) {
  const float u = 1.0f + x;
  if (u == 1.0f) return x;
  if (u == numeric_limits<float>::infinity()) return u;
  return log(u) * x / (u - 1.0f);
}
}  // namespace lx_m

// -- complex64, in float only (Metal has no 64-bit floats) ------------------------------
// Arithmetic is NumPy's (the product as written, Smith's quotient); the functions are
// C99's principal branches with its special values, each part within a few float ulps
// of the exact value (the methods: lazyx/codegen/msl.py's docstring).
""" + C64_ARITHMETIC + r"""
namespace lx_m {
#define LX_INF numeric_limits<float>::infinity()
#define LX_NAN numeric_limits<float>::quiet_NaN()
#define LX_EPS 1.1920928955078125e-07f     // FLT_EPSILON
#define LX_BIG 8388608.0f                  // 1 / FLT_EPSILON
#define LX_LN2 0.6931471805599453f
#define LX_PIO2 1.5707963267948966f
#define LX_PIO2_HI 1.5707962513f           // pi/2's leading 24 bits, and the rest
#define LX_PIO2_LO 7.549789948768648e-08f
#define LX_P64 1.8446744073709552e+19f     // 2**64
#define LX_M64 5.421010862427522e-20f      // 2**-64

LX_FN bool lx_neg_sign(float x) { return copysign(1.0f, x) < 0.0f; }

// -- exact building blocks: they need no fma, only no contraction (fp contract(off)) --
// x * x - fl(x * x), exactly: Dekker's product with Veltkamp's split (|x| < 2**100).
LX_FN float lx_sq_err(float x, float h) {
  const float c = 4097.0f * x, xh = c - (c - x), xl = x - xh;
  return ((xh * xh - h) + 2.0f * xh * xl) + xl * xl;
}
// a + b = s + e exactly (Knuth's TwoSum); returns s.
LX_FN float lx_two_sum(float a, float b, LX_THREAD float& e) {
  const float s = a + b, bb = s - a;
  e = (a - (s - bb)) + (b - bb);
  return s;
}
// x*x + y*y + c (|x|, |y| < 2**60) without a float sum's cancellation: the squares split
// exactly, every partial sum exact, only the small error terms rounded once (c is -1 for
// log near |z| = 1 and 2x for log1p).
LX_FN float lx_sumsq_plus(float x, float y, float c) {
  const float hx = x * x, hy = y * y;
  float e0, e1, e2, e3, e4;
  float p = lx_two_sum(hx, hy, e0);
  p = lx_two_sum(p, c, e1);
  p = lx_two_sum(p, e0, e2);
  p = lx_two_sum(p, lx_sq_err(x, hx), e3);
  p = lx_two_sum(p, lx_sq_err(y, hy), e4);
  return p + (((e1 + e2) + e3) + e4);
}
// sqrt(x*x + y*y) without overflow or underflow: scaled by a power of two so that the
// squares stay normal, then one sum and a square root (about 1 ulp); C99's infinities.
LX_FN float lx_hypot(float x, float y) {
  x = fabs(x);
  y = fabs(y);
  if (isinf(x) || isinf(y)) return LX_INF;
  if (isnan(x) || isnan(y)) return x + y;
  const float a = x > y ? x : y, b = x > y ? y : x;
  const float s = a > 4.611686018427388e+18f ? LX_M64     // above 2**62
                  : (a < 2.168404344971009e-19f ? LX_P64 : 1.0f);  // below 2**-62
  const float as = a * s, bs = b * s;
  return sqrt(as * as + bs * bs) / s;
}
// log(sqrt(x*x + y*y)) for any finite or infinite x, y (hypot itself may overflow).
LX_FN float lx_log_abs(float x, float y) {
  if (fabs(x) > 1e38f || fabs(y) > 1e38f) return log(lx_hypot(x * 0.5f, y * 0.5f)) + LX_LN2;
  return log(lx_hypot(x, y));
}
// a * b where a zero factor wins over an infinite or NaN one (C99's functions keep the
// zero part of sinh(x + 0i), cosh(0 + iy), ...).
LX_FN float lx_mul0(float a, float b) {
  if (a == 0.0f && !isfinite(b)) return a;
  if (b == 0.0f && !isfinite(a)) return b;
  return a * b;
}
// e**|x| / 2 * f for |x| > 80, where cosh x = |sinh x| = e**|x| / 2 in float: in halves,
// so that e**|x| may overflow while the product does not. A zero f stays zero.
LX_FN float lx_half_exp_times(float ax, float f) {
  if (f == 0.0f) return f;
  const float h = exp(0.5f * ax);
  return (0.5f * h * f) * h;
}

LX_FN float abs(c64 z) { return lx_hypot(z.re, z.im); }
LX_FN c64 conj(c64 z) { return c64(z.re, -z.im); }

LX_FN c64 exp(c64 z) {
  const float x = z.re, y = z.im;
  if (y == 0.0f) return c64(exp(x), y);
  if (isinf(x) && !isfinite(y)) return x > 0.0f ? c64(x, y - y) : c64(0.0f, copysign(0.0f, y));
  const float c = cos(y), s = sin(y);
  if (fabs(x) > 80.0f) {  // e**x over- or underflows where e**x cos y may not: in halves
    const float h = exp(0.5f * x);
    return c64((h * c) * h, (h * s) * h);
  }
  const float e = exp(x);
  return c64(e * c, e * s);
}
LX_FN c64 log(c64 z) {
  const float x = z.re, y = z.im, s = x * x + y * y;
  // Near |z| = 1, log|z| = log1p(x*x + y*y - 1) / 2 with that sum computed exactly.
  const float re = (s > 0.5f && s < 2.0f) ? 0.5f * log1p(lx_sumsq_plus(x, y, -1.0f))
                                          : lx_log_abs(x, y);
  return c64(re, atan2(y, x));
}
LX_FN c64 log10(c64 z) {
  const c64 l = log(z);
  return c64(l.re * 0.4342944819032518f, l.im * 0.4342944819032518f);
}
LX_FN c64 log1p(c64 z) {  // log(1 + z), accurate for small z too
  const float x = z.re, y = z.im, u = 1.0f + x;
  const float s = u * u + y * y;
  const float re = (s > 0.5f && s < 2.0f) ? 0.5f * log1p(lx_sumsq_plus(x, y, 2.0f * x))
                                          : lx_log_abs(u, y);
  return c64(re, atan2(y, u));
}
LX_FN c64 sqrt(c64 z) {
  float x = z.re, y = z.im;
  if (isinf(y)) return c64(LX_INF, y);
  if (isinf(x)) {
    if (x > 0.0f) return c64(x, isnan(y) ? y : copysign(0.0f, y));
    return c64(isnan(y) ? y : 0.0f, copysign(LX_INF, y));
  }
  if (isnan(x) || isnan(y)) return c64(x + y, x + y);
  if (x == 0.0f && y == 0.0f) return c64(0.0f, y);
  // Kahan's: t = sqrt((|x| + |z|) / 2) has no cancellation; scaled by 4**k for range.
  const float m = fabs(x) > fabs(y) ? fabs(x) : fabs(y);
  float back = 1.0f;
  if (m > 4.611686018427388e+18f) { x *= LX_M64; y *= LX_M64; back = 4294967296.0f; }
  else if (m < 2.168404344971009e-19f) { x *= LX_P64; y *= LX_P64; back = 2.3283064365386963e-10f; }
  const float t = sqrt((fabs(x) + lx_hypot(x, y)) * 0.5f);
  if (x >= 0.0f) return c64(t * back, (y / (2.0f * t)) * back);
  return c64((fabs(y) / (2.0f * t)) * back, copysign(t * back, y));
}

// sinh and cosh by parts (C99's special values through lx_mul0); sin, cos, tan from them.
LX_FN c64 sinh(c64 z) {
  const float x = z.re, y = z.im;
  if (isinf(x) && !isfinite(y)) return c64(isinf(y) ? fabs(x) : x, y - y);
  const float c = cos(y), s = sin(y);
  if (fabs(x) > 80.0f)
    return c64(copysign(1.0f, x) * lx_half_exp_times(fabs(x), c), lx_half_exp_times(fabs(x), s));
  return c64(lx_mul0(sinh(x), c), lx_mul0(cosh(x), s));
}
LX_FN c64 cosh(c64 z) {
  const float x = z.re, y = z.im;
  if (isinf(x) && !isfinite(y)) return c64(fabs(x), y - y);
  if (x == 0.0f && !isfinite(y)) return c64(y - y, 0.0f);
  const float c = cos(y), s = sin(y);
  if (fabs(x) > 80.0f)
    return c64(lx_half_exp_times(fabs(x), c), copysign(1.0f, x) * lx_half_exp_times(fabs(x), s));
  return c64(lx_mul0(cosh(x), c), lx_mul0(sinh(x), s));
}
LX_FN c64 tanh(c64 z) {
  const float x = z.re, y = z.im;
  if (y == 0.0f) return c64(tanh(x), y);
  if (isfinite(x) && !isfinite(y)) return c64(x == 0.0f ? x : y - y, y - y);
  if (fabs(x) > 9.0f) {  // tanh x is +-1 in float; the imaginary part is 2 sin 2y e**-2|x|
    const float im = isfinite(y) ? 4.0f * sin(y) * cos(y) * exp(-2.0f * fabs(x))
                                 : copysign(0.0f, y);
    return c64(copysign(1.0f, x), im);
  }
  // Kahan's formula: every sum of positive terms, no cancellation near tan's poles.
  const float t = tan(y), b = 1.0f + t * t, s = sinh(x), r = sqrt(1.0f + s * s);
  const float d = 1.0f + b * s * s;
  return c64(b * r * s / d, t / d);
}
LX_FN c64 sin(c64 z) {  // -i sinh(iz)
  const c64 w = sinh(c64(-z.im, z.re));
  return c64(w.im, -w.re);
}
LX_FN c64 cos(c64 z) { return cosh(c64(-z.im, z.re)); }  // cosh(iz)
LX_FN c64 tan(c64 z) {  // -i tanh(iz)
  const c64 w = tanh(c64(-z.im, z.re));
  return c64(w.im, -w.re);
}

// -- inverse functions: Hull, Fairgrieve and Tang's algorithm ("Implementing the complex
// arcsine and arccosine functions using exception handling", 1997) as FreeBSD's
// catrigf.c writes it in float: real functions of well-conditioned intermediates.
// (hypot(a, b) - b) / 2 without cancellation; h = hypot(a, b).
LX_FN float lx_half_gap(float a, float b, float h) {
  if (b < 0.0f) return (h - b) * 0.5f;
  if (b == 0.0f) return a * 0.5f;
  return a * a / (h + b) * 0.5f;
}
// For asinh(x + iy), x, y >= 0 finite and not both tiny: the real part rx, and the
// imaginary part's asin(B) (when b_usable) or atan2(new_y, sqrt_a2my2).
struct lx_hard { float rx, b, sqrt_a2my2, new_y; bool b_usable; };
LX_FN lx_hard lx_hard_work(float x, float y) {
  lx_hard w;
  const float r = lx_hypot(x, y + 1.0f), s = lx_hypot(x, y - 1.0f);
  float a = (r + s) * 0.5f;  // (|z + i| + |z - i|) / 2 >= 1
  if (a < 1.0f) a = 1.0f;
  if (a < 10.0f) {
    if (y == 1.0f && x < LX_EPS * LX_EPS / 128.0f) {
      w.rx = sqrt(x);
    } else if (x >= LX_EPS * fabs(y - 1.0f)) {
      const float am1 = lx_half_gap(x, 1.0f + y, r) + lx_half_gap(x, 1.0f - y, s);
      w.rx = log1p(am1 + sqrt(am1 * (a + 1.0f)));
    } else if (y < 1.0f) {
      w.rx = x / sqrt((1.0f - y) * (1.0f + y));
    } else {
      w.rx = log1p((y - 1.0f) + sqrt((y - 1.0f) * (y + 1.0f)));
    }
  } else {
    w.rx = log(a + sqrt(a * a - 1.0f));
  }
  w.new_y = y;
  if (y < 4.336808689942018e-19f) {  // 4 sqrt(FLT_MIN): y / a might underflow
    w.b_usable = false;
    w.sqrt_a2my2 = a * (2.0f / LX_EPS);
    w.new_y = y * (2.0f / LX_EPS);
    return w;
  }
  w.b = y / a;
  w.b_usable = w.b <= 0.6417f;
  if (!w.b_usable) {
    if (y == 1.0f && x < LX_EPS / 128.0f) {
      w.sqrt_a2my2 = sqrt(x) * sqrt((a + y) * 0.5f);
    } else if (x >= LX_EPS * fabs(y - 1.0f)) {
      const float amy = lx_half_gap(x, y + 1.0f, r) + lx_half_gap(x, y - 1.0f, s);
      w.sqrt_a2my2 = sqrt(amy * (a + y));
    } else if (y > 1.0f) {
      w.sqrt_a2my2 = x * (4.0f / LX_EPS / LX_EPS) * y / sqrt((y + 1.0f) * (y - 1.0f));
      w.new_y = y * (4.0f / LX_EPS / LX_EPS);
    } else {
      w.sqrt_a2my2 = sqrt((1.0f - y) * (1.0f + y));
    }
  }
  return w;
}
LX_FN c64 asinh(c64 z) {
  const float x = z.re, y = z.im, ax = fabs(x), ay = fabs(y);
  if (isnan(x) || isnan(y)) {
    if (isinf(x)) return c64(x, y + y);
    if (isinf(y)) return c64(y, x + x);
    if (y == 0.0f) return c64(x + x, y);
    return c64(x + y, x + y);
  }
  if (ax > LX_BIG || ay > LX_BIG)  // log(2|z|) and the argument, to float precision
    return c64(copysign(lx_log_abs(ax, ay) + LX_LN2, x), copysign(atan2(ay, ax), y));
  if (ax < 0.00021143197955098003f && ay < 0.00021143197955098003f) return z;  // sqrt(6 eps) / 4
  const lx_hard w = lx_hard_work(ax, ay);
  const float ry = w.b_usable ? asin(w.b) : atan2(w.new_y, w.sqrt_a2my2);
  return c64(copysign(w.rx, x), copysign(ry, y));
}
LX_FN c64 asin(c64 z) {  // -i asinh(iz), by the symmetries of asinh: swap the parts
  const c64 w = asinh(c64(z.im, z.re));
  return c64(w.im, w.re);
}
LX_FN c64 acos(c64 z) {
  const float x = z.re, y = z.im, ax = fabs(x), ay = fabs(y);
  const bool sx = lx_neg_sign(x), sy = lx_neg_sign(y);
  if (isnan(x) || isnan(y)) {
    if (isinf(x)) return c64(y + y, -LX_INF);
    if (isinf(y)) return c64(x + x, -y);
    if (x == 0.0f) return c64(LX_PIO2, y + y);
    return c64(x + y, x + y);
  }
  if (ax > LX_BIG || ay > LX_BIG) {
    const float ry = lx_log_abs(x, y) + LX_LN2;
    return c64(fabs(atan2(y, x)), sy ? ry : -ry);
  }
  if (x == 1.0f && y == 0.0f) return c64(0.0f, -y);
  if (ax < 0.00021143197955098003f && ay < 0.00021143197955098003f)
    return c64(LX_PIO2_HI - (x - LX_PIO2_LO), -y);
  const lx_hard w = lx_hard_work(ay, ax);
  float rx;
  if (w.b_usable) rx = acos(sx ? -w.b : w.b);
  else rx = atan2(w.sqrt_a2my2, sx ? -w.new_y : w.new_y);
  return c64(rx, sy ? w.rx : -w.rx);
}
LX_FN c64 acosh(c64 z) {  // from acos: +-i acos(z), the sign making the real part >= 0
  const c64 w = acos(z);
  if (isnan(w.re) && isnan(w.im)) return w;
  if (isnan(w.re)) return c64(fabs(w.im), w.re);
  if (isnan(w.im)) return c64(w.im, z.re == 0.0f ? w.re : w.im);  // NaN + i pi/2 at 0 + i NaN
  return c64(fabs(w.im), copysign(w.re, z.im));
}
// Re(1 / (x + iy)) without overflow or underflow of the squares.
LX_FN float lx_real_recip(float x, float y) {
  if (isinf(x) || isinf(y)) return copysign(0.0f, x);
  const float h = lx_hypot(x, y);
  return x / h / h;
}
LX_FN c64 atanh(c64 z) {
  const float x = z.re, y = z.im, ax = fabs(x), ay = fabs(y);
  if (y == 0.0f && ax <= 1.0f) return c64(atanh(x), y);
  if (x == 0.0f) return c64(x, atan(y));
  if (isnan(x) || isnan(y)) {
    if (isinf(x)) return c64(copysign(0.0f, x), y + y);
    if (isinf(y)) return c64(copysign(0.0f, x), copysign(LX_PIO2, y));
    return c64(x + y, x + y);
  }
  if (ax > LX_BIG || ay > LX_BIG) return c64(lx_real_recip(x, y), copysign(LX_PIO2, y));
  if (ax < 0.0002990099892485887f && ay < 0.0002990099892485887f) return z;  // sqrt(3 eps) / 2
  float rx, ry;
  if (ax == 1.0f && ay < LX_EPS) {
    rx = (LX_LN2 - log(ay)) * 0.5f;
  } else {
    const float d = ax - 1.0f;  // (1 - |x|)**2 + y**2: a sum of squares, no cancellation
    rx = log1p(4.0f * ax / (ay < 1.0842021724855044e-19f ? d * d : d * d + ay * ay)) * 0.25f;
  }
  if (ax == 1.0f) {
    ry = atan2(2.0f, -ay) * 0.5f;
  } else {
    // 1 - x*x - y*y, computed exactly near the unit circle where the float sum cancels
    const float s = ax * ax + ay * ay;
    const float m = (s > 0.5f && s < 2.0f) ? -lx_sumsq_plus(ax, ay, -1.0f)
                                           : (1.0f - ax) * (1.0f + ax) - ay * ay;
    ry = atan2(2.0f * ay, m) * 0.5f;
  }
  return c64(copysign(rx, x), copysign(ry, y));
}
LX_FN c64 atan(c64 z) {  // -i atanh(iz), by the symmetries of atanh: swap the parts
  const c64 w = atanh(c64(z.im, z.re));
  return c64(w.im, w.re);
}
// NumPy's power: 1 for a zero exponent, 0 or NaN for a zero base, repeated products for
// small integer exponents (as NumPy's, exact on Gaussian integers), else exp(b log a).
LX_FN c64 pow(c64 a, c64 b) {
  if (b.re == 0.0f && b.im == 0.0f) return c64(1.0f, 0.0f);
  if (a.re == 0.0f && a.im == 0.0f) {
    if (b.re > 0.0f && b.im == 0.0f) return c64(0.0f, 0.0f);
    return c64(LX_NAN, LX_NAN);
  }
  if (b.im == 0.0f && fabs(b.re) < 100.0f && b.re == trunc(b.re)) {
    int n = (int)b.re;
    if (n == 1) return a;
    if (n == 2) return a * a;
    if (n == 3) return a * (a * a);
    c64 r(1.0f, 0.0f), p = a;
    n = n < 0 ? -n : n;
    for (int mask = 1;; mask <<= 1) {
      if (n & mask) r = r * p;
      if (n < (mask << 1)) break;
      p = p * p;
    }
    return b.re < 0.0f ? c64(1.0f, 0.0f) / r : r;
  }
  return exp(b * log(a));
}
#undef LX_INF
#undef LX_NAN
#undef LX_EPS
#undef LX_BIG
#undef LX_LN2
#undef LX_PIO2
#undef LX_PIO2_HI
#undef LX_PIO2_LO
#undef LX_P64
#undef LX_M64
}  // namespace lx_m
// The helpers' lx_log1p computes log(1 + a) for complex a: this one is accurate for small a.
LX_FN c64 lx_log1p(c64 a) { return lx_m::log1p(a); }

// -- conversions ----------------------------------------------------------------------
// Float to integer as NumPy's casts do on x86-64, where Metal's conversions saturate: to
// int8, int16, uint8, uint16 and int32 a 32-bit conversion (truncated to the width), to
// uint32 and int64 a 64-bit one, out of range or NaN giving the most negative value; to
// uint64 the 64-bit conversion of x - 2**63 with the top bit set from 2**63 up.
template <class To, class F> LX_FN To lx_f2i(F x) {
  if constexpr (sizeof(To) == 8 && lx_m::is_unsigned_v<To>) {
    if (x != x) return (To)0x8000000000000000UL;
    if (x < (F)9223372036854775808.0f) return (To)lx_f2i<lx_i64>(x);
    return (To)lx_f2i<lx_i64>(x - (F)9223372036854775808.0f) ^ (To)0x8000000000000000UL;
  } else if constexpr (sizeof(To) == 8 || (sizeof(To) == 4 && lx_m::is_unsigned_v<To>)) {
    return (To)((x >= (F)-9223372036854775808.0f && x < (F)9223372036854775808.0f)
                    ? (lx_i64)x : (-9223372036854775807L - 1));
  } else {
    return (To)((x >= (F)-2147483648.0f && x < (F)2147483648.0f) ? (lx_i32)x
                                                                 : (lx_i32)(-2147483647 - 1));
  }
}

// float16 and bfloat16 buffers are Metal's half and bfloat; values are float, rounded
// (to nearest even) after every op.
LX_FN float lx_h2f(half h) { return float(h); }
LX_FN half lx_f2h(float f) { return half(f); }
LX_FN float lx_b2f(bfloat h) { return float(h); }
LX_FN bfloat lx_f2b(float f) { return bfloat(f); }
LX_FN float lx_rh(float x) { return float(half(x)); }
LX_FN float lx_rb(float x) { return float(bfloat(x)); }

"""

_EPILOGUE = r"""
// -- the MSL renderer's own functions -------------------------------------------------
__LX_ERF__
LX_FN float lx_tanh(float x) { return lx_m::tanh(x); }
LX_FN c64 lx_tanh(c64 x) { return lx_m::tanh(x); }
// Giles' single-precision erfinv ("Approximating the erfinv function", GPU Computing
// Gems, 2011): two polynomials in w = -log(1 - x^2); +-inf at +-1, NaN outside.
LX_FN float lx_erfinv(float x) {
  float w = -lx_m::log((1.0f - x) * (1.0f + x)), p;
  if (w < 5.0f) {
    w = w - 2.5f;
    p = 2.81022636e-08f;
    p = 3.43273939e-07f + p * w;
    p = -3.5233877e-06f + p * w;
    p = -4.39150654e-06f + p * w;
    p = 0.00021858087f + p * w;
    p = -0.00125372503f + p * w;
    p = -0.00417768164f + p * w;
    p = 0.246640727f + p * w;
    p = 1.50140941f + p * w;
  } else {
    w = lx_m::sqrt(w) - 3.0f;
    p = -0.000200214257f;
    p = 0.000100950558f + p * w;
    p = 0.00134934322f + p * w;
    p = -0.00367342844f + p * w;
    p = 0.00573950773f + p * w;
    p = -0.0076224613f + p * w;
    p = 0.00943887047f + p * w;
    p = 1.00167406f + p * w;
    p = 2.83297682f + p * w;
  }
  if (lx_m::fabs(x) == 1.0f) return lx_m::copysign(lx_m::numeric_limits<float>::infinity(), x);
  return p * x;
}
"""

#: The shared preamble of every MSL kernel source (before the kernels themselves).
PREAMBLE = (_PROLOGUE + HELPERS + _EPILOGUE.replace(
    "__LX_ERF__", _rational("lx_erf", _ERF_SATURATE, _ERF_P, _ERF_Q).replace("static inline", "LX_FN")))


def render(program: Program, scalar: tuple) -> str:
    """The MSL source of ``program``'s kernels (see the module docstring).

    Args:
        program: the fused program.
        scalar: one bool per input: True for an input of one element (read once).
    Returns:
        the source text; it defines ``lx_contiguous`` and ``lx_strided``.
    Raises:
        DtypeError: the program holds a dtype Metal cannot compute (float64), or needs
            more buffers than Metal binds; the message says which, and the caller runs
            another kernel.
    """
    n_in, n_out = len(program.inputs), len(program.outputs)
    scalar = tuple(bool(s) for s in scalar)
    if len(scalar) != n_in:
        raise ValueError(f"scalar mask of {len(scalar)} entries for {n_in} inputs")
    why = supports(program)
    if why is not None:
        raise DtypeError(f"Cannot render fused program {program.digest} as Metal Shading "
                         f"Language: {why}. Run it with another backend's kernel (the CPU's).")
    used = used_inputs(program)
    params = [f"device const {STORAGE_TYPES[d]}* p{k} [[buffer({k})]]"
              for k, d in enumerate(program.inputs)]
    params += [f"device {STORAGE_TYPES[o.dtype]}* o{j} [[buffer({n_in + j})]]"
               for j, o in enumerate(program.outputs)]
    b = n_in + n_out
    scalars = [f"const {COMPUTE_TYPES[d]} s{k} = {MSL.load(d, f'p{k}[0]')};"
               for k, d in enumerate(program.inputs) if scalar[k] and k in used]
    loaded = [k for k in range(n_in) if k in used and not scalar[k]]

    def stores(results):
        return [f"o{j}[i] = {MSL.store(o.dtype, r)};"
                for j, (o, r) in enumerate(zip(program.outputs, results))]

    def kernel(name, extra, index, load):
        body, results = MSL.body(program, scalar, load)
        return [
            f"kernel void {name}(",
            *[f"    {p}," for p in params],
            f"    constant uint& lx_n [[buffer({b})]],",
            *[f"    {p}," for p in extra],
            "    uint i [[thread_position_in_grid]]) {",
            "  if (i >= lx_n) return;",
            *["  " + s for s in scalars + index + body + stores(results)],
            "}",
        ]

    contiguous = kernel("lx_contiguous", [], [], lambda k: f"p{k}[i]")
    # Offsets from the collapsed layout: the thread's index split into coordinates from
    # the last dimension on, each times every input's stride along it.
    zero = ", ".join(f"q{k} = 0" for k in loaded)
    index = [
        "const int nd = lx_nd;",
        "constant lx_i64* lx_st = lx_layout + nd;",
        "lx_i64 r = (lx_i64)i;",
        *([f"lx_i64 {zero};"] if loaded else []),
        "for (int d = nd - 1; d > 0; --d) {",
        "  const lx_i64 e = lx_layout[d];",
        "  const lx_i64 c = r % e;",
        "  r /= e;",
        *[f"  q{k} += c * lx_st[{k} * nd + d];" for k in loaded],
        "}",
        *[f"q{k} += r * lx_st[{k} * nd];" for k in loaded],
    ]
    strided = kernel("lx_strided", [f"constant int& lx_nd [[buffer({b + 1})]]",
                                    f"constant lx_i64* lx_layout [[buffer({b + 2})]]"],
                     index, lambda k: f"p{k}[q{k}]")
    return "\n".join([
        PREAMBLE,
        (f"// ---- program {program.digest}: {program.size} ops, {n_in} inputs, "
         f"{n_out} outputs, scalar mask {''.join('s' if s else '.' for s in scalar)} ----"),
        *contiguous,
        *strided,
        "",
    ])
