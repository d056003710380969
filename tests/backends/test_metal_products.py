"""The Metal backend's built-in matrix products (backends/metal/kernels/products.py):
``Matmul`` and ``AddMM`` as tiled MSL kernels.

Two levels, as tests/backends/test_metal_kernels.py and test_metal_backend.py:

* the launchers through lazyx's MSL shim (:func:`run_on_cpu`: a threadgroup's 256 threads
  as fibers, barriers as on a GPU) against NumPy float64 products of the same (rounded)
  inputs, within each dtype's rounding plus the float accumulator's error bound;
* ``stream=mx.gpu`` with the Metal backend emulated on the CPU, against the CPU backend:
  the kernels are counted as built-in and Matmul / AddMM no longer fall back.

Shapes stay small: the shim runs a threadgroup's threads one at a time.
"""

import ml_dtypes
import numpy as np
import pytest

import lazyx.core as mx
from helpers import random_array, rng
from lazyx.backends.metal import kernels
from lazyx.backends.metal.kernels import products
from lazyx.backends.metal.kernels.common import UnsupportedDtype
from lazyx.backends.metal.msl_cpu import shim_available
from lazyx.errors import DtypeError
from lazyx.plugins import products as pr
from test_metal_backend import on_metal  # noqa: F401  (the fixture: Metal emulated, stats at 0)
from test_metal_kernels import SUBNORMAL, run, run_reversed  # the shim's two thread orders

pytestmark = pytest.mark.skipif(not shim_available(), reason="no C++ compiler for the MSL shim")

S = mx.default_stream(mx.cpu)
F64 = np.float64
DTYPES = ["float32", "float16", "bfloat16"]
#: Relative error of one rounding to each dtype (the output's), with a little room.
ROUNDING = {"float32": 2e-7, "float16": 1e-3, "bfloat16": 8e-3}


def _np(dtype):
    return getattr(mx, dtype).np


def check_product(got, expected, scale, k, dtype, where=""):
    """``got`` (of ``dtype``) within one rounding of ``expected`` (float64) plus float32
    accumulation over ``k`` terms of total magnitude ``scale`` (``|a| @ |b|``)."""
    assert got.dtype == np.dtype(_np(dtype)), where
    assert got.shape == expected.shape, (where, got.shape, expected.shape)
    got = got.astype(F64)
    tol = ROUNDING[dtype] * np.abs(expected) + (k + 2) * 2.0 ** -24 * scale + SUBNORMAL[dtype]
    bad = ~(np.abs(got - expected) <= tol)
    assert not bad.any(), f"{where} {dtype}: got {got[bad][:5]}, expected {expected[bad][:5]}"


def operand(shape, dtype, gen, how="contiguous"):
    """Random data of ``shape``; ``"transposed"``: a view of the transposed data (strides
    swapped in the last two axes); ``"sliced"``: every other column of a wider array."""
    if how == "transposed":
        x = random_array(shape[:-2] + shape[:-3:-1], getattr(mx, dtype), gen, -1, 1)
        return np.swapaxes(x, -1, -2)
    if how == "sliced":
        x = random_array(shape[:-1] + (2 * shape[-1],), getattr(mx, dtype), gen, -1, 1)
        return x[..., ::2]
    return random_array(shape, getattr(mx, dtype), gen, -1, 1)


# (a's shape, b's shape, a's layout, b's layout): 1 x 1 x 1, sizes that are not multiples
# of the 32 x 32 tile or of the K step of 16, batches broadcast against each other and
# against a single matrix, transposed and sliced views, vectors, K = 0.
CASES = [
    ((1, 1), (1, 1), "contiguous", "contiguous"),
    ((33, 65), (65, 17), "contiguous", "contiguous"),
    ((33, 65), (65, 17), "transposed", "transposed"),
    ((20, 40), (40, 35), "sliced", "transposed"),
    ((2, 1, 5, 7), (3, 7, 4), "contiguous", "contiguous"),
    ((5, 7), (2, 3, 7, 4), "transposed", "contiguous"),
    ((3, 6, 18), (18, 9), "contiguous", "transposed"),
    ((7,), (7, 5), "contiguous", "contiguous"),
    ((5, 7), (7,), "contiguous", "contiguous"),
    ((2, 5, 7), (7,), "transposed", "contiguous"),
    ((7,), (3, 7, 4), "contiguous", "transposed"),
    ((40,), (40,), "contiguous", "contiguous"),
    ((3, 0), (0, 4), "contiguous", "contiguous"),
    ((2, 3, 0), (0, 5), "contiguous", "contiguous"),
]


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_through_the_shim(dtype):
    gen = rng(40)
    for sa, sb, how_a, how_b in CASES:
        a, b = operand(sa, dtype, gen, how_a), operand(sb, dtype, gen, how_b)
        got = products.matmul(pr.Matmul(S), [a, b], run)
        expected = np.matmul(a.astype(F64), b.astype(F64))
        scale = np.matmul(np.abs(a.astype(F64)), np.abs(b.astype(F64)))
        check_product(got, expected, scale, sa[-1], dtype, f"{sa} {how_a} @ {sb} {how_b}")
        if sa[-1] == 0:
            assert got.tolist() == np.zeros(got.shape).tolist()


def test_matmul_in_reverse_thread_order():
    # A thread reading another's tile element before the barrier that publishes it would
    # give different numbers when the threads run in the opposite order.
    gen = rng(41)
    a, b = operand((2, 40, 33), "float32", gen), operand((33, 50), "float32", gen, "transposed")
    forward = products.matmul(pr.Matmul(S), [a, b], run)
    backward = products.matmul(pr.Matmul(S), [a, b], run_reversed)
    np.testing.assert_array_equal(forward, backward)
    np.testing.assert_allclose(forward, a.astype(F64) @ b.astype(F64), rtol=1e-5, atol=1e-5)


# (c's shape, a's shape, b's shape, c's layout): c broadcast along rows, along columns, a
# full and a transposed c, a batched c against 2-D operands' product, vectors.
ADDMM_CASES = [
    ((17,), (33, 20), (20, 17), "contiguous"),
    ((33, 1), (33, 20), (20, 17), "contiguous"),
    ((33, 17), (33, 20), (20, 17), "transposed"),
    ((2, 6, 5), (2, 6, 9), (9, 5), "contiguous"),
    ((1, 6, 1), (3, 6, 9), (3, 9, 5), "contiguous"),
    ((5,), (9,), (9, 5), "contiguous"),
    ((6,), (6, 9), (9,), "contiguous"),
    ((), (9,), (9,), "contiguous"),
    ((4, 3), (4, 0), (0, 3), "contiguous"),
]


@pytest.mark.parametrize("dtype", DTYPES)
def test_addmm_through_the_shim(dtype):
    gen = rng(42)
    for alpha, beta in ((1.0, 1.0), (2.0, -0.5), (-1.5, 3.0)):
        for sc, sa, sb, how_c in ADDMM_CASES:
            a, b = operand(sa, dtype, gen), operand(sb, dtype, gen)
            c = operand(sc, dtype, gen, how_c) if sc else random_array(sc, getattr(mx, dtype), gen)
            got = products.addmm(pr.AddMM(S, alpha, beta), [c, a, b], run)
            product = np.matmul(a.astype(F64), b.astype(F64))
            expected = alpha * product + beta * c.astype(F64)
            scale = abs(alpha) * np.matmul(np.abs(a.astype(F64)), np.abs(b.astype(F64))) \
                + abs(beta) * np.abs(c.astype(F64))
            check_product(got, expected, scale, sa[-1] + 2, dtype,
                          f"{alpha} * {sa} @ {sb} + {beta} * c{sc} {how_c}")


def test_addmm_with_beta_zero_ignores_nans_in_c():
    gen = rng(43)
    a, b = operand((6, 9), "float32", gen), operand((9, 5), "float32", gen)
    for c in (np.full((6, 5), np.nan, np.float32), np.full((5,), np.inf, np.float32)):
        dispatches = []
        got = products.addmm(pr.AddMM(S, 2.0, 0.0), [c, a, b], dispatches.append)
        # c is not even bound: the matmul kernel runs (with alpha).
        assert [d.function for d in dispatches] == ["matmul_float32"]
        assert not any(x is c for x in dispatches[0].buffers)
        run(dispatches[0])
        np.testing.assert_allclose(got, 2 * (a.astype(F64) @ b.astype(F64)), rtol=1e-5, atol=1e-6)
    dispatches = []
    products.addmm(pr.AddMM(S, 2.0, 1.0), [c, a, b], dispatches.append)
    assert [d.function for d in dispatches] == ["addmm_float32"]
    # beta != 0 reads c: a NaN there is a NaN in the output, where it is.
    c = np.zeros((6, 5), np.float32)
    c[2, 3] = np.nan
    got = products.addmm(pr.AddMM(S, 1.0, 0.5), [c, a, b], run)
    assert np.isnan(got).tolist() == np.isnan(c).tolist()


def test_addmm_with_k_zero_is_beta_c():
    c = np.arange(12, dtype=np.float32).reshape(4, 3)
    got = products.addmm(pr.AddMM(S, 2.0, -0.5), [c, np.ones((4, 0), np.float32),
                                                   np.ones((0, 3), np.float32)], run)
    np.testing.assert_array_equal(got, -0.5 * c)


def test_half_types_accumulate_in_float_and_round_once():
    # A partial sum (120000) overflows float16 (max 65504); the result (60000) does not.
    a = np.array([[30000.0, 30000.0, -30000.0]], np.float16)
    b = np.full((3, 1), 2.0, np.float16)
    got = products.matmul(pr.Matmul(S), [a, b], run)
    assert got.dtype == np.float16 and got.tolist() == [[60000.0]]
    # bfloat16: 1 + 2^-8 + 2^-8 is 1 + 2^-7 in float; each partial sum rounded to bfloat16
    # (8 bits: 1 + 2^-8 is a tie, to even) would stay 1.
    tiny = 2.0 ** -8
    a = np.array([[1.0, tiny, tiny]], ml_dtypes.bfloat16)
    got = products.matmul(pr.Matmul(S), [a, np.ones((3, 1), ml_dtypes.bfloat16)], run)
    assert got.astype(F64).tolist() == [[1.0 + 2.0 ** -7]]


def test_dtypes_without_a_kernel_are_refused_naming_the_dtypes_it_has():
    for dtype in (np.float64, np.complex64):
        x = np.ones((2, 2), dtype)
        with pytest.raises(UnsupportedDtype, match=f"matmul has no version for dtype "
                           f"{np.dtype(dtype).name}; it has float32, float16, bfloat16"):
            products.matmul(pr.Matmul(S), [x, x], run)
        with pytest.raises(UnsupportedDtype, match="addmm has no version"):
            products.addmm(pr.AddMM(S, 1.0, 1.0), [x, x, x], run)


def test_the_table_and_the_library():
    assert kernels.KERNELS[pr.Matmul] is products.matmul
    assert kernels.KERNELS[pr.AddMM] is products.addmm
    from lazyx.plugins import matmuls as mm
    assert kernels.KERNELS[mm.GatherMM] is products.gather_mm
    assert products.LIBRARY in kernels.LIBRARIES
    # One template, instantiated per dtype and kind (matmul, addmm, gather_mm) from the tables.
    assert products.LIBRARY.source.count("[[kernel]] void") == 1
    assert products.LIBRARY.source.count("[[host_name(") == 3 * len(products.DTYPES)


# -- through the backend: stream=mx.gpu, emulated -------------------------------------------------
def _close_to_cpu(got, cpu, dtype, where):
    """Two float32 accumulations in different orders, each rounded once to ``dtype``: a few
    units in the last place of the output apart at most."""
    assert got.dtype == cpu.dtype and got.shape == cpu.shape, where
    ulp = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]
    got, cpu = got.astype(F64), cpu.astype(F64)
    np.testing.assert_allclose(got, cpu, rtol=ulp * 8, atol=1e-5, err_msg=where)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_and_addmm_on_the_gpu_stream_equal_the_cpu_backend(on_metal, dtype):
    gen = rng(44)
    d = getattr(mx, dtype)
    calls = 0
    for sa, sb, transpose_a in [((1, 1), (1, 1), False), ((33, 17), (17, 65), False),
                                ((33, 17), (17, 20), True), ((2, 1, 5, 7), (3, 7, 4), False),
                                ((7,), (7, 5), False), ((5, 7), (7,), True),
                                ((3, 0), (0, 4), False)]:
        b = mx.array(random_array(sb, d, gen, -1, 1))
        if transpose_a:   # a view made on the CPU stream: the GPU's kernel reads it strided
            a = mx.transpose(mx.array(random_array(sa[::-1], d, gen, -1, 1)), stream=mx.cpu)
        else:
            a = mx.array(random_array(sa, d, gen, -1, 1))
        got, cpu = (np.asarray(mx.matmul(a, b, stream=s)) for s in (mx.gpu, mx.cpu))
        _close_to_cpu(got, cpu, dtype, f"{sa} @ {sb}")
        calls += 1
    for alpha, beta, c_shape in ((1.0, 1.0, (6, 5)), (2.0, -0.5, (5,)), (0.5, 0.0, (6, 1))):
        c = random_array(c_shape, d, gen, -1, 1)
        if beta == 0.0:
            c[...] = np.nan
        c, a, b = (mx.array(x) for x in (c, random_array((6, 9), d, gen, -1, 1),
                                          random_array((9, 5), d, gen, -1, 1)))
        got, cpu = (np.asarray(mx.addmm(c, a, b, alpha=alpha, beta=beta, stream=s))
                    for s in (mx.gpu, mx.cpu))
        assert not np.isnan(cpu.astype(F64)).any()
        _close_to_cpu(got, cpu, dtype, f"addmm {alpha} {beta} {c_shape}")
        calls += 1
    # Every product ran the built-in kernels (the transposes ran on the CPU stream).
    assert on_metal["builtin"] == calls and on_metal["cpu_fallback"] == 0


def test_matmul_is_no_longer_a_cpu_fallback(on_metal):
    assert mx.kernel_provider("metal", "Matmul") == "backend 'metal'"
    assert mx.kernel_provider("metal", "AddMM") == "backend 'metal'"
    # A dtype the kernels lack (complex64) falls back, counted; float64 is refused.
    x = mx.array(np.array([[1 + 2j, 3j], [2, 1]], np.complex64))
    got = np.asarray(mx.matmul(x, x, stream=mx.gpu))
    np.testing.assert_allclose(got, np.asarray(x) @ np.asarray(x), rtol=1e-6)
    assert on_metal["cpu_fallback_by_primitive"] == {"Matmul": 1} and on_metal["builtin"] == 0
    with pytest.raises(DtypeError, match=r"^AddMM cannot run on the Metal GPU with float64 inputs"):
        y = mx.array(np.ones((2, 2)), dtype=mx.float64)
        mx.eval(mx.addmm(y, y, y, stream=mx.gpu))


# -- GatherMM: each batch position's matrices picked by index arrays ----------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_mm_picks_each_positions_matrices(dtype):
    from lazyx.errors import IndexOutOfRangeError
    from lazyx.plugins import matmuls as mm
    gen = rng(80)
    a = operand((2, 3, 33, 20), dtype, gen)          # a stack of 6 (A = (2, 3))
    b = operand((4, 20, 17), dtype, gen, "transposed")   # 4, each a transposed view
    lhs = np.array([[5, 0], [2, 2], [1, 5]], np.int32)
    rhs = np.array([[3, 3], [0, 1], [2, 0]], np.int32)
    p = mm.GatherMM(S, False)
    for order in (run, run_reversed):
        got = products.gather_mm(p, [a, b, lhs, rhs], order)
        assert got.shape == (3, 2, 33, 17) and got.dtype == a.dtype
        a3, b3 = a.reshape(-1, 33, 20).astype(F64), b.astype(F64)
        want = np.matmul(a3[lhs], b3[rhs])
        scale = np.matmul(np.abs(a3[lhs]), np.abs(b3[rhs]))
        check_product(got, want, scale, 20, dtype, "gather_mm")
    with pytest.raises(IndexOutOfRangeError, match="rhs_indices holds 4"):
        products.gather_mm(p, [a, b, lhs, rhs + 1], run)


def test_gather_mm_through_the_backend(on_metal):
    gen = rng(81)
    a = mx.array(operand((4, 5, 12), "float32", gen))
    b = mx.array(operand((3, 12, 7), "float32", gen))
    lhs, rhs = mx.array([3, 0, 3, 1]), mx.array([2, 2, 0, 1])
    got = mx.gather_mm(a, b, lhs, rhs, stream=mx.gpu)
    cpu = mx.gather_mm(a, b, lhs, rhs, stream=mx.cpu)
    np.testing.assert_allclose(np.asarray(got), np.asarray(cpu), rtol=1e-5, atol=1e-6)
    assert "GatherMM" not in on_metal["cpu_fallback_by_primitive"]
    assert on_metal["builtin"] >= 1
