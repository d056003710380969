"""Sharded layers for tensor and fully-sharded data parallelism (``mlx.nn``'s):
``AllToShardedLinear``, ``ShardedToAllLinear``, their quantized forms, and
``FullyShardedModule`` / ``fully_shard``; plus ``shard_linear`` and ``shard_inplace``,
which cut an existing layer's weights into this process's shard.

Each process of a group of N holds one N-th of a layer; the collectives of
``lazyx.core.distributed`` make the pieces one layer:

* ``AllToShardedLinear``: every process sees the whole input and computes its slice of
  the outputs (``output_dims / N`` rows of the weight). Its forward pass needs no
  communication; the gradient of the input is summed over the group (``sum_gradients``:
  the identity forward, an ``all_sum`` backward), since every shard used the input;
* ``ShardedToAllLinear``: every process holds ``input_dims / N`` columns and gets the
  matching slice of the input (typically the output of an ``AllToShardedLinear``); the
  partial products are ``all_sum``-med, then the (whole, unsharded) bias is added once,
  so every process ends with the whole result. ``all_sum`` passes the cotangent through
  (the loss after it is the same on every process), so its shard's gradients are right;
* ``FullyShardedModule``: every parameter is cut along axis 0; the forward pass gathers
  the whole parameters (one ``all_gather`` per dtype, of all shards flattened together),
  the backward pass reduce-scatters their gradients (one ``sum_scatter``) divided by N,
  so each process trains only its shard on the mean gradient of the group.

``from_linear`` / ``from_quantized_linear`` take this process's shard of a whole layer.
``segments`` says the weight is several matrices stacked (a fused QKV projection is
``segments=3``, or a list of split points): each segment is sharded on its own, so the
shard holds every segment's slice. A group of one process holds the whole layer and every
collective is the identity: the layers compute what ``Linear`` / ``QuantizedLinear`` do.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Callable, Optional, Union

import lazyx.core as mx
from lazyx.errors import ArgumentError, ShapeError
from lazyx.utils import tree_flatten, tree_map_with_path, tree_unflatten

from ._checks import check_features
from .base import Module
from .linear import Linear
from .quantized import QuantizedLinear, _defaults, _Quantized

__all__ = ["AllToShardedLinear", "ShardedToAllLinear", "QuantizedAllToShardedLinear",
           "QuantizedShardedToAllLinear", "FullyShardedModule", "fully_shard"]


def _group(group):
    """``group``, or the global group (``mx.distributed.init()``) when it is None."""
    return mx.distributed.init() if group is None else group


@lru_cache(maxsize=None)
def sum_gradients(group):
    """The identity whose gradient is summed over ``group`` (``all_sum``): what a
    replicated input of a sharded computation needs. One function per group (cached), so
    every call of a layer uses the same one."""
    if group.size() == 1:
        return lambda x: x

    @mx.custom_function
    def f(x):
        return x

    @f.vjp
    def f_vjp(x, dx, _):
        return mx.distributed.all_sum(dx, group=group)

    return f


# -- cutting weights into shards ------------------------------------------------------------
def _segments(layer: str, size: int, segments: Union[int, list], axis: int) -> list:
    """The split points of an axis of ``size`` into ``segments`` (a count or the points)."""
    if isinstance(segments, bool) or not isinstance(segments, (int, list, tuple)):
        raise ArgumentError(f"[{layer}] segments must be a positive int or a list of split "
                            f"points; got {segments!r}.")
    if isinstance(segments, int):
        if segments < 1 or size % segments:
            raise ArgumentError(f"[{layer}] cannot cut an axis of size {size} (axis {axis}) "
                                f"into segments={segments} equal parts.")
        step = size // segments
        return list(range(step, size, step))
    points = [int(p) for p in segments]
    if points != sorted(points) or any(p <= 0 or p >= size for p in points):
        raise ArgumentError(f"[{layer}] segments {list(segments)} must be increasing split "
                            f"points inside the axis of size {size} (axis {axis}).")
    return points


def _shard(layer: str, weight, axis: int, segments, group):
    """This process's shard of ``weight`` along ``axis``: each segment cut in N, the
    rank's pieces concatenated."""
    n, r = group.size(), group.rank()
    size = weight.shape[axis]
    points = _segments(layer, size, segments, axis)
    parts = mx.split(weight, points, axis=axis) if points else [weight]
    pieces = []
    for part in parts:
        if part.shape[axis] % n:
            raise ShapeError(f"[{layer}] cannot shard a segment of size {part.shape[axis]} "
                             f"(axis {axis} of a parameter of shape {tuple(weight.shape)}) "
                             f"across {n} processes.")
        pieces.append(mx.split(part, n, axis=axis)[r])
    return pieces[0] if len(pieces) == 1 else mx.concatenate(pieces, axis=axis)


def _all_to_sharded(path: str, weight):
    return 0  # the output rows: axis 0 of the weight, its scales and biases, the bias


def _sharded_to_all(path: str, weight):
    if path.endswith("bias"):
        return None  # the whole bias, added once after the all_sum
    return -1


_SHARDINGS = {"all-to-sharded": _all_to_sharded, "sharded-to-all": _sharded_to_all}


def _sharding_rule(sharding) -> Callable:
    if callable(sharding):
        return sharding
    if sharding not in _SHARDINGS:
        raise ArgumentError(f"sharding must be one of {sorted(_SHARDINGS)} or a callable "
                            f"(path, weight) -> axis or (axis, segments); got {sharding!r}.")
    return _SHARDINGS[sharding]


def _sharded_parameters(module: Module, rule: Callable, segments, group,
                        layer: Optional[str] = None) -> dict:
    """This process's shards of ``module``'s parameters; ``layer`` names the caller in
    errors (default: the module's class)."""
    layer = layer or type(module).__name__

    def shard_one(path, weight):
        choice = rule(path, weight)
        if choice is None:
            return weight
        axis, segs = (choice if isinstance(choice, tuple) else (choice, segments))
        return _shard(layer, weight, axis, segs, group)

    return tree_map_with_path(shard_one, module.parameters())


def shard_inplace(module: Module, sharding: Union[str, Callable], *,
                  segments: Union[int, list] = 1, group: Optional[Any] = None) -> None:
    """Replace ``module``'s parameters (in place) by this process's shards.

    Args:
        module (Module): the module; its class is unchanged, so it must communicate
            itself for the shards to compute the whole layer.
        sharding (str or callable): ``"all-to-sharded"`` (every parameter along its
            output axis), ``"sharded-to-all"`` (weights along the last axis, the bias
            whole), or ``fn(path, weight)`` returning the axis, ``(axis, segments)``, or
            None to leave that parameter whole.
        segments (int or list): the segments of the weights (see the module's docstring).
        group (optional): the group to shard across. Default: the global group.
    """
    group = _group(group)
    module.update(_sharded_parameters(module, _sharding_rule(sharding), segments, group))


def shard_linear(module: Module, sharding: str, *, segments: Union[int, list] = 1,
                 group: Optional[Any] = None) -> Module:
    """A new sharded layer made from ``module`` (a ``Linear`` or ``QuantizedLinear``),
    which stays as it is: ``sharding`` ``"all-to-sharded"`` gives an
    ``AllToShardedLinear`` (or its quantized form), ``"sharded-to-all"`` a
    ``ShardedToAllLinear``."""
    quantized = isinstance(module, QuantizedLinear)
    table = {("all-to-sharded", False): AllToShardedLinear.from_linear,
             ("sharded-to-all", False): ShardedToAllLinear.from_linear,
             ("all-to-sharded", True): QuantizedAllToShardedLinear.from_quantized_linear,
             ("sharded-to-all", True): QuantizedShardedToAllLinear.from_quantized_linear}
    if (sharding, quantized) not in table:
        raise ArgumentError(f"shard_linear: sharding must be 'all-to-sharded' or "
                            f"'sharded-to-all'; got {sharding!r}.")
    if not quantized and not isinstance(module, Linear):
        raise ArgumentError(f"shard_linear: expects a Linear or QuantizedLinear layer; got "
                            f"{type(module).__name__}.")
    return table[sharding, quantized](module, segments=segments, group=group)


def _divisible(layer: str, what: str, dims: int, n: int) -> None:
    if dims % n:
        raise ArgumentError(f"[{layer}] cannot shard the {what} of size {dims} across {n} "
                            "processes: it must be a multiple of the group's size.")


# -- the float layers -----------------------------------------------------------------------
def _shard_of(cls, linear_layer: Module, sharder, segments, group):
    """A ``cls`` layer holding this process's shard of ``linear_layer`` (``sharder``:
    :func:`_all_to_sharded` or :func:`_sharded_to_all`)."""
    group = _group(group)
    output_dims, input_dims = linear_layer.weight.shape
    layer = cls(input_dims, output_dims, "bias" in linear_layer, group)
    layer.update(_sharded_parameters(linear_layer, sharder, segments, group, cls.__name__))
    return layer


class AllToShardedLinear(Module):
    """A linear layer whose outputs are sharded across ``group``: each process holds
    ``output_dims / N`` rows of the weight (and of the bias) and computes that slice of
    the outputs from the whole input. The input's gradient is summed over the group.

    Args:
        input_dims (int): input features.
        output_dims (int): output features (of the whole group).
        bias (bool, optional): add a bias. Default: ``True``.
        group (optional): the process group. Default: the global group.
    """

    def __init__(self, input_dims: int, output_dims: int, bias: bool = True,
                 group: Optional[Any] = None):
        super().__init__()
        self.group = _group(group)
        n = self.group.size()
        _divisible(type(self).__name__, "output", output_dims, n)
        scale = math.sqrt(1.0 / input_dims)
        self.weight = mx.random.uniform(low=-scale, high=scale,
                                        shape=(output_dims // n, input_dims))
        if bias:
            self.bias = mx.random.uniform(low=-scale, high=scale, shape=(output_dims // n,))

    def _extra_repr(self) -> str:
        out_dims, in_dims = self.weight.shape
        return (f"input_dims={in_dims}, output_dims={out_dims * self.group.size()}, "
                f"bias={'bias' in self}")

    def __call__(self, x):
        check_features(self, x, self.weight.shape[1], "weight", self.weight.shape)
        x = sum_gradients(self.group)(x)
        if "bias" in self:
            return mx.addmm(self["bias"], x, self["weight"].T)
        return x @ self["weight"].T

    @classmethod
    def from_linear(cls, linear_layer: Module, *, segments: Union[int, list] = 1,
                    group: Optional[Any] = None):
        """This process's shard of ``linear_layer`` (its output rows)."""
        return _shard_of(cls, linear_layer, _all_to_sharded, segments, group)


class ShardedToAllLinear(Module):
    """A linear layer whose inputs are sharded across ``group``: each process holds
    ``input_dims / N`` columns of the weight, multiplies its slice of the input, and the
    partial products are summed over the group (``all_sum``) before the bias is added;
    every process gets the whole result. Arguments as :class:`AllToShardedLinear`."""

    def __init__(self, input_dims: int, output_dims: int, bias: bool = True,
                 group: Optional[Any] = None):
        super().__init__()
        self.group = _group(group)
        n = self.group.size()
        _divisible(type(self).__name__, "input", input_dims, n)
        scale = math.sqrt(1.0 / input_dims)
        self.weight = mx.random.uniform(low=-scale, high=scale,
                                        shape=(output_dims, input_dims // n))
        if bias:
            self.bias = mx.random.uniform(low=-scale, high=scale, shape=(output_dims,))

    def _extra_repr(self) -> str:
        out_dims, in_dims = self.weight.shape
        return (f"input_dims={in_dims * self.group.size()}, output_dims={out_dims}, "
                f"bias={'bias' in self}")

    def __call__(self, x):
        check_features(self, x, self.weight.shape[1], "weight",
                       self.weight.shape)
        y = x @ self["weight"].T
        if self.group.size() > 1:
            y = mx.distributed.all_sum(y, group=self.group)
        if "bias" in self:
            y = y + self["bias"]
        return y

    @classmethod
    def from_linear(cls, linear_layer: Module, *, segments: Union[int, list] = 1,
                    group: Optional[Any] = None):
        """This process's shard of ``linear_layer`` (its input columns; the bias whole)."""
        return _shard_of(cls, linear_layer, _sharded_to_all, segments, group)


# -- the quantized layers -------------------------------------------------------------------
class _QuantizedSharded(_Quantized):
    """What the two quantized sharded layers share: frozen quantized storage, MLX's
    constructor, the check of the input and the shard of a ``QuantizedLinear``."""

    _rule = staticmethod(_all_to_sharded)

    def __init__(self, input_dims: int, output_dims: int, bias: bool = True,
                 group_size: int = 64, bits: int = 4, mode: str = "affine",
                 group: Optional[Any] = None):
        super().__init__()
        name = type(self).__name__
        self.group = _group(group)
        n = self.group.size()
        self.group_size, self.bits = _defaults(name, mode, group_size, bits)
        self.mode = mode
        rows, cols = self._shard_shape(name, input_dims, output_dims, n)
        scale = math.sqrt(1 / input_dims)
        self._store(mx.random.uniform(low=-scale, high=scale, shape=(rows, cols)))
        if bias:
            self.bias = mx.zeros((rows if self._rule is _all_to_sharded else output_dims,))
        self.freeze()

    def unfreeze(self, *args, **kwargs):
        """Unfreeze contained layers; this layer's quantized parameters stay frozen."""
        super().unfreeze(*args, **kwargs)
        self.freeze(recurse=False)
        return self

    def _product(self, x):
        check_features(self, x, self._input_dims, "weight (unpacked)",
                       (self["weight"].shape[0], self._input_dims))
        return mx.quantized_matmul(x, self["weight"], scales=self["scales"],
                                   biases=self.get("biases"), transpose=True,
                                   **self._quantized_args())

    @classmethod
    def from_quantized_linear(cls, quantized_linear_layer: Module, *,
                              segments: Union[int, list] = 1, group: Optional[Any] = None):
        """This process's shard of ``quantized_linear_layer`` (packed weight, scales,
        biases cut alike)."""
        group = _group(group)
        q = quantized_linear_layer
        layer = cls(q._input_dims, q["weight"].shape[0], "bias" in q, q.group_size, q.bits,
                    q.mode, group)
        layer.update(_sharded_parameters(q, cls._rule, segments, group, cls.__name__))
        return layer


class QuantizedAllToShardedLinear(_QuantizedSharded):
    """The quantized form of :class:`AllToShardedLinear`: frozen (no gradient to packed
    integers), like :class:`QuantizedLinear`.

    Args:
        input_dims (int): input features.
        output_dims (int): output features (of the whole group).
        bias (bool, optional): add a bias. Default: ``True``.
        group_size (int, optional): elements sharing one scale. Default: ``64``.
        bits (int, optional): bits per weight. Default: ``4``.
        mode (str, optional): the quantization mode. Default: ``"affine"``.
        group (optional): the process group. Default: the global group.
    """

    @staticmethod
    def _shard_shape(name, input_dims, output_dims, n):
        _divisible(name, "output", output_dims, n)
        return output_dims // n, input_dims

    def _extra_repr(self) -> str:
        return (f"input_dims={self._input_dims}, "
                f"output_dims={self['weight'].shape[0] * self.group.size()}, "
                f"bias={'bias' in self}, group_size={self.group_size}, bits={self.bits}, "
                f"mode={self.mode}")

    def __call__(self, x):
        y = self._product(sum_gradients(self.group)(x))
        return y + self["bias"] if "bias" in self else y


class QuantizedShardedToAllLinear(_QuantizedSharded):
    """The quantized form of :class:`ShardedToAllLinear` (frozen). Arguments as
    :class:`QuantizedAllToShardedLinear`."""

    _rule = staticmethod(_sharded_to_all)

    @staticmethod
    def _shard_shape(name, input_dims, output_dims, n):
        _divisible(name, "input", input_dims, n)
        return output_dims, input_dims // n

    def _extra_repr(self) -> str:
        return (f"input_dims={self._input_dims * self.group.size()}, "
                f"output_dims={self['weight'].shape[0]}, bias={'bias' in self}, "
                f"group_size={self.group_size}, bits={self.bits}, mode={self.mode}")

    def __call__(self, x):
        y = self._product(x)
        if self.group.size() > 1:
            y = mx.distributed.all_sum(y, group=self.group)
        return y + self["bias"] if "bias" in self else y


# -- fully sharded data parallelism ---------------------------------------------------------
def _gather_function(group, shard_shapes: list, compute_dtype):
    """``gather(shards) -> whole parameters`` with a reduce-scatter (mean) gradient.

    The shards of one dtype travel together: flattened and concatenated into one buffer,
    one ``all_gather`` (which stacks the processes' buffers along axis 0), then cut back
    per parameter. The backward pass mirrors it with one ``sum_scatter``."""
    n = group.size()
    sizes = [math.prod(s) for s in shard_shapes]
    by_dtype: dict = {}

    def cast(x, dtype):
        return x if dtype is None or x.dtype == dtype else x.astype(dtype)

    @mx.custom_function
    def gather(shards):
        whole = [None] * len(shards)
        by_dtype.clear()
        for i, s in enumerate(shards):
            by_dtype.setdefault(s.dtype, []).append(i)
        for dtype, idx in by_dtype.items():
            flat = mx.concatenate([shards[i].reshape(-1) for i in idx])
            rows = mx.distributed.all_gather(flat, group=group).reshape(n, -1)
            cuts = list(_running(sizes[i] for i in idx))[:-1]
            for i, piece in zip(idx, mx.split(rows, cuts, axis=1) if cuts else [rows]):
                whole[i] = cast(piece.reshape((n * shard_shapes[i][0],)
                                              + tuple(shard_shapes[i][1:])),
                                compute_dtype if mx.issubdtype(dtype, mx.floating) else None)
        return whole

    @gather.vjp
    def gather_vjp(shards, cotangents, _):
        grads = [None] * len(shards)
        for dtype, idx in by_dtype.items():
            # A parameter the call did not use has no cotangent: its gradient is zero.
            rows = mx.concatenate([
                (mx.zeros((n, sizes[i]), dtype) if cotangents[i] is None
                 else cast(cotangents[i], dtype).reshape(n, -1)) for i in idx], axis=1)
            mine = mx.distributed.sum_scatter(rows.reshape(-1), group=group) / n
            cuts = list(_running(sizes[i] for i in idx))[:-1]
            for i, piece in zip(idx, mx.split(mine, cuts) if cuts else [mine]):
                grads[i] = piece.reshape(shard_shapes[i]).astype(dtype)
        return grads

    return gather


def _running(sizes):
    total = 0
    for s in sizes:
        total += s
        yield total


class FullyShardedModule(Module):
    """Wrap ``module`` so each process of ``group`` holds only a shard of its parameters
    (a 1/N slice along axis 0 of each, so each parameter's first axis must be a
    multiple of N). The whole parameters are gathered for each call; their gradients are
    reduce-scattered and divided by N, so each process trains its shard on the group's
    mean gradient. Use :func:`fully_shard` to wrap a module.

    Args:
        module (Module): the module to shard (the child ``module``).
        group (optional): the process group. Default: the global group.
        compute_dtype (Dtype, optional): the dtype the gathered floating-point
            parameters are cast to for the call. Default: ``None`` (as stored).
    """

    def __init__(self, module: Module, group: Optional[Any] = None,
                 compute_dtype: Optional[Any] = None):
        super().__init__()
        self.group = _group(group)
        self.compute_dtype = compute_dtype
        n = self.group.size()
        if n > 1:
            def axis0(path, weight):
                if weight.ndim == 0 or weight.shape[0] % n:
                    raise ShapeError(
                        f"[FullyShardedModule] cannot shard parameter '{path}' of shape "
                        f"{tuple(weight.shape)} across {n} processes: its axis 0 must be a "
                        "multiple of the group's size.")
                return 0
            module.update(_sharded_parameters(module, axis0, 1, self.group, "FullyShardedModule"))
        self.module = module

    def _extra_repr(self) -> str:
        return f"num_sharded_params={len(tree_flatten(self.module.parameters()))}"

    def _gathered_call(self, fn, *args, **kwargs):
        shards = self.module.parameters()
        flat = tree_flatten(shards)
        if not flat:
            return fn(*args, **kwargs)
        if self.group.size() == 1:
            dtype = self.compute_dtype
            whole = [v if dtype is None or not mx.issubdtype(v.dtype, mx.floating)
                     else v.astype(dtype) for _, v in flat]
        else:
            gather = _gather_function(self.group, [tuple(v.shape) for _, v in flat],
                                      self.compute_dtype)
            whole = gather([v for _, v in flat])
        self.module.update(tree_unflatten([(k, w) for (k, _), w in zip(flat, whole)]))
        try:
            return fn(*args, **kwargs)
        finally:
            self.module.update(shards)

    def __call__(self, *args, **kwargs):
        return self._gathered_call(self.module, *args, **kwargs)

    def as_linear(self, *args, **kwargs):
        """The wrapped module's ``as_linear`` with the gathered parameters."""
        return self._gathered_call(self.module.as_linear, *args, **kwargs)


def fully_shard(module: Module, *, group: Optional[Any] = None,
                compute_dtype: Optional[Any] = None) -> Module:
    """Wrap ``module`` in a :class:`FullyShardedModule`; for a group of one process there
    is nothing to shard and ``module`` comes back unchanged, as in MLX."""
    group = _group(group)
    if group.size() == 1:
        return module
    return FullyShardedModule(module, group=group, compute_dtype=compute_dtype)
