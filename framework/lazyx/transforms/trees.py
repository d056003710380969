"""Trees of arrays, as the transforms see them.

A tree is a nested structure of ``list``, ``tuple`` and ``dict`` (subclasses
included; a ``dict`` subclass such as an ``nn.Module`` comes back as a plain
``dict``, as in MLX); everything else is a leaf. The transforms flatten their
arguments and results into leaves, work on the arrays among them, and rebuild
the same structure.

A flattened structure (a *treedef*) is a nested tuple:

* ``None`` for a leaf;
* ``(type, children)`` for a list or tuple (``children`` a tuple of treedefs);
* ``(dict, keys, children)`` for a dict.
"""

from __future__ import annotations

from ..array import array
from ..array import native as _native
from ..errors import ArgumentError

__all__ = ["flatten", "unflatten", "count_leaves", "leaf_paths", "broadcast_prefix", "describe"]

_array = array


def flatten(tree, leaves: list | None = None):
    """``(leaves, treedef)``: the leaves of ``tree`` in order, and its structure."""
    if leaves is None:
        leaves = []
    return leaves, _flatten_native(tree, leaves)


def _flatten(t, leaves):
    tt = type(t)
    if tt is _array:
        leaves.append(t)
        return None
    if tt is tuple or tt is list:
        return (tt, tuple(_flatten(c, leaves) for c in t))
    if tt is dict:
        return (dict, tuple(t.keys()), tuple(_flatten(c, leaves) for c in t.values()))
    if isinstance(t, (list, tuple)):
        return (tt, tuple(_flatten(c, leaves) for c in t))
    if isinstance(t, dict):
        return (dict, tuple(t.keys()), tuple(_flatten(c, leaves) for c in t.values()))
    leaves.append(t)
    return None


# The walk in C++ (framework/native/graph.cpp, ``flatten``) where the core's native module
# is built; _flatten above is its reference, and the tests check that both agree.
_flatten_native = _native.flatten if _native is not None else _flatten


def unflatten(treedef, leaves, start: int = 0):
    """The tree of structure ``treedef`` holding ``leaves`` (from index ``start``)."""
    return _unflatten(treedef, iter(leaves[start:]) if start else iter(leaves))


def _unflatten(d, it):
    if d is None:
        return next(it)
    tt = d[0]
    if tt is dict:
        return {k: _unflatten(c, it) for k, c in zip(d[1], d[2])}
    children = [_unflatten(c, it) for c in d[1]]
    if tt is list:
        return children
    if tt is tuple:
        return tuple(children)
    if hasattr(tt, "_fields"):  # a namedtuple
        return tt(*children)
    return tt(children)


def leaf_paths(treedef, prefix: str = "") -> list[str]:
    """The path of every leaf of ``treedef`` (``"[0]['w']"``), in flattening order."""
    out: list[str] = []
    stack = [(treedef, prefix)]
    while stack:
        d, p = stack.pop()
        if d is None:
            out.append(p)
        elif d[0] is dict:
            stack.extend(reversed([(c, f"{p}[{k!r}]") for k, c in zip(d[1], d[2])]))
        else:
            stack.extend(reversed([(c, f"{p}[{i}]") for i, c in enumerate(d[1])]))
    return out


def describe(x) -> str:
    """A short description of a value for error messages."""
    if isinstance(x, _array):
        return f"an array of shape {x.shape} and dtype {x.dtype.name}"
    return f"a value of type {type(x).__name__}"


def broadcast_prefix(prefix, treedef, path: str, what: str, is_spec=None) -> list:
    """Expand ``prefix`` (a tree whose leaves apply to whole subtrees, e.g. ``in_axes``)
    to one value per leaf of ``treedef``.

    Raises ArgumentError naming ``path`` where ``prefix`` is not a prefix of the tree.
    ``is_spec(x)`` says whether ``x`` is a prefix leaf (default: not a list/tuple/dict).
    """
    out: list = []
    _expand(prefix, treedef, path, what, out, is_spec)
    return out


def count_leaves(d) -> int:
    """How many leaves treedef ``d`` has."""
    if d is None:
        return 1
    return sum(count_leaves(c) for c in d[-1])


def _expand(p, d, path, what, out, is_spec):
    spec = is_spec(p) if is_spec is not None else not isinstance(p, (list, tuple, dict))
    if spec:
        out.extend([p] * count_leaves(d))
        return
    if d is None:
        raise ArgumentError(f"{what} at {path or 'the top level'} is a {type(p).__name__} "
                            f"but the value there is a single leaf, not a tree.")
    if d[0] is dict:
        if not isinstance(p, dict):
            raise ArgumentError(f"{what} at {path or 'the top level'} is a {type(p).__name__} "
                                f"but the value there is a dict.")
        keys = d[1]
        if set(p.keys()) != set(keys):
            raise ArgumentError(f"{what} at {path or 'the top level'} has keys "
                                f"{sorted(map(str, p.keys()))} but the value there has keys "
                                f"{sorted(map(str, keys))}.")
        for k, c in zip(keys, d[2]):
            _expand(p[k], c, f"{path}[{k!r}]", what, out, is_spec)
        return
    if not isinstance(p, (list, tuple)):
        raise ArgumentError(f"{what} at {path or 'the top level'} is a {type(p).__name__} "
                            f"but the value there is a {d[0].__name__}.")
    if len(p) != len(d[1]):
        raise ArgumentError(f"{what} at {path or 'the top level'} has {len(p)} entries but the "
                            f"value there has {len(d[1])}.")
    for i, (q, c) in enumerate(zip(p, d[1])):
        _expand(q, c, f"{path}[{i}]", what, out, is_spec)
