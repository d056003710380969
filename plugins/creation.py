"""Creation op pack: arrays made from a shape and values (``zeros``, ``arange``, ``eye`` ...).

Creation is lazy, as in MLX: the primitives below take no array inputs (except
``Full``, which broadcasts its ``vals`` input) and their kernels produce the
data when the array is evaluated. ``tril``, ``triu`` and ``meshgrid`` are
compositions of other ops.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Literal

from lazyx import dtypes as dt
from lazyx.arguments import (MAX_DIM, as_array, broadcast_shapes, cast, check_dimensions,
                             constant)
from lazyx.array import array, lazy
from lazyx.device import to_stream
from lazyx.errors import ArgumentError, DtypeError, IntegerRangeError, ShapeError
from lazyx.memory import check_allocation, physical_memory
from lazyx.hookspecs import hookimpl, pack_hooks
from lazyx.primitive import FixedShape, Primitive, SameShape, Shape, Size
from lazyx.examples import example, uniform
from lazyx.rules import batch_first, sum_to_shape
from lazyx.transforms.compile import _settings as _compile  # .tracing: inside a compile trace

import lazyx.core as mx

_INT32_MIN, _INT32_MAX = -(2 ** 31), 2 ** 31 - 1


# -- primitives --------------------------------------------------------------
class Creation(Primitive):
    """A primitive that makes an array from its parameters alone.

    With no inputs, nothing flows back through it, its tangent is zero, and it
    never depends on a mapped argument (``vmap`` rebuilds it unbatched).
    """

    __slots__ = ()
    arity = 0

    def vjp(self, primals, cotangents, argnums, outputs):
        return [None] * len(argnums)

    def jvp(self, primals, tangents, argnums):
        return [None]

    def vmap(self, inputs, axes):
        return [lazy(self.output_shapes(())[0], self.dtype, self, ())], [None]


class Fill(FixedShape, Creation):
    """An array of ``shape`` and ``dtype`` with every element ``value`` (a Python scalar)."""

    __slots__ = ("shape", "dtype", "value")
    shape: Shape
    dtype: dt.Dtype
    value: bool | int | float | complex

    def __init__(self, stream, shape, dtype, value):
        super().__init__(stream)
        self.shape = shape
        self.dtype = dtype
        self.value = value


class Full(FixedShape):
    """Its one input broadcast to ``shape`` (the input already has the output dtype).

    Linear in the input: the cotangent is summed over the broadcast dimensions,
    the tangent is broadcast like the values, and a batch of values fills a
    batch of arrays.
    """

    __slots__ = ("shape",)
    shape: Shape
    arity = 1
    shapeless = False  # parameters fix the output shape (see Primitive.shapeless)

    def __init__(self, stream, shape):
        super().__init__(stream)
        self.shape = shape

    def vjp(self, primals, cotangents, argnums, outputs):
        return [sum_to_shape(cotangents[0], primals[0]._shape, self.stream)]

    def jvp(self, primals, tangents, argnums):
        return [mx.full(self.shape, tangents[0], stream=self.stream)]

    def vmap(self, inputs, axes):
        v = batch_first(inputs[0], axes[0], len(self.shape), self.stream)
        return [mx.full(v._shape[:1] + self.shape, v, stream=self.stream)], [0]


class FullLike(SameShape):
    """Its second input (the values, already of the output dtype) broadcast to the
    shape of its first: ``zeros_like``, ``ones_like`` and ``full_like`` inside a
    compile trace, so that a shapeless compile takes the shape of each call's input,
    as MLX does (eagerly they are a :class:`Fill` or :class:`Full`, which need not
    wait for the input). Only the first input's shape is read: it has no gradient;
    the values' is summed over the broadcast dimensions.
    """

    __slots__ = ()
    arity = 2

    def to_expression(self, args):
        """The values, broadcast to the loop's shape: fused into its consumers (the
        seed of a loss's gradient, ``mean``'s ``1/n`` over the batch) instead of a
        filled buffer of its own. The first input gives the shape alone."""
        return args[1]

    def vjp(self, primals, cotangents, argnums, outputs):
        v = primals[1]
        return [None if i == 0 else sum_to_shape(cotangents[0], v._shape, self.stream)
                for i in argnums]

    def jvp(self, primals, tangents, argnums):
        if 1 not in argnums:
            return [None]
        return [full_like_node(primals[0], tangents[list(argnums).index(1)], self.stream)]

    def vmap(self, inputs, axes):
        (a, v), (ax, vx), s = inputs, axes, self.stream
        ndim = len(a._shape) - (ax is not None)
        if vx is not None:
            v = batch_first(v, vx, ndim, s)
        if ax is None:  # a batch of values over one shape
            return [mx.broadcast_to(v, v._shape[:1] + a._shape, stream=s)], [0]
        return [full_like_node(batch_first(a, ax, None, s), v, s)], [0]


def full_like_node(a, v, stream=None) -> array:
    """The :class:`FullLike` node: ``v`` (of the output dtype, broadcastable to
    ``a.shape``) broadcast to the shape of ``a``."""
    return lazy(a._shape, v._dtype, FullLike(to_stream(stream)), (a, v))


class Arange(Creation):
    """``start, start + step, ...`` up to ``stop`` (excluded), as ``dtype``."""

    __slots__ = ("start", "stop", "step", "dtype")
    start: int | float
    stop: int | float
    step: int | float
    dtype: dt.Dtype

    def __init__(self, stream, start, stop, step, dtype):
        super().__init__(stream)
        self.start = start
        self.stop = stop
        self.step = step
        self.dtype = dtype

    def output_shapes(self, inputs):
        return [(_arange_length(self.start, self.stop, self.step),)]


class Linspace(Creation):
    """``num`` evenly spaced values from ``start`` to ``stop``."""

    __slots__ = ("start", "stop", "num", "endpoint", "dtype")
    start: float
    stop: float
    num: Size
    endpoint: bool
    dtype: dt.Dtype

    def __init__(self, stream, start, stop, num, endpoint, dtype):
        super().__init__(stream)
        self.start = start
        self.stop = stop
        self.num = num
        self.endpoint = endpoint
        self.dtype = dtype

    def output_shapes(self, inputs):
        return [(self.num,)]


class _Banded(Creation):
    """An ``n x m`` matrix described by a diagonal ``k``."""

    __slots__ = ("n", "m", "k", "dtype")
    n: Size
    m: Size
    k: int
    dtype: dt.Dtype

    def __init__(self, stream, n, m, k, dtype):
        super().__init__(stream)
        self.n = n
        self.m = m
        self.k = k
        self.dtype = dtype

    def output_shapes(self, inputs):
        return [(self.n, self.m)]


class Eye(_Banded):
    """An ``n x m`` matrix with ones on diagonal ``k``."""

    __slots__ = ()


class Tri(_Banded):
    """An ``n x m`` matrix with ones at and below diagonal ``k``."""

    __slots__ = ()


class Window(Creation):
    """A float32 tapering window of ``m`` points; ``kind`` names it (``"hanning"`` ...)."""

    __slots__ = ("kind", "m")
    kind: Literal["bartlett", "blackman", "hamming", "hanning"]
    m: Size
    dtype = dt.float32

    def __init__(self, stream, kind, m):
        super().__init__(stream)
        self.kind = kind
        self.m = m

    def output_shapes(self, inputs):
        return [(self.m,)]


# -- argument checks ---------------------------------------------------------
def _shape(shape, op: str) -> tuple[int, ...]:
    """``shape`` (an int or a sequence of ints) as a tuple of non-negative ints."""
    if type(shape) is tuple:
        for s in shape:
            if type(s) is not int or s < 0 or s > MAX_DIM:
                break
        else:
            return shape
    try:
        dims = (operator.index(shape),)
    except TypeError:
        try:
            dims = tuple(operator.index(s) for s in shape)
        except TypeError:
            raise ShapeError(f"[{op}] shape must be an int or a sequence of ints, "
                             f"got {shape!r}.") from None
    return check_dimensions(dims, op)


_PHYSICAL = physical_memory()
_prod = math.prod


def _sized(shape: tuple, d: dt.Dtype, op: str) -> tuple:
    """``shape``, after refusing at the call an array that no allocation could hold
    (one multiplication; :func:`lazyx.memory.check_allocation` decides the rare rest)."""
    if _prod(shape) * d.size > _PHYSICAL:
        check_allocation(shape, d, op)
    return shape


def _dtype(dtype, default):
    return default if dtype is None else dt.to_dtype(dtype)


def _int(value, name: str, op: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise DtypeError(f"[{op}] {name} must be an integer, got {value!r}.") from None


def _size(value, name: str, op: str) -> int:
    n = _int(value, name, op)
    if n < 0:
        raise ArgumentError(f"[{op}] {name} must be non-negative, got {n}.")
    return n


# -- constant-valued arrays --------------------------------------------------
def zeros(shape, dtype=dt.float32, *, stream=None) -> array:
    """An array of zeros.

    Args:
        shape: the shape, an int or a sequence of ints.
        dtype: the element type (float32 when None).
    """
    d = _dtype(dtype, dt.float32)
    shape = _sized(_shape(shape, "zeros"), d, "zeros")
    return lazy(shape, d, Fill(to_stream(stream), shape, d, 0), ())


def ones(shape, dtype=dt.float32, *, stream=None) -> array:
    """An array of ones.

    Args:
        shape: the shape, an int or a sequence of ints.
        dtype: the element type (float32 when None).
    """
    d = _dtype(dtype, dt.float32)
    shape = _sized(_shape(shape, "ones"), d, "ones")
    return lazy(shape, d, Fill(to_stream(stream), shape, d, 1), ())


def empty(shape, dtype=dt.float32, *, stream=None) -> array:
    """An array whose values do not matter; like MLX, lazyx fills it with zeros."""
    d = _dtype(dtype, dt.float32)
    shape = _sized(_shape(shape, "empty"), d, "empty")
    return lazy(shape, d, Fill(to_stream(stream), shape, d, 0), ())


def _full(shape, vals, d, stream, op):
    if type(vals) is array or isinstance(vals, array):
        if d is None:
            d = vals._dtype
        v = cast(vals, d, stream)
    else:
        if isinstance(vals, (list, tuple)):
            raise DtypeError(f"[{op}] vals must be a scalar or an array, got a "
                             f"{type(vals).__name__}; wrap it in an array.")
        v = as_array(vals, d)
        d = v._dtype
    if v._shape != shape and broadcast_shapes(v._shape, shape) != shape:
        raise ShapeError(f"[{op}] vals of shape {v._shape} cannot be broadcast to shape {shape}.")
    _sized(shape, d, op)
    return lazy(shape, d, Full(to_stream(stream), shape), (v,))


def full(shape, vals, dtype=None, *, stream=None) -> array:
    """An array of ``shape`` filled with ``vals``.

    Args:
        shape: the shape, an int or a sequence of ints.
        vals: a scalar, or an array that broadcasts to ``shape``.
        dtype: the element type; inferred from ``vals`` when None.
    Returns:
        the filled array.
    """
    shape = _shape(shape, "full")
    return _full(shape, vals, None if dtype is None else dt.to_dtype(dtype), stream, "full")


def _like(a, op):
    if not isinstance(a, array):
        raise DtypeError(f"[{op}] a must be an array, got {type(a).__name__}.")
    return a


def _fill_like(a, d, value, stream):
    # Inside a compile trace the shape comes from ``a`` at each call (see FullLike).
    if _compile.tracing:
        return full_like_node(a, constant(value, d), stream)
    return lazy(a._shape, d, Fill(to_stream(stream), a._shape, d, value), ())


def zeros_like(a, /, dtype=None, *, stream=None) -> array:
    """An array of zeros with the shape of ``a`` and its dtype (or ``dtype``)."""
    a = _like(a, "zeros_like")
    return _fill_like(a, a._dtype if dtype is None else dt.to_dtype(dtype), 0, stream)


def ones_like(a, /, dtype=None, *, stream=None) -> array:
    """An array of ones with the shape of ``a`` and its dtype (or ``dtype``)."""
    a = _like(a, "ones_like")
    return _fill_like(a, a._dtype if dtype is None else dt.to_dtype(dtype), 1, stream)


def empty_like(a, /, dtype=None, *, stream=None) -> array:
    """An array with the shape of ``a`` whose values do not matter (zeros, as in MLX)."""
    a = _like(a, "empty_like")
    return _fill_like(a, a._dtype if dtype is None else dt.to_dtype(dtype), 0, stream)


def full_like(a, vals, dtype=None, *, stream=None) -> array:
    """An array with the shape of ``a`` filled with ``vals``.

    Args:
        a: the array whose shape (and, without ``dtype``, dtype) the result takes.
        vals: a scalar, or an array that broadcasts to ``a.shape``.
        dtype: the element type (``a.dtype`` when None).
    """
    a = _like(a, "full_like")
    d = a._dtype if dtype is None else dt.to_dtype(dtype)
    out = _full(a._shape, vals, d, stream, "full_like")  # checks vals, names the shapes
    if _compile.tracing:
        return full_like_node(a, out._inputs[0], stream)
    return out


# -- ranges ------------------------------------------------------------------
def _arange_length(start, stop, step) -> int:
    n = math.ceil((stop - start) / step)
    return max(n, 0)


def _real_scalar(v, name, op):
    if type(v) is int or type(v) is float:
        return v
    if not isinstance(v, bool):
        if isinstance(v, numbers.Integral):
            return int(v)
        if isinstance(v, numbers.Real):
            return float(v)
    raise DtypeError(f"[{op}] {name} must be an int or a float, got {v!r}.")


def arange(start=None, stop=None, step=None, dtype=None, *, stream=None) -> array:
    """Evenly spaced values in ``[start, stop)``.

    Called as ``arange(stop)``, ``arange(start, stop)`` or ``arange(start, stop, step)``.

    Args:
        start: first value (0 when only ``stop`` is given).
        stop: end of the interval, excluded.
        step: spacing (1 when None).
        dtype: the element type; int32 when every argument is an int (int64 when
            one does not fit int32), float32 otherwise.
    Returns:
        a 1-D array of ``ceil((stop - start) / step)`` values.
    """
    if stop is None:
        if start is None:
            raise DtypeError("[arange] needs at least stop.")
        start, stop = 0, start
    elif start is None:
        start = 0
    if step is None:
        step = 1
    start = _real_scalar(start, "start", "arange")
    stop = _real_scalar(stop, "stop", "arange")
    step = _real_scalar(step, "step", "arange")
    if dtype is None:
        ints = (start, stop, step)
        if all(type(v) is int for v in ints):
            d = dt.int32 if all(_INT32_MIN <= v <= _INT32_MAX for v in ints) else dt.int64
        else:
            d = dt.float32
    else:
        d = dt.to_dtype(dtype)
    if d is dt.bool_:
        raise DtypeError("[arange] bool is not supported for arange.")
    if step == 0:
        raise ArgumentError("[arange] step must be nonzero.")
    if not all(math.isfinite(v) for v in (start, stop, step)):
        raise ArgumentError(f"[arange] Cannot compute the length of arange({start}, {stop}, {step}).")
    n = _arange_length(start, stop, step)
    if n > MAX_DIM:  # MLX's "Maximum size exceeded" (a ValueError)
        raise IntegerRangeError(f"[arange] arange({start}, {stop}, {step}) has {n} elements, "
                                f"more than the largest dimension ({MAX_DIM}, 32-bit as in MLX).")
    return lazy(_sized((n,), d, "arange"), d, Arange(to_stream(stream), start, stop, step, d), ())


def linspace(start, stop, num=50, endpoint: bool = True, dtype=dt.float32, *,
             stream=None) -> array:
    """``num`` evenly spaced numbers over ``[start, stop]``.

    Args:
        start: first value.
        stop: last value (included when ``endpoint``).
        num: how many values (50 when None).
        endpoint: whether ``stop`` is the last value.
        dtype: the element type (float32 when None).
    """
    num = 50 if num is None else _int(num, "num", "linspace")
    if num < 0:
        raise ArgumentError(f"[linspace] number of samples, {num}, must be non-negative.")
    d = _dtype(dtype, dt.float32)
    try:
        start, stop = float(start), float(stop)
    except (TypeError, ValueError):
        raise DtypeError(f"[linspace] start and stop must be real numbers, got {start!r} "
                         f"and {stop!r}.") from None
    return lazy(_sized((num,), d, "linspace"), d, Linspace(to_stream(stream), start, stop, num, bool(endpoint), d), ())


# -- matrices ----------------------------------------------------------------
def eye(n: int, m: int | None = None, k: int = 0, dtype=dt.float32, *, stream=None) -> array:
    """An ``n x m`` matrix with ones on the ``k``-th diagonal and zeros elsewhere.

    Args:
        n: number of rows.
        m: number of columns (``n`` when None).
        k: the diagonal: 0 the main one, positive above, negative below.
        dtype: the element type (float32 when None).
    """
    n = _size(n, "n", "eye")
    m = n if m is None else _size(m, "m", "eye")
    k = _int(k, "k", "eye")
    d = _dtype(dtype, dt.float32)
    return lazy(_sized((n, m), d, "eye"), d, Eye(to_stream(stream), n, m, k, d), ())


def identity(n: int, dtype=dt.float32, *, stream=None) -> array:
    """The ``n x n`` identity matrix."""
    return eye(n, dtype=dtype, stream=stream)


def tri(n: int, m: int | None = None, k: int = 0, dtype=None, *, stream=None) -> array:
    """An ``n x m`` matrix with ones at and below the ``k``-th diagonal, zeros above.

    Args:
        n: number of rows.
        m: number of columns (``n`` when None).
        k: the diagonal: 0 the main one, positive above, negative below.
        dtype: the element type (float32 when None).
    """
    n = _size(n, "n", "tri")
    m = n if m is None else _size(m, "m", "tri")
    k = _int(k, "k", "tri")
    d = _dtype(dtype, dt.float32)
    return lazy(_sized((n, m), d, "tri"), d, Tri(to_stream(stream), n, m, k, d), ())


def _triangle(x, k, op, stream):
    x = as_array(x)
    if x.ndim < 2:
        raise ShapeError(f"[{op}] The array must be at least 2-D, got shape {x._shape}.")
    k = _int(k, "k", op)
    n, m = x._shape[-2:]
    mask = tri(n, m, k if op == "tril" else k - 1, dt.bool_, stream=stream)
    return x, mask, constant(0, x._dtype)


def tril(x, k: int = 0, *, stream=None) -> array:
    """``x`` with the elements above the ``k``-th diagonal of its last two axes set to zero."""
    x, mask, zero = _triangle(x, k, "tril", stream)
    return mx.where(mask, x, zero, stream=stream)


def triu(x, k: int = 0, *, stream=None) -> array:
    """``x`` with the elements below the ``k``-th diagonal of its last two axes set to zero."""
    x, mask, zero = _triangle(x, k, "triu", stream)
    return mx.where(mask, zero, x, stream=stream)


# -- windows -----------------------------------------------------------------
def _window(kind, doc):
    def op(M: int, *, stream=None) -> array:
        # A negative length gives an empty window, as in MLX and NumPy.
        m = max(_int(M, "M", kind), 0)
        return lazy((m,), dt.float32, Window(to_stream(stream), kind, m), ())
    op.__name__ = op.__qualname__ = kind
    op.__doc__ = doc
    return op


_WINDOW_DOC = r"""The {title} window: ``M`` float32 points,

    .. math::
       {formula} \qquad 0 \le n \le M-1

    Args:
        M: number of points in the window (an empty window when ``M <= 0``).
    Returns:
        a 1-D float32 array, its maximum normalised to one (the value one
        appears only when ``M`` is odd).
    """

bartlett = _window("bartlett", _WINDOW_DOC.format(
    title="Bartlett (triangular)", formula=r"w(n) = 1 - \frac{2|n - (M-1)/2|}{M-1}"))
blackman = _window("blackman", _WINDOW_DOC.format(
    title="Blackman",
    formula=r"w(n) = 0.42 - 0.5 \cos\frac{2\pi n}{M-1} + 0.08 \cos\frac{4\pi n}{M-1}"))
hamming = _window("hamming", _WINDOW_DOC.format(
    title="Hamming", formula=r"w(n) = 0.54 - 0.46 \cos\frac{2\pi n}{M-1}"))
hanning = _window("hanning", _WINDOW_DOC.format(
    title="Hann", formula=r"w(n) = 0.5 - 0.5 \cos\frac{2\pi n}{M-1}"))


def meshgrid(*arrays, sparse: bool = False, indexing: str = "xy", stream=None) -> tuple:
    """Coordinate grids from coordinate arrays (flattened when not 1-D).

    Args:
        arrays: the coordinates along each axis.
        sparse: return arrays of shape ``(1, ..., n_i, ..., 1)`` that broadcast
            to the grid instead of the full grids.
        indexing: ``"xy"`` (Cartesian: the first two axes swapped) or ``"ij"``
            (matrix indexing).
    Returns:
        a tuple of arrays, one per input.
    """
    if indexing not in ("xy", "ij"):
        raise ArgumentError(f"[meshgrid] Invalid indexing value {indexing!r}. "
                         f"Valid values are 'xy' and 'ij'.")
    arrays = [as_array(a) for a in arrays]
    if len(arrays) < 2:
        return tuple(mx.reshape(a, (a.size,), stream=stream) if a.ndim != 1 else a
                     for a in arrays)
    sizes = [a.size for a in arrays]
    axes = list(range(len(arrays)))
    if indexing == "xy":
        axes[0], axes[1] = 1, 0
    grid = [1] * len(arrays)
    for ax, s in zip(axes, sizes):
        grid[ax] = s
    grid = tuple(grid)
    out = []
    for a, ax, s in zip(arrays, axes, sizes):
        shape = [1] * len(arrays)
        shape[ax] = s
        g = mx.reshape(a, tuple(shape), stream=stream)
        out.append(g if sparse else mx.broadcast_to(g, grid, stream=stream))
    return tuple(out)


PRIMITIVES = [Fill, Full, FullLike, Arange, Linspace, Eye, Tri, Window]

OPS = {f.__name__: f for f in (
    zeros, ones, full, zeros_like, ones_like, full_like, empty, empty_like, arange, linspace,
    eye, identity, tri, tril, triu, meshgrid, bartlett, blackman, hamming, hanning)}


lazyx_primitives, lazyx_ops = pack_hooks(PRIMITIVES, OPS)


# -- examples for the registry-wide transform test -------------------------------
# A made array has no inputs: the examples use one with a differentiable array.
def _times(make):
    return lambda x: mx.multiply(x, make())


@hookimpl
def lazyx_examples():
    f64 = dt.float64
    return [
        (Fill, example(_times(lambda: ones((2, 3), f64)), uniform((2, 3)))),
        (Full, example(lambda x: full((2, 3), x), uniform((3,)))),
        (Full, example(lambda x: full((2, 3), x), uniform((2, 1)))),
        (FullLike, example(lambda a, v: full_like_node(a, v), uniform((2, 3)), uniform((3,)))),
        (FullLike, example(lambda a, v: full_like_node(a, v), uniform((2, 3)), uniform((2, 1)))),
        (Arange, example(_times(lambda: arange(3, dtype=f64)), uniform((2, 3)))),
        (Linspace, example(_times(lambda: linspace(-1, 1, 3, dtype=f64)), uniform((2, 3)))),
        (Eye, example(_times(lambda: eye(3, dtype=f64)), uniform((3, 3)))),
        (Tri, example(_times(lambda: tri(3, dtype=f64)), uniform((3, 3)))),
        (Window, example(_times(lambda: hanning(4)), uniform((2, 4)))),
    ]
