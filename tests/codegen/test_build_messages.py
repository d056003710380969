"""What a build tells the user: the ``lazyx`` logger and ``LAZYX_LOG``, the one line a
long build prints, the precompiled header built in the background, warnings that name
the user's line, and a compiler that fails reported as failing.

Every build here is a one-line source in a temporary cache folder (a fraction of a
second); the precompiled header is that of a one-include preamble."""

import inspect
import logging
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import lazyx.core as mx
from lazyx import log
from lazyx.codegen import jit

needs_compiler = pytest.mark.skipif(not jit.available(), reason="no C++ compiler")
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _source(tag: str) -> str:
    """A tiny source no other test builds (the memory cache would answer it)."""
    return f'extern "C" int lazyx_test_value() {{ return 7; }}  // {tag} {time.time_ns()}\n'


@pytest.fixture
def cold(monkeypatch, tmp_path):
    """An empty cache folder, and every build announced (no quiet period)."""
    monkeypatch.setenv("LAZYX_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(jit, "QUIET_S", 0.0)
    return tmp_path / "kernels"


@needs_compiler
def test_a_cold_build_logs_one_info_line_before_it_starts(cold, caplog):
    caplog.set_level(logging.DEBUG, logger="lazyx")
    lib = jit.build(_source("announce"))
    assert lib.lazyx_test_value() == 7
    records = [r for r in caplog.records if r.name == "lazyx"]
    info = [r for r in records if r.levelno == logging.INFO]
    assert len(info) == 1, [r.getMessage() for r in records]
    text = info[0].getMessage()
    assert text.startswith("compiling C++ kernels with ") and str(cold) in text
    # The details are DEBUG: the source built, and how long it took.
    debug = [r.getMessage() for r in records if r.levelno == logging.DEBUG]
    assert any(m.startswith("compiled ") and ".cpp in " in m for m in debug), debug


CHILD = textwrap.dedent("""
    import logging, sys
    {setup}
    from lazyx.codegen import jit
    jit.build('extern "C" int v() {{ return 1; }} // ' + sys.argv[1] + '\\n')
""")


@needs_compiler
@pytest.mark.parametrize("level, setup, shown", [
    (None, "", ["lazyx: compiling C++ kernels with "]),          # visible by default
    ("warning", "", []),                                          # silenced
    ("INFO", "", ["lazyx: compiling C++ kernels with "]),
    ("debug", "", ["lazyx: compiling C++ kernels with ", "lazyx: compiled "]),
    (None, "logging.basicConfig(level=logging.WARNING)", []),    # the application decides
    (None, "logging.basicConfig(level=logging.INFO)", ["INFO:lazyx:compiling C++ kernels"]),
])
def test_lazyx_log_sets_what_a_build_prints(tmp_path, level, setup, shown):
    env = dict(os.environ, LAZYX_CACHE_DIR=str(tmp_path / "kernels"))
    env.pop("LAZYX_LOG", None)
    if level is not None:
        env["LAZYX_LOG"] = level
    r = subprocess.run([sys.executable, "-c", CHILD.format(setup=setup), str(time.time_ns())],
                       env=env, cwd=TESTS, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "lazyx" in ln]
    assert len(lines) == len(shown), r.stderr
    for line, start in zip(lines, shown):
        assert line.startswith(start), r.stderr


def test_a_bad_lazyx_log_warns_at_the_import_naming_the_accepted_values(tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text("import sys\nimport lazyx\nprint('ran')\n")
    env = dict(os.environ, LAZYX_LOG="loud")
    r = subprocess.run([sys.executable, "-W", "always", str(script)], env=env, cwd=TESTS,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "ran\n", r.stderr
    assert f"{script}:2: RuntimeWarning: LAZYX_LOG='loud' is not accepted" in r.stderr
    assert "one of debug, info, warning" in r.stderr


def test_configure_sets_one_handler_and_its_level(monkeypatch):
    monkeypatch.setattr(log, "_handler", None)
    before = list(log.logger.handlers)
    level = log.logger.level
    try:
        log.configure("debug")
        log.configure("Warning")  # again: the same handler, another level
        added = [h for h in log.logger.handlers if h not in before]
        assert len(added) == 1 and added[0].level == logging.WARNING
        assert log.logger.level == logging.WARNING
        with pytest.warns(RuntimeWarning, match="one of debug, info, warning") as rec:
            log.configure("verbose")
        assert rec[0].filename == __file__
    finally:
        for h in log.logger.handlers:
            if h not in before:
                log.logger.removeHandler(h)
        log.logger.setLevel(level)


def test_the_missing_compiler_warning_names_the_users_line(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    monkeypatch.setattr(jit, "_warned", False)
    with pytest.warns(jit.MissingCompilerWarning) as rec:
        jit.warn_missing_compiler(); line = inspect.currentframe().f_lineno  # noqa: E702
    assert (rec[0].filename, rec[0].lineno) == (__file__, line)
    assert "found no C++ compiler" in str(rec[0].message)
    # Through compile: the warning comes from deep in the fusion pass, and names the call.
    monkeypatch.setattr(jit, "_warned", False)
    f = mx.compile(lambda x: mx.exp(x * 0.375) * 2 + x)
    x = np.linspace(-1, 1, 50, dtype=np.float32)
    with pytest.warns(jit.MissingCompilerWarning) as rec:
        y = f(mx.array(x)); line = inspect.currentframe().f_lineno  # noqa: E702
        got = np.array(y)
    assert (rec[0].filename, rec[0].lineno) == (__file__, line)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(got, np.exp(x64 * 0.375) * 2 + x64, rtol=1e-6, atol=1e-6)


def _fake_compiler(tmp_path, version_works: bool):
    fake = tmp_path / "fake-c++"
    version = "echo 'fake 1.0'; exit 0" if version_works else \
        "echo 'fake-c++: fatal error: cannot execute cc1plus: No such file' >&2; exit 4"
    fake.write_text("#!/bin/sh\n"
                    f"if [ \"$1\" = --version ]; then {version}; fi\n"
                    "echo \"fake-c++: error: unrecognized command-line option '-fbogus'\" >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    return str(fake)


def test_a_compiler_that_fails_its_version_check_is_reported_as_failing(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", _fake_compiler(tmp_path, version_works=False))
    assert not jit.available()
    msg = jit.missing_compiler_message()
    assert "found no C++ compiler" not in msg
    assert "compiler fails" in msg and "cannot execute cc1plus" in msg and "exit code 4" in msg
    assert "fake-c++ --version" in msg and "CXX" in msg


def test_a_compiler_that_fails_every_build_is_reported_as_failing(monkeypatch, tmp_path):
    monkeypatch.setenv("LAZYX_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setenv("CXX", _fake_compiler(tmp_path, version_works=True))
    assert jit.available()  # --version works: the failure shows at the first build
    with pytest.raises(jit.CompilerFailedError) as e:
        jit.build(_source("broken toolchain"))
    msg = str(e.value)
    assert "(fake 1.0) fails" in msg and "unrecognized command-line option '-fbogus'" in msg
    assert "bug in lazyx" not in msg
    # From then on there is no compiler: compiled functions run unfused, with one warning
    # that says why.
    assert not jit.available() and jit.missing_compiler_message() == msg
    monkeypatch.setattr(jit, "_warned", False)
    f = mx.compile(lambda x: mx.sin(x) * 3 - x)
    x = np.linspace(-2, 2, 40, dtype=np.float32)
    with pytest.warns(jit.MissingCompilerWarning, match="-fbogus"):
        got = np.array(f(mx.array(x)))
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(got, np.sin(x64) * 3 - x64, rtol=1e-6, atol=1e-6)


@needs_compiler
def test_the_precompiled_header_builds_in_the_background(cold, caplog):
    if not jit._is_gcc(jit.compiler()):
        pytest.skip("precompiled headers are GCC's")
    jit.shim()  # (a kernel's build also builds the call shim when missing: not counted here)
    caplog.set_level(logging.DEBUG, logger="lazyx")
    tag = time.time_ns()
    preamble = f"#include <cstdint>\n// test preamble {tag}\n" + jit.PREAMBLE_END

    def kernel(k):
        return preamble + f'extern "C" int64_t value() {{ return {k}; }}\n'

    headers = jit.stats["headers"]
    first = jit.build(kernel(1))  # does not wait for the header: compiles whole
    jit.wait_for_headers()
    assert jit.stats["headers"] == headers + 1
    assert len(list(cold.glob("lx_pre_*.h.gch"))) == 1
    second = jit.build(kernel(2))  # now with it
    assert (first.value(), second.value()) == (1, 2)
    built = [r.getMessage() for r in caplog.records
             if r.name == "lazyx" and r.getMessage().startswith("compiled ")]
    assert len(built) == 2
    assert built[0].endswith("(whole source)") and built[1].endswith("(with the precompiled header)")
    assert any(r.getMessage().startswith("building the C++ precompiled header in the background")
               for r in caplog.records if r.levelno == logging.INFO)
