"""The vjp/jvp/vmap rules of the reductions pack: finite differences, jvp against vjp,
vmap against a loop, and MLX's conventions at ties and zeros."""

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.plugins.indexing import Gather, GatherAxis, ScatterAxis, Slice
from lazyx.plugins.shapes import BroadcastTo, Concatenate, ExpandDims, Reshape, Transpose
from helpers import (assert_close, check_jvp_vjp, check_vjp_fd, check_vmap_loop, has_rules,
                     random_array, rng, to_lazyx)

X = random_array((3, 4), mx.float64, rng(1))
X3 = random_array((2, 3, 4), mx.float64, rng(2))
X4 = random_array((2, 3, 4, 5), mx.float32, rng(5))

REDUCTIONS = [
    (mx.sum, {}), (mx.sum, {"axis": 1}), (mx.sum, {"axis": (0, 2), "keepdims": True}),
    (mx.prod, {"axis": -1}), (mx.prod, {"axis": (0, 2)}), (mx.prod, {}),
    (mx.max, {"axis": 1}), (mx.min, {"axis": (0, 1), "keepdims": True}), (mx.max, {}),
    (mx.logsumexp, {"axis": 2}), (mx.logsumexp, {"axis": (0, 1)}),
    (mx.logsumexp, {"keepdims": True}),
    (mx.median, {"axis": 1}), (mx.median, {"axis": 2}), (mx.median, {"axis": (0, 2)}),
    (mx.median, {"axis": -1, "keepdims": True}),
]
SCANS = [mx.cumsum, mx.cumprod, mx.cummax, mx.cummin, mx.logcumsumexp]


def _ids(cases):
    return [f"{f.__name__}-{kw}" for f, kw in cases]


@pytest.mark.parametrize("fn,kw", REDUCTIONS, ids=_ids(REDUCTIONS))
def test_reduction_rules(fn, kw):
    f = lambda x: fn(x, **kw)  # noqa: E731
    check_vjp_fd(f, X3, msg=fn.__name__)
    check_jvp_vjp(f, X3, msg=fn.__name__)


@pytest.mark.parametrize("fn,kw", REDUCTIONS, ids=_ids(REDUCTIONS))
@pytest.mark.parametrize("in_axis", [0, 2, -1])
def test_reduction_vmap(fn, kw, in_axis):
    check_vmap_loop(lambda x: fn(x, **kw), X4, in_axes=in_axis, msg=fn.__name__)


@pytest.mark.parametrize("scan", SCANS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("inclusive", [True, False])
def test_scan_rules(scan, reverse, inclusive):
    f = lambda x: scan(x, axis=1, reverse=reverse, inclusive=inclusive)  # noqa: E731
    check_vjp_fd(f, X, msg=scan.__name__)
    check_jvp_vjp(f, X, msg=scan.__name__)
    check_vmap_loop(f, X3.astype(np.float32), in_axes=1, msg=scan.__name__)


@pytest.mark.parametrize("scan", SCANS, ids=lambda f: f.__name__)
def test_scan_batched_along_other_axes(scan):
    for ax in (0, 2):
        check_vmap_loop(lambda x: scan(x, axis=0, reverse=True), X3.astype(np.float32),
                        in_axes=ax)


@pytest.mark.skipif(not has_rules(Reshape), reason="the shapes pack has no Reshape rules yet")
@pytest.mark.parametrize("scan", SCANS, ids=lambda f: f.__name__)
def test_scan_of_the_flattened_array(scan):
    check_vjp_fd(lambda x: scan(x), X, msg=scan.__name__)
    check_vmap_loop(lambda x: scan(x), X3.astype(np.float32), in_axes=1)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("inclusive", [True, False])
def test_cumprod_with_zeros(reverse, inclusive):
    x = np.array([[1.5, 0.0, 3.0, 2.0, 0.0, -1.0], [0.0, 0.0, 2.0, 1.0, 0.5, 2.0],
                  [2.0, 1.5, -1.0, 0.5, 3.0, 0.0]])
    f = lambda a: mx.cumprod(a, axis=1, reverse=reverse, inclusive=inclusive)  # noqa: E731
    check_vjp_fd(f, x)
    check_jvp_vjp(f, x)


def test_prod_with_zeros():
    x = np.array([[1.5, 0.0, 3.0], [0.0, 0.0, 2.0], [2.0, 1.5, -1.0]])
    for axis in (0, 1, None):
        check_vjp_fd(lambda a: mx.prod(a, axis=axis), x)
        check_jvp_vjp(lambda a: mx.prod(a, axis=axis), x)
    # MLX: d/dx of prod([1, 0, 3]) = [0, 3, 0]; two zeros give no gradient at all.
    g = mx.vjp(lambda a: mx.prod(a, axis=1), [mx.array([[1.0, 0.0, 3.0], [0.0, 0.0, 2.0]])],
               [mx.ones((2,))])[1][0]
    assert g.tolist() == [[0.0, 3.0, 0.0], [0.0, 0.0, 0.0]]


def test_extrema_split_ties_evenly():
    a = mx.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]])
    g = mx.vjp(lambda x: mx.max(x, axis=1), [a], [mx.ones((2,))])[1][0]
    assert g.tolist() == [[0.0, 0.5, 0.5], [0.5, 0.5, 0.0]]
    g = mx.vjp(lambda x: mx.min(x), [a], [mx.array(1.0)])[1][0]
    assert g.tolist() == [[0.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
    # jvp agrees: the average of the tangents at the tied positions.
    t = mx.array([[5.0, 1.0, 3.0], [4.0, 2.0, 7.0]])
    assert mx.jvp(lambda x: mx.max(x, axis=1), [a], [t])[1][0].tolist() == [2.0, 3.0]


def test_cummax_ties_follow_mlx():
    # Output j takes its gradient from the last i <= j equal to the running maximum.
    a = mx.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]])
    g = mx.vjp(lambda x: mx.cummax(x, axis=1), [a], [mx.ones((2, 3))])[1][0]
    assert g.tolist() == [[1.0, 1.0, 1.0], [1.0, 2.0, 0.0]]
    g = mx.vjp(lambda x: mx.cummin(x, axis=1), [-a], [mx.ones((2, 3))])[1][0]
    assert g.tolist() == [[1.0, 1.0, 1.0], [1.0, 2.0, 0.0]]


def test_median_gradient_goes_to_the_middle():
    a = mx.array([[1.0, 5.0, 3.0, 2.0], [0.0, 4.0, 2.0, 1.0], [7.0, 1.0, 3.0, 9.0]])
    g = mx.vjp(lambda x: mx.median(x, axis=1), [a], [mx.ones((3,))])[1][0]
    assert g.tolist() == [[0, 0, 0.5, 0.5], [0, 0, 0.5, 0.5], [0.5, 0, 0.5, 0]]
    # The tie in column 2 (3, 2, 3) goes to the first 3, as in MLX.
    g = mx.vjp(lambda x: mx.median(x, axis=0), [a], [mx.ones((4,))])[1][0]
    assert g.tolist() == [[1, 0, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]]


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32])
def test_gradient_dtypes_follow_the_input(dtype):
    x = mx.array(random_array((3, 4), dtype, rng(3)), dtype=dtype)
    for fn in (mx.sum, mx.prod, mx.max, mx.logsumexp, mx.median, mx.cumsum, mx.cumprod,
               mx.cummax, mx.logcumsumexp):
        g = mx.vjp(lambda a: fn(a, axis=1), [x], [fn(x, axis=1)])[1][0]
        assert g.dtype == dtype and g.shape == x.shape, fn.__name__


def test_integer_sums_differentiate_as_mlx():
    # MLX differentiates integer computations in their dtype.
    x = mx.array([1, 2, 3], dtype=mx.int8)
    g = mx.grad(lambda a: mx.sum(a))(x)
    assert g.dtype == mx.int8 and g.tolist() == [1, 1, 1]
    g = mx.grad(lambda a: mx.prod(a))(x)
    assert g.dtype == mx.int8 and g.tolist() == [6, 3, 2]


@pytest.mark.parametrize("op", [mx.argmax, mx.argmin])
def test_arg_reductions(op):
    x = to_lazyx(X3)
    _, (g,) = mx.vjp(lambda a: op(a, axis=1), [x], [mx.ones((2, 4), dtype=mx.uint32)])
    assert g.dtype == mx.float64 and not np.array(g).any()
    _, (t,) = mx.jvp(lambda a: op(a, axis=1), [x], [x])
    assert t.dtype == mx.uint32 and not np.array(t).any()
    for kw in ({"axis": 1}, {"axis": -1, "keepdims": True}, {}, {"keepdims": True}):
        for ax in (0, 1, 2):
            check_vmap_loop(lambda a: op(a, **kw), X3, in_axes=ax, msg=f"{kw} {ax}")


def test_all_any_have_no_gradient():
    x = to_lazyx(X)
    for op in (mx.all, mx.any):
        _, (g,) = mx.vjp(lambda a: op(a, axis=0), [x], [mx.ones((4,), dtype=mx.bool_)])
        assert not np.array(g).any()
        check_vmap_loop(lambda a: op(a, axis=0), X, in_axes=1)


def test_reductions_of_integers_vmap():
    data = random_array((3, 5), mx.int16, rng(4))
    for fn in (mx.sum, mx.prod, mx.max, mx.cumsum, mx.argmax):
        check_vmap_loop(lambda a: fn(a, axis=0), data, in_axes=1, msg=fn.__name__)


def test_grad_of_a_keepdims_reduction_feeds_back():
    x = to_lazyx(X)
    g = mx.grad(lambda a: mx.sum(mx.logsumexp(a, axis=1, keepdims=True)))(x)
    e = np.exp(X - X.max(axis=1, keepdims=True))
    assert_close(g, e / e.sum(axis=1, keepdims=True), mx.float64)


_SHAPE_AND_INDEX_RULES = has_rules(ExpandDims, BroadcastTo, Transpose, Reshape, Concatenate,
                                   Slice, Gather, GatherAxis, ScatterAxis)
SECOND_ORDER = {
    "sum": lambda a: mx.sum(a * a, axis=1), "prod": lambda a: mx.prod(a, axis=0),
    "max": lambda a: mx.max(a, axis=1), "logsumexp": lambda a: mx.logsumexp(a, axis=1),
    "median": lambda a: mx.median(a, axis=1), "cumsum": lambda a: mx.cumsum(a * a, axis=1),
    "cumprod": lambda a: mx.cumprod(a, axis=1, reverse=True),
    "cummax": lambda a: mx.cummax(a, axis=1, inclusive=False),
    "logcumsumexp": lambda a: mx.logcumsumexp(a, axis=1),
}


@pytest.mark.skipif(not _SHAPE_AND_INDEX_RULES,
                    reason="the shapes and indexing packs have no rules yet")
@pytest.mark.parametrize("name", SECOND_ORDER)
def test_second_order(name):
    # The rules are graphs of ops with rules: their own vjp is checked the same way.
    f = SECOND_ORDER[name]
    w = to_lazyx(random_array(f(to_lazyx(X)).shape, mx.float64, rng(6)))
    check_vjp_fd(mx.grad(lambda a: mx.sum(f(a) * w)), X, msg=name)
