"""The core layers (Sequential, Identity, Linear, Bilinear, Embedding, Dropout*, LayerNorm,
RMSNorm, GroupNorm, BatchNorm, InstanceNorm): initialisation and outputs against MLX on
the same seed and weights, outputs against NumPy float64 references of the math,
gradients against finite differences, and bad input."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import lazyx.core as mx
import lazyx.nn as nn
from lazyx.errors import LazyxError
from lazyx.utils import tree_flatten, tree_map, tree_unflatten

from helpers import check_vjp_fd

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "mlx"))
from mlx_compat import requires_mlx  # noqa: E402

try:
    import mlx.core as mlx_core
    import mlx.nn as mlx_nn
except ImportError:  # pragma: no cover
    mlx_core = mlx_nn = None

RNG = np.random.default_rng(0)


def _ln(x, eps, axes=(-1,)):
    mean = x.mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(x.var(axis=axes, keepdims=True) + eps)


def _group_norm(p, x, groups, eps, torch_like):
    b, *rest, c = x.shape
    if torch_like:   # consecutive channels per group
        g = x.reshape(b, -1, groups, c // groups)
        y = _ln(g, eps, axes=(1, 3)).reshape(x.shape)
    else:            # channel c in group c % groups
        g = x.reshape(b, -1, groups)
        y = _ln(g, eps, axes=(1,)).reshape(x.shape)
    return y * p["weight"] + p["bias"]


def _bilinear(p, x1, x2):
    return np.einsum("...j,oij,...i->...o", x1, p["weight"], x2) + p["bias"]


# name: (constructor(lib_nn), input shapes, NumPy float64 reference(params, *inputs))
CASES = {
    "Linear": (lambda n: n.Linear(5, 3), [(4, 5)], lambda p, x: x @ p["weight"].T + p["bias"]),
    "Linear_nobias": (lambda n: n.Linear(5, 3, bias=False), [(2, 4, 5)],
                      lambda p, x: x @ p["weight"].T),
    "Bilinear": (lambda n: n.Bilinear(3, 4, 2), [(5, 3), (5, 4)], _bilinear),
    "Identity": (lambda n: n.Identity(7, k=1), [(2, 3)], lambda p, x: x),
    "Sequential": (lambda n: n.Sequential(n.Linear(3, 4), n.Linear(4, 2)), [(6, 3)],
                   lambda p, x: (x @ p["layers"][0]["weight"].T + p["layers"][0]["bias"])
                   @ p["layers"][1]["weight"].T + p["layers"][1]["bias"]),
    "LayerNorm": (lambda n: n.LayerNorm(6), [(3, 6)],
                  lambda p, x: _ln(x, 1e-5) * p["weight"] + p["bias"]),
    "LayerNorm_nobias": (lambda n: n.LayerNorm(6, eps=1e-3, bias=False), [(2, 2, 6)],
                         lambda p, x: _ln(x, 1e-3) * p["weight"]),
    "LayerNorm_noaffine": (lambda n: n.LayerNorm(6, affine=False), [(3, 6)],
                           lambda p, x: _ln(x, 1e-5)),
    "RMSNorm": (lambda n: n.RMSNorm(6, eps=1e-4), [(3, 6)],
                lambda p, x: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-4) * p["weight"]),
    "GroupNorm": (lambda n: n.GroupNorm(2, 6), [(2, 3, 6)],
                  lambda p, x: _group_norm(p, x, 2, 1e-5, False)),
    "GroupNorm_torch": (lambda n: n.GroupNorm(3, 6, pytorch_compatible=True), [(2, 2, 2, 6)],
                        lambda p, x: _group_norm(p, x, 3, 1e-5, True)),
    "InstanceNorm": (lambda n: n.InstanceNorm(4, affine=True), [(2, 3, 5, 4)],
                     lambda p, x: _ln(x, 1e-5, axes=(1, 2)) * p["weight"] + p["bias"]),
    "BatchNorm": (lambda n: n.BatchNorm(4), [(6, 3, 4)],
                  lambda p, x: _ln(x, 1e-5, axes=(0, 1)) * p["weight"] + p["bias"]),
    "BatchNorm_nostats": (lambda n: n.BatchNorm(4, affine=False, track_running_stats=False),
                          [(8, 4)], lambda p, x: _ln(x, 1e-5, axes=(0,))),
}


def _inputs(shapes):
    return [RNG.standard_normal(s) for s in shapes]


def _perturbed(params):
    """Parameters moved off their ones/zeros start so scales and offsets are tested."""
    return tree_map(lambda a: a + RNG.standard_normal(a.shape) * 0.5, params)


def _np_params(module):
    return tree_map(lambda a: np.array(a, np.float64), module.parameters())


@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_against_numpy_float64(name):
    make, shapes, ref = CASES[name]
    layer = make(nn)
    params = _perturbed(_np_params(layer))
    layer.update(tree_map(lambda a: mx.array(a.astype(np.float32)), params))
    xs = _inputs(shapes)
    got = layer(*[mx.array(x.astype(np.float32)) for x in xs])
    np.testing.assert_allclose(np.array(got), ref(params, *xs), rtol=2e-4, atol=2e-5)


@requires_mlx
@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_against_mlx(name):
    make, shapes, _ = CASES[name]
    # Same seed: MLX's and lazyx's random streams agree, so initial weights must too.
    mx.random.seed(7), mlx_core.random.seed(7)
    ours, theirs = make(nn), make(mlx_nn)
    assert repr(ours) == repr(theirs)
    flat_ours, flat_theirs = tree_flatten(ours.parameters()), tree_flatten(theirs.parameters())
    assert [k for k, _ in flat_ours] == [k for k, _ in flat_theirs]
    for (k, a), (_, b) in zip(flat_ours, flat_theirs):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-6, err_msg=k)
    assert sorted(k for k, _ in tree_flatten(ours.trainable_parameters())) == \
        sorted(k for k, _ in tree_flatten(theirs.trainable_parameters()))
    # Same (perturbed) weights copied across with update, same inputs, both modes.
    params = _perturbed(_np_params(ours))
    ours.update(tree_map(lambda a: mx.array(a.astype(np.float32)), params))
    theirs.update(tree_map(lambda a: mlx_core.array(a.astype(np.float32)), params))
    xs = [x.astype(np.float32) for x in _inputs(shapes)]
    for mode in (True, False):
        ours.train(mode), theirs.train(mode)
        got = ours(*[mx.array(x) for x in xs])
        want = theirs(*[mlx_core.array(x) for x in xs])
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-5)
        # Running statistics (BatchNorm) evolve the same way.
        for (k, a), (_, b) in zip(tree_flatten(ours.parameters()), tree_flatten(theirs.parameters())):
            np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_gradients_finite_differences(name):
    make, shapes, _ = CASES[name]
    layer = make(nn)
    keys = [k for k, _ in tree_flatten(layer.trainable_parameters())]
    params = dict(tree_flatten(_perturbed(_np_params(layer))))
    xs = _inputs(shapes)

    def fun(*arrays):
        inputs, values = arrays[:len(xs)], arrays[len(xs):]
        layer.update(tree_unflatten(list(zip(keys, values))))
        return layer(*inputs)

    check_vjp_fd(fun, *xs, *[params[k] for k in keys], rtol=1e-4, atol=1e-6, msg=name)


def test_batchnorm_running_stats_and_eval():
    bn = nn.BatchNorm(3, momentum=0.25)
    x = RNG.standard_normal((10, 3)) * 2 + 1
    bn(mx.array(x.astype(np.float32)))
    np.testing.assert_allclose(np.array(bn.running_mean), 0.25 * x.mean(0), rtol=1e-5)
    np.testing.assert_allclose(np.array(bn.running_var), 0.75 + 0.25 * x.var(0, ddof=1), rtol=1e-5)
    assert set(bn.trainable_parameters()) == {"weight", "bias"}
    bn.unfreeze()
    assert set(bn.trainable_parameters()) == {"weight", "bias"}  # running stats stay frozen
    bn.eval()
    y = np.array(bn(mx.array(x.astype(np.float32))))
    want = (x - np.array(bn.running_mean)) / np.sqrt(np.array(bn.running_var) + 1e-5)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_embedding():
    mx.random.seed(3)
    emb = nn.Embedding(10, 4)
    w = np.array(emb.weight, np.float64)
    idx = np.array([[1, 9], [0, 1]])
    np.testing.assert_array_equal(np.array(emb(mx.array(idx))), w[idx].astype(np.float32))
    x = RNG.standard_normal((3, 4))
    np.testing.assert_allclose(np.array(emb.as_linear(mx.array(x.astype(np.float32)))), x @ w.T,
                               rtol=1e-5, atol=1e-6)
    assert repr(emb) == "Embedding(10, 4)" and emb.weight.shape == (10, 4)


@requires_mlx
def test_embedding_and_dropout_against_mlx():
    mx.random.seed(5), mlx_core.random.seed(5)
    ours, theirs = nn.Embedding(7, 3), mlx_nn.Embedding(7, 3)
    np.testing.assert_allclose(np.array(ours.weight), np.array(theirs.weight), rtol=1e-6)
    np.testing.assert_allclose(np.array(ours.as_linear(mx.ones((2, 3)))),
                               np.array(theirs.as_linear(mlx_core.ones((2, 3)))), rtol=1e-5)
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    for make, shape in [(lambda n: n.Dropout(0.3), (2, 3, 4, 5)), (lambda n: n.Dropout2d(0.4), (2, 3, 4, 5)),
                        (lambda n: n.Dropout3d(0.5), (1, 2, 3, 4, 5))]:
        xi = RNG.standard_normal(shape).astype(np.float32)
        mx.random.seed(11), mlx_core.random.seed(11)
        a, b = make(nn), make(mlx_nn)
        assert repr(a) == repr(b)
        np.testing.assert_allclose(np.array(a(mx.array(xi))), np.array(b(mlx_core.array(xi))), rtol=1e-6)
    del x


@pytest.mark.parametrize("cls,shape,shared", [(nn.Dropout, (40, 50), ()), (nn.Dropout2d, (4, 5, 6, 30), (1, 2)),
                                              (nn.Dropout3d, (3, 4, 5, 6, 20), (1, 2, 3))])
def test_dropout_statistics_and_eval(cls, shape, shared):
    x = np.ones(shape, np.float32)
    layer = cls(0.25)
    y = np.array(layer(mx.array(x)))
    assert set(np.unique(y)) <= {0.0, np.float32(1 / 0.75)}
    kept = (y != 0).mean()
    assert 0.6 < kept < 0.9
    for axis in shared:  # channel dropout: one decision per (sample, channel)
        assert (y == y.take([0], axis=axis)).all()
    np.testing.assert_array_equal(np.array(layer.eval()(mx.array(x))), x)
    with pytest.raises(ValueError, match=r"p=1.0 is not in \[0, 1\)"):
        cls(1.0)


@pytest.mark.parametrize("call,match", [
    (lambda: nn.Linear(5, 3)(mx.ones((2, 4))), r"\[Linear\].*\(2, 4\).*weight of shape \(3, 5\)"),
    (lambda: nn.Bilinear(3, 4, 2)(mx.ones((2, 3)), mx.ones((2, 3))), r"\[Bilinear\].*\(2, 3\)"),
    (lambda: nn.LayerNorm(4)(mx.ones((2, 3))), r"\[LayerNorm\].*\(2, 3\)"),
    (lambda: nn.RMSNorm(4)(mx.ones((2, 3))), r"\[RMSNorm\].*\(2, 3\)"),
    (lambda: nn.GroupNorm(2, 4)(mx.ones((4,))), r"\[GroupNorm\].*\(4,\)"),
    (lambda: nn.GroupNorm(3, 4)(mx.ones((2, 4))), "num_groups=3 does not divide dims=4"),
    (lambda: nn.BatchNorm(3)(mx.ones((1, 2, 2, 2, 3))), r"\[BatchNorm\].*\(1, 2, 2, 2, 3\)"),
    (lambda: nn.BatchNorm(3)(mx.ones((2, 4))), r"\[BatchNorm\].*\(2, 4\)"),
    (lambda: nn.InstanceNorm(4)(mx.ones((2, 4))), r"\[InstanceNorm\].*\(2, 4\)"),
    (lambda: nn.Dropout2d()(mx.ones((2, 3))), r"\[Dropout2d\].*\(2, 3\).*3 or 4"),
    (lambda: nn.Dropout3d()(mx.ones((2, 3, 3))), r"\[Dropout3d\].*\(2, 3, 3\).*4 or 5"),
])
def test_bad_input_names_layer_and_shapes(call, match):
    with pytest.raises(ValueError, match=match) as info:
        call()
    assert isinstance(info.value, LazyxError)


@pytest.mark.skipif(not hasattr(nn, "QuantizedLinear"), reason="quantized layers not written yet")
def test_quantize_replaces_linear_and_embedding():
    model = nn.Sequential(nn.Embedding(16, 64), nn.Linear(64, 64), nn.LayerNorm(64))
    x = mx.array([[1, 2, 3]])
    before = np.array(model(x))
    nn.quantize(model, group_size=64, bits=8)
    kinds = [type(m).__name__ for m in model.layers]
    assert kinds == ["QuantizedEmbedding", "QuantizedLinear", "LayerNorm"]
    np.testing.assert_allclose(np.array(model(x)), before, atol=0.05)
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    nn.quantize(model, class_predicate=lambda path, m: path == "layers.1")
    assert [type(m).__name__ for m in model.layers] == ["Linear", "QuantizedLinear"]
