"""The ``lazyx`` console script.

``lazyx info`` prints the version, the devices, the backends (available or why
not), every plugin with its distribution and version (and the error of any that
failed to load, or the built-in names it was refused), the plugins skipped and
why, its primitives and how many of them each backend has a kernel for, the
kernel overrides plugins installed, and which backend lacks a kernel for which
primitive. ``lazyx kernels [NAME ...] [--backend B]`` says who provides
each primitive's kernel on each backend. ``lazyx cache`` shows where the kernel
cache is, its size and its entry count; ``lazyx cache clear`` empties it.
"""

from __future__ import annotations

import sys


def info(out=None) -> None:
    """Print what this lazyx installation is made of."""
    out = out or sys.stdout
    import lazyx
    import lazyx.core as mx
    from lazyx import registry
    from lazyx.backend import active_backend, backends, resolve_kernel

    w = out.write
    w(f"lazyx {lazyx.__version__}\n\n")
    w("Devices:\n")
    for dt in mx.DeviceType:
        avail = mx.is_available(mx.Device(dt))
        w(f"  {dt.name}: {'available' if avail else 'not available'}"
          f"{' (default)' if mx.default_device().type is dt else ''}\n")
    w("\nBackends:\n")
    for name, b in sorted(backends().items()):
        active = ""
        try:
            active = " [active]" if active_backend(b.device_type) is b else ""
        except Exception:
            pass
        state = "available" if b.is_available() else f"not available: {b.unavailable_reason()}"
        provider = registry.plugins.get(_plugin_of_backend(name))
        who = f" from {provider.distribution} {provider.version}" if provider else ""
        w(f"  {name} ({b.device_type.name}){active}{who}: {state}\n")
        extra = b.describe()
        if extra:
            w(f"    {extra}\n")
    w("\nPlugins:\n")
    for name, p in sorted(registry.plugins.items()):
        if p.error is not None:
            w(f"  {name} ({p.distribution} {p.version}): FAILED TO LOAD: "
              f"{type(p.error).__name__}: {p.error}\n")
            continue
        parts = []
        if p.primitives:
            parts.append(f"{len(p.primitives)} primitives")
        if p.ops:
            parts.append(f"{len(p.ops)} names")
        if p.backends:
            parts.append("backends " + ", ".join(p.backends))
        if p.kernels:
            parts.append(f"{len(p.kernels)} kernel overrides")
        w(f"  {name} ({p.distribution} {p.version}): {'; '.join(parts) or 'nothing registered'}\n")
        if p.primitives:
            w("    primitives: " + " ".join(c.name for c in p.primitives) + "\n")
            w("    kernels: " + ", ".join(
                f"{bname} {_served(b, p.primitives)}/{len(p.primitives)}"
                + ("" if b.is_available() else " (not available)")
                for bname, b in sorted(backends().items())) + "\n")
        for b, prim in p.kernels:
            w(f"    kernel override: {prim} on {b}\n")
        for claim, owner in p.refused:
            w(f"    REFUSED: {claim} (built in: {owner})\n")
    if registry.skipped:
        w("\nSkipped plugins (not loaded):\n")
        for p, reason in registry.skipped:
            w(f"  {p.name} ({p.distribution} {p.version}): {reason}\n")
    if registry.kernel_overrides or registry.kernel_conflicts:
        # Precedence: a plugin's override, then the backend's own kernel, then the
        # primitive's eval_cpu/eval_gpu (lazyx.backend).
        w("\nKernel overrides (a plugin's kernel wins over the backend's own):\n")
        for (bname, cls), (fn, who) in sorted(registry.kernel_overrides.items(),
                                               key=lambda kv: (kv[0][0], kv[0][1].name)):
            w(f"  {cls.name} on {bname}: {who.label}\n")
        for (bname, cls), whos in sorted(registry.kernel_conflicts.items(),
                                         key=lambda kv: (kv[0][0], kv[0][1].name)):
            w(f"  {cls.name} on {bname}: CONFLICT, none used: "
              + " and ".join(i.label for i in whos) + "\n")
    if registry.conflicts:
        w("\nConflicts (these names are disabled):\n")
        for n, owners in sorted(registry.conflicts.items()):
            w(f"  {n}: " + " and ".join(o.label for o in owners) + "\n")
    w("\nMissing kernels:\n")
    any_missing = False
    for name, b in sorted(backends().items()):
        missing = [cls.name for cls in registry.primitives
                   if getattr(resolve_kernel(b, cls)[0], "missing", False)]
        if missing:
            any_missing = True
            reason = "" if b.is_available() else " (backend not available)"
            w(f"  {name}{reason}: {len(missing)} of {len(registry.primitives)} primitives: "
              + " ".join(sorted(missing)) + "\n")
    if not any_missing:
        w("  none\n")


def _served(backend, classes) -> int:
    from lazyx.backend import resolve_kernel
    return sum(not getattr(resolve_kernel(backend, c)[0], "missing", False) for c in classes)


def kernels(names=(), backend_names=(), out=None) -> int:
    """Print who provides the kernel of each primitive on each backend.

    Args:
        names: primitive names to show (default: every registered primitive).
        backend_names: backends to show (default: all).
    Returns:
        the exit status: 1 when a name is unknown.
    """
    out = out or sys.stdout
    import lazyx.core  # noqa: F401  (loads the plugins)
    from lazyx import registry
    from lazyx.backend import backends, resolve_kernel

    all_backends = backends()
    unknown = [b for b in backend_names if b not in all_backends]
    classes = sorted(registry.primitives, key=lambda c: (c.name, registry.primitives[c].name))
    if names:
        unknown += [n for n in names if not any(c.name == n for c in classes)]
        classes = [c for c in classes if c.name in names]
    if unknown:
        out.write(f"unknown: {', '.join(unknown)}\n")
        return 1
    shown = [(n, b) for n, b in sorted(all_backends.items()) if not backend_names or n in backend_names]
    for cls in classes:
        out.write(f"{cls.name} ({registry.primitives[cls].label}):\n")
        for n, b in shown:
            out.write(f"  {n}: {resolve_kernel(b, cls)[1]}\n")
    return 0


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
    parser = argparse.ArgumentParser(prog="lazyx", description="lazyx command line.")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("info", help="version, devices, backends, plugins, primitives, missing kernels")
    k = sub.add_parser("kernels", help="who provides each primitive's kernel on each backend")
    k.add_argument("primitives", nargs="*", help="primitive names (default: all)")
    k.add_argument("--backend", action="append", default=[], help="only this backend (repeatable)")
    c = sub.add_parser("cache", help="the kernel cache: location, size, entries; `clear` empties it")
    c.add_argument("action", nargs="?", choices=["clear"], help="clear: delete every entry")
    args = parser.parse_args(argv)
    if args.command == "info":
        info()
        return 0
    if args.command == "kernels":
        return kernels(args.primitives, args.backend)
    if args.command == "cache":
        return cache(args.action)
    parser.print_help()
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
