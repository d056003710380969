"""The shared helpers for transform rules (lazyx.rules)."""

import numpy as np
import pytest

import lazyx.core as mx
from helpers import assert_close, rng, to_lazyx
from lazyx import rules


def _x(shape, seed=0):
    return rng(seed).standard_normal(shape)


@pytest.mark.parametrize("big,shape", [((2, 3), (2, 3)), ((4, 2, 3), (3,)), ((2, 3), (2, 1)),
                                       ((5, 2, 3), (1, 3)), ((2, 3), ()), ((2, 1, 3), (1, 1, 1))])
def test_sum_to_shape(big, shape):
    g = _x(big)
    got = rules.sum_to_shape(to_lazyx(g), shape)
    lead = len(big) - len(shape)
    want = g.sum(axis=tuple(range(lead)))
    want = want.sum(axis=tuple(i for i, n in enumerate(shape) if n == 1), keepdims=True)
    assert_close(got, want.reshape(shape), mx.float64)


def test_none_passes_through():
    assert rules.sum_to_shape(None, (2,)) is None
    assert rules.broadcast_to_shape(None, (2,)) is None
    a = to_lazyx(_x((2,)))
    assert rules.add_tangents(None, a) is a and rules.add_tangents(a, None) is a
    assert rules.add_tangents(None, None) is None
    assert_close(rules.add_tangents(a, a), 2 * np.array(a), mx.float64)
    assert rules.sum_to_shape(a, (2,)) is a and rules.broadcast_to_shape(a, (2,)) is a
    assert_close(rules.broadcast_to_shape(a, (3, 2)), np.broadcast_to(np.array(a), (3, 2)),
                 mx.float64)


def test_batch_axes():
    x = _x((2, 5, 3))
    got = rules.batch_first(to_lazyx(x), 1)
    assert_close(got, np.moveaxis(x, 1, 0), mx.float64)
    padded = rules.batch_first(to_lazyx(x), 1, ndim=4)
    assert padded.shape == (5, 1, 1, 2, 3)
    assert_close(rules.move_batch_axis(to_lazyx(x), 0, 2), np.moveaxis(x, 0, 2), mx.float64)
    a = to_lazyx(x)
    assert rules.move_batch_axis(a, 1, 1) is a
    assert_close(rules.add_batch_axis(to_lazyx(x), 1, 4),
                 np.broadcast_to(x[:, None], (2, 4, 5, 3)), mx.float64)
    assert rules.batch_size([a, to_lazyx(x)], [None, 2]) == 3
    assert rules.batched_axes((0, 1, 3), 1) == (0, 2, 4)
    assert rules.batched_axes((2,), 0) == (3,)


@pytest.mark.parametrize("shapes,axes", [
    (((4, 3), (4, 3)), (0, 0)),       # one common axis: left alone
    (((3, 4), (3,)), (1, None)),      # batch at 1 of per-example (3,), an unbatched (3,)
    (((4, 3), (3, 4)), (1, 0)),       # different axes: moved to the front
    (((3,), (2, 4, 3)), (None, 0)),   # per-example ranks differ
    (((2, 3), (2, 3, 4)), (None, 2)),  # an unbatched operand of the full rank
])
def test_align_batched_broadcasts_one_batch_axis(shapes, axes):
    xs = [_x(s, i) for i, s in enumerate(shapes)]
    (a, b), k = rules.align_batched([to_lazyx(x) for x in xs], list(axes))
    got = np.array(mx.add(a, b))
    n = next(x.shape[ax] for x, ax in zip(xs, axes) if ax is not None)
    for i in range(n):
        ex = [np.take(x, i, axis=ax) if ax is not None else x for x, ax in zip(xs, axes)]
        np.testing.assert_allclose(np.take(got, i, axis=k), ex[0] + ex[1])


def test_no_gradient_mixin():
    assert not rules.NoGradient.differentiable
    from lazyx.plugins.elementwise import Floor
    assert issubclass(Floor, rules.NoGradient) and not Floor.differentiable
    x = to_lazyx(_x((2, 3)))
    y = mx.floor(x)
    assert y._prim.vjp([x], [y], [0], [y]) == [None]
    assert y._prim.jvp([x], [x], [0]) == [None]
