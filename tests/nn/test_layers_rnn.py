"""RNN, GRU, LSTM: MLX's parameter names, shapes and gate layout against a NumPy float64
recurrence and MLX on the same weights, with and without an initial state; gradients
by finite differences; a wrong feature count names the layer and the weight."""

from __future__ import annotations

import numpy as np
import pytest

import lazyx.core as mx
import lazyx.nn as nn
from lazyx.errors import ShapeError

from layer_checks import assert_matches_mlx, check_layer_grads, mlx_core, mlx_nn, requires_mlx, same_weights


def sig(v):
    return 1 / (1 + np.exp(-v))


def np_rnn(p, x, h=None):
    out = []
    for t in range(x.shape[-2]):
        a = x[..., t, :] @ p["Wxh"].T + p.get("bias", 0) + (0 if h is None else h @ p["Whh"].T)
        h = np.tanh(a)
        out.append(h)
    return np.stack(out, -2)


def np_gru(p, x, h=None):
    H = p["Wh"].shape[1]
    h = np.zeros(x.shape[:-2] + (H,)) if h is None else h
    out = []
    for t in range(x.shape[-2]):
        gx = x[..., t, :] @ p["Wx"].T + p.get("b", 0)
        gh = h @ p["Wh"].T
        r = sig(gx[..., :H] + gh[..., :H])
        z = sig(gx[..., H:2 * H] + gh[..., H:2 * H])
        n = np.tanh(gx[..., 2 * H:] + r * (gh[..., 2 * H:] + p.get("bhn", 0)))
        h = (1 - z) * n + z * h
        out.append(h)
    return np.stack(out, -2)


def np_lstm(p, x, h=None, c=None):
    H = p["Wh"].shape[1]
    h = np.zeros(x.shape[:-2] + (H,)) if h is None else h
    c = np.zeros_like(h) if c is None else c
    hs, cs = [], []
    for t in range(x.shape[-2]):
        g = x[..., t, :] @ p["Wx"].T + h @ p["Wh"].T + p.get("bias", 0)
        i, f, gg, o = np.split(g, 4, -1)
        c = sig(f) * c + sig(i) * np.tanh(gg)
        h = sig(o) * np.tanh(c)
        hs.append(h)
        cs.append(c)
    return np.stack(hs, -2), np.stack(cs, -2)


REFS = {"RNN": np_rnn, "GRU": np_gru, "LSTM": np_lstm}


@pytest.mark.parametrize("name", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("with_state", [False, True])
def test_matches_numpy(name, bias, with_state):
    layer = getattr(nn, name)(3, 4, bias=bias)
    p = {k: np.array(v, dtype=np.float64) for k, v in layer.parameters().items()}
    gen = np.random.default_rng(0)
    x = gen.standard_normal((2, 5, 3))
    h = gen.standard_normal((2, 4)) if with_state else None
    got = layer(mx.array(x, dtype=mx.float32), None if h is None else mx.array(h, dtype=mx.float32))
    ref = REFS[name](p, x, h)
    for g, r in zip(got if name == "LSTM" else [got], ref if name == "LSTM" else [ref]):
        np.testing.assert_allclose(np.array(g), r, rtol=1e-5, atol=1e-5)


def test_names_shapes_and_unbatched_input():
    assert {k: v.shape for k, v in nn.GRU(3, 4).parameters().items()} == {
        "Wx": (12, 3), "Wh": (12, 4), "b": (12,), "bhn": (4,)}
    assert {k: v.shape for k, v in nn.LSTM(3, 4).parameters().items()} == {
        "Wx": (16, 3), "Wh": (16, 4), "bias": (16,)}
    assert sorted(nn.RNN(3, 4, bias=False).parameters()) == ["Whh", "Wxh"]
    assert nn.RNN(3, 4)(mx.zeros((5, 3))).shape == (5, 4)
    assert nn.RNN(3, 4, nonlinearity=mx.sigmoid)(mx.zeros((1, 2, 3))).shape == (1, 2, 4)


@requires_mlx
@pytest.mark.parametrize("name", ["RNN", "GRU", "LSTM"])
def test_matches_mlx(name):
    ref = getattr(mlx_nn, name)(3, 4)
    layer = same_weights(ref, getattr(nn, name)(3, 4))
    assert repr(layer).split("nonlinearity")[0] == repr(ref).split("nonlinearity")[0]
    gen = np.random.default_rng(1)
    x, h = gen.standard_normal((2, 5, 3)).astype(np.float32), gen.standard_normal((2, 4)).astype(np.float32)
    for args in ((x,), (x, h)):
        got = layer(*map(mx.array, args))
        want = ref(*map(mlx_core.array, args))
        for g, w in zip(got if name == "LSTM" else [got], want if name == "LSTM" else [want]):
            assert_matches_mlx(g, w)


@pytest.mark.parametrize("name", ["RNN", "GRU", "LSTM"])
def test_gradients(name):
    layer = getattr(nn, name)(2, 3)
    call = (lambda m, x: m(x)[1]) if name == "LSTM" else None
    check_layer_grads(layer, np.random.default_rng(2).standard_normal((1, 3, 2)), call=call,
                      max_elements=0)


@pytest.mark.parametrize("name,param", [("RNN", "Wxh"), ("GRU", "Wx"), ("LSTM", "Wx")])
def test_wrong_feature_count(name, param):
    with pytest.raises(ShapeError, match=rf"\[{name}\].*\(2, 5, 4\).*{param} of shape"):
        getattr(nn, name)(3, 4)(mx.zeros((2, 5, 4)))
