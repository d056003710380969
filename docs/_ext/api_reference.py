"""The API reference, generated from the modules themselves: ``.. lazyx-api:: lazyx.core``.

A page of ``docs/api/`` is a title and this directive. The directive asks the module
what a user sees in it (:func:`public_names`: its ``__all__``, or its lazyx-defined
names where it has none, plus what the built-in plugins installed, such as the ops of
``lazyx.core`` and the ``linalg``/``fft``/``random`` namespaces), and writes, as
reStructuredText that Sphinx then parses:

1. the module's docstring, under a ``py:module`` target;
2. one section per module that defines the names (``lazyx.plugins.elementwise``,
   ``lazyx.device`` ...), titled by that module's docstring, each an ``autosummary``
   table followed by the ``autoclass``/``autofunction`` entries, classes first;
3. a "Data" section (dtypes, constants, tables), as ``autodata`` entries;
4. a section per namespace (a submodule whose names the module does not re-export,
   such as ``lazyx.core.linalg`` or ``lazyx.nn.init``), written the same way.

So a new op or class appears in the reference by itself, and one without a docstring
is a warning (an error under ``-W``, as the docs test builds). Third-party plugins
are left out: ``conf.py`` disables their autoload, and :func:`public_names` drops names
that only a third-party plugin registered, whatever process it runs in.
``tests/docs/test_api_reference.py`` checks the built inventory against
:func:`public_names` of every covered module.
"""

from __future__ import annotations

import importlib
import inspect
import types

from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.parsing import nested_parse_to_nodes

logger = logging.getLogger(__name__)

#: The modules the reference covers, one page each (``docs/api/<last name>.rst``).
MODULES = ["lazyx.core", "lazyx.nn", "lazyx.optimizers", "lazyx.utils", "lazyx.extend",
           "lazyx.testing"]

# Section underlines by depth: the page title is "=", the generated sections go below it.
_UNDERLINES = "-~^\"'`"


def _registered(name: str) -> tuple[set[str], set[str]]:
    """Names the plugins installed directly in namespace ``name``: (built-in, third-party).

    ``lazyx.core`` holds the ops (``add``) and the namespaces (``linalg``);
    ``lazyx.core.linalg`` holds ``svd``. ``array.*`` entries are methods, not names.
    """
    if name != "lazyx.core" and not name.startswith("lazyx.core."):
        return set(), set()
    from lazyx import providers

    prefix = name[len("lazyx.core."):] + "." if name != "lazyx.core" else ""
    builtin: set[str] = set()
    third: set[str] = set()
    for key, (_, info) in providers.ops.items():
        if not key.startswith(prefix):
            continue
        head = key[len(prefix):].split(".")[0]
        if not prefix and head == "array":
            continue
        (builtin if info.builtin else third).add(head)
    return builtin, third - builtin


def third_party_members(cls_name: str) -> set[str]:
    """Methods a third-party plugin added to class ``cls_name`` of ``lazyx.core`` (``array.cube``)."""
    from lazyx import providers

    prefix = cls_name + "."
    return {key[len(prefix):] for key, (_, info) in providers.ops.items()
            if key.startswith(prefix) and not info.builtin}


def public_names(module: types.ModuleType, name: str | None = None) -> list[str]:
    """The names a user of ``module`` sees, in a stable order.

    ``__all__`` where the module declares it, otherwise its non-underscore names that
    lazyx defines (typing helpers and imported modules left out); plus, for
    ``lazyx.core`` and its namespaces, what the built-in plugins installed, minus what
    only third-party plugins did. A submodule counts when it is a namespace of its own
    (some of its names are not re-exported here: ``lazyx.nn.init``, not
    ``lazyx.nn.layers``).
    """
    name = name or module.__name__
    builtin, third = _registered(name)
    declared = getattr(module, "__all__", None)
    names = list(declared) if declared is not None else []
    for key, value in vars(module).items():
        if key.startswith("_") or key in names or key in third:
            continue
        if key in builtin:
            names.append(key)
        elif declared is not None:
            continue
        elif isinstance(value, types.ModuleType):
            if _is_namespace(module, value):
                names.append(key)
        elif str(getattr(value, "__module__", None) or "").startswith("lazyx"):
            names.append(key)
    return sorted(names, key=lambda n: (n.lower(), n))


_MISSING = object()


def _is_namespace(parent: types.ModuleType, sub: types.ModuleType) -> bool:
    """Whether ``sub``, found in ``parent``, holds names ``parent`` does not re-export."""
    if not sub.__name__.startswith(parent.__name__ + "."):
        return False  # an import (``math``, ``lazyx.core as mx``), not a part of it
    return any(getattr(parent, n, _MISSING) is not getattr(sub, n) for n in public_names(sub))


def _kind(value) -> str:
    if isinstance(value, types.ModuleType):
        return "namespace"
    if inspect.isclass(value):
        return "exception" if issubclass(value, BaseException) else "class"
    if inspect.isroutine(value):
        return "function"
    return "data"


def _title(module_name: str) -> str:
    """A section title: the first clause of the defining module's docstring."""
    try:
        doc = inspect.getdoc(importlib.import_module(module_name)) or ""
    except ImportError:
        doc = ""
    first = doc.strip().split("\n\n")[0].replace("\n", " ")
    for stop in (": ", ". ", "; "):
        first = first.split(stop)[0]
    return first.rstrip(".").strip() or module_name


def _heading(text: str, depth: int) -> list[str]:
    return [text, _UNDERLINES[depth] * max(len(text), 4), ""]


def _walk(name: str, module: types.ModuleType):
    """``(full name, value)`` of every public name of ``module`` and its namespaces."""
    for key in public_names(module, name):
        value = getattr(module, key)
        if isinstance(value, types.ModuleType):
            yield from _walk(f"{name}.{key}", value)
        else:
            yield f"{name}.{key}", value


_homes: dict[int, str] = {}


def home_of(value) -> str | None:
    """Where a class or function is documented in full: the first name it has in the
    covered modules (in :data:`MODULES` order, ``lazyx.core`` first). ``lazyx.extend``
    re-exports ``array``, ``Device``, ``Primitive`` ...: their rows link to
    ``lazyx.core``'s entries instead of describing them twice (which Sphinx reports as
    duplicates, and which makes ``array`` in a docstring ambiguous)."""
    if not _homes:
        for module_name in MODULES:
            for full, obj in _walk(module_name, importlib.import_module(module_name)):
                if inspect.isclass(obj) or inspect.isroutine(obj):
                    _homes.setdefault(id(obj), full)
    return _homes.get(id(value))


def documented_name(namespace: str, key: str, value) -> str:
    """The reference entry a user's name ``namespace.key`` leads to: its own, or, for a
    re-export of another covered module's class or function, that one's (aliases within
    one covered module, ``arccos``/``acos`` or ``norm``/``linalg.norm``, each have their
    own entry)."""
    home = home_of(value) if inspect.isclass(value) or inspect.isroutine(value) else None
    if home is None or _covered(home) == _covered(namespace):
        return f"{namespace}.{key}"
    return home


def reference_targets(name: str, module: types.ModuleType):
    """``(name a user writes, inventory entry it leads to)`` for every public name of
    ``module`` and of its namespaces (a namespace leads to its own ``py:module``)."""
    for key in public_names(module, name):
        value = getattr(module, key)
        full = f"{name}.{key}"
        if isinstance(value, types.ModuleType):
            yield full, full
            yield from reference_targets(full, value)
        else:
            yield full, documented_name(name, key, value)


def _covered(name: str) -> str:
    """The covered module (:data:`MODULES`) that ``name`` is in."""
    return next((m for m in MODULES if name == m or name.startswith(m + ".")), name)


def module_rst(name: str, module: types.ModuleType, depth: int, location) -> list[str]:
    """The reStructuredText of one module's reference (see the module docstring)."""
    lines = [f".. py:module:: {name}", ""]
    doc = inspect.getdoc(module) if isinstance(module.__doc__, str) else None
    if doc:
        lines += doc.splitlines() + [""]
    groups: dict[str, list[tuple[str, str, object]]] = {}
    data, namespaces = [], []
    for key in public_names(module, name):
        value = getattr(module, key)
        kind = _kind(value)
        if kind == "namespace":
            namespaces.append((key, value))
            continue
        if kind == "data":
            data.append(key)
            continue
        if not (value.__doc__ or "").strip():
            logger.warning("lazyx API reference: %s.%s has no docstring; write one in MLX's "
                           "voice (what it does, Args, Returns)", name, key, location=location)
        owner = getattr(value, "__module__", None) or name
        groups.setdefault(owner, []).append((key, kind, value))

    titled = len(groups) + bool(data) + len(namespaces) > 1
    order = {"class": 0, "exception": 1, "function": 2}
    for owner, entries in sorted(groups.items(), key=lambda item: _title(item[0]).lower()):
        entries.sort(key=lambda e: (order[e[1]], e[0].lower(), e[0]))
        if titled:
            lines += _heading(_title(owner), depth)
        # Rows are relative to the current module (``py:module`` above); a re-export
        # links to its home entry.
        rows, entry_lines = [], []
        for key, kind, value in entries:
            target = documented_name(name, key, value)
            if target != f"{name}.{key}":
                rows.append(f"   ~{target}")
                continue
            rows.append(f"   {key}")
            entry_lines.append(f".. auto{kind}:: {target}")
            if kind == "class":
                entry_lines += ["   :members:", "   :show-inheritance:"]
                skip = third_party_members(key) if name == "lazyx.core" else set()
                if skip:
                    entry_lines.append(f"   :exclude-members: {', '.join(sorted(skip))}")
            entry_lines.append("")
        lines += [".. autosummary::", "   :nosignatures:", ""] + rows + [""] + entry_lines
    if data:
        if titled:
            lines += _heading("Data", depth)
        for key in data:
            lines += [f".. autodata:: {name}.{key}", ""]
    for key, value in namespaces:
        lines += _heading(f"{name}.{key}", depth)
        lines += module_rst(f"{name}.{key}", value, depth + 1, location)
    return lines


class LazyxApi(SphinxDirective):
    """``.. lazyx-api:: lazyx.core``: the whole reference of one module, in place."""

    required_arguments = 1

    def run(self):
        name = self.arguments[0]
        module = importlib.import_module(name)
        text = "\n".join(module_rst(name, module, 0, self.get_location()))
        return nested_parse_to_nodes(self.state, text, source=self.get_source_info()[0],
                                     allow_section_headings=True)


def _drop_type_docstring(app, what, name, obj, options, lines):
    """A constant (``pi``, ``float32``) has no docstring of its own: show no text rather
    than its type's (``float``'s "Convert a string or number ..."), unless it is the
    module's documented data."""
    if what == "data" and not isinstance(obj, type) and "\n".join(lines).strip() == \
            inspect.cleandoc(type(obj).__doc__ or "").strip():
        lines[:] = []


def setup(app):
    app.add_directive("lazyx-api", LazyxApi)
    # Before napoleon (priority 500) rewrites the type's docstring into fields.
    app.connect("autodoc-process-docstring", _drop_type_docstring, priority=100)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
