"""The first compile on a fresh machine: what it waits for and what it says.

* ``jit.prepare()`` (run by the install, CMakeLists.txt) builds the precompiled header
  of the CPU kernels' preamble into the kernel cache under the key a kernel build looks
  for, so the first kernel compiles only its own part and nothing builds in the
  background;
* the compiler's identity in that key does not depend on the name it was called by
  (``c++`` or ``g++``), and does depend on the flags given in ``CXX``;
* the one line a build prints names the compiled function it builds for;
* the call shim builds beside the first kernel (both are needed by its first call).
"""

import logging
import os
import shutil
import time

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.codegen import jit

needs_gcc = pytest.mark.skipif(not jit.available() or not jit._is_gcc(jit.compiler()),
                               reason="needs GCC (precompiled headers are GCC's)")


@pytest.fixture
def cold(monkeypatch, tmp_path):
    """An empty cache folder, and every build announced (no quiet period)."""
    monkeypatch.setenv("LAZYX_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(jit, "QUIET_S", 0.0)
    return tmp_path / "kernels"


def _unique_function(tag):
    """A compiled function whose kernel no other test builds (a constant of its own)."""
    c = 1.0 + (time.time_ns() % 1000003) / 1e7

    def loss_fn(x):
        return mx.exp(x) * c + 1.0
    return loss_fn, c


@needs_gcc
def test_prepare_builds_the_header_the_first_kernel_uses(cold, caplog):
    headers = jit.stats["headers"]
    said = jit.prepare()
    assert said.startswith("precompiled header ready in ") and str(cold) in said
    assert jit.stats["headers"] == headers + 1
    assert len(list(cold.glob("lx_pre_*.h.gch"))) == 1
    assert jit.prepare().startswith("precompiled header ready")  # again: found, not rebuilt
    assert jit.stats["headers"] == headers + 1
    # A fresh process's view: forget what this one knows, then compile a function.
    jit._headers.clear()
    caplog.set_level(logging.DEBUG, logger="lazyx")
    loss_fn, c = _unique_function("prepared")
    x = np.linspace(-2, 2, 33).astype(np.float32)
    got = np.asarray(mx.compile(loss_fn)(mx.array(x)))
    np.testing.assert_allclose(got, np.exp(x.astype(np.float64)) * c + 1.0, rtol=1e-6)
    messages = [r.getMessage() for r in caplog.records if r.name == "lazyx"]
    kernels = [m for m in messages if m.startswith("compiled ") and "lx_pre_" not in m]
    assert any(m.endswith("(with the precompiled header)") for m in kernels), messages
    assert not any("precompiled header in the background" in m for m in messages), messages
    assert jit.stats["headers"] == headers + 1


def test_the_compiler_identity_names_the_program_and_the_cxx_flags(monkeypatch):
    if not jit.available():
        pytest.skip("no C++ compiler")
    path = jit.compiler()[0][0]
    line = f"{os.path.basename(path)} (Some Vendor 1.2) 1.2.3"
    real = os.path.basename(os.path.realpath(path))
    assert jit._identity(path, [os.path.basename(path)], line) == f"{real} (Some Vendor 1.2) 1.2.3"
    # Called by another name that is the same program: the same identity.
    assert jit._identity(path, ["cc-alias"], "cc-alias (Some Vendor 1.2) 1.2.3") == \
        f"{real} (Some Vendor 1.2) 1.2.3"
    # A first word that is not the name it was called by is kept.
    assert jit._identity(path, ["g++"], "wrapper (X) 1") == "wrapper (X) 1"
    # A version line that does not start with the name (clang's) is kept as it is.
    assert jit._identity(path, ["clang++"], "Ubuntu clang version 18") == "Ubuntu clang version 18"
    # Flags given in CXX build other kernels: they are part of the identity.
    assert jit._identity(path, ["g++", "-DLAZYX_SOFT_HALF"], "g++ (X) 1") == \
        f"{os.path.basename(os.path.realpath(path))} (X) 1 -DLAZYX_SOFT_HALF"
    for name in ("c++", "g++"):
        if shutil.which(name) is None:
            pytest.skip(f"no {name}")
    same = os.path.realpath(shutil.which("c++")) == os.path.realpath(shutil.which("g++"))
    ids = []
    for name in ("c++", "g++"):
        monkeypatch.setenv("CXX", name)
        ids.append(jit.compiler()[1])
    assert (ids[0] == ids[1]) == same, ids
    monkeypatch.setenv("CXX", "g++ -DLAZYX_TEST_FLAG")
    assert jit.compiler()[1] == ids[1] + " -DLAZYX_TEST_FLAG"


@pytest.mark.skipif(not jit.available(), reason="no C++ compiler")
def test_the_build_line_names_the_compiled_function(cold, caplog, capsys):
    caplog.set_level(logging.INFO, logger="lazyx")
    loss_fn, c = _unique_function("named")
    x = np.arange(5, dtype=np.float32)
    got = np.asarray(mx.compile(loss_fn)(mx.array(x)))
    np.testing.assert_allclose(got, np.exp(x.astype(np.float64)) * c + 1.0, rtol=1e-6)
    lines = [r.getMessage() for r in caplog.records
             if r.name == "lazyx" and r.levelno == logging.INFO
             and r.getMessage().startswith("compiling ")]
    assert len(lines) == 1, lines
    assert lines[0].startswith("compiling C++ kernels for compile("), lines
    assert "loss_fn)" in lines[0] and str(cold) in lines[0]


def test_building_for_labels_only_its_block():
    assert getattr(jit._building_for, "label", None) is None
    with jit.building_for("compile(f)"):
        assert jit._building_for.label == "compile(f)"
        with jit.building_for("compile(g)"):
            assert jit._building_for.label == "compile(g)"
        assert jit._building_for.label == "compile(f)"
    assert jit._building_for.label is None
