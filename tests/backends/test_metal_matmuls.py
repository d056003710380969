"""The Metal backend's kernels of the matmuls pack (backends/metal/kernels/matmuls.py):
``BlockMaskedMM``, ``SegmentedMM`` and ``Hadamard``.

Two levels, as tests/backends/test_metal_products.py:

* the launchers through lazyx's MSL shim, in both thread orders, against NumPy float64
  references (within each dtype's rounding plus float accumulation) and the CPU
  backend's kernels (the Hadamard transform: bit for bit);
* ``stream=mx.gpu`` with the Metal backend emulated on the CPU, against the CPU stream:
  the kernels are counted as built-in and nothing falls back, gradients included.
"""

import lazyx.core as mx
import numpy as np
import pytest
from helpers import random_array, rng
from lazyx import backend as registry
from lazyx.backends.cpu.kernels import matmuls as cpu_matmuls
from lazyx.backends.metal import kernels
from lazyx.backends.metal.kernels import matmuls
from lazyx.backends.metal.kernels.common import UnsupportedDtype
from lazyx.backends.metal.msl_cpu import shim_available
from lazyx.errors import IndexOutOfRangeError
from lazyx.plugins import matmuls as mm
from test_metal_backend import on_metal  # noqa: F401  (the fixture: Metal emulated, stats at 0)
from test_metal_kernels import run, run_reversed  # the shim's two thread orders
from test_metal_products import ROUNDING, check_product, operand

pytestmark = pytest.mark.skipif(not shim_available(), reason="no C++ compiler for the MSL shim")

S = mx.default_stream(mx.cpu)
F64 = np.float64
DTYPES = ["float32", "float16", "bfloat16"]


def _cpu_kernel(cls):
    """The CPU backend's kernel for primitive class ``cls`` (the native one where it has one)."""
    return registry.backends()["cpu"].kernels[cls]


def _same_bits(x, y):
    return x.dtype == y.dtype and x.shape == y.shape and \
        x.view(np.uint8).tobytes() == y.view(np.uint8).tobytes()


# -- BlockMaskedMM ------------------------------------------------------------------------------
def _up(mask, block, rows, cols):
    return np.repeat(np.repeat(mask, block, axis=-2), block, axis=-1)[..., :rows, :cols]


def _masked(x, mask, block):
    """``x`` (float64) with ``mask``'s tiles applied: zeroed where false (NaNs too), scaled."""
    if mask is None:
        return x
    up = _up(mask, block, x.shape[-2], x.shape[-1])
    return np.where(up, x, 0.0) if mask.dtype == np.bool_ else x * up.astype(F64)


def _mask(kind, shape, dtype, gen):
    if kind is None:
        return None
    if kind == "bool":
        return gen.random(shape) > 0.4
    return random_array(shape, getattr(mx, dtype), gen, -2, 2)


# (a's shape, b's shape, block size, kinds of mask_out, mask_lhs, mask_rhs, b's layout): sizes
# not multiples of the 32 x 32 tile or of the K step, every kind of each mask, block sizes 32
# and 64, batches (one broadcast by a stride of 0, as the op leaves it), K = 0.
MASKED_CASES = [
    ((40, 70), (70, 33), 32, ("bool", None, None), "contiguous"),
    ((40, 70), (70, 33), 32, ("float", None, None), "contiguous"),
    ((40, 70), (70, 33), 32, (None, "bool", "bool"), "transposed"),
    ((65, 100), (100, 50), 64, (None, "float", "float"), "contiguous"),
    ((2, 33, 47), (2, 47, 20), 32, ("bool", "float", "bool"), "contiguous"),
    ((3, 40, 70), (1, 70, 33), 32, ("float", "bool", "float"), "transposed"),
    ((70, 129), (129, 65), 64, ("float", "float", "bool"), "contiguous"),
    ((5, 0), (0, 7), 32, ("float", "bool", "float"), "contiguous"),
]


def _masked_inputs(case, dtype, gen):
    sa, sb, bs, kinds, how_b = case
    a, b = operand(sa, dtype, gen), operand(sb, dtype, gen, how_b)
    M, K, N = sa[-2], sa[-1], sb[-1]
    batch = np.broadcast_shapes(sa[:-2], sb[:-2])
    tiles = [(-(-M // bs), -(-N // bs)), (-(-M // bs), -(-K // bs)), (-(-K // bs), -(-N // bs))]
    masks = [_mask(k, (1,) * len(batch) + t, dtype, gen) for k, t in zip(kinds, tiles)]
    # The op broadcasts every input to one batch (views: stride-0 batch dimensions).
    full = [np.broadcast_to(x, batch + x.shape[-2:]) for x in [a, b] + masks if x is not None]
    prim = mm.BlockMaskedMM(S, bs, *(k is not None for k in kinds))
    return prim, full, masks


@pytest.mark.parametrize("dtype", DTYPES)
def test_block_masked_mm_through_the_shim(dtype):
    gen = rng(90)
    cpu = _cpu_kernel(mm.BlockMaskedMM)
    for case in MASKED_CASES:
        prim, inputs, (mo, ml, mr) = _masked_inputs(case, dtype, gen)
        bs, where = case[2], f"{case[:4]} {dtype}"
        a, b = inputs[0].astype(F64), inputs[1].astype(F64)
        A, B = _masked(a, ml, bs), _masked(b, mr, bs)
        expected = _masked(A @ B, mo, bs)
        scale = np.abs(_masked(np.abs(A) @ np.abs(B), mo, bs))
        got = matmuls.block_masked_mm(prim, inputs, run)
        check_product(got, expected, scale, a.shape[-1] + 2, dtype, where)
        # The CPU backend's kernel: the same float products, summed in another order.
        want = cpu(prim, inputs).astype(F64)
        tol = 2 * ROUNDING[dtype] * np.abs(want) + (a.shape[-1] + 2) * 2.0 ** -23 * scale
        assert (np.abs(got.astype(F64) - want) <= tol + 1e-30).all(), where
        if mo is not None and mo.dtype == np.bool_:   # masked-out output blocks: exact zeros
            off = ~_up(mo, bs, *got.shape[-2:]) & np.ones(got.shape, bool)
            assert (got[off] == 0).all(), where


def test_block_masked_mm_in_reverse_thread_order():
    gen = rng(91)
    for case in MASKED_CASES[4:7]:
        prim, inputs, _ = _masked_inputs(case, "float32", gen)
        forward = matmuls.block_masked_mm(prim, inputs, run)
        assert _same_bits(forward, matmuls.block_masked_mm(prim, inputs, run_reversed)), case


def test_block_masked_mm_false_blocks_read_nothing():
    # A false boolean block is skipped: the NaNs of a masked-out tile of a (or of the product,
    # under mask_out) do not reach the output, nor do those of b's rows in a skipped K step
    # (MLX's GPU kernel skips there too; the CPU's zeroed copies give 0 * NaN = NaN).
    gen = rng(92)
    a, b = operand((40, 70), "float32", gen), operand((70, 40), "float32", gen)
    ml = np.array([[True, False, True], [True, True, True]])
    a[:32, 32:64] = np.nan      # a's masked-out tile
    b[40:50, :] = np.nan        # rows 40..49 of b: read only by a's second block row
    mo = np.array([[True, True], [False, True]])
    prim = mm.BlockMaskedMM(S, 32, True, True, False)
    got = matmuls.block_masked_mm(prim, [a, b, mo, ml], run)
    # Rows 32.. read b's NaN rows (their K block is kept): NaN but where mask_out is false.
    assert np.isnan(got[32:]).tolist() == np.broadcast_to(np.arange(40) >= 32, (8, 40)).tolist()
    assert (got[32:, :32] == 0).all()   # mask_out's false block: zeros despite the NaNs
    a64, b64 = a.astype(F64), b.astype(F64)
    expected = np.where(_up(ml, 32, 40, 70), np.nan_to_num(a64, nan=0.0), 0.0)[:32] @ \
        np.nan_to_num(b64, nan=0.0)
    np.testing.assert_allclose(got[:32], expected, rtol=1e-5, atol=1e-5)
    # A floating mask scales: 0 times a NaN is a NaN, as on the CPU.
    prim = mm.BlockMaskedMM(S, 32, False, True, False)
    got = matmuls.block_masked_mm(prim, [a, np.nan_to_num(b), ml.astype(np.float32)], run)
    assert np.isnan(got[:32]).all() and not np.isnan(got[32:]).any()


# -- SegmentedMM --------------------------------------------------------------------------------
# Segments: the whole of K, empty ones (at 0, inside, at K), a reversed one (zeros, as the
# CPU's kernel), bounds across the K step of 16, one of a single column.
SEGMENTS = np.array([[[0, 70], [5, 5], [70, 70]], [[9, 3], [3, 40], [69, 70]]], np.int32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_segmented_mm_through_the_shim(dtype):
    gen = rng(93)
    cpu = _cpu_kernel(mm.SegmentedMM)
    for sa, sb, how_a in (((33, 70), (70, 45), "contiguous"), ((17, 70), (70, 9), "transposed")):
        a, b = operand(sa, dtype, gen, how_a), operand(sb, dtype, gen)
        for order in (run, run_reversed):
            got = matmuls.segmented_mm(mm.SegmentedMM(S), [a, b, SEGMENTS], order)
            assert got.shape == SEGMENTS.shape[:-1] + (sa[0], sb[1])
            expected = np.zeros(got.shape)
            scale = np.zeros(got.shape)
            for idx in np.ndindex(SEGMENTS.shape[:-1]):
                lo, hi = SEGMENTS[idx]
                if hi > lo:
                    expected[idx] = a[:, lo:hi].astype(F64) @ b[lo:hi].astype(F64)
                    scale[idx] = np.abs(a[:, lo:hi].astype(F64)) @ np.abs(b[lo:hi].astype(F64))
            check_product(got, expected, scale, 72, dtype, f"{sa} {how_a}")
            assert (got[0, 1:] == 0).all() and (got[1, 0] == 0).all()   # the empty segments
            want = cpu(mm.SegmentedMM(S), [a, b, SEGMENTS]).astype(F64)
            np.testing.assert_allclose(got.astype(F64), want, rtol=4 * ROUNDING[dtype],
                                       atol=72 * 2.0 ** -23 * scale.max())


def test_segmented_mm_bounds_and_empty_inner_dimension():
    a, b = np.ones((4, 6), np.float32), np.ones((6, 3), np.float32)
    with pytest.raises(IndexOutOfRangeError, match=r"segmented_mm\] segments .* outside \[0, 6\]"):
        matmuls.segmented_mm(mm.SegmentedMM(S), [a, b, np.array([[0, 7]], np.int32)], run)
    got = matmuls.segmented_mm(mm.SegmentedMM(S), [np.ones((4, 0), np.float32),
                                                   np.ones((0, 3), np.float32),
                                                   np.zeros((2, 2), np.int32)], run)
    assert got.shape == (2, 4, 3) and (got == 0).all()
    assert matmuls.segmented_mm(mm.SegmentedMM(S), [a, b, np.zeros((0, 2), np.int32)],
                                run).shape == (0, 4, 3)


# -- Hadamard -----------------------------------------------------------------------------------
# n = 2^k (one element, one butterfly group, a last group of 1-3 stages), m * 2^k for m = 12, 20,
# 28, the largest one-pass row (8192) and two-pass ones (16384: chunks of 8192 then pairs;
# 28 * 512: chunks of 512 then only H_28).
LENGTHS = [1, 2, 16, 32, 128, 48, 40, 28, 12 * 64, 20 * 16, 28 * 8]
LONG = [8192, 16384, 28 * 512]


def _hadamard_reference(x, scale, transposed):
    """``scale * kron(H_m, H_p) @ x`` along the last axis in float64: the matrix itself for
    short rows, the float64 butterflies of the CPU's NumPy kernel for long ones."""
    n = x.shape[-1]
    x = x.astype(F64)
    if n > 1024:
        return cpu_matmuls.hadamard(x, scale, transposed)
    h = cpu_matmuls.hadamard_matrix(*mm.hadamard_factors(n), transposed)
    return scale * x @ h.T


def _check_hadamard(got, x, scale, transposed, dtype, where):
    expected = _hadamard_reference(x, scale, transposed)
    n = x.shape[-1]
    # Float sums of n terms, each partial sum bounded by the row's sum of |x|, then one rounding.
    bound = abs(scale) * np.abs(x.astype(F64)).sum(-1, keepdims=True)
    tol = ROUNDING[dtype] * np.abs(expected) + (np.log2(n) + 30) * 2.0 ** -24 * bound
    assert got.dtype == x.dtype and got.shape == x.shape, where
    bad = ~(np.abs(got.astype(F64) - expected) <= tol)
    assert not bad.any(), f"{where}: got {got[bad][:4]}, expected {expected[bad][:4]}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_hadamard_through_the_shim(dtype):
    gen = rng(94)
    cpu = _cpu_kernel(mm.Hadamard)
    for n in LENGTHS + (LONG if dtype == "float32" else LONG[1:2]):
        x = random_array((3, n), getattr(mx, dtype), gen, -1, 1)
        for transposed, scale in ((False, 1 / np.sqrt(n)), (True, 0.75)):
            prim = mm.Hadamard(S, scale, transposed)
            got = matmuls.hadamard(prim, [x], run)
            where = f"n={n} transposed={transposed} {dtype}"
            _check_hadamard(got, x, scale, transposed, dtype, where)
            # The CPU's float operations in the CPU's order: its numbers bit for bit.
            assert _same_bits(got, cpu(prim, [x])), where


def test_hadamard_in_reverse_thread_order_and_odd_layouts():
    gen = rng(95)
    for n, rows in ((16, 300), (48, 5), (28 * 16, 3), (16384, 2), (28 * 512, 2)):
        x = random_array((rows, n), mx.float32, gen, -1, 1)
        prim = mm.Hadamard(S, 0.5, n % 7 == 0)
        forward = matmuls.hadamard(prim, [x], run)
        assert _same_bits(forward, matmuls.hadamard(prim, [x], run_reversed)), n
    # A transposed view (copied on the host), a 0-d input, a batch of rows.
    x = random_array((40, 6), mx.float16, gen, -1, 1).T
    prim = mm.Hadamard(S, 0.25, False)
    assert _same_bits(matmuls.hadamard(prim, [x], run), _cpu_kernel(mm.Hadamard)(prim, [x]))
    got = matmuls.hadamard(prim, [np.array(3.0, np.float32)], run)
    assert got.shape == () and got.tolist() == 0.75
    x = random_array((2, 3, 20), mx.bfloat16, gen, -1, 1)
    _check_hadamard(matmuls.hadamard(prim, [x], run), x, 0.25, False, "bfloat16", "2x3x20")


def test_hadamard_plans():
    dispatches = []
    matmuls.hadamard(mm.Hadamard(S, 1.0, False), [np.ones((3, 16384), np.float32)],
                     dispatches.append)
    assert [d.function for d in dispatches] == ["hadamard_float32_float32"] * 2
    dispatches = []
    matmuls.hadamard(mm.Hadamard(S, 1.0, False), [np.ones((5, 28 * 512), np.float16)],
                     dispatches.append)
    assert [d.function for d in dispatches] == ["hadamard_float16_float32",
                                                "hadamard_float32_float16"]
    dispatches = []
    matmuls.hadamard(mm.Hadamard(S, 1.0, False), [np.ones((300, 16), np.float16)],
                     dispatches.append)
    (d,) = dispatches
    assert d.function == "hadamard_float16_float16"
    assert d.grid == (1, 300) and d.threadgroup == (1, 256)   # many short rows per threadgroup


# -- dtypes and the tables ----------------------------------------------------------------------
def test_dtypes_without_a_kernel_are_refused_naming_the_dtypes_it_has():
    x = np.ones((4, 4))
    has = "it has float32, float16, bfloat16"
    with pytest.raises(UnsupportedDtype, match=f"block_masked_mm has no version for dtype "
                       f"float64; {has}"):
        matmuls.block_masked_mm(mm.BlockMaskedMM(S, 32, True, False, False),
                                [x, x, np.ones((1, 1), bool)], run)
    with pytest.raises(UnsupportedDtype, match="segmented_mm has no version for dtype float64"):
        matmuls.segmented_mm(mm.SegmentedMM(S), [x, x, np.zeros((1, 2), np.int32)], run)
    with pytest.raises(UnsupportedDtype, match="hadamard has no version for dtype float64"):
        matmuls.hadamard(mm.Hadamard(S, 1.0, False), [x], run)
    with pytest.raises(UnsupportedDtype, match="multiples of 32, got 16"):
        y = np.ones((4, 4), np.float32)
        matmuls.block_masked_mm(mm.BlockMaskedMM(S, 16, True, False, False),
                                [y, y, np.ones((1, 1), bool)], run)


def test_the_table_and_the_library():
    assert kernels.KERNELS[mm.BlockMaskedMM] is matmuls.block_masked_mm
    assert kernels.KERNELS[mm.SegmentedMM] is matmuls.segmented_mm
    assert kernels.KERNELS[mm.Hadamard] is matmuls.hadamard
    assert matmuls.LIBRARY in kernels.LIBRARIES
    # Three templates (the products' tiles shared with kernels/products.py), instantiated
    # from the tables: two products per dtype, the transform per (input, output) pair.
    source = matmuls.LIBRARY.source
    assert source.count("[[kernel]] void") == 3 and "inline void stage_tiles" in source
    assert source.count("[[host_name(") == 2 * len(matmuls.DTYPES) + 7


# -- through the backend: stream=mx.gpu, emulated -------------------------------------------------
def _gpu_and_cpu(fn, *args):
    return [np.asarray(fn(*args, stream=s)) for s in (mx.gpu, mx.cpu)]


def _close(got, cpu, dtype, k, where):
    assert got.dtype == cpu.dtype and got.shape == cpu.shape, where
    ulp = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]
    np.testing.assert_allclose(got.astype(F64), cpu.astype(F64), rtol=4 * ulp,
                               atol=k * 2.0 ** -22, err_msg=where)


@pytest.mark.parametrize("dtype", DTYPES)
def test_on_the_gpu_stream_equal_the_cpu_backend(on_metal, dtype):  # noqa: F811
    gen = rng(96)
    d = getattr(mx, dtype)

    def arr(shape, low=-1, high=1):
        return mx.array(random_array(shape, d, gen, low, high))

    a, b = arr((2, 40, 70)), arr((70, 33))
    calls = 0
    for mo, ml, mr in ((mx.array(gen.random((2, 2)) > 0.3), None, None),
                       (arr((2, 2, 2), -2, 2), None, None),
                       (None, mx.array(gen.random((2, 3)) > 0.4),
                        mx.array(gen.random((3, 2)) > 0.4)),
                       (arr((1, 2, 2)), arr((2, 3)), arr((3, 2)))):
        got, cpu = _gpu_and_cpu(lambda *x, stream, masks=(mo, ml, mr):
                                mx.block_masked_mm(*x, 32, *masks, stream=stream), a, b)
        _close(got, cpu, dtype, 70, f"masks {[m is not None for m in (mo, ml, mr)]}")
        calls += 1
    seg = mx.array(SEGMENTS)
    got, cpu = _gpu_and_cpu(lambda x, y, stream: mx.segmented_mm(x, y, seg, stream=stream),
                            arr((20, 70)), arr((70, 9)))
    _close(got, cpu, dtype, 70, "segmented_mm")
    calls += 1
    for n in (16, 48, 40, 28, 16384):
        x = arr((2, n))
        got, cpu = _gpu_and_cpu(mx.hadamard_transform, x)
        assert _same_bits(got, cpu), n
        calls += 1
    assert on_metal["cpu_fallback"] == 0 and on_metal["builtin"] >= calls


def test_are_no_longer_cpu_fallbacks(on_metal):  # noqa: F811
    for name in ("BlockMaskedMM", "SegmentedMM", "Hadamard"):
        assert mx.kernel_provider("metal", name) == "backend 'metal'"


def _grads(fn, argnums, inputs, stream):
    grad = mx.grad(lambda *x: mx.sum(fn(*x, stream=stream), stream=stream), argnums=argnums)
    grads = grad(*inputs)
    return [np.asarray(g) for g in (grads if isinstance(grads, (tuple, list)) else [grads])]


def test_gradients_on_the_gpu_stream_equal_the_cpu_streams(on_metal):  # noqa: F811
    gen = rng(97)

    def arr(*shape):
        return mx.array(random_array(shape, mx.float32, gen, -1, 1))

    bool_out = mx.array(gen.random((2, 2)) > 0.3)

    def masked(a, b, ml, mr, stream):
        return mx.block_masked_mm(a, b, 32, bool_out, ml, mr, stream=stream)

    def segmented(a, b, stream):
        return mx.segmented_mm(a, b, mx.array(SEGMENTS), stream=stream)

    def hadamard(x, stream):   # H_28 is not symmetric: the vjp is the transposed transform
        return mx.multiply(mx.hadamard_transform(x, 0.5, stream=stream), x, stream=stream)

    cases = [(masked, (0, 1, 2, 3), [arr(40, 70), arr(70, 33), arr(2, 3), arr(3, 2)]),
             (segmented, (0, 1), [arr(20, 70), arr(70, 9)]),
             (hadamard, (0,), [arr(3, 56)])]
    for fn, argnums, inputs in cases:
        gpu = _grads(fn, argnums, inputs, mx.gpu)
        cpu = _grads(fn, argnums, inputs, mx.cpu)
        assert len(gpu) == len(cpu) == len(argnums)
        for g, c in zip(gpu, cpu):
            assert g.shape == c.shape and np.isfinite(c).all()
            np.testing.assert_allclose(g, c, rtol=1e-5, atol=1e-4, err_msg=fn.__name__)
    assert on_metal["cpu_fallback"] == 0, on_metal["cpu_fallback_by_primitive"]
    assert on_metal["builtin"] > 0
