"""Kernels for existing primitives from plugins (the ``lazyx_kernels`` hook).

Precedence, for a primitive class on a backend: a plugin's override, then the
backend's own kernel (``find_kernel``: its table, by class or base class), then
the primitive's ``eval_cpu``/``eval_gpu``, then a ``KernelNotFoundError``. Two
overrides of one (backend, class) are an error naming both plugins.
"""

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import lazyx.core as mx
from lazyx import hookimpl, registry
from lazyx.array import lazy
from lazyx.backend import Backend, kernel_provider
from lazyx.device import DeviceType, to_stream
from lazyx.errors import BackendError, KernelNotFoundError
from lazyx.plugins.elementwise import Add
from lazyx.primitive import Primitive
from lazyx.testing import isolated_registry


class _Halve(Primitive):
    __slots__ = ()

    def output_shapes(self, inputs):
        return [inputs[0].shape]

    def eval_cpu(self, inputs):
        return inputs[0] / 2


class _Base(Primitive):
    __slots__ = ()


class _Derived(_Base):
    __slots__ = ()

    def output_shapes(self, inputs):
        return [inputs[0].shape]


def _node(cls, x):
    return lazy(x.shape, x.dtype, cls(to_stream(None)), (x,))


class _Layered(Backend):
    """A backend whose own table has _Halve (and _Base, for its subclasses)."""

    name = "layered"
    device_type = DeviceType.cpu

    def __init__(self):
        super().__init__()
        self.kernels = {_Halve: lambda p, ins: ins[0] / 4, _Base: lambda p, ins: ins[0] * 10}


class _BackendPlugin:
    @hookimpl
    def lazyx_backends(self):
        return [_Layered()]


class _Override:
    def __init__(self, backend, cls, fn):
        self.triple = (backend, cls, fn)

    @hookimpl
    def lazyx_kernels(self):
        return [self.triple]


def _value(cls, backend):
    with mx.use_backend("cpu", backend):
        return _node(cls, mx.array([8.0])).item()


def test_the_precedence_rule():
    with isolated_registry():
        registry.register_plugin(_BackendPlugin(), "layered", "lazyx-layered", "1")
        # 3. the primitive's own eval_cpu, where the backend has nothing
        assert _value(_Halve, "cpu") == 4.0
        assert kernel_provider("cpu", _Halve) == "_Halve.eval_cpu"
        # 2. the backend's own kernel wins over eval_cpu; a base class's entry serves subclasses
        assert _value(_Halve, "layered") == 2.0 and _value(_Derived, "layered") == 80.0
        assert kernel_provider("layered", _Halve) == "backend 'layered'"
        # 1. a plugin's override wins over both (for that exact class and backend)
        registry.register_plugin(_Override("layered", _Halve, lambda p, ins: ins[0] * 0),
                                 "zeroing", "lazyx-zeroing", "2.0")
        assert _value(_Halve, "layered") == 0.0 and _value(_Halve, "cpu") == 4.0
        assert kernel_provider("layered", _Halve) == (
            "plugin 'zeroing' of distribution 'lazyx-zeroing' 2.0")
        # 4. nothing at all: an error naming the primitive, the device and the backend
        with pytest.raises(KernelNotFoundError, match=r"_Derived has no kernel for device cpu "
                                                      r"on backend 'cpu'"):
            _value(_Derived, "cpu")
        assert kernel_provider("cpu", _Derived) == "missing"
    assert kernel_provider("cpu", _Halve) == "_Halve.eval_cpu"
    with pytest.raises(BackendError):
        kernel_provider("layered", _Halve)


def test_overriding_add_on_cpu_in_process():
    calls = []

    def add(prim, inputs):
        calls.append(len(inputs))
        return np.add(*inputs)

    x = mx.array([1.0, 2.0])
    with isolated_registry():
        registry.register_plugin(_Override("cpu", Add, add), "fast-add", "lazyx-fast-add", "0.2")
        assert (x + x).tolist() == [2.0, 4.0] and calls == [2]
        assert mx.kernel_provider("cpu", "Add") == (
            "plugin 'fast-add' of distribution 'lazyx-fast-add' 0.2")
        with mx.use_backend("cpu", "cpu-reference"):
            assert (x + 1.0).tolist() == [2.0, 3.0] and calls == [2]  # other backends unchanged
        from lazyx import cli
        import io
        out = io.StringIO()
        cli.info(out)
        assert "Add on cpu: plugin 'fast-add' of distribution 'lazyx-fast-add' 0.2" in out.getvalue()
        assert "kernel override: Add on cpu" in out.getvalue()
    assert (x + x).tolist() == [2.0, 4.0] and calls == [2]
    assert mx.kernel_provider("cpu", Add) == "backend 'cpu'"


def test_two_overrides_of_one_kernel_are_an_error_naming_both():
    x = mx.array([1.0])
    with isolated_registry():
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            registry.register_plugin(_Override("cpu", Add, lambda p, i: np.add(*i)), "one",
                                     "lazyx-one", "1")
            registry.register_plugin(_Override("cpu", Add, lambda p, i: np.add(*i)), "two",
                                     "lazyx-two", "1")
        assert any("lazyx-one" in str(m.message) and "lazyx-two" in str(m.message) for m in w)
        good = mx.exp(x)
        with pytest.raises(KernelNotFoundError, match="Add on backend 'cpu' is overridden by both "
                                                      "plugin 'one'.*and plugin 'two'"):
            (x + x).tolist()
        assert mx.kernel_provider("cpu", Add) == "conflict"
        assert good.item() == pytest.approx(np.e)
    assert (x + x).tolist() == [2.0]


def test_kernel_provider_arguments():
    assert mx.kernel_provider("cpu", Add) == mx.kernel_provider("cpu", "Add") == \
        mx.kernel_provider("cpu", (mx.array(1) + 1)._prim) == "backend 'cpu'"
    with pytest.raises(BackendError, match="No registered primitive is named 'Nope'"):
        mx.kernel_provider("cpu", "Nope")
    with pytest.raises(BackendError, match="Expected a Primitive class"):
        mx.kernel_provider("cpu", 3)
    with pytest.raises(BackendError, match="Unknown backend"):
        mx.kernel_provider("nope", Add)


def test_an_installed_plugin_overrides_add_on_cpu(tmp_path):
    """A real distribution (a dist-info with its entry point) on the path of a fresh
    interpreter: its override is found, used, and reported by lazyx info."""
    (tmp_path / "add_logger.py").write_text(textwrap.dedent("""
        import numpy as np
        from lazyx import hookimpl
        from lazyx.plugins.elementwise import Add

        CALLS = []

        def add(prim, inputs):
            CALLS.append(prim.name)
            return np.add(*inputs)

        @hookimpl
        def lazyx_kernels():
            return [("cpu", Add, add)]
    """))
    dist = tmp_path / "lazyx_add_logger-3.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lazyx-add-logger\nVersion: 3.1\n")
    (dist / "entry_points.txt").write_text("[lazyx]\nadd-logger = add_logger\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = textwrap.dedent("""
        import lazyx.core as mx
        import add_logger
        x = mx.array([1.0, 2.0])
        print("SUM", (x + x).tolist(), (x * x).tolist(), add_logger.CALLS)
        print("PROVIDER", mx.kernel_provider("cpu", "Add"))
        from lazyx import cli
        cli.info()
    """)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "SUM [2.0, 4.0] [1.0, 4.0] ['Add']" in r.stdout
    assert "PROVIDER plugin 'add-logger' of distribution 'lazyx-add-logger' 3.1" in r.stdout
    assert "Add on cpu: plugin 'add-logger' of distribution 'lazyx-add-logger' 3.1" in r.stdout


def test_a_missing_kernel_names_the_primitives_plugin():
    class Pack:
        @hookimpl
        def lazyx_primitives(self):
            return [_Derived]

    with isolated_registry():
        registry.register_plugin(Pack(), "no-kernels", "lazyx-no-kernels", "0.9")
        kept = mx.exp(mx.array([0.0]))
        with pytest.raises(KernelNotFoundError, match=r"_Derived \(from plugin 'no-kernels' of "
                                                      r"distribution 'lazyx-no-kernels' 0.9\) has "
                                                      r"no kernel for device cpu on backend 'cpu'"):
            mx.eval(_node(_Derived, mx.array([1.0])), kept)
        assert kept.tolist() == [1.0]
