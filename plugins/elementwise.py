"""Element-wise op pack: unary, binary and ternary operations, all broadcasting.

Each operation is a small :class:`Primitive` subclass (its shape rule comes
from its base: same shape for unary, the broadcast shape for binary) and an op
function that applies MLX's dtype rules and adds the node. Kernels live in the
backends (``lazyx.backends.cpu.kernels.elementwise``).
"""

from __future__ import annotations

from lazyx import dtypes as dt
from lazyx.arguments import binary_operands, broadcast_shapes, as_array, cast
from lazyx.array import array, lazy
from lazyx.device import to_stream
from lazyx.hookspecs import hookimpl
from lazyx.primitive import Primitive


# -- primitive families ------------------------------------------------------
class Unary(Primitive):
    """An element-wise primitive of one input; the output has the input's shape."""

    __slots__ = ()

    def output_shapes(self, inputs):
        return [inputs[0].shape]


class Binary(Primitive):
    """An element-wise primitive of two inputs that broadcast."""

    __slots__ = ()

    def output_shapes(self, inputs):
        return [broadcast_shapes(inputs[0].shape, inputs[1].shape)]


class AsType(Unary):
    __slots__ = ("dtype",)

    def __init__(self, stream, dtype):
        super().__init__(stream)
        self.dtype = dtype


class Exp(Unary):
    __slots__ = ()


class Negative(Unary):
    __slots__ = ()


class Add(Binary):
    __slots__ = ()


class Subtract(Binary):
    __slots__ = ()


class Multiply(Binary):
    __slots__ = ()


# -- op functions ------------------------------------------------------------
def astype(a, dtype, /, *, stream=None) -> array:
    """``a`` converted to ``dtype``."""
    a = as_array(a)
    dtype = dt.to_dtype(dtype)
    if a._dtype is dtype:
        return a
    return lazy(a._shape, dtype, AsType(to_stream(stream), dtype), (a,))


def _unary(cls, doc, float_only=False):
    def op(a, /, *, stream=None) -> array:
        a = as_array(a)
        d = a._dtype
        if float_only and d.kind in "biu":
            d = dt.float32
            a = cast(a, d, stream)
        return lazy(a._shape, d, cls(to_stream(stream)), (a,))
    op.__doc__ = doc
    return op


def _binary(cls, doc):
    def op(a, b, /, *, stream=None) -> array:
        a, b, d = binary_operands(a, b, stream)
        sa, sb = a._shape, b._shape
        return lazy(sa if sa == sb else broadcast_shapes(sa, sb), d,
                    cls(to_stream(stream)), (a, b))
    op.__doc__ = doc
    return op


exp = _unary(Exp, "Element-wise exponential: ``e ** a``. Integer inputs give float32.",
             float_only=True)
negative = _unary(Negative, "Element-wise negation: ``-a``.")
add = _binary(Add, "Element-wise addition with broadcasting: ``a + b``.")
subtract = _binary(Subtract, "Element-wise subtraction with broadcasting: ``a - b``.")
multiply = _binary(Multiply, "Element-wise multiplication with broadcasting: ``a * b``.")


def _reflect(fn):
    def r(a, b):
        return fn(b, a)
    return r


PRIMITIVES = [AsType, Exp, Negative, Add, Subtract, Multiply]

OPS = {
    "astype": astype, "exp": exp, "negative": negative,
    "add": add, "subtract": subtract, "multiply": multiply,
    "array.astype": astype,
    "array.__add__": add, "array.__radd__": _reflect(add),
    "array.__sub__": subtract, "array.__rsub__": _reflect(subtract),
    "array.__mul__": multiply, "array.__rmul__": _reflect(multiply),
    "array.__neg__": negative,
    "array.exp": exp,
}


@hookimpl
def lazyx_primitives():
    return PRIMITIVES


@hookimpl
def lazyx_ops():
    return OPS
