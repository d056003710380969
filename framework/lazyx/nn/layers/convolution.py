"""Convolution layers: ``Conv1d``, ``Conv2d``, ``Conv3d`` on ``mx.conv1d/2d/3d``.

Inputs are channels-last as in MLX (``NLC``, ``NHWC``, ``NDHWC``); the weight is
``(out_channels, *kernel_size, in_channels // groups)`` and the bias ``(out_channels,)``,
so weights saved by MLX load unchanged. Weights start uniform in ``±sqrt(1 / fan_in)``
with ``fan_in = in_channels * prod(kernel_size)``; the bias starts at zero.

One private base, :class:`_Conv`, holds the construction and the call; each public class
only names its spatial rank and the op it calls.
"""

from __future__ import annotations

import math

import lazyx.core as mx
from lazyx.errors import ArgumentError

from ._checks import check_features
from .base import Module

__all__ = ["Conv1d", "Conv2d", "Conv3d"]


def _tuple(value, n: int) -> tuple:
    return (value,) * n if isinstance(value, int) else tuple(value)


def init_kernel(layer: Module, in_channels: int, out_channels: int, ksize: tuple,
                weight_channels: int, bias: bool) -> None:
    """``layer.weight`` ``(out_channels, *ksize, weight_channels)`` uniform in
    ``±sqrt(1 / (in_channels * prod(ksize)))`` and ``layer.bias`` zeros when ``bias``:
    the convolutions' and the transposed convolutions' initialisation (MLX's)."""
    scale = math.sqrt(1.0 / (in_channels * math.prod(ksize)))
    layer.weight = mx.random.uniform(low=-scale, high=scale,
                                     shape=(out_channels, *ksize, weight_channels))
    if bias:
        layer.bias = mx.zeros((out_channels,))


class _Conv(Module):
    """Shared construction for the convolutions of one spatial rank ``_ndim``."""

    _ndim = 1

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=True):
        super().__init__()
        n = self._ndim
        if in_channels % groups != 0:
            raise ArgumentError(
                f"[{type(self).__name__}] in_channels ({in_channels}) must be divisible by "
                f"groups ({groups}).")
        # Conv1d keeps its integer arguments as given; the 2-D and 3-D layers store tuples,
        # as MLX does (it shows in their repr).
        if n > 1:
            kernel_size, stride, padding = (_tuple(kernel_size, n), _tuple(stride, n),
                                            _tuple(padding, n))
        init_kernel(self, in_channels, out_channels, _tuple(kernel_size, n),
                    in_channels // groups, bias)
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self.dilation = dilation
        self.groups = groups

    # Conv3d takes no ``groups`` (as MLX) and so does not show it.
    _has_groups = True

    def _extra_repr(self) -> str:
        groups = f"groups={self.groups}, " if self._has_groups else ""
        return (f"{self.weight.shape[-1] * self.groups}, {self.weight.shape[0]}, "
                f"kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, {groups}"
                f"bias={'bias' in self}")

    def __call__(self, x):
        check_features(self, x, self.weight.shape[-1] * self.groups, "weight", self.weight.shape)
        y = self._conv(x, self.weight, self.stride, self.padding, self.dilation, self.groups)
        if "bias" in self:
            y = y + self.bias
        return y


class Conv1d(_Conv):
    r"""A 1-dimensional convolution over inputs of shape ``(N, L, C_in)``.

    .. math:: y = \mathrm{conv1d}(x, W) + b

    Args:
        in_channels (int): input channels ``C_in``.
        out_channels (int): output channels ``C_out``.
        kernel_size (int): size of the kernel.
        stride (int, optional): stride of the window. Default: ``1``.
        padding (int, optional): zeros added on both sides. Default: ``0``.
        dilation (int, optional): spacing of the kernel taps. Default: ``1``.
        groups (int, optional): channel groups. Default: ``1``.
        bias (bool, optional): add a learned bias. Default: ``True``.
    """

    _ndim = 1
    _conv = staticmethod(mx.conv1d)


class Conv2d(_Conv):
    r"""A 2-dimensional convolution over inputs of shape ``(N, H, W, C_in)``.

    Same arguments as :class:`Conv1d`; ``kernel_size``, ``stride`` and ``padding`` may be
    an int (for both axes) or a pair.
    """

    _ndim = 2
    _conv = staticmethod(mx.conv2d)


class Conv3d(_Conv):
    r"""A 3-dimensional convolution over inputs of shape ``(N, D, H, W, C_in)``.

    Same arguments as :class:`Conv2d` with triples, and no ``groups`` (as MLX).
    """

    _ndim = 3
    _has_groups = False

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, bias: bool = True):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         1, bias)

    _conv = staticmethod(mx.conv3d)
