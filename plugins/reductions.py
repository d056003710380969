"""Reductions op pack: sums, extrema, statistics, arg-reductions and scans.

Four primitive families carry everything:

* :class:`Reduce` (``op`` one of ``sum prod max min all any``) over a tuple of axes;
* :class:`ArgReduce` (``argmax``/``argmin``) over one axis or the flattened array;
* :class:`LogSumExp`, a primitive of its own so that its kernels can be
  numerically stable (max-subtracted) in one pass;
* :class:`Scan` (``op`` one of ``sum prod max min logaddexp``) for the cumulative ops.

``mean``, ``var``, ``std`` and ``count_nonzero`` are compositions of these with
element-wise ops, as in MLX; ``median`` is a primitive (:class:`Median`) because
its NumPy kernel is one call. Kernels live in
``lazyx.backends.cpu.kernels.reductions``.
"""

from __future__ import annotations

import operator

import lazyx.core as mx
from lazyx import dtypes as dt
from lazyx.arguments import as_array, cast, normalize_axes, normalize_axis
from lazyx.array import array, lazy
from lazyx.device import to_stream
from lazyx.errors import DtypeError, ShapeError
from lazyx.hookspecs import hookimpl
from lazyx.primitive import Primitive

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

    def __init__(self, stream, axes: tuple, keepdims: bool):
        self.stream = stream
        self.axes = axes
        self.keepdims = keepdims

    def output_shapes(self, inputs):
        return [reduced_shape(inputs[0].shape, self.axes, self.keepdims)]


class Reduce(_OverAxes):
    """Reduce one input over ``axes`` with ``op`` (``sum prod max min all any``).

    Output dtype: ``bool`` for ``all``/``any``; for ``sum``/``prod`` bool, int8 and
    int16 give int32, uint8 and uint16 give uint32 (:data:`SUM_DTYPE`), other
    dtypes are kept; ``max``/``min`` keep the input dtype. float16 and bfloat16
    accumulate in float32. ``axes`` is never empty.
    """

    __slots__ = ("op",)

    def __init__(self, stream, op: str, axes: tuple, keepdims: bool):
        self.stream = stream
        self.op = op
        self.axes = axes
        self.keepdims = keepdims


class ArgReduce(Primitive):
    """Index of the ``op`` (``argmax``/``argmin``) element along ``axis``, as uint32.

    ``axis=None`` reduces the flattened array (the result has shape ``()``, or
    all ones when ``keepdims``). Ties give the first index; a NaN wins both.
    """

    __slots__ = ("op", "axis", "keepdims")

    def __init__(self, stream, op: str, axis, keepdims: bool):
        self.stream = stream
        self.op = op
        self.axis = axis
        self.keepdims = keepdims

    def output_shapes(self, inputs):
        shape = inputs[0].shape
        if self.axis is None:
            return [(1,) * len(shape) if self.keepdims else ()]
        return [reduced_shape(shape, (self.axis,), self.keepdims)]


class LogSumExp(_OverAxes):
    """``log(sum(exp(x)))`` over ``axes``, computed stably as ``m + log(sum(exp(x - m)))``
    with ``m`` the (finite) maximum. The input is inexact; the output has its dtype."""

    __slots__ = ()


class Median(_OverAxes):
    """The median over ``axes`` (mean of the two middle values for an even count;
    NaN when the slice holds a NaN). The input is inexact; the output has its dtype."""

    __slots__ = ()


class Scan(Primitive):
    """Cumulative ``op`` (``sum prod max min logaddexp``) along ``axis``.

    ``reverse`` scans from the end; ``inclusive=False`` shifts by one so element
    ``i`` combines only the elements before it (the first gets the identity: 0,
    1, the dtype's lowest/highest value, -inf). The output has the input's shape
    and dtype (the op functions cast beforehand: a bool sum becomes int32, an
    integer logaddexp float32). float16 and bfloat16 accumulate in float32.
    """

    __slots__ = ("op", "axis", "reverse", "inclusive")

    def __init__(self, stream, op: str, axis: int, reverse: bool, inclusive: bool):
        self.stream = stream
        self.op = op
        self.axis = axis
        self.reverse = reverse
        self.inclusive = inclusive

    def output_shapes(self, inputs):
        return [inputs[0].shape]


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
    n = _size(x._shape, axes)
    # 0 * inf is NaN: the mean of no elements, as in MLX.
    return mx.multiply(_reduce("sum", x, axes, keepdims, stream), 1.0 / n if n else float("inf"),
                       stream=stream)


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
    div = _size(x._shape, axes) - ddof
    # MLX clamps the divisor at 0, so ddof >= n gives inf (or NaN for zero spread).
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


PRIMITIVES = [Reduce, ArgReduce, LogSumExp, Median, Scan]

OPS = {
    "sum": sum, "prod": prod, "max": max, "min": min, "mean": mean, "var": var, "std": std,
    "all": all, "any": any, "argmax": argmax, "argmin": argmin, "logsumexp": logsumexp,
    "count_nonzero": count_nonzero, "median": median,
    "cumsum": cumsum, "cumprod": cumprod, "cummax": cummax, "cummin": cummin,
    "logcumsumexp": logcumsumexp,
    "array.sum": sum, "array.prod": prod, "array.max": max, "array.min": min,
    "array.mean": mean, "array.var": _var_method, "array.std": _std_method,
    "array.all": all, "array.any": any, "array.argmax": argmax, "array.argmin": argmin,
    "array.logsumexp": logsumexp, "array.cumsum": _no_dtype(cumsum),
    "array.cumprod": _no_dtype(cumprod), "array.cummax": cummax, "array.cummin": cummin,
    "array.logcumsumexp": logcumsumexp,
}


@hookimpl
def lazyx_primitives():
    return PRIMITIVES


@hookimpl
def lazyx_ops():
    return OPS
