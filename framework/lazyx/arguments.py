"""Argument handling shared by every op pack (built-in or third-party).

These are the pieces an op function uses before it adds its node: turning
Python scalars into weakly typed constants, MLX's promotion of two operands,
broadcasting shapes, and normalising axes. Each raises the lazyx error that
names the problem.
"""

from __future__ import annotations

import numpy as np

from . import dtypes as _dt
from . import ops
from .array import array, from_buffer
from .device import to_stream
from .errors import (ArgumentError, AxisError, DtypeError, IntegerRangeError, LazyxError,
                     ShapeError, at_op)

__all__ = ["as_array", "constant", "binary_operands", "broadcast_shapes", "normalize_axis",
           "normalize_axes", "to_stream", "cast", "check_dimensions", "MAX_DIM"]

_PY_SCALARS = (bool, int, float, complex)
#: The largest dimension: MLX's shapes are 32-bit ints.
MAX_DIM = 2**31 - 1


def check_dimensions(dims: tuple, op: str) -> tuple:
    """``dims`` (a tuple of ints) unchanged, or the error MLX raises for a negative
    dimension (a ValueError) or one beyond 32 bits (an OverflowError)."""
    for d in dims:
        if d < 0:
            raise ShapeError(f"[{op}] Negative dimensions are not allowed, got shape {dims}.")
        if d > MAX_DIM:
            raise IntegerRangeError(f"[{op}] Dimension {d} of shape {dims} is outside the "
                                    f"supported range [0, {MAX_DIM}] (32-bit, as in MLX).")
    return dims
_constants: dict = {}
def cast(a: array, dtype: _dt.Dtype, stream=None) -> array:
    """``a`` converted to ``dtype`` (``a`` itself when it already has it)."""
    if a._dtype is dtype:
        return a
    return ops.astype(a, dtype, stream=stream)


def constant(value, dtype: _dt.Dtype) -> array:
    """An evaluated 0-d array holding Python scalar ``value`` as ``dtype`` (cached).

    An int that does not fit an integer ``dtype`` is an error (``uint8_array + 300``),
    as in MLX; the array constructor instead wraps (``array(300, dtype=uint8)``).
    """
    key = (type(value), value, dtype)
    try:
        c = _constants.get(key)
    except TypeError:  # unhashable (nan is fine, it hashes)
        c = None
    if c is None:
        if dtype.kind in "ui" and isinstance(value, float):
            data = np.array(value).astype(dtype.np)
        else:
            if dtype.kind in "ui" and isinstance(value, int):
                info = np.iinfo(dtype.np)
                if not info.min <= value <= info.max:
                    raise ArgumentError(f"Converting {value} to {dtype.name} would result in "
                                        f"overflow ({dtype.name} holds [{info.min}, "
                                        f"{info.max}]).")
            data = np.array(value, dtype=dtype.np)
        data.flags.writeable = False  # shared by every op that meets the value: never written
        c = from_buffer(data, dtype)
        if value == 0 and type(value) is not int and type(value) is not bool:
            return c  # 0.0 == -0.0 as keys: a cached zero would lose its sign (1 / -0.0)
        if len(_constants) > 4096:
            _constants.clear()
        _constants[key] = c
    return c


def as_array(x, dtype: _dt.Dtype | None = None) -> array:
    """``x`` as an array: arrays pass through, scalars and sequences are converted."""
    if type(x) is array:
        return x if dtype is None else cast(x, dtype)
    if isinstance(x, _PY_SCALARS):
        return constant(x, dtype if dtype is not None else _dt.scalar_dtype(x))
    if isinstance(x, array):
        return x if dtype is None else cast(x, dtype)
    return array(x, dtype)


def binary_operands(a, b, stream=None, op: str | None = None):
    """Two operands converted to arrays of their common dtype, by MLX's rules.

    Python scalars are weakly typed (``int8_array + 1`` stays int8); one that does not
    fit the array's dtype is an :class:`ArgumentError` (named ``[op]`` when given).
    Returns ``(a, b, dtype)``.
    """
    ta, tb = type(a), type(b)
    if ta is array and tb is array:  # the common case first: it cannot fail
        da, db = a._dtype, b._dtype
        if da is db:
            return a, b, da
    if op is not None:
        try:
            return binary_operands(a, b, stream)
        except LazyxError as e:
            raise at_op(e, op)
    if ta is array:
        if tb is array:
            da, db = a._dtype, b._dtype
            d = _dt._PROMOTE[(da, db)]
            return cast(a, d, stream), cast(b, d, stream), d
        if tb in _PY_SCALARS:
            d = _dt.weak_scalar_dtype(a._dtype, tb)
            try:
                return cast(a, d, stream), constant(b, d), d
            except ArgumentError as e:
                raise _scalar_error(e, a) from None
        return binary_operands(a, as_array(b), stream)
    if ta in _PY_SCALARS:
        if tb is array:
            d = _dt.weak_scalar_dtype(b._dtype, ta)
            try:
                return constant(a, d), cast(b, d, stream), d
            except ArgumentError as e:
                raise _scalar_error(e, b) from None
        if tb in _PY_SCALARS:
            d = _dt._result_type(a, b)
            return constant(a, d), constant(b, d), d
        return binary_operands(a, as_array(b), stream)
    if isinstance(a, array) or isinstance(b, array) or isinstance(a, _PY_SCALARS):
        return binary_operands(_operand(a), _operand(b), stream)
    return binary_operands(as_array(a), b, stream)


def _operand(x):
    """``x`` for :func:`binary_operands`' typed branches: an array (a subclass too), a
    Python scalar, a subclass of one (``np.float64`` is a ``float``) as that weak Python
    scalar, as MLX takes it, or anything else as an array."""
    if isinstance(x, array) or type(x) in _PY_SCALARS:
        return x
    for t in (bool, int, float, complex):
        if isinstance(x, t):
            return t(x)
    return as_array(x)


def _scalar_error(e: ArgumentError, other: array) -> ArgumentError:
    """A scalar that does not fit the dtype of the array it meets: name that array."""
    return ArgumentError(f"{e} The Python scalar meets an array of shape {other._shape} and "
                         f"dtype {other._dtype.name}; cast the array to a wider dtype first.")


def broadcast_shapes(*shapes, op: str | None = None) -> tuple[int, ...]:
    """The shape that ``shapes`` broadcast to, as NumPy defines it (a
    :class:`ShapeError` naming ``[op]`` and the shapes when they do not)."""
    if len(shapes) == 2:
        s1, s2 = shapes
        if s1 == s2 or not s2:
            return tuple(s1)
        if not s1:
            return tuple(s2)
    else:
        s1 = shapes[0] if shapes else ()
        if all(s == s1 for s in shapes):
            return tuple(s1)
    ndim = max(len(s) for s in shapes)
    out = [1] * ndim
    for s in shapes:
        off = ndim - len(s)
        for i, d in enumerate(s):
            o = out[off + i]
            if o == 1:
                out[off + i] = d
            elif d != 1 and d != o:
                where = f"[{op}] " if op else ""
                raise ShapeError(f"{where}Shapes {' and '.join(str(tuple(x)) for x in shapes)} "
                                 f"cannot be broadcast.")
    return tuple(out)


def normalize_axis(axis: int, ndim: int, name: str = "axis") -> int:
    """``axis`` in ``[0, ndim)`` (negative axes count from the end)."""
    if type(axis) is not int:
        try:
            axis = axis.__index__()
        except (AttributeError, TypeError, ValueError):
            raise AxisError(f"{name} must be an integer, got {axis!r}.") from None
    if axis < -ndim or axis >= ndim:
        raise AxisError(f"{name} {axis} is out of bounds for an array of dimension {ndim}.")
    return int(axis) % ndim if ndim else 0


def normalize_axes(axes, ndim: int, name: str = "axis") -> tuple[int, ...]:
    """``axes`` (None for all, an int, or a sequence) as sorted unique non-negative ints."""
    if axes is None:
        return tuple(range(ndim))
    if isinstance(axes, (int, np.integer)) or hasattr(axes, "__index__"):
        return (normalize_axis(axes, ndim, name),)
    out = tuple(normalize_axis(a, ndim, name) for a in axes)
    if len(set(out)) != len(out):
        op, _, what = name.rpartition("] ")  # name may carry the op: "[sum] axis"
        raise AxisError(f"{op + '] ' if op else ''}Repeated {what} in {tuple(axes)}.")
    return tuple(sorted(out))


def check_dtype(x: array, allowed: str, op: str) -> None:
    """Raise if ``x``'s dtype kind is not one of ``allowed`` (``"bui"``, ``"fc"``...)."""
    if x._dtype.kind not in allowed:
        raise DtypeError(f"[{op}] does not support dtype {x._dtype.name} (an array of shape "
                         f"{x._shape}).")
