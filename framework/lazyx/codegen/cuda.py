"""The CUDA C++ renderer: one NVRTC source per fused program.

The source needs no header (NVRTC has no standard library) and defines three
``extern "C" __global__`` kernels over the same parameters: the input
pointers ``p0 .. p<n-1>``, then the output pointers ``o0 ..``, then

* ``lx_contiguous(..., long long n)``: every non-scalar input is C-contiguous
  with the loop's shape. A grid-stride loop over *packs* of :func:`vector_width`
  elements: each thread moves 16 bytes of its widest buffer per load and store
  (``float4`` for float32) when every buffer is aligned for it (tested in the
  kernel), then the remainder element by element;
* ``lx_strided(..., long long n, int nd, const long long* layout)``: any
  layout and broadcasting, one element per iteration, with 32-bit index
  arithmetic (the launcher checks that the element count and every offset
  fit); ``layout`` is the collapsed loop shape (``nd`` values) followed by
  ``nd`` element strides per input (0 along broadcast dimensions), the
  format of the C++ kernels (:mod:`lazyx.backends.cpu.compiled`);
* ``lx_strided_wide``: the same with 64-bit index arithmetic.

Scalar inputs (the *scalar mask*, part of the source) are read once per
thread; inlined constants are literals. Outputs are C-contiguous.

**Semantics are the C++ renderer's**: the op templates
(:data:`lazyx.codegen.cpp.TEMPLATES`) and the semantic helpers
(:data:`lazyx.codegen.cpp.HELPERS`) are shared text; this module supplies the
device side of their portability layer: CUDA's math functions (``expf``,
``erff``, ``erfinvf`` ...) behind the names ``lx_m::exp`` ..., the type
traits NVRTC lacks, a complex type (complex64 functions are computed in
double precision and rounded), float16 conversions by PTX ``cvt`` (exact;
bit manipulation off the device), and float-to-integer conversions that
behave as the x86 conversions NumPy's casts compile to (out of range or NaN
gives the most negative integer, where CUDA would saturate). Integer sums and
products are computed unsigned, so they wrap as NumPy's do. Kernels are
compiled with ``--fmad=false``: no multiply-add contraction, so a fused
kernel rounds every op as the unfused kernels (and the C++ kernels) do.

:mod:`lazyx.codegen.cuda_host` compiles these sources as host C++ through a
shim header, which is how they are tested on machines without a GPU.
"""

from __future__ import annotations

from .. import dtypes as dt
from .cpp import C64_ARITHMETIC, HELPERS, TEMPLATES, Dialect, type_traits, used_inputs
from .ir import Program

__all__ = ["render", "vector_width", "COMPUTE_TYPES", "STORAGE_TYPES", "CUDA", "OPTIONS",
           "KERNELS", "PACK_BYTES"]

#: Type holding a value of each dtype during computation (lazyx's own integer typedefs:
#: NVRTC has no <cstdint>).
COMPUTE_TYPES = {
    dt.bool_: "bool", dt.uint8: "lx_u8", dt.uint16: "lx_u16", dt.uint32: "lx_u32",
    dt.uint64: "lx_u64", dt.int8: "lx_i8", dt.int16: "lx_i16", dt.int32: "lx_i32",
    dt.int64: "lx_i64", dt.float16: "float", dt.bfloat16: "float", dt.float32: "float",
    dt.float64: "double", dt.complex64: "c64",
}
#: Type of a buffer element of each dtype.
STORAGE_TYPES = dict(COMPUTE_TYPES)
STORAGE_TYPES.update({dt.float16: "lx_u16", dt.bfloat16: "lx_u16"})

_TEMPLATES = dict(TEMPLATES)
# Integer sums and products through the helpers, which compute them unsigned: signed
# overflow is undefined in CUDA C++ (there is no -fwrapv), and NumPy's wraps.
_TEMPLATES.update({"add": "lx_add({0}, {1})", "mul": "lx_mul({0}, {1})"})

#: The CUDA renderer's dialect (shared statement writer, CUDA type names, decimal floats).
CUDA = Dialect(COMPUTE_TYPES, STORAGE_TYPES, _TEMPLATES, hex_floats=False)

#: NVRTC options of every fused kernel (``CudaKernel`` adds ``-std=c++17``).
OPTIONS = ("--fmad=false",)

#: The kernels a source defines.
KERNELS = ("lx_contiguous", "lx_strided", "lx_strided_wide")

#: Bytes a thread moves per load or store of its widest buffer in the contiguous kernel.
PACK_BYTES = 16

_ITEMSIZE = {d: d.size for d in COMPUTE_TYPES}


def vector_width(program: Program, scalar: tuple) -> int:
    """Elements per pack in the contiguous kernel: 16 bytes of the widest buffer that is
    read or written element by element (at most 8 elements, to bound the unrolled body)."""
    used = used_inputs(program)
    sizes = [_ITEMSIZE[d] for k, d in enumerate(program.inputs) if k in used and not scalar[k]]
    sizes += [_ITEMSIZE[o.dtype] for o in program.outputs]
    return max(1, min(8, PACK_BYTES // max(sizes)))


_PROLOGUE = r"""// lazyx fused element-wise kernel, CUDA C++ for NVRTC (generated; see lazyx/codegen/cuda.py)
#define LX_FN __device__ __forceinline__
typedef signed char lx_i8;
typedef unsigned char lx_u8;
typedef short lx_i16;
typedef unsigned short lx_u16;
typedef int lx_i32;
typedef unsigned int lx_u32;
typedef long long lx_i64;
typedef unsigned long long lx_u64;
#undef isnan
#undef isinf
#undef isfinite

// -- complex64: two floats, NumPy's arithmetic -----------------------------------------
struct c64 {
  float re, im;
  c64() = default;
  __device__ constexpr c64(float r, float i = 0.0f) : re(r), im(i) {}
  __device__ constexpr float real() const { return re; }
  __device__ constexpr float imag() const { return im; }
};
""" + C64_ARITHMETIC + r"""
// -- the standard library's part: type traits and math, on the device --------------------
namespace lx_m {
""" + type_traits([("signed char", "unsigned char"), ("short", "unsigned short"),
                ("int", "unsigned int"), ("long long", "unsigned long long")],
               ["float", "double"]) + r"""

template <class T> struct numeric_limits {};
template <> struct numeric_limits<float> {
  static LX_FN float infinity() { return __int_as_float(0x7f800000); }
  static LX_FN float quiet_NaN() { return __int_as_float(0x7fc00000); }
};
template <> struct numeric_limits<double> {
  static LX_FN double infinity() { return __longlong_as_double(0x7ff0000000000000LL); }
  static LX_FN double quiet_NaN() { return __longlong_as_double(0x7ff8000000000000LL); }
};

#define LX_UNARY(name, f32, f64) \
  LX_FN float name(float x) { return ::f32(x); } \
  LX_FN double name(double x) { return ::f64(x); }
#define LX_BINARY(name, f32, f64) \
  LX_FN float name(float x, float y) { return ::f32(x, y); } \
  LX_FN double name(double x, double y) { return ::f64(x, y); }
LX_UNARY(exp, expf, exp) LX_UNARY(expm1, expm1f, expm1) LX_UNARY(log, logf, log)
LX_UNARY(log1p, log1pf, log1p) LX_UNARY(log2, log2f, log2) LX_UNARY(log10, log10f, log10)
LX_UNARY(sqrt, sqrtf, sqrt) LX_UNARY(sin, sinf, sin) LX_UNARY(cos, cosf, cos)
LX_UNARY(tan, tanf, tan) LX_UNARY(asin, asinf, asin) LX_UNARY(acos, acosf, acos)
LX_UNARY(atan, atanf, atan) LX_UNARY(sinh, sinhf, sinh) LX_UNARY(cosh, coshf, cosh)
LX_UNARY(tanh, tanhf, tanh) LX_UNARY(asinh, asinhf, asinh) LX_UNARY(acosh, acoshf, acosh)
LX_UNARY(atanh, atanhf, atanh) LX_UNARY(erf, erff, erf) LX_UNARY(erfinv, erfinvf, erfinv)
LX_UNARY(floor, floorf, floor) LX_UNARY(ceil, ceilf, ceil) LX_UNARY(trunc, truncf, trunc)
LX_UNARY(nearbyint, rintf, rint) LX_UNARY(fabs, fabsf, fabs)
LX_BINARY(atan2, atan2f, atan2) LX_BINARY(fmod, fmodf, fmod)
LX_BINARY(copysign, copysignf, copysign) LX_BINARY(pow, powf, pow)
#undef LX_UNARY
#undef LX_BINARY
LX_FN bool isnan(float x) { return x != x; }
LX_FN bool isnan(double x) { return x != x; }
LX_FN bool isinf(float x) { return ::fabsf(x) == numeric_limits<float>::infinity(); }
LX_FN bool isinf(double x) { return ::fabs(x) == numeric_limits<double>::infinity(); }
LX_FN bool isfinite(float x) { return ::fabsf(x) < numeric_limits<float>::infinity(); }
LX_FN bool isfinite(double x) { return ::fabs(x) < numeric_limits<double>::infinity(); }

// complex64 functions: computed in double from the float parts (principal branches, as
// C99's), rounded once at the end.
struct zd { double re, im; };
LX_FN zd wide(c64 z) { return zd{(double)z.re, (double)z.im}; }
LX_FN c64 narrow(zd z) { return c64((float)z.re, (float)z.im); }
LX_FN zd zadd(zd a, zd b) { return zd{a.re + b.re, a.im + b.im}; }
LX_FN zd zsub(zd a, zd b) { return zd{a.re - b.re, a.im - b.im}; }
LX_FN zd zmul(zd a, zd b) { return zd{a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re}; }
LX_FN zd zscale(zd a, double s) { return zd{a.re * s, a.im * s}; }
LX_FN zd zi(zd a) { return zd{-a.im, a.re}; }       // i * a
LX_FN zd zmi(zd a) { return zd{a.im, -a.re}; }       // -i * a
LX_FN zd zexp(zd z) {
  const double e = ::exp(z.re);
  if (z.im == 0.0) return zd{e, z.im};
  return zd{e * ::cos(z.im), e * ::sin(z.im)};
}
LX_FN zd zlog(zd z) {
  const double x = z.re, y = z.im, s = x * x + y * y;
  // Near |z| = 1, log|z| from x^2 + y^2 - 1 computed without cancellation.
  const double re = (s > 0.5 && s < 2.0) ? 0.5 * ::log1p((x - 1.0) * (x + 1.0) + y * y)
                                         : ::log(::hypot(x, y));
  return zd{re, ::atan2(y, x)};
}
LX_FN zd zsqrt(zd z) {
  const double x = z.re, y = z.im;
  if (x == 0.0 && y == 0.0) return zd{0.0, y};
  const double t = ::sqrt((::fabs(x) + ::hypot(x, y)) * 0.5);
  if (x >= 0.0) return zd{t, y / (2.0 * t)};
  return zd{::fabs(y) / (2.0 * t), ::copysign(t, y)};
}
LX_FN zd ztanh(zd z) {
  const double x = z.re, y = z.im;
  if (::fabs(x) > 22.0) {  // tanh(x) is +-1 in double; the imaginary part underflows
    return zd{::copysign(1.0, x), 4.0 * ::sin(y) * ::cos(y) * ::exp(-2.0 * ::fabs(x))};
  }
  // Kahan's formula: no cancellation near the poles of tan.
  const double t = ::tan(y), b = 1.0 + t * t, s = ::sinh(x), r = ::sqrt(1.0 + s * s);
  const double d = 1.0 + b * s * s;
  return zd{b * r * s / d, t / d};
}
LX_FN zd zasinh(zd z) {
  // asinh(-z) = -asinh(z): evaluate with Re z >= 0, where z + sqrt(z^2 + 1) does not cancel.
  const bool flip = z.re < 0.0 || (z.re == 0.0 && ::copysign(1.0, z.re) < 0.0);
  const zd w = flip ? zd{-z.re, -z.im} : z;
  zd r;
  if (::fabs(w.re) + ::fabs(w.im) < 1e-4) {  // asinh(w) = w - w^3 / 6, to double precision
    r = zsub(w, zscale(zmul(w, zmul(w, w)), 1.0 / 6.0));
  } else {
    r = zlog(zadd(w, zsqrt(zadd(zmul(w, w), zd{1.0, 0.0}))));
  }
  return flip ? zd{-r.re, -r.im} : r;
}
LX_FN zd zatanh(zd z) {
  // (log(1 + z) - log(1 - z)) / 2 in the form that keeps small parts accurate.
  const double x = z.re, y = z.im, d = (1.0 - x) * (1.0 - x) + y * y;
  return zd{0.25 * ::log1p(4.0 * x / d), 0.5 * ::atan2(2.0 * y, (1.0 - x) * (1.0 + x) - y * y)};
}
LX_FN zd zacosh(zd z) {  // log(z + sqrt(z + 1) sqrt(z - 1))
  return zlog(zadd(z, zmul(zsqrt(zd{z.re + 1.0, z.im}), zsqrt(zd{z.re - 1.0, z.im}))));
}

LX_FN float abs(c64 z) { return (float)::hypot((double)z.re, (double)z.im); }
LX_FN c64 conj(c64 z) { return c64(z.re, -z.im); }
LX_FN c64 exp(c64 z) { return narrow(zexp(wide(z))); }
LX_FN c64 log(c64 z) { return narrow(zlog(wide(z))); }
LX_FN c64 log10(c64 z) { return narrow(zscale(zlog(wide(z)), 0.43429448190325182)); }
LX_FN c64 sqrt(c64 z) { return narrow(zsqrt(wide(z))); }
LX_FN c64 sinh(c64 z) {
  const double x = z.re, y = z.im;
  return narrow(zd{::sinh(x) * ::cos(y), ::cosh(x) * ::sin(y)});
}
LX_FN c64 cosh(c64 z) {
  const double x = z.re, y = z.im;
  return narrow(zd{::cosh(x) * ::cos(y), ::sinh(x) * ::sin(y)});
}
LX_FN c64 sin(c64 z) {
  const double x = z.re, y = z.im;
  return narrow(zd{::sin(x) * ::cosh(y), ::cos(x) * ::sinh(y)});
}
LX_FN c64 cos(c64 z) {
  const double x = z.re, y = z.im;
  return narrow(zd{::cos(x) * ::cosh(y), -::sin(x) * ::sinh(y)});
}
LX_FN c64 tanh(c64 z) { return narrow(ztanh(wide(z))); }
LX_FN c64 tan(c64 z) { return narrow(zmi(ztanh(zi(wide(z))))); }       // -i tanh(iz)
LX_FN c64 asinh(c64 z) { return narrow(zasinh(wide(z))); }
LX_FN c64 asin(c64 z) { return narrow(zmi(zasinh(zi(wide(z))))); }     // -i asinh(iz)
LX_FN c64 acos(c64 z) {                                                 // pi/2 - asin(z)
  const zd a = zmi(zasinh(zi(wide(z))));
  return narrow(zd{1.5707963267948966 - a.re, -a.im});
}
LX_FN c64 atanh(c64 z) { return narrow(zatanh(wide(z))); }
LX_FN c64 atan(c64 z) { return narrow(zmi(zatanh(zi(wide(z))))); }     // -i atanh(iz)
LX_FN c64 acosh(c64 z) { return narrow(zacosh(wide(z))); }
LX_FN c64 pow(c64 a, c64 b) {  // exp(b log a), with NumPy's cases for a zero base
  if (b.re == 0.0f && b.im == 0.0f) return c64(1.0f, 0.0f);
  if (a.re == 0.0f && a.im == 0.0f) {
    if (b.im == 0.0f && b.re > 0.0f) return c64(0.0f, 0.0f);
    return c64(numeric_limits<float>::quiet_NaN(), numeric_limits<float>::quiet_NaN());
  }
  return narrow(zexp(zmul(wide(b), zlog(wide(a)))));
}
}  // namespace lx_m

// -- conversions ----------------------------------------------------------------------
// Float to integer as NumPy's casts do on x86-64, where CUDA's conversions saturate: to
// int8, int16, uint8, uint16 and int32 a 32-bit conversion (truncated to the width),
// to uint32 and int64 a 64-bit one, out of range or NaN giving the most negative value;
// to uint64 the 64-bit conversion of x - 2**63 with the top bit set from 2**63 up.
template <class To, class F> LX_FN To lx_f2i(F x) {
  if constexpr (sizeof(To) == 8 && lx_m::is_unsigned_v<To>) {
    if (x != x) return (To)0x8000000000000000ull;
    if (x < (F)9223372036854775808.0) return (To)lx_f2i<lx_i64>(x);
    return (To)lx_f2i<lx_i64>(x - (F)9223372036854775808.0) ^ (To)0x8000000000000000ull;
  } else if constexpr (sizeof(To) == 8 || (sizeof(To) == 4 && lx_m::is_unsigned_v<To>)) {
    return (To)((x >= (F)-9223372036854775808.0 && x < (F)9223372036854775808.0)
                    ? (lx_i64)x : (-9223372036854775807LL - 1));
  } else {
    return (To)((x >= (F)-2147483648.0 && x < (F)2147483648.0) ? (lx_i32)x
                                                               : (lx_i32)(-2147483647 - 1));
  }
}

// float16 and bfloat16 buffers hold raw bits; values are float, rounded after every op.
LX_FN float lx_b2f(lx_u16 h) { return __uint_as_float((lx_u32)h << 16); }
LX_FN lx_u16 lx_f2b(float f) {  // round to nearest even; NaN stays NaN
  lx_u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (lx_u16)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (lx_u16)(u >> 16);
}
#ifdef __CUDA_ARCH__
LX_FN float lx_h2f(lx_u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
LX_FN lx_u16 lx_f2h(float f) { lx_u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#else  // off the device (the host shim): the same conversions by bit manipulation
LX_FN float lx_h2f(lx_u16 h) {
  const lx_u32 em = h & 0x7fffu, bits = em << 13;
  const float f = em >= 0x7c00u ? __uint_as_float(bits | 0x7f800000u)
                                : __uint_as_float(bits) * 5.192296858534828e+33f;  // 2**112
  return __uint_as_float(__float_as_uint(f) | ((lx_u32)(h & 0x8000u) << 16));
}
LX_FN lx_u16 lx_f2h(float f) {
  lx_u32 u = __float_as_uint(f);
  const lx_u16 sign = (lx_u16)((u >> 16) & 0x8000u);
  lx_u16 h;
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) h = (lx_u16)(0x7e00u | ((u >> 13) & 0x3ffu));
  else if (u >= 0x477ff000u) h = 0x7c00u;  // rounds to infinity
  else if (u < 0x38800000u) {              // subnormal: the FPU rounds at 2**-24
    h = (lx_u16)(__float_as_uint(__uint_as_float(u) + 0.5f) - 0x3f000000u);
  } else h = (lx_u16)((u + 0xc8000fffu + ((u >> 13) & 1u)) >> 13);
  return (lx_u16)(h | sign);
}
#endif
LX_FN float lx_rh(float x) { return lx_h2f(lx_f2h(x)); }
LX_FN float lx_rb(float x) { return lx_b2f(lx_f2b(x)); }

"""

_EPILOGUE = r"""
// -- the CUDA renderer's own functions ------------------------------------------------
LX_FN float lx_erf(float x) { return ::erff(x); }
LX_FN double lx_erf(double x) { return ::erf(x); }
LX_FN float lx_tanh(float x) { return ::tanhf(x); }
LX_FN double lx_tanh(double x) { return ::tanh(x); }
LX_FN c64 lx_tanh(c64 x) { return lx_m::tanh(x); }
LX_FN float lx_erfinv(float x) { return ::erfinvf(x); }
LX_FN double lx_erfinv(double x) { return ::erfinv(x); }

// -- packs: a thread's 16-byte loads and stores -----------------------------------------
template <int B> struct lx_raw {};
template <> struct lx_raw<16> { typedef uint4 type; };
template <> struct lx_raw<8> { typedef uint2 type; };
template <> struct lx_raw<4> { typedef unsigned int type; };
template <> struct lx_raw<2> { typedef unsigned short type; };
template <> struct lx_raw<1> { typedef unsigned char type; };
template <class T, int V> union lx_pack {
  typename lx_raw<sizeof(T) * V>::type raw;
  T v[V];
};
template <int V, class T> LX_FN lx_pack<T, V> lx_load(const T* __restrict__ p, lx_i64 q) {
  lx_pack<T, V> r;
  r.raw = reinterpret_cast<const typename lx_raw<sizeof(T) * V>::type*>(p)[q];
  return r;
}
template <int V, class T> LX_FN void lx_store(T* __restrict__ p, lx_i64 q, const lx_pack<T, V>& w) {
  reinterpret_cast<typename lx_raw<sizeof(T) * V>::type*>(p)[q] = w.raw;
}
template <class T> LX_FN bool lx_aligned(const T* p, int v) {
  return ((unsigned long long)p % (unsigned long long)(sizeof(T) * v)) == 0;
}
"""

#: The shared preamble of every CUDA kernel source (before the kernels themselves).
PREAMBLE = _PROLOGUE + HELPERS + _EPILOGUE


def render(program: Program, scalar: tuple) -> str:
    """The CUDA C++ source of ``program``'s kernels (see the module docstring).

    Args:
        program: the fused program.
        scalar: one bool per input: True for an input of one element (read once).
    Returns:
        the source text; it defines ``lx_contiguous``, ``lx_strided`` and
        ``lx_strided_wide``.
    """
    n_in, n_out = len(program.inputs), len(program.outputs)
    scalar = tuple(bool(s) for s in scalar)
    if len(scalar) != n_in:
        raise ValueError(f"scalar mask of {len(scalar)} entries for {n_in} inputs")
    used = used_inputs(program)
    params = [f"const {STORAGE_TYPES[d]}* __restrict__ p{k}" for k, d in enumerate(program.inputs)]
    params += [f"{STORAGE_TYPES[o.dtype]}* __restrict__ o{j}" for j, o in enumerate(program.outputs)]
    head = ", ".join(params)
    scalars = [f"const {COMPUTE_TYPES[d]} s{k} = {CUDA.load(d, f'*p{k}')};"
               for k, d in enumerate(program.inputs) if scalar[k] and k in used]
    loaded = [k for k in range(n_in) if k in used and not scalar[k]]

    def stores(results, target):
        return [f"{target(j)} = {CUDA.store(o.dtype, r)};"
                for j, (o, r) in enumerate(zip(program.outputs, results))]

    # -- contiguous: packs of v elements, then the rest one by one --------------------
    v = vector_width(program, scalar)
    st_in = {k: STORAGE_TYPES[program.inputs[k]] for k in loaded}
    st_out = [STORAGE_TYPES[o.dtype] for o in program.outputs]
    aligned = " && ".join([f"lx_aligned(p{k}, {v})" for k in loaded] +
                          [f"lx_aligned(o{j}, {v})" for j in range(n_out)])
    pbody, presults = CUDA.body(program, scalar, lambda k: f"r{k}.v[u]")
    packed = (
        [f"const lx_pack<{st_in[k]}, {v}> r{k} = lx_load<{v}>(p{k}, q);" for k in loaded] +
        [f"lx_pack<{st_out[j]}, {v}> w{j};" for j in range(n_out)] +
        ["#pragma unroll", f"for (int u = 0; u < {v}; ++u) {{"] +
        _indent(pbody + stores(presults, lambda j: f"w{j}.v[u]"), 1) +
        ["}"] +
        [f"lx_store<{v}>(o{j}, q, w{j});" for j in range(n_out)])
    ebody, eresults = CUDA.body(program, scalar, lambda k: f"p{k}[i]")
    contiguous = [
        f'extern "C" __global__ void lx_contiguous({head}, const lx_i64 n) {{',
        "  const lx_i64 lx_first = (lx_i64)blockIdx.x * blockDim.x + threadIdx.x;",
        "  const lx_i64 lx_step = (lx_i64)gridDim.x * blockDim.x;",
        *_indent(scalars, 1),
        "  lx_i64 lx_done = 0;",
        f"  if ({aligned}) {{",
        f"    const lx_i64 lx_packs = n / {v};",
        "    for (lx_i64 q = lx_first; q < lx_packs; q += lx_step) {",
        *_indent(packed, 3),
        "    }",
        f"    lx_done = lx_packs * {v};",
        "  }",
        "  for (lx_i64 i = lx_done + lx_first; i < n; i += lx_step) {",
        *_indent(ebody + stores(eresults, lambda j: f"o{j}[i]"), 2),
        "  }",
        "}",
    ]

    # -- strided: one element per iteration, offsets from the collapsed layout ---------
    def strided(name, index, offset):
        sbody, sresults = CUDA.body(program, scalar, lambda k: f"p{k}[q{k}]")
        zero = ", ".join(f"q{k} = 0" for k in loaded)
        return [
            f'extern "C" __global__ void {name}({head}, const lx_i64 n, const int nd,',
            "    const lx_i64* __restrict__ lx_layout) {",
            f"  const {index} lx_n = ({index})n;",
            f"  const {index} lx_first = ({index})blockIdx.x * blockDim.x + threadIdx.x;",
            f"  const {index} lx_step = ({index})gridDim.x * blockDim.x;",
            "  const lx_i64* __restrict__ lx_st = lx_layout + nd;",
            *_indent(scalars, 1),
            f"  for ({index} i = lx_first; i < lx_n; i += lx_step) {{",
            f"    {index} r = i;",
            *([f"    {offset} {zero};"] if loaded else []),
            "    for (int d = nd - 1; d > 0; --d) {",
            f"      const {index} e = ({index})lx_layout[d];",
            f"      const {index} c = r % e;",
            "      r /= e;",
            *[f"      q{k} += ({offset})c * ({offset})lx_st[{k} * nd + d];" for k in loaded],
            "    }",
            *[f"    q{k} += ({offset})r * ({offset})lx_st[{k} * nd];" for k in loaded],
            *_indent(sbody + stores(sresults, lambda j: f"o{j}[i]"), 2),
            "  }",
            "}",
        ]

    return "\n".join([
        PREAMBLE,
        f"// ---- program {program.digest}: {program.size} ops, {n_in} inputs, {n_out} outputs, "
        f"scalar mask {''.join('s' if s else '.' for s in scalar)}, packs of {v} ----",
        *contiguous,
        *strided("lx_strided", "lx_u32", "lx_i32"),
        *strided("lx_strided_wide", "lx_i64", "lx_i64"),
        "",
    ])


def _indent(lines, level):
    pad = "  " * level
    return [ln if ln.startswith("#") else pad + ln for ln in lines]
