"""Devices and streams.

A :class:`Device` names a kind of processor (``cpu`` or ``gpu``) and an index.
A :class:`Stream` is an ordered queue of work on one device; every primitive
records the stream it runs on. Kernels run on the calling thread, so streams
order work but do not add threads (see DESIGN.md: a thread hand-off per
evaluation costs more than most small kernels).
"""

from __future__ import annotations

import contextlib
import os
import threading

from .backend import backend_for
from .device_types import Device, DeviceType, Stream
from .errors import DeviceError

__all__ = [
    "DeviceType", "Device", "Stream", "cpu", "gpu", "default_device",
    "set_default_device", "default_stream", "set_default_stream", "new_stream",
    "stream", "to_stream", "synchronize", "is_available",
]


cpu = DeviceType.cpu
gpu = DeviceType.gpu

_CPU = Device(DeviceType.cpu, 0)
_GPU = Device(DeviceType.gpu, 0)
_streams: list[Stream] = [Stream(0, _CPU)]
_default_streams: dict[Device, Stream] = {_CPU: _streams[0]}


_initial = _CPU  # the default device of new threads (see choose_default_device)


class _State(threading.local):
    def __init__(self):
        self.device = _initial
        self.stream = _default_streams.get(_initial) or _streams[0]


_state = _State()


def _as_device(d) -> Device:
    if isinstance(d, Device):
        return d
    if isinstance(d, DeviceType):
        return _CPU if d is DeviceType.cpu else _GPU
    raise DeviceError(f"Expected a Device or DeviceType, got {d!r}.")


def is_available(device) -> bool:
    """Whether an active backend can run work on ``device``."""
    d = _as_device(device)
    try:
        return backend_for(d.type).is_available()
    except Exception:
        return False


def _check_available(d: Device) -> None:
    if d.type is DeviceType.cpu:
        return
    b = backend_for(d.type)
    if not b.is_available():
        raise DeviceError(f"Device {d!r} is not available: backend {b.name!r} says "
                          f"{b.unavailable_reason()}")


def choose_default_device() -> Device:
    """Pick the default device once the backends are registered (``lazyx.core`` calls
    it on import): ``LAZYX_DEFAULT_DEVICE`` (``cpu`` or ``gpu``) if set, else the GPU
    when an available backend runs it (as MLX defaults to the GPU), else the CPU."""
    global _initial
    env = os.environ.get("LAZYX_DEFAULT_DEVICE", "").strip().lower()
    if env:
        if env not in ("cpu", "gpu"):
            raise DeviceError(f"LAZYX_DEFAULT_DEVICE must be 'cpu' or 'gpu', got {env!r}.")
        d = _CPU if env == "cpu" else _GPU
        _check_available(d)
    else:
        d = _GPU if is_available(_GPU) else _CPU
    _initial = d
    _state.device = d
    _state.stream = default_stream(d)
    return d


def default_device() -> Device:
    """The device operations run on when no ``stream`` is given."""
    return _state.device


def set_default_device(device) -> None:
    """Make ``device`` (a Device or DeviceType) the default for this thread."""
    d = _as_device(device)
    _check_available(d)
    _state.device = d
    _state.stream = default_stream(d)


def default_stream(device) -> Stream:
    """The default stream of ``device``."""
    d = _as_device(device)
    s = _default_streams.get(d)
    if s is None:
        s = Stream(len(_streams), d)
        _streams.append(s)
        _default_streams[d] = s
    return s


def set_default_stream(s: Stream) -> None:
    """Make ``s`` the default stream (and its device the default device)."""
    if not isinstance(s, Stream):
        raise DeviceError(f"Expected a Stream, got {s!r}.")
    _state.device = s.device
    _state.stream = s


def new_stream(device) -> Stream:
    """A new stream on ``device``."""
    d = _as_device(device)
    _check_available(d)
    s = Stream(len(_streams), d)
    _streams.append(s)
    return s


@contextlib.contextmanager
def stream(s):
    """Run the enclosed operations on stream or device ``s``.

    Example:
        >>> with lazyx.core.stream(lazyx.core.cpu):
        ...     y = x + 1
    """
    if s is None:
        yield
        return
    target = to_stream(s)
    old_d, old_s = _state.device, _state.stream
    _state.device, _state.stream = target.device, target
    try:
        yield target
    finally:
        _state.device, _state.stream = old_d, old_s


def to_stream(s) -> Stream:
    """Resolve an op's ``stream=`` argument (None, a Stream, a Device or a DeviceType)."""
    if s is None:
        return _state.stream
    if type(s) is Stream:
        return s
    if isinstance(s, (Device, DeviceType)):
        d = _as_device(s)
        _check_available(d)
        return default_stream(d)
    raise DeviceError(f"stream= must be None, a Stream or a Device, got {s!r}.")


def synchronize(s=None) -> None:
    """Wait for the work queued on stream ``s`` (all streams when None)."""
    streams = _streams if s is None else [to_stream(s)]
    for st in streams:
        try:
            backend_for(st.device.type).synchronize(st)
        except Exception:
            if st.device.type is DeviceType.cpu:
                raise
