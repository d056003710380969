"""Metal kernels of the indexing op pack: gathers and scatters with bounds checks.

Every gather and scatter is planned on the host as one *indexed block*: NumPy's
advanced indexing lays the result out as ``rest`` dimensions (slices, new axes, the
axes no entry names) around ``B``, the broadcast shape of the index arrays. A thread
handles one ``(r, b)`` pair (grid ``(rest, B)``): the *indexed* array's element is at

    base + loc(r, rest strides) + loc(b, B strides) + sum_k wrap(index_k[b]) * stride_k

(``base``: the slices' starts and the integer entries; ``stride_k``: the stride of the
axis index array ``k`` addresses), the *other* array's at ``loc(r, ...) + loc(b, ...)``.
Index arrays (up to four, any of int8 to int64 and uint8 to uint32, each its own
dtype) are read through their own broadcast strides; a negative index wraps once, as
NumPy's. An index still outside its axis is never used: the thread raises the
``error`` flag instead, and the launcher raises the CPU kernel's
:class:`~lazyx.errors.IndexOutOfRangeError` (it runs the CPU kernel on the same
buffers to get NumPy's exact words; nothing is written).

* ``Gather`` (``a[idx]``, ``take``) and ``GatherAxis`` (``take_along_axis``: B is the
  output's shape, the operand's other axes broadcast through its B strides):
  ``gather_<bytes>`` moves elements; an empty output with non-empty indices still
  checks them (``check_indices``), as NumPy does.
* ``Scatter`` and ``ScatterAxis`` (``put_along_axis``): the operand copied to the
  output (:func:`.shapes.copy_into`), then two passes. ``scatter_elect`` gives each
  written position an *owner* with an atomic ``max`` (assignment: the last update in
  C order wins, as NumPy's) or ``min`` (``add prod max min``: the first) and counts
  its updates with an atomic add. ``scatter_<mode>`` then lets each owner write:
  assignment its own value; a reduction folds the position's updates in index order
  (the owner walks forward until it has met ``count`` of them), so repeated
  positions combine in NumPy's order with NumPy's rounding (``np.add.at`` on float16
  rounds after each step; so does the kernel) — deterministic, where float atomics
  would not be. A position updated once costs one step; a walk is as long as the
  distance between a position's first and last update.

Dtypes: gathers and assignments move elements of 1, 2, 4 or 8 bytes (every dtype
Metal has); reductions are instantiated for :data:`REDUCE_DTYPES`, accumulating
float16 and bfloat16 in float. Other dtypes raise :class:`~.common.UnsupportedDtype`
before anything runs (the backend falls back to the CPU kernel).
"""

from __future__ import annotations

import numpy as np

from lazyx import dtypes as ldt
from lazyx.errors import IndexOutOfRangeError
from lazyx.plugins import indexing as ix

from . import shapes
from .common import empty, PRELUDE, Dispatch, Library, _collapse, bindable, instantiate, msl_type, \
    unsupported

__all__ = ["LIBRARY", "KERNELS", "REDUCE_DTYPES", "INDEX_DTYPES", "MAX_INDEX_ARRAYS"]

#: How many index arrays one kernel reads (more fall back to the CPU).
MAX_INDEX_ARRAYS = 4
#: Index dtype -> the code ``load_index`` reads it by (all convert to int64 exactly).
INDEX_DTYPES = {"int32": 0, "int64": 1, "uint32": 2, "int16": 3, "uint16": 4, "int8": 5,
                "uint8": 6}
#: The dtypes scatter's reductions (``add prod max min``) have kernels for.
REDUCE_DTYPES = tuple(ldt.to_dtype(n) for n in ("bool", "int32", "uint32", "float16",
                                                "bfloat16", "float32"))
_OPS = {"add": "ScatterAdd", "prod": "ScatterProd", "max": "ScatterMax", "min": "ScatterMin"}
_HALF = (ldt.float16, ldt.bfloat16)

# The parameters every kernel of the library takes, in this order (see _layout).
_PARAMS = """
    device const S* data [[buffer(0)]], device S* out [[buffer(1)]],
    device uint* error [[buffer(2)]],
    device const uchar* i0 [[buffer(3)]], device const uchar* i1 [[buffer(4)]],
    device const uchar* i2 [[buffer(5)]], device const uchar* i3 [[buffer(6)]],
    constant uint* counts [[buffer(7)]],
    constant int* rest_shape [[buffer(8)]], constant int& rest_ndim [[buffer(9)]],
    constant int* b_shape [[buffer(10)]], constant int& b_ndim [[buffer(11)]],
    constant int64_t* indexed_rest [[buffer(12)]], constant int64_t* indexed_b [[buffer(13)]],
    constant int64_t* other_rest [[buffer(14)]], constant int64_t* other_b [[buffer(15)]],
    constant int64_t* index_strides [[buffer(16)]], constant int64_t* axes [[buffer(17)]],
    constant int* index_kinds [[buffer(18)]], constant int& n_index [[buffer(19)]],
    constant int64_t& base [[buffer(20)]]"""

# Arguments of index_offset, as the kernels pass them.
_INDEX_ARGS = "i0, i1, i2, i3, b_shape, b_ndim, index_strides, axes, index_kinds, n_index"

_SOURCE = PRELUDE + r"""
// Element `i` of an index array of kind `kind` (the INDEX_DTYPES codes) as int64.
inline int64_t load_index(device const uchar* p, int kind, int64_t i) {
  switch (kind) {
    case 0: return int64_t(((device const int*)p)[i]);
    case 1: return int64_t(((device const long*)p)[i]);
    case 2: return int64_t(((device const uint*)p)[i]);
    case 3: return int64_t(((device const short*)p)[i]);
    case 4: return int64_t(((device const ushort*)p)[i]);
    case 5: return int64_t(((device const char*)p)[i]);
    default: return int64_t(((device const uchar*)p)[i]);
  }
}

// Add the index arrays' offset at index position `b` to `offset`; false when an index
// is outside its axis (after one wrap of a negative index, as NumPy).
inline bool index_offset(uint b, device const uchar* i0, device const uchar* i1,
                         device const uchar* i2, device const uchar* i3,
                         constant int* b_shape, int b_ndim, constant int64_t* index_strides,
                         constant int64_t* axes, constant int* index_kinds, int n_index,
                         thread int64_t& offset) {
  for (int k = 0; k < n_index; ++k) {
    device const uchar* p = k == 0 ? i0 : k == 1 ? i1 : k == 2 ? i2 : i3;
    int64_t i = load_index(p, index_kinds[k],
                           elem_to_loc(b, b_shape, index_strides + k * b_ndim, b_ndim));
    int64_t n = axes[2 * k];
    if (i < 0) i += n;
    if (i < 0 || i >= n) return false;
    offset += i * axes[2 * k + 1];
  }
  return true;
}

// out[other(r, b)] = data[base + indexed(r, b) + indices]; grid (rest, B).
template <typename S>
[[kernel]] void gather(PARAMS,
    uint2 pos [[thread_position_in_grid]]) {
  uint r = pos.x, b = pos.y;
  if (r >= counts[0] || b >= counts[1]) return;
  int64_t src = base + elem_to_loc(r, rest_shape, indexed_rest, rest_ndim) +
                elem_to_loc(b, b_shape, indexed_b, b_ndim);
  int64_t dst = elem_to_loc(r, rest_shape, other_rest, rest_ndim) +
                elem_to_loc(b, b_shape, other_b, b_ndim);
  if (!index_offset(b, INDEX_ARGS, src)) {
    error[0] = 1u;
    out[dst] = S(0);
    return;
  }
  out[dst] = data[src];
}

// Only the bounds check (an empty result whose indices NumPy still checks); grid B.
template <typename S>
[[kernel]] void check_indices(PARAMS,
    uint b [[thread_position_in_grid]]) {
  if (b >= counts[1]) return;
  int64_t offset = 0;
  if (!index_offset(b, INDEX_ARGS, offset)) error[0] = 1u;
}

// The position in `out` update (r, b) goes to, or -1 when an index is out of range.
inline int64_t scatter_target(uint r, uint b, constant int* rest_shape, int rest_ndim,
                              constant int64_t* indexed_rest, constant int64_t* indexed_b,
                              int64_t base, device const uchar* i0, device const uchar* i1,
                              device const uchar* i2, device const uchar* i3,
                              constant int* b_shape, int b_ndim,
                              constant int64_t* index_strides, constant int64_t* axes,
                              constant int* index_kinds, int n_index) {
  int64_t t = base + elem_to_loc(r, rest_shape, indexed_rest, rest_ndim) +
              elem_to_loc(b, b_shape, indexed_b, b_ndim);
  return index_offset(b, INDEX_ARGS, t) ? t : -1;
}

// Pass 1: each written position's owner (the last update when `last`, else the first)
// and its number of updates.
template <typename S, bool last>
[[kernel]] void scatter_elect(PARAMS,
    device atomic_int* owner [[buffer(21)]], device atomic_uint* count [[buffer(22)]],
    uint2 pos [[thread_position_in_grid]]) {
  uint r = pos.x, b = pos.y;
  if (r >= counts[0] || b >= counts[1]) return;
  int64_t t = scatter_target(r, b, rest_shape, rest_ndim, indexed_rest, indexed_b, base,
                             INDEX_ARGS);
  if (t < 0) {
    error[0] = 1u;
    return;
  }
  if (last) atomic_fetch_max_explicit(&owner[t], int(b), memory_order_relaxed);
  else atomic_fetch_min_explicit(&owner[t], int(b), memory_order_relaxed);
  atomic_fetch_add_explicit(&count[t], 1u, memory_order_relaxed);
}

// How the updates of one position combine with what is there (NumPy's ufuncs; a NaN
// wins max and min); U is the type the arithmetic runs in, rounded to T each step.
template <typename T, typename U> struct ScatterAssign {
  static T apply(T a, T b) { return b; }
};
template <typename T, typename U> struct ScatterAdd {
  static T apply(T a, T b) { return T(U(a) + U(b)); }
};
template <typename T, typename U> struct ScatterProd {
  static T apply(T a, T b) { return T(U(a) * U(b)); }
};
template <typename T, typename U> struct ScatterMax {
  static T apply(T a, T b) { U x = U(a), y = U(b); return T((x > y || x != x) ? x : y); }
};
template <typename T, typename U> struct ScatterMin {
  static T apply(T a, T b) { U x = U(a), y = U(b); return T((x < y || x != x) ? x : y); }
};

// Pass 2: the owner of each position writes it: its own update (`combine` false), or
// the fold of the position's updates in index order, starting from out's value.
template <typename S, typename Op, bool combine>
[[kernel]] void scatter(PARAMS,
    device const int* owner [[buffer(21)]], device const uint* count [[buffer(22)]],
    uint2 pos [[thread_position_in_grid]]) {
  uint r = pos.x, b = pos.y;
  if (r >= counts[0] || b >= counts[1]) return;
  int64_t t = scatter_target(r, b, rest_shape, rest_ndim, indexed_rest, indexed_b, base,
                             INDEX_ARGS);
  if (t < 0 || owner[t] != int(b)) return;
  int64_t r_loc = elem_to_loc(r, rest_shape, other_rest, rest_ndim);
  S acc = Op::apply(out[t], data[r_loc + elem_to_loc(b, b_shape, other_b, b_ndim)]);
  if (combine) {
    uint left = count[t] - 1;
    for (uint b2 = b + 1; left > 0 && b2 < counts[1]; ++b2) {
      if (scatter_target(r, b2, rest_shape, rest_ndim, indexed_rest, indexed_b, base,
                         INDEX_ARGS) != t) continue;
      acc = Op::apply(acc, data[r_loc + elem_to_loc(b2, b_shape, other_b, b_ndim)]);
      --left;
    }
  }
  out[t] = acc;
}
""".replace("PARAMS", _PARAMS.strip()).replace("INDEX_ARGS", _INDEX_ARGS)


def _instantiations() -> str:
    lines = []
    for size, s in shapes.STORAGE.items():
        lines.append(instantiate(f"gather_{size}", "gather", s))
        lines.append(instantiate(f"scatter_assign_{size}", "scatter", s,
                                 f"ScatterAssign<{s}, {s}>", "false"))
    lines.append(instantiate("check_indices", "check_indices", "uchar"))
    for which, last in (("last", "true"), ("first", "false")):
        lines.append(instantiate(f"scatter_elect_{which}", "scatter_elect", "uchar", last))
    for op, functor in _OPS.items():
        for d in REDUCE_DTYPES:
            t = msl_type(d)
            u = "float" if d in _HALF else t
            lines.append(instantiate(f"scatter_{op}_{d.name}", "scatter", t,
                                     f"{functor}<{t}, {u}>", "true"))
    return "".join(lines)


LIBRARY = Library("indexing", _SOURCE + "\n" + _instantiations())

_GROUP = (32, 8, 1)


# -- planning ---------------------------------------------------------------------------------
class _Block:
    """An indexed block (strides in elements): the ``rest`` and ``B`` dimensions, the
    indexed array's base offset and strides over them, the index arrays and the
    ``(size, stride)`` of the axis each addresses, and the block's dimension order
    (``("rest", j)`` or ``("b", d)``: NumPy's layout of the result)."""

    def __init__(self, rest, rest_strides, b_shape, b_strides, base, indices, axes, order):
        self.rest, self.rest_strides = list(rest), list(rest_strides)
        self.b_shape, self.b_strides = tuple(b_shape), list(b_strides)
        self.base, self.indices, self.axes, self.order = base, indices, axes, order

    @property
    def shape(self) -> tuple:
        """The block's shape (a gather's output; what a scatter's update broadcasts to)."""
        return tuple(self.rest[j] if kind == "rest" else self.b_shape[j]
                     for kind, j in self.order)

    def split(self, strides) -> tuple:
        """Strides over the block's dimensions -> ``(rest strides, B strides)``."""
        rest, b = [0] * len(self.rest), [0] * len(self.b_shape)
        for (kind, j), s in zip(self.order, strides):
            (rest if kind == "rest" else b)[j] = s
        return rest, b


def _elements(a) -> list:
    return [s // a.itemsize for s in a.strides]


def _c_strides(shape) -> list:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return strides[::-1]


def _key_block(primitive, x_shape, x_strides, inputs):
    """The block of ``x[key]`` for Gather's and Scatter's entries (their ``_template`` and
    ``_places``), or None when an integer entry is outside its axis."""
    array_at = dict(primitive._places)
    rest, rest_strides, adv, axes, indices = [], [], [], [], []
    base, axis, first = 0, 0, None
    for pos, t in enumerate(primitive._template):
        if pos in array_at or (t is not None and not isinstance(t, slice)):
            # An advanced index (an array, or an int beside arrays: NumPy's rule).
            n, st = x_shape[axis], x_strides[axis]
            first = len(rest) if first is None else first
            adv.append(pos)
            if pos in array_at:
                indices.append(inputs[array_at[pos]])
                axes.append((n, st))
            else:
                i = t + n if t < 0 else t
                if not 0 <= i < n:
                    return None
                base += i * st
            axis += 1
        elif t is None:   # a new axis
            rest.append(1)
            rest_strides.append(0)
        else:
            n, st = x_shape[axis], x_strides[axis]
            start, stop, step = t.indices(n)   # a replay at another shape clips, as NumPy
            rest.append(len(range(start, stop, step)))
            rest_strides.append(step * st)
            base += start * st
            axis += 1
    for a in range(axis, len(x_shape)):   # axes the key does not name: whole
        rest.append(x_shape[a])
        rest_strides.append(x_strides[a])
    b_shape = np.broadcast_shapes(*(i.shape for i in indices))
    # NumPy puts B where the advanced indices are when they are neighbours, else first.
    first = first if all(q - p == 1 for p, q in zip(adv, adv[1:])) else 0
    order = ([("rest", j) for j in range(first)] + [("b", d) for d in range(len(b_shape))]
             + [("rest", j) for j in range(first, len(rest))])
    return _Block(rest, rest_strides, b_shape, [0] * len(b_shape), base, indices, axes, order)


def _check_indices(kernel: str, block: _Block) -> None:
    """UnsupportedDtype (the CPU runs it) for index arrays the kernels cannot read."""
    supported = [ldt.to_dtype(n) for n in INDEX_DTYPES]
    if len(block.indices) > MAX_INDEX_ARRAYS:
        raise unsupported(f"{kernel} with {len(block.indices)} index arrays (it reads up to "
                          f"{MAX_INDEX_ARRAYS})", block.indices[0].dtype, supported)
    for i in block.indices:
        if i.dtype.name not in INDEX_DTYPES:
            raise unsupported(f"{kernel} (index arrays)", i.dtype, supported)


def _buffers(block: _Block, data, out, other_strides, error, extra=()) -> tuple:
    """``(buffers, (rest count, B count))`` of one dispatch (``_PARAMS``'s order), with
    ``other_strides`` (over the block's dimensions) for the array not indexed."""
    idx = [bindable(i) for i in block.indices]
    idx_b = [_elements(np.broadcast_to(i, block.b_shape)) for i in idx]
    other_rest, other_b = block.split(other_strides)
    rest, (r_indexed, r_other) = _collapse(block.rest, block.rest_strides, other_rest)
    b_dims, (b_indexed, b_other, *idx_b) = _collapse(block.b_shape, block.b_strides, other_b,
                                                      *idx_b)
    counts = (int(np.prod(block.rest, dtype=np.int64)),
              int(np.prod(block.b_shape, dtype=np.int64)))
    unused = [error] * (MAX_INDEX_ARRAYS - len(idx))   # any buffer: never read
    return [data, out, error, *idx, *unused, np.array(counts, np.uint32),
            np.array(rest or [1], np.int32), np.array([len(rest)], np.int32),
            np.array(b_dims or [1], np.int32), np.array([len(b_dims)], np.int32),
            _i64(r_indexed), _i64(b_indexed), _i64(r_other), _i64(b_other),
            _i64([s for st in idx_b for s in st]), _i64([v for a in block.axes for v in a]),
            np.array([INDEX_DTYPES[i.dtype.name] for i in idx] or [0], np.int32),
            np.array([len(idx)], np.int32), np.array([block.base], np.int64), *extra], counts


def _i64(values) -> np.ndarray:
    return np.array(values or [0], np.int64)   # a bound buffer is never empty


def _grid(counts) -> tuple:
    return (-(-counts[0] // _GROUP[0]) * _GROUP[0], -(-counts[1] // _GROUP[1]) * _GROUP[1], 1)


def _check_only(run, buffers, counts, error) -> None:
    """Bounds-check the index arrays alone (nothing to read or write: NumPy still checks)."""
    buffers = [error, error, *buffers[2:]]
    run(Dispatch(LIBRARY, "check_indices", buffers[:21], (-(-counts[1] // 256) * 256, 1, 1),
                 (256, 1, 1), writes=(2,)))


def _out_of_range(primitive, inputs) -> IndexOutOfRangeError:
    """The CPU kernel's IndexOutOfRangeError for these inputs (NumPy's own words)."""
    from lazyx.backends.cpu.kernels import indexing as cpu_indexing  # the error path only
    try:
        cpu_indexing.KERNELS[type(primitive)](primitive, list(inputs))
    except IndexOutOfRangeError as e:
        return e
    return IndexOutOfRangeError(f"[{primitive.name}] An index array holds a position outside "
                                f"the array of shape {inputs[0].shape}.")


# -- gathers ----------------------------------------------------------------------------------
def _gather(primitive, inputs, run, x, block: _Block):
    kernel = f"gather_{x.itemsize}"
    shapes.storage(kernel, x)
    _check_indices(kernel, block)
    out = empty(run, block.shape, x.dtype)
    error = np.zeros(1, np.uint32)
    buffers, counts = _buffers(block, x, out, _c_strides(out.shape), error)
    if out.size:
        run(Dispatch(LIBRARY, kernel, buffers, _grid(counts), _GROUP, writes=(1, 2)))
    elif counts[1]:
        _check_only(run, buffers, counts, error)
    if error[0]:
        raise _out_of_range(primitive, inputs)
    return out


def gather(primitive, inputs, run):
    """``Gather`` (``a[idx]``, ``take``: NumPy's advanced indexing) on Metal."""
    x = bindable(inputs[0])
    block = _key_block(primitive, x.shape, _elements(x), inputs)
    if block is None:
        raise _out_of_range(primitive, inputs)
    return _gather(primitive, inputs, run, x, block)


def gather_axis(primitive, inputs, run):
    """``GatherAxis`` (``take_along_axis``) on Metal: B is the output's shape; ``a``'s
    other axes broadcast against the indices through its B strides."""
    x, idx = bindable(inputs[0]), inputs[1]
    ax = primitive.axis % x.ndim
    shape = primitive.output_shapes(inputs)[0]
    spread = list(shape)
    spread[ax] = x.shape[ax]
    strides = _elements(np.broadcast_to(x, spread))
    axis = (x.shape[ax], strides[ax])
    strides[ax] = 0
    block = _Block([], [], shape, strides, 0, [idx], [axis],
                   [("b", d) for d in range(len(shape))])
    return _gather(primitive, inputs, run, x, block)


# -- scatters ---------------------------------------------------------------------------------
def _scatter(primitive, inputs, run, x, v, block: _Block, mode):
    """``x`` copied, then ``v`` (broadcast to the block) written at it (``mode``: None
    assigns, else ``add prod max min``). ``block`` indexes ``x``'s C-order copy."""
    d = ldt.from_numpy(x.dtype)
    if mode is None:
        kernel = f"scatter_assign_{x.itemsize}"
        shapes.storage(kernel, x, v)
    else:
        kernel = f"scatter_{mode}_{d.name}"
        if d not in REDUCE_DTYPES or v.dtype != x.dtype:
            raise unsupported(f"scatter_{mode}", d if d not in REDUCE_DTYPES else v.dtype,
                              REDUCE_DTYPES)
    _check_indices(kernel, block)
    target = block.shape
    while v.ndim > len(target) and v.shape[0] == 1:   # NumPy drops a value's leading 1s
        v = v[0]
    v = bindable(v)
    out = shapes.contiguous_copy(run, x)
    error = np.zeros(1, np.uint32)
    first = np.iinfo(np.int32).max
    owner = np.full(max(out.size, 1), -1 if mode is None else first, np.int32)
    count = np.zeros(max(out.size, 1), np.uint32)
    buffers, counts = _buffers(block, v, out, _elements(np.broadcast_to(v, target)), error,
                               (owner, count))
    if counts[0] and counts[1]:
        elect = "scatter_elect_last" if mode is None else "scatter_elect_first"
        run(Dispatch(LIBRARY, elect, buffers, _grid(counts), _GROUP, writes=(2, 21, 22)))
        if error[0]:
            raise _out_of_range(primitive, inputs)
        run(Dispatch(LIBRARY, kernel, buffers, _grid(counts), _GROUP, writes=(1,)))
    elif counts[1]:
        _check_only(run, buffers, counts, error)
        if error[0]:
            raise _out_of_range(primitive, inputs)
    return out


def scatter(primitive, inputs, run):
    """``Scatter`` (``a[idx] = v``, ``a.at[idx].add(v)`` ...) on Metal."""
    x, v = inputs[0], inputs[1]
    block = _key_block(primitive, x.shape, _c_strides(x.shape), inputs)
    if block is None:
        raise _out_of_range(primitive, inputs)
    return _scatter(primitive, inputs, run, x, v, block, primitive.reduce)


def scatter_axis(primitive, inputs, run):
    """``ScatterAxis`` (``put_along_axis``: the last write wins) on Metal: indices and
    values broadcast together along the axis, and to ``a``'s sizes elsewhere."""
    x, idx, v = inputs
    ax = primitive.axis % x.ndim
    vs = (1,) * (x.ndim - v.ndim) + v.shape
    full = x.shape[:ax] + np.broadcast_shapes((idx.shape[ax],), (vs[ax],)) + x.shape[ax + 1:]
    strides = _c_strides(x.shape)
    axis = (x.shape[ax], strides[ax])
    strides[ax] = 0
    block = _Block([], [], full, strides, 0, [np.broadcast_to(idx, full)], [axis],
                   [("b", d) for d in range(len(full))])
    return _scatter(primitive, inputs, run, x, np.broadcast_to(v, full), block, None)


KERNELS = {
    ix.Gather: gather,
    ix.GatherAxis: gather_axis,
    ix.Scatter: scatter,
    ix.ScatterAxis: scatter_axis,
    ix.SliceUpdate: shapes.slice_update,
}
