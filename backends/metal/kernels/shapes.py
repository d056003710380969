"""Metal kernels of the shapes op pack that compute data: one strided copy, many uses.

Every shape primitive whose CPU kernel copies (rather than returns a NumPy view) is a
few dispatches of one kernel, ``copy_<bytes>``: thread ``i`` reads element ``i`` (C
order over ``shape``) of a strided, possibly broadcast source and writes it to a
strided place in a C-contiguous output (``dst_offset`` + strides, in elements). The
kernel moves elements of 1, 2, 4 or 8 bytes (``uchar`` ``ushort`` ``uint``
``ulong``): a copy never looks at values, so one instantiation per element size
serves every dtype of that size.

* ``Contiguous`` — the source into the whole output (no dispatch when it is already
  C-contiguous, or F-contiguous and allowed: the CPU returns those as they are).
* ``Concatenate`` — one dispatch per input, each into its block of the output.
* ``Pad`` — the 0-d pad value broadcast over the output, then the input into the inside.
* ``SliceUpdate`` / ``DynamicSliceUpdate`` — the input into the output, then the update
  (broadcast) into the strided block; the dynamic block's start is read and checked
  on the host as the CPU kernel does (same error for a block that leaves the array).
* ``Diag`` — zeros, then the vector along diagonal ``k`` (stride ``n + 1``).
* ``View`` — a non-contiguous source copied to C order first, then reinterpreted.
* ``Reshape`` / ``Flatten`` / ``Unflatten`` — a view when NumPy can make one (no
  dispatch), else a C-order copy reshaped.

The view primitives (:data:`VIEWS`: ``Squeeze``, ``ExpandDims``, ``Transpose``,
``BroadcastTo``, ``Split``, ``AsStrided``, ``Diagonal``, ``DynamicSlice``, and the
indexing pack's ``Slice``) need no kernel: buffers are NumPy arrays over unified
memory, so the CPU's kernel returns a view sharing the bytes. The backend runs it as a
view (``lazyx.backends.metal``), not as a CPU fallback: nothing is copied or waited for.

Element types: every dtype Metal has (:data:`DTYPES`; float64 and complex64 have
none: they fall back, and the fallback refuses float64). Inputs of different dtypes
(a pad value or update not of the operand's dtype) fall back to the CPU kernel, which
casts.
"""

from __future__ import annotations

import numpy as np

from lazyx import dtypes as ldt
from lazyx.plugins import indexing as ix
from lazyx.plugins import shapes as sh

from .common import (empty, PRELUDE, Dispatch, Library, UnsupportedDtype, _collapse, bindable,
                     instantiate, unsupported)

__all__ = ["LIBRARY", "DTYPES", "KERNELS", "VIEWS", "COPIES_STRIDED", "copy_into", "storage", "contiguous_copy"]

#: The primitives whose CPU kernels return views of their first input (no kernel here).
VIEWS = frozenset((sh.Squeeze, sh.ExpandDims, sh.Transpose, sh.BroadcastTo, sh.Split,
                   sh.AsStrided, sh.Diagonal, sh.DynamicSlice, ix.Slice))
#: Those of :data:`VIEWS` whose CPU kernel copies a non-contiguous input first (AsStrided
#: views the elements in C order).
COPIES_STRIDED = frozenset((sh.AsStrided,))

_SOURCE = PRELUDE + r"""
// dst[dst_offset + loc(i, dst_strides)] = src[loc(i, src_strides)] for i < n, C order
// over `shape` (a src stride of 0 broadcasts).
template <typename S>
[[kernel]] void copy(
    device const S* src [[buffer(0)]], device S* dst [[buffer(1)]],
    constant uint& n [[buffer(2)]], constant int* shape [[buffer(3)]],
    constant int64_t* src_strides [[buffer(4)]], constant int64_t* dst_strides [[buffer(5)]],
    constant int& ndim [[buffer(6)]], constant int64_t& dst_offset [[buffer(7)]],
    uint index [[thread_position_in_grid]]) {
  if (index >= n) return;
  dst[dst_offset + elem_to_loc(index, shape, dst_strides, ndim)] =
      src[elem_to_loc(index, shape, src_strides, ndim)];
}
"""

#: Element size in bytes -> the MSL type that moves it.
STORAGE = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}
#: The dtypes the copy kernels move (all that Metal has).
DTYPES = tuple(ldt.to_dtype(n) for n in ("bool", "int8", "uint8", "int16", "uint16", "int32",
                                         "uint32", "int64", "uint64", "float16", "bfloat16",
                                         "float32"))

LIBRARY = Library("shapes", _SOURCE + "\n" + "".join(
    instantiate(f"copy_{size}", "copy", t) for size, t in STORAGE.items()))

_GROUP = 256


def storage(kernel: str, *arrays) -> int:
    """The element size the kernels move ``arrays`` (one dtype) by; an
    :class:`~.common.UnsupportedDtype` for a dtype Metal lacks or mixed dtypes."""
    for a in arrays:
        d = ldt.from_numpy(a.dtype)
        if d not in DTYPES:
            raise unsupported(kernel, d, DTYPES)
        if a.dtype != arrays[0].dtype:
            raise UnsupportedDtype(f"Metal kernel {kernel} moves elements of one dtype; its "
                                   f"inputs have {arrays[0].dtype} and {a.dtype}. Run the "
                                   f"primitive on another backend (the CPU's), which casts.")
    return arrays[0].dtype.itemsize


def _elements(a: np.ndarray, view: np.ndarray) -> tuple:
    """``(offset, strides)`` in elements of ``view``, a view into C-contiguous ``a``."""
    item = a.itemsize
    return ((view.__array_interface__["data"][0] - a.__array_interface__["data"][0]) // item,
            [s // item for s in view.strides])


def copy_into(run, out: np.ndarray, src, shape=None, offset: int = 0, strides=None) -> None:
    """Copy ``src`` (any strides; broadcast to ``shape``) into C-contiguous ``out`` at
    element ``offset`` with element ``strides`` (default: all of ``out``) — one dispatch."""
    shape = tuple(out.shape if shape is None else shape)
    strides = list(np.array(out.strides) // out.itemsize if strides is None else strides)
    n = int(np.prod(shape, dtype=np.int64))
    if n == 0:
        return
    src = bindable(np.broadcast_to(bindable(src), shape))
    dims, (s_st, d_st) = _collapse(shape, [s // src.itemsize for s in src.strides], strides)
    run(Dispatch(LIBRARY, f"copy_{out.itemsize}",
                 [src, out, np.array([n], np.uint32), np.array(dims or [1], np.int32),
                  np.array(s_st or [0], np.int64), np.array(d_st or [0], np.int64),
                  np.array([len(dims)], np.int32), np.array([offset], np.int64)],
                 (-(-n // _GROUP) * _GROUP, 1, 1), (_GROUP, 1, 1)))


def copy_view(run, out: np.ndarray, view: np.ndarray, src) -> None:
    """Copy ``src`` into ``view``, a (writable, strided) view of C-contiguous ``out``."""
    offset, strides = _elements(out, view)
    copy_into(run, out, src, view.shape, offset, strides)


def contiguous_copy(run, x: np.ndarray, kernel: str = "copy") -> np.ndarray:
    """``x`` copied to a new C-contiguous array on the GPU."""
    storage(kernel, x)
    out = empty(run, x.shape, x.dtype)
    copy_into(run, out, x)
    return out


def contiguous(primitive, inputs, run):
    """``Contiguous``: ``x`` as it is when C-contiguous (or F-contiguous and allowed), else
    a C-order copy."""
    x = inputs[0]
    storage("copy", x)
    if x.flags.c_contiguous or (primitive.allow_col_major and x.flags.f_contiguous):
        return x
    return contiguous_copy(run, x)


def concatenate(primitive, inputs, run):
    """``Concatenate``: each input into its block of the output along ``axis``."""
    storage("copy", *inputs)
    ax = primitive.axis % inputs[0].ndim
    out = empty(run, primitive.output_shapes(inputs)[0], inputs[0].dtype)
    key = [slice(None)] * out.ndim
    start = 0
    for x in inputs:
        key[ax] = slice(start, start + x.shape[ax])
        copy_view(run, out, out[tuple(key)], x)
        start += x.shape[ax]
    return out


def pad(primitive, inputs, run):
    """``Pad``: the pad value everywhere, then ``x`` inside."""
    x, v = inputs
    storage("copy", x, v)
    out = empty(run, primitive.output_shapes(inputs)[0], x.dtype)
    inner = [slice(None)] * x.ndim
    for ax, lo in zip(primitive.axes, primitive.low_pad_size):
        inner[ax] = slice(lo, lo + x.shape[ax])
    copy_into(run, out, v)
    copy_view(run, out, out[tuple(inner)], x)
    return out


def slice_update(primitive, inputs, run):
    """``SliceUpdate``: ``x`` with the strided block ``primitive._key`` set to the update."""
    x, u = inputs
    storage("copy", x, u)
    out = contiguous_copy(run, x)
    copy_view(run, out, out[primitive._key], u)
    return out


def dynamic_slice_update(primitive, inputs, run):
    """``DynamicSliceUpdate``: ``x`` with the block at ``start`` set to the update."""
    x, u, start = inputs
    storage("copy", x, u)
    block = sh._update_block(x.shape, u.shape, primitive.axes)
    # The start is data the CPU kernel checks on the host: the same check, the same error.
    starts = sh._check_starts(start, primitive.axes, x.shape, block, primitive.name)
    out = contiguous_copy(run, x)
    key = [slice(0, b) for b in block]
    for ax, b in zip(primitive.axes, starts):
        key[ax] = slice(b, b + block[ax])
    copy_view(run, out, out[tuple(key)], u.reshape(block))
    return out


def diag(primitive, inputs, run):
    """``Diag``: an ``n x n`` matrix of zeros with ``x`` along diagonal ``k``."""
    x = inputs[0]
    storage("copy", x)
    n = x.shape[0] + abs(primitive.k)
    out = empty(run, (n, n), x.dtype)
    copy_into(run, out, np.zeros((), x.dtype))
    k = primitive.k
    copy_into(run, out, x, x.shape, k if k >= 0 else -k * n, [n + 1])
    return out


def view(primitive, inputs, run):
    """``View``: ``x``'s bytes as another dtype (copied to C order first when needed)."""
    x = inputs[0]
    if x.ndim and not x.flags.c_contiguous:
        x = contiguous_copy(run, x)
    else:
        storage("copy", x)
    return x.view(primitive.dtype.np)


def _reshaping(shape_of):
    """A reshape launcher: NumPy's view when it can make one, else a C-order copy."""
    def launcher(primitive, inputs, run):
        x = inputs[0]
        storage("copy", x)
        target = shape_of(primitive, x)
        try:
            return x.reshape(target, copy=False)
        except ValueError:   # not expressible as a view of these strides
            return contiguous_copy(run, x).reshape(target)
    return launcher


KERNELS = {
    sh.Contiguous: contiguous,
    sh.Concatenate: concatenate,
    sh.Pad: pad,
    sh.DynamicSliceUpdate: dynamic_slice_update,
    sh.Diag: diag,
    sh.View: view,
    sh.Reshape: _reshaping(lambda p, x: p.target),
    sh.Flatten: _reshaping(lambda p, x: sh._flattened(x.shape, p.start_axis, p.end_axis)),
    sh.Unflatten: _reshaping(lambda p, x: x.shape[:p.axis] + p.target + x.shape[p.axis + 1:]),
}
