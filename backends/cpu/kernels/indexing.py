"""NumPy kernels of the indexing op pack.

Slices are views; gathers and scatters use NumPy's own indexing (``x[key]``,
``x[key] = v``, ``np.add.at``), which also bounds-checks index arrays: its IndexError
becomes an :class:`IndexOutOfRangeError` naming the primitive. Scatters copy their input
first: buffers are immutable.
"""

import numpy as np

from lazyx.errors import IndexOutOfRangeError
from lazyx.plugins import indexing as ix

_REDUCE = {"add": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def _out_of_range(p, ins, e):
    # Raised at evaluation, where only the primitive is known: name it, the shapes, and
    # the ops that build it. NumPy's own words follow.
    shapes = ", ".join(str(getattr(x, "shape", ())) for x in ins[1:])
    return IndexOutOfRangeError(
        f"[{p.name}] An index array holds a position outside the array of shape "
        f"{ins[0].shape} (index and update shapes {shapes}); NumPy says: {e}. Indices "
        f"given as lazyx arrays to take, take_along_axis, put_along_axis, a[...] or "
        f"a.at[...] are checked when evaluated.")


def _key(p, ins):
    key = list(p._template)
    for pos, k in p._places:
        key[pos] = ins[k]
    return tuple(key)


def _gather(p, ins):
    x = ins[0]
    try:
        ax = p._take_axis
        if ax >= 0 and p._take_rest == x.shape[:ax] + x.shape[ax + 1:]:
            return np.take(x, ins[1], axis=ax)
        return x[_key(p, ins)]
    except IndexError as e:
        raise _out_of_range(p, ins, e) from None


def _slice_update(p, ins):
    out = ins[0].copy()
    out[p._key] = ins[1]
    return out


def _scatter(p, ins):
    out = ins[0].copy()
    key = _key(p, ins)
    try:
        if p.reduce is None:
            out[key] = ins[1]
        else:
            _REDUCE[p.reduce].at(out, key, ins[1])
    except IndexError as e:
        raise _out_of_range(p, ins, e) from None
    return out


def _gather_axis(p, ins):
    x, idx = ins
    try:
        if x.ndim == 2 and p.axis == 1 and idx.ndim == 2 and idx.shape[0] == x.shape[0]:
            # Indices per row (a cross entropy's targets): one fancy index, where
            # np.take_along_axis's Python builds it (38 against 16 µs for 256 rows with
            # the interpreter's state cold, as in a training step). Same values and errors.
            return x[_rows(x.shape[0]), idx]
        return np.take_along_axis(x, idx, axis=p.axis)
    except IndexError as e:
        raise _out_of_range(p, ins, e) from None


_row_columns: dict = {}


def _rows(n: int):
    """``arange(n)[:, None]`` (intp), kept per ``n``: the row index of a per-row gather."""
    r = _row_columns.get(n)
    if r is None:
        if len(_row_columns) > 64:
            _row_columns.clear()
        r = _row_columns[n] = np.arange(n, dtype=np.intp)[:, None]
        r.flags.writeable = False
    return r


def _scatter_axis(p, ins):
    x, idx, v = ins
    nd = x.ndim
    vs = (1,) * (nd - v.ndim) + v.shape
    ax = p.axis
    # Indices and values broadcast together along the axis; elsewhere to ``x``'s sizes.
    full = x.shape[:ax] + np.broadcast_shapes((idx.shape[ax],), (vs[ax],)) + x.shape[ax + 1:]
    out = x.copy()
    try:
        np.put_along_axis(out, np.broadcast_to(idx, full), np.broadcast_to(v, full), axis=ax)
    except IndexError as e:
        raise _out_of_range(p, ins, e) from None
    return out


KERNELS = {
    ix.Slice: lambda p, ins: ins[0][p._key],
    ix.SliceUpdate: _slice_update,
    ix.Gather: _gather,
    ix.Scatter: _scatter,
    ix.GatherAxis: _gather_axis,
    ix.ScatterAxis: _scatter_axis,
}
