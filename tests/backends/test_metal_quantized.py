"""The Metal backend's quantized products (backends/metal/kernels/quantized.py):
``QuantizedMatmul`` and ``GatherQMM`` in the affine mode, from the packed words.

Two levels, as the other Metal kernel tests:

* the launchers through lazyx's MSL shim (both thread orders) against a float64 product
  of the dequantized weights (``mx.dequantize`` on the CPU: MLX's packing) and against
  the CPU backend's kernel, for every width (2 to 8 bits: 3, 5 and 6 straddle words),
  group sizes, ``transpose`` or not, float32 / float16 / bfloat16, scales of x's dtype or
  float32, broadcast batches and gathered pairs;
* ``stream=mx.gpu`` with the Metal backend emulated on the CPU: counted as built-in, not
  a CPU fallback; the micro-scaled modes are the CPU's kernel, counted as a fallback.
"""

import numpy as np
import pytest

import lazyx.core as mx
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
#: Relative error of one rounding to each output dtype, with a little room.
ROUNDING = {"float32": 2e-7, "float16": 1e-3, "bfloat16": 8e-3}


def _weights(shape, bits, group_size, dtype, gen):
    """Packed affine weights of ``shape`` (quantized on the CPU, MLX's packing) and their
    dequantized float64 values."""
    w = mx.array(random_array(shape, getattr(mx, dtype), gen, -1, 1))
    packed, scales, biases = mx.quantize(w, group_size=group_size, bits=bits, stream=CPU)
    # Dequantized from float32 scales and biases: scale * q + bias unrounded, as the kernel
    # computes it (in x's dtype the weights would be rounded once more).
    deq = mx.dequantize(packed, mx.astype(scales, mx.float32), mx.astype(biases, mx.float32),
                        group_size=group_size, bits=bits, stream=CPU)
    return [np.asarray(a) for a in (packed, scales, biases)], np.asarray(deq).astype(F64)


def _check(got, want, scale, k, dtype):
    assert got.dtype == np.dtype(getattr(mx, dtype).np) and got.shape == want.shape
    tol = ROUNDING[dtype] * np.abs(want) + (k + 2) * 2.0 ** -23 * scale + 1e-30
    bad = ~(np.abs(got.astype(F64) - want) <= tol)
    assert not bad.any(), f"{dtype}: got {got.astype(F64)[bad][:5]}, want {want[bad][:5]}"


def _primitive(bits, group_size, transpose, cls=qp.QuantizedMatmul, mode="affine"):
    return cls(stream=mx.default_stream(mx.gpu), group_size=group_size, bits=bits, mode=mode,
               transpose=transpose)


@pytest.mark.parametrize("order", [run, run_reversed], ids=["forward", "reverse"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("bits,group_size", [(2, 32), (3, 64), (4, 32), (4, 128), (5, 64),
                                             (6, 32), (8, 64)])
@pytest.mark.parametrize("transpose", [True, False], ids=["transpose", "plain"])
def test_quantized_matmul_matches_the_dequantized_product(order, dtype, bits, group_size,
                                                          transpose):
    gen = rng(bits * 100 + group_size)
    k, n = 128, 40 if transpose else max(64, group_size)
    shape = (n, k) if transpose else (k, n)
    weights, deq = _weights(shape, bits, group_size, dtype, gen)
    x = random_array((3, k), getattr(mx, dtype), gen, -1, 1)
    got = quantized.quantized_matmul(_primitive(bits, group_size, transpose), [x, *weights],
                                     order)
    w64 = deq.T if transpose else deq
    want = x.astype(F64) @ w64
    _check(got, want, np.abs(x.astype(F64)) @ np.abs(w64), k, dtype)
    # The CPU backend's kernel on the same packed words: the same numbers within a
    # rounding of each (the CPU's rounds its dequantized weights to x's dtype).
    cpu = mx.quantized_matmul(mx.array(x), *[mx.array(a) for a in weights],
                              transpose=transpose, group_size=group_size, bits=bits, stream=CPU)
    scale = np.abs(x.astype(F64)) @ np.abs(w64)
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


def test_gather_qmm_pairs_and_bounds():
    gen = rng(8)
    mats = [_weights((16, 64), 8, 64, "float32", gen) for _ in range(3)]
    packed, scales, biases = (np.stack([m[0][i] for m in mats]) for i in range(3))
    x = random_array((4, 2, 64), mx.float32, gen, -1, 1)
    lhs = np.array([[3, 0], [1, 1]], np.int32)
    rhs = np.array([[2, 2], [0, 1]], np.int32)
    prim = _primitive(8, 64, True, qp.GatherQMM)
    got = quantized.gather_qmm(prim, [x, packed, scales, biases, lhs, rhs], run)
    assert got.shape == (2, 2, 2, 16)
    for i in range(2):
        for j in range(2):
            w = mats[rhs[i, j]][1].T
            want = x[lhs[i, j]].astype(F64) @ w
            _check(got[i, j], want, np.abs(x[lhs[i, j]].astype(F64)) @ np.abs(w), 64, "float32")
    with pytest.raises(IndexOutOfRangeError, match="gather_qmm"):
        quantized.gather_qmm(prim, [x, packed, scales, biases, lhs, rhs + 2], run)


def test_other_modes_and_dtypes_are_left_to_the_cpu():
    x = np.ones((2, 32), np.float32)
    w = np.zeros((4, 4), np.uint32)
    s = np.ones((4, 1), np.uint8)
    with pytest.raises(UnsupportedDtype, match="mode 'mxfp4'"):
        quantized.quantized_matmul(_primitive(4, 32, True, mode="mxfp4"), [x, w, s], run)
    with pytest.raises(UnsupportedDtype, match="float64"):
        quantized.quantized_matmul(_primitive(4, 32, True),
                                   [x.astype(np.int32).astype(np.float64), w, s, s], run)


def test_through_the_backend_on_the_gpu_stream(on_metal):
    gen = rng(9)
    weights, _ = _weights((48, 128), 4, 64, "bfloat16", gen)
    x = mx.array(random_array((2, 128), mx.bfloat16, gen, -1, 1))
    args = [mx.array(a) for a in weights]
    got = mx.quantized_matmul(x, *args, transpose=True, group_size=64, bits=4, stream=mx.gpu)
    cpu = mx.quantized_matmul(x, *args, transpose=True, group_size=64, bits=4, stream=CPU)
    np.testing.assert_allclose(np.asarray(got).astype(F64), np.asarray(cpu).astype(F64),
                               rtol=1e-2, atol=1e-2)
    assert on_metal["builtin"] >= 1
    assert "QuantizedMatmul" not in on_metal["cpu_fallback_by_primitive"]


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("dtype,out", [("float32", "float32"), ("float16", "float16"),
                                       ("bfloat16", "bfloat16"), ("float16", "float32")])
def test_dequantize_is_the_cpu_kernel_bit_for_bit(bits, dtype, out):
    gen = rng(bits + 50)
    w = mx.array(random_array((5, 2, 64), getattr(mx, dtype), gen, -2, 2))
    packed, scales, biases = (np.asarray(a) for a in
                              mx.quantize(w, group_size=32, bits=bits, stream=CPU))
    prim = qp.Dequantize(mx.default_stream(mx.gpu), 32, bits, "affine", getattr(mx, out))
    got = quantized.dequantize(prim, [packed, scales, biases], run)
    want = mx.dequantize(mx.array(packed), mx.array(scales), mx.array(biases), group_size=32,
                         bits=bits, dtype=getattr(mx, out), stream=CPU)
    assert got.dtype == np.dtype(getattr(mx, out).np) and got.shape == (5, 2, 64)
    np.testing.assert_array_equal(got.view(np.uint8), np.asarray(want).view(np.uint8))


def test_dequantize_on_the_gpu_stream_and_the_float_modes_on_the_cpu(on_metal):
    w = mx.array(random_array((8, 64), mx.float32, rng(60), -1, 1))
    args = mx.quantize(w, group_size=64, bits=4, stream=CPU)
    got = mx.dequantize(*args, group_size=64, bits=4, stream=mx.gpu)
    cpu = mx.dequantize(*args, group_size=64, bits=4, stream=CPU)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(cpu))
    assert "Dequantize" not in on_metal["cpu_fallback_by_primitive"]
    fp4 = mx.quantize(w, group_size=32, bits=4, mode="mxfp4", stream=CPU)
    got = mx.dequantize(*fp4, group_size=32, bits=4, mode="mxfp4", stream=mx.gpu)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(
        mx.dequantize(*fp4, group_size=32, bits=4, mode="mxfp4", stream=CPU)))
    assert on_metal["cpu_fallback_by_primitive"].get("Dequantize") == 1
