"""Large parameters update through one compiled function per rule
(``Optimizer._apply_fused``): the same numbers as the rule run op by op, for every
built-in optimizer, with schedules, bias correction, a hyper-parameter changed between
steps, inside a compiled step, and not for a subclass's own rule."""

from functools import partial

import numpy as np
import pytest

import lazyx.core as mx
import lazyx.optimizers as optim
from lazyx.errors import ShapeError
from lazyx.optimizers import optimizers as impl

MAKERS = {
    "SGD": lambda: optim.SGD(0.1, momentum=0.9, weight_decay=0.01, nesterov=True),
    "RMSprop": lambda: optim.RMSprop(0.01),
    "Adagrad": lambda: optim.Adagrad(0.1),
    "AdaDelta": lambda: optim.AdaDelta(0.5),
    "Adam": lambda: optim.Adam(optim.cosine_decay(0.05, 10), bias_correction=True),
    "AdamW": lambda: optim.AdamW(0.01),
    "Adamax": lambda: optim.Adamax(0.01),
    "Lion": lambda: optim.Lion(0.01),
    "Adafactor": lambda: optim.Adafactor(),
    "Muon": lambda: optim.Muon(0.02),
}


def _params():
    rng = np.random.default_rng(0)
    return {"w": mx.array(rng.standard_normal((80, 64)).astype(np.float32)),  # fused
            "b": mx.array(rng.standard_normal(64).astype(np.float32))}        # op by op


def _grads(step):
    rng = np.random.default_rng(100 + step)
    return {"w": mx.array(rng.standard_normal((80, 64)).astype(np.float32)),
            "b": mx.array(rng.standard_normal(64).astype(np.float32))}


def _train(make, steps=4, change=None):
    opt, params = make(), _params()
    for t in range(steps):
        if change is not None and t == 2:
            change(opt)
        params = opt.apply_gradients(_grads(t), params)
        mx.eval(params, opt.state)
    return opt, {k: np.asarray(v) for k, v in params.items()}


def _plain(monkeypatch, make, **kw):
    with monkeypatch.context() as m:
        m.setattr(impl, "FUSE_MIN", 1 << 62)
        return _train(make, **kw)[1]


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_fused_rule_matches_the_rule_op_by_op(name, monkeypatch):
    opt, fused = _train(MAKERS[name])
    entries = list(opt._fused_rules.values())
    assert entries and all(e is not impl._UNFUSABLE for e in entries), name
    plain = _plain(monkeypatch, MAKERS[name])
    for k in fused:
        np.testing.assert_allclose(fused[k], plain[k], rtol=2e-5, atol=2e-6, err_msg=f"{name} {k}")


def test_a_changed_hyper_parameter_traces_again(monkeypatch):
    def change(opt):
        opt.betas = [0.5, 0.9]
        opt.eps = 1e-3
    make = lambda: optim.Adam(0.05)  # noqa: E731
    opt, fused = _train(make, change=change)
    assert len(opt._fused_rules) == 2
    plain = _plain(monkeypatch, make, change=change)
    np.testing.assert_allclose(fused["w"], plain["w"], rtol=2e-5, atol=2e-6)


def test_inside_a_compiled_step_the_numbers_are_the_same(monkeypatch):
    opt, params = optim.Adam(0.05), _params()
    opt.init(params)
    state = [opt.state]  # as MLX users write a compiled step

    @partial(mx.compile, inputs=state, outputs=state)
    def step(params, grads):
        return opt.apply_gradients(grads, params)

    for t in range(3):
        params = step(params, _grads(t))
        mx.eval(params, opt.state)
    plain = _plain(monkeypatch, lambda: optim.Adam(0.05), steps=3)
    np.testing.assert_allclose(np.asarray(params["w"]), plain["w"], rtol=2e-5, atol=2e-6)


def test_a_subclass_rule_runs_op_by_op():
    class Noisy(optim.SGD):
        calls = 0

        def apply_single(self, gradient, parameter, state):
            Noisy.calls += 1  # a side effect a trace would run once
            return super().apply_single(gradient, parameter, state)

    _train(lambda: Noisy(0.1), steps=3)
    assert Noisy.calls == 6  # 2 parameters x 3 steps


# -- every parameter in one compiled function (the GPU's update: Optimizer._apply_all_fused) --
@pytest.mark.parametrize("name", sorted(MAKERS))
def test_the_all_parameter_update_matches_the_rule_op_by_op(name, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(impl, "_fuses_all", lambda: True)
        opt, fused = _train(MAKERS[name])
    keys = [k for k in opt._fused_rules if k[0] == "all"]
    assert keys and all(opt._fused_rules[k] is not impl._UNFUSABLE for k in keys), name
    plain = _plain(monkeypatch, MAKERS[name])
    for k in fused:
        np.testing.assert_allclose(fused[k], plain[k], rtol=2e-5, atol=2e-6, err_msg=f"{name} {k}")


def test_the_all_parameter_update_leaves_errors_to_the_per_parameter_path(monkeypatch):
    monkeypatch.setattr(impl, "_fuses_all", lambda: True)
    opt, params = optim.Adam(0.05), _params()
    opt.apply_gradients(_grads(0), params)
    bad = dict(_grads(1), b=mx.zeros(63))
    with pytest.raises(ShapeError, match="'b'"):
        opt.apply_gradients(bad, params)
    # a changed hyper-parameter traces the all-parameter function again
    opt.betas = [0.5, 0.9]
    mx.eval(opt.apply_gradients(_grads(2), params))
    assert len([k for k in opt._fused_rules if k[0] == "all"]) == 2
