"""Random op pack: counter-based random numbers, as in MLX and JAX.

A key is a ``uint32`` array of shape ``(2,)``. The one random primitive,
:class:`RandomBits`, hashes a counter under a key with Threefry-2x32 (20
rounds; Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011)
and so gives bits that depend on the key alone. Every distribution is a
composition of ordinary ops on top of those bits (uniform from the bits,
normal through ``erfinv`` of a uniform, ...), so a result depends only on its
key, never on when or in which order the graph is evaluated.

Ops called without ``key=`` take a fresh key from the global state at the
call: ``state[0]`` is split in two, the first half becomes the new state and
the second half is used. ``seed(s)`` resets the state to ``key(s)``. The
numbers match MLX's for the same key where MLX's algorithm is the one named
here (keys, ``split``, ``uniform``, ``normal``, ``bernoulli``,
``truncated_normal``, ``gumbel``, ``laplace``, ``categorical``,
``permutation``); ``randint`` reduces 64 random bits modulo the range, which
is exact for every integer range.

Transforms: random bits have no gradient (zero cotangents for the keys, zero
tangents for the bits); the distributions' parameters get their
reparameterisation gradients through the ordinary ops they enter. ``vmap``
over keys draws with each key of the batch, exactly as a loop would. The
matrix square root of ``multivariate_normal`` is differentiable once with
respect to the covariance.
"""

from __future__ import annotations

import math
import operator
import time
from typing import Literal

import numpy as np

import lazyx.core as mx
from lazyx import dtypes as dt
from lazyx.arguments import (MAX_DIM, as_array, broadcast_shapes, cast, check_dimensions,
                             constant, normalize_axis)
from lazyx.array import array, from_buffer, lazy
from lazyx.device import to_stream
from lazyx.errors import DtypeError, ShapeError, TransformError
from lazyx.hookspecs import hookimpl, pack_hooks
from lazyx.primitive import Primitive, SameShape, Shape
from lazyx import examples as _ex
from lazyx.rules import NoGradient, add_batch_axis, batch_first, batch_size

_M32 = 0xFFFFFFFF
_UINT = {1: dt.uint8, 2: dt.uint16, 4: dt.uint32, 8: dt.uint64}
_SQRT2 = math.sqrt(2.0)
_ABOVE_MINUS_ONE = float(np.nextafter(np.float32(-1), np.float32(0)))
# The largest value below 1 in each floating dtype, as the float32 clamp of the
# unit samples: it keeps them below 1 after the cast to a narrower dtype.
_BELOW_ONE = {d: 1.0 - dt.finfo(d).eps / 2 for d in (dt.float16, dt.bfloat16, dt.float32)}
_BELOW_ONE[dt.float64] = _BELOW_ONE[dt.float32]


# -- primitives ----------------------------------------------------------------
class RandomBits(NoGradient, Primitive):
    """Random bits from keys: ``keys`` of shape ``(..., 2)`` give ``(...) + shape``.

    The output of each key is ``prod(shape) * width`` bytes, filled from
    ``n = ceil(bytes / 4)`` 32-bit words. With ``h = ceil(n / 2)``, the pair
    ``(i, i + h)`` of counters is hashed with Threefry-2x32 under the key;
    the first word of the hash is word ``i`` and the second is word ``i + h``
    (for odd ``n`` the last pair is ``(h - 1, 0)`` and only its first word is
    used). Bytes are taken in little-endian order. ``split(key, num)`` is
    ``RandomBits((num, 2), 4)``.

    Random bits have no gradient: the cotangent of the keys and the tangent of
    the bits are zeros. A batch of keys gives a batch of draws, each the draw
    of its key, which is how ``vmap`` over keys works.
    """

    __slots__ = ("shape", "width")
    shape: Shape
    width: Literal[tuple(_UINT)]
    arity = 1

    #: Threefry-2x32 rotation constants, for the even and the odd groups of 4 rounds.
    ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
    #: Threefry's key-schedule parity constant.
    PARITY = 0x1BD11BDA

    def __init__(self, stream, shape: tuple[int, ...], width: int):
        super().__init__(stream)
        self.shape = shape
        self.width = width

    def output_shapes(self, inputs):
        return [tuple(inputs[0].shape[:-1]) + self.shape]

    def vmap(self, inputs, axes):
        # The kernel draws for every key of (..., 2): the batch goes in front.
        keys = batch_first(inputs[0], axes[0], stream=self.stream)
        out = lazy(keys._shape[:-1] + self.shape, _UINT[self.width], self, (keys,))
        return [out], [0]


def _batched_matrices(inputs, axes, stream) -> list:
    """Inputs of a matrix primitive with the batch axis in front, all batched.

    An unbatched input is broadcast (a view) to the batched shape; a batch
    axis among the matrix dimensions moves to the front.
    """
    size = batch_size(inputs, axes)
    return [add_batch_axis(x, 0, size, stream) if ax is None else batch_first(x, ax, stream=stream)
            for x, ax in zip(inputs, axes)]


class MatrixSqrt(SameShape):
    """``U @ diag(sqrt(S)) @ Vt`` from the SVD of each matrix in ``(..., n, n)``.

    For a covariance (symmetric positive semi-definite) matrix this is its
    symmetric square root, which is how ``multivariate_normal`` scales its
    samples; the SVD also accepts singular matrices.

    Its derivative is :class:`MatrixSqrtDerivative`; it is unbounded where a
    singular value is zero.
    """

    __slots__ = ()
    arity = 1

    def vjp(self, primals, cotangents, argnums, outputs):
        # The derivative is self-adjoint, so the vjp applies it to the cotangent.
        c = primals[0]
        return [lazy(c._shape, c._dtype, MatrixSqrtDerivative(self.stream),
                     (c, cotangents[0]))]

    def jvp(self, primals, tangents, argnums):
        c = primals[0]
        return [lazy(c._shape, c._dtype, MatrixSqrtDerivative(self.stream), (c, tangents[0]))]

    def vmap(self, inputs, axes):
        c, ax = inputs[0], axes[0]
        if ax >= len(c._shape) - 2:  # the batch must be a leading axis
            c, ax = batch_first(c, ax, stream=self.stream), 0
        return [lazy(c._shape, c._dtype, self, (c,))], [ax]


class MatrixSqrtDerivative(SameShape):
    """The derivative of :class:`MatrixSqrt` at ``c`` applied to ``t``; inputs ``(c, t)``.

    With ``c = U diag(s) Vt`` and ``p = U^T t V`` split into its symmetric
    part ``sym`` and its skew part ``skew``, the result is
    ``U (sym * a + skew * b) Vt`` where
    ``a[i, j] = 1 / (sqrt(s[i]) + sqrt(s[j]))`` and
    ``b[i, j] = (sqrt(s[i]) + sqrt(s[j])) / (s[i] + s[j])``. It is linear
    and self-adjoint in ``t``, so it is also the vjp. For a symmetric ``c``
    and ``t`` it solves ``r x + x r = t`` with ``r`` the square root of ``c``.

    The derivative with respect to ``c`` (a second derivative of the square
    root) is not implemented and raises a :class:`TransformError`.
    """

    __slots__ = ()

    def _second_order(self, where: str):
        raise TransformError(
            f"[{self.name}.{where}] Second derivatives of the matrix square root "
            f"(multivariate_normal) with respect to the matrix are not implemented; "
            f"only the derivative with respect to the direction (input 1) is.")

    def vjp(self, primals, cotangents, argnums, outputs):
        if 0 in argnums:
            self._second_order("vjp")
        c = primals[0]
        return [lazy(c._shape, c._dtype, self, (c, cotangents[0]))]

    def jvp(self, primals, tangents, argnums):
        if 0 in argnums:
            self._second_order("jvp")
        c = primals[0]
        return [lazy(c._shape, c._dtype, self, (c, tangents[0]))]

    def vmap(self, inputs, axes):
        c, t = _batched_matrices(inputs, axes, self.stream)
        return [lazy(c._shape, c._dtype, self, (c, t))], [0]


# -- keys and the global state -------------------------------------------------
def _split_host(k0: int, k1: int) -> tuple[int, int, int, int]:
    """``split(key)`` with Python ints: ``(new0, new1, sub0, sub1)``.

    This is Threefry-2x32 of the counter pairs (0, 2) and (1, 3), the two
    lanes side by side, exactly as RandomBits((2, 2), 4) lays them out. The
    NumPy kernel is the vectorised form; this scalar one splits the global key
    at each op call, where NumPy's per-call overhead would cost several times
    more than the hash itself.
    """
    even, odd = RandomBits.ROTATIONS
    k2 = k0 ^ k1 ^ RandomBits.PARITY
    # Lane a hashes counters (0, 2), lane b counters (1, 3).
    a0, a1, b0, b1 = k0, (k1 + 2) & _M32, (k0 + 1) & _M32, (k1 + 3) & _M32
    for c0, c1, rot in ((k1, k2 + 1, even), (k2, k0 + 2, odd), (k0, k1 + 3, even),
                        (k1, k2 + 4, odd), (k2, k0 + 5, even)):
        for r in rot:
            a0 = (a0 + a1) & _M32
            a1 = (((a1 << r) & _M32) | (a1 >> (32 - r))) ^ a0
            b0 = (b0 + b1) & _M32
            b1 = (((b1 << r) & _M32) | (b1 >> (32 - r))) ^ b0
        a0 += c0
        a1 = (a1 + c1) & _M32
        b0 += c0
        b1 = (b1 + c1) & _M32
    return a0 & _M32, b0 & _M32, a1, b1


def _key_array(k0: int, k1: int) -> array:
    return from_buffer(np.array((k0, k1), dtype=np.uint32), dt.uint32)


def key(seed: int) -> array:
    """A PRNG key from a seed.

    Args:
        seed (int): an integer in ``[0, 2**64)``.

    Returns:
        array: the key, a ``uint32`` array of shape ``(2,)`` holding the high
        and the low 32 bits of ``seed``.
    """
    try:
        s = operator.index(seed)
    except TypeError:
        raise DtypeError(f"[key] seed must be an integer, got {type(seed).__name__}.") from None
    if not 0 <= s < 1 << 64:
        raise DtypeError(f"[key] seed must be in [0, 2**64), got {s}.")
    return _key_array(s >> 32, s & _M32)


#: The global random state: a list holding the current key (as in MLX).
state: list = [key(time.time_ns() // 1_000_000)]
# The Python ints of state[0], so that taking the next key reads no buffer.
_cached = [None, 0, 0]


def seed(seed: int) -> None:
    """Seed the global PRNG: the global key becomes ``key(seed)``.

    Args:
        seed (int): an integer in ``[0, 2**64)``.
    """
    state[0] = key(seed)


def _next_key() -> array:
    """Split the global key: keep the first half as the state, return the second."""
    k = state[0]
    if k is _cached[0]:
        k0, k1 = _cached[1], _cached[2]
    elif k._data is None and k._prim is not None:
        # An unevaluated key (compile's inputs= captures the state): split in the graph.
        keys = split(k)
        state[0] = keys[0]
        return keys[1]
    else:
        d = np.asarray(_check_key(k, "random"))
        k0, k1 = int(d[0]), int(d[1])
    n0, n1, s0, s1 = _split_host(k0, k1)
    new = _key_array(n0, n1)
    state[0] = new
    _cached[0], _cached[1], _cached[2] = new, n0, n1
    return _key_array(s0, s1)


def _check_key(k, op: str) -> array:
    if type(k) is not array:
        if not isinstance(k, array):
            raise DtypeError(f"[{op}] key must be a uint32 array of shape (2,), got "
                             f"{type(k).__name__}.")
    if k._dtype is not dt.uint32:
        raise DtypeError(f"[{op}] key must have dtype uint32, got {k._dtype.name}.")
    if k._shape != (2,):
        raise ShapeError(f"[{op}] key must have shape (2,), got {k._shape}.")
    return k


def _key(k, op: str) -> array:
    return _next_key() if k is None else _check_key(k, op)


def _shape_arg(shape, op: str) -> tuple[int, ...]:
    if type(shape) is tuple and all(type(s) is int and 0 <= s <= MAX_DIM for s in shape):
        return shape
    try:
        out = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise ShapeError(f"[{op}] shape must be a sequence of integers, got {shape!r}.") from None
    return check_dimensions(out, op)


def _dtype_arg(dtype, default: dt.Dtype) -> dt.Dtype:
    return default if dtype is None else dt.to_dtype(dtype)


def _fits(shape: tuple, others, op: str) -> None:
    """Raise unless arrays of shapes ``others`` broadcast to ``shape`` without growing it."""
    b = broadcast_shapes(shape, *others)
    if b != shape:
        raise ShapeError(f"[{op}] Cannot generate random values of shape {shape} from "
                         f"the broadcast shape {b} of its parameters.")


def _bits(shape: tuple, width: int, k: array, stream) -> array:
    return lazy(shape, _UINT[width], RandomBits(to_stream(stream), shape, width), (k,))


def bits(shape=(), width: int = 4, key=None, stream=None) -> array:
    """Random bits: an array of unsigned integers, every bit uniformly random.

    Args:
        shape (list(int)): shape of the output. Default: ``()``.
        width (int): bytes per element, 1, 2, 4 or 8 (``uint8`` ...
            ``uint64``). Default: ``4``.
        key (array, optional): a PRNG key; the global state when omitted.

    Returns:
        array: the random bits.
    """
    shape = _shape_arg(shape, "bits")
    if width not in _UINT:
        raise DtypeError(f"[bits] width must be 1, 2, 4 or 8 bytes, got {width!r}.")
    return _bits(shape, width, _key(key, "bits"), stream)


def split(key: array, num: int = 2, stream=None) -> array:
    """Split a PRNG key into ``num`` new keys.

    Args:
        key (array): the key to split.
        num (int): how many keys to make. Default: ``2``.

    Returns:
        array: the keys, stacked in a ``uint32`` array of shape ``(num, 2)``.
    """
    k = _check_key(key, "split")
    n = operator.index(num)
    if n < 0:
        raise ShapeError(f"[split] num must be non-negative, got {n}.")
    return _bits((n, 2), 4, k, stream)


# -- distributions -------------------------------------------------------------
def _unit(shape: tuple, dtype: dt.Dtype, k: array, stream) -> array:
    """Uniform in ``[0, 1)`` of ``dtype``: 32 random bits / (2**32 - 1), clamped below one."""
    u = mx.astype(_bits(shape, 4, k, stream), dt.float32, stream=stream)
    # float32(2**32 - 1) is 2**32, so this product is exactly MLX's division.
    u = mx.multiply(u, 2.0 ** -32, stream=stream)
    u = mx.minimum(u, _BELOW_ONE[dtype], stream=stream)
    return u if dtype is dt.float32 else mx.astype(u, dtype, stream=stream)


def _uniform(low, high, shape: tuple, dtype: dt.Dtype, k, stream, op: str) -> array:
    """Uniform in ``[low, high)`` of ``dtype`` (validated), drawn with key ``k`` (or the state)."""
    scalars = type(low) in (int, float) and type(high) in (int, float)
    if not scalars:
        lo = as_array(low, dtype)
        hi = as_array(high, dtype)
        _fits(shape, (lo._shape, hi._shape), op)
    u = _unit(shape, dtype, _key(k, op), stream)
    if not scalars:
        return mx.add(mx.multiply(u, mx.subtract(hi, lo, stream=stream), stream=stream), lo,
                      stream=stream)
    if low == 0 and high == 1:
        return u
    # The range is computed in dtype, as it would be between arrays of dtype.
    npd = dtype.np
    rng = float(np.asarray(high, npd) - np.asarray(low, npd))
    return mx.add(mx.multiply(u, constant(rng, dtype), stream=stream),
                  constant(float(low), dtype), stream=stream)


def _floating(dtype, op: str, allow_complex: bool = False) -> dt.Dtype:
    d = _dtype_arg(dtype, dt.float32)
    if d.kind != "f" and not (allow_complex and d is dt.complex64):
        kinds = "floating point or complex64" if allow_complex else "real floating point"
        raise DtypeError(f"[{op}] Can only generate {kinds} random numbers, got dtype {d.name}.")
    return d


def uniform(low=0, high=1, shape=(), dtype=dt.float32, key=None, stream=None) -> array:
    """Uniformly distributed random numbers in the half-open interval ``[low, high)``.

    ``low`` and ``high`` must broadcast to ``shape``.

    Args:
        low (scalar or array): lower bound. Default: ``0``.
        high (scalar or array): upper bound. Default: ``1``.
        shape (list(int)): shape of the output. Default: ``()``.
        dtype (Dtype): a real floating point type. Default: ``float32``.
        key (array, optional): a PRNG key; the global state when omitted.

    Returns:
        array: the random values.
    """
    d = _floating(dtype, "uniform")
    return _uniform(low, high, _shape_arg(shape, "uniform"), d, key, stream, "uniform")


def _erfinv_uniform(shape: tuple, k, stream, op: str) -> array:
    """float32 ``erfinv(u)``, u uniform in (-1, 1): normal samples of variance 1/2."""
    u = _uniform(_ABOVE_MINUS_ONE, 1.0, shape, dt.float32, k, stream, op)
    return mx.erfinv(u, stream=stream)


def normal(shape=(), dtype=dt.float32, loc=None, scale=None, key=None, stream=None) -> array:
    """Normally distributed random numbers: ``loc + scale * z`` with ``z ~ N(0, 1)``.

    Args:
        shape (list(int)): shape of the samples. Default: ``()``.
        dtype (Dtype): a floating point type or ``complex64`` (whose real and
            imaginary parts each have variance 1/2). Default: ``float32``.
        loc (scalar or array, optional): mean. Default: ``0``.
        scale (scalar or array, optional): standard deviation. Default: ``1``.
        key (array, optional): a PRNG key; the global state when omitted.

    Returns:
        array: the samples; ``loc`` and ``scale`` broadcast with ``shape``.
    """
    d = _floating(dtype, "normal", allow_complex=True)
    shape = _shape_arg(shape, "normal")
    if loc is not None:
        loc = as_array(loc, d)
    if scale is not None:
        scale = as_array(scale, d)
    others = [x._shape for x in (loc, scale) if x is not None]
    if others:
        broadcast_shapes(shape, *others)
    if d is dt.complex64:
        z = _erfinv_uniform(shape + (2,), key, stream, "normal")
        z = mx.reshape(mx.view(z, dt.complex64, stream=stream), shape, stream=stream)
        if scale is not None:
            z = mx.multiply(scale, z, stream=stream)
    else:
        z = _erfinv_uniform(shape, key, stream, "normal")
        if d is not dt.float32:
            z = mx.astype(z, d, stream=stream)
        factor = _SQRT2 if scale is None else mx.multiply(constant(_SQRT2, d), scale,
                                                          stream=stream)
        z = mx.multiply(factor, z, stream=stream)
    if loc is not None:
        z = mx.add(loc, z, stream=stream)
    return z


def randint(low, high, shape=(), dtype=dt.int32, key=None, stream=None) -> array:
    """Random integers in the half-open interval ``[low, high)``.

    ``low`` and ``high`` must broadcast to ``shape``. An empty interval
    (``high <= low``) gives ``low``.

    Args:
        low (scalar or array): lower bound (inclusive).
        high (scalar or array): upper bound (exclusive).
        shape (list(int)): shape of the output. Default: ``()``.
        dtype (Dtype): an integer type or ``bool``. Default: ``int32``.
        key (array, optional): a PRNG key; the global state when omitted.

    Returns:
        array: the random integers.
    """
    d = _dtype_arg(dtype, dt.int32)
    if d.kind not in "biu":
        raise DtypeError(f"[randint] randint only accepts integer dtypes and bool, got "
                         f"{d.name}.")
    # MLX's algorithm, so that one key gives MLX's numbers: float32 uniform samples in
    # [low, high), rounded down, clamped below at low, converted to the dtype.
    lo = low if type(low) is array else as_array(low)
    u = _uniform(lo, high, _shape_arg(shape, "randint"), dt.float32, key, stream, "randint")
    return cast(mx.maximum(mx.floor(u, stream=stream), lo, stream=stream), d, stream)



def bernoulli(p=0.5, shape=None, key=None, stream=None) -> array:
    """Bernoulli random values: ``True`` with probability ``p``.

    Args:
        p (float or array): probability of ``True``, a floating point value.
            Default: ``0.5``.
        shape (list(int), optional): shape of the output; ``p.shape`` when
            omitted. ``p`` must broadcast to it.
        key (array, optional): a PRNG key; the global state when omitted.

    Returns:
        array: a ``bool`` array.
    """
    p = as_array(p)
    if p._dtype.kind != "f":
        raise DtypeError(f"[bernoulli] The probability p must be a floating point type, got "
                         f"{p._dtype.name}.")
    shape = p._shape if shape is None else _shape_arg(shape, "bernoulli")
    _fits(shape, (p._shape,), "bernoulli")
    u = _uniform(0, 1, shape, p._dtype, key, stream, "bernoulli")
    return mx.less(u, p, stream=stream)


def truncated_normal(lower, upper, shape=None, dtype=dt.float32, key=None,
                     stream=None) -> array:
    """Normal random values truncated to the interval ``[lower, upper]``.

    Args:
        lower (scalar or array): lower bound.
        upper (scalar or array): upper bound.
        shape (list(int), optional): shape of the output; the broadcast shape
            of ``lower`` and ``upper`` when omitted.
        dtype (Dtype): a real floating point type. Default: ``float32``.
        key (array, optional): a PRNG key; the global state when omitted.

    Returns:
        array: the random values.
    """
    d = _floating(dtype, "truncated_normal")
    lo = as_array(lower, d)
    hi = as_array(upper, d)
    if shape is None:
        shape = broadcast_shapes(lo._shape, hi._shape)
    else:
        shape = _shape_arg(shape, "truncated_normal")
        _fits(shape, (lo._shape, hi._shape), "truncated_normal")
    # Sample the normal CDF (through erf) between the bounds and invert it.
    a = mx.erf(mx.divide(lo, _SQRT2, stream=stream), stream=stream)
    b = mx.erf(mx.divide(hi, _SQRT2, stream=stream), stream=stream)
    u = _uniform(a, b, shape, d, key, stream, "truncated_normal")
    out = mx.multiply(_SQRT2, mx.erfinv(u, stream=stream), stream=stream)
    # erf saturates in finite precision: clip to the bounds.
    return mx.maximum(mx.minimum(out, hi, stream=stream), lo, stream=stream)


def gumbel(shape=(), dtype=dt.float32, key=None, stream=None) -> array:
    """Random values from the standard Gumbel distribution: ``-log(-log(u))``.

    Args:
        shape (list(int)): shape of the output. Default: ``()``.
        dtype (Dtype): a real floating point type. Default: ``float32``.
        key (array, optional): a PRNG key; the global state when omitted.

    Returns:
        array: the random values.
    """
    d = _floating(dtype, "gumbel")
    u = _uniform(0, 1, _shape_arg(shape, "gumbel"), d, key, stream, "gumbel")
    return mx.negative(mx.log(mx.negative(mx.log(u, stream=stream), stream=stream),
                              stream=stream), stream=stream)


def laplace(shape=(), dtype=dt.float32, loc: float = 0.0, scale: float = 1.0, key=None,
            stream=None) -> array:
    """Random values from the Laplace distribution with mean ``loc`` and scale ``scale``.

    Args:
        shape (list(int)): shape of the output. Default: ``()``.
        dtype (Dtype): a real floating point type. Default: ``float32``.
        loc (float): mean. Default: ``0.0``.
        scale (float): scale (the standard deviation is ``sqrt(2) * scale``).
            Default: ``1.0``.
        key (array, optional): a PRNG key; the global state when omitted.

    Returns:
        array: the random values.
    """
    d = _floating(dtype, "laplace")
    u = _uniform(_ABOVE_MINUS_ONE, 1.0, _shape_arg(shape, "laplace"), dt.float32, key, stream,
                 "laplace")
    # Inverse CDF: sign(u) * log(1 - |u|).
    z = mx.multiply(mx.sign(u, stream=stream),
                    mx.log1p(mx.negative(mx.abs(u, stream=stream), stream=stream),
                             stream=stream), stream=stream)
    if d is not dt.float32:
        z = mx.astype(z, d, stream=stream)
    if scale != 1.0:
        z = mx.multiply(constant(float(scale), d), z, stream=stream)
    if loc != 0.0:
        z = mx.add(constant(float(loc), d), z, stream=stream)
    return z


def categorical(logits, axis: int = -1, shape=None, num_samples=None, key=None,
                stream=None) -> array:
    """Sample indices from a categorical distribution given by unnormalised log-probabilities.

    Args:
        logits (array): the log-probabilities (up to a constant) along ``axis``.
        axis (int): the axis of the categories. Default: ``-1``.
        shape (list(int), optional): shape of the output; it must broadcast
            with ``logits``'s shape without ``axis``, which is the default.
        num_samples (int, optional): draw this many samples for each
            distribution (appended as the last axis). At most one of ``shape``
            and ``num_samples`` may be given.
        key (array, optional): a PRNG key; the global state when omitted.

    Returns:
        array: ``uint32`` indices into ``axis``.
    """
    logits = as_array(logits)
    nd = len(logits._shape)
    ax = normalize_axis(axis, nd, "[categorical] axis of logits")
    reduced = logits._shape[:ax] + logits._shape[ax + 1:]
    if shape is not None and num_samples is not None:
        raise ShapeError("[categorical] At most one of shape or num_samples can be given.")
    if num_samples is not None:
        n = operator.index(num_samples)
        if n < 0:
            raise ShapeError(f"[categorical] num_samples must be non-negative, got {n}.")
        logits = mx.expand_dims(logits, -1, stream=stream)
        shape = reduced + (n,)
        nd += 1
    elif shape is None:
        shape = reduced
    else:
        shape = _shape_arg(shape, "categorical")
        if broadcast_shapes(shape, reduced) != shape:
            raise ShapeError(f"[categorical] The shape {shape} does not broadcast with the "
                             f"shape {reduced} of logits without axis {ax}.")
    # The Gumbel-max trick: argmax(logits + gumbel) is a categorical sample.
    offset = ax + len(shape) - nd + 1
    g_shape = shape[:offset] + (logits._shape[ax],) + shape[offset:]
    g = gumbel(g_shape, dt.float32, key, stream)
    return mx.argmax(mx.add(g, logits, stream=stream), axis=offset, stream=stream)


def permutation(x, axis: int = 0, key=None, stream=None) -> array:
    """A random permutation of ``arange(x)``, or ``x`` shuffled along ``axis``.

    Args:
        x (int or array): the length of the permutation, or the array to shuffle.
        axis (int): the axis of ``x`` to shuffle. Default: ``0``.
        key (array, optional): a PRNG key; the global state when omitted.

    Returns:
        array: the ``uint32`` permutation, or the shuffled array.
    """
    if isinstance(x, array):
        ax = normalize_axis(axis, len(x._shape), "[permutation] axis")
        perm = permutation(x._shape[ax], key=key, stream=stream)
        return mx.take(x, perm, axis=ax, stream=stream)
    try:
        n = operator.index(x)
    except TypeError:
        raise DtypeError(f"[permutation] x must be an int or an array, got "
                         f"{type(x).__name__}.") from None
    if n < 0:
        raise ShapeError(f"[permutation] The length must be non-negative, got {n}.")
    return mx.argsort(_bits((n,), 4, _key(key, "permutation"), stream), stream=stream)


def multivariate_normal(mean, cov, shape=(), dtype=dt.float32, key=None,
                        stream=None) -> array:
    """Random values from a multivariate normal distribution.

    Args:
        mean (array): the means, of shape ``(..., n)``.
        cov (array): the covariance matrices, of shape ``(..., n, n)``; they
            should be symmetric positive semi-definite.
        shape (list(int)): the batch shape of the output; it broadcasts with
            the batch shapes of ``mean`` and ``cov``. Default: ``()``.
        dtype (Dtype): must be ``float32``. Default: ``float32``.
        key (array, optional): a PRNG key; the global state when omitted.

    Returns:
        array: samples of shape ``broadcast(shape, batch shapes) + (n,)``.
    """
    d = _dtype_arg(dtype, dt.float32)
    if d is not dt.float32:
        raise DtypeError(f"[multivariate_normal] dtype must be float32, got {d.name}.")
    mean = as_array(mean)
    cov = as_array(cov)
    sm, sc = mean._shape, cov._shape
    if len(sm) < 1:
        raise ShapeError("[multivariate_normal] mean must have at least one dimension.")
    if len(sc) < 2:
        raise ShapeError(f"[multivariate_normal] cov must have at least two dimensions, got "
                         f"shape {sc}.")
    if sc[-1] != sc[-2]:
        raise ShapeError(f"[multivariate_normal] The last two dimensions of cov must be "
                         f"equal, got shape {sc}.")
    if sm[-1] != sc[-1]:
        raise ShapeError(f"[multivariate_normal] mean of shape {sm} and cov of shape {sc} "
                         f"have incompatible sizes.")
    batch = broadcast_shapes(_shape_arg(shape, "multivariate_normal"), sm[:-1], sc[:-2])
    cov = cast(cov, dt.float32, stream)
    std = lazy(sc, dt.float32, MatrixSqrt(to_stream(stream)), (cov,))
    z = normal(batch + sm[-1:], dt.float32, key=key, stream=stream)
    if len(sc) == 2:
        scaled = mx.matmul(z, std, stream=stream)
    else:
        scaled = mx.matmul(mx.expand_dims(z, -2, stream=stream), std, stream=stream)
        scaled = mx.squeeze(scaled, -2, stream=stream)
    return mx.add(mean, scaled, stream=stream)


PRIMITIVES = [RandomBits, MatrixSqrt, MatrixSqrtDerivative]

OPS = {
    "random.key": key, "random.split": split, "random.seed": seed, "random.state": state,
    "random.uniform": uniform, "random.normal": normal, "random.randint": randint,
    "random.bernoulli": bernoulli, "random.categorical": categorical,
    "random.truncated_normal": truncated_normal, "random.gumbel": gumbel,
    "random.laplace": laplace, "random.permutation": permutation,
    "random.multivariate_normal": multivariate_normal,
}


lazyx_primitives, lazyx_ops = pack_hooks(PRIMITIVES, OPS)


# -- examples for the registry-wide transform test -------------------------------
def _matrix_sqrt(c):
    return lazy(c._shape, c._dtype, MatrixSqrt(to_stream(None)), (c,))


@hookimpl
def lazyx_examples():
    k = np.array([3, 141], dtype=np.uint32)
    m = _ex.uniform((3, 3), -1, 1)
    spd = m @ m.T + 3 * np.eye(3)  # symmetric positive definite: the square root is smooth
    c = from_buffer(spd, dt.float64)
    return [
        (RandomBits, _ex.example(lambda key: bits((2, 3), key=key), k)),
        (RandomBits, _ex.example(lambda key: split(key, 3), k)),
        (MatrixSqrt, _ex.example(_matrix_sqrt, spd)),
        # The derivative in its direction argument (the matrix is a constant).
        (MatrixSqrtDerivative, _ex.example(
            lambda t: lazy(c._shape, c._dtype, MatrixSqrtDerivative(to_stream(None)), (c, t)),
            _ex.uniform((3, 3)))),
    ]
