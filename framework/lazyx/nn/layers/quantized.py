"""Quantized layers: ``QuantizedLinear`` and ``QuantizedEmbedding`` (weights stored
quantized, on ``mx.quantize`` / ``mx.quantized_matmul`` / ``mx.dequantize``) and
``QQLinear`` (inputs quantized too, on ``mx.qqmm``).

Parameters as MLX: the packed ``weight`` (``uint32``), ``scales``, ``biases`` (affine
mode only) and the layer ``bias``; ``QuantizedLinear`` and ``QuantizedEmbedding`` are
frozen at construction (no gradient to packed integers). ``from_linear`` and
``from_embedding`` quantize an existing float layer; ``nn.quantize`` uses them through
``Linear.to_quantized``.
"""

from __future__ import annotations

import math
from typing import Optional

import lazyx.core as mx
from lazyx.errors import ArgumentError

from ._checks import check_features
from .base import Module

__all__ = ["QuantizedLinear", "QuantizedEmbedding", "QQLinear"]

# mode -> (default group_size, default bits), as mx.quantize chooses them.
_MODE_DEFAULTS = {"affine": (64, 4), "mxfp4": (32, 4), "nvfp4": (16, 4), "mxfp8": (32, 8)}


def _defaults(layer: str, mode: str, group_size, bits) -> tuple:
    if mode not in _MODE_DEFAULTS:
        raise ArgumentError(f"[{layer}] unknown quantization mode {mode!r}; use one of "
                            f"{sorted(_MODE_DEFAULTS)}.")
    g, b = _MODE_DEFAULTS[mode]
    return group_size or g, bits or b


class _Quantized(Module):
    """Storage shared by the layers holding a quantized ``weight``."""

    def _store(self, weight) -> None:
        """Quantize ``weight`` into ``weight``, ``scales`` and (affine) ``biases``."""
        packed, scales, *biases = mx.quantize(weight, self.group_size, self.bits,
                                              mode=self.mode)
        self.weight, self.scales = packed, scales
        if biases and biases[0] is not None:
            self.biases = biases[0]
        elif "biases" in self:
            del self["biases"]

    @property
    def _input_dims(self) -> int:
        return self["weight"].shape[1] * 32 // self.bits

    def _quantized_args(self) -> dict:
        return dict(group_size=self.group_size, bits=self.bits, mode=self.mode)


class QuantizedLinear(_Quantized):
    r"""An affine layer ``y = x W^T + b`` with a quantized ``W``.

    Args:
        input_dims (int): input features.
        output_dims (int): output features.
        bias (bool, optional): add a (float) bias. Default: ``True``.
        group_size (int, optional): elements sharing one scale. Default: the mode's
            (64 for ``affine``).
        bits (int, optional): bits per weight. Default: the mode's (4 for ``affine``).
        mode (str, optional): ``"affine"``, ``"mxfp4"``, ``"nvfp4"`` or ``"mxfp8"``.
            Default: ``"affine"``.
    """

    def __init__(self, input_dims: int, output_dims: int, bias: bool = True,
                 group_size: Optional[int] = None, bits: Optional[int] = None,
                 mode: str = "affine"):
        super().__init__()
        self.group_size, self.bits = _defaults("QuantizedLinear", mode, group_size, bits)
        self.mode = mode
        scale = math.sqrt(1 / input_dims)
        self._store(mx.random.uniform(low=-scale, high=scale, shape=(output_dims, input_dims)))
        if bias:
            self.bias = mx.zeros((output_dims,))
        self.freeze()

    def _extra_repr(self) -> str:
        return (f"input_dims={self._input_dims}, output_dims={self['weight'].shape[0]}, "
                f"bias={'bias' in self}, group_size={self.group_size}, bits={self.bits}, "
                f"mode={self.mode}")

    def __call__(self, x):
        check_features(self, x, self._input_dims, "weight (unpacked)",
                       (self["weight"].shape[0], self._input_dims))
        y = mx.quantized_matmul(x, self["weight"], scales=self["scales"],
                                biases=self.get("biases"), transpose=True,
                                **self._quantized_args())
        if "bias" in self:
            y = y + self["bias"]
        return y

    @classmethod
    def from_linear(cls, linear_layer: Module, group_size: Optional[int] = None,
                    bits: Optional[int] = None, mode: str = "affine") -> "QuantizedLinear":
        """A ``QuantizedLinear`` holding ``linear_layer``'s weight quantized and its bias."""
        output_dims, input_dims = linear_layer.weight.shape
        layer = cls(input_dims, output_dims, False, group_size, bits, mode=mode)
        layer._store(linear_layer.weight)
        if "bias" in linear_layer:
            layer.bias = linear_layer.bias
        layer.freeze()
        return layer


class QuantizedEmbedding(_Quantized):
    """An embedding table stored quantized; a lookup dequantizes the rows it reads.

    Args:
        num_embeddings (int): rows of the table.
        dims (int): features per row.
        group_size, bits, mode: as :class:`QuantizedLinear`.

    ``as_linear(x)`` multiplies by the transposed table (tied output embeddings).
    """

    def __init__(self, num_embeddings: int, dims: int, group_size: Optional[int] = None,
                 bits: Optional[int] = None, mode: str = "affine"):
        super().__init__()
        self.group_size, self.bits = _defaults("QuantizedEmbedding", mode, group_size, bits)
        self.mode = mode
        scale = math.sqrt(1 / dims)
        self._store(mx.random.normal(shape=(num_embeddings, dims), scale=scale))
        self.num_embeddings = num_embeddings
        self.dims = dims
        self.freeze()

    def _extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.dims}, group_size={self.group_size}, "
                f"bits={self.bits}, mode={self.mode}")

    def __call__(self, x):
        biases = self.get("biases")
        return mx.dequantize(self["weight"][x], scales=self["scales"][x],
                             biases=None if biases is None else biases[x],
                             **self._quantized_args())

    def as_linear(self, x):
        """``x @ table.T`` with the quantized table (e.g. the output projection of a
        language model that ties its embeddings)."""
        check_features(self, x, self.dims, "dims")
        return mx.quantized_matmul(x, self["weight"], scales=self["scales"],
                                   biases=self.get("biases"), transpose=True,
                                   **self._quantized_args())

    @classmethod
    def from_embedding(cls, embedding_layer: Module, group_size: Optional[int] = None,
                       bits: Optional[int] = None, mode: str = "affine") -> "QuantizedEmbedding":
        """A ``QuantizedEmbedding`` holding ``embedding_layer``'s table quantized."""
        num_embeddings, dims = embedding_layer.weight.shape
        layer = cls(num_embeddings, dims, group_size, bits, mode=mode)
        layer._store(embedding_layer.weight)
        layer.freeze()
        return layer


class QQLinear(_Quantized):
    """A linear layer (no bias) that quantizes its input as well as its weight
    (``mx.qqmm``): ``y = q(x) q(W)^T``.

    In training mode the weight is kept in floating point and quantized on the fly, so
    it receives gradients; ``eval()`` stores it quantized (``weight`` packed, ``scales``)
    and ``train()`` dequantizes it back.

    Args:
        input_dims (int): input features.
        output_dims (int): output features.
        group_size, bits: as :class:`QuantizedLinear` (the mode's defaults).
        mode (str, optional): ``"nvfp4"`` or ``"mxfp8"``. Default: ``"nvfp4"``.
    """

    def __init__(self, input_dims: int, output_dims: int, group_size: Optional[int] = None,
                 bits: Optional[int] = None, mode: str = "nvfp4"):
        super().__init__()
        self.group_size, self.bits = _defaults("QQLinear", mode, group_size, bits)
        self.mode = mode
        scale = math.sqrt(1 / input_dims)
        self.weight = mx.random.uniform(low=-scale, high=scale, shape=(output_dims, input_dims))
        self._quantized = False

    def _extra_repr(self) -> str:
        in_dims = self._input_dims if self._quantized else self["weight"].shape[1]
        return (f"input_dims={in_dims}, output_dims={self['weight'].shape[0]}, "
                f"group_size={self.group_size}, bits={self.bits}, mode={self.mode}")

    def quantize(self) -> None:
        """Store the weight quantized (done by ``eval()``)."""
        if not self._quantized:
            self._store(self["weight"])
            self._quantized = True

    def dequantize(self) -> None:
        """Store the weight in floating point again (done by ``train()``)."""
        if self._quantized:
            self.weight = mx.dequantize(self["weight"], scales=self["scales"],
                                        biases=self.get("biases"), **self._quantized_args())
            del self["scales"]
            self._quantized = False

    def _set_training_mode(self, mode: bool) -> None:
        super()._set_training_mode(mode)
        if mode:
            self.dequantize()
        else:
            self.quantize()

    def __call__(self, x):
        in_dims = self._input_dims if self._quantized else self["weight"].shape[1]
        check_features(self, x, in_dims, "weight")
        return mx.qqmm(x, self["weight"], scales=self.get("scales"), **self._quantized_args())

    @classmethod
    def from_linear(cls, linear_layer: Module, group_size: Optional[int] = None,
                    bits: Optional[int] = None, mode: str = "nvfp4") -> "QQLinear":
        """A ``QQLinear`` with ``linear_layer``'s weight, in ``linear_layer``'s mode
        (quantized if it is in evaluation mode)."""
        output_dims, input_dims = linear_layer.weight.shape
        layer = cls(input_dims, output_dims, group_size, bits, mode=mode)
        layer.weight = linear_layer.weight
        layer.train(linear_layer.training)
        return layer
