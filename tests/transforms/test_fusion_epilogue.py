"""Epilogue fusion (``split_epilogue``, ``lazyx/transforms/fusion.py``): in a compiled
CPU trace an ``AddMM`` whose result a fusible op reads becomes a ``Matmul`` and an
element-wise tail (``alpha * y + beta * c``) that fuses with that op: a Linear layer's
bias and activation in one pass. Values against float64 NumPy; gradients see through."""

import numpy as np
import pytest

import lazyx.core as mx
import lazyx.nn as nn
from lazyx.plugins.products import AddMM, Matmul
from lazyx.transforms import fusion
from lazyx.transforms.fusion import Compiled


pytestmark = pytest.mark.usefixtures("cpu_backend")


def _classes(f):
    (entry,) = f.cache.entries.values()
    return [type(n.prim) for n in entry.run_tape.nodes]


def _data(*shapes, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def test_a_linear_layers_bias_and_activation_fuse():
    x, w, b = _data((16, 64), (32, 64), (32,))
    f = mx.compile(lambda x, w, b: mx.maximum(mx.addmm(b, x, w.T), 0.0))
    got = np.asarray(f(mx.array(x), mx.array(w), mx.array(b)))
    want = np.maximum(x.astype(np.float64) @ w.T.astype(np.float64) + b, 0.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    kinds = _classes(f)
    assert AddMM not in kinds and Matmul in kinds
    assert kinds.count(Compiled) == 1  # bias + maximum: one kernel


@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 2.0), (-3.0, 1.0), (1.0, 0.25)])
def test_scales_and_a_cast_bias(alpha, beta):
    x, w = _data((24, 40), (40, 48), seed=1)
    c = _data((48,), seed=2, dtype=np.float16)[0]  # cast to the product's float32 in the tail
    f = mx.compile(lambda c, x, w: mx.exp(mx.addmm(c, x, w, alpha=alpha, beta=beta) * 0.1))
    got = np.asarray(f(mx.array(c), mx.array(x), mx.array(w)))
    want = np.exp((alpha * (x.astype(np.float64) @ w) + beta * c.astype(np.float64)) * 0.1)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
    eager = np.asarray(mx.exp(mx.addmm(mx.array(c), mx.array(x), mx.array(w), alpha=alpha,
                                       beta=beta) * 0.1))
    np.testing.assert_allclose(got, eager, rtol=2e-6, atol=1e-7)
    assert AddMM not in _classes(f)


def test_stays_whole_without_a_fusible_reader_or_when_c_is_not_read():
    x, w, b = _data((8, 16), (16, 12), (12,), seed=3)
    whole = mx.compile(lambda b, x, w: mx.addmm(b, x, w))  # read by nothing but the caller
    np.testing.assert_allclose(np.asarray(whole(mx.array(b), mx.array(x), mx.array(w))),
                               x.astype(np.float64) @ w + b, rtol=1e-5, atol=1e-5)
    assert AddMM in _classes(whole)
    unread = mx.compile(lambda b, x, w: mx.exp(mx.addmm(b, x, w, beta=0.0)))
    b_nan = np.full_like(b, np.nan)  # beta = 0 ignores c, NaNs included (BLAS's rule)
    np.testing.assert_allclose(np.asarray(unread(mx.array(b_nan), mx.array(x), mx.array(w))),
                               np.exp(x.astype(np.float64) @ w), rtol=1e-5)
    assert AddMM in _classes(unread)


def test_mixed_factor_dtypes():
    """addmm casts a float16 factor before its node: the split node's values are those
    of the eager call; a node whose factors are not of the output's dtype, or integers,
    is not split."""
    x = _data((8, 16), seed=6, dtype=np.float16)[0]
    w, b = _data((16, 12), (12,), seed=7)
    f = mx.compile(lambda b, x, w: mx.addmm(b, x, w) * 2)
    got = np.asarray(f(mx.array(b), mx.array(x), mx.array(w)))
    want = np.asarray(mx.addmm(mx.array(b), mx.array(x), mx.array(w)) * 2)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    prim = AddMM(mx.default_stream(mx.cpu), 1.0, 1.0)
    assert prim.split_epilogue([mx.float32, mx.float16, mx.float32], mx.float32) is None
    assert prim.split_epilogue([mx.int32] * 3, mx.int32) is None
    assert prim.split_epilogue([mx.float32] * 3, mx.float32) is not None


def test_gradients_and_training_see_through():
    mx.random.seed(0)
    model = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 3))
    x, = _data((32, 20), seed=4)
    y = mx.array(np.arange(32) % 3)

    def loss(model, x, y):
        return nn.losses.cross_entropy(model(x), y, reduction="mean")

    loss_and_grad = nn.value_and_grad(model, loss)
    grad_eager = loss_and_grad(model, mx.array(x), y)
    compiled = mx.compile(lambda x, y: loss_and_grad(model, x, y), inputs=[model.state])
    grad_comp = compiled(mx.array(x), y)
    np.testing.assert_allclose(float(grad_comp[0]), float(grad_eager[0]), rtol=1e-5)
    from lazyx.utils import tree_flatten
    pairs = list(zip(tree_flatten(grad_eager[1]), tree_flatten(grad_comp[1])))
    assert len(pairs) == 4
    for (k, g1), (_, g2) in pairs:
        np.testing.assert_allclose(np.asarray(g2), np.asarray(g1), rtol=1e-4, atol=1e-6,
                                   err_msg=k)


@pytest.mark.parametrize("rows", [5, 300, 1])
def test_shapeless(rows):
    x, w, b = _data((rows, 32), (32, 24), (24,), seed=rows)
    f = mx.compile(lambda b, x, w: mx.tanh(mx.addmm(b, x, w)), shapeless=True)
    for r in (rows, rows + 7):
        xx = np.concatenate([x] * 2)[:r] if r <= 2 * rows else _data((r, 32), seed=9)[0]
        got = np.asarray(f(mx.array(b), mx.array(xx), mx.array(w)))
        np.testing.assert_allclose(got, np.tanh(xx.astype(np.float64) @ w + b), rtol=1e-5,
                                   atol=1e-6)


def test_a_lone_epilogue_runs_as_a_program():
    """Left unfused (here: evaluated by itself) the tail computes what it says."""
    from lazyx.codegen import ir
    prim = fusion._Epilogue(mx.default_stream(mx.cpu),
                            lambda y, c: ir.apply("add", y, ir.cast(c, y.dtype)))
    y, = _data((4, 6), seed=5)
    c = np.arange(6, dtype=np.float16)
    got = np.asarray(prim.eval_cpu([y, c]))
    np.testing.assert_array_equal(got, y + c.astype(np.float32))
