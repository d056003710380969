"""The Metal backend's built-in MSL kernels (backends/metal/kernels/), run through lazyx's
MSL shim on the CPU (their threadgroups as fibers: barriers, SIMD-group functions and
threadgroup memory as on a GPU) and compared with NumPy float64 references."""

import ml_dtypes
import numpy as np
import pytest

import lazyx.core as mx
from lazyx.backends.metal import kernels
from lazyx.backends.metal.kernels import reductions, run_on_cpu, softmax
from lazyx.backends.metal.msl_cpu import shim_available
from lazyx.errors import DtypeError
from lazyx.plugins import products as pr
from lazyx.plugins import reductions as rd

from helpers import random_array, rng

pytestmark = pytest.mark.skipif(not shim_available(), reason="no C++ compiler for the MSL shim")

S = mx.default_stream(mx.cpu)
F64 = np.float64
HALVES = {"float16", "bfloat16"}
#: Relative error of one rounding to each float dtype (the output's), with room for
#: the different order of a parallel sum.
ROUNDING = {"float32": 2e-6, "float16": 1e-3, "bfloat16": 8e-3}
#: The spacing of each dtype's subnormals (float16's start at 6e-5).
SUBNORMAL = {"float32": 0.0, "float16": 2.0 ** -24, "bfloat16": 0.0}


def run(dispatch):
    run_on_cpu(dispatch)


def run_reversed(dispatch):
    run_on_cpu(dispatch, schedule="reverse")


# (shape, axes, how the input is laid out): 1 element, sizes that are not multiples of
# 32, rows longer than a threadgroup (1024), the column kernel, strided views.
LAYOUTS = [
    ((1,), (0,), "contiguous"),
    ((37,), (0,), "contiguous"),
    ((3, 2500), (1,), "contiguous"),
    ((45, 6), (0,), "contiguous"),              # leading axis: the column kernel
    ((4, 6, 5), (0, 1), "contiguous"),          # leading axes: the column kernel
    ((4, 6, 5), (0, 2), "contiguous"),          # rows of a strided walk
    ((5, 70), (0, 1), "contiguous"),            # everything
    ((6, 45), (1,), "transposed"),              # rows along a non-unit stride
    ((9, 40), (0,), "sliced"),                  # leading axis, not contiguous: rows
]


def layout(x, how):
    if how == "transposed":
        return np.ascontiguousarray(x.T).T
    if how == "sliced":
        wide = np.zeros((x.shape[0], 2 * x.shape[1]), x.dtype)
        wide[:, ::2] = x
        return wide[:, ::2]
    return x


def data(shape, dtype, gen, op=None):
    """Inputs for ``op``: products of numbers near 1 (or +-1 for integers), so that
    nothing overflows over 2500 elements."""
    d = _dtype(dtype)
    if op == "prod":
        if dtype == "int32":
            return gen.choice(np.array([-1, 1], np.int32), shape)
        if dtype != "bool":
            return gen.uniform(0.9, 1.1, shape).astype(d.np)
    return random_array(shape, d, gen)


def _dtype(name):
    return getattr(mx, "bool_" if name == "bool" else name)


def check_close(got, expected, dtype, scale):
    """``got`` within the output dtype's rounding of ``expected`` (float64), plus the float32
    accumulator's error over values of total magnitude ``scale``."""
    got = got.astype(F64)
    tol = ROUNDING[dtype] * np.abs(expected) + 1e-6 * scale + SUBNORMAL[dtype] + 1e-30
    bad = ~(np.abs(got - expected) <= tol) & ~(np.isinf(expected) & (got == expected))
    assert not bad.any(), f"{dtype}: got {got[bad][:5]}, expected {expected[bad][:5]}"


REDUCE_CASES = [(op, d) for op, ds in reductions.REDUCE_DTYPES.items()
                for d in ("float32", "float16", "bfloat16", "int32", "uint32", "bool")
                if _dtype(d) in ds]


@pytest.mark.parametrize("op, dtype", REDUCE_CASES, ids=lambda v: v)
def test_reduce(op, dtype):
    gen = rng(10)
    for shape, axes, how in LAYOUTS:
        x = layout(data(shape, dtype, gen, op), how)
        for keepdims in (False, True) if shape == (4, 6, 5) else (False,):
            prim = rd.Reduce(S, op, axes, keepdims)
            got = reductions.reduce(prim, [x], run)
            where = f"{op} {dtype} {shape} axes {axes} {how}"
            assert got.shape == rd.reduced_shape(shape, axes, keepdims), where
            expected_dtype = {"all": np.bool_, "any": np.bool_}.get(
                op, rd.SUM_DTYPE.get(_dtype(dtype), _dtype(dtype)).np if op in ("sum", "prod")
                else x.dtype)
            assert got.dtype == np.dtype(expected_dtype), where
            wide = x.astype(F64) if dtype in HALVES or dtype == "float32" else x
            fn = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min,
                  "all": np.all, "any": np.any}[op]
            expected = fn(wide, axis=axes, keepdims=keepdims)
            if dtype in HALVES | {"float32"} and op in ("sum", "prod"):
                scale = np.sum(np.abs(wide), axis=axes, keepdims=keepdims)
                check_close(got, expected, dtype, scale)
            else:   # integers, bool, max and min: exact
                np.testing.assert_array_equal(got, expected.astype(got.dtype), err_msg=where)


@pytest.mark.parametrize("shape, axes", [((3, 2500), (1,)), ((40, 6), (0,)), ((6, 40), (0, 1))])
def test_reduce_in_reverse_order(shape, axes):
    # The threads of a threadgroup run in the opposite order between barriers: a kernel
    # that read another thread's value before a barrier guaranteed it would differ.
    x = random_array(shape, mx.float32, rng(11))
    for op, fn in (("sum", np.sum), ("max", np.max)):
        got = reductions.reduce(rd.Reduce(S, op, axes, False), [x], run_reversed)
        np.testing.assert_allclose(got, fn(x.astype(F64), axis=axes), rtol=1e-5, atol=1e-4)


def test_reduce_nan_and_infinities():
    x = np.array([[1.0, np.nan, 3.0, -np.inf], [np.inf, -1.0, 2.0, 0.5], [-np.inf] * 4],
                 np.float32)
    x = np.repeat(x, 20, axis=1)          # 80 per row: three simdgroups per threadgroup
    for op, fn in (("max", np.max), ("min", np.min), ("sum", np.sum)):
        for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
            xs = x.astype(dtype)
            for axis in (0, 1):       # the column kernel and the row kernel
                got = reductions.reduce(rd.Reduce(S, op, (axis,), False), [xs], run)
                with np.errstate(invalid="ignore"):
                    expected = fn(x.astype(F64), axis=axis)
                np.testing.assert_array_equal(got.astype(F64), expected, err_msg=f"{op} {dtype}")
    got = reductions.reduce(rd.Reduce(S, "any", (1,), False), [x], run)
    assert got.tolist() == [True, True, True]            # NaN and inf are true
    got = reductions.reduce(rd.Reduce(S, "all", (1,), False), [np.array([[np.nan, 0.0]])
                                                            .astype(np.float32)], run)
    assert got.tolist() == [False]


def test_reduce_over_an_empty_axis_gives_the_identity():
    for op, value in (("sum", 0), ("prod", 1), ("all", True), ("any", False)):
        for shape, axes in (((0, 5), (0,)), ((3, 0), (1,))):
            got = reductions.reduce(rd.Reduce(S, op, axes, False), [np.ones(shape, np.float32)], run)
            assert got.tolist() == [value] * got.size, (op, shape)
    assert reductions.reduce(rd.Reduce(S, "sum", (1,), False), [np.ones((0, 4), np.float32)],
                             run).shape == (0,)


ARG_CASES = [("argmax", d) for d in ("float32", "float16", "bfloat16", "int32", "bool")] + \
            [("argmin", d) for d in ("float32", "int32")]


@pytest.mark.parametrize("op, dtype", ARG_CASES, ids=lambda v: v)
def test_arg_reduce(op, dtype):
    gen = rng(12)
    fn = {"argmax": np.argmax, "argmin": np.argmin}[op]
    for shape, axis, keepdims in [((1,), None, False), ((37,), 0, False), ((3, 2500), 1, False),
                                  ((45, 6), 0, True), ((4, 6, 5), 1, False), ((5, 70), None, True)]:
        # Few distinct values: many ties, where the first index must win.
        x = random_array(shape, _dtype(dtype), gen, 0, 4)
        if dtype != "bool":
            x = np.floor(x.astype(np.float32)).astype(x.dtype)
        prim = rd.ArgReduce(S, op, axis, keepdims)
        got = reductions.arg_reduce(prim, [x], run)
        expected = fn(x.astype(np.float32) if dtype != "bool" else x, axis=axis, keepdims=keepdims)
        assert got.dtype == np.uint32
        np.testing.assert_array_equal(got, np.asarray(expected), err_msg=f"{shape} {axis}")


def test_arg_reduce_nan_wins_and_strided_input():
    x = rng(13).standard_normal((6, 300)).astype(np.float32)
    x[1, 200], x[1, 250], x[2, 5] = np.nan, np.nan, np.nan
    x[3, 299] = np.nan
    for op, fn in (("argmax", np.argmax), ("argmin", np.argmin)):
        for xs in (x, np.ascontiguousarray(x.T).T, x.astype(np.float16)):
            got = reductions.arg_reduce(rd.ArgReduce(S, op, 1, False), [xs], run_reversed)
            np.testing.assert_array_equal(got, fn(xs, axis=1), err_msg=op)
        got = reductions.arg_reduce(rd.ArgReduce(S, op, 0, False), [x], run)
        np.testing.assert_array_equal(got, fn(x, axis=0))


def _softmax64(x, axes):
    x = x.astype(F64)
    m = np.max(x, axis=axes, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axes, keepdims=True)


def _logsumexp64(x, axes, keepdims):
    x = x.astype(F64)
    m = np.max(x, axis=axes, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    r = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
    return r if keepdims else np.squeeze(r, axis=axes)


ROW_LAYOUTS = [((1, 1), (1,), "contiguous"), ((3, 37), (1,), "contiguous"),
               ((2, 2500), (1,), "contiguous"), ((4, 6, 5), (1,), "contiguous"),
               ((4, 6, 5), (1, 2), "contiguous"), ((6, 45), (1,), "transposed"),
               ((9, 40), (0,), "sliced")]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_softmax_and_logsumexp(dtype):
    gen = rng(14)
    for shape, axes, how in ROW_LAYOUTS:
        x = layout(random_array(shape, _dtype(dtype), gen, -6, 6), how)
        got = softmax.softmax(pr.Softmax(S, axes, False), [x], run)
        assert got.dtype == x.dtype and got.shape == shape
        check_close(got, _softmax64(x, axes), dtype, 1e-3)
        for keepdims in (False, True):
            got = softmax.logsumexp(rd.LogSumExp(S, axes, keepdims), [x], run)
            assert got.dtype == x.dtype
            expected = _logsumexp64(x, axes, keepdims)
            assert got.shape == expected.shape
            check_close(got, expected, dtype, np.abs(expected) + 1)


def test_softmax_and_logsumexp_nan_and_infinities():
    x = np.array([[0.0, 1.0, np.nan, 2.0], [-np.inf, -np.inf, -np.inf, -np.inf],
                  [np.inf, 1.0, 2.0, 3.0], [1e30, -1e30, 1e30, 0.0], [100.0, 0.0, -100.0, 50.0]],
                 np.float32)
    for dtype in (np.float32, np.float16):
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            xs = x.astype(dtype)
            expected = _logsumexp64(xs, (1,), False)
            probabilities = _softmax64(xs, (1,))
        got = softmax.logsumexp(rd.LogSumExp(S, (1,), False), [xs], run_reversed)
        np.testing.assert_allclose(got.astype(F64), expected, rtol=1e-3)
        got = softmax.softmax(pr.Softmax(S, (1,), False), [xs], run_reversed)
        np.testing.assert_allclose(got.astype(F64), probabilities, rtol=1e-3, atol=1e-7)


def test_unsupported_dtypes_name_the_kernel_and_the_dtypes_it_has():
    with pytest.raises(DtypeError, match="softmax has no version for dtype float64; it has "
                                         "float32, float16, bfloat16"):
        softmax.softmax(pr.Softmax(S, (0,), False), [np.ones(3)], run)
    with pytest.raises(DtypeError, match="reduce_max has no version for dtype bool"):
        reductions.reduce(rd.Reduce(S, "max", (0,), False), [np.ones(3, bool)], run)


def test_the_table_and_the_libraries():
    assert kernels.KERNELS[rd.Reduce] is reductions.reduce
    assert {rd.Reduce, rd.ArgReduce, rd.LogSumExp, pr.Softmax} <= set(kernels.KERNELS)
    import re
    for library in kernels.LIBRARIES:
        # Templates instantiated from tables: one kernel text per kind, whatever the dtype
        # (each name once, no dtype in it), instantiated from the tables (random bits: a
        # plain kernel of uint32 keys).
        templates = re.findall(r"\[\[kernel\]\] void (\w+)\(", library.source)
        assert templates and len(templates) == len(set(templates)), library.name
        for name in templates:
            assert not re.search(r"float|half|bfloat|int\d", name), (library.name, name)
            assert library.name == "random" or f"decltype({name}<" in library.source, name
        # (shapes' copies move bytes: one instantiation per element size, no dtype names;
        # random bits hash uint32 keys into bytes: one kernel, no dtype; FFTs read only
        # complex64 and float32, the dtypes the fft pack casts to.)
        assert library.name in ("shapes", "random", "fft") or ("float16" in library.source
                                                        and "bfloat16" in library.source)
