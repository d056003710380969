"""lazyx.optimizers schedules: NumPy float64 formulas, MLX's values, argument errors."""

import math

import numpy as np
import pytest

import lazyx.core as mx
import lazyx.optimizers as optim

from mlx_compat import mlx, requires_mlx

STEPS = [0, 1, 2, 3, 5, 9, 10, 11, 20]


def _reference(name, *args):
    """The schedule as a float64 function of an int step."""
    if name == "exponential_decay":
        init, rate = args
        return lambda t: init * rate ** t
    if name == "step_decay":
        init, rate, size = args
        return lambda t: init * rate ** (t // size)
    if name == "cosine_decay":
        init, steps, end = (*args, 0.0)[:3]
        return lambda t: end + 0.5 * (1 + math.cos(math.pi * min(t, steps) / steps)) * (init - end)
    if name == "linear_schedule":
        init, end, steps = args
        return lambda t: init + min(t, steps) * (end - init) / steps
    raise KeyError(name)


CASES = [
    ("exponential_decay", (0.1, 0.9)),
    ("step_decay", (0.1, 0.5, 3)),
    ("cosine_decay", (0.1, 10)),
    ("cosine_decay", (0.1, 10, 0.01)),
    ("linear_schedule", (0.0, 0.1, 7)),
    ("linear_schedule", (1.0, 0.5, 4)),
]


@pytest.mark.parametrize("name,args", CASES)
def test_schedule_matches_numpy(name, args):
    schedule, want = getattr(optim, name)(*args), _reference(name, *args)
    for t in STEPS:
        got = schedule(mx.array(t, mx.uint64))
        assert got.shape == () and got.dtype == mx.float32
        np.testing.assert_allclose(got.item(), want(t), rtol=1e-6, atol=1e-8, err_msg=str(t))


def test_join_schedules_matches_numpy():
    warmup, decay = optim.linear_schedule(0.0, 0.1, 5), optim.cosine_decay(0.1, 10)
    schedule = optim.join_schedules([warmup, decay, optim.exponential_decay(0.05, 0.5)], [5, 12])
    w, d = _reference("linear_schedule", 0.0, 0.1, 5), _reference("cosine_decay", 0.1, 10)
    e = _reference("exponential_decay", 0.05, 0.5)
    for t in range(20):
        want = w(t) if t < 5 else d(t - 5) if t < 12 else e(t - 12)
        np.testing.assert_allclose(schedule(mx.array(t, mx.uint64)).item(), want, rtol=1e-6,
                                   atol=1e-8, err_msg=str(t))


@requires_mlx
@pytest.mark.parametrize("name,args", CASES)
def test_schedule_matches_mlx(name, args):
    import mlx.optimizers as mlx_optim
    ours, theirs = getattr(optim, name)(*args), getattr(mlx_optim, name)(*args)
    for t in STEPS:
        got, want = ours(mx.array(t, mx.uint64)), theirs(mlx.array(t, mlx.uint64))
        assert got.dtype.name == str(want.dtype).split(".")[-1]
        np.testing.assert_allclose(got.item(), want.item(), rtol=1e-6, err_msg=str(t))


@requires_mlx
@pytest.mark.parametrize("make", [
    lambda o: o.step_decay(0.1, 0.9, 0), lambda o: o.cosine_decay(0.1, -1),
    lambda o: o.linear_schedule(0.0, 1.0, 0), lambda o: o.join_schedules([], []),
    lambda o: o.join_schedules([o.exponential_decay(0.1, 0.9)], [3]),
])
def test_bad_arguments_raise_as_mlx(make):
    import mlx.optimizers as mlx_optim
    with pytest.raises(ValueError) as want:
        make(mlx_optim)
    with pytest.raises(ValueError) as got:
        make(optim)
    assert str(got.value) == str(want.value)


def test_schedule_drives_the_optimizer_inside_a_compiled_step():
    # The learning rate is recomputed from the step in the graph: no retrace per step.
    opt = optim.SGD(optim.step_decay(1.0, 0.5, 2))
    params = {"w": mx.zeros((2,))}
    traces = []

    def step(g):
        traces.append(1)
        params.update(opt.apply_gradients({"w": g}, params))
        return params["w"]

    opt.init(params)
    state = [params, opt.state]
    compiled = mx.compile(step, inputs=state, outputs=state)
    for _ in range(5):
        mx.eval(compiled(mx.ones((2,))))
    # Learning rates 1, 1, 0.5, 0.5, 0.25.
    np.testing.assert_allclose(np.asarray(params["w"]), [-3.25, -3.25])
    assert len(traces) == 1 and opt.step.item() == 5
