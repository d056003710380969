import os
import subprocess
import sys

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.backend import active_backend, kernel_provider
from lazyx.errors import BackendError
from lazyx.plugins.elementwise import Add


def test_cpu_is_the_default_and_reference_can_be_swapped_in():
    assert active_backend(mx.cpu).name == "cpu"
    x = mx.array(np.linspace(-3, 3, 50, dtype=np.float32))
    with mx.use_backend("cpu", "cpu-reference") as b:
        assert b.name == "cpu-reference" and active_backend(mx.cpu) is b
        ref = np.array(mx.exp(x) * 2 + x)
    assert active_backend(mx.cpu).name == "cpu"
    np.testing.assert_allclose(np.array(mx.exp(x) * 2 + x), ref, rtol=1e-6)


def test_use_backend_as_a_call_stays():
    mx.use_backend(mx.cpu, "cpu-reference")
    try:
        assert active_backend(mx.cpu).name == "cpu-reference"
    finally:
        mx.use_backend(mx.cpu, "cpu")
    assert active_backend(mx.cpu).name == "cpu"


def test_context_restores_after_an_exception():
    with pytest.raises(RuntimeError):
        with mx.use_backend("cpu", "cpu-reference"):
            raise RuntimeError("boom")
    assert active_backend(mx.cpu).name == "cpu"


def test_bad_backend_names():
    with pytest.raises(BackendError, match="Unknown backend 'nope'.*cpu-reference"):
        mx.use_backend("cpu", "nope")
    with pytest.raises(BackendError, match="runs device type gpu"):
        mx.use_backend("cpu", "metal")
    with pytest.raises(BackendError, match="Unknown device type"):
        mx.use_backend("tpu", "cpu")
    if not mx.is_available(mx.gpu):
        with pytest.raises(BackendError, match="not available"):
            mx.use_backend("gpu", "metal")
    assert active_backend(mx.cpu).name == "cpu"


def test_environment_variable_chooses_the_backend():
    code = "import lazyx.core as mx; from lazyx.backend import active_backend; print(active_backend(mx.cpu).name)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, LAZYX_CPU_BACKEND="cpu-reference"))
    assert r.stdout.strip() == "cpu-reference", r.stderr


def test_kernel_provider_says_who_serves_a_primitive():
    assert kernel_provider("cpu-reference", Add) == "backend 'cpu-reference'"
    # Metal generates element-wise kernels (Add), has built-in reductions and matmuls, and
    # runs primitives it has no kernel for (Inverse) through an explicit CPU fallback.
    assert kernel_provider("metal", Add) == "backend 'metal'"
    assert kernel_provider("metal", "Reduce") == "backend 'metal'"
    assert kernel_provider("metal", "Matmul") == "backend 'metal'"
    assert kernel_provider("metal", "Inverse").startswith("CPU fallback")


def test_metal_reports_why_it_is_unavailable():
    from lazyx.backend import backends
    m = backends()["metal"]
    if sys.platform != "darwin":
        assert not m.is_available() and "macOS" in m.unavailable_reason()
