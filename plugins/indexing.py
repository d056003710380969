"""The indexing op pack (to be filled)."""

from lazyx.hookspecs import hookimpl

PRIMITIVES = []
OPS = {}


@hookimpl
def lazyx_primitives():
    return PRIMITIVES


@hookimpl
def lazyx_ops():
    return OPS
