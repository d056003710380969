"""The Metal backend (Apple GPUs), and Metal kernels for primitives.

A primitive gets a Metal kernel from MSL source with :class:`MetalKernel`,
registered for ``("metal", PrimitiveClass)`` through the ``lazyx_kernels`` hook.
The backend is available only on macOS with Apple silicon and PyObjC's Metal
bindings (``pip install pyobjc-framework-Metal``); elsewhere it says why. Its
kernels are checked anywhere with a C++ compiler by running their MSL through
lazyx's C++ shim: :func:`run_msl_on_cpu`.

The backend has no kernels of its own yet: only those plugins register run on it.

It also answers MLX's ``mx.metal`` namespace (``lazyx.core.metal.is_available()``,
the deprecated memory aliases, captures) through its ``lazyx_ops`` hook, so the
answers come from the backend that would run the work.
"""

from __future__ import annotations

import warnings

from lazyx import device as lazyx_device
from lazyx import memory
from lazyx.backend import Backend
from lazyx.device import DeviceType
from lazyx.environment import read_variable
from lazyx.errors import BackendError, DtypeError
from lazyx.hookspecs import hookimpl

from .kernel import MetalKernel
from .runtime import availability

__all__ = ["MetalBackend", "MetalKernel", "MSLShimError", "run_msl_on_cpu", "shim_available",
           "is_available", "unavailable_reason"]


def __getattr__(name):
    # The CPU shim (and with it the C++ toolchain) loads when first used: a plugin that
    # only declares Metal kernels does not pay for it at import.
    if name in ("MSLShimError", "run_msl_on_cpu", "shim_available"):
        from . import msl_cpu  # start-up: see above
        return getattr(msl_cpu, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_available() -> bool:
    """Whether this machine can run Metal kernels (macOS, Apple silicon, PyObjC's Metal)."""
    return availability()[0]


def unavailable_reason() -> str:
    """Why :func:`is_available` is False, in words (empty when it is True)."""
    return availability()[1]


class MetalBackend(Backend):
    """Apple GPUs through Metal. Buffers are NumPy arrays (unified memory); each kernel
    is a :class:`MetalKernel` a plugin registered (the GPU path is untested: see
    :mod:`lazyx.backends.metal.runtime`)."""

    name = "metal"
    device_type = DeviceType.gpu

    def __init__(self):
        super().__init__()
        self._availability = None

    def _check(self) -> tuple[bool, str]:
        if self._availability is None:
            ok, why = availability()
            if ok and read_variable("LAZYX_METAL") != "1":
                # Only plugins' MSL kernels exist so far, so the GPU would fail on most
                # ops: the backend (and with it the GPU as default device) is opt-in.
                ok, why = False, ("the Metal backend runs plugin-registered MSL kernels only "
                                  "(no built-in kernels yet); set LAZYX_METAL=1 to use it.")
            self._availability = (ok, why)
        return self._availability

    def is_available(self) -> bool:
        return self._check()[0]

    def unavailable_reason(self) -> str:
        return self._check()[1]

    def describe(self) -> str:
        return "MSL kernels from plugins; checked on the CPU through lazyx's C++ shim"


_BACKEND = MetalBackend()


@hookimpl
def lazyx_backends():
    return [_BACKEND]


# -- lazyx.core.metal: MLX's ``mx.metal`` namespace, answered by this backend ----------
def _metal_is_available() -> bool:
    """Check if the Metal back-end is available (here: whether lazyx runs on it)."""
    return _BACKEND.is_available()


def _metal_device_info() -> dict:
    """Information about the GPU device and system settings (an empty dict where Metal is
    unavailable, as in MLX). Deprecated in MLX: use ``lazyx.core.device_info``."""
    _deprecated("device_info")
    return lazyx_device.device_info(lazyx_device.gpu) if _BACKEND.is_available() else {}


def _deprecated(name: str) -> None:
    warnings.warn(f"lazyx.core.metal.{name} is deprecated (as in MLX 0.32) and will be "
                  f"removed in a future version. Use lazyx.core.{name} instead.",
                  DeprecationWarning, stacklevel=3)


def _alias(fn):
    """MLX's deprecated ``mx.metal.<name>``: the core function, with a warning."""
    def alias(*args, **kwargs):
        _deprecated(fn.__name__)
        return fn(*args, **kwargs)
    alias.__name__ = alias.__qualname__ = fn.__name__
    alias.__doc__ = fn.__doc__
    return alias


def _start_capture(path: str) -> None:
    """Start a Metal capture (an Xcode ``.gputrace`` of the GPU work that follows).

    Where Metal is unavailable there is nothing to capture and, as in MLX, nothing
    happens; where it is available lazyx's Metal backend cannot capture yet.
    """
    if not isinstance(path, str):
        raise DtypeError(f"[metal.start_capture] path must be a str, got {path!r}.")
    if _BACKEND.is_available():
        raise BackendError("[metal.start_capture] GPU captures are not implemented by lazyx's "
                           "Metal backend yet; use Xcode's Metal debugger on the process.")


def _stop_capture() -> None:
    """Stop a Metal capture (nothing to stop where none could start)."""


@hookimpl
def lazyx_ops():
    ops = {"metal.is_available": _metal_is_available, "metal.device_info": _metal_device_info,
           "metal.start_capture": _start_capture, "metal.stop_capture": _stop_capture}
    for fn in (memory.get_active_memory, memory.get_peak_memory, memory.reset_peak_memory,
               memory.get_cache_memory, memory.clear_cache, memory.set_memory_limit,
               memory.set_cache_limit, lazyx_device.set_wired_limit):
        ops["metal." + fn.__name__] = _alias(fn)
    return ops
