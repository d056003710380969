"""Metal kernels of the products pack's matrix products: ``Matmul`` and ``AddMM``.

One MSL library, one kernel template (``matmul<T, U, add_c>``) instantiated per dtype
from :data:`DTYPES` and per kind (``matmul_<dtype>``: ``a @ b``; ``addmm_<dtype>``:
``alpha * (a @ b) + beta * c``); no kernel text per dtype.

The kernel tiles the output: one threadgroup of 16 x 16 threads per 32 x 32 tile of
one matrix of the batch (``threadgroup_position_in_grid``: x the tile column, y the
tile row, z the batch position). It walks K in steps of 16: the threads copy a 32 x 16
block of ``a`` and a 16 x 32 block of ``b`` into threadgroup memory (converted to the
float accumulator; zeros past M, N or K, so any size works), wait at a barrier, and
each thread adds the block's products into its 2 x 2 register block (rows
``ty, ty + 16``, columns ``tx, tx + 16``: neighbouring threads read neighbouring
columns of ``b``'s block). The epilogue scales by ``alpha``, adds ``beta * c``
(``addmm`` only) and rounds once to the output dtype. The K loop (``tile_product``) and
its step (``stage_tiles``, ``multiply_tiles``) are :data:`TILES`, MSL that :mod:`.matmuls`
shares (and :mod:`.conv`, its ``multiply_tiles``).

Layouts are strides, never copies: each operand is read through ``(rows, columns)``
strides in elements (a transposed view is its strides swapped), a 1-D ``a`` is a
1 x K row, a 1-D ``b`` a K x 1 column, and the batch dimensions of ``a``, ``b`` and
``c`` broadcast through stride-0 batch strides (:func:`.common.row_layout`'s
collapse: size-1 dimensions dropped, neighbouring ones merged). ``c`` broadcasts to
the output the same way. The output is C-contiguous.

The numerics of the CPU kernels (``backends/cpu/kernels/products.py``): float16 and
bfloat16 accumulate in float and round once; ``alpha`` scales the float product, then
``beta * c`` is added in float; ``beta == 0`` ignores ``c`` (its NaNs do not leak, as
BLAS's gemm), so it runs the ``matmul`` kernel; ``K == 0`` gives zeros (or
``beta * c``). The primitives take only inexact dtypes; complex64 and float64 have no
Metal version (:class:`.common.UnsupportedDtype`, then the CPU's kernel).
"""

from __future__ import annotations

import math

import numpy as np

from lazyx import dtypes as ldt

from .common import (empty, PRELUDE, Dispatch, Library, UnsupportedDtype, _collapse, bindable,
                     host_array, instantiate, msl_type, unsupported)

__all__ = ["DTYPES", "LIBRARY", "THREADS", "TILE", "TILES", "addmm", "gather_mm", "matmul"]

#: Output tile (rows = columns) of one threadgroup, and its threads per side.
TILE, THREADS = 32, 16

#: The tile machinery, shared with kernels/matmuls.py (block-masked and segmented products)
#: and kernels/conv.py (its own staging, this register-block product):
#: the tile constants, one K step's staging and its register-block product, the K loop.
TILES = r"""
// Output tile TM x TN per threadgroup of RT x RT threads (each a (TM/RT) x (TN/RT) block),
// K in steps of TK. Tiles are padded by one column against bank conflicts.
static constant constexpr const int TM = 32, TN = 32, TK = 16, RT = 16;
static constant constexpr const int BM = TM / RT, BN = TN / RT;

// Stage K step k0 of the tile at (row0, col0): a TM x TK block of A (rows M, columns K,
// strides a_row, a_col) times sa and a TK x TN block of B (K x N) times sb, as U into
// a_tile[TM][TK + 1] and b_tile[TK][TN + 1]; zeros outside the matrices, so the product
// below needs no bounds. t: the thread's index in the threadgroup.
template <typename T, typename U>
inline void stage_tiles(threadgroup U* a_tile, threadgroup U* b_tile, device const T* A,
                        device const T* B, int64_t a_row, int64_t a_col, int64_t b_row,
                        int64_t b_col, int M, int N, int K, int row0, int col0, int k0, int t,
                        U sa, U sb) {
  for (int e = t; e < TM * TK; e += RT * RT) {
    int r = e / TK, k = k0 + e % TK, m = row0 + r;
    a_tile[r * (TK + 1) + e % TK] =
        (m < M && k < K) ? U(A[int64_t(m) * a_row + int64_t(k) * a_col]) * sa : U(0);
  }
  for (int e = t; e < TK * TN; e += RT * RT) {
    int r = e / TN, k = k0 + r, n = col0 + e % TN;
    b_tile[r * (TN + 1) + e % TN] =
        (k < K && n < N) ? U(B[int64_t(k) * b_row + int64_t(n) * b_col]) * sb : U(0);
  }
}

// Add the staged blocks' products into the thread's register block acc[BM][BN] (rows
// ty, ty + RT, columns tx, tx + RT: neighbouring threads read neighbouring columns).
template <typename U>
inline void multiply_tiles(threadgroup const U* a_tile, threadgroup const U* b_tile,
                           thread U* acc, int ty, int tx) {
  // On a Mac this is where simdgroup matrices go: each of the 8 simdgroups owns an
  // 8 x 16 strip of the tile as two simdgroup_float8x8 accumulators, simdgroup_load()s
  // 8 x 8 pieces of a_tile and b_tile per 8 of TK and calls
  // simdgroup_multiply_accumulate; the epilogue simdgroup_store()s the strip to
  // threadgroup memory and writes it out as below. The shim cannot emulate them, so the
  // version checked here is this scalar register block.
  for (int k = 0; k < TK; ++k) {
    U x[BM], y[BN];
    for (int i = 0; i < BM; ++i) x[i] = a_tile[(ty + i * RT) * (TK + 1) + k];
    for (int j = 0; j < BN; ++j) y[j] = b_tile[k * (TN + 1) + tx + j * RT];
    for (int i = 0; i < BM; ++i)
      for (int j = 0; j < BN; ++j) acc[i * BN + j] += x[i] * y[j];
  }
}

// acc[BM][BN] = the thread's block of the tile's product over all of K, a K step at a time
// (ty, tx: the thread's position in the RT x RT threadgroup).
template <typename T, typename U>
inline void tile_product(threadgroup U* a_tile, threadgroup U* b_tile, thread U* acc,
                         device const T* A, device const T* B, int64_t a_row, int64_t a_col,
                         int64_t b_row, int64_t b_col, int M, int N, int K, int row0, int col0,
                         int ty, int tx) {
  for (int i = 0; i < BM * BN; ++i) acc[i] = U(0);
  for (int k0 = 0; k0 < K; k0 += TK) {
    stage_tiles(a_tile, b_tile, A, B, a_row, a_col, b_row, b_col, M, N, K, row0, col0, k0,
                ty * RT + tx, U(1), U(1));
    threadgroup_barrier(mem_flags::mem_threadgroup);
    multiply_tiles(a_tile, b_tile, acc, ty, tx);
    threadgroup_barrier(mem_flags::mem_threadgroup);   // the tiles are free again
  }
}
"""

_SOURCE = PRELUDE + TILES + r"""

// out[z] = alpha * (a[z] @ b[z]) (+ beta * c[z]) for the batch position z = group.z.
// a: rows M, columns K; b: rows K, columns N; c: M x N; all through strides (elements).
template <typename T, typename U, bool add_c, bool gathered>
[[kernel]] void matmul(
    device const T* a [[buffer(0)]], device T* out [[buffer(1)]],
    device const T* b [[buffer(2)]], device const T* c [[buffer(3)]],
    constant int* mnk [[buffer(4)]],
    constant int64_t* a_strides [[buffer(5)]], constant int64_t* b_strides [[buffer(6)]],
    constant int64_t* c_strides [[buffer(7)]],
    constant int* batch_shape [[buffer(8)]], constant int64_t* a_batch [[buffer(9)]],
    constant int64_t* b_batch [[buffer(10)]], constant int64_t* c_batch [[buffer(11)]],
    constant int& batch_ndim [[buffer(12)]], constant float* scale [[buffer(13)]],
    device const int* lhs [[buffer(14)]], device const int* rhs [[buffer(15)]],
    uint3 group [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]) {
  threadgroup U a_tile[TM][TK + 1];
  threadgroup U b_tile[TK][TN + 1];
  const int M = mnk[0], N = mnk[1], K = mnk[2];
  const int row0 = int(group.y) * TM, col0 = int(group.x) * TN;
  // gathered (GatherMM): the batch position's matrices are a[lhs[z]] and b[rhs[z]] of the
  // operands' stacks (batch stride a_batch[0], b_batch[0]); else the broadcast batch.
  device const T* A = a + (gathered ? int64_t(lhs[group.z]) * a_batch[0]
                                    : elem_to_loc(group.z, batch_shape, a_batch, batch_ndim));
  device const T* B = b + (gathered ? int64_t(rhs[group.z]) * b_batch[0]
                                    : elem_to_loc(group.z, batch_shape, b_batch, batch_ndim));
  U acc[BM][BN];
  tile_product(&a_tile[0][0], &b_tile[0][0], &acc[0][0], A, B, a_strides[0], a_strides[1],
               b_strides[0], b_strides[1], M, N, K, row0, col0, int(lid.y), int(lid.x));

  const U alpha = U(scale[0]), beta = U(scale[1]);
  device T* O = out + int64_t(group.z) * int64_t(M) * int64_t(N);
  device const T* C = c + (add_c ? elem_to_loc(group.z, batch_shape, c_batch, batch_ndim) : 0);
  for (int i = 0; i < BM; ++i) {
    int m = row0 + int(lid.y) + i * RT;
    for (int j = 0; j < BN; ++j) {
      int n = col0 + int(lid.x) + j * RT;
      if (m >= M || n >= N) continue;
      U v = acc[i][j] * alpha;
      if (add_c) v += beta * U(C[int64_t(m) * c_strides[0] + int64_t(n) * c_strides[1]]);
      O[int64_t(m) * N + n] = T(v);
    }
  }
}
"""

#: The dtypes the kernels have versions for (float64 has no Metal type; complex64 none here).
DTYPES = (ldt.float32, ldt.float16, ldt.bfloat16)

LIBRARY = Library("products", _SOURCE + "\n" + "".join(
    instantiate(f"{kind}_{d.name}", "matmul", msl_type(d), "float", add_c, gathered)
    for kind, add_c, gathered in (("matmul", "false", "false"), ("addmm", "true", "false"),
                                  ("gather_mm", "false", "true"))
    for d in DTYPES))

#: Index stand-ins for the products that gather nothing (buffers 14 and 15 are bound).
_NO_INDEX = np.zeros(1, np.int32)


def _strides(x: np.ndarray, ndim: int) -> list:
    """``x``'s strides in elements, right-aligned to ``ndim`` dimensions: 0 along a missing
    or size-1 dimension (where it broadcasts)."""
    st = [0 if n == 1 else s // x.itemsize for n, s in zip(x.shape, x.strides, strict=True)]
    return [0] * (ndim - x.ndim) + st


def _operand(x: np.ndarray, batch_ndim: int, vector_at: int) -> tuple:
    """``(batch strides, matrix strides)`` of operand ``x`` as a stack of matrices; a 1-D
    ``x`` gets a stride-0 matrix dimension at ``vector_at`` (0: a row, 1: a column)."""
    if x.ndim == 1:
        st = _strides(x, 1)
        st.insert(vector_at, 0)
        return [0] * batch_ndim, st
    st = _strides(x, batch_ndim + 2)
    return st[:-2], st[-2:]


def _tiles(M: int, N: int, count: int) -> tuple:
    """The products' grid: a threadgroup of THREADS x THREADS per TILE x TILE output tile
    of each of ``count`` M x N outputs."""
    return (math.ceil(N / TILE) * THREADS, math.ceil(M / TILE) * THREADS, count)


def _product(op: str, shape: tuple, a, b, c, alpha: float, beta: float, run):
    """``alpha * (a @ b) (+ beta * c)`` of output ``shape`` through kernel ``addmm_<dtype>``,
    or ``matmul_<dtype>`` when ``c`` is None."""
    a, b = bindable(a), bindable(b)
    d = ldt.from_numpy(a.dtype)
    if d not in DTYPES:
        raise unsupported(op, d, DTYPES)
    out = empty(run, shape, a.dtype)
    if out.size == 0:
        return out
    M = a.shape[-2] if a.ndim > 1 else 1
    N = b.shape[-1] if b.ndim > 1 else 1
    K = a.shape[-1]
    batch = shape[:len(shape) - (a.ndim > 1) - (b.ndim > 1)]
    nb = len(batch)
    kernel = "matmul" if c is None else "addmm"
    a_batch, a_mat = _operand(a, nb, 0)
    b_batch, b_mat = _operand(b, nb, 1)
    if c is None:
        # Nothing to read: one element stands in (Metal has no zero-length buffers).
        c, c_batch, c_mat = np.zeros(1, a.dtype), [0] * nb, [0, 0]
    else:
        c = bindable(c)
        st = _strides(c, len(shape))
        if b.ndim == 1:
            st.append(0)
        if a.ndim == 1:
            st.insert(len(st) - 1, 0)
        c_batch, c_mat = st[:-2], st[-2:]
    if K == 0:   # nothing to read from a and b: a stand-in each, as for c
        a = b = np.zeros(1, a.dtype)
    dims, (a_batch, b_batch, c_batch) = _collapse(batch, a_batch, b_batch, c_batch)
    run(Dispatch(LIBRARY, f"{kernel}_{d.name}", [
        a, out, b, c, np.array([M, N, K], np.int32),
        np.array(a_mat, np.int64), np.array(b_mat, np.int64), np.array(c_mat, np.int64),
        np.array(dims or [1], np.int32), np.array(a_batch or [0], np.int64),
        np.array(b_batch or [0], np.int64), np.array(c_batch or [0], np.int64),
        np.array([len(dims)], np.int32), np.array([alpha, beta], np.float32),
        _NO_INDEX, _NO_INDEX],
        _tiles(M, N, math.prod(batch)), (THREADS, THREADS, 1)))
    return out


def _stack(x: np.ndarray) -> np.ndarray:
    """``x`` as a stack of matrices ``(-1, rows, columns)``: a view, or a host copy where
    its strides cannot say that."""
    try:
        return x.reshape((-1,) + x.shape[-2:], copy=False)
    except ValueError:
        return host_array(x).reshape((-1,) + x.shape[-2:])


def gather_mm(primitive, inputs, run):
    """``GatherMM`` (inputs ``(a, b, lhs, rhs)``: ``out[i] = a[lhs[i]] @ b[rhs[i]]`` over
    the flat batch positions of the stacks ``a (*A, M, K)`` and ``b (*B, K, N)``) on Metal:
    the tiled product with each batch position's matrices picked by the indices, which
    are checked on the host first (as the CPU's kernel does)."""
    from lazyx.backends.cpu.kernels.matmuls import check_indices  # the CPU's messages
    a, b = bindable(inputs[0]), bindable(inputs[1])
    d = ldt.from_numpy(a.dtype)
    if d not in DTYPES or b.dtype != a.dtype:
        raise unsupported("gather_mm", ldt.from_numpy(b.dtype) if d in DTYPES else d, DTYPES)
    lhs, rhs = host_array(inputs[2], np.int32), host_array(inputs[3], np.int32)
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    check_indices(lhs.reshape(-1), math.prod(a.shape[:-2]), "lhs_indices", a.shape)
    check_indices(rhs.reshape(-1), math.prod(b.shape[:-2]), "rhs_indices", b.shape)
    out = empty(run, lhs.shape + (M, N), a.dtype)
    if out.size == 0:
        return out
    if K == 0:
        raise UnsupportedDtype("Metal kernel gather_mm reads its operands; with K = 0 the "
                               "CPU's kernel writes the zeros.")
    a3, b3 = _stack(a), _stack(b)
    a_mat, b_mat = _strides(a3, 3), _strides(b3, 3)
    run(Dispatch(LIBRARY, f"gather_mm_{d.name}", [
        a3, out, b3, np.zeros(1, a.dtype), np.array([M, N, K], np.int32),
        np.array(a_mat[1:], np.int64), np.array(b_mat[1:], np.int64), np.zeros(2, np.int64),
        np.ones(1, np.int32), np.array([a3.strides[0] // a3.itemsize], np.int64),
        np.array([b3.strides[0] // b3.itemsize], np.int64), np.zeros(1, np.int64),
        np.array([1], np.int32), np.array([1.0, 0.0], np.float32),
        lhs.reshape(-1), rhs.reshape(-1)],
        _tiles(M, N, lhs.size), (THREADS, THREADS, 1)))
    return out


def matmul(primitive, inputs, run):
    """``Matmul`` (NumPy's ``matmul``: 1-D operands, broadcast batches) on Metal: the output."""
    a, b = inputs
    return _product("matmul", _shape(primitive, inputs), a, b, None, 1.0, 0.0, run)


def addmm(primitive, inputs, run):
    """``AddMM`` (``alpha * (a @ b) + beta * c``; inputs ``(c, a, b)``) on Metal: the output.
    ``beta == 0`` ignores ``c`` (NaNs included), as the CPU's kernel and BLAS do."""
    c, a, b = inputs
    beta = float(primitive.beta)
    return _product("addmm", _shape(primitive, inputs), a, b, None if beta == 0.0 else c,
                    float(primitive.alpha), beta, run)


def _shape(primitive, inputs) -> tuple:
    return tuple(primitive.output_shapes(inputs)[0])
