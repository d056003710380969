"""Metal kernels of the quantized pack: ``Quantize`` (every mode), ``Dequantize``, and the
products ``QuantizedMatmul`` and ``GatherQMM`` from the packed words (the dequantized
matrix is never made), in the ``affine`` mode and the micro-scaled float modes
(``mxfp4``, ``nvfp4``, ``mxfp8``), bit for bit the CPU kernels' (MLX's) packing.

A mode is an MSL type (:data:`FORMATS`) that the three templates take as a parameter:
``Affine`` (``scale * q + bias``, scales and biases of x's dtype or float) or
``FloatMode<Element, Scale>`` (``scale * element``) over the codecs ``E2M1`` (a 16-entry
table, :data:`lazyx.backends.cpu.kernels.quantized.FP4`), ``E4M3`` (elements and nvfp4's
scales, decoded and encoded with round-to-nearest-even arithmetically) and ``E8M0``
(mx scales, a power of two). Each codec decodes (``value``) and encodes (``code``); a
mode gives the kernels ``scale``/``element`` (the products), ``dequantize``, and for
quantizing ``group`` (a group's parameters from its minimum and maximum), ``store`` and
``code``. Kernels are instantiated per mode and dtype from the Python tables
:data:`QMM`, :data:`DEQUANTIZE` and :data:`QUANTIZE`.

* ``qmm<T, S, Mode>`` (``T`` x's and the output's type, ``S`` the scales': x's or float
  for affine, ``uchar`` codes for the float modes). The product is the CUDA kernels'
  layout (``backends/cuda/quantized.py``): ``out[p] = x[xi[p]] @ W(wi[p])`` with ``x``
  ``(nx, M, K)``, packed ``w`` ``(nw, R, C)`` uint32 words, scales (and biases)
  ``(nw, R, G)``, and int64 index pairs — a batch broadcast (``quantized_matmul``) or the
  gathered pairs (``gather_qmm``) are both lists of pairs. One simdgroup per output
  value ``(p, m, n)`` (threadgroups of :data:`ROWS` simdgroups): its 32 lanes walk K
  (lane ``l`` takes ``k = l, l + 32, ...``), read value ``k`` of the packed row (any
  width 2 to 8: a value may straddle two words), decode it with its group's scale (and
  bias), multiply by ``x`` in float, and ``simd_sum`` the lanes; the output is rounded
  once. ``transpose``: W's rows are the outputs (row ``n``, value ``k``); otherwise its
  rows are K (row ``k``, value ``n``).
* ``dequantize<S, O, Mode>``: a thread per value ``(i, r)`` of row ``r`` of the packed
  matrix, the CPU kernel's arithmetic (affine: ``scale * q`` rounded to ``S``, plus the
  bias rounded to ``S``; the float modes: ``element * (scale * factor)`` in float, the
  factor ``g / 2688`` of an nvfp4 global scale ``g``, else 1), then ``O``.
* ``quantize<T, S, Mode>``: a simdgroup per group of ``group_size`` values (threadgroups
  of :data:`ROWS` simdgroups, one group each). Its lanes read the group (lane ``l``
  values ``l, l + 32, ...``: at most 4), reduce its minimum and maximum with
  ``simd_min``/``simd_max`` (NaN-propagating, as NumPy's), and every lane derives the
  group's parameters from them, in float32 exactly as the CPU kernel does (see
  ``backends/cpu/kernels/quantized.py``). Lane 0 stores the scale (and bias); lane ``j``
  builds packed word ``j`` of the group (a group is ``group_size * bits / 32 <= 32``
  whole words) from the codes of the values whose bits fall in it, re-reading those
  values (a straddling value is coded by both lanes that hold a part of it), so no two
  threads write one word: no atomics, no threadgroup memory.
"""

from __future__ import annotations

import numpy as np
from lazyx import dtypes as ldt
from lazyx.backends.cpu.kernels.quantized import FP4
from lazyx.plugins import quantized as qp

from .common import (
    PRELUDE,
    SIMD_WIDTH,
    Dispatch,
    Library,
    UnsupportedDtype,
    empty,
    host_array,
    instantiate,
    msl_type,
    unsupported,
)

__all__ = ["DTYPES", "FORMATS", "LIBRARY", "ROWS", "dequantize", "gather_qmm", "quantize",
           "quantized_matmul"]

#: Simdgroups (output values, or groups quantized) per threadgroup.
ROWS = 8

#: Per mode of the pack: the MSL type that encodes and decodes it.
FORMATS = {"affine": "Affine", "mxfp4": "FloatMode<E2M1, E8M0>",
           "nvfp4": "FloatMode<E2M1, E4M3>", "mxfp8": "FloatMode<E4M3, E8M0>"}
FLOAT_MODES = tuple(m for m in FORMATS if m != "affine")

_CODECS = r"""
// -- the float modes' codes (MLX's formats; the CPU kernel's rounding) ---------------------
constant float E2M1_VALUES[16] = {@FP4@};

// E2M1 elements: the nearest of the 16 values, ties to the first in the table (the CPU's
// argmin: the smaller magnitude, +0 for a signed zero; a NaN or an infinity gives code 0).
struct E2M1 {
  static float largest() { return 6.0f; }
  static float value(uint c) { return E2M1_VALUES[c & 15u]; }
  static uint code(float v) {
    uint best = 0;
    float d = fabs(v - E2M1_VALUES[0]);
    for (uint c = 1; c < 16; ++c) {
      const float e = fabs(v - E2M1_VALUES[c]);
      if (e < d) { d = e; best = c; }
    }
    return best;
  }
};

// E4M3 (float8_e4m3fn): 4 exponent bits (bias 7), 3 mantissa bits, no infinities, 0x7f NaN.
struct E4M3 {
  static float largest() { return 448.0f; }
  static float value(uint c) {
    const uint e = (c >> 3) & 15u, m = c & 7u;
    const float v = (e == 15u && m == 7u) ? as_type<float>(0x7fc00000u)
                    : e == 0u ? float(m) * as_type<float>(118u << 23)          // m 2^-9
                              : float(8u + m) * as_type<float>((e + 117u) << 23);  // (8+m) 2^(e-10)
    return (c & 0x80u) ? -v : v;
  }
  // Saturating at 448 (as MLX converts), round to nearest even: the mantissa is
  // rint(|v| 2^(3-e)) for v's exponent e (at least -6, E4M3's subnormals); a carry to 16
  // lands on the next exponent's code by itself. A NaN stays one (its sign kept).
  static uint code(float v) {
    const uint sign = (as_type<uint>(v) >> 24) & 0x80u;
    if (v != v) return sign | 0x7fu;
    const float a = min(fabs(v), 448.0f);
    const int e = max(int(as_type<uint>(a) >> 23) - 127, -6);
    const float m = rint(a * as_type<float>(uint(130 - e) << 23));   // exact: a power of two
    return sign | uint((e + 6) * 8 + int(m));
  }
};

// E8M0 scales: 2^(c - 127), code 0 being 2^-127 and 255 infinity (as MLX decodes them).
struct E8M0 {
  static float value(uint c) { return as_type<float>(c == 0u ? 0x00400000u : c << 23); }
  // The CPU's exponent round(log2 s), raised by one where 2^e < s, clipped at -127, is
  // ceil(log2 s): read off the bits (s == 0 gives 2^0; infinity 2^128, code 255).
  static uint code(float s) {
    if (s == 0.0f) return 127u;
    const uint b = as_type<uint>(s), e = (b >> 23) & 0xffu, m = b & 0x7fffffu;
    if (e == 255u) return 255u;
    if (e == 0u) return m > 0x400000u ? 1u : 0u;   // subnormal: 2^-126 above 2^-127, else 2^-127
    return e + (m != 0u ? 1u : 0u);
  }
};

// -- the modes ------------------------------------------------------------------------------
// Affine: scale * q + bias.
struct Affine {
  struct Group { float scale, bias, top; };
  template <typename S> static float scale(S s) { return float(s); }
  static float element(uint q) { return float(q); }
  // MLX's CPU arithmetic: scale * q rounded to S, plus the bias, rounded to S (each in
  // float, then rounded: a product of two 16-bit values is exact in float).
  template <typename S> static float dequantize(uint q, S s, S b, float) {
    const S scaled = S(float(s) * float(q));
    return float(S(float(scaled) + float(b)));
  }
  // The CPU kernel's group parameters, in float32 step by step: the scale signed towards
  // the edge of larger magnitude, then made to hit that edge exactly (the bias) when it
  // is not coded 0.
  template <typename T> static Group group(float lo, float hi, int bits, float) {
    const float top = float((1 << bits) - 1);
    const bool low = fabs(lo) > fabs(hi);
    const float d = (hi - lo) / top;
    float scale = d < 1e-7f ? 1e-7f : d;   // NumPy's maximum: a NaN stays
    scale = low ? scale : -scale;
    const float edge = low ? lo : hi;
    const float q0 = rint(edge / scale);
    if (q0 != 0.0f) return {edge / q0, edge, top};
    return {scale, 0.0f, top};
  }
  template <typename S> static void store(Group p, device S* scales, device S* biases,
                                          int64_t g) {
    scales[g] = S(p.scale);
    biases[g] = S(p.bias);
  }
  template <typename T> static uint code(Group p, T w) {
    return uint(clamp(rint((float(w) - p.bias) / p.scale), 0.0f, p.top));
  }
};

// The micro-scaled float modes: scale * element, no bias.
template <typename Element, typename Scale> struct FloatMode {
  struct Group { float scale, inv; uint code; };
  static float scale(uchar s) { return Scale::value(s); }
  static float element(uint q) { return Element::value(q); }
  template <typename S> static float dequantize(uint q, S s, S, float factor) {
    return Element::value(q) * (Scale::value(s) * factor);
  }
  // amax / largest element in T (as MLX divides), times inv (2688 / g for an nvfp4 global
  // scale g, else 1: exact), to the scale's code; elements divide by the code's value in T.
  template <typename T> static Group group(float lo, float hi, int, float inv) {
    const float amax = fabs(Max<float>::apply(-lo, hi));   // fabs: max(-0, -0) is -0
    const float s = float(T(amax / Element::largest())) * inv;
    const uint c = Scale::code(s);
    return {float(T(Scale::value(c))), inv, c};
  }
  template <typename S> static void store(Group p, device S* scales, device S*, int64_t g) {
    scales[g] = S(p.code);
  }
  template <typename T> static uint code(Group p, T w) {
    return Element::code(float(T(float(w) / p.scale)) * p.inv);
  }
};
""".replace("@FP4@", ", ".join(f"{float(v)!r}f" for v in FP4))

_KERNELS = r"""
// Value i of a packed row (any width: a value may straddle two words).
inline uint code_at(device const uint* row, int64_t i, int bits) {
  const int64_t bit = i * bits;
  device const uint* words = row + (bit >> 5);
  const int shift = int(bit & 31);
  uint q = words[0] >> shift;
  if (shift + bits > 32) q |= words[1] << (32 - shift);
  return q & ((1u << bits) - 1u);
}

// dims: P, M, K, N, C (words per packed row), G (groups per row), bits, group size,
// has biases, transpose.
template <typename T, typename S, typename Mode>
[[kernel]] void qmm(
    device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
    device const uint* w [[buffer(2)]], device const S* scales [[buffer(3)]],
    device const S* biases [[buffer(4)]], device const int64_t* xi [[buffer(5)]],
    device const int64_t* wi [[buffer(6)]], constant int* dims [[buffer(7)]],
    uint3 group [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]],
    uint3 threads [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
  const int M = dims[1], K = dims[2], N = dims[3], C = dims[4], G = dims[5];
  const int bits = dims[6], gs = dims[7], has_b = dims[8], transpose = dims[9];
  const int64_t total = int64_t(dims[0]) * M * N;
  const int64_t wanted = int64_t(group.y) * threads.y + lid.y;
  // Simdgroups past the last output compute output 0 (simd_sum needs every lane) and
  // write nothing.
  const int64_t o = wanted < total ? wanted : 0;
  const int n = int(o % N);
  const int64_t pm = o / N;
  const int m = int(pm % M);
  const int64_t p = pm / M;
  device const T* xr = x + (xi[p] * M + m) * int64_t(K);
  const int64_t first = wi[p] * (transpose ? int64_t(N) : int64_t(K));
  float acc = 0.0f;
  for (int k = int(lane); k < K; k += 32) {
    const int64_t row = first + (transpose ? n : k);
    const int at = transpose ? k : n;            // the value's place in its row
    const uint q = code_at(w + row * C, at, bits);
    const int64_t g = row * G + at / gs;
    const float b = has_b ? float(biases[g]) : 0.0f;
    acc += float(xr[k]) * (Mode::scale(scales[g]) * Mode::element(q) + b);
  }
  acc = simd_sum(acc);
  if (wanted < total && lane == 0) out[o] = T(acc);
}

// Dequantize: a thread per value (i, r) of row r of the packed matrix.
// dims: rows R, values per row V, words per row C, groups per row G, bits, group size.
template <typename S, typename O, typename Mode>
[[kernel]] void dequantize(
    device const uint* w [[buffer(0)]], device O* out [[buffer(1)]],
    device const S* scales [[buffer(2)]], device const S* biases [[buffer(3)]],
    constant int* dims [[buffer(4)]], constant float& factor [[buffer(5)]],
    uint3 gid [[thread_position_in_grid]]) {
  const int V = dims[1], C = dims[2], G = dims[3], bits = dims[4], gs = dims[5];
  const int i = int(gid.x);
  const int64_t r = int64_t(gid.y);
  if (i >= V || r >= int64_t(dims[0])) return;
  const int64_t g = r * G + i / gs;
  out[r * V + i] = O(Mode::dequantize(code_at(w + r * C, i, bits), scales[g], biases[g],
                                      factor));
}

// Quantize: a simdgroup per group (the grid's y), lane j building packed word j.
// dims: groups, group size, bits. `inv`: 2688 / g for an nvfp4 global scale g, else 1.
template <typename T, typename S, typename Mode>
[[kernel]] void quantize(
    device const T* w [[buffer(0)]], device uint* out [[buffer(1)]],
    device S* scales [[buffer(2)]], device S* biases [[buffer(3)]],
    constant int* dims [[buffer(4)]], constant float& inv [[buffer(5)]],
    uint3 gid [[thread_position_in_grid]], uint lane [[thread_index_in_simdgroup]]) {
  const int gs = dims[1], bits = dims[2];
  const int64_t g = int64_t(gid.y);      // the grid is the groups: every simdgroup has one
  device const T* v = w + g * gs;
  float lo = Min<float>::init(), hi = Max<float>::init();
  for (int i = int(lane); i < gs; i += 32) {
    const float value = float(v[i]);
    lo = Min<float>::apply(lo, value);
    hi = Max<float>::apply(hi, value);
  }
  lo = Min<float>::simd(lo);
  hi = Max<float>::simd(hi);
  const typename Mode::Group p = Mode::template group<T>(lo, hi, bits, inv);
  if (lane == 0) Mode::store(p, scales, biases, g);
  const int words = gs * bits / 32;
  const int j = int(lane);
  if (j >= words) return;
  // Values first..last have bits in word j (bits [32 j, 32 j + 32) of the group's stream);
  // a value starting in the previous word gives its upper bits (a right shift).
  uint word = 0;
  for (int i = 32 * j / bits; i <= (32 * j + 31) / bits; ++i) {
    const uint q = Mode::code(p, v[i]);
    const int at = i * bits - 32 * j;
    word |= at >= 0 ? q << at : q >> (-at);
  }
  out[g * words + j] = word;
}
"""

#: The dtypes of x (and of quantize's input, and dequantize's output) the kernels have.
DTYPES = (ldt.float32, ldt.float16, ldt.bfloat16)
#: Affine (x's dtype, the scales' dtype): scales of x's dtype, or float32.
PAIRS = [(d, d) for d in DTYPES] + [(ldt.float16, ldt.float32), (ldt.bfloat16, ldt.float32)]
#: Instantiated: products (mode, x, scales); dequantize (mode, scales, output); quantize
#: (mode, input, scales) — the float modes' scales are their uint8 codes.
QMM = [("affine", x, s) for x, s in PAIRS] + [(m, x, ldt.uint8) for m in FLOAT_MODES
                                              for x in DTYPES]
DEQUANTIZE = [("affine", s, o) for s in DTYPES for o in DTYPES] + [
    (m, ldt.uint8, o) for m in FLOAT_MODES for o in DTYPES]
QUANTIZE = [(m, x, qp.MODES[m]["scale_dtype"] or x) for m in FORMATS for x in DTYPES]


def _instances(kernel: str, table) -> str:
    return "".join(instantiate(f"{kernel}_{m}_{a.name}_{b.name}", kernel, msl_type(a),
                               msl_type(b), FORMATS[m]) for m, a, b in table)


LIBRARY = Library("quantized", PRELUDE + _CODECS + _KERNELS + "\n" + _instances("qmm", QMM)
                  + _instances("dequantize", DEQUANTIZE) + _instances("quantize", QUANTIZE))


def _mode(kernel: str, mode: str) -> str:
    if mode not in FORMATS:
        raise UnsupportedDtype(f"Metal kernel {kernel} has no version for mode {mode!r}; it has "
                               f"{', '.join(map(repr, FORMATS))}. The CPU's kernel runs it.")
    return mode


def _global_scale(inputs, first: int):
    """The float32 value of the nvfp4 global scale at ``inputs[first]`` (None without one)."""
    if len(inputs) <= first:
        return None
    return np.float32(host_array(inputs[first], np.float32).reshape(()))


def _run(primitive, x, weights, xi, wi, run):
    """``out[p] = x[xi[p]] @ W(wi[p])``, ``(P, M, N)`` in x's dtype."""
    mode = _mode("quantized_matmul", primitive.mode)
    d = ldt.from_numpy(x.dtype)
    if d not in DTYPES:
        raise unsupported("quantized_matmul", d, DTYPES)
    w = host_array(weights[0], np.uint32)
    w = w.reshape((-1,) + w.shape[-2:])
    scales = host_array(weights[1])
    biases = host_array(weights[2]) if len(weights) > 2 else None
    if mode == "affine" and (scales.dtype != x.dtype
                             or (biases is not None and biases.dtype != x.dtype)):
        scales = host_array(scales, np.float32)
        biases = None if biases is None else host_array(biases, np.float32)
    s = ldt.from_numpy(scales.dtype)
    if (mode, d, s) not in QMM:   # (the plugin gives the float modes uint8 codes)
        raise unsupported(f"quantized_matmul's {mode} scales", s,
                          {t for m, _, t in QMM if m == mode})
    x = host_array(x)
    n = primitive.columns(w.shape)
    P, M, K = len(xi), x.shape[1], x.shape[-1]
    out = empty(run, (P, M, n), x.dtype)
    total = P * M * n
    if total == 0:
        return out
    if total >= 2 ** 31 or max(w.shape[-1], K, n) >= 2 ** 31:
        raise UnsupportedDtype(f"Metal kernel quantized_matmul indexes outputs and rows with "
                               f"32-bit integers; a product of {total} values is past them.")
    dims = [P, M, K, n, w.shape[-1], scales.shape[-1], primitive.bits, primitive.group_size,
            int(biases is not None), int(primitive.transpose)]
    groups = -(-total // ROWS)
    run(Dispatch(LIBRARY, f"qmm_{mode}_{d.name}_{s.name}", [
        x, out, w, scales, scales if biases is None else biases,
        np.ascontiguousarray(xi, np.int64), np.ascontiguousarray(wi, np.int64),
        np.array(dims, np.int32)], (SIMD_WIDTH, groups * ROWS, 1), (SIMD_WIDTH, ROWS, 1)))
    return out


def quantized_matmul(primitive, inputs, run):
    """``QuantizedMatmul`` (inputs ``(x, w, scales[, biases])``; batch dimensions broadcast)
    on Metal: the output."""
    x = inputs[0]
    batch, xi, wi = qp.batch_pairs(x.shape[:-2], inputs[1].shape[:-2])
    out = _run(primitive, x.reshape((-1,) + x.shape[-2:]), inputs[1:], xi, wi, run)
    return out.reshape(batch + out.shape[-2:])


def gather_qmm(primitive, inputs, run):
    """``GatherQMM`` (inputs ``(x, w, scales[, biases], lhs, rhs)``) on Metal: the output,
    of the indices' shape + ``(M, N)``; an index out of range raises as on the CPU."""
    x, lhs, rhs = inputs[0], inputs[-2], inputs[-1]
    xi, wi = host_array(lhs, np.int64).ravel(), host_array(rhs, np.int64).ravel()
    qp.check_gather_pairs(xi, wi, x.shape[0], int(np.prod(inputs[1].shape[:-2])))
    out = _run(primitive, x, inputs[1:-2], xi, wi, run)
    return out.reshape(rhs.shape + out.shape[-2:])


def dequantize(primitive, inputs, run):
    """``Dequantize`` on Metal: inputs ``(w, scales, biases)`` (affine), ``(w, scales)`` or
    ``(w, scales, global_scale)`` (the float modes); values of ``primitive.dtype``, bit
    for bit the CPU kernel's (MLX's) arithmetic."""
    mode = _mode("dequantize", primitive.mode)
    affine = qp.MODES[mode]["biases"]
    s, o = ldt.from_numpy(inputs[1].dtype), ldt.to_dtype(primitive.dtype)
    if o not in DTYPES:
        raise unsupported("dequantize", o, DTYPES)
    if affine and inputs[2].dtype != inputs[1].dtype:
        raise UnsupportedDtype("Metal kernel dequantize takes scales and biases of one dtype; "
                               "the CPU's kernel runs mixed ones.")
    if (mode, s, o) not in DEQUANTIZE:
        raise unsupported(f"dequantize's {mode} scales", s,
                          {t for m, t, _ in DEQUANTIZE if m == mode})
    g = None if affine else _global_scale(inputs, 2)
    factor = np.float32(1) if g is None else g / np.float32(qp.NVFP4_RANGE)
    w = host_array(inputs[0], np.uint32)
    scales = host_array(inputs[1])
    biases = host_array(inputs[2]) if affine else scales
    lead, words = w.shape[:-1], w.shape[-1]
    values = words * 32 // primitive.bits
    out = empty(run, lead + (values,), o.np)
    rows = int(np.prod(lead, dtype=np.int64))
    if out.size == 0:
        return out
    if rows >= 2 ** 31 or values >= 2 ** 31:
        raise UnsupportedDtype("Metal kernel dequantize indexes rows and values with 32-bit "
                               "integers; this matrix is past them.")
    dims = [rows, values, words, scales.shape[-1], primitive.bits, primitive.group_size]
    run(Dispatch(LIBRARY, f"dequantize_{mode}_{s.name}_{o.name}",
                 [w, out, scales, biases, np.array(dims, np.int32),
                  np.array([factor], np.float32)],
                 (values, rows, 1), (min(values, 256), 1, 1)))
    return out


def quantize(primitive, inputs, run):
    """``Quantize`` (inputs ``(w,)``, or ``(w, global_scale)`` for nvfp4) on Metal: the
    packed words, the scales and (affine) the biases, bit for bit the CPU kernel's
    (MLX's)."""
    mode = _mode("quantize", primitive.mode)
    d = ldt.from_numpy(inputs[0].dtype)
    if d not in DTYPES:
        raise unsupported("quantize", d, DTYPES)
    gs, bits = primitive.group_size, primitive.bits
    if gs > 4 * SIMD_WIDTH or gs * bits % 32:
        raise UnsupportedDtype(f"Metal kernel quantize takes groups of at most "
                               f"{4 * SIMD_WIDTH} values filling whole words; got "
                               f"group_size={gs}, bits={bits}.")
    w = host_array(inputs[0])
    g = _global_scale(inputs, 1)
    inv = np.float32(1) if g is None else np.float32(qp.NVFP4_RANGE) / g
    s = qp.MODES[mode]["scale_dtype"] or d
    lead, n = w.shape[:-1], w.shape[-1]
    packed = empty(run, lead + (n * bits // 32,), np.uint32)
    outs = [packed] + [empty(run, lead + (n // gs,), s.np)
                       for _ in range(1 + qp.MODES[mode]["biases"])]
    groups = w.size // gs
    if groups == 0:
        return tuple(outs)
    if groups >= 2 ** 31:
        raise UnsupportedDtype(f"Metal kernel quantize indexes groups with 32-bit integers; "
                               f"{groups} groups are past them.")
    run(Dispatch(LIBRARY, f"quantize_{mode}_{d.name}_{s.name}",
                 [w, packed, outs[1], outs[-1], np.array([groups, gs, bits], np.int32),
                  np.array([inv], np.float32)],
                 (SIMD_WIDTH, groups, 1), (SIMD_WIDTH, min(ROWS, groups), 1),
                 writes=tuple(range(1, len(outs) + 1))))
    return tuple(outs)
