"""The indexing pack against NumPy: a table of index expressions (ints, slices with
negative steps, None, Ellipsis, integer arrays as lazyx arrays, lists and NumPy arrays,
and their combinations) for reading, assigning and ``.at`` updates; ``take``,
``take_along_axis``, ``put_along_axis``; functional ``__setitem__`` (other references
keep their values); out-of-range and malformed indices."""

import numpy as np
import pytest

import lazyx.core as mx
from helpers import assert_close, random_array, rng, to_lazyx
from lazyx.errors import ArgumentError, AxisError, DtypeError, IndexOutOfRangeError, ShapeError

ids = lambda d: d.name  # noqa: E731

DTYPES = [mx.bool_, mx.uint8, mx.int32, mx.int64, mx.float16, mx.bfloat16, mx.float32,
          mx.complex64]

I = np.array  # an integer index array in the table below

# Index expressions on an array of shape (4, 5, 6), as NumPy writes them. Integer arrays
# are passed to lazyx as lazyx arrays, NumPy arrays and lists in turn.
KEYS = [
    0, -1, 3, (1, 2), (-4, -5, -6), (slice(None),), (slice(1, 3),), (slice(None, None, -1),),
    (slice(None, None, -2), slice(4, 0, -2)), (slice(-2, None), slice(None, 2), slice(1, None, 3)),
    (slice(5, -10, -1),), (slice(3, 1),), (slice(-1, -1, -1), 0), (Ellipsis,), (Ellipsis, 1),
    (0, Ellipsis), (1, Ellipsis, slice(None, None, -1)), (None,), (None, 0, None),
    (Ellipsis, None), (slice(None), None, 2), (), (2, 3, 4),
    (I([0, 3, 1]),), (I([[0, 1], [3, 3]]),), (I([-1, -4]),), (I(2),),
    (slice(None), I([0, 4])), (Ellipsis, I([5, 0, 5])), (I([0, 1]), I([2, 3])),
    (I([0, 1]), slice(None), I([2, 3])), (slice(None), I([[0], [1]]), I([1, 2, 3])),
    (I([1]), 2, slice(None)), (1, slice(None), I([0, 2])), (slice(1, None), I([0, 4]), 3),
    (I([0, 2]), None, I([1, 1])), (None, I([0, 2]), slice(None, None, -1)),
    (slice(None, None, -1), I([[0, 1]]), None), (I([3, 0]), Ellipsis, I([1, 2])),
    (I([1, 2]), I([[0], [1]]), I([0, 5])), (I([], dtype=np.int64),),
    (slice(0, 0), I([1, 2])), (I(0), I([1, 2]), I(-1)),
]


def _lx_key(key, kind):
    """The key with its NumPy index arrays as lazyx arrays, NumPy arrays or lists."""
    key = key if isinstance(key, tuple) else (key,)
    out = []
    for k in key:
        if isinstance(k, np.ndarray):
            if kind == "lazyx":
                k = mx.array(k.astype(np.int32))
            elif kind == "list":
                k = k.tolist() if k.ndim else int(k)
        out.append(k)
    return tuple(out)


@pytest.mark.parametrize("kind", ["lazyx", "numpy", "list"])
@pytest.mark.parametrize("key", KEYS, ids=[str(i) for i in range(len(KEYS))])
def test_getitem_matches_numpy(key, kind):
    x = random_array((4, 5, 6), mx.float32, rng(1))
    got = to_lazyx(x)[_lx_key(key, kind)]
    assert_close(got, x[key], mx.float32, msg=repr(key))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_getitem_dtypes(dtype):
    x = random_array((3, 4), dtype, rng(2))
    lx = to_lazyx(x)
    for key in [1, (slice(None), -1), (slice(None, None, -1), None), (I([2, 0, 2]), I([1, 3, 3])),
                (Ellipsis, I([[0, 3]]))]:
        assert_close(lx[_lx_key(key, "lazyx")], x[key], dtype, msg=repr(key))


def test_getitem_on_noncontiguous_and_empty_arrays():
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    t = mx.transpose(to_lazyx(np.ascontiguousarray(x.transpose(2, 0, 1))), (1, 2, 0))
    for key in [(1,), (slice(None, None, -1), 2), (I([2, 0]), slice(1, 3), I([4, 0])), (Ellipsis, 3)]:
        assert_close(t[_lx_key(key, "lazyx")], x[key], mx.float32, msg=repr(key))
    e = to_lazyx(np.zeros((0, 3), np.int32))
    assert_close(e[:, 1], np.zeros((0,)), mx.int32)
    assert_close(e[mx.array(np.zeros((0,), np.int32))], np.zeros((0, 3)), mx.int32)
    assert_close(e[:, mx.array([0, 2])], np.zeros((0, 2)), mx.int32)
    s = to_lazyx(np.array(2.5, np.float32))
    for key, shape in [((), ()), (None, (1,)), (Ellipsis, ()), ((None, None), (1, 1))]:
        assert_close(s[key], np.full(shape, 2.5), mx.float32)


def test_index_dtypes_and_iteration():
    x = np.arange(12, dtype=np.int32).reshape(4, 3)
    lx = to_lazyx(x)
    for d in [np.uint8, np.int16, np.uint32, np.int64, np.uint64]:
        assert_close(lx[mx.array(np.array([3, 0], dtype=d))], x[[3, 0]], mx.int32)
    assert_close(lx[np.int64(2), np.uint8(1)], x[2, 1], mx.int32)
    assert [r.tolist() for r in lx] == x.tolist()
    assert_close(lx[mx.array(-1)], x[-1], mx.int32)  # a 0-d index array drops the axis


def test_basic_indexing_is_a_view_and_advanced_a_gather(on_cpu):
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    lx = to_lazyx(x)
    v = lx[1:3, ::-2]
    assert type(v._prim).__name__ == "Slice"
    assert np.shares_memory(np.asarray(v), np.asarray(lx))
    r = lx[2]
    assert np.shares_memory(np.asarray(r), np.asarray(lx))
    g = lx[mx.array([0, 2])]
    assert type(g._prim).__name__ == "Gather"
    assert not np.shares_memory(np.asarray(g), np.asarray(lx))


# -- __setitem__ ---------------------------------------------------------------------
SET_KEYS = [
    0, -1, (1, 2), (slice(None), 3), (slice(None, None, -1),), (slice(3, 0, -2), slice(1, None, 2)),
    (Ellipsis, 0), (None, 1), (slice(None), None, slice(2, 4)), (slice(2, 2),),
    (I([0, 2]),), (I([3, 1]), I([4, 0])), (slice(None), I([0, 4, 2])), (I([1]), 2, slice(None)),
    (I([[0], [3]]), Ellipsis, I([1, 2])), (I([0, 2]), None, I([1, 1])), (0, slice(None), I([5, 0])),
]


@pytest.mark.parametrize("vshape", ["scalar", "full", "broadcast", "extra_ones"])
@pytest.mark.parametrize("key", SET_KEYS, ids=[str(i) for i in range(len(SET_KEYS))])
def test_setitem_matches_numpy(key, vshape):
    g = rng(3)
    x = random_array((4, 5, 6), mx.float32, g)
    target = x[key].shape
    if vshape == "scalar":
        value = 1.5
        lv = 1.5
    else:
        shape = {"full": target, "broadcast": (1,) + target[1:] if target else (),
                 "extra_ones": (1, 1) + target}[vshape]
        value = random_array(shape, mx.float32, g)
        lv = to_lazyx(value)
    ref = x.copy()
    ref[key] = value
    a = to_lazyx(x)
    before = a
    a[_lx_key(key, "lazyx")] = lv
    assert a is before            # the same Python object, rebound to the new value
    assert_close(a, ref, mx.float32, msg=repr(key))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_setitem_casts_the_value_to_the_array_dtype(dtype):
    x = random_array((3, 4), dtype, rng(4))
    v = random_array((4,), mx.float32, rng(5), low=0, high=3)
    ref = x.copy()
    ref[1] = v.astype(dtype.np)
    a = to_lazyx(x)
    a[1] = to_lazyx(v)
    assert_close(a, ref, dtype)
    a[mx.array([0, 2]), 3] = True
    ref[[0, 2], 3] = np.array(True).astype(dtype.np)
    assert_close(a, ref, dtype)


def test_setitem_from_lists_numpy_and_python_scalars():
    a = to_lazyx(np.zeros((2, 3), np.int32))
    a[0] = [4, 5, 6]
    a[1] = np.array([7, 8, 9])
    a[0, 0] = 9.7                 # cast to the array's dtype
    a[[1], [2]] = -1
    assert_close(a, np.array([[9, 5, 6], [7, 8, -1]]), mx.int32)
    a[1] += 10                    # x[i] += v is x[i] = x[i] + v
    assert_close(a, np.array([[9, 5, 6], [17, 18, 9]]), mx.int32)


def test_setitem_with_repeated_positions_keeps_one_write():
    a = to_lazyx(np.zeros(4, np.int32))
    a[mx.array([1, 1, 1])] = mx.array([5, 6, 7])
    got = a.tolist()
    assert got[0] == 0 and got[2:] == [0, 0] and got[1] in (5, 6, 7)
    b = to_lazyx(np.zeros(4, np.int32))
    b[mx.array([2, 2])] += 1      # read once, written once: not accumulated
    assert b.tolist() == [0, 0, 1, 0]


# -- functional semantics: other references keep their values ------------------------
def test_setitem_leaves_other_references_unchanged():
    x = to_lazyx(np.arange(6, dtype=np.int32))
    y = x * 2                      # built before, evaluated after
    v = x[1:4]                     # an unevaluated view of x
    w = mx.reshape(x, (2, 3))
    x[0] = 100
    x[2:4] = mx.array([-1, -2])
    assert_close(y, np.arange(6) * 2, mx.int32)
    assert_close(v, np.arange(1, 4), mx.int32)
    assert_close(w, np.arange(6).reshape(2, 3), mx.int32)
    assert_close(x, np.array([100, 1, -1, -2, 4, 5]), mx.int32)
    alias = x                      # the same object sees the update, as in MLX
    x[5] = 0
    assert alias.tolist() == [100, 1, -1, -2, 4, 0]


def _assign_in_function(arr, value):
    arr[0] = value


def test_setitem_reads_the_previous_value_of_itself():
    x = to_lazyx(np.arange(5, dtype=np.float32))
    x[0] = x[4]
    x[1:3] = x[2:4] * 10
    x[mx.array([4, 3])] = x[:2]
    assert_close(x, np.array([4, 20, 30, 20, 4]), mx.float32)
    y = to_lazyx(np.arange(4, dtype=np.float32)) + 0     # unevaluated
    z = y + 1
    _assign_in_function(y, z[3])                        # referenced by z and the caller
    assert_close(z, np.arange(4) + 1, mx.float32)
    assert_close(y, np.array([4, 1, 2, 3]), mx.float32)
    for i in range(1, 4):                               # a running recurrence
        y[i] = y[i - 1] * 2
    assert_close(y, np.array([4, 8, 16, 32]), mx.float32)


def test_views_and_bases_after_setitem_on_either(on_cpu):
    base = to_lazyx(np.arange(12, dtype=np.int32).reshape(3, 4))
    view = base[1]
    mx.eval(view)
    assert np.shares_memory(np.asarray(view), np.asarray(base))
    view[0] = -5
    base[1, 1] = -6
    assert_close(view, np.array([-5, 5, 6, 7]), mx.int32)
    assert_close(base[1], np.array([4, -6, 6, 7]), mx.int32)
    parts = mx.split(base, 2, axis=1)
    parts[0][:, 0] = 0
    assert_close(parts[1], np.arange(12).reshape(3, 4)[:, 2:], mx.int32)
    assert_close(base[:, 0], np.array([0, 4, 8]), mx.int32)


# -- .at updates ------------------------------------------------------------------------
AT_OPS = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply,
          "maximum": np.maximum, "minimum": np.minimum}
AT_KEYS = [(I([0, 0, 2, 0]),), (I([1, 1]), I([2, 2])), (slice(None), I([3, 0, 3])),
           (I([[0], [0]]), 1), (1, slice(1, 4)), (Ellipsis, -1)]


@pytest.mark.parametrize("op", list(AT_OPS))
@pytest.mark.parametrize("key", AT_KEYS, ids=[str(i) for i in range(len(AT_KEYS))])
@pytest.mark.parametrize("dtype", [mx.int32, mx.float32, mx.bfloat16], ids=ids)
def test_at_accumulates_repeated_positions(op, key, dtype):
    g = rng(6)
    x = random_array((3, 4), dtype, g, low=-3, high=3)
    target = x[key].shape
    v = random_array(target, dtype, g, low=1, high=3)
    ref = x.astype(np.float64)
    AT_OPS[op].at(ref, key, v.astype(np.float64))
    a = to_lazyx(x)
    got = getattr(a.at[_lx_key(key, "lazyx")], op)(to_lazyx(v))
    assert_close(got, ref, dtype, rtol=0.05 if dtype is mx.bfloat16 else None)
    assert_close(a, x, dtype)      # .at is functional: the array itself is unchanged


def test_at_divide_and_scalars():
    x = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    got = to_lazyx(x).at[mx.array([0, 0]), 1].divide(2.0)
    ref = x.copy()
    ref[0, 1] /= 4
    assert_close(got, ref, mx.float32)
    # As in MLX, an integer array is multiplied by 1 / value in its own dtype.
    i = to_lazyx(np.array([7, 7, 7], np.int32))
    assert i.at[0].divide(-1).tolist() == [-7, 7, 7]
    assert i.at[1].divide(2).tolist() == [7, 0, 7]
    assert i.at[:].add(1.5).tolist() == [8, 8, 8]
    b = to_lazyx(np.array([False, True]))
    assert b.at[mx.array([0, 0])].add(True).tolist() == [True, True]
    u = to_lazyx(np.array([5, 5], np.uint8))
    assert u.at[mx.array([1, 1])].subtract(mx.array([1, 2])).tolist() == [5, 2]
    with pytest.raises(ShapeError):
        to_lazyx(x).at[mx.array([0, 0])].add(mx.zeros((3, 3)))
    with pytest.raises(ArgumentError):
        to_lazyx(x).at.add(1)


# -- take / take_along_axis / put_along_axis ----------------------------------------------
@pytest.mark.parametrize("dtype", [mx.bool_, mx.int16, mx.float32, mx.complex64], ids=ids)
def test_take(dtype):
    x = random_array((3, 4, 5), dtype, rng(7))
    lx = to_lazyx(x)
    idx = np.array([[0, 4], [-1, 2]])
    assert_close(mx.take(lx, mx.array(idx)), np.take(x, idx), dtype)
    for axis in [0, 1, -1]:
        n = x.shape[axis]
        i = np.array([n - 1, 0, -n, 1])
        assert_close(mx.take(lx, mx.array(i), axis=axis), np.take(x, i, axis=axis), dtype)
        assert_close(mx.take(lx, -1, axis=axis), np.take(x, -1, axis=axis), dtype)
    assert_close(mx.take(lx, 7), np.take(x, 7), dtype)
    assert_close(mx.take(lx, mx.array(2), axis=1), np.take(x, 2, axis=1), dtype)
    assert_close(mx.take(lx, [1, 1], axis=2), np.take(x, [1, 1], axis=2), dtype)
    t = mx.transpose(lx)                                   # non-contiguous input
    assert_close(mx.take(t, mx.array([1, 0]), axis=1), np.take(x.T, [1, 0], axis=1), dtype)


@pytest.mark.parametrize("dtype", [mx.uint8, mx.float16, mx.float32], ids=ids)
def test_take_along_axis(dtype):
    g = rng(8)
    x = random_array((3, 4, 5), dtype, g)
    lx = to_lazyx(x)
    for axis in [0, 1, -1]:
        shape = list(x.shape)
        shape[axis] = 6
        idx = g.integers(-x.shape[axis], x.shape[axis], size=shape)
        assert_close(mx.take_along_axis(lx, mx.array(idx), axis),
                     np.take_along_axis(x, idx, axis), dtype)
    idx = np.argsort(x, axis=-1)
    assert_close(mx.take_along_axis(lx, mx.array(idx)), np.sort(x, axis=-1), dtype)
    b = np.array([[[0], [2], [1], [0]]])                   # broadcasts along axis 0
    assert_close(mx.take_along_axis(lx, mx.array(b), 2),
                 np.take_along_axis(x, np.broadcast_to(b, (3, 4, 1)), 2), dtype)
    flat = np.array([0, 59, -1])
    assert_close(mx.take_along_axis(lx, mx.array(flat), None), x.reshape(-1)[flat], dtype)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64, np.uint8])
def test_take_along_the_rows_of_a_matrix(index_dtype):
    """A 2-d gather along axis 1 with indices for every row (a cross entropy's targets:
    the CPU kernel's one-fancy-index path) against NumPy, with negative, repeated and
    several indices per row, and a row broadcast (the general path); an index past the
    row raises naming the shapes."""
    g = rng(10)
    x = random_array((6, 5), mx.float32, g)
    lx = to_lazyx(x)
    low = 0 if index_dtype is np.uint8 else -5
    for k in (1, 3, 7):
        idx = g.integers(low, 5, size=(6, k)).astype(index_dtype)
        assert_close(mx.take_along_axis(lx, mx.array(idx), 1), np.take_along_axis(x, idx, 1),
                     mx.float32)
    row = np.array([[4, 0]], index_dtype)
    assert_close(mx.take_along_axis(lx, mx.array(row), 1),
                 np.take_along_axis(x, np.broadcast_to(row, (6, 2)), 1), mx.float32)
    empty = mx.take_along_axis(to_lazyx(np.zeros((0, 5), np.float32)),
                               mx.array(np.zeros((0, 1), index_dtype)), 1)
    assert empty.shape == (0, 1)
    bad = np.zeros((6, 1), index_dtype)
    bad[3, 0] = 5
    with pytest.raises(IndexOutOfRangeError, match=r"\(6, 5\)"):
        mx.eval(mx.take_along_axis(lx, mx.array(bad), 1))


@pytest.mark.parametrize("dtype", [mx.bool_, mx.int32, mx.float32], ids=ids)
def test_put_along_axis(dtype):
    g = rng(9)
    x = random_array((3, 4), dtype, g)
    lx = to_lazyx(x)
    idx = np.array([[0, 2], [3, 1], [-1, 0]])
    v = random_array((3, 2), dtype, g)
    ref = x.copy()
    np.put_along_axis(ref, idx, v, 1)
    assert_close(mx.put_along_axis(lx, mx.array(idx), to_lazyx(v), 1), ref, dtype)
    ref = x.copy()
    np.put_along_axis(ref, np.array([[2, 0, 1, 2]]), v[:1, :1], 0)
    assert_close(mx.put_along_axis(lx, mx.array([[2, 0, 1, 2]]), to_lazyx(v[:1, :1]), 0), ref, dtype)
    ref = x.copy().reshape(-1)
    ref[[11, 0]] = v[0]
    got = mx.put_along_axis(lx, mx.array([11, 0]), to_lazyx(v[0]))
    assert_close(got, ref.reshape(3, 4), dtype)
    assert_close(lx, x, dtype)
    # As in MLX, values broadcast with the indices (one write wins per position).
    got = mx.put_along_axis(lx, mx.array([[0], [1], [2]]), to_lazyx(v[0]), 1)
    assert got.shape == (3, 4)


# -- errors -----------------------------------------------------------------------------
X = to_lazyx(np.arange(60, dtype=np.float32).reshape(3, 4, 5))

BAD = [
    (lambda: X[3], IndexOutOfRangeError, "Index 3 is out of bounds for axis 0 with size 3"),
    (lambda: X[-4], IndexOutOfRangeError, "-4"),
    (lambda: X[0, 4], IndexOutOfRangeError, "axis 1"),
    (lambda: X[..., 5], IndexOutOfRangeError, "axis 2"),
    (lambda: X[np.int64(7)], IndexOutOfRangeError, "7"),
    (lambda: X[[0, 3]], IndexOutOfRangeError, "Index 3"),
    (lambda: X[:, np.array([-5])], IndexOutOfRangeError, "-5"),
    (lambda: X[0, 0, 0, 0], AxisError, "Too many indices"),
    (lambda: X[..., 0, ...], AxisError, "single ellipsis"),
    (lambda: to_lazyx(np.array(1.0, np.float32))[0], AxisError, "dimension 0"),
    (lambda: X[mx.array([True, False, True])], ArgumentError, "Boolean"),
    (lambda: X[[True, False, True]], ArgumentError, "Boolean"),
    (lambda: X[True], ArgumentError, "Boolean"),
    (lambda: X[1.0], DtypeError, "float"),
    (lambda: X[mx.array([1.0])], DtypeError, "integers"),
    (lambda: X["a"], DtypeError, "str"),
    (lambda: X[mx.array([0, 1]), mx.array([0, 1, 2])], ShapeError, "broadcast"),
    (lambda: mx.take(X, 60), IndexOutOfRangeError, "60"),
    (lambda: mx.take(X, -4, axis=0), IndexOutOfRangeError, "-4"),
    (lambda: mx.take(X, mx.array([0]), axis=3), AxisError, "3"),
    (lambda: mx.take(X, mx.array([0.5])), DtypeError, "integers"),
    (lambda: mx.take_along_axis(X, mx.array([0, 1]), 1), ShapeError, "dimension"),
    (lambda: mx.take_along_axis(X, mx.zeros((2, 1, 1), mx.int32), 1), ShapeError, "broadcast"),
    (lambda: mx.take_along_axis(X, mx.zeros((1, 1, 1), mx.int32), 3), AxisError, "3"),
    (lambda: mx.put_along_axis(X, mx.zeros((1, 2, 1), mx.int32), 1.0, 0), ShapeError, "(1, 2, 1)"),
    (lambda: mx.put_along_axis(X, mx.zeros((1, 1), mx.int32), 1.0, 0), ShapeError, "dimension"),
]


@pytest.mark.parametrize("fn,exc,text", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_index_raises_at_the_call(fn, exc, text):
    before = np.array(X)
    with pytest.raises(exc) as info:
        fn()
    assert text in str(info.value), str(info.value)
    assert_close(X, before, mx.float32)


def test_bad_setitem_leaves_the_array_unchanged():
    x = to_lazyx(np.arange(6, dtype=np.int32).reshape(2, 3))
    for key, value, exc in [(2, 0, IndexOutOfRangeError), ((slice(None), 1), mx.array([1, 2, 3]), ShapeError),
                            (slice(None), mx.zeros((2, 2)), ShapeError),
                            (mx.array([True, False, True]), 1, ShapeError),
                            ((slice(None), mx.array([True, False, True])), 1, ArgumentError),
                            ((mx.array([0]), 5), 1, IndexOutOfRangeError)]:
        with pytest.raises(exc):
            x[key] = value
        assert_close(x, np.arange(6).reshape(2, 3), mx.int32)


def test_index_array_out_of_range_raises_at_evaluation():
    x = to_lazyx(np.arange(10, dtype=np.int32))
    bad = mx.array([2, 10])
    for make in [lambda: x[bad], lambda: mx.take(x, bad), lambda: x.at[bad].add(1),
                 lambda: mx.take_along_axis(x, bad, 0),
                 lambda: mx.put_along_axis(x, bad, mx.array([1, 1]), 0)]:
        y = make()
        # At the evaluation on the CPU; a GPU reports it at the next value read (the checks
        # run without making the host wait: backends/cuda/kernels.py).
        with pytest.raises(IndexOutOfRangeError, match="outside the array"):
            mx.eval(y)
            y.tolist()
    y = to_lazyx(np.arange(10, dtype=np.int32))
    y[bad] = 0
    with pytest.raises(IndexOutOfRangeError):
        mx.eval(y)
        y.tolist()
    assert_close(x, np.arange(10), mx.int32)
    assert_close(x[mx.array([-10, 9])], np.array([0, 9]), mx.int32)   # negatives wrap


# -- boolean-mask assignment (MLX's masked scatter) --------------------------------------
@pytest.mark.parametrize("dtype", [mx.float32, mx.int32, mx.bool_, mx.complex64], ids=str)
@pytest.mark.parametrize("shape,k", [((5,), 1), ((3, 4), 1), ((3, 4), 2), ((2, 3, 2), 2), ((4,), 0)],
                         ids=str)
def test_mask_assignment_matches_numpy(dtype, shape, k):
    g = rng(21)
    x = random_array(shape, dtype, g)
    mask = g.random(shape[:k]) < 0.5
    n = int(mask.sum())
    trail = shape[k:]
    for value in [random_array((), dtype, g), random_array(trail, dtype, g),
                  random_array((n,) + trail, dtype, g)]:
        want = x.copy()
        want[mask] = value
        a = to_lazyx(x)
        alias = a
        a[mx.array(mask) if k else bool(mask)] = to_lazyx(np.asarray(value))
        assert a is alias
        assert_close(a, want, dtype)


def test_mask_assignment_consumes_rows_in_order_and_keeps_earlier_readers():
    x = to_lazyx(np.arange(6, dtype=np.float32).reshape(3, 2))
    before = x * 1
    x[mx.array([True, False, True])] = mx.array([[10.0, 11], [12, 13], [14, 15]])  # extra row unused
    assert x.tolist() == [[10, 11], [2, 3], [12, 13]] and before.tolist() == [[0, 1], [2, 3], [4, 5]]
    x[[False, True, False]] = 7  # a list of bools is a mask too
    assert x.tolist()[1] == [7, 7]


def test_mask_assignment_gradients_and_vmap():
    mask = mx.array([True, False, True, False])
    xs = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    vs = np.array([5.0, 6.0], np.float32)

    def f(x, v):
        y = x * 1
        y[mask] = v * v
        return (y * y).sum()
    gx, gv = mx.grad(f, argnums=(0, 1))(to_lazyx(xs), to_lazyx(vs))
    assert_close(gx, np.array([0, 4, 0, 8.0]), mx.float32)  # masked positions get none
    assert_close(gv, 4 * vs ** 3, mx.float32)  # d/dv (v^2)^2

    def put(x, m):
        x[m] = 0.0
        return x
    xb = np.arange(6, dtype=np.float32).reshape(2, 3)
    mb = np.array([[True, False, True], [False, True, False]])
    out = mx.vmap(put)(to_lazyx(xb), mx.array(mb))
    assert_close(out, np.where(mb, 0, xb), mx.float32)
    assert_close(mx.compile(put)(to_lazyx(xb[0]), mx.array(mb[0])), np.where(mb[0], 0, xb[0]),
                 mx.float32)
