"""Automatic differentiation: ``vjp``, ``jvp``, ``grad`` and ``value_and_grad``.

One walker per mode, over the graph the user's function records:

1. Each primal is wrapped in a fresh :class:`TraceInput` node (the identity of
   the primal, sharing its buffer when it has one). The walk recognises the
   inputs by the identity of these wrappers, so passing one array twice gives
   two gradients, and an enclosing transform still sees through them (which is
   what makes ``grad(grad(f))`` work).
2. The function runs under :data:`lazyx.scheduler.retain_graph`, so ``item()``,
   printing or ``eval`` inside it keep the nodes the walk needs.
3. An iterative depth-first walk from the outputs orders the nodes (through
   evaluated-but-retained ones) and stops at leaves and at the wrappers.
4. Reverse mode accumulates cotangents from the outputs back, calling each
   primitive's ``vjp`` once per node; forward mode pushes tangents forward with
   ``jvp``. The rules build lazy graphs with ``lazyx.core`` ops, so the results
   can be transformed again.
5. When no enclosing transform is tracing, the nodes evaluated while retained
   are detached afterwards: nothing lives longer than it would without the
   transform.

The rule contract (also in :mod:`lazyx.primitive`):

* ``vjp(primals, cotangents, argnums, outputs) -> list``: ``cotangents`` holds one
  array per output (zeros for outputs that received none); return one entry per
  index in ``argnums``: an array of that input's shape, or ``None`` for "no
  gradient" (zero).
* ``jvp(primals, tangents, argnums) -> list``: ``tangents`` are aligned with
  ``argnums``; return one entry per output: an array of that output's shape, or
  ``None`` for zero.
* Integer and boolean outputs computed from floating inputs carry no gradient:
  the walkers give them zero cotangents and tangents without calling the rule.
  Integer computations on integer inputs are differentiated as MLX does.
"""

from __future__ import annotations

import functools
import itertools

from .. import ops

from .. import scheduler as _scheduler
from ..arguments import constant
from ..array import array, lazy
from ..device import to_stream
from ..errors import ArgumentError, ShapeError, TransformError
from ..primitive import Primitive
from .trees import count_leaves, describe, flatten, leaf_paths, unflatten

__all__ = ["vjp", "jvp", "grad", "value_and_grad", "TraceInput"]

_array = array
_retain = _scheduler.retain_graph
_seq = itertools.count(1)
_NO_GRAD_KINDS = "biu"


class TraceInput(Primitive):
    """A transform's handle on one primal: the identity of its input.

    Wrappers are numbered in creation order; a walk stops at its own wrappers and
    at older ones (which cannot depend on its inputs) and sees through newer ones
    (those of transforms nested inside the function).
    """

    __slots__ = ("seq",)
    seq: int

    # An identity: a compiled tape drops it (inlined copies would stop later walks).
    def is_noop(self, inputs):
        return True

    def output_shapes(self, inputs):
        return [inputs[0].shape]

    def eval_cpu(self, inputs):
        return inputs[0]

    eval_gpu = eval_cpu

    def vjp(self, primals, cotangents, argnums, outputs):
        return [cotangents[0]]

    def jvp(self, primals, tangents, argnums):
        return [tangents[0]]

    def vmap(self, inputs, axes):
        return [inputs[0]], [axes[0]]


def wrap_primals(primals) -> tuple[list, int]:
    """Fresh :class:`TraceInput` wrappers of ``primals`` and the last sequence number."""
    out = []
    seq = 0
    for p in primals:
        seq = next(_seq)
        pp = p._prim
        w = lazy(p._shape, p._dtype, TraceInput(pp.stream if pp is not None else to_stream(None),
                                                seq), (p,))
        d = p._data
        if d is not None:
            w._data = d
        out.append(w)
    return out, seq


def rebound(handles: list, nodes: list) -> list:
    """The arrays that hold the primitives ``nodes`` of the arrays ``handles`` now.

    ``x[idx] = v`` rebinds the Python object ``x`` to the update and moves its
    previous node to a new object in the update's graph: when ``x`` is a
    transform's handle on an argument, the walk must start from that object.
    """
    out = handles
    for k, (h, p) in enumerate(zip(handles, nodes)):
        if h._prim is not p:
            if out is handles:
                out = list(handles)
            out[k] = _holder(h, p)
    return out


def _holder(root, prim):
    """The array of ``root``'s graph whose node is ``prim`` (``root`` if none is)."""
    stack = [root]
    seen = {id(root)}
    while stack:
        a = stack.pop()
        if a._prim is prim:
            return a
        for x in a._inputs or ():
            if id(x) not in seen:
                seen.add(id(x))
                stack.append(x)
    return root


# -- the walk ----------------------------------------------------------------------
def graph_order(outputs, stop: int, active: set | None = None):
    """The nodes between ``outputs`` and the wrappers numbered ``<= stop``, inputs first.

    One array stands for each node (multi-output nodes appear once). Evaluated
    nodes whose graph was retained are walked through; leaves end the walk.
    With ``active`` (ids of arrays, which grows), also returns the nodes of the
    order that depend on them: ``(order, live)``.
    """
    order = []
    live = []
    seen = set()
    add = seen.add
    emit = order.append
    trace = TraceInput
    tracking = active is not None
    for r in outputs:
        p = r._prim
        if p is None or id(r) in seen or (type(p) is trace and p.seq <= stop):
            continue
        # Each entry holds a node and the iterator over its inputs, resumed where it
        # stopped: a node is pushed once and popped once.
        stack = [(r, iter(r._inputs))]
        push = stack.append
        while stack:
            a, it = stack[-1]
            for x in it:
                xp = x._prim
                if xp is None or id(x) in seen or (type(xp) is trace and xp.seq <= stop):
                    continue
                push((x, iter(x._inputs)))
                break
            else:
                stack.pop()
                sib = a._siblings
                if sib is None:
                    add(id(a))
                else:
                    for s in sib:
                        add(id(s))
                emit(a)
                # Inputs come first in the order, so theirs are already known. A
                # stop_gradient output depends on nothing (MLX): indices behind one do not
                # count as differentiated (Gather and co. raise for those that do).
                if tracking and not getattr(a._prim, "cuts_dependence", False):
                    for x in a._inputs:
                        if id(x) in active:
                            live.append(a)
                            if sib is None:
                                active.add(id(a))
                            else:
                                for s in sib:
                                    active.add(id(s))
                            break
    return (order, live) if tracking else order


def _no_gradient(outs, ins, argnums) -> bool:
    """Integer/bool outputs of a node with a floating differentiated input carry nothing."""
    for o in outs:
        if o._dtype.kind not in _NO_GRAD_KINDS:
            return False
    for i in argnums:
        if ins[i]._dtype.kind not in _NO_GRAD_KINDS:
            return True
    return False


def _checked(prim, rule: str, g, like: array, what: str, i: int, cast: bool = True) -> array:
    """``g`` as a cotangent/tangent for ``like``: a shape check and (``cast``) a cast to
    its dtype. Tangents keep the dtype their rule gives, as in MLX (an int primal with a
    float tangent has float tangents downstream); cotangents take their input's."""
    if type(g) is not _array and not isinstance(g, _array):
        raise TransformError(f"[{prim.name}.{rule}] returned {describe(g)} for {what} {i}; "
                             f"expected an array or None.")
    if g._shape != like._shape:
        raise TransformError(f"[{prim.name}.{rule}] returned shape {g._shape} for {what} {i}, "
                             f"which has shape {like._shape}.")
    if cast and g._dtype is not like._dtype:
        g = ops.astype(g, like._dtype)
    return g


def backward(outputs: list, cotangents: list, wrappers: list, stop: int):
    """Reverse mode over the recorded graph.

    Returns the cotangent of each wrapper (None where nothing flowed) and the
    node order (for :func:`release`).
    """
    active = {id(w) for w in wrappers}
    order, live = graph_order(outputs, stop, active)
    cot: dict = {}
    for o, c in zip(outputs, cotangents):
        k = id(o)
        if k in active:
            prev = cot.get(k)
            cot[k] = c if prev is None else ops.add(prev, c)
    pop = cot.pop
    get = cot.get
    add = ops.add
    arr = _array
    # Every bytecode of this loop runs once per node: the common nodes (one output,
    # one input, or two inputs) take short paths; the checks are the same for all.
    for a in reversed(live):
        ins = a._inputs
        if a._siblings is None:
            c = pop(id(a), None)
            if c is None:
                continue
            if len(ins) == 1:
                if a._dtype.kind in _NO_GRAD_KINDS and _no_gradient((a,), ins, (0,)):
                    continue
                res = a._prim.vjp([ins[0]], [c], [0], [a])
                if len(res) != 1:
                    _wrong_count(a._prim, res, [0])
                g = res[0]
                if g is not None:
                    x = ins[0]
                    if type(g) is not arr or g._dtype is not x._dtype or g._shape != x._shape:
                        g = _checked(a._prim, "vjp", g, x, "input", 0)
                    kx = id(x)
                    prev = get(kx)
                    cot[kx] = g if prev is None else add(prev, g)
                continue
            if len(ins) == 2:
                if id(ins[0]) in active:
                    argnums = [0, 1] if id(ins[1]) in active else [0]
                else:
                    argnums = [1]
            else:
                argnums = [i for i, x in enumerate(ins) if id(x) in active]
            if a._dtype.kind in _NO_GRAD_KINDS and _no_gradient((a,), ins, argnums):
                continue
            outs = [a]
            cots = [c]
        else:
            sib = a._siblings
            cots = [pop(id(s), None) for s in sib]
            if all(c is None for c in cots):
                continue
            outs = list(sib)
            argnums = [i for i, x in enumerate(ins) if id(x) in active]
            if _no_gradient(outs, ins, argnums):
                continue
            cots = [ops.zeros_like(s) if c is None else c for s, c in zip(outs, cots)]
        prim = a._prim
        res = prim.vjp(list(ins), cots, argnums, outs)
        if len(res) != len(argnums):
            _wrong_count(prim, res, argnums)
        for i, g in zip(argnums, res):
            if g is None:
                continue
            x = ins[i]
            if type(g) is not arr or g._dtype is not x._dtype or g._shape != x._shape:
                g = _checked(prim, "vjp", g, x, "input", i)
            kx = id(x)
            prev = get(kx)
            cot[kx] = g if prev is None else add(prev, g)
    return [get(id(w)) for w in wrappers], order


def _wrong_count(prim, res, argnums):
    raise TransformError(f"[{prim.name}.vjp] returned {len(res)} cotangents for argnums "
                         f"{argnums}; expected one per argnum.")


def forward(outputs: list, wrappers: list, tangents: list, stop: int):
    """Forward mode over the recorded graph: the tangent of each output (None for zero)."""
    order = graph_order(outputs, stop)
    tan = {id(w): t for w, t in zip(wrappers, tangents)}
    for a in order:
        ins = a._inputs
        argnums = [i for i, x in enumerate(ins) if id(x) in tan]
        if not argnums:
            continue
        sib = a._siblings
        outs = (a,) if sib is None else sib
        if _no_gradient(outs, ins, argnums):
            continue
        prim = a._prim
        res = prim.jvp(list(ins), [tan[id(ins[i])] for i in argnums], argnums)
        if len(res) != len(outs):
            raise TransformError(f"[{prim.name}.jvp] returned {len(res)} tangents for a node "
                                 f"with {len(outs)} outputs; expected one per output.")
        for j, (o, t) in enumerate(zip(outs, res)):
            if t is not None:
                if type(t) is not _array or t._shape != o._shape:
                    t = _checked(prim, "jvp", t, o, "output", j, cast=False)
                tan[id(o)] = t
    return [tan.get(id(o)) for o in outputs], order


def release(order: list, wrappers: list) -> None:
    """Detach the nodes evaluated while the graph was retained (no transform is tracing)."""
    kept = _scheduler.retained
    if kept:
        for r in kept:
            a = r()
            if a is not None and a._prim is not None and a._data is not None:
                _detach(a)
        kept.clear()
    for a in order:
        if a._data is not None and a._prim is not None:
            _detach(a)
    stack = list(wrappers)
    while stack:
        a = stack.pop()
        if a._data is None or a._prim is None:
            continue
        stack.extend(a._inputs)
        _detach(a)


def _detach(a: array) -> None:
    sib = a._siblings
    for s in (a,) if sib is None else sib:
        s._prim = None
        s._inputs = None
        s._siblings = None


# -- argument checks -----------------------------------------------------------------
def _array_list(xs, op: str, name: str) -> list:
    if not isinstance(xs, (list, tuple)):
        raise ArgumentError(f"[{op}] {name} must be a list of arrays, got {describe(xs)}.")
    for i, x in enumerate(xs):
        if not isinstance(x, _array):
            raise ArgumentError(f"[{op}] {name}[{i}] must be an array, got {describe(x)}.")
    return list(xs)


def _outputs(out, op: str) -> list:
    if isinstance(out, _array):
        return [out]
    if isinstance(out, (list, tuple)):
        for i, o in enumerate(out):
            if not isinstance(o, _array):
                raise ArgumentError(f"[{op}] The function must return an array or a list of "
                                    f"arrays; output {i} is {describe(o)}.")
        return list(out)
    raise ArgumentError(f"[{op}] The function must return an array or a list of arrays; "
                        f"it returned {describe(out)}.")


# -- vjp / jvp -----------------------------------------------------------------------
def vjp(fun, primals, cotangents):
    """Compute the vector-Jacobian product.

    Args:
        fun (Callable): A function which takes a variable number of arrays and
          returns a single array or a list of arrays.
        primals (list(array)): A list of arrays at which to compute the
          vector-Jacobian product.
        cotangents (list(array)): A list of arrays, one per output of ``fun``,
          with the outputs' shapes.

    Returns:
        tuple(list(array), list(array)): The outputs of ``fun`` and the
        vector-Jacobian products, one per primal.

    Example:
        >>> outs, vjps = mx.vjp(lambda x: x * x, [mx.array(3.0)], [mx.array(1.0)])
        >>> vjps[0]
        array(6, dtype=float32)
    """
    primals = _array_list(primals, "vjp", "primals")
    cotangents = _array_list(cotangents, "vjp", "cotangents")
    wrappers, stop = wrap_primals(primals)
    handles = [w._prim for w in wrappers]
    with _retain:
        outs = _outputs(fun(*wrappers), "vjp")
        wrappers = rebound(wrappers, handles)
        if len(cotangents) != len(outs):
            raise ArgumentError(f"[vjp] The function returned {len(outs)} output(s) but "
                                f"{len(cotangents)} cotangent(s) were given.")
        cots = _matching(cotangents, outs, "vjp", "Output", "cotangent")
        grads, order = backward(outs, cots, wrappers, stop)
        grads = [ops.zeros_like(p) if g is None else g for p, g in zip(primals, grads)]
    if _retain.depth == 0:
        release(order, wrappers)
    return outs, grads


def _matching(values, refs, op: str, ref_name: str, value_name: str, cast: bool = True) -> list:
    """``values`` (cotangents or tangents), each checked to have its reference's shape
    and (``cast``: cotangents; MLX keeps a tangent's dtype) cast to its dtype."""
    out = []
    for i, (r, v) in enumerate(zip(refs, values)):
        if v._shape != r._shape:
            raise ShapeError(f"[{op}] {ref_name} {i} has shape {r._shape} but its {value_name} "
                             f"has shape {v._shape}.")
        out.append(v if not cast or v._dtype is r._dtype else ops.astype(v, r._dtype))
    return out


def jvp(fun, primals, tangents):
    """Compute the Jacobian-vector product.

    Args:
        fun (Callable): A function which takes a variable number of arrays and
          returns a single array or a list of arrays.
        primals (list(array)): A list of arrays at which to compute the
          Jacobian-vector product.
        tangents (list(array)): A list of arrays, one per primal, with the
          primals' shapes.

    Returns:
        tuple(list(array), list(array)): The outputs of ``fun`` and the
        Jacobian-vector products, one per output.
    """
    primals = _array_list(primals, "jvp", "primals")
    tangents = _array_list(tangents, "jvp", "tangents")
    if len(tangents) != len(primals):
        raise ArgumentError(f"[jvp] {len(primals)} primal(s) but {len(tangents)} tangent(s) "
                            f"were given.")
    tans = _matching(tangents, primals, "jvp", "Primal", "tangent", cast=False)
    wrappers, stop = wrap_primals(primals)
    handles = [w._prim for w in wrappers]
    with _retain:
        outs = _outputs(fun(*wrappers), "jvp")
        wrappers = rebound(wrappers, handles)
        res, order = forward(outs, wrappers, tans, stop)
        res = [ops.zeros_like(o) if t is None else t for o, t in zip(outs, res)]
    if _retain.depth == 0:
        release(order, wrappers)
    return outs, res


# -- grad / value_and_grad -----------------------------------------------------------
def _argnums(argnums, argnames, op: str):
    if isinstance(argnames, str):
        argnames = (argnames,)
    else:
        try:
            argnames = tuple(argnames)
        except TypeError:
            raise ArgumentError(f"[{op}] argnames must be a string or a sequence of strings, "
                                f"got {argnames!r}.") from None
        for n in argnames:
            if not isinstance(n, str):
                raise ArgumentError(f"[{op}] argnames must be strings, got {n!r}.")
    if argnums is None:
        argnums = () if argnames else (0,)
    elif isinstance(argnums, int) and not isinstance(argnums, bool):
        argnums = (argnums,)
    elif isinstance(argnums, (list, tuple)):
        argnums = tuple(argnums)
        for i in argnums:
            if not isinstance(i, int) or isinstance(i, bool):
                raise ArgumentError(f"[{op}] argnums must be integers, got {i!r}.")
    else:
        raise ArgumentError(f"[{op}] argnums must be an int or a sequence of ints, got "
                            f"{argnums!r}.")
    for i in argnums:
        if i < 0:
            raise ArgumentError(f"[{op}] Can't compute the gradient of negative argument index "
                                f"{i}.")
    if len(set(argnums)) != len(argnums):
        dup = next(i for i in argnums if argnums.count(i) > 1)
        raise ArgumentError(f"[{op}] Duplicate argument index {dup} is not allowed.")
    if not argnums and not argnames:
        raise ArgumentError(f"[{op}] Gradient with respect to no argument requested: give "
                            f"argnums or argnames.")
    return argnums, argnames


def _param_name(fun, i: int) -> str:
    """`` ('x')`` for positional parameter ``i`` of ``fun`` when it can be found."""
    try:
        import inspect
        params = [p for p in inspect.signature(fun).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return f" ({params[i].name!r})" if i < len(params) else ""
    except (TypeError, ValueError):
        return ""


def _diff_leaves(value, what, op: str):
    """The array leaves of a differentiated argument (all leaves must be arrays); ``what``
    names it in the error (a string, or a function making it: only an error needs it)."""
    leaves, d = flatten(value)
    for j, x in enumerate(leaves):
        if type(x) is not _array and not isinstance(x, _array):
            if callable(what):
                what = what()
            path = leaf_paths(d)[j]
            where = f"{what}{path}" if path else what
            raise ArgumentError(f"[{op}] Cannot differentiate with respect to {where}: it is "
                                f"{describe(x)}. The differentiated arguments must hold only "
                                f"arrays (pass other values in arguments not in argnums).")
    return leaves, d


def _make_grad(fun, argnums, argnames, op: str, with_value: bool):
    argnums, argnames = _argnums(argnums, argnames, op)
    single = len(argnums) == 1

    def transformed(*args, **kwargs):
        nargs = len(args)
        for i in argnums:
            if i >= nargs:
                raise ArgumentError(f"[{op}] Can't compute the gradient of argument index {i} "
                                    f"because the function is called with only {nargs} "
                                    f"positional argument(s).")
        for n in argnames:
            if n not in kwargs:
                raise ArgumentError(f"[{op}] Can't compute the gradient of keyword argument "
                                    f"{n!r} because the function is called with the keyword "
                                    f"arguments {sorted(kwargs)}.")
        primals: list = []
        defs = []
        for i in argnums:
            a = args[i]
            if type(a) is _array:
                primals.append(a)
                defs.append(None)
            else:
                leaves, d = _diff_leaves(a, lambda i=i: f"argument {i}{_param_name(fun, i)}", op)
                primals.extend(leaves)
                defs.append(d)
        for n in argnames:
            leaves, d = _diff_leaves(kwargs[n], f"keyword argument {n!r}", op)
            primals.extend(leaves)
            defs.append(d)
        wrappers, stop = wrap_primals(primals)
        args = list(args)
        k = 0
        for i, d in zip(argnums, defs):
            if d is None:
                args[i] = wrappers[k]
                k += 1
            else:
                n0 = k
                k += count_leaves(d)
                args[i] = unflatten(d, wrappers[n0:k])
        if argnames:
            kwargs = dict(kwargs)
            for n, d in zip(argnames, defs[len(argnums):]):
                n0 = k
                k += count_leaves(d)
                kwargs[n] = unflatten(d, wrappers[n0:k])
        handles = [w._prim for w in wrappers]
        with _retain:
            out = fun(*args, **kwargs)
            wrappers = rebound(wrappers, handles)
            loss = _loss(out, op, with_value)
            seed = constant(1, loss._dtype)
            grads, order = backward([loss], [seed], wrappers, stop)
            grads = [ops.zeros_like(p) if g is None else g for p, g in zip(primals, grads)]
        if _retain.depth == 0:
            release(order, wrappers)
        trees = []
        k = 0
        for d in defs:
            if d is None:
                trees.append(grads[k])
                k += 1
            else:
                n0 = k
                k += count_leaves(d)
                trees.append(unflatten(d, grads[n0:k]))
        npos = len(argnums)
        pos = None if not npos else (trees[0] if single else tuple(trees[:npos]))
        result = pos if not argnames else (pos, dict(zip(argnames, trees[npos:])))
        return (out, result) if with_value else result

    return functools.update_wrapper(transformed, fun)


def _loss(out, op: str, with_value: bool) -> array:
    if with_value and type(out) is tuple and out:
        loss = out[0]
        shape_of = "The first element of the returned tuple"
    else:
        loss = out
        shape_of = "The returned array"
    if not isinstance(loss, _array):
        if with_value:
            raise ArgumentError(f"[{op}] The function must return a scalar array or a tuple "
                                f"whose first element is a scalar array; it returned "
                                f"{describe(out)}" + (f" whose first element is {describe(loss)}."
                                                      if loss is not out else "."))
        raise ArgumentError(f"[{op}] The function must return a scalar array; it returned "
                            f"{describe(out)}.")
    if loss._shape != ():
        raise ShapeError(f"[{op}] {shape_of} must be a scalar (shape ()) to take its gradient, "
                         f"got shape {loss._shape}.")
    return loss


def grad(fun, argnums=None, argnames=()):
    """Returns a function which computes the gradient of ``fun``.

    Args:
        fun (Callable): A function which takes a variable number of arrays or
          trees of arrays (nested lists, tuples and dicts) and returns a scalar
          array.
        argnums (int or list(int), optional): The index (or indices) of the
          positional arguments to differentiate with respect to. If neither
          ``argnums`` nor ``argnames`` is given, ``argnums`` defaults to ``0``.
        argnames (str or list(str), optional): Keyword arguments to
          differentiate with respect to. Defaults to none.

    Returns:
        Callable: A function with the arguments of ``fun`` that returns the
        gradients: one tree for a single ``argnums`` entry, a tuple of trees for
        several, and ``(positional gradients, {name: gradient})`` when
        ``argnames`` is given.

    Example:
        >>> mx.grad(lambda x: (x * x).sum())(mx.array([1.0, 2.0]))
        array([2, 4], dtype=float32)
    """
    return _make_grad(fun, argnums, argnames, "grad", False)


def value_and_grad(fun, argnums=None, argnames=()):
    """Returns a function which computes the value and the gradient of ``fun``.

    ``fun`` returns either a scalar loss or a tuple whose first element is a
    scalar loss; the other elements (auxiliary outputs) are returned with the
    value but not differentiated.

    Args:
        fun (Callable): A function which takes a variable number of arrays or
          trees of arrays and returns a scalar array or a tuple whose first
          element is a scalar array.
        argnums (int or list(int), optional): The index (or indices) of the
          positional arguments to differentiate with respect to. If neither
          ``argnums`` nor ``argnames`` is given, ``argnums`` defaults to ``0``.
        argnames (str or list(str), optional): Keyword arguments to
          differentiate with respect to. Defaults to none.

    Returns:
        Callable: A function that returns ``(value, gradients)``, the gradients
        structured as in :func:`grad`.

    Example:
        >>> loss, g = mx.value_and_grad(lambda x: (x * x).sum())(mx.array([1.0, 2.0]))
    """
    return _make_grad(fun, argnums, argnames, "value_and_grad", True)
