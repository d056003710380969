"""NumPy kernels of the shapes op pack.

Most return views of their input (reshape, transpose, broadcast, split, diagonal,
strided and typed views): buffers are immutable, so sharing memory is safe.
"""

import numpy as np

from lazyx.errors import IndexOutOfRangeError
from lazyx.plugins import shapes as sh

_as_strided = np.lib.stride_tricks.as_strided


def _reshape(p, ins):
    return ins[0].reshape(p.target)  # ``-1`` kept: a shapeless compile replays it


# Squeeze and ExpandDims as ndarray methods rather than NumPy's Python-level functions:
# in a training step a small node runs with the interpreter's state cold (the products
# before it evicted it), and np.expand_dims then took ~18 µs against ~7 for a reshape.
def _squeeze(p, ins):
    return ins[0].squeeze(axis=p.axes)


def _expand_dims(p, ins):
    return ins[0].reshape(sh._expanded(ins[0].shape, p.axes))


def _flatten(p, ins):
    x = ins[0]
    return x.reshape(sh._flattened(x.shape, p.start_axis, p.end_axis))


def _unflatten(p, ins):
    x = ins[0]
    s = x.shape
    return x.reshape(s[:p.axis] + p.target + s[p.axis + 1:])


def _broadcast_to(p, ins):
    try:
        return np.broadcast_to(ins[0], p.shape)
    except ValueError:  # a shapeless compile's replay: the shape rule's broadcast (as MLX)
        return np.broadcast_to(ins[0], np.broadcast_shapes(ins[0].shape, p.shape))


def _concatenate(p, ins):
    return np.concatenate(ins, axis=p.axis)


def _split(p, ins):
    return tuple(np.split(ins[0], list(p.indices), axis=p.axis))


def _pad(p, ins):
    x, v = ins
    shape = list(x.shape)
    inner = [slice(None)] * x.ndim
    for ax, lo, hi in zip(p.axes, p.low_pad_size, p.high_pad_size):
        shape[ax] += lo + hi
        inner[ax] = slice(lo, lo + x.shape[ax])
    out = np.empty_like(x, shape=shape)  # a CuPy array for CuPy inputs (cuda backend)
    out[...] = v
    out[tuple(inner)] = x
    return out


def _starts(p, start, a_shape, sizes):
    """Wrapped start positions; raise if a block leaves the array (MLX reads out of bounds)."""
    return sh._check_starts(start, p.axes, a_shape, sizes, p.name)


def _dynamic_slice(p, ins):
    x, start = ins
    key = [slice(0, s) for s in p.slice_size]
    for ax, b in zip(p.axes, _starts(p, start, x.shape, p.slice_size)):
        key[ax] = slice(b, b + p.slice_size[ax])
    return x[tuple(key)]


def _dynamic_slice_update(p, ins):
    x, u, start = ins
    block = sh._update_block(x.shape, u.shape, p.axes)
    key = [slice(0, b) for b in block]
    for ax, b in zip(p.axes, _starts(p, start, x.shape, block)):
        key[ax] = slice(b, b + block[ax])
    out = x.copy()
    out[tuple(key)] = u
    return out


def as_strided_kernel(as_strided):
    """The AsStrided kernel over ``as_strided(flat, shape, strides)`` (NumPy's, read-only,
    or CuPy's): a strided view of the input's elements in C order."""
    def kernel(p, ins):
        x = ins[0]
        if 0 in p.shape:
            return np.empty_like(x, shape=p.shape)
        flat = x.reshape(-1)  # C order: a view when contiguous, else a copy
        if not (0 <= p.offset < flat.size):
            raise IndexOutOfRangeError(f"[as_strided] offset {p.offset} is outside an array "
                                       f"of {flat.size} elements.")
        # The op checks this too, but a node may come from elsewhere (a function file):
        # the view must never reach memory outside the input.
        low = high = p.offset
        for d, st in zip(p.shape, p.strides):
            if st > 0:
                high += (d - 1) * st
            else:
                low += (d - 1) * st
        if low < 0 or high >= flat.size:
            raise IndexOutOfRangeError(
                f"[as_strided] shape {p.shape}, strides {p.strides} and offset {p.offset} "
                f"reach elements {low} to {high} of an array of {flat.size} elements.")
        item = flat.itemsize
        return as_strided(flat[p.offset:], p.shape, tuple(s * item for s in p.strides))
    return kernel


def _view(p, ins):
    x = ins[0]
    if x.ndim == 0:
        return x.view(p.dtype.np)
    return np.ascontiguousarray(x).view(p.dtype.np)


def _contiguous(p, ins):
    x = ins[0]
    if p.allow_col_major and x.flags.f_contiguous:
        return x
    return np.ascontiguousarray(x)


KERNELS = {
    sh.Reshape: _reshape,
    sh.Flatten: _flatten,
    sh.Unflatten: _unflatten,
    sh.Squeeze: _squeeze,
    sh.ExpandDims: _expand_dims,
    sh.Transpose: lambda p, ins: ins[0].transpose(p.axes),
    sh.BroadcastTo: _broadcast_to,
    sh.Concatenate: _concatenate,
    sh.Split: _split,
    sh.Pad: _pad,
    sh.DynamicSlice: _dynamic_slice,
    sh.DynamicSliceUpdate: _dynamic_slice_update,
    sh.AsStrided: as_strided_kernel(
        lambda a, shape, strides: _as_strided(a, shape=shape, strides=strides, writeable=False)),
    sh.View: _view,
    sh.Contiguous: _contiguous,
    sh.Diagonal: lambda p, ins: np.diagonal(ins[0], p.offset, p.axis1, p.axis2),
    sh.Diag: lambda p, ins: np.diag(ins[0], p.k),
}
