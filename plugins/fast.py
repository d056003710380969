"""``lazyx.core.fast``: fused norms, rotary embeddings, attention and cross entropy,
as ``mlx.core.fast``.

The flow of a call (``rms_norm`` ... ``cross_entropy``):

1. The function checks its arguments as MLX 0.32 does (shapes, ranks, dtypes, head
   counts, mask shape and dtype) and raises a lazyx error naming the op, the argument
   and the shapes, of MLX's exception type (``ValueError`` throughout).
2. It casts the inputs to the dtype of the result by MLX's rules (the norms: the
   promoted type of ``x`` and the weights; attention: that of ``q``, ``k``, ``v``;
   ``cross_entropy``: float32 out, logits read as they are) and adds ONE node.
3. The node's kernel makes one pass: a native C++ kernel on the CPU
   (``backends/cpu/native/fast.cpp``; float32, float16 and bfloat16 computing in
   float32), CUDA C++ on the GPU (``backends/cuda/fast.py``), NumPy on the
   ``cpu-reference`` backend and for float64 (``backends/cpu/kernels/fast.py``).

Every primitive here also carries its composition in ops (:meth:`_Fused.fallback`,
MLX's ``fallback`` of a ``Custom`` primitive). Where MLX has nothing better, the rules
are those of the composition (:class:`_Fused`: ``mx.vjp``/``mx.jvp``/``mx.vmap`` of
it), as MLX's ``Custom`` primitives do; otherwise they are MLX's own:

* ``rms_norm``/``layer_norm``: the vjp is one fused backward node
  (:class:`RMSNormVJP`, :class:`LayerNormVJP`, MLX's ``RMSNormVJP``/``LayerNormVJP``)
  that gives the input's cotangent and the weight's and bias's sums over rows;
* ``rope``: linear in its input, so the vjp is ``rope`` with the inverse rotation and
  the jvp ``rope`` of the tangent (MLX refuses gradients of ``offset`` and ``freqs``);
* ``scaled_dot_product_attention``: the vjp is one fused backward node
  (:class:`ScaledDotProductAttentionVJP`, MLX's ``ScaledDotProductAttentionVJP``:
  FlashAttention-2's backward) giving the cotangents of ``q``, ``k``, ``v`` and the
  sinks; the cotangent of a mask array, rarely asked for, is the composition's;
* vmap folds the batch into a leading axis where the per-example call allows it
  (the norms, ``rope``, attention), else maps the composition.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

import lazyx.core as mx
from lazyx import dtypes as dt
from lazyx.arguments import as_array, cast
from lazyx.array import array, lazy, lazy_multi
from lazyx.device import to_stream
from lazyx.errors import ArgumentError, DtypeError, ShapeError, TransformError
from lazyx.examples import booleans, example, integers, uniform
from lazyx.hookspecs import hookimpl, pack_hooks
from lazyx.primitive import Primitive

_f32 = dt.float32
_HALF = (dt.float16, dt.bfloat16)
#: The masked value of attention scores (MLX: ``finfo(float32).min``, not -inf, so a
#: row whose keys are all masked averages its values instead of giving NaN).
MASKED = float(np.finfo(np.float32).min)


def _shape(s: tuple) -> str:
    """A shape as MLX's messages write it: ``(2,3)``."""
    return "(" + ",".join(str(d) for d in s) + ")"


def _compute(d):
    """The dtype a fallback computes in: float32 for half types, else the dtype."""
    return _f32 if d in _HALF else d


class _Fused(Primitive):
    """A fused primitive whose rules default to those of its composition in ops.

    A subclass writes :meth:`fallback` (its outputs from its inputs with ``lazyx.core``
    ops); ``vjp``, ``jvp`` and ``vmap`` transform that composition, as MLX's ``Custom``
    primitives transform their ``fallback``. Integer inputs (``offset``, ``targets``)
    are held fixed: they carry no gradient.
    """

    __slots__ = ()

    def fallback(self, inputs: list) -> list:
        raise NotImplementedError

    def _partial(self, inputs, argnums):
        """The fallback as a function of the inputs at ``argnums``, the others fixed."""
        def fn(*moving):
            xs = list(inputs)
            for i, x in zip(argnums, moving):
                xs[i] = x
            return self.fallback(xs)
        return fn

    def vjp(self, primals, cotangents, argnums, outputs):
        argnums = list(argnums)
        _, grads = mx.vjp(self._partial(primals, argnums), [primals[i] for i in argnums],
                          list(cotangents))
        return list(grads)

    def jvp(self, primals, tangents, argnums):
        argnums = list(argnums)
        _, tans = mx.jvp(self._partial(primals, argnums), [primals[i] for i in argnums],
                         list(tangents))
        return list(tans)

    def vmap(self, inputs, axes):
        outs = mx.vmap(lambda *xs: self.fallback(list(xs)), in_axes=tuple(axes))(*inputs)
        return list(outs), [0] * len(outs)


def _fold_last(x: array, axis: int, stream):
    """Batched ``x`` whose per-example rows are its last axis: the batch moved to the
    front when it sits on the last axis. Returns ``(x, batch axis)``."""
    if axis == len(x._shape) - 1:
        return mx.moveaxis(x, axis, 0, stream=stream), 0
    return x, axis


# -- rms_norm ------------------------------------------------------------------------

class _LikeInput(_Fused):
    """A fused primitive whose one output has its first input's shape and dtype."""

    __slots__ = ()

    def output_shapes(self, inputs):
        return [tuple(inputs[0].shape)]

    def output_dtypes(self, inputs):
        return [inputs[0].dtype]


class RMSNorm(_LikeInput):
    """``x * rsqrt(mean(x ** 2, -1) + eps) * weight`` over the last axis; inputs
    ``(x,)`` or ``(x, weight)``, of one dtype (half types compute in float32)."""

    __slots__ = ("eps",)
    eps: float

    def fallback(self, inputs):
        x = inputs[0]
        s, d = self.stream, x._dtype
        xf = cast(x, _compute(d), s)
        r = mx.rsqrt(mx.add(mx.mean(mx.square(xf, stream=s), -1, keepdims=True, stream=s),
                            self.eps, stream=s), stream=s)
        y = mx.multiply(xf, r, stream=s)
        if len(inputs) > 1:
            y = mx.multiply(y, cast(inputs[1], _compute(d), s), stream=s)
        return [cast(y, d, s)]

    def vjp(self, primals, cotangents, argnums, outputs):
        grads = _norm_vjp(RMSNormVJP(self.stream, self.eps), primals, cotangents[0])
        return [grads[i] for i in argnums]

    def vmap(self, inputs, axes):
        if len(inputs) > 1 and axes[1] is not None:
            return super().vmap(inputs, axes)
        x, b = _fold_last(inputs[0], axes[0], self.stream)
        return [_node(RMSNorm(self.stream, self.eps), [x] + list(inputs[1:]))], [b]


class _NormVJP(_Fused):
    """A norm's fused backward: inputs the forward's inputs and the cotangent, outputs
    their cotangents; its composition is the vjp of the forward's (:meth:`forward`)."""

    __slots__ = ()

    def output_shapes(self, inputs):
        return [tuple(i.shape) for i in inputs[:-1]]

    def output_dtypes(self, inputs):
        return [i.dtype for i in inputs[:-1]]

    def fallback(self, inputs):
        primals, cot = inputs[:-1], inputs[-1]
        forward = self.forward()
        _, grads = mx.vjp(lambda *xs: forward.fallback(list(xs)), list(primals), [cot])
        return list(grads)


class RMSNormVJP(_NormVJP):
    """The fused backward of :class:`RMSNorm`: inputs ``(x, [weight,] cotangent)``,
    outputs the cotangent of ``x`` and, with a weight, its sum over rows."""

    __slots__ = ("eps",)
    eps: float

    def forward(self):
        return RMSNorm(self.stream, self.eps)


# -- layer_norm ----------------------------------------------------------------------
class LayerNorm(_LikeInput):
    """``(x - mean) * rsqrt(var + eps) * weight + bias`` over the last axis; inputs
    ``x`` then ``weight`` (when ``weighted``) and ``bias`` (when ``biased``)."""

    __slots__ = ("eps", "weighted", "biased")
    eps: float
    weighted: bool
    biased: bool

    def fallback(self, inputs):
        x = inputs[0]
        s, d = self.stream, x._dtype
        c = _compute(d)
        xf = cast(x, c, s)
        mu = mx.mean(xf, -1, keepdims=True, stream=s)
        xc = mx.subtract(xf, mu, stream=s)
        var = mx.mean(mx.square(xc, stream=s), -1, keepdims=True, stream=s)
        y = mx.multiply(xc, mx.rsqrt(mx.add(var, self.eps, stream=s), stream=s), stream=s)
        k = 1
        if self.weighted:
            y = mx.multiply(y, cast(inputs[k], c, s), stream=s)
            k += 1
        if self.biased:
            y = mx.add(y, cast(inputs[k], c, s), stream=s)
        return [cast(y, d, s)]

    def vjp(self, primals, cotangents, argnums, outputs):
        p = LayerNormVJP(self.stream, self.eps, self.weighted, self.biased)
        grads = _norm_vjp(p, primals, cotangents[0])
        return [grads[i] for i in argnums]

    def vmap(self, inputs, axes):
        if any(a is not None for a in axes[1:]):
            return super().vmap(inputs, axes)
        x, b = _fold_last(inputs[0], axes[0], self.stream)
        p = LayerNorm(self.stream, self.eps, self.weighted, self.biased)
        return [_node(p, [x] + list(inputs[1:]))], [b]


class LayerNormVJP(_NormVJP):
    """The fused backward of :class:`LayerNorm`: inputs ``(x, [weight,] [bias,]
    cotangent)``, outputs the cotangents of ``x``, ``weight`` and ``bias`` (the last
    two summed over rows)."""

    __slots__ = ("eps", "weighted", "biased")
    eps: float
    weighted: bool
    biased: bool

    def forward(self):
        return LayerNorm(self.stream, self.eps, self.weighted, self.biased)


def _norm_vjp(p, primals, cot):
    """The cotangents of a norm's inputs from its fused backward node ``p``."""
    cot = cast(cot, primals[0]._dtype, p.stream)
    ins = list(primals) + [cot]
    return lazy_multi(p.output_shapes(ins), p.output_dtypes(ins), p, tuple(ins))


def _node(p, inputs) -> array:
    """The one output of primitive ``p`` applied to ``inputs``."""
    ins = tuple(inputs)
    return lazy(p.output_shapes(ins)[0], p.output_dtypes(ins)[0], p, ins)


def _float_type(d, op: str, what: str = "type"):
    if d.kind != "f":
        raise ArgumentError(f"[{op}] Received unsupported {what} {d.name}.")


def _norm_param(w, name: str, x: array, op: str) -> array:
    w = as_array(w)
    if w.ndim != 1:
        raise ShapeError(f"[{op}] {name} must have 1 dimension but has {w.ndim} dimensions "
                         f"(shape {_shape(w.shape)}; x has shape {_shape(x.shape)}).")
    if w.shape[0] != x.shape[-1]:
        raise ShapeError(f"[{op}] {name} must have the same size as the last dimension of x "
                         f"but has {w.shape[0]} elements (x has shape {_shape(x.shape)}).")
    return w


def _norm_input(x, op: str) -> array:
    x = as_array(x)
    if x.ndim == 0:
        raise ShapeError(f"[{op}] Input must have at least 1 dimension but got input with "
                         f"0 dimensions.")
    return x


def _eps(eps, op: str) -> float:
    if isinstance(eps, (bool, str, bytes)) or not isinstance(eps, (int, float, np.number)):
        raise DtypeError(f"[{op}] eps must be a float, got {eps!r}.")
    return float(eps)


def rms_norm(x, weight, eps, *, stream=None) -> array:
    """Root Mean Square normalization (RMS norm).

    The normalization is with respect to the last axis of the input ``x``.

    Args:
        x (array): Input array.
        weight (array, optional): A multiplicative weight to scale the result by.
          The ``weight`` should be one-dimensional with the same size
          as the last axis of ``x``. If set to ``None`` then no scaling happens.
        eps (float): A small additive constant for numerical stability.

    Returns:
        array: The output array, of the promoted type of ``x`` and ``weight``.
    """
    x = _norm_input(x, "rms_norm")
    eps = _eps(eps, "rms_norm")
    ins = [x]
    out = x.dtype
    if weight is not None:
        w = _norm_param(weight, "weight", x, "rms_norm")
        out = dt.promote_types(out, w.dtype)
        ins.append(w)
    _float_type(out, "rms_norm")
    s = to_stream(stream)
    return _node(RMSNorm(s, eps), [cast(a, out, s) for a in ins])


def layer_norm(x, weight, bias, eps, *, stream=None) -> array:
    """Layer normalization.

    The normalization is with respect to the last axis of the input ``x``.

    Args:
        x (array): Input array.
        weight (array, optional): A multiplicative weight to scale the result by.
          The ``weight`` should be one-dimensional with the same size
          as the last axis of ``x``. If set to ``None`` then no scaling happens.
        bias (array, optional): An additive offset to be added to the result.
          The ``bias`` should be one-dimensional with the same size
          as the last axis of ``x``. If set to ``None`` then no translation happens.
        eps (float): A small additive constant for numerical stability.

    Returns:
        array: The output array: of ``x``'s type, or with a weight the promoted type of
        ``x``, ``weight`` and ``bias`` (MLX's rule: a bias alone does not promote).
    """
    x = _norm_input(x, "layer_norm")
    eps = _eps(eps, "layer_norm")
    ins = [x]
    w = b = None
    if weight is not None:
        w = _norm_param(weight, "weight", x, "layer_norm")
        ins.append(w)
    if bias is not None:
        b = _norm_param(bias, "bias", x, "layer_norm")
        ins.append(b)
    out = dt.result_type(*ins) if w is not None else x.dtype
    _float_type(out, "layer_norm")
    s = to_stream(stream)
    return _node(LayerNorm(s, eps, w is not None, b is not None), [cast(a, out, s) for a in ins])


# -- rope ----------------------------------------------------------------------------
class RoPE(_LikeInput):
    """Rotary positional encoding of the first ``dims`` features of the last axis of
    input 0 (shape ``(B, *, T, D)``): the pair ``(x1, x2)`` of frequency ``i`` at
    position ``p = (offset + t) * scale`` is rotated by ``p * inv_freq[i]``, backwards
    when not ``forward`` (the inverse, the vjp). Inputs ``(x, offset[, freqs])``:
    ``offset`` an int32 scalar or ``B`` of them; ``freqs`` (float32, float64 for a float64 input) replaces
    ``base ** (2 i / dims)``. ``traditional`` pairs features ``2i, 2i + 1``, else
    ``i, i + dims / 2``."""

    __slots__ = ("dims", "traditional", "base", "scale", "forward")
    dims: int
    traditional: bool
    base: float | None
    scale: float
    forward: bool

    def angles(self, inputs):
        """The rotation angles as an array of shape ``(B or 1, T, dims / 2)`` (float32,
        or float64 for a float64 input), in ops."""
        x, offset = inputs[0], inputs[1]
        s, c = self.stream, _compute(inputs[0]._dtype)
        half = self.dims // 2
        t = mx.arange(x._shape[-2], dtype=c, stream=s)
        off = mx.reshape(cast(offset, c, s), (-1, 1), stream=s)
        pos = mx.multiply(mx.add(t, off, stream=s), self.scale, stream=s)  # (B or 1, T)
        if len(inputs) > 2:
            inv = mx.reciprocal(cast(inputs[2], c, s), stream=s)
        else:
            inv = mx.exp(mx.multiply(mx.arange(0, -half, -1, dtype=c, stream=s),
                                     math.log(self.base) / half, stream=s), stream=s)
        return mx.multiply(mx.expand_dims(pos, -1, stream=s), inv, stream=s)

    def fallback(self, inputs):
        x = inputs[0]
        s, d = self.stream, x._dtype
        shape = x._shape
        xf = cast(mx.reshape(x, (shape[0], -1) + shape[-2:], stream=s), _compute(d), s)
        theta = mx.expand_dims(self.angles(inputs), 1, stream=s)  # (B or 1, 1, T, half)
        cos, sin = mx.cos(theta, stream=s), mx.sin(theta, stream=s)
        if not self.forward:
            sin = mx.negative(sin, stream=s)
        dims, half = self.dims, self.dims // 2
        if self.traditional:
            x1, x2 = xf[..., 0:dims:2], xf[..., 1:dims:2]
        else:
            x1, x2 = xf[..., :half], xf[..., half:dims]
        y1 = mx.subtract(mx.multiply(x1, cos, stream=s), mx.multiply(x2, sin, stream=s), stream=s)
        y2 = mx.add(mx.multiply(x1, sin, stream=s), mx.multiply(x2, cos, stream=s), stream=s)
        if self.traditional:
            y = mx.reshape(mx.stack([y1, y2], -1, stream=s), y1._shape[:-1] + (dims,), stream=s)
        else:
            y = mx.concatenate([y1, y2], -1, stream=s)
        if dims < shape[-1]:
            y = mx.concatenate([y, xf[..., dims:]], -1, stream=s)
        return [cast(mx.reshape(y, shape, stream=s), d, s)]

    def _again(self, inputs, forward=None):
        p = RoPE(self.stream, self.dims, self.traditional, self.base, self.scale,
                 self.forward if forward is None else forward)
        return _node(p, inputs)

    def vjp(self, primals, cotangents, argnums, outputs):
        if list(argnums) != [0]:
            raise ArgumentError("[RoPE::vjp] vjp for offset or frequencies not supported: "
                                "differentiate rope with respect to its input only.")
        cot = cast(cotangents[0], primals[0]._dtype, self.stream)
        return [self._again([cot] + list(primals[1:]), forward=not self.forward)]

    def jvp(self, primals, tangents, argnums):
        if list(argnums) != [0]:
            raise ArgumentError("[RoPE::jvp] jvp for offset or frequencies not supported: "
                                "differentiate rope with respect to its input only.")
        return [self._again([tangents[0]] + list(primals[1:]))]

    def vmap(self, inputs, axes):
        if any(a is not None for a in axes[1:]):
            return super().vmap(inputs, axes)
        x, b = inputs[0], axes[0]
        nd = len(x._shape)  # per-example rank nd - 1 >= 3
        # The batch may sit anywhere but on the per-example B axis (offsets index it)
        # and the last two (T, D): axis 1 of the batched array is always such a place.
        if b == 0 or b >= nd - 2:
            x, b = mx.moveaxis(x, b, 1, stream=self.stream), 1
        return [self._again([x] + list(inputs[1:]))], [b]


def rope(a, dims, *, traditional, base, scale, offset, freqs=None, stream=None) -> array:
    """Apply rotary positional encoding to the input.

    The input is expected to be at least 3D with shape ``(B, *, T, D)`` where
    ``B`` is the batch size, ``T`` the sequence length and ``D`` the feature dimension.

    Args:
        a (array): The input array.
        dims (int): The feature dimensions to be rotated. If the input feature
          is larger than dims then the rest is left unchanged.
        traditional (bool): If set to ``True`` choose the traditional
          implementation which rotates consecutive dimensions.
        base (float, optional): The base used to compute angular frequency for
          each dimension in the positional encodings. Exactly one of ``base`` and
          ``freqs`` must be ``None``.
        scale (float): The scale used to scale the positions.
        offset (int or array): The position offset to start at. If an
          :obj:`array` is given it can be a scalar or vector of ``B``
          offsets for each example in the batch.
        freqs (array, optional): Optional frequencies to use with RoPE.
          If set, the ``base`` parameter must be ``None``. Default: ``None``.

    Returns:
        array: The output array.
    """
    op = "rope"
    a = as_array(a)
    if a.ndim < 3:
        raise ShapeError(f"[{op}] Input must have at least 3 dimensions but got input with "
                         f"{a.ndim} dimensions (shape {_shape(a.shape)}).")
    if a.dtype.kind != "f":
        raise ArgumentError(f"[{op}] Input must be a floating type but got {a.dtype.name}.")
    if isinstance(dims, bool) or not isinstance(dims, (int, np.integer)):
        raise DtypeError(f"[{op}] dims must be an integer, got {dims!r}.")
    dims = int(dims)
    if dims <= 0:
        raise ArgumentError(f"[{op}] dims must be positive but got {dims}.")
    if dims % 2:
        raise ArgumentError(f"[{op}] dims must be even but got {dims} (input shape "
                            f"{_shape(a.shape)}).")
    if dims > a.shape[-1]:
        raise ArgumentError(f"[{op}] dims must not exceed the input's last dimension "
                            f"({a.shape[-1]}) but got {dims} (input shape {_shape(a.shape)}).")
    if (base is None) == (freqs is None):
        raise ArgumentError(f"[{op}] Only one of base or freqs can have a value." if base is not None
                            else f"[{op}] Neither base nor freqs has a value.")
    s = to_stream(stream)
    if isinstance(offset, array) or isinstance(offset, (np.ndarray, list, tuple)):
        off = as_array(offset)
        if off.dtype.kind not in "iu":
            raise ArgumentError(f"[{op}] offset must be an integer but got type {off.dtype.name}.")
        if off.ndim > 1:
            raise ShapeError(f"[{op}] offset must have at most one dimension but has shape "
                             f"{_shape(off.shape)}.")
        if off.ndim == 1 and off.shape[0] != a.shape[0]:
            raise ShapeError(f"[{op}] offset must be a scalar or vector with {a.shape[0]} "
                             f"elements but has shape {_shape(off.shape)} (input shape "
                             f"{_shape(a.shape)}).")
        off = cast(off, dt.int32, s)
    elif isinstance(offset, (int, np.integer)) and not isinstance(offset, bool):
        off = mx.array(int(offset), dtype=dt.int32)
    else:
        raise ArgumentError(f"[{op}] offset must be an integer but got type "
                            f"{type(offset).__name__}.")
    ins = [a, off]
    if freqs is not None:
        f = as_array(freqs)
        if f.shape != (dims // 2,):
            raise ShapeError(f"[{op}] freqs must be one dimensional with size {dims // 2} but "
                             f"got shape {_shape(f.shape)}.")
        ins.append(cast(f, _compute(a.dtype), s))
        base = None
    else:
        base = float(base)
    return _node(RoPE(s, dims, bool(traditional), base, float(scale), True), ins)


# -- scaled_dot_product_attention ----------------------------------------------------
class ScaledDotProductAttention(_Fused):
    """``softmax(scale * q @ k.T + mask) @ v`` per head, the softmax in float32 (with
    an extra ``sinks`` logit per head when ``sinks``). Inputs ``(q, k, v[, mask]
    [, sinks])``: ``q`` of shape ``(B, Hq, Tq, D)``, ``k``/``v`` ``(B, Hkv, Tk, D/Dv)``
    with ``Hq % Hkv == 0`` (query head ``h`` reads kv head ``h // (Hq / Hkv)``);
    ``mask`` ("array") is boolean (False: masked, score ``finfo(float32).min``) or
    additive of q's dtype, of 4 dimensions that broadcast to ``(B, Hq, Tq, Tk)``;
    "causal" masks key ``j > i + Tk - Tq`` of query ``i`` (lower-right aligned)."""

    __slots__ = ("scale", "mask", "sinks")
    scale: float
    mask: Literal["none", "causal", "array"]
    sinks: bool

    def output_shapes(self, inputs):
        q, v = inputs[0].shape, inputs[2].shape
        return [tuple(q[:3]) + (v[3],)]

    def output_dtypes(self, inputs):
        return [inputs[0].dtype]

    def fallback(self, inputs):
        q, k, v = inputs[:3]
        s, d = self.stream, q._dtype
        c = _compute(d)
        hq, hkv = q._shape[1], k._shape[1]
        g = hq // hkv
        qf = mx.multiply(cast(q, c, s), self.scale, stream=s)
        kf, vf = cast(k, c, s), cast(v, c, s)
        if g > 1:
            kf = mx.repeat(kf, g, axis=1, stream=s)
            vf = mx.repeat(vf, g, axis=1, stream=s)
        scores = mx.matmul(qf, mx.swapaxes(kf, -1, -2, stream=s), stream=s)
        tq, tk = q._shape[2], k._shape[2]
        k_in = 3
        if self.mask == "causal":
            keep = mx.greater_equal(mx.reshape(mx.arange(tq, stream=s), (tq, 1), stream=s)
                                    + (tk - tq), mx.arange(tk, stream=s), stream=s)
            scores = mx.where(keep, scores, MASKED, stream=s)
        elif self.mask == "array":
            m = inputs[3]
            k_in = 4
            if m._dtype is dt.bool_:
                scores = mx.where(m, scores, MASKED, stream=s)
            else:
                scores = mx.add(scores, cast(m, c, s), stream=s)
        if self.sinks:
            # (Hq,), or (B, Hq) per batch in the backward's composition
            sk = mx.reshape(cast(inputs[k_in], c, s), (-1, hq, 1, 1), stream=s)
            sk = mx.broadcast_to(sk, scores._shape[:3] + (1,), stream=s)
            scores = mx.concatenate([sk, scores], -1, stream=s)
        p = mx.softmax(scores, -1, stream=s)
        if self.sinks:
            p = p[..., 1:]
        return [cast(mx.matmul(p, vf, stream=s), d, s)]

    def vjp(self, primals, cotangents, argnums, outputs):
        if self.mask == "array" and 3 in argnums:  # the mask's cotangent: the composition's
            return super().vjp(primals, cotangents, argnums, outputs)
        s = self.stream
        p = ScaledDotProductAttentionVJP(s, self.scale, self.mask, self.sinks)
        ins = list(primals) + [outputs[0], cast(cotangents[0], primals[0]._dtype, s)]
        outs = lazy_multi(p.output_shapes(ins), p.output_dtypes(ins), p, tuple(ins))
        grads = list(outs[:3]) + [None] * (self.mask == "array")  # by input index
        if self.sinks:  # per batch from the kernel: summed here
            grads.append(mx.sum(outs[3], 0, stream=s))
        return [grads[i] for i in argnums]

    def vmap(self, inputs, axes):
        if any(a is not None for a in axes[3:]):
            return super().vmap(inputs, axes)
        return _fold_attention(self, inputs, axes, 3)


def _fold_attention(p, inputs, axes, per_batch: int):
    """vmap of attention or its backward by folding the vmapped axis into the batch
    axis: the first ``per_batch`` inputs and the last ``len(inputs) - per_batch - mask -
    sinks`` ones (the backward's output and cotangent) have a batch axis; the mask and
    the sinks are unbatched (a per-batch mask repeats per vmapped example)."""
    s = p.stream
    n = next(x._shape[a] for x, a in zip(inputs, axes) if a is not None)
    extra = (p.mask == "array") + p.sinks
    ins = list(inputs)
    for i in list(range(per_batch)) + list(range(per_batch + extra, len(inputs))):
        x, a = inputs[i], axes[i]
        if a is None:
            x = mx.broadcast_to(mx.expand_dims(x, 0, stream=s), (n,) + x._shape, stream=s)
        elif a:
            x = mx.moveaxis(x, a, 0, stream=s)
        ins[i] = mx.reshape(x, (-1,) + x._shape[2:], stream=s)
    if p.mask == "array" and inputs[per_batch]._shape[0] != 1:
        m = inputs[per_batch]  # the batch folds into B: a per-example mask repeats per batch
        m = mx.broadcast_to(mx.expand_dims(m, 0, stream=s), (n,) + m._shape, stream=s)
        ins[per_batch] = mx.reshape(m, (-1,) + m._shape[2:], stream=s)
    t = tuple(ins)
    shapes, dtypes = p.output_shapes(t), p.output_dtypes(t)
    outs = lazy_multi(shapes, dtypes, p, t) if len(shapes) > 1 else [_node(p, t)]
    return [mx.reshape(o, (n, -1) + o._shape[1:], stream=s) for o in outs], [0] * len(outs)


class ScaledDotProductAttentionVJP(_Fused):
    """The fused backward of :class:`ScaledDotProductAttention` (MLX's
    ``ScaledDotProductAttentionVJP``): inputs the forward's ``(q, k, v[, mask]
    [, sinks])``, its output and the output's cotangent; outputs the cotangents of
    ``q``, ``k`` and ``v`` (those of ``k``/``v`` summed over the query heads that share
    a kv head) and, with sinks, the sinks' cotangent per batch, ``(B, Hq)`` in the
    compute dtype (float32 for half types; the forward's rule sums it). One
    FlashAttention-2 backward kernel: the scores and their softmax are recomputed
    block by block from each row's statistics, never held whole. Its composition (and
    so its own rules: second-order derivatives) is the vjp of the forward's."""

    __slots__ = ("scale", "mask", "sinks")
    scale: float
    mask: Literal["none", "causal", "array"]
    sinks: bool

    def output_shapes(self, inputs):
        q = tuple(inputs[0].shape)
        shapes = [q, tuple(inputs[1].shape), tuple(inputs[2].shape)]
        return shapes + [q[:2]] if self.sinks else shapes

    def output_dtypes(self, inputs):
        d = inputs[0].dtype
        return [d, d, d] + ([_compute(d)] if self.sinks else [])

    def fallback(self, inputs):
        primals, cot = list(inputs[:-2]), inputs[-1]
        forward = ScaledDotProductAttention(self.stream, self.scale, self.mask, self.sinks)
        moving = [0, 1, 2]
        if self.sinks:  # per batch: differentiate sinks broadcast to (B, Hq)
            s, q = self.stream, primals[0]
            sk = cast(primals[-1], _compute(q._dtype), s)
            primals[-1] = mx.broadcast_to(mx.expand_dims(sk, 0, stream=s), q._shape[:2], stream=s)
            moving.append(len(primals) - 1)

        def fn(*xs):
            ys = list(primals)
            for i, x in zip(moving, xs):
                ys[i] = x
            return forward.fallback(ys)
        _, grads = mx.vjp(fn, [primals[i] for i in moving], [cot])
        return list(grads)

    def vmap(self, inputs, axes):
        n = len(inputs) - 2
        if any(a is not None for a in axes[3:n]):
            return super().vmap(inputs, axes)
        return _fold_attention(self, inputs, axes, 3)


_SDPA = "scaled_dot_product_attention"


def scaled_dot_product_attention(q, k, v, *, scale, mask=None, sinks=None, force_fused=False,
                                 stream=None) -> array:
    """A fast implementation of multi-head attention: ``O = softmax(Q @ K.T, dim=-1) @ V``.

    Supports multi-head, grouped-query and multi-query attention (``k`` and ``v``
    with fewer heads than ``q``, not pre-tiled). The softmax is performed in
    ``float32`` regardless of the input precision. One kernel computes the whole
    attention (an online softmax over key blocks, on the CPU and the GPU): the score
    matrix of a long sequence is never held at once.

    Args:
        q (array): Queries with shape ``[B, N_q, T_q, D]``.
        k (array): Keys with shape ``[B, N_kv, T_kv, D]``.
        v (array): Values with shape ``[B, N_kv, T_kv, D]``.
        scale (float): Scale for queries (typically ``1.0 / sqrt(q.shape(-1)``).
        mask (str or array, optional): ``"causal"`` (lower-right aligned: the last
          query aligns with the last key), or a boolean or additive mask of at most
          4 dimensions that broadcasts to ``[B, N_q, T_q, T_kv]``; an additive mask's
          type must promote to the type of ``q``, ``k`` and ``v``.
        sinks (array, optional): One attention-sink logit per query head.
        force_fused (bool, optional): Accepted for MLX's signature; lazyx always
          uses its fused kernel.

    Returns:
        array: The output array, ``[B, N_q, T_q, D_v]``.
    """
    op = f"[{_SDPA}]"
    q, k, v = as_array(q), as_array(k), as_array(v)
    for x in (q, k, v):
        if x.ndim != 4:
            raise ShapeError(f"{op} input with shape {_shape(x.shape)} expected to be rank 4 "
                             f"([B, N, T, D]).")
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        bad = k if k.shape[0] != q.shape[0] else v
        raise ShapeError(f"{op} mismatching batch dimension for input with shape "
                         f"{_shape(bad.shape)} (queries {_shape(q.shape)}).")
    if q.shape[-1] != k.shape[-1]:
        raise ShapeError(f"{op} query, keys expected to have matching last dimension; found "
                         f"query shape {_shape(q.shape)} for keys shape {_shape(k.shape)}.")
    if k.shape[1] != v.shape[1]:
        raise ShapeError(f"{op} keys, values expected to have matching n_kv_heads; found keys "
                         f"with n_heads {k.shape[1]} for values with n_heads {v.shape[1]}.")
    if k.shape[2] != v.shape[2]:
        raise ShapeError(f"{op} keys, values expected to have the same number of tokens; found "
                         f"keys shape {_shape(k.shape)} for values shape {_shape(v.shape)}.")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ShapeError(f"{op} n_heads must be a multiple of n_kv_heads, found n_heads "
                         f"{q.shape[1]} for n_kv_heads {k.shape[1]} (q {_shape(q.shape)}, "
                         f"k {_shape(k.shape)}).")
    out = dt.result_type(q, k, v)
    _float_type(out, _SDPA)
    s = to_stream(stream)
    ins = [cast(q, out, s), cast(k, out, s), cast(v, out, s)]
    b, hq, tq, tk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    mode = "none"
    if isinstance(mask, str):
        if mask != "causal":
            raise ArgumentError(f"{op} invalid mask option {mask!r}. Must be 'causal', or an "
                                f"array.")
        mode = "causal"
    elif mask is not None:
        m = as_array(mask)
        if m.ndim > 4:
            raise ShapeError(f"{op} the mask with shape {_shape(m.shape)} expected to have at "
                             f"most rank 4.")
        full = (b, hq, tq, tk)
        ms = (1,) * (4 - m.ndim) + tuple(m.shape)
        if any(d not in (1, f) for d, f in zip(ms, full)):
            raise ShapeError(f"{op} the mask with shape {_shape(m.shape)} does not broadcast to "
                             f"the scores' shape {_shape(full)} ([B, N_q, T_q, T_kv]).")
        if m.dtype is not dt.bool_:
            if dt.promote_types(m.dtype, out) is not out:
                raise ArgumentError(f"{op} Mask type must promote to output type {out.name} "
                                    f"(mask {m.dtype.name}).")
            m = cast(m, out, s)
        mode = "array"
        ins.append(mx.reshape(m, ms, stream=s) if m.ndim < 4 else m)
    if sinks is not None:
        sk = as_array(sinks)
        if sk.shape != (hq,):
            raise ShapeError(f"{op} Received invalid shape for sinks {_shape(sk.shape)}: "
                             f"expected ({hq}), one per query head.")
        ins.append(cast(sk, out, s))
    return _node(ScaledDotProductAttention(s, float(scale), mode, sinks is not None), ins)


# -- cross_entropy -------------------------------------------------------------------
class CrossEntropy(_Fused):
    """``logsumexp(logits, -1) - logits[..., target]`` in float32: inputs ``(logits,
    targets)`` (integer class indices, taken modulo the class count as MLX's gather
    wraps them); the float32 output has the targets' shape."""

    __slots__ = ()

    def output_shapes(self, inputs):
        return [tuple(inputs[1].shape)]

    def output_dtypes(self, inputs):
        return [_f32]

    def fallback(self, inputs):
        logits, t = inputs
        s = self.stream
        lf = cast(logits, _f32, s)
        n = logits._shape[-1]
        idx = mx.expand_dims(mx.remainder(cast(t, dt.int32, s), n, stream=s), -1, stream=s)
        picked = mx.squeeze(mx.take_along_axis(lf, idx, -1, stream=s), -1, stream=s)
        return [mx.subtract(mx.logsumexp(lf, -1, stream=s), picked, stream=s)]

    def vmap(self, inputs, axes):
        s = self.stream
        n = next(x._shape[a] for x, a in zip(inputs, axes) if a is not None)
        xs = []
        for x, a in zip(inputs, axes):
            if a is None:
                x = mx.broadcast_to(mx.expand_dims(x, 0, stream=s), (n,) + x._shape, stream=s)
            elif a:
                x = mx.moveaxis(x, a, 0, stream=s)
            xs.append(x)
        return [_node(CrossEntropy(s), xs)], [0]


def cross_entropy(logits, targets, *, stream=None) -> array:
    """Cross entropy loss with class indices as targets.

    Computes ``logsumexp(logits, axis=-1) - logits[..., target]`` in a fused kernel
    with accumulation in float32.

    Args:
        logits (array): The unnormalized logits. The loss is computed over
          the last axis.
        targets (array): Class indices. The shape should match the shape of
          ``logits`` with the last axis removed. The indices must be in
          ``[0, logits.shape[-1])``.

    Returns:
        array: The per-element loss in float32, with the shape of ``targets``.
    """
    op = "[cross_entropy]"
    logits, targets = as_array(logits), as_array(targets)
    if logits.ndim == 0:
        raise ShapeError(f"{op} logits must have at least 1 dimension but got input with 0 "
                         f"dimensions.")
    if logits.dtype.kind != "f":
        raise ArgumentError(f"{op} Received unsupported logits type {logits.dtype.name}.")
    if targets.dtype.kind not in "iu":
        raise ArgumentError(f"{op} targets must be integer class indices but got "
                            f"{targets.dtype.name}.")
    if tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ShapeError(f"{op} targets shape {_shape(targets.shape)} does not match logits "
                         f"shape {_shape(logits.shape)} with the last axis removed.")
    s = to_stream(stream)
    return _node(CrossEntropy(s), [logits, targets])


PRIMITIVES = [RMSNorm, RMSNormVJP, LayerNorm, LayerNormVJP, RoPE, ScaledDotProductAttention,
              ScaledDotProductAttentionVJP, CrossEntropy]

_FUNCTIONS = (rms_norm, layer_norm, rope, scaled_dot_product_attention, cross_entropy)
OPS = {f"fast.{f.__name__}": f for f in _FUNCTIONS}

lazyx_primitives, lazyx_ops = pack_hooks(PRIMITIVES, OPS)


# -- examples for the registry-wide transform test -------------------------------------
def _norm_grads(fn, *fixed):
    """An example through a fused backward node (a norm's, attention's): the inputs'
    cotangents for a fixed output cotangent, as functions of the primals."""
    def grads(*xs):
        _, g = mx.vjp(lambda *ys: fn(*ys, *fixed[1:]), list(xs), [mx.array(fixed[0])])
        return list(g)
    return grads


@hookimpl
def lazyx_examples():
    cot = uniform((3, 5))
    offs = integers((2,), 0, 5)
    bmask = mx.array(booleans((2, 1, 4)))
    targets = mx.array(integers((3,), 0, 5))
    acot, acot2 = uniform((1, 2, 3, 3)), uniform((1, 2, 3, 2))
    return [
        (RMSNorm, example(lambda x, w: rms_norm(x, w, 1e-5), uniform((3, 5)), uniform((5,)))),
        (RMSNorm, example(lambda x: rms_norm(x, None, 0.1), uniform((2, 2, 4)))),
        (RMSNormVJP, example(_norm_grads(lambda x, w: rms_norm(x, w, 1e-5), cot),
                             uniform((3, 5)), uniform((5,)))),
        (LayerNorm, example(lambda x, w, b: layer_norm(x, w, b, 1e-5), uniform((3, 5)),
                            uniform((5,)), uniform((5,)))),
        (LayerNorm, example(lambda x, b: layer_norm(x, None, b, 0.1), uniform((2, 2, 4)),
                            uniform((4,)))),
        (LayerNormVJP, example(_norm_grads(lambda x, w, b: layer_norm(x, w, b, 1e-5), cot),
                               uniform((3, 5)), uniform((5,)), uniform((5,)))),
        (RoPE, example(lambda x: rope(x, 4, traditional=False, base=10000.0, scale=1.0,
                                      offset=2), uniform((2, 3, 6)))),
        (RoPE, example(lambda x: rope(x, 4, traditional=True, base=None, scale=0.5,
                                      offset=mx.array(offs), freqs=mx.array([1.0, 3.0])),
                       uniform((2, 2, 3, 4)))),
        (ScaledDotProductAttention,
         example(lambda q, k, v: scaled_dot_product_attention(q, k, v, scale=0.5),
                 uniform((1, 2, 3, 4)), uniform((1, 1, 5, 4)), uniform((1, 1, 5, 3)))),
        (ScaledDotProductAttention,
         example(lambda q, k, v, s: scaled_dot_product_attention(q, k, v, scale=0.7, mask="causal",
                                                                  sinks=s),
                 uniform((2, 2, 4, 3)), uniform((2, 2, 4, 3)), uniform((2, 2, 4, 3)),
                 uniform((2,)))),
        (ScaledDotProductAttention,
         example(lambda q, k, v, m: scaled_dot_product_attention(q, k, v, scale=0.7, mask=m),
                 uniform((1, 2, 3, 2)), uniform((1, 2, 4, 2)), uniform((1, 2, 4, 2)),
                 uniform((3, 4)))),
        (ScaledDotProductAttention,
         example(lambda q, k, v: scaled_dot_product_attention(q, k, v, scale=0.7, mask=bmask),
                 uniform((1, 2, 3, 2)), uniform((1, 2, 4, 2)), uniform((1, 2, 4, 2)))),
        (ScaledDotProductAttentionVJP,
         example(_norm_grads(lambda q, k, v: scaled_dot_product_attention(q, k, v, scale=0.5,
                                                                           mask="causal"), acot),
                 uniform((1, 2, 3, 4)), uniform((1, 1, 5, 4)), uniform((1, 1, 5, 3)))),
        (ScaledDotProductAttentionVJP,
         example(_norm_grads(lambda q, k, v, s: scaled_dot_product_attention(
             q, k, v, scale=0.7, mask=bmask, sinks=s), acot2),
                 uniform((1, 2, 3, 2)), uniform((1, 2, 4, 2)), uniform((1, 2, 4, 2)),
                 uniform((2,)))),
        (CrossEntropy, example(lambda x: cross_entropy(x, targets), uniform((3, 5)))),
    ]
