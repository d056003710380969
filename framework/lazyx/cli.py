"""The ``lazyx`` console script.

Commands (``lazyx --help``; ``lazyx --version`` prints the package version):

* ``lazyx info [--env] [--json]``: the version, the devices, the backends (available
  or why not; ``[active]`` marks the backend each device type runs on, and only
  when it can run here), every plugin with its distribution and version (and the
  error of any that failed to load, or the built-in names it was refused), the
  plugins skipped and why, each plugin's primitives and how many of them each
  available backend has a kernel for, the kernel overrides plugins installed, and
  which available backend lacks a kernel for which primitive (backends that cannot
  run here are named, not checked). ``--env`` adds every environment variable
  lazyx reads with its current value (:mod:`lazyx.environment`).
* ``lazyx kernels [NAME ...] [--backend B] [--json]``: who provides each
  primitive's kernel on each backend. A NAME is a primitive class (``Add``) or an op
  as users write it (``add``, ``fast.rms_norm``, ``linalg.qr``, or ``axpby`` for the
  one op ``ext.axpby``), resolved through the op registry to the primitives it
  builds (:func:`resolve`); an unknown NAME is an error with close matches.
* ``lazyx cache [clear]``: where the kernel cache is, its size and entry count;
  ``clear`` empties it.
* ``lazyx launch [-n N] [--hostfile F] SCRIPT ...``: ``python -m lazyx.launch``, the
  launcher of distributed programs (:mod:`lazyx.launch`).

Flow: each command gathers its facts into plain data (:func:`info_data`,
:func:`kernels_data`); the text and ``--json`` outputs are two renderings of that
same data, so they cannot disagree. The JSON keys are documented on those functions
and are stable: new keys may be added, existing ones keep their meaning. Errors go
to stderr, with exit status 1.
"""

from __future__ import annotations

import json
import sys

# How many close matches an unknown name's error suggests.
SUGGESTIONS = 5


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else (plural or word + 's')}"


# -- lazyx info ------------------------------------------------------------------------
def info_data(env: bool = False) -> dict:
    """What this lazyx installation is made of, as JSON-ready data.

    Keys (stable; ``lazyx info --json`` prints this):

    * ``version``: the lazyx version;
    * ``devices``: ``[{"type", "available", "default"}]``;
    * ``backends``: ``[{"name", "device_type", "available", "reason", "active",
      "distribution", "version", "description"}]``; ``reason`` says why one is not
      available (null when it is), ``active`` is true only for the available backend
      its device type runs on;
    * ``plugins``: ``[{"name", "distribution", "version", "error", "primitives",
      "ops", "backends", "kernel_overrides", "communication_backends", "refused", "kernels"}]``; ``kernels``
      maps each available backend to how many of the plugin's primitives it has a
      kernel for;
    * ``skipped``: ``[{"name", "distribution", "version", "reason"}]``;
    * ``kernel_overrides``: ``[{"primitive", "backend", "provider"}]``;
    * ``kernel_conflicts`` and ``conflicts``: ``[{"primitive", "backend", "providers"}]``
      and ``[{"name", "providers"}]``;
    * ``missing_kernels``: ``{backend: [primitive, ...]}`` for every available backend;
    * ``fallback_kernels``: ``{backend: [primitive, ...]}``: the primitives an available
      backend runs through an explicit CPU fallback (a kernel marked ``cpu_fallback``,
      e.g. the Metal backend's);
    * ``unchecked_backends``: the backends that cannot run here (their kernels are not
      counted as missing);
    * ``primitive_count``: how many primitives are registered;
    * ``environment`` (with ``env=True`` only): :func:`lazyx.environment.current`.
    """
    import lazyx
    import lazyx.core as mx
    from lazyx import registry
    from lazyx.backend import active_backend, backends, resolve_kernel

    all_backends = sorted(backends().items())
    runnable = [(n, b) for n, b in all_backends if b.is_available()]
    default = mx.default_device().type
    data: dict = {"version": lazyx.__version__, "devices": [
        {"type": dt.name, "available": bool(mx.is_available(mx.Device(dt))),
         "default": dt is default} for dt in mx.DeviceType]}

    rows = []
    for name, b in all_backends:
        available = bool(b.is_available())
        try:
            active = available and active_backend(b.device_type) is b
        except Exception:  # a bad LAZYX_<TYPE>_BACKEND: info still reports the rest
            active = False
        provider = registry.plugins.get(_plugin_of_backend(name))
        rows.append({"name": name, "device_type": b.device_type.name, "available": available,
                     "reason": None if available else b.unavailable_reason(), "active": active,
                     "distribution": provider.distribution if provider else None,
                     "version": provider.version if provider else None,
                     "description": b.describe() or None})
    data["backends"] = rows

    def served(b, classes):
        return sum(not getattr(resolve_kernel(b, c)[0], "missing", False) for c in classes)

    # lazyx.core.distributed's communication backends, by plugin (their hook is read only
    # when a group starts; asking it here imports no communication library).
    comm: dict = {}
    for impl in registry.plugin_manager.hook.lazyx_distributed_backends.get_hookimpls():
        try:
            got = impl.function() or []
        except Exception as e:  # a broken hook: info reports it instead of failing
            got = [f"error: {type(e).__name__}: {e}"]
        comm[impl.plugin_name] = [
            b if isinstance(b, str) else
            f"{b.name} ({b.device}: {'available' if b.is_available() else 'not available'})"
            for b in got]
    data["plugins"] = [{
        "name": name, "distribution": p.distribution, "version": p.version,
        "communication_backends": comm.get(name, []),
        "error": None if p.error is None else f"{type(p.error).__name__}: {p.error}",
        "primitives": [c.name for c in p.primitives], "ops": list(p.ops),
        "backends": list(p.backends),
        "kernel_overrides": [{"backend": b, "primitive": prim} for b, prim in p.kernels],
        "refused": [{"name": claim, "owner": owner} for claim, owner in p.refused],
        "kernels": {bn: served(b, p.primitives) for bn, b in runnable} if p.primitives else {},
    } for name, p in sorted(registry.plugins.items())]
    data["skipped"] = [{"name": p.name, "distribution": p.distribution, "version": p.version,
                        "reason": reason} for p, reason in registry.skipped]
    # Precedence: a plugin's override, then the backend's own kernel, then the
    # primitive's eval_cpu/eval_gpu (lazyx.backend).
    data["kernel_overrides"] = [
        {"primitive": cls.name, "backend": bn, "provider": who.label}
        for (bn, cls), (_fn, who) in sorted(registry.kernel_overrides.items(),
                                            key=lambda kv: (kv[0][0], kv[0][1].name))]
    data["kernel_conflicts"] = [
        {"primitive": cls.name, "backend": bn, "providers": [i.label for i in whos]}
        for (bn, cls), whos in sorted(registry.kernel_conflicts.items(),
                                      key=lambda kv: (kv[0][0], kv[0][1].name))]
    data["conflicts"] = [{"name": n, "providers": [o.label for o in owners]}
                         for n, owners in sorted(registry.conflicts.items())]
    # Only a backend that can run here can miss a kernel that matters: a Metal backend
    # on Linux lacks them all, and saying so would bury the real gaps.
    data["missing_kernels"] = {
        bn: sorted(cls.name for cls in registry.primitives
                   if getattr(resolve_kernel(b, cls)[0], "missing", False))
        for bn, b in runnable}
    data["fallback_kernels"] = {
        bn: names for bn, names in (
            (bn, sorted(cls.name for cls in registry.primitives
                        if getattr(resolve_kernel(b, cls)[0], "cpu_fallback", False)))
            for bn, b in runnable) if names}
    data["unchecked_backends"] = [n for n, b in all_backends if not b.is_available()]
    data["primitive_count"] = len(registry.primitives)
    if env:
        from lazyx import environment
        data["environment"] = environment.current()
    return data


def info(out=None, env: bool = False, as_json: bool = False) -> None:
    """Print what this lazyx installation is made of (:func:`info_data`), as text or JSON."""
    out = out or sys.stdout
    d = info_data(env)
    if as_json:
        out.write(json.dumps(d, indent=2) + "\n")
        return
    w = out.write
    w(f"lazyx {d['version']}\n\nDevices:\n")
    for dev in d["devices"]:
        w(f"  {dev['type']}: {'available' if dev['available'] else 'not available'}"
          f"{' (default)' if dev['default'] else ''}\n")
    w("\nBackends:\n")
    for b in d["backends"]:
        who = f" from {b['distribution']} {b['version']}" if b["distribution"] else ""
        state = "available" if b["available"] else f"not available: {b['reason']}"
        w(f"  {b['name']} ({b['device_type']}){' [active]' if b['active'] else ''}{who}: "
          f"{state}\n")
        if b["description"]:
            w(f"    {b['description']}\n")
    w("\nPlugins:\n")
    for p in d["plugins"]:
        label = f"{p['name']} ({p['distribution']} {p['version']})"
        if p["error"] is not None:
            w(f"  {label}: FAILED TO LOAD: {p['error']}\n")
            continue
        parts = []
        if p["primitives"]:
            parts.append(_plural(len(p["primitives"]), "primitive"))
        if p["ops"]:
            parts.append(_plural(len(p["ops"]), "name"))
        if p["backends"]:
            parts.append(("backend " if len(p["backends"]) == 1 else "backends ")
                         + ", ".join(p["backends"]))
        if p["kernel_overrides"]:
            parts.append(_plural(len(p["kernel_overrides"]), "kernel override"))
        if p["communication_backends"]:
            parts.append("communication backend " + ", ".join(p["communication_backends"]))
        w(f"  {label}: {'; '.join(parts) or 'nothing registered'}\n")
        if p["primitives"]:
            n = len(p["primitives"])
            w("    primitives: " + " ".join(p["primitives"]) + "\n")
            w("    kernels: " + ", ".join(f"{bn} {k}/{n}" for bn, k in p["kernels"].items())
              + "\n")
        for o in p["kernel_overrides"]:
            w(f"    kernel override: {o['primitive']} on {o['backend']}\n")
        for r in p["refused"]:
            w(f"    REFUSED: {r['name']} (built in: {r['owner']})\n")
    if d["skipped"]:
        w("\nSkipped plugins (not loaded):\n")
        for p in d["skipped"]:
            w(f"  {p['name']} ({p['distribution']} {p['version']}): {p['reason']}\n")
    if d["kernel_overrides"] or d["kernel_conflicts"]:
        w("\nKernel overrides (a plugin's kernel wins over the backend's own):\n")
        for o in d["kernel_overrides"]:
            w(f"  {o['primitive']} on {o['backend']}: {o['provider']}\n")
        for c in d["kernel_conflicts"]:
            w(f"  {c['primitive']} on {c['backend']}: CONFLICT, none used: "
              + " and ".join(c["providers"]) + "\n")
    if d["conflicts"]:
        w("\nConflicts (these names are disabled):\n")
        for c in d["conflicts"]:
            w(f"  {c['name']}: " + " and ".join(c["providers"]) + "\n")
    w("\nMissing kernels:\n")
    total = d["primitive_count"]
    missing = {bn: names for bn, names in d["missing_kernels"].items() if names}
    for bn, names in missing.items():
        w(f"  {bn}: {len(names)} of {_plural(total, 'primitive')}: " + " ".join(names) + "\n")
    if not missing:
        w("  none\n")
    if d["unchecked_backends"]:
        w("  (not checked, not available here: " + ", ".join(d["unchecked_backends"]) + ")\n")
    if d["fallback_kernels"]:
        w("\nCPU fallbacks (the CPU backend's kernel runs on the device's memory):\n")
        for bn, names in d["fallback_kernels"].items():
            w(f"  {bn}: {len(names)} of {_plural(total, 'primitive')}: " + " ".join(names) + "\n")
    if env:
        w("\n")
        _environment(w, d["environment"])


def _environment(w, rows) -> None:
    """The ``--env`` section: each variable with its value, or its default when unset."""
    w("Environment variables:\n")
    for e in rows:
        if e["value"] is None:
            w(f"  {e['name']} (unset; default: {e['default']})\n")
        else:
            bad = "" if e["valid"] else f"  (NOT ACCEPTED: {e['accepted']})"
            w(f"  {e['name']}={e['value']}{bad}\n")


# -- lazyx kernels ---------------------------------------------------------------------
def _norm(name: str) -> str:
    """A name compared loosely: ``rms_norm``, ``RMSNorm`` and ``rmsnorm`` are one."""
    return name.replace("_", "").lower()


def resolve(name: str) -> tuple[list, str | None]:
    """The primitive classes ``name`` stands for, and the op it was read as.

    Tried in order: a primitive class name (``Add``); an op of the op registry, by its
    full name (``add``, ``fast.rms_norm``) or, when exactly one op has it, its last
    part (``axpby`` for ``ext.axpby``). An op's primitives are those of the plugin that
    registered it whose name is the op's (loosely: ``rms_norm`` is ``RMSNorm``), else
    the plugin's only primitive, else the primitives of the graph the op builds on
    small float32 matrices (``mean`` builds ``Reduce`` and ``Divide``).

    Returns:
        ``(classes, op name or None)``; ``classes`` is empty when nothing matched.
    """
    from lazyx import registry

    classes = [c for c in registry.primitives if c.name == name]
    if classes:
        return classes, None
    op = name if name in registry.ops else None
    if op is None:
        # Array methods (``array.cube``) are not ops users name on their own.
        tails = [o for o in registry.ops
                 if not o.startswith("array.") and o.rsplit(".", 1)[-1] == name]
        op = tails[0] if len(tails) == 1 else None
    if op is None:
        return [], None
    fn, info = registry.ops[op]
    tail = _norm(op.rsplit(".", 1)[-1])
    same = [c for c in info.primitives if _norm(c.name) == tail]
    if same:
        return same, op
    if len(info.primitives) == 1:
        return list(info.primitives), op
    return _traced(fn) if info.primitives else [], op


def _traced(fn) -> list:
    """The registered primitives of the graph ``fn`` builds from 1-4 small float32
    matrices (its required positional arguments); none when it does not build one.
    Nothing is evaluated."""
    import inspect
    import warnings

    import numpy as np

    import lazyx.core as mx
    from lazyx import registry
    from lazyx.array import array

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    n = sum(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            for p in params)
    if not 1 <= n <= 4:
        return []
    args = [mx.array(np.eye(2, dtype=np.float32) + 1) for _ in range(n)]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = fn(*args)
    except Exception:
        return []
    found, seen = [], set()
    stack = [o for o in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(o, array)]
    while stack:
        a = stack.pop()
        if id(a) in seen or a._prim is None:
            continue
        seen.add(id(a))
        cls = type(a._prim)
        if cls in registry.primitives and cls not in found:
            found.append(cls)
        stack.extend(a._inputs)
    return sorted(found, key=lambda c: c.name)


def _suggestions(name: str) -> list[str]:
    """Close matches of an unknown name among primitive classes and op names."""
    import difflib

    from lazyx import registry
    known: dict[str, str] = {}
    for op in registry.ops:
        if not op.startswith("array."):
            known.setdefault(op.lower(), op)
            known.setdefault(op.rsplit(".", 1)[-1].lower(), op)
    for c in registry.primitives:
        known.setdefault(c.name.lower(), c.name)
    got = difflib.get_close_matches(name.lower(), list(known), n=SUGGESTIONS * 2, cutoff=0.6)
    return list(dict.fromkeys(known[g] for g in got))[:SUGGESTIONS]


def kernels_data(names=(), backend_names=()) -> dict:
    """Who provides each primitive's kernel on each backend, as JSON-ready data.

    Keys (stable; ``lazyx kernels --json`` prints this):

    * ``primitives``: ``[{"name", "plugin", "distribution", "version", "kernels"}]``
      where ``kernels`` maps each backend shown to ``{"provider", "missing",
      "available"}`` (``provider`` as :func:`lazyx.core.kernel_provider` says it;
      ``available``: whether that backend can run here);
    * ``ops``: ``{name: {"op": full op name, "primitives": [...]}}`` for each NAME that
      was read as an op;
    * ``errors``: ``[{"name", "kind", "message", "suggestions"}]`` for unknown
      backends (``kind`` ``"backend"``) and names (``"name"``); the others are
      still listed.
    """
    import lazyx.core  # noqa: F401  (loads the plugins)
    from lazyx import registry
    from lazyx.backend import backends, resolve_kernel

    all_backends = backends()
    errors = [{"name": b, "kind": "backend", "suggestions": [],
               "message": f"unknown backend {b!r}; registered backends: "
                          f"{', '.join(sorted(all_backends))}"}
              for b in backend_names if b not in all_backends]
    ops: dict = {}
    if names:
        classes: list = []
        for n in names:
            found, op = resolve(n)
            if op is not None:
                ops[n] = {"op": op, "primitives": [c.name for c in found]}
            if found:
                classes += [c for c in found if c not in classes]
                continue
            if op is not None:
                own = [c.name for c in registry.ops[op][1].primitives]
                msg = (f"the op {op!r} builds no primitive this command can find (it takes "
                       f"no array arguments, or needs inputs other than small float "
                       f"matrices); name a primitive class instead"
                       + (f", e.g. one of its plugin's: {', '.join(own)}" if own else ""))
                errors.append({"name": n, "kind": "name", "message": msg, "suggestions": own})
                continue
            hint = _suggestions(n)
            msg = f"unknown primitive or op {n!r}" + (
                f"; did you mean {', '.join(hint)}?" if hint else
                "; `lazyx kernels` lists every primitive")
            errors.append({"name": n, "kind": "name", "message": msg, "suggestions": hint})
    else:
        classes = sorted(registry.primitives, key=lambda c: (c.name, registry.primitives[c].name))
    shown = [(n, b) for n, b in sorted(all_backends.items())
             if not backend_names or n in backend_names]
    prims = []
    for cls in classes:
        info = registry.primitives[cls]
        ks = {}
        for bn, b in shown:
            fn, who = resolve_kernel(b, cls)
            ks[bn] = {"provider": who, "missing": bool(getattr(fn, "missing", False)),
                      "available": bool(b.is_available())}
        prims.append({"name": cls.name, "plugin": info.name, "distribution": info.distribution,
                      "version": info.version, "label": info.label, "kernels": ks})
    return {"primitives": prims, "ops": ops, "errors": errors}


def kernels(names=(), backend_names=(), out=None, as_json: bool = False, err=None) -> int:
    """Print who provides the kernel of each primitive on each backend.

    Args:
        names: primitive class names or op names to show (default: every registered
            primitive); see :func:`resolve`.
        backend_names: backends to show (default: all).
        as_json: print :func:`kernels_data` as JSON instead of text.
    Returns:
        the exit status: 1 when a name or a backend is unknown (each is named on
        ``err``, stderr by default, with close matches).
    """
    out = out or sys.stdout
    err = err or sys.stderr
    d = kernels_data(names, backend_names)
    for e in d["errors"]:
        err.write(f"lazyx kernels: {e['message']}\n")
    if d["errors"]:
        return 1
    if as_json:
        out.write(json.dumps(d, indent=2) + "\n")
        return 0
    for name, o in d["ops"].items():
        out.write(f"{name}: op {o['op']!r} uses {', '.join(o['primitives'])}\n")
    for p in d["primitives"]:
        out.write(f"{p['name']} ({p['label']}):\n")
        for bn, k in p["kernels"].items():
            out.write(f"  {bn}: {k['provider']}\n")
    return 0


# -- lazyx cache -----------------------------------------------------------------------
def cache(action: str | None = None, out=None) -> int:
    """Show the kernel cache (``action`` None) or empty it (``"clear"``); the exit status."""
    out = out or sys.stdout
    from lazyx.codegen import jit

    if action == "clear":
        r = jit.clear_cache()
        out.write(f"Removed {r['entries']} entries ({_mib(r['bytes'])}) from {r['path']}\n")
        return 0
    try:
        r = jit.cache_info()
    except jit.KernelCacheError as exc:  # a bad LAZYX_CACHE_MAX_MB
        sys.stderr.write(f"{exc}\n")
        return 1
    out.write(f"Kernel cache: {r['path']}\n"
              f"  {r['entries']} entries, {_mib(r['bytes'])} of {_mib(r['max_bytes'])} "
              f"(LAZYX_CACHE_MAX_MB)\n")
    return 0


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _plugin_of_backend(name: str):
    from lazyx import registry
    for pname, p in registry.plugins.items():
        if name in p.backends:
            return pname
    return None


def main(argv=None) -> int:
    import argparse  # only the console script parses arguments (lazyx.extend imports info)

    import lazyx
    parser = argparse.ArgumentParser(prog="lazyx", description="lazyx command line.")
    parser.add_argument("--version", action="version", version=f"lazyx {lazyx.__version__}")
    sub = parser.add_subparsers(dest="command")
    i = sub.add_parser("info", help="version, devices, backends, plugins, primitives, missing kernels")
    i.add_argument("--env", action="store_true",
                   help="also every environment variable lazyx reads, with its value")
    i.add_argument("--json", action="store_true",
                   help="JSON for scripts (keys: lazyx.cli.info_data)")
    k = sub.add_parser("kernels", help="who provides each primitive's kernel on each backend")
    k.add_argument("primitives", nargs="*", metavar="NAME",
                   help="primitive class names (Add) or op names (add, fast.rms_norm); "
                        "default: all")
    k.add_argument("--backend", action="append", default=[], help="only this backend (repeatable)")
    k.add_argument("--json", action="store_true",
                   help="JSON for scripts (keys: lazyx.cli.kernels_data)")
    c = sub.add_parser("cache", help="the kernel cache: location, size, entries; `clear` empties it")
    c.add_argument("action", nargs="?", choices=["clear"], help="clear: delete every entry")
    sub.add_parser("launch", add_help=False,
                   help="start a distributed program on N processes (python -m lazyx.launch)")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["launch"]:  # its options are lazyx.launch's own, the script's after it
        from lazyx import launch  # only this command starts processes
        return launch.main(argv[1:])
    args = parser.parse_args(argv)
    from lazyx.errors import LazyxError  # the console script's own import, as argparse
    try:
        if args.command == "info":
            info(env=args.env, as_json=args.json)
            return 0
        if args.command == "kernels":
            return kernels(args.primitives, args.backend, as_json=args.json)
        if args.command == "cache":
            return cache(args.action)
    except LazyxError as exc:  # e.g. a bad LAZYX_DEFAULT_DEVICE: lazyx.core cannot import
        sys.stderr.write(f"lazyx: {type(exc).__name__}: {exc}\n")
        if args.command == "info" and args.env:  # what --env is for: finding the culprit
            from lazyx import environment  # needs no lazyx.core
            if args.json:
                print(json.dumps({"error": str(exc), "environment": environment.current()},
                                 indent=2))
            else:
                _environment(sys.stdout.write, environment.current())
        return 1
    parser.print_help()
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
