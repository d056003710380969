"""Parameter initializers (``mlx.nn.init``).

Each function here takes the distribution's settings and returns an
*initializer*: a function of an array ``a`` that returns a new array of
``a``'s shape (``a``'s values are never read) in the initializer's ``dtype``::

    init_fn = nn.init.he_uniform()
    layer.weight = init_fn(layer.weight)

The flow of a call: the fans are read from ``a``'s shape (``fan_in`` is the last
axis, ``fan_out`` the first, both times the receptive field of the axes between,
as MLX and PyTorch lay out convolution weights), the scale follows from them and
the gain, then the values are drawn from :mod:`lazyx.core.random`'s global stream
with the same calls, in the same order, as MLX draws them. lazyx's random numbers
equal MLX's for the same seed, so after ``mx.random.seed(s)`` both libraries
initialize the same weights.
"""

from __future__ import annotations

import math
from typing import Callable, Literal

import lazyx.core as mx
from lazyx.errors import ArgumentError, ShapeError

__all__ = ["constant", "normal", "uniform", "identity", "glorot_normal", "glorot_uniform",
           "he_normal", "he_uniform", "sparse", "orthogonal"]


def constant(value: float, dtype=mx.float32) -> Callable:
    """An initializer that fills the array with ``value``.

    Args:
        value (float): The value.
        dtype (Dtype): The dtype of the result. Default: ``float32``.

    Example:
        >>> nn.init.constant(0.5)(mx.zeros((2, 2)))
        array([[0.5, 0.5],
               [0.5, 0.5]], dtype=float32)
    """

    def initializer(a):
        return mx.full(a.shape, value, dtype=dtype)

    return initializer


def normal(mean: float = 0.0, std: float = 1.0, dtype=mx.float32) -> Callable:
    """An initializer that draws from :math:`N(\\text{mean}, \\text{std}^2)`.

    Args:
        mean (float): The mean. Default: ``0.0``.
        std (float): The standard deviation. Default: ``1.0``.
        dtype (Dtype): The dtype of the result. Default: ``float32``.
    """

    def initializer(a):
        return mx.random.normal(shape=a.shape, scale=std, loc=mean, dtype=dtype)

    return initializer


def uniform(low: float = 0.0, high: float = 1.0, dtype=mx.float32) -> Callable:
    """An initializer that draws uniformly from ``[low, high)``.

    Args:
        low (float): The lower bound. Default: ``0.0``.
        high (float): The upper bound. Default: ``1.0``.
        dtype (Dtype): The dtype of the result. Default: ``float32``.
    """

    def initializer(a):
        return mx.random.uniform(low, high, a.shape, dtype=dtype)

    return initializer


def identity(dtype=mx.float32) -> Callable:
    """An initializer that returns the identity matrix; the array must be square.

    Args:
        dtype (Dtype): The dtype of the result. Default: ``float32``.
    """

    def initializer(a):
        if a.ndim != 2 or a.shape[0] != a.shape[1]:
            raise ShapeError(f"[init.identity] The input array must be a square matrix but got "
                             f"shape {tuple(a.shape)}.")
        return mx.eye(n=a.shape[0], dtype=dtype)

    return initializer


def _fans(a, op: str) -> tuple[int, int]:
    """``(fan_in, fan_out)`` of a weight laid out ``(out, *receptive_field, in)``."""
    if a.ndim < 2:
        raise ShapeError(f"[{op}] Glorot / He initialization requires at least 2 dimensional "
                         f"input but input with {a.ndim} dimensions (shape {tuple(a.shape)}).")
    receptive_field = math.prod(a.shape[1:-1])
    return a.shape[-1] * receptive_field, a.shape[0] * receptive_field


def _fan(a, mode: str, op: str) -> int:
    fan_in, fan_out = _fans(a, op)
    if mode == "fan_in":
        return fan_in
    if mode == "fan_out":
        return fan_out
    raise ArgumentError(f"[{op}] Invalid mode: {mode}. Valid modes are: fan_in, fan_out")


def glorot_normal(dtype=mx.float32) -> Callable:
    r"""A Glorot (Xavier) normal initializer: :math:`N(0, \sigma^2)` with
    :math:`\sigma = \gamma \sqrt{2 / (\text{fan\_in} + \text{fan\_out})}`.

    The initializer takes ``(a, gain=1.0)``; ``a`` needs at least 2 dimensions.

    Args:
        dtype (Dtype): The dtype of the result. Default: ``float32``.
    """

    def initializer(a, gain: float = 1.0):
        fan_in, fan_out = _fans(a, "init.glorot_normal")
        std = gain * math.sqrt(2.0 / (fan_in + fan_out))
        return mx.random.normal(shape=a.shape, dtype=dtype) * std

    return initializer


def glorot_uniform(dtype=mx.float32) -> Callable:
    r"""A Glorot (Xavier) uniform initializer: uniform on :math:`[-l, l]` with
    :math:`l = \gamma \sqrt{6 / (\text{fan\_in} + \text{fan\_out})}`.

    The initializer takes ``(a, gain=1.0)``; ``a`` needs at least 2 dimensions.

    Args:
        dtype (Dtype): The dtype of the result. Default: ``float32``.
    """

    def initializer(a, gain: float = 1.0):
        fan_in, fan_out = _fans(a, "init.glorot_uniform")
        limit = gain * math.sqrt(6.0 / (fan_in + fan_out))
        return mx.random.uniform(-limit, limit, a.shape, dtype=dtype)

    return initializer


def he_normal(dtype=mx.float32) -> Callable:
    r"""A He (Kaiming) normal initializer: :math:`N(0, \sigma^2)` with
    :math:`\sigma = \gamma / \sqrt{\text{fan}}`.

    The initializer takes ``(a, mode="fan_in", gain=1.0)``; ``mode`` picks the fan
    (``"fan_in"`` or ``"fan_out"``); ``a`` needs at least 2 dimensions.

    Args:
        dtype (Dtype): The dtype of the result. Default: ``float32``.
    """

    def initializer(a, mode: Literal["fan_in", "fan_out"] = "fan_in", gain: float = 1.0):
        std = gain / math.sqrt(_fan(a, mode, "init.he_normal"))
        return mx.random.normal(shape=a.shape, dtype=dtype) * std

    return initializer


def he_uniform(dtype=mx.float32) -> Callable:
    r"""A He (Kaiming) uniform initializer: uniform on :math:`[-l, l]` with
    :math:`l = \gamma \sqrt{3 / \text{fan}}`.

    The initializer takes ``(a, mode="fan_in", gain=1.0)``; ``mode`` picks the fan
    (``"fan_in"`` or ``"fan_out"``); ``a`` needs at least 2 dimensions.

    Args:
        dtype (Dtype): The dtype of the result. Default: ``float32``.
    """

    def initializer(a, mode: Literal["fan_in", "fan_out"] = "fan_in", gain: float = 1.0):
        limit = gain * math.sqrt(3.0 / _fan(a, mode, "init.he_uniform"))
        return mx.random.uniform(-limit, limit, a.shape, dtype=dtype)

    return initializer


def sparse(sparsity: float, mean: float = 0.0, std: float = 1.0, dtype=mx.float32) -> Callable:
    """An initializer of 2-D arrays with ``ceil(sparsity * columns)`` zeros in every row
    (Martens 2010) and the other entries drawn from :math:`N(\\text{mean}, \\text{std}^2)`.

    The zeros sit at random columns, chosen independently per row.

    Args:
        sparsity (float): The fraction of each row set to zero.
        mean (float): The mean of the nonzero entries. Default: ``0.0``.
        std (float): Their standard deviation. Default: ``1.0``.
        dtype (Dtype): The dtype of the result. Default: ``float32``.
    """

    def initializer(a):
        if a.ndim != 2:
            raise ShapeError(f"[init.sparse] Only tensors with 2 dimensions are supported; got "
                             f"shape {tuple(a.shape)}.")
        rows, cols = a.shape
        num_zeros = int(math.ceil(sparsity * cols))
        # A random permutation of the columns of each row; its first num_zeros are zeroed.
        order = mx.argsort(mx.random.uniform(shape=a.shape), axis=1)
        values = mx.random.normal(shape=a.shape, scale=std, loc=mean, dtype=dtype)
        values[mx.arange(rows).reshape(rows, 1), order[:, :num_zeros]] = 0
        return values

    return initializer


def orthogonal(gain: float = 1.0, dtype=mx.float32) -> Callable:
    """An initializer of 2-D arrays with orthonormal rows or columns (whichever are
    fewer), scaled by ``gain``: the Q factor of the QR decomposition of a square
    standard normal matrix, its signs fixed by R's diagonal so that Q is uniformly
    (Haar) distributed.

    Args:
        gain (float): The scale. Default: ``1.0``.
        dtype (Dtype): The dtype of the result. Default: ``float32``.
    """

    def initializer(a):
        if a.ndim != 2:
            raise ShapeError(f"[init.orthogonal] Orthogonal initialization requires a 2D array "
                             f"but got a {a.ndim}D array (shape {tuple(a.shape)}).")
        rows, cols = a.shape
        n = max(rows, cols)
        q, r = mx.linalg.qr(mx.random.normal(shape=(n, n)), stream=mx.cpu)
        q = q * mx.sign(mx.diag(r))
        q = q[:rows, :] if rows < cols else q[:, :cols]
        return (gain * q).astype(dtype)

    return initializer
