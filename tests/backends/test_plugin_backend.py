"""A third-party backend: ``counting``, from ``tests/plugin_packages/lazyx-countingbackend``.

It is pip-installed by the test command and found through its entry point only; it
wraps ``cpu`` and counts kernel launches. A second plugin of the same distribution
overrides its ``Subtract`` kernel.
"""

import numpy as np
import pytest

import lazyx.core as mx
from lazyx import registry
from lazyx.backend import Backend, active_backend, backends
from helpers import assert_close, rng, to_lazyx


@pytest.fixture
def counting():
    info = registry.plugins.get("counting")
    assert info is not None, ("the counting backend is not installed: "
                              "pip install --no-deps --upgrade --target build/test-plugins "
                              "./tests/plugin_packages/*")
    with mx.use_backend("cpu", "counting") as b:
        b.reset()
        yield b


def test_it_comes_from_its_distributions_entry_point():
    info = registry.plugins["counting"]
    assert info.distribution == "lazyx-countingbackend" and info.version == "1.0.0"
    assert info.backends == ["counting"] and info.error is None
    b = backends()["counting"]
    assert isinstance(b, Backend) and type(b).__module__ == "lazyx_countingbackend"
    assert b.device_type is mx.DeviceType.cpu and b.is_available()


def test_kernel_launches_are_counted(counting):
    gen = rng(0)
    a = gen.standard_normal((3, 4)).astype(np.float32)
    x = to_lazyx(a)
    y = mx.sum(mx.exp(x) * x, axis=1)
    assert counting.launches == {}  # nothing runs before evaluation
    mx.eval(y)
    assert counting.launches == {"Exp": 1, "Multiply": 1, "Reduce": 1}
    assert_close(y, (np.exp(a.astype(np.float64)) * a).sum(axis=1), dtype=mx.float32)
    mx.eval(y)
    y.tolist()
    assert sum(counting.launches.values()) == 3  # evaluated once
    (x + 1).tolist()
    assert counting.launches["Add"] == 1


def test_a_plugins_primitive_with_its_own_kernel_is_counted_too(counting):
    out = mx.testpack.cube(mx.array([2.0, -1.0]))
    assert out.tolist() == [8.0, -1.0] and counting.launches == {"Cube": 1}


def test_results_match_cpu_on_many_ops():
    gen = rng(1)
    a = gen.uniform(0.5, 2.0, (4, 5)).astype(np.float32)

    def program(x):
        y = mx.log(x) @ mx.transpose(x) + mx.sort(x, axis=0)[:4, :4]
        return mx.concatenate([mx.cumsum(y, axis=1), mx.maximum(y, 1.0)], axis=0)

    expected = np.array(program(to_lazyx(a)))
    with mx.use_backend("cpu", "counting") as counting:
        counting.reset()
        got = np.array(program(to_lazyx(a)))
        assert sum(counting.launches.values()) >= 8
    np.testing.assert_array_equal(got, expected)
    assert active_backend(mx.cpu).name == "cpu"


def test_a_plugins_override_wins_over_the_backends_own_kernel(counting):
    from lazyx_countingbackend import overrides
    before = overrides.RUNS["Subtract"]
    x = mx.array([3.0, 5.0])
    assert (x - 1.0).tolist() == [2.0, 4.0]
    assert (mx.array([True, False]) - mx.array([True, True])).tolist() == [False, True]
    assert overrides.RUNS["Subtract"] == before + 2
    assert "Subtract" not in counting.launches  # the backend's own (counted) kernel did not run
    assert mx.kernel_provider("counting", "Subtract") == (
        "plugin 'counting-overrides' of distribution 'lazyx-countingbackend' 1.0.0")
    assert mx.kernel_provider("counting", "Add") == "backend 'counting'"
    assert mx.kernel_provider("cpu", "Subtract") == "backend 'cpu'"


def test_memory_figures_are_the_wrapped_backends(counting):
    assert counting.memory_stats() == backends()["cpu"].memory_stats()
    assert "wraps 'cpu'" in counting.describe()
