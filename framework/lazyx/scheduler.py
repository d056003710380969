"""The scheduler: evaluate lazy arrays.

``eval`` gathers the arrays of its arguments (nested lists, tuples and dicts),
orders the unevaluated part of their graph topologically with an iterative
depth-first walk (no recursion, so a 200,000-node chain is fine), then runs
each node once on the calling thread:

* the kernel comes from the active backend of the node's device (its kernel
  table, else the primitive's own ``eval_cpu``/``eval_gpu``, else a
  :class:`KernelNotFoundError` naming primitive, device and backend);
* outputs are checked against the shapes and dtypes the graph promised;
* a kernel whose allocation fails (``MemoryError``) becomes an
  :class:`OutOfMemoryError` naming the primitive, its output shape and dtype, the
  bytes and the memory limit (one ``except`` around the loop: free until it raises);
* the node is then detached (primitive and inputs dropped) and the walk's own
  reference released, so an intermediate is freed as soon as its last
  consumer has run, unless a transform asked to retain the graph.
"""

from __future__ import annotations

from weakref import ref as _weakref

import numpy as np

from . import array as _array_module
from . import backend as _backend
from .array import array
from .backend import is_device_buffer
from .errors import ArgumentError, KernelOutputError, LazyxError
from .memory import out_of_memory
from .providers import provider_of

__all__ = ["eval", "async_eval", "eval_arrays", "retain_graph", "tree_arrays"]

_ndarray = np.ndarray
_asarray = np.asarray


class _Retain:
    """Counts the transforms that are tracing; while > 0 eval keeps graphs attached."""

    __slots__ = ("depth",)

    def __init__(self):
        self.depth = 0

    def __enter__(self):
        self.depth += 1
        return self

    def __exit__(self, *exc):
        self.depth -= 1


retain_graph = _Retain()
#: Counts the compile and vmap traces running (``async_eval`` is refused inside any
#: transform, as in MLX; the autodiff transforms are counted by ``retain_graph``).
tracing = _Retain()

#: Weak references to the nodes evaluated while the graph was retained; the
#: outermost transform detaches them when it finishes (lazyx.transforms.autodiff).
retained: list = []

#: Eager replay (``lazyx.transforms.replay``, which installs itself): called with the
#: unevaluated nodes of an ``eval`` of at least ``replay_min`` nodes; True when it
#: evaluated them.
replay = None
replay_min = 16

#: When True (the test suite sets it), every node's ``output_shapes`` is checked
#: against what its kernel returned, and the classes seen are recorded.
check_shape_rules = False
checked_primitives: set = set()


def tree_arrays(tree, out: list) -> list:
    """Append every array in ``tree`` (nested lists, tuples and dicts) to ``out``."""
    stack = [tree]
    while stack:
        t = stack.pop()
        if type(t) is array:
            out.append(t)
        elif isinstance(t, (list, tuple)):
            stack.extend(reversed(t))
        elif isinstance(t, dict):
            stack.extend(reversed(list(t.values())))
        elif isinstance(t, array):
            out.append(t)
    return out


def eval(*args) -> None:
    """Evaluate every array in ``args`` (arrays or trees of arrays).

    Example:
        >>> a = lazyx.core.ones((2, 2)) * 3
        >>> lazyx.core.eval(a, {"b": [a + 1]})
    """
    eval_arrays(tree_arrays(args, []))


def async_eval(*args) -> None:
    """Evaluate ``args``; lazyx runs kernels on the calling thread, so this is ``eval``.

    It exists for MLX compatibility: code that overlaps graph building with
    ``async_eval`` still runs correctly. As in MLX it is refused (``ValueError``)
    inside a function being transformed (``grad``, ``vjp``, ``jvp``, ``vmap``,
    ``compile``), where ``eval`` is still allowed.
    """
    if retain_graph.depth or tracing.depth:
        raise ArgumentError("[async_eval] Not allowed inside a graph transformation (grad, "
                            "vjp, jvp, vmap, compile); call eval, or call async_eval outside "
                            "the transformed function.")
    eval_arrays(tree_arrays(args, []))


def unevaluated_order(roots) -> list:
    """The unevaluated nodes ``roots`` depend on, inputs first, each once (one array
    stands for a multi-output node). Iterative: no recursion limit."""
    order = []
    seen = set()
    add = seen.add
    for r in roots:
        if r._data is not None or id(r) in seen:
            continue
        stack = [(r, 0)]
        while stack:
            a, i = stack.pop()
            ins = a._inputs
            n = len(ins)
            while i < n:
                x = ins[i]
                i += 1
                if x._data is None and id(x) not in seen:
                    stack.append((a, i))
                    stack.append((x, 0))
                    break
            else:
                sib = a._siblings
                if sib is None:
                    add(id(a))
                else:
                    for s in sib:
                        add(id(s))
                order.append(a)
    return order


def eval_arrays(roots) -> None:
    """Evaluate a flat sequence of arrays."""
    order = _order(roots)
    if not order:
        return
    if replay is not None and len(order) >= replay_min and replay(order, roots):
        return
    tables, cpu = _backend._tables or _backend.dispatch_tables()
    token = cpu.enter_eval()
    try:
        if _native is not None:
            failed = [None]
            try:
                _native.run(order, tables, retain_graph.depth > 0,
                            _check_shape_rule if check_shape_rules else None, _finish, failed)
            except MemoryError as e:
                _raise_out_of_memory(e, failed[0])
        else:
            _run(order, tables)
    finally:
        cpu.exit_eval(token)


def _run(order, tables) -> None:
    """The scheduler's loop in Python: the reference of the native ``run``."""
    keep = retain_graph.depth > 0
    a = None
    try:
        for k in range(len(order)):
            a = order[k]
            order[k] = None
            prim = a._prim
            if prim is None:  # a sibling evaluated it already
                continue
            kernel = tables[prim.stream.kind][type(prim)]
            out = kernel(prim, [x._data for x in a._inputs])
            if check_shape_rules:
                _check_shape_rule(prim, a)
            if not keep and a._siblings is None and type(out) is _ndarray and \
                    out.shape == a._shape and (out.dtype is a._dtype.np or out.dtype == a._dtype.np):
                a._data = out
                a._prim = None
                a._inputs = None
            else:
                _finish(prim, a, out)
    except MemoryError as e:
        _raise_out_of_memory(e, a)


def _finish(prim, a, out) -> None:
    """Store the output(s) ``out`` of ``a``'s node: checked against the shapes and
    dtypes the graph promised, then the node detached (or, while a transform retains
    the graph, recorded). The loops do the common case themselves: one NumPy array as
    promised, nothing retained."""
    keep = retain_graph.depth > 0
    sib = a._siblings
    if sib is None:
        if type(out) is not _ndarray:
            out = _fix_single(out, a)
        if out.shape != a._shape or (out.dtype is not a._dtype.np and out.dtype != a._dtype.np):
            _bad_output(prim, (out,), (a,))
        a._data = out
        if not keep:
            a._prim = None
            a._inputs = None
        else:
            retained.append(_weakref(a))
        return
    if type(out) not in (tuple, list) or len(out) != len(sib):
        _bad_output(prim, out if type(out) in (tuple, list) else (out,), sib)
    outs = [o if type(o) is _ndarray else _fix_output(o) for o in out]
    for o, s in zip(outs, sib):
        if o.shape != s._shape or o.dtype != s._dtype.np:
            _bad_output(prim, outs, sib)
    for o, s in zip(outs, sib):
        s._data = o
        if not keep:
            s._prim = None
            s._inputs = None
            s._siblings = None
    if keep:
        retained.append(_weakref(a))


def _raise_out_of_memory(e: MemoryError, a) -> None:
    """A kernel's ``MemoryError`` as an :class:`OutOfMemoryError` naming the node."""
    if isinstance(e, LazyxError) or a is None:
        raise e
    raise out_of_memory(a._prim.name if a._prim is not None else "eval", a._shape,
                        a._dtype, f"while evaluating; the kernel said: {e}") from None


# The native walk and loop (lazyx._graph, loaded by lazyx.array) or the Python ones.
_native = _array_module.native
_order = _native.unevaluated_order if _native is not None else unevaluated_order

# The tree walk in C++ too (graph.cpp's ``tree_arrays``; the function above is its reference).
py_tree_arrays = tree_arrays
if _native is not None:
    tree_arrays = _native.tree_arrays  # noqa: F811

# Arrays evaluate themselves (``item()``, ``np.asarray``) through the scheduler.
_array_module.evaluate = eval_arrays


def _check_shape_rule(prim, a) -> None:
    expected = [s._shape for s in a._siblings] if a._siblings is not None else [a._shape]
    got = [tuple(s) for s in prim.output_shapes(a._inputs)]
    if got != expected:
        raise KernelOutputError(f"{prim!r}.output_shapes gave {got}, the graph has {expected}.")
    checked_primitives.add(type(prim))


def _fix_single(out, a):
    if type(out) in (tuple, list):
        if len(out) == 1:
            out = out[0]
            if type(out) is _ndarray:
                return out
        else:
            _bad_output(a._prim, out, (a,))
    if is_device_buffer(out):
        return out
    return _asarray(out)


def _bad_output(prim, outs, expected) -> None:
    got = ", ".join(f"{getattr(o, 'shape', '?')} {getattr(o, 'dtype', type(o).__name__)}" for o in outs)
    want = ", ".join(f"{e._shape} {e._dtype.np}" for e in expected)
    raise KernelOutputError(
        f"The kernel of {prim.name} ({provider_of(prim)}) returned [{got}], "
        f"expected [{want}]. The outputs were discarded; other arrays are unaffected.")


def _fix_output(o):
    """A kernel output that is not a NumPy array: a device buffer stays as it is."""
    return o if is_device_buffer(o) else _asarray(o)
