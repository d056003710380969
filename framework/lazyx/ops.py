"""The late-bound op table: how lazyx's own floors call an op by name.

Transforms, rules and code generation need ops (``add``, ``zeros_like``,
``broadcast_to`` ...), which the op packs register as plugins. They must not
import ``lazyx.core`` for them: the façade sits on top of them, and importing it
from below makes an import circle. They read the op from here instead::

    from lazyx import ops
    ops.add(a, b, stream=s)

A name resolves through the plugin registry (:data:`lazyx.registry.ops`) the
first time it is read, then stays a plain module attribute, so a call costs one
attribute lookup. This is JAX's rule that interpreters never import the
user-facing op library, with the registry as the table between them.
"""

from __future__ import annotations

from . import registry as _registry
from .errors import PluginError


def __getattr__(name: str):
    entry = _registry.ops.get(name)
    if entry is None:
        if name.startswith("__"):
            raise AttributeError(name)
        if not _registry.loaded():
            raise PluginError(f"lazyx.ops.{name}: the op packs are not loaded yet; "
                              f"import lazyx.core first.")
        raise AttributeError(f"lazyx.ops has no op {name!r}: no loaded plugin registers it.")
    fn = entry[0]
    globals()[name] = fn
    return fn
