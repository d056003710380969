"""Recomputing in readers (``_recompute_in_readers``, ``lazyx/transforms/fusion.py``):
an output of a fused kernel that one other fused kernel alone reads, and that is a
function of what that reader loads anyway, is recomputed there instead of stored and
loaded back. Exact GELU's forward then stores its input and its result only, and its
backward recomputes ``erf``. Values against float64 NumPy (and the same trace without
the pass); what is left alone is checked on the run tape."""

import math

import numpy as np
import pytest

import lazyx.core as mx
import lazyx.nn as nn
from lazyx.transforms import fusion
from lazyx.transforms.fusion import Compiled


pytestmark = pytest.mark.usefixtures("cpu_backend")


def _compiled_nodes(f):
    (entry,) = f.cache.entries.values()
    return [n for n in entry.run_tape.nodes if type(n.prim) is Compiled]


def _stored(f) -> int:
    """How many arrays the trace's fused kernels store."""
    return sum(len(n.outputs) for n in _compiled_nodes(f))


def _data(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _erf(x):
    return np.vectorize(math.erf)(x)


def _without_the_pass(monkeypatch, fn, args, **kwargs):
    """``(compiled fn, its result on args)``, traced without the pass."""
    with monkeypatch.context() as mp:
        mp.setattr(fusion, "_recompute_in_readers", lambda tape: None)
        f = mx.compile(fn, **kwargs)
        out = f(*args)
        mx.eval(out)
        return f, out


def _step(act):
    """``(w, b) -> (loss, (dw, db))`` of ``sum(act(x @ w + b) @ v)``: a product between
    the activation's forward and its backward, as in a transformer's MLP."""
    def step(x, w, b, v):
        def loss(w, b):
            return mx.sum(act(x @ w + b) @ v)
        return mx.value_and_grad(loss, argnums=(0, 1))(w, b)
    return step


_SQ2PI = math.sqrt(2 / math.pi)
#: name -> (the nn activation, its float64 NumPy forward, output buffers the pass spares)
ACTIVATIONS = {
    "gelu": (nn.gelu, lambda h: h * 0.5 * (1 + _erf(h / math.sqrt(2))), 2),
    "gelu_approx": (nn.gelu_approx,
                    lambda h: 0.5 * h * (1 + np.tanh(_SQ2PI * (h + 0.044715 * h ** 3))), 3),
    "silu": (nn.silu, lambda h: h / (1 + np.exp(-h)), 1),
    "mish": (nn.mish, lambda h: h * np.tanh(np.log1p(np.exp(h))), 2),
}


def _reference(forward, x, w, b, v):
    """The loss and its gradients in float64, the activation's derivative by central
    differences of its NumPy forward."""
    x, w, b, v = (a.astype(np.float64) for a in (x, w, b, v))
    h = x @ w + b
    eps = 1e-6
    dh = v.sum(axis=1) * (forward(h + eps) - forward(h - eps)) / (2 * eps)
    return np.sum(forward(h) @ v), x.T @ dh, dh.sum(axis=0)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_an_activations_backward_recomputes_what_its_forward_no_longer_stores(name, monkeypatch):
    act, forward, spared = ACTIVATIONS[name]
    x, w, b, v = _data((256, 48), (48, 512), (512,), (512, 8))  # loops of 131072 elements
    args = [mx.array(a) for a in (x, w, b, v)]
    f = mx.compile(_step(act))
    loss, (dw, db) = f(*args)
    want = _reference(forward, x, w, b, v)
    np.testing.assert_allclose(float(loss.item()), want[0], rtol=1e-4)
    np.testing.assert_allclose(np.asarray(dw), want[1], rtol=2e-4, atol=2e-3)
    np.testing.assert_allclose(np.asarray(db), want[2], rtol=2e-4, atol=2e-3)

    plain, (loss0, (dw0, db0)) = _without_the_pass(monkeypatch, _step(act), args)
    np.testing.assert_allclose(np.asarray(dw), np.asarray(dw0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(db), np.asarray(db0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(loss.item()), float(loss0.item()), rtol=1e-6)
    # Without the pass the forward kernel stores intermediates (exact GELU: h / sqrt(2)
    # and 1 + erf(h / sqrt(2))) that the backward kernel loads; with it, they are
    # recomputed there from h.
    assert _stored(plain) - _stored(f) == spared, (_stored(plain), _stored(f))
    assert _stored(f) == 3  # h and the activation (forward), the cotangent (backward)


def test_small_loops_are_left_alone(monkeypatch):
    x, w, b, c = _data((8, 16), (16, 32), (32,), (32, 4), seed=1)  # 256 elements
    args = [mx.array(a) for a in (x, w, b, c)]
    f = mx.compile(_step(nn.gelu))
    got = f(*args)
    plain, _ = _without_the_pass(monkeypatch, _step(nn.gelu), args)
    assert _stored(plain) == _stored(f)
    np.testing.assert_allclose(np.asarray(got[1][0]),
                               _reference(ACTIVATIONS["gelu"][1], x, w, b, c)[1],
                               rtol=2e-4, atol=2e-4)


def test_a_value_with_another_reader_or_returned_stays_stored(monkeypatch):
    """``t = tanh(h)``: read by the fused backward and by a product (a second reader), or
    returned: it stays an output of the forward kernel."""
    x, w, v = _data((256, 32), (32, 512), (512, 8), seed=2)
    h_ref = x.astype(np.float64) @ w

    def two_readers(x, w, v):
        t = mx.tanh(x @ w)
        return mx.sum(t * t @ v) + mx.sum(mx.exp(t) * t)

    def returned(x, w):
        t = mx.tanh(x @ w)
        return t, mx.sum(mx.exp(t) * 2.0 + t)

    args = [mx.array(a) for a in (x, w, v)]
    for fn, n_args in ((two_readers, 3), (returned, 2)):
        g = mx.compile(lambda *a, fn=fn: mx.grad(lambda w: fn(a[0], w, *a[2:])
                                                 if n_args == 3 else fn(a[0], w)[1])(a[1]))
        got = np.asarray(g(*args[:n_args]))
        plain, want = _without_the_pass(monkeypatch, lambda *a, fn=fn: mx.grad(
            lambda w: fn(a[0], w, *a[2:]) if n_args == 3 else fn(a[0], w)[1])(a[1]), args[:n_args])
        want = np.asarray(want)
        assert _stored(plain) == _stored(g)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    t = np.tanh(h_ref)
    out = mx.compile(returned)(mx.array(x), mx.array(w))
    np.testing.assert_allclose(np.asarray(out[0]), t, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(out[1].item()), np.sum(np.exp(t) * 2 + t), rtol=1e-4)


def test_shapeless_traces_are_left_alone(monkeypatch):
    x, w, b, c = _data((256, 48), (48, 512), (512,), (512, 8), seed=4)
    args = [mx.array(a) for a in (x, w, b, c)]
    f = mx.compile(_step(nn.gelu), shapeless=True)
    got = f(*args)
    plain, _ = _without_the_pass(monkeypatch, _step(nn.gelu), args, shapeless=True)
    assert _stored(f) == _stored(plain) > 0
    np.testing.assert_allclose(np.asarray(got[1][1]),
                               _reference(ACTIVATIONS["gelu"][1], x, w, b, c)[2],
                               rtol=2e-4, atol=2e-3)


def test_a_relu_layers_forward_stores_the_activation_alone():
    """maximum's partial reads its output, which the next product reads anyway: the
    compiled ReLU layer's forward kernel stores relu(x @ w + b) and nothing else."""
    x, w, b, v = _data((64, 32), (32, 128), (128,), (128, 4), seed=5)
    args = [mx.array(a) for a in (x, w, b, v)]
    f = mx.compile(_step(nn.relu))
    loss, (dw, db) = f(*args)
    want = _reference(lambda h: np.maximum(h, 0.0), x, w, b, v)
    np.testing.assert_allclose(float(loss.item()), want[0], rtol=1e-4)
    np.testing.assert_allclose(np.asarray(dw), want[1], rtol=2e-4, atol=2e-3)
    np.testing.assert_allclose(np.asarray(db), want[2], rtol=2e-4, atol=2e-3)
    assert _stored(f) == 2  # the activation (forward), the cotangent (backward)
