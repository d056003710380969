"""Trees as the transforms flatten and rebuild them."""

from collections import namedtuple

import pytest

import lazyx.core as mx
from lazyx.errors import ArgumentError
from lazyx.transforms.trees import broadcast_prefix, flatten, leaf_paths, unflatten


class Params(dict):
    """A dict subclass (as nn.Module is)."""


def test_flatten_and_rebuild():
    P = namedtuple("P", "w b")
    a, b = mx.array(1.0), mx.array(2.0)
    tree = {"x": [a, (b, 3)], "p": P(a, None), "m": Params(k=b), "e": [], "s": "text"}
    leaves, d = flatten(tree)
    assert leaves[:5] == [a, b, 3, a, None] and leaves[-1] == "text"
    assert leaf_paths(d) == ["['x'][0]", "['x'][1][0]", "['x'][1][1]", "['p'][0]", "['p'][1]",
                             "['m']['k']", "['s']"]
    back = unflatten(d, leaves)
    assert back["x"][1] == (b, 3) and isinstance(back["x"], list)
    assert isinstance(back["p"], P) and back["p"].w is a
    assert type(back["m"]) is dict and back["m"]["k"] is b
    assert back["e"] == [] and back["s"] == "text"
    assert unflatten(flatten(a)[1], [b]) is b


def test_prefix_broadcast_and_errors():
    _, d = flatten(({"w": 1, "b": 2}, [3, 4]))
    spec = lambda x: not isinstance(x, (list, tuple, dict))  # noqa: E731
    assert broadcast_prefix((0, [1, None]), d, "", "axes", spec) == [0, 0, 1, None]
    assert broadcast_prefix(({"w": 1, "b": None}, 0), d, "", "axes", spec) == [1, None, 0, 0]
    with pytest.raises(ArgumentError, match=r"axes at \[1\] has 3 entries .* has 2"):
        broadcast_prefix((0, [1, 2, 3]), d, "", "axes", spec)
    with pytest.raises(ArgumentError, match=r"axes at \[0\] has keys \['w'\] .* \['b', 'w'\]"):
        broadcast_prefix(({"w": 0}, 0), d, "", "axes", spec)
    with pytest.raises(ArgumentError, match=r"axes at \[1\]\[0\] is a list .* single leaf"):
        broadcast_prefix((0, [[0], 1]), d, "", "axes", spec)


# -- the native walks (framework/native/graph.cpp) against their Python references -------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from lazyx import scheduler  # noqa: E402
from lazyx.array import native  # noqa: E402
from lazyx.transforms import trees  # noqa: E402

needs_native = pytest.mark.skipif(native is None, reason="the core's native module is not built")
_LEAVES = [mx.array(1.0), mx.array([2, 3]), 3, None, "s", 2.5]
_Pair = namedtuple("_Pair", "a b")


class _Tuple(tuple):
    pass


class _ReversedKeys(dict):
    """A dict subclass whose keys() and values() differ from the dict's own order: the
    walks must call them, as the Python versions do."""

    def keys(self):
        return list(reversed(list(super().keys())))

    def values(self):
        return list(reversed(list(super().values())))


_trees = st.recursive(
    st.sampled_from(range(len(_LEAVES))).map(lambda i: _LEAVES[i]),
    lambda kids: st.one_of(
        st.lists(kids, max_size=4),
        st.lists(kids, max_size=4).map(tuple),
        st.lists(kids, max_size=4).map(_Tuple),
        st.tuples(kids, kids).map(lambda t: _Pair(*t)),
        st.dictionaries(st.text("abc", min_size=1, max_size=2), kids, max_size=4),
        st.dictionaries(st.text("xyz", min_size=1, max_size=2), kids, max_size=3).map(Params),
        st.dictionaries(st.text("pq", min_size=1, max_size=2), kids, max_size=3)
        .map(_ReversedKeys)),
    max_leaves=20)


@needs_native
@settings(max_examples=300, deadline=None)
@given(_trees)
def test_native_flatten_and_tree_arrays_match_the_python_walks(tree):
    py_leaves, native_leaves = [], []
    want = trees._flatten(tree, py_leaves)
    got = native.flatten(tree, native_leaves)
    assert got == want
    assert len(native_leaves) == len(py_leaves)
    assert all(a is b for a, b in zip(native_leaves, py_leaves))
    py_arrays = scheduler.py_tree_arrays(tree, [])
    native_arrays = native.tree_arrays(tree, [])
    assert len(native_arrays) == len(py_arrays)
    assert all(a is b for a, b in zip(native_arrays, py_arrays))


@needs_native
def test_native_walks_raise_as_python_does():
    deep = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(RecursionError):
        native.flatten(deep, [])
    with pytest.raises(RecursionError):
        native.tree_arrays(deep, [])

    class Broken(dict):
        def values(self):
            raise ValueError("values() broke")

    with pytest.raises(ValueError, match="values\\(\\) broke"):
        native.flatten(Broken(a=1), [])
    with pytest.raises(ValueError, match="values\\(\\) broke"):
        native.tree_arrays(Broken(a=1), [])
    with pytest.raises(TypeError, match="leaves"):
        native.flatten([1], ())
