"""Metal kernels of the matmuls pack's ``BlockMaskedMM``, ``SegmentedMM`` and ``Hadamard``.

One MSL library: three kernel templates instantiated per dtype from :data:`DTYPES` (the
Hadamard transform per pair of input and output element types, :data:`_HADAMARD_PAIRS`),
no kernel text per dtype. The products reuse :mod:`.products`'s tile machinery
(:data:`.products.TILES`: 32 x 32 output tiles, 16 x 16 threads each owning a 2 x 2
register block, K in steps of 16 staged through threadgroup memory as float; the K loop
``tile_product``, or its step for the masked product).

**block_masked_mm** (``block_masked_mm_<dtype>``): one threadgroup per output tile of
one batch position (``threadgroup_position_in_grid``: x the tile column, y the tile row,
z the batch position), as ``Matmul``. The block size (32 or 64) is a multiple of the
tile and of the K step, so a tile lies in one block of the output mask and each K step
in one block column of ``mask_lhs`` and block row of ``mask_rhs``: every mask decision
is one value per threadgroup, the same for all its threads (so the barriers stay
matched). A boolean ``mask_out`` entry that is false skips the whole product and writes
zeros; a boolean ``mask_lhs`` or ``mask_rhs`` entry that is false skips that K step,
reading neither operand there (as MLX's GPU kernel): the masked tile's NaNs do not leak,
nor do those of the other operand's block, which the CPU kernel's zeroed copies turn into
``0 * NaN``. Floating mask entries scale: ``mask_lhs`` and ``mask_rhs`` multiply the
staged values of ``a`` and ``b`` in float, ``mask_out`` the float accumulator before the
one rounding, as the CPU kernel does (it multiplies the widened operands by the
upsampled masks). The masks are bound as bytes and read as
``bool`` or as the operands' dtype, told by a per-mask kind (:data:`MASK_KINDS`), so one
instantiation serves every combination. Every input is broadcast to one batch by the op
(stride-0 views): the batch walks through strides, collapsed as in :mod:`.products`.

**segmented_mm** (``segmented_mm_<dtype>``): one threadgroup per output tile of one
segment (z the flat segment index). Segment ``(s0, s1)`` is the product of ``a``'s
columns and ``b``'s rows ``s0 .. s1``: the tile loop over ``K = s1 - s0`` from
``a + s0 * a_col`` and ``b + s0 * b_row``; an empty (or reversed) segment writes zeros.
Bounds are checked on the host first with the CPU kernel's message.

**hadamard** (``hadamard_<in>_<out>``): the transform of rows of ``n = m * p`` points
(``p`` a power of two, ``m`` in 1, 12, 20, 28) as the CPU kernels compute it, in float
whatever the dtype: Sylvester butterflies over each of the row's ``m`` pieces of ``p``
points (pair distances 1, 2, ..., p / 2, in that order), then ``H_m`` mixing the pieces
(``out[a] = sum_b H[a, b] piece[b]``, added from 0 in ``b`` order), times ``scale``,
rounded once — the float operations of the native CPU kernel
(``backends/cpu/native/matmuls.cpp``) in its order, so the results are its bit for bit
(the NumPy reference's ``H_m`` product is a BLAS call: within rounding). A dispatch
transforms *logical rows* of ``m * q`` points (``q`` a power of two): row ``r`` at offset
``outer * (r / inner) + inner_step * (r % inner)``, its point ``(b, j)`` at ``b * piece +
j * point`` further (the ``steps`` buffer). The grid is ``(T, rows)``, its
threadgroups ``(T, G)``: ``T`` threads per logical row, ``G`` rows side by side
(:func:`_hadamard_threads`), each row in threadgroup memory (float, at most
:data:`MAX_POINTS` per threadgroup). Its threads

1. load the group's points (consecutive threads read consecutive addresses: along a
   row, or across rows where neighbouring rows are neighbouring in memory);
2. run the butterflies in register groups of up to four stages (16 points a thread,
   ``butterfly_group<R>``), a barrier after each group;
3. mix the pieces by ``H_m``: a thread per column ``j`` reads its ``m`` values, writes
   the ``m`` sums back to the same places (no other thread touches them);
4. store each point times ``scale``, converted to the output type.

A row of up to :data:`MAX_POINTS` points is one pass. A longer one is two (the split
``p = p1 * p2``, Sylvester's ``H_p = H_p1 x H_p2``): pass 1 transforms the contiguous
chunks of ``p2`` points into a float32 scratch array (the CPU's first stages), pass 2
the ``m * p1`` points ``(b, j1)`` at ``b * p + j1 * p2 + j2`` of each ``(row, j2)``,
mixing and scaling (its last stages). Rows beyond ``8192 * 8192 / m`` have no plan:
:class:`~.common.UnsupportedDtype`, and the backend runs the CPU's kernel. An input that
is not C-contiguous is copied on the host first (as the CPU's native kernel does).

The primitives take floating operands (the ops promote); float64 has no Metal type and
complex none here: :class:`~.common.UnsupportedDtype`, then the CPU's kernel. On a Mac
the products' inner loop is the place for simdgroup matrices (see :mod:`.products`).
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from lazyx import dtypes as ldt
from lazyx.backends.cpu.kernels import matmuls as cpu_matmuls
from lazyx.plugins import matmuls as mm

from .common import (
    PRELUDE,
    Dispatch,
    Library,
    UnsupportedDtype,
    _collapse,
    bindable,
    empty,
    host_array,
    instantiate,
    msl_type,
    unsupported,
)
from .products import THREADS, TILE, TILES, _strides, _tiles

__all__ = ["DTYPES", "LIBRARY", "MASK_KINDS", "MAX_POINTS", "block_masked_mm", "hadamard",
           "segmented_mm"]

#: Points of one threadgroup's Hadamard rows (float32: 32 KiB, a threadgroup's memory).
MAX_POINTS = 8192

#: How a block mask is read: absent, boolean (keep or skip), floating (scale).
MASK_KINDS = {None: 0, "bool": 1, "float": 2}

_SOURCE = PRELUDE + TILES + r"""
static constant constexpr const int NO_MASK = """ + str(MASK_KINDS[None]) + r""";
static constant constexpr const int BOOL_MASK = """ + str(MASK_KINDS["bool"]) + r""";
static constant constexpr const int MAX_POINTS = """ + str(MAX_POINTS) + r""";

// Mask entry `offset` (elements) as U: a boolean mask's 0 or 1, a floating one's value.
template <typename T, typename U>
inline U mask_value(device const uchar* mask, int kind, int64_t offset) {
  return kind == BOOL_MASK ? U(mask[offset] != 0 ? 1 : 0)
                           : U(((device const T*)mask)[offset]);
}

// Write the thread's register block of the tile at (row0, col0) of the M x N output O
// (C-contiguous), times s, rounded once to T.
template <typename T, typename U>
inline void store_tile(device T* O, thread const U* acc, U s, int M, int N, int row0, int col0,
                       int ty, int tx) {
  for (int i = 0; i < BM; ++i) {
    int m = row0 + ty + i * RT;
    for (int j = 0; j < BN; ++j) {
      int n = col0 + tx + j * RT;
      if (m < M && n < N) O[int64_t(m) * N + n] = T(acc[i * BN + j] * s);
    }
  }
}

// out[z] = (a[z] * up(lhs[z])) @ (b[z] * up(rhs[z])) * up(mask_out[z]), z = group.z.
// sizes: M, N, K, block, then the kinds of mask_out, mask_lhs, mask_rhs (NO_MASK: absent);
// strides: the (row, column) strides of a, b, mask_out, mask_lhs, mask_rhs; batch_strides:
// batch_ndim strides of each of them, in that order.
template <typename T, typename U>
[[kernel]] void block_masked_mm(
    device const T* a [[buffer(0)]], device T* out [[buffer(1)]],
    device const T* b [[buffer(2)]], device const uchar* mask_out [[buffer(3)]],
    device const uchar* mask_lhs [[buffer(4)]], device const uchar* mask_rhs [[buffer(5)]],
    constant int* sizes [[buffer(6)]], constant int64_t* strides [[buffer(7)]],
    constant int* batch_shape [[buffer(8)]], constant int64_t* batch_strides [[buffer(9)]],
    constant int& batch_ndim [[buffer(10)]],
    uint3 group [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]) {
  threadgroup U a_tile[TM][TK + 1];
  threadgroup U b_tile[TK][TN + 1];
  const int M = sizes[0], N = sizes[1], K = sizes[2], block = sizes[3];
  const int out_kind = sizes[4], lhs_kind = sizes[5], rhs_kind = sizes[6];
  const int t = int(lid.y) * RT + int(lid.x);
  const int row0 = int(group.y) * TM, col0 = int(group.x) * TN;
  int64_t at[5];   // the batch position's offset into a, b and each mask
  for (int i = 0; i < 5; ++i)
    at[i] = elem_to_loc(group.z, batch_shape, batch_strides + i * batch_ndim, batch_ndim);
  // The tile lies in one block of the output: its block row and column.
  const int64_t br = row0 / block, bc = col0 / block;
  const U s_out = out_kind == NO_MASK ? U(1)
      : mask_value<T, U>(mask_out, out_kind, at[2] + br * strides[4] + bc * strides[5]);
  U acc[BM][BN];
  for (int i = 0; i < BM; ++i)
    for (int j = 0; j < BN; ++j) acc[i][j] = U(0);
  // A false boolean mask_out entry: nothing to compute, zeros out.
  const bool skip_all = out_kind == BOOL_MASK && s_out == U(0);
  for (int k0 = 0; k0 < K && !skip_all; k0 += TK) {
    const int64_t bk = k0 / block;   // the K step lies in one block column of mask_lhs
    const U sa = lhs_kind == NO_MASK ? U(1)
        : mask_value<T, U>(mask_lhs, lhs_kind, at[3] + br * strides[6] + bk * strides[7]);
    const U sb = rhs_kind == NO_MASK ? U(1)
        : mask_value<T, U>(mask_rhs, rhs_kind, at[4] + bk * strides[8] + bc * strides[9]);
    // A false boolean operand block adds nothing: skip the step (every thread alike).
    if ((lhs_kind == BOOL_MASK && sa == U(0)) || (rhs_kind == BOOL_MASK && sb == U(0)))
      continue;
    stage_tiles(&a_tile[0][0], &b_tile[0][0], a + at[0], b + at[1], strides[0], strides[1],
                strides[2], strides[3], M, N, K, row0, col0, k0, t, sa, sb);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    multiply_tiles(&a_tile[0][0], &b_tile[0][0], &acc[0][0], int(lid.y), int(lid.x));
    threadgroup_barrier(mem_flags::mem_threadgroup);   // the tiles are free again
  }
  store_tile(out + int64_t(group.z) * int64_t(M) * int64_t(N), &acc[0][0],
             skip_all ? U(1) : s_out, M, N, row0, col0, int(lid.y), int(lid.x));
}

// out[z] = a[:, s0:s1] @ b[s0:s1] for segment z = group.z, (s0, s1) = segments[z].
// sizes: M, N; strides: a's (row, column), then b's.
template <typename T, typename U>
[[kernel]] void segmented_mm(
    device const T* a [[buffer(0)]], device T* out [[buffer(1)]],
    device const T* b [[buffer(2)]], device const int* segments [[buffer(3)]],
    constant int* sizes [[buffer(4)]], constant int64_t* strides [[buffer(5)]],
    uint3 group [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]) {
  threadgroup U a_tile[TM][TK + 1];
  threadgroup U b_tile[TK][TN + 1];
  const int M = sizes[0], N = sizes[1];
  const int s0 = segments[2 * group.z], s1 = segments[2 * group.z + 1];
  const int K = max(s1 - s0, 0);   // an empty or reversed segment: zeros
  const int row0 = int(group.y) * TM, col0 = int(group.x) * TN;
  U acc[BM][BN];
  tile_product(&a_tile[0][0], &b_tile[0][0], &acc[0][0], a + int64_t(s0) * strides[1],
               b + int64_t(s0) * strides[2], strides[0], strides[1], strides[2], strides[3],
               M, N, K, row0, col0, int(lid.y), int(lid.x));
  store_tile(out + int64_t(group.z) * int64_t(M) * int64_t(N), &acc[0][0], U(1), M, N, row0,
             col0, int(lid.y), int(lid.x));
}

// R consecutive butterfly stages (pair distances h, 2h, ..., h R / 2) over each of the
// m pieces of q points of `row`: unit u of a piece holds the R points base + i h (base =
// (u / h) h R + u % h) in registers; thread tx of nt takes units tx, tx + nt, ...
template <int R>
inline void butterfly_group(threadgroup float* row, int m, int q, int h, int tx, int nt) {
  const int units = q / R;
  for (int e = tx; e < m * units; e += nt) {
    const int u = e % units, base = (e / units) * q + (u / h) * h * R + u % h;
    float v[R];
    for (int i = 0; i < R; ++i) v[i] = row[base + i * h];
    for (int d = 1; d < R; d *= 2)
      for (int i = 0; i < R; ++i)
        if ((i & d) == 0) {
          const float lo = v[i], hi = v[i + d];
          v[i] = lo + hi;
          v[i + d] = lo - hi;
        }
    for (int i = 0; i < R; ++i) row[base + i * h] = v[i];
  }
}

// The transform of logical rows (see the module docstring). dims: m, q, logical rows,
// inner (logical rows per outer step); steps: outer, inner, piece, point (elements);
// signs[a]: bit b set where H_m[a, b] = -1.
template <typename I, typename O>
[[kernel]] void hadamard(
    device const I* in [[buffer(0)]], device O* out [[buffer(1)]],
    constant int* dims [[buffer(2)]], constant int64_t* steps [[buffer(3)]],
    constant uint* signs [[buffer(4)]], constant float& scale [[buffer(5)]],
    uint2 pos [[thread_position_in_grid]], uint2 lid [[thread_position_in_threadgroup]],
    uint2 size [[threads_per_threadgroup]]) {
  threadgroup float buf[MAX_POINTS];
  const int m = dims[0], q = dims[1], inner = dims[3], L = m * q;
  const int nt = int(size.x), count = int(size.y);   // threads per row, rows here
  const int first = int(pos.y) - int(lid.y);          // the group's first logical row
  const int tid = int(lid.y) * nt + int(lid.x);
  // Neighbouring rows neighbouring in memory: consecutive threads take consecutive rows.
  const bool across = steps[1] == 1 && count > 1;

  for (int f = tid; f < count * L; f += nt * count) {
    const int g = across ? f % count : f / L, i = across ? f / count : f % L;
    const int r = first + g;
    const int64_t at = steps[0] * (r / inner) + steps[1] * (r % inner) +
                       steps[2] * (i / q) + steps[3] * (i % q);
    buf[g * L + i] = float(in[at]);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  // (No local `threadgroup T*` declarations: the shim would make them shared statics.)
  const int row = int(lid.y) * L;   // this thread's logical row in buf
  int h = 1;
  for (; h * 16 <= q; h *= 16) {
    butterfly_group<16>(buf + row, m, q, h, int(lid.x), nt);
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (h < q) {   // the last one to three stages
    if (h * 2 == q) butterfly_group<2>(buf + row, m, q, h, int(lid.x), nt);
    else if (h * 4 == q) butterfly_group<4>(buf + row, m, q, h, int(lid.x), nt);
    else butterfly_group<8>(buf + row, m, q, h, int(lid.x), nt);
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }

  if (m > 1) {   // H_m across the pieces: column j is this thread's alone
    for (int j = int(lid.x); j < q; j += nt) {
      float col[28];
      for (int b = 0; b < m; ++b) col[b] = buf[row + b * q + j];
      for (int a = 0; a < m; ++a) {
        float acc = 0.0f;
        for (int b = 0; b < m; ++b) acc = (signs[a] >> b) & 1u ? acc - col[b] : acc + col[b];
        buf[row + a * q + j] = acc;
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }

  for (int f = tid; f < count * L; f += nt * count) {
    const int g = across ? f % count : f / L, i = across ? f / count : f % L;
    const int r = first + g;
    const int64_t at = steps[0] * (r / inner) + steps[1] * (r % inner) +
                       steps[2] * (i / q) + steps[3] * (i % q);
    out[at] = O(buf[g * L + i] * scale);
  }
}
"""

#: The dtypes the kernels have versions for (float64 has no Metal type; complex64 none here).
DTYPES = (ldt.float32, ldt.float16, ldt.bfloat16)

#: The Hadamard transform's (input, output) element types: a dtype to itself (one pass),
#: and to and from the float32 scratch of two passes.
_HADAMARD_PAIRS = tuple(dict.fromkeys(
    pair for d in DTYPES for pair in ((d, d), (d, ldt.float32), (ldt.float32, d))))

LIBRARY = Library("matmuls", _SOURCE + "\n" + "".join(
    [instantiate(f"{kind}_{d.name}", kind, msl_type(d), "float")
     for kind in ("block_masked_mm", "segmented_mm") for d in DTYPES]
    + [instantiate(f"hadamard_{i.name}_{o.name}", "hadamard", msl_type(i), msl_type(o))
       for i, o in _HADAMARD_PAIRS]))

#: A stand-in for an absent or empty buffer (Metal has no zero-length buffers).
_NOTHING = np.zeros(8, np.uint8)


def _dtype_of(kernel: str, x) -> ldt.Dtype:
    d = ldt.from_numpy(x.dtype)
    if d not in DTYPES:
        raise unsupported(kernel, d, DTYPES)
    return d


def block_masked_mm(primitive, inputs, run):
    """``BlockMaskedMM`` (inputs ``(a, b)`` then the masks present, out, lhs, rhs; all
    broadcast to one batch by the op) on Metal: the output."""
    a, b = bindable(inputs[0]), bindable(inputs[1])
    d = _dtype_of("block_masked_mm", a)
    if b.dtype != a.dtype:
        raise unsupported("block_masked_mm", ldt.from_numpy(b.dtype), DTYPES)
    bs = int(primitive.block_size)
    if bs % TILE:   # the op allows 32 and 64; a tile must lie in one mask block
        raise UnsupportedDtype(f"Metal kernel block_masked_mm takes block sizes that are "
                               f"multiples of {TILE}, got {bs}; the CPU's kernel runs it.")
    masks = []
    for m in primitive._masks(inputs):
        if m is not None and m.dtype != np.bool_ and m.dtype != a.dtype:
            raise unsupported("block_masked_mm", ldt.from_numpy(m.dtype), DTYPES)
        masks.append(None if m is None else bindable(m))
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = a.shape[:-2]
    out = empty(run, batch + (M, N), a.dtype)
    if out.size == 0:
        return out
    nb = len(batch)
    operands = [a, b] + masks
    strides = [[0, 0] if x is None or x.size == 0 else _strides(x, nb + 2) for x in operands]
    dims, batch_strides = _collapse(batch, *[s[:-2] or [0] * nb for s in strides])
    kinds = [MASK_KINDS[None if m is None else "bool" if m.dtype == np.bool_ else "float"]
             for m in masks]
    # Nothing to read where K = 0 or a mask is absent: a stand-in (never read).
    buffers = [_NOTHING if x is None or x.size == 0 else x for x in operands]
    run(Dispatch(LIBRARY, f"block_masked_mm_{d.name}", [
        buffers[0], out, buffers[1], *buffers[2:],
        np.array([M, N, K, bs, *kinds], np.int32),
        np.array([s for st in strides for s in st[-2:]], np.int64),
        np.array(dims or [1], np.int32),
        np.array([s for st in batch_strides for s in st] or [0], np.int64),
        np.array([len(dims)], np.int32)],
        _tiles(M, N, math.prod(batch)), (THREADS, THREADS, 1)))
    return out


def segmented_mm(primitive, inputs, run):
    """``SegmentedMM`` (inputs ``(a (M, K), b (K, N), segments (*S, 2))``) on Metal: the
    output ``(*S, M, N)``. The segments are read on the host first, for their bounds
    check (the CPU kernel's message)."""
    a, b = bindable(inputs[0]), bindable(inputs[1])
    d = _dtype_of("segmented_mm", a)
    if b.dtype != a.dtype:
        raise unsupported("segmented_mm", ldt.from_numpy(b.dtype), DTYPES)
    segments = host_array(inputs[2], np.int32)
    (M, K), N = a.shape, b.shape[1]
    cpu_matmuls.segment_bounds(segments, K)
    out = empty(run, segments.shape[:-1] + (M, N), a.dtype)
    if out.size == 0:
        return out
    st = (_strides(a, 2) + _strides(b, 2)) if K else [0, 0, 0, 0]
    if K == 0:   # every segment is (0, 0): nothing is read
        a = b = _NOTHING
    run(Dispatch(LIBRARY, f"segmented_mm_{d.name}", [
        a, out, b, segments.reshape(-1), np.array([M, N], np.int32), np.array(st, np.int64)],
        _tiles(M, N, segments.size // 2), (THREADS, THREADS, 1)))
    return out


# -- Hadamard ---------------------------------------------------------------------------------
@cache
def _signs(m: int, transposed: bool) -> np.ndarray:
    """``H_m`` (or its transpose) as sign words: bit ``b`` of word ``a`` is set where
    ``H[a, b] = -1``. The matrices are the CPU kernels' (MLX's)."""
    h = cpu_matmuls.hadamard_matrix(m, 1, transposed)
    return np.array([sum(1 << b for b in range(m) if h[a, b] < 0) for a in range(m)], np.uint32)


def _hadamard_threads(points: int, rows: int) -> tuple:
    """``(T, G)``: threads per logical row of ``points`` points (a power of two up to 256,
    about one per 16 points: a butterfly group's registers), and rows per threadgroup (up
    to 256 threads and :data:`MAX_POINTS` points in all)."""
    t = 1 << min(8, max(0, (points // 16).bit_length() - 1))
    return t, max(1, min(rows, 256 // t, MAX_POINTS // points))


def _hadamard_pass(run, function, source, target, m, q, rows, inner, steps, signs, scale):
    t, g = _hadamard_threads(m * q, rows)
    run(Dispatch(LIBRARY, function, [
        source, target, np.array([m, q, rows, inner], np.int32), np.array(steps, np.int64),
        signs, np.array([scale], np.float32)], (t, rows), (t, g)))


def hadamard(primitive, inputs, run):
    """``Hadamard`` (``scale * kron(H_m, H_p) @ x`` along the last axis, transposed for the
    vjp) on Metal: the output, the native CPU kernel's numbers bit for bit."""
    x = inputs[0]
    d = _dtype_of("hadamard", x)
    n = x.shape[-1] if x.ndim else 1
    m, p = mm.hadamard_factors(n)
    out = empty(run, x.shape, x.dtype)
    if out.size == 0:
        return out
    one_pass = m * p <= MAX_POINTS
    if not one_pass:   # two: the contiguous chunks of p2 points first, then the rest
        p2 = min(p, MAX_POINTS)
        if m * (p // p2) > MAX_POINTS:
            raise UnsupportedDtype(f"Metal kernel hadamard transforms rows of up to "
                                   f"{MAX_POINTS ** 2 // m} points for m = {m}, got {n}; the "
                                   f"CPU's kernel runs it.")
    x = x if x.flags.c_contiguous else host_array(x)
    rows = x.size // n
    signs = _signs(m, bool(primitive.transposed))
    scale = float(primitive.scale)
    name = d.name
    if one_pass:
        _hadamard_pass(run, f"hadamard_{name}_{name}", x, out, m, p, rows, 1, [n, 0, p, 1],
                       signs, scale)
        return out
    p1 = p // p2
    scratch = empty(run, x.shape, np.float32)
    # Pass 1: the chunks of p2 points (pair distances below p2), unscaled, into float32.
    _hadamard_pass(run, f"hadamard_{name}_float32", x, scratch, 1, p2, rows * m * p1, 1,
                   [p2, 0, 0, 1], _signs(1, False), 1.0)
    # Pass 2: for each (row, j2), the points (b, j1) at b p + j1 p2 + j2; H_m; the scale.
    _hadamard_pass(run, f"hadamard_float32_{name}", scratch, out, m, p1, rows * p2, p2,
                   [n, 1, p, p2], signs, scale)
    return out
