"""Vectorising map: ``vmap``.

``vmap(fun)`` calls ``fun`` once on *placeholders*: arrays of the per-example
shape (the mapped axis removed) that stand for the mapped arguments and cannot
be evaluated. Then it replays the recorded graph from the placeholders to the
outputs: a node with a batched input is rebuilt by its primitive's ``vmap``
rule, a node without one (including everything already evaluated) is kept as
it is. The result is an ordinary lazy graph, so ``vmap`` nests and composes
with the other transforms.

The rule contract: ``vmap(inputs, axes) -> (outputs, out_axes)``. ``inputs``
are the node's inputs with the batched ones replaced by their batched arrays;
``axes[i]`` is the (non-negative) batch axis of ``inputs[i]`` or ``None`` when
that input is not batched (at least one is). Return one array per output and
the batch axis of each (``None`` for an output that does not depend on the
batch; the walker then broadcasts it).
"""

from __future__ import annotations

import functools
import itertools

from ..array import array, lazy, lazy_multi
from ..device import to_stream
from ..errors import ArgumentError, AxisError, ShapeError, TransformError
from ..scheduler import tracing as _tracing, unevaluated_order
from .placeholder import InputPlaceholder
from ..rules import add_batch_axis, move_batch_axis
from .autodiff import rebound
from .trees import broadcast_prefix, describe, flatten, leaf_paths, unflatten

__all__ = ["vmap", "Placeholder"]

_array = array
_seq = itertools.count(1)


class Placeholder(InputPlaceholder):
    """Stands for one example of a mapped argument while ``vmap`` traces the function."""

    __slots__ = ()
    message = (
        "[vmap] Cannot evaluate an array that depends on a mapped argument inside the "
        "function being vmapped (item(), printing, eval, NumPy conversion): its values "
        "exist only once vmap has returned.")


def _is_axis_spec(x) -> bool:
    return x is None or not isinstance(x, (list, tuple, dict))


def _axis_value(ax, where: str, what: str):
    if ax is None:
        return None
    if isinstance(ax, bool) or not isinstance(ax, int):
        if hasattr(ax, "__index__") and not isinstance(ax, bool):
            return ax.__index__()
        raise ArgumentError(f"[vmap] {what} for {where} must be an int or None, got {ax!r}.")
    return ax


def _arg_paths(treedef) -> list:
    """Leaf paths of the argument tuple written as ``argument 1['w']``."""
    out = []
    for p in leaf_paths(treedef):
        close = p.index("]")
        out.append(f"argument {p[1:close]}{p[close + 1:]}")
    return out


def _replay(outputs, mapped: dict, size: int) -> None:
    """Batch every node between the placeholders in ``mapped`` and ``outputs``.

    ``mapped`` maps ``id(array)`` to ``(replacement, axis)``; it is filled in for
    every node that depends on a placeholder. ``axis`` is None for a value a rule
    found to be the same for every example (an element count): it stays unbatched,
    as in MLX, and its consumers see it as an unbatched input. Broadcasting it to
    ``size`` here would bake the batch size into the graph, which a shapeless
    compile then replays at other sizes.
    """
    order = unevaluated_order(outputs)
    get = mapped.get
    for a in order:
        ins = a._inputs
        new_ins = None
        batched = False
        for i, x in enumerate(ins):
            m = get(id(x))
            if m is not None:
                if new_ins is None:
                    new_ins = list(ins)
                    axes = [None] * len(ins)
                new_ins[i] = m[0]
                axes[i] = m[1]
                batched = batched or m[1] is not None
        if new_ins is None:
            continue
        prim = a._prim
        sib = a._siblings
        outs = (a,) if sib is None else sib
        if not batched:  # only unbatched replacements: the same node on them
            res = [lazy(a._shape, a._dtype, prim, tuple(new_ins))] if sib is None else \
                lazy_multi([o._shape for o in sib], [o._dtype for o in sib], prim, tuple(new_ins))
            for o, b in zip(outs, res):
                mapped[id(o)] = (b, None)
            continue
        res, res_axes = prim.vmap(new_ins, axes)
        if len(res) != len(outs) or len(res_axes) != len(outs):
            raise TransformError(f"[{prim.name}.vmap] returned {len(res)} outputs and "
                                 f"{len(res_axes)} axes for a node with {len(outs)} outputs.")
        for j, (o, b, ax) in enumerate(zip(outs, res, res_axes)):
            s = o._shape
            if ax is None:
                want = s
            else:
                if ax < 0:
                    ax += len(b._shape)
                want = s[:ax] + (size,) + s[ax:]
            if b._shape != want or b._dtype is not o._dtype:
                raise TransformError(
                    f"[{prim.name}.vmap] output {j} has shape {b._shape} and dtype "
                    f"{b._dtype.name}; " + (f"unbatched (axis None) it needs shape {s}"
                                           if ax is None else
                                           f"batching shape {s} at axis {ax} over {size} "
                                           f"examples needs shape {want}")
                    + f" and dtype {o._dtype.name}.")
            mapped[id(o)] = (b, ax)


def vmap(fun, in_axes=0, out_axes=0):
    """Returns a vectorized version of ``fun``.

    Args:
        fun (Callable): A function which takes a variable number of arrays or
          trees of arrays and returns a variable number of arrays or trees of
          arrays.
        in_axes (int, optional): An integer or a valid prefix tree of the inputs
          to ``fun`` where each node specifies the vmapped axis. If the value is
          ``None`` then the corresponding input(s) are not vmapped. Defaults to
          ``0``.
        out_axes (int, optional): An integer or a valid prefix tree of the
          outputs of ``fun`` where each node specifies the vmapped axis. If the
          value is ``None`` then the corresponding output(s) are not vmapped
          (they must not depend on a mapped input). Defaults to ``0``.

    Returns:
        Callable: The vectorized function.

    Example:
        >>> mx.vmap(lambda x, y: x * y, in_axes=(0, None))(mx.ones((3, 2)), mx.ones(2)).shape
        (3, 2)
    """

    def vectorized(*args, **kwargs):
        if kwargs:
            raise ArgumentError(f"[vmap] Keyword arguments are not supported; got "
                                f"{sorted(kwargs)}. Pass them positionally (None in in_axes "
                                f"leaves an argument unmapped).")
        leaves, treedef = flatten(args)
        if len(args) == 1 and (isinstance(in_axes, dict) or (
                isinstance(in_axes, (list, tuple)) and len(in_axes) != 1)):
            # One argument: MLX matches in_axes against the argument itself, so a dict
            # or a nested tuple is that argument's tree (a 1-tuple still means "one
            # entry per argument", which reads the same).
            axes = broadcast_prefix(in_axes, treedef[1][0], "argument 0", "[vmap] in_axes",
                                    _is_axis_spec)
        elif isinstance(in_axes, (list, tuple)):
            if len(in_axes) != len(args):
                raise ArgumentError(f"[vmap] in_axes has {len(in_axes)} entries but the "
                                    f"function was called with {len(args)} argument(s).")
            axes = []
            for i, (spec, d) in enumerate(zip(in_axes, treedef[1])):
                axes.extend(broadcast_prefix(spec, d, f"argument {i}", "[vmap] in_axes",
                                             _is_axis_spec))
        elif isinstance(in_axes, dict):
            raise ArgumentError("[vmap] in_axes must be an int, None, or a tuple with one "
                                "entry per argument; got a dict (a dict matches the argument "
                                "itself only when there is one).")
        else:
            axes = [in_axes] * len(leaves)
        paths = None
        size = None
        first = None
        mapped: dict = {}
        new_leaves = list(leaves)
        for k, (x, ax) in enumerate(zip(leaves, axes)):
            if ax is None:
                continue
            if paths is None:
                paths = _arg_paths(treedef)
            ax = _axis_value(ax, paths[k], "in_axes")
            if not isinstance(x, _array):
                raise ArgumentError(f"[vmap] {paths[k]} is {describe(x)}: only arrays can be "
                                    f"mapped (give it None in in_axes).")
            s = x._shape
            nd = len(s)
            if not -nd <= ax < nd:
                raise AxisError(f"[vmap] in_axes {ax} is out of bounds for {paths[k]} of shape "
                                f"{s}.")
            ax %= nd
            if size is None:
                size, first = s[ax], (paths[k], ax)
            elif s[ax] != size:
                raise ShapeError(f"[vmap] Inconsistent sizes of the mapped axes: {first[0]} has "
                                 f"size {size} along axis {first[1]} but {paths[k]} has size "
                                 f"{s[ax]} along axis {ax}.")
            p = x._prim
            ph = lazy(s[:ax] + s[ax + 1:], x._dtype,
                      Placeholder(p.stream if p is not None else to_stream(None),
                                  s[:ax] + s[ax + 1:], next(_seq)), ())
            mapped[id(ph)] = (x, ax)
            new_leaves[k] = ph
        if size is None:
            raise ArgumentError("[vmap] At least one of in_axes must be non-None: no argument "
                                "is mapped.")
        placeholders = [(x, x._prim) for x in new_leaves
                        if isinstance(x, _array) and type(x._prim) is Placeholder]
        _tracing.depth += 1
        try:
            out = fun(*unflatten(treedef, new_leaves))
        finally:
            _tracing.depth -= 1
        # ``x[idx] = v`` on a mapped argument moves its placeholder to another object.
        for x, p in placeholders:
            if x._prim is not p:
                mapped[id(rebound([x], [p])[0])] = mapped.pop(id(x))
        out_leaves, out_def = flatten(out)
        out_paths = leaf_paths(out_def)
        for x, p in zip(out_leaves, out_paths):
            if not isinstance(x, _array):
                raise ArgumentError(f"[vmap] The function must return arrays or trees of "
                                    f"arrays; output{p} is {describe(x)}.")
        spec = out_axes
        if out_def is None and isinstance(spec, (list, tuple)) and len(spec) == 1 \
                and _is_axis_spec(spec[0]):
            spec = spec[0]  # MLX reads (axis,) at a single array as axis
        oaxes = broadcast_prefix(spec, out_def, "output",
                                 "[vmap] out_axes", _is_axis_spec)
        _replay(out_leaves, mapped, size)
        results = []
        for x, oa, p in zip(out_leaves, oaxes, out_paths):
            oa = _axis_value(oa, f"output{p}", "out_axes")
            m = mapped.get(id(x))
            if m is not None and m[1] is None:  # the same for every example
                x, m = m[0], None
            if oa is None:
                if m is not None:
                    raise ArgumentError(f"[vmap] out_axes is None for output{p}, but it depends "
                                        f"on a mapped argument.")
                results.append(x)
                continue
            nd = len(x._shape) + 1
            if not -nd <= oa < nd:
                raise AxisError(f"[vmap] out_axes {oa} is out of bounds for output{p}, which "
                                f"has {nd} dimensions once batched (shape {x._shape} per "
                                f"example).")
            oa %= nd
            if m is None:
                results.append(add_batch_axis(x, oa, size))
            else:
                b, ax = m
                results.append(move_batch_axis(b, ax, oa))
        return unflatten(out_def, results)

    return functools.update_wrapper(vectorized, fun)
