"""A wheel built for other machines installs and runs where there is no C++ compiler.

The flow (docs/building.md, "Building a wheel"):

1. ``pip wheel .`` (the default, ``LAZYX_NATIVE_ARCH=OFF``, said explicitly; without build isolation: the
   build tools of this environment, no download), in a build folder of its own under
   ``build/`` so that a second run only relinks and the editable install's folder is
   left alone;
2. the wheel is installed into a fresh virtual environment (unpacked into its
   ``site-packages``, as pip does for a wheel of this kind), which sees lazyx's four
   run-time dependencies and nothing else of this environment (no editable lazyx);
3. a small program runs there with ``PATH`` holding no compiler and ``CXX`` unset: the
   native module loads and is portable (no ``-march=native``: the x86-64-v3 module on a
   CPU that has those instructions, else its baseline twin, which holds no AVX
   instruction and is checked by running it as such a CPU would), a compiled function
   gives NumPy's float64 answer, and the missing compiler is one warning naming the
   program's line.

The first run builds both native modules (~60 s on 2 cores); later runs reuse the
build folder. It is skipped where a wheel cannot be built here (no CMake, compiler,
scikit-build-core or nanobind).
"""

import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "test-portable-wheel"
#: lazyx's run-time dependencies (pyproject.toml) that the program below imports, with
#: the folders of the libraries their wheels bundle.
DEPENDENCIES = ("numpy", "numpy.libs", "ml_dtypes", "pluggy", "filelock", "scipy", "scipy.libs",
                "threadpoolctl", "opt_einsum")


def _missing_tools() -> str | None:
    for module in ("pip", "scikit_build_core", "nanobind"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed"
    for tool in ("cmake",):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH"
    if not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        return "no C++ compiler to build the wheel with"
    return None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    why = _missing_tools()
    if why:
        pytest.skip(f"cannot build a wheel here: {why}")
    import filelock
    out = tmp_path_factory.mktemp("wheels")
    BUILD.parent.mkdir(exist_ok=True)
    with filelock.FileLock(str(BUILD) + ".lock"):  # (two sessions at once share the folder)
        r = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
             "-w", str(out), "-C", "cmake.define.LAZYX_NATIVE_ARCH=OFF",
             "-C", f"build-dir={BUILD}"],
            capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (found,) = out.glob("lazyx-*.whl")
    return found


def _site_packages_of(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    return Path(spec.origin).parent.parent


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed and the dependencies linked."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True,
                   timeout=120)
    (site,) = root.glob("lib/python*/site-packages")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    for so in site.rglob("*.so"):
        so.chmod(0o755)
    deps = root / "deps"
    deps.mkdir()
    for name in DEPENDENCIES:
        if name.endswith(".libs"):
            src = _site_packages_of(name[:-len(".libs")]) / name
        else:
            spec = importlib.util.find_spec(name)
            origin = Path(spec.origin)
            src = origin.parent if origin.name == "__init__.py" else origin
        if src.exists():
            (deps / src.name).symlink_to(src, target_is_directory=src.is_dir())
    (site / "lazyx-test-dependencies.pth").write_text(f"{deps}\n")
    return root


PROGRAM = textwrap.dedent("""\
    import json, warnings
    import numpy as np
    warnings.simplefilter("always")
    import lazyx, lazyx.core as mx
    from lazyx.backends.cpu import native_kernels
    from lazyx.codegen import jit

    def loss_fn(x, y):
        return mx.sum(mx.exp(x) * 2 + y * y)

    f = mx.compile(loss_fn)
    x = np.linspace(-1, 1, 1000, dtype=np.float32)
    y = np.arange(1000, dtype=np.float32) / 1000
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        values = [f(mx.array(x), mx.array(y)).item() for _ in range(3)]
    native = native_kernels.load()
    print(json.dumps({
        "lazyx": lazyx.__file__, "native": native.__file__ if native else None,
        "load_error": native_kernels.load_error,
        "build_info": native.build_info() if native else None,
        "compiler": jit.compiler(), "values": values,
        "warnings": [(w.category.__name__, str(w.message), w.lineno) for w in got]}))
""")


def test_a_portable_wheel_runs_without_a_compiler(venv, tmp_path):
    import json

    import numpy as np
    from lazyx.errors import MissingCompilerWarning

    no_tools = tmp_path / "bin"  # a PATH with no compiler on it
    no_tools.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("CXX", "PYTHONPATH", "PYTHONHOME", "LAZYX_CACHE_DIR")}
    env.update(PATH=str(no_tools), LAZYX_CACHE_DIR=str(tmp_path / "cache"))
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    r = subprocess.run([str(venv / "bin" / "python"), "-s", str(script)], env=env,
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # The installed copy ran, not this checkout's editable one, and its native module
    # loaded: the x86-64-v3 one on a CPU that has those instructions, else its baseline twin.
    from lazyx.backends.cpu import native_kernels
    assert out["lazyx"].startswith(str(venv)), out
    assert out["native"] and out["native"].startswith(str(venv)), out["load_error"]
    assert out["build_info"]["march_native"] is False
    if platform.machine() in ("x86_64", "AMD64"):
        v3 = native_kernels.has_x86_64_v3()
        assert out["build_info"]["arch"] == ("x86-64-v3" if v3 else "baseline"), out
        assert ("avx2" in out["build_info"]["isa"]) == v3
    assert out["compiler"] is None
    x = np.linspace(-1, 1, 1000, dtype=np.float32).astype(np.float64)
    y = np.arange(1000, dtype=np.float32).astype(np.float64) / 1000
    expected = np.sum(np.exp(x) * 2 + y * y)
    np.testing.assert_allclose(out["values"], [expected] * 3, rtol=1e-5)
    # One warning, naming the program's line (the first call of f), over three calls.
    warned = [w for w in out["warnings"] if w[0] == MissingCompilerWarning.__name__]
    assert len(warned) == 1, out["warnings"]
    call_line = next(i for i, ln in enumerate(PROGRAM.splitlines(), 1) if "values = [f(" in ln)
    assert "found no C++ compiler" in warned[0][1] and warned[0][2] == call_line, warned


def test_the_baseline_module_holds_no_avx_instruction_and_runs(venv, tmp_path):
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 only")
    # A CPU without x86-64-v3 gets the baseline twin, which never touches a wider register.
    (module,) = venv.glob("lib/python*/site-packages/lazyx/backends/cpu/_native_base*.so")
    objdump = shutil.which("objdump")
    if objdump is not None and sys.platform.startswith("linux"):
        text = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(module)],
                              capture_output=True, text=True, timeout=300).stdout
        assert text.count("\n") > 1000  # it did disassemble
        wide = [ln for ln in text.splitlines() if "%ymm" in ln or "%zmm" in ln]
        assert not wide, wide[:5]
    # As such a CPU would see it (the feature check answering no), it loads and computes.
    program = ("import numpy as np\n"
               "from lazyx.backends.cpu import native_kernels as nk\n"
               "nk.has_x86_64_v3 = lambda: False\n"
               "import lazyx.core as mx\n"
               "x = np.linspace(-3, 3, 600, dtype=np.float32).reshape(2, 300)\n"
               "s = np.asarray(mx.softmax(mx.array(x), axis=-1))\n"
               "e = np.exp(x - x.max(-1, keepdims=True)); e /= e.sum(-1, keepdims=True)\n"
               "n = nk.load()\n"
               "print(n.__name__, n.build_info()['arch'], float(np.abs(s - e).max()))\n")
    r = subprocess.run([str(venv / "bin" / "python"), "-s", "-c", program], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert r.returncode == 0, r.stderr
    name, arch, err = r.stdout.split()
    assert name.endswith("._native_base") and arch == "baseline" and float(err) < 1e-6
