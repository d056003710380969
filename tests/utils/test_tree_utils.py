"""lazyx.utils tree functions: fixed cases with known answers, and MLX's mlx.utils as the
differential reference on generated trees (same flattenings, maps, reductions, merges)."""

from __future__ import annotations

import os
import sys
from collections import namedtuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lazyx.utils import (tree_flatten, tree_map, tree_map_with_path, tree_merge, tree_reduce,
                         tree_unflatten)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "mlx"))
from mlx_compat import requires_mlx  # noqa: E402

try:
    import mlx.utils as mlx_utils
except ImportError:  # pragma: no cover
    mlx_utils = None

Pair = namedtuple("Pair", "a b")

# Trees of ints: nested lists, tuples and dicts with identifier keys.
_keys = st.sampled_from(["a", "b", "w", "bias", "layers", "x0"])
trees = st.recursive(
    st.integers(-50, 50),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(_keys, children, max_size=4),
    ),
    max_leaves=20,
)


def test_flatten_known_cases():
    tree = {"layers": [{"weight": 1, "bias": 2}, {"weight": 3}], "out": (4, [5])}
    assert tree_flatten(tree) == [("layers.0.weight", 1), ("layers.0.bias", 2),
                                  ("layers.1.weight", 3), ("out.0", 4), ("out.1.0", 5)]
    assert tree_flatten(tree, prefix=".model")[0] == ("model.layers.0.weight", 1)
    assert tree_flatten(7) == [("", 7)]
    assert tree_flatten({"a": [], "b": {}}) == []
    assert tree_flatten({"a": [1, (2, 3)]}, is_leaf=lambda x: isinstance(x, tuple)) == \
        [("a.0", 1), ("a.1", (2, 3))]
    assert tree_flatten({"a": {"b": 1}}, destination={}) == {"a.b": 1}
    dest = [("z", 0)]
    assert tree_flatten([1], destination=dest) is dest and dest == [("z", 0), ("0", 1)]
    with pytest.raises(TypeError, match="destination"):
        tree_flatten([1], destination=set())


def test_unflatten_known_cases():
    assert tree_unflatten([("layers.0.weight", 1), ("bias", 2)]) == \
        {"layers": [{"weight": 1}], "bias": 2}
    assert tree_unflatten({"hello.world": 42}) == {"hello": {"world": 42}}
    assert tree_unflatten([("1", "b"), ("0", "a")]) == ["a", "b"]
    assert tree_unflatten([("0", 1), ("2", 3)]) == [1, {}, 3]       # gaps stay empty subtrees
    assert tree_unflatten([("0", 1), ("a", 2)]) == {"0": 1, "a": 2}  # mixed keys: a dict
    assert tree_unflatten([("", 5)]) == 5
    # A key given twice, or as a leaf and a parent, is an error naming it (MLX recurses forever).
    with pytest.raises(ValueError, match="'a'"):
        tree_unflatten([("a", 1), ("a", 2)])
    with pytest.raises(ValueError, match="'x.a'"):
        tree_unflatten([("x.a", 1), ("x.a.b", 2)])


def test_map_and_merge_known_cases():
    assert tree_map(lambda x, y: x + y, {"a": [1, (2, 3)]}, {"a": [10, (20, 30)], "extra": 0}) == \
        {"a": [11, (22, 33)]}
    assert tree_map(lambda x: x * 2, Pair(1, [2])) == Pair(2, [4])
    assert tree_map_with_path(lambda p, x: p, {"m": [{"w": 0}, 1]}) == {"m": [{"w": "m.0.w"}, "m.1"]}
    assert tree_map_with_path(lambda p, x: p, [[1]], path="pre") == [["pre.0.0"]]
    assert tree_reduce(lambda acc, x: acc + x, {"a": [1, 2, 3], "b": [4, 5]}) == 15
    assert tree_reduce(lambda acc, x: acc + x, {}, 3) == 3
    assert tree_reduce(lambda acc, x: acc + x, []) is None
    assert tree_merge({"a": [1, {}], "b": 2}, {"a": [{}, {"c": 3}], "d": 4}) == \
        {"a": [1, {"c": 3}], "b": 2, "d": 4}
    assert tree_merge({"a": 1}, {"a": 2}, lambda x, y: x + y) == {"a": 3}
    assert tree_merge((1, {}), (None, {"x": 1})) == (1, {"x": 1})
    with pytest.raises(ValueError, match="'a.0'.*merge_fn"):
        tree_merge({"a": [1]}, {"a": [2]})


@given(trees)
@settings(max_examples=60, deadline=None)
def test_flatten_unflatten_round_trip(tree):
    flat = tree_flatten(tree)
    rebuilt = tree_flatten(tree_unflatten(flat)) if flat else []
    # Tuples come back as lists and empty containers vanish; the flat form is a fixed point.
    assert rebuilt == flat


@requires_mlx
@given(trees)
@settings(max_examples=80, deadline=None)
def test_against_mlx(tree):
    u = mlx_utils
    for kw in ({}, {"prefix": ".p"}, {"is_leaf": lambda x: isinstance(x, tuple)}):
        assert tree_flatten(tree, **kw) == u.tree_flatten(tree, **kw)
    assert tree_flatten(tree, destination={}) == u.tree_flatten(tree, destination={})
    flat = tree_flatten(tree)
    if flat and flat != [("", tree)]:
        assert tree_unflatten(flat) == u.tree_unflatten(flat)
    assert tree_map(lambda x: x * 3 + 1, tree) == u.tree_map(lambda x: x * 3 + 1, tree)
    assert tree_map(lambda x, y: x - y, tree, tree) == u.tree_map(lambda x, y: x - y, tree, tree)
    assert tree_map_with_path(lambda p, x: (p, x), tree) == \
        u.tree_map_with_path(lambda p, x: (p, x), tree)
    assert tree_map_with_path(lambda p, x: p, tree, path="q") == \
        u.tree_map_with_path(lambda p, x: p, tree, path="q")
    assert tree_reduce(lambda a, x: a + [x], tree, []) == u.tree_reduce(lambda a, x: a + [x], tree, [])
    assert tree_reduce(lambda a, x: a + x, tree) == u.tree_reduce(lambda a, x: a + x, tree)


@requires_mlx
@given(trees, trees)
@settings(max_examples=80, deadline=None)
def test_merge_against_mlx(a, b):
    try:
        want = mlx_utils.tree_merge(a, b, lambda x, y: (x, y))
    except Exception as e:  # MLX refuses: so must lazyx, with the same type
        with pytest.raises(type(e)):
            tree_merge(a, b, lambda x, y: (x, y))
        return
    assert tree_merge(a, b, lambda x, y: (x, y)) == want
