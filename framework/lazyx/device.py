"""Devices and streams.

A :class:`Device` names a kind of processor (``cpu`` or ``gpu``) and an index.
A :class:`Stream` is an ordered queue of work on one device; every primitive
records the stream it runs on. Kernels run on the calling thread, so streams
order work but do not add threads (see DESIGN.md: a thread hand-off per
evaluation costs more than most small kernels). As in MLX, the default device and
the default stream of each device belong to the calling thread: a new thread gets
default streams of its own (made on first use), and ``set_default_stream`` /
``with stream(s)`` change only the calling thread's.
"""

from __future__ import annotations

import platform
import threading

from .backend import backend_for
from .device_types import Device, DeviceType, Stream
from .environment import read_variable
from .errors import BackendError, DeviceError, DtypeError

__all__ = [
    "DeviceType", "Device", "Stream", "cpu", "gpu", "default_device",
    "set_default_device", "default_stream", "set_default_stream", "new_stream",
    "stream", "to_stream", "synchronize", "is_available", "StreamContext", "ThreadLocalStream",
    "new_thread_local_stream", "new_thread_unsafe_stream", "clear_streams", "device_count",
    "device_info", "set_wired_limit",
]


cpu = DeviceType.cpu
gpu = DeviceType.gpu

_CPU = Device(DeviceType.cpu, 0)
_GPU = Device(DeviceType.gpu, 0)
_streams: list[Stream] = []          # every stream made, in index order
_streams_lock = threading.Lock()     # threads may make streams at once


_initial = _CPU  # the default device of new threads (see choose_default_device)


class _State(threading.local):
    """One thread's default device and default streams.

    As in MLX, each thread has a default stream per device of its own, made (with the
    next free index) the first time the thread asks for it; ``set_default_stream`` and
    ``with stream(s)`` change only the calling thread's. ``stream`` (the default
    device's default stream, read by every op through :func:`to_stream`) is None until
    the thread first asks for it. (No ``__getattr__`` here: on a ``threading.local``
    subclass it would slow down every attribute read, ~100 ns per op.)
    """

    def __init__(self):
        self.device = _initial
        self.defaults: dict[Device, Stream] = {}
        self.stream = None


def current_stream() -> Stream:
    """This thread's current default stream (made the first time the thread asks)."""
    s = _state.stream
    if s is None:
        s = _state.stream = default_stream(_state.device)
    return s


_state = _State()
#: The calling thread's state (``thread_state.stream``: its current default stream, or
#: None until first asked): op functions on the hot path read it inline, as
#: ``thread_state.stream or current_stream()``, instead of calling :func:`to_stream`.
thread_state = _state


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
    env = read_variable("LAZYX_DEFAULT_DEVICE", DeviceError)  # checked: cpu or gpu
    if env:
        d = _CPU if env == "cpu" else _GPU
        _check_available(d)
    else:
        d = _GPU if is_available(_GPU) else _CPU
    _initial = d
    _state.device = d
    _state.stream = None  # made on first use, on d
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


def _make_stream(d: Device) -> Stream:
    with _streams_lock:
        s = Stream(len(_streams), d)
        _streams.append(s)
    return s


def default_stream(device) -> Stream:
    """This thread's default stream of ``device`` (a new stream the first time a
    thread asks, as in MLX)."""
    d = _as_device(device)
    s = _state.defaults.get(d)
    if s is None:
        s = _state.defaults[d] = _make_stream(d)
    return s


def set_default_stream(s: Stream) -> None:
    """Make ``s`` this thread's default stream of its device, and that device the
    default device. Other threads keep theirs."""
    if not isinstance(s, Stream):
        raise DeviceError(f"Expected a Stream, got {s!r}.")
    _state.defaults[s.device] = s
    _state.device = s.device
    _state.stream = s


def new_stream(device) -> Stream:
    """A new stream on ``device``."""
    d = _as_device(device)
    _check_available(d)
    return _make_stream(d)


class StreamContext:
    """A context manager for setting the current device and stream.

    ``with StreamContext(s):`` runs the enclosed operations on ``s`` (a Stream, a
    ThreadLocalStream, a Device or a DeviceType; None changes nothing) and then
    restores this thread's previous default stream. See :func:`stream`.
    """

    __slots__ = ("target", "_saved")

    def __init__(self, s):
        if s is not None and not isinstance(s, (Stream, ThreadLocalStream, Device, DeviceType)):
            to_stream(s)  # raises the DeviceError that names the accepted kinds
        self.target = s
        self._saved = None

    def __enter__(self):
        if self.target is None:
            return None
        # As MLX: save this thread's defaults first (making them if new), then resolve
        # the target (a device means this thread's default stream of it) and make it
        # the default stream of its device until exit.
        saved_stream = current_stream()
        s = to_stream(self.target)
        self._saved = (_state.device, saved_stream, s.device, _state.defaults.get(s.device))
        set_default_stream(s)
        return s

    def __exit__(self, *exc):
        if self._saved is not None:
            device, stream, target_device, target_default = self._saved
            if target_default is None:
                _state.defaults.pop(target_device, None)
            else:
                _state.defaults[target_device] = target_default
            _state.device, _state.stream = device, stream
            self._saved = None
        return False


def stream(s) -> StreamContext:
    """Run the enclosed operations on stream or device ``s``.

    Example:
        >>> with lazyx.core.stream(lazyx.core.cpu):
        ...     y = x + 1
    """
    return StreamContext(s)


def to_stream(s) -> Stream:
    """Resolve an op's ``stream=`` argument (None, a Stream, a Device or a DeviceType)."""
    if s is None:
        st = _state.stream
        return st if st is not None else current_stream()
    if type(s) is Stream:
        return s
    if isinstance(s, (Device, DeviceType)):
        d = _as_device(s)
        _check_available(d)
        return default_stream(d)
    if type(s) is ThreadLocalStream:
        return s.stream()
    raise DeviceError(f"stream= must be None, a Stream, a ThreadLocalStream or a Device, "
                      f"got {s!r}.")


def synchronize(s=None) -> None:
    """Wait for the work queued on stream ``s`` (all streams when None)."""
    streams = _streams if s is None else [to_stream(s)]
    for st in streams:
        try:
            backend = backend_for(st.device.type)
        except BackendError:  # a stream of a device whose backend is gone: nothing queued
            if st.device.type is DeviceType.cpu:
                raise
            continue
        # An error the backend reports here (a GPU index check queued by a kernel) is
        # the caller's: it propagates.
        backend.synchronize(st)


# -- MLX's thread and device queries --------------------------------------------------
class ThreadLocalStream:
    """A stream that will be unique per thread and can be used to run operations on a
    given device: each thread that uses it gets a stream of its own (created on first
    use), so work queued from different threads is never ordered against each other."""

    __slots__ = ("device", "index", "_local")
    _count = 0  # MLX numbers thread-local streams on their own counter

    def __init__(self, device):
        self.device = _as_device(device)
        with _streams_lock:
            self.index = ThreadLocalStream._count
            ThreadLocalStream._count += 1
        self._local = threading.local()

    def stream(self) -> Stream:
        """This thread's stream."""
        s = getattr(self._local, "stream", None)
        if s is None:
            s = self._local.stream = new_stream(self.device)
        return s

    def __repr__(self) -> str:
        return f"ThreadLocalStream({self.device!r}, {self.index})"


def new_thread_local_stream(device) -> ThreadLocalStream:
    """Make a new stream that will be unique per thread."""
    d = _as_device(device)
    _check_available(d)
    return ThreadLocalStream(d)


def new_thread_unsafe_stream(device) -> Stream:
    """Make a new stream that can be used in any thread.

    lazyx's streams already can (kernels run on the calling thread), so this is
    :func:`new_stream`; ordering work from several threads is the caller's task.
    """
    return new_stream(device)


def clear_streams() -> None:
    """Destroy all streams created in current thread.

    lazyx's streams hold no threads or queues (kernels run on the calling thread), so
    this waits for the work queued on them; as in MLX, this thread's default streams
    stay what they were.
    """
    synchronize()


def device_count(device_type) -> int:
    """Get the number of available devices for the given device type (cpu or gpu)."""
    if not isinstance(device_type, DeviceType):
        raise DeviceError(f"[device_count] Expected a DeviceType (cpu or gpu), got "
                          f"{device_type!r}.")
    if device_type is DeviceType.cpu:
        return 1
    if not is_available(_GPU):
        return 0
    count = getattr(backend_for(DeviceType.gpu), "device_count", None)
    return count() if callable(count) else 1


def device_info(d=None) -> dict:
    """Get information about a device (the default device when ``d`` is None).

    Keys depend on the backend: the CPU gives ``device_name`` and ``architecture``;
    a GPU backend adds what it knows (``total_memory`` ...). An unavailable device
    gives an empty dict, as in MLX.
    """
    dev = _state.device if d is None else _as_device(d)
    if dev.type is DeviceType.cpu:
        return {"architecture": platform.machine(), "device_name": _cpu_name()}
    if not is_available(dev):
        return {}
    info = getattr(backend_for(dev.type), "device_info", None)
    return dict(info()) if callable(info) else {}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def set_wired_limit(limit: int) -> int:
    """Set the wired size limit (the memory kept resident for the GPU on Apple silicon).

    Only Metal on macOS 15 wires memory; no backend lazyx runs here does, so the limit
    is accepted and, as MLX on such machines, the previous limit returned is ``0``.

    Args:
        limit (int): The wired limit in bytes.

    Returns:
        int: The previous wired limit in bytes.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        # A TypeError, as MLX's binding raises for anything but a size_t.
        raise DtypeError(f"[set_wired_limit] limit must be a non-negative int (bytes), "
                         f"got {limit!r}.")
    return 0
