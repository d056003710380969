"""The shapes pack against NumPy: every op on a few dtypes (shape ops move bytes, so
bool, bfloat16 and complex64 stand for the rest), negative axes, 0-d and empty arrays,
non-contiguous inputs, views that share memory with their base, and bad input."""

import numpy as np
import pytest

import lazyx.core as mx
from helpers import assert_close, check_op, random_array, rng, to_lazyx
from lazyx.errors import (ArgumentError, AxisError, DtypeError, IndexOutOfRangeError,
                          ShapeError)

ids = lambda d: d.name  # noqa: E731

# Shape ops are dtype-agnostic: a few dtypes of every kind and size.
SHAPE_DTYPES = [mx.bool_, mx.int8, mx.uint16, mx.int64, mx.bfloat16, mx.float32, mx.complex64]

needs_sum = pytest.mark.skipif(not hasattr(mx, "sum"), reason="needs mx.sum (reductions pack)")


def _noncontiguous(x: np.ndarray) -> mx.array:
    """A lazyx array equal to ``x`` whose buffer is a strided view (every other row of a
    larger array, transposed twice)."""
    if x.ndim == 0:
        return to_lazyx(x)
    big = np.zeros((x.shape[0] * 2,) + x.shape[1:], dtype=x.dtype)
    big[::2] = x
    lx = to_lazyx(big)[::2]
    return mx.transpose(mx.transpose(lx))


# (name, lazyx op, NumPy reference, input shape): one array in, one array out.
CASES = [
    ("reshape", lambda a: mx.reshape(a, (4, -1)), lambda a: a.reshape(4, -1), (2, 3, 4)),
    ("reshape_method", lambda a: a.reshape(3, 8), lambda a: a.reshape(3, 8), (2, 3, 4)),
    ("reshape_0d", lambda a: mx.reshape(a, ()), lambda a: a.reshape(()), (1, 1)),
    ("flatten", lambda a: mx.flatten(a), lambda a: a.reshape(-1), (2, 3, 4)),
    ("flatten_range", lambda a: mx.flatten(a, 1, -1), lambda a: a.reshape(2, -1), (2, 3, 4)),
    ("flatten_neg", lambda a: a.flatten(-3, -2), lambda a: a.reshape(6, 4), (2, 3, 4)),
    ("unflatten", lambda a: mx.unflatten(a, -1, (2, -1)), lambda a: a.reshape(2, 3, 2, 2), (2, 3, 4)),
    ("squeeze", lambda a: mx.squeeze(a), lambda a: np.squeeze(a), (1, 3, 1, 2)),
    ("squeeze_axes", lambda a: a.squeeze((0, -2)), lambda a: np.squeeze(a, (0, 2)), (1, 3, 1, 2)),
    ("expand_dims", lambda a: mx.expand_dims(a, (0, -1)), lambda a: np.expand_dims(a, (0, -1)), (2, 3)),
    ("expand_dims_mid", lambda a: mx.expand_dims(a, 1), lambda a: np.expand_dims(a, 1), (2, 3)),
    ("transpose", lambda a: mx.transpose(a), lambda a: a.T, (2, 3, 4)),
    ("transpose_axes", lambda a: mx.transpose(a, (1, -1, 0)), lambda a: a.transpose(1, 2, 0), (2, 3, 4)),
    ("transpose_method", lambda a: a.transpose(2, 0, 1), lambda a: a.transpose(2, 0, 1), (2, 3, 4)),
    ("T", lambda a: a.T, lambda a: a.T, (2, 3, 4)),
    ("mT", lambda a: a.mT, lambda a: np.swapaxes(a, -1, -2), (2, 3, 4)),
    ("permute_dims", lambda a: mx.permute_dims(a, (2, 1, 0)), lambda a: a.transpose(2, 1, 0), (2, 3, 4)),
    ("swapaxes", lambda a: mx.swapaxes(a, 0, -1), lambda a: np.swapaxes(a, 0, -1), (2, 3, 4)),
    ("swapaxes_method", lambda a: a.swapaxes(1, 2), lambda a: np.swapaxes(a, 1, 2), (2, 3, 4)),
    ("moveaxis", lambda a: mx.moveaxis(a, 0, -1), lambda a: np.moveaxis(a, 0, -1), (2, 3, 4)),
    ("moveaxis_method", lambda a: a.moveaxis(-1, 1), lambda a: np.moveaxis(a, -1, 1), (2, 3, 4)),
    ("broadcast_to", lambda a: mx.broadcast_to(a, (2, 4, 3)), lambda a: np.broadcast_to(a, (2, 4, 3)), (4, 1)),
    ("tile", lambda a: mx.tile(a, (2, 1, 3)), lambda a: np.tile(a, (2, 1, 3)), (2, 3)),
    ("tile_int", lambda a: mx.tile(a, 2), lambda a: np.tile(a, 2), (2, 3)),
    ("repeat", lambda a: mx.repeat(a, 3), lambda a: np.repeat(a, 3), (2, 3)),
    ("repeat_axis", lambda a: mx.repeat(a, 2, axis=-1), lambda a: np.repeat(a, 2, axis=-1), (2, 3)),
    ("pad", lambda a: mx.pad(a, 1), lambda a: np.pad(a, 1), (2, 3)),
    ("pad_pairs", lambda a: mx.pad(a, [(1, 0), (0, 2)]), lambda a: np.pad(a, [(1, 0), (0, 2)]), (2, 3)),
    ("pad_edge", lambda a: mx.pad(a, (1, 2), "edge"), lambda a: np.pad(a, (1, 2), "edge"), (2, 3)),
    ("pad_reflect", lambda a: mx.pad(a, 3, "reflect"), lambda a: np.pad(a, 3, "reflect"), (2, 3)),
    ("pad_symmetric", lambda a: mx.pad(a, [(4, 1), (2, 0)], "symmetric"),
     lambda a: np.pad(a, [(4, 1), (2, 0)], "symmetric"), (2, 3)),
    ("roll", lambda a: mx.roll(a, 2), lambda a: np.roll(a, 2), (2, 3)),
    ("roll_axis", lambda a: mx.roll(a, -4, -1), lambda a: np.roll(a, -4, -1), (2, 3)),
    ("roll_axes", lambda a: mx.roll(a, (1, 2), (0, 1)), lambda a: np.roll(a, (1, 2), (0, 1)), (2, 3)),
    ("roll_same_axis", lambda a: mx.roll(a, (1, 1), 1), lambda a: np.roll(a, 2, 1), (2, 3)),
    ("flip", lambda a: mx.flip(a), lambda a: np.flip(a), (2, 3)),
    ("flip_axis", lambda a: mx.flip(a, -1), lambda a: np.flip(a, -1), (2, 3)),
    ("diag_extract", lambda a: mx.diag(a, 1), lambda a: np.diag(a, 1), (3, 4)),
    ("diag_method", lambda a: a.diag(-1), lambda a: np.diag(a, -1), (3, 4)),
    ("diag_build", lambda a: mx.diag(a, -2), lambda a: np.diag(a, -2), (3,)),
    ("diagonal", lambda a: mx.diagonal(a, 1, 0, 2), lambda a: np.diagonal(a, 1, 0, 2), (3, 2, 4)),
    ("diagonal_neg", lambda a: a.diagonal(-1, -1, 0), lambda a: np.diagonal(a, -1, 2, 0), (3, 2, 4)),
    ("atleast_1d", lambda a: mx.atleast_1d(a), lambda a: np.atleast_1d(a), ()),
    ("atleast_2d", lambda a: mx.atleast_2d(a), lambda a: np.atleast_2d(a), (3,)),
    ("atleast_3d", lambda a: mx.atleast_3d(a), lambda a: np.atleast_3d(a), (2, 3)),
    ("atleast_3d_1d", lambda a: mx.atleast_3d(a), lambda a: np.atleast_3d(a), (3,)),
    ("as_strided", lambda a: mx.as_strided(a, (3, 2), (1, 3)),
     lambda a: np.lib.stride_tricks.as_strided(np.ascontiguousarray(a), (3, 2),
                                               (a.itemsize, 3 * a.itemsize)), (2, 3)),
    ("as_strided_offset", lambda a: mx.as_strided(a, (2, 2), (-1, 2), 3),
     lambda a: np.ascontiguousarray(a).reshape(-1)[[[3, 5], [2, 4]]], (2, 3)),
    ("contiguous", lambda a: mx.contiguous(a), lambda a: a, (2, 3)),
    ("slice", lambda a: mx.slice(a, mx.array([1, 2]), (0, 2), (1, 3, 2)),
     lambda a: a[1:2, :, 2:4], (2, 3, 4)),
    ("slice_neg_start", lambda a: mx.slice(a, mx.array([-1]), (-1,), (2, 2, 1)),
     lambda a: a[:, :2, 3:4], (2, 3, 4)),
    ("getitem_view", lambda a: a[1:, ::-2], lambda a: a[1:, ::-2], (3, 4)),
]


@pytest.mark.parametrize("dtype", SHAPE_DTYPES, ids=ids)
@pytest.mark.parametrize("name,lx_fn,np_fn,shape", CASES, ids=[c[0] for c in CASES])
def test_shape_op_matches_numpy(name, lx_fn, np_fn, shape, dtype):
    x = random_array(shape, dtype, rng(3))
    check_op(lx_fn, np_fn, x, dtype=dtype, upcast=False, msg=name)


@pytest.mark.parametrize("name,lx_fn,np_fn,shape", CASES, ids=[c[0] for c in CASES])
def test_shape_op_on_noncontiguous_input(name, lx_fn, np_fn, shape):
    x = random_array(shape, mx.float32, rng(4))
    assert_close(lx_fn(_noncontiguous(x)), np_fn(x), mx.float32, msg=name)


# -- joining and splitting ---------------------------------------------------------------
@pytest.mark.parametrize("dtype", SHAPE_DTYPES, ids=ids)
def test_concatenate_and_stack(dtype):
    g = rng(5)
    a, b, c = (random_array(s, dtype, g) for s in [(2, 3), (2, 1), (2, 0)])
    check_op(lambda *xs: mx.concatenate(xs, axis=-1), lambda *xs: np.concatenate(xs, -1),
             a, b, c, dtype=dtype, upcast=False)
    check_op(lambda x, y: mx.concat([x, y], 1), lambda x, y: np.concatenate([x, y], 1),
             a, b, dtype=dtype, upcast=False)
    check_op(lambda x, y: mx.concatenate([x, y], axis=None),
             lambda x, y: np.concatenate([x, y], axis=None), a, b, dtype=dtype, upcast=False)
    check_op(lambda x, y: mx.stack([x, y], axis=-1), lambda x, y: np.stack([x, y], -1),
             a, a, dtype=dtype, upcast=False)
    check_op(lambda x, y: mx.stack((x, y)), lambda x, y: np.stack([x, y]), a, a,
             dtype=dtype, upcast=False)


def test_concatenate_and_stack_promote_dtypes():
    a = to_lazyx(np.arange(6, dtype=np.int32).reshape(2, 3))
    assert mx.concatenate([a, mx.astype(a, mx.float16)]).dtype == mx.float16
    assert mx.concatenate([a, mx.astype(a, mx.uint64)]).dtype == mx.float32
    assert mx.concatenate([mx.astype(a, mx.bfloat16), mx.astype(a, mx.float16)]).dtype == mx.float32
    s = mx.stack([a, mx.astype(a, mx.bool_)])
    assert_close(s, np.stack([np.array(a), np.array(a).astype(bool).astype(np.int32)]), mx.int32)
    assert_close(mx.stack([mx.array(1), mx.array(2)]), np.array([1, 2]), mx.int32)


@pytest.mark.parametrize("dtype", [mx.bool_, mx.bfloat16, mx.complex64], ids=ids)
def test_split_and_unstack(dtype):
    x = random_array((2, 6, 3), dtype, rng(6))
    lx = to_lazyx(x)
    for args, ref in [((3, 1), np.split(x, 3, 1)),
                      (([1, 4], -2), np.split(x, [1, 4], -2)),
                      (([4, 2, 9, -1], 1), np.split(x, [4, 2, 9, -1], 1)),
                      (([], 0), [x])]:
        got = mx.split(lx, *args)
        assert isinstance(got, list) and len(got) == len(ref)
        for g, r in zip(got, ref):
            assert_close(g, r, dtype)
    got = lx.split(2)
    assert [p.shape for p in got] == [(1, 6, 3), (1, 6, 3)]
    parts = mx.unstack(lx, axis=-1)
    assert isinstance(parts, tuple) and len(parts) == 3
    for i, p in enumerate(parts):
        assert_close(p, x[..., i], dtype)
    assert mx.unstack(to_lazyx(np.zeros((0, 3), np.float32))) == ()


def test_split_pieces_are_independent_outputs():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    a, b = mx.split(to_lazyx(x), 2)
    assert_close(b, x[2:], mx.float32)   # evaluating one output fills its sibling
    assert_close(a, x[:2], mx.float32)
    c, d = mx.split(to_lazyx(x), [1])
    c[0, 0] = -1.0                         # rebinding one output leaves the other intact
    assert_close(d, x[1:], mx.float32)
    assert_close(c, np.array([[-1.0, 1, 2]]), mx.float32)


def test_broadcast_arrays_and_shapes():
    a = to_lazyx(np.arange(3, dtype=np.int16).reshape(3, 1))
    b = to_lazyx(np.ones((2, 1, 4), np.float16))
    x, y = mx.broadcast_arrays(a, b)
    assert (x.shape, x.dtype, y.shape, y.dtype) == ((2, 3, 4), mx.int16, (2, 3, 4), mx.float16)
    assert_close(x, np.broadcast_to(np.arange(3).reshape(3, 1), (2, 3, 4)), mx.int16)
    assert mx.broadcast_arrays() == []
    assert mx.broadcast_shapes((2, 1), (3,), ()) == (2, 3)
    assert mx.broadcast_shapes((0, 1), (1, 5)) == (0, 5)
    assert_close(mx.broadcast_to(2.5, (2,)), np.array([2.5, 2.5]), mx.float32)


# -- dtypes of compositions --------------------------------------------------------------
@needs_sum
@pytest.mark.parametrize("dtype,out", [(mx.bool_, mx.int32), (mx.int8, mx.int32),
                                       (mx.uint8, mx.uint32), (mx.float16, mx.float16),
                                       (mx.int64, mx.int64), (mx.complex64, mx.complex64)],
                         ids=lambda d: d.name if hasattr(d, "name") else d)
def test_trace_dtypes(dtype, out):
    x = random_array((3, 4, 2), dtype, rng(7), low=0, high=3)
    ref = np.trace(x.astype(np.complex128 if dtype.kind == "c" else np.float64), 1, 0, 1)
    assert_close(mx.trace(to_lazyx(x), 1, 0, 1), ref, out)
    if dtype.kind != "c":
        assert_close(mx.trace(to_lazyx(x[..., 0]), dtype=mx.float32),
                     np.trace(x[..., 0].astype(np.float64)), mx.float32)


def test_pad_constant_values_and_dtypes():
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    lx = to_lazyx(x)
    assert_close(mx.pad(lx, 1, constant_values=2.5), np.pad(x, 1, constant_values=2), mx.int32)
    assert_close(mx.pad(lx, 1, constant_values=mx.array(7.0)), np.pad(x, 1, constant_values=7),
                 mx.int32)
    b = mx.pad(mx.astype(lx, mx.bool_), (0, 1), constant_values=2)
    assert_close(b, np.pad(x.astype(bool), (0, 1), constant_values=True), mx.bool_)
    h = mx.pad(mx.astype(lx, mx.float16), ((1, 1), (0, 0)), constant_values=mx.array([-1.5]))
    assert_close(h, np.pad(x.astype(np.float64), ((1, 1), (0, 0)), constant_values=-1.5),
                 mx.float16)


def test_view_reinterprets_bytes():
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    lx = to_lazyx(x)
    assert_close(mx.view(lx, mx.uint8), x.view(np.uint8), mx.uint8)
    assert_close(lx.view(mx.float32), x.view(np.float32), mx.float32)
    assert_close(mx.view(mx.transpose(lx), mx.int16), np.ascontiguousarray(x.T).view(np.int16),
                 mx.int16)
    u = np.arange(8, dtype=np.uint8).reshape(2, 4)
    assert_close(mx.view(to_lazyx(u), mx.int32), u.view(np.int32), mx.int32)
    assert_close(mx.view(1.5, mx.int32), np.array(1.5, np.float32).view(np.int32), mx.int32)
    assert_close(mx.view(to_lazyx(np.zeros((2, 0), np.float32)), mx.int64),
                 np.zeros((2, 0), np.int64), mx.int64)
    bf = mx.view(to_lazyx(np.array([0x3F80, 0x4000], np.uint16)), mx.bfloat16)
    assert_close(bf, np.array([1.0, 2.0]), mx.bfloat16)


def test_contiguous_allow_col_major():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = mx.transpose(to_lazyx(x))
    assert_close(mx.contiguous(t, allow_col_major=True), x.T, mx.float32)
    c = mx.contiguous(t)
    assert np.array(c).flags.c_contiguous


def test_slice_update():
    x = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    lx = to_lazyx(x)
    ref = x.copy()
    ref[1:2, :, 2:4] = 0
    out = mx.slice_update(lx, mx.array([0.0, 0.0]), mx.array([1, 2]), (0, 2))
    assert_close(out, ref, mx.int32)
    ref = x.copy()
    ref[0:1, :, 1:3] = np.array([[7], [8], [9]])
    upd = mx.array(np.array([[[7, 7], [8, 8], [9, 9]]], np.int64))
    assert_close(mx.slice_update(lx, upd, mx.array([1]), (-1,)), ref, mx.int32)
    assert_close(lx, x, mx.int32)  # the input is unchanged


# -- 0-d and empty arrays ----------------------------------------------------------------
def test_zero_dim_inputs():
    s = to_lazyx(np.array(3.5, np.float32))
    assert_close(mx.flatten(s), np.array([3.5]), mx.float32)
    assert_close(mx.reshape(s, (1, 1)), np.full((1, 1), 3.5), mx.float32)
    assert_close(mx.expand_dims(s, 0), np.array([3.5]), mx.float32)
    assert_close(mx.squeeze(s), np.array(3.5), mx.float32)
    assert_close(mx.transpose(s), np.array(3.5), mx.float32)
    assert_close(mx.broadcast_to(s, (2, 2)), np.full((2, 2), 3.5), mx.float32)
    assert_close(mx.atleast_3d(s), np.full((1, 1, 1), 3.5), mx.float32)
    assert_close(mx.pad(s, 2), np.array(3.5), mx.float32)
    assert_close(mx.roll(s, 1), np.array(3.5), mx.float32)
    assert_close(mx.flip(s), np.array(3.5), mx.float32)
    assert_close(mx.tile(s, 3), np.full(3, 3.5), mx.float32)
    assert_close(mx.repeat(s, 2), np.full(2, 3.5), mx.float32)
    assert_close(mx.view(s, mx.uint32), np.array(3.5, np.float32).view(np.uint32), mx.uint32)


@pytest.mark.parametrize("dtype", [mx.bool_, mx.float32], ids=ids)
def test_empty_inputs(dtype):
    x = random_array((0, 3), dtype)
    for lx_fn, np_fn in [
        (lambda a: mx.reshape(a, (3, -1)), lambda a: a.reshape(3, -1)),
        (lambda a: mx.reshape(a, (-1,)), lambda a: a.reshape(-1)),
        (lambda a: mx.transpose(a), lambda a: a.T),
        (lambda a: mx.broadcast_to(a, (2, 0, 3)), lambda a: np.broadcast_to(a, (2, 0, 3))),
        (lambda a: mx.concatenate([a, a]), lambda a: np.concatenate([a, a])),
        (lambda a: mx.stack([a, a], 1), lambda a: np.stack([a, a], 1)),
        (lambda a: mx.tile(a, (2, 2)), lambda a: np.tile(a, (2, 2))),
        (lambda a: mx.repeat(a, 2, 1), lambda a: np.repeat(a, 2, 1)),
        (lambda a: mx.pad(a, 1), lambda a: np.pad(a, 1)),
        (lambda a: mx.pad(a, [(0, 0), (1, 1)], "edge"), lambda a: np.pad(a, [(0, 0), (1, 1)], "edge")),
        (lambda a: mx.roll(a, 1, 1), lambda a: np.roll(a, 1, 1)),
        (lambda a: mx.flip(a), lambda a: np.flip(a)),
        (lambda a: mx.diagonal(a), lambda a: np.diagonal(a)),
        (lambda a: mx.split(a, 3)[1], lambda a: np.split(a, 3)[1]),
        (lambda a: mx.unflatten(a, 0, (-1, 2)), lambda a: a.reshape(0, 2, 3)),
    ]:
        check_op(lx_fn, np_fn, x, dtype=dtype, upcast=False)
    assert_close(mx.diag(to_lazyx(np.zeros((0,), np.float32)), 2), np.zeros((2, 2)), mx.float32)


# -- views and their bases -----------------------------------------------------------------
def test_views_share_memory_but_not_updates(on_cpu):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    base = to_lazyx(x)
    views = [mx.reshape(base, (4, 3)), mx.transpose(base), base[1:, ::2],
             mx.broadcast_to(base, (2, 3, 4)), mx.split(base, 2, axis=1)[1],
             mx.diagonal(base), mx.as_strided(base, (2, 2), (1, 4)), mx.expand_dims(base, 0)]
    refs = [np.array(v) for v in views]
    # Zero-copy: the evaluated views are NumPy views of the base's buffer.
    assert np.shares_memory(np.asarray(views[0]), np.asarray(base))
    assert np.shares_memory(np.asarray(views[1]), np.asarray(base))
    base[0, 0] = 100.0
    base[:, 1] = -1.0
    for v, r in zip(views, refs):
        assert_close(v, r, mx.float32)
    ref_base = x.copy()
    ref_base[0, 0] = 100.0
    ref_base[:, 1] = -1.0
    assert_close(base, ref_base, mx.float32)
    for v in views:
        v[...] = 5.0
    assert_close(base, ref_base, mx.float32)


def test_unevaluated_views_keep_their_values():
    base = to_lazyx(np.arange(6, dtype=np.int32)) * 1
    v = mx.reshape(base, (2, 3))        # not yet evaluated
    base[0] = 9
    assert_close(v, np.arange(6).reshape(2, 3), mx.int32)
    assert_close(base, np.array([9, 1, 2, 3, 4, 5]), mx.int32)


def test_no_op_results_are_new_objects():
    a = to_lazyx(np.arange(4, dtype=np.int32))
    outs = [mx.reshape(a, (4,)), mx.atleast_1d(a), mx.concatenate([a]), mx.pad(a, 0),
            mx.roll(a, 4), mx.flip(a, ()), mx.squeeze(a), mx.transpose(a), a[:], a[...]]
    for o in outs:
        assert o is not a
        o[0] = -1
    assert_close(a, np.arange(4), mx.int32)


# -- bad input ----------------------------------------------------------------------------
A = to_lazyx(np.zeros((2, 3, 4), np.float32))

BAD = [
    (lambda: mx.reshape(A, (5, -1)), ShapeError, "(2, 3, 4)"),
    (lambda: mx.reshape(A, (5, 5)), ShapeError, "(5, 5)"),
    (lambda: mx.reshape(A, (-1, -1)), ShapeError, "one"),
    (lambda: mx.reshape(A, (0, -1)), ShapeError, "(0, -1)"),
    (lambda: mx.reshape(A, (2.0, 12)), DtypeError, "shape"),
    (lambda: A.reshape(), ShapeError, "shape"),
    (lambda: mx.flatten(A, 2, 1), AxisError, "start_axis"),
    (lambda: mx.unflatten(A, 1, (2, 2)), ShapeError, "size 3"),
    (lambda: mx.unflatten(A, 3, (2, 2)), AxisError, "3"),
    (lambda: mx.squeeze(A, 1), ShapeError, "size 3"),
    (lambda: mx.squeeze(A, 5), AxisError, "5"),
    (lambda: mx.squeeze(A, (-1, 2)), AxisError, "Repeated"),
    (lambda: mx.expand_dims(A, 4), AxisError, "4"),
    (lambda: mx.expand_dims(A, (0, 0)), AxisError, "Repeated"),
    (lambda: mx.transpose(A, (0, 1)), AxisError, "2 axes"),
    (lambda: mx.transpose(A, (0, 0, 1)), AxisError, "Repeated"),
    (lambda: mx.transpose(A, (0, 1, 3)), AxisError, "3"),
    (lambda: mx.swapaxes(A, 0, 3), AxisError, "axis2"),
    (lambda: mx.moveaxis(A, -4, 0), AxisError, "source"),
    (lambda: mx.zeros((3,)).mT, ShapeError, "two"),
    (lambda: mx.broadcast_to(A, (3, 4)), ShapeError, "(2, 3, 4)"),
    (lambda: mx.broadcast_to(A, (2, 3, -1)), ShapeError, "Negative"),
    (lambda: mx.broadcast_shapes((2, 1), (3, 4)), ShapeError, "(3, 4)"),
    (lambda: mx.broadcast_shapes(), ShapeError, "at least one"),
    (lambda: mx.concatenate([]), ShapeError, "No arrays"),
    (lambda: mx.concatenate([A, mx.zeros((2, 3))]), ShapeError, "(2, 3)"),
    (lambda: mx.concatenate([A, mx.zeros((2, 3, 5))], axis=1), ShapeError, "(2, 3, 5)"),
    (lambda: mx.concatenate([A, A], axis=3), AxisError, "3"),
    (lambda: mx.concatenate(A), DtypeError, "list"),
    (lambda: mx.stack([A, mx.zeros((2, 3))]), ShapeError, "same shape"),
    (lambda: mx.stack([A, A], 4), AxisError, "4"),
    (lambda: mx.split(A, 2, axis=1), ShapeError, "size 3"),
    (lambda: mx.split(A, 0), ArgumentError, "positive"),
    (lambda: mx.split(A, [1], axis=3), AxisError, "3"),
    (lambda: mx.tile(A, -1), ShapeError, "non-negative"),
    (lambda: mx.repeat(A, -1, 0), ArgumentError, "negative"),
    (lambda: mx.repeat(A, 2, axis=3), AxisError, "3"),
    (lambda: mx.pad(A, -1), ShapeError, "non-negative"),
    (lambda: mx.pad(A, [(1, 1), (1, 1)]), ShapeError, "pad_width"),
    (lambda: mx.pad(A, 1, "wrap"), ArgumentError, "wrap"),
    (lambda: mx.pad(mx.zeros((0, 2)), 1, "reflect"), ShapeError, "empty"),
    (lambda: mx.pad(A, 1, constant_values=mx.zeros((2,))), ShapeError, "one value"),
    (lambda: mx.roll(A, 1, 3), AxisError, "3"),
    (lambda: mx.roll(A, (1, 2, 3), (0, 1)), ShapeError, "same length"),
    (lambda: mx.flip(A, 3), AxisError, "3"),
    (lambda: mx.diag(A), ShapeError, "1-D or 2-D"),
    (lambda: mx.diagonal(mx.zeros((3,))), ShapeError, "two dimensions"),
    (lambda: mx.diagonal(A, 0, 1, -2), AxisError, "same axis"),
    (lambda: mx.trace(mx.zeros((3,))), ShapeError, "two dimensions"),
    (lambda: mx.as_strided(A, (4, 4), (1, 8)), IndexOutOfRangeError, "outside"),
    (lambda: mx.as_strided(A, (2,), (-1,)), IndexOutOfRangeError, "outside"),
    (lambda: mx.as_strided(A, (2, 2), (1,)), ShapeError, "same length"),
    (lambda: mx.view(mx.zeros((3,)), mx.int64), ShapeError, "multiple"),
    (lambda: mx.view(mx.array(1), mx.int16), ShapeError, "0-d"),
    (lambda: mx.slice(A, mx.array([1, 1]), (0, 2), (1, 3, 5)), ShapeError, "slice_size"),
    (lambda: mx.slice(A, mx.array([1]), (0, 2), (1, 3, 2)), ShapeError, "axes"),
    (lambda: mx.slice(A, mx.array([1, 1]), (0, 0), (1, 3, 2)), AxisError, "Repeated"),
    (lambda: mx.slice(A, mx.array([1.0, 1.0]), (0, 2), (1, 3, 2)), DtypeError, "integers"),
    (lambda: mx.slice(A, mx.array([[1, 1]]), (0, 2), (1, 3, 2)), ShapeError, "1-D"),
    (lambda: mx.slice(A, mx.array([5, 1]), (0, 2), (1, 3, 2)), IndexOutOfRangeError, "axis 0"),
    (lambda: mx.slice(A, mx.array([1, 3]), (0, 2), (1, 3, 2)), IndexOutOfRangeError, "axis 2"),
    (lambda: mx.slice_update(A, mx.zeros((2, 3, 5)), mx.array([0]), (0,)), ShapeError, "(2, 3, 5)"),
    (lambda: mx.slice_update(A, mx.zeros((1, 3, 2)), mx.array([1, 3]), (0, 2)),
     IndexOutOfRangeError, "axis 2"),
]


@pytest.mark.parametrize("fn,exc,text", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_raises_at_the_call(fn, exc, text):
    before = np.array(A)
    with pytest.raises(exc) as info:
        fn()
    assert text in str(info.value), str(info.value)
    assert_close(A, before, mx.float32)


def test_dynamic_start_out_of_range_raises_at_evaluation():
    a = to_lazyx(np.arange(12, dtype=np.int32).reshape(3, 4))
    start = to_lazyx(np.array([2, 3], np.int32)) + 0      # not known until evaluated
    s = mx.slice(a, start, (0, 1), (2, 2))
    with pytest.raises(IndexOutOfRangeError, match="does not fit"):
        mx.eval(s)
    late = to_lazyx(np.array([0, 2], np.int32)) + 0
    u = mx.slice_update(a, mx.zeros((1, 3), mx.int32), late, (0, 1))
    with pytest.raises(IndexOutOfRangeError, match="does not fit"):
        mx.eval(u)
    with pytest.raises(IndexOutOfRangeError, match="axis 1"):   # now known: at the call
        mx.slice_update(a, mx.zeros((1, 3), mx.int32), start, (0, 1))
    ok = mx.slice(a, to_lazyx(np.array([1, -2], np.int32)) + 0, (0, 1), (2, 2))
    assert_close(ok, np.arange(12).reshape(3, 4)[1:3, 2:4], mx.int32)
    assert_close(a, np.arange(12).reshape(3, 4), mx.int32)
