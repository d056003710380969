"""lazyx.nn.Module: tree views and updates against MLX's Module on the same structure,
weights saved and loaded (npz, safetensors, MLX's own files) with strict-mode errors that
name the key and the shapes, and nn.value_and_grad / checkpoint against hand gradients."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import lazyx.core as mx
import lazyx.nn as nn
from lazyx.errors import LazyxError
from lazyx.utils import tree_flatten, tree_map

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "mlx"))
from mlx_compat import requires_mlx  # noqa: E402

try:
    import mlx.core as mlx_core
    import mlx.nn as mlx_nn
except ImportError:  # pragma: no cover
    mlx_core = mlx_nn = None


def build(lib_nn, lib_mx):
    """The same model in either library: nested modules in lists and dicts, a bare
    array, a private array, a plain attribute and an empty list."""

    class Sub(lib_nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = lib_nn.Sequential(lib_nn.Linear(2, 3), lib_nn.Identity())
            self.lin = lib_nn.Linear(3, 2, bias=False)

    class Model(lib_nn.Module):
        def __init__(self):
            super().__init__()
            self.a = Sub()
            self.b = [Sub(), lib_nn.Linear(2, 2)]
            self.d = {"x": lib_mx.zeros((4,)), "m": lib_nn.LayerNorm(2), "e": {}}
            self.s = lib_mx.ones((3,))
            self._private = lib_mx.ones((1,))
            self.size = 3
            self.empty = []

    return Model()


def shapes(tree):
    return tree_map(lambda x: tuple(x.shape), tree)


def kinds(tree):
    return tree_map(lambda m: type(m).__name__, tree, is_leaf=lambda v: hasattr(v, "children"))


@requires_mlx
def test_tree_views_match_mlx():
    ours, theirs = build(nn, mx), build(mlx_nn, mlx_core)
    assert shapes(ours.parameters()) == shapes(theirs.parameters())
    assert shapes(ours.trainable_parameters()) == shapes(theirs.trainable_parameters())
    assert kinds(ours.children()) == kinds(theirs.children())
    assert kinds(ours.leaf_modules()) == kinds(theirs.leaf_modules())
    assert [(k, type(m).__name__) for k, m in ours.named_modules()] == \
        [(k, type(m).__name__) for k, m in theirs.named_modules()]
    assert [type(m).__name__ for m in ours.modules()] == [type(m).__name__ for m in theirs.modules()]
    assert list(ours.keys()) == list(theirs.keys())
    assert ours.size == 3 and "size" not in ours and ours.state is ours
    assert repr(ours) == repr(theirs)
    visited = []
    ours.apply_to_modules(lambda k, m: visited.append(k))
    assert visited == [k for k, _ in theirs.named_modules()]


@requires_mlx
@pytest.mark.parametrize("call", [
    lambda m: m.freeze(),
    lambda m: m.freeze(recurse=False),
    lambda m: m.freeze(keys="bias"),
    lambda m: m.freeze(keys=["weight", "s"], recurse=True),
    lambda m: m.a.freeze(),
    lambda m: m.freeze().unfreeze(keys="weight"),
    lambda m: m.freeze().b[1].unfreeze(),
    lambda m: m.freeze(keys="lin", strict=True),
])
def test_freeze_matches_mlx(call):
    ours, theirs = build(nn, mx), build(mlx_nn, mlx_core)
    call(ours), call(theirs)
    assert shapes(ours.trainable_parameters()) == shapes(theirs.trainable_parameters())
    assert shapes(ours.parameters()) == shapes(theirs.parameters())


def test_freeze_strict_names_the_key():
    m = build(nn, mx)
    with pytest.raises(KeyError, match="nope") as info:
        m.freeze(keys=["s", "nope"], strict=True)
    assert isinstance(info.value, LazyxError)
    m.freeze(keys=["nope"])  # not strict: ignored
    with pytest.raises(KeyError, match="a.lin.weight"):
        m.unfreeze(keys="a.lin.weight", strict=True)


def test_attributes_train_eval_set_dtype():
    m = build(nn, mx)
    assert m.training and m.b[1].training
    m.eval()
    assert not m.training and not m.a.inner.layers[0].training
    m.train()
    assert m.a.lin.training
    m.w = mx.zeros((2,))
    assert "w" in m and m.w.shape == (2,)
    m.w = 5  # a plain value replaces the entry
    assert "w" not in m and m.w == 5
    del m.s
    assert "s" not in m
    with pytest.raises(AttributeError, match="'Model' object has no attribute 'missing'"):
        m.missing
    m.q = mx.array([1, 2])  # integer arrays are left alone by set_dtype
    m.set_dtype(mx.float16)
    dtypes = {k: v.dtype for k, v in tree_flatten(m.parameters())}
    assert dtypes["q"] == mx.int32 and dtypes["a.lin.weight"] == mx.float16
    m.apply(lambda p: p * 0 + 7)
    assert float(m.b[1].bias[0]) == 7.0


def test_update_and_update_modules():
    m = build(nn, mx)
    new = mx.full((3, 2), 2.0)
    m.update({"a": {"inner": {"layers": [{"weight": new}]}}})
    assert m.a.inner.layers[0].weight is new
    with pytest.raises(ValueError, match='"a.nope"'):
        m.update({"a": {"nope": new}})
    m.update({"a": {"nope": new}}, strict=False)
    assert "nope" not in m.a
    with pytest.raises(ValueError, match="int.*'a.lin'"):
        m.update({"a": {"lin": 5}})
    replacement = nn.Linear(2, 2)
    m.update_modules({"b": [{}, replacement]})
    assert m.b[1] is replacement
    with pytest.raises(ValueError, match='sub-module named "zz"'):
        m.update_modules({"zz": replacement})
    with pytest.raises(ValueError, match="'a.lin'"):
        m.update_modules({"a": {"lin": mx.zeros((1,))}})


@pytest.mark.parametrize("ext", ["npz", "safetensors"])
def test_save_load_round_trip_and_strict_errors(tmp_path, ext):
    mx.random.seed(1)
    src, dst = build(nn, mx), build(nn, mx)
    path = str(tmp_path / f"w.{ext}")
    src.save_weights(path)
    dst.load_weights(path)
    for (k, a), (k2, b) in zip(tree_flatten(src.parameters()), tree_flatten(dst.parameters())):
        assert k == k2
        np.testing.assert_array_equal(np.array(a), np.array(b))
    pairs = tree_flatten(src.parameters())
    with pytest.raises(ValueError, match=r"missing 1 parameters: s\b"):
        dst.load_weights([p for p in pairs if p[0] != "s"])
    with pytest.raises(ValueError, match="not in the model: extra.w"):
        dst.load_weights(pairs + [("extra.w", mx.zeros((1,)))])
    bad = [(k, mx.zeros((5,)) if k == "a.lin.weight" else v) for k, v in pairs]
    with pytest.raises(ValueError, match=r"expected shape \(2, 3\) but received shape \(5,\) "
                                         r"for parameter a.lin.weight"):
        dst.load_weights(bad)
    # Not strict: the matching keys load, the others are ignored.
    dst.load_weights([("b.1.bias", mx.full((2,), 9.0)), ("zz", mx.zeros((1,)))], strict=False)
    assert float(dst.b[1].bias[1]) == 9.0
    with pytest.raises(ValueError, match="unsupported file extension"):
        src.save_weights(str(tmp_path / "w.bin"))


@requires_mlx
def test_loads_weights_saved_by_mlx(tmp_path):
    theirs = build(mlx_nn, mlx_core)
    path = str(tmp_path / "mlx.safetensors")
    theirs.save_weights(path)
    ours = build(nn, mx).load_weights(path)
    want = dict(tree_flatten(theirs.parameters()))
    for k, v in tree_flatten(ours.parameters()):
        np.testing.assert_array_equal(np.array(v), np.array(want[k]))
    ours.save_weights(str(tmp_path / "ours.npz"))
    back = build(mlx_nn, mlx_core).load_weights(str(tmp_path / "ours.npz"))
    for k, v in tree_flatten(back.parameters()):
        np.testing.assert_array_equal(np.array(v), np.array(want[k]))


def test_value_and_grad_and_checkpoint():
    mx.random.seed(0)
    model = nn.Sequential(nn.Linear(3, 2))
    x = mx.array(np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32))
    w, b = np.array(model.layers[0].weight, np.float64), np.array(model.layers[0].bias, np.float64)
    xn = np.array(x, np.float64)

    def loss(inputs):
        return (model(inputs) ** 2).sum()

    value, grads = nn.value_and_grad(model, loss)(x)
    y = xn @ w.T + b
    np.testing.assert_allclose(float(value), (y ** 2).sum(), rtol=1e-5)
    np.testing.assert_allclose(np.array(grads["layers"][0]["weight"]), 2 * y.T @ xn, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.array(grads["layers"][0]["bias"]), 2 * y.sum(0), rtol=1e-5, atol=1e-5)
    # Frozen parameters get no gradient.
    model.layers[0].freeze(keys="bias")
    _, grads = nn.value_and_grad(model, loss)(x)
    assert set(grads["layers"][0]) == {"weight"}
    model.unfreeze()
    # checkpoint: same values and gradients through the recomputed call.
    layer = model.layers[0]
    ck = nn.checkpoint(layer)
    np.testing.assert_allclose(np.array(ck(x)), y, rtol=1e-5)
    _, g2 = nn.value_and_grad(model, lambda inputs: (ck(inputs) ** 2).sum())(x)
    # (atol as above: an entry near cancellation rounds differently on a GPU's GEMM)
    np.testing.assert_allclose(np.array(g2["layers"][0]["weight"]), 2 * y.T @ xn, rtol=1e-5,
                               atol=1e-5)
    assert nn.average_gradients(grads) is grads


def test_compiled_training_step_matches_eager():
    """The whole update compiles with the module as state (running statistics included)."""
    from functools import partial

    data = np.random.default_rng(2)
    x = mx.array(data.standard_normal((16, 4)).astype(np.float32))
    y = mx.array(data.standard_normal((16, 1)).astype(np.float32))

    def run(compiled):
        mx.random.seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm(8), nn.Linear(8, 1))
        grad_fn = nn.value_and_grad(model, lambda a, b: ((model(a) - b) ** 2).mean())

        def step(a, b):
            loss, grads = grad_fn(a, b)
            model.update(tree_map(lambda p, g: p - 0.1 * g, model.trainable_parameters(), grads))
            return loss

        if compiled:
            step = partial(mx.compile, inputs=[model.state], outputs=[model.state])(step)
        losses = []
        for _ in range(5):
            losses.append(float(step(x, y)))
            mx.eval(model.state)
        return losses, np.array(model.layers[1].running_var)

    (eager, var_e), (comp, var_c) = run(False), run(True)
    np.testing.assert_allclose(comp, eager, rtol=1e-5)
    np.testing.assert_allclose(var_c, var_e, rtol=1e-5)
    assert eager[-1] < eager[0]
