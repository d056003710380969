"""``custom_function`` and ``checkpoint``: functions with their own transform rules.

A call of a :class:`custom_function` becomes one node of the graph, a
:class:`CustomTransforms` primitive whose inputs are the arrays among the
arguments. The node holds the outputs the wrapped function built and
evaluates them when it is evaluated, so the transforms never look inside it:
they call its rules, which are the user's ``vjp``/``jvp``/``vmap`` where given,
and otherwise transform the wrapped function itself (traced again on the
node's inputs). Arrays the function captures, and keyword arguments, are
constants to the transforms.

``checkpoint`` is a custom function whose ``vjp`` recomputes the forward pass
(after the cotangents exist, through :class:`Depends`), so its intermediates
are freed after the forward pass instead of being kept for the backward pass.
"""

from __future__ import annotations

import functools

from .. import ops

from ..array import array, lazy, lazy_multi
from ..device import to_stream
from ..errors import ArgumentError, TransformError
from ..primitive import Primitive, Size
from ..scheduler import eval_arrays
from . import autodiff
from .trees import broadcast_prefix, describe, flatten, leaf_paths, unflatten
from .vmap import vmap as _vmap

__all__ = ["custom_function", "checkpoint", "depends", "CustomTransforms", "Depends"]

_array = array


class _Call:
    """How one call of a custom function maps its arguments to the node's inputs."""

    __slots__ = ("fun", "treedef", "template", "slots", "kwargs", "out_def")

    def __init__(self, fun, treedef, template, slots, kwargs, out_def):
        self.fun = fun
        self.treedef = treedef
        self.template = template  # the argument leaves, None where the node has an input
        self.slots = slots        # positions of the array leaves among the leaves
        self.kwargs = kwargs
        self.out_def = out_def

    def args(self, values, constants: bool = True) -> tuple:
        """The positional arguments with ``values`` at the array positions (and None
        at the others unless ``constants``)."""
        leaves = list(self.template) if constants else [None] * len(self.template)
        for k, v in zip(self.slots, values):
            leaves[k] = v
        return unflatten(self.treedef, leaves)

    def flat(self, *inputs) -> list:
        """The wrapped function on node inputs ``inputs``, its outputs flattened."""
        out = self.fun(*self.args(inputs), **self.kwargs)
        leaves, d = flatten(out)
        if d != self.out_def:
            raise TransformError("[custom_function] The function returned a different output "
                                 "structure when traced again.")
        return leaves

    def partial(self, inputs, argnums):
        """:meth:`flat` as a function of the inputs at ``argnums`` only."""
        def f(*xs):
            full = list(inputs)
            for i, x in zip(argnums, xs):
                full[i] = x
            return self.flat(*full)
        return f

    def per_input(self, res, what: str) -> list:
        """One value per node input from ``res``, a tree shaped like the arguments
        (a single argument may be returned bare)."""
        d = self.treedef
        if len(d[1]) == 1 and not (type(res) in (tuple, list) and len(res) == 1):
            res = (res,)
        vals = _match(d, res, "", what)
        return [vals[k] for k in self.slots]

    def per_output(self, res, what: str) -> list:
        d = self.out_def
        if d is None and type(res) in (tuple, list) and len(res) == 1:
            res = res[0]
        return _match(d, res, "", what)


def _match(d, value, path: str, what: str) -> list:
    """The values of ``value`` at the leaves of treedef ``d``."""
    out: list = []
    stack = [(d, value, path)]
    while stack:
        d, v, p = stack.pop()
        if d is None:
            out.append(v)
        elif d[0] is dict:
            if not isinstance(v, dict) or set(v) != set(d[1]):
                raise ArgumentError(f"[custom_function] {what}{p} must be a dict with keys "
                                    f"{list(d[1])}, got {describe(v)}.")
            stack.extend(reversed([(c, v[k], f"{p}[{k!r}]") for k, c in zip(d[1], d[2])]))
        else:
            if not isinstance(v, (list, tuple)) or len(v) != len(d[1]):
                raise ArgumentError(f"[custom_function] {what}{p} must be a sequence of "
                                    f"{len(d[1])} entries, got {describe(v)}.")
            stack.extend(reversed([(c, x, f"{p}[{i}]") for i, (c, x) in enumerate(zip(d[1], v))]))
    return out


def _unwrap(args: tuple):
    return args[0] if len(args) == 1 else args


class CustomTransforms(Primitive):
    """One call of a :class:`custom_function`: its outputs, with the function's rules."""

    # ``fn`` and ``call`` are parameters so that no two calls count as equivalent.
    __slots__ = ("fn", "call", "_pending", "_shapes")
    # Python objects: a file cannot hold them, so export refuses this primitive.
    fn: custom_function
    call: _Call

    def __init__(self, stream, fn: "custom_function", call: _Call, pending: list):
        self.stream = stream
        self.fn = fn
        self.call = call
        self._pending = pending  # the outputs the function built, until evaluated
        self._shapes = [o._shape for o in pending]

    def output_shapes(self, inputs):
        return list(self._shapes)

    def eval_cpu(self, inputs):
        outs = self._pending
        if outs is None:
            raise TransformError("[custom_function] This node was already evaluated.")
        eval_arrays(outs)
        self._pending = None
        if len(outs) == 1:
            return outs[0]._data
        return tuple(o._data for o in outs)

    eval_gpu = eval_cpu

    def vjp(self, primals, cotangents, argnums, outputs):
        fn = self.fn
        call = self.call
        if fn._flat_vjp is not None:
            return fn._flat_vjp(call, primals, cotangents, argnums)
        if fn._vjp is None:
            return autodiff.vjp(call.partial(primals, argnums), [primals[i] for i in argnums],
                                cotangents)[1]
        res = fn._vjp(_unwrap(call.args(primals)), unflatten(call.out_def, cotangents),
                      unflatten(call.out_def, outputs), **call.kwargs)
        grads = call.per_input(res, "the vjp's result")
        return [grads[i] for i in argnums]

    def jvp(self, primals, tangents, argnums):
        fn = self.fn
        call = self.call
        if fn._jvp is None:
            return autodiff.jvp(call.partial(primals, argnums), [primals[i] for i in argnums],
                                tangents)[1]
        full = [None] * len(primals)
        for i, t in zip(argnums, tangents):
            full[i] = t
        full = [ops.zeros_like(p) if t is None else t for p, t in zip(primals, full)]
        res = fn._jvp(_unwrap(call.args(primals)), _unwrap(call.args(full, False)),
                      **call.kwargs)
        return call.per_output(res, "the jvp's result")

    def vmap(self, inputs, axes):
        fn = self.fn
        call = self.call
        if fn._vmap is None:
            outs = _vmap(call.flat, in_axes=tuple(axes))(*inputs)
            return outs, [0] * len(outs)
        res = fn._vmap(_unwrap(call.args(inputs)), _unwrap(call.args(axes, False)),
                       **call.kwargs)
        if type(res) not in (tuple, list) or len(res) != 2:
            raise ArgumentError(f"[custom_function] The vmap function must return "
                                f"(outputs, out_axes), got {describe(res)}.")
        outs = call.per_output(res[0], "the vmap's outputs")
        oaxes = broadcast_prefix(res[1], call.out_def, "the vmap's out_axes",
                                 "[custom_function] out_axes",
                                 lambda x: x is None or not isinstance(x, (list, tuple, dict)))
        return outs, oaxes


class custom_function:
    """Set up a function for custom gradient and vmap definitions.

    Meant to be used as a decorator. Calling the result behaves exactly as the
    wrapped function; under a transform (``grad``, ``vjp``, ``jvp``, ``vmap``)
    the rules given with :meth:`vjp`, :meth:`jvp` and :meth:`vmap` are used
    instead of transforming the function. Each rule is optional: a missing one
    transforms the wrapped function as usual.

    The rules receive the positional arguments as ``primals`` (the argument
    itself when there is only one, else a tuple) and the keyword arguments as
    keyword arguments:

    * ``vjp(primals, cotangents, outputs, **kwargs)`` returns the cotangents
      of the primals (structured like ``primals``; ``None`` for no gradient);
      ``cotangents`` and ``outputs`` are structured like the function's output;
    * ``jvp(primals, tangents, **kwargs)`` returns the output tangents;
    * ``vmap(inputs, axes, **kwargs)`` returns ``(outputs, out_axes)``.

    The function is pure to the transforms: arrays it captures and keyword
    arguments are constants (no gradient flows to them).

    Example:
        >>> @mx.custom_function
        ... def f(x, y):
        ...     return mx.sin(x) * y
        >>> @f.vjp
        ... def f_vjp(primals, cotangent, output):
        ...     x, y = primals
        ...     return cotangent * mx.cos(x) * y, cotangent * mx.sin(x)
    """

    def __init__(self, f):
        if not callable(f):
            raise ArgumentError(f"[custom_function] Expected a callable, got {describe(f)}.")
        self._fun = f
        self._vjp = None
        self._jvp = None
        self._vmap = None
        self._flat_vjp = None
        functools.update_wrapper(self, f)

    def __call__(self, *args, **kwargs):
        leaves, treedef = flatten(args)
        slots = [k for k, x in enumerate(leaves) if isinstance(x, _array)]
        out = self._fun(*args, **kwargs)
        if not slots:
            return out
        out_leaves, out_def = flatten(out)
        for x, p in zip(out_leaves, leaf_paths(out_def)):
            if not isinstance(x, _array):
                raise ArgumentError(f"[custom_function] The function must return arrays or "
                                    f"trees of arrays; output{p} is {describe(x)}.")
        if not out_leaves:
            return out
        template = list(leaves)
        for k in slots:
            template[k] = None
        call = _Call(self._fun, treedef, template, slots, kwargs, out_def)
        inputs = tuple(leaves[k] for k in slots)
        prim = CustomTransforms(to_stream(None), self, call, out_leaves)
        if len(out_leaves) == 1:
            o = out_leaves[0]
            outs = [lazy(o._shape, o._dtype, prim, inputs)]
        else:
            outs = lazy_multi([o._shape for o in out_leaves], [o._dtype for o in out_leaves],
                              prim, inputs)
        return unflatten(out_def, outs)

    def vjp(self, f):
        """Set the vector-Jacobian product: ``f(primals, cotangents, outputs, **kwargs)``."""
        self._vjp = f
        return self

    def jvp(self, f):
        """Set the Jacobian-vector product: ``f(primals, tangents, **kwargs)``."""
        self._jvp = f
        return self

    def vmap(self, f):
        """Set the vectorised form: ``f(inputs, axes, **kwargs) -> (outputs, out_axes)``."""
        self._vmap = f
        return self

    def __repr__(self) -> str:
        return f"custom_function({getattr(self._fun, '__qualname__', self._fun)!r})"


# -- depends / checkpoint -----------------------------------------------------------
class Depends(Primitive):
    """Its first ``n`` inputs unchanged, evaluated only once the others are.

    Gives the scheduler an order: a graph built on the outputs waits for the
    extra inputs (used by :func:`checkpoint` to recompute after the cotangents).
    """

    __slots__ = ("n",)
    n: Size

    def output_shapes(self, inputs):
        return [x.shape for x in inputs[:self.n]]

    def eval_cpu(self, inputs):
        return inputs[0] if self.n == 1 else tuple(inputs[:self.n])

    eval_gpu = eval_cpu

    def vjp(self, primals, cotangents, argnums, outputs):
        return [cotangents[i] if i < self.n else None for i in argnums]

    def jvp(self, primals, tangents, argnums):
        out = [None] * self.n
        for i, t in zip(argnums, tangents):
            if i < self.n:
                out[i] = t
        return out

    def vmap(self, inputs, axes):
        return depends(inputs[:self.n], inputs[self.n:]), list(axes[:self.n])


def depends(arrays, dependencies) -> list:
    """``arrays`` unchanged (no copy), as new arrays evaluated only after ``dependencies``."""
    arrays = list(arrays)
    n = len(arrays)
    if not n:
        return []
    prim = Depends(to_stream(None), n)
    inputs = tuple(arrays) + tuple(dependencies)
    if n == 1:
        a = arrays[0]
        return [lazy(a._shape, a._dtype, prim, inputs)]
    return lazy_multi([a._shape for a in arrays], [a._dtype for a in arrays], prim, inputs)


def _recompute_vjp(call: _Call, primals, cotangents, argnums):
    waiting = depends([primals[i] for i in argnums], cotangents)
    grads = autodiff.vjp(call.partial(primals, argnums), waiting, cotangents)[1]
    # One node for all the cotangents: whichever the scheduler needs first, the
    # others are computed with it, so the recomputed intermediates die at once
    # (not when, say, a weight's gradient is finally asked for).
    return depends(grads, ()) if len(grads) > 1 else grads


def checkpoint(fun):
    """Transform the passed callable to one that performs gradient checkpointing
    with respect to the inputs of the callable.

    The intermediates of ``fun`` are not kept for the backward pass: the
    gradient recomputes them, trading computation for memory.

    Args:
        fun (Callable): The function to checkpoint. Gradients flow to the arrays
          among its positional arguments (trees included), not to arrays it
          captures.

    Returns:
        Callable: A function that recomputes intermediate states during gradient
        computation.
    """
    cf = custom_function(fun)
    cf._flat_vjp = _recompute_vjp

    @functools.wraps(fun)
    def checkpointed(*args, **kwargs):
        return cf(*args, **kwargs)

    return checkpointed
