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

Not rendered (:class:`lazyx.errors.DtypeError`, so the caller falls back to
another kernel): float64 (Metal has no double precision) and, for now,
complex64 (its functions are computed in double in the other renderers; a
float-only version is still to be written).

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
}
#: Type of a buffer element of each dtype: Metal's 16-bit float types.
STORAGE_TYPES = dict(COMPUTE_TYPES)
STORAGE_TYPES.update({dt.float16: "half", dt.bfloat16: "bfloat"})

#: Why a dtype has no MSL kernel (the caller runs another backend's kernel instead).
UNSUPPORTED = {
    dt.float64: "Metal has no double precision (MSL has no `double` type)",
    dt.complex64: "complex64 is not rendered to MSL yet (its functions are computed in "
                  "double elsewhere; a float-only version is still to be written)",
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

// -- complex64: the type the helpers name (no program with complex values is rendered) --
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
LX_FN float abs(c64 z) { return metal::precise::sqrt(z.re * z.re + z.im * z.im); }
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
        DtypeError: the program holds a dtype Metal cannot compute (float64), one not
            rendered yet (complex64), or needs more buffers than Metal binds; the
            message says which, and the caller runs another kernel.
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
