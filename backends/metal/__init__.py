"""The Metal backend (Apple GPUs). Available only on macOS with Apple silicon."""

from __future__ import annotations

import platform
import sys

from lazyx.backend import Backend
from lazyx.device import DeviceType
from lazyx.hookspecs import hookimpl


def is_available() -> bool:
    """Whether this machine can run Metal kernels."""
    return sys.platform == "darwin" and platform.machine() == "arm64"


def unavailable_reason() -> str:
    if sys.platform != "darwin":
        return f"Metal needs macOS on Apple silicon; this is {sys.platform} on {platform.machine()}."
    if platform.machine() != "arm64":
        return f"Metal needs Apple silicon; this Mac is {platform.machine()}."
    return "the Metal kernels are not built yet."


class MetalBackend(Backend):
    name = "metal"
    device_type = DeviceType.gpu

    def is_available(self) -> bool:
        # No Metal kernels exist yet, so even a Mac reports the reason instead.
        return False

    def unavailable_reason(self) -> str:
        return unavailable_reason()


@hookimpl
def lazyx_backends():
    return [MetalBackend()]
