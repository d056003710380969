"""Dropout layers: ``Dropout``, ``Dropout2d``, ``Dropout3d`` (``mlx.nn.layers.dropout``).

In training mode each zeroes entries with probability ``p`` and scales the kept ones
by ``1 / (1 - p)`` so the expectation is unchanged; in evaluation mode (``.eval()``)
they return the input. The mask comes from ``mx.random.bernoulli(1 - p, shape)``, so a
seeded run draws the same mask as MLX. The 2-D/3-D forms drop whole channels: their
mask has size 1 on the spatial axes.
"""

from __future__ import annotations

import lazyx.core as mx
from lazyx.errors import ArgumentError, ShapeError

from .base import Module

__all__ = ["Dropout", "Dropout2d", "Dropout3d"]


class _Dropout(Module):
    """Shared construction and call; subclasses say which axes share one mask entry."""

    #: Accepted input ranks (None: any) and the axes (from the end) the mask spans as 1.
    _ranks: tuple = ()
    _shared_axes: tuple = ()
    _layout: str = ""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0 <= p < 1:
            raise ArgumentError(
                f"[{type(self).__name__}] the dropout probability p={p} is not in [0, 1)")
        self._p_1 = 1 - p

    def _extra_repr(self) -> str:
        return f"p={1 - self._p_1}"

    def __call__(self, x):
        if self._ranks and x.ndim not in self._ranks:
            raise ShapeError(
                f"[{type(self).__name__}] received an input of shape {tuple(x.shape)} with "
                f"{x.ndim} dimensions; expected {' or '.join(map(str, self._ranks))} "
                f"dimensions ({self._layout})")
        if self._p_1 == 1 or not self.training:
            return x
        mask_shape = list(x.shape)
        for axis in self._shared_axes:
            mask_shape[axis] = 1
        mask = mx.random.bernoulli(self._p_1, mask_shape)
        return (mask * x) * (1 / self._p_1)


class Dropout(_Dropout):
    r"""Zero each entry with probability ``p`` during training, scaling the rest by
    :math:`\frac{1}{1-p}`.

    Args:
        p (float): The probability of zeroing an entry. Default: ``0.5``.
    """


class Dropout2d(_Dropout):
    r"""Zero whole channels of a ``NHWC`` (or ``HWC``) input with probability ``p`` during
    training, scaling the rest by :math:`\frac{1}{1-p}`.

    Args:
        p (float): The probability of zeroing a channel. Default: ``0.5``.
    """

    _ranks = (3, 4)
    _shared_axes = (-2, -3)
    _layout = "NHWC or HWC"


class Dropout3d(_Dropout):
    r"""Zero whole channels of a ``NDHWC`` (or ``DHWC``) input with probability ``p``
    during training, scaling the rest by :math:`\frac{1}{1-p}`.

    Args:
        p (float): The probability of zeroing a channel. Default: ``0.5``.
    """

    _ranks = (4, 5)
    _shared_axes = (-2, -3, -4)
    _layout = "NDHWC or DHWC"
