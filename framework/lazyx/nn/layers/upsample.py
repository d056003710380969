"""Spatial upsampling: the ``Upsample`` layer and the functions ``upsample_nearest``,
``upsample_linear``, ``upsample_cubic``.

Inputs are channels-last ``(N, *spatial, C)``; each spatial axis of size ``n`` with scale
``s`` becomes ``int(s * n)`` long. The flow, per spatial axis:

* nearest: an integer scale repeats each element (broadcast + reshape, no gather);
  otherwise a gather at the nearest source index.
* linear / cubic: the output coordinates are mapped to fractional source coordinates
  (``align_corners`` pins the corners to each other, else the pixel centres), and the
  result is a sum over the 2 (linear) or 4 (cubic, Keys kernel ``a = -0.75``) neighbours
  on every axis of ``weight * gather`` — separable, so bilinear and bicubic are products.
* ``antialias=True``: per axis, a dense ``(out, in)`` filter matrix applied with a
  matmul: the kernel (triangle, or Keys with ``a = -0.5``) centred on the same source
  coordinates, stretched by ``1 / scale`` when downsampling, cut at the borders and
  normalised (PyTorch's ``antialias=True`` filter for integer ratios).

The coordinate rules are MLX's, so the numbers match ``mlx.nn.Upsample``.
"""

from __future__ import annotations

import operator
from functools import reduce
from itertools import product

import numpy as np

import lazyx.core as mx
from lazyx.errors import ArgumentError, ShapeError

from .base import Module

__all__ = ["Upsample", "upsample_nearest", "upsample_linear", "upsample_cubic"]


def _axis_shape(ndims: int, axis: int) -> list:
    shape = [1] * ndims
    shape[axis] = -1
    return shape


def _scaled_coordinates(n: int, scale: float, align_corners: bool, axis: int, ndims: int):
    """Source coordinates of the ``int(scale * n)`` outputs along one axis."""
    m = int(scale * n)
    if align_corners:
        coords = mx.arange(m, dtype=mx.float32) * ((n - 1) / max(m - 1, 1))
    else:
        step = 1 / scale
        start = ((m - 1) * step - n + 1) / 2
        coords = mx.arange(m, dtype=mx.float32) * step - start
    return coords.reshape(_axis_shape(ndims, axis))


def _nearest_indices(n: int, scale: float, axis: int, ndims: int):
    m = int(scale * n)
    coords = mx.arange(m, dtype=mx.float32)
    if m > n:  # centre-aligned and rounded when enlarging, floor when shrinking (MLX)
        coords = mx.round((coords + 0.5) * (n / m) - 0.5)
    else:
        coords = mx.floor(coords * (n / m))
    return mx.clip(coords, 0, n - 1).astype(mx.int32).reshape(_axis_shape(ndims, axis))


def _linear_taps(n: int, scale: float, align_corners: bool, axis: int, ndims: int):
    coords = mx.clip(_scaled_coordinates(n, scale, align_corners, axis, ndims), 0, n - 1)
    left, right = mx.floor(coords), mx.ceil(coords)
    weight = mx.expand_dims(coords - left, -1)
    return ((left.astype(mx.int32), 1 - weight), (right.astype(mx.int32), weight))


def _cubic_weight(distance, a: float):
    """Keys' cubic convolution kernel at ``|distance|`` (0..2)."""
    d = mx.abs(distance)
    near = ((a + 2.0) * d - (a + 3.0)) * d * d + 1
    far = (((d - 5) * d + 8) * d - 4) * a
    return mx.where(d <= 1, near, far)


def _cubic_taps(n: int, scale: float, align_corners: bool, axis: int, ndims: int,
                a: float = -0.75):
    coords = _scaled_coordinates(n, scale, align_corners, axis, ndims)
    l1 = mx.floor(coords)
    taps = (l1 - 1, l1, l1 + 1, l1 + 2)
    # Out-of-range neighbours repeat the border element (clamped index, kept weight).
    return tuple((mx.clip(t, 0, n - 1).astype(mx.int32),
                  mx.expand_dims(_cubic_weight(coords - t, a), -1)) for t in taps)


def _interpolate(x, scale_factor, taps_fn, align_corners: bool):
    ndims = x.ndim - 2
    taps = [taps_fn(n, s, align_corners, axis, ndims)
            for axis, (n, s) in enumerate(zip(x.shape[1:-1], scale_factor))]
    result = 0
    for combination in product(*taps):
        indices, weights = zip(*combination)
        result = result + reduce(operator.mul, weights) * x[(slice(None), *indices)]
    return result


def _antialias_matrix(n: int, scale: float, kernel, support: float) -> np.ndarray:
    """The ``(int(scale * n), n)`` filter matrix of one axis: the kernel centred on each
    output's source coordinate (the same coordinates as without antialiasing), stretched
    by ``1 / scale`` when shrinking, cut at the borders and normalised per output."""
    m = int(scale * n)
    step = 1 / scale
    centres = np.arange(m) * step - ((m - 1) * step - n + 1) / 2
    stretch = max(step, 1.0)
    out = kernel((np.arange(n)[None, :] - centres[:, None]) / stretch)
    out[np.abs(np.arange(n)[None, :] - centres[:, None]) >= support * stretch] = 0.0
    return out / out.sum(axis=1, keepdims=True)


def _triangle(t):
    return np.maximum(0.0, 1 - np.abs(t))


def _keys(t, a: float = -0.5):
    d = np.abs(t)
    return np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                    np.where(d < 2, (((d - 5) * d + 8) * d - 4) * a, 0.0))


# mode -> (kernel, half-width in source elements): the antialiasing filters.
_FILTERS = {"linear": (_triangle, 1.0), "cubic": (_keys, 2.0)}


def _antialiased(x, scale_factor, mode: str):
    """Filter ``x`` axis by axis with a dense ``(out, in)`` matrix (shapes only, built
    with NumPy once per call) applied by a matmul on the moved axis."""
    kernel, support = _FILTERS[mode]
    for axis, s in enumerate(scale_factor, start=1):
        matrix = mx.array(_antialias_matrix(x.shape[axis], s, kernel, support).T,
                          dtype=mx.float32)
        x = mx.moveaxis(mx.moveaxis(x, axis, -1) @ matrix, -1, axis)
    return x


def _check_scales(x, scale_factor, fn: str) -> tuple:
    scale_factor = tuple(scale_factor)
    if x.ndim - 2 != len(scale_factor):
        raise ShapeError(
            f"[{fn}] One scale per spatial dimension is required but scale_factor="
            f"{scale_factor} and the input of shape {tuple(x.shape)} has {x.ndim - 2} "
            f"spatial dimensions (layout (N, *spatial, C)).")
    return scale_factor


def upsample_nearest(x, scale_factor: tuple):
    """Nearest-neighbour upsampling of the spatial axes of ``x`` (``(N, *spatial, C)``)
    by ``scale_factor`` (one scale per spatial axis)."""
    scale_factor = _check_scales(x, scale_factor, "upsample_nearest")
    ndims = x.ndim - 2
    if all(float(s).is_integer() for s in scale_factor):
        # Integer scales: repeat by broadcasting a new axis after each spatial one.
        b, c, spatial = x.shape[0], x.shape[-1], x.shape[1:-1]
        scales = [int(s) for s in scale_factor]
        expanded = [b]
        for n in spatial:
            expanded += [n, 1]
        x = x.reshape(*expanded, c)
        target = [b]
        for n, s in zip(spatial, scales):
            target += [n, s]
        x = mx.broadcast_to(x, (*target, c))
        return x.reshape(b, *(n * s for n, s in zip(spatial, scales)), c)
    indices = [_nearest_indices(n, s, axis, ndims)
               for axis, (n, s) in enumerate(zip(x.shape[1:-1], scale_factor))]
    return x[(slice(None), *indices)]


def upsample_linear(x, scale_factor: tuple, align_corners: bool = False,
                    antialias: bool = False):
    """Linear (bilinear, trilinear ...) upsampling of the spatial axes of ``x``."""
    scale_factor = _check_scales(x, scale_factor, "upsample_linear")
    if antialias:
        return _antialiased(x, scale_factor, "linear")
    return _interpolate(x, scale_factor, _linear_taps, align_corners)


def upsample_cubic(x, scale_factor: tuple, align_corners: bool = False,
                   antialias: bool = False):
    """Cubic (bicubic ...) upsampling of the spatial axes of ``x``; Keys' kernel with
    ``a = -0.75``, or ``a = -0.5`` when ``antialias`` (PyTorch's convention)."""
    scale_factor = _check_scales(x, scale_factor, "upsample_cubic")
    if antialias:
        return _antialiased(x, scale_factor, "cubic")
    return _interpolate(x, scale_factor, _cubic_taps, align_corners)


class Upsample(Module):
    r"""Upsample the spatial axes of a channels-last input ``(N, *spatial, C)``.

    Every spatial axis of size ``n`` becomes ``int(scale * n)`` long.

    Args:
        scale_factor (float or tuple): the multiplier of every spatial axis, or one per
            spatial axis.
        mode (str, optional): ``"nearest"``, ``"linear"`` or ``"cubic"``.
            Default: ``"nearest"``.
        align_corners (bool, optional): for ``linear`` and ``cubic``, map the corner
            elements of input and output onto each other (otherwise the element centres).
            Default: ``False``.
        antialias (bool, optional): for ``linear`` and ``cubic``, low-pass filter when
            downsampling (and use ``a = -0.5`` for cubic). Not with ``nearest`` nor with
            ``align_corners``. Default: ``False``.

    Example:
        >>> x = mx.arange(1, 5).reshape((1, 2, 2, 1))
        >>> nn.Upsample(scale_factor=2, mode="nearest")(x).squeeze()
        array([[1, 1, 2, 2],
               [1, 1, 2, 2],
               [3, 3, 4, 4],
               [3, 3, 4, 4]], dtype=int32)
    """

    def __init__(self, scale_factor, mode: str = "nearest", align_corners: bool = False,
                 antialias: bool = False):
        super().__init__()
        if mode not in ("nearest", "linear", "cubic"):
            raise ArgumentError(f"[Upsample] Got unsupported upsampling algorithm: {mode}; "
                                f"use 'nearest', 'linear' or 'cubic'.")
        if antialias and mode == "nearest":
            raise ArgumentError("[Upsample] Antialiasing is not supported for nearest neighbor "
                                "upsampling; use mode='linear' or 'cubic'.")
        if antialias and align_corners:
            raise ArgumentError("[Upsample] antialias=True with align_corners=True is not "
                                "supported. Use align_corners=False for antialiased "
                                "interpolation.")
        self.scale_factor = (tuple(map(float, scale_factor))
                             if isinstance(scale_factor, (list, tuple)) else float(scale_factor))
        self.mode = mode
        self.align_corners = align_corners
        self.antialias = antialias

    def _extra_repr(self) -> str:
        extra = ", antialias=True" if self.antialias else ""
        return (f"scale_factor={self.scale_factor}, mode={self.mode!r}, "
                f"align_corners={self.align_corners}{extra}")

    def __call__(self, x):
        dims = x.ndim - 2
        if dims <= 0:
            raise ShapeError(
                f"[Upsample] The input should have at least 1 spatial dimension which means "
                f"it should be at least 3D but {x.ndim}D was provided (shape "
                f"{tuple(x.shape)}; layout (N, *spatial, C)).")
        scale = self.scale_factor
        if isinstance(scale, tuple):
            if len(scale) != dims:
                raise ShapeError(
                    f"[Upsample] One scale per spatial dimension is required but "
                    f"scale_factor={scale} and the number of spatial dimensions were {dims} "
                    f"(input shape {tuple(x.shape)}).")
        else:
            scale = (scale,) * dims
        if self.mode == "nearest":
            return upsample_nearest(x, scale)
        fn = upsample_linear if self.mode == "linear" else upsample_cubic
        return fn(x, scale, self.align_corners, self.antialias)
