"""QuantizedLinear, QuantizedEmbedding, QQLinear and the sharded layers' quantized forms:
against a NumPy float64 product with the dequantized weight, against MLX on the same
packed weights (every mode), freezing, train/eval switching of QQLinear, bad input."""

from __future__ import annotations

import numpy as np
import pytest

import lazyx.core as mx
import lazyx.nn as nn
from lazyx.errors import ArgumentError, ShapeError

from layer_checks import assert_matches_mlx, mlx_core, mlx_nn, requires_mlx, same_weights

MODES = ["affine", "mxfp4", "nvfp4", "mxfp8"]


def dequantized(layer):
    return np.array(mx.dequantize(layer.weight, layer.scales, layer.get("biases"),
                                  layer.group_size, layer.bits, mode=layer.mode).astype(mx.float32),
                    dtype=np.float64)


@pytest.mark.parametrize("mode", MODES)
def test_quantized_linear_matches_numpy(mode):
    lin = nn.Linear(64, 8)
    q = nn.QuantizedLinear.from_linear(lin, mode=mode)
    x = np.random.default_rng(0).standard_normal((3, 64))
    w = dequantized(q)
    # The quantized weight stays close to the float one it came from.
    assert np.abs(w - np.array(lin.weight)).max() < 0.3 * np.abs(np.array(lin.weight)).max()
    ref = x @ w.T + np.array(lin.bias)
    np.testing.assert_allclose(np.array(q(mx.array(x, dtype=mx.float32))), ref, rtol=1e-4, atol=1e-4)
    assert q.trainable_parameters() == {}


@pytest.mark.parametrize("mode", ["affine", "mxfp8"])
def test_quantized_embedding_matches_numpy(mode):
    emb = nn.Embedding(10, 64)
    q = nn.QuantizedEmbedding.from_embedding(emb, mode=mode)
    table = dequantized(q)
    idx = np.array([[1, 3], [9, 0]])
    np.testing.assert_allclose(np.array(q(mx.array(idx)).astype(mx.float32)), table[idx], rtol=1e-2, atol=1e-6)
    x = np.random.default_rng(1).standard_normal((2, 64))
    np.testing.assert_allclose(np.array(q.as_linear(mx.array(x, dtype=mx.float32))), x @ table.T,
                               rtol=1e-4, atol=1e-4)


@requires_mlx
@pytest.mark.parametrize("mode", MODES)
def test_matches_mlx(mode):
    x = np.random.default_rng(2).standard_normal((3, 64)).astype(np.float32)
    ref = mlx_nn.QuantizedLinear(64, 8, mode=mode)
    q = same_weights(ref, nn.QuantizedLinear(64, 8, mode=mode))
    assert repr(q) == repr(ref)
    assert sorted(q) == sorted(ref)
    assert_matches_mlx(q(mx.array(x)), ref(mlx_core.array(x)), rtol=1e-4, atol=1e-5)
    ref = mlx_nn.QuantizedEmbedding(10, 64, mode=mode)
    q = same_weights(ref, nn.QuantizedEmbedding(10, 64, mode=mode))
    assert repr(q) == repr(ref)
    idx = np.array([[1, 3], [9, 0]])
    got, want = q(mx.array(idx)), ref(mlx_core.array(idx))
    assert str(got.dtype).split(".")[-1] == str(want.dtype).split(".")[-1]
    assert_matches_mlx(got, want)
    assert_matches_mlx(q.as_linear(mx.array(x)), ref.as_linear(mlx_core.array(x)), rtol=1e-4, atol=1e-5)


@requires_mlx
def test_sharded_quantized_layers_match_mlx():
    x = np.random.default_rng(3).standard_normal((3, 64)).astype(np.float32)
    for name in ["QuantizedAllToShardedLinear", "QuantizedShardedToAllLinear"]:
        ref = getattr(mlx_nn, name)(64, 8)
        q = same_weights(ref, getattr(nn, name)(64, 8))
        assert repr(q) == repr(ref)
        assert q.trainable_parameters() == {}
        assert q.unfreeze().trainable_parameters() == {}
        assert_matches_mlx(q(mx.array(x)), ref(mlx_core.array(x)), rtol=1e-4, atol=1e-5)


def test_qqlinear_train_and_eval():
    lin = nn.Linear(64, 8, bias=False)
    q = nn.QQLinear.from_linear(lin)
    assert repr(q) == "QQLinear(input_dims=64, output_dims=8, group_size=16, bits=4, mode=nvfp4)"
    x = mx.random.normal((3, 64))
    y_train = q(x)
    assert sorted(q.trainable_parameters()) == ["weight"]
    q.eval()
    assert q.weight.dtype == mx.uint32 and "scales" in q
    np.testing.assert_allclose(np.array(q(x)), np.array(y_train), rtol=1e-5, atol=1e-5)
    q.train()
    assert "scales" not in q and q.weight.shape == (8, 64)
    # The product of the quantized input and weight stays close to the float product.
    full = np.array(x) @ np.array(lin.weight).T
    assert np.abs(np.array(y_train) - full).max() < 0.25 * np.abs(full).max()


def test_nn_quantize_replaces_linear_layers():
    model = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 8))
    nn.quantize(model, group_size=32, bits=8)
    assert [type(m).__name__ for m in model.layers] == ["QuantizedLinear"] * 2
    assert model.layers[0].group_size == 32 and model.layers[0].bits == 8
    assert model(mx.zeros((2, 64))).shape == (2, 8)


def test_bad_input():
    q = nn.QuantizedLinear(64, 8)
    with pytest.raises(ShapeError, match=r"\[QuantizedLinear\].*\(3, 32\).*weight \(unpacked\) of shape \(8, 64\)"):
        q(mx.zeros((3, 32)))
    with pytest.raises(ArgumentError, match=r"\[QuantizedLinear\] unknown quantization mode 'int3'"):
        nn.QuantizedLinear(64, 8, mode="int3")
