"""Metal kernels of the creation op pack: ``Fill``, ``Full``, ``FullLike``, ``Arange``,
``Linspace``, ``Eye``, ``Tri``, ``Window``.

One thread per output element; every kernel a template instantiated per dtype (and
window kind) from the tables below. The parameters travel in buffer 0, the output is
buffer 1 (the built-in kernels' convention):

* ``Fill``, ``Full``, ``FullLike`` — the shapes pack's strided copy
  (:func:`.shapes.copy_into`): the value broadcast over the output (a ``Fill``'s value
  converted to the dtype on the host by NumPy, as the CPU kernel converts it, so an
  out-of-range value raises the CPU's error). ``Full`` of an input already of the
  output's shape is that input, as on the CPU.
* ``range_int_<dtype>`` — integer ``Arange``: ``start + i * step`` in 64-bit integers
  (``start`` and ``step`` truncated to integers first, as MLX and the CPU kernel do),
  wrapping to the dtype as NumPy's ``astype``.
* ``range_f64_<dtype>`` — float ``Arange`` and ``Linspace`` (any dtype): the CPU
  computes ``start + i * step`` in float64 (``Linspace``: NumPy's ``linspace``, whose
  ``step`` is ``(stop - start) / div`` and whose last value is ``stop``) and rounds
  once to the dtype. Metal has no double, so the kernel computes in float64 *emulated
  in 64-bit integers* (:data:`SOFT_DOUBLE`: IEEE round-to-nearest-even products by
  an integer, sums, and the one conversion to the output), the same two float64
  roundings as NumPy and the same final rounding or truncation: the values are the
  CPU's bit for bit, integer and bool outputs of ``linspace`` included (where a float32
  computation would turn ``linspace(0, 3, 10)``'s ``3 * (1/3)`` into 0.99999994 and
  truncate it to 0). The host computes ``step`` (one float64 division, Python's). A
  value outside an integer dtype's range has no defined conversion in NumPy (x86 gives
  the smallest integer, ARM saturates); the kernel wraps its int64 truncation.
* ``band_<eye|tri>_<dtype>`` — ``Eye`` and ``Tri``: a 2-D grid over the ``n x m``
  output; thread ``(c, r)`` writes 1 where ``c - r == k`` (``Eye``) or ``<= k``
  (``Tri``), else 0 (``k`` clamped to ``[-n, m]`` on the host: beyond it nothing
  changes, and the clamped value fits the kernel's 64-bit arithmetic).
* ``window_<kind>`` — float32 ``Window``: with ``a = min(j, M - 1 - j) / (M - 1)`` and
  ``s = sin(pi a)^2`` (NumPy's cosine forms rewritten so that the small values near
  the ends keep their relative precision; ``a`` and ``pi a`` carry their rounding
  errors into ``sin``'s first-order term): hanning ``s``, hamming ``0.08 + 0.92 s``,
  blackman ``s (0.36 + 0.64 s)``, bartlett ``2 min(j, M - 1 - j) / (M - 1)`` (one
  division, correctly rounded).

Values against the CPU backend's: integers, bool and everything ``Arange``,
``Linspace``, ``Eye``, ``Tri``, ``Fill``, ``Full`` produce are identical. ``Window``
differs: the CPU evaluates NumPy's cosines in float64 and rounds once; Metal has no
double and its ``sin`` is not correctly rounded, so hanning, hamming and blackman are
within a few float32 ulps (through the shim, whose ``sin`` is the C library's: at most
3, 3 and 4 ulps up to 4097 points; a GPU's ``precise::sin`` may add its own error);
bartlett is the correctly rounded ratio, which the CPU's two float64 roundings give
except in rare ties.

Dtypes: bool, the 8- to 64-bit integers, float16, bfloat16, float32. float64 has no
Metal type: a creation op asked for it raises a :class:`~lazyx.errors.DtypeError` (it
has no input whose dtype the CPU fallback's refusal would catch); complex64 falls back
to the CPU. Parameters the emulation does not cover fall back too: a non-finite
``linspace`` step, or one that underflows to zero (NumPy's denormal branch).
"""

from __future__ import annotations

import math

import numpy as np
from lazyx import dtypes as ldt
from lazyx.errors import DtypeError
from lazyx.plugins import creation as cr

from .common import (
    Dispatch,
    Library,
    UnsupportedDtype,
    empty,
    instantiate,
    msl_type,
    unsupported,
)
# DTYPES: the creation kernels have versions for every dtype Metal has, as the copy has.
from .shapes import DTYPES, copy_into, storage

__all__ = [
    "DTYPES",
    "KERNELS",
    "LIBRARY",
    "SOFT_DOUBLE",
    "arange",
    "eye",
    "f64_bits",
    "fill",
    "full",
    "full_like",
    "linspace",
    "tri",
    "window",
]

#: float64 emulated in 64-bit integers: a value is its IEEE bits in a ``ulong``. Finite
#: operands only (the launchers check); results round to nearest even, overflow to
#: infinity, keep signed zeros as IEEE. Shared with :mod:`.reductions` (``allclose`` of
#: integers computes in float64 there, as NumPy does).
SOFT_DOUBLE = r"""
// The index of the highest set bit of x (x != 0); portable where clz of 64 bits is not.
inline int msb64(ulong x) {
  int n = 0;
  if (x >> 32) { x >>= 32; n += 32; }
  if (x >> 16) { x >>= 16; n += 16; }
  if (x >> 8) { x >>= 8; n += 8; }
  if (x >> 4) { x >>= 4; n += 4; }
  if (x >> 2) { x >>= 2; n += 2; }
  if (x >> 1) n += 1;
  return n;
}

// The nearest value (ties to even) to (-1)^neg (m + sticky) 2^e, sticky a nonzero part
// below m's last bit, in the binary format of P significant bits (the implicit one
// included) and EXP_BITS exponent bits: its bits (sign, biased exponent, fraction).
// Past the largest finite value: infinity; below the subnormals: a signed zero.
inline ulong round_pack(bool neg, ulong m, int e, bool sticky, int P, int EXP_BITS) {
  const int emax = (1 << (EXP_BITS - 1)) - 1, emin = 1 - emax;
  const ulong sign = neg ? ulong(1) << (P + EXP_BITS - 1) : ulong(0);
  if (m == 0) return sign;
  const int lead = msb64(m) + e;                // the exponent of m's leading bit
  int ulp = max(lead, emin) - (P - 1);          // the exponent of the result's last bit
  const int shift = ulp - e;                    // m's bits below it
  ulong kept;
  if (shift <= 0) {
    kept = m << (-shift);                       // exact
  } else if (shift > 64) {
    kept = 0;                                   // below half the smallest subnormal
  } else {
    const ulong rem = shift == 64 ? m : m & ((ulong(1) << shift) - 1);
    const ulong half = ulong(1) << (shift - 1);
    kept = shift == 64 ? 0 : m >> shift;
    if (rem > half || (rem == half && (sticky || (kept & 1)))) kept += 1;
  }
  if (kept >> P) {                              // rounding carried into a new bit
    kept >>= 1;
    ulp += 1;
  }
  const ulong biased = (kept >> (P - 1)) ? ulong(ulp + (P - 1) + emax) : ulong(0);
  if (biased >= ulong(2 * emax + 1))
    return sign | (ulong((1 << EXP_BITS) - 1) << (P - 1));
  return sign | (biased << (P - 1)) | (kept & ((ulong(1) << (P - 1)) - 1));
}

// A finite double as (-1)^neg m 2^e, m < 2^53.
struct Unpacked {
  bool neg;
  ulong m;
  int e;
};
inline Unpacked unpack64(ulong bits) {
  const int biased = int((bits >> 52) & 0x7ff);
  const ulong fraction = bits & ((ulong(1) << 52) - 1);
  Unpacked u;
  u.neg = (bits >> 63) != 0;
  u.m = biased ? fraction | (ulong(1) << 52) : fraction;
  u.e = (biased ? biased : 1) - 1075;
  return u;
}

// a * i rounded to double: the 85-bit product from 32-bit halves of a's mantissa.
inline ulong f64_mul_u32(ulong a, uint i) {
  const Unpacked u = unpack64(a);
  const ulong low_part = (u.m & 0xffffffffu) * ulong(i), high_part = (u.m >> 32) * ulong(i);
  const ulong low = low_part + (high_part << 32);
  const ulong high = (high_part >> 32) + (low < low_part ? 1 : 0);
  if (high == 0) return round_pack(u.neg, low, u.e, false, 53, 11);
  const int s = msb64(high) + 1;                // fold the high word in, the rest is sticky
  return round_pack(u.neg, (high << (64 - s)) | (low >> s), u.e + s,
                    (low & ((ulong(1) << s) - 1)) != 0, 53, 11);
}

// a + b rounded to double. Mantissas get 10 spare low bits; the smaller operand's bits
// shifted out past them are folded into its last bit (sticky), which is exact enough for
// round-to-nearest since that bit lies below the rounding position.
inline ulong f64_add(ulong a, ulong b) {
  Unpacked x = unpack64(a), y = unpack64(b);
  if (y.m == 0) return x.m == 0 ? ((x.neg && y.neg) ? a : (a & ~(ulong(1) << 63))) : a;
  if (x.m == 0) return b;
  ulong mx = x.m << 10, my = y.m << 10;
  int ex = x.e - 10, ey = y.e - 10;
  bool nx = x.neg, ny = y.neg;
  if (ey > ex) {
    ulong tm = mx; mx = my; my = tm;
    int te = ex; ex = ey; ey = te;
    bool tn = nx; nx = ny; ny = tn;
  }
  const int d = ex - ey;
  if (d >= 64) my = 1;
  else if (d > 0) my = (my >> d) | ((my & ((ulong(1) << d) - 1)) != 0 ? 1 : 0);
  ulong m;
  bool neg;
  if (nx == ny) { m = mx + my; neg = nx; }
  else if (mx >= my) { m = mx - my; neg = nx; }
  else { m = my - mx; neg = ny; }
  if (m == 0) return 0;                         // x - x is +0 when rounding to nearest
  return round_pack(neg, m, ex, false, 53, 11);
}

// The double a rounded to the format of P significant and EXP_BITS exponent bits.
inline ulong f64_round_to(ulong a, int P, int EXP_BITS) {
  const ulong inf = ulong((1 << EXP_BITS) - 1) << (P - 1);
  const ulong sign = (a >> 63) << (P + EXP_BITS - 1);
  if (((a >> 52) & 0x7ff) == 0x7ff)             // infinity; NaN (a quiet one)
    return sign | inf | ((a << 12) != 0 ? ulong(1) << (P - 2) : ulong(0));
  const Unpacked u = unpack64(a);
  return round_pack(u.neg, u.m, u.e, false, P, EXP_BITS);
}

// The double a truncated toward zero (NumPy's astype to an integer, in range).
inline long f64_trunc(ulong a) {
  const Unpacked u = unpack64(a);
  ulong magnitude = u.e >= 0 ? u.m << min(u.e, 63) : (u.e <= -64 ? 0 : u.m >> (-u.e));
  return u.neg ? -long(magnitude) : long(magnitude);
}

// The double a as T: rounded once (floats), truncated (integers), nonzero (bool).
template <typename T> inline T from_f64(ulong a) { return T(f64_trunc(a)); }
template <> inline bool from_f64<bool>(ulong a) { return (a << 1) != 0; }
template <> inline float from_f64<float>(ulong a) {
  return as_type<float>(uint(f64_round_to(a, 24, 8)));
}
template <> inline half from_f64<half>(ulong a) {
  return as_type<half>(ushort(f64_round_to(a, 11, 5)));
}
template <> inline bfloat from_f64<bfloat>(ulong a) {
  return as_type<bfloat>(ushort(f64_round_to(a, 8, 8)));
}
"""

_SOURCE = r"""
#include <metal_stdlib>
using namespace metal;
""" + SOFT_DOUBLE + r"""
// Integer arange: out[i] = start + i * step (p: start, step, n), wrapping in 64 bits.
template <typename T>
[[kernel]] void range_int(constant long* p [[buffer(0)]], device T* out [[buffer(1)]],
                          uint i [[thread_position_in_grid]]) {
  if (ulong(i) >= ulong(p[2])) return;
  out[i] = T(long(ulong(p[0]) + ulong(i) * ulong(p[1])));
}

// Float arange and linspace: out[i] = start + i * step in (emulated) float64, then T.
// p: start, step, stop (float64 bits), n, the index that is `stop` itself (n when none).
template <typename T>
[[kernel]] void range_f64(constant ulong* p [[buffer(0)]], device T* out [[buffer(1)]],
                          uint i [[thread_position_in_grid]]) {
  if (ulong(i) >= p[3]) return;
  out[i] = from_f64<T>(ulong(i) == p[4] ? p[2] : f64_add(p[0], f64_mul_u32(p[1], i)));
}

// Eye (c - r == k) and Tri (c - r <= k) over an n x m output. p: n, m, k. Grid (m, n).
template <typename T, bool lower>
[[kernel]] void band(constant long* p [[buffer(0)]], device T* out [[buffer(1)]],
                     uint3 pos [[thread_position_in_grid]]) {
  if (long(pos.x) >= p[1] || long(pos.y) >= p[0]) return;
  const long d = long(pos.x) - long(pos.y);
  out[ulong(pos.y) * ulong(p[1]) + pos.x] = T(lower ? d <= p[2] : d == p[2]);
}

// Windows of m points; kind: 0 bartlett, 1 blackman, 2 hamming, 3 hanning.
template <int kind>
[[kernel]] void window(constant uint& m [[buffer(0)]], device float* out [[buffer(1)]],
                       uint j [[thread_position_in_grid]]) {
  if (j >= m) return;
  if (m == 1) { out[j] = 1.0f; return; }
  const uint k = min(j, m - 1 - j);            // the distance to the nearer end
  if (kind == 0) { out[j] = float(2 * ulong(k)) / float(m - 1); return; }
  // 0.5 + 0.5 cos(pi n / (M - 1)) with n = 2j - (M - 1) is sin(pi a)^2: no cancellation
  // near the ends, where the window is small. a and pi a carry their rounding errors
  // (a_lo, x_lo: exact remainders and pi's low part) into sin's first-order term, so
  // that only sin and the last products round.
  const float q = float(m - 1), a = float(k) / q, a_lo = fma(-a, q, float(k)) / q;
  const float PI_HI = 3.14159274f, PI_LO = -8.74227766e-8f;
  const float x = PI_HI * a, x_lo = fma(PI_HI, a, -x) + fma(PI_LO, a, PI_HI * a_lo);
  const float root = fma(precise::cos(x), x_lo, precise::sin(x));
  const float s = root * root;
  out[j] = kind == 3 ? s : (kind == 2 ? fma(0.92f, s, 0.08f) : s * fma(0.64f, s, 0.36f));
}
"""

_INTEGERS = tuple(d for d in DTYPES if d.kind in "iu")
#: Window kind -> the kernel's template argument.
WINDOWS = {"bartlett": 0, "blackman": 1, "hamming": 2, "hanning": 3}


def _instantiations() -> str:
    lines = [instantiate(f"range_int_{d.name}", "range_int", msl_type(d)) for d in _INTEGERS]
    lines += [instantiate(f"range_f64_{d.name}", "range_f64", msl_type(d)) for d in DTYPES]
    lines += [instantiate(f"band_{name}_{d.name}", "band", msl_type(d), lower)
              for name, lower in (("eye", "false"), ("tri", "true")) for d in DTYPES]
    lines += [instantiate(f"window_{kind}", "window", str(n)) for kind, n in WINDOWS.items()]
    return "".join(lines)


LIBRARY = Library("creation", _SOURCE + "\n" + _instantiations())

_GROUP = 256
_INT64 = np.iinfo(np.int64)


def f64_bits(value: float) -> int:
    """The IEEE bits of ``value`` as a float64 (what :data:`SOFT_DOUBLE` computes on)."""
    return int(np.array(value, np.float64).view(np.uint64))


def _dtype(primitive, kernel: str):
    """The output dtype, after refusing float64 (no Metal type) and any :data:`DTYPES` lacks."""
    d = primitive.dtype
    if d is ldt.float64:
        raise DtypeError(f"{type(primitive).__name__} cannot run on the Metal GPU with float64 "
                         f"outputs (Metal has no double precision). Run it on the CPU "
                         f"(stream=mx.cpu), or ask for float32.")
    if d not in DTYPES:
        raise unsupported(kernel, d, DTYPES)
    return d


def _line(run, kernel: str, params: np.ndarray, out: np.ndarray) -> np.ndarray:
    """One thread per element of 1-D ``out``."""
    n = out.shape[0]
    if n:
        run(Dispatch(LIBRARY, kernel, [params, out], (-(-n // _GROUP) * _GROUP, 1, 1),
                     (_GROUP, 1, 1)))
    return out


def fill(primitive, inputs, run):
    """``Fill``: ``value`` (converted by NumPy as on the CPU) in every element."""
    d = _dtype(primitive, "fill")
    # NumPy's conversion, and the CPU kernel's zeros for any value equal to 0 (-0.0 too)
    value = np.full((), 0 if primitive.value == 0 else primitive.value, d.np)
    storage("fill", value)  # complex64: no Metal type, the CPU's kernel instead
    out = empty(run, primitive.shape, d.np)
    copy_into(run, out, value)
    return out


def _broadcast(run, kernel: str, v, shape) -> np.ndarray:
    """``v`` broadcast to ``shape`` by one strided copy (``v`` itself when already of it)."""
    storage(kernel, v)
    if v.shape == tuple(shape):
        return v
    out = empty(run, shape, v.dtype)
    copy_into(run, out, v)
    return out


def full(primitive, inputs, run):
    """``Full``: the input broadcast to ``shape`` (the input itself when already of it)."""
    return _broadcast(run, "full", inputs[0], primitive.shape)


def full_like(primitive, inputs, run):
    """``FullLike``: the values (second input) broadcast to the first input's shape."""
    a, v = inputs
    return _broadcast(run, "full_like", v, a.shape)


def arange(primitive, inputs, run):
    """``Arange``: ``start + i * step``, in int64 for integer dtypes, else in (emulated)
    float64 rounded once, as the CPU kernel."""
    d = _dtype(primitive, "arange")
    n = primitive.output_shapes(())[0][0]
    out = empty(run, (n,), d.np)
    if d.kind in "iu":
        start, step = int(primitive.start), int(primitive.step)
        if not all(_INT64.min <= v <= _INT64.max for v in (start, step)):
            raise UnsupportedDtype(f"Metal kernel range_int_{d.name} steps in 64-bit integers; "
                                   f"arange({start}, ..., {step}) is past them.")
        return _line(run, f"range_int_{d.name}", np.array([start, step, n], np.int64), out)
    start, step = float(primitive.start), float(primitive.step)
    return _line(run, f"range_f64_{d.name}",
                 np.array([f64_bits(start), f64_bits(step), 0, n, n], np.uint64), out)


def linspace(primitive, inputs, run):
    """``Linspace``: NumPy's ``linspace`` in (emulated) float64, rounded once to the dtype."""
    d = _dtype(primitive, "linspace")
    n, start, stop = primitive.num, float(primitive.start), float(primitive.stop)
    out = empty(run, (n,), d.np)
    div = n - 1 if primitive.endpoint else n
    delta = stop - start
    # NumPy: y = i * step + start with step = delta / div; for div <= 0 (one point with the
    # end point, or none) y = i * delta + start, i being 0.
    step = delta / div if div > 0 else delta
    if not (math.isfinite(start) and math.isfinite(stop) and math.isfinite(step)) or \
            (step == 0 and delta != 0):
        raise UnsupportedDtype(f"Metal kernel range_f64_{d.name} emulates finite float64 steps; "
                               f"linspace({start}, {stop}, {n}) needs NumPy's other branches.")
    last = n - 1 if primitive.endpoint and n > 1 else n
    return _line(run, f"range_f64_{d.name}",
                 np.array([f64_bits(start), f64_bits(step), f64_bits(stop), n, last],
                          np.uint64), out)


def _band(name):
    def launcher(primitive, inputs, run):
        d = _dtype(primitive, name)
        n, m = primitive.n, primitive.m
        out = empty(run, (n, m), d.np)
        if out.size:
            k = min(max(primitive.k, -n - 1), m + 1)
            grid = (-(-m // 16) * 16, -(-n // 16) * 16, 1)
            run(Dispatch(LIBRARY, f"band_{name}_{d.name}", [np.array([n, m, k], np.int64), out],
                         grid, (16, 16, 1)))
        return out
    launcher.__name__ = name
    launcher.__doc__ = (f"``{name.capitalize()}``: an ``n x m`` matrix of ones "
                        f"{'on' if name == 'eye' else 'at and below'} diagonal ``k``, zeros "
                        f"elsewhere.")
    return launcher


eye = _band("eye")
tri = _band("tri")


def window(primitive, inputs, run):
    """``Window``: ``m`` float32 points of the ``kind`` window."""
    out = empty(run, (primitive.m,), np.float32)
    return _line(run, f"window_{primitive.kind}", np.array([primitive.m], np.uint32), out)


#: Primitive class -> launcher.
KERNELS = {cr.Fill: fill, cr.Full: full, cr.FullLike: full_like, cr.Arange: arange,
           cr.Linspace: linspace, cr.Eye: eye, cr.Tri: tri, cr.Window: window}
