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
messages and profilers can point at it. An entry's flow:

1. take the entry's file lock (``lx_<hash>.lock``, :mod:`filelock`): processes
   that want the same kernel at once wait for the first, which builds it;
2. check the entry against its sidecar (``lx_<hash>.meta``, JSON: the size and
   SHA-256 of each file, the compiler's version line, when it was created and
   last used). A missing, unreadable or mismatched sidecar, or a file of another
   size or hash (empty, truncated, random bytes, a stale build) means the entry
   is deleted and built again: loading a truncated library would kill the
   process (SIGBUS), so nothing is loaded unchecked;
3. build: every file is written under a temporary name and moved into place with
   ``os.replace``, the library first and its sidecar last, so a reader never
   sees a torn file, and a crash between the two leaves an entry without a
   sidecar, which is rebuilt;
4. after a new entry, evict the least recently used entries while the cache is
   larger than ``$LAZYX_CACHE_MAX_MB`` (:data:`DEFAULT_MAX_MB` by default),
   skipping any whose lock another process holds and those this process still
   reads from disk (its precompiled headers). A library this process has loaded
   may go: on Linux unlinking a mapped file leaves the mapping intact.

The precompiled header of the kernels' shared preamble (GCC's ``.gch``) is an
entry of the same kind (``lx_pre_<hash>``). The install builds it (:func:`prepare`,
the last step of CMakeLists.txt for a build for this machine); where it is missing
all the same (a wheel, another compiler, an evicted entry), a background thread
builds it when a kernel build finds it missing (kernels compile whole meanwhile, see
:func:`_precompiled_header`). The compiler's part of every key is its identity
(:func:`_identity`): its version line under the name of the program it really is, and
the flags given in ``CXX``. :func:`cache_info` and :func:`clear_cache` are what
``lazyx cache`` and ``lazyx cache clear`` print and do.

**The first compile** of a small function on a machine, then, waits for its kernel's
own part (~0.4 s with the header, ~0.9 s without) and, side by side on another core,
the call shim (:func:`prefetch_shim`, ~0.35 s), not for the header.

**What it says.** The first build after :data:`QUIET_S` seconds without one is
announced on the ``lazyx`` logger before it starts (:func:`lazyx.log.announce`:
visible on stderr without configuration), naming what it builds for when the caller
said (:func:`building_for`: ``compile(loss_fn)``, from a compiled function's first run
after a trace); each build is a ``DEBUG`` record with its time. A missing compiler is one warning naming the user's line; a compiler that
fails (its ``--version``, or a one-line source after a kernel failed) is reported
as failing, with its first error lines (:class:`CompilerFailedError`).

**Memory cache.** A library is loaded once per process; :func:`build` of the
same source again is a dictionary hit.

**Calls.** Reading a NumPy array's data address from Python costs about a
microsecond per array, and a ctypes call about as much; a small shim (a Python
extension module built once, like a kernel) takes the arrays themselves and
calls the kernel with their addresses, releasing the GIL around large loops.
Without Python's headers the addresses are read in Python and ctypes calls.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from pathlib import Path

from . import PREAMBLE_END
from ..environment import read_variable
from ..errors import KernelCompileError, LazyxError, MissingCompilerWarning
from ..log import announce, logger, warn

__all__ = ["KernelCompileError", "KernelCacheError", "compiler", "available", "cache_dir",
           "cache_info", "clear_cache", "DEFAULT_MAX_MB", "build", "FLAGS",
           "vector_math_header", "stats", "missing_compiler_message", "warn_missing_compiler",
           "MissingCompilerWarning", "CompilerFailedError", "wait_for_headers", "building_for",
           "prefetch_shim", "prepare"]

#: Flags besides ``-O3 -march=native -shared -fPIC``: C++17; wrapping signed integer
#: arithmetic (NumPy's overflow behaviour, and no undefined behaviour); math
#: functions that need not set ``errno`` (so that they vectorise); no floating-point
#: traps (nothing reads the exception flags; without it GCC will not speculate the
#: division of a select's other arm, so the saturating ``erf``/``tanh`` fits and every
#: loop with such a select stay scalar: 4x slower GELU); complex multiplication and
#: division without C99's inf/NaN recovery (as NumPy does). Values are IEEE's either way.
FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-std=c++17", "-fwrapv",
         "-fno-math-errno", "-fno-trapping-math", "-fcx-fortran-rules")

_CANDIDATES = ("c++", "g++", "clang++")
_ERROR_LINES = 12


class KernelCacheError(LazyxError, ValueError):
    """The kernel cache's configuration is invalid (``LAZYX_CACHE_MAX_MB``)."""


class CompilerFailedError(KernelCompileError):
    """The C++ compiler fails on any source, not just lazyx's: a broken toolchain or bad
    flags in ``CXX``. From then on :func:`available` is False (functions run unfused)."""


#: Counters for tests and diagnostics: libraries compiled, loaded from disk, found in
#: memory; precompiled headers built; damaged entries found (and rebuilt); entries evicted.
stats = {"compiled": 0, "disk": 0, "memory": 0, "headers": 0, "rebuilt": 0, "evicted": 0}

_lock = threading.Lock()
_libraries: dict[str, ctypes.CDLL] = {}
_building: dict[str, threading.Lock] = {}
_compilers: dict = {}
_failures: dict = {}  # $CXX -> [(command, output, version line or "")] of compilers that fail


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
    failed = _failures[env] = []
    for cmd in candidates:
        path = shutil.which(cmd[0])
        if path is None:
            continue
        run = [path, *cmd[1:], "--version"]
        try:
            out = subprocess.run(run, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            failed.append((shlex.join(run), str(exc), ""))
            continue
        if out.returncode == 0:
            version = (out.stdout or out.stderr).strip().splitlines()
            return [path, *cmd[1:]], _identity(path, cmd, version[0] if version else cmd[0])
        failed.append((f"{shlex.join(run)} (exit code {out.returncode})",
                       out.stderr or out.stdout, ""))
    return None


def _identity(path: str, cmd: list, line: str) -> str:
    """The compiler's identity in cache keys and sidecars: its version line, named by
    the program it really is (GCC starts the line with the name it was called by, so
    ``c++`` and ``g++``, one program, would otherwise key two caches: a header prepared
    at install time under one name would be missed under the other), plus the flags
    given in ``CXX`` (``g++ -DLAZYX_SOFT_HALF`` builds other kernels than ``g++``)."""
    first, sep, rest = line.partition(" ")
    if sep and first == os.path.basename(cmd[0]):
        line = f"{os.path.basename(os.path.realpath(path))} {rest}"
    return " ".join([line, *cmd[1:]])


def available() -> bool:
    """Whether a C++ compiler was found."""
    return compiler() is not None


def missing_compiler_message() -> str:
    """What to do when there is no working compiler, in words: none was found, or the
    one found fails (then with the command and its first error lines)."""
    env = os.environ.get("CXX", "").strip()
    compiler()
    failed = _failures.get(env)
    if failed:
        command, output, version = failed[0]
        name = f" ({version})" if version else ""
        return (f"lazyx's C++ compiler{name} fails, so compiled functions run their operations "
                f"unfused.\n  command: {command}\n  output:\n{_first_lines(output)}\n"
                f"Fix the compiler, or set the CXX environment variable to a working C++ "
                f"compiler (with its flags, e.g. CXX='g++ -O2').")
    tried = f"CXX={env!r}" if env else ", ".join(_CANDIDATES)
    return (f"lazyx found no C++ compiler (tried {tried}), so compiled functions run their "
            f"operations unfused. To enable fused kernels, install one (e.g. `apt install g++`) "
            f"or set the CXX environment variable to a C++ compiler.")


_warned = False


def warn_missing_compiler() -> None:
    """Warn, once per process, that there is no working compiler and how to get one
    (the warning names the line of the user's code that led here)."""
    global _warned
    if not _warned:
        _warned = True
        warn(missing_compiler_message(), MissingCompilerWarning)


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
    name = f"lx_{key}"
    lib_path = folder / f"{name}.so"
    cc = compiler()
    cap = _max_bytes()  # a bad LAZYX_CACHE_MAX_MB fails here, before any work
    with _entry_lock(folder, name):
        if _checked(folder, name, cc) is not None:
            try:
                lib = loader(str(lib_path))
            except (OSError, ImportError):
                lib = None  # intact yet unloadable (a library it links went away): rebuild
            if lib is not None:
                stats["disk"] += 1
                _touch(folder, name)
                return lib
        _compile(folder, name, source, extra, cc)
        lib = loader(str(lib_path))
    _evict(folder, name, cap)
    return lib


def _compile(folder: Path, name: str, source: str, extra: tuple, cc) -> None:
    """Compile ``source`` into the entry ``name`` (its lock held): library, source, sidecar."""
    if cc is None:
        raise RuntimeError(missing_compiler_message())
    _clear_for_build(folder, name)
    src_path = folder / f"{name}.cpp"
    _write_atomically(src_path, source.encode())
    tmp = _temporary(folder / f"{name}.so")
    started = _build_started(cc, folder)
    try:
        ok = False
        prefix, sep, body = source.partition(PREAMBLE_END)
        header = _precompiled_header(prefix, cc, extra) if sep else None
        if header is not None:
            # The shared preamble comes precompiled: the kernel's own part compiles alone.
            body_path = folder / f"{name}.body.cpp"
            _write_atomically(body_path, body.encode())
            out = _run([*cc[0], *FLAGS, *extra, "-include", str(header), str(body_path),
                        "-o", str(tmp), *_link_flags()])
            ok = out.returncode == 0
            body_path.unlink(missing_ok=True)
        if not ok:
            out = _run([*cc[0], *FLAGS, *extra, str(src_path), "-o", str(tmp), *_link_flags()])
            if out.returncode != 0:
                _check_compiler(cc, extra)
                raise KernelCompileError(_error_message(cc, src_path, out.stderr or out.stdout))
        os.replace(tmp, folder / f"{name}.so")
    finally:
        tmp.unlink(missing_ok=True)
        _build_ended(started, src_path, header)
    _record(folder, name, cc, (f"{name}.so",), FLAGS + extra)
    stats["compiled"] += 1


def _run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


# -- saying what is built --------------------------------------------------------------
#: A build starting after this many seconds without one is announced (one line, see
#: :func:`lazyx.log.announce`); the builds of one burst (a compiled function's first
#: run: its kernels and the call shim, about a second each) share that line.
QUIET_S = 30.0
_last_build = -float("inf")  # time.monotonic() when the last build ended
_active_builds = 0


_building_for = threading.local()  # .label: what the builds of this thread are for


@contextlib.contextmanager
def building_for(label: str):
    """Name what the builds in this block are for (``"compile(loss_fn)"``) in the line
    that announces them. Entered on cold paths only (a compiled function's first run
    after a trace): a build happens there, never on a call that finds its kernels."""
    before = getattr(_building_for, "label", None)
    _building_for.label = label
    try:
        yield
    finally:
        _building_for.label = before


def _build_started(cc, folder: Path) -> float:
    global _active_builds
    with _lock:
        quiet = _active_builds == 0 and time.monotonic() - _last_build >= QUIET_S
        _active_builds += 1
    if quiet:
        label = getattr(_building_for, "label", None)
        announce("compiling C++ kernels%s with %s (about a second each, once: later runs "
                 "load them from %s)...", f" for {label}" if label else "",
                 Path(cc[0][0]).name, folder)
    return time.perf_counter()


def prefetch_shim() -> None:
    """Start building the call shim (:func:`shim`) in a thread, when it is not built yet:
    called just before the build of a kernel that the shim will call, so that both
    compilers run side by side. One after the other they are the first compile's wait
    (kernel ~0.9 s + shim ~0.35 s); side by side on two cores, the kernel's alone."""
    global _shim_thread
    if _shim is not None or _shim_error is not None or not available():
        return
    with _lock:
        if _shim_thread is not None:
            return
        # Not a daemon: a process that exits first waits for it (a killed build would
        # leave its temporary file behind). It may announce the burst: with our label.
        label = getattr(_building_for, "label", None)
        _shim_thread = threading.Thread(target=_shim_for, args=(label,), name="lazyx call shim")
    _shim_thread.start()


def _shim_for(label) -> None:
    with building_for(label):
        shim()


_shim_thread: threading.Thread | None = None


def _build_ended(started: float, src_path: Path, header) -> None:
    global _active_builds, _last_build
    with _lock:
        _active_builds -= 1
        _last_build = time.monotonic()
    logger.debug("compiled %s in %.2f s (%s)", src_path, time.perf_counter() - started,
                 "with the precompiled header" if header is not None else "whole source")


# -- a compiler that fails -------------------------------------------------------------
_PROBE = "int lazyx_probe() { return 0; }\n"


def _check_compiler(cc, extra: tuple) -> None:
    """After a failed build: raise :class:`CompilerFailedError` when the compiler fails
    on a one-line source with the same flags too (the toolchain, not lazyx's source, is
    at fault); from then on there is no compiler for this process."""
    with tempfile.TemporaryDirectory(prefix="lazyx-probe-") as tmp:
        src = Path(tmp) / "probe.cpp"
        src.write_text(_PROBE)
        cmd = [*cc[0], *FLAGS, *extra, str(src), "-o", str(Path(tmp) / "probe.so")]
        try:
            out = _run(cmd)
            code, text = out.returncode, out.stderr or out.stdout
        except (OSError, subprocess.SubprocessError) as exc:
            code, text = -1, str(exc)
    if code == 0:
        return
    env = os.environ.get("CXX", "").strip()
    _failures[env] = [(f"{shlex.join(cmd)} (exit code {code})", text, cc[1])]
    _compilers[env] = False
    raise CompilerFailedError(missing_compiler_message())


def _first_lines(text: str) -> str:
    """The compiler's output from its first error line, at most :data:`_ERROR_LINES`
    lines, indented."""
    lines = text.splitlines()
    first = next((i for i, ln in enumerate(lines) if "error" in ln), 0)
    return "\n".join("    " + ln for ln in lines[first:first + _ERROR_LINES])


# -- the precompiled header --------------------------------------------------------------
#: The background build runs at the lowest priority, so that the kernels the user waits
#: for get the processor first (on a busy 2-core machine: 1.5 s instead of 3 s).
_NICE = ("nice", "-n", "19") if shutil.which("nice") else ()
_headers: dict = {}         # (folder, key) -> the header's path, or False: there is none
_header_builds: dict = {}   # (folder, key) -> the thread building it


def _precompiled_header(prefix: str, cc, extra: tuple):
    """The path of a header holding ``prefix`` whose precompiled form (GCC's ``.gch``)
    sits beside it, when it is ready; None when the compiler is not GCC, the build
    failed, or it is being built (the full source is compiled instead). Compiling the
    standard headers and the helpers is about half of a kernel's build time.

    A header found intact in the cache is used at once. Otherwise it is built once per
    preamble, compiler and flags by a background thread (~2 s, 45 MB), so that the first
    kernels of a fresh machine do not wait for it; the thread holds the entry's file
    lock like any build and is joined at exit (:func:`wait_for_headers` joins it now)."""
    key = _key(prefix, ("-x", "c++-header", *extra))
    folder = cache_dir()
    name = f"lx_pre_{key}"
    header = folder / f"{name}.h"
    got = _headers.get((folder, key))
    if got is False or (got is not None and (folder / f"{name}.h.gch").exists()):
        return got or None  # (another process may have evicted it: then look again)
    if not _is_gcc(cc):
        _headers[(folder, key)] = False
        return None
    with _lock:
        running = _header_builds.get((folder, key))
        if running is not None and running.is_alive():
            return None
    with _entry_lock(folder, name, timeout=0) as held:  # held elsewhere: being built
        if held and _checked(folder, name, cc) is not None:
            _touch(folder, name)
            _pinned.add((folder, name))  # read by every later build: this process keeps it
            _headers[(folder, key)] = header
            return header
    with _lock:
        running = _header_builds.get((folder, key))
        if running is None or not running.is_alive():
            thread = threading.Thread(target=_build_header, args=(folder, key, prefix, cc, extra),
                                      name="lazyx precompiled header")
            _header_builds[(folder, key)] = thread
            thread.start()  # not a daemon: a process that exits first waits for it
    return None


def _build_header(folder: Path, key: str, prefix: str, cc, extra: tuple) -> None:
    """Build the precompiled header of :func:`_precompiled_header` (in its thread)."""
    name = f"lx_pre_{key}"
    header, gch = folder / f"{name}.h", folder / f"{name}.h.gch"
    result = False
    try:
        built = False
        with _entry_lock(folder, name):
            if _checked(folder, name, cc) is None:
                logger.info("building the C++ precompiled header in the background (once per "
                            "compiler and flags, about 2 s): %s", header)
                started = time.perf_counter()
                _clear_for_build(folder, name)
                _write_atomically(header, prefix.encode())
                tmp = _temporary(gch)
                try:
                    flags = [f for f in FLAGS if f != "-shared"]
                    out = _run([*_NICE, *cc[0], *flags, *extra, "-x", "c++-header",
                                str(header), "-o", str(tmp)])
                    if out.returncode != 0:
                        logger.debug("the precompiled header did not build (kernels compile "
                                     "whole):\n%s", _first_lines(out.stderr or out.stdout))
                        return
                    os.replace(tmp, gch)
                finally:
                    tmp.unlink(missing_ok=True)
                _record(folder, name, cc, (header.name, gch.name), (*flags, *extra))
                stats["headers"] += 1
                built = True
                logger.debug("built %s in %.2f s", gch, time.perf_counter() - started)
            else:
                _touch(folder, name)
            _pinned.add((folder, name))  # read by every later build: this process keeps it
        if built:
            _evict(folder, name, _max_bytes())
        result = header
    except Exception as exc:  # a thread has no caller to raise to: kernels compile whole
        logger.debug("the precompiled header did not build: %r", exc)
    finally:
        _headers[(folder, key)] = result


def prepare() -> str:
    """Build, now, what the first compile on this machine would otherwise wait for or
    build in the background: the precompiled header of the CPU kernels' preamble (its
    usual cache entry, keyed by the preamble, the compiler, the flags and the CPU, so a
    later change of any of them simply misses it). Run at install time by the CMake
    build (``python -m lazyx.codegen.jit prepare``), so that the first compile of a
    small function compiles only its own part (~0.4 s instead of ~0.9 s).

    Returns what was done, in words (nothing is raised: an install must not fail here).
    """
    cc = compiler()
    if cc is None:
        return "no working C++ compiler: nothing to prepare"
    if not _is_gcc(cc):
        return f"{cc[1]} is not GCC: its kernels compile without a precompiled header"
    from . import cpp, ir  # (prepare only: the kernels' renderer)
    from .. import dtypes as _dtypes  # (prepare only: the dtype of its one-op program)
    x = ir.input(0, _dtypes.float32)
    source = cpp.render(ir.Program([_dtypes.float32], [ir.apply("exp", x)]), (False,),
                        vector_math_header())
    prefix = source.partition(PREAMBLE_END)[0]
    if _precompiled_header(prefix, cc, ()) is None:
        wait_for_headers()
        if _precompiled_header(prefix, cc, ()) is None:
            return "the precompiled header did not build (kernels compile whole)"
    return f"precompiled header ready in {cache_dir()} ({cc[1]})"


def wait_for_headers(timeout: float | None = None) -> None:
    """Wait until the precompiled headers being built in the background are done (at
    most ``timeout`` seconds each): after it, the next kernel builds use them."""
    with _lock:
        threads = list(_header_builds.values())
    for thread in threads:
        thread.join(timeout)


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


def _temporary(path: Path) -> Path:
    """A unique temporary name beside ``path``: a dot, the entry's name, the process."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = _temporary(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# -- the entries of the disk cache ---------------------------------------------------
# An entry is every file named ``lx_<hash>.*`` (or ``lx_pre_<hash>.*``) in the cache
# folder, plus its temporaries ``.lx_<hash>.*``: the built files, the source, the
# sidecar ``.meta`` and the lock ``.lock``. Files of other names are never touched.

#: The size cap of the disk cache in MiB when ``LAZYX_CACHE_MAX_MB`` is not set.
DEFAULT_MAX_MB = 1024
#: A load rewrites an entry's last-use time only when it is older than this (as the
#: ``relatime`` mount option does): a process start costs no writes to a warm cache.
TOUCH_AFTER_S = 60.0
#: How long to wait for another process's build of the same entry before building too
#: (the lock saves work; correctness rests on the checks and the atomic renames).
LOCK_TIMEOUT_S = 900.0
#: The longest a process trusts its last listing of the folder when checking the cap.
RESCAN_S = 60.0
_FORMAT = 1
#: What an entry may hold besides its lock and temporaries: a kernel's ``.so`` and
#: ``.cpp`` (``.body.cpp`` while it builds), a header's ``.h`` and ``.h.gch``; a ``.meta``.
_SUFFIXES = (".so", ".cpp", ".body.cpp", ".h", ".h.gch", ".meta")
_pinned: set = set()  # (folder, name): entries this process reads from disk again
_room: dict = {}      # folder -> (bytes under the cap, monotonic time, cap) at the last listing


@contextlib.contextmanager
def _entry_lock(folder: Path, name: str, timeout: float = LOCK_TIMEOUT_S):
    """Hold the entry's cross-process lock (yields False when ``timeout`` ran out)."""
    import filelock  # its import costs ~50 ms, paid only by a process that builds or loads
    lock = filelock.FileLock(str(folder / f"{name}.lock"), timeout=timeout)
    try:
        lock.acquire()
    except filelock.Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


def _read_meta(folder: Path, name: str):
    try:
        meta = json.loads((folder / f"{name}.meta").read_bytes())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _checked(folder: Path, name: str, cc):
    """The entry's sidecar when every file it lists has the recorded size and hash and
    was built by this compiler; else None (missing, unreadable, damaged or foreign)."""
    meta = _read_meta(folder, name)
    files = meta.get("files") if meta is not None else None
    if (not isinstance(files, dict) or not files or meta.get("format") != _FORMAT
            or meta.get("name") != name or meta.get("compiler") != (cc[1] if cc else "")):
        return None
    for fname, want in files.items():
        if not (isinstance(fname, str) and fname.startswith(name + ".") and "/" not in fname
                and isinstance(want, dict)):
            return None
        path = folder / fname
        try:
            size = path.stat().st_size
            if size == 0 or size != want.get("size") or _sha256(path) != want.get("sha256"):
                return None
        except OSError:
            return None
    return meta


def _record(folder: Path, name: str, cc, files: tuple, flags: tuple) -> None:
    """Write the entry's sidecar for its just-built ``files`` (the last step of a build)."""
    now = time.time()
    meta = {"format": _FORMAT, "name": name, "compiler": cc[1], "flags": list(flags),
            "files": {f: {"size": (folder / f).stat().st_size, "sha256": _sha256(folder / f)}
                      for f in files},
            "created": now, "last_used": now}
    _write_atomically(folder / f"{name}.meta", json.dumps(meta, indent=1).encode())


def _touch(folder: Path, name: str) -> None:
    """Record a use of the entry (its lock held), at most once per :data:`TOUCH_AFTER_S`."""
    meta = _read_meta(folder, name)
    now = time.time()
    if meta is not None and not now - (_last_use(meta) or 0.0) < TOUCH_AFTER_S:
        meta["last_used"] = now
        _write_atomically(folder / f"{name}.meta", json.dumps(meta, indent=1).encode())


def _entry_files(folder: Path) -> dict:
    """The cache's entries: name -> [(path, os.stat_result)] of its files."""
    entries: dict = {}
    try:
        scan = list(os.scandir(folder))
    except OSError:
        return entries
    for e in scan:
        base = e.name[1:] if e.name.startswith(".") else e.name
        name = base.split(".", 1)[0]
        if not base.startswith("lx_") or name == base:
            continue
        try:
            if not e.is_dir(follow_symlinks=False):
                entries.setdefault(name, []).append((Path(e.path), e.stat(follow_symlinks=False)))
        except OSError:
            continue  # removed meanwhile
    return entries


def _remove(folder: Path, name: str, files) -> int:
    """Delete the entry ``name`` (its lock held): its listed ``files``, whatever else it
    holds now, and its lock file; the bytes freed."""
    freed = 0
    paths = {path: st.st_size for path, st in files}
    for suffix in (*_SUFFIXES, ".lock"):
        paths.setdefault(folder / f"{name}{suffix}", 0)
    for path, size in paths.items():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            freed += size
    return freed


def _clear_for_build(folder: Path, name: str) -> None:
    """Before a build (the entry's lock held), delete what is left of the entry: a
    built file or sidecar there means it was damaged, which ``stats["rebuilt"]`` counts."""
    damaged = False
    for suffix in _SUFFIXES:
        with contextlib.suppress(FileNotFoundError):
            (folder / f"{name}{suffix}").unlink()
            damaged = damaged or suffix in (".so", ".h.gch", ".meta")
    if damaged:
        stats["rebuilt"] += 1


def _size(folder: Path, name: str) -> int:
    """The bytes of the entry's files (its temporaries aside)."""
    size = 0
    for suffix in _SUFFIXES:
        with contextlib.suppress(OSError):
            size += (folder / f"{name}{suffix}").stat().st_size
    return size


def _max_bytes() -> int:
    """The cache's size cap in bytes: ``$LAZYX_CACHE_MAX_MB`` MiB (fractions allowed),
    else :data:`DEFAULT_MAX_MB`."""
    mb = read_variable("LAZYX_CACHE_MAX_MB", KernelCacheError)  # checked: a number >= 0
    if mb is None:
        return DEFAULT_MAX_MB << 20
    return int(mb * (1 << 20))


def _last_use(meta) -> float | None:
    try:
        return float(meta["last_used"])
    except (TypeError, KeyError, ValueError):
        return None


def _evict(folder: Path, keep: str, cap: int) -> None:
    """After the new entry ``keep``: delete least recently used entries until the cache
    fits under ``cap`` bytes; never ``keep``, this process's pinned entries, nor one whose
    lock another holder has.

    Listing the folder costs about 20 µs a file, so a process lists it again only
    when its own new entries have used up the room the last listing saw, the cap has
    changed, or that listing is older than :data:`RESCAN_S` (other processes add too).
    """
    room, seen, seen_cap = _room.get(folder, (-1, 0.0, cap))
    room -= _size(folder, keep)
    if room >= 0 and seen_cap == cap and time.monotonic() - seen < RESCAN_S:
        _room[folder] = (room, seen, cap)
        return
    entries = _entry_files(folder)
    total = sum(st.st_size for files in entries.values() for _, st in files)
    if total > cap:
        candidates = sorted(
            (_last_use(_read_meta(folder, n)) or max(st.st_mtime for _, st in files), n)
            for n, files in entries.items() if n != keep and (folder, n) not in _pinned)
        for _, name in candidates:
            if total <= cap:
                break
            with _entry_lock(folder, name, timeout=0) as held:
                if held:
                    total -= _remove(folder, name, entries[name])
                    stats["evicted"] += 1
    _room[folder] = (cap - total, time.monotonic(), cap)


def cache_info() -> dict:
    """Where the disk cache is and how big.

    Returns:
        a dict: ``path`` (the folder), ``entries`` (how many kernels, shims and
        precompiled headers), ``bytes`` (their total size on disk) and ``max_bytes``
        (the cap, ``$LAZYX_CACHE_MAX_MB``).
    """
    folder = cache_dir()
    entries = _entry_files(folder)
    return {"path": str(folder), "entries": len(entries),
            "bytes": sum(st.st_size for files in entries.values() for _, st in files),
            "max_bytes": _max_bytes()}


def clear_cache() -> dict:
    """Empty the disk cache: delete every entry (waiting for one being built).

    Libraries this process has loaded stay usable. Files in the folder that are not
    lazyx's are left alone.

    Returns:
        a dict: ``path``, ``entries`` and ``bytes`` removed.
    """
    folder = cache_dir()
    removed = freed = 0
    for name, files in _entry_files(folder).items():
        with _entry_lock(folder, name, timeout=60) as held:
            if held:
                freed += _remove(folder, name, files)
                removed += 1
    _headers.clear()
    _room.pop(folder, None)
    return {"path": str(folder), "entries": removed, "bytes": freed}


def _error_message(cc, src_path: Path, text: str) -> str:
    return (f"The C++ compiler ({cc[1]}) failed to build a fused kernel.\n"
            f"  source: {src_path}\n  compiler output:\n{_first_lines(text)}\n"
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
// ``fn`` (an address) with the data pointers of the NumPy arrays in tuple ``arrays``;
// range_contiguous and range_strided do the same through a kernel's range entry
// points, splitting the loop over the thread pool given to set_runner.
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

// -- loops split over a thread pool ----------------------------------------------
// set_runner(address) hands the shim a pool's entry, run_parallel(fn, ctx, n, chunk,
// threads): it runs fn(ctx, begin, end) over [0, n) in chunks of `chunk` on up to
// `threads` threads (the caller's included), the chunks claimed by whichever thread
// is free (the cpu backend's native pool: one pool for every kernel). The loop is cut
// into a few chunks per thread, each a multiple of 64 elements so that no two threads
// write one cache line. Without a runner, or with one thread, the loop runs here.
typedef void (*contiguous_range_fn)(void* const*, int64_t, int64_t);
typedef void (*strided_range_fn)(void* const*, const int64_t*, const int64_t*, int, int64_t, int64_t);
typedef void (*chunk_fn)(void*, size_t, size_t);
typedef void (*runner_fn)(chunk_fn, void*, size_t, size_t, size_t);
static runner_fn lx_runner = nullptr;

struct lx_job {
  void* fn;
  void* const* buf;
  const int64_t* shape;
  const int64_t* st;
  int nd;
};

static void lx_contiguous_chunk(void* ctx, size_t b, size_t e) {
  const lx_job* j = static_cast<const lx_job*>(ctx);
  reinterpret_cast<contiguous_range_fn>(j->fn)(j->buf, (int64_t)b, (int64_t)e);
}

static void lx_strided_chunk(void* ctx, size_t b, size_t e) {
  const lx_job* j = static_cast<const lx_job*>(ctx);
  reinterpret_cast<strided_range_fn>(j->fn)(j->buf, j->shape, j->st, j->nd, (int64_t)b, (int64_t)e);
}

static void lx_split(chunk_fn fn, lx_job* job, int64_t n, int threads) {
  if (threads <= 1 || lx_runner == nullptr) { fn(job, 0, (size_t)n); return; }
  const int64_t chunks = 4 * (int64_t)threads;
  const int64_t chunk = ((n + chunks - 1) / chunks + 63) / 64 * 64;
  if (chunk >= n) { fn(job, 0, (size_t)n); return; }
  lx_runner(fn, job, (size_t)n, (size_t)chunk, (size_t)threads);
}

// lx_split, with the GIL let go unless the loop is too short to be worth it.
static PyObject* lx_run(chunk_fn fn, lx_job* job, int64_t n, int threads) {
  if (n < lx_release_gil) {
    lx_split(fn, job, n, 1);
  } else {
    Py_BEGIN_ALLOW_THREADS
    lx_split(fn, job, n, threads);
    Py_END_ALLOW_THREADS
  }
  return PyLong_FromLong(0);
}

static PyObject* lx_set_runner(PyObject*, PyObject* arg) {
  void* fn = PyLong_AsVoidPtr(arg);
  if (PyErr_Occurred()) return nullptr;
  lx_runner = reinterpret_cast<runner_fn>(fn);
  Py_RETURN_NONE;
}

// range_contiguous(fn, arrays, n, threads): fn is a kernel's lazyx_contiguous_range.
static PyObject* lx_range_contiguous(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) { PyErr_SetString(PyExc_TypeError, "range_contiguous takes 4 arguments"); return nullptr; }
  lx_job job = {PyLong_AsVoidPtr(args[0]), nullptr, nullptr, nullptr, 0};
  int64_t n = PyLong_AsLongLong(args[2]);
  int threads = (int)PyLong_AsLong(args[3]);
  void* ptrs[lx_max_buffers];
  if (PyErr_Occurred() || lx_addresses(args[1], ptrs)) return nullptr;
  job.buf = ptrs;
  return lx_run(lx_contiguous_chunk, &job, n, threads);
}

// range_strided(fn, arrays, layout, nd, n, threads): fn is a kernel's lazyx_strided_range.
static PyObject* lx_range_strided(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6) { PyErr_SetString(PyExc_TypeError, "range_strided takes 6 arguments"); return nullptr; }
  if (!PyBytes_Check(args[2])) { PyErr_SetString(PyExc_TypeError, "layout must be bytes"); return nullptr; }
  const int64_t* layout = reinterpret_cast<const int64_t*>(PyBytes_AS_STRING(args[2]));
  int nd = (int)PyLong_AsLong(args[3]);
  lx_job job = {PyLong_AsVoidPtr(args[0]), nullptr, layout, layout + nd, nd};
  int64_t n = PyLong_AsLongLong(args[4]);
  int threads = (int)PyLong_AsLong(args[5]);
  void* ptrs[lx_max_buffers];
  if (PyErr_Occurred() || lx_addresses(args[1], ptrs)) return nullptr;
  if (nd < 1 || nd > 16 || PyBytes_GET_SIZE(args[2]) < (Py_ssize_t)(8 * nd)) return PyLong_FromLong(2);
  job.buf = ptrs;
  return lx_run(lx_strided_chunk, &job, n, threads);
}

static PyMethodDef lx_methods[] = {
  {"contiguous", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(lx_contiguous)),
   METH_FASTCALL, "Call a kernel's contiguous entry point."},
  {"strided", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(lx_strided)),
   METH_FASTCALL, "Call a kernel's strided entry point."},
  {"range_contiguous", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(lx_range_contiguous)),
   METH_FASTCALL, "Run a kernel's contiguous loop through its range entry point, on the pool."},
  {"range_strided", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(lx_range_strided)),
   METH_FASTCALL, "Run a kernel's strided loop through its range entry point, on the pool."},
  {"set_runner", lx_set_runner, METH_O, "Set the thread pool's run_parallel address (0: none)."},
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
    """The call shim (a Python extension module with ``contiguous`` and ``strided``,
    ``range_contiguous`` and ``range_strided`` for loops split over the thread pool set
    with ``set_runner``),
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


if __name__ == "__main__":  # python -m lazyx.codegen.jit prepare (the install's last step)
    if sys.argv[1:] != ["prepare"]:
        sys.exit("usage: python -m lazyx.codegen.jit prepare")
    print(f"lazyx: {prepare()}")
