"""The Metal backend's quantized kernels (backends/metal/kernels/quantized.py):
``Quantize`` in every mode, and ``Dequantize``, ``QuantizedMatmul`` and ``GatherQMM`` in
the affine mode and the micro-scaled float modes (mxfp4, nvfp4, mxfp8).

Three levels, as the other Metal kernel tests:

* the launchers through lazyx's MSL shim (both thread orders): ``quantize`` bit for bit
  the CPU backend's packed words, scales and biases (every bits x group size x input
  dtype, edge groups, each float mode, nvfp4's global scale); ``dequantize`` bit for
  bit; the products against a float64 product of the dequantized weights and against
  the CPU backend's kernel, for every width (2 to 8 bits: 3, 5 and 6 straddle words),
  group sizes, ``transpose`` or not, float32 / float16 / bfloat16, scales of x's dtype
  or float32, broadcast batches and gathered pairs;
* ``stream=mx.gpu`` with the Metal backend emulated on the CPU: counted as built-in,
  never a CPU fallback, in every mode;
* MLX 0.32.2 where it is installed: ``mx.quantize`` on the emulated Metal path gives
  MLX's words, scales and biases.
"""

import lazyx.core as mx
import numpy as np
import pytest
from helpers import random_array, rng
from lazyx.backends.metal.kernels import quantized
from lazyx.backends.metal.kernels.common import UnsupportedDtype
from lazyx.backends.metal.msl_cpu import shim_available
from lazyx.errors import IndexOutOfRangeError
from lazyx.plugins import quantized as qp
from test_metal_backend import on_metal  # noqa: F401  (the fixture: Metal emulated, stats at 0)
from test_metal_kernels import run, run_reversed

pytestmark = pytest.mark.skipif(not shim_available(), reason="no C++ compiler for the MSL shim")

F64 = np.float64
CPU = mx.default_stream(mx.cpu)
GPU = mx.default_stream(mx.gpu)
ORDERS = pytest.mark.parametrize("order", [run, run_reversed], ids=["forward", "reverse"])
DTYPES = pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
FLOAT_MODES = ["mxfp4", "nvfp4", "mxfp8"]
#: Relative error of one rounding to each output dtype, with a little room.
ROUNDING = {"float32": 2e-7, "float16": 1e-3, "bfloat16": 8e-3}


def _mode_args(mode, group_size=None, bits=None):
    """``(group_size, bits)`` with the mode's defaults (the plugin's table)."""
    m = qp.MODES[mode]
    return group_size or m["group_size"], bits or m["default_bits"]


def _weights(shape, bits, group_size, dtype, gen, mode="affine"):
    """Packed weights of ``shape`` (quantized on the CPU, MLX's packing) and their
    dequantized float64 values."""
    w = mx.array(random_array(shape, getattr(mx, dtype), gen, -1, 1))
    packed = mx.quantize(w, group_size=group_size, bits=bits, mode=mode, stream=CPU)
    if mode == "affine":
        # Dequantized from float32 scales and biases: scale * q + bias unrounded, as the
        # kernel computes it (in x's dtype the weights would be rounded once more).
        deq = mx.dequantize(packed[0], mx.astype(packed[1], mx.float32),
                            mx.astype(packed[2], mx.float32), group_size=group_size,
                            bits=bits, stream=CPU)
    else:  # element times scale: exact in float32
        deq = mx.dequantize(*packed, group_size=group_size, bits=bits, mode=mode,
                            dtype=mx.float32, stream=CPU)
    return [np.asarray(a) for a in packed], np.asarray(deq).astype(F64)


def _check(got, want, scale, k, dtype):
    assert got.dtype == np.dtype(getattr(mx, dtype).np) and got.shape == want.shape
    tol = ROUNDING[dtype] * np.abs(want) + (k + 2) * 2.0 ** -23 * scale + 1e-30
    bad = ~(np.abs(got.astype(F64) - want) <= tol)
    assert not bad.any(), f"{dtype}: got {got.astype(F64)[bad][:5]}, want {want[bad][:5]}"


def _primitive(bits, group_size, transpose, cls=qp.QuantizedMatmul, mode="affine"):
    return cls(stream=GPU, group_size=group_size, bits=bits, mode=mode, transpose=transpose)


def _same_bits(got, want, what=""):
    """Outputs equal bit for bit (dtype, shape and bytes), one by one."""
    assert len(got) == len(want), what
    for j, (g, w) in enumerate(zip(got, want)):
        w = np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, (what, j, g.dtype, g.shape, w.shape)
        bad = g.view(np.uint8).reshape(g.shape + (-1,)) != w.view(np.uint8).reshape(
            w.shape + (-1,))
        assert not bad.any(), (f"{what} output {j}: {int(bad.any(-1).sum())} of {g.size} "
                               f"differ, e.g. {g[bad.any(-1)][:4]} for {w[bad.any(-1)][:4]}")


# -- quantize ------------------------------------------------------------------------------
def _matrix(dtype, gen, n=256):
    """Rows of ``n`` values of ``dtype`` covering what a group can hold: random values over
    magnitudes 1e-4 to 1e4 (3-D: two matrices), then edge rows — all zeros, negative zeros,
    one value repeated, a one-hot row, large magnitudes of both signs (near float16's
    largest), float16 subnormals, E2M1's ties (the quarter points) and a row of a single
    sign."""
    big = 6e4 if dtype == "float16" else 1e30
    rows = [gen.standard_normal((6, n)) * 10.0 ** gen.uniform(-4, 4, (6, 1)),
            np.zeros((1, n)), np.full((1, n), -0.0), np.full((1, n), -2.75),
            np.eye(1, n, 5) * 7.0, gen.choice([-big, big, 0.5 * big], (1, n)),
            gen.choice([3e-8, -1e-7, 6e-8], (1, n)),
            np.resize([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, 6.0], (1, n)) * 16,
            gen.uniform(1, 2, (1, n))]
    w = np.concatenate(rows).astype(np.float32)
    return np.asarray(mx.astype(mx.array(w), getattr(mx, dtype))).reshape(2, -1, n)


def _quantize(mode, group_size, bits, w, order, global_scale=None):
    """The Metal launcher's outputs and the CPU backend's, for ``w`` (NumPy)."""
    ins = [w] + ([np.float32(global_scale).reshape(())] if global_scale is not None else [])
    got = quantized.quantize(qp.Quantize(GPU, group_size, bits, mode), ins, order)
    g = None if global_scale is None else mx.array(global_scale, dtype=mx.float32)
    want = mx.quantize(mx.array(w), group_size, bits, mode, global_scale=g, stream=CPU)
    return got, want


@ORDERS
@DTYPES
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_quantize_affine_is_the_cpu_kernel_bit_for_bit(order, dtype, group_size, bits):
    w = _matrix(dtype, rng(bits * 1000 + group_size))
    got, want = _quantize("affine", group_size, bits, w, order)
    assert [a.shape for a in got] == [(2, 7, 256 * bits // 32)] + [(2, 7, 256 // group_size)] * 2
    _same_bits(got, want, f"affine {bits}-bit, groups of {group_size}")


@ORDERS
@DTYPES
@pytest.mark.parametrize("mode", FLOAT_MODES)
def test_quantize_float_modes_are_the_cpu_kernel_bit_for_bit(order, dtype, mode):
    gs, bits = _mode_args(mode)
    w = _matrix(dtype, rng(len(mode) + 70))
    got, want = _quantize(mode, gs, bits, w, order)
    assert got[1].dtype == np.uint8 and len(got) == 2
    _same_bits(got, want, mode)
    # Magnitudes past E4M3's range (nvfp4's scales saturate at 448) and below 1: every
    # E8M0 exponent path.
    for scale in (3e3, 1e-3):
        w = np.asarray(mx.astype(mx.array(random_array((4, 64), mx.float32, rng(9), -1, 1)
                                          * scale), getattr(mx, dtype)))
        _same_bits(*_quantize(mode, gs, bits, w, order), f"{mode} x {scale}")


@ORDERS
@DTYPES
@pytest.mark.parametrize("amax", ["tensor", 3.0])
def test_quantize_nvfp4_with_a_global_scale(order, dtype, amax):
    w = _matrix(dtype, rng(80))
    w = np.where(np.abs(w.astype(np.float32)) > 1e20, 0, w).astype(w.dtype)   # finite amax
    g = np.abs(w.astype(np.float32)).max() if amax == "tensor" else amax
    got, want = _quantize("nvfp4", 16, 4, w, order, global_scale=g)
    _same_bits(got, want, f"nvfp4, global scale {g}")


@pytest.fixture
def ieee_subnormals():
    """The CPU backend computing subnormals (its default flushes them to zero; MLX and the
    kernels keep them)."""
    previous = mx.set_flush_denormal(False)
    yield
    mx.set_flush_denormal(previous)


def test_quantize_subnormals_as_the_cpu_computes_them_without_flushing(ieee_subnormals):
    """float32 subnormal inputs and scales: the kernel keeps them (IEEE, as MLX), as the
    CPU backend does once its flushing is off."""
    # (rows of one group; amax / 6 or / 448 below 2^-127, and between 2^-127 and 2^-126:
    # E8M0's two subnormal codes)
    w = np.array([[1e-40, -2e-41, 3e-39, 0.0] * 8, [1e-38, 2e-39, -5e-39, 1e-45] * 8,
                  [5e-38, -1e-39, 2e-40, 3e-38] * 8, [4e-36, 1e-37, -3e-36, 0.0] * 8],
                 np.float32)
    for mode, gs, bits in [("affine", 32, 4), ("mxfp4", 32, 4), ("nvfp4", 16, 4),
                           ("mxfp8", 32, 8)]:
        _same_bits(*_quantize(mode, gs, bits, w, run), mode)


def test_quantize_packs_each_group_alone():
    """Every group owns whole words: 3-bit values straddle words inside a group, never
    across two (a value changed in one group leaves the neighbours' words as they were)."""
    w = _matrix("float32", rng(90))[0, :2]
    base = quantized.quantize(qp.Quantize(GPU, 32, 3, "affine"), [w], run)
    w2 = w.copy()
    w2[:, 32:64] = np.linspace(-1, 1, 32, dtype=np.float32)
    changed = quantized.quantize(qp.Quantize(GPU, 32, 3, "affine"), [w2], run)
    words = base[0].reshape(2, -1, 3)   # 32 values x 3 bits: 3 words a group
    assert (changed[0].reshape(2, -1, 3)[:, [0, 2, 3]] == words[:, [0, 2, 3]]).all()
    assert (changed[0].reshape(2, -1, 3)[:, 1] != words[:, 1]).any()


def test_quantize_a_strided_view_and_empty_input():
    w = _matrix("float16", rng(91))[0]
    view = np.asarray(w).T.copy().T                      # Fortran order: a strided input
    got, want = _quantize("affine", 64, 5, view, run)
    _same_bits(got, want, "strided")
    empty = quantized.quantize(qp.Quantize(GPU, 32, 4, "mxfp4"),
                               [np.zeros((0, 64), np.float32)], run)
    assert [a.shape for a in empty] == [(0, 8), (0, 2)]


# -- dequantize ---------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("dtype,out", [("float32", "float32"), ("float16", "float16"),
                                       ("bfloat16", "bfloat16"), ("float16", "float32")])
def test_dequantize_is_the_cpu_kernel_bit_for_bit(bits, dtype, out):
    gen = rng(bits + 50)
    w = mx.array(random_array((5, 2, 64), getattr(mx, dtype), gen, -2, 2))
    packed, scales, biases = (np.asarray(a) for a in
                              mx.quantize(w, group_size=32, bits=bits, stream=CPU))
    prim = qp.Dequantize(GPU, 32, bits, "affine", getattr(mx, out))
    got = quantized.dequantize(prim, [packed, scales, biases], run)
    want = mx.dequantize(mx.array(packed), mx.array(scales), mx.array(biases), group_size=32,
                         bits=bits, dtype=getattr(mx, out), stream=CPU)
    assert got.dtype == np.dtype(getattr(mx, out).np) and got.shape == (5, 2, 64)
    np.testing.assert_array_equal(got.view(np.uint8), np.asarray(want).view(np.uint8))


def _every_code(mode, gen, rows=64):
    """Packed words of ``rows`` rows of 4 groups holding every element code, and scales
    holding every scale code (E4M3's NaNs and negatives, E8M0's 2^-127 and infinity
    included), in random places."""
    gs, bits = _mode_args(mode)
    codes = gen.permuted(np.resize(gen.permutation(1 << bits), (rows, 4 * gs)), axis=1)
    shifts = np.arange(32 // bits, dtype=np.uint32) * bits
    words = np.bitwise_or.reduce(codes.astype(np.uint32).reshape(rows, -1, 32 // bits) << shifts,
                                 axis=-1)
    return words, gen.permutation(256).astype(np.uint8).reshape(rows, 4)


@ORDERS
@DTYPES
@pytest.mark.parametrize("mode", FLOAT_MODES)
def test_dequantize_float_modes_decode_every_code_as_the_cpu(order, dtype, mode,
                                                            ieee_subnormals):
    """(E8M0's 2^-127 makes float32 subnormals: the CPU backend keeps them here.)"""
    gs, bits = _mode_args(mode)
    words, scales = _every_code(mode, rng(len(mode)))
    out = getattr(mx, dtype)
    got = quantized.dequantize(qp.Dequantize(GPU, gs, bits, mode, out), [words, scales], order)
    want = np.asarray(mx.dequantize(mx.array(words), mx.array(scales), group_size=gs,
                                    bits=bits, mode=mode, dtype=out, stream=CPU))
    assert got.dtype == want.dtype and got.shape == want.shape == (64, 4 * gs)
    nan = np.isnan(want.astype(np.float32))    # NaN codes: any NaN (its bits are the CPU's)
    assert (np.isnan(got.astype(np.float32)) == nan).all()
    _same_bits([np.where(nan, 0, got).astype(got.dtype)], [np.where(nan, 0, want).astype(
        want.dtype)], mode)


@ORDERS
@pytest.mark.parametrize("g", [3.0, 1234.5])
def test_dequantize_nvfp4_with_a_global_scale(order, g):
    w = mx.array(random_array((3, 64), mx.float32, rng(61), -4, 4))
    gs_arr = mx.array(g, dtype=mx.float32)
    packed, scales = mx.quantize(w, mode="nvfp4", global_scale=gs_arr, stream=CPU)
    prim = qp.Dequantize(GPU, 16, 4, "nvfp4", mx.float32)
    got = quantized.dequantize(prim, [np.asarray(packed), np.asarray(scales),
                                      np.float32(g).reshape(())], order)
    want = mx.dequantize(packed, scales, mode="nvfp4", global_scale=gs_arr, stream=CPU)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), np.asarray(want).view(np.uint32))


# -- the products -------------------------------------------------------------------------
@ORDERS
@DTYPES
@pytest.mark.parametrize("bits,group_size", [(2, 32), (3, 64), (4, 32), (4, 128), (5, 64),
                                             (6, 32), (8, 64)])
@pytest.mark.parametrize("transpose", [True, False], ids=["transpose", "plain"])
def test_quantized_matmul_matches_the_dequantized_product(order, dtype, bits, group_size,
                                                          transpose):
    _product_matches(order, dtype, transpose, "affine", group_size, bits)


@ORDERS
@DTYPES
@pytest.mark.parametrize("mode", FLOAT_MODES)
@pytest.mark.parametrize("transpose", [True, False], ids=["transpose", "plain"])
def test_quantized_matmul_float_modes(order, dtype, mode, transpose):
    _product_matches(order, dtype, transpose, mode, *_mode_args(mode))


def _product_matches(order, dtype, transpose, mode, group_size, bits):
    gen = rng(bits * 100 + group_size + len(mode))
    k, n = 128, 40 if transpose else max(64, group_size)
    shape = (n, k) if transpose else (k, n)
    weights, deq = _weights(shape, bits, group_size, dtype, gen, mode)
    x = random_array((3, k), getattr(mx, dtype), gen, -1, 1)
    prim = _primitive(bits, group_size, transpose, mode=mode)
    got = quantized.quantized_matmul(prim, [x, *weights], order)
    w64 = deq.T if transpose else deq
    want = x.astype(F64) @ w64
    scale = np.abs(x.astype(F64)) @ np.abs(w64)
    _check(got, want, scale, k, dtype)
    # The CPU backend's kernel on the same packed words: the same numbers within a
    # rounding of each (the CPU's rounds its dequantized weights to x's dtype).
    cpu = mx.quantized_matmul(mx.array(x), *[mx.array(a) for a in weights],
                              transpose=transpose, group_size=group_size, bits=bits, mode=mode,
                              stream=CPU)
    assert (np.abs(got.astype(F64) - np.asarray(cpu).astype(F64))
            <= 2 * ROUNDING[dtype] * (np.abs(want) + scale) + 1e-30).all()


def test_batches_broadcast_and_scales_in_float32():
    gen = rng(7)
    weights, deq = [], []
    for _ in range(2):
        wq, d = _weights((24, 64), 4, 32, "float32", gen)
        weights.append(wq)
        deq.append(d)
    packed = np.stack([w[0] for w in weights])          # (2, 24, 8): two weight matrices
    scales = np.stack([w[1] for w in weights])
    biases = np.stack([w[2] for w in weights])
    x = random_array((3, 1, 5, 64), mx.bfloat16, gen, -1, 1)  # batch (3, 1) against (2,)
    got = quantized.quantized_matmul(_primitive(4, 32, True),
                                     [x, packed, scales.astype(np.float32), biases], run)
    assert got.shape == (3, 2, 5, 24) and got.dtype == x.dtype
    want = x.astype(F64) @ np.swapaxes(np.stack(deq), -1, -2)
    _check(got, want, np.abs(x.astype(F64)) @ np.abs(np.swapaxes(np.stack(deq), -1, -2)), 64,
           "bfloat16")


@pytest.mark.parametrize("mode", ["affine"] + FLOAT_MODES)
def test_gather_qmm_pairs_and_bounds(mode):
    gen = rng(8)
    gs, bits = _mode_args(mode, 64 if mode == "affine" else None, 8 if mode == "affine" else None)
    mats = [_weights((16, 64), bits, gs, "float32", gen, mode) for _ in range(3)]
    parts = [np.stack([m[0][i] for m in mats]) for i in range(len(mats[0][0]))]
    x = random_array((4, 2, 64), mx.float32, gen, -1, 1)
    lhs = np.array([[3, 0], [1, 1]], np.int32)
    rhs = np.array([[2, 2], [0, 1]], np.int32)
    prim = _primitive(bits, gs, True, qp.GatherQMM, mode)
    got = quantized.gather_qmm(prim, [x, *parts, lhs, rhs], run)
    assert got.shape == (2, 2, 2, 16)
    for i in range(2):
        for j in range(2):
            w = mats[rhs[i, j]][1].T
            want = x[lhs[i, j]].astype(F64) @ w
            _check(got[i, j], want, np.abs(x[lhs[i, j]].astype(F64)) @ np.abs(w), 64, "float32")
    with pytest.raises(IndexOutOfRangeError, match="gather_qmm"):
        quantized.gather_qmm(prim, [x, *parts, lhs, rhs + 2], run)


def test_dtypes_without_a_version_are_left_to_the_cpu():
    x = np.ones((2, 32), np.float32)
    w = np.zeros((4, 4), np.uint32)
    s = np.ones((4, 1), np.uint8)
    with pytest.raises(UnsupportedDtype, match="float64"):
        quantized.quantized_matmul(_primitive(4, 32, True),
                                   [x.astype(np.float64), w, s, s], run)
    with pytest.raises(UnsupportedDtype, match="float64"):
        quantized.quantize(qp.Quantize(GPU, 32, 4, "mxfp4"), [x.astype(np.float64)], run)
    with pytest.raises(UnsupportedDtype, match="one dtype"):
        quantized.dequantize(qp.Dequantize(GPU, 32, 4, "affine", mx.float32),
                             [w, s.astype(np.float16), s.astype(np.float32)], run)


# -- through the backend (Metal emulated on the CPU) ----------------------------------------
def _no_fallback(stats, *names):
    assert stats["builtin"] >= 1
    for name in names:
        assert name not in stats["cpu_fallback_by_primitive"], stats


def test_through_the_backend_on_the_gpu_stream(on_metal):  # noqa: F811
    gen = rng(9)
    weights, _ = _weights((48, 128), 4, 64, "bfloat16", gen)
    x = mx.array(random_array((2, 128), mx.bfloat16, gen, -1, 1))
    args = [mx.array(a) for a in weights]
    got = mx.quantized_matmul(x, *args, transpose=True, group_size=64, bits=4, stream=mx.gpu)
    cpu = mx.quantized_matmul(x, *args, transpose=True, group_size=64, bits=4, stream=CPU)
    np.testing.assert_allclose(np.asarray(got).astype(F64), np.asarray(cpu).astype(F64),
                               rtol=1e-2, atol=1e-2)
    _no_fallback(on_metal, "QuantizedMatmul")


@pytest.mark.parametrize("mode,group_size,bits", [("affine", 64, 4), ("affine", 32, 3),
                                                  ("affine", 128, 8), ("mxfp4", 32, 4),
                                                  ("nvfp4", 16, 4), ("mxfp8", 32, 8)])
def test_quantize_on_the_gpu_stream(on_metal, mode, group_size, bits):  # noqa: F811
    w = mx.array(_matrix("bfloat16", rng(group_size + bits)))
    got = mx.quantize(w, group_size, bits, mode, stream=mx.gpu)
    want = mx.quantize(w, group_size, bits, mode, stream=CPU)
    _same_bits([np.asarray(a) for a in got], want, mode)
    _no_fallback(on_metal, "Quantize")
    assert on_metal["builtin"] == 1


def test_nvfp4_global_scale_and_qqmm_on_the_gpu_stream(on_metal):  # noqa: F811
    gen = rng(92)
    w = mx.array(random_array((32, 64), mx.float32, gen, -3, 3))
    x = mx.array(random_array((4, 64), mx.float32, gen, -1, 1))
    g = mx.array(3.0, dtype=mx.float32)

    def outputs(stream):
        packed = mx.quantize(w, mode="nvfp4", global_scale=g, stream=stream)
        deq = mx.dequantize(*packed, mode="nvfp4", global_scale=g, stream=stream)
        return [np.asarray(a) for a in (*packed, deq, mx.qqmm(x, w, mode="mxfp4", stream=stream))]

    got, want = outputs(mx.gpu), outputs(CPU)
    _same_bits(got[:3], want[:3], "nvfp4 with a global scale")
    np.testing.assert_allclose(got[3], want[3], rtol=1e-5, atol=1e-5)
    _no_fallback(on_metal, "Quantize", "Dequantize", "QuantizedMatmul")


def test_float_modes_on_the_gpu_stream(on_metal):  # noqa: F811
    w = mx.array(random_array((8, 64), mx.float32, rng(60), -1, 1))
    args = mx.quantize(w, group_size=64, bits=4, stream=CPU)
    got = mx.dequantize(*args, group_size=64, bits=4, stream=mx.gpu)
    cpu = mx.dequantize(*args, group_size=64, bits=4, stream=CPU)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(cpu))
    x = mx.array(random_array((2, 3, 64), mx.float16, rng(61), -1, 1))
    for mode in FLOAT_MODES:
        packed = mx.quantize(w, mode=mode, stream=CPU)
        got = mx.dequantize(*packed, mode=mode, stream=mx.gpu)
        np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(
            mx.dequantize(*packed, mode=mode, stream=CPU)).view(np.uint16))
        qmm = [mx.quantized_matmul(x, *packed, mode=mode, stream=s) for s in (mx.gpu, CPU)]
        np.testing.assert_allclose(*[np.asarray(a).astype(F64) for a in qmm], rtol=2e-3,
                                   atol=2e-3)
        idx = mx.array(np.array([1, 0, 1], np.int32))
        gq = [mx.gather_qmm(x, *[mx.stack([a, a]) for a in packed], lhs_indices=idx,
                            rhs_indices=idx, mode=mode, stream=s) for s in (mx.gpu, CPU)]
        np.testing.assert_allclose(*[np.asarray(a).astype(F64) for a in gq], rtol=2e-3,
                                   atol=2e-3)
    _no_fallback(on_metal, "Dequantize", "QuantizedMatmul", "GatherQMM")
    assert on_metal["cpu_fallback"] == 0


# -- against MLX ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode,group_size,bits", [("affine", 64, 4), ("affine", 32, 3),
                                                  ("affine", 128, 6), ("affine", 64, 5),
                                                  ("mxfp4", None, None), ("nvfp4", None, None),
                                                  ("mxfp8", None, None)])
@DTYPES
def test_quantize_on_metal_gives_mlx_words(on_metal, mode, group_size, bits, dtype):  # noqa: F811
    mlx = pytest.importorskip("mlx.core")
    gen = rng(group_size or 7)
    w = (gen.standard_normal((3, 4, 256)) * 10.0 ** gen.uniform(-2, 3, (3, 4, 1))).astype(
        np.float32)
    w[0, 0, :32] = 0            # an all-zero group
    w[0, 1, :32] = 2.5          # a constant group
    got = mx.quantize(mx.astype(mx.array(w), getattr(mx, dtype)), group_size, bits, mode,
                      stream=mx.gpu)
    want = mlx.quantize(mlx.array(w).astype(getattr(mlx, dtype)), group_size, bits, mode=mode)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        if dtype == "bfloat16" and a.dtype == mx.bfloat16:   # NumPy has no bfloat16 of MLX's
            a, b = mx.astype(a, mx.float32), b.astype(mlx.float32)
        np.testing.assert_array_equal(np.asarray(a), np.array(b))
    _no_fallback(on_metal, "Quantize")
