"""Transposed convolution layers: ``ConvTranspose1d/2d/3d`` on ``mx.conv_transpose1d/2d/3d``.

The gradient of a convolution with respect to its input, used to upsample. Inputs are
channels-last; the weight is ``(out_channels, *kernel_size, in_channels)`` as in MLX, so
saved MLX weights load. Initialisation as the convolutions: uniform in
``±sqrt(1 / (in_channels * prod(kernel_size)))``, bias zero.
"""

from __future__ import annotations


import lazyx.core as mx

from ._checks import check_features
from .convolution import _tuple, init_kernel
from .base import Module

__all__ = ["ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"]


class _ConvTranspose(Module):
    """Shared construction for the transposed convolutions of spatial rank ``_ndim``."""

    _ndim = 1

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, output_padding=0, bias: bool = True):
        super().__init__()
        n = self._ndim
        if n > 1:  # the 2-D and 3-D layers store tuples, as MLX (it shows in their repr)
            kernel_size, stride, padding, output_padding = (
                _tuple(kernel_size, n), _tuple(stride, n), _tuple(padding, n),
                _tuple(output_padding, n))
        init_kernel(self, in_channels, out_channels, _tuple(kernel_size, n), in_channels, bias)
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self.dilation = dilation
        self.output_padding = output_padding

    def _extra_repr(self) -> str:
        return (f"{self.weight.shape[-1]}, {self.weight.shape[0]}, "
                f"kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, "
                f"output_padding={self.output_padding}, bias={'bias' in self}")

    def __call__(self, x):
        check_features(self, x, self.weight.shape[-1], "weight", self.weight.shape)
        y = self._conv(x, self.weight, self.stride, self.padding, self.dilation,
                       self.output_padding)
        if "bias" in self:
            y = y + self.bias
        return y


class ConvTranspose1d(_ConvTranspose):
    r"""A 1-dimensional transposed convolution over inputs of shape ``(N, L, C_in)``.

    The output length is ``(L - 1) * stride - 2 * padding + dilation * (kernel_size - 1)
    + output_padding + 1``.

    Args:
        in_channels (int): input channels ``C_in``.
        out_channels (int): output channels ``C_out``.
        kernel_size (int): size of the kernel.
        stride (int, optional): upsampling stride. Default: ``1``.
        padding (int, optional): padding removed from both sides. Default: ``0``.
        dilation (int, optional): spacing of the kernel taps. Default: ``1``.
        output_padding (int, optional): extra size added on one side. Default: ``0``.
        bias (bool, optional): add a learned bias. Default: ``True``.
    """

    _ndim = 1
    _conv = staticmethod(mx.conv_transpose1d)


class ConvTranspose2d(_ConvTranspose):
    """A 2-dimensional transposed convolution over ``(N, H, W, C_in)``; arguments as
    :class:`ConvTranspose1d`, each an int or a pair."""

    _ndim = 2
    _conv = staticmethod(mx.conv_transpose2d)


class ConvTranspose3d(_ConvTranspose):
    """A 3-dimensional transposed convolution over ``(N, D, H, W, C_in)``; arguments as
    :class:`ConvTranspose1d`, each an int or a triple."""

    _ndim = 3
    _conv = staticmethod(mx.conv_transpose3d)
