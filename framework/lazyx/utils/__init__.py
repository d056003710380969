"""Tree utilities: Python containers of arrays as plain data (``mlx.utils``).

A *tree* is any nesting of ``list``, ``tuple`` (named tuples included) and ``dict``
(``nn.Module`` is a dict); everything else is a *leaf*. Model parameters, gradients and
optimizer state are all trees, so the same six functions serve the whole roof:

- ``tree_flatten`` walks a tree depth-first into ``[("layers.0.weight", leaf), ...]``
  (the key format of saved weights); ``tree_unflatten`` rebuilds the tree, turning a
  level whose keys are all digits into a list.
- ``tree_map`` / ``tree_map_with_path`` rebuild a tree with ``fn`` applied to its leaves
  (the extra trees are indexed by the first tree's keys, so they may be supersets).
- ``tree_reduce`` folds the leaves; ``tree_merge`` overlays two trees that hold their
  leaves at different places.

``is_leaf`` lets a caller stop the walk at a container (``is_leaf=lambda x:
isinstance(x, tuple)``). Empty containers hold no leaves and vanish from a flattening.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple, Union

__all__ = [
    "tree_flatten",
    "tree_unflatten",
    "tree_map",
    "tree_map_with_path",
    "tree_reduce",
    "tree_merge",
]


def _is_sequence(tree: Any) -> bool:
    return isinstance(tree, (list, tuple))


def _rebuild_sequence(tree: Any, items: List[Any]) -> Any:
    """A list/tuple of ``tree``'s type holding ``items`` (named tuples take fields)."""
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*items)
    if isinstance(tree, list):
        return items if type(tree) is list else type(tree)(items)
    return type(tree)(items)


def tree_map(fn: Callable, tree: Any, *rest: Any, is_leaf: Optional[Callable] = None) -> Any:
    """Apply ``fn`` to the leaves of ``tree`` and return a tree of the results.

    Every tree in ``rest`` must contain ``tree``'s structure (it may hold more); its
    matching leaves are passed to ``fn`` as extra positional arguments, as
    ``itertools.starmap`` does. Lists and tuples keep their type; dicts (``Module``
    included) come back as plain ``dict``.

    Args:
        fn (callable): Called as ``fn(leaf, *rest_leaves)``.
        tree (Any): The tree walked.
        rest (Any): Trees walked alongside ``tree``.
        is_leaf (callable, optional): Returns ``True`` for a node to treat as a leaf.

    Returns:
        The tree of ``fn``'s results.

    Example:
        >>> tree_map(lambda x: x * 2, {"a": [1, 2], "b": 3})
        {'a': [2, 4], 'b': 6}
    """
    if is_leaf is not None and is_leaf(tree):
        return fn(tree, *rest)
    if _is_sequence(tree):
        items = [
            tree_map(fn, child, *[r[i] for r in rest], is_leaf=is_leaf)
            for i, child in enumerate(tree)
        ]
        return _rebuild_sequence(tree, items)
    if isinstance(tree, dict):
        return {
            k: tree_map(fn, child, *[r[k] for r in rest], is_leaf=is_leaf)
            for k, child in tree.items()
        }
    return fn(tree, *rest)


def tree_map_with_path(
    fn: Callable,
    tree: Any,
    *rest: Any,
    is_leaf: Optional[Callable] = None,
    path: Optional[Any] = None,
) -> Any:
    """Like :func:`tree_map`, but ``fn`` receives the leaf's dotted path first.

    Args:
        fn (callable): Called as ``fn(path, leaf, *rest_leaves)``.
        tree (Any): The tree walked.
        rest (Any): Trees walked alongside ``tree``.
        is_leaf (callable, optional): Returns ``True`` for a node to treat as a leaf.
        path (str, optional): A prefix for the paths (a leaf at the top gets ``path``).

    Returns:
        The tree of ``fn``'s results.

    Example:
        >>> tree_map_with_path(lambda p, x: p, {"model": [{"w": 0}]})
        {'model': [{'w': 'model.0.w'}]}
    """
    if is_leaf is not None and is_leaf(tree):
        return fn(path, tree, *rest)

    def child_path(key):
        return f"{path}.{key}" if path else str(key)

    if _is_sequence(tree):
        items = [
            tree_map_with_path(
                fn, child, *[r[i] for r in rest], is_leaf=is_leaf, path=child_path(i)
            )
            for i, child in enumerate(tree)
        ]
        return _rebuild_sequence(tree, items)
    if isinstance(tree, dict):
        return {
            k: tree_map_with_path(
                fn, child, *[r[k] for r in rest], is_leaf=is_leaf, path=child_path(k)
            )
            for k, child in tree.items()
        }
    return fn(path, tree, *rest)


def tree_flatten(
    tree: Any,
    prefix: str = "",
    is_leaf: Optional[Callable] = None,
    destination: Union[List[Tuple[str, Any]], Dict[str, Any], None] = None,
) -> Union[List[Tuple[str, Any]], Dict[str, Any]]:
    """Flatten a tree into ``(dotted_key, leaf)`` pairs, depth first.

    Args:
        tree (Any): The tree to flatten.
        prefix (str): Prepended to every key; its first character is dropped, so
            ``prefix=".model"`` gives keys ``"model.…"``.
        is_leaf (callable, optional): Returns ``True`` for a node to treat as a leaf.
        destination (list or dict, optional): Where the pairs go: a list gets
            ``(key, leaf)`` tuples appended, a dict gets ``key: leaf`` entries.
            Default: a new list.

    Returns:
        ``destination`` (a new list when not given).

    Example:
        >>> tree_flatten({"layers": [{"weight": 1}]})
        [('layers.0.weight', 1)]
    """
    if destination is None:
        destination = []
    if isinstance(destination, dict):
        add = destination.__setitem__
    elif isinstance(destination, list):
        add = lambda k, v: destination.append((k, v))  # noqa: E731
    else:
        raise TypeError(
            f"tree_flatten: destination must be a list or a dict, got {type(destination).__name__}"
        )

    def walk(node, key):
        if is_leaf is not None and is_leaf(node):
            add(key[1:], node)
        elif _is_sequence(node):
            for i, child in enumerate(node):
                walk(child, f"{key}.{i}")
        elif isinstance(node, dict):
            for k, child in node.items():
                walk(child, f"{key}.{k}")
        else:
            add(key[1:], node)

    walk(tree, prefix)
    return destination


def tree_unflatten(tree: Union[List[Tuple[str, Any]], Dict[str, Any]]) -> Any:
    """Rebuild a tree from its flat ``(dotted_key, leaf)`` form.

    A level whose keys are all digits becomes a list (missing indices are filled with
    empty dicts); other levels become dicts. A single pair with the empty key is the
    leaf itself.

    Args:
        tree (list or dict): Pairs as made by :func:`tree_flatten`, or a dict of them.

    Returns:
        The nested tree.

    Example:
        >>> tree_unflatten([("layers.0.weight", 1), ("bias", 2)])
        {'layers': [{'weight': 1}], 'bias': 2}
    """
    items = list(tree.items()) if isinstance(tree, dict) else list(tree)
    if len(items) == 1 and items[0][0] == "":
        return items[0][1]
    return _unflatten_level(items, "")


def _unflatten_level(items: List[Tuple[str, Any]], where: str) -> Any:
    children: Dict[str, Any] = {}
    leaves: Dict[str, Any] = {}
    for key, value in items:
        head, dot, tail = key.partition(".")
        if dot:
            if head in leaves:
                raise ValueError(_clash(where, head))
            children.setdefault(head, []).append((tail, value))
        else:
            if head in leaves or head in children:
                raise ValueError(_clash(where, head))
            leaves[head] = value

    def build(k):
        if k in leaves:
            return leaves[k]
        return _unflatten_level(children[k], f"{where}{k}.")

    keys = list(dict.fromkeys(k.partition(".")[0] for k, _ in items))
    if keys and all(k.isdigit() for k in keys):
        out: List[Any] = [{} for _ in range(max(int(k) for k in keys) + 1)]
        for k in keys:
            out[int(k)] = build(k)
        return out
    return {k: build(k) for k in keys}


def _clash(where: str, key: str) -> str:
    return (
        f"tree_unflatten: key '{where}{key}' is given both as a leaf and again "
        "(as a leaf or as the parent of other keys); every key must name one leaf"
    )


def tree_reduce(fn: Callable, tree: Any, initializer: Any = None, is_leaf: Optional[Callable] = None) -> Any:
    """Fold the leaves of ``tree`` with ``fn(accumulator, leaf)``.

    Args:
        fn (callable): The reducer.
        tree (Any): The tree whose leaves are folded, depth first.
        initializer (Any, optional): The starting accumulator; without it the first
            leaf starts the fold (an empty tree then gives ``None``).
        is_leaf (callable, optional): Returns ``True`` for a node to treat as a leaf.

    Returns:
        The accumulated value.

    Example:
        >>> tree_reduce(lambda acc, x: acc + x, {"a": [1, 2, 3], "b": [4, 5]}, 0)
        15
    """
    accumulator = initializer
    started = initializer is not None
    for _, leaf in tree_flatten(tree, is_leaf=is_leaf):
        if started:
            accumulator = fn(accumulator, leaf)
        else:
            accumulator, started = leaf, True
    return accumulator


def tree_merge(tree_a: Any, tree_b: Any, merge_fn: Optional[Callable] = None) -> Any:
    """Overlay two trees into one holding the leaves of both (a deep ``dict.update``).

    ``None`` and empty containers count as empty subtrees (two empty containers of
    different kinds are an error). Lists and tuples merge position by position, dicts
    key by key; where both trees hold something else at one place, ``merge_fn(a, b)``
    decides, and without one that is an error.

    Args:
        tree_a (Any): The first tree.
        tree_b (Any): The second tree.
        merge_fn (callable, optional): Merges two leaves found at one place.

    Returns:
        The merged tree.

    Example:
        >>> tree_merge({"a": [1, {}]}, {"a": [{}, {"c": 3}], "d": 4})
        {'a': [1, {'c': 3}], 'd': 4}
    """
    return _merge(tree_a, tree_b, merge_fn, "")


def _is_empty_container(tree: Any) -> bool:
    return isinstance(tree, (list, tuple, dict)) and len(tree) == 0


def _merge(a: Any, b: Any, merge_fn: Optional[Callable], where: str) -> Any:
    if _is_empty_container(a) and _is_empty_container(b):
        if type(a) is not type(b):
            raise ValueError(
                f"tree_merge: cannot merge {type(a).__name__} with {type(b).__name__} at "
                f"'{where[1:] or '<root>'}'")
        return a
    # An empty container is an empty subtree, like None: the other side wins.
    a = None if _is_empty_container(a) else a
    b = None if _is_empty_container(b) else b
    if a is None and b is not None:
        return b
    if b is None and a is not None:
        return a
    if _is_sequence(a) and _is_sequence(b):
        n = max(len(a), len(b))
        items = [
            _merge(a[i] if i < len(a) else None, b[i] if i < len(b) else None,
                   merge_fn, f"{where}.{i}")
            for i in range(n)
        ]
        return _rebuild_sequence(a, items)
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _merge(a.get(k), b.get(k), merge_fn, f"{where}.{k}")
                for k in dict.fromkeys([*a.keys(), *b.keys()])}
    if merge_fn is None:
        raise ValueError(
            f"tree_merge: both trees hold a value at '{where[1:] or '<root>'}' "
            f"({type(a).__name__} and {type(b).__name__}) but no merge_fn was given; "
            "pass merge_fn(a, b) to combine them"
        )
    return merge_fn(a, b)
