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
