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

The reductions that are not folds:

* ``Median`` — the sorting library's row sort (:func:`.sorting.sort`, NaNs last) along
  the reduced axis (several axes: first gathered last by a strided copy, or a view where
  the layout allows one), then ``median_pick_<dtype>``: one thread per row reads the
  middle value, or the mean of the two middle ones (``(a + b) / 2`` in float, as NumPy's
  ``mean`` in float32, to which the CPU casts halves), NaN when the row's last value is
  NaN or the row is empty. The values are the CPU's; a zero's sign may differ (among
  equal values NumPy's partition picks its own).
* ``NumberOfElements`` — ``scalar_from_f64_<dtype>``: one thread writes the count (or
  its reciprocal, computed by the host in float64 as the CPU kernel does) in the
  requested dtype, through :mod:`.creation`'s float64 conversion (floats rounded once
  from the double, integers truncated, bool nonzero): the CPU's value exactly.
* ``AllClose``, ``ArrayEqual`` — ``all_<test>_<dtype>``: threadgroups of 256 threads,
  each folding the element test over a chunk of 4096 positions of the broadcast shape
  (both operands strided, stride 0 where broadcast) into one bool per threadgroup
  (``threadgroup_reduce`` with ``All``); more than one chunk: ``reduce_rows_all_bool``
  folds those. The tests are NumPy's: ``array_equal`` is ``a == b`` (or both NaN with
  ``equal_nan``, floats); ``allclose`` is ``isclose``'s ``|a - b| <= atol + rtol |b|``
  and ``b`` finite, or ``a == b`` (or both NaN with ``equal_nan``), each operation
  rounded to the operands' float dtype as NumPy does (the tolerances converted to it
  first); for bool and 8- to 32-bit integers NumPy computes in float64, and so does the
  kernel, emulated (:data:`.creation.SOFT_DOUBLE`). 64-bit integers' ``allclose`` (their
  float64 conversion rounds) and non-finite tolerances for integers fall back to the CPU.
"""

from __future__ import annotations

import math

import numpy as np
from lazyx import dtypes as ldt
from lazyx.plugins import reductions as rd
from lazyx.plugins import sorting as so

from . import sorting
from .common import (
    PRELUDE,
    Dispatch,
    Library,
    UnsupportedDtype,
    bindable,
    empty,
    instantiate,
    msl_type,
    row_layout,
    threadgroup_for_rows,
    unsupported,
)
from .creation import SOFT_DOUBLE, f64_bits
from .shapes import DTYPES as ALL_DTYPES
from .shapes import contiguous_copy

__all__ = [
    "ARG_DTYPES",
    "CLOSE_DTYPES",
    "LIBRARY",
    "MEDIAN_DTYPES",
    "REDUCE_DTYPES",
    "allclose",
    "arg_reduce",
    "array_equal",
    "median",
    "number_of_elements",
    "reduce",
]

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


# Median's pick, NumberOfElements's scalar, and the all-reductions of an element test.
_MORE_SOURCE = SOFT_DOUBLE + r"""
// One thread per row of the sorted array (buffers 3-8 from common.row_layout): the
// middle value, the mean of the two middle ones, or NaN (NaNs sort last; empty rows).
template <typename T>
[[kernel]] void median_pick(
    device const T* sorted [[buffer(0)]], device T* out [[buffer(1)]],
    constant uint* sizes [[buffer(2)]],
    constant int* red_shape [[buffer(3)]], constant int64_t* red_strides [[buffer(4)]],
    constant int& red_ndim [[buffer(5)]],
    constant int* row_shape [[buffer(6)]], constant int64_t* row_strides [[buffer(7)]],
    constant int& row_ndim [[buffer(8)]], uint r [[thread_position_in_grid]]) {
  const uint rows = sizes[0], n = sizes[1];
  if (r >= rows) return;
  device const T* row = sorted + elem_to_loc(r, row_shape, row_strides, row_ndim);
  if (n == 0 || isnan(row[elem_to_loc(n - 1, red_shape, red_strides, red_ndim)])) {
    out[r] = numeric_limits<T>::quiet_NaN();
    return;
  }
  const T high = row[elem_to_loc(n / 2, red_shape, red_strides, red_ndim)];
  if (n % 2) { out[r] = high; return; }
  const T low = row[elem_to_loc(n / 2 - 1, red_shape, red_strides, red_ndim)];
  out[r] = T((float(low) + float(high)) / 2.0f);
}

// NumberOfElements: the count (or its reciprocal) given as float64 bits, as T.
template <typename T>
[[kernel]] void scalar_from_f64(constant ulong& value [[buffer(0)]], device T* out [[buffer(1)]],
                                uint i [[thread_position_in_grid]]) {
  if (i == 0) out[0] = from_f64<T>(value);
}

// Element tests: test(x, y, tolerances in T, tolerances as float64 bits).
template <typename T> struct Equal {
  static bool test(T x, T y, constant T* tol, constant ulong* tol64) { return x == y; }
};
template <typename T> struct EqualNan {
  static bool test(T x, T y, constant T* tol, constant ulong* tol64) {
    return x == y || (isnan(x) && isnan(y));
  }
};
// NumPy's isclose in the float dtype T: every operation rounded to T (float arithmetic
// rounded back, as NumPy computes float16 and bfloat16 ufuncs).
template <typename T, bool equal_nan> struct CloseFloat {
  static bool test(T x, T y, constant T* tol, constant ulong* tol64) {
    const float xf = float(x), yf = float(y);
    const float diff = float(T(abs(xf - yf)));
    const float bound = float(T(float(tol[1]) + float(T(float(tol[0]) * abs(yf)))));
    return (diff <= bound && isfinite(yf)) || xf == yf || (equal_nan && isnan(xf) && isnan(yf));
  }
};
// Both doubles finite: a <= b.
inline bool f64_le(ulong a, ulong b) {
  if (((a | b) << 1) == 0) return true;         // +0 and -0
  const bool na = (a >> 63) != 0, nb = (b >> 63) != 0;
  if (na != nb) return na;
  return na ? a >= b : a <= b;
}
// NumPy's isclose of integers (or bool): b becomes float64, so |a - b| (exact here) is
// compared with atol + rtol |b| in float64, emulated.
template <typename T> struct CloseInt {
  static bool test(T x, T y, constant T* tol, constant ulong* tol64) {
    const long d = long(x) - long(y), yl = long(y);
    const ulong diff = round_pack(false, ulong(d < 0 ? -d : d), 0, false, 53, 11);
    const ulong bound = f64_add(tol64[1], f64_mul_u32(tol64[0], uint(yl < 0 ? -yl : yl)));
    return f64_le(diff, bound) || x == y;
  }
};

// Whether test holds at every position of the broadcast shape. Threadgroup g folds
// positions [g chunk, (g + 1) chunk) into partial[g]. sizes: n, chunk.
template <typename T, typename Test>
[[kernel]] void all_pairs(
    device const T* a [[buffer(0)]], device bool* partial [[buffer(1)]],
    device const T* b [[buffer(2)]], constant uint* sizes [[buffer(3)]],
    constant T* tol [[buffer(4)]], constant ulong* tol64 [[buffer(5)]],
    constant int* shape [[buffer(6)]], constant int64_t* a_strides [[buffer(7)]],
    constant int64_t* b_strides [[buffer(8)]], constant int& ndim [[buffer(9)]],
    uint3 group [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]],
    uint3 threads [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
    uint simd_group [[simdgroup_index_in_threadgroup]]) {
  threadgroup bool partials[32];
  const uint n = sizes[0], start = group.x * sizes[1], end = min(n, start + sizes[1]);
  bool ok = true;
  for (uint k = start + lid.x; k < end; k += threads.x)
    ok = ok && Test::test(a[elem_to_loc(k, shape, a_strides, ndim)],
                          b[elem_to_loc(k, shape, b_strides, ndim)], tol, tol64);
  ok = threadgroup_reduce<bool, All<bool>>(ok, partials, lane, simd_group, (threads.x + 31) / 32);
  if (lid.x == 0) partial[group.x] = ok;
}
"""

#: The dtypes Median has kernels for (its input is inexact; float64 has no Metal type).
MEDIAN_DTYPES = (ldt.float16, ldt.bfloat16, ldt.float32)
#: The dtypes AllClose has kernels for (ArrayEqual: every dtype Metal has).
CLOSE_DTYPES = (ldt.bool_, ldt.int8, ldt.uint8, ldt.int16, ldt.uint16, ldt.int32, ldt.uint32,
                *MEDIAN_DTYPES)


def _more_instantiations() -> str:
    lines = [instantiate(f"median_pick_{d.name}", "median_pick", msl_type(d))
             for d in MEDIAN_DTYPES]
    lines += [instantiate(f"scalar_from_f64_{d.name}", "scalar_from_f64", msl_type(d))
              for d in ALL_DTYPES]
    for d in ALL_DTYPES:
        t = msl_type(d)
        tests = {"equal": f"Equal<{t}>"}
        if d.kind == "f":
            tests |= {"equal_nan": f"EqualNan<{t}>", "close": f"CloseFloat<{t}, false>",
                      "close_nan": f"CloseFloat<{t}, true>"}
        elif d in CLOSE_DTYPES:
            tests |= {"close": f"CloseInt<{t}>"}
        lines += [instantiate(f"all_{name}_{d.name}", "all_pairs", t, test)
                  for name, test in tests.items()]
    return "".join(lines)


LIBRARY = Library("reductions", _SOURCE + "\n" + _instantiations() + _MORE_SOURCE + "\n"
                  + _more_instantiations())

_COLUMN_SLICES = 8


def _count(n: int) -> np.ndarray:
    return np.array([n], np.uint32)


def _fold_rows(kernel: str, x, axes, out, run):
    """Dispatch row kernel ``kernel`` (``reduce_rows_*``, ``arg_reduce_*``): a threadgroup
    per row of ``x`` over ``axes``, each writing its row's value into ``out``."""
    rows, size, layout = row_layout(x.shape, axes, x)
    threads = threadgroup_for_rows(size)
    run(Dispatch(LIBRARY, kernel, [x, out, _count(size), *layout],
                 (threads, rows, 1), (threads, 1, 1)))
    return out


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
    return _fold_rows(f"reduce_rows_{name}", x, axes, out, run)


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
    return _fold_rows(f"arg_reduce_{primitive.op}_{d.name}", x, axes, out, run)


# -- Median, NumberOfElements, AllClose, ArrayEqual ---------------------------------------------
_GROUP = 256


def median(primitive, inputs, run):
    """``Median`` over ``axes`` on Metal: a row sort, then the middle value(s) of each row."""
    x = bindable(inputs[0])
    d = ldt.from_numpy(x.dtype)
    if d not in MEDIAN_DTYPES:
        raise unsupported("median", d, MEDIAN_DTYPES)
    axes = tuple(primitive.axes)
    out = empty(run, rd.reduced_shape(x.shape, axes, primitive.keepdims), x.dtype)
    if out.size == 0:
        return out
    kept = [k for k in range(x.ndim) if k not in axes]
    n = math.prod(x.shape[k] for k in axes)
    if n == 0:
        g, axis = np.zeros((out.size, 1), x.dtype), 1    # a stand-in: every row is NaN
    elif len(axes) == 1:
        g, axis = x, axes[0]
    else:   # the reduced axes gathered last: a view where the strides allow, else a copy
        view = x.transpose(kept + list(axes))
        target = view.shape[:len(kept)] + (n,)
        try:
            g = view.reshape(target, copy=False)
        except ValueError:
            g = contiguous_copy(run, view).reshape(target)
        axis = len(kept)
    s = g if n == 0 else sorting.sort(so.Sort(primitive.stream, axis), [g], run)
    rows, _, layout = row_layout(s.shape, (axis,), s)
    run(Dispatch(LIBRARY, f"median_pick_{d.name}", [s, out, np.array([rows, n], np.uint32),
                                                    *layout],
                 (-(-rows // _GROUP) * _GROUP, 1, 1), (_GROUP, 1, 1)))
    return out


def number_of_elements(primitive, inputs, run):
    """``NumberOfElements``: the input's element count over ``axes`` (or its reciprocal,
    ``inf`` for none) as a 0-d array of ``dtype``, written by one thread."""
    d = primitive.dtype
    if d is ldt.float64:
        raise UnsupportedDtype("Metal kernel scalar_from_f64 has no float64 version (Metal has "
                               "no double precision).")
    if d not in ALL_DTYPES:
        raise unsupported("scalar_from_f64", d, ALL_DTYPES)
    n = math.prod(inputs[0].shape[k] for k in primitive.axes)
    value = (1.0 / n if n else math.inf) if primitive.inverted else float(n)
    if d.kind in "iu":
        info = np.iinfo(d.np)
        if not (math.isfinite(value) and info.min <= int(value) <= info.max):
            # NumPy refuses the conversion: the CPU kernel raises its error
            raise UnsupportedDtype(f"Metal kernel scalar_from_f64_{d.name}: {value} does not "
                                   f"fit {d.name}.")
    out = empty(run, (), d.np)
    run(Dispatch(LIBRARY, f"scalar_from_f64_{d.name}",
                 [np.array([f64_bits(value)], np.uint64), out], (1, 1, 1), (1, 1, 1)))
    return out


_CHUNK = 16 * _GROUP


def _all_pairs(kernel: str, a, b, run, tolerances=(0.0, 0.0)):
    """Dispatch ``all_<kernel>`` over the broadcast positions of ``a`` and ``b``: the 0-d bool."""
    shape = np.broadcast_shapes(a.shape, b.shape)
    n = math.prod(shape)
    if n >= 2 ** 32:
        raise UnsupportedDtype(f"Metal kernel all_{kernel} counts with 32-bit integers; "
                               f"{n} elements are past them.")
    out = empty(run, (), np.bool_)
    a = bindable(np.broadcast_to(a, shape)) if n else np.zeros(1, a.dtype)
    b = bindable(np.broadcast_to(b, shape)) if n else np.zeros(1, b.dtype)
    # the positions as one reduced part: collapsed shape, a's and b's strides, ndim
    positions = row_layout(a.shape, tuple(range(a.ndim)), a, b)[2][:4]
    groups = max(1, -(-n // _CHUNK))
    partial = out if groups == 1 else empty(run, (groups,), np.bool_)
    run(Dispatch(LIBRARY, f"all_{kernel}",
                 [a, partial, b, np.array([n, _CHUNK], np.uint32),
                  np.array(tolerances, a.dtype), np.array([f64_bits(t) for t in tolerances],
                                                          np.uint64), *positions],
                 (groups * _GROUP, 1, 1), (_GROUP, 1, 1)))
    if groups > 1:   # one bool per threadgroup: folded by the reduction's own row kernel
        _fold_rows("reduce_rows_all_bool", partial, (0,), out, run)
    return out


def _operands(kernel: str, inputs, supported):
    a, b = inputs
    d = ldt.from_numpy(a.dtype)
    if d not in supported:
        raise unsupported(kernel, d, supported)
    if b.dtype != a.dtype:
        raise UnsupportedDtype(f"Metal kernel {kernel} compares operands of one dtype; these "
                               f"are {a.dtype} and {b.dtype}. The CPU's kernel converts them.")
    return a, b, d


def allclose(primitive, inputs, run):
    """``AllClose``: whether NumPy's ``isclose`` (``rtol``, ``atol``, ``equal_nan``) holds at
    every broadcast position, as a 0-d bool."""
    a, b, d = _operands("allclose", inputs, CLOSE_DTYPES)
    tolerances = (primitive.rtol, primitive.atol)
    if d.kind != "f" and not all(math.isfinite(t) for t in tolerances):
        raise UnsupportedDtype("Metal kernel all_close emulates float64 for integers with finite "
                               "tolerances only.")
    nan = "_nan" if primitive.equal_nan and d.kind == "f" else ""
    return _all_pairs(f"close{nan}_{d.name}", a, b, run, tolerances)


def array_equal(primitive, inputs, run):
    """``ArrayEqual``: whether the operands (of one shape) are equal everywhere (NaNs equal to
    each other with ``equal_nan``), as a 0-d bool."""
    a, b, d = _operands("array_equal", inputs, ALL_DTYPES)
    if a.shape != b.shape:
        raise UnsupportedDtype("Metal kernel all_equal compares operands of one shape; the "
                               "CPU's kernel answers False for these.")
    nan = "_nan" if primitive.equal_nan and d.kind == "f" else ""
    return _all_pairs(f"equal{nan}_{d.name}", a, b, run)
