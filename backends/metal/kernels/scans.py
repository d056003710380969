"""Metal kernel of ``Scan``: cumulative sum, product, max, min and log-add-exp along an axis.

One MSL template, instantiated per operator and dtype from the tables below:

* ``scan_<op>_<dtype>`` — one threadgroup per row (the positions along ``axis``,
  strided: any axis, any layout; :func:`.common.row_layout`). The threadgroup walks
  its row in chunks of ``threads`` elements, in scan order (from the end when
  ``reverse``). In a chunk each thread holds one element; a simdgroup scans its 32
  with ``simd_prefix_inclusive_sum``/``_product`` (max, min and log-add-exp: a
  Hillis-Steele scan over ``simd_shuffle_up``), each simdgroup's total goes to
  threadgroup memory, and every thread adds the totals of the simdgroups before its
  own and the carry of the chunks before (a register every thread keeps alike). An
  exclusive scan takes the inclusive value of the element before (``simd_shuffle_up``
  by one; the first gets the identity). Rows of any length run in one dispatch; a
  long row is a sequential loop over its chunks.

Semantics of the CPU kernel (``backends/cpu/kernels/reductions.py``): float16 and
bfloat16 accumulate in float and round once per output; bool accumulates in uint
(``prod`` is a logical and, ``max``/``min`` or/and); a NaN propagates through max
and min (NumPy's ``maximum``); log-add-exp is ``max + log(1 + exp(-|a - b|))``, equal
inputs giving ``a + log 2`` (so infinities stay themselves). The exclusive identities
are 0, 1, the dtype's lowest/highest value (``-inf``/``inf`` for floats) and ``-inf``.
Integer sums and products wrap as NumPy's do. Floating-point sums and products add
in a different order from NumPy's sequential loop (a tree within a chunk), so they
agree to rounding, not bit for bit.
"""

from __future__ import annotations

import numpy as np

from lazyx import dtypes as ldt

from .common import (empty, PRELUDE, Dispatch, Library, bindable, instantiate, msl_type, row_layout,
                     threadgroup_for_rows, unsupported)

__all__ = ["scan", "LIBRARY", "SCAN_DTYPES"]

_SOURCE = PRELUDE + r"""
// The scan operators: the reduction operators of the prelude plus an inclusive
// simdgroup scan (`simd_scan`) each.
template <typename U, typename Op>
inline U shuffle_scan(U v, uint lane) {
  for (ushort d = 1; d < 32; d *= 2) {
    U other = simd_shuffle_up(v, d);
    if (lane >= d) v = Op::apply(other, v);
  }
  return v;
}
template <typename U> struct ScanSum : Sum<U> {
  static U simd_scan(U v, uint lane) { return simd_prefix_inclusive_sum(v); }
};
template <typename U> struct ScanProd : Prod<U> {
  static U simd_scan(U v, uint lane) { return simd_prefix_inclusive_product(v); }
};
template <typename U> struct ScanMax : Max<U> {
  static U simd_scan(U v, uint lane) { return shuffle_scan<U, Max<U>>(v, lane); }
};
template <typename U> struct ScanMin : Min<U> {
  static U simd_scan(U v, uint lane) { return shuffle_scan<U, Min<U>>(v, lane); }
};
// NumPy's logaddexp: a NaN propagates, equal values (infinities too) give a + log 2.
template <typename U> struct LogAddExp {
  static U init() { return -numeric_limits<U>::infinity(); }
  static U apply(U a, U b) {
    if (a != a || b != b) return a + b;
    if (a == b) return a + U(0.693147180559945309f);
    U m = a > b ? a : b;
    return m + metal::log(U(1) + metal::exp(-metal::abs(a - b)));
  }
  static U simd_scan(U v, uint lane) { return shuffle_scan<U, LogAddExp<U>>(v, lane); }
};

// Rows of x and of out (same shape): buffers 4-11 from common.row_layout(shape, (axis,), x, out).
// flags: bit 0 reverse, bit 1 exclusive.
template <typename T, typename U, typename Op>
[[kernel]] void scan(
    device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
    constant uint& row_size [[buffer(2)]], constant uint& flags [[buffer(3)]],
    constant int* red_shape [[buffer(4)]], constant int64_t* x_red_strides [[buffer(5)]],
    constant int64_t* out_red_strides [[buffer(6)]], constant int& red_ndim [[buffer(7)]],
    constant int* row_shape [[buffer(8)]], constant int64_t* x_row_strides [[buffer(9)]],
    constant int64_t* out_row_strides [[buffer(10)]], constant int& row_ndim [[buffer(11)]],
    uint3 group [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]],
    uint3 threads [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
    uint simd_group [[simdgroup_index_in_threadgroup]]) {
  threadgroup U totals[32];
  device const T* row = x + elem_to_loc(group.y, row_shape, x_row_strides, row_ndim);
  device T* dest = out + elem_to_loc(group.y, row_shape, out_row_strides, row_ndim);
  const bool reverse = (flags & 1u) != 0, exclusive = (flags & 2u) != 0;
  const uint n_simd = (threads.x + 31) / 32;
  U carry = Op::init();
  for (uint start = 0; start < row_size; start += threads.x) {
    uint k = start + lid.x;                       // position in scan order
    uint at = reverse ? row_size - 1 - k : k;     // position along the axis
    U v = k < row_size ? U(row[elem_to_loc(at, red_shape, x_red_strides, red_ndim)]) : Op::init();
    U inclusive = Op::simd_scan(v, lane);
    U before = simd_shuffle_up(inclusive, ushort(1));
    if (lane == 0) before = Op::init();
    if (lane == 31) totals[simd_group] = inclusive;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    U prefix = carry;
    for (uint s = 0; s < simd_group; ++s) prefix = Op::apply(prefix, totals[s]);
    for (uint s = 0; s < n_simd; ++s) carry = Op::apply(carry, totals[s]);
    threadgroup_barrier(mem_flags::mem_threadgroup);   // `totals` is free again
    if (k < row_size)
      dest[elem_to_loc(at, red_shape, out_red_strides, red_ndim)] =
          T(Op::apply(prefix, exclusive ? before : inclusive));
  }
}
"""

_HALF = (ldt.float16, ldt.bfloat16)
_FLOATS = (ldt.float32, ldt.float16, ldt.bfloat16)
_NUMBERS = (ldt.bool_, ldt.int32, ldt.uint32, *_FLOATS)
#: The dtypes each Scan operator has kernels for (the op functions cast bool sums to
#: int32 and integer log-add-exps to float32 before the primitive; int64 and uint64 are
#: left to the CPU fallback: SIMD-group functions of 64-bit integers are not portable).
SCAN_DTYPES = {"sum": _NUMBERS, "prod": _NUMBERS, "max": _NUMBERS, "min": _NUMBERS,
               "logaddexp": _FLOATS}
_OPERATOR = {"sum": "ScanSum", "prod": "ScanProd", "max": "ScanMax", "min": "ScanMin",
             "logaddexp": "LogAddExp"}


def _accumulator(d) -> str:
    if d in _HALF:
        return "float"
    return "uint" if d == ldt.bool_ else msl_type(d)


LIBRARY = Library("scans", _SOURCE + "\n" + "".join(
    instantiate(f"scan_{op}_{d.name}", "scan", msl_type(d), _accumulator(d),
                f"{_OPERATOR[op]}<{_accumulator(d)}>")
    for op, dtypes in SCAN_DTYPES.items() for d in dtypes))


def scan(primitive, inputs, run):
    """``Scan`` (cumulative ``op`` along ``axis``, ``reverse``, ``inclusive``) on Metal: the
    output array (the input's shape and dtype)."""
    x = bindable(inputs[0])
    op = primitive.op
    d = ldt.from_numpy(x.dtype)
    if d not in SCAN_DTYPES[op]:
        raise unsupported(f"scan_{op}", d, SCAN_DTYPES[op])
    out = empty(run, x.shape, x.dtype)
    if out.size == 0:
        return out
    axis = primitive.axis % x.ndim
    rows, size, layout = row_layout(x.shape, (axis,), x, out)
    threads = threadgroup_for_rows(size)
    flags = (1 if primitive.reverse else 0) | (0 if primitive.inclusive else 2)
    run(Dispatch(LIBRARY, f"scan_{op}_{d.name}",
                 [x, out, np.array([size], np.uint32), np.array([flags], np.uint32), *layout],
                 (threads, rows, 1), (threads, 1, 1)))
    return out
