"""Where a test runs: ``running_on``, ``available_backends`` and ``isolated_registry``."""

import sys
import warnings

import numpy as np
import pytest

import lazyx.core as mx
from lazyx import hookimpl, registry
from lazyx.backend import Backend, active_backend, backends, kernel_provider
from lazyx.device import DeviceType
from lazyx.errors import BackendError
from lazyx.plugins.elementwise import Add
from lazyx.testing import available_backends, isolated_registry, running_on


def test_available_backends():
    names = available_backends()
    assert names[:2] == ["cpu", "cpu-reference"] and "counting" in names
    assert all(backends()[n].is_available() for n in names)
    if sys.platform != "darwin":
        assert "metal" not in names


def test_running_on_makes_the_backend_active_and_its_device_the_default():
    with running_on("cpu-reference") as b:
        assert b.name == "cpu-reference" and active_backend(mx.cpu) is b
        assert mx.default_device() == mx.cpu
        assert (mx.array([1.0]) + 1).tolist() == [2.0]
    assert active_backend(mx.cpu).name == "cpu"
    with running_on(backends()["counting"]) as b:
        assert active_backend(mx.cpu) is b
    with pytest.raises(BackendError, match="Unknown backend 'nope'"):
        with running_on("nope"):
            pass
    if not mx.is_available(mx.gpu):
        with pytest.raises(BackendError, match="not available"):
            with running_on("metal"):
                pass
    assert active_backend(mx.cpu).name == "cpu" and mx.default_device() == mx.cpu


class _Everything:
    """A plugin that registers a bit of everything."""

    class _Twice(Backend):
        name = "twice"
        device_type = DeviceType.cpu

    @hookimpl
    def lazyx_backends(self):
        return [self._Twice()]

    @hookimpl
    def lazyx_kernels(self):
        return [("cpu", Add, lambda prim, ins: np.add(ins[0], ins[1]) * 2)]

    @hookimpl
    def lazyx_ops(self):
        return {"isolated_op": lambda x: x, "isolated.op": lambda x: x,
                "array.isolated_method": lambda self: 42, "add": lambda a, b: None}


def test_isolated_registry_takes_everything_away():
    before = dict(registry.plugins), len(registry.plugin_manager.get_plugins())
    with isolated_registry():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the claim on the built-in "add" is refused
            registry.register_plugin(_Everything(), "everything", "lazyx-everything", "1")
        assert (mx.array([1.0]) + mx.array([2.0])).tolist() == [6.0]  # the override
        assert kernel_provider("cpu", Add).startswith("plugin 'everything'")
        assert mx.isolated_op(3) == 3 and mx.isolated.op(4) == 4
        assert mx.array([1]).isolated_method() == 42
        with mx.use_backend("cpu", "twice"):
            pass
        assert registry.ops["add"][1].distribution == "lazyx" and mx.add is registry.ops["add"][0]
        assert [c for c, _ in registry.plugins["everything"].refused] == ["add"]
    assert dict(registry.plugins) == before[0]
    assert len(registry.plugin_manager.get_plugins()) == before[1]
    assert (mx.array([1.0]) + mx.array([2.0])).tolist() == [3.0]
    assert mx.add(1, 2).item() == 3
    assert kernel_provider("cpu", Add) == "backend 'cpu'"
    for name in ("isolated_op", "isolated"):
        with pytest.raises(AttributeError):
            getattr(mx, name)
    assert "lazyx.core.isolated" not in sys.modules
    assert not hasattr(mx.array, "isolated_method")
    with pytest.raises(BackendError, match="Unknown backend 'twice'"):
        mx.use_backend("cpu", "twice")


def test_isolated_registry_restores_the_active_backends():
    with isolated_registry():
        mx.use_backend("cpu", "cpu-reference")
    assert active_backend(mx.cpu).name == "cpu"
