"""Pooling layers: ``MaxPool1d/2d/3d`` and ``AvgPool1d/2d/3d``, as MLX builds them.

The flow of a call: pad the spatial axes with the pooling's neutral value (``-inf`` for
max, ``0`` for average — so padded zeros count in an average, as in MLX), view the
input as sliding windows with ``mx.as_strided`` (shape ``(N, *out_spatial,
*kernel_size, C)``, no copy), then reduce the window axes with ``mx.max`` or
``mx.mean``. Inputs are channels-last ``(N, *spatial, C)``; the stride defaults to the
kernel size. Autodiff goes through ``as_strided``'s rule, so no pooling primitive is
needed.

Windows that do not overlap (stride = kernel size, the default) are a reshape instead:
``(N, o1 * k1, ..., C)`` as ``(N, o1, k1, ..., C)``, reduced over the ``k`` axes. Same
values and gradients, but the backward pass is a reshape, where ``as_strided``'s is a
scatter-add into the whole input (most of a small CNN's step: 70 of 310 ms).
"""

from __future__ import annotations

import math

import lazyx.core as mx
from lazyx.errors import ArgumentError, ShapeError

from .base import Module

__all__ = ["MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d"]


def _sliding_windows(x, window_shape: tuple, window_strides: tuple):
    """View ``x`` of shape ``(N, *spatial, C)`` as ``(N, *out_spatial, *window_shape, C)``."""
    if x.ndim < 3:
        raise ShapeError(
            f"To extract sliding windows at least 1 spatial dimension (3 total) is needed but "
            f"the input only has {x.ndim} dimensions (shape {tuple(x.shape)}).")
    spatial = x.shape[1:-1]
    if not len(spatial) == len(window_shape) == len(window_strides):
        raise ShapeError(
            f"To extract sliding windows the window shape {window_shape} and strides "
            f"{window_strides} need one entry per spatial dimension of the input of shape "
            f"{tuple(x.shape)} ({len(spatial)}).")
    # Row-major element strides of x: strides[i] = prod(shape[i+1:]).
    strides = [math.prod(x.shape[i + 1:]) for i in range(x.ndim)]
    out = tuple((size - window) // step + 1
                for size, window, step in zip(spatial, window_shape, window_strides))
    shape = (x.shape[0], *out, *window_shape, x.shape[-1])
    view_strides = (strides[0], *(s * step for s, step in zip(strides[1:-1], window_strides)),
                    *strides[1:-1], strides[-1])
    return mx.as_strided(x, shape, view_strides)


def _tiles(x, window_shape: tuple):
    """Non-overlapping windows of ``x`` of shape ``(N, *spatial, C)``: the view
    ``(N, o1, k1, o2, k2, ..., C)`` (a trailing remainder of a spatial axis dropped, as
    the strided windows drop it) and its window axes ``(2, 4, ...)``."""
    out = tuple(size // k for size, k in zip(x.shape[1:-1], window_shape))
    if any(o * k != size for o, k, size in zip(out, window_shape, x.shape[1:-1])):
        x = x[(slice(None), *(slice(0, o * k) for o, k in zip(out, window_shape)))]
    shape = (x.shape[0], *(d for o, k in zip(out, window_shape) for d in (o, k)), x.shape[-1])
    return x.reshape(shape), tuple(range(2, 2 * len(out) + 1, 2))


def _as_tuple(name: str, layer: str, value, n: int) -> tuple:
    if isinstance(value, int):
        return (value,) * n
    value = tuple(value)
    if len(value) != n or not all(isinstance(v, int) for v in value):
        raise ArgumentError(f"[{layer}] {name} must be an int or a tuple of {n} ints; "
                            f"got {value!r}.")
    return value


class _Pool(Module):
    """Pad, view as windows, reduce: the whole of every pooling layer."""

    _ndim = 1

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        name, n = type(self).__name__, self._ndim
        self._kernel_size = _as_tuple("kernel_size", name, kernel_size, n)
        self._stride = (self._kernel_size if stride is None
                        else _as_tuple("stride", name, stride, n))
        self._padding = _as_tuple("padding", name, 0 if padding is None else padding, n)
        self._axes = tuple(range(-n - 1, -1))

    def _extra_repr(self) -> str:
        return (f"kernel_size={self._kernel_size}, stride={self._stride}, "
                f"padding={self._padding}")

    def __call__(self, x):
        if x.ndim == self._ndim + 2:
            padded = tuple(s + 2 * p for s, p in zip(x.shape[1:-1], self._padding))
            if any(s < k for s, k in zip(padded, self._kernel_size)):
                raise ShapeError(
                    f"[{type(self).__name__}] kernel_size {self._kernel_size} is larger than "
                    f"the padded spatial shape {padded} of the input of shape "
                    f"{tuple(x.shape)} (padding {self._padding}).")
        if any(p > 0 for p in self._padding):
            x = mx.pad(x, [(0, 0)] + [(p, p) for p in self._padding] + [(0, 0)],
                       constant_values=self._padding_value)
        if self._stride == self._kernel_size and x.ndim == self._ndim + 2:
            return self._reduce(*_tiles(x, self._kernel_size))
        windows = _sliding_windows(x, self._kernel_size, self._stride)
        return self._reduce(windows, self._axes)


class _MaxPool(_Pool):
    _padding_value = -float("inf")
    _reduce = staticmethod(mx.max)


class _AvgPool(_Pool):
    _padding_value = 0
    _reduce = staticmethod(mx.mean)


_MAX_DOC = r"""{n}-dimensional max pooling over inputs of shape ``(N, {axes}, C)``.

    .. math:: y(n, {idx}, c) = \max_{{\text{{window}}}} x(n, \text{{stride}} \cdot {idx}
        + \text{{offset}}, c)

    Args:
        kernel_size (int or tuple): the window size.
        stride (int or tuple, optional): the window step. Default: ``kernel_size``.
        padding (int or tuple, optional): ``-inf`` padding on both sides of each spatial
            axis. Default: ``0``.
    """

_AVG_DOC = r"""{n}-dimensional average pooling over inputs of shape ``(N, {axes}, C)``.

    The mean over each window; zero padding counts in the mean, as in MLX.

    Args:
        kernel_size (int or tuple): the window size.
        stride (int or tuple, optional): the window step. Default: ``kernel_size``.
        padding (int or tuple, optional): zero padding on both sides of each spatial
            axis. Default: ``0``.
    """


class MaxPool1d(_MaxPool):
    __doc__ = _MAX_DOC.format(n=1, axes="L", idx="l")
    _ndim = 1


class MaxPool2d(_MaxPool):
    __doc__ = _MAX_DOC.format(n=2, axes="H, W", idx="(h, w)")
    _ndim = 2


class MaxPool3d(_MaxPool):
    __doc__ = _MAX_DOC.format(n=3, axes="D, H, W", idx="(d, h, w)")
    _ndim = 3


class AvgPool1d(_AvgPool):
    __doc__ = _AVG_DOC.format(n=1, axes="L")
    _ndim = 1


class AvgPool2d(_AvgPool):
    __doc__ = _AVG_DOC.format(n=2, axes="H, W")
    _ndim = 2


class AvgPool3d(_AvgPool):
    __doc__ = _AVG_DOC.format(n=3, axes="D, H, W")
    _ndim = 3
