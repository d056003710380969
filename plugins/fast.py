"""Op pack ``fast`` (issue 14): being built."""

from __future__ import annotations

from lazyx.hookspecs import pack_hooks

PRIMITIVES: list = []
OPS: dict = {}

lazyx_primitives, lazyx_ops = pack_hooks(PRIMITIVES, OPS)
