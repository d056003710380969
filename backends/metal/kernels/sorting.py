"""Metal kernels of the sorting pack: ``Sort``, ``ArgSort``, ``Partition``, ``ArgPartition``.

Every kernel orders (value, index) pairs by one total order: the value (NaNs after
every number, equal to each other; ``-0.0`` equal to ``0.0``), then the index. That
is NumPy's stable sort, so ``ArgSort`` gives the CPU backend's indices exactly (ties
in input order) and ``Sort`` its values. Two template kernels, instantiated per dtype
and output (values or indices) from the tables below:

* ``sort_block_<dtype>[_arg]`` — one threadgroup per block of up to :data:`BLOCK`
  (2048) elements of a row (the positions along ``axis``, strided, any layout): the
  pairs are loaded into threadgroup memory, padded to a power of two with pairs that
  order last, and sorted by a bitonic network (each thread compares and swaps
  ``block / 2 / threads`` pairs per step, a barrier between steps). A row that fits in
  one block is written straight to the output; a longer row's sorted blocks go to
  scratch buffers (``rows x n`` values and uint32 indices).
* ``sort_merge_<dtype>[_arg]`` — one pass of a merge sort over the scratch: sorted runs
  of ``width`` merge pairwise into runs of ``2 width``. One thread per element: its
  place in the merged run is its rank in its own run plus the number of elements of
  the partner run that order before it (a binary search; the order is total, so no two
  elements claim one place). The passes ping-pong between two scratch pairs; the last
  writes the output. ``log2(n / 2048)`` passes, each ``O(n log n)`` work.

``Partition`` and ``ArgPartition`` are the full sort (a sorted row is partitioned at
every ``kth``): the element at ``kth`` and the sets on either side are NumPy's, but
the order inside each side is the sorted one, where NumPy's introselect leaves its
own order (``np.partition`` documents that order as unspecified).

Dtypes: bool, the 8- to 64-bit integers, float16, bfloat16, float32 (float64 has no
Metal type: the backend's CPU fallback refuses it as for every kernel).
"""

from __future__ import annotations

import numpy as np

from lazyx import dtypes as ldt

from .common import (empty, PRELUDE, MAX_THREADGROUP, Dispatch, Library, bindable, instantiate,
                     msl_type, row_layout, unsupported)

__all__ = ["sort", "argsort", "partition", "argpartition", "topk", "searchsorted", "LIBRARY",
           "DTYPES", "BLOCK"]

#: Elements one threadgroup sorts in threadgroup memory: 2048 x (8-byte value + 4-byte
#: index) = 24 KiB, within Apple GPUs' 32 KiB.
BLOCK = 2 * MAX_THREADGROUP

_SOURCE = PRELUDE + f"\n#define SORT_BLOCK {BLOCK}u\n" + r"""
constant uint PAD = 0xffffffffu;   // the index of a padding pair: orders after all others

// a before b: the value (NaNs last), then the index.
template <typename T>
inline bool value_less(T a, T b) { return a < b || (b != b && a == a); }
template <typename T>
inline bool before(T a, uint ia, T b, uint ib) {
  if (ia == PAD || ib == PAD) return ib == PAD && ia != PAD;
  return value_less(a, b) || (!value_less(b, a) && ia < ib);
}

// What a sort writes: the value, or (`arg`) the index.
template <typename T, bool arg> struct Output {
  typedef T type;
  static T get(T value, uint index) { return value; }
};
template <typename T> struct Output<T, true> {
  typedef uint type;
  static uint get(T value, uint index) { return index; }
};

// x's rows (buffers 5-12 from common.row_layout(shape, (axis,), x, out)); block group.x of
// row group.y. `to_scratch`: write the sorted block to the scratch pair (rows x n) instead
// of the output.
template <typename T, bool arg>
[[kernel]] void sort_block(
    device const T* x [[buffer(0)]], device typename Output<T, arg>::type* out [[buffer(1)]],
    device T* scratch_values [[buffer(2)]], device uint* scratch_indices [[buffer(3)]],
    constant uint& n [[buffer(4)]],
    constant int* red_shape [[buffer(5)]], constant int64_t* x_red_strides [[buffer(6)]],
    constant int64_t* out_red_strides [[buffer(7)]], constant int& red_ndim [[buffer(8)]],
    constant int* row_shape [[buffer(9)]], constant int64_t* x_row_strides [[buffer(10)]],
    constant int64_t* out_row_strides [[buffer(11)]], constant int& row_ndim [[buffer(12)]],
    constant uint& to_scratch [[buffer(13)]],
    uint3 group [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]],
    uint3 threads [[threads_per_threadgroup]]) {
  threadgroup T values[SORT_BLOCK];
  threadgroup uint indices[SORT_BLOCK];
  device const T* row = x + elem_to_loc(group.y, row_shape, x_row_strides, row_ndim);
  const uint start = group.x * SORT_BLOCK;
  const uint count = min(SORT_BLOCK, n - start);
  uint padded = 1;
  while (padded < count) padded *= 2;
  for (uint k = lid.x; k < padded; k += threads.x) {
    bool real = k < count;
    values[k] = real ? row[elem_to_loc(start + k, red_shape, x_red_strides, red_ndim)] : T(0);
    indices[k] = real ? start + k : PAD;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  // The bitonic network: runs of `size` sorted alternately up and down, merged at
  // distance `stride`; pair t compares positions i and i + stride.
  for (uint size = 2; size <= padded; size *= 2) {
    for (uint stride = size / 2; stride > 0; stride /= 2) {
      for (uint t = lid.x; t < padded / 2; t += threads.x) {
        uint i = 2 * stride * (t / stride) + t % stride, j = i + stride;
        bool up = (i & size) == 0;
        T vi = values[i], vj = values[j];
        uint ii = indices[i], ij = indices[j];
        if (before(vj, ij, vi, ii) == up) {
          values[i] = vj; values[j] = vi;
          indices[i] = ij; indices[j] = ii;
        }
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
    }
  }
  if (to_scratch != 0) {
    uint64_t base = uint64_t(group.y) * n + start;
    for (uint k = lid.x; k < count; k += threads.x) {
      scratch_values[base + k] = values[k];
      scratch_indices[base + k] = indices[k];
    }
    return;
  }
  device typename Output<T, arg>::type* dest =
      out + elem_to_loc(group.y, row_shape, out_row_strides, row_ndim);
  for (uint k = lid.x; k < count; k += threads.x)
    dest[elem_to_loc(k, red_shape, out_red_strides, red_ndim)] =
        Output<T, arg>::get(values[k], indices[k]);
}

// One merge pass over the scratch pair (rows x n): sorted runs of `width` -> runs of
// 2 width, into the other pair, or (`last`) the output (buffers 9-14 from
// common.row_layout(shape, (axis,), out)). Grid: (n, rows).
template <typename T, bool arg>
[[kernel]] void sort_merge(
    device const T* src_values [[buffer(0)]], device const uint* src_indices [[buffer(1)]],
    device T* dst_values [[buffer(2)]], device uint* dst_indices [[buffer(3)]],
    device typename Output<T, arg>::type* out [[buffer(4)]],
    constant uint& n [[buffer(5)]], constant uint& width [[buffer(6)]],
    constant uint& last [[buffer(7)]],
    constant int* red_shape [[buffer(8)]], constant int64_t* out_red_strides [[buffer(9)]],
    constant int& red_ndim [[buffer(10)]],
    constant int* row_shape [[buffer(11)]], constant int64_t* out_row_strides [[buffer(12)]],
    constant int& row_ndim [[buffer(13)]],
    uint3 pos [[thread_position_in_grid]]) {
  const uint k = pos.x;
  if (k >= n) return;
  const uint64_t base = uint64_t(pos.y) * n;
  const T value = src_values[base + k];
  const uint index = src_indices[base + k];
  const uint run = k / width, start = run * width;
  const uint partner = (run ^ 1u) * width;
  uint place = k;                            // a run without a partner stays
  if (partner < n) {
    const uint length = min(width, n - partner);
    uint lo = 0, hi = length;                // partner elements that order before this one
    while (lo < hi) {
      uint mid = (lo + hi) / 2;
      if (before(src_values[base + partner + mid], src_indices[base + partner + mid], value,
                 index))
        lo = mid + 1;
      else
        hi = mid;
    }
    place = min(start, partner) + (k - start) + lo;
  }
  if (last != 0) {
    device typename Output<T, arg>::type* dest =
        out + elem_to_loc(pos.y, row_shape, out_row_strides, row_ndim);
    dest[elem_to_loc(place, red_shape, out_red_strides, red_ndim)] =
        Output<T, arg>::get(value, index);
  } else {
    dst_values[base + place] = value;
    dst_indices[base + place] = index;
  }
}

// SearchSorted: a thread per value (of any layout: `value_loc`), a binary search of the
// ascending 1-D sequence (stride `seq_stride` elements) in the sort's order (NaNs last):
// the count of elements before the value (`right`: not after it).
template <typename T, bool right>
[[kernel]] void searchsorted(
    device const T* seq [[buffer(0)]], device uint* out [[buffer(1)]],
    device const T* values [[buffer(2)]], constant uint* sizes [[buffer(3)]],
    constant int* value_shape [[buffer(4)]], constant int64_t* value_strides [[buffer(5)]],
    constant int& value_ndim [[buffer(6)]], uint pos [[thread_position_in_grid]]) {
  const uint n = sizes[0], count = sizes[1], stride = sizes[2];
  if (pos >= count) return;
  const T v = values[elem_to_loc(pos, value_shape, value_strides, value_ndim)];
  uint lo = 0, hi = n;
  while (lo < hi) {
    const uint mid = lo + (hi - lo) / 2;
    const T s = seq[int64_t(mid) * stride];
    // left: s before v; right: v not before s
    if (right ? !value_less(v, s) : value_less(s, v)) lo = mid + 1; else hi = mid;
  }
  out[pos] = lo;
}
"""

#: The dtypes the sort kernels have versions for.
DTYPES = (ldt.bool_, ldt.int8, ldt.uint8, ldt.int16, ldt.uint16, ldt.int32, ldt.uint32,
          ldt.int64, ldt.uint64, ldt.float16, ldt.bfloat16, ldt.float32)

LIBRARY = Library("sorting", _SOURCE + "\n" + "".join(
    instantiate(f"{kernel}_{d.name}{'_arg' if arg else ''}", kernel, msl_type(d),
                "true" if arg else "false")
    for kernel in ("sort_block", "sort_merge") for d in DTYPES for arg in (False, True))
    + "".join(instantiate(f"searchsorted_{d.name}_{side}", "searchsorted", msl_type(d),
                          "true" if side == "right" else "false")
              for d in DTYPES for side in ("left", "right")))

_MERGE_THREADS = 256


def _u32(n: int) -> np.ndarray:
    return np.array([n], np.uint32)


def _sorted(kernel: str, primitive, inputs, run, arg: bool):
    """The row-wise sort of ``inputs[0]`` along ``primitive.axis``: values, or uint32
    indices (``arg``)."""
    x = bindable(inputs[0])
    d = ldt.from_numpy(x.dtype)
    if d not in DTYPES:
        raise unsupported(kernel, d, DTYPES)
    out = empty(run, x.shape, np.uint32 if arg else x.dtype)
    if out.size == 0:
        return out
    axis = primitive.axis % x.ndim
    name = f"{d.name}{'_arg' if arg else ''}"
    rows, n, layout = row_layout(x.shape, (axis,), x, out)
    blocks = -(-n // BLOCK)
    padded = 1 << max(0, (min(n, BLOCK) - 1).bit_length())
    threads = max(1, min(MAX_THREADGROUP, padded // 2))
    # One-element stand-ins for the buffers a dispatch does not touch (so that a GPU run
    # copies nothing for them).
    no_pair, no_out = (np.zeros(1, x.dtype), np.zeros(1, np.uint32)), np.zeros(1, out.dtype)
    if blocks == 1:
        run(Dispatch(LIBRARY, f"sort_block_{name}", [x, out, *no_pair, _u32(n), *layout, _u32(0)],
                     (threads, rows, 1), (threads, 1, 1)))
        return out
    # Sorted blocks into scratch, then merge passes between two scratch pairs.
    # (shared buffers on the GPU: the passes bind them in place, nothing copied back)
    pairs = [(empty(run, (rows, n), x.dtype), empty(run, (rows, n), np.uint32))
             for _ in range(2)]
    run(Dispatch(LIBRARY, f"sort_block_{name}",
                 [x, no_out, *pairs[0], _u32(n), *layout, _u32(1)],
                 (threads * blocks, rows, 1), (threads, 1, 1), writes=(2, 3)))
    _, _, out_layout = row_layout(out.shape, (axis,), out)
    width = BLOCK
    while width < n:
        last = 2 * width >= n
        src, dst = pairs
        run(Dispatch(LIBRARY, f"sort_merge_{name}",
                     [*src, *(no_pair if last else dst), out if last else no_out, _u32(n),
                      _u32(width), _u32(int(last)), *out_layout],
                     (n, rows, 1), (min(_MERGE_THREADS, n), 1, 1),
                     writes=(4,) if last else (2, 3)))
        pairs = [dst, src]
        width *= 2
    return out


def sort(primitive, inputs, run):
    """``Sort`` along ``axis`` on Metal (NaNs last): the sorted values."""
    return _sorted("sort", primitive, inputs, run, arg=False)


def argsort(primitive, inputs, run):
    """``ArgSort`` along ``axis`` on Metal: the uint32 indices of a stable sort."""
    return _sorted("argsort", primitive, inputs, run, arg=True)


def searchsorted(primitive, inputs, run):
    """``SearchSorted`` (inputs ``(sorted_sequence, values)``) on Metal: uint32 insertion
    indices of the values' shape, NumPy's ``searchsorted`` (NaNs last)."""
    seq, values = bindable(inputs[0]), bindable(inputs[1])
    d = ldt.from_numpy(seq.dtype)
    if d not in DTYPES or values.dtype != seq.dtype:
        raise unsupported("searchsorted", ldt.from_numpy(values.dtype), DTYPES)
    out = empty(run, values.shape, np.uint32)
    if out.size == 0:
        return out
    if seq.size >= 2 ** 32 or out.size >= 2 ** 32:
        raise UnsupportedDtype("Metal kernel searchsorted counts with 32-bit integers; "
                               "these arrays are past them.")
    stride = seq.strides[0] // seq.itemsize if seq.ndim and seq.size > 1 else 0
    rows, _, layout = row_layout(values.shape, (), values)
    run(Dispatch(LIBRARY, f"searchsorted_{d.name}_{primitive.side}", [
        seq if seq.size else np.zeros(1, seq.dtype), out, values,
        np.array([seq.size, out.size, stride], np.uint32), *layout[3:]],
        (out.size, 1, 1), (min(out.size, 256), 1, 1)))
    return out


def topk(primitive, inputs, run):
    """``TopK`` (the ``k`` largest along ``axis``, in no particular order) on Metal: the
    last ``k`` of the row-wise sort (ascending), a view of its output."""
    out = _sorted("topk", primitive, inputs, run, arg=False)
    axis = primitive.axis % out.ndim
    n = out.shape[axis]
    return out[(slice(None),) * axis + (slice(n - primitive.k, n),)]


def partition(primitive, inputs, run):
    """``Partition`` at ``kth`` along ``axis`` on Metal: the sorted values (a partition at
    every ``kth``; see the module docstring)."""
    return _sorted("partition", primitive, inputs, run, arg=False)


def argpartition(primitive, inputs, run):
    """``ArgPartition`` at ``kth`` along ``axis`` on Metal: a stable argsort's indices."""
    return _sorted("argpartition", primitive, inputs, run, arg=True)
