"""lazyx finds lazyx-axpby through its entry point alone, and says who provides what."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import lazyx.core as mx
from lazyx import registry
from lazyx.backend import kernel_provider

pytest.importorskip("lazyx_axpby", reason="lazyx-axpby is not installed: pip install ./extensions_example")
from lazyx_axpby import Axpby, axpby  # noqa: E402


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONWARNINGS="default"))


def test_lazyx_core_finds_axpby_without_importing_the_package():
    done = _run("""
        import sys
        import lazyx.core as mx
        from lazyx import registry
        out = mx.ext.axpby(mx.array([1.0, 2.0]), mx.array([[10.0], [20.0]]), 2.0, 0.5)
        assert out.tolist() == [[7.0, 9.0], [12.0, 14.0]], out.tolist()
        fn, info = registry.ops["ext.axpby"]
        assert info.distribution == "lazyx-axpby" and info.error is None
        # Only the entry point's module was imported, by lazyx itself.
        print(sorted(m for m in sys.modules if m.startswith("lazyx_axpby")))
        """)
    assert done.returncode == 0, done.stderr
    assert "lazyx-axpby" not in done.stderr, done.stderr  # no warning about the plugin
    assert "'lazyx_axpby.plugin'" in done.stdout


def test_importing_the_package_first_registers_it_once():
    done = _run("""
        import lazyx_axpby
        import lazyx.core as mx
        from lazyx import registry
        assert mx.ext.axpby is lazyx_axpby.axpby
        assert registry.plugins["axpby"].error is None
        assert registry.primitives[lazyx_axpby.Axpby].distribution == "lazyx-axpby"
        print(mx.ext.axpby(mx.array([1.0]), mx.array([2.0]), 1.0, 1.0).tolist())
        """)
    assert done.returncode == 0, done.stderr
    assert "lazyx-axpby" not in done.stderr, done.stderr
    assert done.stdout.strip() == "[3.0]"


def test_registration_is_recorded_with_the_distribution():
    info = registry.plugins["axpby"]
    assert info.distribution == "lazyx-axpby" and info.error is None
    assert info.primitives == [Axpby]
    assert info.ops == ["ext.axpby"] and mx.ext.axpby is axpby
    assert ("cpu-reference", "Axpby") in info.kernels


def test_who_runs_axpby_on_each_backend():
    # cpu: the primitive's own eval_cpu (the C++ kernel); cpu-reference: the plugin's NumPy kernel.
    assert kernel_provider("cpu", Axpby).startswith("Axpby.eval_cpu (plugin 'axpby' of distribution 'lazyx-axpby'")
    assert "lazyx-axpby" in kernel_provider("cpu-reference", Axpby)
    assert not kernel_provider("cpu-reference", Axpby).startswith("Axpby.eval_cpu")


def test_backends_agree(lazyx_backend):
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    got = np.array(mx.ext.axpby(mx.array(x), mx.array(x[0]), 0.25, -3.0))
    np.testing.assert_allclose(got, 0.25 * x - 3.0 * x[0], rtol=1e-6)
