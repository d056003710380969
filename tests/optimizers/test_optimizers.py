"""lazyx.optimizers: every update rule against a NumPy float64 step and against MLX,
state trees, save/load, compiled steps, and the errors of bad input."""

from functools import partial

import numpy as np
import pytest

import lazyx.core as mx
import lazyx.optimizers as optim
from lazyx.errors import LazyxError, ShapeError, TreeStructureError
from lazyx.transforms.compile import CompiledCall
from lazyx.utils import tree_flatten, tree_map, tree_unflatten

from mlx_compat import mlx, requires_mlx

STEPS = 4
SHAPES = {"w": (4, 3), "b": (3,), "layers": [(2, 3, 5)]}


def _draw(rng):
    return tree_map(lambda s: rng.standard_normal(s), SHAPES, is_leaf=lambda s: isinstance(s, tuple))


RNG = np.random.default_rng(7)
PARAMS = _draw(RNG)
GRADS = [_draw(RNG) for _ in range(STEPS)]


def _to(lib, tree):
    return tree_map(lambda a: lib.array(np.asarray(a, np.float32)), tree)


def _flat_np(tree):
    return {k: np.asarray(v, np.float64) for k, v in tree_flatten(tree)}


# NumPy float64 references: step(g, p, s, t, lr) -> new p, with s the parameter's state
# dict (updated in place) and t the 1-based step count.

def _rms(x):
    return np.sqrt(np.mean(np.square(x)))


def sgd(momentum=0.0, weight_decay=0.0, dampening=0.0, nesterov=False):
    def init(p):
        return {"v": np.zeros_like(p)}

    def step(g, p, s, t, lr):
        g = g + weight_decay * p
        if momentum <= 0:
            return p - lr * g
        s["v"] = momentum * s["v"] + (1 - dampening) * g
        return p - lr * (g + momentum * s["v"] if nesterov else s["v"])
    return init, step


def rmsprop(alpha=0.99, eps=1e-8):
    def step(g, p, s, t, lr):
        s["v"] = alpha * s["v"] + (1 - alpha) * g * g
        return p - lr * g / (np.sqrt(s["v"]) + eps)
    return (lambda p: {"v": np.zeros_like(p)}), step


def adagrad(eps=1e-8):
    def step(g, p, s, t, lr):
        s["v"] = s["v"] + g * g
        return p - lr * g / (np.sqrt(s["v"]) + eps)
    return (lambda p: {"v": np.zeros_like(p)}), step


def adadelta(rho=0.9, eps=1e-6):
    def step(g, p, s, t, lr):
        s["v"] = rho * s["v"] + (1 - rho) * g * g
        d = np.sqrt(s["u"] + eps) / np.sqrt(s["v"] + eps) * g
        s["u"] = rho * s["u"] + (1 - rho) * d * d
        return p - lr * d
    return (lambda p: {"v": np.zeros_like(p), "u": np.zeros_like(p)}), step


def adam(betas=(0.9, 0.999), eps=1e-8, bias_correction=False, weight_decay=None):
    b1, b2 = betas

    def step(g, p, s, t, lr):
        if weight_decay is not None:  # AdamW
            p = p * (1 - lr * weight_decay)
        s["m"] = b1 * s["m"] + (1 - b1) * g
        s["v"] = b2 * s["v"] + (1 - b2) * g * g
        if bias_correction:
            m_hat, v_hat = s["m"] / (1 - b1 ** t), s["v"] / (1 - b2 ** t)
            return p - lr * m_hat / (np.sqrt(v_hat) + eps)
        return p - lr * s["m"] / (np.sqrt(s["v"]) + eps)
    return (lambda p: {"m": np.zeros_like(p), "v": np.zeros_like(p)}), step


def adamax(betas=(0.9, 0.999), eps=1e-8):
    b1, b2 = betas

    def step(g, p, s, t, lr):
        s["m"] = b1 * s["m"] + (1 - b1) * g
        s["v"] = np.maximum(b2 * s["v"], np.abs(g))
        return p - lr * s["m"] / (s["v"] + eps)
    return (lambda p: {"m": np.zeros_like(p), "v": np.zeros_like(p)}), step


def lion(betas=(0.9, 0.99), weight_decay=0.0):
    b1, b2 = betas

    def step(g, p, s, t, lr):
        c = b1 * s["m"] + (1 - b1) * g
        s["m"] = b2 * s["m"] + (1 - b2) * g
        return p * (1 - lr * weight_decay) - lr * np.sign(c)
    return (lambda p: {"m": np.zeros_like(p)}), step


def adafactor(lr_fixed=False, eps=(1e-30, 1e-3), clip=1.0, decay=-0.8, beta_1=None,
              weight_decay=0.0, scale_parameter=True, warmup_init=False):
    def init(p):
        s = ({"exp_avg_sq_row": np.zeros(p.shape[:-1]),
              "exp_avg_sq_col": np.zeros(p.shape[:-2] + p.shape[-1:])}
             if p.ndim >= 2 else {"exp_avg_sq": np.zeros_like(p)})
        if beta_1 is not None:
            s["exp_avg"] = np.zeros_like(p)
        return s

    def step(g, p, s, t, lr):
        size = lr if lr_fixed else min(1e-6 * t if warmup_init else 1e-2, 1 / np.sqrt(t))
        if scale_parameter:
            size = max(eps[1], _rms(p)) * size
        beta_2 = 1 - t ** decay
        u = g * g + eps[0]
        if g.ndim >= 2:
            s["exp_avg_sq_row"] = beta_2 * s["exp_avg_sq_row"] + (1 - beta_2) * u.mean(-1)
            s["exp_avg_sq_col"] = beta_2 * s["exp_avg_sq_col"] + (1 - beta_2) * u.mean(-2)
            row, col = s["exp_avg_sq_row"], s["exp_avg_sq_col"]
            # The factored estimate of E[g^2]: outer(row, col) / mean(row).
            v = row[..., :, None] * col[..., None, :] / row.mean(-1)[..., None, None]
        else:
            s["exp_avg_sq"] = beta_2 * s["exp_avg_sq"] + (1 - beta_2) * u
            v = s["exp_avg_sq"]
        upd = g / np.sqrt(v)
        upd = size * upd / max(1.0, _rms(upd) / clip)
        if beta_1 is not None:
            s["exp_avg"] = beta_1 * s["exp_avg"] + (1 - beta_1) * upd
            upd = s["exp_avg"]
        return p * (1 - weight_decay * size) - upd
    return init, step


def _newton_schulz(x, steps):
    a, b, c = 3.4445, -4.7750, 2.0315
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / (np.linalg.norm(x) + 1e-7)
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if tall else x


def muon(momentum=0.95, weight_decay=0.01, nesterov=True, ns_steps=5):
    def step(g, p, s, t, lr):
        g = g + weight_decay * p
        s["v"] = momentum * s["v"] + (1 - momentum) * g
        upd = g * (1 - momentum) + momentum * s["v"] if nesterov else s["v"]
        if upd.ndim >= 2:
            flat = upd.reshape(upd.shape[0], -1)
            upd = _newton_schulz(flat, ns_steps).reshape(upd.shape)
            lr = lr * max(1, upd.shape[-2] / upd.shape[-1]) ** 0.5
        return p - lr * upd
    return (lambda p: {"v": np.zeros_like(p)}), step


# (optimizer name, keyword arguments, NumPy reference, tolerance)
CASES = [
    ("SGD", {"learning_rate": 0.1}, sgd(), 1e-5),
    ("SGD", {"learning_rate": 0.1, "momentum": 0.9, "weight_decay": 0.01, "dampening": 0.1},
     sgd(0.9, 0.01, 0.1), 1e-5),
    ("SGD", {"learning_rate": 0.1, "momentum": 0.9, "nesterov": True}, sgd(0.9, nesterov=True),
     1e-5),
    ("RMSprop", {"learning_rate": 0.01, "alpha": 0.9}, rmsprop(0.9), 1e-5),
    ("Adagrad", {"learning_rate": 0.1}, adagrad(), 1e-5),
    ("AdaDelta", {"learning_rate": 0.5, "rho": 0.8}, adadelta(0.8), 1e-5),
    ("Adam", {"learning_rate": 0.01}, adam(), 1e-5),
    ("Adam", {"learning_rate": 0.01, "betas": [0.8, 0.9], "bias_correction": True},
     adam((0.8, 0.9), bias_correction=True), 1e-5),
    ("AdamW", {"learning_rate": 0.01, "weight_decay": 0.1}, adam(weight_decay=0.1), 1e-5),
    ("AdamW", {"learning_rate": 0.01, "bias_correction": True},
     adam(bias_correction=True, weight_decay=0.01), 1e-5),
    ("Adamax", {"learning_rate": 0.01}, adamax(), 1e-5),
    ("Lion", {"learning_rate": 0.01, "weight_decay": 0.1}, lion(weight_decay=0.1), 1e-5),
    ("Adafactor", {}, adafactor(), 1e-5),
    ("Adafactor", {"learning_rate": 0.01, "relative_step": False, "beta_1": 0.9,
                   "weight_decay": 0.1, "clip_threshold": 0.5},
     adafactor(lr_fixed=True, beta_1=0.9, weight_decay=0.1, clip=0.5), 1e-5),
    ("Adafactor", {"warmup_init": True, "scale_parameter": False},
     adafactor(warmup_init=True, scale_parameter=False), 1e-5),
    ("Muon", {"learning_rate": 0.02}, muon(), 1e-4),
    ("Muon", {"learning_rate": 0.02, "nesterov": False, "weight_decay": 0.0, "ns_steps": 3},
     muon(nesterov=False, weight_decay=0.0, ns_steps=3), 1e-4),
]
IDS = [f"{n}-{i}" for i, (n, *_) in enumerate(CASES)]


def _reference(init, step, lrs):
    """Parameters and per-parameter states after ``STEPS`` NumPy steps."""
    params = _flat_np(PARAMS)
    states = {k: init(p) for k, p in params.items()}
    for t, grads in enumerate(GRADS, start=1):
        g = _flat_np(grads)
        params = {k: step(g[k], params[k], states[k], t, lrs[t - 1]) for k in params}
    return params, states


def _run_lazyx(name, kwargs, schedule=None):
    kw = dict(kwargs)
    if schedule is not None:
        kw["learning_rate"] = schedule
    opt = getattr(optim, name)(**kw)
    params = _to(mx, PARAMS)
    for g in GRADS:
        params = opt.apply_gradients(_to(mx, g), params)
    mx.eval(params, opt.state)
    return params, opt


def _check_against(params, opt, want_params, want_states, tol):
    got = _flat_np(params)
    for k, want in want_params.items():
        np.testing.assert_allclose(got[k], want, rtol=tol, atol=tol, err_msg=k)
    state = opt.state
    assert int(state["step"].item()) == STEPS and state["step"].dtype == mx.uint64
    flat = dict(tree_flatten(state))
    for k, s in want_states.items():
        for key, want in s.items():
            np.testing.assert_allclose(np.asarray(flat[f"{k}.{key}"], np.float64), want,
                                       rtol=tol, atol=tol, err_msg=f"{k}.{key}")


@pytest.mark.parametrize("name,kwargs,ref,tol", CASES, ids=IDS)
def test_update_rule_matches_numpy(name, kwargs, ref, tol):
    lr = kwargs.get("learning_rate", 0.0)
    want_params, want_states = _reference(*ref, [lr] * STEPS)
    _check_against(*_run_lazyx(name, kwargs), want_params, want_states, tol)


@pytest.mark.parametrize("name,kwargs,ref,tol",
                         [c for c in CASES if "learning_rate" in c[1]],
                         ids=[i for i, c in zip(IDS, CASES) if "learning_rate" in c[1]])
def test_update_rule_with_a_schedule_matches_numpy(name, kwargs, ref, tol):
    # The schedule is evaluated at the step count before the update (0, 1, 2, ...).
    lr0 = kwargs["learning_rate"]
    want_params, want_states = _reference(*ref, [lr0 * 0.5 ** t for t in range(STEPS)])
    got = _run_lazyx(name, kwargs, optim.exponential_decay(lr0, 0.5))
    _check_against(*got, want_params, want_states, tol)
    assert got[1].learning_rate.shape == ()
    np.testing.assert_allclose(got[1].learning_rate.item(), lr0 * 0.5 ** (STEPS - 1), rtol=1e-6)


@requires_mlx
@pytest.mark.parametrize("name,kwargs,ref,tol", CASES, ids=IDS)
def test_update_rule_matches_mlx(name, kwargs, ref, tol):
    import mlx.optimizers as mlx_optim
    from mlx.utils import tree_flatten as mlx_flatten

    kw = dict(kwargs)
    if "learning_rate" in kw:
        kw["learning_rate"] = optim.cosine_decay(kw["learning_rate"], 3, 1e-3)
    ours, params = getattr(optim, name)(**kw), _to(mx, PARAMS)
    if "learning_rate" in kwargs:
        kw["learning_rate"] = mlx_optim.cosine_decay(kwargs["learning_rate"], 3, 1e-3)
    theirs, mparams = getattr(mlx_optim, name)(**kw), _to(mlx, PARAMS)
    for g in GRADS:
        params = ours.apply_gradients(_to(mx, g), params)
        mparams = theirs.apply_gradients(_to(mlx, g), mparams)
    got, want = dict(tree_flatten(params)), dict(mlx_flatten(mparams))
    gstate, wstate = dict(tree_flatten(ours.state)), dict(mlx_flatten(theirs.state))
    assert list(gstate) == list(wstate)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=1e-5,
                                   atol=1e-6, err_msg=k)
    for k in wstate:
        assert gstate[k].dtype.name.replace("bool_", "bool") == str(wstate[k].dtype).split(".")[-1]
        assert gstate[k].shape == tuple(wstate[k].shape), k
        np.testing.assert_allclose(np.asarray(gstate[k]).astype(np.float64),
                                   np.asarray(wstate[k]).astype(np.float64), rtol=1e-5,
                                   atol=1e-7, err_msg=k)


@requires_mlx
@pytest.mark.parametrize("make", [
    lambda o: o.SGD(0.1, nesterov=True),
    lambda o: o.SGD(0.1, momentum=0.9, dampening=0.1, nesterov=True),
    lambda o: o.RMSprop(0.1, alpha=-1), lambda o: o.RMSprop(0.1, eps=0),
    lambda o: o.Adagrad(0.1, eps=0), lambda o: o.AdaDelta(0.1, rho=-1),
    lambda o: o.AdaDelta(0.1, eps=0), lambda o: o.Adam(0.1, betas=[1.0, 0.9]),
    lambda o: o.Adam(0.1, betas=[0.9, 1.5]), lambda o: o.Adam(0.1, eps=-1),
    lambda o: o.AdamW(0.1, betas=[-0.1, 0.9]), lambda o: o.Adamax(0.1, eps=-1),
    lambda o: o.Lion(0.1, betas=[0.9, 1.0]),
    lambda o: o.MultiOptimizer([o.SGD(0.1), o.Adam(0.1)]),
    lambda o: o.MultiOptimizer([o.SGD(0.1)], [lambda p, g: True]),
])
def test_bad_hyper_parameters_raise_as_mlx(make):
    import mlx.optimizers as mlx_optim
    with pytest.raises(ValueError) as want:
        make(mlx_optim)
    with pytest.raises(ValueError) as got:
        make(optim)
    assert str(got.value) == str(want.value)


@requires_mlx
def test_initial_state_matches_mlx():
    import mlx.optimizers as mlx_optim
    from mlx.utils import tree_flatten as mlx_flatten

    for name, kwargs, *_ in CASES:
        ours, theirs = getattr(optim, name)(**kwargs), getattr(mlx_optim, name)(**kwargs)
        ours.init(_to(mx, PARAMS))
        theirs.init(_to(mlx, PARAMS))
        got, want = dict(tree_flatten(ours.state)), dict(mlx_flatten(theirs.state))
        assert list(got) == list(want), name
        for k in want:
            assert got[k].shape == tuple(want[k].shape), (name, k)
            assert got[k].dtype.name == str(want[k].dtype).split(".")[-1], (name, k)


def test_state_saves_and_loads_and_resumes(tmp_path):
    opt = optim.Adam(optim.linear_schedule(0.0, 0.01, 3), bias_correction=True)
    params = _to(mx, PARAMS)
    for g in GRADS[:2]:
        params = opt.apply_gradients(_to(mx, g), params)
    path = str(tmp_path / "opt.safetensors")
    mx.save_safetensors(path, dict(tree_flatten(opt.state)))

    resumed = optim.Adam(optim.linear_schedule(0.0, 0.01, 3), bias_correction=True)
    resumed.state = tree_unflatten(list(mx.load(path).items()))
    assert resumed.state["step"].dtype == mx.uint64 and resumed.state["step"].item() == 2
    assert isinstance(resumed.state["layers"], list)
    p1, p2 = params, tree_map(lambda a: mx.array(np.asarray(a)), params)
    for g in GRADS[2:]:
        p1 = opt.apply_gradients(_to(mx, g), p1)
        p2 = resumed.apply_gradients(_to(mx, g), p2)
    # (The loaded state's keys come back in the file's order: compare by key.)
    got, want = dict(tree_flatten([p2, resumed.state])), dict(tree_flatten([p1, opt.state]))
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]), err_msg=k)


def _loss(params, x, y):
    h = mx.maximum(x @ params["layers"][0]["w"] + params["layers"][0]["b"], 0.0)
    return mx.mean(mx.square(h @ params["out"] - y))


class DictModel(dict):
    """A minimal stand-in for an nn.Module: a dict of parameters with ``update``."""


@pytest.mark.parametrize("make", [
    lambda: optim.Adam(optim.cosine_decay(1e-2, 4), bias_correction=True),
    lambda: optim.SGD(1e-2, momentum=0.9, weight_decay=1e-3),
    lambda: optim.Adafactor(beta_1=0.9),
    lambda: optim.MultiOptimizer([optim.Lion(1e-3), optim.AdamW(1e-2)],
                                 [lambda path, g: path.startswith("out")]),
], ids=["Adam", "SGD", "Adafactor", "MultiOptimizer"])
def test_compiled_step_is_one_node_and_equals_eager(make):
    rng = np.random.default_rng(3)
    data = [(rng.standard_normal((8, 5)).astype(np.float32),
             rng.standard_normal((8, 2)).astype(np.float32)) for _ in range(4)]
    init = {"layers": [{"w": rng.standard_normal((5, 6)), "b": np.zeros(6)}],
            "out": rng.standard_normal((6, 2))}

    def train(compiled):
        model, opt = DictModel(_to(mx, init)), make()
        state = [model, opt.state]

        def step(x, y):
            loss, grads = mx.value_and_grad(_loss)(model, x, y)
            opt.update(model, grads)
            return loss

        if compiled:
            step = partial(mx.compile, inputs=state, outputs=state)(step)
        losses = []
        for x, y in data:
            loss = step(mx.array(x), mx.array(y))
            if compiled:
                # The loss, every parameter and every state array: outputs of one node.
                arrays = [loss] + [a for _, a in tree_flatten([model, opt.state])]
                assert type(loss._prim) is CompiledCall
                assert all(a._prim is loss._prim for a in arrays)
            mx.eval(loss, model, opt.state)
            losses.append(loss.item())
        return losses, dict(tree_flatten([model, opt.state]))

    (el, es), (cl, cs) = train(False), train(True)
    np.testing.assert_allclose(cl, el, rtol=1e-5)
    assert list(cs) == list(es)
    for k in es:
        np.testing.assert_allclose(np.asarray(cs[k]).astype(np.float64),
                                   np.asarray(es[k]).astype(np.float64), rtol=1e-5, atol=1e-6,
                                   err_msg=k)
    assert cl[-1] < cl[0]


def test_multi_optimizer_splits_by_filter():
    params = _to(mx, PARAMS)
    grads = _to(mx, GRADS[0])
    opt = optim.MultiOptimizer([optim.SGD(0.1), optim.SGD(1.0)],
                               [lambda path, g: path.startswith("layers")])
    new = opt.apply_gradients(grads, params)
    for k, p in tree_flatten(PARAMS):
        lr = 0.1 if k.startswith("layers") else 1.0
        np.testing.assert_allclose(np.asarray(dict(tree_flatten(new))[k]),
                                   p - lr * dict(tree_flatten(GRADS[0]))[k], rtol=1e-5, atol=1e-6)
    assert set(opt.state["states"][0]) == {"step", "learning_rate", "layers"}
    assert set(opt.state["states"][1]) == {"step", "learning_rate", "w", "b"}
    opt.learning_rate = 0.5
    assert opt.learning_rate.item() == 0.5 and opt.optimizers[1].learning_rate.item() == 0.5
    with pytest.raises(ValueError, match="Invalid state"):
        opt.state = {"states": [{}]}


@requires_mlx
def test_multi_optimizer_and_clip_grad_norm_match_mlx():
    import mlx.optimizers as mlx_optim
    from mlx.utils import tree_flatten as mlx_flatten

    def make(o):
        return o.MultiOptimizer([o.Lion(1e-2), o.AdamW(1e-2, bias_correction=True)],
                                [lambda path, g: path.endswith("b") or g.ndim == 3])

    ours, theirs = make(optim), make(mlx_optim)
    params, mparams = _to(mx, PARAMS), _to(mlx, PARAMS)
    for raw in GRADS:
        g, norm = optim.clip_grad_norm(_to(mx, raw), 4.0)
        mg, mnorm = mlx_optim.clip_grad_norm(_to(mlx, raw), 4.0)
        np.testing.assert_allclose(norm.item(), mnorm.item(), rtol=1e-6)
        params = ours.apply_gradients(g, params)
        mparams = theirs.apply_gradients(mg, mparams)
    got = dict(tree_flatten([params, ours.state]))
    want = dict(mlx_flatten([mparams, theirs.state]))
    # (MLX's tree_merge orders keys by string hash: compare by key.)
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]).astype(np.float64),
                                   np.asarray(want[k]).astype(np.float64), rtol=1e-5,
                                   atol=1e-7, err_msg=k)


def test_clip_grad_norm():
    grads = _to(mx, GRADS[0])
    flat = _flat_np(GRADS[0])
    norm = np.sqrt(sum(np.sum(np.square(v.astype(np.float32).astype(np.float64)))
                       for v in flat.values()))
    for max_norm in (float(norm / 3), float(2 * norm)):
        clipped, total = optim.clip_grad_norm(grads, max_norm)
        np.testing.assert_allclose(total.item(), norm, rtol=1e-5)
        scale = min(max_norm / (norm + 1e-6), 1.0)
        for k, c in tree_flatten(clipped):
            np.testing.assert_allclose(np.asarray(c), flat[k] * scale, rtol=1e-5, atol=1e-6)
        got = np.sqrt(sum(np.sum(np.square(np.asarray(c, np.float64)))
                          for _, c in tree_flatten(clipped)))
        np.testing.assert_allclose(got, min(norm, max_norm), rtol=1e-5)


def test_learning_rate_setter_and_step():
    opt = optim.SGD(learning_rate=0.1)
    assert opt.step.dtype == mx.uint64 and opt.step.item() == 0
    assert opt.learning_rate.dtype == mx.float32
    opt.learning_rate = 0.25
    new = opt.apply_gradients({"w": mx.ones((2,))}, {"w": mx.zeros((2,))})
    np.testing.assert_allclose(np.asarray(new["w"]), [-0.25, -0.25])
    assert opt.step.item() == 1


# Bad input: errors name the parameter path and the shapes.

def test_gradient_of_the_wrong_shape_names_path_and_shapes():
    opt = optim.Adam(0.1)
    with pytest.raises(ShapeError, match=r"'layers\.0'.*\(2, 3, 4\).*\(2, 3, 5\)"):
        opt.apply_gradients({"layers": [mx.ones((2, 3, 4))]}, {"layers": [mx.ones((2, 3, 5))]})


def test_state_of_another_model_names_path_and_shapes():
    opt = optim.Adam(0.1)
    opt.init({"w": mx.ones((2, 3))})
    with pytest.raises(ShapeError, match=r"'w'.*\(3, 3\).*m: \(2, 3\)"):
        opt.apply_gradients({"w": mx.ones((3, 3))}, {"w": mx.ones((3, 3))})
    # A state that would broadcast silently is caught too.
    opt = optim.SGD(0.1, momentum=0.9)
    opt.init({"w": mx.ones((2, 3))})
    with pytest.raises(ShapeError, match=r"'w'.*\(1, 3\).*v: \(2, 3\)"):
        opt.apply_gradients({"w": mx.ones((1, 3))}, {"w": mx.ones((1, 3))})


def test_tree_that_does_not_match_the_state_names_the_path():
    opt = optim.Adam(0.1)
    opt.init({"w": mx.ones((2, 3))})
    with pytest.raises(TreeStructureError, match="'x'.*optimizer state") as e:
        opt.apply_gradients({"x": mx.ones((2, 3))}, {"x": mx.ones((2, 3))})
    assert isinstance(e.value, KeyError)  # as MLX raises
    with pytest.raises(TreeStructureError, match="'w'.*parameters"):
        opt.apply_gradients({"w": mx.ones((2, 3))}, {"y": mx.ones((2, 3))})
    opt.state = tree_unflatten(list({"step": mx.array(3, mx.uint64),
                                     "learning_rate": mx.array(0.1)}.items()))
    opt._initialized = True  # a loaded state used without init: a missing parameter
    with pytest.raises(TreeStructureError, match="'a.0'"):
        opt.apply_gradients({"a": [mx.ones(2), mx.ones(2)]}, {"a": [mx.ones(2), mx.ones(2)]})


def test_an_error_of_the_rule_itself_is_not_called_a_tree_mismatch():
    class Broken(optim.SGD):
        def apply_single(self, gradient, parameter, state):
            raise TypeError("a bug in the rule")

    with pytest.raises(TypeError, match="a bug in the rule"):
        Broken(0.1).apply_gradients({"w": mx.ones(2)}, {"w": mx.ones(2)})


def test_schedule_returning_a_non_scalar_is_an_error():
    with pytest.raises(ShapeError, match=r"'learning_rate'.*\(3,\).*scalar"):
        optim.SGD(lambda step: mx.ones(3) * 0.1)
    calls = []

    def late(step):
        calls.append(step)
        return mx.array(0.1) if len(calls) == 1 else mx.full((2,), 0.1)

    opt = optim.Adam(late)
    with pytest.raises(ShapeError, match=r"Adam.*'learning_rate'.*\(2,\)"):
        opt.apply_gradients({"w": mx.ones(2)}, {"w": mx.ones(2)})
    assert isinstance(opt.learning_rate, mx.array)
    # A schedule may return a plain number.
    opt = optim.SGD(lambda step: 0.5)
    assert opt.learning_rate.item() == 0.5
    assert issubclass(ShapeError, LazyxError)


def test_adafactor_needs_a_learning_rate_without_relative_step():
    with pytest.raises(ValueError, match="learning_rate"):
        optim.Adafactor(relative_step=False)
