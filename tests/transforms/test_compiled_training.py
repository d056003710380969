"""Compiled MLP training steps: MSE and cross-entropy losses, with and without biases,
SGD and Adam written with core ops, compiled against eager and against NumPy float64.

A step is ``value_and_grad`` of the loss of a two-layer tanh MLP followed by the
optimizer's update, the graph where the backward pass reads forward values across
the loss (the case that once made fusion group a node with its own consumer). Each
configuration runs several steps three ways — eager lazyx, ``mx.compile`` of the
step, and a NumPy float64 step with the gradients written by hand — and the losses
and parameters must agree. Every configuration runs on the ``cpu-reference``
backend with fusion forced (fused nodes interpreted, nothing compiled), two on the
``cpu`` backend with C++ kernels; the captured-state pattern (``inputs=`` /
``outputs=``) runs on both.
"""

import contextlib
import itertools

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.codegen import jit
from lazyx.transforms import fusion
from lazyx.transforms.fusion import Compiled

B, D, H, C = 6, 5, 7, 3  # batch, inputs, hidden units, outputs (classes)
LR, B1, B2, EPS = 0.05, 0.9, 0.999, 1e-8
STEPS = 4


# -- the model, the losses and the optimizers in lazyx -----------------------------------
def forward(p, x):
    a = x @ p["w1"]
    if "b1" in p:
        a = a + p["b1"]
    z = mx.tanh(a) @ p["w2"]
    if "b2" in p:
        z = z + p["b2"]
    return z


def mse(z, y):
    return mx.mean(mx.square(z - y))


def cross_entropy(z, labels):
    logp = z - mx.logsumexp(z, axis=1, keepdims=True)  # log-softmax
    return -mx.mean(mx.take_along_axis(logp, labels[:, None], axis=1))


def sgd(p, g, state):
    return {k: p[k] - LR * g[k] for k in p}, state


def adam(p, g, state):
    t = state["t"] + 1
    m = {k: B1 * state["m"][k] + (1 - B1) * g[k] for k in p}
    v = {k: B2 * state["v"][k] + (1 - B2) * mx.square(g[k]) for k in p}
    new = {k: p[k] - LR * (m[k] / (1 - B1 ** t)) / (mx.sqrt(v[k] / (1 - B2 ** t)) + EPS)
           for k in p}
    return new, {"m": m, "v": v, "t": t}


LOSSES = {"mse": mse, "cross_entropy": cross_entropy}
OPTIMIZERS = {"sgd": sgd, "adam": adam}


def make_step(loss, optimizer):
    """``step(params, state, x, y) -> (loss, params, state)``, a pure function."""
    loss_fn, update = LOSSES[loss], OPTIMIZERS[optimizer]

    def step(p, state, x, y):
        value, g = mx.value_and_grad(lambda p: loss_fn(forward(p, x), y))(p)
        p, state = update(p, g, state)
        return value, p, state
    return step


# -- the same step in NumPy float64, gradients by hand ------------------------------------
def np_step(loss, optimizer, p, state, x, y):
    a = x @ p["w1"] + p.get("b1", 0.0)
    h = np.tanh(a)
    z = h @ p["w2"] + p.get("b2", 0.0)
    if loss == "mse":
        value = np.mean((z - y) ** 2)
        dz = 2 * (z - y) / z.size
    else:
        logp = z - z.max(1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(1, keepdims=True))
        value = -np.mean(logp[np.arange(len(y)), y])
        dz = (np.exp(logp) - np.eye(z.shape[1])[y]) / len(y)
    da = (dz @ p["w2"].T) * (1 - h ** 2)
    g = {"w1": x.T @ da, "w2": h.T @ dz, "b1": da.sum(0), "b2": dz.sum(0)}
    g = {k: g[k] for k in p}
    if optimizer == "sgd":
        return value, {k: p[k] - LR * g[k] for k in p}, state
    t = state["t"] + 1
    m = {k: B1 * state["m"][k] + (1 - B1) * g[k] for k in p}
    v = {k: B2 * state["v"][k] + (1 - B2) * g[k] ** 2 for k in p}
    new = {k: p[k] - LR * (m[k] / (1 - B1 ** t)) / (np.sqrt(v[k] / (1 - B2 ** t)) + EPS)
           for k in p}
    return value, new, {"m": m, "v": v, "t": t}


# -- data -------------------------------------------------------------------------------
def problem(loss, bias, optimizer, seed=0):
    """NumPy float64 ``(params, state, x, y)``; the float32 casts are what lazyx gets."""
    gen = np.random.default_rng(seed)
    f32 = lambda a: a.astype(np.float32).astype(np.float64)  # noqa: E731
    p = {"w1": f32(gen.normal(0, 0.5, (D, H))), "w2": f32(gen.normal(0, 0.5, (H, C)))}
    if bias:
        p["b1"], p["b2"] = f32(gen.normal(0, 0.1, H)), f32(gen.normal(0, 0.1, C))
    state = {}
    if optimizer == "adam":
        state = {"m": {k: np.zeros_like(v) for k, v in p.items()},
                 "v": {k: np.zeros_like(v) for k, v in p.items()}, "t": 0.0}
    x = f32(gen.normal(0, 1, (B, D)))
    y = f32(gen.normal(0, 1, (B, C))) if loss == "mse" else gen.integers(0, C, B).astype(np.int32)
    return p, state, x, y


def to_lazyx(tree):
    if isinstance(tree, dict):
        return {k: to_lazyx(v) for k, v in tree.items()}
    a = np.asarray(tree)
    return mx.array(a.astype(np.float32) if a.dtype == np.float64 else a)


def leaves(tree):
    if isinstance(tree, dict):
        return [x for k in sorted(tree) for x in leaves(tree[k])]
    if isinstance(tree, (list, tuple)):
        return [x for t in tree for x in leaves(t)]
    return [np.asarray(tree, dtype=np.float64)]


def assert_trees_close(got, want, rtol, atol):
    for a, b in zip(leaves(got), leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


@contextlib.contextmanager
def backend(name):
    """``cpu``: C++ kernels. ``cpu-reference``: compile still fuses (forced), and the
    fused nodes are interpreted, so every grouping runs without a compiler."""
    with mx.use_backend("cpu", name), pytest.MonkeyPatch.context() as mp:
        if name == "cpu-reference":
            mp.setattr(fusion, "_can_fuse", lambda: True)
        yield


def fused_nodes(fn):
    return [n.prim for e in fn.cache.entries.values() for n in e.run_tape.nodes
            if isinstance(n.prim, Compiled)]


CONFIGS = list(itertools.product(LOSSES, (True, False), OPTIMIZERS))
CPP = [("mse", True, "adam"), ("cross_entropy", False, "sgd")]
cases = [pytest.param(*c, "cpu-reference", id="-".join(map(str, c)) + "-reference")
         for c in CONFIGS]
cases += [pytest.param(*c, "cpu", id="-".join(map(str, c)) + "-cpp",
                       marks=pytest.mark.skipif(not jit.available(), reason="no C++ compiler"))
          for c in CPP]


@pytest.mark.parametrize("loss,bias,optimizer,backend_name", cases)
def test_compiled_steps_match_eager_and_numpy(loss, bias, optimizer, backend_name):
    p64, s64, x64, y64 = problem(loss, bias, optimizer)
    step = make_step(loss, optimizer)
    x, y = to_lazyx(x64), to_lazyx(y64)
    with backend(backend_name):
        cstep = mx.compile(step)
        eager = (to_lazyx(p64), to_lazyx(s64))
        comp = (to_lazyx(p64), to_lazyx(s64))
        for _ in range(STEPS):
            le, *eager = step(*eager, x, y)
            lc, *comp = cstep(*comp, x, y)
            mx.eval(le, eager, lc, comp)
            l64, p64, s64 = np_step(loss, optimizer, p64, s64, x64, y64)
            assert_trees_close([lc, comp], [le, eager], rtol=1e-5, atol=1e-6)
            assert_trees_close([lc, comp[0]], [l64, p64], rtol=1e-4, atol=1e-5)
    assert cstep.cache.traces == 1
    assert fused_nodes(cstep), "the step's element-wise runs were fused"


@pytest.mark.parametrize("backend_name", [
    "cpu-reference",
    pytest.param("cpu", marks=pytest.mark.skipif(not jit.available(), reason="no C++ compiler"))])
def test_a_step_compiled_with_captured_state_updates_it_in_place(backend_name):
    # MLX's pattern: the model and optimizer state are read through inputs= and
    # written back through outputs=; the step takes only the batch.
    loss, optimizer = "mse", "adam"
    p64, s64, x64, y64 = problem(loss, True, optimizer, seed=1)
    step = make_step(loss, optimizer)
    with backend(backend_name):
        state = {"params": to_lazyx(p64), "opt": to_lazyx(s64)}

        def train(x, y):
            value, state["params"], state["opt"] = step(state["params"], state["opt"], x, y)
            return value
        ctrain = mx.compile(train, inputs=state, outputs=state)
        x, y = to_lazyx(x64), to_lazyx(y64)
        for _ in range(STEPS):
            value = ctrain(x, y)
            mx.eval(value, state)
            l64, p64, s64 = np_step(loss, optimizer, p64, s64, x64, y64)
            assert_trees_close([value, state["params"], state["opt"]], [l64, p64, s64],
                               rtol=1e-4, atol=1e-5)
    assert ctrain.cache.traces == 1
    assert fused_nodes(ctrain)
