"""Metal kernels of the reductions pack: ``Reduce`` and ``ArgReduce``.

One MSL library, every kernel a template instantiated per operator and dtype from
the tables below (no kernel text per dtype):

* ``reduce_rows_<op>_<dtype>`` — one threadgroup per output element (a *row*: the
  positions of the reduced axes, strided, any axes, any layout). Each thread folds
  every ``threads``-th element, then a simdgroup reduction (``simd_sum``,
  ``simd_prod``, ``simd_all``, ``simd_any``; max and min a NaN-propagating butterfly
  of ``simd_shuffle_xor``) and one across the simdgroups through threadgroup memory.
* ``reduce_columns_<op>_<dtype>`` — the leading axes of a C-contiguous input (a
  ``(reduced, columns)`` matrix): threadgroups of 32 columns x 8 slices of the
  reduced axis; each thread folds its slice, threadgroup memory combines the 8.
* ``arg_reduce_<op>_<dtype>`` — ``argmax``/``argmin`` along one axis (or all),
  one threadgroup per output element; (value, index) pairs meet through
  ``simd_shuffle_down`` and threadgroup memory. Ties give the first index and a NaN
  wins (the first NaN), as NumPy's.

Accumulation as the CPU kernels: float16 and bfloat16 in float, sums and products of
bool in int32; the output dtype is the primitive's.
"""

from __future__ import annotations

import numpy as np

from lazyx import dtypes as ldt
from lazyx.plugins import reductions as rd

from .common import (empty, PRELUDE, Dispatch, Library, bindable, instantiate, msl_type, row_layout,
                     threadgroup_for_rows, unsupported)

__all__ = ["reduce", "arg_reduce", "LIBRARY", "REDUCE_DTYPES", "ARG_DTYPES"]

_SOURCE = PRELUDE + r"""
// x's rows (buffers 2-8, see common.row_layout) -> one value per row.
template <typename T, typename U, typename O, typename Op>
[[kernel]] void reduce_rows(
    device const T* x [[buffer(0)]], device O* out [[buffer(1)]],
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
  U acc = Op::init();
  for (uint k = lid.x; k < row_size; k += threads.x)
    acc = Op::apply(acc, U(row[elem_to_loc(k, red_shape, red_strides, red_ndim)]));
  acc = threadgroup_reduce<U, Op>(acc, partial, lane, simd_group, (threads.x + 31) / 32);
  if (lid.x == 0) out[group.y] = O(acc);
}

// x as a C-contiguous (n_reduce, n_columns) matrix -> one value per column.
// Threadgroups of (32 columns, 8 slices).
template <typename T, typename U, typename O, typename Op>
[[kernel]] void reduce_columns(
    device const T* x [[buffer(0)]], device O* out [[buffer(1)]],
    constant uint& n_reduce [[buffer(2)]], constant uint& n_columns [[buffer(3)]],
    uint3 pos [[thread_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]],
    uint3 threads [[threads_per_threadgroup]]) {
  threadgroup U partial[8][32];
  uint column = pos.x;
  U acc = Op::init();
  if (column < n_columns)
    for (uint r = lid.y; r < n_reduce; r += threads.y)
      acc = Op::apply(acc, U(x[uint64_t(r) * n_columns + column]));
  partial[lid.y][lid.x] = acc;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lid.y == 0 && column < n_columns) {
    for (uint s = 1; s < threads.y; ++s) acc = Op::apply(acc, partial[s][lid.x]);
    out[column] = O(acc);
  }
}

// argmax / argmin: `better(a, b)` when a should replace b; a NaN beats any number.
template <typename T> struct ArgMax {
  static bool better(T a, T b) { return a > b || (a != a && b == b); }
};
template <typename T> struct ArgMin {
  static bool better(T a, T b) { return a < b || (a != a && b == b); }
};

constant uint NO_INDEX = 0xffffffffu;

// Keep the better of (value, index) and (v, i); equal ones keep the smaller index.
template <typename T, typename Cmp>
inline void keep_best(thread T& value, thread uint& index, T v, uint i) {
  if (i == NO_INDEX) return;
  if (index == NO_INDEX || Cmp::better(v, value) || (!Cmp::better(value, v) && i < index)) {
    value = v;
    index = i;
  }
}

template <typename T, typename Cmp>
inline void simd_best(thread T& value, thread uint& index) {
  for (ushort offset = 16; offset > 0; offset /= 2) {
    T v = simd_shuffle_down(value, offset);
    uint i = simd_shuffle_down(index, offset);
    keep_best<T, Cmp>(value, index, v, i);
  }
}

template <typename T, typename Cmp>
[[kernel]] void arg_reduce(
    device const T* x [[buffer(0)]], device uint* out [[buffer(1)]],
    constant uint& row_size [[buffer(2)]],
    constant int* red_shape [[buffer(3)]], constant int64_t* red_strides [[buffer(4)]],
    constant int& red_ndim [[buffer(5)]],
    constant int* row_shape [[buffer(6)]], constant int64_t* row_strides [[buffer(7)]],
    constant int& row_ndim [[buffer(8)]],
    uint3 group [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]],
    uint3 threads [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
    uint simd_group [[simdgroup_index_in_threadgroup]]) {
  threadgroup T best_values[32];
  threadgroup uint best_indices[32];
  device const T* row = x + elem_to_loc(group.y, row_shape, row_strides, row_ndim);
  T value = T(0);
  uint index = NO_INDEX;
  for (uint k = lid.x; k < row_size; k += threads.x)
    keep_best<T, Cmp>(value, index, row[elem_to_loc(k, red_shape, red_strides, red_ndim)], k);
  simd_best<T, Cmp>(value, index);
  if (lane == 0) {
    best_values[simd_group] = value;
    best_indices[simd_group] = index;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (simd_group == 0) {
    bool mine = lane < (threads.x + 31) / 32;
    value = mine ? best_values[lane] : T(0);
    index = mine ? best_indices[lane] : NO_INDEX;
    simd_best<T, Cmp>(value, index);
    if (lane == 0) out[group.y] = index == NO_INDEX ? 0u : index;
  }
}
"""

_HALF = (ldt.float16, ldt.bfloat16)
_NUMBERS = (ldt.int32, ldt.uint32, ldt.float16, ldt.bfloat16, ldt.float32)
#: The input dtypes each Reduce operator has kernels for.
REDUCE_DTYPES = {"sum": (ldt.bool_, *_NUMBERS), "prod": (ldt.bool_, *_NUMBERS),
                 "max": _NUMBERS, "min": _NUMBERS,
                 "all": (ldt.bool_, *_NUMBERS), "any": (ldt.bool_, *_NUMBERS)}
#: The input dtypes ArgReduce has kernels for.
ARG_DTYPES = (ldt.bool_, *_NUMBERS)
_OPERATOR = {"sum": "Sum", "prod": "Prod", "max": "Max", "min": "Min", "all": "All", "any": "Any"}
_ARG = {"argmax": "ArgMax", "argmin": "ArgMin"}


def _out_dtype(op: str, d):
    if op in ("all", "any"):
        return ldt.bool_
    if op in ("sum", "prod"):
        return rd.SUM_DTYPE.get(d, d)
    return d


def _accumulator(op: str, d) -> str:
    if op in ("all", "any"):
        return "bool"
    return "float" if d in _HALF else msl_type(_out_dtype(op, d))


def _instantiations() -> str:
    lines = []
    for op, dtypes in REDUCE_DTYPES.items():
        for d in dtypes:
            u = _accumulator(op, d)
            args = (msl_type(d), u, msl_type(_out_dtype(op, d)), f"{_OPERATOR[op]}<{u}>")
            for kind in ("rows", "columns"):
                lines.append(instantiate(f"reduce_{kind}_{op}_{d.name}", f"reduce_{kind}", *args))
    for op, cmp in _ARG.items():
        for d in ARG_DTYPES:
            t = msl_type(d)
            lines.append(instantiate(f"arg_reduce_{op}_{d.name}", "arg_reduce", t, f"{cmp}<{t}>"))
    return "".join(lines)


LIBRARY = Library("reductions", _SOURCE + "\n" + _instantiations())

_COLUMN_SLICES = 8


def _count(n: int) -> np.ndarray:
    return np.array([n], np.uint32)


def reduce(primitive, inputs, run):
    """``Reduce`` (sum prod max min all any over ``axes``) on Metal: the output array."""
    x = bindable(inputs[0])
    op, axes = primitive.op, tuple(primitive.axes)
    d = ldt.from_numpy(x.dtype)
    if d not in REDUCE_DTYPES[op]:
        raise unsupported(f"reduce_{op}", d, REDUCE_DTYPES[op])
    out = empty(run, rd.reduced_shape(x.shape, axes, primitive.keepdims), _out_dtype(op, d).np)
    if out.size == 0:
        return out
    name = f"{op}_{d.name}"
    if x.flags.c_contiguous and axes == tuple(range(len(axes))) and len(axes) < x.ndim:
        # Leading axes of a contiguous input: neighbouring threads read neighbouring columns.
        n_reduce, n_columns = x.size // out.size, out.size
        run(Dispatch(LIBRARY, f"reduce_columns_{name}",
                     [x, out, _count(n_reduce), _count(n_columns)],
                     (-(-n_columns // 32) * 32, _COLUMN_SLICES, 1), (32, _COLUMN_SLICES, 1)))
        return out
    rows, size, layout = row_layout(x.shape, axes, x)
    threads = threadgroup_for_rows(size)
    run(Dispatch(LIBRARY, f"reduce_rows_{name}", [x, out, _count(size), *layout],
                 (threads, rows, 1), (threads, 1, 1)))
    return out


def arg_reduce(primitive, inputs, run):
    """``ArgReduce`` (argmax, argmin along ``axis``, or all when None) on Metal: uint32 indices."""
    x = bindable(inputs[0])
    d = ldt.from_numpy(x.dtype)
    if d not in ARG_DTYPES:
        raise unsupported(f"arg_reduce_{primitive.op}", d, ARG_DTYPES)
    out = empty(run, primitive.output_shapes([x])[0], np.uint32)
    if out.size == 0:
        return out
    axes = tuple(range(x.ndim)) if primitive.axis is None else (primitive.axis,)
    rows, size, layout = row_layout(x.shape, axes, x)
    threads = threadgroup_for_rows(size)
    run(Dispatch(LIBRARY, f"arg_reduce_{primitive.op}_{d.name}", [x, out, _count(size), *layout],
                 (threads, rows, 1), (threads, 1, 1)))
    return out
