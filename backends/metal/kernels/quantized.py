"""Metal kernels of the quantized pack: the products ``QuantizedMatmul`` and ``GatherQMM``
in the ``affine`` mode, from the packed words (the dequantized matrix is never made), and
``Dequantize`` (affine, a thread per value, the CPU kernel's arithmetic bit for bit).

One MSL template, ``qmm<T, S>`` (``T`` x's and the output's type, ``S`` the scales' and
biases': x's, or float), instantiated per pair from :data:`PAIRS`. The product is the CUDA
kernels' layout (``backends/cuda/quantized.py``): ``out[p] = x[xi[p]] @ W(wi[p])`` with
``x`` ``(nx, M, K)``, packed ``w`` ``(nw, R, C)`` uint32 words, scales and biases
``(nw, R, G)``, and int64 index pairs — a batch broadcast (``quantized_matmul``) or the
gathered pairs (``gather_qmm``) are both lists of pairs.

One simdgroup per output value ``(p, m, n)`` (threadgroups of :data:`ROWS` simdgroups):
its 32 lanes walk K (lane ``l`` takes ``k = l, l + 32, ...``), read value ``k`` of the
packed row (any width 2 to 8: a value may straddle two words), decode it as ``scale * q +
bias`` of its group, multiply by ``x`` in float, and ``simd_sum`` the lanes; the output is
rounded once. ``transpose``: W's rows are the outputs (row ``n``, value ``k``); otherwise
its rows are K (row ``k``, value ``n``). The micro-scaled float modes (``mxfp4``,
``nvfp4``, ``mxfp8``) have no version here: :class:`.common.UnsupportedDtype`, so the
backend runs the CPU's kernel (counted as a CPU fallback).
"""

from __future__ import annotations

import numpy as np

from lazyx import dtypes as ldt
from lazyx.plugins import quantized as qp

from .common import (PRELUDE, SIMD_WIDTH, Dispatch, Library, UnsupportedDtype, empty,
                     host_array, instantiate, msl_type, unsupported)

__all__ = ["quantized_matmul", "gather_qmm", "dequantize", "LIBRARY", "DTYPES", "ROWS"]

#: Simdgroups (output values) per threadgroup.
ROWS = 8

_SOURCE = PRELUDE + r"""
// dims: P, M, K, N, C (words per packed row), G (groups per row), bits, group size,
// has biases, transpose.
template <typename T, typename S>
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
  const uint mask = (1u << bits) - 1u;
  float acc = 0.0f;
  for (int k = int(lane); k < K; k += 32) {
    const int64_t row = first + (transpose ? n : k);
    const int at = transpose ? k : n;            // the value's place in its row
    const int64_t bit = int64_t(at) * bits;
    device const uint* words = w + row * C + (bit >> 5);
    const int shift = int(bit & 31);
    uint q = words[0] >> shift;
    if (shift + bits > 32) q |= words[1] << (32 - shift);
    q &= mask;
    const int64_t g = row * G + at / gs;
    const float b = has_b ? float(biases[g]) : 0.0f;
    acc += float(xr[k]) * (float(scales[g]) * float(q) + b);
  }
  acc = simd_sum(acc);
  if (wanted < total && lane == 0) out[o] = T(acc);
}

// Dequantize: a thread per value (i, r) of row r of the packed matrix; the arithmetic of
// the CPU kernel (MLX's): scale * q rounded to S, plus the bias rounded to S (each in
// float, then rounded: a product of two 16-bit values is exact in float), then O.
// dims: rows R, values per row V, words per row C, groups per row G, bits, group size.
template <typename S, typename O>
[[kernel]] void dequantize(
    device const uint* w [[buffer(0)]], device O* out [[buffer(1)]],
    device const S* scales [[buffer(2)]], device const S* biases [[buffer(3)]],
    constant int* dims [[buffer(4)]], uint3 gid [[thread_position_in_grid]]) {
  const int V = dims[1], C = dims[2], G = dims[3], bits = dims[4], gs = dims[5];
  const int i = int(gid.x);
  const int64_t r = int64_t(gid.y);
  if (i >= V || r >= int64_t(dims[0])) return;
  const int64_t bit = int64_t(i) * bits;
  device const uint* words = w + r * C + (bit >> 5);
  const int shift = int(bit & 31);
  uint q = words[0] >> shift;
  if (shift + bits > 32) q |= words[1] << (32 - shift);
  q &= (1u << bits) - 1u;
  const int64_t g = r * G + i / gs;
  const S scaled = S(float(scales[g]) * float(q));
  const S value = S(float(scaled) + float(biases[g]));
  out[r * V + i] = O(float(value));
}
"""

#: The dtypes of x the kernels have versions for.
DTYPES = (ldt.float32, ldt.float16, ldt.bfloat16)
#: (x's dtype, the scales' dtype) instantiated: scales of x's dtype, or float32.
PAIRS = [(d, d) for d in DTYPES] + [(ldt.float16, ldt.float32), (ldt.bfloat16, ldt.float32)]

LIBRARY = Library("quantized", _SOURCE + "\n" + "".join(
    instantiate(f"qmm_{x.name}_{s.name}", "qmm", msl_type(x), msl_type(s)) for x, s in PAIRS)
    + "".join(instantiate(f"dequantize_{s.name}_{o.name}", "dequantize", msl_type(s), msl_type(o))
              for s in DTYPES for o in DTYPES))


def _run(primitive, x, weights, xi, wi, run):
    """``out[p] = x[xi[p]] @ W(wi[p])``, ``(P, M, N)`` in x's dtype."""
    if primitive.mode != "affine":
        raise UnsupportedDtype(f"Metal kernel quantized_matmul has no version for mode "
                               f"{primitive.mode!r}; it has 'affine'. The CPU's kernel runs it.")
    d = ldt.from_numpy(x.dtype)
    if d not in DTYPES:
        raise unsupported("quantized_matmul", d, DTYPES)
    w = host_array(weights[0], np.uint32)
    w = w.reshape((-1,) + w.shape[-2:])
    scales = host_array(weights[1])
    biases = host_array(weights[2]) if len(weights) > 2 else None
    if scales.dtype != x.dtype or (biases is not None and biases.dtype != x.dtype):
        scales = host_array(scales, np.float32)
        biases = None if biases is None else host_array(biases, np.float32)
    s = ldt.from_numpy(scales.dtype)
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
    run(Dispatch(LIBRARY, f"qmm_{d.name}_{s.name}", [
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
    """``Dequantize`` (inputs ``(w, scales, biases)``, affine) on Metal: values of
    ``primitive.dtype``, bit for bit the CPU kernel's (MLX's) arithmetic."""
    if primitive.mode != "affine" or len(inputs) != 3:
        raise UnsupportedDtype(f"Metal kernel dequantize has no version for mode "
                               f"{primitive.mode!r}; it has 'affine'. The CPU's kernel runs it.")
    s, o = ldt.from_numpy(inputs[1].dtype), ldt.to_dtype(primitive.dtype)
    for d in (s, o, ldt.from_numpy(inputs[2].dtype)):
        if d not in DTYPES:
            raise unsupported("dequantize", d, DTYPES)
    if inputs[2].dtype != inputs[1].dtype:
        raise UnsupportedDtype("Metal kernel dequantize takes scales and biases of one dtype; "
                               "the CPU's kernel runs mixed ones.")
    w = host_array(inputs[0], np.uint32)
    scales, biases = host_array(inputs[1]), host_array(inputs[2])
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
    run(Dispatch(LIBRARY, f"dequantize_{s.name}_{o.name}",
                 [w, out, scales, biases, np.array(dims, np.int32)],
                 (values, rows, 1), (min(values, 256), 1, 1)))
    return out
