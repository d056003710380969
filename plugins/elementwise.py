"""Element-wise op pack: unary, binary and ternary operations, all broadcasting.

Each operation is a small :class:`Primitive` subclass (its shape rule comes
from its base: same shape for unary, the broadcast shape for binary) and an op
function that applies MLX's dtype rules and adds the node. Kernels live in the
backends (``lazyx.backends.cpu.kernels.elementwise``).

The dtype rules of an op are data: the factories below turn a rule into a
table ``{input dtype: (dtype to cast the inputs to, output dtype)}`` once, so
a call costs one dictionary lookup. An entry that is ``None`` means the op is
the identity for that dtype (``floor`` of an integer array returns the array);
a string entry is the error message for a dtype the op refuses.

Transform rules sit in the family bases: a unary primitive states its
derivative, a binary one its partial derivatives, and the bases make ``vjp``
(conjugated for complex inputs and summed back over broadcast dimensions, as
MLX does), ``jvp`` and ``vmap`` (batch axes aligned across operands) from them.
The derivatives of tanh, sigmoid, sin, cos and square (and ``x * x``) have
a fused form, a :class:`DerivativeProduct` primitive that computes ``g * f'(z)``
in one node (one per op of a backward pass instead of two or three).
Piecewise-constant and integer- or bool-valued primitives take the
:class:`~lazyx.rules.NoGradient` mixin. The shared moves
(``sum_to_shape``, ``align_batched`` ...) come from :mod:`lazyx.rules`.
"""

from __future__ import annotations

import math

import numpy as np

from lazyx import dtypes as dt
from lazyx.arguments import as_array, binary_operands, broadcast_shapes, cast, constant
from lazyx.array import array, from_buffer, lazy, lazy_multi, native, node_maker
from lazyx.codegen import ir
from lazyx.device import current_stream, thread_state, to_stream
from lazyx.errors import ArgumentError, DtypeError, LazyxError, TransformError, at_op
from lazyx.hookspecs import hookimpl, pack_hooks
from lazyx.primitive import Primitive, SameShape
from lazyx.examples import booleans, example, integers, uniform
from lazyx.rules import (NoGradient, add_tangents, align_batched,
                                   broadcast_to_shape, sum_to_shape)

import lazyx.core as mx

_PY_SCALARS = (bool, int, float, complex)


# -- transform helpers --------------------------------------------------------
# Rules are written with ``lazyx.core`` ops, so what they return is again a lazy
# graph that other transforms can walk. A rule returns None for a zero result.
def _tangent(t, d):
    """``t * d`` for a partial derivative ``d`` (an array or a number; 0 gives None)."""
    if type(d) is not array:
        if d == 0:
            return None
        if d == 1:
            return t
        if d == -1:
            return mx.negative(t)
    return mx.multiply(t, d)


def _cotangent(g, d):
    """``g * conj(d)``: the adjoint of :func:`_tangent`, as MLX defines it for complex."""
    if type(d) is array:
        return mx.multiply(g, mx.conj(d) if d._dtype.kind == "c" else d)
    return _tangent(g, d)


# -- primitive families ------------------------------------------------------
class Unary(SameShape):
    """An element-wise primitive of one input; the output has the input's shape.

    A subclass gives its derivative (``derivative(x, y)``: ``f'(x)`` from the
    input and, in reverse mode, the output ``y``); the base turns it into the
    rules: ``vjp = g * conj(f'(x))`` (MLX's convention for complex inputs),
    ``jvp = t * f'(x)``, and ``vmap`` applies the op to the batch, keeping its axis.
    """

    __slots__ = ()
    arity = 1
    #: The op function that adds a node of this primitive (set with the op).
    _op = None
    #: The codegen IR op this primitive is (``lazyx.codegen.ir.OPS``): what makes it
    #: fusible by ``compile``. Subclasses name theirs in one line.
    expression = None
    #: A :class:`DerivativeProduct` computing ``g * f'(x)`` in one node (from ``(g, y)``,
    #: the output, when ``grad_of_output``): the rules of real floating inputs then
    #: add one node instead of the derivative's few.
    fused_grad = None
    grad_of_output = False

    def to_expression(self, args):
        """This operation in the codegen IR, or None where it cannot be fused."""
        return ir.maybe_apply(self.expression, args)

    def derivative(self, x, y):
        raise TransformError(f"[{self.name}] has no derivative: implement derivative(x, y) "
                             f"or vjp and jvp.")

    def apply(self, x):
        """This operation on ``x`` (a fresh node)."""
        return type(self)._op(x, stream=self.stream)

    def _output(self, x, y):
        return self.apply(x) if y is None else y

    def vjp(self, primals, cotangents, argnums, outputs):
        fused = self.fused_grad
        if fused is not None:
            g = _fused(fused, cotangents[0], outputs[0] if self.grad_of_output else primals[0],
                       self.stream)
            if g is not None:
                return [g]
        return [_cotangent(cotangents[0], self.derivative(primals[0], outputs[0]))]

    def jvp(self, primals, tangents, argnums):
        fused = self.fused_grad
        if fused is not None:
            x = primals[0]
            t = _fused(fused, tangents[0], self.apply(x) if self.grad_of_output else x,
                       self.stream)
            if t is not None:
                return [t]
        return [_tangent(tangents[0], self.derivative(primals[0], None))]

    def vmap(self, inputs, axes):
        return [self.apply(inputs[0])], [axes[0]]


class Binary(Primitive):
    """An element-wise primitive of two inputs that broadcast.

    A subclass gives its partial derivatives (``partial(i, a, b, y)``: of the
    output with respect to input ``i``; ``y`` is the output in reverse mode, else
    None). The base sums each cotangent back over the dimensions its operand was
    broadcast along, adds the tangents, and batches by aligning the operands'
    batch axes (:func:`~lazyx.rules.align_batched`).
    """

    __slots__ = ()
    arity = 2
    _op = None
    #: The codegen IR op this primitive is (``lazyx.codegen.ir.OPS``): what makes it
    #: fusible by ``compile``. Subclasses name theirs in one line.
    expression = None

    def to_expression(self, args):
        """This operation in the codegen IR, or None where it cannot be fused."""
        return ir.maybe_apply(self.expression, args)

    def output_shapes(self, inputs):
        return [broadcast_shapes(inputs[0].shape, inputs[1].shape)]

    def partial(self, i, a, b, y):
        raise TransformError(f"[{self.name}] has no partial derivatives: implement "
                             f"partial(i, a, b, y) or vjp and jvp.")

    def apply(self, a, b):
        return type(self)._op(a, b, stream=self.stream)

    def _output(self, a, b, y):
        return self.apply(a, b) if y is None else y

    # Arithmetic on bool arrays (``True + True``) has nothing to differentiate.
    def vjp(self, primals, cotangents, argnums, outputs):
        if outputs[0]._dtype.kind == "b":
            return [None] * len(argnums)
        a, b = primals
        g, y = cotangents[0], outputs[0]
        if a is b and len(argnums) == 2:
            # One array on both sides (``x * x``): one cotangent, for the sum of the
            # partials, instead of two that the walker would then add.
            d0, d1 = self.partial(0, a, b, y), self.partial(1, a, b, y)
            if d0 is d1 and type(d0) is array:
                d = mx.multiply(d0, 2)
            elif type(d0) is array or type(d1) is array:
                d = mx.add(d0, d1)
            else:
                d = d0 + d1
            return [_cotangent(g, d), None]
        return [sum_to_shape(_cotangent(g, self.partial(i, a, b, y)), primals[i]._shape)
                for i in argnums]

    def jvp(self, primals, tangents, argnums):
        a, b = primals
        if a._dtype.kind == "b":
            return [None]
        out = None
        for i, t in zip(argnums, tangents):
            out = add_tangents(out, _tangent(t, self.partial(i, a, b, None)))
        return [broadcast_to_shape(out, broadcast_shapes(a._shape, b._shape))]

    def vmap(self, inputs, axes):
        (a, b), k = align_batched(inputs, axes)
        return [self.apply(a, b)], [k]


class Ternary(Primitive):
    """An element-wise primitive of three inputs that broadcast."""

    __slots__ = ()
    arity = 3
    #: The codegen IR op this primitive is (``lazyx.codegen.ir.OPS``): what makes it
    #: fusible by ``compile``. Subclasses name theirs in one line.
    expression = None

    def to_expression(self, args):
        """This operation in the codegen IR, or None where it cannot be fused."""
        return ir.maybe_apply(self.expression, args)


    def output_shapes(self, inputs):
        return [broadcast_shapes(*(x.shape for x in inputs))]


class BinaryAll(NoGradient, Primitive):
    """Two inputs reduced to one boolean scalar (``allclose``, ``array_equal``).

    Batched, the element-wise comparison runs on the aligned operands and is
    reduced over every axis but the batch.
    """

    __slots__ = ()

    def output_shapes(self, inputs):
        return [()]

    def vmap(self, inputs, axes):
        (a, b), _ = align_batched(inputs, axes, front=True)
        e = self.elementwise(a, b)
        if e.ndim > 1:
            e = mx.all(e, axis=tuple(range(1, e.ndim)))
        return [e], [0]


# -- derivative products ------------------------------------------------------
def _fused(cls, g, z, stream):
    """A ``cls`` node on ``(g, z)``: a cotangent or tangent times a derivative at ``z``, or
    None where the fused primitive does not apply (complex or integer dtypes)."""
    d = g._dtype
    if d is not z._dtype or d.kind != "f" or g._shape != z._shape:
        return None
    return lazy(z._shape, d, cls(stream), (g, z))


def _real_expression(args):
    """The two operands when they are of one real floating dtype (else None: not fused)."""
    g, z = args
    return (g, z) if g.dtype is z.dtype and g.dtype.kind == "f" else (None, None)


class DerivativeProduct(Binary):
    """``g * f'(z)`` in one node: what a unary primitive's rules add for real floating
    inputs (``g`` the cotangent or tangent, ``z`` the primal input or output). It
    computes exactly the unfused ops, in the same order and dtype.

    A subclass gives ``expression_of(g, z)`` (the IR of its value) and, as any
    :class:`Binary`, its partial derivatives, so that it can be differentiated again.
    """

    __slots__ = ()

    def expression_of(self, g, z):
        raise NotImplementedError

    def to_expression(self, args):
        g, z = _real_expression(args)
        return None if g is None else self.expression_of(g, z)


class TanhGrad(DerivativeProduct):
    """``g * (1 - y**2)``, with ``y = tanh(x)``."""

    __slots__ = ()

    def expression_of(self, g, y):
        return ir.apply("mul", g, ir.apply("sub", ir.constant(1, y.dtype), ir.apply("square", y)))

    def partial(self, i, g, y, out):
        if i == 0:
            return mx.subtract(1, mx.square(y))
        return mx.multiply(mx.multiply(g, y), -2)


class SigmoidGrad(DerivativeProduct):
    """``g * (y * (1 - y))``, with ``y = sigmoid(x)``."""

    __slots__ = ()

    def expression_of(self, g, y):
        return ir.apply("mul", g, ir.apply("mul", y, ir.apply("sub", ir.constant(1, y.dtype), y)))

    def partial(self, i, g, y, out):
        if i == 0:
            return mx.multiply(y, mx.subtract(1, y))
        return mx.multiply(g, mx.subtract(1, mx.multiply(y, 2)))


class SinGrad(DerivativeProduct):
    """``g * cos(x)``."""

    __slots__ = ()

    def expression_of(self, g, x):
        return ir.apply("mul", g, ir.apply("cos", x))

    def partial(self, i, g, x, out):
        if i == 0:
            return mx.cos(x)
        return mx.negative(mx.multiply(g, mx.sin(x)))


class CosGrad(DerivativeProduct):
    """``g * -sin(x)``."""

    __slots__ = ()

    def expression_of(self, g, x):
        return ir.apply("mul", g, ir.apply("neg", ir.apply("sin", x)))

    def partial(self, i, g, x, out):
        if i == 0:
            return mx.negative(mx.sin(x))
        return mx.negative(mx.multiply(g, mx.cos(x)))


class SquareGrad(DerivativeProduct):
    """``g * (x * 2)``: the cotangent of ``square(x)`` and of ``x * x``."""

    __slots__ = ()

    def expression_of(self, g, x):
        return ir.apply("mul", g, ir.apply("mul", x, ir.constant(2, x.dtype)))

    def partial(self, i, g, x, out):
        return mx.multiply(g if i else x, 2)


# -- unary primitives --------------------------------------------------------
class AsType(Unary):
    __slots__ = ("dtype",)
    dtype: dt.Dtype

    def is_noop(self, inputs):
        return inputs[0].dtype is self.dtype

    def __init__(self, stream, dtype):
        super().__init__(stream)
        self.dtype = dtype

    def apply(self, x):
        return mx.astype(x, self.dtype, stream=self.stream)

    def to_expression(self, args):
        return ir.cast(args[0], self.dtype)

    # A conversion is linear: the cotangent converts back (complex to real drops
    # the imaginary part). The walkers give integer results of floats no gradient.
    def vjp(self, primals, cotangents, argnums, outputs):
        return [mx.astype(cotangents[0], primals[0]._dtype)]

    def jvp(self, primals, tangents, argnums):
        return [mx.astype(tangents[0], self.dtype)]


class Abs(Unary):
    __slots__ = ()
    expression = "abs"

    # d|x| = sign(x), which is x / |x| for complex x (0 at 0, MLX's subgradient).
    # For complex x, |x| is real: the tangent is Re(conj(sign(x)) t), and its
    # adjoint maps a real cotangent g to g sign(x).
    def vjp(self, primals, cotangents, argnums, outputs):
        return [mx.multiply(cotangents[0], mx.sign(primals[0]))]

    def jvp(self, primals, tangents, argnums):
        x, t = primals[0], tangents[0]
        if x._dtype.kind == "c":
            return [mx.real(mx.multiply(mx.conj(mx.sign(x)), t))]
        return [mx.multiply(t, mx.sign(x))]


class Piecewise(NoGradient, Unary):
    """A unary operation that is constant almost everywhere (zero derivative)."""

    __slots__ = ()


class Sign(Piecewise):
    __slots__ = ()
    expression = "sign"


class Negative(Unary):
    __slots__ = ()
    expression = "neg"

    def derivative(self, x, y):
        return -1


class Exp(Unary):
    __slots__ = ()
    expression = "exp"

    def derivative(self, x, y):
        return self._output(x, y)


class Expm1(Unary):
    __slots__ = ()
    expression = "expm1"

    def derivative(self, x, y):
        return mx.exp(x) if y is None else mx.add(y, 1)


class Log(Unary):
    __slots__ = ()
    expression = "log"

    def derivative(self, x, y):
        return mx.reciprocal(x)


class Log1p(Unary):
    __slots__ = ()
    expression = "log1p"

    def derivative(self, x, y):
        return mx.reciprocal(mx.add(x, 1))


class Log2(Unary):
    __slots__ = ()
    expression = "log2"

    def derivative(self, x, y):
        return mx.reciprocal(mx.multiply(x, math.log(2.0)))


class Log10(Unary):
    __slots__ = ()
    expression = "log10"

    def derivative(self, x, y):
        return mx.reciprocal(mx.multiply(x, math.log(10.0)))


class Sqrt(Unary):
    __slots__ = ()
    expression = "sqrt"

    def derivative(self, x, y):
        return mx.divide(0.5, self._output(x, y))


class Rsqrt(Unary):
    __slots__ = ()
    expression = "rsqrt"

    def derivative(self, x, y):
        return mx.divide(mx.multiply(self._output(x, y), -0.5), x)


class Square(Unary):
    __slots__ = ()
    fused_grad = SquareGrad
    expression = "square"

    def derivative(self, x, y):
        return mx.multiply(x, 2)


class Sin(Unary):
    __slots__ = ()
    fused_grad = SinGrad
    expression = "sin"

    def derivative(self, x, y):
        return mx.cos(x)


class Cos(Unary):
    __slots__ = ()
    fused_grad = CosGrad
    expression = "cos"

    def derivative(self, x, y):
        return mx.negative(mx.sin(x))


class Tan(Unary):
    __slots__ = ()
    expression = "tan"

    def derivative(self, x, y):
        return mx.add(mx.square(self._output(x, y)), 1)


class ArcSin(Unary):
    __slots__ = ()
    expression = "asin"

    def derivative(self, x, y):
        return mx.rsqrt(mx.subtract(1, mx.square(x)))


class ArcCos(Unary):
    __slots__ = ()
    expression = "acos"

    def derivative(self, x, y):
        return mx.negative(mx.rsqrt(mx.subtract(1, mx.square(x))))


class ArcTan(Unary):
    __slots__ = ()
    expression = "atan"

    def derivative(self, x, y):
        return mx.reciprocal(mx.add(mx.square(x), 1))


class Sinh(Unary):
    __slots__ = ()
    expression = "sinh"

    def derivative(self, x, y):
        return mx.cosh(x)


class Cosh(Unary):
    __slots__ = ()
    expression = "cosh"

    def derivative(self, x, y):
        return mx.sinh(x)


class Tanh(Unary):
    __slots__ = ()
    fused_grad = TanhGrad
    grad_of_output = True
    expression = "tanh"

    def derivative(self, x, y):
        return mx.subtract(1, mx.square(self._output(x, y)))


class ArcSinh(Unary):
    __slots__ = ()
    expression = "asinh"

    def derivative(self, x, y):
        return mx.rsqrt(mx.add(mx.square(x), 1))


class ArcCosh(Unary):
    __slots__ = ()
    expression = "acosh"

    def derivative(self, x, y):
        return mx.rsqrt(mx.subtract(mx.square(x), 1))


class ArcTanh(Unary):
    __slots__ = ()
    expression = "atanh"

    def derivative(self, x, y):
        return mx.reciprocal(mx.subtract(1, mx.square(x)))


class Floor(Piecewise):
    __slots__ = ()
    expression = "floor"


class Ceil(Piecewise):
    __slots__ = ()
    expression = "ceil"


class Trunc(Piecewise):
    __slots__ = ()
    expression = "trunc"


class Round(Piecewise):
    __slots__ = ("decimals",)
    decimals: int

    def __init__(self, stream, decimals):
        super().__init__(stream)
        self.decimals = decimals

    def apply(self, x):
        return mx.round(x, self.decimals, stream=self.stream)

    # NumPy's round: rint(x * 10**d) / 10**d (x / 10**-d, then times, for d < 0), in
    # float32 for half precision, rounded once at the end.
    def to_expression(self, args):
        x = args[0]
        if x.dtype.kind != "f":
            return None
        if self.decimals == 0:
            return ir.apply("rint", x)
        d = dt.float32 if x.dtype.size == 2 else x.dtype
        y = ir.cast(x, d)
        f = ir.constant(10.0 ** abs(self.decimals), d)
        first, then = ("mul", "div") if self.decimals > 0 else ("div", "mul")
        return ir.cast(ir.apply(then, ir.apply("rint", ir.apply(first, y, f)), f), x.dtype)


_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


class Erf(Unary):
    __slots__ = ()
    expression = "erf"

    def derivative(self, x, y):
        return mx.multiply(mx.exp(mx.negative(mx.square(x))), _TWO_OVER_SQRT_PI)


class ErfInv(Unary):
    __slots__ = ()
    expression = "erfinv"

    def derivative(self, x, y):
        return mx.divide(mx.exp(mx.square(self._output(x, y))), _TWO_OVER_SQRT_PI)


class Sigmoid(Unary):
    __slots__ = ()
    fused_grad = SigmoidGrad
    grad_of_output = True
    expression = "sigmoid"

    def derivative(self, x, y):
        y = self._output(x, y)
        return mx.multiply(y, mx.subtract(1, y))


class LogicalNot(Piecewise):
    __slots__ = ()
    expression = "not"


class IsNan(Piecewise):
    __slots__ = ()
    expression = "isnan"


class IsInf(Piecewise):
    __slots__ = ()
    expression = "isinf"


class IsFinite(Piecewise):
    __slots__ = ()
    expression = "isfinite"


class IsPosInf(Piecewise):
    __slots__ = ()
    expression = "isposinf"


class IsNegInf(Piecewise):
    __slots__ = ()
    expression = "isneginf"


class NanToNum(Unary):
    """Replace NaN by ``nan``, +inf by ``posinf``, -inf by ``neginf`` (floats, resolved)."""

    __slots__ = ("nan", "posinf", "neginf")
    nan: float
    posinf: float
    neginf: float

    def __init__(self, stream, nan, posinf, neginf):
        super().__init__(stream)
        self.nan = nan
        self.posinf = posinf
        self.neginf = neginf

    def apply(self, x):
        return mx.nan_to_num(x, self.nan, self.posinf, self.neginf, stream=self.stream)

    def to_expression(self, args):
        x = args[0]
        if x.dtype.kind != "f":
            return None
        d = x.dtype
        out = ir.select(ir.apply("isneginf", x), ir.constant(self.neginf, d), x)
        out = ir.select(ir.apply("isposinf", x), ir.constant(self.posinf, d), out)
        return ir.select(ir.apply("isnan", x), ir.constant(self.nan, d), out)

    # The identity where x is finite; replaced values are constants.
    def derivative(self, x, y):
        return mx.isfinite(x)


class Conjugate(Unary):
    __slots__ = ()
    expression = "conj"

    def vjp(self, primals, cotangents, argnums, outputs):
        return [mx.conj(cotangents[0])]

    def jvp(self, primals, tangents, argnums):
        return [mx.conj(tangents[0])]


class Real(Unary):
    __slots__ = ()
    expression = "real"

    def vjp(self, primals, cotangents, argnums, outputs):
        return [mx.astype(cotangents[0], primals[0]._dtype)]

    def jvp(self, primals, tangents, argnums):
        return [mx.real(tangents[0])]


class Imag(Unary):
    __slots__ = ()
    expression = "imag"

    def apply(self, x):
        return mx.imag(x, stream=self.stream)

    # imag(x) = Re(-i x): its adjoint maps a real cotangent g to i g.
    def vjp(self, primals, cotangents, argnums, outputs):
        return [mx.multiply(cotangents[0], 1j)]

    def jvp(self, primals, tangents, argnums):
        return [mx.imag(tangents[0])]


class BitwiseInvert(Piecewise):
    __slots__ = ()
    expression = "bitnot"


class StopGradient(Piecewise):
    """The identity, through which no gradient flows."""

    __slots__ = ()
    #: Reverse mode treats the output as a constant: what it feeds does not depend on
    #: the differentiated inputs (read by ``lazyx.transforms.autodiff.graph_order``).
    cuts_dependence = True

    def to_expression(self, args):
        return args[0]


# -- binary primitives -------------------------------------------------------
class Add(Binary):
    __slots__ = ()
    expression = "add"

    def partial(self, i, a, b, y):
        return 1

    # The common case without the partials' machinery: real floating cotangents pass
    # through (summed back over the dimensions an operand was broadcast along).
    def vjp(self, primals, cotangents, argnums, outputs):
        g = cotangents[0]
        if g._dtype.kind != "f":
            return Binary.vjp(self, primals, cotangents, argnums, outputs)
        s = g._shape
        return [g if primals[i]._shape == s else sum_to_shape(g, primals[i]._shape)
                for i in argnums]


class Subtract(Binary):
    __slots__ = ()
    expression = "sub"

    def partial(self, i, a, b, y):
        return -1 if i else 1

    def vjp(self, primals, cotangents, argnums, outputs):
        g = cotangents[0]
        if g._dtype.kind != "f" or primals[0] is primals[1]:
            return Binary.vjp(self, primals, cotangents, argnums, outputs)
        return [sum_to_shape(mx.negative(g) if i else g, primals[i]._shape) for i in argnums]


class Multiply(Binary):
    __slots__ = ()
    expression = "mul"

    def partial(self, i, a, b, y):
        return a if i else b

    # Real floating operands (the common case) without the partials' machinery; the
    # nodes are those the base would add: g * other, and g * (x * 2) fused for x * x.
    def vjp(self, primals, cotangents, argnums, outputs):
        g = cotangents[0]
        d = g._dtype
        a, b = primals
        if d.kind != "f" or a._dtype is not d or b._dtype is not d:
            return Binary.vjp(self, primals, cotangents, argnums, outputs)
        s = g._shape
        if a is b and len(argnums) == 2:
            return [lazy(s, d, SquareGrad(self.stream), (g, a)), None]
        out = []
        for i in argnums:
            p = lazy(s, d, Multiply(self.stream), (g, b if i == 0 else a))
            shape = primals[i]._shape
            out.append(p if shape == s else sum_to_shape(p, shape))
        return out


class Divide(Binary):
    __slots__ = ()
    expression = "div"

    def partial(self, i, a, b, y):
        if i == 0:
            return mx.reciprocal(b)
        return mx.negative(mx.divide(self._output(a, b, y), b))


class Comparison(NoGradient, Binary):
    """A binary operation with integer or bool values, or constant almost everywhere."""

    __slots__ = ()


class FloorDivide(Comparison):
    __slots__ = ()
    expression = "floordiv"


class Remainder(Binary):
    __slots__ = ()
    expression = "mod"

    # a % b = a - b * floor(a / b): the quotient is constant almost everywhere.
    def partial(self, i, a, b, y):
        return mx.negative(mx.floor_divide(a, b)) if i else 1


class BinaryMulti(Binary):
    """A binary element-wise primitive with several outputs of the broadcast shape."""

    __slots__ = ()
    n_outputs = 2

    def output_shapes(self, inputs):
        return [broadcast_shapes(inputs[0].shape, inputs[1].shape)] * self.n_outputs


class DivMod(BinaryMulti):
    """Quotient and remainder of floor division: two outputs.

    The quotient has no gradient; the remainder's is that of :func:`remainder`.
    """

    __slots__ = ()

    def apply(self, a, b):
        return mx.divmod(a, b, stream=self.stream)

    def to_expression(self, args):
        q = ir.maybe_apply("floordiv", args)
        r = ir.maybe_apply("mod", args)
        return None if q is None or r is None else (q, r)

    def vjp(self, primals, cotangents, argnums, outputs):
        g = cotangents[1]
        if outputs[1]._dtype.kind == "b":
            return [None] * len(argnums)
        return [sum_to_shape(g if i == 0 else mx.negative(mx.multiply(g, outputs[0])),
                             primals[i]._shape) for i in argnums]

    def jvp(self, primals, tangents, argnums):
        a, b = primals
        if a._dtype.kind == "b":
            return [None, None]
        out = None
        for i, t in zip(argnums, tangents):
            out = add_tangents(out, t if i == 0 else
                               mx.negative(mx.multiply(t, mx.floor_divide(a, b))))
        return [None, broadcast_to_shape(out, broadcast_shapes(a._shape, b._shape))]

    def vmap(self, inputs, axes):
        (a, b), k = align_batched(inputs, axes)
        return self.apply(a, b), [k, k]


class Power(Binary):
    __slots__ = ()
    expression = "pow"

    # d/db a**b = log(a) * a**b, taken as 0 where a**b is 0 (a = 0, b > 0) as in MLX.
    def partial(self, i, a, b, y):
        if i == 0:
            return mx.multiply(b, mx.power(a, mx.subtract(b, 1)))
        y = self._output(a, b, y)
        return mx.where(mx.equal(y, 0), 0, mx.multiply(mx.log(a), y))


class Maximum(Binary):
    __slots__ = ()
    expression = "max"

    # MLX's subgradient: a tie (a == b) sends the gradient to b. max(a, b) > b exactly
    # where a > b (a NaN on either side: neither), so a's partial reads the output, which
    # a ReLU's next layer keeps anyway, and a compiled backward need not keep a as well.
    def partial(self, i, a, b, y):
        return mx.less_equal(a, b) if i else mx.greater(a if y is None else y, b)


class Minimum(Binary):
    __slots__ = ()
    expression = "min"

    # As for maximum, a tie sends the gradient to b (and min(a, b) < b exactly where a < b).
    def partial(self, i, a, b, y):
        return mx.greater_equal(a, b) if i else mx.less(a if y is None else y, b)


class LogAddExp(Binary):
    __slots__ = ()
    expression = "logaddexp"

    def partial(self, i, a, b, y):
        return mx.exp(mx.subtract(b if i else a, self._output(a, b, y)))


class ArcTan2(Binary):
    __slots__ = ()
    expression = "atan2"

    # arctan2(a, b) = atan(a / b): d/da = b / (a^2 + b^2), d/db = -a / (a^2 + b^2).
    def partial(self, i, a, b, y):
        r = mx.add(mx.square(a), mx.square(b))
        return mx.negative(mx.divide(a, r)) if i else mx.divide(b, r)


class Equal(Comparison):
    __slots__ = ()
    expression = "eq"


class NotEqual(Comparison):
    __slots__ = ()
    expression = "ne"


class Less(Comparison):
    __slots__ = ()
    expression = "lt"


class LessEqual(Comparison):
    __slots__ = ()
    expression = "le"


class Greater(Comparison):
    __slots__ = ()
    expression = "gt"


class GreaterEqual(Comparison):
    __slots__ = ()
    expression = "ge"


class LogicalAnd(Comparison):
    __slots__ = ()
    expression = "and"


class LogicalOr(Comparison):
    __slots__ = ()
    expression = "or"


class LogicalXor(Comparison):
    __slots__ = ()
    expression = "xor"


class BitwiseAnd(Comparison):
    __slots__ = ()
    expression = "bitand"


class BitwiseOr(Comparison):
    __slots__ = ()
    expression = "bitor"


class BitwiseXor(Comparison):
    __slots__ = ()
    expression = "bitxor"


class LeftShift(Comparison):
    __slots__ = ()
    expression = "shl"


class RightShift(Comparison):
    __slots__ = ()
    expression = "shr"


class IsClose(Comparison):
    __slots__ = ("rtol", "atol", "equal_nan")
    rtol: float
    atol: float
    equal_nan: bool

    def __init__(self, stream, rtol, atol, equal_nan):
        super().__init__(stream)
        self.rtol = rtol
        self.atol = atol
        self.equal_nan = equal_nan

    def apply(self, a, b):
        return mx.isclose(a, b, self.rtol, self.atol, equal_nan=self.equal_nan,
                          stream=self.stream)

    # NumPy's isclose: |a - b| <= atol + rtol |b| where b is finite, or a == b;
    # integers compare in float64.
    def to_expression(self, args):
        a, b = args
        if a.dtype.kind in "biu":
            a, b = ir.cast(a, dt.float64), ir.cast(b, dt.float64)
        f = ir.apply
        mag = f("abs", b)
        tol = f("add", ir.constant(self.atol, mag.dtype),
                f("mul", ir.constant(self.rtol, mag.dtype), mag))
        out = f("or", f("and", f("le", f("abs", f("sub", a, b)), tol), f("isfinite", b)),
                f("eq", a, b))
        if self.equal_nan:
            out = f("or", out, f("and", f("isnan", a), f("isnan", b)))
        return out


class AllClose(BinaryAll):
    __slots__ = ("rtol", "atol", "equal_nan")
    arity = 2
    rtol: float
    atol: float
    equal_nan: bool

    def __init__(self, stream, rtol, atol, equal_nan):
        super().__init__(stream)
        self.rtol = rtol
        self.atol = atol
        self.equal_nan = equal_nan

    def elementwise(self, a, b):
        return mx.isclose(a, b, self.rtol, self.atol, equal_nan=self.equal_nan,
                          stream=self.stream)


class ArrayEqual(BinaryAll):
    """Whether two arrays of one shape hold equal values."""

    __slots__ = ("equal_nan",)
    arity = 2
    equal_nan: bool

    def __init__(self, stream, equal_nan):
        super().__init__(stream)
        self.equal_nan = equal_nan

    def elementwise(self, a, b):
        e = mx.equal(a, b, stream=self.stream)
        if self.equal_nan and a._dtype.kind in "fc":
            e = mx.logical_or(e, mx.logical_and(mx.isnan(a), mx.isnan(b)))
        return e


class Select(Ternary):
    """``where(condition, x, y)``: no gradient flows to the condition."""

    __slots__ = ()
    expression = "select"

    def vjp(self, primals, cotangents, argnums, outputs):
        c, g = primals[0], cotangents[0]
        out = []
        for i in argnums:
            if i == 0:
                out.append(None)
            else:
                gi = mx.where(c, g, 0) if i == 1 else mx.where(c, 0, g)
                out.append(sum_to_shape(gi, primals[i]._shape))
        return out

    def jvp(self, primals, tangents, argnums):
        ts = [None, None, None]
        for i, t in zip(argnums, tangents):
            ts[i] = t
        if ts[1] is None and ts[2] is None:
            return [None]
        out = mx.where(primals[0], 0 if ts[1] is None else ts[1], 0 if ts[2] is None else ts[2])
        return [broadcast_to_shape(out, broadcast_shapes(*(x._shape for x in primals)))]

    def vmap(self, inputs, axes):
        (c, x, y), k = align_batched(inputs, axes)
        return [mx.where(c, x, y, stream=self.stream)], [k]


# -- dtype rules -------------------------------------------------------------
# A rule maps a dtype to (cast to, output dtype), None (identity) or an error
# message. ``{op}`` in a message is replaced by the op's name.
_f32 = dt.float32


def _same(d):
    return (None, d)


def _float(d):
    """Integers and bool compute in float32; floats and complex keep their dtype."""
    return (_f32, _f32) if d.kind in "biu" else (None, d)


def _float_real(d):
    if d.kind == "c":
        return "[{op}] Not supported for complex64."
    return _float(d)


def _to_bool(d):
    return (None, dt.bool_)


def _table(rule, name):
    out = {}
    for d in dt.ALL_DTYPES:
        r = rule(d)
        out[d] = r.format(op=name) if isinstance(r, str) else r
    return out


def _unary(cls, name, rule, doc):
    table = _table(rule, name)
    _lazy, _ts, _array, _tls, _cur = lazy, to_stream, array, thread_state, current_stream

    _node = node_maker(cls)

    def op(a, /, *, stream=None) -> array:
        if type(a) is not _array:
            try:
                a = _input(a)
            except LazyxError as e:
                raise at_op(e, name)
        r = table[a._dtype]
        if type(r) is tuple:
            c, o = r
            if c is not None:
                a = cast(a, c, stream)
            st = (_tls.stream or _cur()) if stream is None else _ts(stream)
            if _node is not None:
                return _node(cls, st, a._shape, o, (a,))
            return _lazy(a._shape, o, cls(st), (a,))
        if r is None:
            return a
        raise DtypeError(r)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    cls._op = staticmethod(op)
    return _native_op(op, cls, table, 1)


def _native_op(op, cls, table, arity):
    """``op`` with its common case (arrays of one dtype and shape, or a floating array and
    a Python float or int; no cast, no stream) in the native module (framework/native/graph.cpp, ``ElementwiseOp``), which calls
    ``op`` for everything else; ``op`` itself where that module is not built."""
    if native is None or node_maker(cls) is None:
        return op
    # A binary op also takes a Python float or int with a floating array there (`x * 0.5`,
    # `1 - x`): the scalar is the array's dtype (MLX's weak scalars), its cached constant.
    return native.elementwise_op(op, cls, table, thread_state, arity,
                                 constant if arity == 2 else None)


def _input(a) -> array:
    """``a`` as an array; Python values become fresh arrays (never a shared cached
    constant), since ops that are the identity for a dtype hand their input back."""
    return a if isinstance(a, array) else array(a)


def _cast_operand(x, d, stream):
    # Constants from Python scalars are cast eagerly: no node for a literal.
    if x._dtype is d:
        return x
    if not x._shape and x._data is not None and type(x._data) is np.ndarray:
        return from_buffer(x._data.astype(d.np), d)
    return cast(x, d, stream)


def _binary(cls, name, rule, doc):
    table = _table(rule, name)
    _lazy, _ts, _bo, _array, _tls, _cur = lazy, to_stream, binary_operands, array, thread_state, current_stream

    _node = node_maker(cls)

    def op(a, b, /, *, stream=None) -> array:
        try:
            if type(a) is _array and type(b) is _array and a._dtype is b._dtype:
                d = a._dtype  # binary_operands' first case, without its call
            else:
                a, b, d = _bo(a, b, stream)
            r = table[d]
            if type(r) is not tuple:
                raise DtypeError(r)
            c, o = r
            if c is not None:
                a = _cast_operand(a, c, stream)
                b = _cast_operand(b, c, stream)
            sa, sb = a._shape, b._shape
            shape = sa if sa == sb else broadcast_shapes(sa, sb)
        except LazyxError as e:  # free unless raised: the shared helpers name no op
            raise at_op(e, name)
        st = (_tls.stream or _cur()) if stream is None else _ts(stream)
        if _node is not None:
            return _node(cls, st, shape, o, (a, b))
        return _lazy(shape, o, cls(st), (a, b))
    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    cls._op = staticmethod(op)
    return _native_op(op, cls, table, 2)


# -- unary rules -------------------------------------------------------------
def _abs_rule(d):
    if d.kind in "bu":
        return None
    return (None, _f32) if d.kind == "c" else (None, d)


def _bool_identity(d):
    """sign, square: the identity on bool."""
    return None if d.kind == "b" else (None, d)


def _negative_rule(d):
    return "[{op}] Not supported for bool, use logical_not instead." if d.kind == "b" else (None, d)


def _integral_identity(d):
    """floor, ceil, trunc: the identity on integers, refused on complex."""
    if d.kind in "biu":
        return None
    if d.kind == "c":
        return "[{op}] Not supported for complex64."
    return (None, d)


def _bitwise_unary_rule(d):
    if d.kind in "fc":
        return f"[{{op}}] Bitwise inversion needs an integer or bool array, got {d.name}."
    return (None, d)


def _keep_or_identity(kinds):
    def rule(d):
        return (None, d) if d.kind in kinds else None
    return rule


def _complex_to_real(d):
    return (None, _f32) if d.kind == "c" else None


# -- unary op functions ------------------------------------------------------
abs = _unary(Abs, "abs", _abs_rule,
             "Element-wise absolute value. Complex inputs give float32 magnitudes.")
sign = _unary(Sign, "sign", _bool_identity,
              "Element-wise sign: -1, 0 or 1 (``a / |a|`` for complex inputs).")
negative = _unary(Negative, "negative", _negative_rule, "Element-wise negation: ``-a``.")
exp = _unary(Exp, "exp", _float,
             "Element-wise exponential: ``e ** a``. Integer inputs give float32.")
expm1 = _unary(Expm1, "expm1", _float_real,
               "Element-wise ``exp(a) - 1``, accurate for small ``a``.")
log = _unary(Log, "log", _float, "Element-wise natural logarithm.")
log1p = _unary(Log1p, "log1p", _float,
               "Element-wise ``log(1 + a)``, accurate for small ``a``.")
log2 = _unary(Log2, "log2", _float, "Element-wise base-2 logarithm.")
log10 = _unary(Log10, "log10", _float, "Element-wise base-10 logarithm.")
sqrt = _unary(Sqrt, "sqrt", _float, "Element-wise square root.")
rsqrt = _unary(Rsqrt, "rsqrt", _float, "Element-wise reciprocal square root: ``1 / sqrt(a)``.")
square = _unary(Square, "square", _bool_identity, "Element-wise square: ``a * a``.")
sin = _unary(Sin, "sin", _float, "Element-wise sine.")
cos = _unary(Cos, "cos", _float, "Element-wise cosine.")
tan = _unary(Tan, "tan", _float, "Element-wise tangent.")
arcsin = _unary(ArcSin, "arcsin", _float, "Element-wise inverse sine.")
arccos = _unary(ArcCos, "arccos", _float, "Element-wise inverse cosine.")
arctan = _unary(ArcTan, "arctan", _float, "Element-wise inverse tangent.")
sinh = _unary(Sinh, "sinh", _float, "Element-wise hyperbolic sine.")
cosh = _unary(Cosh, "cosh", _float, "Element-wise hyperbolic cosine.")
tanh = _unary(Tanh, "tanh", _float, "Element-wise hyperbolic tangent.")
arcsinh = _unary(ArcSinh, "arcsinh", _float, "Element-wise inverse hyperbolic sine.")
arccosh = _unary(ArcCosh, "arccosh", _float, "Element-wise inverse hyperbolic cosine.")
arctanh = _unary(ArcTanh, "arctanh", _float, "Element-wise inverse hyperbolic tangent.")
floor = _unary(Floor, "floor", _integral_identity,
               "Element-wise floor. Integer and bool arrays are returned unchanged.")
ceil = _unary(Ceil, "ceil", _integral_identity,
              "Element-wise ceiling. Integer and bool arrays are returned unchanged.")
trunc = _unary(Trunc, "trunc", _integral_identity,
               "Element-wise truncation toward zero. Integer and bool arrays are returned unchanged.")
erf = _unary(Erf, "erf", _float_real, "Element-wise error function.")
erfinv = _unary(ErfInv, "erfinv", _float_real,
                "Element-wise inverse of :func:`erf`; ``erfinv(erf(x)) == x``.")
sigmoid = _unary(Sigmoid, "sigmoid", _float_real,
                 "Element-wise logistic sigmoid: ``1 / (1 + exp(-a))``.")
logical_not = _unary(LogicalNot, "logical_not", _to_bool,
                     "Element-wise logical not; the result is bool.")
isnan = _unary(IsNan, "isnan", _to_bool, "Boolean array: where ``a`` is NaN.")
isinf = _unary(IsInf, "isinf", _to_bool, "Boolean array: where ``a`` is +inf or -inf.")
isfinite = _unary(IsFinite, "isfinite", _to_bool,
                  "Boolean array: where ``a`` is neither infinite nor NaN.")
isposinf = _unary(IsPosInf, "isposinf", _to_bool, "Boolean array: where ``a`` is +inf.")
isneginf = _unary(IsNegInf, "isneginf", _to_bool, "Boolean array: where ``a`` is -inf.")
conjugate = _unary(Conjugate, "conjugate", _keep_or_identity("c"),
                   "Element-wise complex conjugate; real arrays are returned unchanged.")
conj = _unary(Conjugate, "conj", _keep_or_identity("c"),
              "Element-wise complex conjugate; real arrays are returned unchanged.")
bitwise_invert = _unary(BitwiseInvert, "bitwise_invert", _bitwise_unary_rule,
                        "Element-wise bitwise inversion ``~a`` of an integer or bool array.")
stop_gradient = _unary(StopGradient, "stop_gradient", _same,
                       "The identity, but no gradient flows through it.")
_real = _unary(Real, "real", _complex_to_real, "")


def real(a, /, *, stream=None) -> array:
    """The real part of ``a``: float32 for complex64, ``a`` itself for real arrays."""
    return _real(a, stream=stream)


def imag(a, /, *, stream=None) -> array:
    """The imaginary part of ``a``: float32 for complex64, zeros for real arrays."""
    a = as_array(a)
    if a._dtype.kind == "c":
        return lazy(a._shape, _f32, Imag(to_stream(stream)), (a,))
    return mx.zeros_like(a, stream=stream)


def positive(a, /, *, stream=None) -> array:
    """Element-wise ``+a``: the array itself."""
    return _input(a)


def reciprocal(a, /, *, stream=None) -> array:
    """Element-wise ``1 / a``. Integer inputs give float32."""
    return divide(1, a, stream=stream)


_DEG_PER_RAD = 180.0 / math.pi


def degrees(a, /, *, stream=None) -> array:
    """Convert angles from radians to degrees. Integer inputs give float32."""
    return multiply(a, _DEG_PER_RAD, stream=stream)


def radians(a, /, *, stream=None) -> array:
    """Convert angles from degrees to radians. Integer inputs give float32."""
    return multiply(a, 1.0 / _DEG_PER_RAD, stream=stream)


def astype(a, /, dtype, *, stream=None) -> array:
    """``a`` converted to ``dtype``.

    Complex values convert to real types by dropping the imaginary part;
    floats convert to integers by truncation toward zero. The result is always a
    new array object, even when ``a`` already has ``dtype`` (an assignment into
    the result must not change ``a``); the conversion then costs no copy.
    """
    a = _input(a)
    dtype = dt.to_dtype(dtype)
    if a._dtype is dtype and a._data is not None:
        return from_buffer(a._data, dtype)
    return lazy(a._shape, dtype, AsType(to_stream(stream), dtype), (a,))


def round(a, /, decimals: int = 0, *, stream=None) -> array:
    """Round to the given number of decimals (halves to even, like NumPy).

    Args:
        a: input array.
        decimals: number of decimal places; negative values round to tens,
            hundreds ... Integer arrays are unchanged unless ``decimals < 0``.
    Returns:
        an array of ``a``'s dtype.
    """
    a = _input(a)
    try:
        decimals = int(decimals.__index__())
    except AttributeError:
        raise DtypeError(f"[round] decimals must be an integer, got {decimals!r}.") from None
    k = a._dtype.kind
    if k == "b" or (k in "ui" and decimals >= 0):
        return a
    return lazy(a._shape, a._dtype, Round(to_stream(stream), decimals), (a,))


def nan_to_num(a, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None,
               *, stream=None) -> array:
    """Replace NaN and infinities by finite numbers.

    Args:
        a: input array.
        nan: the value that replaces NaN.
        posinf: the value that replaces +inf (default: the largest finite value of the dtype).
        neginf: the value that replaces -inf (default: the lowest finite value of the dtype).
    Returns:
        an array of ``a``'s dtype; integer and bool arrays are returned unchanged.
    """
    a = _input(a)
    d = a._dtype
    if d.kind in "biu":
        return a
    if d.kind == "c":
        raise DtypeError("[nan_to_num] Not supported for complex64.")
    big = dt.finfo(d).max
    vals = []
    for name, v, default in (("nan", nan, 0.0), ("posinf", posinf, big), ("neginf", neginf, -big)):
        try:
            vals.append(float(default if v is None else v))
        except (TypeError, ValueError):
            raise DtypeError(f"[nan_to_num] {name} must be a real number, got {v!r}.") from None
    return lazy(a._shape, d, NanToNum(to_stream(stream), *vals), (a,))


# -- binary rules ------------------------------------------------------------
def _no_complex(d):
    return "[{op}] Not supported for complex64." if d.kind == "c" else (None, d)


def _integer_only(d):
    if d.kind in "fc":
        return f"[{{op}}] Bitwise operations need integer or bool arrays, got {d.name}."
    return (None, d)


def _shift_rule(d):
    # MLX shifts booleans as uint8.
    if d.kind == "b":
        return (dt.uint8, dt.uint8)
    return _integer_only(d)


# -- binary op functions -----------------------------------------------------
add = _binary(Add, "add", _same, "Element-wise addition with broadcasting: ``a + b``.")
subtract = _binary(Subtract, "subtract", _same,
                   "Element-wise subtraction with broadcasting: ``a - b``.")
multiply = _binary(Multiply, "multiply", _same,
                   "Element-wise multiplication with broadcasting: ``a * b``.")
divide = _binary(Divide, "divide", _float,
                 "Element-wise true division with broadcasting: ``a / b``. "
                 "Integer inputs give float32.")
floor_divide = _binary(FloorDivide, "floor_divide", _no_complex,
                       "Element-wise floor division ``a // b``; integer inputs stay integer "
                       "(division by zero gives 0).")
remainder = _binary(Remainder, "remainder", _no_complex,
                    "Element-wise remainder of floor division ``a % b`` with the sign of ``b`` "
                    "(for integers, ``a % 0 == a``).")
power = _binary(Power, "power", _same,
                "Element-wise power ``a ** b`` with broadcasting. For integers a negative "
                "exponent gives 0.")
maximum = _binary(Maximum, "maximum", _same,
                  "Element-wise maximum with broadcasting; NaN propagates.")
minimum = _binary(Minimum, "minimum", _same,
                  "Element-wise minimum with broadcasting; NaN propagates.")
logaddexp = _binary(LogAddExp, "logaddexp", _float,
                    "Element-wise ``log(exp(a) + exp(b))``, computed without overflow.")
arctan2 = _binary(ArcTan2, "arctan2", _float_real,
                  "Element-wise inverse tangent of ``a / b`` using the signs of both to "
                  "choose the quadrant.")
equal = _binary(Equal, "equal", _to_bool, "Element-wise equality ``a == b``; the result is bool.")
not_equal = _binary(NotEqual, "not_equal", _to_bool,
                    "Element-wise inequality ``a != b``; the result is bool.")
less = _binary(Less, "less", _to_bool, "Element-wise ``a < b``; the result is bool.")
less_equal = _binary(LessEqual, "less_equal", _to_bool,
                     "Element-wise ``a <= b``; the result is bool.")
greater = _binary(Greater, "greater", _to_bool, "Element-wise ``a > b``; the result is bool.")
greater_equal = _binary(GreaterEqual, "greater_equal", _to_bool,
                        "Element-wise ``a >= b``; the result is bool.")
logical_and = _binary(LogicalAnd, "logical_and", _to_bool,
                      "Element-wise logical and; the result is bool.")
logical_or = _binary(LogicalOr, "logical_or", _to_bool,
                     "Element-wise logical or; the result is bool.")
logical_xor = _binary(LogicalXor, "logical_xor", _to_bool,
                      "Element-wise logical exclusive or; the result is bool.")
bitwise_and = _binary(BitwiseAnd, "bitwise_and", _integer_only,
                      "Element-wise bitwise and ``a & b`` of integer or bool arrays.")
bitwise_or = _binary(BitwiseOr, "bitwise_or", _integer_only,
                     "Element-wise bitwise or ``a | b`` of integer or bool arrays.")
bitwise_xor = _binary(BitwiseXor, "bitwise_xor", _integer_only,
                      "Element-wise bitwise exclusive or ``a ^ b`` of integer or bool arrays.")
left_shift = _binary(LeftShift, "left_shift", _shift_rule,
                     "Element-wise left shift ``a << b`` of integer arrays (bool shifts as uint8).")
right_shift = _binary(RightShift, "right_shift", _shift_rule,
                      "Element-wise right shift ``a >> b`` of integer arrays (bool shifts as uint8).")


# The derivative products' op functions (not public: the rules add these nodes, and
# vmap and the tests make them through ``cls._op``).
def _real_floating(d):
    return (None, d) if d.kind == "f" else f"[{{op}}] Needs real floating operands, got {d.name}."


_tanh_grad = _binary(TanhGrad, "tanh_grad", _real_floating, "``g * (1 - y**2)``.")
_sigmoid_grad = _binary(SigmoidGrad, "sigmoid_grad", _real_floating, "``g * (y * (1 - y))``.")
_sin_grad = _binary(SinGrad, "sin_grad", _real_floating, "``g * cos(x)``.")
_cos_grad = _binary(CosGrad, "cos_grad", _real_floating, "``g * -sin(x)``.")
_square_grad = _binary(SquareGrad, "square_grad", _real_floating, "``g * (x * 2)``.")

_divmod_table = _table(_no_complex, "divmod")


def divmod(a, b, /, *, stream=None) -> list[array]:
    """Element-wise quotient and remainder: ``(a // b, a % b)`` in one operation.

    Returns:
        a list of two arrays of the broadcast shape and the promoted dtype.
    """
    a, b, d = binary_operands(a, b, stream, "divmod")
    if type(_divmod_table[d]) is not tuple:
        raise DtypeError(_divmod_table[d])
    shape = broadcast_shapes(a._shape, b._shape, op="divmod")
    return lazy_multi((shape, shape), (d, d), DivMod(to_stream(stream)), (a, b))


def _tolerances(op, rtol, atol, equal_nan):
    try:
        return float(rtol), float(atol), bool(equal_nan)
    except (TypeError, ValueError):
        raise DtypeError(f"[{op}] rtol and atol must be real numbers, got {rtol!r} and {atol!r}.") \
            from None


def isclose(a, b, /, rtol: float = 1e-05, atol: float = 1e-08, *, equal_nan: bool = False,
            stream=None) -> array:
    """Element-wise ``|a - b| <= atol + rtol * |b|`` with broadcasting.

    Infinities are close only to the same infinity; NaNs are close to each
    other only when ``equal_nan``.

    Returns:
        a bool array of the broadcast shape.
    """
    r, t, n = _tolerances("isclose", rtol, atol, equal_nan)
    a, b, _ = binary_operands(a, b, stream, "isclose")
    shape = broadcast_shapes(a._shape, b._shape, op="isclose")
    return lazy(shape, dt.bool_, IsClose(to_stream(stream), r, t, n), (a, b))


def allclose(a, b, /, rtol: float = 1e-05, atol: float = 1e-08, *, equal_nan: bool = False,
             stream=None) -> array:
    """Whether every element of ``a`` is close to the one of ``b`` (see :func:`isclose`).

    Returns:
        a 0-d bool array.
    """
    r, t, n = _tolerances("allclose", rtol, atol, equal_nan)
    a, b, _ = binary_operands(a, b, stream, "allclose")
    broadcast_shapes(a._shape, b._shape, op="allclose")
    return lazy((), dt.bool_, AllClose(to_stream(stream), r, t, n), (a, b))


def array_equal(a, b, /, *, equal_nan: bool = False, stream=None) -> array:
    """Whether ``a`` and ``b`` have the same shape and equal values.

    The dtypes need not match. NaNs compare equal only when ``equal_nan``.

    Returns:
        a 0-d bool array.
    """
    a, b, _ = binary_operands(a, b, stream, "array_equal")
    if a._shape != b._shape:
        return array(False)
    return lazy((), dt.bool_, ArrayEqual(to_stream(stream), bool(equal_nan)), (a, b))


def where(condition, x, y, /, *, stream=None) -> array:
    """Select from ``x`` where ``condition`` is true and from ``y`` elsewhere.

    All three broadcast; ``x`` and ``y`` are promoted to a common dtype
    (Python scalars are weakly typed).

    Returns:
        an array of the broadcast shape and the promoted dtype of ``x`` and ``y``.
    """
    c = as_array(condition)
    if c._dtype is not dt.bool_:
        c = _cast_operand(c, dt.bool_, stream)
    x, y, d = binary_operands(x, y, stream, "where")
    shape = broadcast_shapes(c._shape, x._shape, y._shape, op="where")
    return lazy(shape, d, Select(to_stream(stream)), (c, x, y))


def clip(a, /, a_min, a_max, *, stream=None) -> array:
    """Clip the values of ``a`` to ``[a_min, a_max]``.

    Args:
        a: input array.
        a_min: lower bound (scalar or array, broadcast), or None for no lower bound.
        a_max: upper bound (scalar or array, broadcast), or None for no upper bound.
    Returns:
        the clipped array, of the promoted dtype of ``a`` and the bounds.
    """
    if a_min is None and a_max is None:
        raise ArgumentError("[clip] At most one of a_min and a_max may be None.")
    if a_min is not None:
        a = maximum(a, a_min, stream=stream)
    if a_max is not None:
        a = minimum(a, a_max, stream=stream)
    return a


# -- operators ---------------------------------------------------------------
def _reflect(fn):
    def r(a, b):
        return fn(b, a)
    r.__name__ = f"r{fn.__name__}"
    return r


_COMPARABLE = _PY_SCALARS + (array, np.ndarray, np.generic)


def _compare(fn):
    # == and != with objects that are not array-like fall back to Python's
    # identity comparison (so `x == None` and `x in [None, "a"]` work).
    def op(a, b):
        if type(b) is array or isinstance(b, _COMPARABLE):
            return fn(a, b)
        return NotImplemented
    op.__name__ = f"__{fn.__name__}__"
    return op


def _array_hash(self):
    return id(self)


def _divmod_op(a, b):
    return tuple(divmod(a, b))


def _rdivmod_op(a, b):
    return tuple(divmod(b, a))


def _astype_method(self, dtype, stream=None) -> array:
    """The array converted to ``dtype`` (see :func:`astype`); ``stream`` may be positional,
    as in MLX's method."""
    return astype(self, dtype, stream=stream)


def _round_method(self, decimals: int = 0, *, stream=None) -> array:
    """The array rounded to ``decimals`` decimal places (see :func:`round`)."""
    return round(self, decimals, stream=stream)


_BINARY_OPERATORS = {
    "add": add, "sub": subtract, "mul": multiply, "truediv": divide, "div": divide,
    "floordiv": floor_divide, "mod": remainder, "pow": power, "and": bitwise_and,
    "or": bitwise_or, "xor": bitwise_xor, "lshift": left_shift, "rshift": right_shift,
}


def _operator_entries() -> dict:
    ops = {}
    for name, fn in _BINARY_OPERATORS.items():
        ops[f"array.__{name}__"] = fn
        ops[f"array.__r{name}__"] = _reflect(fn)
    ops.update({
        "array.__eq__": _compare(equal), "array.__ne__": _compare(not_equal),
        "array.__lt__": less, "array.__le__": less_equal,
        "array.__gt__": greater, "array.__ge__": greater_equal,
        "array.__neg__": negative, "array.__pos__": positive, "array.__abs__": abs,
        "array.__invert__": bitwise_invert,
        "array.__divmod__": _divmod_op, "array.__rdivmod__": _rdivmod_op,
        "array.__hash__": _array_hash,
    })
    return ops


PRIMITIVES = [
    AsType, Abs, Sign, Negative, Exp, Expm1, Log, Log1p, Log2, Log10, Sqrt, Rsqrt, Square,
    Sin, Cos, Tan, ArcSin, ArcCos, ArcTan, Sinh, Cosh, Tanh, ArcSinh, ArcCosh, ArcTanh,
    Floor, Ceil, Trunc, Round, Erf, ErfInv, Sigmoid, LogicalNot, IsNan, IsInf, IsFinite,
    IsPosInf, IsNegInf, NanToNum, Conjugate, Real, Imag, BitwiseInvert, StopGradient,
    Add, Subtract, Multiply, Divide, FloorDivide, Remainder, DivMod, Power, Maximum, Minimum,
    LogAddExp, ArcTan2, Equal, NotEqual, Less, LessEqual, Greater, GreaterEqual, LogicalAnd,
    LogicalOr, LogicalXor, BitwiseAnd, BitwiseOr, BitwiseXor, LeftShift, RightShift, IsClose,
    AllClose, ArrayEqual, Select, TanhGrad, SigmoidGrad, SinGrad, CosGrad, SquareGrad,
]

_PUBLIC = [
    astype, abs, sign, negative, positive, exp, expm1, log, log1p, log2, log10, sqrt, rsqrt,
    square, reciprocal, sin, cos, tan, arcsin, arccos, arctan, sinh, cosh, tanh, arcsinh,
    arccosh, arctanh, floor, ceil, round, trunc, erf, erfinv, sigmoid, logical_not, isnan,
    isinf, isfinite, isposinf, isneginf, nan_to_num, conj, conjugate, real, imag, degrees,
    radians, bitwise_invert, stop_gradient, add, subtract, multiply, divide, floor_divide,
    remainder, divmod, power, maximum, minimum, logaddexp, arctan2, equal, not_equal, less,
    less_equal, greater, greater_equal, logical_and, logical_or, logical_xor, bitwise_and,
    bitwise_or, bitwise_xor, left_shift, right_shift, where, clip, isclose, allclose,
    array_equal,
]

# MLX's other spellings of the same functions.
_ALIASES = {
    "acos": arccos, "acosh": arccosh, "asin": arcsin, "asinh": arcsinh, "atan": arctan,
    "atan2": arctan2, "atanh": arctanh, "pow": power,
    "bitwise_left_shift": left_shift, "bitwise_right_shift": right_shift,
}

_METHODS = {
    "astype": _astype_method, "abs": abs, "square": square, "sqrt": sqrt, "rsqrt": rsqrt,
    "reciprocal": reciprocal, "exp": exp, "log": log, "log1p": log1p, "log2": log2,
    "log10": log10, "sin": sin, "cos": cos, "round": _round_method, "conj": conj,
}

OPS = {f.__name__: f for f in _PUBLIC}
OPS.update(_ALIASES)
OPS.update({f"array.{k}": v for k, v in _METHODS.items()})
OPS["array.real"] = property(real, doc="The real part of the array.")
OPS["array.imag"] = property(imag, doc="The imaginary part of the array.")
OPS.update(_operator_entries())


lazyx_primitives, lazyx_ops = pack_hooks(PRIMITIVES, OPS)


# -- examples for the registry-wide transform test -------------------------------
def _complex(x, y):
    return add(x, multiply(y, 1j))


# Unary ops on floats: (primitive, op, domain (low, high), distance from the kink at 0).
_UNARY_EXAMPLES = [
    (AsType, lambda x: astype(x, dt.float32), (-1.5, 1.5), 0), (Abs, abs, (-1.5, 1.5), 0.2),
    (Negative, negative, (-1.5, 1.5), 0), (Exp, exp, (-1.5, 1.5), 0),
    (Expm1, expm1, (-1.5, 1.5), 0), (Log, log, (0.5, 3), 0), (Log1p, log1p, (-0.5, 2), 0),
    (Log2, log2, (0.5, 3), 0), (Log10, log10, (0.5, 3), 0), (Sqrt, sqrt, (0.5, 3), 0),
    (Rsqrt, rsqrt, (0.5, 3), 0), (Square, square, (-1.5, 1.5), 0), (Sin, sin, (-3, 3), 0),
    (Cos, cos, (-3, 3), 0), (Tan, tan, (-1.2, 1.2), 0), (ArcSin, arcsin, (-0.8, 0.8), 0),
    (ArcCos, arccos, (-0.8, 0.8), 0), (ArcTan, arctan, (-3, 3), 0),
    (Sinh, sinh, (-1.5, 1.5), 0), (Cosh, cosh, (-1.5, 1.5), 0), (Tanh, tanh, (-1.5, 1.5), 0),
    (ArcSinh, arcsinh, (-3, 3), 0), (ArcCosh, arccosh, (1.3, 3), 0),
    (ArcTanh, arctanh, (-0.8, 0.8), 0), (Erf, erf, (-1.5, 1.5), 0),
    (ErfInv, erfinv, (-0.8, 0.8), 0), (Sigmoid, sigmoid, (-4, 4), 0),
    (NanToNum, nan_to_num, (-1.5, 1.5), 0),
    # Piecewise constant (no gradient), between the integers.
    (Sign, sign, (-1.5, 1.5), 0.2), (Floor, floor, (-3, 3), 0), (Ceil, ceil, (-3, 3), 0),
    (Trunc, trunc, (-3, 3), 0), (Round, round, (-3, 3), 0), (StopGradient, stop_gradient, (-2, 2), 0),
    (IsNan, isnan, (-2, 2), 0), (IsInf, isinf, (-2, 2), 0), (IsFinite, isfinite, (-2, 2), 0),
    (IsPosInf, isposinf, (-2, 2), 0), (IsNegInf, isneginf, (-2, 2), 0),
]

# Binary ops on floats: (primitive, op, domain of a, domain of b, distance of b from 0).
_BINARY_EXAMPLES = [
    (Add, add, (-2, 2), (-2, 2), 0), (Subtract, subtract, (-2, 2), (-2, 2), 0),
    (Multiply, multiply, (-2, 2), (-2, 2), 0), (Divide, divide, (-2, 2), (-2, 2), 0.5),
    (Remainder, remainder, (-5, 5), (-2, 2), 0.5), (Power, power, (0.5, 2), (-2, 2), 0),
    (Maximum, maximum, (-2, 2), (-2, 2), 0), (Minimum, minimum, (-2, 2), (-2, 2), 0),
    (LogAddExp, logaddexp, (-3, 3), (-3, 3), 0), (ArcTan2, arctan2, (-2, 2), (-2, 2), 0.5),
    (DivMod, divmod, (-5, 5), (-2, 2), 0.5),
    (FloorDivide, floor_divide, (-5, 5), (-2, 2), 0.5),
    (Equal, equal, (-2, 2), (-2, 2), 0), (NotEqual, not_equal, (-2, 2), (-2, 2), 0),
    (Less, less, (-2, 2), (-2, 2), 0), (LessEqual, less_equal, (-2, 2), (-2, 2), 0),
    (Greater, greater, (-2, 2), (-2, 2), 0), (GreaterEqual, greater_equal, (-2, 2), (-2, 2), 0),
    (IsClose, isclose, (-2, 2), (-2, 2), 0),
    (TanhGrad, _tanh_grad, (-2, 2), (-0.9, 0.9), 0),
    (SigmoidGrad, _sigmoid_grad, (-2, 2), (0.1, 0.9), 0),
    (SinGrad, _sin_grad, (-2, 2), (-3, 3), 0), (CosGrad, _cos_grad, (-2, 2), (-3, 3), 0),
    (SquareGrad, _square_grad, (-2, 2), (-2, 2), 0),
]


def _examples() -> list:
    out = [(cls, example(op, uniform((2, 3), lo, hi, away)))
           for cls, op, (lo, hi), away in _UNARY_EXAMPLES]
    # Binary ops broadcast a row against a matrix.
    out += [(cls, example(op, uniform((2, 3), *da), uniform((3,), *db, away=away)))
            for cls, op, da, db, away in _BINARY_EXAMPLES]
    x, y = uniform((2, 3)), uniform((2, 3))
    out += [
        (Conjugate, example(lambda a, b: imag(multiply(conj(_complex(a, b)), square(_complex(a, b)))), x, y)),
        (Real, example(lambda a, b: real(square(_complex(a, b))), x, y)),
        (Imag, example(lambda a, b: imag(square(_complex(a, b))), x, y)),
        (Select, example(where, booleans((2, 3)), x, uniform((3,)))),
        (AllClose, example(allclose, x, y)), (ArrayEqual, example(array_equal, x, y)),
    ]
    ints, shifts = integers((2, 3), -50, 50), integers((3,), 0, 4)
    bools, other = booleans((2, 3)), booleans((3,))
    out += [(cls, example(op, ints, shifts)) for cls, op in (
        (BitwiseAnd, bitwise_and), (BitwiseOr, bitwise_or), (BitwiseXor, bitwise_xor),
        (LeftShift, left_shift), (RightShift, right_shift))]
    out += [(cls, example(op, bools, other)) for cls, op in (
        (LogicalAnd, logical_and), (LogicalOr, logical_or), (LogicalXor, logical_xor))]
    out += [(LogicalNot, example(logical_not, bools)),
            (BitwiseInvert, example(bitwise_invert, ints))]
    return out


@hookimpl
def lazyx_examples():
    return _examples()
