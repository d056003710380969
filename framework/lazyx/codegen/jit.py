"""Build C++ sources with the system compiler into shared libraries, load them with
ctypes, and cache them in memory and on disk.

The compiler is ``$CXX`` when set (then only that one), else the first of
``c++``, ``g++`` and ``clang++`` on the ``PATH``. Sources are compiled with
``-O3 -march=native -shared -fPIC`` plus the flags of :data:`FLAGS`.

**Disk cache.** Libraries live in ``$LAZYX_CACHE_DIR``, else
``$XDG_CACHE_HOME/lazyx/kernels``, else ``~/.cache/lazyx/kernels`` (a temporary
folder when none of these can be written), named by a hash of the source, the
compiler's version, the flags and the CPU: a later process loads them without
compiling. The source is kept beside the library (``lx_<hash>.cpp``), so error
messages and profilers can point at it. Files are written under a temporary
name and moved into place with ``os.replace``, so two processes that build the
same kernel at once both end with a complete library, never a torn one.

**Memory cache.** A library is loaded once per process; :func:`build` of the
same source again is a dictionary hit.

**Calls.** Reading a NumPy array's data address from Python costs about a
microsecond per array, and a ctypes call about as much; a small shim (a Python
extension module built once, like a kernel) takes the arrays themselves and
calls the kernel with their addresses, releasing the GIL around large loops.
Without Python's headers the addresses are read in Python and ctypes calls.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import uuid
import warnings
from pathlib import Path

from ..errors import LazyxError

__all__ = ["KernelCompileError", "compiler", "available", "cache_dir", "build", "FLAGS",
           "vector_math_header", "stats", "missing_compiler_message", "warn_missing_compiler",
           "MissingCompilerWarning"]

#: Flags besides ``-O3 -march=native -shared -fPIC``: C++17; wrapping signed integer
#: arithmetic (NumPy's overflow behaviour, and no undefined behaviour); math
#: functions that need not set ``errno`` (so that they vectorise); complex
#: multiplication and division without C99's inf/NaN recovery (as NumPy does).
FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-std=c++17", "-fwrapv",
         "-fno-math-errno", "-fcx-fortran-rules")

_CANDIDATES = ("c++", "g++", "clang++")
_ERROR_LINES = 12


class KernelCompileError(LazyxError, RuntimeError):
    """The C++ compiler rejected a generated kernel; the message names the source file."""


#: Counters for tests and diagnostics: libraries compiled, loaded from disk, found in memory.
stats = {"compiled": 0, "disk": 0, "memory": 0}

_lock = threading.Lock()
_libraries: dict[str, ctypes.CDLL] = {}
_building: dict[str, threading.Lock] = {}
_compilers: dict = {}


def compiler():
    """The compiler command (a list) and its version line, or None when there is none.

    ``$CXX`` is respected: when it is set and does not name a working program,
    there is no compiler (the other candidates are not tried behind the user's back).
    """
    env = os.environ.get("CXX", "").strip()
    found = _compilers.get(env)
    if found is None:
        found = _compilers[env] = _find_compiler(env) or False
    return found or None


def _find_compiler(env: str):
    if env:
        cmd = shlex.split(env)
        candidates = [cmd] if cmd else []
    else:
        candidates = [[c] for c in _CANDIDATES]
    for cmd in candidates:
        path = shutil.which(cmd[0])
        if path is None:
            continue
        try:
            out = subprocess.run([path, *cmd[1:], "--version"], capture_output=True, text=True,
                                 timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0:
            version = (out.stdout or out.stderr).strip().splitlines()
            return [path, *cmd[1:]], (version[0] if version else cmd[0])
    return None


def available() -> bool:
    """Whether a C++ compiler was found."""
    return compiler() is not None


def missing_compiler_message() -> str:
    """What to do when there is no compiler, in words."""
    env = os.environ.get("CXX", "").strip()
    tried = f"CXX={env!r}" if env else ", ".join(_CANDIDATES)
    return (f"lazyx found no C++ compiler (tried {tried}), so compiled functions run their "
            f"operations unfused. To enable fused kernels, install one (e.g. `apt install g++`) "
            f"or set the CXX environment variable to a C++ compiler.")


class MissingCompilerWarning(RuntimeWarning):
    """No C++ compiler: compiled functions run their operations unfused."""


_warned = False


def warn_missing_compiler(stacklevel: int = 3) -> None:
    """Warn, once per process, that there is no compiler and how to get one."""
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(missing_compiler_message(), MissingCompilerWarning, stacklevel=stacklevel)


def cache_dir() -> Path:
    """The folder of the disk cache (created when needed)."""
    env = os.environ.get("LAZYX_CACHE_DIR")
    if env:
        base = Path(env)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg) if xdg else Path.home() / ".cache") / "lazyx" / "kernels"
    try:
        base.mkdir(parents=True, exist_ok=True)
        if os.access(base, os.W_OK):
            return base
    except OSError:
        pass
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    base = Path(tempfile.gettempdir()) / f"lazyx-{uid}" / "kernels"
    base.mkdir(parents=True, exist_ok=True)
    return base


_cpu_id: str | None = None


def _cpu() -> str:
    """What ``-march=native`` depends on: a library built on one CPU may not run on another."""
    global _cpu_id
    if _cpu_id is None:
        text = platform.machine() + platform.processor()
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith(("flags", "Features", "model name")):
                        text += line
                    if line.strip() == "":
                        break
        except OSError:
            pass
        _cpu_id = hashlib.sha256(text.encode()).hexdigest()[:16]
    return _cpu_id


def _key(source: str, extra: tuple = ()) -> str:
    cc = compiler()
    h = hashlib.sha256()
    for part in (source, cc[1] if cc else "", " ".join(FLAGS + tuple(extra)), _cpu()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


def build(source: str, extra_flags: tuple = (), loader=ctypes.CDLL):
    """The loaded shared library compiled from ``source`` (cached in memory and on disk).

    Args:
        source: C++ source text.
        extra_flags: more compiler flags (include folders, defines); part of the cache key.
        loader: how to load the built file (``ctypes.CDLL`` by default; a function of
            the path for other kinds, such as a Python extension module).
    Raises:
        KernelCompileError: the compiler failed; the message has the source's path
            and the compiler's first error lines.
        RuntimeError: there is no compiler (check :func:`available` first).
    """
    key = _key(source, extra_flags)
    lib = _libraries.get(key)
    if lib is not None:
        stats["memory"] += 1
        return lib
    with _lock:
        lock = _building.setdefault(key, threading.Lock())
    with lock:  # one build per kernel; different kernels build in parallel
        lib = _libraries.get(key)
        if lib is None:
            lib = _libraries[key] = _load_or_compile(key, source, tuple(extra_flags), loader)
        else:
            stats["memory"] += 1
    return lib


def _load_or_compile(key: str, source: str, extra: tuple, loader):
    folder = cache_dir()
    lib_path = folder / f"lx_{key}.so"
    if lib_path.exists():
        try:
            lib = loader(str(lib_path))
            stats["disk"] += 1
            return lib
        except (OSError, ImportError):
            pass  # unreadable or from an interrupted build of old: build it again
    cc = compiler()
    if cc is None:
        raise RuntimeError(missing_compiler_message())
    src_path = folder / f"lx_{key}.cpp"
    _write_atomically(src_path, source.encode())
    tmp = folder / f".lx_{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}.so"
    try:
        ok = False
        prefix, sep, body = source.partition(PREAMBLE_END)
        header = _precompiled_header(prefix, cc, extra) if sep else None
        if header is not None:
            # The shared preamble comes precompiled: the kernel's own part compiles alone.
            body_path = folder / f"lx_{key}.body.cpp"
            _write_atomically(body_path, body.encode())
            out = _run([*cc[0], *FLAGS, *extra, "-include", str(header), str(body_path),
                        "-o", str(tmp), *_link_flags()])
            ok = out.returncode == 0
            body_path.unlink(missing_ok=True)
        if not ok:
            out = _run([*cc[0], *FLAGS, *extra, str(src_path), "-o", str(tmp), *_link_flags()])
            if out.returncode != 0:
                raise KernelCompileError(_error_message(cc, src_path, out.stderr or out.stdout))
        os.replace(tmp, lib_path)
    finally:
        if tmp.exists():
            tmp.unlink()
    stats["compiled"] += 1
    return loader(str(lib_path))


def _run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


#: The line a source's shared preamble ends with (what a precompiled header holds).
PREAMBLE_END = "// ---- end of the shared preamble ----\n"
_headers: dict = {}


def _precompiled_header(prefix: str, cc, extra: tuple):
    """The path of a header holding ``prefix`` whose precompiled form (GCC's ``.gch``)
    sits beside it, built once per preamble, compiler and flags; None when the compiler
    is not GCC or the build fails (the full source is compiled instead). Compiling the
    standard headers and the helpers is about half of a kernel's build time."""
    key = _key(prefix, ("-x", "c++-header", *extra))
    got = _headers.get(key)
    if got is not None:
        return got or None
    _headers[key] = False
    if not _is_gcc(cc):
        return None
    folder = cache_dir()
    header = folder / f"lx_pre_{key}.h"
    gch = folder / f"lx_pre_{key}.h.gch"
    if not gch.exists():
        _write_atomically(header, prefix.encode())
        tmp = folder / f".lx_pre_{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}.gch"
        try:
            flags = [f for f in FLAGS if f != "-shared"]
            out = _run([*cc[0], *flags, *extra, "-x", "c++-header", str(header), "-o", str(tmp)])
            if out.returncode != 0:
                return None
            os.replace(tmp, gch)
        finally:
            if tmp.exists():
                tmp.unlink()
    elif not header.exists():
        _write_atomically(header, prefix.encode())
    _headers[key] = header
    return header


_gcc: dict = {}


def _is_gcc(cc) -> bool:
    """Whether the compiler is GCC (whose precompiled headers :func:`build` uses)."""
    got = _gcc.get(cc[0][0])
    if got is None:
        try:
            out = subprocess.run([*cc[0], "-dM", "-E", "-x", "c++", os.devnull],
                                 capture_output=True, text=True, timeout=60)
            macros = out.stdout
        except (OSError, subprocess.SubprocessError):
            macros = ""
        got = _gcc[cc[0][0]] = "__GNUC__" in macros and "__clang__" not in macros
    return got


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _error_message(cc, src_path: Path, text: str) -> str:
    lines = text.splitlines()
    first = next((i for i, ln in enumerate(lines) if "error" in ln), 0)
    shown = "\n".join("    " + ln for ln in lines[first:first + _ERROR_LINES])
    return (f"The C++ compiler ({cc[1]}) failed to build a fused kernel.\n"
            f"  source: {src_path}\n  compiler output:\n{shown}\n"
            f"This is a bug in lazyx's code generation: please report it with the source file. "
            f"Setting CXX to an invalid name runs compiled functions unfused meanwhile.")


# -- vector math ------------------------------------------------------------------
# glibc's libmvec has SIMD versions of libm's functions; declaring them makes the
# compiler vectorise loops that call them without -ffast-math (which would break
# NaN and infinity semantics). Only functions that every x86-64 variant exists for
# are declared: a missing one would be an undefined symbol at load time.
_VECTOR_FUNCTIONS = ("exp", "log", "sin", "cos", "tan", "expm1", "log1p", "log2", "log10",
                     "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
                     "atanh", "erf")
_VECTOR_BINARY = ("pow", "atan2")
_ISAS = (("b", 2, 4), ("c", 4, 8), ("d", 4, 8), ("e", 8, 16))  # (isa, doubles, floats)
_vector_header: str | None = None
_mvec: str | None = None


def vector_math_header() -> str:
    """Declarations that let the compiler call libmvec's SIMD math (empty where absent)."""
    global _vector_header, _mvec
    if _vector_header is not None:
        return _vector_header
    lines = []
    name = ctypes.util.find_library("mvec") if sys.platform.startswith("linux") and \
        platform.machine() in ("x86_64", "AMD64") else None
    lib = None
    if name:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            lib = None
    if lib is not None:
        def has(fn, params):
            return all(hasattr(lib, f"_ZGV{isa}N{n}{params}_{f}")
                       for isa, nd, nf in _ISAS for f, n in ((fn, nd), (fn + "f", nf)))
        for fn in _VECTOR_FUNCTIONS:
            if has(fn, "v"):
                lines.append(f"{_SIMD} double {fn}(double) noexcept; "
                             f"{_SIMD} float {fn}f(float) noexcept;")
        for fn in _VECTOR_BINARY:
            if has(fn, "vv"):
                lines.append(f"{_SIMD} double {fn}(double, double) noexcept; "
                             f"{_SIMD} float {fn}f(float, float) noexcept;")
    if lines:
        _mvec = "mvec"
        lines = ['extern "C" {', *lines, "}"]
    _vector_header = "\n".join(lines)
    return _vector_header


_SIMD = '__attribute__((simd("notinbranch")))'


def _link_flags() -> list[str]:
    vector_math_header()
    return ["-lpthread"] + ([f"-l{_mvec}"] if _mvec else [])


# -- the call shim -------------------------------------------------------------------
_SHIM = r"""// lazyx kernel-call shim (generated; see lazyx/codegen/jit.py)
// A Python extension module: lazyx_shim.contiguous(fn, arrays, n, threads) and
// lazyx_shim.strided(fn, arrays, layout, nd, n, threads) call kernel entry point
// ``fn`` (an address) with the data pointers of the NumPy arrays in tuple ``arrays``.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/ndarraytypes.h>
#include <cstdint>

typedef int (*contiguous_fn)(void* const*, int64_t, int);
typedef int (*strided_fn)(void* const*, const int64_t*, const int64_t*, int, int64_t, int);
static const Py_ssize_t lx_max_buffers = 256;
// Below this many elements the GIL stays held: releasing it costs more than the loop.
static const int64_t lx_release_gil = 16384;

// The arrays are NumPy arrays (the caller checked): read their data addresses.
static int lx_addresses(PyObject* arrays, void** out) {
  if (!PyTuple_Check(arrays)) { PyErr_SetString(PyExc_TypeError, "arrays must be a tuple"); return -1; }
  Py_ssize_t n = PyTuple_GET_SIZE(arrays);
  if (n > lx_max_buffers) { PyErr_SetString(PyExc_ValueError, "too many buffers"); return -1; }
  for (Py_ssize_t i = 0; i < n; ++i)
    out[i] = PyArray_DATA(reinterpret_cast<PyArrayObject*>(PyTuple_GET_ITEM(arrays, i)));
  return 0;
}

static PyObject* lx_contiguous(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) { PyErr_SetString(PyExc_TypeError, "contiguous takes 4 arguments"); return nullptr; }
  void* fn = PyLong_AsVoidPtr(args[0]);
  int64_t n = PyLong_AsLongLong(args[2]);
  int threads = (int)PyLong_AsLong(args[3]);
  void* ptrs[lx_max_buffers];
  if (PyErr_Occurred() || lx_addresses(args[1], ptrs)) return nullptr;
  int rc;
  if (n < lx_release_gil) {
    rc = reinterpret_cast<contiguous_fn>(fn)(ptrs, n, threads);
  } else {
    Py_BEGIN_ALLOW_THREADS
    rc = reinterpret_cast<contiguous_fn>(fn)(ptrs, n, threads);
    Py_END_ALLOW_THREADS
  }
  return PyLong_FromLong(rc);
}

static PyObject* lx_strided(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6) { PyErr_SetString(PyExc_TypeError, "strided takes 6 arguments"); return nullptr; }
  void* fn = PyLong_AsVoidPtr(args[0]);
  if (!PyBytes_Check(args[2])) { PyErr_SetString(PyExc_TypeError, "layout must be bytes"); return nullptr; }
  const int64_t* layout = reinterpret_cast<const int64_t*>(PyBytes_AS_STRING(args[2]));
  int nd = (int)PyLong_AsLong(args[3]);
  int64_t n = PyLong_AsLongLong(args[4]);
  int threads = (int)PyLong_AsLong(args[5]);
  void* ptrs[lx_max_buffers];
  if (PyErr_Occurred() || lx_addresses(args[1], ptrs)) return nullptr;
  int rc;
  if (n < lx_release_gil) {
    rc = reinterpret_cast<strided_fn>(fn)(ptrs, layout, layout + nd, nd, n, threads);
  } else {
    Py_BEGIN_ALLOW_THREADS
    rc = reinterpret_cast<strided_fn>(fn)(ptrs, layout, layout + nd, nd, n, threads);
    Py_END_ALLOW_THREADS
  }
  return PyLong_FromLong(rc);
}

static PyMethodDef lx_methods[] = {
  {"contiguous", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(lx_contiguous)),
   METH_FASTCALL, "Call a kernel's contiguous entry point."},
  {"strided", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(lx_strided)),
   METH_FASTCALL, "Call a kernel's strided entry point."},
  {nullptr, nullptr, 0, nullptr}};
static struct PyModuleDef lx_module = {PyModuleDef_HEAD_INIT, "lazyx_shim", nullptr, -1, lx_methods};
PyMODINIT_FUNC PyInit_lazyx_shim(void) { return PyModule_Create(&lx_module); }
"""

#: The most buffers (inputs and outputs) one call passes through the shim.
MAX_BUFFERS = 256

_shim = None
_shim_error: str | None = None


def _load_module(path: str):
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.ExtensionFileLoader("lazyx_shim", path)
    spec = importlib.util.spec_from_file_location("lazyx_shim", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def shim():
    """The call shim (a Python extension module with ``contiguous`` and ``strided``),
    or None when it cannot be built (no Python or NumPy headers): callers then read
    the data addresses in Python."""
    global _shim, _shim_error
    if _shim is None and _shim_error is None:
        try:
            import numpy as np
            flags = (f"-I{sysconfig.get_paths()['include']}", f"-I{np.get_include()}")
            _shim = build(_SHIM + f"// python {sys.version}, numpy {np.__version__}\n", flags,
                          loader=_load_module)
        except (KernelCompileError, RuntimeError, OSError, ImportError) as exc:
            _shim_error = str(exc)
    return _shim
