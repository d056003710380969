"""Building kernels: the compiler search, the disk cache (reuse across processes, one
build under concurrency), a missing compiler and compiler errors."""

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

from lazyx.codegen import jit

pytestmark = pytest.mark.skipif(not jit.available(), reason="no C++ compiler")

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A child process: optionally waits for a start time, builds and runs a fused kernel
# (through compile, so the whole path is used), prints what happened as JSON.
CHILD = textwrap.dedent("""
    import json, sys, time, warnings
    import numpy as np
    start, salt = float(sys.argv[1]), float(sys.argv[2])
    import lazyx.core as mx
    from lazyx.codegen import jit
    from lazyx.transforms.fusion import Compiled
    warnings.simplefilter("always")
    f = mx.compile(lambda x: mx.exp(mx.multiply(x, salt)) + x)
    g = mx.compile(lambda x: mx.sin(x) * 2 + 1)
    x = mx.array(np.linspace(-1, 1, 1000, dtype=np.float32))
    while time.time() < start:
        time.sleep(0.005)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ys = [f(x), f(x), g(x), g(x)]
        mx.eval(ys)
    xd = np.array(x).astype(np.float64)
    ok = (np.allclose(np.array(ys[0]), np.exp(xd * np.float32(salt)) + xd, rtol=1e-5, atol=1e-6)
          and np.allclose(np.array(ys[2]), np.sin(xd) * 2 + 1, rtol=1e-5, atol=1e-6))
    fused = sum(isinstance(n.prim, Compiled) for fn in (f, g)
                for t in fn.cache.entries.values() for n in t.run_tape.nodes)
    print(json.dumps({"ok": bool(ok), "stats": jit.stats, "fused": fused,
                      "warnings": [(type(x.message).__name__, str(x.message)) for x in w]}))
""")


def _child(env_extra, start=0.0, salt=0.5):
    env = dict(os.environ)
    env.update(env_extra)
    return subprocess.Popen([sys.executable, "-c", CHILD, str(start), str(salt)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=TESTS)


def _result(proc):
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _libraries(names):
    return [n for n in names if n.endswith(".so")]


def _files(folder):
    return {p: os.stat(os.path.join(folder, p)).st_mtime_ns for p in sorted(os.listdir(folder))}


def test_a_second_process_loads_kernels_from_the_disk_cache(tmp_path):
    cache = str(tmp_path / "kernels")
    salt = time.time() % 1  # a kernel no other test builds
    first = _result(_child({"LAZYX_CACHE_DIR": cache}, salt=salt))
    assert first["ok"] and first["fused"] == 2
    assert first["stats"]["compiled"] >= 2 and first["stats"]["disk"] == 0
    files = _files(cache)
    libraries = _libraries(files)
    assert len(libraries) == first["stats"]["compiled"]
    # The sources are kept beside the libraries, under short names.
    assert all(p[:-3] + ".cpp" in files and len(p) == len("lx_") + 20 + 3 for p in libraries)
    second = _result(_child({"LAZYX_CACHE_DIR": cache}, salt=salt))
    assert second["ok"] and second["stats"]["compiled"] == 0
    assert second["stats"]["disk"] == first["stats"]["compiled"]
    assert _files(cache) == files


def test_two_processes_building_one_kernel_at_once_leave_one_complete_library(tmp_path):
    cache = str(tmp_path / "kernels")
    start = time.time() + 4.0  # both are imported and waiting by then
    procs = [_child({"LAZYX_CACHE_DIR": cache}, start=start, salt=0.25) for _ in range(2)]
    results = [_result(p) for p in procs]
    assert all(r["ok"] for r in results)
    # Each library was compiled once (the other process waited on its lock, then loaded
    # it), and the folder holds one library, source, sidecar and lock per kernel, no
    # temporary files. (tests/codegen/test_kernel_cache.py races more processes.)
    names = sorted(os.listdir(cache))
    assert not [n for n in names if n.startswith(".")], names
    libraries = _libraries(names)
    assert sum(r["stats"]["compiled"] for r in results) == len(libraries) >= 3, results
    assert all(r["stats"]["compiled"] + r["stats"]["disk"] == len(libraries) for r in results)
    kernels = [n for n in names if not n.startswith("lx_pre_")]  # not the shared preamble
    assert len(kernels) == 4 * len(libraries), names
    # A third process loads what they left.
    third = _result(_child({"LAZYX_CACHE_DIR": cache}, salt=0.25))
    assert third["ok"] and third["stats"]["compiled"] == 0


def test_without_a_compiler_functions_run_unfused_with_one_warning(tmp_path):
    env = {"LAZYX_CACHE_DIR": str(tmp_path / "kernels"), "CXX": str(tmp_path / "no-such-c++")}
    r = _result(_child(env))
    assert r["ok"] and r["fused"] == 0 and r["stats"]["compiled"] == 0
    assert len(r["warnings"]) == 1, r["warnings"]
    kind, text = r["warnings"][0]
    assert kind == "MissingCompilerWarning"
    assert "no-such-c++" in text and "install" in text and "CXX" in text


def test_the_compiler_comes_from_cxx(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", "g++")
    cc = jit.compiler()
    if cc is not None:
        assert os.path.basename(cc[0][0]) == "g++"
    monkeypatch.setenv("CXX", str(tmp_path / "missing"))
    assert jit.compiler() is None and not jit.available()
    assert "missing" in jit.missing_compiler_message()
    monkeypatch.delenv("CXX")
    assert jit.available()


def test_a_compiler_error_names_the_source_and_shows_the_first_errors():
    with pytest.raises(jit.KernelCompileError) as e:
        jit.build("int broken( {  // lazyx test: a compiler error\n")
    msg = str(e.value)
    path = next(w for w in msg.split() if w.endswith(".cpp"))
    assert os.path.exists(path) and os.path.basename(path).startswith("lx_")
    assert len(os.path.basename(path)) == len("lx_") + 20 + 4
    assert "error" in msg and "int broken" in msg
    assert msg.count("\n") < 25


def test_a_compiler_error_shows_only_its_first_lines(monkeypatch, tmp_path):
    fake = tmp_path / "fake-c++"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'fake 1.0'; exit 0; fi\n"
                    "echo 'note: starting' >&2\n"
                    "for i in $(seq 1 500); do echo \"kernel.cpp:$i: error: number $i\" >&2; done\n"
                    "exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    with pytest.raises(jit.KernelCompileError) as e:
        jit.build("int f() { return 1; }\n")
    msg = str(e.value)
    assert "fake 1.0" in msg and "error: number 1" in msg and "number 12" in msg
    assert "number 13" not in msg and "note: starting" not in msg


def test_the_vector_math_header_declares_only_what_libmvec_has():
    header = jit.vector_math_header()
    if header:
        assert "simd" in header and "expf" in header
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert jit.vector_math_header() is header  # computed once
