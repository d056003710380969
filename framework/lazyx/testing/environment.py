"""Where a test runs: which backend, and which plugins are registered.

* :func:`available_backends` and :func:`running_on` choose the backend a test
  runs under (the pytest fixture ``lazyx_backend`` is built on them);
* :func:`isolated_registry` lets a test (or a documentation example) register
  plugins, primitives, ops and backends in-process and takes them all away
  again afterwards, so other tests see the installation as it was.
"""

from __future__ import annotations

import contextlib
import sys
import types

__all__ = ["available_backends", "running_on", "isolated_registry"]


def available_backends() -> list[str]:
    """The names of the registered backends that can run on this machine, in
    registration order (lazyx's own first)."""
    from ..backend import backends
    return [name for name, b in backends().items() if b.is_available()]


@contextlib.contextmanager
def running_on(backend):
    """Run the body on ``backend`` (a name or a :class:`~lazyx.backend.Backend`): it is
    the active backend of its device type and that device is the default device.

    Example:
        >>> with running_on("cpu-reference"):
        ...     y = lazyx.core.exp(x) + 1
        ...     lazyx.core.eval(y)
    """
    from ..backend import Backend, backends, use_backend
    from ..device import Device, default_device, set_default_device
    b = backend if isinstance(backend, Backend) else backends().get(backend)
    if b is None:
        use_backend("cpu", backend)  # raises the error that lists the backends
    previous = default_device()
    with use_backend(b.device_type, b.name):
        set_default_device(Device(b.device_type))
        try:
            yield b
        finally:
            set_default_device(previous)


@contextlib.contextmanager
def isolated_registry():
    """Undo, on exit, every plugin registered inside the block.

    Plugins registered with :func:`lazyx.registry.register_plugin` (or
    :func:`lazyx.custom_primitive.register`) inside the block are unregistered
    on exit, with their primitives, names (in ``lazyx.core``, its submodules and
    on ``array``), kernel overrides and backends; the active backends come back.

    Example:
        >>> with isolated_registry():
        ...     register_plugin(my_module, "mine")
        ...     lazyx.core.mine.op(x)
    """
    import lazyx.core as core
    from .. import backend as _backend
    from .. import registry as _registry
    from ..array import array

    tables = (_registry.plugins, _registry.primitives, _registry.ops, _registry.conflicts,
              _registry.kernel_overrides, _registry.kernel_conflicts,
              _backend._backends, _backend._backend_plugins, _backend._active)
    saved_tables = [dict(t) for t in tables]
    saved_plugins = set(map(id, _registry.plugin_manager.get_plugins()))
    namespaces = _namespaces(core)
    saved_namespaces = {name: dict(vars(ns)) for name, ns in namespaces.items()}
    saved_modules = {k for k in sys.modules if k.startswith(core.__name__ + ".")}
    saved_array = dict(vars(array))
    try:
        yield
    finally:
        for p in list(_registry.plugin_manager.get_plugins()):
            if id(p) not in saved_plugins:
                _registry.plugin_manager.unregister(p)
        for t, saved in zip(tables, saved_tables):
            t.clear()
            t.update(saved)
        for name, ns in _namespaces(core).items():
            before = saved_namespaces.get(name)
            d = vars(ns)
            for k in [k for k in d if before is None or k not in before]:
                delattr(ns, k)
            for k, v in (before or {}).items():
                if d.get(k, _ABSENT) is not v:
                    setattr(ns, k, v)
        for k in [k for k in sys.modules if k.startswith(core.__name__ + ".")]:
            # Only the namespaces the registry made up for plugins (they have no file).
            if k not in saved_modules and getattr(sys.modules[k], "__file__", None) is None:
                del sys.modules[k]
        for k in [k for k in vars(array) if k not in saved_array]:
            delattr(array, k)
        for k, v in saved_array.items():
            if vars(array).get(k, _ABSENT) is not v:
                setattr(array, k, v)
        _backend.invalidate_dispatch()


_ABSENT = object()


def _namespaces(core) -> dict:
    """``lazyx.core`` and its op submodules (``random``, plugin namespaces), by name."""
    out = {core.__name__: core}
    for k, v in vars(core).items():
        if isinstance(v, types.ModuleType) and v.__name__.startswith(core.__name__ + "."):
            out[v.__name__] = v
    return out
