"""Who provides what: the tables the plugin registry fills, and nothing else.

The lowest floor of the plugin machinery: :mod:`lazyx.primitive`, :mod:`lazyx.backend`
and :mod:`lazyx.scheduler` read these tables (to name a primitive's plugin in an
error, to find a kernel override), and :mod:`lazyx.registry`, which discovers and
loads plugins, writes them. Keeping the tables here lets the floors read them
without importing the loader (which imports them).
"""

from __future__ import annotations

__all__ = ["PluginInfo", "CORE_DISTRIBUTION", "plugins", "primitives", "ops", "conflicts",
           "kernel_overrides", "kernel_conflicts", "skipped", "provider_of"]

#: The distribution of lazyx itself: its plugins are the built-in packs and backends.
CORE_DISTRIBUTION = "lazyx"


class PluginInfo:
    """What one plugin is and what it registered (and was refused)."""

    __slots__ = ("name", "distribution", "version", "module", "error",
                 "primitives", "ops", "backends", "kernels", "refused")

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
        # (name, label of the built-in that keeps it) for each claim refused.
        self.refused: list[tuple[str, str]] = []

    @property
    def label(self) -> str:
        version = f" {self.version}" if self.version else ""
        return f"plugin {self.name!r} of distribution {self.distribution!r}{version}"

    @property
    def builtin(self) -> bool:
        """Whether lazyx itself registered it (a built-in pack or backend)."""
        return self.distribution == CORE_DISTRIBUTION

    def __repr__(self) -> str:
        return f"PluginInfo({self.name!r}, {self.distribution!r}, {self.version!r})"


plugins: dict[str, PluginInfo] = {}
primitives: dict[type, PluginInfo] = {}
ops: dict[str, tuple[object, PluginInfo]] = {}
conflicts: dict[str, list[PluginInfo]] = {}
kernel_overrides: dict[tuple[str, type], tuple[object, PluginInfo]] = {}
kernel_conflicts: dict[tuple[str, type], list[PluginInfo]] = {}
# Entry points not loaded at all, with why: (PluginInfo without a module, reason).
skipped: list[tuple[PluginInfo, str]] = []


def provider_of(prim) -> str:
    """Which plugin registered ``prim``'s class, as text for error messages."""
    info = primitives.get(type(prim))
    return info.label if info is not None else "an unregistered primitive"

