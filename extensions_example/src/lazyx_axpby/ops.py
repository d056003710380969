"""``axpby(x, y, alpha, beta)`` and its primitive, ``Axpby``.

This is MLX's custom-extension example written as a lazyx op pack. The op
function applies the type rules and adds one node; the primitive carries
``alpha`` and ``beta`` as its parameters and brings everything a transform or
a backend asks of it:

* ``eval_cpu``: the package's C++ kernel (:mod:`lazyx_axpby.kernels`), so no
  lazyx backend needs to know the primitive;
* GPU kernels per backend, registered by the plugin (``axpby.cu`` for ``cuda``);
  ``eval_gpu`` only says so for a GPU backend it has no kernel for;
* ``output_shapes``, ``is_equivalent`` (for the CSE of ``compile``);
* ``vjp``, ``jvp`` and ``vmap``, written with ``lazyx.core`` ops, so their
  results can be transformed again;
* ``to_expression``: the operation in ``compile``'s code-generation IR, which
  lets ``compile`` fuse it with the element-wise operations around it.
"""

from __future__ import annotations

import numbers

from lazyx.extend import (ArgumentError, KernelNotFoundError, Primitive, align_batched, array,
                          binary_operands, broadcast_shapes, broadcast_to_shape, cast, ir, lazy,
                          sum_to_shape, to_stream)
from lazyx.extend import dtypes as dt

import lazyx.core as mx

from . import kernels

__all__ = ["Axpby", "axpby"]

#: The result dtype by the common dtype of x and y (others give float32): what MLX
#: gives ``alpha * x + beta * y`` for Python floats alpha and beta.
_RESULT = {d: d for d in (dt.float16, dt.bfloat16, dt.float32, dt.float64, dt.complex64)}
#: The dtype the kernel computes in, by the dtype of the inputs.
_COMPUTE = {dt.float16: dt.float32, dt.bfloat16: dt.float32}


def _scaled(t, s: float, stream):
    """``s * t`` for a tangent or cotangent ``t`` (None: zero)."""
    if t is None or s == 0.0:
        return None
    return t if s == 1.0 else mx.multiply(t, s, stream=stream)


class Axpby(Primitive):
    """``alpha * x + beta * y`` element-wise, ``x`` and ``y`` broadcast together.

    Its inputs have one floating (or complex64) dtype, which is the output's.
    """

    __slots__ = ("alpha", "beta")
    alpha: float
    beta: float

    def __init__(self, stream, alpha: float, beta: float):
        self.stream = stream
        self.alpha = alpha
        self.beta = beta

    # -- kernels ------------------------------------------------------------------
    #: ``eval_cpu(self, inputs)``: the C++ kernel (the function itself, which saves a
    #: Python call per evaluation; see :func:`lazyx_axpby.kernels.native_kernel`).
    eval_cpu = kernels.cpu_kernel

    def eval_gpu(self, inputs):
        raise KernelNotFoundError(
            "Axpby has no kernel for this GPU backend: lazyx-axpby registers its GPU kernels "
            "per backend through the lazyx_kernels hook (axpby.cu for 'cuda', axpby.metal for "
            "'metal'). Run it on the CPU (stream=lazyx.core.cpu) or on one of those.")

    # A kernel that only raises: ``lazyx info`` lists Axpby as missing on such backends.
    eval_gpu.missing = True

    # -- identity and shapes --------------------------------------------------------
    def is_equivalent(self, other) -> bool:
        # float.hex tells 0.0 from -0.0 (their results differ in the sign of zeros)
        # and makes nan equal to itself.
        return (type(other) is Axpby and other.stream == self.stream
                and other.alpha.hex() == self.alpha.hex() and other.beta.hex() == self.beta.hex())

    def output_shapes(self, inputs):
        return [broadcast_shapes(inputs[0].shape, inputs[1].shape)]

    # -- code generation ------------------------------------------------------------
    def to_expression(self, args):
        """``alpha * x + beta * y`` in the IR of fused kernels, with the kernel's own
        rounding: float16 and bfloat16 are computed in float32 and rounded once."""
        x, y = args
        d = x.dtype
        c = _COMPUTE.get(d, d)
        x, y = ir.cast(x, c), ir.cast(y, c)
        ax = ir.apply("mul", ir.constant(self.alpha, c), x)
        by = ir.apply("mul", ir.constant(self.beta, c), y)
        return ir.cast(ir.apply("add", ax, by), d)

    # -- transforms -----------------------------------------------------------------
    def vjp(self, primals, cotangents, argnums, outputs):
        g, s = cotangents[0], self.stream
        return [sum_to_shape(_scaled(g, self.alpha if i == 0 else self.beta, s), primals[i].shape, s)
                for i in argnums]

    def jvp(self, primals, tangents, argnums):
        s = self.stream
        if len(argnums) == 2:
            # Tangents have their primals' shapes: axpby of them broadcasts the same way.
            return [axpby(tangents[0], tangents[1], self.alpha, self.beta, stream=s)]
        t = _scaled(tangents[0], self.alpha if argnums[0] == 0 else self.beta, s)
        return [broadcast_to_shape(t, broadcast_shapes(primals[0].shape, primals[1].shape), s)]

    def vmap(self, inputs, axes):
        (x, y), axis = align_batched(inputs, axes)
        return [axpby(x, y, self.alpha, self.beta, stream=self.stream)], [axis]


def _real(value, name: str) -> float:
    if isinstance(value, numbers.Real) and not isinstance(value, array):
        return float(value)
    raise ArgumentError(f"[axpby] {name} must be a real Python number, got "
                        f"{type(value).__name__} {value!r}.")


def axpby(x, y, alpha: float, beta: float, *, stream=None) -> array:
    """Scale and add two arrays: ``alpha * x + beta * y``.

    ``x`` and ``y`` broadcast together (NumPy's rules) and are promoted to a
    common dtype; as for ``alpha * x + beta * y`` with Python floats, an
    integer or boolean common dtype gives a ``float32`` result, and floating
    and complex dtypes are kept (``float16`` and ``bfloat16`` are computed in
    ``float32``).

    Args:
        x (array): Input array (or scalar).
        y (array): Input array (or scalar).
        alpha (float): The scale of ``x``.
        beta (float): The scale of ``y``.
        stream (Stream, optional): Stream or device to run on.

    Returns:
        array: ``alpha * x + beta * y``.

    Example:
        >>> axpby(mx.array([1.0, 2.0]), mx.array(10.0), 2.0, 0.5).tolist()
        [7.0, 9.0]
    """
    if type(alpha) is not float:
        alpha = _real(alpha, "alpha")
    if type(beta) is not float:
        beta = _real(beta, "beta")
    x, y, d = binary_operands(x, y, stream)
    out = _RESULT.get(d)
    if out is None:
        x, y, out = cast(x, dt.float32, stream), cast(y, dt.float32, stream), dt.float32
    return lazy(broadcast_shapes(x.shape, y.shape), out, Axpby(to_stream(stream), alpha, beta), (x, y))
