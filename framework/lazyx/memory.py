"""Memory figures, as in ``mlx.core``: they come from the active backends.

On the CPU the figures are those of lazyx's own buffers, counted as MLX counts
them: the CPU backend's native module installs a NumPy allocation handler while
kernels run and arrays are built, which counts the bytes asked for every buffer
until that buffer is freed, and keeps freed blocks in a size-keyed cache for reuse
(a request takes a cached block under twice its size and counts that block's
size). Kernel modules load under NumPy's own handler, so with no array alive the
active memory is 0. lazyx's cached Python-scalar constants are not counted.

The memory limit is a guideline, as in MLX: past it the cache is released first and
allocation goes on. A single buffer larger than both the limit and the machine's
physical memory can never be served, so it is refused with an
:class:`~lazyx.errors.OutOfMemoryError` naming the op, the shape, the dtype, the bytes
asked and the limit: at the call for the creation ops (:func:`check_allocation`, one
multiplication), and at evaluation for any kernel whose allocation fails (the scheduler
turns its ``MemoryError`` into the same error through :func:`out_of_memory`).
"""

from __future__ import annotations

import math
import os

from .backend import backend_for
from .device import DeviceType
from .errors import OutOfMemoryError

__all__ = ["get_active_memory", "get_peak_memory", "reset_peak_memory", "get_cache_memory",
           "set_memory_limit", "set_cache_limit", "clear_cache", "memory_limit", "physical_memory",
           "check_allocation", "out_of_memory"]


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
    """Set the peak memory to 0 (as MLX does); it grows again from the next allocation."""
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


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - no sysconf
        return 1 << 34


_PHYSICAL = _physical_memory()


def physical_memory() -> int:
    """Bytes of physical memory of this machine."""
    return _PHYSICAL


def memory_limit() -> int | None:
    """The CPU backend's memory limit in bytes (None when its backend sets none)."""
    b = backend_for(DeviceType.cpu)
    get = getattr(getattr(b, "native", None), "get_memory_limit", None)
    return int(get()) if get is not None else None


def _format_bytes(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit} ({n} bytes)"
    return f"{n} bytes"


def out_of_memory(op: str, shape: tuple, dtype, detail: str = "") -> OutOfMemoryError:
    """The error for an array of ``shape`` and ``dtype`` that ``op`` cannot allocate."""
    asked = math.prod(shape) * dtype.size
    limit = memory_limit()
    limit_text = "" if limit is None else f"the memory limit is {_format_bytes(limit)}, "
    detail = f" ({detail})" if detail else ""
    return OutOfMemoryError(
        f"[{op}] Cannot allocate an array of shape {tuple(shape)} and dtype {dtype.name}: it "
        f"needs {_format_bytes(asked)}; {limit_text}the machine has "
        f"{_format_bytes(_PHYSICAL)}{detail}. Use a smaller shape or a narrower dtype.")


def check_allocation(shape: tuple, dtype, op: str) -> None:
    """Raise :class:`OutOfMemoryError` at the call when one array of ``shape`` and
    ``dtype`` could never be allocated: more bytes than both the memory limit and the
    machine's memory (the limit alone is a guideline), or more than a pointer addresses."""
    asked = math.prod(shape) * dtype.size
    if asked > _PHYSICAL and (asked >= 1 << 63 or asked > (memory_limit() or 0)):
        raise out_of_memory(op, shape, dtype)
