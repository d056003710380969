"""Every environment variable lazyx reads, as data.

Each place that reads a variable reads it itself (once, where it is needed: at import,
at the first compile, when the default device is chosen), so the hot path never looks
here. This table is what the rest of lazyx says *about* those reads:

* ``lazyx info --env`` lists every variable with its current value
  (:func:`current`), and flags a value outside the accepted ones;
* ``docs/environment.md`` holds :func:`markdown_table` verbatim;
* ``tests/test_environment_variables.py`` parses every source file of
  ``framework/``, ``backends/`` and ``plugins/`` for environment reads and fails when
  one reads a variable missing here, or when ``read_in`` does not name exactly the
  files that read it. So a new variable cannot go undocumented.
"""

from __future__ import annotations

import os
from typing import NamedTuple

__all__ = ["EnvironmentVariable", "VARIABLES", "current", "markdown_table"]


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


_BACKEND = "framework/lazyx/backend.py"
_JIT = "framework/lazyx/codegen/jit.py"
_REGISTRY = "framework/lazyx/registry.py"

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
        "`1` (any value but empty, `0`, `false`, `no`, `off`): functions made by "
        "`lazyx.core.compile` just call the function, as after `disable_compile()`.",
        ("framework/lazyx/transforms/compile.py",)),
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
        (_JIT,)),
    EnvironmentVariable(
        "LAZYX_LOG", "unset: only long work (a C++ build) prints one `lazyx: ...` line, "
        "unless the application configured `logging`",
        "Attaches a stderr handler at this level to the `lazyx` logger when `lazyx` is "
        "imported: `info` shows what is built and when, `debug` each build and its time, "
        "`warning` silences the build line. Any other value is a warning naming these.",
        ("framework/lazyx/__init__.py", "framework/lazyx/log.py"), ("debug", "info", "warning")),
    EnvironmentVariable(
        "CXX", "the first of the usual C++ compilers found on `PATH`",
        "The C++ compiler (with flags, e.g. `g++ -DLAZYX_SOFT_HALF`) for compiled "
        "kernels. When set and not working, no other compiler is tried.",
        (_JIT,)),
    EnvironmentVariable(
        "LAZYX_CPU_ELEMENTWISE", "1",
        "`0`: single element-wise ops on large CPU arrays always run NumPy, never a "
        "generated kernel. Read once, at import.",
        ("backends/cpu/compiled.py",), ("0", "1")),
    EnvironmentVariable(
        "LAZYX_CUDA_ELEMENTWISE", "1",
        "`0`: single element-wise ops on the GPU run CuPy's kernels, never a generated "
        "one. Read once, at import.",
        ("backends/cuda/compiled.py",), ("0", "1")),
    EnvironmentVariable(
        "LAZYX_CUDNN_LEGACY", "unset: cuDNN's graph (backend) API",
        "`1`: convolutions use cuDNN's legacy API instead of its graph API.",
        ("backends/cuda/cudnn.py",), ("0", "1")),
    EnvironmentVariable(
        "LAZYX_METAL", "unset: the Metal backend is off",
        "`1`: enable the Metal backend on a Mac (it runs plugins' MSL kernels only, so "
        "it is opt-in).",
        ("backends/metal/__init__.py",), ("0", "1")),
]}


def current(environ=None) -> list[dict]:
    """Each variable's current value: ``[{"name", "value", "default", "valid"}]`` in the
    table's order; ``value`` is None when unset, ``valid`` False when the variable is a
    choice and the value is not one of ``choices``."""
    environ = os.environ if environ is None else environ
    rows = []
    for v in VARIABLES.values():
        value = environ.get(v.name)
        valid = (value is None or value == "" or v.choices is None
                 or value.strip().lower() in v.choices)
        rows.append({"name": v.name, "value": value, "default": v.default, "valid": valid,
                     "choices": list(v.choices) if v.choices else None})
    return rows


def markdown_table() -> str:
    """The table of ``docs/environment.md`` (a test checks the page holds exactly this)."""
    lines = ["| Variable | Default | What it does | Read in |", "|---|---|---|---|"]
    for v in VARIABLES.values():
        accepted = f" Accepted: {', '.join(f'`{c}`' for c in v.choices)}." if v.choices else ""
        where = "<br>".join(f"`{p}`" for p in v.read_in)
        lines.append(f"| `{v.name}` | {v.default} | {v.meaning}{accepted} | {where} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m lazyx.environment: print the docs' table
    print(markdown_table(), end="")
