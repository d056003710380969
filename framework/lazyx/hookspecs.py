"""Everything a lazyx plugin can do: the hook specifications.

A plugin is a module (or object) named by an entry point in the group
``lazyx``::

    [project.entry-points.lazyx]
    axpby = "lazyx_axpby.plugin"

It implements any of the hooks below, each marked with ``lazyx.hookimpl``.
Every hook is called once per plugin when ``lazyx.core`` is first imported;
what each returns is recorded together with the plugin's distribution, so
``lazyx info`` can say who provides what and conflicts name both parties.
The built-in op packs and backends register through these same hooks, from
lazyx's own entry points.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("lazyx")
hookimpl = pluggy.HookimplMarker("lazyx")


@hookspec
def lazyx_primitives():
    """Return the :class:`~lazyx.primitive.Primitive` subclasses this plugin defines.

    Registered primitives are listed by ``lazyx info``, walked by the
    registry-driven tests, and checked for kernels on every backend.
    """


@hookspec
def lazyx_ops():
    """Return a mapping from public name to function (or value).

    * ``"add"`` installs ``lazyx.core.add``;
    * ``"random.uniform"`` installs ``lazyx.core.random.uniform`` (submodules
      ``random``, ``linalg``, ``fft`` and ``fast`` exist; a new prefix makes a
      new submodule of ``lazyx.core``);
    * ``"array.__add__"`` or ``"array.sum"`` installs a method (or property) on
      :class:`lazyx.core.array`.

    Two plugins that return the same name are a :class:`~lazyx.errors.PluginError`
    naming both distributions; the name is then unusable until one is removed.
    """


@hookspec
def lazyx_backends():
    """Return :class:`~lazyx.backend.Backend` instances this plugin provides."""


@hookspec
def lazyx_kernels():
    """Return ``(backend_name, primitive_class, kernel)`` triples.

    ``kernel(primitive, inputs) -> buffer | tuple[buffer, ...]`` runs
    ``primitive`` on ``backend_name``. Precedence for a primitive on a backend:
    a kernel from this hook (a plugin's override) wins over the backend's own
    kernel table, which wins over the primitive's ``eval_cpu``/``eval_gpu``.
    Two plugins overriding the same (backend, primitive) is an error naming both.
    """
