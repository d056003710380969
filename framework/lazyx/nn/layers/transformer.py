"""Attention and the transformer: ``MultiHeadAttention`` (through
``mx.fast.scaled_dot_product_attention``), the encoder and decoder layers and stacks,
and ``Transformer``, with MLX's submodule names (``attention``, ``ln1``, ``linear1``,
``dropout1`` ...) so MLX checkpoints load.

A layer is pre-norm (``norm_first=True``, the default: ``x + f(norm(x))``) or post-norm
(``norm(x + f(x))``). The stacks end with a ``LayerNorm`` ``ln``; with
``checkpoint=True`` each layer's activations are recomputed in the backward pass
(:func:`lazyx.nn.utils.checkpoint`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import lazyx.core as mx
from lazyx.errors import ArgumentError

from ..utils import checkpoint as _checkpoint
from ._checks import check_features
from .activations import relu
from .base import Module
from .dropout import Dropout
from .linear import Linear
from .normalization import LayerNorm


__all__ = ["MultiHeadAttention", "TransformerEncoderLayer", "TransformerEncoder",
           "TransformerDecoderLayer", "TransformerDecoder", "Transformer"]


class MultiHeadAttention(Module):
    r"""Multi-head attention.

    .. math::
        \mathrm{head}_h = \mathrm{softmax}\left(\frac{Q_h K_h^T}{\sqrt{d}} + M\right) V_h,
        \qquad y = [\mathrm{head}_1, \dots, \mathrm{head}_H] W_o

    with ``Q = queries @ W_q``, ``K = keys @ W_k``, ``V = values @ W_v`` split into
    ``num_heads`` heads of ``d = dims / num_heads`` features.

    Args:
        dims (int): the model width (of the projected queries and keys).
        num_heads (int): the number of heads; must divide ``dims``.
        query_input_dims, key_input_dims (int, optional): input widths of the queries
            and keys. Default: ``dims``.
        value_input_dims (int, optional): input width of the values.
            Default: ``key_input_dims``.
        value_dims (int, optional): width of the projected values. Default: ``dims``.
        value_output_dims (int, optional): output width. Default: ``dims``.
        bias (bool, optional): biases in the projections. Default: ``False``.

    Call as ``mha(queries, keys, values, mask=None)``; ``mask`` is additive (or boolean)
    and broadcasts to ``(..., num_heads, L_q, L_k)``.
    """

    def __init__(self, dims: int, num_heads: int, query_input_dims: Optional[int] = None,
                 key_input_dims: Optional[int] = None, value_input_dims: Optional[int] = None,
                 value_dims: Optional[int] = None, value_output_dims: Optional[int] = None,
                 bias: bool = False):
        super().__init__()
        if dims % num_heads != 0:
            raise ArgumentError(
                f"[MultiHeadAttention] The input feature dimensions should be divisible by the "
                f"number of heads ({dims} % {num_heads}) != 0")
        query_input_dims = query_input_dims or dims
        key_input_dims = key_input_dims or dims
        value_input_dims = value_input_dims or key_input_dims
        value_dims = value_dims or dims
        value_output_dims = value_output_dims or dims
        self.num_heads = num_heads
        self.query_proj = Linear(query_input_dims, dims, bias=bias)
        self.key_proj = Linear(key_input_dims, dims, bias=bias)
        self.value_proj = Linear(value_input_dims, value_dims, bias=bias)
        self.out_proj = Linear(value_dims, value_output_dims, bias=bias)

    def __call__(self, queries, keys, values, mask=None):
        for name, x in (("query_proj", queries), ("key_proj", keys), ("value_proj", values)):
            w = self[name].weight
            check_features(self, x, w.shape[1], f"{name}.weight", w.shape)
        queries = self._heads(self.query_proj(queries))
        keys = self._heads(self.key_proj(keys))
        values = self._heads(self.value_proj(values))
        scale = math.sqrt(1 / queries.shape[-1])
        out = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale,
                                                   mask=mask)
        out = mx.moveaxis(out, -3, -2)  # (..., L, heads, d)
        return self.out_proj(out.reshape(*out.shape[:-2], -1))

    def _heads(self, x):
        """``(..., L, heads * d)`` -> ``(..., heads, L, d)``."""
        x = x.reshape(*x.shape[:-1], self.num_heads, -1)
        return mx.moveaxis(x, -2, -3)

    @staticmethod
    def create_additive_causal_mask(N: int, dtype=mx.float32):
        """The ``(N, N)`` mask with the dtype's lowest value above the diagonal (a query
        does not see later keys) and ``0`` elsewhere."""
        indices = mx.arange(N)
        mask = indices[:, None] < indices[None]
        return mask.astype(dtype) * mx.finfo(dtype).min


class TransformerEncoderLayer(Module):
    r"""One encoder layer: self-attention then an MLP, each with a residual connection,
    a ``LayerNorm`` and dropout.

    Pre-norm: ``x = x + drop(attn(ln1(x)))``, ``y = x + linear2(drop(act(linear1(ln2(x)))))``.
    Post-norm: ``x = ln1(x + drop(attn(x)))``, ``y = ln2(x + linear2(drop(act(linear1(x)))))``.

    Args:
        dims (int): the model width.
        num_heads (int): attention heads.
        mlp_dims (int, optional): hidden width of the MLP. Default: ``4 * dims``.
        dropout (float, optional): dropout probability. Default: ``0.0``.
        activation (callable, optional): the MLP's activation. Default: ``relu``.
        norm_first (bool, optional): pre-norm (``True``) or post-norm. Default: ``True``.
    """

    def __init__(self, dims: int, num_heads: int, mlp_dims: Optional[int] = None,
                 dropout: float = 0.0, activation: Callable[[Any], Any] = relu,
                 norm_first: bool = True):
        super().__init__()
        mlp_dims = mlp_dims or dims * 4
        self.attention = MultiHeadAttention(dims, num_heads)
        self.ln1 = LayerNorm(dims)
        self.ln2 = LayerNorm(dims)
        self.linear1 = Linear(dims, mlp_dims)
        self.linear2 = Linear(mlp_dims, dims)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = activation
        self.norm_first = norm_first

    def _mlp(self, x):
        return self.linear2(self.dropout2(self.activation(self.linear1(x))))

    def __call__(self, x, mask):
        if self.norm_first:
            y = self.ln1(x)
            x = x + self.dropout1(self.attention(y, y, y, mask))
            return x + self._mlp(self.ln2(x))
        x = self.ln1(x + self.dropout1(self.attention(x, x, x, mask)))
        return self.ln2(x + self._mlp(x))


class TransformerEncoder(Module):
    """``num_layers`` :class:`TransformerEncoderLayer` (in ``layers``) then a ``LayerNorm``
    ``ln``; ``checkpoint=True`` recomputes each layer's activations in the backward pass.
    Other arguments as :class:`TransformerEncoderLayer`. Call as ``encoder(x, mask)``."""

    def __init__(self, num_layers: int, dims: int, num_heads: int,
                 mlp_dims: Optional[int] = None, dropout: float = 0.0, activation=relu,
                 norm_first: bool = True, checkpoint: bool = False):
        super().__init__()
        self.layers = [TransformerEncoderLayer(dims, num_heads, mlp_dims, dropout, activation,
                                               norm_first) for _ in range(num_layers)]
        self.ln = LayerNorm(dims)
        self.checkpoint = checkpoint

    def __call__(self, x, mask):
        for layer in self.layers:
            x = (_checkpoint(layer) if self.checkpoint else layer)(x, mask)
        return self.ln(x)


class TransformerDecoderLayer(Module):
    r"""One decoder layer: masked self-attention, cross-attention over ``memory``, then an
    MLP, each with a residual connection, a ``LayerNorm`` (``ln1`` to ``ln3``) and dropout.
    Arguments as :class:`TransformerEncoderLayer`. Call as
    ``layer(x, memory, x_mask, memory_mask)``.
    """

    def __init__(self, dims: int, num_heads: int, mlp_dims: Optional[int] = None,
                 dropout: float = 0.0, activation: Callable[[Any], Any] = relu,
                 norm_first: bool = True):
        super().__init__()
        mlp_dims = mlp_dims or dims * 4
        self.self_attention = MultiHeadAttention(dims, num_heads)
        self.cross_attention = MultiHeadAttention(dims, num_heads)
        self.ln1 = LayerNorm(dims)
        self.ln2 = LayerNorm(dims)
        self.ln3 = LayerNorm(dims)
        self.linear1 = Linear(dims, mlp_dims)
        self.linear2 = Linear(mlp_dims, dims)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)
        self.activation = activation
        self.norm_first = norm_first

    def _mlp(self, x):
        return self.linear2(self.dropout3(self.activation(self.linear1(x))))

    def __call__(self, x, memory, x_mask, memory_mask):
        if self.norm_first:
            y = self.ln1(x)
            x = x + self.dropout1(self.self_attention(y, y, y, x_mask))
            y = self.ln2(x)
            x = x + self.dropout2(self.cross_attention(y, memory, memory, memory_mask))
            return x + self._mlp(self.ln3(x))
        x = self.ln1(x + self.dropout1(self.self_attention(x, x, x, x_mask)))
        x = self.ln2(x + self.dropout2(self.cross_attention(x, memory, memory, memory_mask)))
        return self.ln3(x + self._mlp(x))


class TransformerDecoder(Module):
    """``num_layers`` :class:`TransformerDecoderLayer` then a ``LayerNorm`` ``ln``. Call as
    ``decoder(x, memory, x_mask, memory_mask)``."""

    def __init__(self, num_layers: int, dims: int, num_heads: int,
                 mlp_dims: Optional[int] = None, dropout: float = 0.0, activation=relu,
                 norm_first: bool = True, checkpoint: bool = False):
        super().__init__()
        self.layers = [TransformerDecoderLayer(dims, num_heads, mlp_dims, dropout, activation,
                                               norm_first) for _ in range(num_layers)]
        self.ln = LayerNorm(dims)
        self.checkpoint = checkpoint

    def __call__(self, x, memory, x_mask, memory_mask):
        for layer in self.layers:
            x = (_checkpoint(layer) if self.checkpoint else layer)(x, memory, x_mask,
                                                                    memory_mask)
        return self.ln(x)


class Transformer(Module):
    """An encoder-decoder transformer (Vaswani et al.): ``encoder`` then ``decoder``.

    Args:
        dims (int, optional): the model width. Default: ``512``.
        num_heads (int, optional): attention heads. Default: ``8``.
        num_encoder_layers, num_decoder_layers (int, optional): stack depths.
            Default: ``6`` each.
        mlp_dims (int, optional): MLP hidden width. Default: ``4 * dims``.
        dropout (float, optional): dropout probability. Default: ``0.0``.
        activation (callable, optional): MLP activation. Default: ``relu``.
        custom_encoder, custom_decoder (Module, optional): replace the stacks.
        norm_first (bool, optional): pre-norm layers. Default: ``True``.
        checkpoint (bool, optional): recompute activations in the backward pass.
            Default: ``False``.

    Call as ``transformer(src, tgt, src_mask, tgt_mask, memory_mask)``.
    """

    def __init__(self, dims: int = 512, num_heads: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, mlp_dims: Optional[int] = None,
                 dropout: float = 0.0, activation: Callable[[Any], Any] = relu,
                 custom_encoder: Optional[Any] = None, custom_decoder: Optional[Any] = None,
                 norm_first: bool = True, checkpoint: bool = False):
        super().__init__()
        self.encoder = custom_encoder or TransformerEncoder(
            num_encoder_layers, dims, num_heads, mlp_dims, dropout, activation, norm_first,
            checkpoint)
        self.decoder = custom_decoder or TransformerDecoder(
            num_decoder_layers, dims, num_heads, mlp_dims, dropout, activation, norm_first,
            checkpoint)

    def __call__(self, src, tgt, src_mask, tgt_mask, memory_mask):
        memory = self.encoder(src, src_mask)
        return self.decoder(tgt, memory, tgt_mask, memory_mask)
