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


def pack_hooks(primitives, ops):
    """The ``lazyx_primitives`` and ``lazyx_ops`` hooks of an op pack made of two tables.

    An op pack lists its primitive classes and its public names once; this gives it
    both hooks, so its module ends with one line instead of two hook functions::

        PRIMITIVES = [Fill, Full]
        OPS = {"zeros": zeros, "full": full}
        lazyx_primitives, lazyx_ops = pack_hooks(PRIMITIVES, OPS)

    pluggy finds hooks by attribute name, so the names the module binds them to are
    what count.
    """
    @hookimpl
    def lazyx_primitives():
        return list(primitives)

    @hookimpl
    def lazyx_ops():
        return dict(ops)

    return lazyx_primitives, lazyx_ops


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

    A name lazyx itself provides (``"exp"``, ``"array.sum"``, ``"eval"``) stays
    the built-in: a third-party claim on it is refused with a warning naming both
    distributions. Two third-party plugins that return the same name are a
    :class:`~lazyx.errors.PluginError` naming both distributions; the name is then
    unusable until one is removed.
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


@hookspec
def lazyx_distributed_backends():
    """Return communication backends of ``lazyx.core.distributed``:
    :class:`lazyx.backends.distributed.CommunicationBackend` instances (a ``name``,
    the ``device`` type they serve, ``is_available()``, ``unavailable_reason()`` and
    ``init(strict)`` returning a ``Communicator``). ``distributed.init(backend=name)``
    starts one; ``backend="any"`` tries them in turn. Read when ``init`` is first
    called, not when plugins load.
    """


@hookspec
def lazyx_examples():
    """Return example uses of primitives, for the registry-wide transform test.

    A list of ``(primitive_class, make)`` pairs. ``make()`` returns ``(fn,
    args)``: ``args`` is a list of arrays (lazyx or NumPy; floating ones in
    float64, integer ones such as indices or random keys as they must be) and
    ``fn(*args)`` builds a graph that contains a node of ``primitive_class``,
    returning an array or a list of arrays. ``fn`` must be differentiable in
    its floating arguments at ``args``: pick inputs away from kinks and domain
    edges (``abs`` at 0, ``log`` at 0, ties of ``max``). ``make`` may return a
    third element, a dict of options:

    * ``"batch_ints": False``: batch integer arguments by repeating them rather
      than by reversing them (reversed index arrays must stay valid, e.g. not
      for start indices of different axes).

    Give one or more examples per primitive and keep shapes small (a few
    elements): ``tests/transforms/test_every_primitive.py`` runs each one and
    checks ``vjp`` against central finite differences in float64, ``jvp``
    against ``vjp``, and ``vmap`` (batches of the arguments on different axes)
    against a Python loop. For a primitive with ``differentiable = False``
    (comparisons, integer results, random draws) it checks instead that the
    cotangents and tangents are zero, and ``vmap``. A registered primitive
    with no example, or without ``vjp``, ``jvp`` or ``vmap``, fails that test
    with its name and its plugin's distribution. Examples are collected only
    by tests (:func:`lazyx.registry.examples`), never when plugins load.

    Example::

        @hookimpl
        def lazyx_examples():
            x = np.linspace(-1.0, 1.0, 6).reshape(2, 3)
            return [(Cube, lambda: (cube, [x]))]
    """
