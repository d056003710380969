"""Affine layers: ``Identity``, ``Linear``, ``Bilinear`` (``mlx.nn.layers.linear``).

Weights are stored ``(output_dims, input_dims)`` as in MLX and PyTorch, so saved
weights load unchanged; they start uniform in ``±sqrt(1 / input_dims)`` (``input1_dims``
for ``Bilinear``), drawn weight first then bias, the same random stream as MLX's.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import lazyx.core as mx

from ._checks import check_features
from .base import Module

__all__ = ["Identity", "Linear", "Bilinear"]


class Identity(Module):
    """A placeholder layer that returns its input; its arguments are ignored."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def __call__(self, x):
        return x


class Linear(Module):
    r"""An affine transformation of the last axis: :math:`y = x W^\top + b`.

    ``W`` has shape ``(output_dims, input_dims)`` and ``b`` shape ``(output_dims,)``; both
    start uniform in :math:`[-k, k]` with :math:`k = 1 / \sqrt{D_i}`.

    Args:
        input_dims (int): The size of the input's last axis :math:`D_i`.
        output_dims (int): The size of the output's last axis :math:`D_o`.
        bias (bool): Whether to add ``b``. Default: ``True``.
    """

    def __init__(self, input_dims: int, output_dims: int, bias: bool = True) -> None:
        super().__init__()
        scale = math.sqrt(1.0 / input_dims)
        self.weight = mx.random.uniform(low=-scale, high=scale, shape=(output_dims, input_dims))
        if bias:
            self.bias = mx.random.uniform(low=-scale, high=scale, shape=(output_dims,))

    def _extra_repr(self) -> str:
        return (f"input_dims={self.weight.shape[1]}, output_dims={self.weight.shape[0]}, "
                f"bias={'bias' in self}")

    def __call__(self, x):
        check_features(self, x, self.weight.shape[1], "weight", self.weight.shape)
        if "bias" in self:
            return mx.addmm(self["bias"], x, self["weight"].T)
        return x @ self["weight"].T

    def to_quantized(self, group_size: Optional[int] = None, bits: Optional[int] = None,
                     mode: str = "affine", quantize_input: bool = False):
        """This layer as a ``QuantizedLinear`` (``QQLinear`` with ``quantize_input``)."""
        from . import quantized  # written beside the layers; imported on first use (start-up cost)

        cls = quantized.QQLinear if quantize_input else quantized.QuantizedLinear
        return cls.from_linear(self, group_size, bits, mode=mode)


class Bilinear(Module):
    r"""A bilinear form of two inputs: :math:`y_o = x_1^\top W_o x_2 + b_o`.

    ``W`` has shape ``(output_dims, input2_dims, input1_dims)`` and ``b`` shape
    ``(output_dims,)``; both start uniform in :math:`[-k, k]`, :math:`k = 1/\sqrt{D_1}`.

    Args:
        input1_dims (int): The size of ``x1``'s last axis :math:`D_1`.
        input2_dims (int): The size of ``x2``'s last axis :math:`D_2`.
        output_dims (int): The size of the output's last axis.
        bias (bool): Whether to add ``b``. Default: ``True``.
    """

    def __init__(self, input1_dims: int, input2_dims: int, output_dims: int,
                 bias: bool = True) -> None:
        super().__init__()
        scale = math.sqrt(1.0 / input1_dims)
        self.weight = mx.random.uniform(low=-scale, high=scale,
                                        shape=(output_dims, input2_dims, input1_dims))
        if bias:
            self.bias = mx.random.uniform(low=-scale, high=scale, shape=(output_dims,))

    def _extra_repr(self) -> str:
        out, in2, in1 = self.weight.shape
        return f"input1_dims={in1}, input2_dims={in2}, output_dims={out}, bias={'bias' in self}"

    def __call__(self, x1, x2):
        out, in2, in1 = self.weight.shape
        check_features(self, x1, in1, "weight", self.weight.shape)
        check_features(self, x2, in2, "weight", self.weight.shape)
        lead = x1.shape[:-1]
        # (N, in1) @ (in1, out*in2) then contract in2 with x2: two matmuls, no (N, out, in2, in1).
        y = x1.reshape(-1, in1) @ self.weight.reshape(out * in2, in1).T
        y = y.reshape(-1, out, in2).swapaxes(-2, -1)
        y = (x2.reshape(-1, 1, in2) @ y).squeeze(1)
        if "bias" in self:
            y = y + self.bias
        return y.reshape(*lead, out)
