"""The plugin manager: discovery, registration and the records of who provides what.

Plugins are found through the entry-point group ``lazyx`` (see
:mod:`lazyx.hookspecs`). Loading happens once, when ``lazyx.core`` is first
imported. A plugin that fails to import is recorded with its real exception and
its distribution, reported with one warning, and skipped: ``import
lazyx.core`` still works. Two plugins claiming one name make that name raise a
:class:`PluginError` naming both distributions.
"""

from __future__ import annotations

import importlib.metadata as _md
import traceback
import types
import warnings

import pluggy

from . import hookspecs
from .errors import PluginError

__all__ = ["PluginInfo", "plugin_manager", "plugins", "primitives", "ops",
           "load_plugins", "provider_of", "register_plugin", "examples"]

ENTRY_POINT_GROUP = "lazyx"
CORE_DISTRIBUTION = "lazyx"


class PluginInfo:
    """What one plugin is and what it registered."""

    __slots__ = ("name", "distribution", "version", "module", "error",
                 "primitives", "ops", "backends", "kernels")

    def __init__(self, name, distribution, version, module=None, error=None):
        self.name = name
        self.distribution = distribution
        self.version = version
        self.module = module
        self.error = error
        self.primitives: list = []
        self.ops: list[str] = []
        self.backends: list[str] = []
        self.kernels: list[tuple[str, str]] = []

    @property
    def label(self) -> str:
        version = f" {self.version}" if self.version else ""
        return f"plugin {self.name!r} of distribution {self.distribution!r}{version}"

    def __repr__(self) -> str:
        return f"PluginInfo({self.name!r}, {self.distribution!r}, {self.version!r})"


plugin_manager = pluggy.PluginManager("lazyx")
plugin_manager.add_hookspecs(hookspecs)

plugins: dict[str, PluginInfo] = {}
primitives: dict[type, PluginInfo] = {}
ops: dict[str, tuple[object, PluginInfo]] = {}
conflicts: dict[str, list[PluginInfo]] = {}
kernel_overrides: dict[tuple[str, type], tuple[object, PluginInfo]] = {}
kernel_conflicts: dict[tuple[str, type], list[PluginInfo]] = {}
_loaded = False
_namespace_targets: list = []


def load_plugins(core_namespace: dict, reserved: set[str]) -> None:
    """Discover and register every plugin; install their ops into ``lazyx.core``.

    Args:
        core_namespace: the globals of ``lazyx.core``.
        reserved: names ``lazyx.core`` defines itself (claiming one is a conflict).
    """
    global _loaded
    if _loaded:
        return
    _loaded = True
    _namespace_targets.append((core_namespace, reserved))
    for ep in _entry_points():
        dist = ep.dist.name if ep.dist is not None else "?"
        version = ep.dist.version if ep.dist is not None else "?"
        try:
            module = ep.load()
        except Exception as exc:
            info = PluginInfo(ep.name, dist, version, error=exc)
            plugins[ep.name] = info
            warnings.warn(
                f"lazyx: {info.label} failed to import and was skipped: "
                f"{type(exc).__name__}: {exc}\n"
                + "".join(traceback.format_exception_only(type(exc), exc)).rstrip(),
                RuntimeWarning, stacklevel=2)
            continue
        register_plugin(module, ep.name, dist, version)


def _entry_points():
    eps = _md.entry_points(group=ENTRY_POINT_GROUP)
    # The core's own plugins first, so a third-party conflict names them second.
    return sorted(eps, key=lambda ep: (ep.dist is None or ep.dist.name != CORE_DISTRIBUTION, ep.name))


def register_plugin(module, name: str, distribution: str = "?", version: str = "?") -> PluginInfo:
    """Register one plugin object and apply its hooks.

    Entry points call this for you; tests and notebooks may call it directly.
    """
    if name in plugins and plugins[name].error is None:
        raise PluginError(f"A plugin named {name!r} is already registered "
                          f"({plugins[name].label}).")
    info = PluginInfo(name, distribution, version, module)
    try:
        plugin_manager.register(module, name=name)
    except Exception as exc:
        info.error = exc
        plugins[name] = info
        warnings.warn(f"lazyx: {info.label} was rejected: {exc}", RuntimeWarning, stacklevel=2)
        return info
    plugins[name] = info
    try:
        _apply(module, info)
    except Exception as exc:
        info.error = exc
        warnings.warn(f"lazyx: {info.label} raised while registering: "
                      f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
    return info


def _call(hook_name, module):
    hook = getattr(plugin_manager.hook, hook_name)
    for impl in hook.get_hookimpls():
        if impl.plugin is module:
            return impl.function()
    return None


def _apply(module, info: PluginInfo) -> None:
    from .backend import register_backend, invalidate_dispatch

    for cls in _call("lazyx_primitives", module) or ():
        primitives[cls] = info
        info.primitives.append(cls)
    for backend in _call("lazyx_backends", module) or ():
        register_backend(backend, info)
        info.backends.append(backend.name)
    for backend_name, cls, fn in _call("lazyx_kernels", module) or ():
        key = (backend_name, cls)
        if key in kernel_overrides or key in kernel_conflicts:
            # Neither override is used: resolve_kernel raises, naming every plugin.
            owners = kernel_conflicts.get(key) or [kernel_overrides.pop(key)[1]]
            kernel_conflicts[key] = owners + [info]
            warnings.warn(f"lazyx: {' and '.join(o.label for o in kernel_conflicts[key])} each "
                          f"override the kernel of {cls.name} on backend {backend_name!r}; "
                          f"none is used.", RuntimeWarning, stacklevel=3)
        else:
            kernel_overrides[key] = (fn, info)
        info.kernels.append((backend_name, cls.name))
    invalidate_dispatch()
    for name, fn in (_call("lazyx_ops", module) or {}).items():
        _install_op(name, fn, info)


def _install_op(name: str, fn, info: PluginInfo) -> None:
    namespace, reserved = _namespace_targets[0]
    if name in ops or name in conflicts or ("." not in name and name in reserved):
        owners = conflicts.get(name) or ([ops[name][1]] if name in ops else [
            PluginInfo("core", CORE_DISTRIBUTION, "")])
        conflicts[name] = owners + [info]
        ops.pop(name, None)
        target, attr = _target(namespace, name)
        if isinstance(target, type):
            # Methods that conflict are removed so using them raises via __getattr__.
            if attr in target.__dict__:
                delattr(target, attr)
        else:
            target.pop(attr, None) if isinstance(target, dict) else target.__dict__.pop(attr, None)
        names = " and ".join(o.label for o in conflicts[name])
        warnings.warn(f"lazyx: {names} both define {name!r}; the name is disabled.",
                      RuntimeWarning, stacklevel=3)
        return
    ops[name] = (fn, info)
    info.ops.append(name)
    target, attr = _target(namespace, name)
    if isinstance(target, dict):
        target[attr] = fn
    else:
        setattr(target, attr, fn)


def _target(namespace: dict, name: str):
    if "." not in name:
        return namespace, name
    prefix, attr = name.rsplit(".", 1)
    if prefix == "array":
        return namespace["array"], attr
    mod = namespace.get(prefix)
    if not isinstance(mod, types.ModuleType):
        import sys
        full = f"{namespace['__name__']}.{prefix}"
        mod = sys.modules.get(full) or types.ModuleType(full, f"lazyx.core.{prefix}: ops from plugins.")
        mod.__getattr__ = _missing_attr(full)
        sys.modules[full] = mod
        namespace[prefix] = mod
    return mod, attr


def _missing_attr(module_name: str):
    prefix = module_name.split(".", 2)[-1]

    def __getattr__(attr):
        conflict_error(f"{prefix}.{attr}", module_name)

    return __getattr__


def conflict_error(name: str, where: str = "lazyx.core"):
    """Raise the error for a missing or conflicted public name."""
    if name in conflicts:
        names = " and ".join(o.label for o in conflicts[name])
        raise PluginError(f"{where}.{name.rsplit('.', 1)[-1]} is defined by {names}; "
                          f"uninstall one of them to use it.")
    failed = [p for p in plugins.values() if p.error is not None]
    hint = ""
    if failed:
        hint = " (plugins that failed to load: " + ", ".join(
            f"{p.name} from {p.distribution}: {type(p.error).__name__}: {p.error}" for p in failed) + ")"
    raise AttributeError(f"module {where!r} has no attribute {name.rsplit('.', 1)[-1]!r}{hint}")


def examples() -> dict:
    """The examples of every loaded plugin's ``lazyx_examples`` hook, by primitive class:
    ``{cls: [(make, PluginInfo of the plugin that gave it), ...]}``."""
    out: dict = {}
    for info in plugins.values():
        if info.error is not None or info.module is None:
            continue
        for cls, make in _call("lazyx_examples", info.module) or ():
            out.setdefault(cls, []).append((make, info))
    return out


def provider_of(prim) -> str:
    """Which plugin registered ``prim``'s class, as text for error messages."""
    info = primitives.get(type(prim))
    return info.label if info is not None else "an unregistered primitive"
