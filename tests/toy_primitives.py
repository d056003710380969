"""Small test-local primitives with their own transform rules.

The transform walkers are tested on these, independently of the op packs'
rules: each has a NumPy ``eval_cpu`` and ``vjp``/``jvp``/``vmap`` written with
the other toy ops, so they compose (grad of grad, vmap of grad ...).
"""

from __future__ import annotations

import numpy as np

import lazyx.core as mx
from lazyx.array import lazy, lazy_multi
from lazyx.device import to_stream
from lazyx.primitive import Primitive


def _node(shape, dtype, prim, inputs):
    return lazy(tuple(shape), dtype, prim, tuple(inputs))


# -- unary ----------------------------------------------------------------------------
class _Unary(Primitive):
    __slots__ = ()

    def output_shapes(self, inputs):
        return [inputs[0].shape]

    def vmap(self, inputs, axes):
        return [type(self)(self.stream).make(inputs[0])], [axes[0]]

    def make(self, x):
        return _node(x.shape, x.dtype, self, (x,))


class TSin(_Unary):
    __slots__ = ()

    def eval_cpu(self, ins):
        return np.sin(ins[0])

    def vjp(self, primals, cotangents, argnums, outputs):
        return [t_mul(cotangents[0], t_cos(primals[0]))]

    def jvp(self, primals, tangents, argnums):
        return [t_mul(tangents[0], t_cos(primals[0]))]


class TCos(_Unary):
    __slots__ = ()

    def eval_cpu(self, ins):
        return np.cos(ins[0])

    def vjp(self, primals, cotangents, argnums, outputs):
        return [t_neg(t_mul(cotangents[0], t_sin(primals[0])))]

    def jvp(self, primals, tangents, argnums):
        return [t_neg(t_mul(tangents[0], t_sin(primals[0])))]


class TNeg(_Unary):
    __slots__ = ()

    def eval_cpu(self, ins):
        return np.negative(ins[0])

    def vjp(self, primals, cotangents, argnums, outputs):
        return [t_neg(cotangents[0])]

    def jvp(self, primals, tangents, argnums):
        return [t_neg(tangents[0])]


class TNoRule(_Unary):
    """The identity, with no transform rules at all."""

    __slots__ = ()
    vmap = Primitive.vmap

    def eval_cpu(self, ins):
        return ins[0]


class TFloorInt(Primitive):
    """floor(x) as int32; deliberately without rules (the walkers must not need them)."""

    __slots__ = ()

    def output_shapes(self, inputs):
        return [inputs[0].shape]

    def eval_cpu(self, ins):
        return np.floor(ins[0]).astype(np.int32)


class TToFloat(Primitive):
    """An integer array as float32 (gradients cast back, as MLX's astype does)."""

    __slots__ = ()

    def output_shapes(self, inputs):
        return [inputs[0].shape]

    def eval_cpu(self, ins):
        return ins[0].astype(np.float32)

    def vjp(self, primals, cotangents, argnums, outputs):
        return [mx.astype(cotangents[0], primals[0].dtype)]


# -- binary (equal shapes) -------------------------------------------------------------
class _Binary(Primitive):
    __slots__ = ()

    def output_shapes(self, inputs):
        return [inputs[0].shape]

    def vmap(self, inputs, axes):
        a, b = inputs
        ax, bx = axes
        if ax is None:
            a, ax = t_broadcast_in(a, b.shape, (bx,)), bx
        elif bx is None:
            b = t_broadcast_in(b, a.shape, (ax,))
        elif ax != bx:
            b = t_moveaxis(b, bx, ax)
        return [type(self)(self.stream).make(a, b)], [ax]

    def make(self, a, b):
        assert a.shape == b.shape, (a.shape, b.shape)
        return _node(a.shape, a.dtype, self, (a, b))


class TMul(_Binary):
    __slots__ = ()

    def eval_cpu(self, ins):
        return ins[0] * ins[1]

    def vjp(self, primals, cotangents, argnums, outputs):
        a, b = primals
        c = cotangents[0]
        return [t_mul(c, b) if i == 0 else t_mul(c, a) for i in argnums]

    def jvp(self, primals, tangents, argnums):
        a, b = primals
        parts = [t_mul(t, b) if i == 0 else t_mul(a, t) for i, t in zip(argnums, tangents)]
        return [parts[0] if len(parts) == 1 else t_add(parts[0], parts[1])]


class TAdd(_Binary):
    __slots__ = ()

    def eval_cpu(self, ins):
        return ins[0] + ins[1]

    def vjp(self, primals, cotangents, argnums, outputs):
        return [cotangents[0] for _ in argnums]

    def jvp(self, primals, tangents, argnums):
        return [tangents[0] if len(tangents) == 1 else t_add(tangents[0], tangents[1])]


# -- shapes -----------------------------------------------------------------------------
class TSum(Primitive):
    """Sum over ``axes`` (sorted, non-negative)."""

    __slots__ = ("axes",)

    def __init__(self, stream, axes):
        super().__init__(stream)
        self.axes = axes

    def output_shapes(self, inputs):
        return [tuple(d for i, d in enumerate(inputs[0].shape) if i not in self.axes)]

    def eval_cpu(self, ins):
        return ins[0].sum(axis=self.axes).astype(ins[0].dtype)  # NumPy or CuPy arrays

    def vjp(self, primals, cotangents, argnums, outputs):
        return [t_broadcast_in(cotangents[0], primals[0].shape, self.axes)]

    def jvp(self, primals, tangents, argnums):
        return [t_sum(tangents[0], self.axes)]

    def vmap(self, inputs, axes):
        ax = axes[0]
        new = tuple(a if a < ax else a + 1 for a in self.axes)
        return [t_sum(inputs[0], new)], [ax - sum(1 for a in self.axes if a < ax)]


class TBroadcastIn(Primitive):
    """Insert ``axes`` (positions in the output) and broadcast to ``shape``."""

    __slots__ = ("shape", "axes")

    def __init__(self, stream, shape, axes):
        super().__init__(stream)
        self.shape = shape
        self.axes = axes

    def output_shapes(self, inputs):
        return [self.shape]

    def eval_cpu(self, ins):
        return np.broadcast_to(np.expand_dims(ins[0], self.axes), self.shape)

    def vjp(self, primals, cotangents, argnums, outputs):
        return [t_sum(cotangents[0], self.axes)]

    def jvp(self, primals, tangents, argnums):
        return [t_broadcast_in(tangents[0], self.shape, self.axes)]

    def vmap(self, inputs, axes):
        x = inputs[0]
        if axes[0] != 0:
            x = t_moveaxis(x, axes[0], 0)
        b = x.shape[0]
        return [t_broadcast_in(x, (b,) + self.shape, tuple(a + 1 for a in self.axes))], [0]


class TMoveAxis(Primitive):
    __slots__ = ("src", "dst")

    def __init__(self, stream, src, dst):
        super().__init__(stream)
        self.src = src
        self.dst = dst

    def output_shapes(self, inputs):
        s = list(inputs[0].shape)
        d = s.pop(self.src)
        s.insert(self.dst, d)
        return [tuple(s)]

    def eval_cpu(self, ins):
        return np.moveaxis(ins[0], self.src, self.dst)

    def vjp(self, primals, cotangents, argnums, outputs):
        return [t_moveaxis(cotangents[0], self.dst, self.src)]

    def jvp(self, primals, tangents, argnums):
        return [t_moveaxis(tangents[0], self.src, self.dst)]

    def vmap(self, inputs, axes):
        x = inputs[0]
        if axes[0] != 0:
            x = t_moveaxis(x, axes[0], 0)
        return [t_moveaxis(x, self.src + 1, self.dst + 1)], [0]


# -- multi-output ------------------------------------------------------------------------
class TSinCos(Primitive):
    """Two outputs: sin(x) and cos(x)."""

    __slots__ = ()

    def output_shapes(self, inputs):
        return [inputs[0].shape] * 2

    def eval_cpu(self, ins):
        return np.sin(ins[0]), np.cos(ins[0])

    def vjp(self, primals, cotangents, argnums, outputs):
        x = primals[0]
        cs, cc = cotangents
        return [t_add(t_mul(cs, t_cos(x)), t_neg(t_mul(cc, t_sin(x))))]

    def jvp(self, primals, tangents, argnums):
        x = primals[0]
        t = tangents[0]
        return [t_mul(t, t_cos(x)), t_neg(t_mul(t, t_sin(x)))]

    def vmap(self, inputs, axes):
        return t_sincos(inputs[0]), [axes[0], axes[0]]


# -- a tiny MLP (first-order rules written with lazyx.core ops) ------------------------------
class TMatmul(Primitive):
    __slots__ = ()

    def output_shapes(self, inputs):
        return [(inputs[0].shape[0], inputs[1].shape[1])]

    def eval_cpu(self, ins):
        return ins[0] @ ins[1]

    def vjp(self, primals, cotangents, argnums, outputs):
        a, b = primals
        c = cotangents[0]
        return [mx.matmul(c, mx.transpose(b)) if i == 0 else mx.matmul(mx.transpose(a), c)
                for i in argnums]


class TTanh(_Unary):
    __slots__ = ()

    def eval_cpu(self, ins):
        return np.tanh(ins[0])

    def vjp(self, primals, cotangents, argnums, outputs):
        y = outputs[0]
        return [mx.multiply(cotangents[0], mx.subtract(1.0, mx.multiply(y, y)))]


# -- op functions ------------------------------------------------------------------------
def _s():
    return to_stream(None)


def t_sin(x):
    return TSin(_s()).make(x)


def t_cos(x):
    return TCos(_s()).make(x)


def t_neg(x):
    return TNeg(_s()).make(x)


def t_norule(x):
    return TNoRule(_s()).make(x)


def t_mul(a, b):
    return TMul(_s()).make(a, b)


def t_add(a, b):
    return TAdd(_s()).make(a, b)


def t_sum(x, axes=None):
    axes = tuple(range(x.ndim)) if axes is None else tuple(sorted(a % x.ndim for a in axes))
    shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return _node(shape, x.dtype, TSum(_s(), axes), (x,))


def t_broadcast_in(x, shape, axes):
    return _node(shape, x.dtype, TBroadcastIn(_s(), tuple(shape), tuple(axes)), (x,))


def t_moveaxis(x, src, dst):
    prim = TMoveAxis(_s(), src % x.ndim, dst % x.ndim)
    return _node(prim.output_shapes([x])[0], x.dtype, prim, (x,))


def t_sincos(x):
    return lazy_multi([x.shape, x.shape], [x.dtype, x.dtype], TSinCos(_s()), (x,))


def t_floor_int(x):
    return _node(x.shape, mx.int32, TFloorInt(_s()), (x,))


def t_to_float(x):
    return _node(x.shape, mx.float32, TToFloat(_s()), (x,))


def t_matmul(a, b):
    return _node((a.shape[0], b.shape[1]), a.dtype, TMatmul(_s()), (a, b))


def t_tanh(x):
    return TTanh(_s()).make(x)
