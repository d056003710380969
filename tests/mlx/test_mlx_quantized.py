"""``quantize``/``dequantize``/``quantized_matmul``/``gather_qmm``/``qqmm`` against MLX
0.32.2: the same calls on both.

Packing is compared bit for bit (the uint32 words, the scales and the biases) over
every mode, bits, group size and input dtype, so weights quantized by MLX load into
lazyx and multiply to MLX's numbers; results of the products within float32
tolerance; bad input raises the same built-in exception type.
"""

import numpy as np
import pytest
import lazyx.core as lx
from mlx_compat import mlx, requires_mlx, same

pytestmark = requires_mlx

GEN = np.random.default_rng(14)
AFFINE = [(gs, b) for gs in (32, 64, 128) for b in (2, 3, 4, 5, 6, 8)]
FLOAT_MODES = ["mxfp4", "mxfp8", "nvfp4"]
TOL = {"rtol": 2e-4, "atol": 2e-4}


def _weights(shape=(3, 5, 256), dtype=np.float32, scale=1.0):
    w = (GEN.standard_normal(shape) * scale).astype(np.float32)
    w.reshape(-1, w.shape[-1])[0, :32] = 0          # an all-zero group
    w.reshape(-1, w.shape[-1])[1, :32] = 2.5        # a constant group
    return w


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("gs,bits", AFFINE)
def test_affine_packing_is_bit_identical(gs, bits, dtype):
    w = _weights(scale=GEN.uniform(0.01, 20))
    same(lambda m: list(m.quantize(m.array(w).astype(getattr(m, dtype)), gs, bits)), rtol=0)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("mode", FLOAT_MODES)
@pytest.mark.parametrize("scale", [1e-3, 1.0, 300.0])
def test_float_mode_packing_is_bit_identical(mode, dtype, scale):
    w = _weights(scale=scale)
    same(lambda m: list(m.quantize(m.array(w).astype(getattr(m, dtype)), mode=mode)), rtol=0)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_packing_over_magnitudes(dtype, seed):
    """Magnitudes from 1e-5 to 1e4: subnormal float16 quotients and E4M3 saturation."""
    gen = np.random.default_rng(seed)
    gs, bits = int(gen.choice([32, 64, 128])), int(gen.choice([2, 3, 4, 5, 6, 8]))
    w = (gen.standard_normal((4, 256)) * 10.0 ** gen.uniform(-5, 4)).astype(np.float32)
    for mode, g, b in [("affine", gs, bits)] + [(m, None, None) for m in FLOAT_MODES]:
        same(lambda m, g=g, b=b, mode=mode: list(m.quantize(m.array(w).astype(getattr(m, dtype)),
                                                             g, b, mode)), rtol=0)


def test_ties_and_saturation_as_mlx():
    # E2M1 ties (0.25, 0.75, ... times the scale) and nvfp4 scales beyond E4M3's range
    row = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4, np.float32)
    w = np.stack([row * 16, -row, row * 1e4, row * 3e3]).astype(np.float32)
    for mode in FLOAT_MODES:
        same(lambda m, mode=mode: list(m.quantize(m.array(w), mode=mode)), rtol=0)


@pytest.mark.parametrize("mode,gs,bits", [("affine", 64, 4), ("affine", 32, 3),
                                          ("affine", 128, 6), ("mxfp4", None, None),
                                          ("mxfp8", None, None), ("nvfp4", None, None)])
def test_mlx_weights_load_and_dequantize(mode, gs, bits):
    """Packed arrays made by MLX dequantize and multiply in lazyx to MLX's numbers."""
    import lazyx.core as lx
    import mlx.core as mlx
    w = _weights((64, 128))
    packed = [np.array(a) for a in mlx.quantize(mlx.array(w), gs, bits, mode=mode)]
    x = GEN.standard_normal((2, 3, 128)).astype(np.float32)

    def run(m):
        args = [m.array(a) for a in packed]
        biases = args[2] if mode == "affine" else None
        deq = m.dequantize(args[0], args[1], biases, gs, bits, mode=mode, dtype=m.float32)
        out = m.quantized_matmul(m.array(x), args[0], args[1], biases, True, gs, bits, mode)
        return [deq, out]
    got = same(run, **TOL)
    assert got is not None and isinstance(got[0], lx.array)


@pytest.mark.parametrize("mode", ["affine"] + FLOAT_MODES)
def test_dequantize_default_dtype(mode):
    w = _weights((4, 64)).astype(np.float16)

    def run(m):
        return m.dequantize(*m.quantize(m.array(w), mode=mode), mode=mode)
    same(run, **TOL)


@pytest.mark.parametrize("transpose", [True, False])
@pytest.mark.parametrize("mode,gs,bits", [("affine", 64, 4), ("affine", 32, 5),
                                          ("affine", 128, 8), ("affine", 32, 2),
                                          ("mxfp4", None, None), ("mxfp8", None, None),
                                          ("nvfp4", None, None)])
def test_quantized_matmul(mode, gs, bits, transpose):
    w = _weights((2, 128, 256) if transpose else (2, 256, 128))
    x = GEN.standard_normal((2, 3, 256)).astype(np.float32)

    def run(m):
        q = m.quantize(m.array(w), gs, bits, mode=mode)
        b = q[2] if mode == "affine" else None
        return m.quantized_matmul(m.array(x), q[0], q[1], b, transpose, gs, bits, mode)
    same(run, **TOL)


@pytest.mark.parametrize("xdtype,sdtype", [("float16", "float32"), ("float16", "float16"),
                                           ("bfloat16", "bfloat16")])
def test_quantized_matmul_dtypes(xdtype, sdtype):
    w = _weights((32, 64))
    x = GEN.standard_normal((3, 64)).astype(np.float32)

    def run(m):
        q, s, b = m.quantize(m.array(w).astype(getattr(m, sdtype)), 32, 4)
        return m.quantized_matmul(m.array(x).astype(getattr(m, xdtype)), q, s, b, True, 32, 4)
    # MLX's CPU kernel accumulates bfloat16 products in bfloat16 (lazyx in float32)
    same(run, rtol=2e-2, atol=0.3 if xdtype == "bfloat16" else 2e-2)


@pytest.mark.parametrize("mode", ["affine", "mxfp4"])
def test_gather_qmm(mode):
    w = _weights((3, 32, 64))
    x = GEN.standard_normal((4, 2, 64)).astype(np.float32)
    lhs = np.array([[0], [3], [1]], np.uint32)
    rhs = np.array([2, 0, 1, 1], np.int32)

    def run(m):
        q = m.quantize(m.array(w), mode=mode, group_size=32)
        b = q[2] if mode == "affine" else None
        return [m.gather_qmm(m.array(x), q[0], q[1], b, m.array(lhs), m.array(rhs),
                             group_size=32, mode=mode),
                m.gather_qmm(m.array(x[:3]), q[0], q[1], b, group_size=32, mode=mode,
                             transpose=True),
                m.gather_qmm(m.array(x[0]), q[0], q[1], b, rhs_indices=m.array(rhs[:2]),
                             group_size=32, mode=mode)]
    same(run, **TOL)


@pytest.mark.parametrize("mode", FLOAT_MODES)
def test_qqmm_decode_shaped(mode):
    """MLX's CPU runs qqmm for one row of x with packed weights (elsewhere it raises)."""
    w = _weights((16, 64))
    x = GEN.standard_normal((1, 64)).astype(np.float32)
    same(lambda m: m.qqmm(m.array(x), *m.quantize(m.array(w), mode=mode), mode=mode),
         rtol=3e-2, atol=3e-2)


def test_gradient_with_respect_to_x():
    w = _weights((32, 64))
    x = GEN.standard_normal((3, 64)).astype(np.float32)
    c = GEN.standard_normal((3, 32)).astype(np.float32)

    def run(m):
        q, s, b = m.quantize(m.array(w), 32, 4)
        f = lambda v: (m.quantized_matmul(v, q, s, b, True, 32, 4) * m.array(c)).sum()
        g = lambda v: (m.quantized_matmul(v[:, :32], q, s, b, False, 32, 4)).sum()
        return [m.grad(f)(m.array(x)), m.grad(g)(m.array(x))]
    same(run, **TOL)


BAD = {
    "group size": lambda m: m.quantize(m.zeros((2, 64)), 48),
    "bits": lambda m: m.quantize(m.zeros((2, 64)), 64, 7),
    "mode": lambda m: m.quantize(m.zeros((2, 64)), mode="int4"),
    "one dim": lambda m: m.quantize(m.zeros((64,))),
    "not divisible": lambda m: m.quantize(m.zeros((2, 48)), 32),
    "integer w": lambda m: m.quantize(m.zeros((2, 64), m.int32)),
    "mx group size": lambda m: m.quantize(m.zeros((2, 64)), 64, mode="mxfp4"),
    "mx bits": lambda m: m.quantize(m.zeros((2, 64)), 32, 8, mode="mxfp4"),
    "float packed": lambda m: m.dequantize(m.zeros((2, 8)), m.zeros((2, 1)), m.zeros((2, 1))),
    "scales shape": lambda m: m.dequantize(m.zeros((2, 8), m.uint32), m.zeros((2, 2)),
                                           m.zeros((2, 2))),
    "no biases": lambda m: m.dequantize(m.zeros((2, 8), m.uint32), m.zeros((2, 1))),
    "qmm K": lambda m: m.quantized_matmul(m.zeros((2, 32)), m.zeros((8, 8), m.uint32),
                                          m.zeros((8, 1)), m.zeros((8, 1))),
    "qmm float w": lambda m: m.quantized_matmul(m.zeros((2, 64)), m.zeros((8, 8)),
                                                m.zeros((8, 1)), m.zeros((8, 1))),
    "qmm biases shape": lambda m: m.quantized_matmul(m.zeros((2, 64)),
                                                     m.zeros((8, 8), m.uint32),
                                                     m.zeros((8, 1)), m.zeros((8, 2))),
    "gather float indices": lambda m: m.gather_qmm(
        m.zeros((2, 64)), m.zeros((3, 8, 8), m.uint32), m.zeros((3, 8, 1)),
        m.zeros((3, 8, 1)), rhs_indices=m.array([0.0, 1.0])),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_raises_mlx_type(case):
    same(BAD[case])


@pytest.mark.parametrize("mode", FLOAT_MODES)
def test_gather_qqmm_where_mlx_refuses(mode):
    """MLX's CPU build raises for every gather_qqmm (a deliberate difference, listed in
    docs/mlx-differences.md); lazyx computes it: the same numbers as MLX's qqmm of the
    gathered rows and matrices, which MLX does run for one row of x."""
    w = _weights((3, 16, 64))
    x = GEN.standard_normal((2, 1, 64)).astype(np.float32)
    lhs, rhs = np.array([1, 0], np.int32), np.array([2, 0], np.int32)
    with pytest.raises(RuntimeError):
        mlx.eval(mlx.gather_qqmm(mlx.array(x), *mlx.quantize(mlx.array(w), mode=mode),
                                 lhs_indices=mlx.array(lhs), rhs_indices=mlx.array(rhs),
                                 mode=mode))
    got = lx.gather_qqmm(lx.array(x), *lx.quantize(lx.array(w), mode=mode),
                         lhs_indices=lx.array(lhs), rhs_indices=lx.array(rhs), mode=mode)
    want = [np.asarray(mlx.qqmm(mlx.array(x[i]), *mlx.quantize(mlx.array(w[j]), mode=mode),
                                mode=mode)) for i, j in zip(lhs, rhs)]
    np.testing.assert_allclose(np.asarray(got), np.stack(want), rtol=3e-2, atol=3e-2)


# -- nvfp4 global scale ----------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("which", ["amax", "random"])
def test_global_scale_packing_and_values_are_bit_identical(dtype, which):
    """quantize with a global scale: scale codes and words bit for bit; dequantize's
    values (float32 whatever dtype asks, as MLX) exactly."""
    gen = np.random.default_rng(3 if which == "amax" else 4)
    for _ in range(3):
        w = (gen.standard_normal((6, 64)) * 10.0 ** gen.uniform(-3, 3)).astype(np.float32)
        w[0, :16] = 0
        g = np.float32(np.abs(w).max() if which == "amax" else gen.uniform(0.1, 1000))
        same(lambda m: list(m.quantize(m.array(w).astype(getattr(m, dtype)), mode="nvfp4",
                                       global_scale=m.array(g))), rtol=0)
        same(lambda m: m.dequantize(*m.quantize(m.array(w).astype(getattr(m, dtype)),
                                                mode="nvfp4", global_scale=m.array(g)),
                                    mode="nvfp4", global_scale=m.array(g),
                                    dtype=getattr(m, dtype)), rtol=0)


@pytest.mark.parametrize("call", [
    lambda m: m.quantize(m.zeros((2, 32)), mode="mxfp4", global_scale=m.array(1.0)),
    lambda m: m.quantize(m.zeros((2, 32)), mode="affine", group_size=32,
                         global_scale=m.array(1.0)),
    lambda m: m.quantize(m.zeros((2, 32)), mode="nvfp4", global_scale=m.array([1.0, 2.0])),
    lambda m: m.quantize(m.zeros((2, 32)), mode="nvfp4",
                         global_scale=m.array(1.0, dtype=m.float16)),
    lambda m: m.quantize(m.zeros((2, 32)), mode="nvfp4", global_scale=2.0),
    lambda m: m.dequantize(*m.quantize(m.zeros((2, 32)), mode="mxfp8"), mode="mxfp8",
                           global_scale=m.array(1.0)),
    lambda m: m.qqmm(m.zeros((1, 32)), m.zeros((4, 32)), global_scale_x=m.array(1.0)),
    lambda m: m.qqmm(m.zeros((1, 32)), m.zeros((4, 32)), mode="mxfp8",
                     global_scale_x=m.array(1.0), global_scale_w=m.array(1.0)),
])
def test_global_scale_bad_input_as_mlx(call):
    same(call)


def test_quantized_matmul_decode_rows_and_stored_scale_dtypes():
    """The decode-shaped kernel (1..8 rows) with float16 scales read as stored (bfloat16
    is checked against float64 in tests/plugins: MLX sums bfloat16 products in bfloat16,
    lazyx in float32, so they differ by more than a tolerance can tell from a bug)."""
    gen = np.random.default_rng(9)
    w = gen.standard_normal((40, 256)).astype(np.float32)
    for dtype in ("float16",):
        for rows in (1, 3, 8):
            x = gen.standard_normal((rows, 256)).astype(np.float32)
            same(lambda m: m.quantized_matmul(m.array(x).astype(getattr(m, dtype)),
                                              *m.quantize(m.array(w).astype(getattr(m, dtype)),
                                                          64, 4), True, 64, 4),
                 rtol=3e-2, atol=0.2)  # MLX sums float16/bfloat16 rows of 256 in their dtype
