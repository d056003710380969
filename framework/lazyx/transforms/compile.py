"""``compile``: trace a function once per input signature and replay it as one node.

How a call of ``compile(fun)`` runs:

1. **Signature.** The arguments (positional and keyword) are flattened into
   leaves (:mod:`lazyx.transforms.trees`). The signature is the tree structure,
   each array leaf's shape (its number of dimensions when ``shapeless``) and
   dtype, each other leaf's value (``None``, bools, ints, floats, complex
   numbers, strings), and the same for the arrays of the ``inputs=`` trees. It
   keys a cache: a new signature traces again.
2. **Trace.** ``fun`` is called once on :class:`CompileInput` placeholders:
   arrays of the arguments' shapes and dtypes that hold no data (evaluating one
   raises). The arrays of the ``inputs=`` trees are replaced by placeholders in
   place for the call and put back afterwards. The recorded graph between the
   placeholders and the outputs (plus the arrays found in the ``outputs=``
   trees afterwards) becomes a :class:`Tape`; every other array the graph
   reaches (captured arrays, values computed without the inputs) is a
   *constant* of the tape.
3. **Simplify.** No-ops are dropped while the tape is built
   (:meth:`Primitive.is_noop`); then small identical constants merge, equivalent
   nodes merge (common-subexpression elimination through
   :meth:`Primitive.is_equivalent`: same class, same parameters, same inputs),
   and nodes no output needs are removed. The tape that runs (a copy) then folds
   nodes that do not depend on the call into constants (:func:`fold_constants`:
   at fixed shapes an element count, then small nodes of constants alone), and,
   if the fusion pass exists, ``lazyx.transforms.fusion.fuse_elementwise(tape) ->
   tape`` fuses element-wise runs for execution.
4. **Replay.** A call adds ONE node to the graph: a :class:`CompiledCall` whose
   inputs are the call's arrays, the ``inputs=`` arrays and the constants. Its
   kernel runs a generated Python function, the *plan*: one line per tape node
   calling the kernel the active backend registers for it, intermediates
   released after their last use. The outputs of the ``outputs=`` trees are
   written back into those trees after the call.
5. **Donation.** As in MLX, an input buffer nothing else references becomes the
   output of the fused kernel that reads it last (same shape and dtype, one
   output), so ``y = f(x); del x`` needs one buffer, not two. The tape says
   statically which slots may donate (:func:`_donor_candidates`); whether one
   does is decided per call by reference counts: a call's input array must be
   held by the node alone and its buffer by that array alone (no view, no NumPy
   array or memoryview or DLPack capsule sharing it), an intermediate by the plan
   alone. Captured constants never donate; nor does anything while a transform
   retains the graph.

Transforms see through a compiled call: :class:`CompiledCall`'s ``vjp``,
``jvp`` and ``vmap`` rebuild the (unfused) tape as ordinary lazy ops on the
node's inputs and transform that, so ``grad(compile(f))`` and
``vmap(compile(f))`` work, and a compiled function called while another is
being traced is inlined into the outer tape.

The tape (what a pass such as fusion receives and returns)
-----------------------------------------------------------
Values live in numbered *slots*. ``Tape.shapes[s]`` and ``Tape.dtypes[s]`` are
the shape (as traced) and dtype of slot ``s``; :meth:`Tape.new_slot` adds one.

* ``inputs``: the slots bound to the call's arrays, in order (the flattened
  arguments, then the arrays of the ``inputs=`` trees);
* ``constants``: ``{slot: array}``, in insertion order; the node receives these
  arrays after the call's arrays (they may be unevaluated: the scheduler
  evaluates them before the node);
* ``nodes``: :class:`TapeNode` ``(prim, inputs, outputs)`` in execution order,
  ``inputs``/``outputs`` tuples of slots; ``prim`` is an ordinary primitive
  whose kernel comes from the active backend's dispatch table;
* ``outputs``: the slots returned, in order (a slot may repeat, and may be an
  input or a constant slot).

A pass may replace, remove or add nodes and slots, but keeps ``inputs``,
``outputs`` and ``constants`` as they are.
"""

from __future__ import annotations

import builtins
import functools
import itertools
import math
import sys

import numpy as np

from ..device import _state as _device_state
from ..device import current_stream
from .. import backend as _backend
from .. import dtypes as _dt
from .. import environment as _environment
from ..environment import read_variable
from .. import scheduler as _scheduler
from ..arguments import constant
from ..array import array, lazy, lazy_multi
from ..device import to_stream
from ..errors import (ArgumentError, KernelOutputError, LazyxError, ShapelessCompileError,
                      TransformError)
from ..primitive import Primitive
from .fusion import Compiled, fuse_elementwise
from .placeholder import InputPlaceholder
from .tape import Tape, TapeNode
from . import autodiff
from .custom import CustomTransforms
from .trees import describe, flatten, leaf_paths, unflatten
from .vmap import vmap as _vmap

__all__ = ["compile", "enable_compile", "disable_compile", "CompiledCall", "CompileInput",
           "Tape", "TapeNode"]

_array = array
_seq = itertools.count(1)
_ndarray = np.ndarray
_new_prim = object.__new__
#: Constants up to this many bytes are compared by value and merged.
MERGE_CONSTANT_BYTES = 1024
#: Leaf types that a compiled function takes as constants (part of the signature).
_CONSTANT_TYPES = (type(None), bool, int, float, complex, str, bytes, _dt.Dtype)


class _Settings:
    __slots__ = ("enabled", "tracing")

    def __init__(self):
        self.enabled = read_variable("LAZYX_DISABLE_COMPILE") not in _environment.ON
        self.tracing = 0  # how many compile traces are running


_settings = _Settings()


def enable_compile() -> None:
    """Enable compilation globally (the default unless ``LAZYX_DISABLE_COMPILE`` is set).

    Functions made by :func:`compile` trace and replay again; this overrides the
    environment variable.
    """
    _settings.enabled = True


def disable_compile() -> None:
    """Disable compilation globally: compiled functions just call the function.

    Useful to debug a compiled function (``print`` and ``item()`` work again).
    Setting the environment variable ``LAZYX_DISABLE_COMPILE=1`` has the same
    effect from the start of the process.
    """
    _settings.enabled = False


# -- placeholders ------------------------------------------------------------------
class CompileInput(InputPlaceholder):
    """Stands for one input array while ``compile`` traces a function: no data."""

    __slots__ = ()
    message = (
        "[compile] Attempting to eval an array during function transformations like "
        "compile or vmap is not allowed: this array depends on an input of a function "
        "being compiled, whose values exist only when the compiled function runs. "
        "Inside the function, do not call eval, item(), print or NumPy conversion on "
        "it; an array the function stored outside without declaring the container in "
        "compile's inputs= and outputs= cannot be evaluated either.")


def _placeholder(x: array) -> array:
    p = x._prim
    s = x._shape
    return lazy(s, x._dtype, CompileInput(p.stream if p is not None else to_stream(None),
                                          s, next(_seq)), ())


# -- signatures --------------------------------------------------------------------
def _signature(leaves, shapeless: bool, where: str) -> tuple:
    out = []
    for k, x in enumerate(leaves):
        if type(x) is _array or isinstance(x, _array):
            out.append((len(x._shape) if shapeless else x._shape, x._dtype))
        elif isinstance(x, _CONSTANT_TYPES):
            # NaN is not equal to itself: key it by its text so it finds its trace.
            out.append((type(x), x) if x == x else (type(x), repr(x)))
        else:
            raise ArgumentError(
                f"[compile] Function arguments must be trees of arrays or constants (None, "
                f"bools, ints, floats, complex numbers, strings), but {where} leaf {k} is "
                f"{describe(x)}.")
    return tuple(out)


def _tree_paths(tree) -> list:
    """``(leaf, path)`` for every array leaf of a mutable tree, ``path`` a tuple of keys."""
    out = []
    stack = [(tree, ())]
    while stack:
        t, p = stack.pop()
        if isinstance(t, _array):
            out.append((t, p))
        elif isinstance(t, dict):
            stack.extend(reversed([(v, p + (k,)) for k, v in t.items()]))
        elif isinstance(t, (list, tuple)):
            stack.extend(reversed([(v, p + (i,)) for i, v in enumerate(t)]))
    return out


def _path_text(name: str, path: tuple) -> str:
    return name + "".join(f"[{k!r}]" for k in path)


def _setter(tree, path: tuple, name: str):
    """The container holding ``path`` in ``tree`` (which must accept assignment)."""
    c = tree
    for k in path[:-1]:
        c = c[k]
    if isinstance(c, tuple):
        raise ArgumentError(f"[compile] {_path_text(name, path)} sits in a tuple, which compile "
                            f"cannot update in place; use a list or a dict.")
    return c


def _assign(tree, path: tuple, value, name: str) -> None:
    _setter(tree, path, name)[path[-1]] = value


# -- building the tape -------------------------------------------------------------
def _build(outputs: list, inputs: list, shapeless: bool, expand: bool) -> Tape:
    """The tape of the graph from the placeholders to arrays ``outputs``.

    ``inputs`` holds ``(CompileInput, dtype)`` per placeholder: the walk knows them
    by their primitive, since ``x[idx] = v`` moves a placeholder's node to another
    array object. With ``expand``, a custom function's node is replaced by the graph
    that computes its outputs (what runs); without, it stays one node (what the
    transforms inline, so they use its rules). ``tape.custom`` says whether there was one.
    """
    tape = Tape(shapeless=shapeless)
    slot: dict = {}          # id(array) -> slot (every array walked is alive: ids are unique)
    by_prim = {}
    for p, d in inputs:
        s = tape.new_slot(p.shape, d)
        tape.inputs.append(s)
        by_prim[id(p)] = s
    dep: dict = {}           # id(array) -> depends on an input
    custom = []

    def _children(a):
        p = a._prim
        if type(p) is CustomTransforms and p._pending is not None:
            custom.append(p)
            if expand:
                return p._pending
        return a._inputs

    def is_leaf(a):
        return a._data is not None or a._prim is None or type(a._prim) is CompileInput

    def leaf_dep(a):
        return a._data is None and id(a._prim) in by_prim

    order = []
    for r in outputs:
        if id(r) in dep:
            continue
        if is_leaf(r):
            dep[id(r)] = leaf_dep(r)
            continue
        stack = [(r, 0, _children(r))]
        while stack:
            a, i, ins = stack.pop()
            n = len(ins)
            while i < n:
                x = ins[i]
                i += 1
                if id(x) in dep:
                    continue
                if is_leaf(x):
                    dep[id(x)] = leaf_dep(x)
                    continue
                stack.append((a, i, ins))
                stack.append((x, 0, _children(x)))
                break
            else:
                d = any(dep[id(x)] for x in ins)
                sib = a._siblings
                for s in (a,) if sib is None else sib:
                    dep[id(s)] = d
                if d:
                    order.append(a)

    def slot_of(x):
        s = slot.get(id(x))
        if s is None:
            if dep.get(id(x)):
                s = by_prim[id(x._prim)]
            else:
                s = tape.new_slot(x._shape, x._dtype)
                tape.constants[s] = x
            slot[id(x)] = s
        return s

    for a in order:
        prim = a._prim
        sib = a._siblings
        outs = (a,) if sib is None else sib
        custom_node = type(prim) is CustomTransforms and prim._pending is not None
        if custom_node and expand:
            for o, x in zip(outs, prim._pending):
                slot[id(o)] = slot_of(x)
            continue
        ins = a._inputs
        in_slots = tuple(slot_of(x) for x in ins)
        if shapeless and not custom_node:
            _check_shapeless(prim, ins)
        # A no-op judged at the traced shapes (a reshape or broadcast to the input's
        # shape) need not be one at other shapes: a shapeless tape keeps those nodes.
        if sib is None and (not shapeless or "shape" not in prim._param_names) \
                and prim.is_noop(list(ins)):
            slot[id(a)] = in_slots[0]
            continue
        out_slots = tuple(tape.new_slot(o._shape, o._dtype) for o in outs)
        for o, s in zip(outs, out_slots):
            slot[id(o)] = s
        tape.nodes.append(TapeNode(prim, in_slots, out_slots))
    tape.outputs = [slot_of(r) for r in outputs]
    tape.custom = bool(custom)
    return tape


def _check_shapeless(prim, ins) -> None:
    if not prim.shapeless:
        raise ShapelessCompileError(
            f"[compile] {prim.name} cannot infer output shapes at other input shapes (its "
            f"parameters fix them), so this function cannot be compiled with "
            f"shapeless=True; compile it without shapeless.")
    try:
        prim.output_shapes(list(ins))
    except TransformError as e:
        raise TransformError(f"[compile] {prim.name} cannot infer output shapes, so this "
                             f"function cannot be compiled with shapeless=True: {e}") from None


# -- simplification ------------------------------------------------------------------
def merge_constants(tape: Tape) -> Tape:
    """Make nodes read one slot for identical small constants (same dtype, shape, bytes).

    Only plain evaluated arrays (no node) of at most ``MERGE_CONSTANT_BYTES`` bytes
    are compared; merged slots stay in ``constants`` (unused) so the node's inputs do
    not change.
    """
    first: dict = {}
    alias: dict = {}
    for s, c in tape.constants.items():
        d = c._data
        if d is None or c._prim is not None or c.nbytes > MERGE_CONSTANT_BYTES \
                or type(d) is not _ndarray:
            continue
        key = (c._dtype, c._shape, np.ascontiguousarray(d).tobytes())
        t = first.setdefault(key, s)
        if t != s:
            alias[s] = t
    if alias:
        _rename(tape, alias)
    return tape


def _rename(tape: Tape, alias: dict) -> None:
    get = alias.get
    for n in tape.nodes:
        n.inputs = tuple(get(s, s) for s in n.inputs)
    tape.outputs = [get(s, s) for s in tape.outputs]


def eliminate_common_subexpressions(tape: Tape) -> Tape:
    """Merge nodes that compute the same thing: the same class, equivalent parameters
    (:meth:`Primitive.is_equivalent`) and the same input slots."""
    seen: dict = {}
    alias: dict = {}
    nodes = []
    get = alias.get
    for n in tape.nodes:
        ins = tuple(get(s, s) for s in n.inputs)
        n.inputs = ins
        key = (type(n.prim), ins)
        same = None
        for m in seen.get(key, ()):
            if len(m.outputs) == len(n.outputs) and m.prim.is_equivalent(n.prim):
                same = m
                break
        if same is None:
            seen.setdefault(key, []).append(n)
            nodes.append(n)
        else:
            for a, b in zip(n.outputs, same.outputs):
                alias[a] = b
    tape.nodes = nodes
    tape.outputs = [get(s, s) for s in tape.outputs]
    return tape


def remove_dead_nodes(tape: Tape) -> Tape:
    """Drop the nodes none of whose outputs the tape's outputs need."""
    live = set(tape.outputs)
    kept = []
    for n in reversed(tape.nodes):
        if any(s in live for s in n.outputs):
            kept.append(n)
            live.update(n.inputs)
    kept.reverse()
    tape.nodes = kept
    return tape


def simplify(tape: Tape) -> Tape:
    """Constant merging, common-subexpression elimination and dead-node removal."""
    return remove_dead_nodes(eliminate_common_subexpressions(merge_constants(tape)))


#: The most elements an output of a node whose inputs are all constants may have for
#: :func:`fold_constants` to compute it once, at the trace, instead of at every call.
FOLD_MAX_ELEMENTS = 64


def fold_constants(tape: Tape) -> Tape:
    """Make constant slots of the outputs of nodes that do not depend on the call:
    at fixed shapes, a node whose one 0-d output the input shapes alone give
    (:meth:`Primitive.constant_at`: ``mean``'s element count; a shapeless tape keeps
    them, to count at each call's shapes); and an element-wise node (one that declares
    ``to_expression``: a pure function of its inputs, unlike a collective or a callback)
    whose inputs are all constants and whose outputs have at most
    :data:`FOLD_MAX_ELEMENTS` elements (``1.0 * (1 / n)`` in ``mean``'s gradient),
    evaluated here once. A constant fuses into its readers as a literal; a node that
    runs costs its dispatch at every call. A node whose evaluation raises here stays
    a node of the plan."""
    kept = []
    where = {id(c): s for s, c in tape.constants.items()}
    alias = {}  # constants are cached: one slot per array object, as the plan binds them
    consts = tape.constants

    def bind(s, c):
        t = where.setdefault(id(c), s)
        if t == s:
            consts[s] = c
        else:
            alias[s] = t

    for n in tape.nodes:
        ins = [alias.get(i, i) for i in n.inputs]
        outs = n.outputs
        if outs and all(i in consts for i in ins) and hasattr(n.prim, "to_expression") and \
                all(math.prod(tape.shapes[o]) <= FOLD_MAX_ELEMENTS for o in outs):
            values = _evaluate_node(n.prim, [consts[i] for i in ins],
                                    [tape.shapes[o] for o in outs], [tape.dtypes[o] for o in outs])
            if values is not None:
                for o, c in zip(outs, values):
                    bind(o, c)
                continue
        if not tape.shapeless and len(outs) == 1 and tape.shapes[outs[0]] == ():
            v = n.prim.constant_at([tape.shapes[i] for i in n.inputs])
            if v is not None:
                bind(outs[0], constant(v, tape.dtypes[outs[0]]))
                continue
        kept.append(n)
    tape.nodes = kept
    if alias:
        _rename(tape, alias)
    return tape


def _evaluate_node(prim, ins, shapes, dtypes):
    """The evaluated outputs of ``prim`` on evaluated ``ins``, or None if it raises."""
    outs = lazy_multi(shapes, dtypes, prim, tuple(ins)) if len(shapes) > 1 else \
        [lazy(tuple(shapes[0]), dtypes[0], prim, tuple(ins))]
    try:
        _scheduler.eval(*outs)
    except LazyxError:
        return None
    return outs


#: Whether traces are fused; benchmarks switch it off to measure the plan alone.
FUSE = True


def _fuse(tape: Tape) -> Tape:
    return fuse_elementwise(tape) if FUSE else tape


# -- the replay plan ---------------------------------------------------------------
def _fix(o):
    """A kernel's output as a buffer (NumPy gives scalars for 0-d results)."""
    if type(o) is _ndarray or _backend.is_device_buffer(o):
        return o
    return np.asarray(o)


# -- donation ---------------------------------------------------------------------
_count = sys.getrefcount


def _own_references() -> int:
    o = object()  # held by this frame's local alone
    return _count(o) - 1


#: What a call of ``sys.getrefcount`` adds to the references of the object it is given,
#: measured once: ``_count(x) - _OWN`` is how many references ``x`` has, the caller's
#: local included, whatever this Python's calling convention adds.
_OWN = _own_references()


def _donor_candidates(tape: Tape) -> dict:
    """``{node index: ((input position, slot), ...)}``: the inputs of the tape's fused
    nodes whose buffer may become one of the node's outputs (an optimizer's update
    writes a parameter and its moments: three outputs, three donors). A candidate is
    read by that node once and last, is no output and no constant of the tape, and has
    the dtype (and, unless shapeless, the shape) of one of the node's outputs; the
    kernel pairs donors with outputs."""
    last: dict = {}
    for i, n in enumerate(tape.nodes):
        for s in n.inputs:
            last[s] = i
    keep = set(tape.outputs) | set(tape.constants)
    out: dict = {}
    for i, n in enumerate(tape.nodes):
        if type(n.prim) is not Compiled:
            continue
        kinds = {(tape.dtypes[o], None if tape.shapeless else tape.shapes[o])
                 for o in n.outputs}
        got = tuple((j, s) for j, s in enumerate(n.inputs)
                    if last[s] == i and s not in keep and n.inputs.count(s) == 1
                    and (tape.dtypes[s], None if tape.shapeless else tape.shapes[s]) in kinds)
        if got:
            out[i] = got
    return out


def _owns_numpy(buf) -> bool:
    """A NumPy buffer that owns its memory and may be written."""
    return type(buf) is _ndarray and buf.base is None and buf.flags.writeable


def _donors(ins, inputs, positions, owns=_owns_numpy) -> tuple:
    """The positions among ``positions`` of the node inputs that may donate their
    buffer: the array ``ins[k]`` is held by the node's input tuple alone (once), its
    buffer ``inputs[k]`` is the array's own (not a copy a backend made for the kernel,
    such as a device upload of host data, which its cache shares) and held by that array
    and the scheduler's list alone, and ``owns`` it (a buffer of the backend's kind that
    owns its memory; a device backend passes its own test: ``backends/cuda/graphs.py``)."""
    out = ()
    for k in positions:
        x = ins[k]
        buf = inputs[k]
        if x._data is buf and _count(x) - _OWN == 2 and _count(buf) - _OWN == 3 \
                and owns(buf):
            out += (k,)
    return out


def _make_runner(tape: Tape, bound: list, tables, checked: bool):
    """The plan of ``tape`` as a Python function ``run(buffers, donors)`` for dispatch
    ``tables``.

    Each node is one line ``sN = kernel(prim, [sA, sB])``; a slot is deleted after
    its last use so intermediates are freed as the plan goes. With ``checked``
    (the test suite), every node's outputs are checked against the tape. ``bound``
    gives the slot of each of the node's inputs (None: not read by this tape).
    A fused node whose kernel takes donors (``kernel.donates``) gets a third
    argument: the positions of its inputs it may write its output into, those of
    its candidates (:func:`_donor_candidates`) that are call inputs named in
    ``donors`` or intermediates held by the plan alone.
    """
    ns = {"_fix": _fix, "_check": _check_node, "_count": _count, "_OWN": _OWN}
    last: dict = {}
    for i, n in enumerate(tape.nodes):
        for s in n.inputs:
            last[s] = i
    outputs = set(tape.outputs)
    candidates = _donor_candidates(tape)
    position = {s: k for k, s in reversed(list(enumerate(bound))) if s is not None}
    lines = ["def run(ins, donors):"]
    if bound:
        lines.append(f"    {''.join('_, ' if s is None else f's{s}, ' for s in bound)}= ins")
    for i, n in enumerate(tape.nodes):
        kernel = ns[f"k{i}"] = tables[n.prim.stream.kind][type(n.prim)]
        ns[f"p{i}"] = n.prim
        donate = ""
        if i in candidates and getattr(kernel, "donates", False):
            terms = [f"(({j},) if {position[s]} in donors else ())" if s in position
                     else f"(({j},) if _count(s{s}) - _OWN == 1 else ())"
                     for j, s in candidates[i]]
            lines.append(f"    d{i} = {' + '.join(terms)}")
            donate = f", d{i}"
        call = f"k{i}(p{i}, [{', '.join(f's{s}' for s in n.inputs)}]{donate})"
        outs = n.outputs
        if len(outs) == 1:
            s = outs[0]
            lines.append(f"    s{s} = _fix({call})" if not tape.shapes[s] or checked
                         else f"    s{s} = {call}")
        else:
            lines.append(f"    {''.join(f's{s}, ' for s in outs)}= {call}")
            for s in outs:
                if not tape.shapes[s] or checked:
                    lines.append(f"    s{s} = _fix(s{s})")
        if checked:
            ns[f"n{i}"] = n
            ns[f"e{i}"] = None if tape.shapeless else [tape.shapes[s] for s in outs]
            ns[f"t{i}"] = [tape.dtypes[s] for s in outs]  # not d{i}: the donors' local
            lines.append(f"    _check(n{i}, [{', '.join(f's{s}' for s in outs)}], "
                         f"[{', '.join(f's{s}' for s in n.inputs)}], e{i}, t{i})")
        dead = [s for s in set(n.inputs) if last[s] == i and s not in outputs]
        dead += [s for s in outs if s not in last and s not in outputs]  # never read
        if dead:
            lines.append(f"    del {', '.join(f's{s}' for s in sorted(dead))}")
    outs = tape.outputs
    if len(outs) == 1:
        lines.append(f"    return s{outs[0]}")
    else:
        lines.append(f"    return ({''.join(f's{s}, ' for s in outs)})")
    code = "\n".join(lines)
    exec(builtins.compile(code, f"<lazyx compiled plan {id(tape):#x}>", "exec"), ns)
    return ns["run"]


def _check_node(node: TapeNode, outs, ins, shapes, dtypes) -> None:
    """Check a node's outputs in the plan (the test suite's shape-rule check); ``shapes``
    None (shapeless) means the node's shape rule on the actual inputs."""
    prim = node.prim
    if shapes is None:
        shapes = [tuple(s) for s in prim.output_shapes([_ShapeOnly(x) for x in ins])]
    for o, want, d in zip(outs, shapes, dtypes):
        if type(o) is not _ndarray and not _backend.is_device_buffer(o):
            raise KernelOutputError(f"[compile] The kernel of {prim.name} returned "
                                    f"{type(o).__name__}, not a buffer.")
        if tuple(o.shape) != tuple(want) or o.dtype != d.np:
            raise KernelOutputError(f"[compile] {prim!r} gave {tuple(o.shape)} {o.dtype} in the "
                                    f"plan; the tape expects {tuple(want)} {d.np}.")


class _ShapeOnly:
    """What a shape rule reads of an array: shape, dtype, ndim."""

    __slots__ = ("shape", "dtype", "_shape", "_dtype")

    def __init__(self, buf):
        self.shape = self._shape = tuple(buf.shape)
        self.dtype = self._dtype = _dt.from_numpy(buf.dtype)

    @property
    def ndim(self):
        return len(self.shape)


# -- the compiled call's primitive ----------------------------------------------------
class _Entry:
    """One traced signature of a compiled function: its tape, plan and output layout."""

    label = "a compiled function"  # ``compile(<name>)``, set by _trace

    def __init__(self, tape: Tape, run_tape: Tape, out_def, out_template, n_returned: int,
                 state_paths: list, state_defs: list):
        self.tape = tape            # simplified, unfused (what transforms inline)
        self.run_tape = run_tape    # fused (what the plan runs)
        self.out_def = out_def
        self.out_template = out_template
        self.n_returned = n_returned
        self.state_paths = state_paths
        self.state_defs = state_defs
        # The node reads the constants of both tapes (expanding custom functions may
        # capture more); each tape binds those it has.
        consts = {}
        for t in (tape, run_tape):
            used = _used(t)
            consts.update((id(c), c) for s, c in t.constants.items() if s in used)
        self.consts = tuple(consts.values())
        self.tape_bound = self._bound(tape)
        self.run_bound = self._bound(run_tape)
        self.out_shapes = [tape.shapes[s] for s in tape.outputs]
        self.out_dtypes = [tape.dtypes[s] for s in tape.outputs]
        self.single = len(tape.outputs) == 1
        # One array returned as is, nothing written back: the call is one lazy().
        self.bare = self.single and out_def is None and n_returned == 1
        self.prim = CompiledCall(to_stream(None), self)
        self.prim._ins = None
        # The call inputs (positions in the node's inputs) that may donate their buffer:
        # a call then gets a primitive of its own that knows the node's input arrays.
        slots = {s for c in _donor_candidates(run_tape).values() for _, s in c}
        self.donor_positions = tuple(k for k, s in enumerate(self.run_bound) if s in slots)
        self._runner = None
        self._tables = None
        self._checked = None
        self._shapes_memo: dict = {}
        self._derived: dict = {}
        #: Whether what the plan launches was built before its first call (an eager
        #: graph's entry: lazyx.transforms.replay); a backend may then skip a warm-up run.
        self.prebuilt = False

    def call_prim(self, ins: tuple):
        """The primitive of one call on node inputs ``ins``: the shared one, or, when an
        input may donate its buffer, one that holds ``ins`` for the check at evaluation."""
        if not self.donor_positions:
            return self.prim
        p = _new_prim(CompiledCall)
        p.stream = self.prim.stream
        p.entry = self
        p._ins = ins
        return p

    def _bound(self, tape: Tape) -> list:
        where = {id(c): s for s, c in tape.constants.items()}
        return list(tape.inputs) + [where.get(id(c)) for c in self.consts]

    def rebuild(self, tables) -> None:
        """Make the plan for the kernel tables of the active backends."""
        checked = _scheduler.check_shape_rules
        self._runner = _make_runner(self.run_tape, self.run_bound, tables, checked)
        self._tables = tables
        self._checked = checked

    def output_shapes(self, inputs) -> list:
        if not self.tape.shapeless:
            return self.out_shapes
        key = tuple(x.shape for x in inputs)
        got = self._shapes_memo.get(key)
        if got is None:
            got = _replay_shapes(self.tape, self.tape_bound, inputs)
            if len(self._shapes_memo) > 256:
                self._shapes_memo.clear()
            self._shapes_memo[key] = got
        return got

    def derived(self, rule: str, spec):
        """The compiled function computing transform ``rule`` of this tape for argnums
        (``vjp``, ``jvp``) or batch axes (``vmap``) ``spec``."""
        key = (rule, tuple(spec))
        fn = self._derived.get(key)
        if fn is None:
            argnums = key[1]
            inline = self.inline
            if rule == "vmap":
                batched = _vmap(lambda *xs: inline(xs), in_axes=argnums)
                fn = lambda *xs: batched(*xs)  # noqa: E731  (a cache of its own)
            else:
                walk = autodiff.vjp if rule == "vjp" else autodiff.jvp

                def fn(primals, seeds):
                    def f(*xs):
                        full = list(primals)
                        for i, x in zip(argnums, xs):
                            full[i] = x
                        return inline(full)
                    return walk(f, [primals[i] for i in argnums], seeds)[1]
            fn.__qualname__ = f"{rule} of {self.label}"  # (named in its build line)
            fn = self._derived[key] = compile(fn)
        return fn

    def inline(self, inputs) -> list:
        """The tape as ordinary lazy ops on ``inputs`` (the node's inputs): its outputs."""
        tape = self.tape
        vals = dict(zip(self.tape_bound, inputs))
        for n in tape.nodes:
            ins = tuple(vals[s] for s in n.inputs)
            prim = n.prim
            outs = n.outputs
            if type(prim) is CustomTransforms:
                # A new call of the custom function: a node with the same rules.
                call = prim.call
                got = flatten(prim.fn(*call.args(ins), **call.kwargs))[0]
                for s, o in zip(outs, got):
                    vals[s] = o
                continue
            if tape.shapeless:
                shapes = [tuple(s) for s in prim.output_shapes(list(ins))]
            else:
                shapes = [tape.shapes[s] for s in outs]
            dtypes = [tape.dtypes[s] for s in outs]
            if len(outs) == 1:
                vals[outs[0]] = lazy(shapes[0], dtypes[0], prim, ins)
            else:
                for s, o in zip(outs, lazy_multi(shapes, dtypes, prim, ins)):
                    vals[s] = o
        return [vals[s] for s in tape.outputs]


def _used(tape: Tape) -> set:
    """The slots the tape's nodes read or return."""
    used = set(tape.outputs)
    for n in tape.nodes:
        used.update(n.inputs)
    return used


def _replay_shapes(tape: Tape, bound: list, inputs) -> list:
    """The output shapes of shapeless ``tape`` for node inputs ``inputs``."""
    shapes = {}
    for s, x in zip(bound, inputs):
        shapes[s] = tuple(x.shape)
    stand = {}
    for n in tape.nodes:
        ins = []
        for s in n.inputs:
            a = stand.get(s)
            if a is None:
                a = stand[s] = lazy(shapes[s], tape.dtypes[s], None, ())
            ins.append(a)
        try:
            got = n.prim.output_shapes(ins)
        except TransformError as e:
            raise TransformError(f"[compile] {n.prim.name} cannot infer output shapes for a "
                                 f"shapeless call: {e}") from None
        except (ValueError, IndexError) as e:
            raise ArgumentError(f"[compile] The shapeless function cannot run at input shapes "
                                f"{[tuple(x.shape) for x in inputs]}: {n.prim.name} fails: "
                                f"{e}") from None
        for s, g in zip(n.outputs, got):
            shapes[s] = tuple(g)
    return [shapes[s] for s in tape.outputs]


class CompiledCall(Primitive):
    """One call of a compiled function: runs the traced tape's plan.

    The transform rules rebuild the tape as ordinary lazy ops on the node's
    inputs and transform those, so gradients, forward derivatives and
    vectorisation see through the call.
    """

    __slots__ = ("entry", "_ins")
    entry: _Entry

    def output_shapes(self, inputs):
        return [tuple(s) for s in self.entry.output_shapes(inputs)]

    def eval_cpu(self, inputs):
        e = self.entry
        t = _backend._tables
        if t is None:
            t = _backend.dispatch_tables()
        if e._tables is not t[0] or e._checked is not _scheduler.check_shape_rules:
            e.rebuild(t[0])
            # The first run after a trace builds the kernels: their line names the function.
            from ..codegen import jit  # cold path only (start-up: jit loads on first build)
            with jit.building_for(e.label):
                return self.eval_cpu(inputs)
        ins = self._ins
        if ins is None or _scheduler.retain_graph.depth:
            return e._runner(inputs, ())
        # The node's inputs are checked here, where the scheduler holds no other
        # reference to them: see "Donation" in the module docstring.
        return e._runner(inputs, _donors(ins, inputs, e.donor_positions))

    eval_gpu = eval_cpu

    # Each rule is itself a compiled function (one per argnums or axes), so the
    # derivative or the batched form of a compiled call is again one node per call.
    def vjp(self, primals, cotangents, argnums, outputs):
        return self.entry.derived("vjp", argnums)(list(primals), list(cotangents))

    def jvp(self, primals, tangents, argnums):
        return self.entry.derived("jvp", argnums)(list(primals), list(tangents))

    def vmap(self, inputs, axes):
        outs = self.entry.derived("vmap", axes)(*inputs)
        return outs, [0] * len(outs)


# -- compile ------------------------------------------------------------------------
class CompileCache:
    """The traced signatures of a compiled function, with counters for inspection.

    Attributes:
        traces: how many times the function was traced (cache misses).
        hits: how many calls reused a trace.
        entries: ``{signature: entry}``; ``entry.tape`` is the simplified tape.
    """

    def __init__(self):
        self.entries: dict = {}
        self.fast: dict = {}  # flat keys of calls with positional arrays only
        self.traces = 0
        self.hits = 0

    def clear(self) -> None:
        self.entries.clear()
        self.fast.clear()

    def tapes(self) -> list:
        """The simplified tape of every traced signature."""
        return [e.tape for e in self.entries.values()]


_shared = {}  # (fun, shapeless) -> CompileCache for compile() without inputs/outputs


def _cache_for(fun, shapeless: bool, own: bool) -> CompileCache:
    if own:
        return CompileCache()
    try:
        import weakref
        per_fun = _shared.get(id(fun))
        if per_fun is None or per_fun[0]() is not fun:
            ref = weakref.ref(fun, lambda r, k=id(fun): _shared.pop(k, None))
            per_fun = _shared[id(fun)] = (ref, {})
    except TypeError:  # not weakly referenceable: a cache of its own
        return CompileCache()
    return per_fun[1].setdefault(shapeless, CompileCache())


def compile(fun, inputs=None, outputs=None, shapeless: bool = False):
    """Returns a compiled function which produces the same output as ``fun``.

    The first call with a new signature (the arguments' tree structure, array
    shapes and dtypes, and the values of non-array arguments) traces ``fun`` on
    placeholder arrays, simplifies the recorded graph and fuses element-wise
    work; later calls with that signature replay it as one node. Arrays that
    ``fun`` captures (closures, globals) are constants of the trace: their
    value at tracing time is used on every call.

    Args:
        fun (Callable): A function which takes a variable number of
          :class:`array` or trees of :class:`array` and returns a variable
          number of :class:`array` or trees of :class:`array`.
        inputs (list or dict, optional): Trees (nested lists and dicts) of
          arrays that ``fun`` reads besides its arguments, such as a model's
          parameters; they are read again on every call. Leaves that are not
          arrays are ignored. Default: ``None``.
        outputs (list or dict, optional): Trees of arrays that ``fun`` updates,
          such as a model's parameters and an optimizer's state: the arrays found
          in them after ``fun`` runs are computed by the compiled function and
          written back into them after every call. Default: ``None``.
        shapeless (bool, optional): A function compiled with ``shapeless=True``
          is not traced again when only the input shapes change (a change in the
          number of dimensions or a dtype still traces again). Output shapes
          are inferred again at each call as MLX does: a ``-1`` in a reshape is
          inferred again (other dimensions stay as traced), ``broadcast_to``
          broadcasts the input with the traced shape, gathers and slice
          updates keep their traced slice bounds. Functions with primitives
          whose parameters fix their output shapes (a basic slice, ``split``)
          raise :class:`ShapelessCompileError` (a ``ValueError``) naming the
          primitive. Default: ``False``.

    Returns:
        Callable: A compiled function with the same arguments as ``fun`` that
        returns the same output(s). Its ``cache`` attribute is the
        :class:`CompileCache` (``traces``, ``hits``).

    Example:
        >>> @mx.compile
        ... def gelu(x):
        ...     return x * (1 + mx.erf(x / math.sqrt(2))) / 2
        >>> gelu(mx.array([0.0, 1.0]))
        array([0, 0.841345], dtype=float32)
    """
    if not callable(fun):
        raise ArgumentError(f"[compile] Expected a callable, got {describe(fun)}.")
    if not isinstance(shapeless, bool):
        raise ArgumentError(f"[compile] shapeless must be a bool, got {shapeless!r}.")
    for name, t in (("inputs", inputs), ("outputs", outputs)):
        if t is not None and not isinstance(t, (list, tuple, dict)):
            raise ArgumentError(f"[compile] {name} must be a list or a dict (of trees of "
                                f"arrays), got {describe(t)}.")
    cache = _cache_for(fun, shapeless, inputs is not None or outputs is not None)
    entries = cache.entries
    settings = _settings
    state_in = inputs
    state_out = outputs

    def trace(leaves, treedef, has_kwargs, key):
        entry = _trace(fun, leaves, treedef, has_kwargs, state_in, state_out, shapeless)
        cache.traces += 1
        entries[key] = entry
        return entry

    fast = cache.fast
    simple = state_in is None and state_out is None

    def compiled(*args, **kwargs):
        if not settings.enabled:
            return fun(*args, **kwargs)
        if simple and not kwargs:
            # The common call, positional arrays only: a flat key, no tree walk. The
            # default stream is part of it: a trace records the device it ran on.
            key = [_device_state.stream or current_stream()]
            for a in args:
                if type(a) is not _array:
                    break
                key.append(len(a._shape) if shapeless else a._shape)
                key.append(a._dtype)
            else:
                entry = fast.get(tuple(key))
                if entry is not None:
                    cache.hits += 1
                    if entry.bare and not settings.tracing:
                        ins = args + entry.consts
                        prim = entry.prim if not entry.donor_positions else entry.call_prim(ins)
                        if shapeless:
                            return lazy(tuple(entry.output_shapes(ins)[0]), entry.out_dtypes[0],
                                        prim, ins)
                        return lazy(entry.out_shapes[0], entry.out_dtypes[0], prim, ins)
                    return _call(entry, args, (), None)
        if kwargs:
            leaves, treedef = flatten((args, kwargs))
        else:
            leaves, treedef = flatten(args)
        sig = _signature(leaves, shapeless, "argument")
        if state_in is not None:
            state, state_def = flatten(state_in)
            state = [x for x in state if isinstance(x, _array)]
            key = (_device_state.stream or current_stream(), treedef, sig, state_def,
                   _signature(state, shapeless, "inputs"))
        else:
            state = ()
            key = (_device_state.stream or current_stream(), treedef, sig)
        entry = entries.get(key)
        if entry is None:
            entry = trace(leaves, treedef, bool(kwargs), key)
            if simple and not kwargs and all(type(a) is _array for a in args):
                fast[(key[0],) + tuple(v for k in sig for v in k)] = entry
            known = None  # the trace ran the function, which may have changed the state
        else:
            cache.hits += 1
            # A replay runs no Python code of the function: the outputs= trees, when they
            # are the inputs= trees, still have the structure just flattened.
            known = state_def if state_in is not None and state_out is state_in else None
        return _call(entry, leaves, state, state_out, known)

    compiled = functools.update_wrapper(compiled, fun)
    compiled.cache = cache
    return compiled


def _call(entry: _Entry, leaves, state, state_out, state_def=None):
    """Add the compiled call's node; return the outputs and update ``outputs=``
    (``state_def``: the structure of ``outputs=`` when the caller knows it)."""
    ins = tuple(x for x in leaves if isinstance(x, _array)) + tuple(state) + entry.consts
    if not entry.out_shapes:
        outs = []
    elif _settings.tracing:
        # Inside another compile's trace: inline, so the outer tape sees every node.
        outs = entry.inline(ins)
    else:
        prim = entry.call_prim(ins)
        if entry.single:
            outs = [lazy(tuple(entry.output_shapes(ins)[0]), entry.out_dtypes[0], prim, ins)]
        else:
            outs = lazy_multi(entry.output_shapes(ins), entry.out_dtypes, prim, ins)
    n = entry.n_returned
    if entry.state_paths:
        _write_back(entry, state_out, outs[n:], state_def)
    template = entry.out_template
    if template is None:
        return unflatten(entry.out_def, outs[:n])
    vals = list(template)
    it = iter(outs[:n])
    for k, v in enumerate(vals):
        if v is _ARRAY:
            vals[k] = next(it)
    return unflatten(entry.out_def, vals)


_ARRAY = object()  # marks an array position in an output template


def _write_back(entry: _Entry, state_out, values, state_def=None) -> None:
    trees = state_out
    if (state_def if state_def is not None else flatten(trees)[1]) != entry.state_defs:
        raise ArgumentError(
            "[compile] The structure of the outputs= trees changed since the function was "
            "traced (an entry was added or removed outside the compiled function); compile "
            "cannot write the results back. Compile again, or keep the structure fixed.")
    parents: dict = {}  # the leaves of one container (a layer's parameters) share its walk
    for path, v in zip(entry.state_paths, values):
        up = path[:-1]
        c = parents.get(up)
        if c is None:
            c = parents[up] = _setter(trees, path, "outputs")
        c[path[-1]] = v


def _trace(fun, leaves, treedef, has_kwargs: bool, state_in, state_out,
           shapeless: bool) -> _Entry:
    """Trace ``fun`` once on placeholders and build the entry of this signature."""
    new_leaves = list(leaves)
    placeholders = []
    for k, x in enumerate(leaves):
        if isinstance(x, _array):
            new_leaves[k] = ph = _placeholder(x)
            placeholders.append(ph)
    # The inputs= arrays are replaced in place for the trace and restored after it.
    swapped = []
    if state_in is not None:
        for x, path in _tree_paths(state_in):
            ph = _placeholder(x)
            _assign(state_in, path, ph, "inputs")
            swapped.append((path, x, ph))
            placeholders.append(ph)
    handles = [(ph._prim, ph._dtype) for ph in placeholders]
    _settings.tracing += 1
    _scheduler.tracing.depth += 1
    try:
        if has_kwargs:
            a, kw = unflatten(treedef, new_leaves)
            out = fun(*a, **kw)
        else:
            out = fun(*unflatten(treedef, new_leaves))
    finally:
        _settings.tracing -= 1
        _scheduler.tracing.depth -= 1
        for path, x, ph in swapped:
            c = _setter(state_in, path, "inputs")
            try:
                still = c[path[-1]] is ph
            except (KeyError, IndexError):
                still = False
            if still:
                c[path[-1]] = x
    out_leaves, out_def = flatten(out)
    for x, p in zip(out_leaves, leaf_paths(out_def)):
        if x is not None and not isinstance(x, _array):
            raise ArgumentError(f"[compile] The function must return arrays or trees of arrays "
                                f"(None allowed); output{p} is {describe(x)}.")
    returned = [x for x in out_leaves if x is not None]
    # With None among the outputs, a template says where the arrays go.
    template = None if len(returned) == len(out_leaves) else \
        [None if x is None else _ARRAY for x in out_leaves]
    state_paths = []
    state_arrays = []
    state_defs = None
    if state_out is not None:
        for x, path in _tree_paths(state_out):
            _setter(state_out, path, "outputs")  # a tuple raises here, at the trace
            state_paths.append(path)
            state_arrays.append(x)
        state_defs = flatten(state_out)[1]
    roots = returned + state_arrays
    tape = simplify(_build(roots, handles, shapeless, False))
    run_tape = simplify(_build(roots, handles, shapeless, True)) if tape.custom else _copy(tape)
    run_tape = _fuse(fold_constants(run_tape))
    entry = _Entry(tape, run_tape, out_def, template, len(returned), state_paths, state_defs)
    name = getattr(fun, "__qualname__", None) or getattr(fun, "__name__", None)
    entry.label = f"compile({name or type(fun).__name__})"  # what its C++ build announces
    return entry


def _copy(tape: Tape) -> Tape:
    return Tape([TapeNode(n.prim, n.inputs, n.outputs) for n in tape.nodes], list(tape.inputs),
                list(tape.outputs), dict(tape.constants), list(tape.shapes), list(tape.dtypes),
                tape.shapeless, tape.custom)
