"""``Embedding``: a lookup table of vectors (``mlx.nn.Embedding``)."""

from __future__ import annotations

import math
from typing import Optional

import lazyx.core as mx

from .base import Module

__all__ = ["Embedding"]


class Embedding(Module):
    r"""Map integer indices to ``dims``-long vectors: :math:`y = W[x]`.

    ``W`` has shape ``(num_embeddings, dims)`` and starts normal with standard
    deviation :math:`1/\sqrt{\text{dims}}`.

    Args:
        num_embeddings (int): How many indices the table holds.
        dims (int): The length of each vector.
    """

    def __init__(self, num_embeddings: int, dims: int):
        super().__init__()
        scale = math.sqrt(1.0 / dims)
        self.weight = mx.random.normal(shape=(num_embeddings, dims), scale=scale)

    def _extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, {self.weight.shape[1]}"

    def __call__(self, x):
        return self.weight[x]

    def as_linear(self, x):
        """Use the table as a linear layer: :math:`x W^\\top` (tied input/output embeddings)."""
        return x @ self.weight.T

    def to_quantized(self, group_size: Optional[int] = None, bits: Optional[int] = None,
                     mode: str = "affine", quantize_input: bool = False):
        """This layer as a ``QuantizedEmbedding`` (the input is indices: ``quantize_input``
        does not apply)."""
        from . import quantized  # written beside the layers; imported on first use (start-up cost)

        return quantized.QuantizedEmbedding.from_embedding(self, group_size, bits, mode=mode)
