"""The vjp/jvp/vmap rules of the sorting pack."""

import numpy as np
import pytest

import lazyx.core as mx
from helpers import check_jvp_vjp, check_vjp_fd, check_vmap_loop, random_array, rng, to_lazyx

X = random_array((3, 5), mx.float64, rng(11))
X3 = random_array((2, 3, 5), mx.float32, rng(12))

VALUE_OPS = {
    "sort": lambda a, axis=-1: mx.sort(a, axis=axis),
    "partition": lambda a, axis=-1: mx.partition(a, 2, axis=axis),
    "partition-neg": lambda a, axis=-1: mx.partition(a, -1, axis=axis),
    "topk": lambda a, axis=-1: mx.topk(a, 2, axis=axis),
    "topk-all": lambda a, axis=-1: mx.topk(a, a.shape[axis], axis=axis),
}


@pytest.mark.parametrize("name", VALUE_OPS)
@pytest.mark.parametrize("axis", [0, -1])
def test_value_rules(name, axis):
    f = lambda a: VALUE_OPS[name](a, axis)  # noqa: E731
    check_vjp_fd(f, X, msg=name)
    check_jvp_vjp(f, X, msg=name)


@pytest.mark.parametrize("name", VALUE_OPS)
@pytest.mark.parametrize("in_axis", [0, 1, 2])
def test_value_vmap(name, in_axis):
    check_vmap_loop(lambda a: VALUE_OPS[name](a, -1), X3, in_axes=in_axis, msg=name)


def test_topk_gradient_lands_on_the_largest():
    a = mx.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]])
    g = mx.vjp(lambda x: mx.topk(x, 2, axis=1), [a], [mx.array([[1.0, 2.0], [3.0, 4.0]])])[1][0]
    g = np.array(g)
    # Each output's cotangent goes to a distinct input of equal value.
    np.testing.assert_array_equal(np.sort(g, axis=1), [[0, 1, 2], [0, 3, 4]])
    assert g[0, 0] == 0 and g[1, 2] == 0


def test_sort_ties_get_distinct_inputs():
    a = mx.array([2.0, 1.0, 2.0, 2.0])
    c = mx.array([10.0, 1.0, 2.0, 3.0])
    g = np.array(mx.vjp(lambda x: mx.sort(x), [a], [c])[1][0])
    assert g[1] == 10.0 and sorted(g[[0, 2, 3]]) == [1.0, 2.0, 3.0]


def test_nans_are_sorted_last_in_the_rules():
    a = mx.array([1.0, float("nan"), -1.0, 3.0])
    g = mx.vjp(lambda x: mx.topk(x, 1), [a], [mx.array([5.0])])[1][0]
    assert np.array(g).tolist() == [0.0, 5.0, 0.0, 0.0]


@pytest.mark.parametrize("op", [mx.argsort, lambda a, axis=-1: mx.argpartition(a, 1, axis=axis)])
def test_index_outputs(op):
    x = to_lazyx(X)
    _, (g,) = mx.vjp(lambda a: op(a), [x], [mx.ones(X.shape, dtype=mx.uint32)])
    assert g.dtype == mx.float64 and not np.array(g).any()
    _, (t,) = mx.jvp(lambda a: op(a), [x], [x])
    assert t.dtype == mx.uint32 and not np.array(t).any()
    for ax in (0, 1, 2):
        check_vmap_loop(lambda a: op(a, axis=0), X3, in_axes=ax)


def test_partition_and_topk_batched_values_match():
    # vmap of the index ops must give indices of the same values the loop gives.
    got = mx.vmap(lambda a: mx.argpartition(a, 2))(to_lazyx(X3[0]))
    vals = np.take_along_axis(X3[0], np.array(got).astype(np.int64), axis=1)
    np.testing.assert_array_equal(vals[:, 2], np.sort(X3[0], axis=1)[:, 2])


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("dtype", [mx.float32, mx.int32])
def test_searchsorted_vmap(side, dtype):
    gen = rng(13)
    seqs = np.sort(random_array((3, 6), dtype, gen), axis=1)
    vals = random_array((3, 4), dtype, gen)
    vals[:, 0] = seqs[:, 2]  # a value equal to an element: left and right differ
    if dtype.kind == "f":
        seqs[0, -2:] = np.nan
        vals[1, 1] = np.nan
        vals[0, 3] = np.nan
    f = lambda s, v: mx.searchsorted(s, v, side=side)  # noqa: E731
    check_vmap_loop(f, seqs, vals, in_axes=(0, 0))
    check_vmap_loop(f, seqs, np.ascontiguousarray(vals.T), in_axes=(0, 1))
    check_vmap_loop(f, seqs, vals[0], in_axes=(0, None))
    check_vmap_loop(f, seqs[0], vals, in_axes=(None, 1))
    check_vmap_loop(f, seqs.T.copy(), vals, in_axes=(1, 0), out_axes=1)


def test_searchsorted_has_no_gradient():
    s, v = to_lazyx(np.sort(X[0])), to_lazyx(X[1])
    _, g = mx.vjp(lambda a, b: mx.searchsorted(a, b), [s, v], [mx.ones((5,), dtype=mx.uint32)])
    assert not np.array(g[0]).any() and not np.array(g[1]).any()
    _, (t,) = mx.jvp(lambda a, b: mx.searchsorted(a, b), [s, v], [s, v])
    assert t.dtype == mx.uint32 and not np.array(t).any()
