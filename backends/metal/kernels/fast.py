"""Metal kernels of the ``fast`` op pack's primitives: ``RMSNorm``, ``LayerNorm``,
``RoPE``, ``ScaledDotProductAttention`` and ``CrossEntropy``, and the fused backwards
``RMSNormVJP``, ``LayerNormVJP`` and ``ScaledDotProductAttentionVJP``.

One MSL library (with :mod:`.softmax`'s row statistics, which cross-entropy reuses), one
template per kernel instantiated per dtype from :data:`DTYPES` (and, for cross-entropy,
per target dtype from :data:`TARGET_DTYPES`); no text per dtype. Every kernel computes in
float and rounds once to the output dtype, with the numerics of the CPU reference kernels
(``backends/cpu/kernels/fast.py``):

* **norms** (``norm_<dtype>``, one template for both): a threadgroup per row of the
  last axis (strided rows, :func:`.common.row_layout`); LayerNorm's mean is a first
  threadgroup reduction, then ``sum((x - mean)^2)`` (the mean 0 for RMSNorm), then
  ``y = (x - mean) / sqrt(ms + eps) * weight + bias``, weight and bias optional
  (flags in a constant buffer, the same kernel);
* **norms' backwards** (``norm_vjp_<dtype>``, ``norm_vjp_columns_<dtype>``): dx by rows
  of C-contiguous x, each row's ``(mean, r)`` kept for a thread per column that sums the
  weight's and bias's cotangents over the rows;
* **RoPE** (``rope_<dtype>``): a thread per rotated pair ``(i, t, row)`` (plus one per
  feature past ``dims``, copied), the angle ``(t + offset) * scale * inv_freq[i]``
  computed in float32 as the CPU computes it (``inv_freq = exp(-i * float32(log(base) /
  (dims / 2)))``, or ``1 / freqs[i]``), traditional (``2i, 2i + 1``) or split halves
  (``i, i + dims / 2``) pairs, the inverse rotation when not ``forward``; offsets a
  scalar or one per batch; any layout of ``x`` through strides;
* **attention** (``sdpa_<dtype>``, ``sdpa_boolmask_<dtype>``): a threadgroup per
  (batch, query head, block of up to :data:`ROWS` query rows), a simdgroup per query
  row, its lanes splitting the head dimension (up to :data:`MAX_HEAD_DIM`, 8 values a
  lane). Each simdgroup walks the keys once with an **online softmax** (running max
  ``m``, running sum ``l``, the output accumulator rescaled by ``exp(m_old - m)`` when
  the max grows; the scores are never stored): the score ``scale * q . k`` is a
  ``simd_sum``, then masked (causal: keys past the lower-right diagonal; boolean;
  additive, broadcast by stride-0 strides) with the CPU's ``finfo(float32).min``, so a
  row that sees no key averages every value as MLX does. A sink starts the walk as
  ``m = sink, l = 1``. Grouped-query heads read kv head ``h // (Hq / Hkv)``. A causal
  row stops at its diagonal. The keys and values are read from device memory by every
  simdgroup (no threadgroup staging; on a GPU they come from the cache);
* **attention's backward** (``ScaledDotProductAttentionVJP``, FlashAttention-2's: the
  scores and their softmax recomputed, never stored; inputs ``(q, k, v[, mask][, sinks],
  out, dO)``, the forward's output given, its log-sum-exp not), three dispatches:

  1. ``sdpa_vjp_rows_<dtype>`` (and ``_boolmask_``): dq by query rows, sdpa's layout (a
     simdgroup per query row, lanes along the head dimension). A row first computes
     ``D = dO . out`` (a ``simd_sum``) and walks its keys for the softmax max ``m`` and
     sum ``l`` (the sink's logit included), then walks them again: ``p = exp(s - m) /
     l``, ``ds = p (dO . v - D)`` (0 where a causal or boolean mask holds the score
     constant), ``dq = scale sum ds k``. ``(m, l, D)`` of every row go to a float32
     scratch buffer (``(m, l)`` apart, not ``m + log l``: a row that sees no key has ``m``
     of ``finfo.min``, which would swallow ``log l``);
  2. ``sdpa_vjp_keys_<dtype>`` (and ``_boolmask_``): dk and dv by key rows, a threadgroup
     per (batch, kv head, block of :data:`ROWS` keys), a simdgroup per key row ``j``
     walking the query rows of each of the ``Hq / Hkv`` query heads that read its kv
     head (the grouped-query sum in registers: no atomics, one writer per output row),
     ``p`` recomputed from the rows' statistics: ``dv = sum p dO``, ``dk = scale sum ds
     q``. A causal key walks only the rows that see it, and the rows that see no key;
  3. with sinks, ``sdpa_vjp_sinks_<dtype>``: a threadgroup per (batch, query head)
     reduces ``-sum_i exp(sink - m_i) / l_i * D_i`` over the rows (float32, one per
     batch: the primitive's rule sums them).
* **cross-entropy** (``cross_entropy_<dtype>_<target dtype>``): softmax's row statistics
  (the max, taken as 0 where not finite, and ``sum(exp(x - m))``), then ``log(s) + m -
  logits[target mod n]`` in float32, one value per row.

float64 has no Metal type (:class:`.common.UnsupportedDtype`, then the fallback refuses
it); a head dimension over :data:`MAX_HEAD_DIM` is refused the same way (the CPU's kernel
runs it), in the forward and the backward alike.
"""

from __future__ import annotations

import math

import numpy as np

from lazyx import dtypes as ldt

from . import softmax
from .common import (empty, PRELUDE, SIMD_WIDTH, Dispatch, Library, UnsupportedDtype, bindable,
                     host_array, instantiate, msl_type, row_layout, threadgroup_for_rows,
                     unsupported)

__all__ = ["rms_norm", "layer_norm", "rms_norm_vjp", "layer_norm_vjp", "rope", "attention",
           "attention_vjp", "cross_entropy", "LIBRARY", "DTYPES",
           "TARGET_DTYPES", "ROWS", "MAX_HEAD_DIM"]

#: Query rows (simdgroups) per attention threadgroup; head dimensions one simdgroup holds.
ROWS, MAX_HEAD_DIM = 4, 256

_SOURCE = PRELUDE + softmax.ROW_STATISTICS + r"""
// ---- norms: a threadgroup per row; flags = (centre, weighted, biased) ----------------------
template <typename T, typename U>
[[kernel]] void norm(
    device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
    device const T* weight [[buffer(2)]], device const T* bias [[buffer(3)]],
    constant int* flags [[buffer(4)]], constant float& eps [[buffer(5)]],
    constant int64_t* wb_strides [[buffer(6)]], constant uint& row_size [[buffer(7)]],
    constant int* red_shape [[buffer(8)]], constant int64_t* x_red_strides [[buffer(9)]],
    constant int64_t* out_red_strides [[buffer(10)]], constant int& red_ndim [[buffer(11)]],
    constant int* row_shape [[buffer(12)]], constant int64_t* x_row_strides [[buffer(13)]],
    constant int64_t* out_row_strides [[buffer(14)]], constant int& row_ndim [[buffer(15)]],
    uint3 group [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]],
    uint3 threads [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
    uint simd_group [[simdgroup_index_in_threadgroup]]) {
  threadgroup U partial[32];
  const uint n_simd = (threads.x + 31) / 32;
  device const T* row = x + elem_to_loc(group.y, row_shape, x_row_strides, row_ndim);
  device T* dest = out + elem_to_loc(group.y, row_shape, out_row_strides, row_ndim);
  U mean = U(0);
  if (flags[0]) {
    U s = U(0);
    for (uint k = lid.x; k < row_size; k += threads.x)
      s += U(row[elem_to_loc(k, red_shape, x_red_strides, red_ndim)]);
    mean = threadgroup_reduce<U, Sum<U>>(s, partial, lane, simd_group, n_simd) / U(row_size);
  }
  U ss = U(0);
  for (uint k = lid.x; k < row_size; k += threads.x) {
    U c = U(row[elem_to_loc(k, red_shape, x_red_strides, red_ndim)]) - mean;
    ss += c * c;
  }
  ss = threadgroup_reduce<U, Sum<U>>(ss, partial, lane, simd_group, n_simd);
  const U r = U(1) / metal::sqrt(ss / U(row_size) + U(eps));
  for (uint k = lid.x; k < row_size; k += threads.x) {
    U y = (U(row[elem_to_loc(k, red_shape, x_red_strides, red_ndim)]) - mean) * r;
    if (flags[1]) y *= U(weight[int64_t(k) * wb_strides[0]]);
    if (flags[2]) y += U(bias[int64_t(k) * wb_strides[1]]);
    dest[elem_to_loc(k, red_shape, out_red_strides, red_ndim)] = T(y);
  }
}

// ---- norms' backward (RMSNormVJP, LayerNormVJP): a threadgroup per row of C-contiguous x
// and cotangent g for dx, the row's (mean, r) kept in `stats` for the column pass; in
// float, as the CPU kernels: gw = g * weight, xn = (x - mean) r,
//   dx = r (gw - [centre] sum(gw) / n - xn sum(gw xn) / n).   flags = (centre, weighted)
template <typename T, typename U>
[[kernel]] void norm_vjp(
    device const T* x [[buffer(0)]], device T* dx [[buffer(1)]],
    device const T* weight [[buffer(2)]], device const T* g [[buffer(3)]],
    device float* stats [[buffer(4)]], constant int* flags [[buffer(5)]],
    constant float& eps [[buffer(6)]], constant uint& n [[buffer(7)]],
    uint3 group [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]],
    uint3 threads [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
    uint simd_group [[simdgroup_index_in_threadgroup]]) {
  threadgroup U partial[32];
  const uint n_simd = (threads.x + 31) / 32;
  const int64_t base = int64_t(group.y) * n;
  device const T* xr = x + base;
  device const T* gr = g + base;
  U mean = U(0);
  if (flags[0]) {
    U s = U(0);
    for (uint k = lid.x; k < n; k += threads.x) s += U(xr[k]);
    mean = threadgroup_reduce<U, Sum<U>>(s, partial, lane, simd_group, n_simd) / U(n);
  }
  U ss = U(0);
  for (uint k = lid.x; k < n; k += threads.x) {
    const U c = U(xr[k]) - mean;
    ss += c * c;
  }
  ss = threadgroup_reduce<U, Sum<U>>(ss, partial, lane, simd_group, n_simd);
  const U r = U(1) / metal::sqrt(ss / U(n) + U(eps));
  U s1 = U(0), s2 = U(0);
  for (uint k = lid.x; k < n; k += threads.x) {
    const U gw = U(gr[k]) * (flags[1] ? U(weight[k]) : U(1));
    s1 += gw;
    s2 += gw * (U(xr[k]) - mean) * r;
  }
  s1 = threadgroup_reduce<U, Sum<U>>(s1, partial, lane, simd_group, n_simd);
  s2 = threadgroup_reduce<U, Sum<U>>(s2, partial, lane, simd_group, n_simd);
  const U m1 = flags[0] ? s1 / U(n) : U(0), m2 = s2 / U(n);
  for (uint k = lid.x; k < n; k += threads.x) {
    const U gw = U(gr[k]) * (flags[1] ? U(weight[k]) : U(1));
    const U xn = (U(xr[k]) - mean) * r;
    dx[base + k] = T(r * (gw - m1 - xn * m2));
  }
  if (lid.x == 0) {
    stats[2 * int64_t(group.y)] = float(mean);
    stats[2 * int64_t(group.y) + 1] = float(r);
  }
}

// The weight's and bias's cotangents: a thread per column k, summing over the rows in
// float (g * xn, g) with the rows' (mean, r) from norm_vjp.   flags = (weighted, biased)
template <typename T>
[[kernel]] void norm_vjp_columns(
    device const T* x [[buffer(0)]], device T* dw [[buffer(1)]], device T* db [[buffer(2)]],
    device const T* g [[buffer(3)]], device const float* stats [[buffer(4)]],
    constant int* flags [[buffer(5)]], constant uint* sizes [[buffer(6)]],
    uint3 pos [[thread_position_in_grid]]) {
  const uint rows = sizes[0], n = sizes[1], k = pos.x;
  if (k >= n) return;
  float sw = 0.0f, sb = 0.0f;
  for (uint i = 0; i < rows; ++i) {
    const int64_t at = int64_t(i) * n + k;
    const float gv = float(g[at]);
    sw += gv * (float(x[at]) - stats[2 * int64_t(i)]) * stats[2 * int64_t(i) + 1];
    sb += gv;
  }
  if (flags[0]) dw[k] = T(sw);
  if (flags[1]) db[k] = T(sb);
}

// ---- RoPE: a thread per (pair or passed-through feature, position t, row n of B * H) --------
// sizes: dims, D, T, rows per batch element, offset stride (0: one offset), traditional,
// has freqs, forward. params: scale, log(base) / (dims / 2) (float32, as the CPU's).
template <typename T>
[[kernel]] void rope(
    device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
    device const int* offset [[buffer(2)]], device const float* freqs [[buffer(3)]],
    constant int* sizes [[buffer(4)]], constant float* params [[buffer(5)]],
    constant int* row_shape [[buffer(6)]], constant int64_t* row_strides [[buffer(7)]],
    constant int& row_ndim [[buffer(8)]], constant int64_t* td_strides [[buffer(9)]],
    uint3 pos [[thread_position_in_grid]]) {
  const int dims = sizes[0], D = sizes[1], seq = sizes[2], pairs = dims / 2;
  const int i = int(pos.x), t = int(pos.y);
  const uint n = pos.z;
  if (i >= pairs + (D - dims) || t >= seq) return;
  device const T* src = x + elem_to_loc(n, row_shape, row_strides, row_ndim)
                          + int64_t(t) * td_strides[0];
  device T* dst = out + (int64_t(n) * seq + t) * D;
  const int64_t sd = td_strides[1];
  if (i >= pairs) {   // past `dims`: unchanged
    const int e = dims + (i - pairs);
    dst[e] = src[e * sd];
    return;
  }
  const float p = (float(t) + float(offset[int(n) / sizes[3] * sizes[4]])) * params[0];
  const float inv = sizes[6] ? 1.0f / freqs[i] : metal::exp(float(-i) * params[1]);
  const float theta = p * inv;
  const float c = metal::cos(theta), s = sizes[7] ? metal::sin(theta) : -metal::sin(theta);
  const int i1 = sizes[5] ? 2 * i : i, i2 = sizes[5] ? 2 * i + 1 : i + pairs;
  const float x1 = float(src[i1 * sd]), x2 = float(src[i2 * sd]);
  dst[i1] = T(x1 * c - x2 * s);
  dst[i2] = T(x1 * s + x2 * c);
}

// ---- attention: a simdgroup per query row, an online softmax over the keys -----------------
// sizes: Hq, Hq / Hkv, Tq, Tk, D, Dv, mask kind (0 none, 1 causal, 2 array), has sinks,
// the sinks' batch stride (0: one per head). Strides (elements): 4 per operand, B H T D.
static constant constexpr const int SDPA_PER_LANE = @PER_LANE@;   // MAX_HEAD_DIM / 32
// A boolean mask keeps or masks a score; an additive one (of q's type) is added to it.
inline float masked_score(float s, bool keep, float masked) { return keep ? s : masked; }
template <typename M> inline float masked_score(float s, M add, float) { return s + float(add); }

// A query row's softmax start and the keys it walks (the forward's and the backward's): the
// sink is one more logit with no value (m = sink, l = 1), a causal row stops at its diagonal.
template <typename T>
inline int sdpa_row_start(thread float& m, thread float& l, device const T* sinks,
                          constant int* sizes, int b, int h, int row, int diag, int Tk,
                          int kind) {
  m = -numeric_limits<float>::infinity();
  l = 0.0f;
  if (sizes[7]) {
    m = float(sinks[b * sizes[8] + h]);
    l = 1.0f;
  }
  return (kind == 1 && diag >= 0 && diag + 1 < Tk) ? diag + 1 : Tk;
}

// The score of a query row (qr: its scaled query, this lane's share) against key row K,
// masked (`past`: the key lies past a causal row's diagonal); `kept`: the mask left it a
// function of q and k (the backward's ds). The forward and both backward kernels compute
// it alike, so p agrees.
inline bool score_kept(bool keep) { return keep; }
template <typename M> inline bool score_kept(M) { return true; }

template <typename T, typename M>
inline float sdpa_score(thread const float* qr, device const T* K, int64_t stride, int D,
                        uint lane, int kind, bool past, device const M* mval, float masked,
                        thread bool& kept) {
  float part = 0.0f;
  for (int e = 0; e < SDPA_PER_LANE; ++e) {
    const int d = int(lane) + 32 * e;
    if (d < D) part += qr[e] * float(K[d * stride]);
  }
  float s = simd_sum(part);
  kept = true;
  if (kind == 1 && past) {
    s = masked;
    kept = false;
  } else if (kind == 2) {
    kept = score_kept(*mval);
    s = masked_score(s, *mval, masked);
  }
  return s;
}

template <typename T, typename M>
[[kernel]] void sdpa(
    device const T* q [[buffer(0)]], device T* out [[buffer(1)]],
    device const T* k [[buffer(2)]], device const T* v [[buffer(3)]],
    device const M* mask [[buffer(4)]], device const T* sinks [[buffer(5)]],
    constant int* sizes [[buffer(6)]], constant float& scale [[buffer(7)]],
    constant int64_t* qs [[buffer(8)]], constant int64_t* ks [[buffer(9)]],
    constant int64_t* vs [[buffer(10)]], constant int64_t* ms [[buffer(11)]],
    uint3 group [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]],
    uint3 threads [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
  const float masked = numeric_limits<float>::lowest();   // the CPU's MASKED
  const int Hq = sizes[0], G = sizes[1], Tq = sizes[2], Tk = sizes[3], D = sizes[4];
  const int Dv = sizes[5], kind = sizes[6];
  const int b = int(group.z) / Hq, h = int(group.z) % Hq, hk = h / G;
  const int wanted = int(group.y * threads.y + lid.y);   // the query row
  // Rows past Tq repeat the last one (a whole simdgroup, so simd_sum sees every lane) and
  // write nothing.
  const int row = wanted < Tq ? wanted : Tq - 1;
  device const T* Q = q + b * qs[0] + h * qs[1] + row * qs[2];
  device const T* K = k + b * ks[0] + hk * ks[1];
  device const T* V = v + b * vs[0] + hk * vs[1];
  device const M* Mrow = mask + b * ms[0] + h * ms[1] + row * ms[2];
  float qr[SDPA_PER_LANE], acc[SDPA_PER_LANE];
  for (int e = 0; e < SDPA_PER_LANE; ++e) {
    const int d = int(lane) + 32 * e;
    qr[e] = d < D ? float(Q[d * qs[3]]) * scale : 0.0f;
    acc[e] = 0.0f;
  }
  float m, l;
  const int diag = row + Tk - Tq;   // causal: the last key the row sees
  const int keys = sdpa_row_start(m, l, sinks, sizes, b, h, row, diag, Tk, kind);
  for (int j = 0; j < keys; ++j) {
    bool kept;   // (the backward's)
    const float s = sdpa_score(qr, K + j * ks[2], ks[3], D, lane, kind, j > diag,
                               Mrow + j * ms[3], masked, kept);
    const float top = s > m ? s : m;
    const float factor = metal::exp(m - top), p = metal::exp(s - top);
    l = l * factor + p;
    for (int e = 0; e < SDPA_PER_LANE; ++e) {
      const int d = int(lane) + 32 * e;
      if (d < Dv) acc[e] = acc[e] * factor + p * float(V[j * vs[2] + d * vs[3]]);
    }
    m = top;
  }
  if (wanted >= Tq) return;
  device T* O = out + ((int64_t(b) * Hq + h) * Tq + row) * Dv;
  for (int e = 0; e < SDPA_PER_LANE; ++e) {
    const int d = int(lane) + 32 * e;
    if (d < Dv) O[d] = T(acc[e] / l);
  }
}

// ---- attention's backward (ScaledDotProductAttentionVJP): FlashAttention-2's, the scores and
// their softmax recomputed from each query row's statistics, never stored. sizes and strides
// as sdpa's (plus the output's and the cotangent's strides). stats holds, per query row
// (b, h, i) in C order, (m, l, D): the row's softmax max and sum (the sink included) and
// D = dO . O, the forward's output as given (the CPU's rowsum(dO * out)).
// A causal mask or a boolean mask's False holds a score constant: no gradient flows through
// it (ds = 0, as the CPU's `keep`, sdpa_score's `kept`); an additive mask moves the score
// but passes gradients.

// dq by query rows: a threadgroup per (batch, query head, block of up to ROWS rows), a
// simdgroup per row, its lanes splitting the head dimension, as sdpa. Two walks over the
// row's keys (a causal row stops at its diagonal): the online max and sum (no values), then
//   p_j = exp(s_j - m) / l,  ds_j = p_j (dO . v_j - D),  dq = scale sum_j ds_j k_j.
// A causal row that sees no key has every score constant: dq = 0, no second walk.
template <typename T, typename M>
[[kernel]] void sdpa_vjp_rows(
    device const T* q [[buffer(0)]], device T* dq [[buffer(1)]],
    device const T* k [[buffer(2)]], device const T* v [[buffer(3)]],
    device const M* mask [[buffer(4)]], device const T* sinks [[buffer(5)]],
    device const T* o [[buffer(6)]], device const T* g [[buffer(7)]],
    device float* stats [[buffer(8)]], constant int* sizes [[buffer(9)]],
    constant float& scale [[buffer(10)]], constant int64_t* qs [[buffer(11)]],
    constant int64_t* ks [[buffer(12)]], constant int64_t* vs [[buffer(13)]],
    constant int64_t* ms [[buffer(14)]], constant int64_t* os [[buffer(15)]],
    constant int64_t* gs [[buffer(16)]],
    uint3 group [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]],
    uint3 threads [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
  const float masked = numeric_limits<float>::lowest();   // the CPU's MASKED
  const int Hq = sizes[0], G = sizes[1], Tq = sizes[2], Tk = sizes[3], D = sizes[4];
  const int Dv = sizes[5], kind = sizes[6];
  const int b = int(group.z) / Hq, h = int(group.z) % Hq, hk = h / G;
  const int wanted = int(group.y * threads.y + lid.y);   // the query row
  // Rows past Tq repeat the last one (whole simdgroups for simd_sum) and write nothing.
  const int row = wanted < Tq ? wanted : Tq - 1;
  device const T* Q = q + b * qs[0] + h * qs[1] + row * qs[2];
  device const T* O = o + b * os[0] + h * os[1] + row * os[2];
  device const T* dO = g + b * gs[0] + h * gs[1] + row * gs[2];
  device const T* K = k + b * ks[0] + hk * ks[1];
  device const T* V = v + b * vs[0] + hk * vs[1];
  device const M* Mrow = mask + b * ms[0] + h * ms[1] + row * ms[2];
  float qr[SDPA_PER_LANE], gr[SDPA_PER_LANE], acc[SDPA_PER_LANE];
  float part = 0.0f;
  for (int e = 0; e < SDPA_PER_LANE; ++e) {
    const int d = int(lane) + 32 * e;
    qr[e] = d < D ? float(Q[d * qs[3]]) * scale : 0.0f;
    gr[e] = d < Dv ? float(dO[d * gs[3]]) : 0.0f;
    if (d < Dv) part += gr[e] * float(O[d * os[3]]);
    acc[e] = 0.0f;
  }
  const float Drow = simd_sum(part);
  float m, l;
  const int diag = row + Tk - Tq;   // causal: the last key the row sees
  const int keys = sdpa_row_start(m, l, sinks, sizes, b, h, row, diag, Tk, kind);
  for (int j = 0; j < keys; ++j) {
    bool kept;
    const float s = sdpa_score(qr, K + j * ks[2], ks[3], D, lane, kind, j > diag,
                               Mrow + j * ms[3], masked, kept);
    const float top = s > m ? s : m;
    l = l * metal::exp(m - top) + metal::exp(s - top);
    m = top;
  }
  const int walked = (kind == 1 && diag < 0) ? 0 : keys;
  for (int j = 0; j < walked; ++j) {
    bool kept;
    const float s = sdpa_score(qr, K + j * ks[2], ks[3], D, lane, kind, j > diag,
                               Mrow + j * ms[3], masked, kept);
    float dp = 0.0f;
    for (int e = 0; e < SDPA_PER_LANE; ++e) {
      const int d = int(lane) + 32 * e;
      if (d < Dv) dp += gr[e] * float(V[j * vs[2] + d * vs[3]]);
    }
    dp = simd_sum(dp);
    const float ds = kept ? metal::exp(s - m) / l * (dp - Drow) : 0.0f;
    for (int e = 0; e < SDPA_PER_LANE; ++e) {
      const int d = int(lane) + 32 * e;
      if (d < D) acc[e] += ds * float(K[j * ks[2] + d * ks[3]]);
    }
  }
  if (wanted >= Tq) return;
  const int64_t at = (int64_t(b) * Hq + h) * Tq + row;
  for (int e = 0; e < SDPA_PER_LANE; ++e) {
    const int d = int(lane) + 32 * e;
    if (d < D) dq[at * D + d] = T(acc[e] * scale);
  }
  if (lane == 0) {
    stats[3 * at] = m;
    stats[3 * at + 1] = l;
    stats[3 * at + 2] = Drow;
  }
}

// dk, dv by key rows: a threadgroup per (batch, kv head, block of up to ROWS key rows), a
// simdgroup per key row j. It walks the query rows of every query head that reads its kv
// head (the grouped heads' sum stays in registers: no atomics) and recomputes p from the
// rows' stats:   dv_j = sum_i p_ij dO_i,   dk_j = scale sum_i ds_ij q_i.
// Causal: the rows that see key j (from j + Tq - Tk on), and the rows that see no key at
// all (their p is 1 / Tk everywhere, or 0 beside a sink; ds = 0).
template <typename T, typename M>
[[kernel]] void sdpa_vjp_keys(
    device const T* k [[buffer(0)]], device T* dk [[buffer(1)]], device T* dv [[buffer(2)]],
    device const T* q [[buffer(3)]], device const T* v [[buffer(4)]],
    device const M* mask [[buffer(5)]], device const T* g [[buffer(6)]],
    device const float* stats [[buffer(7)]], constant int* sizes [[buffer(8)]],
    constant float& scale [[buffer(9)]], constant int64_t* qs [[buffer(10)]],
    constant int64_t* ks [[buffer(11)]], constant int64_t* vs [[buffer(12)]],
    constant int64_t* ms [[buffer(13)]], constant int64_t* gs [[buffer(14)]],
    uint3 group [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]],
    uint3 threads [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
  const float masked = numeric_limits<float>::lowest();
  const int Hq = sizes[0], G = sizes[1], Tq = sizes[2], Tk = sizes[3], D = sizes[4];
  const int Dv = sizes[5], kind = sizes[6], Hkv = Hq / G;
  const int b = int(group.z) / Hkv, hk = int(group.z) % Hkv;
  const int wanted = int(group.y * threads.y + lid.y);   // the key row
  const int j = wanted < Tk ? wanted : Tk - 1;
  device const T* K = k + b * ks[0] + hk * ks[1] + j * ks[2];
  device const T* V = v + b * vs[0] + hk * vs[1] + j * vs[2];
  float vr[SDPA_PER_LANE], dka[SDPA_PER_LANE], dva[SDPA_PER_LANE];
  for (int e = 0; e < SDPA_PER_LANE; ++e) {
    const int d = int(lane) + 32 * e;
    vr[e] = d < Dv ? float(V[d * vs[3]]) : 0.0f;
    dka[e] = 0.0f;
    dva[e] = 0.0f;
  }
  // The query rows in two ranges: [0, blind) (causal rows that see no key), [first, Tq).
  const int blind = kind == 1 ? clamp(Tq - Tk, 0, Tq) : 0;
  const int first = kind == 1 ? max(j + Tq - Tk, blind) : 0;
  for (int h = hk * G; h < hk * G + G; ++h) {
    device const float* st = stats + (int64_t(b) * Hq + h) * Tq * 3;
    for (int range = 0; range < 2; ++range) {
      const int lo = range ? first : 0, hi = range ? Tq : blind;
      for (int i = lo; i < hi; ++i) {
        device const T* Q = q + b * qs[0] + h * qs[1] + i * qs[2];
        device const T* dO = g + b * gs[0] + h * gs[1] + i * gs[2];
        float qr[SDPA_PER_LANE];
        for (int e = 0; e < SDPA_PER_LANE; ++e) {
          const int d = int(lane) + 32 * e;
          qr[e] = d < D ? float(Q[d * qs[3]]) * scale : 0.0f;
        }
        bool kept;
        const float s = sdpa_score(qr, K, ks[3], D, lane, kind, range == 0,
                                   mask + b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3],
                                   masked, kept);
        const float p = metal::exp(s - st[3 * i]) / st[3 * i + 1];
        float dp = 0.0f;
        for (int e = 0; e < SDPA_PER_LANE; ++e) {
          const int d = int(lane) + 32 * e;
          if (d < Dv) {
            const float gv = float(dO[d * gs[3]]);
            dp += gv * vr[e];
            dva[e] += p * gv;
          }
        }
        dp = simd_sum(dp);
        const float ds = kept ? p * (dp - st[3 * i + 2]) : 0.0f;
        for (int e = 0; e < SDPA_PER_LANE; ++e) dka[e] += ds * qr[e];
      }
    }
  }
  if (wanted >= Tk) return;
  const int64_t at = (int64_t(b) * Hkv + hk) * Tk + j;
  for (int e = 0; e < SDPA_PER_LANE; ++e) {
    const int d = int(lane) + 32 * e;
    if (d < D) dk[at * D + d] = T(dka[e]);
    if (d < Dv) dv[at * Dv + d] = T(dva[e]);
  }
}

// The sinks' cotangents per (batch, query head): a threadgroup per (b, h), its threads over
// the query rows: -sum_i p_sink_i D_i, p_sink_i = exp(sink - m_i) / l_i. sizes: Hq, Tq, the
// sinks' batch stride (0: one per head).
template <typename T>
[[kernel]] void sdpa_vjp_sinks(
    device const T* sinks [[buffer(0)]], device float* dsinks [[buffer(1)]],
    device const float* stats [[buffer(2)]], constant int* sizes [[buffer(3)]],
    uint3 group [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]],
    uint3 threads [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
    uint simd_group [[simdgroup_index_in_threadgroup]]) {
  threadgroup float partial[32];
  const int Hq = sizes[0], Tq = sizes[1];
  const int bh = int(group.y), b = bh / Hq, h = bh % Hq;
  const float sink = float(sinks[b * sizes[2] + h]);
  device const float* st = stats + int64_t(bh) * Tq * 3;
  float sum = 0.0f;
  for (int i = int(lid.x); i < Tq; i += int(threads.x))
    sum += metal::exp(sink - st[3 * i]) / st[3 * i + 1] * st[3 * i + 2];
  sum = threadgroup_reduce<float, Sum<float>>(sum, partial, lane, simd_group,
                                              (threads.x + 31) / 32);
  if (lid.x == 0) dsinks[bh] = -sum;
}

// ---- cross-entropy: softmax's row statistics, then lse - logits[target] -------------------
// Rows of logits and of the targets broadcast along the class axis: buffers 4-11 from
// common.row_layout(shape, (last,), logits, targets).
template <typename T, typename I>
[[kernel]] void cross_entropy(
    device const T* logits [[buffer(0)]], device float* out [[buffer(1)]],
    device const I* targets [[buffer(2)]], constant uint& row_size [[buffer(3)]],
    constant int* red_shape [[buffer(4)]], constant int64_t* red_strides [[buffer(5)]],
    constant int64_t* t_red_strides [[buffer(6)]], constant int& red_ndim [[buffer(7)]],
    constant int* row_shape [[buffer(8)]], constant int64_t* row_strides [[buffer(9)]],
    constant int64_t* t_row_strides [[buffer(10)]], constant int& row_ndim [[buffer(11)]],
    uint3 group [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]],
    uint3 threads [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
    uint simd_group [[simdgroup_index_in_threadgroup]]) {
  threadgroup float partial[32];
  device const T* row = logits + elem_to_loc(group.y, row_shape, row_strides, row_ndim);
  float m, s;
  row_statistics<T, float, true>(row, row_size, red_shape, red_strides, red_ndim, m, s, partial,
                                 lid.x, threads.x, lane, simd_group);
  if (lid.x != 0) return;
  // The class index modulo the class count (the CPU's int64 cast, then a floored mod).
  int64_t t = int64_t(targets[elem_to_loc(group.y, row_shape, t_row_strides, row_ndim)]);
  t %= int64_t(row_size);
  if (t < 0) t += int64_t(row_size);
  out[group.y] = (metal::log(s) + m) - float(row[elem_to_loc(uint64_t(t), red_shape, red_strides,
                                                              red_ndim)]);
}
"""

#: The dtypes every kernel has versions for (float64 has no Metal type).
DTYPES = (ldt.float32, ldt.float16, ldt.bfloat16)
#: Cross-entropy's target (class index) dtypes.
TARGET_DTYPES = (ldt.int8, ldt.int16, ldt.int32, ldt.int64, ldt.uint8, ldt.uint16, ldt.uint32,
                 ldt.uint64)

LIBRARY = Library("fast", _SOURCE.replace("@PER_LANE@", str(MAX_HEAD_DIM // SIMD_WIDTH))
                  + "\n" + "".join(
    [instantiate(f"norm_{d.name}", "norm", msl_type(d), "float") for d in DTYPES]
    + [instantiate(f"norm_vjp_{d.name}", "norm_vjp", msl_type(d), "float") for d in DTYPES]
    + [instantiate(f"norm_vjp_columns_{d.name}", "norm_vjp_columns", msl_type(d))
       for d in DTYPES]
    + [instantiate(f"rope_{d.name}", "rope", msl_type(d)) for d in DTYPES]
    + [instantiate(f"{f}_{tag}{d.name}", f, msl_type(d), msl_type(d) if not tag else "bool")
       for f in ("sdpa", "sdpa_vjp_rows", "sdpa_vjp_keys") for d in DTYPES
       for tag in ("", "boolmask_")]
    + [instantiate(f"sdpa_vjp_sinks_{d.name}", "sdpa_vjp_sinks", msl_type(d)) for d in DTYPES]
    + [instantiate(f"cross_entropy_{d.name}_{i.name}", "cross_entropy", msl_type(d), msl_type(i))
       for d in DTYPES for i in TARGET_DTYPES]))


def _checked(kernel: str, x, dtypes=DTYPES):
    x = bindable(x)
    d = ldt.from_numpy(x.dtype)
    if d not in dtypes:
        raise unsupported(kernel, d, dtypes)
    return x, d


def _elements(a: np.ndarray) -> list:
    """``a``'s strides in elements, 0 along a dimension of size 1 (it broadcasts)."""
    return [0 if n == 1 else s // a.itemsize for n, s in zip(a.shape, a.strides, strict=True)]


# -- norms ---------------------------------------------------------------------------------------
def _norm(kernel: str, inputs, run, eps: float, centre: bool, weighted: bool, biased: bool):
    x, d = _checked(kernel, inputs[0])
    params = []
    for a in inputs[1:]:
        a, _ = _checked(kernel, a)
        if a.dtype != x.dtype:   # the ops cast them to x's dtype; anything else: the CPU's
            raise unsupported(kernel, ldt.from_numpy(a.dtype), (d,))
        params.append(np.broadcast_to(a, x.shape[-1:]))
    out = empty(run, x.shape, x.dtype)
    if out.size == 0:
        return out
    weight = params[0] if weighted else np.zeros(1, x.dtype)
    bias = params[-1] if biased else np.zeros(1, x.dtype)
    wb = [_elements(weight)[0] if weighted else 0, _elements(bias)[0] if biased else 0]
    rows, size, layout = row_layout(x.shape, (x.ndim - 1,), x, out)
    threads = threadgroup_for_rows(size)
    run(Dispatch(LIBRARY, f"norm_{d.name}", [
        x, out, weight, bias, np.array([centre, weighted, biased], np.int32),
        np.array([eps], np.float32), np.array(wb, np.int64), np.array([size], np.uint32),
        *layout], (threads, rows, 1), (threads, 1, 1)))
    return out


def rms_norm(primitive, inputs, run):
    """``RMSNorm`` (inputs ``(x[, weight])``) on Metal: the output (x's shape and dtype)."""
    return _norm("rms_norm", inputs, run, primitive.eps, False, len(inputs) > 1, False)


def layer_norm(primitive, inputs, run):
    """``LayerNorm`` (inputs ``(x[, weight][, bias])``) on Metal: the output."""
    return _norm("layer_norm", inputs, run, primitive.eps, True, bool(primitive.weighted),
                 bool(primitive.biased))


def _norm_vjp(kernel: str, inputs, run, eps: float, centre: bool, weighted: bool,
              biased: bool):
    """dx, then the weight's and bias's cotangents (sums over rows) of a norm."""
    x, d = _checked(kernel, inputs[0])
    g = inputs[-1]
    params = list(inputs[1:-1])
    for a in [g] + params:
        if a.dtype != x.dtype:   # the ops cast them to x's dtype; anything else: the CPU's
            raise unsupported(kernel, ldt.from_numpy(a.dtype), (d,))
    n = x.shape[-1] if x.ndim else 1
    rows = x.size // n if n else 0
    if rows == 0 or any(a.size != n for a in params):
        raise UnsupportedDtype(f"Metal kernel {kernel} takes rows of at least one element and "
                               f"weights of the row's length; the CPU's kernel runs this case.")
    x = x if x.flags.c_contiguous else host_array(x)
    g = g if g.flags.c_contiguous else host_array(g)
    weight = host_array(params[0]).reshape(-1) if weighted else np.zeros(1, x.dtype)
    dx = empty(run, x.shape, x.dtype)
    stats = empty(run, (rows, 2), np.float32)
    threads = threadgroup_for_rows(n)
    run(Dispatch(LIBRARY, f"norm_vjp_{d.name}", [
        x, dx, weight, g, stats, np.array([centre, weighted], np.int32),
        np.array([eps], np.float32), np.array([n], np.uint32)],
        (threads, rows, 1), (threads, 1, 1), writes=(1, 4)))
    out = [dx]
    if weighted or biased:
        dw = empty(run, (n,), x.dtype) if weighted else np.zeros(1, x.dtype)
        db = empty(run, (n,), x.dtype) if biased else np.zeros(1, x.dtype)
        run(Dispatch(LIBRARY, f"norm_vjp_columns_{d.name}", [
            x, dw, db, g, stats, np.array([weighted, biased], np.int32),
            np.array([rows, n], np.uint32)], (n, 1, 1), (min(n, 256), 1, 1),
            writes=(1,) * weighted + (2,) * biased))
        if weighted:
            out.append(dw.reshape(params[0].shape))
        if biased:
            out.append(db.reshape(params[-1].shape))
    return tuple(out)


def rms_norm_vjp(primitive, inputs, run):
    """``RMSNormVJP`` (inputs ``(x[, weight], cotangent)``) on Metal: ``(dx[, dweight])``."""
    return _norm_vjp("rms_norm_vjp", inputs, run, primitive.eps, False, len(inputs) > 2,
                     False)


def layer_norm_vjp(primitive, inputs, run):
    """``LayerNormVJP`` (inputs ``(x[, weight][, bias], cotangent)``) on Metal: ``(dx[,
    dweight][, dbias])``."""
    return _norm_vjp("layer_norm_vjp", inputs, run, primitive.eps, True,
                     bool(primitive.weighted), bool(primitive.biased))


# -- RoPE ----------------------------------------------------------------------------------------
def rope(primitive, inputs, run):
    """``RoPE`` (inputs ``(x, offset[, freqs])``, x ``(B, *, T, D)``) on Metal: the output."""
    x, d = _checked("rope", inputs[0])
    out = empty(run, x.shape, x.dtype)
    if out.size == 0:
        return out
    offset = host_array(inputs[1], np.int32).reshape(-1)
    has_freqs = len(inputs) > 2
    freqs = host_array(inputs[2], np.float32) if has_freqs else np.zeros(1, np.float32)
    dims, pairs = int(primitive.dims), int(primitive.dims) // 2
    seq, features = x.shape[-2], x.shape[-1]
    rows = math.prod(x.shape[:-2])
    st = [s // x.itemsize for s in x.strides]
    # float32(log(base) / pairs), as the CPU's angle table (numpy float64, then float32).
    coefficient = 0.0 if primitive.base is None else np.log(primitive.base) / pairs
    sizes = [dims, features, seq, rows // x.shape[0], int(offset.size > 1),
             int(primitive.traditional), int(has_freqs), int(primitive.forward)]
    width = pairs + features - dims   # threads along x: the pairs, then the copied features
    group = min(width, SIMD_WIDTH)
    run(Dispatch(LIBRARY, f"rope_{d.name}", [
        x, out, offset, freqs, np.array(sizes, np.int32),
        np.array([primitive.scale, coefficient], np.float32),
        np.array(x.shape[:-2], np.int32), np.array(st[:-2], np.int64),
        np.array([x.ndim - 2], np.int32), np.array(st[-2:], np.int64)],
        (-(-width // group) * group, seq, rows), (group, 1, 1)))
    return out


# -- attention -----------------------------------------------------------------------------------
def _attention_operands(kernel: str, primitive, inputs):
    """Attention's operands as its kernels bind them, from ``inputs = (q, k, v[, mask]
    [, sinks])``: ``(q, dtype, k, v, mask or None, sinks or None, sizes)``, ``sizes`` the
    kernels' constant table. k or v not of q's dtype, a head dimension past
    :data:`MAX_HEAD_DIM`, or an additive mask not of q's dtype, is
    :class:`.common.UnsupportedDtype` (the CPU's kernel runs it)."""
    q, d = _checked(kernel, inputs[0])
    k, v = (_checked(kernel, a)[0] for a in inputs[1:3])
    for a in (k, v):   # one element type for the three (the op casts them): else the CPU's
        if a.dtype != q.dtype:
            raise unsupported(kernel, ldt.from_numpy(a.dtype), (d,))
    _, hq, tq, dk = q.shape
    hkv, tk, dv = k.shape[1], k.shape[2], v.shape[3]
    if max(dk, dv) > MAX_HEAD_DIM:
        raise UnsupportedDtype(f"Metal kernel {kernel} has no version for head dimensions {dk} "
                               f"(queries, keys) and {dv} (values): it holds at most "
                               f"{MAX_HEAD_DIM} per simdgroup. The CPU's kernel runs it.")
    extra = list(inputs[3:])
    mask = bindable(extra.pop(0)) if primitive.mask == "array" else None
    sinks = host_array(extra.pop(0), q.dtype) if primitive.sinks else None
    if mask is not None and mask.dtype != np.bool_ and mask.dtype != q.dtype:
        raise unsupported(kernel, ldt.from_numpy(mask.dtype), (d,))
    kind = {"none": 0, "causal": 1, "array": 2}[primitive.mask]
    sizes = [hq, hq // hkv, tq, tk, dk, dv, kind, int(sinks is not None),
             hq if sinks is not None and sinks.size > hq else 0]
    return q, d, k, v, mask, sinks, np.array(sizes, np.int32)


def _strides(*arrays) -> list:
    """The kernels' stride buffers: each array's :func:`_elements` (4 zeros for None)."""
    return [np.array(_elements(a) if a is not None else [0] * 4, np.int64) for a in arrays]


def _simdgroup_rows(rows: int, count: int) -> tuple:
    """``(grid, threadgroup)`` of the attention kernels: a simdgroup per row, blocks of up
    to :data:`ROWS` of the ``rows`` rows (the last block padded), ``count`` of them."""
    block = min(ROWS, rows)
    return (SIMD_WIDTH, -(-rows // block) * block, count), (SIMD_WIDTH, block, 1)


def _variant(kernel: str, mask, d) -> str:
    """The instantiation of ``kernel`` for dtype ``d`` and the mask's kind."""
    boolean = mask is not None and mask.dtype == np.bool_
    return f"{kernel}_{'boolmask_' if boolean else ''}{d.name}"


def attention(primitive, inputs, run):
    """``ScaledDotProductAttention`` (inputs ``(q, k, v[, mask][, sinks])``) on Metal: the
    output ``(B, Hq, Tq, Dv)`` of q's dtype."""
    q, d, k, v, mask, sinks, sizes = _attention_operands("scaled_dot_product_attention",
                                                         primitive, inputs)
    b, hq, tq, _ = q.shape
    out = empty(run, (b, hq, tq, v.shape[3]), q.dtype)
    if out.size == 0:
        return out
    run(Dispatch(LIBRARY, _variant("sdpa", mask, d), [
        q, out, k, v, np.zeros(1, q.dtype) if mask is None else mask,
        np.zeros(1, q.dtype) if sinks is None else sinks,
        sizes, np.array([primitive.scale], np.float32), *_strides(q, k, v, mask)],
        *_simdgroup_rows(tq, b * hq)))
    return out


def attention_vjp(primitive, inputs, run):
    """``ScaledDotProductAttentionVJP`` (inputs ``(q, k, v[, mask][, sinks], out,
    cotangent)``) on Metal: ``(dq, dk, dv[, dsinks])``, the first three of q's dtype, the
    sinks' ``(B, Hq)`` float32 (one per batch: the primitive's rule sums them).

    Three dispatches: the query rows' statistics and ``dq`` (``sdpa_vjp_rows``), ``dk``
    and ``dv`` by key rows from those statistics (``sdpa_vjp_keys``), the sinks'
    cotangents (``sdpa_vjp_sinks``)."""
    kernel = "scaled_dot_product_attention_vjp"
    q, d, k, v, mask, sinks, sizes = _attention_operands(kernel, primitive, inputs[:-2])
    o, g = (_checked(kernel, a)[0] for a in inputs[-2:])
    for a in (o, g):   # the primitive's rule casts them to q's dtype; else the CPU's
        if a.dtype != q.dtype:
            raise unsupported(kernel, ldt.from_numpy(a.dtype), (d,))
    b, hq, tq, _ = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    grads = [empty(run, a.shape, q.dtype) for a in (q, k, v)]
    if sinks is not None:
        grads.append(empty(run, (b, hq), np.float32))
    if min(b, hq, tq, tk) == 0:   # no score: every cotangent is 0 (the CPU's)
        for a in grads:
            a[...] = 0
        return tuple(grads)
    dq, dk, dv = grads[:3]
    stats = empty(run, (b * hq * tq * 3,), np.float32)   # (m, l, D) per query row
    scale = np.array([primitive.scale], np.float32)
    bound_mask = np.zeros(1, q.dtype) if mask is None else mask
    bound_sinks = np.zeros(1, q.dtype) if sinks is None else sinks
    qs, ks, vs, ms, os, gs = _strides(q, k, v, mask, o, g)
    run(Dispatch(LIBRARY, _variant("sdpa_vjp_rows", mask, d), [
        q, dq, k, v, bound_mask, bound_sinks, o, g, stats, sizes, scale,
        qs, ks, vs, ms, os, gs], *_simdgroup_rows(tq, b * hq), writes=(1, 8)))
    run(Dispatch(LIBRARY, _variant("sdpa_vjp_keys", mask, d), [
        k, dk, dv, q, v, bound_mask, g, stats, sizes, scale, qs, ks, vs, ms, gs],
        *_simdgroup_rows(tk, b * hkv), writes=(1, 2)))
    if sinks is not None:
        threads = threadgroup_for_rows(tq)
        run(Dispatch(LIBRARY, f"sdpa_vjp_sinks_{d.name}", [
            sinks, grads[3], stats, np.array([hq, tq, sizes[8]], np.int32)],
            (threads, b * hq, 1), (threads, 1, 1)))
    return tuple(grads)


# -- cross-entropy -------------------------------------------------------------------------------
def cross_entropy(primitive, inputs, run):
    """``CrossEntropy`` (inputs ``(logits, targets)``) on Metal: float32 losses of the
    targets' shape."""
    logits, d = _checked("cross_entropy", inputs[0])
    targets, i = _checked("cross_entropy", inputs[1], TARGET_DTYPES)
    out = empty(run, targets.shape, np.float32)
    if out.size == 0:
        return out
    # The targets as an array of the logits' shape, constant along the class axis.
    spread = np.broadcast_to(targets[..., None], logits.shape)
    rows, size, layout = row_layout(logits.shape, (logits.ndim - 1,), logits, spread)
    threads = threadgroup_for_rows(size)
    run(Dispatch(LIBRARY, f"cross_entropy_{d.name}_{i.name}", [
        logits, out, targets, np.array([size], np.uint32), *layout],
        (threads, rows, 1), (threads, 1, 1)))
    return out
