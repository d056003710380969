"""Memory figures, as in ``mlx.core``: they come from the active backends.

On the CPU the figures are those of lazyx's own buffers: the CPU backend's
native module installs a NumPy allocation handler while kernels run, which
counts the bytes of every buffer they allocate until that buffer is freed,
and keeps freed blocks in a size-keyed cache for reuse.
"""

from __future__ import annotations

from .backend import backend_for
from .device import DeviceType

__all__ = ["get_active_memory", "get_peak_memory", "reset_peak_memory", "get_cache_memory",
           "set_memory_limit", "set_cache_limit", "clear_cache"]


def _active_backends():
    out = [backend_for(DeviceType.cpu)]
    try:
        g = backend_for(DeviceType.gpu)
        if g.is_available():
            out.append(g)
    except Exception:
        pass
    return out


def _stat(key: str) -> int:
    return sum(int(b.memory_stats().get(key, 0)) for b in _active_backends())


def get_active_memory() -> int:
    """Bytes held by live array buffers."""
    return _stat("active")


def get_peak_memory() -> int:
    """The most bytes held at once since the start or the last :func:`reset_peak_memory`."""
    return _stat("peak")


def reset_peak_memory() -> None:
    """Restart peak tracking from the current active memory."""
    for b in _active_backends():
        b.reset_peak_memory()


def get_cache_memory() -> int:
    """Bytes of freed buffers kept for reuse."""
    return _stat("cache")


def clear_cache() -> None:
    """Return cached buffers to the system."""
    for b in _active_backends():
        b.clear_cache()


def set_memory_limit(limit: int) -> int:
    """Set the memory limit in bytes (a guideline: past it the cache is released first).

    Returns the previous limit.
    """
    if limit < 0:
        raise ValueError(f"The memory limit must be >= 0, got {limit}.")
    return backend_for(DeviceType.cpu).set_memory_limit(int(limit))


def set_cache_limit(limit: int) -> int:
    """Set the most bytes the buffer cache keeps. Returns the previous limit."""
    if limit < 0:
        raise ValueError(f"The cache limit must be >= 0, got {limit}.")
    return backend_for(DeviceType.cpu).set_cache_limit(int(limit))
