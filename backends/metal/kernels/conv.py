"""Metal kernel of the conv pack's ``Convolution``: an implicit GEMM.

One MSL library, one kernel template (``conv<T, U>``) instantiated per dtype from
:data:`DTYPES` (``conv_<dtype>``); no kernel text per dtype.

A convolution (``plugins/conv.py``; channels last: input ``(N, spatial..., C)``,
weight ``(O, K..., C / groups)``) is, for each group ``g``, the matrix product

    out[m, g * Og + o] = sum_k A[m, k] * B[k, o]

with ``m`` the output pixel ``(n, t...)`` (M of them), ``k`` the kernel tap and input
channel of the group ``(tap..., c)`` (``taps * Cg`` of them, the weight's own order) and

    A[m, k] = xp[n, t * stride + tap * kernel_dilation ..., g * Cg + c]
    B[k, o] = w[g * Og + o, tap (reversed when flip) ..., c]

The columns matrix ``A`` is never built ("implicit"): the kernel reads the input through
the index arithmetic. ``xp`` is the virtual input — ``x`` spread by ``input_dilation``,
padded by ``padding_lo``/``padding_hi`` (a negative padding crops) — so position
``q = t * stride + tap * kernel_dilation - padding_lo`` of a spatial axis reads
``x[q / input_dilation]`` when ``q`` is a non-negative multiple of the input dilation
inside the input, and zero otherwise (the hi padding needs no test: the output shape
keeps the windows inside ``xp``, and past ``x`` is zero either way).

The tiling is :mod:`.products`'s: one threadgroup of 16 x 16 threads per 32 x 32 tile
of the output (``threadgroup_position_in_grid``: x the output-channel tile inside the
group, y the output-pixel tile, z the group), K in steps of 16, each step's 32 x 16
block of ``A`` and 16 x 32 block of ``B`` staged in threadgroup memory (converted to
the float accumulator; zeros past M, Og or K, so any size works), each thread a 2 x 2
register block, rounded once to the output dtype. A thread stages the same two tile
rows of ``A`` (and the same weight column) at every step, so it decodes its output
pixels ``(n, t...)`` once, before the K loop; only the tap and channel of ``k`` are
decoded per element.

Every convolution is a 3-D one here: an absent spatial axis has size 1, kernel size
1, stride and dilations 1, padding 0 and stride 0 in memory, so one template covers
1-3 spatial axes. Input and weight are read through their strides (elements; a view
is not copied, a negative-stride one is, by :func:`.common.bindable`); the output is
C-contiguous.

The numerics of the CPU kernels (``backends/cpu/kernels/conv.py``): float16 and
bfloat16 accumulate in float and round once, float32 in float. float64 and complex64
have no Metal version (:class:`.common.UnsupportedDtype`, then the CPU's kernel).
The gradients of a convolution are convolutions (the pack's vjp), so they run here too.
"""

from __future__ import annotations

import math

import numpy as np

from lazyx import dtypes as ldt

from .common import (empty, PRELUDE, Dispatch, Library, bindable, host_array, instantiate,
                     msl_type, unsupported)
from .products import THREADS, TILE, TILES, _tiles

__all__ = ["DTYPES", "LIBRARY", "THREADS", "TILE", "convolution"]

#: Spatial axes every convolution is padded to (an absent one is a size-1 axis).
AXES = 3

# The tile constants (TM pixels x TN channels, K = taps x channels in steps of TK) and the
# register-block product are products.TILES's (TILE, THREADS: its sizes on the host).
_SOURCE = PRELUDE + TILES + r"""
// Staging: thread t copies A's rows t / TK + i * A_STEP (i < A_ROWS) at column t % TK,
// and B's rows t / TN + j * B_STEP (j < B_ROWS) at column t % TN.
static constant constexpr const int A_STEP = RT * RT / TK, A_ROWS = TM / A_STEP;
static constant constexpr const int B_STEP = RT * RT / TN, B_ROWS = TK / B_STEP;
// geom: Cg, Og, M, K, flip, then per spatial axis (3) at 8 + 8 * axis: the input's size,
// the output's size, the kernel's size, stride, padding_lo, kernel dilation, input dilation.
static constant constexpr const int AXES = 3, AXIS0 = 8, AXIS_LEN = 8;

// out[m, g * Og + o] = sum_k A[m, k] * B[k, o] for the group g = group.z (module docstring).
// x: (N, S0, S1, S2, C) and w: (O, K0, K1, K2, Cg) through strides (elements, 5 each);
// out: (M, O) contiguous.
template <typename T, typename U>
[[kernel]] void conv(
    device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
    device const T* w [[buffer(2)]], constant int* geom [[buffer(3)]],
    constant int64_t* x_strides [[buffer(4)]], constant int64_t* w_strides [[buffer(5)]],
    uint3 group [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]) {
  threadgroup U a_tile[TM][TK + 1];
  threadgroup U b_tile[TK][TN + 1];
  const int Cg = geom[0], Og = geom[1], M = geom[2], K = geom[3];
  const bool flip = geom[4] != 0;
  int in_size[AXES], out_size[AXES], k_size[AXES], stride[AXES], lo[AXES], kdil[AXES], idil[AXES];
  for (int d = 0; d < AXES; ++d) {
    constant int* a = geom + AXIS0 + AXIS_LEN * d;
    in_size[d] = a[0]; out_size[d] = a[1]; k_size[d] = a[2]; stride[d] = a[3];
    lo[d] = a[4]; kdil[d] = a[5]; idil[d] = a[6];
  }
  const int g = int(group.z);
  const int t = int(lid.y) * RT + int(lid.x);
  const int row0 = int(group.y) * TM, col0 = int(group.x) * TN;

  // This thread's A rows (output pixels): the input offset of (n, channel g * Cg) and the
  // first position of the window along each axis in xp's coordinates less padding_lo.
  const int a_col = t % TK;
  int64_t a_base[A_ROWS];
  int a_pos[A_ROWS][AXES];
  bool a_live[A_ROWS];
  for (int i = 0; i < A_ROWS; ++i) {
    int m = row0 + t / TK + i * A_STEP;
    a_live[i] = m < M;
    int rest = a_live[i] ? m : 0;
    for (int d = AXES - 1; d >= 0; --d) {
      a_pos[i][d] = (rest % out_size[d]) * stride[d] - lo[d];
      rest /= out_size[d];
    }
    a_base[i] = int64_t(rest) * x_strides[0] + int64_t(g) * int64_t(Cg) * x_strides[AXES + 1];
  }
  // This thread's B column (an output channel of the group).
  const int b_col = t % TN, o = col0 + b_col;
  const bool b_live = o < Og;
  device const T* W = w + (b_live ? int64_t(g * Og + o) * w_strides[0] : 0);

  U acc[BM][BN];
  for (int i = 0; i < BM; ++i)
    for (int j = 0; j < BN; ++j) acc[i][j] = U(0);

  for (int k0 = 0; k0 < K; k0 += TK) {
    // Stage the blocks; zeros outside the matrices and the input, so the loop below
    // needs no bounds.
    {
      int k = k0 + a_col, c = 0, tap[AXES];
      if (k < K) {
        c = k % Cg;
        int rest = k / Cg;
        for (int d = AXES - 1; d >= 0; --d) { tap[d] = rest % k_size[d]; rest /= k_size[d]; }
      }
      for (int i = 0; i < A_ROWS; ++i) {
        U v = U(0);
        if (a_live[i] && k < K) {
          int64_t off = a_base[i] + int64_t(c) * x_strides[AXES + 1];
          bool inside = true;
          for (int d = 0; d < AXES; ++d) {
            int q = a_pos[i][d] + tap[d] * kdil[d];
            if (q < 0 || q % idil[d] != 0 || q / idil[d] >= in_size[d]) { inside = false; break; }
            off += int64_t(q / idil[d]) * x_strides[d + 1];
          }
          if (inside) v = U(x[off]);
        }
        a_tile[t / TK + i * A_STEP][a_col] = v;
      }
    }
    for (int j = 0; j < B_ROWS; ++j) {
      int r = t / TN + j * B_STEP, k = k0 + r;
      U v = U(0);
      if (b_live && k < K) {
        int64_t off = int64_t(k % Cg) * w_strides[AXES + 1];
        int rest = k / Cg;
        for (int d = AXES - 1; d >= 0; --d) {
          int tap = rest % k_size[d];
          rest /= k_size[d];
          off += int64_t(flip ? k_size[d] - 1 - tap : tap) * w_strides[d + 1];
        }
        v = U(W[off]);
      }
      b_tile[r][b_col] = v;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    multiply_tiles(&a_tile[0][0], &b_tile[0][0], &acc[0][0], int(lid.y), int(lid.x));
    threadgroup_barrier(mem_flags::mem_threadgroup);   // the tiles are free again
  }

  const int O = Og * int(geom[5]);
  for (int i = 0; i < BM; ++i) {
    int m = row0 + int(lid.y) + i * RT;
    for (int j = 0; j < BN; ++j) {
      int n = col0 + int(lid.x) + j * RT;
      if (m >= M || n >= Og) continue;
      out[int64_t(m) * O + g * Og + n] = T(acc[i][j]);
    }
  }
}
"""

#: The dtypes the kernel has versions for (float64 has no Metal type; complex64 none here).
DTYPES = (ldt.float32, ldt.float16, ldt.bfloat16)

LIBRARY = Library("conv", _SOURCE + "\n" + "".join(
    instantiate(f"conv_{d.name}", "conv", msl_type(d), "float") for d in DTYPES))


def _strides(a: np.ndarray) -> list:
    """``a``'s strides in elements as a 3-D convolution operand: ``(batch or output
    channel, spatial x 3, channel)``, 0 along the absent spatial axes."""
    st = [s // a.itemsize for s in a.strides]
    return st[:-1] + [0] * (AXES + 2 - a.ndim) + st[-1:]


def convolution(primitive, inputs, run):
    """``Convolution`` (``plugins/conv.py``) on Metal: the output."""
    x, w = (bindable(a) for a in inputs)
    d = ldt.from_numpy(x.dtype)
    if d not in DTYPES:
        raise unsupported("conv", d, DTYPES)
    p = primitive
    shape = tuple(p.output_shapes(inputs)[0])
    if x.size == 0 or w.size == 0 or math.prod(shape) == 0:   # nothing to read or write
        return np.zeros(shape, x.dtype)
    w = w if w.dtype == x.dtype else host_array(w, x.dtype)
    out = empty(run, shape, x.dtype)
    nd = x.ndim - 2
    groups, c_out, cg = p.groups, w.shape[0], w.shape[-1]
    og = c_out // groups
    m = math.prod(shape[:-1])
    k = math.prod(w.shape[1:])
    geom = [cg, og, m, k, int(p.flip), groups, 0, 0]
    for i in range(AXES):
        if i < nd:
            geom += [x.shape[i + 1], shape[i + 1], w.shape[i + 1], p.strides[i],
                     p.padding_lo[i], p.kernel_dilation[i], p.input_dilation[i], 0]
        else:
            geom += [1, 1, 1, 1, 0, 1, 1, 0]
    run(Dispatch(LIBRARY, f"conv_{d.name}", [
        x, out, w, np.array(geom, np.int32), np.array(_strides(x), np.int64),
        np.array(_strides(w), np.int64)],
        _tiles(m, og, groups), (THREADS, THREADS, 1)))
    return out
