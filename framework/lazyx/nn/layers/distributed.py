"""Sharded layers for tensor and fully-sharded data parallelism:
``AllToShardedLinear``, ``ShardedToAllLinear``, their quantized forms, and
``FullyShardedModule`` (``fully_shard``), with MLX's constructors and parameters.

lazyx runs as one process until its distributed pack exists: the default group is the
group of one process, where a shard is the whole layer and every collective is the
identity, so these layers compute exactly what ``Linear`` / ``QuantizedLinear`` compute
(and load the same weights). A group of several processes is refused with an error
that says so, never a silently wrong result.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Union

import lazyx.core as mx
from lazyx.errors import ArgumentError
from lazyx.utils import tree_flatten, tree_map

from .base import Module
from .linear import Linear
from .quantized import QuantizedLinear

__all__ = ["AllToShardedLinear", "ShardedToAllLinear", "QuantizedAllToShardedLinear",
           "QuantizedShardedToAllLinear", "FullyShardedModule", "fully_shard"]


class _SingleProcessGroup:
    """The group of this one process (what ``mx.distributed.init()`` returns alone)."""

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1

    def __repr__(self) -> str:
        return "Group(rank=0, size=1)"


_WORLD = _SingleProcessGroup()


def _group(layer: str, group):
    group = _WORLD if group is None else group
    if group.size() != 1:
        raise ArgumentError(
            f"[{layer}] a group of {group.size()} processes needs lazyx's distributed pack, "
            f"which is not available yet; run single-process (group=None).")
    return group


def _check_segments(layer: str, segments: Union[int, list]) -> None:
    if not (isinstance(segments, int) and segments >= 1 or isinstance(segments, list)):
        raise ArgumentError(f"[{layer}] segments must be a positive int or a list of split "
                            f"points; got {segments!r}.")


class AllToShardedLinear(Module):
    """A linear layer whose outputs are sharded across ``group``: each process holds
    ``output_dims / N`` rows of the weight. Gradients of the (replicated) input are
    summed over the group.

    Args:
        input_dims (int): input features.
        output_dims (int): output features (over the whole group).
        bias (bool, optional): add a bias. Default: ``True``.
        group (optional): the process group. Default: the global group.
    """

    def __init__(self, input_dims: int, output_dims: int, bias: bool = True,
                 group: Optional[Any] = None):
        super().__init__()
        self.group = _group(type(self).__name__, group)
        n = self.group.size()
        if output_dims % n != 0:
            raise ArgumentError(f"[{type(self).__name__}] Cannot shard the output of size "
                                f"{output_dims} across {n} devices.")
        scale = math.sqrt(1.0 / input_dims)
        self.weight = mx.random.uniform(low=-scale, high=scale,
                                        shape=(output_dims // n, input_dims))
        if bias:
            self.bias = mx.random.uniform(low=-scale, high=scale, shape=(output_dims // n,))

    def _extra_repr(self) -> str:
        out_dims, in_dims = self.weight.shape
        return (f"input_dims={in_dims}, output_dims={out_dims * self.group.size()}, "
                f"bias={'bias' in self}")

    # A process's shard is a Linear layer's product; one process holds the whole weight.
    __call__ = Linear.__call__

    @classmethod
    def from_linear(cls, linear_layer: Module, *, segments: Union[int, list] = 1,
                    group: Optional[Any] = None):
        """The shard of ``linear_layer`` this process holds (all of it, alone)."""
        _check_segments(cls.__name__, segments)
        output_dims, input_dims = linear_layer.weight.shape
        layer = cls(input_dims, output_dims, "bias" in linear_layer, group)
        layer.update(linear_layer.parameters())
        return layer


class ShardedToAllLinear(AllToShardedLinear):
    """A linear layer whose inputs are sharded across ``group``: each process holds
    ``input_dims / N`` columns of the weight and the partial products are summed over
    the group, so every process gets the whole result. Arguments as
    :class:`AllToShardedLinear`."""

    def __init__(self, input_dims: int, output_dims: int, bias: bool = True,
                 group: Optional[Any] = None):
        Module.__init__(self)
        self.group = _group(type(self).__name__, group)
        n = self.group.size()
        if input_dims % n != 0:
            raise ArgumentError(f"[{type(self).__name__}] The input of size {input_dims} "
                                f"cannot be sharded across {n} devices.")
        scale = math.sqrt(1.0 / input_dims)
        self.weight = mx.random.uniform(low=-scale, high=scale,
                                        shape=(output_dims, input_dims // n))
        if bias:
            self.bias = mx.random.uniform(low=-scale, high=scale, shape=(output_dims,))

    def _extra_repr(self) -> str:
        out_dims, in_dims = self.weight.shape
        return (f"input_dims={in_dims * self.group.size()}, output_dims={out_dims}, "
                f"bias={'bias' in self}")


class QuantizedAllToShardedLinear(QuantizedLinear):
    """The quantized form of :class:`AllToShardedLinear` (frozen, like
    :class:`QuantizedLinear`).

    Args:
        input_dims, output_dims, bias: as :class:`AllToShardedLinear`.
        group_size (int, optional): Default: ``64``. bits (int, optional): Default: ``4``.
        mode (str, optional): Default: ``"affine"``.
        group (optional): the process group. Default: the global group.
    """

    def __init__(self, input_dims: int, output_dims: int, bias: bool = True,
                 group_size: int = 64, bits: int = 4, mode: str = "affine",
                 group: Optional[Any] = None):
        self.group = _group(type(self).__name__, group)
        super().__init__(input_dims, output_dims, bias, group_size, bits, mode)

    def unfreeze(self, *args, **kwargs):
        """Unfreeze contained layers; this layer's quantized parameters stay frozen."""
        super().unfreeze(*args, **kwargs)
        self.freeze(recurse=False)
        return self

    @classmethod
    def from_quantized_linear(cls, quantized_linear_layer: Module, *,
                              segments: Union[int, list] = 1, group: Optional[Any] = None):
        """The shard of ``quantized_linear_layer`` this process holds (all of it, alone)."""
        _check_segments(cls.__name__, segments)
        q = quantized_linear_layer
        layer = cls(q._input_dims, q["weight"].shape[0], "bias" in q, q.group_size, q.bits,
                    q.mode, group)
        layer.update(q.parameters())
        return layer


class QuantizedShardedToAllLinear(QuantizedAllToShardedLinear):
    """The quantized form of :class:`ShardedToAllLinear` (frozen). Arguments as
    :class:`QuantizedAllToShardedLinear`."""


class FullyShardedModule(Module):
    """Wrap ``module`` so each process of ``group`` holds only a shard (along axis 0) of
    its parameters, gathered for the forward pass. Alone, the shard is the whole
    parameter and the wrapper calls ``module`` (casting its parameters to
    ``compute_dtype`` for the call when given).

    Args:
        module (Module): the wrapped module (the child ``module``).
        group (optional): the process group. Default: the global group.
        compute_dtype (Dtype, optional): the dtype of the parameters in the forward pass.
    """

    def __init__(self, module: Module, group: Optional[Any] = None,
                 compute_dtype: Optional[Any] = None):
        super().__init__()
        self.group = _group(type(self).__name__, group)
        self.compute_dtype = compute_dtype
        self.module = module

    def _extra_repr(self) -> str:
        return f"num_sharded_params={len(tree_flatten(self.module.parameters()))}"

    def _gathered_call(self, fn, *args, **kwargs):
        if self.compute_dtype is None:
            return fn(*args, **kwargs)
        params = self.module.parameters()
        dtype = self.compute_dtype
        cast = tree_map(lambda p: p.astype(dtype)
                        if mx.issubdtype(p.dtype, mx.floating) else p, params)
        self.module.update(cast)
        try:
            return fn(*args, **kwargs)
        finally:
            self.module.update(params)

    def __call__(self, *args, **kwargs):
        return self._gathered_call(self.module, *args, **kwargs)

    def as_linear(self, *args, **kwargs):
        """The wrapped module's ``as_linear`` with the gathered parameters."""
        return self._gathered_call(self.module.as_linear, *args, **kwargs)


def fully_shard(module: Module, *, group: Optional[Any] = None,
                compute_dtype: Optional[Any] = None) -> Module:
    """Wrap ``module`` in a :class:`FullyShardedModule` (see there); alone (a group of one
    process) there is nothing to shard and ``module`` comes back unchanged, as in MLX."""
    if _group("fully_shard", group).size() == 1:
        return module
    return FullyShardedModule(module, group=group, compute_dtype=compute_dtype)
