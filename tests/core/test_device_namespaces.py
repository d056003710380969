"""``lazyx.core.metal`` and ``lazyx.core.cuda``: MLX's device namespaces, installed by the
metal and cuda backend plugins through their own ``lazyx_ops`` hooks, answering for
this machine (what the backends themselves say), compared with MLX where installed."""

import warnings

import pytest

import lazyx.core as mx
from lazyx import registry
from lazyx.backends import cuda as cuda_backend
from lazyx.backends import metal as metal_backend

METAL = ["is_available", "device_info", "get_active_memory", "get_cache_memory",
         "get_peak_memory", "reset_peak_memory", "clear_cache", "set_cache_limit",
         "set_memory_limit", "set_wired_limit", "start_capture", "stop_capture"]


def test_the_backends_own_the_namespaces():
    for name in METAL:
        assert registry.ops[f"metal.{name}"][1].name == "metal"
    assert registry.ops["cuda.is_available"][1].name == "cuda"
    assert {n for n in dir(mx.metal) if not n.startswith("_")} == set(METAL)
    assert {n for n in dir(mx.cuda) if not n.startswith("_")} == {"is_available"}


def test_availability_is_the_backends_answer():
    assert mx.metal.is_available() is metal_backend.MetalBackend().is_available()
    assert mx.cuda.is_available() is cuda_backend.CudaBackend().is_available()
    # On a machine without either, the GPU is not available as a device either.
    if not (mx.metal.is_available() or mx.cuda.is_available()):
        assert mx.device_count(mx.gpu) == 0
        assert mx.device_info(mx.gpu) == {}


def test_memory_aliases_warn_and_forward():
    with pytest.warns(DeprecationWarning, match="lazyx.core.get_peak_memory"):
        assert mx.metal.get_peak_memory() == mx.get_peak_memory()
    with pytest.warns(DeprecationWarning):
        assert mx.metal.get_active_memory() == mx.get_active_memory()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = mx.metal.set_cache_limit(1 << 20)
        assert mx.set_cache_limit(old) == 1 << 20
        assert mx.metal.set_wired_limit(0) == 0
        mx.metal.reset_peak_memory()
        mx.metal.clear_cache()
        if not mx.metal.is_available():
            assert mx.metal.device_info() == {}


def test_capture_without_metal_does_nothing():
    if mx.metal.is_available():
        pytest.skip("Metal is available here")
    mx.metal.start_capture("/nonexistent/trace.gputrace")
    mx.metal.stop_capture()
    with pytest.raises(TypeError, match="path"):
        mx.metal.start_capture(3)


def test_same_answers_as_mlx():
    mlx = pytest.importorskip("mlx.core")
    assert mx.metal.is_available() == mlx.metal.is_available()
    assert mx.cuda.is_available() == mlx.cuda.is_available()
    assert {n for n in dir(mlx.metal) if not n.startswith("_")} == set(METAL)
