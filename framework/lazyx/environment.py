"""Every environment variable lazyx reads, as data, and the one function that reads
and checks them.

Each place that reads a variable reads it once, where it is needed (at import, at the
first compile, when the default device is chosen), so the hot path never looks here.
The flow of a read:

1. the site calls :func:`read_variable` with the variable's name (and, for an error,
   the exception class its callers expect, e.g. ``DeviceError``);
2. the value is checked against the variable's row in :data:`VARIABLES`: a choice
   (``choices``: compared stripped and lower-cased) or a number (``number``: a
   finite number >= 0); free text passes as it is;
3. a value outside them is never ignored: the row's ``invalid`` says whether it is an
   error (raised, :class:`EnvironmentVariableError` unless the site names a class) or
   a ``RuntimeWarning`` pointing at the user's line, after which lazyx carries on as
   if the variable were unset. Either message names the variable, the value and the
   accepted values.

The table is also what the rest of lazyx says *about* those reads:

* ``lazyx info --env`` lists every variable with its current value
  (:func:`current`), and flags a value outside the accepted ones;
* ``docs/environment.md`` holds :func:`markdown_table` verbatim;
* ``tests/test_environment_variables.py`` parses every source file of
  ``framework/``, ``backends/`` and ``plugins/`` for environment reads (``os.environ``
  and :func:`read_variable`) and fails when one reads a variable missing here, when
  ``read_in`` does not name exactly the files that read it, or when a variable with
  accepted values is read around :func:`read_variable`. So a new variable cannot go
  undocumented, nor a bad value unnoticed.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

from .errors import LazyxError

__all__ = ["EnvironmentVariable", "EnvironmentVariableError", "VARIABLES", "read_variable",
           "current", "markdown_table"]


class EnvironmentVariableError(LazyxError, ValueError):
    """An environment variable lazyx reads has a value it does not accept."""


class EnvironmentVariable(NamedTuple):
    """One variable lazyx reads."""

    name: str
    #: What lazyx does when it is unset, in words.
    default: str
    #: What it does.
    meaning: str
    #: The source files (relative to the repository root) that read it.
    read_in: tuple[str, ...]
    #: The values it accepts, when it is a choice (None: free text, see ``meaning``).
    choices: tuple[str, ...] | None = None
    #: When it is a number: what the number is, in words (e.g. "a size in MiB").
    number: str | None = None
    #: What a value outside ``choices``/``number`` is: ``"error"`` or ``"warning"``.
    invalid: str = "error"


_BACKEND = "framework/lazyx/backend.py"
_SWITCH = ("1", "0", "true", "false", "yes", "no", "on", "off")
#: The values of ``_SWITCH`` that turn a switch on.
ON = ("1", "true", "yes", "on")
_JIT = "framework/lazyx/codegen/jit.py"
_REGISTRY = "framework/lazyx/registry.py"
_DIST = "backends/distributed/__init__.py"

#: Every environment variable lazyx reads, by name.
VARIABLES: dict[str, EnvironmentVariable] = {v.name: v for v in [
    EnvironmentVariable(
        "LAZYX_DEFAULT_DEVICE", "the GPU when an available backend runs it, else the CPU",
        "The default device, chosen once when `lazyx.core` is imported; any other value "
        "is a `DeviceError`.",
        ("framework/lazyx/device.py",), ("cpu", "gpu")),
    EnvironmentVariable(
        "LAZYX_CPU_BACKEND", "the first available CPU backend (`cpu` before the others)",
        "The active CPU backend, by name (`lazyx info` lists them); a name that is not "
        "registered, or names a GPU backend, is a `BackendError`.",
        (_BACKEND,)),
    EnvironmentVariable(
        "LAZYX_GPU_BACKEND", "the first available GPU backend (`cuda` before `metal`)",
        "The active GPU backend, by name, as `LAZYX_CPU_BACKEND` for the CPU.",
        (_BACKEND,)),
    EnvironmentVariable(
        "LAZYX_DISABLE_PLUGIN_AUTOLOAD", "unset: every installed plugin loads",
        "Any non-empty value: third-party plugins (entry points of distributions other "
        "than `lazyx`) load only when `LAZYX_PLUGINS` names them.",
        (_REGISTRY,)),
    EnvironmentVariable(
        "LAZYX_PLUGINS", "unset",
        "Comma-separated entry-point names of the third-party plugins to load while "
        "`LAZYX_DISABLE_PLUGIN_AUTOLOAD` is set; a name no distribution provides is a "
        "warning.",
        (_REGISTRY,)),
    EnvironmentVariable(
        "LAZYX_DISABLE_COMPILE", "unset: `compile` traces and fuses",
        "`1` (or `true`, `yes`, `on`): functions made by `lazyx.core.compile` just call "
        "the function, as after `disable_compile()`; `0`, `false`, `no`, `off` compile. "
        "Another value is a warning, and compile stays on.",
        ("framework/lazyx/transforms/compile.py",), _SWITCH, invalid="warning"),
    EnvironmentVariable(
        "LAZYX_CACHE_DIR", "`$XDG_CACHE_HOME/lazyx/kernels`, else `~/.cache/lazyx/kernels`",
        "The folder of the compiled-kernel cache (`lazyx cache` shows it); when it is not "
        "writable, a folder under the system's temporary directory is used.",
        (_JIT,)),
    EnvironmentVariable(
        "XDG_CACHE_HOME", "`~/.cache`",
        "The base of the default kernel cache folder, when `LAZYX_CACHE_DIR` is unset.",
        (_JIT,)),
    EnvironmentVariable(
        "LAZYX_CACHE_MAX_MB", "1024",
        "The kernel cache's size cap in MiB (fractions allowed); the least recently used "
        "kernels are removed beyond it. A value that is not a size is a "
        "`KernelCacheError`.",
        (_JIT,), number="a size in MiB (e.g. 1024)"),
    EnvironmentVariable(
        "LAZYX_LOG", "unset: only long work (a C++ build) prints one `lazyx: ...` line, "
        "unless the application configured `logging`",
        "Attaches a stderr handler at this level to the `lazyx` logger when `lazyx` is "
        "imported: `info` shows what is built and when, `debug` each build and its time, "
        "`warning` silences the build line. Any other value is a warning naming these.",
        ("framework/lazyx/__init__.py", "framework/lazyx/log.py"), ("debug", "info", "warning"),
        invalid="warning"),
    EnvironmentVariable(
        "PYTHONPATH", "Python's",
        "Read by lazyx's pytest plugin only: during a test session it puts the "
        "`lazyx_plugin_path` folders (the test-only plugin packages) in front, so that "
        "subprocesses of the tests see them too, and restores it afterwards.",
        ("framework/lazyx/testing/pytest_plugin.py",)),
    EnvironmentVariable(
        "CXX", "the first of the usual C++ compilers found on `PATH`",
        "The C++ compiler (with flags, e.g. `g++ -DLAZYX_SOFT_HALF`) for compiled "
        "kernels. When set and not working, no other compiler is tried.",
        (_JIT,)),
    EnvironmentVariable(
        "LAZYX_CPU_ELEMENTWISE", "1",
        "`0`: single element-wise ops on large CPU arrays always run NumPy, never a "
        "generated kernel. Read once, at import; another value is a warning (then `1`).",
        ("backends/cpu/compiled.py",), ("0", "1"), invalid="warning"),
    EnvironmentVariable(
        "LAZYX_CPU_FFT", "`auto`: Intel MKL where `mkl_fft` is installed (`lazyx[mkl]`), "
        "else pocketfft",
        "The library of the CPU's FFTs: `mkl` (an error at the first transform when "
        "`mkl_fft` is missing) or `pocketfft` (SciPy's). Read once, at import of the CPU "
        "FFT kernels; another value is an error.",
        ("backends/cpu/kernels/fft.py",), ("auto", "mkl", "pocketfft")),
    EnvironmentVariable(
        "LAZYX_CUDA_ELEMENTWISE", "1",
        "`0`: single element-wise ops on the GPU run CuPy's kernels, never a generated "
        "one. Read once, at import; another value is a warning (then `1`).",
        ("backends/cuda/compiled.py",), ("0", "1"), invalid="warning"),
    EnvironmentVariable(
        "LAZYX_CUDA_NATIVE", "1",
        "`0`: the CUDA backend launches its kernels (generated element-wise kernels, fused "
        "nodes, kernels of CUDA C++ source) through CuPy from Python instead of from C++ "
        "(`backends/cuda/native/launch.cpp`, the driver's `cuLaunchKernel`). Read once, at "
        "import; another value is a warning (then `1`).",
        ("backends/cuda/runtime.py",), ("0", "1"), invalid="warning"),
    EnvironmentVariable(
        "LAZYX_CUDA_GRAPHS", "1",
        "`0`: a compiled function's calls on the GPU launch their plan's kernels one by "
        "one instead of replaying it as a CUDA graph (captured at the second call of a "
        "signature). Read once, at the CUDA backend's first kernel lookup; another value is "
        "a warning (then `1`).",
        ("backends/cuda/graphs.py",), ("0", "1"), invalid="warning"),
    EnvironmentVariable(
        "LAZYX_EAGER_REPLAY", "auto",
        "Eager replay: an `eval` whose graph (at least 16 nodes) has the structure of an "
        "earlier one runs as one compiled plan (a CUDA graph on the GPU), same kernels, same "
        "results. `auto`: graphs on a GPU; `1`: graphs on any device; `0`: never. Read "
        "once, at import (`lazyx.transforms.replay.set_mode` changes it); another value is "
        "a warning (then `auto`).",
        ("framework/lazyx/transforms/replay.py",), ("auto", "1", "0"), invalid="warning"),
    EnvironmentVariable(
        "LAZYX_CUDNN_LEGACY", "unset: cuDNN's graph (backend) API",
        "`1`: convolutions use cuDNN's legacy API instead of its graph API; another "
        "value is a warning (then `0`).",
        ("backends/cuda/cudnn.py",), ("0", "1"), invalid="warning"),
    EnvironmentVariable(
        "LAZYX_BLAS_THREADS", "`pool`",
        "Who runs the jobs of a threaded OpenBLAS call (a large product): `pool`, lazyx's "
        "native thread pool, the one its CPU kernels run on (OpenBLAS 0.3.27 and later; "
        "NumPy's products in the process too); `openblas`, OpenBLAS's own workers. Read "
        "once, when the CPU backend loads its kernels; another value is a warning (then "
        "`pool`).",
        ("backends/cpu/blas.py", "backends/cpu/blas_threads.py"), ("pool", "openblas"),
        invalid="warning"),
    EnvironmentVariable(
        "LAZYX_BLAS", "`auto`: lazyx's own OpenBLAS (the `scipy-openblas32` wheel) for large "
        "float32/float64 products on CPUs where OpenBLAS's own choice of kernels is slower "
        "(AMD Zen 4: its AVX2 kernels instead of its AVX-512 ones), NumPy's elsewhere",
        "Whose OpenBLAS runs the CPU's large float products: `auto`; `numpy`, NumPy's always; "
        "`own`, lazyx's always (with the kernels OpenBLAS picks, or `OPENBLAS_CORETYPE`'s). "
        "`LAZYX_BLAS_THREADS=openblas` means NumPy's. Read once, when the CPU backend loads "
        "its kernels; another value is a warning (then `auto`).",
        ("backends/cpu/blas.py",), ("auto", "numpy", "own"), invalid="warning"),
    EnvironmentVariable(
        "OPENBLAS_CORETYPE", "unset: lazyx's own OpenBLAS (see `LAZYX_BLAS`) loads with the "
        "kernels lazyx picks for the CPU",
        "OpenBLAS's own variable, read by OpenBLAS when it loads: the kernels it runs "
        "(`Haswell`, `SkylakeX`, ...). lazyx leaves a value the user set as it is, and sets "
        "one in the process's environment only while its own library loads.",
        ("backends/cpu/blas.py",)),
    EnvironmentVariable(
        "OPENBLAS_THREAD_TIMEOUT", "unset: lazyx's CPU backend restarts NumPy's and SciPy's "
        "OpenBLAS workers (when it sets their subnormal mode) with a spin of 2**20 cycles",
        "OpenBLAS's own variable, read by OpenBLAS: how long (2**value cycles) an idle worker "
        "spins before it sleeps. lazyx leaves a value the user set as it is, and sets none "
        "in the process's environment (its own OpenBLAS, `LAZYX_BLAS`, loads with 4: its "
        "calls run on lazyx's pool).",
        ("backends/cpu/blas.py", "backends/cpu/blas_threads.py")),
    EnvironmentVariable(
        "LAZYX_METAL", "unset: the Metal backend is on where Metal is available (Apple "
        "silicon), the GPU the default device",
        "`0`: turn the Metal backend off (everything runs on the CPU backend); `1`: on, as "
        "when unset; another value is a warning (then `0`).",
        ("backends/metal/__init__.py",), ("0", "1"), invalid="warning"),
    EnvironmentVariable(
        "LAZYX_METAL_STRICT", "unset: a primitive with no Metal kernel runs the CPU's "
        "kernel on the same (unified) memory, counted in `lazyx.backends.metal.stats`",
        "`1`: such a CPU fallback raises a `KernelNotFoundError` naming the primitive "
        "instead (`lazyx kernels --backend metal` lists the fallbacks). Read at each "
        "fallback; another value is a warning (then `0`).",
        ("backends/metal/__init__.py", "backends/metal/selftest.py"), ("0", "1"),
        invalid="warning"),
    *[EnvironmentVariable(
        name, "unset", f"{what}, as set by {who}; `lazyx.core.distributed` "
        f"reads the first pair set (`LAZYX_*`, `OMPI_COMM_WORLD_*`, `PMI_*`, then `RANK` and "
        f"`WORLD_SIZE`). A rank outside `[0, size)` is a `DistributedError`.",
        (_DIST,), number=number)
      for name, what, who, number in [
          ("LAZYX_RANK", "This process's rank", "`lazyx.launch`", "a rank (0, 1, ...)"),
          ("LAZYX_WORLD_SIZE", "The number of processes", "`lazyx.launch`", "a count"),
          ("OMPI_COMM_WORLD_RANK", "This process's rank", "Open MPI's `mpirun`",
           "a rank (0, 1, ...)"),
          ("OMPI_COMM_WORLD_SIZE", "The number of processes", "Open MPI's `mpirun`", "a count"),
          ("PMI_RANK", "This process's rank", "a PMI launcher (MPICH, Slurm)",
           "a rank (0, 1, ...)"),
          ("PMI_SIZE", "The number of processes", "a PMI launcher (MPICH, Slurm)", "a count"),
          ("RANK", "This process's rank", "`torchrun`", "a rank (0, 1, ...)"),
          ("WORLD_SIZE", "The number of processes", "`torchrun`", "a count")]],
    EnvironmentVariable(
        "LAZYX_DIST_ADDR", "unset: the `nccl` backend exchanges its id over MPI, or (one "
        "process) needs none",
        "`host:port` where rank 0 of a world started without MPI listens, so the `nccl` "
        "backend's processes exchange NCCL's unique id (set by `lazyx.launch`).",
        ("backends/distributed/nccl.py",)),
    EnvironmentVariable(
        "LAZYX_DIST_TIMEOUT", "300",
        "Seconds the `nccl` backend's processes wait for each other at the `LAZYX_DIST_ADDR` "
        "rendezvous before a `DistributedError`.",
        ("backends/distributed/nccl.py",), number="a time in seconds"),
    EnvironmentVariable(
        "LAZYX_DIST_COLLECTIVE_TIMEOUT", "1800",
        "Seconds an `mpi` collective, send or receive waits for the other processes before "
        "a `DistributedError` (a process died or left, or they called different "
        "collectives); `0`: forever. Read when a communicator starts.",
        ("backends/distributed/mpi.py",), number="a time in seconds"),
    EnvironmentVariable(
        "LAZYX_DIST_CHECK", "unset: collectives are not checked across processes",
        "`1` (or `true`, `yes`, `on`): before each collective the `mpi` backend checks that "
        "every process calls the same op with the same shape and dtype (one more small "
        "collective each: for debugging), and raises naming each rank's shape and dtype.",
        ("backends/distributed/mpi.py",), _SWITCH),
]}


def _accepted(v: EnvironmentVariable) -> str:
    """The values ``v`` accepts, in words."""
    if v.choices:
        return "one of " + ", ".join(v.choices)
    return v.number or "any text"


def _valid(v: EnvironmentVariable, text: str) -> bool:
    if v.choices is not None:
        return text.lower() in v.choices
    if v.number is not None:
        try:
            x = float(text)
        except ValueError:
            return False
        return x >= 0 and math.isfinite(x)
    return True


def read_variable(name: str, error: type[Exception] | None = None, environ=None):
    """The value of the environment variable ``name`` (a row of :data:`VARIABLES`),
    checked: None when unset or blank; a choice lower-cased; a number as a float;
    free text stripped.

    A value the row does not accept is an error (``error``, by default
    :class:`EnvironmentVariableError`) or, for a row whose ``invalid`` is
    ``"warning"``, a ``RuntimeWarning`` naming the user's line, and then None (as if
    unset). Both name the variable, the value and the accepted values.
    """
    v = VARIABLES[name]
    text = (os.environ if environ is None else environ).get(name, "").strip()
    if not text:
        return None
    if _valid(v, text):
        if v.choices is not None:
            return text.lower()
        return float(text) if v.number is not None else text
    message = f"{name}={text!r} is not accepted: set it to {_accepted(v)}, or unset it"
    if v.invalid == "warning":
        from .log import warn  # only for a bad value (start-up: logging loads on demand)
        warn(f"{message}; lazyx carries on as if it were unset.", RuntimeWarning)
        return None
    raise (error or EnvironmentVariableError)(message + ".")


def current(environ=None) -> list[dict]:
    """Each variable's current value: ``[{"name", "value", "default", "valid", "choices",
    "accepted"}]`` in the table's order; ``value`` is None when unset, ``valid`` False
    when the value is not one :func:`read_variable` accepts, ``accepted`` says in words
    what it accepts."""
    environ = os.environ if environ is None else environ
    rows = []
    for v in VARIABLES.values():
        value = environ.get(v.name)
        valid = value is None or not value.strip() or _valid(v, value.strip())
        rows.append({"name": v.name, "value": value, "default": v.default, "valid": valid,
                     "choices": list(v.choices) if v.choices else None,
                     "accepted": _accepted(v)})
    return rows


def markdown_table() -> str:
    """The table of ``docs/environment.md`` (a test checks the page holds exactly this)."""
    lines = ["| Variable | Default | What it does | Read in |", "|---|---|---|---|"]
    for v in VARIABLES.values():
        accepted = (f" Accepted: {', '.join(f'`{c}`' for c in v.choices)}." if v.choices
                    else f" Accepted: {v.number}." if v.number else "")
        where = "<br>".join(f"`{p}`" for p in v.read_in)
        lines.append(f"| `{v.name}` | {v.default} | {v.meaning}{accepted} | {where} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m lazyx.environment: print the docs' table
    print(markdown_table(), end="")
