"""The Mac user's checks of the Metal backend (issue 20, item 5), run on Linux.

``python -m lazyx.backends.metal.selftest --emulate`` runs every kernel kind through
lazyx's C++ shim against the CPU backend; here its ``--quick`` list passes and its
table names the three paths, a kernel broken on purpose (its outputs corrupted after
the launch, or a case whose reference is not what the GPU computes, both through the
``cases`` hook) fails it with status 1, and without Metal and without ``--emulate`` it
exits 2 saying why. ``benchmarks/metal.py`` on a machine without Metal says so and
exits 0 without timing.
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.backends import metal
from lazyx.backends.metal import selftest
from lazyx.codegen import jit

ROOT = Path(__file__).resolve().parents[2]
needs_compiler = pytest.mark.skipif(not jit.available(), reason="no C++ compiler for the MSL shim")
not_a_mac = pytest.mark.skipif(sys.platform == "darwin", reason="Metal may be available on a Mac")


@needs_compiler
def test_quick_emulated_selftest_passes_and_names_every_path(capsys):
    was = metal.runtime.emulating()
    assert selftest.main(["--emulate", "--quick"]) == 0
    out = capsys.readouterr().out
    assert metal.runtime.emulating() == was  # the emulation is put back
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("kernel"))
    table = lines[header + 2:lines.index("", header)]
    assert table and all(line.endswith(" pass") for line in table), out
    paths = {p: [line for line in table if f" {p} " in line]
             for p in (selftest.GENERATED, selftest.BUILTIN, selftest.FALLBACK)}
    assert all(paths.values()), out
    # each kind is on the path it should be
    assert any(line.startswith("exp ") for line in paths[selftest.GENERATED])
    assert any(line.startswith("compile: gelu") for line in paths[selftest.GENERATED])
    assert any(line.startswith("softmax ") for line in paths[selftest.BUILTIN])
    assert any(line.startswith("argmax ") for line in paths[selftest.BUILTIN])
    assert any(line.startswith("matmul ") for line in paths[selftest.BUILTIN])
    assert any(line.startswith("linalg.inv ") for line in paths[selftest.FALLBACK])
    dtypes = {"float32", "float16", "bfloat16", "int32", "bool"}
    assert dtypes == {cell for line in table for cell in line.split() if cell in dtypes}
    assert "0 failed" in out and "not the GPU" in out


@needs_compiler
def test_a_kernel_broken_on_purpose_fails_with_status_1(capsys, monkeypatch):
    from lazyx.backends.metal import compiled

    launch = compiled.ShimRunner.launch

    def broken(self, kernel, name, grid, args):
        # the generated kernel runs, then its first output is off by one
        launch(self, kernel, name, grid, args)
        out = args[len(kernel.program.inputs)]
        out[...] = out + np.ones((), out.dtype)
    monkeypatch.setattr(compiled.ShimRunner, "launch", broken)
    cases = [selftest.Case("exp", lambda x: mx.exp(x), ("float32",), ((5, 7),), selftest.GENERATED),
             selftest.Case("sum axis=1", lambda x: mx.sum(x, axis=1), ("float32",), ((5, 7),),
                           selftest.BUILTIN)]
    assert selftest.main(["--emulate"], cases=cases) == 1
    out = capsys.readouterr().out
    exp = next(line for line in out.splitlines() if line.startswith("exp "))
    assert "FAIL (output 0 differs at" in exp and "generated" in exp
    total = next(line for line in out.splitlines() if line.startswith("sum "))
    assert total.endswith(" pass")  # the built-in kernel is not touched
    assert "1 passed, 1 failed" in out


@needs_compiler
def test_wrong_results_wrong_paths_and_errors_fail_the_case(capsys):
    cases = [
        # an error on the GPU (float64: Metal has no double) is a failed row; the rest run
        selftest.Case("float64 on the GPU", lambda x: mx.exp(x.astype(mx.float64)), ("float32",),
                      ((4,),), selftest.GENERATED),
        # the GPU computes exp, the reference expm1: every element differs by 1
        selftest.Case("exp vs expm1", lambda x: mx.exp(x), ("float16",), ((4,),),
                      selftest.GENERATED, reference=lambda x: mx.expm1(x)),
        # a matmul in a case that expects a generated kernel: the path is checked
        selftest.Case("matmul as generated", lambda a, b: a @ b, ("float32",), ((2, 3), (3, 2)),
                      selftest.GENERATED),
    ]
    assert selftest.main(["--emulate"], cases=cases) == 1
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines()
            if line.startswith(("float64 on", "exp vs", "matmul as"))]
    assert len(rows) == 3, out
    assert "FAIL (DtypeError: " in rows[0] and "float64" in rows[0]
    assert "FAIL (output 0 differs" in rows[1]
    assert "FAIL (ran built-in, expected generated)" in rows[2]
    assert "0 passed, 3 failed" in out


@needs_compiler
def test_the_cpu_refusing_a_dtype_skips_the_row(capsys):
    # bitwise_and has no float version: the CPU refuses it, so there is nothing to compare
    cases = [selftest.Case("bitwise_and", lambda a, b: mx.bitwise_and(a, b), ("float32",),
                           ((3,), (3,)), selftest.GENERATED)]
    assert selftest.main(["--emulate"], cases=cases) == 0
    out = capsys.readouterr().out
    assert "skipped (the CPU backend refuses it: DtypeError" in out and "1 skipped" in out


@not_a_mac
def test_without_metal_or_emulate_it_exits_2_with_the_reason():
    run = subprocess.run([sys.executable, "-m", "lazyx.backends.metal.selftest", "--quick"],
                         capture_output=True, text=True, check=False, timeout=120, cwd=ROOT)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "not run" in run.stderr and "Metal needs macOS" in run.stderr
    assert "--emulate" in run.stderr


def test_without_a_compiler_emulation_exits_2(monkeypatch, capsys):
    if metal.runtime.emulating():
        pytest.skip("another test left the emulation on")
    monkeypatch.setattr(jit, "available", lambda: False)
    assert selftest.main(["--emulate", "--quick"]) == 2
    assert "C++ compiler" in capsys.readouterr().err
    assert not metal.runtime.emulating()


def test_every_case_is_well_formed():
    kinds = {c.path for c in selftest.CASES}
    assert kinds == {selftest.GENERATED, selftest.BUILTIN, selftest.FALLBACK}
    assert any(c.compiled for c in selftest.CASES)
    names = [(c.kernel, c.shapes) for c in selftest.CASES]
    assert len(names) == len(set(names))  # no case twice
    for c in selftest.CASES:
        assert c.dtypes and all(hasattr(mx, "bool_" if d == "bool" else d) for d in c.dtypes), c
        assert callable(c.fn) and len(c.domain) == 2 and c.domain[0] < c.domain[1], c
    quick = {c.path for c in selftest.CASES if c.quick}
    assert quick == kinds


@not_a_mac
def test_the_benchmark_says_metal_is_unavailable_and_exits_0():
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "metal.py")],
                         capture_output=True, text=True, check=False, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "nothing timed" in run.stdout and "Metal needs macOS" in run.stdout
    assert "µs" not in run.stdout  # no timings


@needs_compiler
def test_the_benchmark_runs_end_to_end_emulated_and_says_it_is_no_speed_figure():
    pytest.importorskip("mlx.core", reason="the benchmark's peer column is MLX")
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "metal.py"), "--emulate"],
                         capture_output=True, text=True, check=False, timeout=180, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "NOT A SPEED FIGURE" in run.stdout
    rows = [line for line in run.stdout.splitlines() if " | " in line and "µs" in line]
    assert len(rows) == 6 and not any("failed" in line for line in rows), run.stdout
