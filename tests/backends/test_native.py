"""The cpu backend's native kernels against float64 NumPy and the reference kernels.

The module's functions are checked directly (row lengths around the vector
width and block size, extreme values, threads) and through the backend's
kernels, which must fall back to the NumPy kernel for every layout they do not
cover and still agree with the ``cpu-reference`` backend.
"""

import os
import threading

import ml_dtypes
import numpy as np
import pytest

import lazyx.core as mx
from lazyx.backend import backends
from lazyx.backends.cpu import native_kernels
from helpers import (FLOAT_DTYPES, TOLERANCES, assert_close, random_array, run_in_threads,
                     to_lazyx)

native = native_kernels.load()
pytestmark = pytest.mark.skipif(native is None, reason="the native module was not built")

HALF_DTYPES = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
NATIVE_DTYPES = ["float32", "float16", "bfloat16"]
ROW_LENGTHS = [1, 3, 15, 16, 17, 255, 256, 257, 1000]


def np_dtype(name):
    return HALF_DTYPES.get(name, np.dtype(name))


def run_native(prefix, x, n, reduces):
    """Call the module's ``<prefix>_<dtype>`` on rows of ``n`` elements of ``x``."""
    fn = getattr(native, f"{prefix}_{x.dtype.name}")
    out = np.empty((x.size // n,) if reduces else x.shape, x.dtype)
    if x.dtype.itemsize == 2:
        fn(x.view(np.uint16), out.view(np.uint16), n)
    else:
        fn(x, out, n)
    return out


def softmax64(x):
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)


def logsumexp64(x):
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m = x.max(-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0)
        return (np.log(np.exp(x - m).sum(-1, keepdims=True)) + m)[..., 0]


def assert_matches(got, expected64):
    """``got`` (a NumPy array of dtype d) equals the float64 ``expected64`` rounded to d."""
    r, a = TOLERANCES[got.dtype.name]
    np.testing.assert_allclose(got.astype(np.float64), expected64.astype(got.dtype).astype(np.float64),
                               rtol=r, atol=a, equal_nan=True)


@pytest.fixture
def threads():
    """Set the module's thread count for one test."""
    previous = native.get_num_threads()
    yield native.set_num_threads
    native.set_num_threads(previous)


# -- the module's functions ------------------------------------------------------
@pytest.mark.parametrize("dtype", NATIVE_DTYPES)
@pytest.mark.parametrize("n", ROW_LENGTHS)
def test_softmax_and_logsumexp_rows(dtype, n):
    x = np.random.default_rng(n).normal(0, 3, (7, n)).astype(np_dtype(dtype))
    s = run_native("softmax", x, n, False)
    assert s.dtype == x.dtype and s.shape == x.shape
    assert_matches(s, softmax64(x))
    lse = run_native("logsumexp", x, n, True)
    assert lse.dtype == x.dtype and lse.shape == (7,)
    assert_matches(lse, logsumexp64(x))


@pytest.mark.parametrize("dtype", NATIVE_DTYPES)
@pytest.mark.parametrize("n", [1, 2, 7, 10, 16, 17, 31, 32, 33])
def test_many_short_rows(dtype, n):
    """Rows short enough to be taken a vector's width of rows at a time (one row per lane:
    8 with AVX2, 16 with AVX-512), a row count that leaves a tail, and degenerate rows
    (a NaN, +inf, all -inf) in the middle of a group and in the tail."""
    x = np.random.default_rng(n).normal(0, 3, (37, n))
    x[3, n // 2] = np.nan
    x[9, 0] = np.inf
    x[12] = -np.inf
    x[20, -1] = -np.inf
    x[35, 0] = np.nan
    x = x.astype(np_dtype(dtype))
    s = run_native("softmax", x, n, False)
    ref = softmax64(x)
    assert_matches(s, ref)
    np.testing.assert_array_equal(np.isnan(s.astype(np.float64)), np.isnan(ref))
    lse = run_native("logsumexp", x, n, True).astype(np.float64)
    np.testing.assert_array_equal(lse[[3, 9, 12, 35]], [np.nan, np.inf, -np.inf, np.nan])
    assert_matches(lse.astype(x.dtype), logsumexp64(x))


@pytest.mark.parametrize("num_threads", [1, 2, 7])
def test_short_rows_over_threads(threads, num_threads):
    threads(num_threads)
    x = random_array((50_001, 10), mx.float32, low=-20, high=20)  # enough work for 3 threads
    assert_matches(run_native("softmax", x, 10, False), softmax64(x))
    assert_matches(run_native("logsumexp", x, 10, True), logsumexp64(x))


@pytest.mark.parametrize("dtype", NATIVE_DTYPES)
def test_rows_of_length_one(dtype):
    x = np.array([[-3.0], [0.0], [1e4], [-np.inf], [np.inf]], np_dtype(dtype))
    s = run_native("softmax", x, 1, False).astype(np.float64)
    np.testing.assert_array_equal(s[:3, 0], [1.0, 1.0, 1.0])
    assert np.isnan(s[3:]).all()  # exp(x - max) is inf - inf there, as in NumPy
    lse = run_native("logsumexp", x, 1, True).astype(np.float64)
    np.testing.assert_array_equal(lse, x[:, 0].astype(np.float64))


def test_huge_values_are_stable():
    x = np.array([[3e38, 3e38, -3e38, 1e38], [1e4, 1e4 + 1, 1e4 - 1, -1e4],
                  [-1e30, -1e30 + 1e24, -2e30, -1e30]], np.float32)
    s = run_native("softmax", x, 4, False)
    assert np.isfinite(s).all()
    assert_matches(s, softmax64(x))
    lse = run_native("logsumexp", x, 4, True)
    assert_matches(lse, logsumexp64(x))


@pytest.mark.parametrize("dtype", NATIVE_DTYPES)
def test_infinities_and_nan(dtype):
    inf, nan = np.inf, np.nan
    x = np.array([[1.0, -inf, 2.0, -inf], [-inf] * 4, [inf, 1.0, 2.0, 3.0],
                  [nan, 1.0, 2.0, 3.0], [inf, nan, -inf, 0.0], [-inf, -inf, 5.0, -inf]],
                 np_dtype(dtype))
    s = run_native("softmax", x, 4, False).astype(np.float64)
    ref = softmax64(x)
    np.testing.assert_array_equal(s[[0, 5]] == 0, ref[[0, 5]] == 0)  # exp(-inf) is exactly 0
    assert_matches(s.astype(x.dtype), ref)
    assert np.isnan(s[1:5]).all()
    lse = run_native("logsumexp", x, 4, True).astype(np.float64)
    np.testing.assert_array_equal(lse[1:], [-inf, inf, nan, nan, 5.0])


@pytest.mark.parametrize("num_threads", [1, 2, 3, 7])
def test_threads_and_odd_row_counts(threads, num_threads):
    threads(num_threads)
    x = random_array((13, 40_001), mx.float32, low=-20, high=20)  # enough work for 7 threads
    assert_matches(run_native("softmax", x, 40_001, False), softmax64(x))
    assert_matches(run_native("logsumexp", x, 40_001, True), logsumexp64(x))
    s = run_native("sum", x, 40_001, True)
    np.testing.assert_allclose(s, x.astype(np.float64).sum(-1), rtol=1e-5, atol=1e-6 * np.abs(x).sum())
    # One long row splits across threads.
    y = x.reshape(-1)
    total = run_native("sum", y, y.size, True)[0]
    np.testing.assert_allclose(total, y.astype(np.float64).sum(), rtol=1e-5, atol=1e-6 * np.abs(y).sum())


def test_kernels_called_from_several_threads_at_once(threads):
    threads(2)
    x = random_array((64, 9_000), mx.float32, low=-10, high=10)
    expected = softmax64(x)

    def work(_):
        for _ in range(3):
            assert_matches(run_native("softmax", x, 9_000, False), expected)

    run_in_threads(work, 4)


def test_parked_helpers_wake_for_the_next_kernel(threads):
    # park_threads (called before BLAS products) sends spinning helpers to sleep; the
    # next parallel kernels must still get every chunk done, parked or not, while
    # another thread parks them at random moments.
    threads(2)
    x = random_array((13, 40_001), mx.float32, low=-20, high=20)
    expected = softmax64(x)
    stop = threading.Event()

    def parker():
        while not stop.is_set():
            native.park_threads()

    t = threading.Thread(target=parker)
    t.start()
    try:
        for i in range(20):
            if i % 3 == 0:
                native.park_threads()
            assert_matches(run_native("softmax", x, 40_001, False), expected)
    finally:
        stop.set()
        t.join()


def test_products_park_the_helpers_before_blas(monkeypatch):
    # The cpu backend's BLAS products park the pool's helpers (the work threshold
    # skips small ones); the result is the product either way.
    from lazyx.backends.cpu.kernels import products
    calls = []
    monkeypatch.setattr(products, "_park", lambda: calls.append(1))
    a = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((128, 64)).astype(np.float32)
    out, _ = products._product(a, b)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert calls == [1]
    products._product(a[:4, :8], b[:8, :4])
    assert calls == [1]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_threaded_kernels_work_in_a_forked_child(threads):
    threads(2)
    x = random_array((64, 9_000), mx.float32)
    parent = run_native("softmax", x, 9_000, False)  # starts the helper threads
    pid = os.fork()
    if pid == 0:  # the child has none of the parent's helpers
        ok = np.array_equal(run_native("softmax", x, 9_000, False), parent)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (1, 300_001), (5, 70_000), (70_000, 3)])
def test_sum_rows(shape):
    x = random_array(shape, mx.float32, gen=np.random.default_rng(1))
    got = run_native("sum", x, shape[1], True)
    np.testing.assert_allclose(got, x.astype(np.float64).sum(-1), rtol=1e-5,
                               atol=1e-6 * np.abs(x).sum(-1).max())
    y = x.copy()
    y[0, -1] = np.nan
    assert np.isnan(run_native("sum", y, shape[1], True)[0])


def test_bad_arguments_raise():
    x = np.ones((4, 6), np.float32)
    with pytest.raises(ValueError, match="Row length 5"):
        native.softmax_float32(x, np.empty_like(x), 5)
    with pytest.raises(ValueError, match="output has 6 elements, expected 4"):
        native.logsumexp_float32(x, np.empty(6, np.float32), 6)
    with pytest.raises(TypeError):  # strided input: no silent copy
        native.softmax_float32(x[:, ::2], np.empty((4, 3), np.float32), 3)
    with pytest.raises(TypeError):  # wrong dtype: no silent conversion
        native.sum_float32(x.astype(np.float64), np.empty(4, np.float32), 6)
    with pytest.raises(ValueError, match="n must be >= 1"):
        native.set_num_threads(0)


# -- the backend's kernels ---------------------------------------------------------
def primitive_class(module, name):
    cls = native_kernels._primitive(module, name)
    if cls is None:
        pytest.skip(f"lazyx.plugins.{module}.{name} does not exist yet")
    return cls


def kernel_pair(cls):
    cpu, ref = backends()["cpu"], backends()["cpu-reference"]
    if cls not in cpu.kernels or cls not in ref.kernels:
        pytest.skip(f"{cls.__name__} has no NumPy kernel yet")
    return cpu.kernels[cls], ref.kernels[cls]


def counting(fn):
    def wrapper(prim, inputs):
        wrapper.calls += 1
        return fn(prim, inputs)
    wrapper.calls = 0
    return wrapper


def make_prim(cls, axes, **params):
    return cls(mx.default_stream(mx.cpu), axes=axes, **params)


# (primitive module, class, extra params, float64 reference of (x, axes, keepdims))
def _ref_softmax(x, axes, keepdims):
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(axes, keepdims=True))
        return e / e.sum(axes, keepdims=True)


def _ref_logsumexp(x, axes, keepdims):
    x = x.astype(np.float64)
    m = x.max(axes, keepdims=True)
    r = np.log(np.exp(x - m).sum(axes, keepdims=True)) + m
    return r if keepdims else np.squeeze(r, axis=axes)


CASES = {
    "softmax": ("products", "Softmax", {"precise": False}, _ref_softmax),
    "logsumexp": ("reductions", "LogSumExp", {"keepdims": False}, _ref_logsumexp),
    "logsumexp_keepdims": ("reductions", "LogSumExp", {"keepdims": True}, _ref_logsumexp),
}

# (shape, axes, takes the native path)
LAYOUTS = [((6, 33), (1,), True), ((2, 3, 40), (1, 2), True), ((2, 3, 40), (2, 1), True),
           ((5, 7), (0,), False), ((4, 5, 6), (0, 2), False), ((9,), (0,), True),
           ((2, 3, 4), (0, 1, 2), True)]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"{l[0]}-{l[1]}")
def test_kernels_match_reference_and_fall_back(case, dtype, layout):
    module, name, params, ref64 = CASES[case]
    cls = primitive_class(module, name)
    kernel, reference = kernel_pair(cls)
    shape, axes, fast = layout
    x = random_array(shape, dtype, gen=np.random.default_rng(3))
    spy = counting(reference)
    by_dtype = {"float32": (getattr(native, f"{case.split('_')[0]}_float32"), None)}
    for half in HALF_DTYPES:
        by_dtype[half] = (getattr(native, f"{case.split('_')[0]}_{half}"), np.uint16)
    spied = native_kernels._row_kernel(by_dtype, spy, reduces=name == "LogSumExp")
    prim = make_prim(cls, axes, **params)
    keepdims = params.get("keepdims", True)
    expected = ref64(x, axes, keepdims)
    for k in (kernel, spied):
        got = k(prim, [x])
        assert got.dtype == x.dtype and got.shape == expected.shape
        assert_matches(got, expected)
    np.testing.assert_allclose(kernel(prim, [x]).astype(np.float64),
                               reference(prim, [x]).astype(np.float64),
                               rtol=TOLERANCES[dtype.name][0] * 4, atol=TOLERANCES[dtype.name][1] * 4)
    native_path = fast and dtype is not mx.float64
    assert spy.calls == (0 if native_path else 1)
    # Transposed and sliced inputs are not C-contiguous: the reference computes them.
    spy.calls = 0
    xt = np.asarray(random_array(shape[::-1], dtype)).T
    got = spied(prim, [xt])
    assert_matches(got, ref64(xt, axes, keepdims))
    assert spy.calls == 1 or xt.flags.c_contiguous
    if x.ndim >= 1 and x.shape[-1] > 2:
        spy.calls = 0
        xs = x[..., ::2]
        assert_matches(spied(prim, [xs]), ref64(xs, axes, keepdims))
        assert spy.calls == 1


# max and min propagate NaN (NumPy, MLX); sums accumulate float32 lanes, blocks in double.
REDUCE_OPS = {"sum": np.sum, "max": np.max, "min": np.min}
# Around the vector width (8 or 16 lanes), the 4-vector loop, the 4096-element block and
# the threaded split of long rows (2 * 2**17 elements).
REDUCE_LENGTHS = [1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 65, 4095, 4096, 4097, 300_001]


def assert_reduced(got, x, op):
    """``got`` is op(x) over the last axis, against float64 NumPy (sums to rounding, max/min exactly)."""
    want = REDUCE_OPS[op](x.astype(np.float64), axis=-1)
    assert got.dtype == np.float32 and got.shape == want.shape
    if op == "sum":
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(x).sum(-1).max())
    else:
        np.testing.assert_array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize("op", sorted(REDUCE_OPS))
@pytest.mark.parametrize("n", REDUCE_LENGTHS)
def test_reduce_rows(op, n):
    gen = np.random.default_rng(n)
    rows = 3 if n < 100_000 else 1
    x = gen.normal(0, 10, (rows, n)).astype(np.float32)
    assert_reduced(run_native(op, x, n, True), x, op)
    if n > 1 and op != "sum":  # the extreme in the tail, the first lane, the middle
        for at in (n - 1, 0, n // 2):
            y = x.copy()
            y[:, at] = 1e30 if op == "max" else -1e30
            assert_reduced(run_native(op, y, n, True), y, op)


@pytest.mark.parametrize("op", sorted(REDUCE_OPS))
@pytest.mark.parametrize("n", [1, 9, 33, 4097, 300_001])
def test_reduce_rows_nan_and_infinities(op, n):
    inf = np.float32(np.inf)
    x = np.random.default_rng(7).normal(0, 1, (6, n)).astype(np.float32)
    x[0, -1] = np.nan       # NaN in the tail (last partial vector)
    x[1, 0] = np.nan        # in the first lane
    x[2, :] = -inf          # all -inf: max -inf, sum -inf
    x[3, :] = inf
    x[4, n // 2] = inf      # one inf
    if n > 1:
        x[5, 0], x[5, -1] = inf, -inf  # sum: inf - inf is NaN
    with np.errstate(invalid="ignore"):
        want = REDUCE_OPS[op](x.astype(np.float64), axis=-1)
    got = run_native(op, x, n, True).astype(np.float64)
    if op == "sum":
        finite = np.isfinite(want)
        np.testing.assert_array_equal(got[~finite], want[~finite])  # NaN and +-inf exactly
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5 * n)
    else:
        np.testing.assert_array_equal(got, want)  # assert_array_equal matches NaN with NaN
    assert np.isnan(got[:2]).all()


@pytest.mark.parametrize("num_threads", [1, 2, 3])
def test_reduce_rows_threads(threads, num_threads):
    threads(num_threads)
    x = np.random.default_rng(11).normal(0, 1, 2 * 300_001).astype(np.float32)
    x[-5] = 77.0
    x[123] = -88.0
    for op in REDUCE_OPS:
        assert_reduced(run_native(op, x, x.size, True), x[None], op)  # one long row, split in parts
        assert_reduced(run_native(op, x.reshape(2, -1), 300_001, True), x.reshape(2, -1), op)
    for part in (0, x.size // 3, x.size - 1):  # a NaN in any part makes the whole NaN
        y = x.copy()
        y[part] = np.nan
        for op in ("max", "min"):
            assert np.isnan(run_native(op, y, y.size, True)[0])


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("shape,axes", [((70_000,), (0,)), ((3, 40_000), (1,)), ((4, 200, 100), (1, 2)),
                                        ((4, 200, 100), (0,)), ((300, 300), (0, 1))])
@pytest.mark.parametrize("op", sorted(REDUCE_OPS))
def test_reduce_kernel(op, shape, axes, keepdims):
    cls = primitive_class("reductions", "Reduce")
    kernel, reference = kernel_pair(cls)
    x = random_array(shape, mx.float32, gen=np.random.default_rng(5))
    prim = cls(mx.default_stream(mx.cpu), op, axes, keepdims)
    got = kernel(prim, [x])
    expected = REDUCE_OPS[op](x.astype(np.float64), axis=axes, keepdims=keepdims)
    assert got.dtype == np.float32 and got.shape == expected.shape
    if op == "sum":
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6 * np.abs(x).sum())
        np.testing.assert_allclose(got, reference(prim, [x]), rtol=1e-5, atol=1e-6 * np.abs(x).sum())
    else:
        np.testing.assert_array_equal(got, expected.astype(np.float32))
        np.testing.assert_array_equal(got, reference(prim, [x]))
    # Other ops are the reference's.
    prim_prod = cls(mx.default_stream(mx.cpu), "prod", axes, keepdims)
    with np.errstate(over="ignore"):  # products of thousands of values overflow to inf
        np.testing.assert_array_equal(kernel(prim_prod, [x]), reference(prim_prod, [x]))
    xt = x.T
    prim_t = cls(mx.default_stream(mx.cpu), op, tuple(range(x.ndim - len(axes), x.ndim)), keepdims)
    np.testing.assert_allclose(kernel(prim_t, [xt]),
                               REDUCE_OPS[op](xt.astype(np.float64), axis=prim_t.axes, keepdims=keepdims),
                               rtol=1e-5, atol=1e-6 * np.abs(x).sum())
    # Which inputs the native kernel takes, and which go to the reference: strided
    # views, other dtypes (float16/bfloat16/float64 included), empty arrays, other ops.
    spy = counting(reference)
    spied = native_kernels._reduce_kernel({op: getattr(native, f"{op}_float32")}, spy,
                                          {op: getattr(native, f"{op}_columns_float32")})
    trailing = axes == tuple(range(x.ndim - len(axes), x.ndim))
    leading = axes == tuple(range(len(axes))) and len(axes) < x.ndim
    cases = [(prim, x, trailing or leading), (prim_prod, x, False),
             (prim_t, xt, xt.flags.c_contiguous), (prim, x[..., ::2], False)]
    for d in (np.float64, np.float16, ml_dtypes.bfloat16):
        cases.append((prim, x.astype(d), False))
    for prim_i, x_i, native_path in cases:
        spy.calls = 0
        with np.errstate(over="ignore"):
            got = spied(prim_i, [x_i])
        assert spy.calls == (0 if native_path else 1)
        if prim_i is prim:
            want = REDUCE_OPS[op](x_i.astype(np.float64), axis=axes, keepdims=keepdims)
            tol = 1e-2 if x_i.dtype.itemsize == 2 else 1e-5
            np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * np.abs(x).sum())
            assert got.dtype == x_i.dtype


@pytest.mark.parametrize("num_threads", [1, 2, 3])
@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (256, 10), (256, 512), (300, 1000),
                                   (1024, 1024), (70_000, 3), (5, 257)])
@pytest.mark.parametrize("op", sorted(REDUCE_OPS))
def test_reduce_columns(threads, num_threads, op, shape):
    """Reductions over the leading axes (a bias gradient's sum over the batch), one
    result per column: against float64 NumPy, with NaN and infinities in some columns."""
    threads(num_threads)
    x = np.random.default_rng(shape[1]).normal(0, 10, shape).astype(np.float32)
    rows, cols = shape
    if rows > 2 and cols > 2:
        x[rows // 2, 0] = np.nan      # a NaN mid-column in the first strip
        x[-1, cols - 1] = np.inf      # the last column's last row
        x[0, cols // 2] = -np.inf
        x[1, cols // 2] = np.inf      # sum: inf - inf is NaN
    out = np.empty(cols, np.float32)
    getattr(native, f"{op}_columns_float32")(x, out, cols)
    with np.errstate(invalid="ignore"):
        want = REDUCE_OPS[op](x.astype(np.float64), axis=0)
    if op == "sum":
        finite = np.isfinite(want)
        np.testing.assert_array_equal(out[~finite], want[~finite])
        np.testing.assert_allclose(out[finite], want[finite], rtol=1e-5,
                                   atol=1e-6 * np.abs(x[:, finite]).sum(0).max(initial=1))
    else:
        np.testing.assert_array_equal(out, want.astype(np.float32))


def test_reduce_columns_bad_arguments_raise():
    x = np.ones((4, 6), np.float32)
    with pytest.raises(ValueError, match="columns"):
        native.sum_columns_float32(x, np.empty(5, np.float32), 6)
    with pytest.raises(ValueError, match="columns"):
        native.sum_columns_float32(x, np.empty(6, np.float32), 5)
    with pytest.raises(TypeError):
        native.sum_columns_float32(x.astype(np.float64), np.empty(6, np.float32), 6)


@pytest.mark.parametrize("op", sorted(REDUCE_OPS))
def test_reduce_kernel_empty(op):
    cls = primitive_class("reductions", "Reduce")
    kernel, reference = kernel_pair(cls)
    x = np.empty((3, 0), np.float32)
    prim = cls(mx.default_stream(mx.cpu), op, (1,), False)
    if op == "sum":
        np.testing.assert_array_equal(kernel(prim, [x]), np.zeros(3, np.float32))
    else:  # NumPy refuses max/min of nothing: the kernel defers to the reference
        with pytest.raises(ValueError):
            reference(prim, [x])
        with pytest.raises(ValueError):
            kernel(prim, [x])
    y = np.empty((0, 5), np.float32)  # no rows: an empty result
    got = kernel(cls(mx.default_stream(mx.cpu), op, (1,), True), [y])
    assert got.shape == (0, 1) and got.dtype == np.float32


# -- through the public API, both backends -----------------------------------------
def both_backends(fn, *args):
    with mx.use_backend("cpu", "cpu-reference"):
        ref = np.asarray(fn(*args)).astype(np.float64)
    with mx.use_backend("cpu", "cpu"):
        got = fn(*args)
    return got, ref


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_public_ops_agree_across_backends(dtype):
    x = to_lazyx(random_array((33, 257), dtype, low=-30, high=30))
    ops = [lambda a: mx.logsumexp(a, axis=-1), lambda a: mx.logsumexp(a, axis=(0, 1), keepdims=True),
           lambda a: mx.sum(a, axis=1), lambda a: mx.max(a, axis=-1), lambda a: mx.min(a),
           lambda a: mx.mean(a), lambda a: mx.mean(a, axis=-1, keepdims=True)]
    if hasattr(mx, "softmax"):
        ops += [lambda a: mx.softmax(a, axis=-1), lambda a: mx.softmax(a, axis=0)]
    if hasattr(mx, "transpose"):  # a strided view: the reference kernel serves it
        ops += [lambda a: mx.logsumexp(mx.transpose(a), axis=-1)]
        if hasattr(mx, "softmax"):
            ops += [lambda a: mx.softmax(mx.transpose(a), axis=-1)]
    for i, op in enumerate(ops):
        got, ref = both_backends(op, x)
        r, a = TOLERANCES[dtype.name]
        assert_close(got, ref, dtype=dtype, rtol=2 * r, atol=2 * a, msg=f"op {i}")


def test_native_kernels_are_installed_on_cpu_only():
    table = native_kernels.kernels(native)
    cpu, ref = backends()["cpu"], backends()["cpu-reference"]
    assert table, "the native module serves no primitive"
    for cls, fn in table.items():
        assert fn.reference is ref.kernels[cls]
        assert getattr(cpu.kernels[cls], "reference", None) is ref.kernels[cls]
    assert native_kernels.kernels(None) == {}
