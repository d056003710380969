"""The Metal backend's gather, scatter and copy kernels (backends/metal/kernels/indexing.py
and shapes.py): each launcher run through lazyx's MSL shim against NumPy float64
references, then each op on ``stream=mx.gpu`` (the backend emulated on the CPU) against
the CPU backend — values, out-of-range errors, and the backend's counters (built-in
kernels, no CPU fallback)."""

import numpy as np
import pytest

import lazyx.core as mx
from helpers import random_array, rng
from lazyx.backends import metal
from lazyx.backends.cpu.kernels import indexing as cpu_indexing
from lazyx.backends.metal.kernels import UnsupportedDtype, indexing, shapes
from lazyx.backends.metal.msl_cpu import shim_available
from lazyx.errors import IndexOutOfRangeError
from lazyx.plugins import indexing as ix
from lazyx.plugins import shapes as sh
from test_metal_backend import on_metal  # noqa: F401 - the emulated backend, stats at zero
from test_metal_kernels import _dtype, layout, run, run_reversed

pytestmark = pytest.mark.skipif(not shim_available(), reason="no C++ compiler for the MSL shim")

S = mx.default_stream(mx.cpu)
F64 = np.float64
DTYPES = ["float32", "float16", "bfloat16", "int32", "uint32", "bool"]


def data(shape, dtype, seed=0):
    return random_array(shape, _dtype(dtype), rng(seed))


def strided(x, how):
    """``x`` (any dimensions) in test_metal_kernels' layout ``how``, as a view of it."""
    return layout(x.reshape(x.shape[0], -1), how).reshape(x.shape)


def numpy_key(p, inputs):
    """The NumPy index of a Gather or Scatter (its template with the index arrays in)."""
    key = list(p._template)
    for pos, k in p._places:
        key[pos] = inputs[k]
    return tuple(key)


# -- gathers through the shim ----------------------------------------------------------------
# (x shape, entries, index arrays): take-like, slices around arrays, a new axis, an int
# beside arrays (NumPy's advanced rule), non-adjacent arrays (B goes first), negative
# indices, broadcast index arrays, one element, empty indices.
GATHERS = [
    ((7, 5), (("array", 1),), [[0, -1, 3, 3, -7]]),
    ((4, 6), (("array", 1), ("slice", 5, -1, -2)), [[[0, -1], [2, 1]]]),
    ((3, 4, 5), (("slice", 0, 3, 1), ("array", 1), ("array", 2)), [[[1], [-4]], [0, 4, -1]]),
    ((3, 4, 5), (("array", 1), ("slice", 1, 4, 2), ("array", 2)), [[2, -3], [[4], [0]]]),
    ((3, 4, 5), (("new",), ("int", 2), ("slice", 0, 4, 1), ("array", 1)), [[-1, 1]]),
    ((1,), (("array", 1),), [0]),
    ((6, 3), (("array", 1),), [np.zeros((0,), np.int64)]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("how", ["contiguous", "transposed", "sliced"])
def test_gather_equals_numpy_indexing(dtype, how):
    for n, (shape, entries, idx) in enumerate(GATHERS):
        x = strided(data(shape, dtype, n), how)
        index_types = [np.int32, np.int64, np.int32]
        inputs = [x] + [np.asarray(i, index_types[(n + k) % 3]) for k, i in enumerate(idx)]
        p = ix.Gather(S, entries)
        got = indexing.gather(p, inputs, run)
        ref = x.astype(F64)[numpy_key(p, inputs)]
        assert got.dtype == x.dtype and got.shape == ref.shape, (shape, entries)
        np.testing.assert_array_equal(got.astype(F64), ref, err_msg=str((shape, entries)))


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64, np.uint32, np.int8, np.uint16])
def test_gather_axis_equals_take_along_axis(index_dtype):
    gen = rng(3)
    for shape, ishape, axis in [((5, 7), (5, 4), 1), ((6, 1, 3), (2, 4, 3), 0),
                                ((1, 9), (3, 9), 0), ((4, 5), (1, 0), 1), ((1,), (1,), 0)]:
        x = strided(data(shape, "float32", 1), "transposed")
        low = 0 if np.dtype(index_dtype).kind == "u" else -shape[axis]
        idx = gen.integers(low, shape[axis], ishape).astype(index_dtype)
        got = indexing.gather_axis(ix.GatherAxis(S, axis), [x, idx], run)
        ref = np.take_along_axis(x.astype(F64), idx.astype(np.int64), axis)
        np.testing.assert_array_equal(got.astype(F64), ref)


# -- scatters through the shim ---------------------------------------------------------------
# Repeated positions: ``j`` holds 1 three times, -2 (= 4) twice.
_J = np.array([1, 3, 1, -2, 1, 4, 0], np.int64)
_UFUNC = {"add": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
#: Float64 references of a fold of up to 3 updates, rounded at each step in the dtype.
_TOL = {"float32": 1e-6, "float16": 4e-3, "bfloat16": 3e-2}


def _scatter_inputs(dtype, how, mode):
    x = strided(data((6, 5), dtype, 4), how)
    v = data((7, 5), dtype, 5)
    if mode == "prod" and dtype not in ("bool",):
        v = (np.where(v.astype(F64) > 0.5, 1, -1) if dtype != "uint32" else
             np.full(v.shape, 2)).astype(v.dtype)
    return x, v


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", [None, "add", "prod", "max", "min"])
def test_scatter_combines_repeated_positions_as_numpy(dtype, mode):
    x, v = _scatter_inputs(dtype, "transposed", mode)
    p = ix.Scatter(S, (("array", 2),), mode)
    for runner in (run, run_reversed):   # owners are elected the same in any thread order
        got = indexing.scatter(p, [x, v, _J], runner)
        ref = x.astype(F64)
        if mode is None:
            ref[_J] = v.astype(F64)       # NumPy: the last update of a position wins
        else:
            _UFUNC[mode].at(ref, _J, v.astype(F64))
        if dtype == "bool":
            ref = ref.astype(bool)
        assert got.dtype == x.dtype and got.flags.c_contiguous
        tol = _TOL.get(dtype, 0) if mode in ("add", "prod") else 0
        np.testing.assert_allclose(got.astype(F64), ref, rtol=tol, atol=tol, err_msg=str(mode))
        # And bit for bit what the CPU kernel computes in the dtype (same order, rounding).
        cpu = cpu_indexing.KERNELS[ix.Scatter](p, [x, v, _J])
        np.testing.assert_array_equal(got.astype(F64), cpu.astype(F64))


def test_scatter_with_slices_broadcast_updates_and_nan():
    x = strided(data((4, 6, 3), "float32", 6), "sliced")
    p = ix.Scatter(S, (("slice", 3, -1, -1), ("array", 2), ("array", 3)), "max")
    i, k = np.array([[0], [-1], [0]], np.int32), np.array([2, 2, 0, 2], np.uint32)
    v = np.full((4, 1, 1), np.nan, np.float32)
    v[1] = 10.0
    got = indexing.scatter(p, [x, v, i, k], run)
    ref = x.astype(F64)
    np.maximum.at(ref, numpy_key(p, [x, v, i, k]), v.astype(F64))
    np.testing.assert_array_equal(got, ref.astype(np.float32))   # NaN wins max, as NumPy


def test_scatter_axis_last_write_wins_as_put_along_axis():
    for dtype in DTYPES:
        x = strided(data((4, 5), dtype, 7), "transposed")
        idx = np.array([[0, 0, -1], [4, 2, 4], [1, 1, 1], [3, -5, 3]], np.int32)
        v = data((4, 3), dtype, 8)
        got = indexing.scatter_axis(ix.ScatterAxis(S, 1), [x, idx, v], run)
        ref = x.astype(F64)
        np.put_along_axis(ref, idx.astype(np.int64), v.astype(F64), axis=1)
        np.testing.assert_array_equal(got.astype(F64), ref, err_msg=dtype)
    # Indices and values broadcast together along the axis, and to x elsewhere.
    x = data((3, 4), "float32", 9)
    got = indexing.scatter_axis(ix.ScatterAxis(S, 0), [x, np.array([[2]]), np.float32(7)
                                                       * np.ones((1, 1), np.float32)], run)
    ref = x.copy()
    ref[2] = 7
    np.testing.assert_array_equal(got, ref)


# -- out of range: the CPU kernel's error, nothing read out of bounds ----------------------------
OUT_OF_RANGE = [
    (ix.Gather(S, (("array", 1),)), lambda x: [x, np.array([0, 6], np.int32)]),
    (ix.Gather(S, (("array", 1),)), lambda x: [x, np.array([-7], np.int64)]),
    (ix.Gather(S, (("array", 1), ("slice", 0, 0, 1))), lambda x: [x, np.array([9], np.int32)]),
    (ix.Gather(S, (("int", 8), ("array", 1))), lambda x: [x, np.array([0], np.int32)]),
    (ix.GatherAxis(S, 1), lambda x: [x, np.array([[5]], np.int32)]),
    (ix.Scatter(S, (("array", 2),), None), lambda x: [x, x[:1], np.array([2, 2**31 - 1])]),
    (ix.Scatter(S, (("array", 2),), "add"), lambda x: [x, x[:1], np.array([-7], np.int32)]),
    (ix.Scatter(S, (("array", 2), ("slice", 0, 0, 1)), "add"),
     lambda x: [x, x[:1, :0], np.array([6], np.int32)]),
    (ix.ScatterAxis(S, 0), lambda x: [x, np.array([[6]], np.int32), x[:1, :1]]),
]


@pytest.mark.parametrize("case", range(len(OUT_OF_RANGE)))
def test_out_of_range_indices_raise_the_cpu_kernels_error(case):
    p, make = OUT_OF_RANGE[case]
    x = data((6, 5), "float32", 10)
    inputs = make(x)
    launcher = indexing.KERNELS[type(p)]
    with pytest.raises(IndexOutOfRangeError) as got:
        launcher(p, inputs, run)
    with pytest.raises(IndexOutOfRangeError) as cpu:
        cpu_indexing.KERNELS[type(p)](p, inputs)
    assert str(got.value) == str(cpu.value)
    assert str(got.value).startswith(f"[{p.name}]") and "out of bounds" in str(got.value)


def test_dtypes_the_kernels_lack_are_unsupported_before_anything_runs():
    calls = []
    x = np.ones((3, 2))
    with pytest.raises(UnsupportedDtype, match="gather_8 has no version for dtype float64"):
        indexing.gather(ix.Gather(S, (("array", 1),)), [x, np.array([0])], calls.append)
    with pytest.raises(UnsupportedDtype, match=r"index arrays\) has no version for dtype uint64"):
        indexing.gather(ix.Gather(S, (("array", 1),)), [x.astype(np.float32),
                                                          np.array([0], np.uint64)], calls.append)
    with pytest.raises(UnsupportedDtype, match="scatter_add has no version for dtype int8"):
        indexing.scatter(ix.Scatter(S, (("array", 2),), "add"),
                         [np.ones(3, np.int8), np.ones(1, np.int8), np.array([0])], calls.append)
    with pytest.raises(UnsupportedDtype, match="copy has no version for dtype float64"):
        shapes.concatenate(sh.Concatenate(S, 0), [np.ones(2, np.float32), np.ones(2)],
                           calls.append)
    assert calls == []


# -- copies through the shim -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_copies_equal_numpy(dtype):
    a = strided(data((5, 4), dtype, 11), "transposed")
    b = strided(data((5, 3), dtype, 12), "sliced")
    c = data((5, 1), dtype, 13)
    np.testing.assert_array_equal(shapes.concatenate(sh.Concatenate(S, 1), [a, b, c], run),
                                  np.concatenate([a, b, c], 1))
    np.testing.assert_array_equal(
        shapes.concatenate(sh.Concatenate(S, 0), [a, a[:0], a[::2]], run),
        np.concatenate([a, a[:0], a[::2]], 0))
    got = shapes.contiguous(sh.Contiguous(S, False), [a], run)
    assert got.flags.c_contiguous and np.array_equal(got, a)
    assert shapes.contiguous(sh.Contiguous(S, True), [a], run) is a   # F order allowed
    v = data((), dtype, 14)
    got = shapes.pad(sh.Pad(S, (0, 1), (1, 0), (2, 3)), [b, v], run)
    np.testing.assert_array_equal(got, np.pad(b, ((1, 2), (0, 3)), constant_values=v))
    p = ix.SliceUpdate(S, (4, 0), (-1, 4), (-2, 3))
    got = shapes.slice_update(p, [a, c[:3, :1]], run)
    ref = a.copy()
    ref[p._key] = c[:3, :1]
    np.testing.assert_array_equal(got, ref)
    got = shapes.dynamic_slice_update(sh.DynamicSliceUpdate(S, (0, 1)),
                                      [a, b[:2, :2], np.array([-2, 1], np.int32)], run)
    ref = a.copy()
    ref[3:5, 1:3] = b[:2, :2]
    np.testing.assert_array_equal(got, ref)
    for k in (0, 2, -1):
        np.testing.assert_array_equal(shapes.diag(sh.Diag(S, k), [a[:, 1]], run),
                                      np.diag(a[:, 1], k))
    got = shapes.KERNELS[sh.Reshape](sh.Reshape(S, (2, -1)), [a], run)
    np.testing.assert_array_equal(got, a.reshape(2, -1))


def test_view_and_reshape_copy_only_when_numpy_must():
    x = data((4, 6), "float32", 15)
    assert np.shares_memory(shapes.KERNELS[sh.Reshape](sh.Reshape(S, (3, 8)), [x], run), x)
    t = x.T
    got = shapes.view(sh.View(S, mx.uint16), [t], run)
    np.testing.assert_array_equal(got, np.ascontiguousarray(t).view(np.uint16))
    got = shapes.KERNELS[sh.Flatten](sh.Flatten(S, 0, 1), [t], run)
    assert not np.shares_memory(got, x) and np.array_equal(got, t.reshape(-1))


def test_a_dynamic_block_leaving_the_array_raises_as_on_the_cpu():
    p = sh.DynamicSliceUpdate(S, (0,))
    inputs = [np.zeros((4, 2), np.float32), np.ones((2, 2), np.float32), np.array([3])]
    with pytest.raises(IndexOutOfRangeError, match=r"\[dynamic_slice_update\]|does not fit"):
        shapes.dynamic_slice_update(p, inputs, run)


# -- through the backend: stream=mx.gpu against the CPU backend ---------------------------------
COVERED = {"Gather", "GatherAxis", "Scatter", "ScatterAxis", "SliceUpdate", "Concatenate", "Pad",
           "Contiguous", "DynamicSliceUpdate", "Diag", "View", "Reshape", "Flatten", "Unflatten"}


def _ops(x, v, i, j):
    """Every covered op on lazyx arrays (the current default stream)."""
    xt = mx.transpose(x)
    return [
        x[i], x[:, j], x[i, 1::2], mx.take(x, j, axis=1), xt[j, i[:2]],
        mx.take_along_axis(x, mx.broadcast_to(i[:, None], (i.shape[0], 5)), axis=0),
        x.at[i].add(v), x.at[i].multiply(v), x.at[i].maximum(v), x.at[i].minimum(v),
        mx.put_along_axis(x, mx.array([[0, 2, -1, 0, 3]]), mx.ones((1, 5), x.dtype), axis=0),
        mx.concatenate([x, xt[:5, :3].T], axis=0), mx.pad(x, ((1, 0), (2, 2))),
        mx.slice_update(x, v[:2], mx.array([1]), (0,)), mx.contiguous(xt),
        mx.reshape(xt, (-1,)), mx.diag(x[0]),
    ]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32", "bool"])
def test_ops_on_the_gpu_stream_equal_the_cpu_backend(on_metal, dtype):
    x = mx.array(data((6, 5), dtype, 16))
    v = mx.array(data((5, 5), dtype, 17))
    i = mx.array(np.array([0, -1, 2, 0, 5], np.int32))
    j = mx.array(np.array([[4, -5], [1, 1]], np.int64))
    if dtype == "bool":   # no multiply/maximum of bools in lazyx's ops: assignment instead
        ops = lambda *a: [o for k, o in enumerate(_ops(*a)) if k not in (7, 8, 9)]  # noqa: E731
    else:
        ops = _ops
    with mx.stream(mx.cpu):
        cpu = [np.asarray(o) for o in ops(x, v, i, j)]
    with mx.stream(mx.gpu):
        got = ops(x, v, i, j)
        mx.eval(*got)
    for n, (g, c) in enumerate(zip(got, cpu)):
        assert g.dtype == _dtype(dtype) and g.shape == c.shape, n
        np.testing.assert_array_equal(np.asarray(g), c, err_msg=f"op {n}")
    # Views (Slice, Transpose, BroadcastTo) and creation ops (Fill) may fall back; none of
    # the primitives these kernels cover does.
    assert not on_metal["cpu_fallback_by_primitive"].keys() & COVERED
    assert on_metal["builtin"] >= len(cpu)


def test_out_of_range_on_the_gpu_stream_raises_as_on_the_cpu(on_metal):
    x = mx.array(data((4, 3), "float32", 18))
    bad = mx.array(np.array([1, 4], np.int32))
    for op in (lambda: x[bad], lambda: x.at[bad].add(1.0), lambda: x[bad] * 2,
               lambda: mx.take_along_axis(x, mx.array([[3, 0, 1]]), axis=1)):
        with pytest.raises(IndexOutOfRangeError) as cpu:
            mx.eval(_on(mx.cpu, op))
        with pytest.raises(IndexOutOfRangeError) as gpu:
            mx.eval(_on(mx.gpu, op))
        assert str(gpu.value) == str(cpu.value)
    assert on_metal["cpu_fallback"] == 0
    # What was computed stays valid.
    np.testing.assert_array_equal(np.asarray(x), data((4, 3), "float32", 18))


def _on(device, op):
    with mx.stream(device):
        return op()


def test_the_kernel_table_covers_the_primitives_and_one_template_per_kind():
    from lazyx.backends.metal import kernels
    for cls in (ix.Gather, ix.GatherAxis, ix.Scatter, ix.ScatterAxis, ix.SliceUpdate,
                sh.Concatenate, sh.Pad, sh.Contiguous, sh.DynamicSliceUpdate, sh.Diag,
                sh.View, sh.Reshape, sh.Flatten, sh.Unflatten):
        assert cls in kernels.KERNELS and mx.kernel_provider("metal", cls.name) != \
            metal.CPU_FALLBACK
    assert indexing.LIBRARY in kernels.LIBRARIES and shapes.LIBRARY in kernels.LIBRARIES
    assert shapes.LIBRARY.source.count("[[kernel]] void") == 1
    assert indexing.LIBRARY.source.count("[[kernel]] void") == 4
