"""Positional encodings: ``RoPE`` (rotary, through ``mx.fast.rope``),
``SinusoidalPositionalEncoding`` and ``ALiBi`` (linear attention biases).

None of them has trainable parameters; ``SinusoidalPositionalEncoding`` keeps its
frequencies in the private entry ``_sigmas`` (not a parameter, as in MLX).
"""

from __future__ import annotations

import math

import lazyx.core as mx

from ._checks import check_features
from .base import Module

__all__ = ["RoPE", "SinusoidalPositionalEncoding", "ALiBi"]


class RoPE(Module):
    r"""Rotary positional encoding: rotate pairs of features by an angle proportional to
    the position, ``theta_i = scale * position * base ** (-2 i / dims)``.

    The rotation applies to the first ``dims`` features of the last axis; positions run
    along the second-to-last axis, starting at ``offset``.

    Args:
        dims (int): the number of features to rotate.
        traditional (bool, optional): rotate consecutive pairs ``(x[2i], x[2i+1])``
            instead of the two halves. Default: ``False``.
        base (float, optional): the base of the frequencies. Default: ``10000``.
        scale (float, optional): a scale of the positions. Default: ``1.0``.
    """

    def __init__(self, dims: int, traditional: bool = False, base: float = 10000,
                 scale: float = 1.0):
        super().__init__()
        self.dims = dims
        self.traditional = traditional
        self.base = base
        self.scale = scale

    def _extra_repr(self) -> str:
        return f"{self.dims}, traditional={self.traditional}"

    def __call__(self, x, offset: int = 0):
        if x.shape[-1] < self.dims:
            check_features(self, x, self.dims, "dims")
        return mx.fast.rope(x, self.dims, traditional=self.traditional, base=self.base,
                            scale=self.scale, offset=offset)


class SinusoidalPositionalEncoding(Module):
    r"""Sinusoidal positional encoding: for each input value ``x`` (a position),
    ``[sin(x * sigma_i), cos(x * sigma_i)] * scale`` with ``dims // 2`` frequencies
    ``sigma_i`` geometrically spaced from ``max_freq`` down to ``min_freq``.

    Args:
        dims (int): the size of the encoding (the output's last axis).
        min_freq (float, optional): the lowest frequency. Default: ``0.0001``.
        max_freq (float, optional): the highest frequency. Default: ``1``.
        scale (float, optional): a multiplier of the output. Default: ``sqrt(2 / dims)``.
        cos_first (bool, optional): put the cosines first. Default: ``False``.
        full_turns (bool, optional): multiply the frequencies by ``2 pi``.
            Default: ``False``.
    """

    def __init__(self, dims: int, min_freq: float = 0.0001, max_freq: float = 1,
                 scale: float | None = None, cos_first: bool = False,
                 full_turns: bool = False):
        super().__init__()
        half = dims // 2
        one_zero = 1 - mx.arange(0, half) / (half - 1)
        low, high = math.log(min_freq), math.log(max_freq)
        self._sigmas = mx.exp(one_zero * (high - low) + low)
        if full_turns:
            self._sigmas = self._sigmas * (2 * math.pi)
        self.scale = scale or (2 / dims) ** 0.5
        self.cos_first = cos_first

    def __call__(self, x):
        y = x[..., None] * self._sigmas
        parts = [mx.cos(y), mx.sin(y)] if self.cos_first else [mx.sin(y), mx.cos(y)]
        y = mx.concatenate(parts, axis=-1)
        if self.scale != 1:
            y = y * self.scale
        return y


class ALiBi(Module):
    r"""Attention with linear biases: add ``-slope_h * |i - j|`` to the attention scores
    of head ``h`` between query ``i`` (counted from ``offset``) and key ``j``, with the
    paper's slopes (``2 ** (-8 h / num_heads)`` when ``num_heads`` is a power of two;
    see :meth:`create_alibi_slope`).

    Called on scores of shape ``(..., num_heads, queries, keys)``; an optional additive
    ``mask`` is added too.
    """

    _cache: dict = {}

    @staticmethod
    def create_alibi_matrix(q_sequence_length: int, k_sequence_length: int, num_heads: int,
                            offset: int, dtype=mx.float32):
        """The ``(1, num_heads, q_sequence_length - offset, k_sequence_length)`` biases."""
        key = (q_sequence_length, k_sequence_length, num_heads, offset, dtype)
        if key not in ALiBi._cache:
            x1 = mx.arange(offset, q_sequence_length)
            x2 = mx.arange(0, k_sequence_length)
            distance = -mx.abs(mx.expand_dims(x1[:, None] - x2[None, :], axis=(0, 1)))
            slopes = ALiBi.create_alibi_slope(num_heads, dtype)
            ALiBi._cache[key] = (distance * slopes).astype(dtype)
        return ALiBi._cache[key]

    @staticmethod
    def create_alibi_slope(num_heads: int, dtype=mx.float32):
        """The ``(num_heads, 1, 1)`` slopes of the ALiBi paper: ``2 ** (-8 h / n)`` for
        ``n`` the largest power of two up to ``num_heads``; the heads beyond ``n`` take
        every other slope of ``2 n`` heads."""
        def geometric(n):
            return [2.0 ** (-8 * h / n) for h in range(1, n + 1)]

        closest = 2 ** int(math.floor(math.log2(num_heads)))
        slopes = geometric(closest) + geometric(2 * closest)[0::2][:num_heads - closest]
        return mx.array(slopes, dtype=dtype).reshape(num_heads, 1, 1)

    def __call__(self, attention_scores, offset: int = 0, mask=None):
        bias = ALiBi.create_alibi_matrix(
            q_sequence_length=attention_scores.shape[-2] + offset,
            k_sequence_length=attention_scores.shape[-1],
            num_heads=attention_scores.shape[-3], offset=offset,
            dtype=attention_scores.dtype)
        if mask is not None:
            bias = bias + mask
        return attention_scores + bias
