"""MultiHeadAttention and the transformer stacks: NumPy float64 attention, MLX on the
same weights (pre- and post-norm, masks, checkpoint), gradients by finite differences,
and a wrong feature count naming the projection."""

from __future__ import annotations

import numpy as np
import pytest

import lazyx.core as mx
import lazyx.nn as nn
from lazyx.errors import ArgumentError, ShapeError

from layer_checks import assert_matches_mlx, check_layer_grads, mlx_core, mlx_nn, requires_mlx, same_weights


def np_mha(p, q, k, v, heads, mask=None):
    def proj(x, name):
        y = x @ p[f"{name}.weight"].T
        return y + p.get(f"{name}.bias", 0)

    def split(x):
        return x.reshape(*x.shape[:-1], heads, -1).swapaxes(-2, -3)

    Q, K, V = split(proj(q, "query_proj")), split(proj(k, "key_proj")), split(proj(v, "value_proj"))
    s = Q @ K.swapaxes(-1, -2) / np.sqrt(Q.shape[-1]) + (0 if mask is None else mask)
    a = np.exp(s - s.max(-1, keepdims=True))
    o = (a / a.sum(-1, keepdims=True)) @ V
    o = o.swapaxes(-2, -3).reshape(*q.shape[:-1], -1)
    return proj(o, "out_proj")


def test_mha_matches_numpy():
    from lazyx.utils import tree_flatten
    layer = nn.MultiHeadAttention(8, 2, key_input_dims=6, value_input_dims=4, value_dims=10,
                                  value_output_dims=3, bias=True)
    p = {k: np.array(v, dtype=np.float64) for k, v in tree_flatten(layer.parameters())}
    g = np.random.default_rng(0)
    q, k, v = g.standard_normal((2, 5, 8)), g.standard_normal((2, 7, 6)), g.standard_normal((2, 7, 4))
    mask = g.standard_normal((5, 7))
    got = layer(*[mx.array(a, dtype=mx.float32) for a in (q, k, v, mask)])
    np.testing.assert_allclose(np.array(got), np_mha(p, q, k, v, 2, mask), rtol=1e-5, atol=1e-5)
    assert got.shape == (2, 5, 3)


def test_causal_mask():
    m = np.array(nn.MultiHeadAttention.create_additive_causal_mask(3))
    lo = np.finfo(np.float32).min
    np.testing.assert_array_equal(m, [[0, lo, lo], [0, 0, lo], [0, 0, 0]])
    assert nn.MultiHeadAttention.create_additive_causal_mask(2, mx.float16).dtype == mx.float16


@requires_mlx
def test_mha_matches_mlx():
    ref = mlx_nn.MultiHeadAttention(8, 4, bias=True)
    layer = same_weights(ref, nn.MultiHeadAttention(8, 4, bias=True))
    assert repr(layer) == repr(ref)
    x = np.random.default_rng(1).standard_normal((2, 5, 8)).astype(np.float32)
    m = nn.MultiHeadAttention.create_additive_causal_mask(5)
    assert_matches_mlx(layer(*[mx.array(x)] * 3, m),
                       ref(*[mlx_core.array(x)] * 3, mlx_core.array(np.array(m))))


@requires_mlx
@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("checkpoint", [False, True])
def test_transformer_matches_mlx(norm_first, checkpoint):
    kw = dict(norm_first=norm_first, checkpoint=checkpoint, mlp_dims=12)
    ref = mlx_nn.Transformer(8, 2, 1, 2, **kw)
    model = same_weights(ref, nn.Transformer(8, 2, 1, 2, **kw))
    assert repr(model) == repr(ref)
    g = np.random.default_rng(2)
    src, tgt = g.standard_normal((2, 6, 8)).astype(np.float32), g.standard_normal((2, 5, 8)).astype(np.float32)
    cm = nn.MultiHeadAttention.create_additive_causal_mask(5)
    got = model(mx.array(src), mx.array(tgt), None, cm, None)
    want = ref(mlx_core.array(src), mlx_core.array(tgt), None, mlx_core.array(np.array(cm)), None)
    assert_matches_mlx(got, want, rtol=1e-4, atol=1e-5)


def test_encoder_layer_matches_numpy_composition():
    layer = nn.TransformerEncoderLayer(4, 2, mlp_dims=6, norm_first=False)
    from lazyx.utils import tree_flatten
    p = {k: np.array(v, dtype=np.float64) for k, v in tree_flatten(layer.parameters())}
    x = np.random.default_rng(3).standard_normal((1, 3, 4))

    def ln(v, name):
        v = (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + 1e-5)
        return v * p[f"{name}.weight"] + p[f"{name}.bias"]

    att = np_mha({k[10:]: v for k, v in p.items() if k.startswith("attention.")}, x, x, x, 2)
    h = ln(x + att, "ln1")
    mlp = np.maximum(h @ p["linear1.weight"].T + p["linear1.bias"], 0) @ p["linear2.weight"].T + p["linear2.bias"]
    np.testing.assert_allclose(np.array(layer(mx.array(x, dtype=mx.float32), None)), ln(h + mlp, "ln2"),
                               rtol=1e-5, atol=1e-5)


def test_checkpoint_gives_the_same_gradients():
    mx.random.seed(4)
    a = nn.TransformerEncoder(2, 8, 2, checkpoint=False)
    b = nn.TransformerEncoder(2, 8, 2, checkpoint=True)
    b.update(a.parameters())
    x = mx.random.normal((2, 4, 8))
    grads = [nn.value_and_grad(m, lambda x: m(x, None).sum())(x)[1] for m in (a, b)]
    from lazyx.utils import tree_flatten
    for (ka, ga), (kb, gb) in zip(tree_flatten(grads[0]), tree_flatten(grads[1])):
        assert ka == kb
        np.testing.assert_allclose(np.array(ga), np.array(gb), rtol=1e-5, atol=1e-6)


def test_mha_gradients():
    layer = nn.MultiHeadAttention(4, 2, bias=True)
    check_layer_grads(layer, np.random.default_rng(5).standard_normal((1, 3, 4)),
                      call=lambda m, x: m(x, x, x), max_elements=0)


def test_bad_input():
    with pytest.raises(ArgumentError, match=r"divisible by the number of heads \(10 % 3\)"):
        nn.MultiHeadAttention(10, 3)
    with pytest.raises(ShapeError, match=r"\[MultiHeadAttention\].*\(2, 5, 6\).*key_proj.weight of shape \(8, 8\)"):
        layer = nn.MultiHeadAttention(8, 2)
        layer(mx.zeros((2, 5, 8)), mx.zeros((2, 5, 6)), mx.zeros((2, 5, 8)))
