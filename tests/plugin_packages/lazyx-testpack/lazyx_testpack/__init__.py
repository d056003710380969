"""A third-party op pack for lazyx's tests: one primitive, one op, found by entry point.

``lazyx.core.testpack.cube(x)`` computes ``x ** 3`` through the primitive
``Cube``, whose CPU kernel is its own ``eval_cpu`` (no backend knows it). Its
transform rules sit beside it, written with ``lazyx.core`` ops as a plugin's
should be, and its ``lazyx_examples`` entry lets lazyx's registry-wide test
check them.
"""

import numpy as np

import lazyx.core as mx
from lazyx.extend import Primitive, as_array, hookimpl, lazy, to_stream

IMPORTED = True


class Cube(Primitive):
    __slots__ = ()

    def eval_cpu(self, inputs):
        x = inputs[0]
        return x * x * x

    def output_shapes(self, inputs):
        return [inputs[0].shape]

    def _derivative(self, x):
        return mx.multiply(mx.square(x, stream=self.stream), 3, stream=self.stream)

    def vjp(self, primals, cotangents, argnums, outputs):
        return [mx.multiply(cotangents[0], self._derivative(primals[0]), stream=self.stream)]

    def jvp(self, primals, tangents, argnums):
        return [mx.multiply(tangents[0], self._derivative(primals[0]), stream=self.stream)]

    def vmap(self, inputs, axes):
        # Element-wise: the batch axis stays where it is.
        return [cube(inputs[0], stream=self.stream)], [axes[0]]


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


@hookimpl
def lazyx_examples():
    x = np.linspace(-1.5, 2.0, 6).reshape(2, 3)
    return [(Cube, lambda: (cube, [x]))]
