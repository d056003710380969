"""Reductions op pack: sums, extrema, statistics, arg-reductions and scans.

Four primitive families carry everything:

* :class:`Reduce` (``op`` one of ``sum prod max min all any``) over a tuple of axes;
* :class:`ArgReduce` (``argmax``/``argmin``) over one axis or the flattened array;
* :class:`LogSumExp`, a primitive of its own so that its kernels can be
  numerically stable (max-subtracted) in one pass;
* :class:`Scan` (``op`` one of ``sum prod max min logaddexp``) for the cumulative ops.

``mean``, ``var``, ``std`` and ``count_nonzero`` are compositions of these with
element-wise ops, as in MLX; ``median`` is a primitive (:class:`Median`) because
its NumPy kernel is one call. The element count that ``mean``, ``var`` and ``std``
divide by is a constant when they run eagerly; inside a compile trace it is a
:class:`NumberOfElements` node, so that a shapeless compile counts again at each
call's input shapes (MLX's primitive of the same name). Kernels live in
``lazyx.backends.cpu.kernels.reductions``.
"""

from __future__ import annotations

import builtins
import operator
from typing import Literal

import lazyx.core as mx
from lazyx import dtypes as dt
from lazyx.arguments import as_array, cast, normalize_axes, normalize_axis
from lazyx.array import array, lazy
from lazyx.device import to_stream
from lazyx.errors import DtypeError, ShapeError
from lazyx.hookspecs import hookimpl, pack_hooks
from lazyx.primitive import Axes, Axis, Primitive, SameShape
from lazyx.examples import example, uniform
from lazyx.rules import NoGradient, batch_first, batched_axes
from lazyx.transforms.compile import _settings as _compile  # .tracing: inside a compile trace
from lazyx.plugins.creation import full_like_node

_float32 = dt.float32
_bool = dt.bool_
_int32 = dt.int32
_HALF = (dt.float16, dt.bfloat16)
#: The dtype of sum/prod by input dtype (MLX widens bool and small integers).
SUM_DTYPE = {dt.bool_: dt.int32, dt.int8: dt.int32, dt.int16: dt.int32,
             dt.uint8: dt.uint32, dt.uint16: dt.uint32}
_ALL_AXES: dict = {}


# -- shape helpers -------------------------------------------------------------
def reduced_shape(shape: tuple, axes: tuple, keepdims: bool) -> tuple:
    """``shape`` with ``axes`` (sorted, non-negative) removed, or set to 1 when ``keepdims``."""
    if len(axes) == len(shape):
        return (1,) * len(shape) if keepdims else ()
    if len(axes) == 1:
        i = axes[0]
        return shape[:i] + (1,) + shape[i + 1:] if keepdims else shape[:i] + shape[i + 1:]
    if keepdims:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def _axes(axis, ndim: int, op: str) -> tuple:
    """The reduction axes as sorted unique non-negative ints (AxisError names op, axis, ndim)."""
    if axis is None:
        axes = _ALL_AXES.get(ndim)
        if axes is None:
            axes = _ALL_AXES[ndim] = tuple(range(ndim))
        return axes
    t = type(axis)
    if t is int:
        if -ndim <= axis < ndim:
            return (axis % ndim,)
    elif t is tuple or t is list:
        # The common case, in-range ints, without building an error-message name.
        out = set()
        for x in axis:
            if type(x) is not int or not -ndim <= x < ndim:
                break
            out.add(x % ndim)
        else:
            if len(out) == len(axis):
                return tuple(sorted(out))
    elif hasattr(axis, "__index__"):
        axis = operator.index(axis)
    return normalize_axes(axis, ndim, f"[{op}] axis")


def _axis(axis, ndim: int, op: str) -> int:
    """One axis in ``[0, ndim)``."""
    if type(axis) is int and -ndim <= axis < ndim:
        return axis % ndim
    if not isinstance(axis, int) and hasattr(axis, "__index__"):
        axis = operator.index(axis)
    return normalize_axis(axis, ndim, f"[{op}] axis")


def _size(shape: tuple, axes: tuple) -> int:
    n = 1
    for i in axes:
        n *= shape[i]
    return n


def _check_nonempty(op: str, shape: tuple, axes: tuple) -> None:
    for i in axes:
        if shape[i] == 0:
            raise ShapeError(f"[{op}] Cannot reduce over axis {i} of size 0 (array shape "
                             f"{shape}): {op} of no elements is undefined.")


# -- primitives ------------------------------------------------------------------
class _OverAxes(Primitive):
    """A reduction over the sorted, non-negative ``axes`` (size-1 dims when ``keepdims``)."""

    __slots__ = ("axes", "keepdims")
    axes: Axes
    keepdims: bool

    def output_shapes(self, inputs):
        return [reduced_shape(inputs[0].shape, self.axes, self.keepdims)]

    def vmap(self, inputs, axes):
        new, out_ax = _batched_axes(self.axes, axes[0], self.keepdims)
        return [self._apply(inputs[0], new)], [out_ax]

    def _apply(self, x, axes):
        """The op itself on ``x`` over ``axes`` (the subclass's op function)."""
        raise NotImplementedError


class Reduce(_OverAxes):
    """Reduce one input over ``axes`` with ``op`` (``sum prod max min all any``).

    Output dtype: ``bool`` for ``all``/``any``; for ``sum``/``prod`` bool, int8 and
    int16 give int32, uint8 and uint16 give uint32 (:data:`SUM_DTYPE`), other
    dtypes are kept; ``max``/``min`` keep the input dtype. float16 and bfloat16
    accumulate in float32. ``axes`` is never empty.
    """

    __slots__ = ("op",)
    arity = 1
    op: Literal["sum", "prod", "max", "min", "all", "any"]

    # Positionally the op comes first (``Reduce(stream, "sum", axes, keepdims)``),
    # before the slots it inherits.
    def __init__(self, stream, op: str, axes: tuple, keepdims: bool):
        super().__init__(stream, axes, keepdims, op)

    # max/min: the gradient is shared equally among the elements equal to the
    # extremum (MLX's convention); all/any have none.
    def vjp(self, primals, cotangents, argnums, outputs):
        op = self.op
        if op == "all" or op == "any":
            return [None]
        x, s = primals[0], self.stream
        c = _expanded(cotangents[0], x, self.axes, self.keepdims, s)
        if op == "sum":
            return [c]
        if op == "prod":
            # g * conj(d), as every complex rule (MLX's convention; see elementwise.py).
            others = _prod_of_others(x, self.axes, s)
            if others._dtype.kind == "c":
                others = mx.conj(others, stream=s)
            return [mx.multiply(c, others, stream=s)]
        out = outputs[0]
        if not self.keepdims:
            out = mx.expand_dims(out, self.axes, stream=s)
        return [mx.multiply(c, self._extremum_weights(x, out, s), stream=s)]

    def jvp(self, primals, tangents, argnums):
        op = self.op
        if op == "all" or op == "any":
            return [None]
        x, t, s = primals[0], tangents[0], self.stream
        if op == "prod":
            t = mx.multiply(t, _prod_of_others(x, self.axes, s), stream=s)
        elif op != "sum":
            out = _reduce(op, x, self.axes, True, s)
            t = mx.multiply(t, self._extremum_weights(x, out, s), stream=s)
        return [_reduce("sum", t, self.axes, self.keepdims, s)]

    def _apply(self, x, axes):
        return getattr(mx, self.op)(x, axis=axes, keepdims=self.keepdims, stream=self.stream)

    def _extremum_weights(self, x, out, s):
        """1/count where ``x`` equals the extremum of its group (``out``, reduced axes
        kept), else 0."""
        hit = mx.equal(x, out, stream=s)
        count = _reduce("sum", hit, self.axes, True, s)
        d = x._dtype if x._dtype.kind in "fc" else _float32
        return mx.divide(cast(hit, d, s), count, stream=s)


class ArgReduce(NoGradient, Primitive):
    """Index of the ``op`` (``argmax``/``argmin``) element along ``axis``, as uint32.

    ``axis=None`` reduces the flattened array (the result has shape ``()``, or
    all ones when ``keepdims``). Ties give the first index; a NaN wins both.
    """

    __slots__ = ("op", "axis", "keepdims")
    arity = 1
    op: Literal["argmax", "argmin"]
    axis: Axis | None
    keepdims: bool

    def output_shapes(self, inputs):
        shape = inputs[0].shape
        if self.axis is None:
            return [(1,) * len(shape) if self.keepdims else ()]
        return [reduced_shape(shape, (self.axis,), self.keepdims)]

    def vmap(self, inputs, axes):
        x, ax, s = inputs[0], axes[0], self.stream
        fn = getattr(mx, self.op)
        if self.axis is None:
            # Each example is flattened on its own: batch in front, the rest in one axis.
            x = batch_first(x, ax, stream=s)
            n = x._shape[0]
            out = fn(mx.reshape(x, (n, -1), stream=s), axis=1, stream=s)
            if self.keepdims:
                out = mx.reshape(out, (n,) + (1,) * (len(x._shape) - 1), stream=s)
            return [out], [0]
        new, out_ax = _batched_axes((self.axis,), ax, self.keepdims)
        return [fn(x, axis=new[0], keepdims=self.keepdims, stream=s)], [out_ax]


class LogSumExp(_OverAxes):
    """``log(sum(exp(x)))`` over ``axes``, computed stably as ``m + log(sum(exp(x - m)))``
    with ``m`` the (finite) maximum. The input is inexact; the output has its dtype."""

    __slots__ = ()
    arity = 1

    def _softmax(self, x, out, s):
        out = out if self.keepdims else mx.expand_dims(out, self.axes, stream=s)
        return mx.exp(mx.subtract(x, out, stream=s), stream=s)

    # The product broadcasts the cotangent over the reduced axes itself.
    def vjp(self, primals, cotangents, argnums, outputs):
        x, s = primals[0], self.stream
        c = cotangents[0]
        if not self.keepdims:
            c = mx.expand_dims(c, self.axes, stream=s)
        return [mx.multiply(c, self._softmax(x, outputs[0], s), stream=s)]

    def jvp(self, primals, tangents, argnums):
        x, s = primals[0], self.stream
        out = self._apply(x, self.axes)
        w = mx.multiply(tangents[0], self._softmax(x, out, s), stream=s)
        return [_reduce("sum", w, self.axes, self.keepdims, s)]

    def _apply(self, x, axes):
        return mx.logsumexp(x, axes, keepdims=self.keepdims, stream=self.stream)


class NumberOfElements(NoGradient, Primitive):
    """The number of elements of the input over ``axes`` (its reciprocal when
    ``inverted``; ``inf`` for none) as a 0-d array of ``dtype``.

    Only the input's shape is read. ``mean``, ``var`` and ``std`` use it inside a
    compile trace, so a shapeless compile counts at each call's shapes (a compile at
    fixed shapes folds it into a constant, :meth:`constant_at`); it has no gradient.
    """

    __slots__ = ("axes", "inverted", "dtype")
    arity = 1
    axes: Axes
    inverted: bool
    dtype: dt.Dtype

    def output_shapes(self, inputs):
        return [()]

    def constant_at(self, shapes):
        return _element_count(shapes[0], self.axes, self.inverted)

    def vmap(self, inputs, axes):
        # The count is the same for every example: the axes move past the batch axis.
        ax = axes[0]
        new = self.axes if ax is None else tuple(i + (i >= ax) for i in self.axes)
        return [number_of_elements(inputs[0], new, self.inverted, self.dtype, self.stream)], \
            [None]


def number_of_elements(a, axes: tuple, inverted: bool, dtype, stream=None) -> array:
    """The :class:`NumberOfElements` node of ``a`` over ``axes`` (sorted, non-negative)."""
    s = to_stream(stream)
    return lazy((), dtype, NumberOfElements(s, axes, inverted, dtype), (a,))


def _count(x, axes: tuple, inverted: bool, dtype, stream):
    """The element count of ``x`` over ``axes`` (inverted: 1/count, inf for none): a
    Python number eagerly, a node inside a compile trace (see NumberOfElements)."""
    if _compile.tracing:
        return number_of_elements(x, axes, inverted, dtype, stream)
    return _element_count(x._shape, axes, inverted)


def _element_count(shape: tuple, axes: tuple, inverted: bool):
    """The number of elements of ``shape`` over ``axes`` (inverted: 1/count, inf for none)."""
    n = _size(shape, axes)
    if inverted:
        return 1.0 / n if n else float("inf")
    return n


class Median(_OverAxes):
    """The median over ``axes`` (mean of the two middle values for an even count;
    NaN when the slice holds a NaN). The input is inexact; the output has its dtype.

    The gradient goes to the middle element of each sorted slice (half to each of
    the two middle ones for an even count).
    """

    __slots__ = ()
    arity = 1

    def _middle(self, x, s):
        """``x`` grouped (reduced axes flattened last), the positions of the middle
        element(s) of each group in it, and their weight."""
        g, undo = _grouped(x, self.axes, s)
        n = g._shape[-1]
        mid = [n // 2] if n % 2 else [n // 2 - 1, n // 2]
        order = mx.argsort(g, axis=-1, stream=s)
        idx = mx.take(order, mx.array(mid, dtype=dt.int32), axis=-1, stream=s)
        # Indices carry no gradient, and a transform reaching one raises (as in MLX).
        idx = mx.stop_gradient(idx, stream=s)
        return g, undo, idx, 1.0 / len(mid)

    def vjp(self, primals, cotangents, argnums, outputs):
        x, s = primals[0], self.stream
        g, undo, idx, w = self._middle(x, s)
        c = mx.reshape(mx.multiply(cotangents[0], w, stream=s), g._shape[:-1] + (1,), stream=s)
        c = mx.broadcast_to(c, idx._shape, stream=s)
        return [undo(mx.put_along_axis(mx.zeros_like(g, stream=s), idx, c, axis=-1, stream=s))]

    def jvp(self, primals, tangents, argnums):
        x, s = primals[0], self.stream
        g, undo, idx, w = self._middle(x, s)
        t, _ = _grouped(tangents[0], self.axes, s)
        picked = mx.take_along_axis(t, idx, axis=-1, stream=s)
        out = mx.multiply(mx.sum(picked, axis=-1, stream=s), w, stream=s)
        return [mx.reshape(out, reduced_shape(x._shape, self.axes, self.keepdims), stream=s)]

    def _apply(self, x, axes):
        return mx.median(x, axes, keepdims=self.keepdims, stream=self.stream)


class Scan(SameShape):
    """Cumulative ``op`` (``sum prod max min logaddexp``) along ``axis``.

    ``reverse`` scans from the end; ``inclusive=False`` shifts by one so element
    ``i`` combines only the elements before it (the first gets the identity: 0,
    1, the dtype's lowest/highest value, -inf). The output has the input's shape
    and dtype (the op functions cast beforehand: a bool sum becomes int32, an
    integer logaddexp float32). float16 and bfloat16 accumulate in float32.
    """

    __slots__ = ("op", "axis", "reverse", "inclusive")
    arity = 1
    op: Literal[tuple(_SCAN_FUNCTIONS)]
    axis: Axis
    reverse: bool
    inclusive: bool

    def _inclusive(self, x, s):
        """The forward inclusive scan of ``x`` (already flipped when reversed)."""
        return getattr(mx, _SCAN_FUNCTIONS[self.op])(x, axis=self.axis, stream=s)

    # Other than sum, the rules are written for a forward inclusive scan: a reversed
    # scan is the forward one of the flipped input, and an exclusive scan is the
    # inclusive one shifted by one place.
    def vjp(self, primals, cotangents, argnums, outputs):
        x, c, s, ax = primals[0], cotangents[0], self.stream, self.axis
        if self.op == "sum":
            return [mx.cumsum(c, axis=ax, reverse=not self.reverse, inclusive=self.inclusive,
                              stream=s)]
        if x._shape[ax] == 0:
            return [mx.zeros_like(x, stream=s)]
        out = outputs[0]
        if self.reverse:
            x, c, out = _flip(x, ax, s), _flip(c, ax, s), _flip(out, ax, s)
        if not self.inclusive:
            c = _shift(c, ax, -1, s)
            out = self._inclusive(x, s)
        g = _SCAN_VJP[self.op](x, out, c, ax, s)
        return [_flip(g, ax, s) if self.reverse else g]

    def jvp(self, primals, tangents, argnums):
        x, t, s, ax = primals[0], tangents[0], self.stream, self.axis
        if self.op == "sum":
            return [mx.cumsum(t, axis=ax, reverse=self.reverse, inclusive=self.inclusive,
                              stream=s)]
        if x._shape[ax] == 0:
            return [mx.zeros_like(x, stream=s)]
        if self.reverse:
            x, t = _flip(x, ax, s), _flip(t, ax, s)
        r = _SCAN_JVP[self.op](x, self._inclusive(x, s), t, ax, s)
        if not self.inclusive:
            r = _shift(r, ax, 1, s)
        return [_flip(r, ax, s) if self.reverse else r]

    def vmap(self, inputs, axes):
        (new,), out_ax = _batched_axes((self.axis,), axes[0], True)
        fn = getattr(mx, _SCAN_FUNCTIONS[self.op])
        return [fn(inputs[0], axis=new, reverse=self.reverse, inclusive=self.inclusive,
                   stream=self.stream)], [out_ax]


# -- transform-rule helpers -----------------------------------------------------------
_SCAN_FUNCTIONS = {"sum": "cumsum", "prod": "cumprod", "max": "cummax", "min": "cummin",
                   "logaddexp": "logcumsumexp"}


def _batched_axes(axes: tuple, bx: int, keepdims: bool):
    """``axes`` of one example as axes of the batch (batch axis ``bx``), and the batch
    axis of the result of reducing them."""
    new = batched_axes(axes, bx)
    return new, bx if keepdims else bx - builtins.sum(1 for a in axes if a < bx)


def _expanded(c, x, axes: tuple, keepdims: bool, s):
    """A reduction's cotangent broadcast back to the shape of its input ``x``."""
    # Broadcasting puts back leading axes by itself (a full reduction's 0-d cotangent).
    if not keepdims and axes != tuple(range(len(axes))):
        c = mx.expand_dims(c, axes, stream=s)
    if _compile.tracing:
        # A shapeless compile then broadcasts to each call's input shape, as MLX.
        return full_like_node(x, c, s)
    return mx.broadcast_to(c, x._shape, stream=s)


def _grouped(x, axes: tuple, s):
    """``x`` with ``axes`` moved last and flattened into one, and the inverse map."""
    shape = x._shape
    nd = len(shape)
    rest = [i for i in range(nd) if i not in axes]
    perm = rest + list(axes)
    moved = perm != list(range(nd))
    if moved:
        x = mx.transpose(x, perm, stream=s)
    tshape = x._shape
    if len(axes) != 1:
        x = mx.reshape(x, tshape[:len(rest)] + (_size(shape, axes),), stream=s)
    inverse = [perm.index(i) for i in range(nd)]

    def undo(y):
        if len(axes) != 1:
            y = mx.reshape(y, tshape, stream=s)
        return mx.transpose(y, inverse, stream=s) if moved else y
    return x, undo


def _prod_of_others(x, axes: tuple, s):
    """For each element, the product of the other elements of its group (no division,
    so exact with zeros): exclusive products from the left times from the right."""
    g, undo = _grouped(x, axes, s)
    left = mx.cumprod(g, axis=-1, inclusive=False, stream=s)
    right = mx.cumprod(g, axis=-1, reverse=True, inclusive=False, stream=s)
    return undo(mx.multiply(left, right, stream=s))


def _flip(x, axis: int, s):
    return mx.flip(x, axis=axis, stream=s)


def _shift(x, axis: int, by: int, s):
    """``x`` moved one place along ``axis`` (``by`` = 1: later, -1: earlier), zero-filled."""
    n = x._shape[axis]
    head = (builtins.slice(None),) * axis
    zero = mx.zeros(x._shape[:axis] + (1,) + x._shape[axis + 1:], x._dtype, stream=s)
    if by > 0:
        return mx.concatenate([zero, x[head + (builtins.slice(0, n - 1),)]], axis=axis, stream=s)
    return mx.concatenate([x[head + (builtins.slice(1, n),)], zero], axis=axis, stream=s)


def _positions(x, axis: int, s):
    """0, 1, ... along ``axis`` (int32), shaped to broadcast against ``x``."""
    n = x._shape[axis]
    shape = [1] * len(x._shape)
    shape[axis] = n
    return mx.reshape(mx.arange(n, dtype=_int32, stream=s), tuple(shape), stream=s)


def _first_zero(x, axis: int, s):
    """(no zero up to here, count of zeros up to here, the first zero) along ``axis``."""
    z = mx.equal(x, 0, stream=s)
    count = mx.cumsum(z, axis=axis, stream=s)
    first = mx.logical_and(z, mx.equal(count, 1, stream=s), stream=s)
    return z, count, first


def _cumprod_vjp(x, out, c, axis, s):
    # Before the first zero: sum_{j>=i} c_j out_j / x_i. At the first zero z: the
    # products with x_z replaced by 1. After it every product holds x_z: zero.
    z, count, first = _first_zero(x, axis, s)
    rev = mx.cumsum(mx.multiply(c, out, stream=s), axis=axis, reverse=True, stream=s)
    before = mx.divide(rev, mx.where(z, 1, x, stream=s), stream=s)
    skip = mx.cumprod(mx.where(first, 1, x, stream=s), axis=axis, stream=s)
    at = mx.cumsum(mx.multiply(c, skip, stream=s), axis=axis, reverse=True, stream=s)
    zero = mx.zeros_like(x, stream=s)
    return mx.where(mx.equal(count, 0, stream=s), before, mx.where(first, at, zero, stream=s),
                    stream=s)


def _cumprod_jvp(x, out, t, axis, s):
    z, count, first = _first_zero(x, axis, s)
    before = mx.multiply(out, mx.cumsum(mx.divide(t, mx.where(z, 1, x, stream=s), stream=s),
                                        axis=axis, stream=s), stream=s)
    skip = mx.cumprod(mx.where(first, 1, x, stream=s), axis=axis, stream=s)
    t_first = mx.cumsum(mx.where(first, t, 0, stream=s), axis=axis, stream=s)
    one = mx.multiply(t_first, skip, stream=s)
    zero = mx.zeros_like(out, stream=s)
    return mx.where(mx.equal(count, 0, stream=s), before,
                    mx.where(mx.equal(count, 1, stream=s), one, zero, stream=s), stream=s)


def _cumext_vjp(x, out, c, axis, s):
    # Output j comes from the last i <= j where x_i equals the running extremum
    # (MLX's choice among ties), so input i collects the cotangents from i up to
    # the next such position.
    n = x._shape[axis]
    sets = mx.equal(x, out, stream=s)
    pos = _positions(x, axis, s)
    nxt = mx.cummin(mx.where(sets, pos, n, stream=s), axis=axis, reverse=True, inclusive=False,
                    stream=s)
    nxt = mx.stop_gradient(mx.minimum(nxt, n, stream=s), stream=s)  # indices: see Median
    tail = mx.cumsum(c, axis=axis, reverse=True, stream=s)
    zero = mx.zeros(x._shape[:axis] + (1,) + x._shape[axis + 1:], tail._dtype, stream=s)
    padded = mx.concatenate([tail, zero], axis=axis, stream=s)
    g = mx.subtract(tail, mx.take_along_axis(padded, nxt, axis=axis, stream=s), stream=s)
    return mx.where(sets, g, mx.zeros_like(g, stream=s), stream=s)


def _cumext_jvp(x, out, t, axis, s):
    sets = mx.equal(x, out, stream=s)
    src = mx.cummax(mx.where(sets, _positions(x, axis, s), 0, stream=s), axis=axis, stream=s)
    src = mx.stop_gradient(src, stream=s)  # indices: see Median
    return mx.take_along_axis(t, src, axis=axis, stream=s)


def _logcumsumexp_vjp(x, out, c, axis, s):
    # sum_{j>=i} c_j exp(x_i - out_j), summed in the log domain, positive and
    # negative cotangents apart, so nothing overflows.
    ninf = float("-inf")
    res = None
    for mask, v in ((mx.greater(c, 0, stream=s), c), (mx.less(c, 0, stream=s),
                                                      mx.negative(c, stream=s))):
        v = mx.where(mask, v, 1, stream=s)  # no log of <= 0, even where unused
        logs = mx.where(mask, mx.subtract(mx.log(v, stream=s), out, stream=s), ninf, stream=s)
        part = mx.exp(mx.add(x, mx.logcumsumexp(logs, axis=axis, reverse=True, stream=s),
                             stream=s), stream=s)
        res = part if res is None else mx.subtract(res, part, stream=s)
    return res


def _logcumsumexp_jvp(x, out, t, axis, s):
    ninf = float("-inf")
    res = None
    for mask, v in ((mx.greater(t, 0, stream=s), t), (mx.less(t, 0, stream=s),
                                                      mx.negative(t, stream=s))):
        v = mx.where(mask, v, 1, stream=s)
        logs = mx.where(mask, mx.add(x, mx.log(v, stream=s), stream=s), ninf, stream=s)
        part = mx.exp(mx.subtract(mx.logcumsumexp(logs, axis=axis, stream=s), out, stream=s),
                      stream=s)
        res = part if res is None else mx.subtract(res, part, stream=s)
    return res


_SCAN_VJP = {"prod": _cumprod_vjp, "max": _cumext_vjp, "min": _cumext_vjp,
             "logaddexp": _logcumsumexp_vjp}
_SCAN_JVP = {"prod": _cumprod_jvp, "max": _cumext_jvp, "min": _cumext_jvp,
             "logaddexp": _logcumsumexp_jvp}


# -- reductions ------------------------------------------------------------------
def _reduce(op: str, a, axes: tuple, keepdims: bool, stream) -> array:
    """A Reduce node of ``a`` over normalised ``axes``, with MLX's output dtype."""
    d = a._dtype
    if op == "sum" or op == "prod":
        out = SUM_DTYPE.get(d, d)
    elif op == "all" or op == "any":
        out = _bool
    else:
        out = d
    if not axes:
        # MLX: reducing over no axes is the identity (all/any still give bool).
        return cast(a, _bool, stream) if out is _bool else a
    shape = a._shape
    if 0 in shape and (op == "max" or op == "min"):
        _check_nonempty(op, shape, axes)
    return lazy(reduced_shape(shape, axes, keepdims), out,
                Reduce(to_stream(stream), op, axes, bool(keepdims)), (a,))


def _make_reduce(op: str, doc: str):
    def fn(a, /, axis=None, keepdims=False, *, stream=None) -> array:
        a = as_array(a)
        return _reduce(op, a, _axes(axis, len(a._shape), op), keepdims, stream)
    fn.__name__ = fn.__qualname__ = op
    fn.__doc__ = doc
    return fn


_REDUCE_ARGS = """

    Args:
        a (array): Input array.
        axis (int or sequence of int, optional): Axis or axes to reduce over.
          Defaults to ``None``, which reduces over the entire array.
        keepdims (bool, optional): Keep reduced axes as singleton dimensions,
          defaults to ``False``.

    Returns:
        array: {ret}
    """

sum = _make_reduce("sum", "A sum reduction over the given axes." + _REDUCE_ARGS.format(
    ret="The sums. bool, int8 and int16 inputs give int32; uint8 and uint16 give uint32."))
prod = _make_reduce("prod", "A product reduction over the given axes." + _REDUCE_ARGS.format(
    ret="The products, with the output dtypes of :func:`sum`."))
max = _make_reduce("max", "A max reduction over the given axes." + _REDUCE_ARGS.format(
    ret="The maxima. A NaN propagates. Reducing an axis of size 0 is an error."))
min = _make_reduce("min", "A min reduction over the given axes." + _REDUCE_ARGS.format(
    ret="The minima. A NaN propagates. Reducing an axis of size 0 is an error."))
all = _make_reduce("all", "An and reduction over the given axes." + _REDUCE_ARGS.format(
    ret="A bool array: whether every element is non-zero (True when empty)."))
any = _make_reduce("any", "An or reduction over the given axes." + _REDUCE_ARGS.format(
    ret="A bool array: whether some element is non-zero (False when empty)."))


def _inexact(a, stream):
    """``a`` as an inexact array (bool and integers become float32, as MLX does)."""
    return cast(a, _float32, stream) if a._dtype.kind in "biu" else a


def mean(a, /, axis=None, keepdims=False, *, stream=None) -> array:
    """Compute the mean(s) over the given axes.

    Args:
        a (array): Input array.
        axis (int or sequence of int, optional): Axis or axes to reduce over.
          Defaults to ``None``, which reduces over the entire array.
        keepdims (bool, optional): Keep reduced axes as singleton dimensions,
          defaults to ``False``.

    Returns:
        array: The means: float32 for bool and integer inputs, else the input dtype
        (float16 and bfloat16 are averaged in float32). The mean of nothing is NaN.
    """
    a = as_array(a)
    axes = _axes(axis, len(a._shape), "mean")
    d = a._dtype
    if d in _HALF:
        return cast(_mean(cast(a, _float32, stream), axes, keepdims, stream), d, stream)
    return _mean(_inexact(a, stream), axes, keepdims, stream)


def _mean(x, axes, keepdims, stream):
    # 0 * inf is NaN: the mean of no elements, as in MLX.
    return mx.multiply(_reduce("sum", x, axes, keepdims, stream),
                       _count(x, axes, True, x._dtype, stream), stream=stream)


def _variance(a, axis, keepdims, ddof, stream, op):
    """The variance in a working dtype (float32 for half types) and the dtype to return."""
    a = as_array(a)
    axes = _axes(axis, len(a._shape), op)
    if not isinstance(ddof, int):
        if not hasattr(ddof, "__index__"):
            raise DtypeError(f"[{op}] ddof must be an integer, got {ddof!r}.")
        ddof = operator.index(ddof)
    d = a._dtype
    if d in _HALF:
        x, out = cast(a, _float32, stream), d
    else:
        x = _inexact(a, stream)
        out = _float32 if x._dtype.kind == "c" else x._dtype
    # Two passes (mean, then squared deviations): accurate when the mean is large.
    dev = mx.subtract(x, _mean(x, axes, True, stream), stream=stream)
    if dev._dtype.kind == "c":
        dev = mx.abs(dev, stream=stream)
    ss = _reduce("sum", mx.multiply(dev, dev, stream=stream), axes, keepdims, stream)
    # MLX clamps the divisor at 0, so ddof >= n gives inf (or NaN for zero spread).
    if _compile.tracing:
        n = _count(x, axes, False, ss._dtype, stream)
        div = mx.maximum(mx.subtract(n, ddof, stream=stream), 0, stream=stream)
        return mx.divide(ss, div, stream=stream), out
    div = _size(x._shape, axes) - ddof
    return mx.multiply(ss, 1.0 / div if div > 0 else float("inf"), stream=stream), out


def var(a, /, axis=None, keepdims=False, ddof=0, *, stream=None) -> array:
    """Compute the variance(s) over the given axes.

    Args:
        a (array): Input array.
        axis (int or sequence of int, optional): Axis or axes to reduce over.
          Defaults to ``None``, which reduces over the entire array.
        keepdims (bool, optional): Keep reduced axes as singleton dimensions,
          defaults to ``False``.
        ddof (int, optional): The divisor is ``N - ddof``, defaults to 0.

    Returns:
        array: The variances: float32 for bool, integer and complex inputs, else
        the input dtype.
    """
    v, out = _variance(a, axis, keepdims, ddof, stream, "var")
    return cast(v, out, stream)


def std(a, /, axis=None, keepdims=False, ddof=0, *, stream=None) -> array:
    """Compute the standard deviation(s) over the given axes.

    Args:
        a (array): Input array.
        axis (int or sequence of int, optional): Axis or axes to reduce over.
          Defaults to ``None``, which reduces over the entire array.
        keepdims (bool, optional): Keep reduced axes as singleton dimensions,
          defaults to ``False``.
        ddof (int, optional): The divisor is ``N - ddof``, defaults to 0.

    Returns:
        array: The standard deviations, with the dtypes of :func:`var`.
    """
    v, out = _variance(a, axis, keepdims, ddof, stream, "std")
    return cast(mx.sqrt(v, stream=stream), out, stream)


def _var_method(self, axis=None, keepdims=False, ddof=0, *, correction=None, stream=None):
    """The variance over the given axes; ``correction`` is a synonym of ``ddof`` that wins."""
    return var(self, axis, keepdims, ddof if correction is None else correction, stream=stream)


def _std_method(self, axis=None, keepdims=False, ddof=0, *, correction=None, stream=None):
    """The standard deviation over the given axes; ``correction`` is a synonym of ``ddof``."""
    return std(self, axis, keepdims, ddof if correction is None else correction, stream=stream)


def _make_argreduce(op: str, doc: str):
    def fn(a, /, axis=None, keepdims=False, *, stream=None) -> array:
        a = as_array(a)
        shape = a._shape
        if axis is None:
            out = (1,) * len(shape) if keepdims else ()
        else:
            axis = _axis(axis, len(shape), op)
            out = reduced_shape(shape, (axis,), keepdims)
        if 0 in shape:
            raise ShapeError(f"[{op}] Cannot {op} reduce an array of size 0 (shape {shape}).")
        return lazy(out, dt.uint32, ArgReduce(to_stream(stream), op, axis, bool(keepdims)), (a,))
    fn.__name__ = fn.__qualname__ = op
    fn.__doc__ = doc
    return fn


_ARG_ARGS = """

    Args:
        a (array): Input array.
        axis (int, optional): Axis to reduce over. Defaults to ``None``, which
          reduces over the flattened array.
        keepdims (bool, optional): Keep reduced axes as singleton dimensions,
          defaults to ``False``.

    Returns:
        array: The ``uint32`` indices (the first one on ties).
    """

argmax = _make_argreduce("argmax", "Indices of the maximum values along the axis." + _ARG_ARGS)
argmin = _make_argreduce("argmin", "Indices of the minimum values along the axis." + _ARG_ARGS)


def logsumexp(a, /, axis=None, keepdims=False, *, stream=None) -> array:
    """A log-sum-exp reduction over the given axes.

    The reduction is numerically stable: ``log(sum(exp(a)))`` is computed as
    ``m + log(sum(exp(a - m)))`` with ``m`` the maximum.

    Args:
        a (array): Input array.
        axis (int or sequence of int, optional): Axis or axes to reduce over.
          Defaults to ``None``, which reduces over the entire array.
        keepdims (bool, optional): Keep reduced axes as singleton dimensions,
          defaults to ``False``.

    Returns:
        array: The output array: float32 for bool and integer inputs, else the input dtype.
    """
    a = as_array(a)
    shape = a._shape
    axes = _axes(axis, len(shape), "logsumexp")
    if 0 in shape:
        raise ShapeError(f"[logsumexp] Received an empty array (shape {shape}).")
    a = _inexact(a, stream)
    if not axes:
        return a
    return lazy(reduced_shape(shape, axes, keepdims), a._dtype,
                LogSumExp(to_stream(stream), axes, bool(keepdims)), (a,))


def count_nonzero(a, /, *, axis=None, keepdims=False, stream=None) -> array:
    """Count the number of non-zero elements along the given axes.

    Args:
        a (array): Input array.
        axis (int or sequence of int, optional): Axis or axes to count over.
          Defaults to ``None``, which counts over the whole array.
        keepdims (bool, optional): Keep the reduced axes as size one, defaults to ``False``.

    Returns:
        array: The counts as an ``int32`` array.
    """
    a = as_array(a)
    axes = _axes(axis, len(a._shape), "count_nonzero")
    r = _reduce("sum", cast(a, _bool, stream), axes, keepdims, stream)
    return cast(r, _int32, stream)


def median(a, /, axis=None, keepdims=False, *, stream=None) -> array:
    """Compute the median(s) over the given axes.

    Args:
        a (array): Input array.
        axis (int or sequence of int, optional): Axis or axes to reduce over.
          Defaults to ``None``, which reduces over the entire array.
        keepdims (bool, optional): Keep reduced axes as singleton dimensions,
          defaults to ``False``.

    Returns:
        array: The medians: float32 for bool and integer inputs, else the input
        dtype. A slice holding a NaN has median NaN.
    """
    a = as_array(a)
    shape = a._shape
    axes = _axes(axis, len(shape), "median")
    if 0 in shape:
        _check_nonempty("median", shape, axes)
    a = _inexact(a, stream)
    if not axes:
        return a
    return lazy(reduced_shape(shape, axes, keepdims), a._dtype,
                Median(to_stream(stream), axes, bool(keepdims)), (a,))


# -- scans -----------------------------------------------------------------------
def _scan(op: str, name: str, a, axis, reverse, inclusive, stream) -> array:
    d = a._dtype
    if op == "sum" and d is _bool:
        a = cast(a, _int32, stream)
    elif op == "logaddexp" and d.kind in "biu":
        a = cast(a, _float32, stream)
    if axis is None:
        # MLX scans the flattened array.
        if len(a._shape) != 1:
            a = mx.reshape(a, (a.size,), stream=stream)
        axis = 0
    else:
        axis = _axis(axis, len(a._shape), name)
    return lazy(a._shape, a._dtype,
                Scan(to_stream(stream), op, axis, bool(reverse), bool(inclusive)), (a,))


_SCAN_ARGS = """

    Args:
        a (array): Input array.
        axis (int, optional): Axis to scan along. Defaults to ``None``, which scans
          the flattened array.
        reverse (bool): Scan from the end. Defaults to ``False``.
        inclusive (bool): Whether the i-th output includes the i-th input.
          Defaults to ``True``.{extra}

    Returns:
        array: {ret}
    """
_DTYPE_ARG = """
        dtype (Dtype, optional): Cast the input to this type first."""


def cumsum(a, /, axis=None, *, reverse=False, inclusive=True, dtype=None, stream=None) -> array:
    a = as_array(a)
    if dtype is not None:
        a = cast(a, dt.to_dtype(dtype), stream)
    return _scan("sum", "cumsum", a, axis, reverse, inclusive, stream)


def cumprod(a, /, axis=None, *, reverse=False, inclusive=True, dtype=None, stream=None) -> array:
    a = as_array(a)
    if dtype is not None:
        a = cast(a, dt.to_dtype(dtype), stream)
    return _scan("prod", "cumprod", a, axis, reverse, inclusive, stream)


def cummax(a, /, axis=None, *, reverse=False, inclusive=True, stream=None) -> array:
    return _scan("max", "cummax", as_array(a), axis, reverse, inclusive, stream)


def cummin(a, /, axis=None, *, reverse=False, inclusive=True, stream=None) -> array:
    return _scan("min", "cummin", as_array(a), axis, reverse, inclusive, stream)


def logcumsumexp(a, /, axis=None, *, reverse=False, inclusive=True, stream=None) -> array:
    return _scan("logaddexp", "logcumsumexp", as_array(a), axis, reverse, inclusive, stream)


cumsum.__doc__ = "Return the cumulative sum of the elements along the given axis." + \
    _SCAN_ARGS.format(extra=_DTYPE_ARG, ret="The cumulative sums (bool sums as int32; "
                      "other dtypes are kept and integers wrap on overflow).")
cumprod.__doc__ = "Return the cumulative product of the elements along the given axis." + \
    _SCAN_ARGS.format(extra=_DTYPE_ARG, ret="The cumulative products, in the input dtype.")
cummax.__doc__ = "Return the cumulative maximum of the elements along the given axis." + \
    _SCAN_ARGS.format(extra="", ret="The cumulative maxima, in the input dtype.")
cummin.__doc__ = "Return the cumulative minimum of the elements along the given axis." + \
    _SCAN_ARGS.format(extra="", ret="The cumulative minima, in the input dtype.")
logcumsumexp.__doc__ = "Return the cumulative logsumexp of the elements along the given axis." + \
    _SCAN_ARGS.format(extra="", ret="The output array: float32 for bool and integer inputs.")


def _no_dtype(fn):
    # MLX's array methods cumsum/cumprod take no dtype argument.
    def method(self, axis=None, *, reverse=False, inclusive=True, stream=None):
        return fn(self, axis, reverse=reverse, inclusive=inclusive, stream=stream)
    method.__name__ = method.__qualname__ = fn.__name__
    method.__doc__ = fn.__doc__
    return method


PRIMITIVES = [Reduce, ArgReduce, LogSumExp, NumberOfElements, Median, Scan]

OPS = {
    "sum": sum, "prod": prod, "max": max, "min": min, "mean": mean, "var": var, "std": std,
    "all": all, "any": any, "argmax": argmax, "argmin": argmin, "logsumexp": logsumexp,
    "count_nonzero": count_nonzero, "median": median,
    "cumsum": cumsum, "cumprod": cumprod, "cummax": cummax, "cummin": cummin,
    "logcumsumexp": logcumsumexp, "cumulative_sum": cumsum, "cumulative_prod": cumprod,
    "array.sum": sum, "array.prod": prod, "array.max": max, "array.min": min,
    "array.mean": mean, "array.var": _var_method, "array.std": _std_method,
    "array.all": all, "array.any": any, "array.argmax": argmax, "array.argmin": argmin,
    "array.logsumexp": logsumexp, "array.cumsum": _no_dtype(cumsum),
    "array.cumprod": _no_dtype(cumprod), "array.cummax": cummax, "array.cummin": cummin,
    "array.logcumsumexp": logcumsumexp,
}


lazyx_primitives, lazyx_ops = pack_hooks(PRIMITIVES, OPS)


@hookimpl
def lazyx_examples():
    x, p = uniform((2, 3)), uniform((2, 3), 0.5, 1.5)
    return [
        (Reduce, example(lambda a: sum(a, axis=1, keepdims=True), x)),
        (Reduce, example(lambda a: prod(a, axis=-1), x)),
        (Reduce, example(lambda a: max(a, axis=0), x)),
        (Reduce, example(lambda a: min(a, axis=(0, 1), keepdims=True), x)),
        (Reduce, example(lambda a: all(mx.greater(a, 0), axis=1), x)),
        (Reduce, example(lambda a: any(mx.greater(a, 0)), x)),
        (ArgReduce, example(lambda a: argmax(a, axis=1), x)),
        (ArgReduce, example(lambda a: argmin(a, keepdims=True), x)),
        (LogSumExp, example(lambda a: logsumexp(a, axis=0, keepdims=True), x)),
        (NumberOfElements, example(lambda a: number_of_elements(a, (1,), True, a._dtype), x)),
        (NumberOfElements, example(lambda a: number_of_elements(a, (0, 1), False, dt.int32), x)),
        (Median, example(lambda a: median(a, axis=1), uniform((2, 4)))),
        (Scan, example(lambda a: cumsum(a, axis=1, reverse=True, inclusive=False), x)),
        (Scan, example(lambda a: cumprod(a, axis=1), p)),
        (Scan, example(lambda a: cummax(a, axis=0), x)),
        (Scan, example(lambda a: cummin(a, axis=1, reverse=True), x)),
        (Scan, example(lambda a: logcumsumexp(a, axis=1), x)),
    ]
