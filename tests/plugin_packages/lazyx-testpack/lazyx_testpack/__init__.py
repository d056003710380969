"""A third-party op pack for lazyx's tests: one primitive, one op, found by entry point.

``lazyx.core.testpack.cube(x)`` computes ``x ** 3`` through the primitive
``Cube``, whose CPU kernel is its own ``eval_cpu`` (no backend knows it).
"""

import numpy as np

from lazyx import hookimpl
from lazyx.arguments import as_array
from lazyx.array import lazy
from lazyx.device import to_stream
from lazyx.primitive import Primitive

IMPORTED = True


class Cube(Primitive):
    __slots__ = ()

    def eval_cpu(self, inputs):
        x = inputs[0]
        return x * x * x

    def output_shapes(self, inputs):
        return [inputs[0].shape]


def cube(x, /, *, stream=None):
    """``x ** 3``, element-wise."""
    x = as_array(x)
    return lazy(x.shape, x.dtype, Cube(to_stream(stream)), (x,))


@hookimpl
def lazyx_primitives():
    return [Cube]


@hookimpl
def lazyx_ops():
    return {"testpack.cube": cube, "array.cube": cube}
