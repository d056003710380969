"""The plugin manager: discovery, registration and the records of who provides what.

Plugins are found through the entry-point group ``lazyx`` (see
:mod:`lazyx.hookspecs`). Loading happens once, when ``lazyx.core`` is first
imported, in this order:

1. choose the entry points: the ``lazyx`` distribution's own (the built-in packs
   and backends) first; a third-party entry point that reuses a built-in's name
   (or another plugin's) is skipped; with ``LAZYX_DISABLE_PLUGIN_AUTOLOAD`` set,
   third-party entry points are skipped unless ``LAZYX_PLUGINS`` names them;
2. import each plugin; one that fails (any exception, ``sys.exit`` included; not
   ``KeyboardInterrupt``) is recorded with its real exception and skipped;
3. run its hooks and check what they return before anything is registered, so
   a hook that raises leaves nothing half-registered;
4. register primitives, backends, kernel overrides and names. A built-in name
   (one the ``lazyx`` distribution registers, or ``lazyx.core`` defines itself)
   always stays the built-in's, whatever the order: a third-party claim on it is
   refused. Two third-party plugins claiming one other name make that name raise
   a :class:`PluginError` naming both distributions.

Every skip and refusal is one ``RuntimeWarning`` naming the distribution(s),
and is listed by ``lazyx info``; ``import lazyx.core`` itself never fails
because of a plugin.
"""

from __future__ import annotations

import importlib.metadata as _md
import os
import traceback
import types
import warnings

import pluggy

from . import hookspecs
from .backend import Backend, invalidate_dispatch, register_backend, registered_backends
from .errors import PluginError
from .primitive import Primitive
from .providers import (CORE_DISTRIBUTION, PluginInfo, conflicts, kernel_conflicts,
                        kernel_overrides, ops, plugins, primitives, provider_of, skipped)

__all__ = ["PluginInfo", "plugin_manager", "plugins", "primitives", "ops", "skipped",
           "load_plugins", "loaded", "provider_of", "register_plugin", "examples"]

ENTRY_POINT_GROUP = "lazyx"
# Like pytest's PYTEST_DISABLE_PLUGIN_AUTOLOAD: any non-empty value disables it.
AUTOLOAD_ENV = "LAZYX_DISABLE_PLUGIN_AUTOLOAD"
PLUGINS_ENV = "LAZYX_PLUGINS"


plugin_manager = pluggy.PluginManager("lazyx")
plugin_manager.add_hookspecs(hookspecs)

_loaded = False
_namespace_targets: list = []
# What lazyx.core defines itself, for names it reserves: stands in as their owner.
_CORE = PluginInfo("lazyx.core", CORE_DISTRIBUTION, "")


def load_plugins(core_namespace: dict, reserved: set[str]) -> None:
    """Discover and register every plugin; install their ops into ``lazyx.core``.

    Never raises because of a plugin: a plugin that cannot be loaded is skipped
    with a warning naming its distribution.

    Args:
        core_namespace: the globals of ``lazyx.core``.
        reserved: names ``lazyx.core`` defines itself (a third-party claim on one is refused).
    """
    global _loaded
    if _loaded:
        return
    _loaded = True
    array_cls = core_namespace.get("array")
    # The array class's own attributes (shape, dtype, item ...) are built-ins too.
    array_own = set(vars(array_cls)) if isinstance(array_cls, type) else set()
    _namespace_targets.append((core_namespace, reserved, array_own))
    for ep, info in _entry_points():
        try:
            module = ep.load()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # sys.exit in a plugin must not end the import
            info.error = exc
            plugins[ep.name] = info
            warnings.warn(
                f"lazyx: {info.label} failed to import and was skipped: "
                f"{type(exc).__name__}: {exc}\n"
                + "".join(traceback.format_exception_only(type(exc), exc)).rstrip(),
                RuntimeWarning, stacklevel=2)
            continue
        try:
            register_plugin(module, ep.name, info.distribution, info.version)
        except PluginError as exc:  # its name was taken while plugins imported
            _skip(info, str(exc))


def loaded() -> bool:
    """Whether the plugins are loaded (``import lazyx.core`` loads them)."""
    return _loaded


def _entry_points():
    """The entry points to load, as ``(entry point, PluginInfo)``; records the rest in ``skipped``."""
    # A distribution's name and version parse its metadata file: once per distribution.
    seen: dict = {}

    def dist_of(ep):
        d = ep.dist
        if d is None:
            return ("?", "?")
        got = seen.get(id(d))
        if got is None:
            got = seen[id(d)] = (d.name, d.version)
        return got

    # The core's own plugins first, so their names are taken before any third party's.
    eps = sorted(_md.entry_points(group=ENTRY_POINT_GROUP),
                 key=lambda ep: (dist_of(ep)[0] != CORE_DISTRIBUTION, ep.name))
    autoload = not os.environ.get(AUTOLOAD_ENV)
    wanted = {n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(",") if n.strip()}
    chosen: dict[str, PluginInfo] = {}
    out = []
    for ep in eps:
        info = PluginInfo(ep.name, *dist_of(ep))
        first = chosen.get(ep.name)
        if first is not None:
            what = "a built-in pack of lazyx" if first.builtin else "another plugin"
            _skip(info, f"its entry-point name {ep.name!r} is taken by {what} "
                        f"({first.label}); rename the entry point")
        elif not (info.builtin or autoload or ep.name in wanted):
            # Asked for: recorded for ``lazyx info``, without a warning (as pytest's
            # PYTEST_DISABLE_PLUGIN_AUTOLOAD).
            skipped.append((info, f"{AUTOLOAD_ENV} is set and {PLUGINS_ENV} does not name "
                                  f"{ep.name!r}"))
        else:
            chosen[ep.name] = info
            out.append((ep, info))
    if not autoload:
        for name in sorted(wanted - {ep.name for ep in eps}):
            warnings.warn(f"lazyx: {PLUGINS_ENV} names {name!r}, but no installed distribution "
                          f"has a {ENTRY_POINT_GROUP!r} entry point of that name.",
                          RuntimeWarning, stacklevel=3)
    return out


def _skip(info: PluginInfo, reason: str) -> None:
    skipped.append((info, reason))
    warnings.warn(f"lazyx: {info.label} was skipped: {reason.rstrip('.')}.", RuntimeWarning,
                  stacklevel=4)


def register_plugin(module, name: str, distribution: str = "?", version: str = "?") -> PluginInfo:
    """Register one plugin object and apply its hooks.

    Entry points call this for you; tests and notebooks may call it directly.
    A plugin whose hooks raise (``SystemExit`` included) is recorded with the
    error, warned about and registers nothing.

    Raises:
        PluginError: a plugin of that name is already registered.
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
        hooks = _collect(module)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # sys.exit in a hook must not end the import
        info.error = exc
        plugin_manager.unregister(module)
        warnings.warn(f"lazyx: {info.label} raised while registering and was skipped: "
                      f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
        return info
    _apply(hooks, info)
    return info


def _call(hook_name, module):
    hook = getattr(plugin_manager.hook, hook_name)
    for impl in hook.get_hookimpls():
        if impl.plugin is module:
            return impl.function()
    return None


def _collect(module):
    """Run the plugin's registration hooks (its code) and check what they return.

    Everything that can fail happens here, before :func:`_apply` changes any table.
    """
    taken = registered_backends()
    prims = list(_call("lazyx_primitives", module) or ())
    for cls in prims:
        if not (isinstance(cls, type) and issubclass(cls, Primitive)):
            raise PluginError(f"lazyx_primitives returned {cls!r}, which is not a Primitive subclass.")
    backends = list(_call("lazyx_backends", module) or ())
    for i, b in enumerate(backends):
        if not isinstance(b, Backend):
            raise PluginError(f"lazyx_backends returned {b!r}, which is not a lazyx Backend.")
        if b.name in taken or any(b.name == other.name for other in backends[:i]):
            raise PluginError(f"its backend {b.name!r} is already registered; choose another name.")
    kernels = [tuple(k) for k in _call("lazyx_kernels", module) or ()]
    for k in kernels:
        if len(k) != 3 or not isinstance(k[0], str) or not isinstance(k[1], type):
            raise PluginError(f"lazyx_kernels returned {k!r}, not a (backend name, "
                              f"primitive class, kernel) triple.")
    names = dict(_call("lazyx_ops", module) or {})
    for n in names:
        if not isinstance(n, str) or not n or n.startswith(".") or n.endswith("."):
            raise PluginError(f"lazyx_ops returned the name {n!r}; names are 'op', "
                              f"'namespace.op' or 'array.method'.")
    return prims, backends, kernels, names


def _apply(hooks, info: PluginInfo) -> None:
    prims, backends, kernels, names = hooks
    for cls in prims:
        owner = primitives.get(cls)
        if owner is not None and owner is not info and owner.builtin != info.builtin:
            # A built-in primitive keeps its provider, whichever came first.
            loser, winner = (info, owner) if owner.builtin else (owner, info)
            _refuse(f"primitive {cls.__name__}", loser, winner)
            if loser is info:
                continue
            owner.primitives.remove(cls)
        primitives[cls] = info
        info.primitives.append(cls)
    for backend in backends:
        register_backend(backend, info)
        info.backends.append(backend.name)
    for backend_name, cls, fn in kernels:
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
    for name, fn in names.items():
        _install_op(name, fn, info)


def _builtin_owner(name: str):
    """The built-in that owns ``name`` (a PluginInfo of the lazyx distribution), else None."""
    namespace, reserved, array_own = _namespace_targets[0]
    if name in ops and ops[name][1].builtin:
        return ops[name][1]
    prefix, _, attr = name.rpartition(".")
    if not prefix:
        if name in reserved:
            return _CORE
        # A plain name over a namespace of built-in ops (``random``) would hide them all.
        inside = [o for n, (_, o) in ops.items() if n.startswith(name + ".") and o.builtin]
        return inside[0] if inside else None
    if prefix == "array":
        return _CORE if attr in array_own else None
    # ``eval.x`` would replace lazyx.core.eval by a namespace.
    head = prefix.split(".", 1)[0]
    if head in ops and ops[head][1].builtin:
        return ops[head][1]
    if head in reserved and not isinstance(namespace.get(head), types.ModuleType):
        return _CORE
    return None


def _refuse(name: str, info: PluginInfo, owner: PluginInfo) -> None:
    info.refused.append((name, owner.label))
    warnings.warn(f"lazyx: {info.label} claims {name!r}, which is built in ({owner.label}); "
                  f"the claim is refused and the built-in is kept.", RuntimeWarning, stacklevel=4)


def _install_op(name: str, fn, info: PluginInfo) -> None:
    namespace, reserved, _ = _namespace_targets[0]
    if not info.builtin:
        owner = _builtin_owner(name)
        if owner is not None:
            _refuse(name, info, owner)
            return
    else:
        # A built-in wins whatever order the plugins came in: third-party claims
        # on its name made earlier are withdrawn (the built-in overwrites the attribute).
        earlier = conflicts.get(name) or ([ops[name][1]] if name in ops else [])
        if earlier and not any(o.builtin for o in earlier):
            conflicts.pop(name, None)
            ops.pop(name, None)
            for other in earlier:
                if name in other.ops:
                    other.ops.remove(name)
                _refuse(name, other, info)
    if name in ops or name in conflicts or name in reserved:
        # Two third-party plugins, or two parts of lazyx itself (a bug in lazyx; a
        # built-in pack may still replace an array method the class defines).
        owners = conflicts.get(name) or [ops[name][1] if name in ops else _CORE]
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
