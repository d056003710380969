"""Metal kernels of ``Softmax`` and ``LogSumExp``: max-subtracted row kernels.

One threadgroup per row (the positions of the primitive's axes, strided; any axes,
any layout; :func:`.common.row_layout`), three sweeps over the row with two
threadgroup reductions between them (:data:`.common.PRELUDE`):

* the maximum ``m`` (a NaN wins, as NumPy's ``max``);
* ``s = sum(exp(x - m))``;
* Softmax writes ``exp(x - m) / s``; LogSumExp writes ``log(s) + m``, with ``m``
  taken as 0 where it is not finite (so ``inf - inf`` never appears), one value per row.

The numerics of the CPU kernels (``backends/cpu/kernels/products.py`` and
``reductions.py``): float16 and bfloat16 are computed in float and rounded once.
"""

from __future__ import annotations

import numpy as np

from lazyx import dtypes as ldt
from lazyx.plugins import reductions as rd

from .common import (empty, PRELUDE, Dispatch, Library, bindable, instantiate, msl_type, row_layout,
                     threadgroup_for_rows, unsupported)

__all__ = ["softmax", "logsumexp", "LIBRARY", "DTYPES", "ROW_STATISTICS"]

#: The row statistics both kernels (and cross-entropy, kernels/fast.py) start from.
ROW_STATISTICS = r"""
// The row's maximum and sum(exp(x - m)), the first with non-finite maxima as 0 when
// `finite_max` (log-sum-exp's shift).
template <typename T, typename U, bool finite_max>
inline void row_statistics(device const T* row, uint row_size, constant int* shape,
                           constant int64_t* strides, int ndim, thread U& m, thread U& s,
                           threadgroup U* partial, uint first, uint step, uint lane,
                           uint simd_group) {
  uint n_simd = (step + 31) / 32;
  m = Max<U>::init();
  for (uint k = first; k < row_size; k += step)
    m = Max<U>::apply(m, U(row[elem_to_loc(k, shape, strides, ndim)]));
  m = threadgroup_reduce<U, Max<U>>(m, partial, lane, simd_group, n_simd);
  if (finite_max && !metal::isfinite(m)) m = U(0);
  s = U(0);
  for (uint k = first; k < row_size; k += step)
    s += metal::exp(U(row[elem_to_loc(k, shape, strides, ndim)]) - m);
  s = threadgroup_reduce<U, Sum<U>>(s, partial, lane, simd_group, n_simd);
}
"""

_SOURCE = PRELUDE + ROW_STATISTICS + r"""
// Rows of x and of out (same shape): buffers 3-10 from common.row_layout(shape, axes, x, out).
template <typename T, typename U>
[[kernel]] void softmax(
    device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
    constant uint& row_size [[buffer(2)]],
    constant int* red_shape [[buffer(3)]], constant int64_t* x_red_strides [[buffer(4)]],
    constant int64_t* out_red_strides [[buffer(5)]], constant int& red_ndim [[buffer(6)]],
    constant int* row_shape [[buffer(7)]], constant int64_t* x_row_strides [[buffer(8)]],
    constant int64_t* out_row_strides [[buffer(9)]], constant int& row_ndim [[buffer(10)]],
    uint3 group [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]],
    uint3 threads [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
    uint simd_group [[simdgroup_index_in_threadgroup]]) {
  threadgroup U partial[32];
  device const T* row = x + elem_to_loc(group.y, row_shape, x_row_strides, row_ndim);
  device T* dest = out + elem_to_loc(group.y, row_shape, out_row_strides, row_ndim);
  U m, s;
  row_statistics<T, U, false>(row, row_size, red_shape, x_red_strides, red_ndim, m, s, partial,
                              lid.x, threads.x, lane, simd_group);
  for (uint k = lid.x; k < row_size; k += threads.x) {
    U e = metal::exp(U(row[elem_to_loc(k, red_shape, x_red_strides, red_ndim)]) - m);
    dest[elem_to_loc(k, red_shape, out_red_strides, red_ndim)] = T(e / s);
  }
}

// Rows of x (buffers 2-8 from common.row_layout(shape, axes, x)) -> one value per row.
template <typename T, typename U>
[[kernel]] void logsumexp(
    device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
    constant uint& row_size [[buffer(2)]],
    constant int* red_shape [[buffer(3)]], constant int64_t* red_strides [[buffer(4)]],
    constant int& red_ndim [[buffer(5)]],
    constant int* row_shape [[buffer(6)]], constant int64_t* row_strides [[buffer(7)]],
    constant int& row_ndim [[buffer(8)]],
    uint3 group [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]],
    uint3 threads [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
    uint simd_group [[simdgroup_index_in_threadgroup]]) {
  threadgroup U partial[32];
  device const T* row = x + elem_to_loc(group.y, row_shape, row_strides, row_ndim);
  U m, s;
  row_statistics<T, U, true>(row, row_size, red_shape, red_strides, red_ndim, m, s, partial,
                             lid.x, threads.x, lane, simd_group);
  if (lid.x == 0) out[group.y] = T(metal::log(s) + m);
}
"""

#: The dtypes both kernels have versions for (float64 has no Metal type).
DTYPES = (ldt.float32, ldt.float16, ldt.bfloat16)

LIBRARY = Library("softmax", _SOURCE + "\n" + "".join(
    instantiate(f"{kernel}_{d.name}", kernel, msl_type(d), "float")
    for kernel in ("softmax", "logsumexp") for d in DTYPES))


def _checked(kernel: str, inputs):
    x = bindable(inputs[0])
    d = ldt.from_numpy(x.dtype)
    if d not in DTYPES:
        raise unsupported(kernel, d, DTYPES)
    return x, d


def softmax(primitive, inputs, run):
    """``Softmax`` over ``axes`` on Metal: the output array (x's shape and dtype)."""
    x, d = _checked("softmax", inputs)
    out = empty(run, x.shape, x.dtype)
    if out.size == 0:
        return out
    rows, size, layout = row_layout(x.shape, tuple(primitive.axes), x, out)
    threads = threadgroup_for_rows(size)
    run(Dispatch(LIBRARY, f"softmax_{d.name}", [x, out, np.array([size], np.uint32), *layout],
                 (threads, rows, 1), (threads, 1, 1)))
    return out


def logsumexp(primitive, inputs, run):
    """``LogSumExp`` over ``axes`` on Metal: the output array."""
    x, d = _checked("logsumexp", inputs)
    axes = tuple(primitive.axes)
    out = empty(run, rd.reduced_shape(x.shape, axes, primitive.keepdims), x.dtype)
    if out.size == 0:
        return out
    rows, size, layout = row_layout(x.shape, axes, x)
    threads = threadgroup_for_rows(size)
    run(Dispatch(LIBRARY, f"logsumexp_{d.name}", [x, out, np.array([size], np.uint32), *layout],
                 (threads, rows, 1), (threads, 1, 1)))
    return out
