"""Transforms over a whole ``Module``: ``value_and_grad``, ``checkpoint``, ``quantize``,
``average_gradients`` (``mlx.nn.utils``).

``lazyx.core``'s transforms differentiate a function of arrays; a model's function
reads its parameters from the module instead. ``value_and_grad`` and ``checkpoint``
bridge the two the same way: they pass ``model.trainable_parameters()`` as the first
argument of an inner function that writes them back with ``model.update`` and then
calls the user's function, so the gradient is a tree shaped like the parameters.
"""

from __future__ import annotations

from functools import wraps
from typing import Any, Callable, Optional

import lazyx.core as mx
from lazyx.errors import ArgumentError
from lazyx.utils import tree_flatten, tree_map, tree_map_with_path, tree_unflatten

from .layers.base import Module

__all__ = ["value_and_grad", "checkpoint", "average_gradients", "quantize"]


def _through_parameters(model: Module, fn: Callable) -> Callable:
    """``fn`` as a function of ``(parameters, *args)`` that installs ``parameters`` first."""

    def inner(parameters, *args, **kwargs):
        model.update(parameters)
        return fn(*args, **kwargs)

    return inner


def value_and_grad(model: Module, fn: Callable) -> Callable:
    """Transform ``fn`` to also return its gradient with respect to ``model``'s trainable
    parameters.

    Args:
        model (Module): The model whose trainable parameters are differentiated.
        fn (callable): A function of any arguments that uses ``model`` and returns a
            scalar (or a tuple whose first entry is the scalar).

    Returns:
        A function with ``fn``'s arguments returning ``(value, grads)``, where ``grads``
        has the structure of ``model.trainable_parameters()``.

    Example:
        >>> loss_and_grad = nn.value_and_grad(model, lambda x, y: mse(model(x), y))
        >>> loss, grads = loss_and_grad(x, y)
    """
    value_grad = mx.value_and_grad(_through_parameters(model, fn))

    @wraps(fn)
    def wrapped(*args, **kwargs):
        return value_grad(model.trainable_parameters(), *args, **kwargs)

    return wrapped


def checkpoint(module: Module, fn: Optional[Callable] = None) -> Callable:
    """Gradient checkpointing of a module's call: its activations are recomputed in the
    backward pass instead of being kept.

    Args:
        module (Module): The module whose parameters the call reads.
        fn (callable, optional): The function to checkpoint. Default: ``module``'s call.

    Returns:
        A function with ``fn``'s arguments and results.
    """
    if fn is None:
        # The class's __call__ bound to the module: calling `module` itself here would
        # recurse once a subclass replaces __call__ with this wrapper.
        fn = type(module).__call__.__get__(module)
    checkpointed = mx.checkpoint(_through_parameters(module, fn))

    @wraps(fn)
    def wrapped(*args, **kwargs):
        return checkpointed(module.trainable_parameters(), *args, **kwargs)

    return wrapped


def average_gradients(
    gradients: Any,
    group: Optional[Any] = None,
    all_reduce_size: int = 32 * 1024**2,
    communication_stream: Optional[Any] = None,
) -> Any:
    """Average a gradient tree over the processes of a distributed group.

    Small arrays are sent together: the tree's arrays, in ``tree_flatten`` order, are
    gathered into batches of one dtype, a batch closing once it holds at least
    ``all_reduce_size`` bytes (an array at least that big travels alone); each batch is
    flattened into one buffer, ``all_sum``-med once and divided by the group's size, then
    cut back into the arrays. One collective per batch instead of one per array is what
    makes a model of many small parameters cheap to synchronise. An integer array's
    average is floating point (the sum divided by the size), as in MLX.

    Args:
        gradients (Any): A tree of arrays, of the same structure on every process.
        group (optional): The process group. Default: the global group.
        all_reduce_size (int): The bytes at which a batch closes; ``<= 0`` sends every
            array on its own. Default: 32 MiB.
        communication_stream (optional): The stream of the ``all_sum`` calls. Default:
            the backend's.

    Returns:
        The averaged tree (the same tree, unchanged, for a group of one process).
    """
    group = mx.distributed.init() if group is None else group
    n = group.size()
    if n == 1:
        return gradients

    def mean(x):
        return mx.distributed.all_sum(x, group=group, stream=communication_stream) / n

    if all_reduce_size <= 0:
        return tree_map(mean, gradients)
    flat = tree_flatten(gradients)
    averaged = [None] * len(flat)
    batches, batch, nbytes = [], [], 0
    for i, (_, g) in enumerate(flat):
        if batch and flat[batch[0]][1].dtype != g.dtype:
            batches.append(batch)  # one buffer holds one dtype
            batch, nbytes = [], 0
        batch.append(i)
        nbytes += g.nbytes
        if nbytes >= all_reduce_size:
            batches.append(batch)
            batch, nbytes = [], 0
    if batch:
        batches.append(batch)
    for batch in batches:
        if len(batch) == 1:
            averaged[batch[0]] = mean(flat[batch[0]][1])
            continue
        arrays = [flat[i][1] for i in batch]
        buffer = mean(mx.concatenate([a.reshape(-1) for a in arrays]))
        cuts, total = [], 0
        for a in arrays[:-1]:
            total += a.size
            cuts.append(total)
        for i, a, piece in zip(batch, arrays, mx.split(buffer, cuts)):
            averaged[i] = piece.reshape(a.shape)
    return tree_unflatten([(k, a) for (k, _), a in zip(flat, averaged)])


def quantize(
    model: Module,
    group_size: Optional[int] = None,
    bits: Optional[int] = None,
    *,
    mode: str = "affine",
    quantize_input: bool = False,
    class_predicate: Optional[Callable[[str, Module], Any]] = None,
) -> None:
    """Replace the quantizable leaf layers of ``model`` (in place) by quantized ones.

    A layer is quantizable when it has ``to_quantized`` (``Linear`` → ``QuantizedLinear``,
    ``Embedding`` → ``QuantizedEmbedding``).

    Args:
        model (Module): The model, changed in place.
        group_size (int, optional): Elements sharing one scale (the mode's default if
            ``None``).
        bits (int, optional): Bits per element (the mode's default if ``None``).
        mode (str): The quantization mode (``"affine"``, ``"mxfp4"``, ...).
        quantize_input (bool): Quantize the inputs of the layer too (``QQLinear``).
        class_predicate (callable, optional): ``class_predicate(path, module)`` returns
            ``False`` to skip a layer, ``True`` to quantize it with the arguments above,
            or a dict of ``to_quantized`` arguments for that layer. Default: every layer
            with ``to_quantized``.
    """
    class_predicate = class_predicate or (lambda _, m: hasattr(m, "to_quantized"))

    def maybe_quantize(path, module):
        choice = class_predicate(path, module)
        if not choice:
            return module
        if not hasattr(module, "to_quantized"):
            raise ArgumentError(
                f"quantize: cannot quantize '{path}' of type {type(module).__name__}: it has "
                "no to_quantized method; exclude it with class_predicate")
        if isinstance(choice, dict):
            return module.to_quantized(**choice)
        return module.to_quantized(group_size=group_size, bits=bits, mode=mode,
                                   quantize_input=quantize_input)

    leaves = tree_map_with_path(maybe_quantize, model.leaf_modules(), is_leaf=Module.is_module)
    model.update_modules(leaves)
