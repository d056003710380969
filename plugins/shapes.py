"""Shapes and views op pack: reshaping, transposing, broadcasting, joining, splitting,
padding, diagonals, strided and typed views, and dynamic slices.

Each distinct operation is a small :class:`Primitive` (``Reshape``, ``Transpose``,
``BroadcastTo``, ``Concatenate``, ``Split``, ``Pad``, ...); the rest are compositions
as in MLX (``stack`` is ``expand_dims`` + ``concatenate``, ``tile`` and ``repeat`` are
``reshape`` + ``broadcast_to`` + ``reshape``, ``roll`` is slices + ``concatenate``,
``flip`` is a strided slice, ``trace`` is ``diagonal`` + ``sum``). The NumPy kernels
(``lazyx.backends.cpu.kernels.shapes``) return views of their input where NumPy can,
so most of these ops copy nothing.

No op here returns its input object itself: ``__setitem__`` rebinds the Python array it
is called on, so an op that handed back its input would let ``b[0] = 1`` change ``a``.
A no-op gives a fresh array sharing the data (:func:`_alias`).

Every primitive has its ``vjp``, ``jvp`` and ``vmap`` rules beside its class. Most are
linear in their array input, so the tangent goes through the same primitive and the
cotangent through its adjoint (a reshape back, the inverse transpose, a sum over
broadcast dimensions, a scatter-add for diagonals and strided views). Batched, a
primitive keeps the batch axis where its parameters allow and moves it first
otherwise; dynamic slices whose starts differ per example become gathers and
scatters of the blocks' positions. ``view`` reinterprets bits: it has no gradient
(except as its own dtype, where it is the identity).
"""

from __future__ import annotations

import operator

import numpy as np

import lazyx.core as mx
from lazyx import dtypes as dt
from lazyx.arguments import (as_array, broadcast_shapes as _broadcast_shapes, cast,
                             check_dimensions, normalize_axis, MAX_DIM)
from lazyx.array import array, from_buffer, lazy, lazy_multi
from lazyx.device import to_stream
from lazyx.errors import (ArgumentError, AxisError, DtypeError, IndexOutOfRangeError,
                          IntegerRangeError, ShapeError)
from lazyx.hookspecs import hookimpl, pack_hooks
from lazyx.primitive import Axes, Axis, FixedShape, NewAxes, Primitive, SameShape, Shape, Size
from lazyx.rules import (add_batch_axis, add_tangents, batch_first, batched_axes,
                                   move_batch_axis, sum_to_shape)
from lazyx.examples import example, integers, uniform

_int = int
_index = operator.index
_py_slice = slice


# -- primitives ----------------------------------------------------------------
# Transform rules sit beside each class. They build lazy graphs with ``lazyx.core`` ops
# (or new nodes of these primitives), so what they return can be transformed again. In
# ``vmap`` rules ``b`` is the batch axis of the batched input and ``n`` the batch size.
def _apply(prim: Primitive, *inputs) -> array:
    """A node of ``prim`` on ``inputs``: its shape rule gives the shape, and the first
    input its dtype (rules reuse their own primitive where the parameters still hold)."""
    return lazy(prim.output_shapes(inputs)[0], inputs[0]._dtype, prim, inputs)


class _Reshaping(Primitive):
    """A primitive that keeps the elements in row-major order and changes only the shape:
    the cotangent is reshaped back, and the tangent goes through the same primitive."""

    __slots__ = ()
    arity = 1

    def vjp(self, primals, cotangents, argnums, outputs):
        return [mx.reshape(cotangents[0], primals[0]._shape, stream=self.stream)]

    def jvp(self, primals, tangents, argnums):
        return [_apply(self, tangents[0])]


def _reinferred(shape: tuple, infer: int, size: int, op: str, src: tuple) -> tuple:
    """``shape`` with dimension ``infer`` (-1: none) inferred again from ``size``, as a
    shapeless compile replays a reshape written with ``-1`` at other input shapes (MLX
    keeps the ``-1``; the other dimensions stay as traced)."""
    if infer >= 0:
        known = _prod(d for i, d in enumerate(shape) if i != infer)
        if known and size % known == 0:
            return shape[:infer] + (size // known,) + shape[infer + 1:]
    elif _prod(shape) == size:
        return shape
    spec = shape if infer < 0 else shape[:infer] + (-1,) + shape[infer + 1:]
    raise ShapeError(f"[{op}] Cannot reshape an array of shape {src} (size {size}) into "
                     f"shape {spec}.")


class Reshape(FixedShape, _Reshaping):
    """``a`` with the same elements in row-major order and a new ``shape``; ``infer``
    is the dimension written ``-1`` (-1: none), which a shapeless compile infers again
    from the size at each call (the kernel reshapes to :attr:`target`)."""

    __slots__ = ("shape", "infer", "_target")
    derived_slots = ("_target",)
    shape: Shape
    infer: int

    def is_noop(self, inputs):
        return inputs[0].shape == self.shape

    def __init__(self, stream, shape: tuple, infer: int = -1):
        super().__init__(stream)
        self.shape = shape
        self.infer = infer
        self._target = shape if infer < 0 else shape[:infer] + (-1,) + shape[infer + 1:]

    @property
    def target(self) -> tuple:
        """The shape the kernel reshapes to: ``shape`` with ``-1`` at ``infer``."""
        return self._target

    def output_shapes(self, inputs):
        s = inputs[0].shape
        return [_reinferred(self.shape, self.infer, _prod(s), "reshape", s)]

    def vmap(self, inputs, axes):
        x, b = inputs[0], axes[0]
        s = x._shape
        # Row-major order keeps the batch where it is when the dimensions before it
        # are unchanged: the reshape then acts within each batch entry.
        if s[:b] != self.shape[:b]:
            x, b = batch_first(x, b, stream=self.stream), 0
            s = x._shape
        return [mx.reshape(x, self.shape[:b] + (s[b],) + self.shape[b:],
                           stream=self.stream)], [b]


class Flatten(_Reshaping):
    """Axes ``start_axis..end_axis`` (non-negative, inclusive) merged into one."""

    __slots__ = ("start_axis", "end_axis")
    start_axis: int
    end_axis: int

    def __init__(self, stream, start_axis: int, end_axis: int):
        super().__init__(stream)
        self.start_axis = start_axis
        self.end_axis = end_axis

    def output_shapes(self, inputs):
        return [_flattened(inputs[0].shape, self.start_axis, self.end_axis)]

    def vmap(self, inputs, axes):
        x, b = inputs[0], axes[0]
        s, e = self.start_axis, self.end_axis
        if len(x._shape) == 1:  # a 0-d example flattens to (1,)
            return [mx.expand_dims(x, 1, stream=self.stream)], [0]
        if s < b <= e:
            x, b = batch_first(x, b, stream=self.stream), 0
        if b <= s:
            return [_apply(Flatten(self.stream, s + 1, e + 1), x)], [b]
        return [_apply(Flatten(self.stream, s, e), x)], [b - (e - s)]


class Unflatten(_Reshaping):
    """Axis ``axis`` split into the dimensions ``shape`` (their product is its size);
    ``infer`` is the dimension written ``-1`` (-1: none), inferred again from the
    axis's size when a shapeless compile replays it (:attr:`target` keeps the ``-1``)."""

    __slots__ = ("axis", "shape", "infer", "_target")
    derived_slots = ("_target",)
    axis: Axis
    shape: Shape
    infer: int

    def __init__(self, stream, axis: int, shape: tuple, infer: int = -1):
        super().__init__(stream)
        self.axis = axis
        self.shape = shape
        self.infer = infer
        self._target = shape if infer < 0 else shape[:infer] + (-1,) + shape[infer + 1:]

    @property
    def target(self) -> tuple:
        """The dimensions the kernel splits the axis into: ``shape`` with ``-1`` at ``infer``."""
        return self._target

    def output_shapes(self, inputs):
        s = inputs[0].shape
        ax = self.axis
        new = _reinferred(self.shape, self.infer, s[ax], "unflatten", (s[ax],))
        return [s[:ax] + new + s[ax + 1:]]

    def vmap(self, inputs, axes):
        b, ax = axes[0], self.axis
        if b <= ax:
            return [_apply(Unflatten(self.stream, ax + 1, self.shape, self.infer), inputs[0])], [b]
        return [_apply(Unflatten(self.stream, ax, self.shape, self.infer), inputs[0])], \
            [b + len(self.shape) - 1]


class Squeeze(_Reshaping):
    """``a`` without its size-1 axes ``axes`` (sorted, non-negative)."""

    __slots__ = ("axes",)
    axes: Axes

    def __init__(self, stream, axes: tuple):
        super().__init__(stream)
        self.axes = axes

    def output_shapes(self, inputs):
        axes = self.axes
        return [tuple(d for i, d in enumerate(inputs[0].shape) if i not in axes)]

    def vmap(self, inputs, axes):
        b = axes[0]
        out = _apply(Squeeze(self.stream, batched_axes(self.axes, b)), inputs[0])
        return [out], [b - sum(1 for a in self.axes if a < b)]


class ExpandDims(_Reshaping):
    """``a`` with new size-1 axes at output positions ``axes`` (sorted, non-negative)."""

    __slots__ = ("axes",)
    axes: NewAxes

    def __init__(self, stream, axes: tuple):
        super().__init__(stream)
        self.axes = axes

    def output_shapes(self, inputs):
        return [_expanded(inputs[0].shape, self.axes)]

    def vmap(self, inputs, axes):
        x, b = inputs[0], axes[0]
        # The batch goes where the example's axis b lands in the output (the end if
        # b is past the example's axes); the new axes shift around it.
        nd = len(x._shape) - 1 + len(self.axes)
        kept = [i for i in range(nd) if i not in self.axes]
        c = kept[b] if b < len(kept) else nd
        new = tuple(a + (a >= c) for a in self.axes)
        return [_apply(ExpandDims(self.stream, new), x)], [c]


class Transpose(Primitive):
    """``a`` with its axes permuted: output axis ``i`` is input axis ``axes[i]``."""

    __slots__ = ("axes",)
    arity = 1
    axes: Axes

    def is_noop(self, inputs):
        return self.axes == tuple(range(len(self.axes)))

    def __init__(self, stream, axes: tuple):
        super().__init__(stream)
        self.axes = axes

    def output_shapes(self, inputs):
        s = inputs[0].shape
        return [tuple(s[i] for i in self.axes)]

    def vjp(self, primals, cotangents, argnums, outputs):
        inv = [0] * len(self.axes)
        for i, a in enumerate(self.axes):
            inv[a] = i
        return [_apply(Transpose(self.stream, tuple(inv)), cotangents[0])]

    def jvp(self, primals, tangents, argnums):
        return [_apply(self, tangents[0])]

    def vmap(self, inputs, axes):
        b = axes[0]
        perm = batched_axes(self.axes, b)
        return [_apply(Transpose(self.stream, perm[:b] + (b,) + perm[b:]), inputs[0])], [b]


class BroadcastTo(FixedShape):
    """``a`` broadcast to ``shape`` (NumPy's rules)."""

    __slots__ = ("shape",)
    shape: Shape
    arity = 1

    def is_noop(self, inputs):
        return inputs[0].shape == self.shape

    def __init__(self, stream, shape: tuple):
        super().__init__(stream)
        self.shape = shape

    def output_shapes(self, inputs):
        # The input's shape broadcast with the traced one, as MLX: a shapeless compile
        # replays it at input shapes that broadcast to a larger result.
        s = inputs[0].shape
        return [self.shape if s == self.shape else _broadcast_shapes(s, self.shape)]

    def vjp(self, primals, cotangents, argnums, outputs):
        return [sum_to_shape(cotangents[0], primals[0]._shape, self.stream)]

    def jvp(self, primals, tangents, argnums):
        return [_apply(self, tangents[0])]

    def vmap(self, inputs, axes):
        x, b = inputs[0], axes[0]
        # Broadcasting aligns trailing axes: the batch keeps its distance from the end.
        c = b + len(self.shape) - (len(x._shape) - 1)
        shape = self.shape[:c] + (x._shape[b],) + self.shape[c:]
        return [_apply(BroadcastTo(self.stream, shape), x)], [c]


class Concatenate(Primitive):
    """The inputs (one dtype, equal shapes but along ``axis``) joined along ``axis``."""

    __slots__ = ("axis",)
    axis: Axis

    def __init__(self, stream, axis: int):
        super().__init__(stream)
        self.axis = axis

    def output_shapes(self, inputs):
        ax = self.axis
        s = inputs[0].shape
        return [s[:ax] + (sum(x.shape[ax] for x in inputs),) + s[ax + 1:]]

    def vjp(self, primals, cotangents, argnums, outputs):
        ax = self.axis
        cuts = []
        n = 0
        for x in primals[:-1]:
            n += x._shape[ax]
            cuts.append(n)
        pieces = mx.split(cotangents[0], cuts, ax, stream=self.stream)
        return [pieces[i] for i in argnums]

    def jvp(self, primals, tangents, argnums):
        ts = [mx.zeros_like(x) for x in primals]
        for i, t in zip(argnums, tangents):
            ts[i] = t
        return [_apply(self, *ts)]

    def vmap(self, inputs, axes):
        b = next(a for a in axes if a is not None)
        n = next(x._shape[a] for x, a in zip(inputs, axes) if a is not None)
        xs = [add_batch_axis(x, b, n, self.stream) if a is None else
              move_batch_axis(x, a, b, self.stream) for x, a in zip(inputs, axes)]
        ax = self.axis + (self.axis >= b)
        return [_apply(Concatenate(self.stream, ax), *xs)], [b]


class Split(Primitive):
    """``a`` cut along ``axis`` before each of ``indices`` (non-negative, clamped to the
    axis): one output per piece, as Python slicing gives them."""

    __slots__ = ("indices", "axis")
    arity = 1
    indices: tuple[int, ...]
    axis: Axis
    shapeless = False  # parameters fix the output shape (see Primitive.shapeless)

    def __init__(self, stream, indices: tuple, axis: int):
        super().__init__(stream)
        self.indices = indices
        self.axis = axis

    def output_shapes(self, inputs):
        s = inputs[0].shape
        ax = self.axis
        return [s[:ax] + (n,) + s[ax + 1:] for n in _piece_sizes(self.indices, s[ax])]

    def _apply(self, x) -> list:
        return lazy_multi(self.output_shapes((x,)), [x._dtype] * (len(self.indices) + 1),
                          self, (x,))

    def vjp(self, primals, cotangents, argnums, outputs):
        ind, ax = self.indices, self.axis
        if all(i <= j for i, j in zip(ind, ind[1:])):
            return [mx.concatenate(cotangents, ax, stream=self.stream)]
        # Decreasing indices make pieces that overlap (as Python slices do): each
        # cotangent is padded back to its place and they add up.
        a = primals[0]
        n = a._shape[ax]
        bounds = (0,) + ind + (n,)
        out = None
        for k, c in enumerate(cotangents):
            m = c._shape[ax]
            if m:
                widths = [(0, 0)] * len(a._shape)
                widths[ax] = (bounds[k], n - bounds[k] - m)
                out = add_tangents(out, mx.pad(c, widths, stream=self.stream), self.stream)
        return [mx.zeros_like(a) if out is None else out]

    def jvp(self, primals, tangents, argnums):
        return self._apply(tangents[0])

    def vmap(self, inputs, axes):
        b = axes[0]
        outs = Split(self.stream, self.indices, self.axis + (self.axis >= b))._apply(inputs[0])
        return outs, [b] * len(outs)


class Pad(Primitive):
    """``a`` padded with the 0-d second input: ``low_pad_size[i]`` before and
    ``high_pad_size[i]`` after along ``axes[i]``."""

    __slots__ = ("axes", "low_pad_size", "high_pad_size")
    arity = 2
    axes: Axes
    low_pad_size: Shape
    high_pad_size: Shape

    def __init__(self, stream, axes: tuple, low_pad_size: tuple, high_pad_size: tuple):
        super().__init__(stream)
        self.axes = axes
        self.low_pad_size = low_pad_size
        self.high_pad_size = high_pad_size

    def output_shapes(self, inputs):
        s = list(inputs[0].shape)
        for ax, lo, hi in zip(self.axes, self.low_pad_size, self.high_pad_size):
            s[ax] += lo + hi
        return [tuple(s)]

    def _inner(self, g, shape: tuple) -> array:
        """The part of padded ``g`` that holds the input of ``shape``."""
        key = [_py_slice(None)] * len(shape)
        for ax, lo in zip(self.axes, self.low_pad_size):
            key[ax] = _py_slice(lo, lo + shape[ax])
        return _index_on(g, tuple(key), self.stream)

    def vjp(self, primals, cotangents, argnums, outputs):
        g = cotangents[0]
        inner = self._inner(g, primals[0]._shape)
        out = []
        for i in argnums:
            if i == 0:
                out.append(inner)
            else:  # the padding value: everything outside the input
                out.append(mx.subtract(mx.sum(g, stream=self.stream),
                                       mx.sum(inner, stream=self.stream), stream=self.stream))
        return out

    def jvp(self, primals, tangents, argnums):
        ts = [mx.zeros_like(primals[0]), mx.zeros_like(primals[1])]
        for i, t in zip(argnums, tangents):
            ts[i] = t
        return [_apply(self, *ts)]

    def vmap(self, inputs, axes):
        (x, v), (b, bv) = inputs, axes
        s = self.stream
        if b is None:
            x, b = add_batch_axis(x, 0, v._shape[0], s), 0
        pad = Pad(s, batched_axes(self.axes, b), self.low_pad_size, self.high_pad_size)
        if bv is None:
            return [_apply(pad, x, v)], [b]
        # A padding value per example: pad with zeros, then fill outside a mask.
        out = _apply(pad, x, mx.zeros((), x._dtype))
        per = x._shape[:b] + x._shape[b + 1:]
        mask = _apply(Pad(s, self.axes, self.low_pad_size, self.high_pad_size),
                      mx.ones(per, dt.bool_), mx.zeros((), dt.bool_))
        vb = mx.reshape(v, (1,) * b + v._shape + (1,) * (len(per) - b), stream=s)
        return [mx.where(mx.expand_dims(mask, b, stream=s), out, vb, stream=s)], [b]


def _no_start_gradient(prim, argnums, start: int) -> None:
    """MLX's vjp of a dynamic slice (update) refuses traced start indices, even integer
    ones computed from the differentiated values, rather than give them zeros."""
    if argnums[-1] >= start:
        raise ArgumentError(f"[{prim.name}] Cannot calculate the VJP with respect to the "
                            f"start indices (input {start}). Use stop_gradient on them.")


class DynamicSlice(Primitive):
    """A block of size ``slice_size`` of ``a``; its start along ``axes`` is the second
    input (an integer array, read at evaluation), 0 along the other axes."""

    __slots__ = ("axes", "slice_size")
    arity = 2
    axes: Axes
    slice_size: Shape
    shapeless = False  # parameters fix the output shape (see Primitive.shapeless)

    def __init__(self, stream, axes: tuple, slice_size: tuple):
        super().__init__(stream)
        self.axes = axes
        self.slice_size = slice_size

    def output_shapes(self, inputs):
        return [self.slice_size]

    # The start indices get no cotangent: reaching them raises, as in MLX (the fix is
    # stop_gradient on them); the tangent ignores them.
    def vjp(self, primals, cotangents, argnums, outputs):
        _no_start_gradient(self, argnums, 1)
        a, start = primals
        return [_apply(DynamicSliceUpdate(self.stream, self.axes), mx.zeros_like(a),
                       cotangents[0], start)]

    def jvp(self, primals, tangents, argnums):
        if argnums[0] != 0:
            return [None]
        return [_apply(self, tangents[0], primals[1])]

    def vmap(self, inputs, axes):
        (a, start), (b, bs) = inputs, axes
        s = self.stream
        if bs is None:
            size = self.slice_size[:b] + (a._shape[b],) + self.slice_size[b:]
            return [_apply(DynamicSlice(s, batched_axes(self.axes, b), size), a, start)], [b]
        # Starts that differ per example: a gather along each sliced axis.
        n = start._shape[bs]
        starts = mx.reshape(batch_first(start, bs, stream=s), (n, len(self.axes)), stream=s)
        per = a._shape if b is None else a._shape[:b] + a._shape[b + 1:]
        x = mx.expand_dims(a, 0, stream=s) if b is None else batch_first(a, b, stream=s)
        size = self.slice_size
        if any(size[d] != per[d] for d in range(len(per)) if d not in self.axes):
            x = _index_on(x, (_py_slice(None),) + tuple(
                _py_slice(None) if d in self.axes else _py_slice(0, size[d])
                for d in range(len(per))), s)
        for k, ax in enumerate(self.axes):
            idx = _block_positions(starts, k, per[ax], size[ax], s)
            idx = mx.reshape(idx, (n,) + (1,) * ax + (size[ax],) + (1,) * (len(per) - ax - 1),
                             stream=s)
            x = mx.take_along_axis(x, idx, axis=ax + 1, stream=s)
        return [x], [0]


def _block_positions(starts: array, k: int, n: int, size: int, stream) -> array:
    """``(batch, size)`` positions of blocks of ``size`` that start at ``starts[:, k]``
    in an axis of size ``n``. A start outside the axis becomes position ``n`` (past its
    end), so the gather or scatter that uses it fails instead of wrapping around."""
    st = _index_on(starts, (_py_slice(None), k), stream)
    if st._dtype.kind == "u" or st._dtype.size < 4:
        st = mx.astype(st, dt.int64 if st._dtype is dt.uint64 else dt.int32, stream=stream)
    st = mx.where(mx.less(st, 0, stream=stream), mx.add(st, n, stream=stream), st, stream=stream)
    st = mx.where(mx.less(st, 0, stream=stream), n, st, stream=stream)
    pos = mx.add(mx.expand_dims(st, 1, stream=stream),
                 mx.arange(size, dtype=st._dtype, stream=stream), stream=stream)
    return mx.where(mx.greater(mx.expand_dims(mx.add(st, size, stream=stream), 1, stream=stream),
                               n, stream=stream), n, pos, stream=stream)


class DynamicSliceUpdate(SameShape):
    """``a`` with a block replaced by the update (second input); the block starts at the
    third input along ``axes`` and at 0 elsewhere. It has the update's dimensions, and
    for leading axes the update lacks, 1 on ``axes`` and all of ``a`` elsewhere."""

    __slots__ = ("axes",)
    axes: Axes

    def __init__(self, stream, axes: tuple):
        super().__init__(stream)
        self.axes = axes

    def vjp(self, primals, cotangents, argnums, outputs):
        _no_start_gradient(self, argnums, 2)
        a, u, start = primals
        g = cotangents[0]
        out = []
        for i in argnums:
            if i == 0:
                out.append(_apply(self, g, mx.zeros_like(u), start))
            elif i == 1:
                block = _update_block(a._shape, u._shape, self.axes)
                gu = _apply(DynamicSlice(self.stream, self.axes, block), g, start)
                out.append(sum_to_shape(gu, u._shape, self.stream))
            else:
                out.append(None)
        return out

    def jvp(self, primals, tangents, argnums):
        a, u, start = primals
        ts = {i: t for i, t in zip(argnums, tangents) if i < 2}
        if not ts:
            return [None]
        return [_apply(self, ts.get(0, mx.zeros_like(a)), ts.get(1, mx.zeros_like(u)), start)]

    def vmap(self, inputs, axes):
        (a, u, start), (b, bu, bs) = inputs, axes
        s = self.stream
        n = next(x._shape[k] for x, k in zip(inputs, axes) if k is not None)
        if b is None:
            a, b = add_batch_axis(a, 0, n, s), 0
        per = a._shape[:b] + a._shape[b + 1:]
        uper = u._shape if bu is None else u._shape[:bu] + u._shape[bu + 1:]
        block = _update_block(per, uper, self.axes)
        # The update, repeated over the block's leading axes, with its batch at 0.
        if bu is None:
            u = add_batch_axis(mx.broadcast_to(u, block, stream=s), 0, n, s)
        else:
            u = mx.broadcast_to(batch_first(u, bu, len(block), s), (n,) + block, stream=s)
        if bs is None:
            u = move_batch_axis(u, 0, b, s)
            return [_apply(DynamicSliceUpdate(s, batched_axes(self.axes, b)), a, u, start)], [b]
        # Starts that differ per example: a scatter at the blocks' positions.
        a = batch_first(a, b, stream=s)
        starts = mx.reshape(batch_first(start, bs, stream=s), (n, len(self.axes)), stream=s)
        nd = len(per)
        key = [mx.reshape(mx.arange(n, dtype=dt.int32, stream=s), (n,) + (1,) * nd, stream=s)]
        for d in range(nd):
            m = block[d]
            if d in self.axes:
                idx = _block_positions(starts, self.axes.index(d), per[d], m, s)
                key.append(mx.reshape(idx, (n,) + (1,) * d + (m,) + (1,) * (nd - d - 1),
                                      stream=s))
            else:
                key.append(mx.reshape(mx.arange(m, dtype=dt.int32, stream=s),
                                      (1,) * (d + 1) + (m,) + (1,) * (nd - d - 1), stream=s))
        out = _alias(a, s)
        out[tuple(key)] = u
        return [out], [0]


class AsStrided(FixedShape):
    """A view of ``a``'s row-major elements with ``shape``, element ``strides`` and
    element ``offset``; the op checks that every element it reaches lies in ``a``."""

    __slots__ = ("shape", "strides", "offset")
    shape: Shape
    strides: tuple[int, ...]
    offset: Size
    arity = 1
    shapeless = False  # parameters fix the output shape (see Primitive.shapeless)

    def __init__(self, stream, shape: tuple, strides: tuple, offset: int):
        super().__init__(stream)
        self.shape = shape
        self.strides = strides
        self.offset = offset

    def positions(self) -> np.ndarray:
        """The row-major position in ``a`` of each element of the view."""
        nd = len(self.shape)
        pos = np.full(self.shape, self.offset, dtype=np.int64)
        for ax, (d, st) in enumerate(zip(self.shape, self.strides)):
            pos += (np.arange(d, dtype=np.int64) * st).reshape((d,) + (1,) * (nd - ax - 1))
        return pos

    # Elements the view reaches more than once collect every cotangent: a scatter-add
    # into the flattened input.
    def vjp(self, primals, cotangents, argnums, outputs):
        a = primals[0]
        flat = mx.zeros((a.size,), a._dtype, stream=self.stream)
        flat = flat.at[from_buffer(self.positions(), dt.int64)].add(cotangents[0])
        return [mx.reshape(flat, a._shape, stream=self.stream)]

    def jvp(self, primals, tangents, argnums):
        return [_apply(self, tangents[0])]

    def vmap(self, inputs, axes):
        # With the batch first, example k is the k-th block of the row-major elements.
        x = batch_first(inputs[0], axes[0], stream=self.stream)
        s = x._shape
        prim = AsStrided(self.stream, s[:1] + self.shape, (_prod(s[1:]),) + self.strides,
                         self.offset)
        return [_apply(prim, x)], [0]


class View(Primitive):
    """``a``'s bytes (row-major) read as ``dtype``; the last axis scales by the size ratio."""

    __slots__ = ("dtype",)
    arity = 1
    dtype: dt.Dtype

    def __init__(self, stream, dtype):
        super().__init__(stream)
        self.dtype = dtype

    def output_shapes(self, inputs):
        x = inputs[0]
        return [_view_shape(x.shape, x.dtype, self.dtype)]

    # Reinterpreting bits has no derivative; a view as the same dtype is the identity.
    def vjp(self, primals, cotangents, argnums, outputs):
        return [cotangents[0] if primals[0]._dtype is self.dtype else None]

    def jvp(self, primals, tangents, argnums):
        return [tangents[0] if primals[0]._dtype is self.dtype else None]

    def vmap(self, inputs, axes):
        x, b = inputs[0], axes[0]
        # The last axis grows or shrinks: the batch must not be it.
        if b == len(x._shape) - 1 and x._dtype.size != self.dtype.size:
            x, b = batch_first(x, b, stream=self.stream), 0
        return [lazy(_view_shape(x._shape, x._dtype, self.dtype), self.dtype, self, (x,))], [b]


class Contiguous(SameShape):
    """``a`` in row-major memory order (or column-major, if allowed and already so)."""

    __slots__ = ("allow_col_major",)
    arity = 1
    allow_col_major: bool

    def __init__(self, stream, allow_col_major: bool):
        super().__init__(stream)
        self.allow_col_major = allow_col_major

    def vjp(self, primals, cotangents, argnums, outputs):
        return [cotangents[0]]

    def jvp(self, primals, tangents, argnums):
        return [tangents[0]]

    def vmap(self, inputs, axes):
        return [_apply(self, inputs[0])], [axes[0]]


class Diagonal(Primitive):
    """The diagonal ``offset`` of the planes of ``axis1`` and ``axis2``, as a last axis."""

    __slots__ = ("offset", "axis1", "axis2")
    arity = 1
    offset: int
    axis1: Axis
    axis2: Axis

    def __init__(self, stream, offset: int, axis1: int, axis2: int):
        super().__init__(stream)
        self.offset = offset
        self.axis1 = axis1
        self.axis2 = axis2

    def output_shapes(self, inputs):
        return [_diagonal_shape(inputs[0].shape, self.offset, self.axis1, self.axis2)]

    # The cotangent goes back onto the diagonal: a scatter at its (row, column) pairs.
    def vjp(self, primals, cotangents, argnums, outputs):
        a, g = primals[0], cotangents[0]
        ax1, ax2 = self.axis1, self.axis2
        key = [_py_slice(None)] * len(a._shape)
        key[ax1], key[ax2] = _diagonal_positions(g._shape[-1], self.offset)
        # NumPy puts the dimension of two adjacent index arrays where they stand, else first.
        where = min(ax1, ax2) if abs(ax1 - ax2) == 1 else 0
        g = move_batch_axis(g, len(g._shape) - 1, where, self.stream)
        return [mx.zeros_like(a).at[tuple(key)].add(g)]

    def jvp(self, primals, tangents, argnums):
        return [_apply(self, tangents[0])]

    def vmap(self, inputs, axes):
        b = axes[0]
        ax1, ax2 = batched_axes((self.axis1, self.axis2), b)
        out = _apply(Diagonal(self.stream, self.offset, ax1, ax2), inputs[0])
        return [out], [b - (ax1 < b) - (ax2 < b)]


def _diagonal_positions(n: int, k: int) -> tuple:
    """Row and column positions (evaluated int32 arrays) of the ``n`` elements of diagonal ``k``."""
    r = np.arange(max(0, -k), max(0, -k) + n, dtype=np.int32)
    return from_buffer(r, dt.int32), from_buffer(r + np.int32(k), dt.int32)


class Diag(Primitive):
    """A square matrix with 1-D ``a`` on its diagonal ``k`` and zeros elsewhere."""

    __slots__ = ("k",)
    arity = 1
    k: int

    def __init__(self, stream, k: int):
        super().__init__(stream)
        self.k = k

    def output_shapes(self, inputs):
        n = inputs[0].shape[0] + abs(self.k)
        return [(n, n)]

    def vjp(self, primals, cotangents, argnums, outputs):
        return [_apply(Diagonal(self.stream, self.k, 0, 1), cotangents[0])]

    def jvp(self, primals, tangents, argnums):
        return [_apply(self, tangents[0])]

    def vmap(self, inputs, axes):
        x = batch_first(inputs[0], axes[0], stream=self.stream)
        nb, n = x._shape
        m = n + abs(self.k)
        rows, cols = _diagonal_positions(n, self.k)
        out = mx.zeros((nb, m, m), x._dtype, stream=self.stream)
        return [out.at[_py_slice(None), rows, cols].add(x)], [0]


# -- shape helpers --------------------------------------------------------------
def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _ints(value, op: str, name: str) -> tuple:
    """``value`` (an int or a sequence of ints) as a tuple of Python ints."""
    if type(value) is tuple:
        for v in value:
            if type(v) is not _int:
                break
        else:
            return value
    if isinstance(value, bool):
        raise DtypeError(f"[{op}] {name} must be an integer or a sequence of integers, "
                         f"got {value!r}.")
    try:
        if isinstance(value, (list, tuple)):
            out = []
            for v in value:
                if isinstance(v, (bool, np.bool_)):
                    raise TypeError
                out.append(_index(v))
            return tuple(out)
        return (_index(value),)
    except TypeError:
        raise DtypeError(f"[{op}] {name} must be an integer or a sequence of integers, "
                         f"got {value!r}.") from None


def _axis(axis, ndim: int, op: str, name: str = "axis") -> int:
    if isinstance(axis, bool):
        raise AxisError(f"[{op}] {name} must be an integer, got {axis!r}.")
    return normalize_axis(axis, ndim, f"[{op}] {name}")


def _fast_axes(axes, ndim: int):
    """``axes`` (a tuple or list of in-range Python ints) made non-negative, else None
    (the caller then validates slowly, raising the error that names the problem)."""
    if type(axes) is not tuple and type(axes) is not list:
        return None
    out = []
    for x in axes:
        if type(x) is not _int:
            return None
        if x < 0:
            x += ndim
        if x < 0 or x >= ndim:
            return None
        out.append(x)
    return tuple(out)


def _unique_axes(axes, ndim: int, op: str, name: str = "axis") -> tuple:
    """Normalised axes; a repeated axis is an AxisError naming ``op``."""
    out = tuple(_axis(a, ndim, op, name) for a in _ints(axes, op, name))
    if len(set(out)) != len(out):
        raise AxisError(f"[{op}] Repeated axes in {name}={out}.")
    return out


def _infer_shape(src_shape: tuple, size: int, shape: tuple, op: str) -> tuple:
    """``shape`` with its one ``-1`` resolved so that it holds ``size`` elements."""
    infer = -1
    known = 1
    for i, d in enumerate(shape):
        if d >= 0:
            known *= d
        elif d == -1:
            if infer >= 0:
                raise ShapeError(f"[{op}] Can only infer one dimension, got shape {shape}.")
            infer = i
        else:
            raise ShapeError(f"[{op}] Invalid dimension {d} in shape {shape}: dimensions "
                             f"must be non-negative (or one -1).")
    if infer >= 0:
        if known == 0:
            raise ShapeError(f"[{op}] Cannot infer the -1 of shape {shape} for an array of "
                             f"shape {src_shape}: the other dimensions hold no elements.")
        if size % known:
            raise ShapeError(f"[{op}] Cannot reshape an array of shape {src_shape} (size "
                             f"{size}) into shape {shape}.")
        return shape[:infer] + (size // known,) + shape[infer + 1:]
    if known != size:
        raise ShapeError(f"[{op}] Cannot reshape an array of shape {src_shape} (size {size}) "
                         f"into shape {shape} (size {known}).")
    return shape


def _flattened(shape: tuple, start: int, end: int) -> tuple:
    if not shape:
        return (1,)
    return shape[:start] + (_prod(shape[start:end + 1]),) + shape[end + 1:]


def _expanded(shape: tuple, axes: tuple) -> tuple:
    out = list(shape)
    for ax in axes:
        out.insert(ax, 1)
    return tuple(out)


def _piece_sizes(indices: tuple, n: int) -> list:
    bounds = (0,) + indices + (n,)
    return [max(0, bounds[i + 1] - bounds[i]) for i in range(len(bounds) - 1)]


def _view_shape(shape: tuple, src, dst) -> tuple:
    if src.size == dst.size:
        return shape
    if not shape:
        raise ShapeError(f"[view] A 0-d array can only be viewed as a dtype of the same size: "
                         f"{src.name} has {src.size} bytes, {dst.name} {dst.size}.")
    nbytes = shape[-1] * src.size
    if nbytes % dst.size:
        raise ShapeError(f"[view] Cannot view an array of shape {shape} and dtype {src.name} "
                         f"as {dst.name}: the last axis holds {nbytes} bytes, not a multiple "
                         f"of {dst.size}.")
    return shape[:-1] + (nbytes // dst.size,)


def _diagonal_shape(shape: tuple, offset: int, ax1: int, ax2: int) -> tuple:
    d1, d2 = shape[ax1], shape[ax2]
    if offset >= 0:
        n = max(0, min(d1, d2 - offset))
    else:
        n = max(0, min(d1 + offset, d2))
    return tuple(d for i, d in enumerate(shape) if i != ax1 and i != ax2) + (n,)


def _update_block(a_shape: tuple, u_shape: tuple, axes: tuple) -> tuple:
    """The block a dynamic slice update writes: the update's own dimensions, and for the
    leading axes it lacks, 1 on the sliced ``axes`` and all of ``a`` elsewhere (as MLX)."""
    lead = len(a_shape) - len(u_shape)
    return tuple((1 if i in axes else a_shape[i]) for i in range(lead)) + u_shape


def _alias(a: array, stream) -> array:
    """A new array object with ``a``'s value (shares the buffer; no copy)."""
    # Only a leaf: an evaluated node that still holds its primitive (a transform's
    # traced input) must stay in the graph, or gradients stop at the alias.
    if a._data is not None and a._prim is None:
        return from_buffer(a._data, a._dtype)
    return lazy(a._shape, a._dtype, Reshape(to_stream(stream), a._shape), (a,))


def _operand(a) -> array:
    return a if type(a) is array else as_array(a)


# -- reshaping -------------------------------------------------------------------
def reshape(a, /, shape, *, stream=None) -> array:
    """Reshape an array while preserving its size.

    Args:
        a (array): Input array.
        shape (tuple(int)): New shape; one dimension may be ``-1``, inferred from the
            size of ``a``.

    Returns:
        array: The reshaped array (a view of ``a`` when its layout allows).
    """
    a = _operand(a)
    if type(shape) is tuple:
        # The common case, a tuple of non-negative ints, checked in one pass.
        known = 1
        for d in shape:
            if type(d) is not _int or not 0 <= d <= MAX_DIM:
                break
            known *= d
        else:
            src = a._shape
            if shape != src:
                size = 1
                for d in src:
                    size *= d
                if known != size:
                    _infer_shape(src, size, shape, "reshape")  # raises, naming both shapes
            return lazy(shape, a._dtype, Reshape(to_stream(stream), shape), (a,))
    shape = _ints(shape, "reshape", "shape")
    for d in shape:
        if not -MAX_DIM - 1 <= d <= MAX_DIM:
            # An OverflowError, as MLX's binding raises converting to its 32-bit shape.
            raise IntegerRangeError(f"[reshape] Dimension {d} of shape {shape} is outside "
                                    f"the supported range [{-MAX_DIM - 1}, {MAX_DIM}] "
                                    f"(32-bit, as in MLX).")
    infer = shape.index(-1) if -1 in shape else -1  # kept for shapeless compile, as MLX
    if shape != a._shape:
        shape = _infer_shape(a._shape, a.size, shape, "reshape")
    return lazy(shape, a._dtype, Reshape(to_stream(stream), shape, infer), (a,))


def flatten(a, /, start_axis: int = 0, end_axis: int = -1, *, stream=None) -> array:
    """Flatten an array.

    The axes from ``start_axis`` to ``end_axis`` (inclusive; negative axes count from
    the end, and both are clamped to the array's axes) are merged into one. A 0-d
    array flattens to shape ``(1,)``.

    Example:
        >>> flatten(zeros((2, 3, 4)), start_axis=1).shape
        (2, 12)
    """
    a = _operand(a)
    nd = len(a._shape)
    s, e = _index(start_axis), _index(end_axis)
    if nd:
        s = min(max(s + nd if s < 0 else s, 0), nd - 1)
        e = min(max(e + nd if e < 0 else e, 0), nd - 1)
        if s > e:
            raise AxisError(f"[flatten] start_axis ({start_axis}) must be less than or equal "
                            f"to end_axis ({end_axis}) for an array of dimension {nd}.")
    else:
        s = e = 0
    shape = _flattened(a._shape, s, e)
    return lazy(shape, a._dtype, Flatten(to_stream(stream), s, e), (a,))


def unflatten(a, /, axis: int, shape, *, stream=None) -> array:
    """Unflatten an axis of an array into several.

    Args:
        a (array): Input array.
        axis (int): The axis to unflatten.
        shape (tuple(int)): Its new dimensions (one may be ``-1``); their product
            must be the size of ``axis``.

    Returns:
        array: The unflattened array.
    """
    a = _operand(a)
    ax = _axis(axis, len(a._shape), "unflatten")
    shape = _ints(shape, "unflatten", "shape")
    if not shape:
        raise ShapeError("[unflatten] The shape to unflatten into cannot be empty.")
    n = a._shape[ax]
    infer = shape.index(-1) if -1 in shape else -1  # kept for shapeless compile
    if shape.count(-1) > 1:
        raise ShapeError(f"[unflatten] Can only infer one dimension, got shape {shape}.")
    if -1 in shape:
        known = _prod(d for d in shape if d != -1)
        if known == 0 or n % known:
            raise ShapeError(f"[unflatten] Cannot unflatten axis {ax} of size {n} into shape "
                             f"{shape}.")
        shape = tuple(n // known if d == -1 else d for d in shape)
    if any(d < 0 for d in shape) or _prod(shape) != n:
        raise ShapeError(f"[unflatten] Cannot unflatten axis {ax} of size {n} into shape {shape}.")
    out = a._shape[:ax] + shape + a._shape[ax + 1:]
    return lazy(out, a._dtype, Unflatten(to_stream(stream), ax, shape, infer), (a,))


def squeeze(a, /, axis=None, *, stream=None) -> array:
    """Remove size-1 axes from an array.

    Args:
        a (array): Input array.
        axis (int or tuple(int), optional): The axes to remove; each must have size 1.
            Default: every size-1 axis.

    Returns:
        array: The squeezed array.
    """
    a = _operand(a)
    shape = a._shape
    if axis is None:
        axes = tuple(i for i, d in enumerate(shape) if d == 1)
    else:
        axes = _unique_axes(axis, len(shape), "squeeze")
        for ax in axes:
            if shape[ax] != 1:
                raise ShapeError(f"[squeeze] Cannot squeeze axis {ax} of size {shape[ax]} "
                                 f"(array shape {shape}): its size is not 1.")
        axes = tuple(sorted(axes))
    out = tuple(d for i, d in enumerate(shape) if i not in axes)
    return lazy(out, a._dtype, Squeeze(to_stream(stream), axes), (a,))


def expand_dims(a, /, axis, *, stream=None) -> array:
    """Add size-1 axes to an array.

    Args:
        a (array): Input array.
        axis (int or tuple(int)): The positions of the new axes in the output (negative
            positions count from the end of the output).

    Returns:
        array: The array with the new axes.
    """
    a = _operand(a)
    if type(axis) is _int:
        s = a._shape
        ax = axis + len(s) + 1 if axis < 0 else axis
        if 0 <= ax <= len(s):
            return lazy(s[:ax] + (1,) + s[ax:], a._dtype, ExpandDims(to_stream(stream), (ax,)),
                        (a,))
    axes = _ints(axis, "expand_dims", "axis")
    out_nd = len(a._shape) + len(axes)
    axes = _unique_axes(axes, out_nd, "expand_dims")
    axes = tuple(sorted(axes))
    out = _expanded(a._shape, axes)
    return lazy(out, a._dtype, ExpandDims(to_stream(stream), axes), (a,))


def atleast_1d(*arys, stream=None):
    """Convert all arrays to have at least one dimension.

    Returns:
        array or list(array): One array for one argument, else a list.
    """
    return _atleast(arys, 1, stream)


def atleast_2d(*arys, stream=None):
    """Convert all arrays to have at least two dimensions (a 1-D array of size ``n``
    becomes ``(1, n)``).

    Returns:
        array or list(array): One array for one argument, else a list.
    """
    return _atleast(arys, 2, stream)


def atleast_3d(*arys, stream=None):
    """Convert all arrays to have at least three dimensions (``(n,)`` becomes
    ``(1, n, 1)`` and ``(m, n)`` becomes ``(m, n, 1)``).

    Returns:
        array or list(array): One array for one argument, else a list.
    """
    return _atleast(arys, 3, stream)


def _atleast(arys, n: int, stream):
    out = []
    for x in arys:
        x = _operand(x)
        s = x._shape
        nd = len(s)
        if nd >= n:
            out.append(_alias(x, stream))
            continue
        if n == 1:
            shape = (1,)
        elif n == 2:
            shape = (1,) + s if nd == 1 else (1, 1)
        else:
            shape = {0: (1, 1, 1), 1: (1,) + s + (1,), 2: s + (1,)}[nd]
        out.append(lazy(shape, x._dtype, Reshape(to_stream(stream), shape), (x,)))
    return out[0] if len(out) == 1 else out


# -- axes permutations -------------------------------------------------------------
def transpose(a, /, axes=None, *, stream=None) -> array:
    """Transpose the dimensions of an array.

    Args:
        a (array): Input array.
        axes (list(int), optional): The source axis of each output axis; a permutation
            of the axes. Default: the axes reversed.

    Returns:
        array: The transposed array (a view).
    """
    a = _operand(a)
    s = a._shape
    nd = len(s)
    if axes is None:
        axes = tuple(range(nd - 1, -1, -1))
    else:
        given = axes
        axes = _fast_axes(axes, nd)
        if axes is None or len(axes) != nd or len(set(axes)) != nd:
            axes = _ints(given, "transpose", "axes")
            if len(axes) != nd:
                raise AxisError(f"[transpose] Received {len(axes)} axes {axes} for an array "
                                f"of dimension {nd}.")
            axes = tuple([_axis(ax, nd, "transpose", "axes") for ax in axes])
            if len(set(axes)) != nd:
                raise AxisError(f"[transpose] Repeated axes in {axes}.")
    return lazy(tuple([s[i] for i in axes]), a._dtype, Transpose(to_stream(stream), axes), (a,))


def permute_dims(a, /, axes=None, *, stream=None) -> array:
    """See :func:`transpose`."""
    return transpose(a, axes, stream=stream)


def swapaxes(a, /, axis1: int, axis2: int, *, stream=None) -> array:
    """Swap two axes of an array.

    Returns:
        array: The array with ``axis1`` and ``axis2`` exchanged (a view).
    """
    a = _operand(a)
    nd = len(a._shape)
    i = _axis(axis1, nd, "swapaxes", "axis1")
    j = _axis(axis2, nd, "swapaxes", "axis2")
    axes = list(range(nd))
    axes[i], axes[j] = j, i
    return transpose(a, tuple(axes), stream=stream)


def moveaxis(a, /, source: int, destination: int, *, stream=None) -> array:
    """Move an axis to a new position.

    Returns:
        array: The array with axis ``source`` at position ``destination`` (a view).
    """
    a = _operand(a)
    nd = len(a._shape)
    src = _axis(source, nd, "moveaxis", "source")
    dst = _axis(destination, nd, "moveaxis", "destination")
    axes = [i for i in range(nd) if i != src]
    axes.insert(dst, src)
    return transpose(a, tuple(axes), stream=stream)


# -- broadcasting ----------------------------------------------------------------
def broadcast_shapes(*shapes) -> tuple:
    """The shape that ``shapes`` broadcast to.

    Example:
        >>> broadcast_shapes((2, 1), (3,))
        (2, 3)
    """
    if not shapes:
        raise ShapeError("[broadcast_shapes] Must provide at least one shape.")
    return _broadcast_shapes(*(_ints(s, "broadcast_shapes", "shape") for s in shapes))


def broadcast_to(a, /, shape, *, stream=None) -> array:
    """Broadcast an array (or scalar) to the given shape, by NumPy's rules.

    Returns:
        array: The broadcast array (a view; no copy).
    """
    a = _operand(a)
    shape = _ints(shape, "broadcast_to", "shape")
    s = a._shape
    if s != shape:
        check_dimensions(shape, "broadcast_to")
        off = len(shape) - len(s)
        ok = off >= 0
        if ok:
            for i, d in enumerate(s):
                if d != 1 and d != shape[off + i]:
                    ok = False
                    break
        if not ok:
            raise ShapeError(f"[broadcast_to] Cannot broadcast an array of shape {s} into "
                             f"shape {shape}.")
    return lazy(shape, a._dtype, BroadcastTo(to_stream(stream), shape), (a,))


def broadcast_arrays(*arrays, stream=None) -> list:
    """Broadcast arrays against each other (dtypes are kept).

    Returns:
        list(array): The arrays, each with the common shape.
    """
    arrays = [_operand(x) for x in arrays]
    if not arrays:
        return []
    shape = _broadcast_shapes(*(x._shape for x in arrays))
    return [broadcast_to(x, shape, stream=stream) for x in arrays]


# -- joining and splitting ---------------------------------------------------------
def _joined(arrays, op: str) -> list:
    if isinstance(arrays, array) or not isinstance(arrays, (list, tuple)):
        raise DtypeError(f"[{op}] arrays must be a list or tuple of arrays, got "
                         f"{type(arrays).__name__}.")
    if not arrays:
        raise ShapeError(f"[{op}] No arrays provided.")
    xs = [x if type(x) is array else as_array(x) for x in arrays]
    d = xs[0]._dtype
    mixed = False
    for x in xs:
        if x._dtype is not d:
            d = dt.promote_types(d, x._dtype)
            mixed = True
    if mixed:
        xs = [cast(x, d) for x in xs]
    return xs


def concatenate(arrays, axis=0, *, stream=None) -> array:
    """Concatenate arrays along an axis.

    Args:
        arrays (list(array)): Arrays of equal dimension whose shapes match except along
            ``axis``; their dtypes are promoted to a common one.
        axis (int, optional): The axis; ``None`` concatenates the flattened arrays.
            Default: ``0``.

    Returns:
        array: The concatenated array.
    """
    xs = _joined(arrays, "concatenate")
    if axis is None:
        xs = [reshape(x, (-1,), stream=stream) if len(x._shape) != 1 else x for x in xs]
        axis = 0
    s0 = xs[0]._shape
    nd = len(s0)
    ax = axis + nd if type(axis) is _int and -nd <= axis < 0 else axis
    if type(ax) is not _int or not 0 <= ax < nd:
        ax = _axis(axis, nd, "concatenate")
    head, tail = s0[:ax], s0[ax + 1:]
    total = 0
    for x in xs:
        s = x._shape
        if len(s) != nd:
            raise ShapeError(f"[concatenate] All arrays must have the same number of dimensions; "
                             f"got shapes {', '.join(str(y._shape) for y in xs)}.")
        if s[:ax] != head or s[ax + 1:] != tail:
            raise ShapeError(f"[concatenate] Shapes must match except along axis {ax}; got "
                             f"{', '.join(str(y._shape) for y in xs)}.")
        total += s[ax]
    if len(xs) == 1:
        return _alias(xs[0], stream)
    return lazy(s0[:ax] + (total,) + s0[ax + 1:], xs[0]._dtype,
                Concatenate(to_stream(stream), ax), tuple(xs))


def concat(arrays, axis=0, *, stream=None) -> array:
    """See :func:`concatenate`."""
    return concatenate(arrays, axis, stream=stream)


def stack(arrays, axis=0, *, stream=None) -> array:
    """Stack arrays of one shape along a new axis.

    Args:
        arrays (list(array)): Arrays of the same shape (dtypes are promoted).
        axis (int, optional): The position of the new axis in the output. Default: ``0``.

    Returns:
        array: The stacked array.
    """
    xs = _joined(arrays, "stack")
    s0 = xs[0]._shape
    for x in xs:
        if x._shape != s0:
            raise ShapeError(f"[stack] All arrays must have the same shape; got "
                             f"{', '.join(str(y._shape) for y in xs)}.")
    ax = _axis(0 if axis is None else axis, len(s0) + 1, "stack")
    return concatenate([expand_dims(x, ax, stream=stream) for x in xs], ax, stream=stream)


def unstack(x, /, *, axis: int = 0, stream=None) -> tuple:
    """Split an array along an axis into its slices, that axis removed.

    Returns:
        tuple(array): ``x.shape[axis]`` arrays.
    """
    x = _operand(x)
    ax = _axis(axis, len(x._shape), "unstack")
    n = x._shape[ax]
    if n == 0:
        return ()
    return tuple(squeeze(p, ax, stream=stream) for p in split(x, n, ax, stream=stream))


def split(a, /, indices_or_sections, axis: int = 0, *, stream=None) -> list:
    """Split an array along an axis.

    Args:
        a (array): Input array.
        indices_or_sections (int or list(int)): A number of equal pieces (it must divide
            the axis), or the indices to cut before (as Python slicing treats them).
        axis (int, optional): The axis. Default: ``0``.

    Returns:
        list(array): The pieces (views of ``a``).
    """
    a = _operand(a)
    ax = _axis(axis, len(a._shape), "split")
    n = a._shape[ax]
    sections = indices_or_sections
    if isinstance(sections, (_int, np.integer)) and not isinstance(sections, bool):
        k = _int(sections)
        if k <= 0:
            raise ArgumentError(f"[split] The number of sections must be positive, got {k}.")
        if n % k:
            raise ShapeError(f"[split] An axis of size {n} (array shape {a._shape}, axis {ax}) "
                             f"cannot be split into {k} equal sections.")
        step = n // k
        indices = tuple(range(step, n, step)) if step else (0,) * (k - 1)
    else:
        indices = tuple(min(max(i + n if i < 0 else i, 0), n)
                        for i in _ints(indices_or_sections, "split", "indices_or_sections"))
    s = a._shape
    shapes = [s[:ax] + (m,) + s[ax + 1:] for m in _piece_sizes(indices, n)]
    return lazy_multi(shapes, [a._dtype] * len(shapes), Split(to_stream(stream), indices, ax), (a,))


def tile(a, reps, /, *, stream=None) -> array:
    """Construct an array by repeating ``a`` ``reps`` times along each axis.

    ``a`` and ``reps`` are aligned from the right; the shorter is padded with ones.

    Returns:
        array: The tiled array.
    """
    a = _operand(a)
    reps = _ints(reps, "tile", "reps")
    if any(r < 0 for r in reps):
        raise ShapeError(f"[tile] reps must be non-negative, got {reps}.")
    nd = max(len(a._shape), len(reps))
    s = (1,) * (nd - len(a._shape)) + a._shape
    r = (1,) * (nd - len(reps)) + reps
    if all(x == 1 for x in r):
        return reshape(a, s, stream=stream)
    inter = tuple(v for pair in zip((1,) * nd, s) for v in pair)
    big = tuple(v for pair in zip(r, s) for v in pair)
    x = reshape(a, inter, stream=stream)
    x = broadcast_to(x, big, stream=stream)
    return reshape(x, tuple(ri * si for ri, si in zip(r, s)), stream=stream)


def repeat(array, repeats: int, axis=None, *, stream=None):
    """Repeat each element of an array along an axis.

    Args:
        array (array): Input array.
        repeats (int): How many times each element repeats.
        axis (int, optional): The axis. Default: the flattened array.

    Returns:
        array: The array with each element repeated.
    """
    a = _operand(array)
    if isinstance(repeats, bool):
        raise DtypeError("[repeat] repeats must be an integer, got a bool.")
    try:
        repeats = _index(repeats)
    except TypeError:
        raise DtypeError(f"[repeat] repeats must be an integer, got {repeats!r}.") from None
    if repeats < 0:
        raise ArgumentError(f"[repeat] The number of repeats cannot be negative, got {repeats}.")
    if axis is None:
        a = reshape(a, (-1,), stream=stream)
        ax = 0
    else:
        ax = _axis(axis, len(a._shape), "repeat")
    s = a._shape
    x = expand_dims(a, ax + 1, stream=stream)
    x = broadcast_to(x, s[:ax + 1] + (repeats,) + s[ax + 1:], stream=stream)
    return reshape(x, s[:ax] + (s[ax] * repeats,) + s[ax + 1:], stream=stream)


# -- padding, rolling, flipping -----------------------------------------------------
_PAD_MODES = ("constant", "edge", "reflect", "symmetric")


def _pad_pairs(pad_width, nd: int) -> list:
    """``pad_width`` as one (low, high) pair per axis."""
    def bad():
        return ShapeError(f"[pad] Invalid pad_width {pad_width!r} for an array of dimension "
                          f"{nd}: give an int, (pad,), (low, high) or one (low, high) per axis.")

    if isinstance(pad_width, (_int, np.integer)) and not isinstance(pad_width, bool):
        pairs = [(_int(pad_width), _int(pad_width))] * nd
    elif isinstance(pad_width, (list, tuple)):
        if all(isinstance(p, (_int, np.integer)) and not isinstance(p, bool) for p in pad_width):
            if len(pad_width) == 1:
                pairs = [(_int(pad_width[0]),) * 2] * nd
            elif len(pad_width) == 2:
                pairs = [(_int(pad_width[0]), _int(pad_width[1]))] * nd
            elif nd == 0 and not pad_width:
                pairs = []
            else:
                raise bad()
        else:
            pairs = []
            for p in pad_width:
                p = _ints(p, "pad", "pad_width")
                if len(p) == 1:
                    p = p * 2
                if len(p) != 2:
                    raise bad()
                pairs.append(p)
            if len(pairs) == 1:
                pairs = pairs * nd
            elif len(pairs) != nd:
                raise bad()
    else:
        raise DtypeError(f"[pad] pad_width must be an int or a sequence of ints, got "
                         f"{pad_width!r}.")
    for ax, (lo, hi) in enumerate(pairs):
        if lo < 0 or hi < 0:
            raise ShapeError(f"[pad] Padding sizes must be non-negative, got ({lo}, {hi}) for "
                             f"axis {ax}.")
    return pairs


def pad(a, pad_width, mode: str = "constant", constant_values=0, *, stream=None) -> array:
    """Pad an array.

    Args:
        a (array): Input array.
        pad_width (int, tuple(int) or list(tuple(int, int))): Padding per axis: an int
            (both sides of every axis), ``(low, high)`` for every axis, or one
            ``(low, high)`` pair per axis.
        mode (str): ``"constant"`` pads with ``constant_values``; ``"edge"`` repeats the
            edge values; ``"reflect"`` mirrors without the edge, ``"symmetric"`` with it.
        constant_values (scalar or array): The padding value for ``"constant"`` (cast
            to ``a``'s dtype). Default: ``0``.

    Returns:
        array: The padded array.
    """
    a = _operand(a)
    if mode not in _PAD_MODES:
        raise ArgumentError(f"[pad] Invalid padding mode {mode!r}; use one of "
                            f"{', '.join(_PAD_MODES)}.")
    pairs = _pad_pairs(pad_width, len(a._shape))
    axes = tuple(i for i, (lo, hi) in enumerate(pairs) if lo or hi)
    if not axes:
        return _alias(a, stream)
    if mode == "constant":
        v = constant_values
        if isinstance(v, (bool, _int, float, complex)):
            v = as_array(v, a._dtype)
        else:
            v = cast(_operand(v), a._dtype, stream)
            if v.size != 1:
                raise ShapeError(f"[pad] constant_values must hold one value, got an array of "
                                 f"shape {v._shape}.")
            if v._shape != ():
                v = reshape(v, (), stream=stream)
        lo = tuple(pairs[i][0] for i in axes)
        hi = tuple(pairs[i][1] for i in axes)
        shape = list(a._shape)
        for ax, l, h in zip(axes, lo, hi):
            shape[ax] += l + h
        return lazy(tuple(shape), a._dtype, Pad(to_stream(stream), axes, lo, hi), (a, v))
    # Edge/reflect/symmetric: a gather of computed positions along each padded axis,
    # NumPy's np.pad on an index vector giving exactly its semantics.
    out = a
    for ax in axes:
        n = a._shape[ax]
        if n == 0:
            raise ShapeError(f"[pad] Cannot pad the empty axis {ax} (array shape {a._shape}) "
                             f"in mode {mode!r}.")
        idx = np.pad(np.arange(n, dtype=np.int32), pairs[ax], mode=mode)
        out = mx.take(out, from_buffer(idx, dt.int32), axis=ax, stream=stream)
    return out


def roll(a, shift, axis=None, *, stream=None) -> array:
    """Roll array elements along the given axes: an element shifted past the end comes
    back at the start.

    Args:
        a (array): Input array.
        shift (int or tuple(int)): The shifts; several shifts of one axis add up.
        axis (int or tuple(int), optional): The axes, matched with ``shift`` (one of
            them may be a single value used for all). Default: the flattened array.

    Returns:
        array: The rolled array.
    """
    a = _operand(a)
    shifts = _ints(shift, "roll", "shift")
    if axis is None:
        flat = reshape(a, (-1,), stream=stream)
        return reshape(_roll_axes(flat, {0: sum(shifts)}, stream), a._shape, stream=stream)
    nd = len(a._shape)
    axes = tuple(_axis(x, nd, "roll") for x in _ints(axis, "roll", "axis"))
    if len(shifts) == 1:
        shifts = shifts * len(axes)
    elif len(axes) == 1:
        axes = axes * len(shifts)
    elif len(axes) != len(shifts):
        raise ShapeError(f"[roll] shift {shifts} and axis {axes} must have the same length.")
    total: dict = {}
    for ax, s in zip(axes, shifts):
        total[ax] = total.get(ax, 0) + s
    return _roll_axes(a, total, stream)


def _roll_axes(a: array, shifts: dict, stream) -> array:
    out = a
    for ax, s in shifts.items():
        n = a._shape[ax]
        if n == 0 or s % n == 0:
            continue
        k = n - s % n
        head = (_py_slice(None),) * ax
        out = concatenate([_index_on(out, head + (_py_slice(k, None),), stream),
                           _index_on(out, head + (_py_slice(None, k),), stream)], ax, stream=stream)
    return out if out is not a else _alias(a, stream)


def flip(a, /, axis=None, *, stream=None) -> array:
    """Reverse the order of elements along the given axes (default: all axes).

    Returns:
        array: The flipped array (a view).
    """
    a = _operand(a)
    nd = len(a._shape)
    if axis is None:
        axes = set(range(nd))
    else:
        axes = {_axis(x, nd, "flip") for x in _ints(axis, "flip", "axis")}
    if not axes:
        return _alias(a, stream)
    rev = _py_slice(None, None, -1)
    full = _py_slice(None)
    return _index_on(a, tuple(rev if i in axes else full for i in range(nd)), stream)


def _index_on(a: array, key: tuple, stream) -> array:
    """``a[key]`` (the indexing pack's basic slicing) on ``stream``."""
    if stream is None:
        return a[key]
    with mx.stream(stream):
        return a[key]


# -- diagonals ------------------------------------------------------------------
def diagonal(a, offset: int = 0, axis1: int = 0, axis2: int = 1, stream=None) -> array:
    """The diagonals of an array.

    Args:
        a (array): Input array of at least two dimensions.
        offset (int): The diagonal: positive above the main one, negative below.
        axis1, axis2 (int): The axes of the 2-D planes whose diagonals are taken.

    Returns:
        array: The diagonals; the two axes are removed and the diagonal is the last axis.
    """
    a = _operand(a)
    nd = len(a._shape)
    if nd < 2:
        raise ShapeError(f"[diagonal] The array must have at least two dimensions, got shape "
                         f"{a._shape}.")
    ax1 = _axis(axis1, nd, "diagonal", "axis1")
    ax2 = _axis(axis2, nd, "diagonal", "axis2")
    if ax1 == ax2:
        raise AxisError(f"[diagonal] axis1 and axis2 cannot be the same axis ({axis1}, {axis2}).")
    offset = _index(offset)
    shape = _diagonal_shape(a._shape, offset, ax1, ax2)
    return lazy(shape, a._dtype, Diagonal(to_stream(stream), offset, ax1, ax2), (a,))


def diag(a, /, k: int = 0, *, stream=None) -> array:
    """Extract a diagonal or construct a diagonal matrix.

    Args:
        a (array): 1-D (the diagonal of the matrix to build) or 2-D (the matrix).
        k (int): The diagonal: positive above the main one, negative below.

    Returns:
        array: The diagonal of a 2-D ``a``, or the square matrix with 1-D ``a`` on
        diagonal ``k``.
    """
    a = _operand(a)
    nd = len(a._shape)
    k = _index(k)
    if nd == 2:
        return diagonal(a, k, 0, 1, stream=stream)
    if nd != 1:
        raise ShapeError(f"[diag] The array must be 1-D or 2-D, got shape {a._shape}.")
    n = a._shape[0] + abs(k)
    return lazy((n, n), a._dtype, Diag(to_stream(stream), k), (a,))


def trace(a, /, offset: int = 0, axis1: int = 0, axis2: int = 1, dtype=None, *,
          stream=None) -> array:
    """The sum along a diagonal of an array.

    Args:
        a (array): Input array of at least two dimensions.
        offset (int), axis1 (int), axis2 (int): The diagonal, as in :func:`diagonal`.
        dtype (Dtype, optional): The dtype to sum in; default that of :func:`sum`.

    Returns:
        array: The traces, with the two axes removed.
    """
    a = _operand(a)
    if len(a._shape) < 2:
        raise ShapeError(f"[trace] The array must have at least two dimensions, got shape "
                         f"{a._shape}.")
    d = diagonal(a, offset, axis1, axis2, stream=stream)
    if dtype is not None:
        d = cast(d, dt.to_dtype(dtype), stream)
    return mx.sum(d, axis=-1, stream=stream)


# -- views ------------------------------------------------------------------------
def as_strided(a, /, shape=None, strides=None, offset: int = 0, *, stream=None) -> array:
    """A view of an array with the given shape and strides.

    The array is read as if it were row contiguous, whatever its layout. Unlike MLX,
    a view that would reach outside the array is refused (IndexOutOfRangeError).

    Args:
        a (array): Input array.
        shape (list(int), optional): The view's shape. Default: ``a.shape``.
        strides (list(int), optional): The view's strides, in elements. Default: the
            row-major strides of ``shape``.
        offset (int): The element the view starts at.

    Returns:
        array: The strided view.
    """
    a = _operand(a)
    shape = a._shape if shape is None else _ints(shape, "as_strided", "shape")
    if any(d < 0 for d in shape):
        raise ShapeError(f"[as_strided] Negative dimensions are not allowed: shape {shape}.")
    if strides is None:
        st, acc = [], 1
        for d in reversed(shape):
            st.append(acc)
            acc *= d
        strides = tuple(reversed(st))
    else:
        strides = _ints(strides, "as_strided", "strides")
    if len(strides) != len(shape):
        raise ShapeError(f"[as_strided] shape {shape} and strides {strides} must have the same "
                         f"length.")
    offset = _index(offset)
    if 0 not in shape:
        lo = offset + sum((d - 1) * s for d, s in zip(shape, strides) if s < 0)
        hi = offset + sum((d - 1) * s for d, s in zip(shape, strides) if s > 0)
        if lo < 0 or hi >= a.size:
            raise IndexOutOfRangeError(
                f"[as_strided] shape {shape}, strides {strides} and offset {offset} reach "
                f"elements {lo}..{hi}, outside an array of {a.size} elements.")
    return lazy(shape, a._dtype, AsStrided(to_stream(stream), shape, strides, offset), (a,))


def view(a, dtype, stream=None) -> array:
    """View the array as a different type.

    The bytes of each element (read in row-major order) are reinterpreted; when the
    dtypes differ in size, the last axis grows or shrinks accordingly.

    Args:
        a (array or scalar): Input.
        dtype (Dtype): The type to view as.

    Returns:
        array: The array with the new type.
    """
    a = _operand(a)
    dtype = dt.to_dtype(dtype)
    shape = _view_shape(a._shape, a._dtype, dtype)
    return lazy(shape, dtype, View(to_stream(stream), dtype), (a,))


def contiguous(a, /, allow_col_major: bool = False, *, stream=None) -> array:
    """Force an array to be row contiguous, copying if necessary.

    Args:
        allow_col_major (bool): Accept a column-major array as it is.

    Returns:
        array: The contiguous array.
    """
    a = _operand(a)
    return lazy(a._shape, a._dtype, Contiguous(to_stream(stream), bool(allow_col_major)), (a,))


# -- dynamic slices -------------------------------------------------------------------
def _start_indices(start, axes, a_shape: tuple, sizes: tuple, op: str) -> array:
    start = _operand(start)
    if start._dtype.kind not in "iu":
        raise DtypeError(f"[{op}] start_indices must be integers, got dtype {start._dtype.name}.")
    if len(start._shape) > 1:
        raise ShapeError(f"[{op}] start_indices must be 0-D or 1-D, got shape {start._shape}.")
    if start.size != len(axes):
        raise ShapeError(f"[{op}] {start.size} start indices do not match {len(axes)} axes {axes}.")
    if start._data is not None:
        _check_starts(start._numpy(), axes, a_shape, sizes, op)
    return start


def _check_starts(starts, axes, a_shape, sizes, op):
    """The starts, negative ones wrapped, as Python ints; raise if a block leaves ``a``."""
    out = []
    for s, ax in zip(np.asarray(starts).reshape(-1).tolist(), axes):
        n = a_shape[ax]
        w = s + n if s < 0 else s
        if w < 0 or w + sizes[ax] > n:
            raise IndexOutOfRangeError(
                f"[{op}] A block of size {sizes[ax]} starting at {s} along axis {ax} does not "
                f"fit in an axis of size {n}.")
        out.append(w)
    return out


def slice(a, start_indices, axes, slice_size, *, stream=None) -> array:
    """Extract a sub-array from the input array, starting at positions held in an array.

    Args:
        a (array): Input array.
        start_indices (array): The start along each of ``axes`` (negative starts count
            from the end). A block that would leave ``a`` raises IndexOutOfRangeError
            (at the call when the starts are already computed, else at evaluation).
        axes (tuple(int)): The axes of ``start_indices``; other axes start at 0.
        slice_size (tuple(int)): The size of the block, one entry per axis of ``a``.

    Returns:
        array: The block.

    Example:
        >>> a = array([[1, 2, 3], [4, 5, 6]])
        >>> slice(a, start_indices=array(1), axes=(0,), slice_size=(1, 2))
        array([[4, 5]], dtype=int32)
    """
    a = _operand(a)
    nd = len(a._shape)
    axes = _unique_axes(axes, nd, "slice", "axes")
    size = _ints(slice_size, "slice", "slice_size")
    if len(size) != nd or any(s < 0 or s > d for s, d in zip(size, a._shape)):
        raise ShapeError(f"[slice] Invalid slice_size {size} for an array of shape {a._shape}.")
    start = _start_indices(start_indices, axes, a._shape, size, "slice")
    return lazy(size, a._dtype, DynamicSlice(to_stream(stream), axes, size), (a, start))


def slice_update(a, update, start_indices, axes, *, stream=None) -> array:
    """Update a sub-array of the input array, starting at positions held in an array.

    The block written has the update's dimensions (aligned to the right); leading axes
    the update lacks count 1 if they are among ``axes`` and span ``a`` otherwise, the
    update repeating along them.

    Args:
        a (array): The input array to update.
        update (array): The new values (cast to ``a``'s dtype).
        start_indices (array): The start along each of ``axes`` (see :func:`slice`).
        axes (tuple(int)): The axes of ``start_indices``.

    Returns:
        array: A new array with ``a``'s shape and dtype.
    """
    a = _operand(a)
    nd = len(a._shape)
    axes = _unique_axes(axes, nd, "slice_update", "axes")
    u = cast(_operand(update), a._dtype, stream)
    us = u._shape
    if len(us) > nd:
        raise ShapeError(f"[slice_update] An update of shape {us} has more dimensions than "
                         f"the array of shape {a._shape}.")
    block = _update_block(a._shape, us, axes)
    if any(b > d for b, d in zip(block, a._shape)):
        raise ShapeError(f"[slice_update] An update of shape {us} does not fit in an array of "
                         f"shape {a._shape}.")
    start = _start_indices(start_indices, axes, a._shape, block, "slice_update")
    return lazy(a._shape, a._dtype, DynamicSliceUpdate(to_stream(stream), axes), (a, u, start))


# -- array methods and properties ----------------------------------------------------
def _shape_args(args, op):
    if len(args) == 1 and not isinstance(args[0], (_int, np.integer)):
        return args[0]
    if not args:
        raise ShapeError(f"[{op}] Give the new shape, as a tuple or as separate integers.")
    return args


def _array_reshape(self, *shape, stream=None) -> array:
    """Equivalent to :func:`reshape`; the shape is a tuple or separate integers."""
    return reshape(self, _shape_args(shape, "reshape"), stream=stream)


def _array_transpose(self, *axes, stream=None) -> array:
    """Equivalent to :func:`transpose`; the axes are a tuple or separate integers."""
    if not axes:
        return transpose(self, stream=stream)
    if len(axes) == 1 and not isinstance(axes[0], (_int, np.integer)):
        axes = axes[0]
    return transpose(self, axes, stream=stream)


def _array_flatten(self, start_axis: int = 0, end_axis: int = -1, *, stream=None) -> array:
    """See :func:`flatten`."""
    return flatten(self, start_axis, end_axis, stream=stream)


def _array_squeeze(self, axis=None, *, stream=None) -> array:
    """See :func:`squeeze`."""
    return squeeze(self, axis, stream=stream)


def _array_swapaxes(self, axis1: int, axis2: int, *, stream=None) -> array:
    """See :func:`swapaxes`."""
    return swapaxes(self, axis1, axis2, stream=stream)


def _array_moveaxis(self, source: int, destination: int, *, stream=None) -> array:
    """See :func:`moveaxis`."""
    return moveaxis(self, source, destination, stream=stream)


def _array_split(self, indices_or_sections, axis: int = 0, *, stream=None) -> list:
    """See :func:`split`."""
    return split(self, indices_or_sections, axis, stream=stream)


def _array_diag(self, k: int = 0, *, stream=None) -> array:
    """Extract a diagonal or construct a diagonal matrix; see :func:`diag`."""
    return diag(self, k, stream=stream)


def _array_diagonal(self, offset: int = 0, axis1: int = 0, axis2: int = 1, stream=None) -> array:
    """See :func:`diagonal`."""
    return diagonal(self, offset, axis1, axis2, stream=stream)


def _array_view(self, dtype, *, stream=None) -> array:
    """See :func:`view`."""
    return view(self, dtype, stream=stream)


def diff(a, /, n: int = 1, axis: int = -1, *, stream=None) -> array:
    """The n-th discrete difference along the given axis.

    ``a[1:] - a[:-1]`` along ``axis``, ``n`` times (``not_equal`` for booleans, as
    NumPy and MLX); ``n`` past the axis' length gives an empty axis.

    Args:
        a (array): Input array.
        n (int, optional): The number of times to difference. Default: ``1``.
        axis (int, optional): The axis along which to difference. Default: ``-1``.

    Returns:
        array: The n-th differences.
    """
    a = _operand(a)
    n = _int_argument(n, "diff", "n")
    axis = _int_argument(axis, "diff", "axis")
    if n < 0:
        raise ArgumentError(f"[diff] Order `n` must be non-negative, got n={n}.")
    nd = len(a._shape)
    if not -nd <= axis < nd:
        raise AxisError(f"[diff] Axis {axis} is out of bounds for the array of shape "
                        f"{a._shape}.")
    axis %= nd
    lead = (_py_slice(None),) * axis
    for _ in range(n):
        if a._shape[axis] == 0:
            break
        hi, lo = a[lead + (_py_slice(1, None),)], a[lead + (_py_slice(None, -1),)]
        a = mx.not_equal(hi, lo, stream=stream) if a._dtype is dt.bool_ else \
            mx.subtract(hi, lo, stream=stream)
    return a


def _int_argument(value, op: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (_int, np.integer)):
        raise DtypeError(f"[{op}] {name} must be an integer, got {value!r}.")
    return _int(value)


# -- fp8 (e4m3) ------------------------------------------------------------------------
# MLX's to_fp8/from_fp8 are bit conversions through views of the float32 bits: written
# with integer ops here, so every backend, vmap and compile run them with no kernel of
# their own. Encoding rounds to nearest even and saturates (NaN and +-inf included) to
# +-448, MLX's rule (PyTorch's float8_e4m3fn conversion, saturating); decoding is a
# 256-entry table lookup in which, as in MLX, no code is NaN.
_FP8_SATURATE = 543 << 21      # float32 bits of the first magnitude rounding past 448
_FP8_NORMAL = 121 << 23        # float32 bits of 2**-6, the smallest normal e4m3
_FP8_DENORM = 141 << 23        # float32 bits of 2**14: adding it rounds to 2**-9 steps
_FP8_BIAS = (((7 - 127) << 23) + 0x7FFFF) % (1 << 32)  # rebias the exponent, round up


def _u32(value: int) -> array:
    return array(np.uint32(value))


def to_fp8(x, *, stream=None) -> array:
    """Convert the array to fp8 (e4m3) from another floating-point type.

    Args:
        x (array): The input array, of a real floating dtype.

    Returns:
        array: The array converted to fp8, as the bits in a ``uint8`` array.
    """
    x = _operand(x)
    if x._dtype.kind != "f":
        raise DtypeError(f"[to_fp8] Only real floating types are supported but x has dtype "
                         f"{x._dtype.name} (shape {x._shape}).")
    s = stream
    bits = view(cast(x, dt.float32, s), dt.uint32, stream=s)
    sign = mx.bitwise_and(bits, _u32(0x80000000), stream=s)
    mag = mx.bitwise_xor(bits, sign, stream=s)
    # Below 2**-6: add 2**14 so that float32 rounding lands on the subnormal grid.
    sub = mx.subtract(view(mx.add(view(mag, dt.float32, stream=s),
                                  view(_u32(_FP8_DENORM), dt.float32), stream=s),
                           dt.uint32, stream=s), _u32(_FP8_DENORM), stream=s)
    odd = mx.bitwise_and(mx.right_shift(mag, _u32(20), stream=s), _u32(1), stream=s)
    normal = mx.right_shift(mx.add(mx.add(mag, _u32(_FP8_BIAS), stream=s), odd, stream=s),
                            _u32(20), stream=s)
    out = mx.where(mx.less(mag, _u32(_FP8_NORMAL), stream=s), sub, normal, stream=s)
    out = mx.where(mx.greater_equal(mag, _u32(_FP8_SATURATE), stream=s), _u32(0x7E), out,
                   stream=s)
    out = mx.bitwise_or(mx.bitwise_and(out, _u32(0xFF), stream=s),
                        mx.right_shift(sign, _u32(24), stream=s), stream=s)
    return cast(out, dt.uint8, s)


_FP8_TABLE: list = []


def from_fp8(x, dtype=dt.bfloat16, *, stream=None) -> array:
    """Convert the array from fp8 (e4m3) to another floating-point type.

    Args:
        x (array): The input fp8 array with type ``uint8``.
        dtype (Dtype): The data type to convert to. Default: ``bfloat16``.

    Returns:
        array: The array converted from fp8.
    """
    x = _operand(x)
    dtype = dt.to_dtype(dtype)
    if x._dtype is not dt.uint8:
        raise DtypeError(f"[from_fp8] Input must have type uint8 but x has dtype "
                         f"{x._dtype.name} (shape {x._shape}).")
    if dtype.kind != "f":
        raise DtypeError(f"[from_fp8] Only real floating types are supported but dtype is "
                         f"{dtype.name}.")
    if not _FP8_TABLE:
        # All 256 codes are finite in MLX's decoding (0x7F is 480, not NaN).
        c = np.arange(256)
        e, m = (c >> 3) & 0xF, (c & 7).astype(np.float64)
        mag = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e - 7))
        _FP8_TABLE.append(array(np.where(c >> 7, -mag, mag).astype(np.float32)))
    # Every e4m3 value is exact in float16 and bfloat16: one rounding, none lost.
    return cast(mx.take(_FP8_TABLE[0], x, stream=stream), dtype, stream)


def _T(self) -> array:
    """The array with its axes reversed: ``self.transpose()``."""
    return transpose(self)


def _mT(self) -> array:
    """The array with its last two axes swapped."""
    nd = len(self._shape)
    if nd < 2:
        raise ShapeError(f"[matrix_transpose] The array must have at least two dimensions, "
                         f"got shape {self._shape}.")
    return transpose(self, tuple(range(nd - 2)) + (nd - 1, nd - 2))


PRIMITIVES = [Reshape, Flatten, Unflatten, Squeeze, ExpandDims, Transpose, BroadcastTo,
              Concatenate, Split, Pad, DynamicSlice, DynamicSliceUpdate, AsStrided, View,
              Contiguous, Diagonal, Diag]

OPS = {
    "reshape": reshape, "flatten": flatten, "unflatten": unflatten, "squeeze": squeeze,
    "expand_dims": expand_dims, "atleast_1d": atleast_1d, "atleast_2d": atleast_2d,
    "atleast_3d": atleast_3d, "transpose": transpose, "permute_dims": permute_dims,
    "swapaxes": swapaxes, "moveaxis": moveaxis, "broadcast_shapes": broadcast_shapes,
    "broadcast_to": broadcast_to, "broadcast_arrays": broadcast_arrays,
    "concatenate": concatenate, "concat": concat, "stack": stack, "unstack": unstack,
    "split": split, "tile": tile, "repeat": repeat, "pad": pad, "roll": roll, "flip": flip,
    "diagonal": diagonal, "diag": diag, "trace": trace, "as_strided": as_strided,
    "view": view, "contiguous": contiguous, "slice": slice, "slice_update": slice_update,
    "matrix_transpose": transpose, "diff": diff, "to_fp8": to_fp8, "from_fp8": from_fp8,
    "array.reshape": _array_reshape, "array.transpose": _array_transpose,
    "array.flatten": _array_flatten, "array.squeeze": _array_squeeze,
    "array.swapaxes": _array_swapaxes, "array.moveaxis": _array_moveaxis,
    "array.split": _array_split, "array.diag": _array_diag,
    "array.diagonal": _array_diagonal, "array.view": _array_view,
    "array.T": property(_T), "array.mT": property(_mT),
}


lazyx_primitives, lazyx_ops = pack_hooks(PRIMITIVES, OPS)


# -- examples for the registry-wide transform test -------------------------------------
@hookimpl
def lazyx_examples():

    x23 = uniform((2, 3))
    i32 = dt.int32
    return [
        (Reshape, example(lambda a: reshape(a, (3, 2)), x23)),
        (Flatten, example(lambda a: flatten(a, 1, 2), uniform((2, 3, 2)))),
        (Unflatten, example(lambda a: unflatten(a, 1, (2, 2)), uniform((3, 4)))),
        (Squeeze, example(lambda a: squeeze(a, (0, 2)), uniform((1, 3, 1, 2)))),
        (ExpandDims, example(lambda a: expand_dims(a, (0, 2)), x23)),
        (Transpose, example(lambda a: transpose(a, (1, 2, 0)), uniform((2, 3, 2)))),
        (BroadcastTo, example(lambda a: broadcast_to(a, (2, 3, 2)), uniform((3, 1)))),
        (Concatenate, example(lambda a, b: concatenate([a, b], 1), x23, uniform((2, 1)))),
        (Split, example(lambda a: split(a, [1, 3], 1), uniform((2, 4)))),
        (Split, example(lambda a: split(a, [3, 1], 0), uniform((4, 2)))),  # overlapping pieces
        (Pad, example(lambda a, v: pad(a, ((1, 0), (0, 2)), constant_values=v), x23,
                      uniform(()))),
        (DynamicSlice, example(lambda a, s: slice(a, s, (0, 1), (2, 2)), uniform((4, 3)),
                               np.array([1, 0], np.int32), batch_ints=False)),
        (DynamicSlice, example(lambda a, s: slice(a, s, (1,), (2, 2)), uniform((2, 4)),
                               integers((1,), 0, 3))),
        (DynamicSliceUpdate, example(lambda a, u, s: slice_update(a, u, s, (1, 0)),
                                     uniform((4, 3)), uniform((2,)),
                                     np.array([1, 2], np.int32), batch_ints=False)),
        (AsStrided, example(lambda a: as_strided(a, (2, 2), (1, 1), 1), x23)),
        (View, example(lambda a: view(a, dt.float64), x23)),
        (View, example(lambda a: view(a, i32), x23)),
        (Contiguous, example(lambda a: contiguous(transpose(a)), x23)),
        (Diagonal, example(lambda a: diagonal(a, -1, 2, 0), uniform((3, 2, 4)))),
        (Diag, example(lambda a: diag(a, 1), uniform((3,)))),
    ]
