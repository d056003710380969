"""Sorting op pack: sort, argsort, partition, argpartition, topk and searchsorted.

Every primitive works along one axis (``axis=None`` flattens first, as in MLX).
NaNs order after every number, as in NumPy. Index outputs are ``uint32``.
Kernels live in ``lazyx.backends.cpu.kernels.sorting``.
"""

from __future__ import annotations

import operator
from typing import Literal

import numpy as np

import lazyx.core as mx
from lazyx import dtypes as dt
from lazyx.arguments import as_array, binary_operands, normalize_axis
from lazyx.array import array, lazy
from lazyx.device import to_stream
from lazyx.errors import DtypeError, ShapeError
from lazyx.hookspecs import hookimpl, pack_hooks
from lazyx.primitive import Axis, Primitive, SameShape, Size
from lazyx.examples import example, uniform
from lazyx.rules import NoGradient, batch_first, batched_axes

_uint32 = dt.uint32


class _AlongAxis(SameShape):
    """A primitive whose output has the input's shape, working along ``axis``."""

    __slots__ = ("axis",)
    axis: Axis

    # Batching shifts the working axis past the batch axis; ``_forward`` is the op.
    def vmap(self, inputs, axes):
        ax = axes[0]
        return [self._forward(inputs[0], batched_axes((self.axis,), ax)[0], self.stream)], [ax]


class _Permuting(_AlongAxis):
    """A primitive whose output holds input elements along ``axis``: ``out[j] = x[src[j]]``.

    Kernels may order equal (or, for partition and topk, any) elements freely, so
    the rules recover ``src`` from the outputs themselves: the ``r``-th smallest
    output comes from the ``r``-th smallest input (stable orders, NaNs last),
    which pairs equal values with distinct equal inputs.
    """

    __slots__ = ()

    def _sources(self, x, out, s):
        return mx.take_along_axis(mx.argsort(x, axis=self.axis, stream=s),
                                  _ranks(out, self.axis, s), axis=self.axis, stream=s)

    def _stopped_sources(self, x, out, s):
        # Indices carry no gradient, and a transform reaching one raises (as in MLX):
        # stopped, so that higher derivatives pass these rules.
        return mx.stop_gradient(self._sources(x, out, s), stream=s)

    def vjp(self, primals, cotangents, argnums, outputs):
        x, s = primals[0], self.stream
        src = self._stopped_sources(x, outputs[0], s)
        return [mx.put_along_axis(mx.zeros_like(x, stream=s), src, cotangents[0],
                                  axis=self.axis, stream=s)]

    def jvp(self, primals, tangents, argnums):
        x, s = primals[0], self.stream
        src = self._stopped_sources(x, self._forward(x, self.axis, s), s)
        return [mx.take_along_axis(tangents[0], src, axis=self.axis, stream=s)]


def _ranks(a, axis: int, s):
    """The rank of each element of ``a`` along ``axis`` (a stable sort's inverse)."""
    return mx.argsort(mx.argsort(a, axis=axis, stream=s), axis=axis, stream=s)


class _IndexOutput(NoGradient, _AlongAxis):
    """Index outputs: no gradient; batching moves the axis."""

    __slots__ = ()


class Sort(_Permuting):
    """The input sorted along ``axis`` (NaNs last)."""

    __slots__ = ()
    arity = 1

    def _sources(self, x, out, s):
        # The output is sorted: its ranks are 0, 1, ... already.
        return mx.argsort(x, axis=self.axis, stream=s)

    def _forward(self, x, axis, s):
        return mx.sort(x, axis=axis, stream=s)


class ArgSort(_IndexOutput):
    """The uint32 indices that sort the input along ``axis``; stable for equal keys."""

    __slots__ = ()
    arity = 1

    def _forward(self, x, axis, s):
        return mx.argsort(x, axis=axis, stream=s)


class Partition(_Permuting):
    """The input partitioned along ``axis``: position ``kth`` (in ``[0, n)``) holds the
    element a sort would put there, smaller-or-equal ones before it, the rest after."""

    __slots__ = ("kth",)
    arity = 1
    kth: int

    def _forward(self, x, axis, s):
        return mx.partition(x, self.kth, axis=axis, stream=s)


class ArgPartition(_IndexOutput):
    """The uint32 indices that partition the input along ``axis`` (see :class:`Partition`)."""

    __slots__ = ("kth",)
    arity = 1
    kth: int

    def _forward(self, x, axis, s):
        return mx.argpartition(x, self.kth, axis=axis, stream=s)


class TopK(_Permuting):
    """The ``k`` largest elements along ``axis`` (``0 <= k <= n``), in no particular
    order; the output's ``axis`` has size ``k``. NaNs count as largest."""

    __slots__ = ("k",)
    arity = 1
    k: Size

    def output_shapes(self, inputs):
        s = list(inputs[0].shape)
        s[self.axis] = self.k
        return [tuple(s)]

    # As for Sort and Partition: the r-th smallest of the k outputs comes from the
    # r-th smallest of the k largest inputs.
    def _sources(self, x, out, s):
        axis, n = self.axis, x._shape[self.axis]
        head = (slice(None),) * axis
        largest = mx.argsort(x, axis=axis, stream=s)[head + (slice(n - self.k, n),)]
        return mx.take_along_axis(largest, _ranks(out, axis, s), axis=axis, stream=s)

    def _forward(self, x, axis, s):
        return mx.topk(x, self.k, axis=axis, stream=s)


class SearchSorted(NoGradient, Primitive):
    """For each of ``values`` (input 1), its insertion index into the ascending 1-D
    ``sorted_sequence`` (input 0), as uint32: the count of elements ``<`` it
    (``side="left"``) or ``<=`` it (``side="right"``). Both inputs share one dtype."""

    __slots__ = ("side",)
    arity = 2
    side: Literal["left", "right"]

    def output_shapes(self, inputs):
        return [inputs[1].shape]

    def vmap(self, inputs, axes):
        seq, vals = inputs
        sx, vx = axes
        s = self.stream
        if sx is None:
            return [mx.searchsorted(seq, vals, side=self.side, stream=s)], [vx]
        # One sequence per example: count, for each value, the elements before it
        # (in the order that puts NaNs last).
        seq = batch_first(seq, sx, stream=s)
        b, n = seq._shape
        if vx is None:
            vals = mx.expand_dims(vals, 0, stream=s)
        else:
            vals = batch_first(vals, vx, stream=s)
        v = mx.expand_dims(vals, -1, stream=s)
        q = mx.reshape(seq, (b,) + (1,) * (len(v._shape) - 2) + (n,), stream=s)
        if self.side == "left":
            before = mx.less(q, v, stream=s)
            if q._dtype.kind in "fc":
                before = mx.logical_or(before, mx.logical_and(
                    mx.isnan(v, stream=s), mx.logical_not(mx.isnan(q, stream=s), stream=s),
                    stream=s), stream=s)
        else:
            before = mx.less_equal(q, v, stream=s)
            if q._dtype.kind in "fc":
                before = mx.logical_or(before, mx.isnan(v, stream=s), stream=s)
        count = mx.sum(before, axis=-1, stream=s)
        if vx is None:
            count = mx.broadcast_to(count, (b,) + count._shape[1:], stream=s)
        return [mx.astype(count, _uint32, stream=s)], [0]


# -- argument helpers ------------------------------------------------------------
def _along(a, axis, op: str):
    """``(a, axis)`` with ``a`` flattened when ``axis`` is None and ``axis`` in ``[0, ndim)``."""
    ndim = len(a._shape)
    if axis is None:
        if ndim != 1:
            a = mx.reshape(a, (a.size,))
        return a, 0
    if type(axis) is int and -ndim <= axis < ndim:
        return a, axis % ndim
    if not isinstance(axis, int) and hasattr(axis, "__index__"):
        axis = operator.index(axis)
    return a, normalize_axis(axis, ndim, f"[{op}] axis")


def _int_arg(value, name: str, op: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if hasattr(value, "__index__") and not isinstance(value, bool):
        return operator.index(value)
    raise DtypeError(f"[{op}] {name} must be an integer, got {value!r}.")


# -- op functions ----------------------------------------------------------------
def sort(a, /, axis=-1, *, stream=None) -> array:
    """Returns a sorted copy of the array.

    Args:
        a (array): Input array.
        axis (int or None, optional): Axis to sort over. If ``None``, the
          flattened array is sorted. Defaults to ``-1``.

    Returns:
        array: The sorted array (NaNs last).
    """
    a, axis = _along(as_array(a), axis, "sort")
    return lazy(a._shape, a._dtype, Sort(to_stream(stream), axis), (a,))


def argsort(a, /, axis=-1, *, stream=None) -> array:
    """Returns the indices that sort the array.

    Args:
        a (array): Input array.
        axis (int or None, optional): Axis to sort over. If ``None``, the
          flattened array is sorted. Defaults to ``-1``.

    Returns:
        array: The ``uint32`` indices; equal elements keep their order (a stable sort).
    """
    a, axis = _along(as_array(a), axis, "argsort")
    return lazy(a._shape, _uint32, ArgSort(to_stream(stream), axis), (a,))


def _partition(cls, op, a, kth, axis, stream, out_dtype):
    a, axis = _along(as_array(a), axis, op)
    kth = _int_arg(kth, "kth", op)
    n = a._shape[axis]
    if not -n <= kth < n:
        raise ShapeError(f"[{op}] Received invalid kth {kth} along axis {axis} for an array "
                         f"of shape {a._shape}: kth must lie in [{-n}, {n}).")
    return lazy(a._shape, out_dtype or a._dtype, cls(to_stream(stream), axis, kth % n), (a,))  # slot order


def partition(a, /, kth, axis=-1, *, stream=None) -> array:
    """Returns a partitioned copy of the array such that the smaller ``kth``
    elements are first.

    The ordering of the elements within each partition is undefined.

    Args:
        a (array): Input array.
        kth (int): The element at index ``kth`` is in its sorted position; the ones
          before it are less or equal, the ones after greater or equal. Negative
          values count from the end.
        axis (int or None, optional): Axis to partition over. If ``None``, the
          flattened array is partitioned. Defaults to ``-1``.

    Returns:
        array: The partitioned array.
    """
    return _partition(Partition, "partition", a, kth, axis, stream, None)


def argpartition(a, /, kth, axis=-1, *, stream=None) -> array:
    """Returns the indices that partition the array.

    The ordering of the elements within each partition is undefined.

    Args:
        a (array): Input array.
        kth (int): The element at index ``kth`` is in its sorted position; the ones
          before it are less or equal, the ones after greater or equal. Negative
          values count from the end.
        axis (int or None, optional): Axis to partition over. If ``None``, the
          flattened array is partitioned. Defaults to ``-1``.

    Returns:
        array: The ``uint32`` indices that partition the input.
    """
    return _partition(ArgPartition, "argpartition", a, kth, axis, stream, _uint32)


def topk(a, /, k, axis=-1, *, stream=None) -> array:
    """Returns the ``k`` largest elements from the input along a given axis.

    The elements will not necessarily be in sorted order.

    Args:
        a (array): Input array.
        k (int): The number of elements to return, ``0 <= k <= a.shape[axis]``.
        axis (int or None, optional): Axis to select over. If ``None``, selects
          over the flattened array. Defaults to ``-1``.

    Returns:
        array: The top ``k`` elements (NaNs count as largest).
    """
    a, axis = _along(as_array(a), axis, "topk")
    k = _int_arg(k, "k", "topk")
    shape = a._shape
    if not 0 <= k <= shape[axis]:
        raise ShapeError(f"[topk] Received invalid k={k} along axis {axis} for an array of "
                         f"shape {shape}: k must lie in [0, {shape[axis]}].")
    out = shape[:axis] + (k,) + shape[axis + 1:]
    return lazy(out, a._dtype, TopK(to_stream(stream), axis, k), (a,))


def searchsorted(sorted_sequence, values, /, side="left", *, stream=None) -> array:
    """Find the indices that keep ``sorted_sequence`` sorted when inserting ``values``.

    Args:
        sorted_sequence (array): A 1-D array sorted in ascending order (NaNs last).
        values (array): The values to insert. May have any shape.
        side (str, optional): ``'left'`` gives the first suitable index (the count
          of elements strictly less than the value), ``'right'`` the last (the
          count of elements less or equal). Defaults to ``'left'``.

    Returns:
        array: A ``uint32`` array of ``values``' shape holding indices in
        ``[0, sorted_sequence.size]``.

    Example:
        >>> a = mx.array([1, 2, 2, 4])
        >>> mx.searchsorted(a, mx.array([0, 2, 3, 5]))
        array([0, 1, 3, 4], dtype=uint32)
    """
    if side != "left" and side != "right":
        raise ValueError(f"[searchsorted] Invalid side {side!r}: expected 'left' or 'right'.")
    seq = as_array(sorted_sequence)
    if len(seq._shape) != 1:
        raise ShapeError(f"[searchsorted] The sorted sequence must be 1-D, got shape "
                         f"{seq._shape}.")
    # Python scalars get their own dtype: inserting 300 into uint8 data must not wrap.
    seq, vals, _ = binary_operands(seq, as_array(values), stream)
    return lazy(vals._shape, _uint32, SearchSorted(to_stream(stream), side), (seq, vals))


PRIMITIVES = [Sort, ArgSort, Partition, ArgPartition, TopK, SearchSorted]

OPS = {
    "sort": sort, "argsort": argsort, "partition": partition, "argpartition": argpartition,
    "topk": topk, "searchsorted": searchsorted,
}


lazyx_primitives, lazyx_ops = pack_hooks(PRIMITIVES, OPS)


@hookimpl
def lazyx_examples():
    x = uniform((2, 4))
    return [
        (Sort, example(lambda a: sort(a, axis=0), x)),
        (ArgSort, example(lambda a: argsort(a, axis=1), x)),
        (Partition, example(lambda a: partition(a, 1, axis=1), x)),
        (ArgPartition, example(lambda a: argpartition(a, 1, axis=0), x)),
        (TopK, example(lambda a: topk(a, 2, axis=1), x)),
        (SearchSorted, example(lambda q, v: searchsorted(q, v, side="right"),
                               np.sort(uniform((5,))), uniform((2, 3)))),
    ]
