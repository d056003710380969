"""Indexing op pack: ``array.__getitem__``, ``array.__setitem__``, ``array.at`` and
``take``, ``take_along_axis``, ``put_along_axis``.

An index is parsed once into *entries*, one per input axis plus one per new axis:

* ``("slice", start, stop, step)``: normalised as ``slice.indices`` gives it (``stop``
  is ``-1`` for a negative step that runs through index 0; an empty slice is
  ``(0, 0, 1)``);
* ``("int", i)``: a non-negative integer, checked against the axis at the call;
* ``("new",)``: a new axis of size 1 (``None``);
* ``("array", k)``: the integer index array held by the node's input ``k``.

Basic indexing (ints, slices, ``None``, ``...``) becomes a :class:`Slice` (a NumPy view)
plus a reshape when ints or ``None`` change the dimensions; assigning to it a
:class:`SliceUpdate`. An index with integer arrays (lazyx arrays, lists, NumPy
arrays) follows NumPy's advanced-indexing rules and becomes a :class:`Gather`;
assigning to it, or any ``a.at[...]`` update, a :class:`Scatter`. A boolean mask, as
MLX 0.32 allows, is a whole-key assignment only (``a[mask] = v``, MLX's masked scatter:
see :func:`_masked_update`); reading ``a[mask]`` is refused, as MLX refuses it (its shape
would depend on the data).

``__setitem__`` is functional, as in MLX: ``a[idx] = v`` makes the Python object ``a``
refer to a new node; nodes built from the old value keep reading it (see
:func:`_setitem`). Integer indices out of
range raise :class:`IndexOutOfRangeError` at the call when the index is a Python int or
host data (list, NumPy array), and at evaluation when it is a lazyx array (where MLX
reads or writes out of bounds).

Transform rules sit beside each primitive. A gather's cotangent is a scatter-add at the
same index; a scatter's cotangents follow its mode (see :class:`Scatter`): an
assignment's reaches only the write that won each position (found by scattering the
updates' positions when the index may repeat), so gradients agree with finite
differences. Batched, an operand's batch axis gets a whole slice, or, when index arrays
are batched too, an index array of batch positions placed so that NumPy lays out the
result as it does for one example. Index arrays get no gradient.
"""

from __future__ import annotations

import operator
import sys
from typing import Literal

import numpy as np

import lazyx.core as mx
from lazyx import dtypes as dt
from lazyx.arguments import as_array, broadcast_shapes, cast, constant, normalize_axis
from lazyx.array import SETITEM_REFS, array, from_buffer, lazy, update_in_place
from lazyx.device import to_stream
from lazyx.errors import (ArgumentError, AxisError, DtypeError, IndexOutOfRangeError, LazyxError,
                          ShapeError, at_op)
from lazyx.hookspecs import hookimpl, pack_hooks
from lazyx.primitive import Axis, Primitive, SameShape, Size
from lazyx.rules import add_batch_axis, batch_first, move_batch_axis, sum_to_shape
from lazyx.examples import example, integers, uniform

_int = int
_index = operator.index
_getrefcount = sys.getrefcount
_PY_SCALARS = (bool, int, float, complex)
_FULL = slice(None)
#: One entry of a Gather's or Scatter's index (the module docstring says what each means).
IndexEntry = (tuple[Literal["slice"], int, int, int] | tuple[Literal["int"], Size]
              | tuple[Literal["new"]] | tuple[Literal["array"], Size])


# -- entries --------------------------------------------------------------------
def _key_template(entries: tuple) -> tuple:
    """The NumPy index for ``entries`` with ``None`` where arrays go, and their places."""
    tmpl = []
    places = []
    for pos, e in enumerate(entries):
        tag = e[0]
        if tag == "slice":
            tmpl.append(slice(e[1], e[2] if e[2] >= 0 else None, e[3]))
        elif tag == "int":
            tmpl.append(e[1])
        elif tag == "new":
            tmpl.append(None)
        else:
            tmpl.append(None)
            places.append((pos, e[1]))
    return tuple(tmpl), tuple(places)


def _indexed_shape(entries: tuple, index_shapes) -> tuple:
    """The shape NumPy gives ``x[entries]`` (``index_shapes`` by input position)."""
    dims = []
    adv = []
    first = -1
    last_adv = -2
    adjacent = True
    for pos, e in enumerate(entries):
        tag = e[0]
        if tag == "slice":
            dims.append(len(range(e[1], e[2], e[3])))
        elif tag == "new":
            dims.append(1)
        else:
            if first < 0:
                first = len(dims)
            elif last_adv != pos - 1:
                adjacent = False
            last_adv = pos
            adv.append(() if tag == "int" else index_shapes[e[1]])
    if first < 0:
        return tuple(dims)
    try:
        b = broadcast_shapes(*adv)
    except ShapeError:
        raise ShapeError(f"Index arrays of shapes {', '.join(str(s) for s in adv if s)} cannot "
                         f"be broadcast together.") from None
    if adjacent:
        return tuple(dims[:first]) + tuple(b) + tuple(dims[first:])
    return tuple(b) + tuple(dims)


def _slice_key(starts: tuple, ends: tuple, strides: tuple) -> tuple:
    """The NumPy index of a Slice (an end of -1 runs through index 0)."""
    if -1 in ends:
        ends = [None if e < 0 else e for e in ends]
    return tuple(map(slice, starts, ends, strides))


# -- primitives ------------------------------------------------------------------
# Transform rules sit beside each class and build lazy graphs (``lazyx.core`` ops or new
# nodes of these primitives). Index arrays are integers: they get no cotangent. In the
# ``vmap`` rules the batch goes first wherever an index would otherwise have to follow it.
def _apply(prim: Primitive, *inputs) -> array:
    """A node of ``prim`` on ``inputs`` with the first input's dtype."""
    return lazy(prim.output_shapes(inputs)[0], inputs[0]._dtype, prim, inputs)


def _insert(t: tuple, i: int, v) -> tuple:
    return t[:i] + (v,) + t[i:]


def _tangents(argnums, tangents) -> dict:
    return {i: t for i, t in zip(argnums, tangents)}


def _no_index_gradient(prim, argnums, first: int, mode: str, last: int | None = None) -> None:
    """Raise where the transform reaches an index input (positions ``first``..``last``).

    MLX refuses to differentiate with respect to indices, even integer ones computed
    from the differentiated values (``b[mx.argsort(b)]``), rather than give zeros:
    the fix is ``stop_gradient`` on the indices. Internal rules stop theirs."""
    for i in argnums:
        if i >= first and (last is None or i <= last):
            raise ArgumentError(f"[{prim.name}] Cannot calculate {mode} with respect to indices "
                                f"(input {i}). Use stop_gradient on indices to stop gradients "
                                f"from being computed.")


class _Strided(Primitive):
    """Parameters of a strided block of every axis: ``start_indices``, ``end_indices``
    (``-1`` where a negative stride runs through index 0) and ``strides``."""

    __slots__ = ("start_indices", "end_indices", "strides", "_key")
    derived_slots = ("_key",)
    start_indices: tuple[int, ...]
    end_indices: tuple[int, ...]
    strides: tuple[int, ...]
    shapeless = False  # parameters fix the output shape (see Primitive.shapeless)

    def __init__(self, stream, start_indices: tuple, end_indices: tuple, strides: tuple):
        super().__init__(stream)
        self.start_indices = start_indices
        self.end_indices = end_indices
        self.strides = strides
        self._key = _slice_key(start_indices, end_indices, strides)

    def _params(self):
        return self.start_indices, self.end_indices, self.strides

    def _batched(self, b: int, n: int) -> tuple:
        """The parameters with the whole batch axis ``b`` (of size ``n``) inserted."""
        return (_insert(self.start_indices, b, 0), _insert(self.end_indices, b, n),
                _insert(self.strides, b, 1))


class Slice(_Strided):
    """``a[start:end:stride]`` along every axis (a view)."""

    __slots__ = ()
    arity = 1

    def output_shapes(self, inputs):
        return [tuple(len(range(b, e, s)) for b, e, s in
                      zip(self.start_indices, self.end_indices, self.strides))]

    def vjp(self, primals, cotangents, argnums, outputs):
        a = primals[0]
        return [_apply(SliceUpdate(self.stream, *self._params()), mx.zeros_like(a),
                       cotangents[0])]

    def jvp(self, primals, tangents, argnums):
        return [_apply(self, tangents[0])]

    def vmap(self, inputs, axes):
        x, b = inputs[0], axes[0]
        return [_apply(Slice(self.stream, *self._batched(b, x._shape[b])), x)], [b]


class SliceUpdate(SameShape, _Strided):
    """``a`` with ``a[start:end:stride]`` replaced by the update (second input), which
    broadcasts to the slice."""

    __slots__ = ()
    arity = 2
    # Its output has the input's shape: a shapeless compile replays the traced block
    # bounds at other shapes, as MLX's SliceUpdate does.
    shapeless = True

    def vjp(self, primals, cotangents, argnums, outputs):
        v, g = primals[1], cotangents[0]
        out = []
        for i in argnums:
            if i == 0:  # the overwritten block gets nothing
                out.append(_apply(self, g, constant(0, g._dtype)))
            else:
                gv = _apply(Slice(self.stream, *self._params()), g)
                out.append(sum_to_shape(gv, v._shape, self.stream))
        return out

    def jvp(self, primals, tangents, argnums):
        a = primals[0]
        ts = _tangents(argnums, tangents)
        ta = ts.get(0)
        return [_apply(self, mx.zeros_like(a) if ta is None else ta,
                       ts.get(1, constant(0, a._dtype)))]

    def vmap(self, inputs, axes):
        (a, v), (b, bv) = inputs, axes
        s = self.stream
        if b is None:
            a, b = add_batch_axis(a, 0, v._shape[bv], s), 0
        r = len(a._shape) - 1
        if bv is not None:
            v = move_batch_axis(batch_first(v, bv, r, s), 0, b, s)
        elif b and len(v._shape) > r - b:  # the update would broadcast over the batch axis
            v = mx.reshape(v, (1,) * (r - len(v._shape)) + v._shape, stream=s)
            v = mx.expand_dims(v, b, stream=s)
        return [_apply(SliceUpdate(s, *self._batched(b, a._shape[b])), a, v)], [b]


class Gather(Primitive):
    """``a[index]`` with NumPy's advanced-indexing rules; ``entries`` (see the module
    docstring) name the index arrays by input position."""

    __slots__ = ("entries", "_template", "_places", "_take_axis", "_take_rest")
    derived_slots = ("_template", "_places", "_take_axis", "_take_rest")
    entries: tuple[IndexEntry, ...]
    # The index arrays' shapes are read at each call; slice entries keep their traced
    # bounds, as MLX's Gather keeps its slice sizes in a shapeless compile.

    def __init__(self, stream, entries: tuple):
        super().__init__(stream)
        self.entries = entries
        plan = _GATHER_PLANS.get(entries)
        if plan is None:
            plan = _gather_plan(entries)
        self._template, self._places, self._take_axis, self._take_rest = plan

    def output_shapes(self, inputs):
        return [_indexed_shape(self.entries, [x.shape for x in inputs])]

    # The cotangent adds back at the gathered positions (repeated ones accumulate).
    def vjp(self, primals, cotangents, argnums, outputs):
        _no_index_gradient(self, argnums, 1, "VJP")
        a = primals[0]
        prim = Scatter(self.stream, _shift_entries(self.entries, 1), "add")
        return [None if i else _apply(prim, mx.zeros_like(a), cotangents[0], *primals[1:])
                for i in argnums]

    def jvp(self, primals, tangents, argnums):
        _no_index_gradient(self, argnums, 1, "JVP")
        return [_apply(self, tangents[0], *primals[1:])]

    def vmap(self, inputs, axes):
        x, bx = inputs[0], axes[0]
        entries, idx, xb, at = _batch_index(self.entries, bx is not None, inputs[1:], axes[1:],
                                            1, _batch_size(inputs, axes), self.stream)
        if bx is not None:
            x = move_batch_axis(x, bx, xb, self.stream)
        return [_apply(Gather(self.stream, entries), x, *idx)], [at]


_GATHER_PLANS: dict = {}


def _gather_plan(entries: tuple) -> tuple:
    """``(template, places, take_axis, take_rest)`` of a Gather, cached by entries.

    One index array among whole-axis slices is np.take, NumPy's fastest gather
    (``take_axis``); the kernel confirms that the slices span their axes (their stops,
    ``take_rest``, are the sizes).
    """
    template, places = _key_template(entries)
    take_axis, take_rest = -1, None
    if len(places) == 1:
        pos = places[0][0]
        rest = [e for i, e in enumerate(entries) if i != pos]
        if all(e[0] == "slice" and e[1] == 0 and e[3] == 1 for e in rest):
            take_axis, take_rest = pos, tuple(e[2] for e in rest)
    if len(_GATHER_PLANS) > 1024:
        _GATHER_PLANS.clear()
    plan = _GATHER_PLANS[entries] = (template, places, take_axis, take_rest)
    return plan


class Scatter(SameShape):
    """``a`` updated at ``a[index]`` (NumPy's indexing rules) with the update (second
    input). ``reduce`` is ``None`` (assign; with repeated positions one write wins) or
    ``"add" "prod" "max" "min"``, which combine repeated positions (``np.add.at``).

    Gradients: an assignment's cotangent reaches only the update that won each
    position; ``add`` is linear; ``prod`` gives each update the product of the others
    at its position (zeros included); ``max``/``min`` share a position's cotangent
    equally among the operand and the updates that equal the result there (JAX's
    convention for ties).
    """

    __slots__ = ("entries", "reduce", "_template", "_places")
    derived_slots = ("_template", "_places")
    entries: tuple[IndexEntry, ...]
    reduce: Literal["add", "prod", "max", "min"] | None

    def __init__(self, stream, entries: tuple, reduce):
        super().__init__(stream)
        self.entries = entries
        self.reduce = reduce
        self._template, self._places = _key_template(entries)

    # -- the pieces the rules are made of --
    def _scatter(self, a, v, idx, reduce) -> array:
        p = self if reduce == self.reduce else Scatter(self.stream, self.entries, reduce)
        return _apply(p, a, v, *idx)

    def _gather(self, x, idx) -> array:
        return _apply(Gather(self.stream, _shift_entries(self.entries, -1)), x, *idx)

    def _target(self, a, idx) -> tuple:
        """The shape of the indexed block (what the update broadcasts to)."""
        return _indexed_shape(self.entries, [a._shape, ()] + [x._shape for x in idx])

    def _winners(self, a, idx, target) -> array:
        """Where each element of the (broadcast) update is the write that stayed."""
        s = self.stream
        n = _prod(target)
        itype = dt.int32 if n < 2 ** 31 else dt.int64
        ids = mx.reshape(mx.arange(n, dtype=itype, stream=s), target, stream=s)
        w = self._scatter(mx.full(a._shape, -1, itype, stream=s), ids, idx, None)
        return mx.equal(self._gather(w, idx), ids, stream=s)

    def _prod_others(self, a, vb, idx) -> array:
        """For each update, ``a`` times the product of the other updates at its position."""
        s = self.stream
        zero = mx.equal(vb, 0, stream=s)
        nz = mx.where(zero, constant(1, vb._dtype), vb, stream=s)
        ones = mx.ones_like(a, stream=s)
        p = self._scatter(ones, nz, idx, "prod")
        z = self._gather(self._scatter(mx.zeros_like(a, stream=s),
                                       mx.astype(zero, a._dtype, stream=s), idx, "add"), idx)
        single = mx.where(zero, mx.equal(z, 1, stream=s), mx.equal(z, 0, stream=s), stream=s)
        ap = self._gather(mx.multiply(a, p, stream=s), idx)
        return mx.multiply(mx.divide(ap, nz, stream=s), mx.astype(single, a._dtype, stream=s),
                           stream=s)

    def _extremum_parts(self, a, vb, idx, out):
        """``(kept, won, count)``: where the operand equals the result, where an update
        does, and how many of them share each position."""
        s = self.stream
        kept = mx.equal(a, out, stream=s)
        won = mx.equal(vb, self._gather(out, idx), stream=s)
        count = self._scatter(mx.astype(kept, a._dtype, stream=s),
                              mx.astype(won, a._dtype, stream=s), idx, "add")
        return kept, won, count

    # -- the rules --
    def vjp(self, primals, cotangents, argnums, outputs):
        _no_index_gradient(self, argnums, 2, "VJP")
        a, v, idx = primals[0], primals[1], primals[2:]
        g = cotangents[0]
        s = self.stream
        red = self.reduce
        ga = gv = None
        want_v = 1 in argnums
        if red is None:
            ga = self._scatter(g, constant(0, g._dtype), idx, None)
            if want_v:
                gv = self._gather(g, idx)
                if _may_repeat(self.entries, a._shape, idx, 2):
                    mask = self._winners(a, idx, gv._shape)
                    gv = mx.where(mask, gv, constant(0, g._dtype), stream=s)
        elif red == "add":
            ga = g
            if want_v:
                gv = self._gather(g, idx)
        else:
            target = self._target(a, idx)
            vb = mx.broadcast_to(v, target, stream=s)
            if red == "prod":
                ga = mx.multiply(g, _conj(self._scatter(mx.ones_like(a, stream=s), vb, idx,
                                                        "prod")), stream=s)
                if want_v:
                    gv = mx.multiply(self._gather(g, idx), _conj(self._prod_others(a, vb, idx)),
                                     stream=s)
            else:
                kept, won, count = self._extremum_parts(a, vb, idx, outputs[0])
                share = mx.divide(g, count, stream=s)
                zero = constant(0, g._dtype)
                ga = mx.where(kept, share, zero, stream=s)
                if want_v:
                    gv = mx.where(won, self._gather(share, idx), zero, stream=s)
        res = []
        for i in argnums:
            if i == 0:
                res.append(ga)
            elif i == 1:
                res.append(sum_to_shape(gv, v._shape, s))
            else:
                res.append(None)
        return res

    def jvp(self, primals, tangents, argnums):
        _no_index_gradient(self, argnums, 2, "JVP")
        a, v, idx = primals[0], primals[1], primals[2:]
        s = self.stream
        ts = _tangents(argnums, tangents)
        ta, tv = ts.get(0), ts.get(1)
        if ta is None and tv is None:
            return [None]
        red = self.reduce
        if red is None or red == "add":
            if tv is None:
                return [ta if red else self._scatter(ta, constant(0, a._dtype), idx, None)]
            return [self._scatter(mx.zeros_like(a) if ta is None else ta, tv, idx, red)]
        target = self._target(a, idx)
        vb = mx.broadcast_to(v, target, stream=s)
        if red == "prod":
            out = None
            if ta is not None:
                out = mx.multiply(ta, self._scatter(mx.ones_like(a, stream=s), vb, idx, "prod"),
                                  stream=s)
            if tv is not None:
                tv = mx.multiply(mx.broadcast_to(tv, target, stream=s),
                                 self._prod_others(a, vb, idx), stream=s)
                out = self._scatter(mx.zeros_like(a) if out is None else out, tv, idx, "add")
            return [out]
        kept, won, count = self._extremum_parts(a, vb, idx, _apply(self, a, v, *idx))
        zero = constant(0, a._dtype)
        base = mx.zeros_like(a) if ta is None else mx.where(kept, ta, zero, stream=s)
        if tv is not None:
            base = self._scatter(base, mx.where(won, tv, zero, stream=s), idx, "add")
        return [mx.divide(base, count, stream=s)]

    def vmap(self, inputs, axes):
        (a, v), (ba, bv) = inputs[:2], axes[:2]
        s = self.stream
        n = _batch_size(inputs, axes)
        entries, idx, xb, at = _batch_index(self.entries, True, inputs[2:], axes[2:], 2, n, s)
        a = add_batch_axis(a, xb, n, s) if ba is None else move_batch_axis(a, ba, xb, s)
        # The update must broadcast to the batched block, its batch at ``at``.
        target = _indexed_shape(entries, [a._shape, ()] + [x._shape for x in idx])
        r = len(target) - 1
        if bv is not None:
            v = move_batch_axis(batch_first(v, bv, r, s), 0, at, s)
        elif len(v._shape) > r - at:
            v = mx.reshape(v, (1,) * (r - len(v._shape)) + v._shape, stream=s)
            v = mx.expand_dims(v, at, stream=s)
        return [_apply(Scatter(s, entries, self.reduce), a, v, *idx)], [xb]


class GatherAxis(Primitive):
    """``take_along_axis``: the elements of ``a`` at the positions of ``indices`` (second
    input, same dimension as ``a``) along ``axis``; other axes broadcast."""

    __slots__ = ("axis",)
    arity = 2
    axis: Axis

    def __init__(self, stream, axis: int):
        super().__init__(stream)
        self.axis = axis

    def output_shapes(self, inputs):
        return [_along_shape(inputs[0].shape, inputs[1].shape, self.axis)]

    # The cotangent adds back at the gathered positions; axes where ``a`` was broadcast
    # against the indices are summed.
    def vjp(self, primals, cotangents, argnums, outputs):
        _no_index_gradient(self, argnums, 1, "VJP")
        a, idx = primals
        g = cotangents[0]
        ax = self.axis
        s = self.stream
        n = a._shape[ax]
        if idx._shape[ax] == 1:
            # One index per row (a cross entropy's target): no position repeats, so the
            # gradient is a select, g where the row's index is, 0 elsewhere (a scatter's
            # result, for a handful of element-wise ops instead of a scatter).
            nd = len(g._shape)
            pos = mx.reshape(mx.arange(n, dtype=dt.int32 if n < 2**31 else dt.int64, stream=s),
                             (1,) * ax + (n,) + (1,) * (nd - ax - 1), stream=s)
            if idx._dtype.kind == "i":
                wide = idx if idx._dtype.size >= 4 else mx.astype(idx, dt.int32, stream=s)
                idx = mx.where(mx.less(wide, 0, stream=s), mx.add(wide, n, stream=s), wide,
                               stream=s)
            ga = mx.where(mx.equal(pos, idx, stream=s), g, mx.zeros((), g._dtype, stream=s),
                          stream=s)
        else:
            spread = g._shape[:ax] + (n,) + g._shape[ax + 1:]
            key = _along_key(idx, ax, g._shape, s)
            ga = mx.zeros(spread, a._dtype, stream=s).at[key].add(g)
        return [None if i else sum_to_shape(ga, a._shape, s) for i in argnums]

    def jvp(self, primals, tangents, argnums):
        _no_index_gradient(self, argnums, 1, "JVP")
        return [_apply(self, tangents[0], primals[1])]

    def vmap(self, inputs, axes):
        s = self.stream
        (a, idx), (ba, bi) = inputs, axes
        # An unbatched operand gets a batch axis of size 1: it broadcasts.
        a = mx.expand_dims(a, 0, stream=s) if ba is None else batch_first(a, ba, stream=s)
        idx = mx.expand_dims(idx, 0, stream=s) if bi is None else batch_first(idx, bi, stream=s)
        return [_apply(GatherAxis(s, self.axis + 1), a, idx)], [0]


class ScatterAxis(SameShape):
    """``put_along_axis``: ``a`` with the values (third input) written at the positions
    of ``indices`` (second input) along ``axis``; indices and values broadcast together
    and with ``a``'s other axes. With repeated positions one write wins, and only it
    gets a cotangent."""

    __slots__ = ("axis",)
    arity = 3
    axis: Axis

    def __init__(self, stream, axis: int):
        super().__init__(stream)
        self.axis = axis

    def _full(self, a, idx, v) -> tuple:
        """The shape indices and values are broadcast to (as the kernel does)."""
        ax = self.axis
        vs = (1,) * (len(a._shape) - len(v._shape)) + v._shape
        return a._shape[:ax] + broadcast_shapes((idx._shape[ax],), (vs[ax],)) + \
            a._shape[ax + 1:]

    def vjp(self, primals, cotangents, argnums, outputs):
        _no_index_gradient(self, argnums, 1, "VJP", 1)
        a, idx, v = primals
        g = cotangents[0]
        s = self.stream
        res = []
        for i in argnums:
            if i == 0:  # overwritten positions get nothing
                res.append(_apply(self, g, idx, constant(0, g._dtype)))
            elif i == 2:
                full = self._full(a, idx, v)
                idx_f = mx.broadcast_to(idx, full, stream=s)
                gather = GatherAxis(s, self.axis)
                gv = _apply(gather, g, idx_f)
                if _repeats_along(idx, a._shape[self.axis], self.axis, full):
                    n = _prod(full)
                    itype = dt.int32 if n < 2 ** 31 else dt.int64
                    ids = mx.reshape(mx.arange(n, dtype=itype, stream=s), full, stream=s)
                    w = _apply(self, mx.full(a._shape, -1, itype, stream=s), idx_f, ids)
                    gv = mx.where(mx.equal(_apply(gather, w, idx_f), ids, stream=s), gv,
                                  constant(0, g._dtype), stream=s)
                res.append(sum_to_shape(gv, v._shape, s))
            else:
                res.append(None)
        return res

    def jvp(self, primals, tangents, argnums):
        _no_index_gradient(self, argnums, 1, "JVP", 1)
        a, idx, v = primals
        ts = _tangents(argnums, tangents)
        ta, tv = ts.get(0), ts.get(2)
        if ta is None and tv is None:
            return [None]
        return [_apply(self, mx.zeros_like(a) if ta is None else ta, idx,
                       constant(0, a._dtype) if tv is None else tv)]

    def vmap(self, inputs, axes):
        s = self.stream
        (a, idx, v), (ba, bi, bv) = inputs, axes
        n = _batch_size(inputs, axes)
        nd = len(a._shape) - (ba is not None)
        a = add_batch_axis(a, 0, n, s) if ba is None else batch_first(a, ba, stream=s)
        idx = mx.expand_dims(idx, 0, stream=s) if bi is None else batch_first(idx, bi, stream=s)
        if bv is not None:
            v = batch_first(v, bv, nd, s)
        return [_apply(ScatterAxis(s, self.axis + 1), a, idx, v)], [0]


def _along_shape(a_shape: tuple, i_shape: tuple, axis: int) -> tuple:
    out = []
    for d, (n, m) in enumerate(zip(a_shape, i_shape)):
        if d == axis:
            out.append(m)
        elif n == m or m == 1:
            out.append(n)
        elif n == 1:
            out.append(m)
        else:
            raise ShapeError(f"[take_along_axis] Indices of shape {i_shape} do not broadcast "
                             f"with an array of shape {a_shape} outside axis {axis}.")
    return tuple(out)


# -- helpers of the transform rules ---------------------------------------------------
def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _conj(x: array) -> array:
    return mx.conj(x) if x._dtype.kind == "c" else x


def _batch_size(inputs, axes) -> int:
    return next(x._shape[b] for x, b in zip(inputs, axes) if b is not None)


def _shift_entries(entries: tuple, by: int) -> tuple:
    """``entries`` with their index arrays ``by`` input positions further on."""
    return tuple(("array", e[1] + by) if e[0] == "array" else e for e in entries)


def _advanced_layout(entries: tuple) -> tuple:
    """``(dims before, adjacent)`` of the advanced indices (ints and arrays): how many
    result dimensions precede the first, and whether they stand next to each other
    (NumPy then puts their broadcast dimensions in place, else first)."""
    before = 0
    first = -1
    last = -2
    adjacent = True
    for pos, e in enumerate(entries):
        if e[0] == "slice" or e[0] == "new":
            if first < 0:
                before += 1
        else:
            if first < 0:
                first = pos
            elif last != pos - 1:
                adjacent = False
            last = pos
    return before, adjacent


def _batch_index(entries: tuple, x_batched: bool, idx, axes, first: int, n: int, stream):
    """Index ``entries`` and index arrays for a batched operand or batched indices:
    ``(entries, index arrays, operand batch axis, batch axis of the indexed block)``.

    With unbatched indices the batched operand's batch (moved first) gets a whole
    slice. Batched indices are lined up behind their batch axis; a batched operand
    then gets an index array of batch positions, placed (with the operand's batch
    axis) just before the first advanced index, so that the advanced indices stay
    adjacent or not as they were and the block keeps its place.
    """
    adv = [() for e in entries if e[0] == "int"]
    for x, b in zip(idx, axes):
        adv.append(x._shape if b is None else x._shape[:b] + x._shape[b + 1:])
    rank = len(broadcast_shapes(*adv)) if adv else 0
    if all(b is None for b in axes):
        entries = (("slice", 0, n, 1),) + entries
        return entries, list(idx), 0, 0 if _advanced_layout(entries)[1] else rank
    idx = [x if b is None else batch_first(x, b, rank, stream) for x, b in zip(idx, axes)]
    before, adjacent = _advanced_layout(entries)
    at = before if adjacent else 0
    if not x_batched:
        return entries, idx, None, at
    iota = mx.reshape(mx.arange(n, dtype=dt.int32, stream=stream), (n,) + (1,) * rank,
                      stream=stream)
    pos = next(k for k, e in enumerate(entries) if e[0] == "int" or e[0] == "array")
    axis = sum(1 for e in entries[:pos] if e[0] == "slice")
    shifted = _shift_entries(entries, 1)
    return shifted[:pos] + (("array", first),) + shifted[pos:], [iota] + idx, axis, at


def _may_repeat(entries: tuple, shape: tuple, idx, first: int) -> bool:
    """Whether the index arrays may name one position twice (True unless all are
    evaluated NumPy data whose positions are distinct)."""
    arrays, sizes = [], []
    ax = 0
    for e in entries:
        tag = e[0]
        if tag == "new":
            continue
        if tag == "array":
            d = idx[e[1] - first]._data
            if type(d) is not np.ndarray:
                return True
            n = shape[ax]
            arrays.append(np.where(d < 0, d + n, d) if d.dtype.kind == "i" else d)
            sizes.append(n)
        ax += 1
    if not arrays:
        return False
    try:
        flat = np.ravel_multi_index(tuple(np.broadcast_arrays(*arrays)), tuple(sizes))
    except ValueError:
        return True
    flat = flat.reshape(-1)
    return np.unique(flat).size != flat.size


def _repeats_along(idx: array, n: int, axis: int, full: tuple) -> bool:
    """Whether ``idx`` (broadcast to ``full``) may name one position of an axis of
    size ``n`` twice along ``axis`` (True unless it is evaluated NumPy data)."""
    d = idx._data
    if type(d) is not np.ndarray:
        return True
    if d.dtype.kind == "i":
        d = np.where(d < 0, d + n, d)
    d = np.sort(np.broadcast_to(d, full), axis=axis)
    return bool(np.any(np.diff(d, axis=axis) == 0))


def _along_key(idx: array, axis: int, shape: tuple, stream) -> tuple:
    """Index arrays that name, for each element of a ``take_along_axis`` result of
    ``shape``, the element it came from: ``idx`` on ``axis``, positions elsewhere."""
    nd = len(shape)
    key = []
    for d in range(nd):
        if d == axis:
            key.append(idx)
        else:
            key.append(mx.reshape(mx.arange(shape[d], dtype=dt.int32, stream=stream),
                                  (1,) * d + (shape[d],) + (1,) * (nd - d - 1), stream=stream))
    return tuple(key)


# -- parsing an index --------------------------------------------------------------
# The parsing helpers name the index and the shapes; the op the user called
# (``__getitem__``, ``take``, ``at.add``...) is added where they are called, by
# :func:`lazyx.errors.at_op` in an ``except`` clause that costs nothing until it raises.
def _out_of_bounds(k, axis: int, shape: tuple) -> IndexOutOfRangeError:
    return IndexOutOfRangeError(f"Index {k} is out of bounds for axis {axis} with size "
                                f"{shape[axis]} (array shape {shape}).")


def _bad_slice(k: slice, axis: int, shape: tuple) -> LazyxError:
    """``slice.indices``' ValueError (a zero step) or TypeError (a non-integer bound)."""
    if k.step is not None and not isinstance(k.step, (bool, np.bool_)):
        try:
            zero = _index(k.step) == 0
        except TypeError:
            zero = False
        if zero:
            return ArgumentError(f"Slice step cannot be zero: {k!r} on axis {axis} of an array "
                                 f"of shape {shape}.")
    return DtypeError(f"Slice bounds must be integers or None: got {k!r} on axis {axis} of "
                      f"an array of shape {shape}.")


def _empty_axis(size: int, axis: int, shape: tuple) -> IndexOutOfRangeError:
    return IndexOutOfRangeError(f"Cannot index axis {axis} of size 0 (array shape {shape}) "
                                f"with an index array of {size} elements: every index is "
                                f"out of bounds.")


def _bad_type(k) -> Exception:
    if isinstance(k, (bool, np.bool_)) or (isinstance(k, array) and k._dtype is dt.bool_):
        return ArgumentError("Boolean indices are not supported here (as in MLX): a mask "
                             "can only be the whole key of an assignment (a[mask] = v); use "
                             "integer indices, or mx.where for masking.")
    return DtypeError(f"Cannot index an array with a value of type {type(k).__name__}: use "
                      f"ints, slices, None, ..., or integer arrays.")


def _host_index(k, shape: tuple, axis: int) -> array:
    """A list or NumPy index as an evaluated integer array, checked against the axis."""
    n = shape[axis]
    try:
        x = np.asarray(k)
    except (ValueError, TypeError):
        raise DtypeError(f"Cannot index with the ragged or mixed sequence {k!r}.") from None
    kind = x.dtype.kind
    if kind == "b":
        raise _bad_type(True)
    if kind not in "iu":
        if x.size == 0:
            x = x.astype(np.int32)
        else:
            raise DtypeError(f"Indices must be integers, got dtype {x.dtype} from "
                             f"{type(k).__name__}.")
    if x.size and (x.min() < -n or x.max() >= n):
        bad = x[(x < -n) | (x >= n)].reshape(-1)[0]
        raise _out_of_bounds(bad, axis, shape)
    return from_buffer(np.array(x, copy=True))


def _parse(shape: tuple, key, first: int):
    """``(entries, index_arrays)`` for ``key`` on an array of ``shape``.

    ``index_arrays`` is empty for a basic index; otherwise entry ``("array", k)`` names
    ``index_arrays[k - first]``: the node's inputs are the array (and, for a scatter,
    the update) followed by the index arrays from input ``first`` on.
    """
    if type(key) is not tuple:
        key = (key,)
    nd = len(shape)
    consumed = 0
    ellipsis = -1
    for i, k in enumerate(key):
        if k is None:
            continue
        if k is Ellipsis:
            if ellipsis >= 0:
                raise AxisError("An index can only have a single ellipsis (...).")
            ellipsis = i
            continue
        consumed += 1
    if consumed > nd:
        raise AxisError(f"Too many indices ({consumed}) for an array of dimension {nd}.")
    entries = []
    arrays = []
    ax = 0
    for i, k in enumerate(key):
        tk = type(k)
        if tk is slice:
            n = shape[ax]
            try:
                b, e, s = k.indices(n)
            except (ValueError, TypeError):
                raise _bad_slice(k, ax, shape) from None
            if not len(range(b, e, s)):
                b, e, s = 0, 0, 1  # an empty slice; a negative start would mean the end
            entries.append(("slice", b, e, s))
            ax += 1
        elif tk is _int or isinstance(k, np.integer):
            n = shape[ax]
            k = _int(k)
            j = k + n if k < 0 else k
            if j < 0 or j >= n:
                raise _out_of_bounds(k, ax, shape)
            entries.append(("int", j))
            ax += 1
        elif k is None:
            entries.append(("new",))
        elif k is Ellipsis:
            for _ in range(nd - consumed):
                entries.append(("slice", 0, shape[ax], 1))
                ax += 1
        elif isinstance(k, array):
            if k._dtype.kind not in "iu":
                if k._dtype is dt.bool_:
                    raise _bad_type(k)
                raise DtypeError(f"Indices must be integers, got an array of dtype "
                                 f"{k._dtype.name}.")
            if shape[ax] == 0 and 0 not in k._shape:
                raise _empty_axis(k.size, ax, shape)
            arrays.append(k)
            entries.append(("array", len(arrays) + first - 1))
            ax += 1
        elif isinstance(k, (list, tuple, np.ndarray)) and not isinstance(k, np.bool_):
            arrays.append(_host_index(k, shape, ax))
            entries.append(("array", len(arrays) + first - 1))
            ax += 1
        else:
            raise _bad_type(k)
    while ax < nd:
        entries.append(("slice", 0, shape[ax], 1))
        ax += 1
    return tuple(entries), arrays


def _basic_parts(shape: tuple, entries: tuple):
    """``(starts, ends, strides, sliced_shape, result_shape, is_full)`` of a basic index."""
    starts, ends, strides, sliced, result = [], [], [], [], []
    full = True
    ax = 0
    for e in entries:
        tag = e[0]
        if tag == "slice":
            b, en, s = e[1], e[2], e[3]
            m = len(range(b, en, s))
            if s != 1 or b != 0 or m != shape[ax]:
                full = False
            starts.append(b)
            ends.append(en)
            strides.append(s)
            sliced.append(m)
            result.append(m)
            ax += 1
        elif tag == "int":
            full = False
            starts.append(e[1])
            ends.append(e[1] + 1)
            strides.append(1)
            sliced.append(1)
            ax += 1
        else:
            result.append(1)
    return tuple(starts), tuple(ends), tuple(strides), tuple(sliced), tuple(result), full


# -- __getitem__ -----------------------------------------------------------------
def _basic(shape: tuple, key):
    """``(starts, ends, strides, sliced_shape, result_shape, is_full)`` for a key of
    Python ints, slices, ``None`` and one ``...``, in one pass; None for any other key
    (the general parser then handles it, or raises)."""
    if type(key) is not tuple:
        key = (key,)
    nd = len(shape)
    starts = []
    ends = []
    strides = []
    sliced = []
    result = []
    full = True
    ax = 0
    whole = ()
    for i, k in enumerate(key):
        tk = type(k)
        if tk is slice:
            if ax >= nd:
                return None
            n = shape[ax]
            try:
                b, e, st = k.indices(n)
            except (ValueError, TypeError):
                raise _bad_slice(k, ax, shape) from None
            m = len(range(b, e, st))
            if m == 0:
                b = e = 0
                st = 1
                full = False
            elif st != 1 or m != n:
                full = False
            starts.append(b)
            ends.append(e)
            strides.append(st)
            sliced.append(m)
            result.append(m)
            ax += 1
        elif tk is _int:
            if ax >= nd:
                return None
            n = shape[ax]
            j = k + n if k < 0 else k
            if j < 0 or j >= n:
                raise _out_of_bounds(k, ax, shape)
            starts.append(j)
            ends.append(j + 1)
            strides.append(1)
            sliced.append(1)
            full = False
            ax += 1
        elif k is None:
            result.append(1)
        elif k is Ellipsis:
            rest = 0
            for x in key[i + 1:]:
                if x is Ellipsis:
                    return None
                if x is not None:
                    rest += 1
            whole = shape[ax:nd - rest]
        else:
            return None
        if whole:
            # Whole axes, for an ellipsis and (below) the axes the key leaves out.
            starts += (0,) * len(whole)
            ends += whole
            strides += (1,) * len(whole)
            sliced += whole
            result += whole
            ax += len(whole)
            whole = ()
    whole = shape[ax:]
    return (tuple(starts) + (0,) * len(whole), tuple(ends) + whole,
            tuple(strides) + (1,) * len(whole), tuple(sliced) + whole, tuple(result) + whole,
            full)


def _basic_parts(shape: tuple, entries: tuple):
    """:func:`_basic`'s tuple for parsed basic ``entries``."""
    starts, ends, strides, sliced, result = [], [], [], [], []
    full = True
    for ax, e in enumerate(x for x in entries if x[0] != "new"):
        if e[0] == "slice":
            b, en, st = e[1], e[2], e[3]
            m = len(range(b, en, st))
            if st != 1 or m != shape[ax]:
                full = False
        else:
            b, en, st, m = e[1], e[1] + 1, 1, 1
            full = False
        starts.append(b)
        ends.append(en)
        strides.append(st)
        sliced.append(m)
    for e in entries:
        if e[0] == "slice":
            result.append(len(range(e[1], e[2], e[3])))
        elif e[0] == "new":
            result.append(1)
    return tuple(starts), tuple(ends), tuple(strides), tuple(sliced), tuple(result), full


_TAKE_ENTRIES: dict = {}


def _getitem(self, key, _op: str = "__getitem__") -> array:
    """``self[key]``: basic indexing gives a view, integer arrays a gather (NumPy's rules).
    Errors name ``_op`` (``take`` passes its own name)."""
    shape = self._shape
    if type(key) is _int and shape:
        # A row, the commonest index (iteration): a one-row Slice, reshaped.
        n = shape[0]
        j = key + n if key < 0 else key
        if j < 0 or j >= n:
            raise at_op(_out_of_bounds(key, 0, shape), _op)
        rest = shape[1:]
        zeros = (0,) * len(rest)
        x = lazy((1,) + rest, self._dtype,
                 Slice(to_stream(None), (j,) + zeros, (j + 1,) + rest, (1,) * (len(rest) + 1)),
                 (self,))
        return mx.reshape(x, rest)
    if type(key) is array and key._dtype.kind in "iu" and shape:
        # One index array on the first axis (an embedding lookup): a take.
        if not shape[0] and 0 not in key._shape:
            raise at_op(_empty_axis(key.size, 0, shape), _op)
        entries = _TAKE_ENTRIES.get(shape)
        if entries is None:
            entries = _TAKE_ENTRIES[shape] = (("array", 1),) + tuple(
                ("slice", 0, n, 1) for n in shape[1:])
            if len(_TAKE_ENTRIES) > 1024:
                _TAKE_ENTRIES.clear()
        return lazy(key._shape + shape[1:], self._dtype, Gather(to_stream(None), entries),
                    (self, key))
    try:
        parts = _basic(shape, key)
        if parts is None:
            entries, arrays = _parse(shape, key, 1)
            if arrays:
                ins = (self,) + tuple(arrays)
                out_shape = _indexed_shape(entries, [x._shape for x in ins])
                return lazy(out_shape, self._dtype, Gather(to_stream(None), entries), ins)
            parts = _basic_parts(shape, entries)
    except LazyxError as e:
        raise at_op(e, _op)
    starts, ends, strides, sliced, result, full = parts
    x = self
    if not full:
        x = lazy(sliced, self._dtype, Slice(to_stream(None), starts, ends, strides), (self,))
    if result != sliced or x is self:
        # Ints drop axes and None adds them; a whole-array index still gives a new object.
        x = mx.reshape(x, result)
    return x


# -- updates -------------------------------------------------------------------------
def _update_value(a: array, value, target: tuple, stream, transform=None) -> array:
    """``value`` as an array of ``a``'s dtype that broadcasts to ``target`` (leading
    size-1 dimensions beyond ``target``'s are dropped, as NumPy assignment does)."""
    if transform is None and isinstance(value, _PY_SCALARS):
        return constant(value, a._dtype)
    v = value if type(value) is array else as_array(value)
    if transform is not None:
        v = transform(v)
    v = cast(v, a._dtype, stream)
    vs = v._shape
    nt = len(target)
    off = nt - len(vs)
    if off < 0 and any(d != 1 for d in vs[:-off]):
        raise _unbroadcastable(vs, target)
    for i, d in enumerate(vs[max(0, -off):]):
        if d != 1 and d != target[max(0, off) + i]:
            raise _unbroadcastable(vs, target)
    if off < 0:
        v = mx.reshape(v, vs[-off:], stream=stream)
    return v


def _unbroadcastable(shape: tuple, target: tuple) -> ShapeError:
    return ShapeError(f"Cannot broadcast an update of shape {shape} to the indexed shape "
                      f"{target}.")


def _scatter(a: array, key, value, reduce, transform=None) -> array:
    """A new array: ``a`` with ``value`` written (or combined by ``reduce``) at ``a[key]``."""
    a = a if type(a) is array else as_array(a)
    stream = to_stream(None)
    parts = _basic(a._shape, key) if reduce is None else None
    if parts is not None:
        v = _update_value(a, value, parts[4], stream, transform)
        # The update lines up with the slice unless ints or None changed the axes.
        if not v._shape or parts[4] == parts[3]:
            return lazy(a._shape, a._dtype, SliceUpdate(stream, *parts[:3]), (a, v))
        entries, arrays = _parse(a._shape, key, 2)
    else:
        entries, arrays = _parse(a._shape, key, 2)
        if arrays:
            target = _indexed_shape(entries, [a._shape, ()] + [x._shape for x in arrays])
        else:
            parts = _basic_parts(a._shape, entries)
            target = parts[4]
        v = _update_value(a, value, target, stream, transform)
        if arrays or reduce is not None:
            return lazy(a._shape, a._dtype, Scatter(stream, entries, reduce),
                        (a, v) + tuple(arrays))
    # A basic assignment whose ints or None change the axes: the update is reshaped to
    # the slice's dimensions (1 where an int stood, nothing where a None did).
    target = parts[4]
    vs = (1,) * (len(target) - len(v._shape)) + v._shape
    upd_shape = []
    t = 0
    for e in entries:
        tag = e[0]
        if tag == "slice":
            upd_shape.append(vs[t])
            t += 1
        elif tag == "new":
            t += 1
        else:
            upd_shape.append(1)
    upd_shape = tuple(upd_shape)
    if upd_shape != v._shape:
        v = mx.reshape(v, upd_shape, stream=stream)
    return lazy(a._shape, a._dtype, SliceUpdate(stream, *parts[:3]), (a, v))


def _setitem(self, key, value) -> None:
    """``self[key] = value``: ``self`` now refers to a new array with the update
    (other references to the previous value are unchanged). With repeated positions,
    one of the writes wins. A boolean mask as the whole key writes the masked positions
    from ``value`` in order (MLX's masked scatter, see :func:`_masked_update`)."""
    refs = _getrefcount(self)
    mask = _as_mask(key)
    try:
        if mask is not None:
            update_in_place(self, lambda old: _masked_update(old, mask, value), refs,
                            SETITEM_REFS)
        else:
            update_in_place(self, lambda old: _scatter(old, key, value, None), refs,
                            SETITEM_REFS)
    except LazyxError as e:
        raise at_op(e, "__setitem__")


def _as_mask(key) -> array | None:
    """``key`` as a boolean mask array when it is one (a bool array, a list or NumPy array
    of bools, a Python bool), else None."""
    if type(key) is array:
        return key if key._dtype is dt.bool_ else None
    if isinstance(key, (bool, np.bool_)):
        return constant(bool(key), dt.bool_)
    if isinstance(key, (list, np.ndarray)):
        try:
            x = np.asarray(key)
        except (ValueError, TypeError):
            return None
        if x.dtype == np.bool_:
            return from_buffer(np.array(x, copy=True))
    return None


def _masked_update(a: array, mask: array, value) -> array:
    """``a`` with its positions where ``mask`` is True filled, in order, from the rows of
    ``value`` (MLX's masked scatter).

    ``mask`` covers the leading axes of ``a`` (its shape is ``a.shape[:k]``); each True
    selects a block of shape ``trail = a.shape[k:]``. A ``value`` of up to ``len(trail)``
    dimensions broadcasts to every selected block; one of ``len(trail) + 1`` dimensions is
    a sequence of blocks, consumed in row-major order of the mask (extra rows unused, too
    few an error at evaluation). Built from ``cumsum``, ``take`` and ``where``, so
    gradients, ``vmap`` and ``compile`` follow from theirs.
    """
    k = mask.ndim
    shape = a._shape
    if mask._shape != shape[:k]:
        raise ShapeError(f"The boolean mask should have the same shape as the leading axes "
                         f"of the indexed array, but the mask has shape {mask._shape} and "
                         f"the array shape {shape}.")
    trail = shape[k:]
    stream = to_stream(None)
    v = cast(value if type(value) is array else as_array(value), a._dtype, stream)
    if v.ndim > len(trail) + 1:
        raise ShapeError(f"The value's shape {v._shape} must broadcast with the last "
                         f"{len(trail)} dimensions of the array (shape {shape}), after one "
                         f"leading axis of rows for the masked positions.")
    if v.ndim <= len(trail):
        # One block, the same for every masked position.
        v = mx.reshape(v, (1,) + v._shape, stream=stream)
        rows = mask.size
    else:
        rows = v._shape[0]
    try:
        v = mx.broadcast_to(v, (rows,) + trail, stream=stream)
    except ShapeError:
        raise ShapeError(f"Cannot broadcast a value of shape {v._shape[1:]} to the masked "
                         f"blocks of shape {trail}.") from None
    # Row 0 is a filler the unmasked positions read; the j-th True reads row j, so a
    # mask with more Trues than value rows reads past the end (an error at evaluation).
    src = mx.concatenate([mx.zeros((1,) + trail, a._dtype, stream=stream), v], stream=stream)
    flat = mx.reshape(mask, (-1,), stream=stream)
    pos = mx.cumsum(cast(flat, dt.int32, stream), stream=stream)
    idx = mx.reshape(mx.where(flat, pos, constant(0, dt.int32), stream=stream), mask._shape,
                     stream=stream)
    picked = mx.take(src, idx, axis=0, stream=stream)
    wide = mx.reshape(mask, mask._shape + (1,) * len(trail), stream=stream)
    return mx.where(wide, picked, a, stream=stream)


class ArrayAt:
    """``a.at[index]``: updates at an index that combine repeated positions.

    Plain assignment ``a[idx] += v`` reads and writes once per position, so repeated
    positions keep one update; ``a = a.at[idx].add(v)`` accumulates them all.

    Example:
        >>> a = array([0.0, 0.0])
        >>> a.at[array([0, 0, 1])].add(1.0)
        array([2, 1], dtype=float32)
    """

    __slots__ = ("_array", "_key")

    def __init__(self, a: array, key=None):
        self._array = a
        self._key = key

    def __getitem__(self, key) -> "ArrayAt":
        return ArrayAt(self._array, key)

    def _apply(self, value, reduce, transform=None):
        if self._key is None:
            raise ArgumentError("[at] Index the updater first: a.at[index].add(value).")
        try:
            return _scatter(self._array, self._key, value, reduce, transform)
        except LazyxError as e:
            raise at_op(e, "at")

    def add(self, value) -> array:
        """``a`` with ``value`` added at the index (repeated positions accumulate)."""
        return self._apply(value, "add")

    def subtract(self, value) -> array:
        """``a`` with ``value`` subtracted at the index (repeated positions accumulate)."""
        return self._apply(value, "add", lambda v: mx.negative(cast(v, self._array._dtype)))

    def multiply(self, value) -> array:
        """``a`` multiplied by ``value`` at the index (repeated positions accumulate)."""
        return self._apply(value, "prod")

    def divide(self, value) -> array:
        """``a`` multiplied by ``1 / value`` at the index (in ``a``'s dtype, as in MLX)."""
        return self._apply(value, "prod", mx.reciprocal)

    def maximum(self, value) -> array:
        """``a`` replaced by the maximum of it and ``value`` at the index."""
        return self._apply(value, "max")

    def minimum(self, value) -> array:
        """``a`` replaced by the minimum of it and ``value`` at the index."""
        return self._apply(value, "min")

    def __repr__(self) -> str:
        return f"<ArrayAt of an array of shape {self._array._shape}>"


def _at(self) -> ArrayAt:
    """Used to apply updates at indices: ``a.at[idx].add(v)``, ``subtract``,
    ``multiply``, ``divide``, ``maximum``, ``minimum``. Unlike ``a[idx] += v``, every
    update to a repeated position is applied."""
    return ArrayAt(self)


# -- take / take_along_axis / put_along_axis ---------------------------------------------
def _int_index(x):
    if isinstance(x, (bool, np.bool_)):
        return None
    if type(x) is _int or isinstance(x, np.integer):
        return _int(x)
    return None


def take(a, /, indices, axis=None, *, stream=None) -> array:
    """Take elements along an axis.

    Args:
        a (array): Input array.
        indices (int or array): Integer positions (negative ones count from the end).
        axis (int, optional): The axis; default the flattened array.

    Returns:
        array: ``a`` with the axis replaced by the shape of ``indices``.
    """
    a = a if type(a) is array else as_array(a)
    if axis is None:
        a = mx.reshape(a, (-1,), stream=stream)
        ax = 0
    else:
        ax = normalize_axis(axis, len(a._shape), "[take] axis")
    key = (_FULL,) * ax
    i = _int_index(indices)
    if i is not None:
        key += (i,)
    elif isinstance(indices, array):
        key += (indices,)
    elif isinstance(indices, (list, tuple, np.ndarray)):
        key += (indices,)
    else:
        raise at_op(_bad_type(indices), "take")
    if stream is None:
        return _getitem(a, key, "take")
    with mx.stream(stream):
        return _getitem(a, key, "take")


def _along_indices(indices, op: str) -> array:
    x = indices if isinstance(indices, array) else as_array(indices)
    if x._dtype.kind not in "iu":
        raise at_op(_bad_type(x) if x._dtype is dt.bool_ else DtypeError(
            f"Indices must be integers, got dtype {x._dtype.name} (shape {x._shape})."), op)
    return x


def take_along_axis(a, /, indices, axis=-1, *, stream=None) -> array:
    """Take values along an axis at the specified indices.

    Args:
        a (array): Input array.
        indices (array): Integer positions, of the same dimension as ``a``; the other
            axes broadcast with ``a``'s.
        axis (int, optional): The axis; ``None`` takes from the flattened array (then
            ``indices`` is 1-D). Default: ``-1``.

    Returns:
        array: The values.
    """
    a = a if type(a) is array else as_array(a)
    idx = _along_indices(indices, "take_along_axis")
    if axis is None:
        a = mx.reshape(a, (-1,), stream=stream)
        ax = 0
    else:
        ax = normalize_axis(axis, len(a._shape), "[take_along_axis] axis")
    if len(idx._shape) != len(a._shape):
        raise ShapeError(f"[take_along_axis] Indices of shape {idx._shape} must have the "
                         f"dimension of the array of shape {a._shape}.")
    shape = _along_shape(a._shape, idx._shape, ax)
    return lazy(shape, a._dtype, GatherAxis(to_stream(stream), ax), (a, idx))


def put_along_axis(a, /, indices, values, axis=None, *, stream=None) -> array:
    """Put values along an axis at the specified indices.

    Args:
        a (array): Destination array.
        indices (array): Integer positions, of the same dimension as ``a``.
        values (array): The values (cast to ``a``'s dtype); they broadcast with
            ``indices``, and both with ``a`` outside ``axis``.
        axis (int, optional): The axis; ``None`` puts into the flattened array.

    Returns:
        array: A new array with ``a``'s shape and the values written.
    """
    a = a if type(a) is array else as_array(a)
    idx = _along_indices(indices, "put_along_axis")
    v = cast(values if isinstance(values, array) else as_array(values), a._dtype, stream)
    if axis is None:
        out = put_along_axis(mx.reshape(a, (-1,), stream=stream), idx, v, 0, stream=stream)
        return mx.reshape(out, a._shape, stream=stream)
    ax = normalize_axis(axis, len(a._shape), "[put_along_axis] axis")
    if len(idx._shape) != len(a._shape):
        raise ShapeError(f"[put_along_axis] Indices of shape {idx._shape} must have the "
                         f"dimension of the array of shape {a._shape}.")
    b = mx.broadcast_shapes(idx._shape, v._shape)
    if len(b) != len(a._shape) or any(
            d != ax and b[d] not in (1, a._shape[d]) for d in range(len(b))):
        raise ShapeError(f"[put_along_axis] Indices of shape {idx._shape} and values of shape "
                         f"{v._shape} do not fit an array of shape {a._shape} along axis {ax}.")
    return lazy(a._shape, a._dtype, ScatterAxis(to_stream(stream), ax), (a, idx, v))


PRIMITIVES = [Slice, SliceUpdate, Gather, Scatter, GatherAxis, ScatterAxis]

OPS = {
    "take": take, "take_along_axis": take_along_axis, "put_along_axis": put_along_axis,
    "array.__getitem__": _getitem, "array.__setitem__": _setitem,
    "array.at": property(_at), "ArrayAt": ArrayAt,
}


lazyx_primitives, lazyx_ops = pack_hooks(PRIMITIVES, OPS)


# -- examples for the registry-wide transform test -------------------------------------
def _assigned(a, key, v):
    b = mx.multiply(a, 1.0)  # a new array: the caller's argument keeps its value
    b[key] = v
    return b


@hookimpl
def lazyx_examples():

    x = uniform((4, 3))
    rows = np.array([0, 2, 0], np.int32)  # a repeated position
    return [
        (Slice, example(lambda a: a[1:, ::-2], x)),
        (SliceUpdate, example(lambda a, v: _assigned(a, (slice(1, 3), 1), v), x, uniform((2,)))),
        (Gather, example(lambda a, i: a[i], x, rows)),
        (Gather, example(lambda a, i, j: a[i, :, j], uniform((4, 2, 3)),
                         integers((2,), 0, 4), integers((3, 1), 0, 3))),
        (Scatter, example(lambda a, i, v: _assigned(a, (i, slice(1, None)), v), x, rows,
                          uniform((3, 2)))),
        (Scatter, example(lambda a, i, v: a.at[i].add(v), x, rows, uniform((3, 3)))),
        (Scatter, example(lambda a, i, v: a.at[:, i].multiply(v), x, rows, uniform((3,)))),
        (Scatter, example(lambda a, i, v: a.at[i].maximum(v), x, rows, uniform((3, 1)))),
        (Scatter, example(lambda a, i, v: a.at[i, 1].minimum(v), x, rows, uniform((3,)))),
        (GatherAxis, example(lambda a, i: take_along_axis(a, i, 1), x,
                             integers((4, 2), 0, 3))),
        (ScatterAxis, example(lambda a, i, v: put_along_axis(a, i, v, 0), x,
                              np.array([[0, 3, 1], [0, 1, 2]], np.int32), uniform((2, 3)))),
    ]
