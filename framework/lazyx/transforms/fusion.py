"""Element-wise fusion: runs of element-wise nodes become one ``Compiled`` node.

A primitive is *fusible* when it declares how to write itself in the codegen IR
(:mod:`lazyx.codegen.ir`)::

    def to_expression(self, args):      # args: IR expressions of its inputs
        return ir.apply("exp", args[0])  # None: not expressible for these dtypes

(a multi-output primitive returns a tuple, one expression per output). Built-in
and plugin primitives are treated alike.

:func:`fuse_elementwise` groups fusible nodes of a compile tape
(:class:`lazyx.transforms.tape.Tape`) and replaces each group of at least
:data:`MIN_OPS` nodes by one :class:`Compiled` node whose parameter is the
group's :class:`~lazyx.codegen.ir.Program`. The rules:

* **One loop shape.** Every node of a group has the same output shape; inputs
  from outside the group may broadcast to it (the broadcast happens as they are
  loaded). A node of another shape starts another group.
* **Maximal runs.** Nodes are visited from the tape's end: a fusible node joins
  the group of one of its consumers when the bounds allow, else starts a group.
  Non-fusible nodes split runs. Then groups of one shape that read a common
  input merge (sibling fusion: the input is read once).
* **Materialised outputs.** A grouped node whose value is used outside its
  group (by another node or as a tape output) becomes an output of the fused
  node, so multi-output kernels compute shared work once.
* **No cycles, by construction.** Groups and unfused nodes (*units*) keep a
  topological numbering. Two units merge only if no path leaves one and reaches
  the other through a third unit (a non-fused node such as a matmul or a
  reduction, or another group): a fused node would read its own output. Only
  units numbered between the two can be on such a path, so the search is short,
  and after a merge the units between are renumbered (Pearce and Kelly's
  dynamic topological order). The fused tape runs in that numbering, so a group
  that is dropped afterwards (too small, or :func:`_fused_node` declines it)
  runs its nodes unfused in its place.
* **Bounds.** At most :data:`MAX_INPUTS` input buffers, :data:`MAX_OUTPUTS`
  output buffers and :data:`MAX_OPS` nodes per group. The input bound keeps
  the kernel's pointers in registers and its strided path small; the op bound
  keeps C++ compile time under a second or so. There is no depth bound: the
  kernel evaluates a shared subexpression once, whatever the depth.
* **Inlined constants.** Evaluated 0-d constants of the tape become literals
  of the kernel instead of inputs.
* **Epilogues.** A node whose primitive splits into a product and an element-wise
  tail (``split_epilogue``: ``AddMM`` is a ``Matmul`` and ``+ c``) is split on CPU
  streams when one of its output's readers is fusible, so that the tail fuses with
  them: a Linear layer's bias and its activation are one pass over the product's
  output instead of two. (On the GPU, cuBLAS adds the bias in the product's own pass.)

Fusion happens per stream kind, and a group never mixes streams: CPU streams
are fused when the active CPU backend runs ``Compiled`` natively and a C++
compiler exists (without one they are left unfused and one warning says how to
enable it); GPU streams when the active GPU backend is available and has a
kernel for ``Compiled`` (the ``cuda`` backend's is generated CUDA C++, see
``lazyx.backends.cuda.compiled``). ``Compiled`` also runs on any
backend without a kernel for it: its ``eval_cpu`` evaluates the program
written back as lazyx operations (:mod:`lazyx.codegen.lower`), which is how the
``cpu-reference`` backend runs it.
"""

from __future__ import annotations

import heapq
import warnings

import numpy as np

from ..arguments import broadcast_shapes
from ..array import from_buffer, lazy, lazy_multi
from ..backend import backend_for
from ..codegen import ir
from ..codegen.lower import to_graph
from ..device import DeviceType
from ..dtypes import from_numpy
from ..errors import MissingCompilerWarning
from ..primitive import Primitive
from ..rules import align_batched
from ..scheduler import eval_arrays, unevaluated_order
from .autodiff import jvp, vjp
from .tape import Tape, TapeNode

__all__ = ["Compiled", "fuse_elementwise", "fuse_arrays", "is_fusible", "MAX_INPUTS",
           "MAX_OUTPUTS", "MAX_OPS", "MIN_OPS", "MissingCompilerWarning"]

#: Most input buffers of one fused kernel.
MAX_INPUTS = 24
#: Most output buffers of one fused kernel.
MAX_OUTPUTS = 16
#: Most nodes in one fused kernel.
MAX_OPS = 128
#: Fewest nodes worth a fused kernel (a lone op keeps its own kernel).
MIN_OPS = 2
#: Most units one cycle check visits before it refuses the merge (keeps fusion near-linear).
_MAX_VISITS = 4096
#: Most groups reading one input that sibling fusion tries to merge with each of them.
_MAX_SIBLINGS = 16
#: Most ops a fused kernel adds to recompute outputs of others instead of loading them
#: (:func:`_recompute_in_readers`).
MAX_RECOMPUTE = 16
#: Fewest elements of a loop whose inputs may be recomputed instead of loaded.
RECOMPUTE_MIN_SIZE = 1 << 16

_CPU = DeviceType.cpu.value


class Compiled(Primitive):
    """A fused run of element-wise operations, computed by one kernel.

    ``program`` (a :class:`~lazyx.codegen.ir.Program`) says what each output is
    per element; inputs broadcast to the loop shape, which is the broadcast of
    the input shapes, and every output has that shape.
    """

    __slots__ = ("program",)
    program: ir.Program

    def output_shapes(self, inputs):
        shape = broadcast_shapes(*(x.shape for x in inputs)) if inputs else ()
        return [shape] * len(self.program.outputs)

    def eval_cpu(self, inputs):
        return interpret(self.program, inputs, self.stream)

    def _graph(self, xs):
        return to_graph(self.program, list(xs), self.stream)

    def _partial(self, primals, argnums):
        def f(*xs):
            full = list(primals)
            for i, x in zip(argnums, xs):
                full[i] = x
            return self._graph(full)
        return f

    # The rules transform the program written back as lazyx operations.
    def vjp(self, primals, cotangents, argnums, outputs):
        return vjp(self._partial(primals, argnums), [primals[i] for i in argnums],
                   list(cotangents))[1]

    def jvp(self, primals, tangents, argnums):
        return jvp(self._partial(primals, argnums), [primals[i] for i in argnums],
                   list(tangents))[1]

    # Element-wise, so batching is broadcasting: align the batch axes and run the
    # same program (still one fused node).
    def vmap(self, inputs, axes):
        xs, k = align_batched(list(inputs), list(axes))
        return _apply(self, xs), [k] * len(self.program.outputs)


def _apply(prim: Compiled, xs) -> list:
    shape = prim.output_shapes(xs)[0]
    outs = prim.program.outputs
    if len(outs) == 1:
        return [lazy(shape, outs[0].dtype, prim, tuple(xs))]
    return lazy_multi([shape] * len(outs), [o.dtype for o in outs], prim, tuple(xs))


def interpret(program: ir.Program, buffers, stream=None):
    """Run ``program`` on host buffers by evaluating it as lazyx operations (the
    reference semantics: the unfused graph's kernels run)."""
    outs = to_graph(program, [from_buffer(b) for b in buffers], stream)
    eval_arrays(outs)
    if len(outs) == 1:
        return outs[0]._data
    return tuple(o._data for o in outs)


class _Epilogue(Primitive):
    """The element-wise tail of a split node (``split_epilogue``): ``build`` writes it in
    the IR from its inputs' expressions (the product's output first). It fuses with its
    readers; left alone it runs as a program of its own."""

    __slots__ = ("build",)

    def __init__(self, stream, build):
        super().__init__(stream)
        self.build = build

    def output_shapes(self, inputs):
        return [broadcast_shapes(*(x.shape for x in inputs))]

    def to_expression(self, args):
        return self.build(*args)

    def eval_cpu(self, inputs):
        args = [ir.input(k, from_numpy(b.dtype)) for k, b in enumerate(inputs)]
        program = ir.Program([a.dtype for a in args], [self.build(*args)])
        return interpret(program, inputs, self.stream)

    eval_gpu = eval_cpu


def _split_epilogues(tape, kinds) -> None:
    """Split the CPU nodes whose primitive has ``split_epilogue(input dtypes, output
    dtype)`` returning ``(prim, positions, build)``: ``prim`` on the inputs at
    ``positions`` gives a new slot, and an :class:`_Epilogue` of ``build`` on that slot
    and the other inputs gives the node's output. Only where a reader of the output is
    fusible with it (same shape and stream): otherwise the node stays whole."""
    nodes = tape.nodes
    if DeviceType.cpu.value not in kinds or not any(
            hasattr(nd.prim, "split_epilogue") for nd in nodes):
        return
    shapes, dtypes = tape.shapes, tape.dtypes
    readers: dict = {}
    for nd in nodes:
        for x in nd.inputs:
            readers.setdefault(x, []).append(nd)

    def fuses_with(reader, slot, stream):
        return reader.prim.stream == stream and _loop_shape(reader, shapes, dtypes) == shapes[slot]

    out = []
    for nd in nodes:
        split = getattr(nd.prim, "split_epilogue", None)
        if split is None or nd.prim.stream.kind != DeviceType.cpu.value or len(nd.outputs) != 1 \
                or not any(fuses_with(r, nd.outputs[0], nd.prim.stream)
                           for r in readers.get(nd.outputs[0], ())):
            out.append(nd)
            continue
        s = nd.outputs[0]
        parts = split([dtypes[x] for x in nd.inputs], dtypes[s])
        if parts is None:
            out.append(nd)
            continue
        prim, positions, build = parts
        y = tape.new_slot(shapes[s], dtypes[s])
        rest = tuple(x for k, x in enumerate(nd.inputs) if k not in positions)
        out.append(TapeNode(prim, tuple(nd.inputs[k] for k in positions), (y,)))
        out.append(TapeNode(_Epilogue(nd.prim.stream, build), (y,) + rest, (s,)))
    tape.nodes = out


# -- fusibility ------------------------------------------------------------------------
_warned_classes: set = set()


def _loop_shape(nd, shapes, dtypes):
    """The loop shape of tape node ``nd`` when it can join a fused group (its outputs of
    one shape, its primitive written in the IR for these dtypes), else None."""
    outs = nd.outputs
    if not outs:
        return None
    s0 = shapes[outs[0]]
    if any(shapes[s] != s0 for s in outs) or _expression(
            nd.prim, [ir.input(k, dtypes[s]) for k, s in enumerate(nd.inputs)],
            [dtypes[s] for s in outs]) is None:
        return None
    return s0


def is_fusible(prim, dtypes) -> bool:
    """Whether ``prim`` with inputs of ``dtypes`` can be written in the IR."""
    return _expression(prim, [ir.input(k, d) for k, d in enumerate(dtypes)]) is not None


def _expression(prim, args, out_dtypes=None):
    """``prim.to_expression(args)`` as a tuple of expressions, or None when the
    primitive is not fusible here. A primitive whose declaration is broken is
    left unfused, with one warning naming it."""
    fn = getattr(prim, "to_expression", None)
    if fn is None:
        return None
    try:
        e = fn(tuple(args))
    except ir.IRError as exc:
        _warn_broken(prim, str(exc))
        return None
    if e is None:
        return None
    es = e if isinstance(e, tuple) else (e,)
    if not all(isinstance(x, ir.Expr) for x in es):
        _warn_broken(prim, f"to_expression returned {type(e).__name__}, not IR expressions")
        return None
    if out_dtypes is not None:
        got = [x.dtype for x in es]
        if got != list(out_dtypes):
            _warn_broken(prim, f"its expression has dtypes {[d.name for d in got]}, its "
                               f"node {[d.name for d in out_dtypes]}")
            return None
    return es


def _warn_broken(prim, why: str) -> None:
    if type(prim) in _warned_classes:
        return
    _warned_classes.add(type(prim))
    warnings.warn(f"[compile] {prim.name} declares to_expression but cannot be fused ({why}); "
                  f"it runs unfused.", RuntimeWarning, stacklevel=3)


# -- when to fuse -----------------------------------------------------------------------
def _native_backend(device_type=DeviceType.cpu) -> bool:
    """Whether the active backend of ``device_type`` runs Compiled with its own kernel."""
    try:
        b = backend_for(device_type)
        if device_type is not DeviceType.cpu and not b.is_available():
            return False
        return b.find_kernel(Compiled) is not None
    except Exception:
        return False


def _can_fuse() -> bool:
    """Whether CPU streams are fused: a native kernel and a C++ compiler (warned once if not)."""
    if not _native_backend():
        return False
    from ..codegen import jit  # the C++ toolchain loads on the first compile, not at import
    if jit.available():
        return True
    jit.warn_missing_compiler()  # names the user's line, however deep this runs
    return False


def _fused_kinds(nodes, force: bool) -> frozenset:
    """The stream kinds (``DeviceType`` values) whose nodes may be fused: CPU streams when
    :func:`_can_fuse` (always with ``force``), GPU streams when the active GPU backend has
    a kernel for ``Compiled`` (its kernels are generated for the device it runs)."""
    kinds = set()
    present = {nd.prim.stream.kind for nd in nodes}
    if _CPU in present and (force or _can_fuse()):
        kinds.add(_CPU)
    for dev in DeviceType:
        if dev.value != _CPU and dev.value in present and _native_backend(dev):
            kinds.add(dev.value)
    return frozenset(kinds)


# -- the pass ---------------------------------------------------------------------------
class _Unit:
    """A node of the graph of groups: one tape node, or a group of fusible tape nodes
    that becomes one fused node.

    ``pos`` numbers the units in a topological order of that graph (every edge goes
    to a larger ``pos``), kept as units merge (:meth:`_Grouping.merge`): it makes the
    graph of groups acyclic by construction, bounds each reachability search, and is
    the order the nodes run in afterwards. ``shape`` is the loop shape, None for a node
    that cannot fuse; ``inputs`` the slots read from outside (inlined scalars aside)
    and ``n_outputs`` the buffers written (values used outside or returned).
    """

    __slots__ = ("members", "pos", "shape", "stream", "inputs", "n_outputs")

    def __init__(self, i, shape=None, stream=None, inputs=frozenset()):
        self.members = [i]
        self.pos = i
        self.shape = shape
        self.stream = stream
        self.inputs = inputs
        self.n_outputs = 0


def _pos(u: _Unit) -> int:
    return u.pos


class _Grouping:
    """The units of one tape, the edges between them, and merges that keep them a DAG."""

    __slots__ = ("unit", "consumers", "producers")

    def __init__(self, unit, consumers, producers):
        self.unit = unit            # node -> its unit
        self.consumers = consumers  # node -> the nodes reading its outputs
        self.producers = producers  # node -> the nodes making its inputs

    def _next_to(self, u: _Unit, edges):
        """The other units at the end of ``edges`` (``consumers`` or ``producers``) of
        ``u``'s members: a group counts as one node."""
        unit = self.unit
        for m in u.members:
            for k in edges[m]:
                v = unit[k]
                if v is not u:
                    yield v

    def merge(self, x: _Unit, y: _Unit) -> bool:
        """Absorb unit ``x`` into unit ``y`` (``x.pos < y.pos``) unless that makes a
        cycle, that is unless a path leaves ``x`` and reaches ``y`` through another unit.

        The check is exact on the graph of groups (a member reached continues from
        every member of its group), and cheap because ``pos`` is topological: only
        units between ``x`` and ``y`` can lie on such a path (Pearce and Kelly's
        dynamic topological order). The units of that span that ``x`` reaches
        (``ahead``) then move after those that reach ``y`` (``behind``), reusing their
        positions, so the merged unit comes after everything it reads and before
        everything that reads it. A search past :data:`_MAX_VISITS` units refuses the
        merge: a fusion lost, never a cycle made.
        """
        top, bottom = y.pos, x.pos
        seen = {x, y}
        heap = []
        for v in self._next_to(x, self.consumers):
            if v is not y and v.pos < top and v not in seen:
                seen.add(v)
                heap.append((-v.pos, v))
        ahead = []
        if heap:
            # The units nearest y first: a path to y, if any, is found in about its length.
            heapq.heapify(heap)
            while heap:
                v = heapq.heappop(heap)[1]
                ahead.append(v)
                if len(ahead) > _MAX_VISITS:
                    return False
                for w in self._next_to(v, self.consumers):
                    if w is y:
                        return False
                    if w.pos < top and w not in seen:
                        seen.add(w)
                        heapq.heappush(heap, (-w.pos, w))
            behind = [y]
            seen = {y}
            stack = [y]
            while stack:
                for w in self._next_to(stack.pop(), self.producers):
                    if w.pos > bottom and w not in seen:
                        seen.add(w)
                        behind.append(w)
                        stack.append(w)
                if len(behind) > _MAX_VISITS:
                    return False
            slots = sorted([u.pos for u in ahead] + [u.pos for u in behind])
            behind.sort(key=_pos)
            ahead.sort(key=_pos)
            for u, p in zip(behind + ahead, slots):
                u.pos = p
        unit = self.unit
        for m in x.members:
            unit[m] = y
        y.members += x.members
        x.members = []
        return True


def fuse_elementwise(tape, force: bool = False, *, max_inputs: int = MAX_INPUTS,
                     max_outputs: int = MAX_OUTPUTS, max_ops: int = MAX_OPS,
                     min_ops: int = MIN_OPS):
    """Replace maximal runs of fusible element-wise nodes of ``tape`` by ``Compiled`` nodes.

    Args:
        tape: a :class:`lazyx.transforms.tape.Tape` (changed in place).
        force: fuse CPU streams even when the active CPU backend has no native
            kernel for ``Compiled`` or there is no compiler (tests use it); GPU
            streams are fused only when the GPU backend has a kernel for it.
        max_inputs, max_outputs, max_ops, min_ops: the bounds of a group (the
            module's constants by default).
    Returns:
        the tape.
    """
    nodes = tape.nodes
    n = len(nodes)
    if n < min_ops:
        return tape
    kinds = _fused_kinds(nodes, force)
    if not kinds:
        return tape
    _split_epilogues(tape, kinds)
    nodes = tape.nodes
    n = len(nodes)
    shapes, dtypes = tape.shapes, tape.dtypes
    producer = {}
    for i, nd in enumerate(nodes):
        for s in nd.outputs:
            producer[s] = i
    consumers = [[] for _ in range(n)]
    producers = [[] for _ in range(n)]
    for i, nd in enumerate(nodes):
        for s in nd.inputs:
            p = producer.get(s)
            if p is not None and (not consumers[p] or consumers[p][-1] != i):
                consumers[p].append(i)
                producers[i].append(p)
    tape_outputs = set(tape.outputs)
    scalars = _inlinable(tape)

    unit = []
    for i, nd in enumerate(nodes):
        u = _Unit(i)
        if nd.prim.stream.kind in kinds:
            s0 = _loop_shape(nd, shapes, dtypes)
            if s0 is not None:
                u = _Unit(i, s0, nd.prim.stream, {s for s in nd.inputs if s not in scalars})
        unit.append(u)
    grouping = _Grouping(unit, consumers, producers)

    # Maximal runs: from the end, a fusible node joins the group of the consumer it
    # shares most consumers with, if the bounds allow and no cycle results.
    for i in range(n - 1, -1, -1):
        me = unit[i]
        if me.shape is None:
            continue
        nd = nodes[i]
        cons = consumers[i]
        outs = set(nd.outputs)
        shared: dict = {}
        for c in cons:
            g = unit[c]
            shared[g] = shared.get(g, 0) + 1
        for g in sorted(shared, key=shared.get, reverse=True):
            if g.shape != me.shape or g.stream != me.stream or len(g.members) >= max_ops:
                continue
            ins = (g.inputs - outs) | me.inputs
            if len(ins) > max_inputs:
                continue
            added = _outputs_added(nd, cons, unit, g, tape_outputs)
            if g.n_outputs + added > max_outputs:
                continue
            if grouping.merge(me, g):
                g.inputs = ins
                g.n_outputs += added
                break
        else:
            me.n_outputs = _outputs_added(nd, cons, unit, me, tape_outputs)

    # Sibling fusion: groups of one shape that read a common input merge, so that the
    # input is read once and one kernel runs instead of several.
    readers: dict = {}
    for u in _distinct(unit):
        if u.shape is not None:
            for s in u.inputs:
                readers.setdefault(s, []).append(u.members[0])
    for firsts in readers.values():
        for k, a in enumerate(firsts):
            for b in firsts[k + 1:k + 1 + _MAX_SIBLINGS]:
                ua, ub = unit[a], unit[b]
                if ua is ub or ua.shape != ub.shape or ua.stream != ub.stream \
                        or len(ua.members) + len(ub.members) > max_ops:
                    continue
                ins, n_out = _union_io(nodes, ua, ub, consumers, unit, tape_outputs)
                if len(ins) > max_inputs or n_out > max_outputs:
                    continue
                x, y = (ua, ub) if ua.pos < ub.pos else (ub, ua)
                if grouping.merge(x, y):
                    y.inputs = ins
                    y.n_outputs = n_out

    # Each unit in ``pos`` order: a group as its fused node, or its nodes in tape order
    # (a group too small, or one that _fused_node declines, runs unfused in its place).
    new_nodes = []
    fused = False
    for u in sorted(_distinct(unit), key=_pos):
        if u.shape is not None and (len(u.members) >= min_ops or (
                len(u.members) == 1 and type(nodes[u.members[0]].prim) is _Epilogue)):
            node = _fused_node(tape, u, consumers, unit, tape_outputs, scalars)
            if node is not None:
                new_nodes.append(node)
                fused = True
                continue
        u.members.sort()
        new_nodes.extend(nodes[m] for m in u.members)
    if not fused:
        return tape
    if not _in_order(new_nodes, producer):  # pragma: no cover - merge keeps pos topological
        warnings.warn("[compile] Element-wise fusion ordered a value after its use; the "
                      "trace runs unfused. Please report this.", RuntimeWarning, stacklevel=2)
        return tape
    tape.nodes = new_nodes
    _recompute_in_readers(tape)
    return tape


def _rebuild(e: ir.Expr, leaves: dict, budget: list | None = None):
    """``e`` with the expressions of ``leaves`` (``{id(expr): replacement}``) replaced,
    or None when it reaches another input or (with a ``budget``) more than ``budget[0]``
    ops, which it counts down."""
    memo: dict = {}

    def go(x):
        r = leaves.get(id(x))
        if r is not None:
            return r
        if x.op == "const":
            return x
        if x.op == "input":
            return None
        r = memo.get(id(x))
        if r is None:
            if budget is not None:
                budget[0] -= 1
                if budget[0] < 0:
                    return None
            args = []
            for a in x.args:
                b = go(a)
                if b is None:
                    return None
                args.append(b)
            r = memo[id(x)] = ir._make(x.op, tuple(args), x.dtype)
        return r
    return go(e)


def _recompute_in_readers(tape) -> None:
    """Recompute a fused kernel's output in the fused kernel that reads it instead of
    storing it and loading it back, where the reader loads what it is made from anyway.

    Fusion makes every value used outside a group an output of the group's kernel. A
    function's forward and backward fuse into separate kernels (a product lies between
    them), so a backward that needs several intermediates of the forward reads them all:
    exact GELU's forward stored ``x``, ``x / sqrt(2)``, ``1 + erf(x / sqrt(2))`` and the
    result, and its backward loaded the first three. An output ``s`` of a ``Compiled``
    node ``P`` read only by one ``Compiled`` node ``C`` (of ``P``'s loop shape and
    stream, not a tape output) is instead written into ``C``'s program when ``P``'s
    expression of it can be rebuilt from other outputs of ``P`` (or inputs of ``P``) that
    ``C`` reads and keeps reading, adding at most :data:`MAX_RECOMPUTE` ops to ``C``;
    ``P`` then stops storing it. Arrays of fewer than :data:`RECOMPUTE_MIN_SIZE` elements stay as they are
    (in cache, a load is cheaper than recomputing), and so do shapeless tapes (a loop
    shape equal at the traced shapes may differ at others).
    """
    if getattr(tape, "shapeless", False):
        return
    nodes = tape.nodes
    shapes = tape.shapes
    made: dict = {}      # slot -> (producing Compiled node, its output position)
    readers: dict = {}   # slot -> the nodes reading it
    for nd in nodes:
        if type(nd.prim) is Compiled:
            for j, s in enumerate(nd.outputs):
                made[s] = (nd, j)
        for s in nd.inputs:
            r = readers.setdefault(s, [])
            if not r or r[-1] is not nd:
                r.append(nd)
    outputs = set(tape.outputs)
    dropped: dict = {}   # producer node -> slots it no longer stores
    changed: dict = {}   # reader node -> its new node
    for nd in nodes:
        if type(nd.prim) is not Compiled:
            continue
        loop = shapes[nd.outputs[0]]
        if int(np.prod(loop, dtype=np.int64)) < RECOMPUTE_MIN_SIZE:
            continue
        program = nd.prim.program
        old = [ir.input(k, d) for k, d in enumerate(program.inputs)]
        position = {s: k for k, s in enumerate(nd.inputs)}
        kept = set(nd.inputs)    # slots the reader still loads
        recomputed: dict = {}    # input position -> expression over old inputs
        budget = [MAX_RECOMPUTE]  # ops this reader may add, all its inputs together
        for k, s in enumerate(nd.inputs):
            hit = made.get(s)
            if hit is None or readers.get(s) != [nd] or s in outputs or shapes[s] != loop:
                continue
            prod, j = hit
            if prod.prim.stream is not nd.prim.stream:
                continue
            pp = prod.prim.program
            leaves = {id(pp.outputs[jj]): old[position[t]]
                      for jj, t in enumerate(prod.outputs) if t != s and t in kept}
            for kk, t in enumerate(prod.inputs):
                if t in kept:
                    leaves[id(ir.input(kk, pp.inputs[kk]))] = old[position[t]]
            spent = [budget[0]]
            e = _rebuild(pp.outputs[j], leaves, spent)
            if e is not None:
                budget[0] = spent[0]
                recomputed[k] = e
                kept.discard(s)
        if not recomputed:
            continue
        # Each recomputed input refers only to inputs kept when it was rebuilt; one
        # removed later is resolved through its own expression in turn.
        order = [k for k, s in enumerate(nd.inputs) if s in kept]
        new_in = {k: ir.input(i, program.inputs[k]) for i, k in enumerate(order)}
        resolved: dict = {}

        def resolve(k):
            r = new_in.get(k)
            if r is None:
                r = resolved.get(k)
                if r is None:
                    refs = {id(old[kk]): resolve(kk) for kk in _inputs_of(recomputed[k])}
                    r = resolved[k] = _rebuild(recomputed[k], refs)
            return r
        refs = {id(old[k]): resolve(k) for k in range(len(old))}
        outs = [_rebuild(o, refs) for o in program.outputs]
        new = ir.Program([program.inputs[k] for k in order], outs)
        changed[nd] = TapeNode(Compiled(nd.prim.stream, new), tuple(nd.inputs[k] for k in order),
                               nd.outputs)
        for k in recomputed:
            prod = made[nd.inputs[k]][0]
            dropped.setdefault(prod, set()).add(nd.inputs[k])
    if not changed:
        return
    new_nodes = []
    for nd in nodes:
        gone = dropped.get(nd)
        nd = changed.get(nd, nd)  # (a reader's new node keeps its outputs)
        if gone:
            keep = [j for j, s in enumerate(nd.outputs) if s not in gone]
            if not keep:  # every output is recomputed where it is read (constants alone)
                continue
            pp = nd.prim.program
            nd = TapeNode(Compiled(nd.prim.stream, ir.Program(pp.inputs, [pp.outputs[j] for j in keep])),
                          nd.inputs, tuple(nd.outputs[j] for j in keep))
        new_nodes.append(nd)
    tape.nodes = new_nodes


def _inputs_of(e: ir.Expr) -> list:
    """The input positions ``e`` reads."""
    return [x.value for x in ir.topological([e]) if x.op == "input"]


def _distinct(unit) -> list:
    """The units of a node-to-unit list, each once, in the order first seen."""
    return list({id(u): u for u in unit}.values())


def _union_io(nodes, a: _Unit, b: _Unit, consumers, unit, tape_outputs):
    """``(inputs, n_outputs)`` of the union of groups ``a`` and ``b``: a value one of
    them makes and the other reads is no longer an input, nor an output if nothing
    else reads it."""
    members = a.members + b.members
    made = {s for m in members for s in nodes[m].outputs}
    n_out = 0
    for m in members:
        outside = any(unit[c] is not a and unit[c] is not b for c in consumers[m])
        n_out += sum(1 for s in nodes[m].outputs if outside or s in tape_outputs)
    return (a.inputs | b.inputs) - made, n_out


def _in_order(new_nodes, producer) -> bool:
    """Whether every slot a node makes is made before it is read."""
    written = set()
    for nd in new_nodes:
        for s in nd.inputs:
            if s in producer and s not in written:
                return False
        written.update(nd.outputs)
    return True


def _outputs_added(nd, cons, group, g, tape_outputs) -> int:
    """How many output buffers node ``nd`` adds to group ``g``: its values used outside."""
    outside = any(group[c] is not g for c in cons)
    return sum(1 for s in nd.outputs if outside or s in tape_outputs)


def _inlinable(tape) -> dict:
    """``{slot: 0-d host buffer}`` of the tape's evaluated scalar constants."""
    out = {}
    for s, c in tape.constants.items():
        d = c._data
        if type(d) is np.ndarray and d.ndim == 0:
            out[s] = d
    return out


def _fused_node(tape, g: _Unit, consumers, group, tape_outputs, scalars):
    """The ``Compiled`` tape node of group ``g``, or None when it must stay unfused."""
    shapes, dtypes = tape.shapes, tape.dtypes
    members = sorted(g.members)
    env: dict = {}
    inputs: list = []
    for m in members:
        nd = tape.nodes[m]
        args = []
        for s in nd.inputs:
            e = env.get(s)
            if e is None:
                if s in scalars:
                    e = ir.constant(scalars[s], dtypes[s])
                else:
                    e = ir.input(len(inputs), dtypes[s])
                    inputs.append(s)
                env[s] = e
            args.append(e)
        es = _expression(nd.prim, args, [dtypes[s] for s in nd.outputs])
        if es is None:  # pragma: no cover - fusibility was checked on the same dtypes
            return None
        for s, e in zip(nd.outputs, es):
            env[s] = e
    outputs = []
    for m in members:
        nd = tape.nodes[m]
        outside = any(group[c] is not g for c in consumers[m])
        for s in nd.outputs:
            if outside or s in tape_outputs:
                outputs.append(s)
    if not outputs:
        return None
    in_shapes = [shapes[s] for s in inputs]
    try:
        loop = broadcast_shapes(*in_shapes) if in_shapes else ()
    except Exception:
        return None
    if tuple(loop) != tuple(g.shape):
        return None  # the group's shape comes from a broadcast inside it
    program = ir.Program([dtypes[s] for s in inputs], [env[s] for s in outputs])
    if getattr(tape, "shapeless", False) and not _outputs_use_every_input(program):
        # At other shapes an output that misses an input could be smaller than the loop.
        return None
    return TapeNode(Compiled(g.stream, program), tuple(inputs), tuple(outputs))


def _outputs_use_every_input(program: ir.Program) -> bool:
    n = len(program.inputs)
    for o in program.outputs:
        used = {e.value for e in ir.topological([o]) if e.op == "input"}
        if len(used) != n:
            return False
    return True


# -- lazy graphs ------------------------------------------------------------------------
def fuse_arrays(outputs, inputs=(), force: bool = False, **bounds) -> list:
    """The arrays ``outputs`` computed by a graph whose element-wise runs are fused.

    A standalone entry to the pass for lazy graphs (``compile`` uses
    :func:`fuse_elementwise` on its tapes). Evaluated arrays that the graph
    reads are constants, except ``inputs`` (never inlined).

    Args:
        outputs: unevaluated arrays.
        inputs: evaluated arrays that stand for varying inputs.
        force: fuse CPU streams even without a native backend kernel or a compiler.
        bounds: ``max_inputs``, ``max_outputs``, ``max_ops``, ``min_ops`` (see
            :func:`fuse_elementwise`).
    Returns:
        new arrays with the same values as ``outputs``.
    """
    tape = Tape()
    slot: dict = {}
    leaves: dict = {}   # slot -> the evaluated array it stands for
    original: dict = {}  # slot -> the array of the graph it stands for
    keep = []
    is_input = {id(x) for x in inputs}

    def slot_of(x):
        s = slot.get(id(x))
        if s is None:
            s = slot[id(x)] = tape.new_slot(x._shape, x._dtype)
            leaves[s] = x
            if id(x) in is_input:
                tape.inputs.append(s)
            else:
                tape.constants[s] = x
        return s

    for a in unevaluated_order(list(outputs)):
        outs = (a,) if a._siblings is None else a._siblings
        ins = tuple(slot_of(x) if x._prim is None or x._data is not None else slot[id(x)]
                    for x in a._inputs)
        out_slots = []
        for o in outs:
            s = slot[id(o)] = tape.new_slot(o._shape, o._dtype)
            keep.append(o)
            original[s] = o
            out_slots.append(s)
        tape.nodes.append(TapeNode(a._prim, ins, tuple(out_slots)))
    tape.outputs = [slot_of(o) if id(o) not in slot else slot[id(o)] for o in outputs]
    fuse_elementwise(tape, force=force, **bounds)
    vals = dict(leaves)
    for nd in tape.nodes:
        ins = tuple(vals[s] for s in nd.inputs)
        olds = [original.get(s) for s in nd.outputs]
        if olds[0] is not None and olds[0]._prim is nd.prim and \
                all(x is y for x, y in zip(ins, olds[0]._inputs)):
            # Untouched by fusion: the same arrays (transforms know some by identity).
            for s, o in zip(nd.outputs, olds):
                vals[s] = o
            continue
        if len(nd.outputs) == 1:
            s = nd.outputs[0]
            vals[s] = lazy(tape.shapes[s], tape.dtypes[s], nd.prim, ins)
        else:
            for s, o in zip(nd.outputs, lazy_multi([tape.shapes[s] for s in nd.outputs],
                                                   [tape.dtypes[s] for s in nd.outputs],
                                                   nd.prim, ins)):
                vals[s] = o
    return [vals[s] for s in tape.outputs]

