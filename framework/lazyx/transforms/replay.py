"""Eager replay: an ``eval`` whose graph has the structure of an earlier one runs as a plan.

A training loop written eagerly builds the same graph at every step: the same
primitives with the same parameters, wired the same way, on arrays of the same
shapes and dtypes; only the data differ. Evaluating such a graph node by node costs
host time per node (a kernel lookup and launch each). Replay notices the repetition and
evaluates the graph as one :class:`~lazyx.transforms.compile.CompiledCall` node
instead, whose plan the backend runs as a whole (the CUDA backend replays it as one
CUDA graph: ``backends/cuda/graphs.py``).

How an ``eval`` is handled (:func:`replay`, called by the scheduler with the graph's
unevaluated nodes in topological order):

1. **Structure.** One walk over the nodes gives the graph's *structure*: per node its
   primitive's class, stream and parameters, where each input comes from (an earlier
   node's output, or the n-th distinct evaluated array, a *leaf*) and its outputs'
   shapes and dtypes; per leaf its shape, dtype and buffer type; and which nodes'
   arrays must receive values (*kept*): the arrays ``eval`` was asked for, and every
   array something outside the graph references (a variable, a model, an optimizer's
   state), found by reference counts (an array referenced only by the inputs of other
   nodes of the graph, the walk and the scheduler's lists is an intermediate nobody
   can read afterwards).
2. **Repetition.** The structure keys a cache. The first ``eval`` of a structure runs
   as usual; the second builds a :class:`~lazyx.transforms.compile.Tape` of the graph
   (leaves as its inputs, kept arrays as its outputs, nodes unchanged: no fusion and
   no simplification, so results are bit for bit those of node-by-node evaluation) and
   a compiled entry for it; that and every later ``eval`` of the structure makes the
   kept arrays the outputs of one ``CompiledCall`` node on the leaves, detaches the
   rest of the graph, and evaluates that node.

A graph is replayed only when it has at least ``lazyx.scheduler.replay_min`` (16) nodes, all
on streams of one kind, no transform is
tracing or retains the graph (``grad`` evaluating inside its trace), every parameter is
hashable, and no node is a compiled call or a custom function (those carry arrays or
functions of their own). Which graphs are replayed is set by ``LAZYX_EAGER_REPLAY``
(read at import, changed with :func:`set_mode`): ``auto`` (the default) replays graphs
whose nodes all run on a GPU stream, where a launch costs the most host time; ``1``
replays every graph (the CPU's plan runs the same kernels from a generated function);
``0`` never. ``stats`` counts builds and replays.
"""

from __future__ import annotations

import sys
from operator import attrgetter as _attrgetter

from .. import scheduler as _scheduler
from ..array import array as _array
from ..array import lazy
from ..array import native as _graph
from ..device_types import DeviceType
from ..environment import read_variable
from ..errors import ArgumentError
from .compile import CompiledCall, _Entry
from .custom import CustomTransforms
from .tape import Tape, TapeNode

__all__ = ["MAX_ENTRIES", "MAX_BUILT", "stats", "set_mode", "mode", "clear"]

#: Structures remembered (seen once, or built); the cache is emptied when it is full.
MAX_ENTRIES = 64
#: Structures built at once (each may hold a CUDA graph and its memory): the oldest goes.
MAX_BUILT = 8

stats = {"builds": 0, "replays": 0}

_count = sys.getrefcount
#: Primitives whose nodes are never replayed: they hold arrays or functions of their own.
_REFUSED = (CustomTransforms,)
_SEEN = object()  # a structure evaluated once, not built
_NO = object()    # a structure whose entry could not be built: always node by node
_cache: dict = {}
_built: list = []  # the keys of the built structures, oldest first
_mode = "auto"


def _own() -> int:
    o = object()
    return _count(o) - 1


_OWN = _own()  # what getrefcount adds to the references of its argument


def mode() -> str:
    """The current mode: ``"auto"``, ``"1"`` or ``"0"`` (see the module docstring)."""
    return _mode


def set_mode(value: str) -> str:
    """Set the mode (``"auto"``, ``"1"`` or ``"0"``); returns the previous one. The cache
    is emptied."""
    global _mode
    if value not in ("auto", "1", "0"):
        raise ArgumentError(f"[replay] mode must be 'auto', '1' or '0', got {value!r}.")
    old = _mode
    _mode = value
    clear()
    _scheduler.replay = None if value == "0" else replay
    return old


def clear() -> None:
    """Forget every structure."""
    _cache.clear()
    _built.clear()


def _class_info(cls):
    """What the walk needs of primitive class ``cls``: a function giving a primitive's
    parameters (None when it has none), or False when its nodes are never replayed: a
    custom function, or a private slot beyond its ``derived_slots`` (a compiled call's
    ``_ins``, the inputs it may donate, is not state: its plan is inlined)."""
    info = _classes.get(cls)
    if info is None:
        derived = set(getattr(cls, "derived_slots", ()))
        private = {s for klass in cls.__mro__ for s in klass.__dict__.get("__slots__", ())
                   if s.startswith("_") and s != "__weakref__"}
        if cls is CompiledCall:
            private.discard("_ins")
        if issubclass(cls, _REFUSED) or not private <= derived:
            info = False
        else:
            names = cls._param_names
            info = _attrgetter(*names) if names else _no_params
        _classes[cls] = info
    return info


def _no_params(prim):
    return None


_classes: dict = {}
_GPU = DeviceType.gpu.value


def _walk(order, roots):
    """The Python reference of ``lazyx._graph.structure``: ``(parts, leaf_signature,
    kept, leaves)`` of the graph of ``order``, or None when a node is not replayed.

    ``kept`` lists the node outputs that must receive values, as ``(node position,
    output position)`` in order; ``leaves`` the distinct evaluated arrays the nodes read.
    (The C++ walk names a node's inputs by number instead of pairs: each walk's keys are
    consistent with themselves.)
    """
    stream = order[0]._prim.stream
    classes = _classes
    where: dict = {}      # id(array) -> (node position, output position) or leaf number
    uses: dict = {}       # id(array) -> references from the graph's input tuples
    leaves = []
    parts = []
    n = len(order)
    for k in range(n):
        a = order[k]
        prim = a._prim
        t = type(prim)
        params = classes.get(t) or _class_info(t)
        if params is False:
            return None
        st = prim.stream
        if st is not stream and st != stream:
            return None
        ps = params(prim)
        if type(ps) is _array or (type(ps) is tuple and any(type(v) is _array for v in ps)):
            return None  # an array parameter is no key (kept alive, compared by value)
        refs = []
        for x in a._inputs:
            i = id(x)
            r = where.get(i)
            if r is None:
                r = where[i] = len(leaves)
                leaves.append(x)
            elif type(r) is tuple:
                uses[i] = uses.get(i, 0) + 1
            refs.append(r)
        sib = a._siblings
        if sib is None:
            where[id(a)] = (k, 0)
            parts.append((t, ps, tuple(refs), a._shape, a._dtype))
        else:
            for j in range(len(sib)):
                where[id(sib[j])] = (k, j)
            parts.append((t, ps, tuple(refs), tuple((s._shape, s._dtype) for s in sib)))
    x = a = None  # the walk's variables would count as references below
    asked = {id(r) for r in roots}
    kept = []
    for k in range(n):
        a = order[k]
        sib = a._siblings
        if sib is None:
            # Its references: ``a``, the order list, the graph's input tuples.
            if id(a) in asked or _count(a) - _OWN > 2 + uses.get(id(a), 0):
                kept.append((k, 0))
            continue
        for j in range(len(sib)):
            s = sib[j]
            # ``s``, the siblings tuple; for the first, ``a`` and the order list too.
            base = 2 + 2 * (s is a) + uses.get(id(s), 0)
            if id(s) in asked or _count(s) - _OWN > base:
                kept.append((k, j))
            del s
    leaf_sig = tuple((x._shape, x._dtype, type(x._data)) for x in leaves)
    return tuple(parts), leaf_sig, kept, leaves


def _native_walk(order, roots):
    return _graph.structure(order, roots, _classes, _class_info)


def _keyed(walk, order, roots):
    """``(key, leaves, kept)`` of the graph of ``order`` by ``walk``, or None when it is
    not replayed (another device in ``auto`` mode, a node refused, an unhashable key)."""
    stream = order[0]._prim.stream
    if _mode == "auto" and stream.kind != _GPU:
        return None
    got = walk(order, roots)
    if got is None:
        return None
    parts, leaf_sig, kept, leaves = got
    key = (stream.kind, stream.index, stream.device.index, parts, leaf_sig, tuple(kept))
    try:
        hash(key)
    except TypeError:  # a parameter that cannot be compared cheaply (a list)
        return None
    return key, leaves, kept


def _python_structure(order, roots):
    return _keyed(_walk, order, roots)


def _native_structure(order, roots):
    return _keyed(_native_walk, order, roots)


_structure = _native_structure if _graph is not None else _python_structure


def _build(order, leaves, kept):
    """The compiled entry evaluating the graph of ``order``: its tape's inputs are the
    leaves, its outputs the kept arrays, its nodes those of the graph, with each
    compiled call's plan inlined (the nodes its call runs, fused as they are)."""
    tape = Tape(shapeless=False)
    slot: dict = {}
    for x in leaves:
        s = tape.new_slot(x._shape, x._dtype)
        tape.inputs.append(s)
        slot[id(x)] = s
    node_slots = []
    for a in order:
        sib = a._siblings
        outs = (a,) if sib is None else sib
        prim = a._prim
        in_slots = tuple(slot[id(x)] for x in a._inputs)
        if type(prim) is CompiledCall:
            out_slots = _inline(tape, prim.entry, in_slots)
        else:
            out_slots = tuple(tape.new_slot(o._shape, o._dtype) for o in outs)
            tape.nodes.append(TapeNode(prim, in_slots, out_slots))
        for o, s in zip(outs, out_slots):
            slot[id(o)] = s
        node_slots.append(out_slots)
    tape.outputs = [node_slots[k][j] for k, j in kept]
    entry = _Entry(tape, tape, None, None, len(kept), [], [])
    entry.label = "an eager graph (replayed)"
    entry.prim.stream = order[-1]._prim.stream  # (its shared primitive: no donation)
    entry.prebuilt = True  # its kernels ran node by node just before (backends may use it)
    return entry


def _inline(tape: Tape, entry, in_slots: tuple) -> tuple:
    """Append the plan of compiled ``entry`` (its fused tape) to ``tape``, reading
    ``in_slots`` (the call node's inputs); the slots of the call's outputs."""
    inner = entry.run_tape
    m = {s: o for s, o in zip(entry.run_bound, in_slots) if s is not None}
    for n in inner.nodes:
        ins = tuple(m[s] for s in n.inputs)
        if inner.shapeless:
            stand = [lazy(tape.shapes[s], tape.dtypes[s], None, ()) for s in ins]
            shapes = [tuple(x) for x in n.prim.output_shapes(stand)]
        else:
            shapes = [inner.shapes[s] for s in n.outputs]
        outs = tuple(tape.new_slot(sh, inner.dtypes[s]) for sh, s in zip(shapes, n.outputs))
        m.update(zip(n.outputs, outs))
        tape.nodes.append(TapeNode(n.prim, ins, outs))
    return tuple(m[s] for s in inner.outputs)


def replay(order: list, roots) -> bool:
    """Evaluate the graph of ``order`` (its unevaluated nodes, inputs first) by replay if
    its structure was evaluated before; False when the scheduler should run it."""
    if _scheduler.retain_graph.depth or _scheduler.tracing.depth:
        return False
    try:
        got = _structure(order, roots)
    except Exception:  # noqa: BLE001 - a node the walk cannot read: the scheduler runs it
        return False
    if got is None:
        return False
    key, leaves, kept = got
    del got
    entry = _cache.get(key)
    if entry is None:
        if len(_cache) >= MAX_ENTRIES:
            _cache.clear()
            _built.clear()
        _cache[key] = _SEEN
        return False
    if entry is _NO:
        return False
    if entry is _SEEN:
        try:
            entry = _build(order, leaves, kept)
        except Exception:  # noqa: BLE001 - a node its rules cannot rebuild: run as it is
            _cache[key] = _NO
            return False
        _cache[key] = entry
        stats["builds"] += 1
        _built.append(key)
        if len(_built) > MAX_BUILT:
            _cache.pop(_built.pop(0), None)
    else:
        stats["replays"] += 1
    outs = []
    for k, j in kept:
        a = order[k]
        outs.append(a if a._siblings is None else a._siblings[j])
    # Detach the graph (the arrays not kept are referenced by nothing else), then make
    # the kept arrays the outputs of one node on the leaves and evaluate it.
    for a in order:
        sib = a._siblings
        for s in (a,) if sib is None else sib:
            s._prim = None
            s._inputs = None
            s._siblings = None
    order.clear()
    ins = tuple(leaves)
    del leaves
    group = tuple(outs) if len(outs) > 1 else None
    prim = entry.prim
    for o in outs:
        o._prim = prim
        o._inputs = ins
        o._siblings = group
    del ins
    _scheduler.eval_arrays(outs[:1])
    return True


def _initial_mode() -> str:
    v = read_variable("LAZYX_EAGER_REPLAY")
    return v if v in ("auto", "1", "0") else "auto"


set_mode(_initial_mode())
