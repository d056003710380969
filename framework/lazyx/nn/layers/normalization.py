"""Normalization layers: ``LayerNorm``, ``RMSNorm``, ``GroupNorm``, ``BatchNorm``,
``InstanceNorm`` (``mlx.nn.layers.normalization``).

Features are the last axis (channels-last, as everywhere in MLX). ``LayerNorm`` and
``RMSNorm`` are one fused ``mx.fast`` kernel each; the others are written with
element-wise ops and reductions, which ``compile`` fuses. Scales start at one and
offsets at zero, named ``weight`` and ``bias`` as in MLX. ``BatchNorm`` keeps
``running_mean``/``running_var`` as (frozen) entries of the module, so they travel
with ``model.state`` through ``compile`` and are saved with the weights.
"""

from __future__ import annotations

import lazyx.core as mx
from lazyx.errors import ArgumentError, ShapeError

from ._checks import check_features
from .base import Module

__all__ = ["LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm", "InstanceNorm"]


class InstanceNorm(Module):
    r"""Normalize each channel of each sample over its spatial axes.

    .. math::
        y = \frac{x - \mathrm{E}[x]}{\sqrt{\mathrm{Var}[x] + \epsilon}} * \gamma + \beta

    The mean and (biased) variance run over the axes between the batch and the
    channels of an ``(N, ..., C)`` input.

    Args:
        dims (int): The number of channels ``C``.
        eps (float): Added to the variance for stability. Default: ``1e-5``.
        affine (bool): Learn ``weight`` (:math:`\gamma`) and ``bias`` (:math:`\beta`).
            Default: ``False``.
    """

    def __init__(self, dims: int, eps: float = 1e-5, affine: bool = False):
        super().__init__()
        if affine:
            self.weight = mx.ones((dims,))
            self.bias = mx.zeros((dims,))
        self.dims = dims
        self.eps = eps

    def _extra_repr(self) -> str:
        return f"{self.dims}, eps={self.eps}, affine={'weight' in self}"

    def __call__(self, x):
        if x.ndim < 3:
            raise ShapeError(
                f"[InstanceNorm] expects inputs with at least 3 dimensions (N, ..., C); got "
                f"shape {tuple(x.shape)}")
        check_features(self, x, self.dims, "dims")
        axes = tuple(range(1, x.ndim - 1))
        mean = mx.mean(x, axis=axes, keepdims=True)
        var = mx.var(x, axis=axes, keepdims=True)
        x = (x - mean) * mx.rsqrt(var + self.eps)
        return (self.weight * x + self.bias) if "weight" in self else x


class LayerNorm(Module):
    r"""Normalize each vector along the last axis (``mx.fast.layer_norm``).

    .. math::
        y = \frac{x - \mathrm{E}[x]}{\sqrt{\mathrm{Var}[x] + \epsilon}} * \gamma + \beta

    Args:
        dims (int): The size of the last axis.
        eps (float): Added to the variance for stability. Default: ``1e-5``.
        affine (bool): Learn ``weight`` (:math:`\gamma`) and, with ``bias``, ``bias``
            (:math:`\beta`). Default: ``True``.
        bias (bool): Learn ``bias`` when ``affine``. Default: ``True``.
    """

    def __init__(self, dims: int, eps: float = 1e-5, affine: bool = True, bias: bool = True):
        super().__init__()
        if affine:
            self.weight = mx.ones((dims,))
            if bias:
                self.bias = mx.zeros((dims,))
        self.eps = eps
        self.dims = dims

    def _extra_repr(self) -> str:
        return f"{self.dims}, eps={self.eps}, affine={'weight' in self}"

    def __call__(self, x):
        check_features(self, x, self.dims, "dims")
        return mx.fast.layer_norm(x, self.get("weight"), self.get("bias"), self.eps)


class RMSNorm(Module):
    r"""Scale each vector along the last axis by its root mean square
    (``mx.fast.rms_norm``).

    .. math::
        y = \frac{x}{\sqrt{\mathrm{E}[x^2] + \epsilon}} * \gamma

    Args:
        dims (int): The size of the last axis.
        eps (float): Added to the mean square for stability. Default: ``1e-5``.
    """

    def __init__(self, dims: int, eps: float = 1e-5):
        super().__init__()
        self.weight = mx.ones((dims,))
        self.eps = eps

    def _extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"

    def __call__(self, x):
        check_features(self, x, self.weight.shape[0], "weight", self.weight.shape)
        return mx.fast.rms_norm(x, self["weight"], self.eps)


class GroupNorm(Module):
    r"""Normalize groups of channels of each sample over the channels and spatial axes.

    .. math::
        y = \frac{x - \mathrm{E}[x]}{\sqrt{\mathrm{Var}[x] + \epsilon}} * \gamma + \beta

    MLX's grouping puts channel ``c`` in group ``c % num_groups``; with
    ``pytorch_compatible=True`` groups are runs of ``dims // num_groups`` consecutive
    channels, as in PyTorch (use it to load PyTorch weights).

    Args:
        num_groups (int): The number of groups; it must divide ``dims``.
        dims (int): The number of channels (the last axis).
        eps (float): Added to the variance for stability. Default: ``1e-5``.
        affine (bool): Learn a per-channel ``weight`` and ``bias``. Default: ``True``.
        pytorch_compatible (bool): Use PyTorch's grouping. Default: ``False``.
    """

    def __init__(self, num_groups: int, dims: int, eps: float = 1e-5, affine: bool = True,
                 pytorch_compatible: bool = False):
        super().__init__()
        if affine:
            self.bias = mx.zeros((dims,))
            self.weight = mx.ones((dims,))
        self.num_groups = num_groups
        self.dims = dims
        self.eps = eps
        self.pytorch_compatible = pytorch_compatible

    def _extra_repr(self) -> str:
        return (f"{self.num_groups}, {self.dims}, eps={self.eps}, affine={'weight' in self}, "
                f"pytorch_compatible={self.pytorch_compatible}")

    def _pytorch_compatible_group_norm(self, x):
        batch, *rest, dims = x.shape
        group_size = dims // self.num_groups
        # (B, S, G, g) -> (B, G, S*g): one layer norm per (sample, group) row.
        x = x.reshape(batch, -1, self.num_groups, group_size).transpose(0, 2, 1, 3)
        x = mx.fast.layer_norm(x.reshape(batch, self.num_groups, -1), None, None, self.eps)
        x = x.reshape(batch, self.num_groups, -1, group_size).transpose(0, 2, 1, 3)
        return x.reshape(batch, *rest, dims)

    def _group_norm(self, x):
        batch, *rest, dims = x.shape
        # (B, S*g, G): channel c is column c % G.
        x = x.reshape(batch, -1, self.num_groups)
        mean = mx.mean(x, axis=1, keepdims=True)
        var = mx.var(x, axis=1, keepdims=True)
        x = (x - mean) * mx.rsqrt(var + self.eps)
        return x.reshape(batch, *rest, dims)

    def __call__(self, x):
        if x.ndim < 2:
            raise ShapeError(
                f"[GroupNorm] expects inputs with at least 2 dimensions (N, ..., C); got "
                f"shape {tuple(x.shape)}")
        check_features(self, x, self.dims, "dims")
        if self.dims % self.num_groups:
            raise ArgumentError(
                f"[GroupNorm] num_groups={self.num_groups} does not divide dims={self.dims}")
        norm = self._pytorch_compatible_group_norm if self.pytorch_compatible else self._group_norm
        x = norm(x)
        return (self.weight * x + self.bias) if "weight" in self else x


class BatchNorm(Module):
    r"""Normalize each feature over the batch (and spatial axes).

    .. math::
        y = \frac{x - \mathrm{E}[x]}{\sqrt{\mathrm{Var}[x] + \epsilon}} * \gamma + \beta

    In training mode the statistics are the batch's; with ``track_running_stats`` the
    running estimates are updated as ``r = (1 - momentum) r + momentum s`` (the unbiased
    variance for ``running_var``) and used in evaluation mode. Inputs are ``(N, C)``,
    ``(N, L, C)`` or ``(N, H, W, C)``.

    Args:
        num_features (int): The number of features ``C``.
        eps (float): Added to the variance for stability. Default: ``1e-5``.
        momentum (float): The weight of a new batch in the running statistics.
            Default: ``0.1``.
        affine (bool): Learn ``weight`` and ``bias``. Default: ``True``.
        track_running_stats (bool): Keep running statistics. Default: ``True``.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, track_running_stats: bool = True):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = mx.ones((num_features,))
            self.bias = mx.zeros((num_features,))
        if track_running_stats:
            self.running_mean = mx.zeros((num_features,))
            self.running_var = mx.ones((num_features,))
            self.freeze(keys=["running_mean", "running_var"], recurse=False)

    def unfreeze(self, *args, **kwargs):
        """Unfreeze like :meth:`Module.unfreeze`; the running statistics stay frozen."""
        super().unfreeze(*args, **kwargs)
        self.freeze(keys=["running_mean", "running_var"], recurse=False)
        return self

    def _extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={'weight' in self}, track_running_stats={self.track_running_stats}")

    def _calc_stats(self, x):
        axes = tuple(range(0, x.ndim - 1))
        return mx.mean(x, axis=axes), mx.var(x, axis=axes)

    def __call__(self, x):
        if x.ndim < 2 or x.ndim > 4:
            raise ShapeError(
                f"[BatchNorm] expects an input with 2, 3 or 4 dimensions ((N, C), (N, L, C) "
                f"or (N, H, W, C)); got shape {tuple(x.shape)}")
        check_features(self, x, self.num_features, "num_features")
        if self.training or not self.track_running_stats:
            mean, var = self._calc_stats(x)
            if self.training and self.track_running_stats:
                mu = self.momentum
                n = x.size / x.shape[-1]
                self.running_mean = (1 - mu) * self.running_mean + mu * mean
                self.running_var = (1 - mu) * self.running_var + mu * var * (n / max(n - 1, 1))
        else:
            mean, var = self.running_mean, self.running_var
        x = (x - mean) * mx.rsqrt(var + self.eps)
        return (self.weight * x + self.bias) if "weight" in self else x
