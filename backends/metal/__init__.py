"""The Metal backend (Apple GPUs), and Metal kernels for primitives.

A primitive gets a Metal kernel from MSL source with :class:`MetalKernel`,
registered for ``("metal", PrimitiveClass)`` through the ``lazyx_kernels`` hook.
The backend is available only on macOS with Apple silicon and PyObjC's Metal
bindings (``pip install pyobjc-framework-Metal``); elsewhere it says why. Its
kernels are checked anywhere with a C++ compiler by running their MSL through
lazyx's C++ shim: :func:`run_msl_on_cpu`.

The backend has no kernels of its own yet: only those plugins register run on it.
"""

from __future__ import annotations

import os

from lazyx.backend import Backend
from lazyx.device import DeviceType
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
            if ok and os.environ.get("LAZYX_METAL", "") != "1":
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


@hookimpl
def lazyx_backends():
    return [MetalBackend()]
