"""The tensor-core flash-attention forward kernel (backends/cuda/flash_attention.py)
against a float64 reference of the rounded inputs: head dimensions 64 and 128,
float16 and bfloat16, causal or not, ``Tq == Tk`` and ``Tq < Tk``, lengths that are
not multiples of the 64-row tiles, grouped-query heads; then the dispatch through
``mx.fast.scaled_dot_product_attention`` on the GPU (flash path and the cases it
leaves to the general kernel).

Skips without CuPy or a CUDA device.
"""

import math

import ml_dtypes
import numpy as np
import pytest

import lazyx.core as mx
from lazyx.backend import backends

CUDA = backends()["cuda"]
pytestmark = pytest.mark.skipif(not CUDA.is_available(),
                                reason=f"cuda backend unavailable: {CUDA.unavailable_reason()}")

DTYPES = {"float16": (np.float16, 5e-3), "bfloat16": (ml_dtypes.bfloat16, 3e-2)}


@pytest.fixture(scope="module")
def flash():
    from lazyx.backends.cuda import flash_attention  # needs CuPy: only once a GPU is there
    return flash_attention


def _inputs(rng, b, hq, hkv, tq, tk, d, dtype):
    q = rng.standard_normal((b, hq, tq, d)).astype(dtype)
    k = rng.standard_normal((b, hkv, tk, d)).astype(dtype)
    v = rng.standard_normal((b, hkv, tk, d)).astype(dtype)
    return q, k, v


def _reference(q, k, v, scale, causal):
    """softmax(scale q kᵀ) v in float64 from the (rounded) inputs; causal lower-right
    aligned as MLX."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, 1), np.repeat(v, g, 1)
    s = scale * q @ np.swapaxes(k, -1, -2)
    if causal:
        tq, tk = q.shape[2], k.shape[2]
        s = np.where(np.arange(tk)[None, :] > np.arange(tq)[:, None] + (tk - tq), -np.inf, s)
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


# (B, Hq, Hkv, Tq, Tk): tiles full and partial, one query, Tq < Tk, GQA and MQA
SHAPES = [
    (1, 2, 2, 64, 64),
    (2, 4, 2, 63, 63),
    (1, 2, 1, 65, 65),
    (1, 4, 4, 200, 200),
    (1, 2, 2, 1, 1),
    (2, 2, 1, 1, 200),
    (1, 3, 1, 65, 200),
    (1, 2, 2, 130, 193),
]


#: Every kernel the launcher can choose: keys per tile.
KERNELS = [64, 32]


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: f"keys{k}")
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("causal", [False, True], ids=["none", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_flash_matches_reference(flash, shape, causal, dtype, d, kernel):
    import cupy as cp  # the GPU's array library; present once the skip did not fire
    np_dtype, tol = DTYPES[dtype]
    b, hq, hkv, tq, tk = shape
    q, k, v = _inputs(np.random.default_rng(sum(shape) + d), b, hq, hkv, tq, tk, d, np_dtype)
    scale = 1.0 / math.sqrt(d)
    out = flash.flash_attention(cp.asarray(q), cp.asarray(k), cp.asarray(v), scale, causal,
                                kernel=kernel)
    assert out is not None, "the flash kernel should cover this case"
    assert out.shape == (b, hq, tq, d) and out.dtype == q.dtype
    got = cp.asnumpy(out).astype(np.float64)
    np.testing.assert_allclose(got, _reference(q, k, v, scale, causal), atol=tol, rtol=tol)


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: f"keys{k}")
def test_flash_long_causal_sequence(flash, kernel):
    # many key tiles per query tile: the online softmax's rescaling across 32 tiles
    import cupy as cp
    q, k, v = _inputs(np.random.default_rng(7), 1, 2, 1, 2048, 2048, 128, ml_dtypes.bfloat16)
    scale = 0.125
    out = flash.flash_attention(cp.asarray(q), cp.asarray(k), cp.asarray(v), scale, True,
                                kernel=kernel)
    np.testing.assert_allclose(cp.asnumpy(out).astype(np.float64),
                               _reference(q, k, v, scale, True), atol=3e-2, rtol=3e-2)


def test_flash_declines_uncovered_cases(flash):
    import cupy as cp
    rng = np.random.default_rng(3)
    cases = [
        (_inputs(rng, 1, 2, 2, 8, 8, 96, np.float16), False),   # head dim 96
        (_inputs(rng, 1, 2, 2, 8, 8, 64, np.float32), False),   # float32
        (_inputs(rng, 1, 2, 2, 9, 4, 64, np.float16), True),    # causal with Tq > Tk
    ]
    for (q, k, v), causal in cases:
        assert flash.flash_attention(cp.asarray(q), cp.asarray(k), cp.asarray(v), 0.1,
                                     causal) is None


@pytest.mark.parametrize("shape,d,mask", [
    ((1, 4, 2, 100, 100), 128, "causal"),   # the flash kernel
    ((1, 2, 2, 37, 90), 64, None),          # the flash kernel, Tq < Tk
    ((1, 2, 2, 9, 4), 64, "causal"),        # Tq > Tk: the general kernel
    ((1, 2, 1, 20, 20), 96, "causal"),      # head dim 96: the general kernel
])
def test_sdpa_on_gpu_dispatches(shape, d, mask):
    b, hq, hkv, tq, tk = shape
    q, k, v = _inputs(np.random.default_rng(11), b, hq, hkv, tq, tk, d, np.float16)
    scale = 1.0 / math.sqrt(d)
    with mx.stream(mx.gpu):
        out = mx.fast.scaled_dot_product_attention(mx.array(q), mx.array(k), mx.array(v),
                                                   scale=scale, mask=mask)
        mx.eval(out)
    got = np.asarray(out).astype(np.float64)
    if tq > tk and mask == "causal":
        # rows that see no key average every key (MLX's finite masked value)
        want = np.asarray(mx.fast.scaled_dot_product_attention(
            mx.array(q), mx.array(k), mx.array(v), scale=scale, mask=mask,
            stream=mx.cpu)).astype(np.float64)
    else:
        want = _reference(q, k, v, scale, mask == "causal")
    np.testing.assert_allclose(got, want, atol=5e-3, rtol=5e-3)
