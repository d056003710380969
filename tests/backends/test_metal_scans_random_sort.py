"""The Metal backend's built-in scan, random-bits and sort kernels
(backends/metal/kernels/scans.py, random.py, sorting.py).

Two levels, as tests/backends/test_metal_kernels.py and test_metal_backend.py:

* each launcher with :func:`run_on_cpu` (lazyx's MSL shim, threadgroups as fibers)
  against NumPy float64 references (scans), the CPU kernel bit for bit (random bits)
  and NumPy's stable sort (sorts);
* the backend under ``emulate_on_cpu`` (``stream=mx.gpu``) against the CPU backend,
  counted in ``stats["builtin"]`` with no CPU fallback.

Shapes cover one element, empty arrays, rows that are not powers of two or multiples
of 32, rows longer than a threadgroup (scans: chunks) and than a sort block (merge
passes), strided views and NaNs.
"""

import ml_dtypes
import numpy as np
import pytest

import lazyx.core as mx
from helpers import random_array, rng
from lazyx.backends.cpu.kernels import random as cpu_random
from lazyx.backends.metal import kernels
from lazyx.backends.metal.kernels import UnsupportedDtype, random, scans, sorting
from lazyx.backends.metal.msl_cpu import shim_available
from lazyx.plugins import random as rd
from lazyx.plugins import reductions as red
from lazyx.plugins import sorting as so
from test_metal_backend import on_metal  # noqa: F401 - the emulated backend, stats at zero
from test_metal_kernels import _dtype, layout, run, run_reversed  # views; the shim runners

pytestmark = pytest.mark.skipif(not shim_available(), reason="no C++ compiler for the MSL shim")

S = mx.default_stream(mx.cpu)
F64 = np.float64
HALVES = {"float16", "bfloat16"}
#: Relative error of one rounding to each float dtype, with room for a tree's order.
ROUNDING = {"float32": 2e-6, "float16": 1e-3, "bfloat16": 8e-3}


# -- Scan -------------------------------------------------------------------------------------
_ACCUMULATE = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum,
               "logaddexp": np.logaddexp}


def scan64(x, op, axis, reverse, inclusive):
    """The scan in float64 (integers in their own dtype, wrapping as the kernel's)."""
    wide = x.astype(F64) if x.dtype.kind == "f" or x.dtype == ml_dtypes.bfloat16 else x
    if x.dtype == np.bool_:
        wide = x.astype(np.uint32)
    if reverse:
        wide = np.flip(wide, axis)
    with np.errstate(all="ignore"):
        r = _ACCUMULATE[op].accumulate(wide, axis=axis, dtype=wide.dtype)
    if not inclusive and r.shape[axis]:
        identity = {"sum": 0, "prod": 1, "logaddexp": -np.inf}.get(op)
        if identity is None:
            if wide.dtype.kind == "f":
                identity = -np.inf if op == "max" else np.inf
            else:
                info = np.iinfo(x.dtype if x.dtype != np.bool_ else np.uint32)
                identity = info.min if op == "max" else info.max
        r = np.concatenate([np.full_like(np.take(r, [0], axis), identity),
                            np.take(r, np.arange(r.shape[axis] - 1), axis)], axis)
    return np.flip(r, axis) if reverse else r


# (shape, axis, layout): one element, 37 (not a multiple of 32), a row of 1100 (two
# chunks of a 1024-thread threadgroup), a middle axis, strided views.
SCAN_LAYOUTS = [((1,), 0, "contiguous"), ((3, 37), 1, "contiguous"), ((2, 1100), 1, "contiguous"),
                ((4, 6, 5), 1, "contiguous"), ((6, 45), 1, "transposed"), ((9, 40), 0, "sliced")]
SCAN_CASES = [(op, d) for op, ds in scans.SCAN_DTYPES.items()
              for d in ("float32", "float16", "bfloat16", "int32", "uint32", "bool")
              if _dtype(d) in ds]


def _scan_data(shape, dtype, op, gen):
    d = _dtype(dtype)
    if op == "prod" and dtype in ("int32", "uint32"):
        return gen.choice(np.array([1, 1, 1, 2, 3], d.np), shape)   # wraps in uint32: as NumPy
    if op == "prod" and dtype != "bool":
        return gen.uniform(0.95, 1.05, shape).astype(d.np)
    return random_array(shape, d, gen)


@pytest.mark.parametrize("op, dtype", SCAN_CASES, ids=lambda v: v)
def test_scan_against_float64(op, dtype):
    gen = rng(40)
    for k, (shape, axis, how) in enumerate(SCAN_LAYOUTS):
        x = layout(_scan_data(shape, dtype, op, gen), how)
        for reverse, inclusive in ((False, True), (True, False)) if k else \
                ((False, True), (True, True), (False, False), (True, False)):
            prim = red.Scan(S, op, axis, reverse, inclusive)
            got = scans.scan(prim, [x], run)
            where = f"{op} {dtype} {shape} axis {axis} {how} {reverse=} {inclusive=}"
            assert got.shape == x.shape and got.dtype == x.dtype, where
            expected = scan64(x, op, axis, reverse, inclusive)
            if dtype in HALVES or dtype == "float32":
                # One rounding to the output dtype, plus the float accumulator's rounding at
                # each of n steps, relative to the magnitudes it adds (sum), multiplies (prod)
                # or carries (log-add-exp).
                magnitude = {"sum": np.sum(np.abs(x.astype(F64))), "prod": np.abs(expected),
                             "logaddexp": np.abs(expected) + 1}.get(op, 0.0)
                tol = (ROUNDING[dtype] * np.abs(expected)
                       + 1.2e-7 * x.shape[axis] * magnitude + 1e-30)
                g = got.astype(F64)
                with np.errstate(invalid="ignore"):      # inf - inf: compared as equal below
                    bad = ~(np.abs(g - expected) <= tol) & ~(g == expected)
                assert not bad.any(), f"{where}: got {g[bad][:4]}, expected {expected[bad][:4]}"
            else:   # integers and bool: exact (wrapping as NumPy's)
                np.testing.assert_array_equal(got, expected.astype(got.dtype), err_msg=where)


def test_scan_nan_infinities_and_threads_in_reverse_order():
    x = np.array([[1.0, np.nan, 3.0, -np.inf, 2.0], [-np.inf, -np.inf, 0.5, np.inf, 1.0],
                  [np.inf, np.inf, -1.0, 2.0, np.nan]], np.float32)
    x = np.repeat(x, 15, axis=1)        # 75 per row: three simdgroups
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
        xs = x.astype(dtype)
        for op in ("max", "min", "sum", "logaddexp"):
            for reverse in (False, True):
                got = scans.scan(red.Scan(S, op, 1, reverse, True), [xs], run_reversed)
                expected = scan64(xs, op, 1, reverse, True)
                np.testing.assert_allclose(got.astype(F64), expected, rtol=1e-2,
                                           err_msg=f"{op} {dtype} reverse={reverse}")


def test_scan_of_empty_arrays_and_unsupported_dtypes():
    for shape, axis in (((0, 5), 0), ((3, 0), 1), ((0,), 0)):
        got = scans.scan(red.Scan(S, "sum", axis, False, True), [np.ones(shape, np.float32)], run)
        assert got.shape == shape and got.dtype == np.float32
    with pytest.raises(UnsupportedDtype, match="scan_sum has no version for dtype int64; it has "
                                               "bool, int32, uint32, float32, float16, bfloat16"):
        scans.scan(red.Scan(S, "sum", 0, False, True), [np.ones(3, np.int64)], run)
    with pytest.raises(UnsupportedDtype, match="scan_logaddexp has no version for dtype int32"):
        scans.scan(red.Scan(S, "logaddexp", 0, False, True), [np.ones(3, np.int32)], run)


# -- RandomBits -------------------------------------------------------------------------------
def _keys(shape, seed):
    return np.random.default_rng(seed).integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32)


@pytest.mark.parametrize("width", [1, 2, 4, 8])
def test_random_bits_equal_the_cpu_kernel_bit_for_bit(width):
    strided = _keys((2, 3), 3).T                                # (3, 2), a transposed view
    assert not strided.flags.c_contiguous
    key_batches = [_keys((2,), 1), _keys((3, 2), 2), _keys((2, 2, 2), 4), strided,
                   _keys((0, 2), 5)]
    for keys in key_batches:
        # odd and even word counts, a byte count not a multiple of 4, several threadgroups
        for shape in ((), (1,), (5,), (3, 7), (1000,), (0,)):
            prim = rd.RandomBits(S, shape, width)
            got = random.random_bits(prim, [keys], run)
            want = cpu_random.KERNELS[rd.RandomBits](prim, [keys])
            where = f"keys {keys.shape} shape {shape} width {width}"
            assert got.dtype == want.dtype and got.shape == want.shape, where
            np.testing.assert_array_equal(got, want, err_msg=where)


def test_random_bits_refuse_keys_that_are_not_uint32():
    with pytest.raises(UnsupportedDtype, match="random_bits has no version for dtype int32"):
        random.random_bits(rd.RandomBits(S, (3,), 4), [np.zeros(2, np.int32)], run)


# -- Sort, ArgSort, Partition, ArgPartition ----------------------------------------------------
SORT_DTYPES = ["float32", "float16", "bfloat16", "int32", "uint32", "bool", "int64", "uint8"]


def _sort_data(shape, dtype, gen):
    """Few distinct values (ties: the index decides) and, for floats, NaNs and -0.0."""
    d = _dtype(dtype)
    if dtype in ("int64", "uint8"):
        return gen.integers(0, 5, shape).astype(d.np)
    x = random_array(shape, d, gen, -3, 3)
    if d.kind == "f" or dtype == "bfloat16":
        x = np.floor(x.astype(np.float32) * 2) / 2
        flat = x.reshape(-1)
        flat[::7] = np.nan
        flat[3::11] = -0.0
        x = flat.reshape(shape).astype(d.np)
    return x


def _numpy_sorted(x, axis):
    """NumPy's stable sort of ``x`` (bfloat16 through float32, as the CPU backend)."""
    wide = x.astype(np.float32) if x.dtype == ml_dtypes.bfloat16 else x
    idx = np.argsort(wide, axis=axis, kind="stable")
    return np.take_along_axis(x, idx, axis), idx


SORT_LAYOUTS = [((1,), 0, "contiguous"), ((5, 37), 1, "contiguous"), ((37, 5), 0, "contiguous"),
                ((3, 4, 6), 1, "contiguous"), ((6, 45), 1, "transposed"), ((9, 40), 0, "sliced")]


def _same(got, want, where):
    np.testing.assert_array_equal(got.astype(F64) if got.dtype == ml_dtypes.bfloat16 else got,
                                  want.astype(F64) if want.dtype == ml_dtypes.bfloat16 else want,
                                  err_msg=where)


@pytest.mark.parametrize("dtype", SORT_DTYPES)
def test_sort_and_argsort_equal_numpys_stable_sort(dtype):
    gen = rng(41)
    for shape, axis, how in SORT_LAYOUTS:
        x = layout(_sort_data(shape, dtype, gen), how)
        values, indices = _numpy_sorted(x, axis)
        where = f"{dtype} {shape} axis {axis} {how}"
        got = sorting.sort(so.Sort(S, axis), [x], run)
        assert got.dtype == x.dtype and got.shape == x.shape, where
        _same(got, values, where)
        got = sorting.argsort(so.ArgSort(S, axis), [x], run_reversed)
        assert got.dtype == np.uint32, where
        np.testing.assert_array_equal(got, indices, err_msg=where)


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_rows_longer_than_a_block_merge(dtype):
    # 2 * 2048 + 700 elements: three blocks, two merge passes (a run without a partner).
    gen = rng(42)
    x = _sort_data((2, 2 * sorting.BLOCK + 700), dtype, gen)
    for xs, axis in ((x, 1), (x.T, 0)):
        values, indices = _numpy_sorted(xs, axis)
        _same(sorting.sort(so.Sort(S, axis), [xs], run), values, f"{dtype} axis {axis}")
        np.testing.assert_array_equal(sorting.argsort(so.ArgSort(S, axis), [xs], run), indices)


def test_partition_is_a_sort_with_numpys_kth_element():
    gen = rng(43)
    x = _sort_data((4, 53), "float32", gen)
    for kth in (0, 17, 52):
        got = sorting.partition(so.Partition(S, 1, kth), [x], run)
        want = np.partition(x, kth, axis=1)
        _same(got[:, kth], want[:, kth], f"kth {kth}")
        idx = sorting.argpartition(so.ArgPartition(S, 1, kth), [x], run)
        _same(np.take_along_axis(x, idx.astype(np.int64), 1)[:, kth], want[:, kth], f"arg {kth}")
        _same(got, np.sort(x, axis=1), "partition is the sorted row")


def test_topk_is_the_sorts_last_k():
    # In no particular order (MLX's and the CPU's orders differ): the same multiset.
    gen = rng(46)
    for dtype in ("float32", "float16", "int32"):
        x = _sort_data((4, 2600), dtype, gen)        # rows past a block: the merge passes
        for axis, k in ((1, 0), (1, 7), (1, 2600), (0, 3)):
            got = sorting.topk(so.TopK(S, axis, k), [x], run)
            want = np.sort(x, axis=axis).take(range(x.shape[axis] - k, x.shape[axis]), axis)
            assert got.shape == want.shape and got.dtype == x.dtype
            _same(np.sort(got, axis=axis), want, f"topk {dtype} axis {axis} k {k}")


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "uint8", "bool"])
def test_searchsorted_is_numpys(dtype):
    gen = rng(47)
    seq = np.sort(_sort_data((37,), dtype, gen))
    values = _sort_data((5, 9), dtype, gen)
    if dtype.startswith("float"):
        seq[-2:] = np.nan                            # NaNs sort last: both sides count them
        values[0, :3] = [np.nan, seq[0], seq[10]]
    else:
        values[0, :2] = [seq[0], seq[10]]            # ties: left and right differ
    for side in ("left", "right"):
        for vals in (values, values.T, values[::2, ::-1]):   # any layout of the values
            got = sorting.searchsorted(so.SearchSorted(S, side), [seq, vals], run)
            assert got.dtype == np.uint32 and got.shape == vals.shape
            np.testing.assert_array_equal(got, np.searchsorted(seq, vals, side=side))
        # a strided sequence, and an empty one
        wide = np.repeat(seq, 2)[::2]
        np.testing.assert_array_equal(
            sorting.searchsorted(so.SearchSorted(S, side), [wide, values], run),
            np.searchsorted(wide, values, side=side))
        np.testing.assert_array_equal(
            sorting.searchsorted(so.SearchSorted(S, side), [seq[:0], values], run), 0)


def test_sort_of_empty_arrays_and_unsupported_dtypes():
    for shape, axis in (((0, 5), 1), ((3, 0), 1), ((0,), 0)):
        assert sorting.sort(so.Sort(S, axis), [np.ones(shape, np.float32)], run).shape == shape
        assert sorting.argsort(so.ArgSort(S, axis), [np.ones(shape, np.int32)], run).dtype == \
            np.uint32
    with pytest.raises(UnsupportedDtype, match="argsort has no version for dtype float64"):
        sorting.argsort(so.ArgSort(S, 0), [np.ones(3)], run)


def test_the_table_lists_the_kernels_and_their_libraries():
    assert kernels.KERNELS[red.Scan] is scans.scan
    assert kernels.KERNELS[rd.RandomBits] is random.random_bits
    assert kernels.KERNELS[so.ArgPartition] is sorting.argpartition
    assert kernels.KERNELS[so.TopK] is sorting.topk
    assert kernels.KERNELS[so.SearchSorted] is sorting.searchsorted
    for library in (scans.LIBRARY, random.LIBRARY, sorting.LIBRARY):
        assert library in kernels.LIBRARIES
        # Templates instantiated from tables: one kernel text per kind, whatever the dtype
        # (scans; random bits; sorting's block sort, merge and search).
        assert library.source.count("[[kernel]] void") <= 3


# -- through the backend (emulated) against the CPU backend -----------------------------------
def _both(fn, *arrays):
    """``fn`` on the CPU stream and on the GPU stream: (cpu, gpu) NumPy results."""
    return tuple(np.asarray(fn(*arrays, stream=s)) for s in (mx.cpu, mx.gpu))


def test_scans_through_the_backend(on_metal):
    gen = rng(44)
    calls = 0
    for dtype in ("float32", "float16", "int32"):
        x = mx.array(random_array((6, 45), _dtype(dtype), gen, -2, 2))
        xt = mx.transpose(x)
        for name in ("cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"):
            for a, axis, reverse, inclusive in ((x, 1, False, True), (xt, 0, True, False)):
                fn = getattr(mx, name)
                cpu, gpu = _both(lambda v, stream: fn(v, axis=axis, reverse=reverse,
                                                      inclusive=inclusive, stream=stream), a)
                calls += 1
                where = f"{name} {dtype} axis {axis}"
                assert gpu.dtype == cpu.dtype and gpu.shape == cpu.shape, where
                if cpu.dtype.kind in "iub":
                    np.testing.assert_array_equal(gpu, cpu, err_msg=where)
                else:
                    rtol = {"float32": 1e-5, "float16": 2e-3}[cpu.dtype.name]
                    np.testing.assert_allclose(gpu.astype(F64), cpu.astype(F64), rtol=rtol,
                                               atol=rtol * 4, err_msg=where)
    assert on_metal["cpu_fallback"] == 0 and on_metal["builtin"] >= calls
    # int64 has no Metal scan: the CPU's kernel runs, counted.
    big = mx.array(np.arange(10, dtype=np.int64))
    np.testing.assert_array_equal(np.asarray(mx.cumsum(big, stream=mx.gpu)),
                                  np.cumsum(np.arange(10)))
    assert on_metal["cpu_fallback_by_primitive"] == {"Scan": 1}


def test_random_bits_through_the_backend_equal_the_cpu_bit_for_bit(on_metal):
    key = mx.random.key(7)
    for width in (1, 2, 4, 8):
        for shape in ((), (3,), (5, 3)):
            cpu, gpu = _both(lambda k, stream: rd.bits(shape, width, k, stream=stream), key)
            assert gpu.dtype == cpu.dtype and gpu.shape == cpu.shape
            np.testing.assert_array_equal(gpu, cpu, err_msg=f"{shape} width {width}")
    cpu, gpu = _both(lambda k, stream: mx.random.split(k, 5, stream=stream), key)
    np.testing.assert_array_equal(gpu, cpu)
    # A batch of keys (vmap) and the distributions built on the bits.
    keys = mx.random.split(key, 3, stream=mx.cpu)
    cpu, gpu = _both(lambda k, stream: mx.vmap(lambda kk: rd.bits((9,), 2, kk, stream=stream))(k),
                     keys)
    np.testing.assert_array_equal(gpu, cpu)
    cpu, gpu = _both(lambda k, stream: mx.random.randint(0, 1000, (40,), key=k, stream=stream), key)
    np.testing.assert_array_equal(gpu, cpu)
    assert on_metal["cpu_fallback"] == 0 and on_metal["builtin"] >= 14


def test_sorts_through_the_backend(on_metal):
    gen = rng(45)
    for dtype in ("float32", "bfloat16", "int32", "bool"):
        x = mx.array(_sort_data((7, 33), dtype, gen))
        xt = mx.transpose(x)
        for a, axis in ((x, -1), (xt, 0), (x, None)):
            for name in ("sort", "argsort"):
                fn = getattr(mx, name)
                cpu, gpu = _both(lambda v, stream: fn(v, axis=axis, stream=stream), a)
                assert gpu.dtype == cpu.dtype and gpu.shape == cpu.shape
                _same(gpu, cpu, f"{name} {dtype} axis {axis}")
        ordered = mx.sort(mx.reshape(x, (-1,)), stream=mx.cpu)
        cpu, gpu = _both(lambda v, stream: mx.searchsorted(ordered, v, side="right",
                                                           stream=stream), x)
        _same(gpu, cpu, f"searchsorted {dtype}")
        cpu, gpu = _both(lambda v, stream: mx.topk(v, 4, axis=-1, stream=stream), x)
        _same(np.sort(gpu, -1), np.sort(cpu, -1), f"topk {dtype}")
        cpu, gpu = _both(lambda v, stream: mx.partition(v, 5, axis=-1, stream=stream), x)
        _same(gpu[:, 5], cpu[:, 5], f"partition {dtype}")
        cpu, gpu = _both(lambda v, stream: mx.argpartition(v, 5, axis=-1, stream=stream), x)
        kth = np.take_along_axis(np.asarray(x), gpu.astype(np.int64), -1)[:, 5]
        _same(kth, np.take_along_axis(np.asarray(x), cpu.astype(np.int64), -1)[:, 5], dtype)
    assert on_metal["cpu_fallback"] == 0 and on_metal["builtin"] >= 4 * 10
