"""Helpers for writing a primitive's ``vjp``, ``jvp`` and ``vmap`` rules.

The rules of most primitives share a handful of moves: summing a cotangent
back over the dimensions broadcasting added, broadcasting a tangent to the
output, adding contributions where ``None`` means zero, and putting batch
axes where an operation expects them. They live here once, for the built-in
packs and plugins alike::

    from lazyx.rules import sum_to_shape, batch_first

Everything is written with ``lazyx.core`` ops, so what a helper returns is a
lazy graph that other transforms can walk again. ``None`` stands for a zero
cotangent or tangent throughout (the walkers read it so), and helpers pass it
through. Batch axes are non-negative, as the ``vmap`` walker gives them.
"""

from __future__ import annotations

from . import ops

__all__ = ["sum_to_shape", "broadcast_to_shape", "add_tangents", "batch_size", "batch_first",
           "move_batch_axis", "add_batch_axis", "batched_axes", "align_batched", "NoGradient"]


# -- reverse and forward mode -------------------------------------------------------
def sum_to_shape(x, shape: tuple, stream=None):
    """Sum ``x`` over the dimensions that broadcasting added to ``shape``.

    This is the cotangent of an operand of shape ``shape`` that was broadcast
    to ``x``'s shape: the leading dimensions ``x`` has beyond ``shape`` and the
    dimensions where ``shape`` has 1 (and ``x`` does not) are summed.

    Args:
        x (array or None): The cotangent of the broadcast result (None: zero).
        shape (tuple(int)): The operand's shape; ``x``'s shape must be a
          broadcast of it.
        stream: Where the sums run.

    Returns:
        array or None: ``x`` reduced to ``shape`` (``x`` itself when the shapes
        match, None for None).
    """
    if x is None:
        return None
    sx = x._shape
    if sx == shape:
        return x
    lead = len(sx) - len(shape)
    inner = [lead + i for i, n in enumerate(shape) if n == 1 and sx[lead + i] != 1]
    if not inner:  # only leading dimensions: one reduction, no reshape
        return ops.sum(x, axis=list(range(lead)), stream=stream)
    x = ops.sum(x, axis=list(range(lead)) + inner, keepdims=True, stream=stream)
    return ops.reshape(x, shape, stream=stream)


def broadcast_to_shape(x, shape: tuple, stream=None):
    """``x`` broadcast to ``shape``: a tangent of an operand made a tangent of the
    broadcast output (None, zero, stays None; a matching shape is returned as is)."""
    if x is None or x._shape == shape:
        return x
    return ops.broadcast_to(x, shape, stream=stream)


def add_tangents(a, b, stream=None):
    """``a + b`` for tangents or cotangents of one array, where None is zero."""
    if a is None:
        return b
    return a if b is None else ops.add(a, b, stream=stream)


# -- vmap ------------------------------------------------------------------------------
def batch_size(inputs, axes) -> int:
    """The number of examples: the size of the first batched input's batch axis."""
    return next(x._shape[a] for x, a in zip(inputs, axes) if a is not None)


def move_batch_axis(x, axis: int, to: int, stream=None):
    """``x`` with its batch axis moved from ``axis`` to ``to`` (no node when equal)."""
    return x if axis == to else ops.moveaxis(x, axis, to, stream=stream)


def batch_first(x, axis: int, ndim: int | None = None, stream=None):
    """Batched ``x`` with its batch axis moved to the front.

    With ``ndim``, size-1 dimensions are inserted behind the batch axis until
    ``x`` has ``ndim`` per-example dimensions, so that broadcasting it against
    unbatched operands of rank ``ndim`` lines the per-example dimensions up
    (NumPy broadcasting aligns trailing dimensions).

    Args:
        x (array): A batched array.
        axis (int): Its batch axis (non-negative).
        ndim (int, optional): The per-example rank to pad to.
        stream: Where the reshapes run.

    Returns:
        array: ``x`` with the batch at axis 0.
    """
    if axis:
        x = ops.moveaxis(x, axis, 0, stream=stream)
    if ndim is not None:
        pad = ndim + 1 - len(x._shape)
        if pad > 0:  # expand_dims, not a reshape: a shapeless compile replays it at any size
            x = ops.expand_dims(x, tuple(range(1, 1 + pad)), stream=stream)
    return x


def add_batch_axis(x, axis: int, size: int, stream=None):
    """Unbatched ``x`` repeated ``size`` times along a new batch axis ``axis`` (a
    broadcast, no copy): the batched form of a value that is the same for every example."""
    s = x._shape
    return ops.broadcast_to(ops.expand_dims(x, axis, stream=stream), s[:axis] + (size,) + s[axis:],
                           stream=stream)


def batched_axes(axes, batch_axis: int) -> tuple:
    """The per-example (non-negative) ``axes`` as axes of the batched array whose
    batch sits at ``batch_axis``: those at or behind it shift by one."""
    return tuple(a + (a >= batch_axis) for a in axes)


def align_batched(inputs, axes, front: bool = False):
    """The operands of a broadcasting (element-wise) op, arranged so that
    broadcasting them puts the batch on one axis of the result.

    Operands batched on one common axis ``k`` with the full per-example rank are
    left alone when every unbatched operand broadcasts against their
    per-example axes (always so for ``k == 0``); otherwise batch axes move to
    the front and ones are inserted behind them up to the largest per-example
    rank (:func:`batch_first`).

    Args:
        inputs (list(array)): The operands, batched or not.
        axes (list(int or None)): The batch axis of each operand (None: unbatched).
        front (bool): Always put the batch at axis 0.

    Returns:
        tuple(list(array), int): The operands and the batch axis of their
        broadcast.
    """
    ranks = [x.ndim if a is None else x.ndim - 1 for x, a in zip(inputs, axes)]
    rank = max(ranks)
    k = None
    for a, r in zip(axes, ranks):
        if a is not None:
            if (k is not None and a != k) or r != rank:
                k = -1
                break
            k = a
    if k == 0 or (k is not None and k > 0 and not front
                  and all(a is not None or k <= rank - r for a, r in zip(axes, ranks))):
        return list(inputs), k
    return [x if a is None else batch_first(x, a, rank) for x, a in zip(inputs, axes)], 0


# -- primitives without a gradient ------------------------------------------------------
class NoGradient:
    """Mixin of primitives that carry no gradient: piecewise-constant functions,
    comparisons, integer- or bool-valued results, random draws.

    Their cotangents and tangents are zero, which the rules say with None. It
    sets ``differentiable = False``, which tells the registry-wide transform
    test to check only that gradients are zero. Put it first among the bases
    (``class Floor(NoGradient, Unary)``) so its rules win.
    """

    __slots__ = ()
    differentiable = False

    def vjp(self, primals, cotangents, argnums, outputs):
        return [None] * len(argnums)

    def jvp(self, primals, tangents, argnums):
        return [None] * len(self.output_shapes(primals))
