"""Backends and kernel dispatch.

A :class:`Backend` implements one device type. Several may exist for one type
(``cpu`` and the NumPy-only ``cpu-reference``); one is active per type, chosen
by ``LAZYX_CPU_BACKEND`` / ``LAZYX_GPU_BACKEND``, by :func:`use_backend`, or by
a test fixture.

The kernel for a node comes from the active backend's dispatch table, which
is resolved once per primitive class and cached:

1. a kernel a plugin registered for (backend, primitive class) through the
   ``lazyx_kernels`` hook (for that exact class; two plugins overriding the same
   pair make it an error naming both);
2. the backend's own kernel, :meth:`Backend.find_kernel` (by default its
   ``kernels`` table: the primitive's class or a base class);
3. the primitive's own ``eval_cpu`` / ``eval_gpu`` if it overrides it;
4. otherwise a kernel that raises :class:`KernelNotFoundError` naming the
   primitive, the device and the backend. Never a silent fallback.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from .device_types import Device, DeviceType
from .errors import BackendError, KernelNotFoundError
from .primitive import Primitive
from .providers import kernel_conflicts, kernel_overrides, primitives

__all__ = ["Backend", "use_backend", "active_backend", "backend_for", "backends",
           "register_backend", "kernel_provider", "primitive_class"]


class Backend:
    """Base class of backends. Subclass it, give it a ``name`` and a ``device_type``,
    fill ``kernels`` (or override :meth:`load_kernels`) and return an instance from a
    plugin's ``lazyx_backends`` hook.

    Attributes:
        name: unique name (``"cpu"``, ``"cuda"``).
        device_type: the :class:`DeviceType` it runs.
        kernels: ``{primitive_class: kernel}``; ``kernel(primitive, inputs)``
            takes input buffers and returns a buffer or a tuple of buffers. Filled by
            :meth:`load_kernels` the first time it is read, so that registering a
            backend (every ``import lazyx.core``) does not import its kernel modules.

    A kernel that is one NumPy ufunc call for small inputs may say so with two
    attributes, ``kernel.small_ufunc`` (the ufunc) and ``kernel.small_limit`` (an
    int): for inputs that are all NumPy arrays of fewer than ``small_limit``
    elements, the scheduler's native loop then calls ``small_ufunc(*inputs)``
    itself, without the kernel's Python frame (the per-op cost of a small op).

    Two more attributes the scheduler's native loop reads: ``kernel.donates`` (True: the
    kernel takes a third argument, the positions of the inputs nothing but this node
    reads any more, whose buffers it may write its output into; the protocol of
    compile's plans) and ``kernel.device_outputs`` (True: it returns a device buffer with
    ``shape`` and ``dtype`` attributes, which the loop stores itself when they are the
    promised ones). The CUDA backend's native launcher declares both.
    """

    name: str = "backend"
    device_type: DeviceType = DeviceType.cpu

    def __init__(self):
        pass

    @functools.cached_property
    def kernels(self) -> dict:
        return self.load_kernels()

    def load_kernels(self) -> dict:
        """The backend's kernel table, built the first time :attr:`kernels` is read.
        Override it to import heavy kernel modules on first use."""
        return {}

    def find_kernel(self, cls: type):
        """This backend's kernel for primitive class ``cls``, or None if it has none.

        The default looks ``cls`` and then its base classes up in ``kernels``. It
        is called once per primitive class (the result is cached until a backend
        or a plugin's kernels change), so a backend may override it to make
        kernels on demand: wrap another backend's, compile one, and so on. A kernel
        with a ``provider`` attribute (a string) is reported by it instead of
        ``"backend '<name>'"`` (``lazyx kernels``, :func:`kernel_provider`).
        """
        kernels = self.kernels
        for klass in cls.__mro__:
            fn = kernels.get(klass)
            if fn is not None:
                return fn
        return None

    def prepare_kernel(self, fn):
        """The kernel the scheduler calls for ``fn`` (whatever provided it: this
        backend, a plugin's override, a primitive's own ``eval_*``).

        Arrays belong to no device, so a kernel may be handed buffers of another
        backend (a CPU node consuming a GPU result). The default, for CPU
        backends, wraps ``fn`` to copy such inputs to the host when a device
        backend is available on this machine, and returns ``fn`` unchanged
        otherwise (no cost on machines without one). A device backend
        overrides it to copy host inputs to the device.
        """
        if self.device_type is not DeviceType.cpu or not _device_backend_available():
            return fn

        fences = host_fences
        if getattr(fn, "donates", False):
            # A compiled plan passes donors only to kernels that take them (transforms.compile);
            # a host copy made here owns its memory, so donating it is as safe as the original.
            def kernel(prim, inputs, donors=()):
                if fences:
                    host_fence()
                for i, x in enumerate(inputs):
                    if type(x) is not np.ndarray:
                        inputs[i] = to_host(x)
                return fn(prim, inputs, donors)
            kernel.donates = True
        else:
            def kernel(prim, inputs):
                if fences:  # device work writing memory the host reads directly (Metal)
                    host_fence()
                for i, x in enumerate(inputs):
                    if type(x) is not np.ndarray:
                        inputs[i] = to_host(x)
                return fn(prim, inputs)
        kernel.__wrapped__ = fn
        return kernel

    def is_available(self) -> bool:
        """Whether this backend can run on this machine."""
        return True

    def unavailable_reason(self) -> str:
        """Why :meth:`is_available` is False, in words."""
        return ""

    def describe(self) -> str:
        """A line about this backend's build for ``lazyx info`` (empty: nothing to add)."""
        return ""

    def enter_eval(self):
        """Called before an evaluation runs kernels; the result goes to exit_eval."""
        return None

    def exit_eval(self, token) -> None:
        """Called after an evaluation, with what enter_eval returned."""

    def is_buffer(self, obj) -> bool:
        """Whether ``obj`` is a buffer of this backend. The answer must depend on the
        object's type alone: lazyx remembers the types a backend accepted (until the
        backends change)."""
        return type(obj) is np.ndarray

    def to_host(self, buf) -> np.ndarray:
        """Copy a buffer to a host NumPy array."""
        return np.asarray(buf)

    def from_host(self, data: np.ndarray):
        """A buffer of this backend holding ``data``."""
        return data

    def synchronize(self, stream) -> None:
        """Wait for the work queued on ``stream``."""

    def memory_stats(self) -> dict:
        """``{"active": bytes, "peak": bytes, "cache": bytes}``."""
        return {"active": 0, "peak": 0, "cache": 0}

    def reset_peak_memory(self) -> None:
        pass

    def clear_cache(self) -> None:
        pass

    def set_memory_limit(self, limit: int) -> int:
        raise BackendError(f"Backend {self.name!r} does not manage memory limits.")

    def set_cache_limit(self, limit: int) -> int:
        raise BackendError(f"Backend {self.name!r} does not manage a buffer cache.")

    def set_flush_denormal(self, on: bool) -> bool:
        """Flush subnormal numbers to zero in this backend's kernels from the next
        evaluation on (or compute them as IEEE 754 says); returns whether the backend
        can (when not, nothing changes)."""
        return False

    def get_flush_denormal(self) -> bool:
        """Whether this backend's kernels flush subnormal numbers to zero."""
        return False

    def __repr__(self) -> str:
        return f"<Backend {self.name!r} ({self.device_type.name})>"


_backends: dict[str, Backend] = {}
_backend_plugins: dict[str, object] = {}
_active: dict[DeviceType, Backend] = {}
_tables: tuple | None = None


class _KernelTable(dict):
    """primitive class -> kernel for one backend, resolved on first use."""

    def __init__(self, backend: Backend):
        super().__init__()
        self.backend = backend

    def __missing__(self, cls):
        fn = resolve_kernel(self.backend, cls)[0]
        if not getattr(fn, "missing", False):
            fn = self.backend.prepare_kernel(fn)
        self[cls] = fn
        return fn


def resolve_kernel(backend: Backend, cls: type) -> tuple[object, str]:
    """The kernel ``backend`` runs for primitive class ``cls``, and who provides it."""
    key = (backend.name, cls)
    if key in kernel_overrides:
        fn, info = kernel_overrides[key]
        return fn, info.label
    if key in kernel_conflicts:
        names = " and ".join(i.label for i in kernel_conflicts[key])
        return _raiser(KernelNotFoundError(
            f"{cls.name} on backend {backend.name!r} is overridden by both {names}; "
            f"uninstall one of them.")), "conflict"
    fn = backend.find_kernel(cls)
    if fn is not None:
        # A backend may label a kernel it makes (the Metal backend's "CPU fallback ...").
        return fn, getattr(fn, "provider", None) or f"backend {backend.name!r}"
    method = "eval_cpu" if backend.device_type is DeviceType.cpu else "eval_gpu"
    own = getattr(cls, method)
    info = primitives.get(cls)
    if own is not getattr(Primitive, method):
        return own, f"{cls.name}.{method}" + (f" ({info.label})" if info else "")
    return _raiser(KernelNotFoundError(
        f"{cls.name}{f' (from {info.label})' if info else ''} has no kernel for device "
        f"{backend.device_type.name} on backend {backend.name!r}: the backend registers none, "
        f"no plugin overrides it, and {cls.name} does not implement {method}.")), "missing"


def _raiser(exc):
    def kernel(prim, inputs):
        raise exc
    kernel.missing = True
    return kernel


def kernel_provider(backend: str, primitive) -> str:
    """Who provides the kernel that backend ``backend`` runs for ``primitive``.

    Args:
        backend (str): A backend's name (``"cpu"``).
        primitive: A :class:`Primitive` subclass, an instance of one, or the
          ``name`` of a registered primitive (``"Add"``).

    Returns:
        str: ``"backend 'cpu'"`` (the backend's own table), a plugin's label
        (its ``lazyx_kernels`` override), ``"<Name>.eval_cpu (plugin ...)"`` (the
        primitive's own kernel), ``"missing"`` or ``"conflict"``.

    Example:
        >>> lazyx.core.kernel_provider("cpu", "Add")
        "backend 'cpu'"
    """
    _ensure_loaded()
    return resolve_kernel(_get(backend), primitive_class(primitive))[1]


def primitive_class(primitive) -> type:
    """The primitive class ``primitive`` stands for: a class, an instance, or the name of
    a registered primitive class (``"Subtract"``), e.g. to override its kernel.

    Raises:
        BackendError: no registered primitive has that name, or several do.
    """
    if isinstance(primitive, type) and issubclass(primitive, Primitive):
        return primitive
    if isinstance(primitive, Primitive):
        return type(primitive)
    if isinstance(primitive, str):
        found = [c for c in primitives if c.name == primitive]
        if len(found) == 1:
            return found[0]
        if found:
            raise BackendError(f"Several registered primitives are named {primitive!r} ("
                               + ", ".join(primitives[c].label for c in found)
                               + "); pass the class.")
        raise BackendError(f"No registered primitive is named {primitive!r}.")
    raise BackendError(f"Expected a Primitive class, a Primitive or a primitive's name, "
                       f"got {primitive!r}.")


def register_backend(backend: Backend, info=None) -> None:
    if not isinstance(backend, Backend):
        raise BackendError(f"{backend!r} is not a lazyx Backend.")
    if backend.name in _backends:
        other = _backend_plugins.get(backend.name)
        raise BackendError(f"Backend {backend.name!r} is registered twice "
                           f"({getattr(other, 'label', other)} and {getattr(info, 'label', info)}).")
    _backends[backend.name] = backend
    _backend_plugins[backend.name] = info
    invalidate_dispatch()


def invalidate_dispatch() -> None:
    global _tables, _device_available
    _tables = None
    _device_available = None
    _buffer_types.clear()
    for b in _backends.values():
        b.__dict__.pop("_table", None)


def _ensure_loaded() -> None:
    if not _backends:
        raise BackendError("No backend is registered yet: import lazyx.core first "
                           "(it loads the plugins, the backends among them).")


def registered_backends() -> dict[str, Backend]:
    """The registered backends by name, as they are (no check that plugins are loaded)."""
    return _backends


def backends() -> dict[str, Backend]:
    """Every registered backend by name."""
    _ensure_loaded()
    return dict(_backends)


def _get(name: str) -> Backend:
    b = _backends.get(name)
    if b is None:
        raise BackendError(f"Unknown backend {name!r}; registered backends: "
                           f"{', '.join(sorted(_backends)) or 'none'}.")
    return b


def _default_for(dt: DeviceType) -> Backend:
    env = os.environ.get(f"LAZYX_{dt.name.upper()}_BACKEND")
    if env:
        b = _get(env)
        if b.device_type is not dt:
            raise BackendError(f"LAZYX_{dt.name.upper()}_BACKEND={env!r} names a "
                               f"{b.device_type.name} backend.")
        return b
    candidates = [b for b in _backends.values() if b.device_type is dt]
    preferred = {"cpu": 0, "cuda": 0, "metal": 1}
    candidates.sort(key=lambda b: (not b.is_available(), preferred.get(b.name, 2)))
    if not candidates:
        raise BackendError(f"No backend is registered for device type {dt.name}.")
    return candidates[0]


def backend_for(dt: DeviceType) -> Backend:
    """The active backend of device type ``dt``."""
    b = _active.get(dt)
    if b is None:
        _ensure_loaded()
        b = _active[dt] = _default_for(dt)
    return b


active_backend = backend_for


def dispatch_tables() -> tuple[list, Backend]:
    """What the scheduler needs, cached until a backend or kernel changes: the kernel
    tables of the active backends indexed by ``DeviceType.value`` (``Stream.kind``),
    and the active CPU backend (whose ``enter_eval``/``exit_eval`` wrap evaluations)."""
    global _tables
    t = _tables
    if t is None:
        tables = [None] * len(DeviceType)
        for dt in DeviceType:
            try:
                b = backend_for(dt)
            except BackendError:
                continue
            table = b.__dict__.get("_table")
            if table is None:
                table = b.__dict__["_table"] = _KernelTable(b)
            tables[dt.value] = table
        cpu = backend_for(DeviceType.cpu)
        # Device backends that mark evaluations (the Metal backend batches an
        # evaluation's launches into one command buffer) are told with the CPU backend.
        hooks = []
        for dt in DeviceType:
            if dt is DeviceType.cpu or tables[dt.value] is None:
                continue
            b = tables[dt.value].backend
            if type(b).enter_eval is not Backend.enter_eval or \
                    type(b).exit_eval is not Backend.exit_eval:
                hooks.append(b)
        t = _tables = (tables, _EvalScope(cpu, hooks) if hooks else cpu)
    return t


class _EvalScope:
    """The CPU backend's ``enter_eval``/``exit_eval`` and those of the device backends
    that mark evaluations, as one (what :func:`dispatch_tables` hands the scheduler
    when there are such backends)."""

    __slots__ = ("cpu", "devices")

    def __init__(self, cpu, devices):
        self.cpu, self.devices = cpu, tuple(devices)

    def enter_eval(self):
        return self.cpu.enter_eval(), [b.enter_eval() for b in self.devices]

    def exit_eval(self, token) -> None:
        outer, inner = token
        try:
            for b, t in zip(reversed(self.devices), reversed(inner)):
                b.exit_eval(t)
        finally:
            self.cpu.exit_eval(outer)


def _device_backend_available() -> bool:
    """Whether a registered non-CPU backend can run here (cached per dispatch state)."""
    global _device_available
    if _device_available is None:
        _device_available = any(b.device_type is not DeviceType.cpu and b.is_available()
                                for b in list(_backends.values()))
    return _device_available


_device_available: bool | None = None


#: The types some backend's ``is_buffer`` said yes to (answers go by type: see
#: :meth:`Backend.is_buffer`): a kernel's output is checked once per type, not per node.
_buffer_types: set = set()


def is_device_buffer(obj) -> bool:
    kind = type(obj)
    if kind in _buffer_types:
        return True
    if any(b.is_buffer(obj) for b in _backends.values()):
        _buffer_types.add(kind)
        return True
    return False


#: Functions that finish device work still writing memory the host reads directly: a
#: device backend whose arrays are NumPy views of unified memory (Metal) adds one when
#: it first queues work, and a read of an array (:func:`to_host`, ``Array._numpy``) and
#: a CPU kernel (the CPU backends' prepared kernels) run them first. Empty elsewhere.
host_fences: list = []


def host_fence(buf=None) -> None:
    """Run the :data:`host_fences`: device work queued so far is done once this returns;
    ``buf``, the buffer about to be read, if any (a fence raises if the work that was to
    write it failed)."""
    for fence in host_fences:
        fence(buf)


def to_host(buf) -> np.ndarray:
    if type(buf) is np.ndarray:
        if host_fences:
            host_fence(buf)
        return buf
    for b in _backends.values():
        if b.is_buffer(buf):
            return b.to_host(buf)
    return np.asarray(buf)


class use_backend:
    """Make backend ``name`` the active one for ``device_type``.

    Works as a call (the switch stays) and as a context manager (the previous
    backend comes back on exit).

    Example:
        >>> with lazyx.core.use_backend("cpu", "cpu-reference"):
        ...     lazyx.core.eval(y)
    """

    def __init__(self, device_type, name: str):
        global _tables
        dt = _as_device_type(device_type)
        _ensure_loaded()
        b = _get(name)
        if b.device_type is not dt:
            raise BackendError(f"Backend {name!r} runs device type {b.device_type.name}, "
                               f"not {dt.name}.")
        if not b.is_available():
            raise BackendError(f"Backend {name!r} is not available: {b.unavailable_reason()}")
        self._dt = dt
        self._previous = backend_for(dt)
        _active[dt] = b
        _tables = None

    def __enter__(self):
        return _active[self._dt]

    def __exit__(self, *exc):
        global _tables
        _active[self._dt] = self._previous
        _tables = None


def _as_device_type(x) -> DeviceType:
    if isinstance(x, DeviceType):
        return x
    if isinstance(x, Device):
        return x.type
    if isinstance(x, str) and x in DeviceType.__members__:
        return DeviceType[x]
    raise BackendError(f"Unknown device type {x!r}; use 'cpu' or 'gpu'.")
