"""Transform rules of the indexing pack: vjp against central finite differences in float64,
jvp against vjp, and vmap against a Python loop for basic and advanced indexing,
``__setitem__``, ``.at`` updates (add, subtract, multiply, divide, maximum, minimum),
``take``, ``take_along_axis`` and ``put_along_axis`` — with the operand, the index arrays
and the updates each unbatched, batched first or batched last. Also the gradient
conventions of updates at repeated positions (the winning write of an assignment, ties
of maximum/minimum, products with zeros), ``__setitem__`` inside ``grad``, ``jvp`` and
``vmap``, and compositions of transforms."""

import itertools

import numpy as np
import pytest

import lazyx.core as mx
from helpers import check_jvp_vjp, check_vjp_fd, check_vmap_loop, rng, to_lazyx
from lazyx.errors import IndexOutOfRangeError
from lazyx.plugins import indexing as ix

GEN = rng(12)


def _x(*shape):
    return GEN.uniform(-2.0, 2.0, size=shape)


def _i(*values):
    return np.array(values, np.int32)


def _assign(a, key, v):
    b = a * 1.0  # leave the caller's array alone
    b[key] = v
    return b


ROWS = mx.array([0, 2, 0])  # a repeated position

# Functions of float arrays only (indices are constants): name -> (function, shapes).
CASES = {
    "slice": (lambda a: a[1:, ::-2], [(4, 3)]),
    "row": (lambda a: a[-1], [(4, 3)]),
    "basic-mixed": (lambda a: a[None, 1, ..., 1:], [(3, 2, 4)]),
    "take-rows": (lambda a: a[ROWS], [(4, 3)]),
    "take-cols": (lambda a: a[:, ROWS], [(3, 4)]),
    "negative": (lambda a: a[mx.array([-1, 0, -1]), 1:], [(4, 3)]),
    "two-adjacent": (lambda a: a[:, mx.array([0, 1]), mx.array([[2], [0]])], [(2, 3, 4)]),
    "two-apart": (lambda a: a[mx.array([0, 1]), :, mx.array([2, 0])], [(2, 3, 4)]),
    "int-and-array": (lambda a: a[1, :, mx.array([0, 3, 3])], [(2, 3, 4)]),
    "list-index": (lambda a: a[[1, 1], None], [(2, 3)]),
    "empty-index": (lambda a: a[mx.array([], dtype=mx.int32)], [(3, 2)]),
    "take": (lambda a: mx.take(a, mx.array([[0, 2], [1, 0]]), axis=1), [(2, 3)]),
    "take-flat": (lambda a: mx.take(a, mx.array([5, 0, 5])), [(2, 3)]),
    "take_along_axis": (lambda a: mx.take_along_axis(a, mx.array([[0, 2], [1, 1]]), 1), [(2, 3)]),
    "take_along_axis-bcast": (lambda a: mx.take_along_axis(a, mx.array([[0], [0]]), 0), [(1, 3)]),
    "take_along_axis-flat": (lambda a: mx.take_along_axis(a, mx.array([4, 1]), None), [(2, 3)]),
    "setitem-basic": (lambda a, v: _assign(a, (slice(1, 3), 1), v), [(4, 3), (2,)]),
    "setitem-broadcast": (lambda a, v: _assign(a, (slice(None), slice(0, 2)), v), [(3, 3), (2,)]),
    "setitem-int": (lambda a, v: _assign(a, 2, v), [(4, 3), ()]),
    "setitem-strided": (lambda a, v: _assign(a, (slice(None, None, -2), None), v),
                        [(4, 3), (2, 1, 3)]),
    "setitem-array": (lambda a, v: _assign(a, (ROWS, slice(1, None)), v), [(4, 3), (3, 2)]),
    "setitem-array-unique": (lambda a, v: _assign(a, mx.array([3, 1]), v), [(4, 3), (3,)]),
    "setitem-lazy-index": (lambda a, v: _assign(a, ROWS + 0, v), [(4, 3), (3, 3)]),
    "at-add": (lambda a, v: a.at[ROWS].add(v), [(4, 3), (3, 3)]),
    "at-add-basic": (lambda a, v: a.at[1:3].add(v), [(4, 3), (3,)]),
    "at-subtract": (lambda a, v: a.at[:, ROWS].subtract(v), [(2, 4), (3,)]),
    "at-multiply": (lambda a, v: a.at[ROWS, 1].multiply(v), [(4, 3), (3,)]),
    "at-divide": (lambda a, v: a.at[ROWS].divide(v), [(4, 3), (3, 1)]),
    "at-maximum": (lambda a, v: a.at[ROWS].maximum(v), [(4, 3), (3, 3)]),
    "at-minimum": (lambda a, v: a.at[1:, ROWS].minimum(v), [(3, 4), (1, 3)]),
    "put_along_axis": (lambda a, v: mx.put_along_axis(a, mx.array([[0, 3, 1], [2, 1, 0]]), v, 0),
                       [(4, 3), (2, 3)]),
    "put_along_axis-repeat": (lambda a, v: mx.put_along_axis(a, mx.array([[1, 1]]), v, 1),
                              [(3, 4), (3, 1)]),
    "put_along_axis-flat": (lambda a, v: mx.put_along_axis(a, mx.array([4, 0]), v, None),
                            [(2, 3), (2,)]),
}


def _args(name):
    args = [_x(*s) for s in CASES[name][1]]
    if name.startswith("at-divide"):
        args[1] = np.where(np.abs(args[1]) < 0.5, 1.0, args[1])
    return args


@pytest.mark.parametrize("name", CASES)
def test_vjp_and_jvp(name):
    fn = CASES[name][0]
    args = _args(name)
    check_vjp_fd(fn, *args, msg=name)
    check_jvp_vjp(fn, *args, msg=name)


# Functions whose index arrays are arguments too: name -> (function, arguments).
BATCHED = {
    "getitem": (lambda a, i: a[i], [_x(4, 3), _i([0, 3], [1, 1])]),
    "getitem-cols": (lambda a, i: a[:, i], [_x(4, 3), _i(0, 2, 1)]),
    "getitem-apart": (lambda a, i, j: a[i, :, j], [_x(4, 2, 3), _i(0, 3), _i([1], [2])]),
    "getitem-adjacent": (lambda a, i, j: a[:, i, j], [_x(2, 4, 3), _i(0, 3), _i([1], [2])]),
    "getitem-int": (lambda a, j: a[1, :, j], [_x(4, 2, 3), _i(0, 2)]),
    "getitem-new": (lambda a, j: a[None, j, 1:], [_x(4, 3), _i(0, 2)]),
    "setitem": (lambda a, i, v: _assign(a, (i, slice(1, None)), v), [_x(4, 3), _i(0, 2), _x(2, 2)]),
    "setitem-basic": (lambda a, v: _assign(a, (slice(1, 3), 1), v), [_x(4, 3), _x(2)]),
    "setitem-new": (lambda a, v: _assign(a, (None, 2), v), [_x(4, 3), _x(1, 3)]),
    "at-add": (lambda a, i, v: a.at[i].add(v), [_x(4, 3), _i(0, 2, 0), _x(3, 3)]),
    "at-add-cols": (lambda a, i, v: a.at[:, i].add(v), [_x(4, 3), _i(0, 2, 0), _x(3)]),
    "at-add-basic": (lambda a, v: a.at[1:, 0].add(v), [_x(4, 3), _x(3)]),
    "at-maximum": (lambda a, i, v: a.at[1:, i].maximum(v), [_x(4, 3), _i(0, 2), _x(3, 1)]),
    "at-multiply": (lambda a, i, v: a.at[i, 1].multiply(v), [_x(4, 3), _i(0, 2, 0), _x(3)]),
    "take": (lambda a, i: mx.take(a, i, axis=1), [_x(2, 3), _i([0, 2], [1, 0])]),
    "take_along_axis": (lambda a, i: mx.take_along_axis(a, i, 1),
                        [_x(4, 3), _i([0, 1], [2, 2], [1, 0], [1, 1])]),
    "take_along_axis-bcast": (lambda a, i: mx.take_along_axis(a, i, 0), [_x(1, 3), _i([0], [0])]),
    "put_along_axis": (lambda a, i, v: mx.put_along_axis(a, i, v, 1),
                       [_x(4, 3), _i([0], [2], [1], [1]), _x(4, 1)]),
    "put_along_axis-bcast": (lambda a, i, v: mx.put_along_axis(a, i, v, 0),
                             [_x(4, 3), _i([1, 0, 3]), _x(1)]),
}


def _batched(x, axis, n=3):
    """``n`` examples like ``x`` stacked at ``axis``: new random floats, or rolled indices."""
    if axis is None:
        return x.astype(np.float32) if x.dtype.kind == "f" else x
    if x.dtype.kind == "f":
        copies = [_x(*x.shape).astype(np.float32) for _ in range(n)]
    else:
        copies = [np.roll(x, k) for k in range(n)]
    return np.stack(copies, axis=axis)


@pytest.mark.parametrize("name", BATCHED)
def test_vmap_against_a_loop(name):
    fn, args = BATCHED[name]
    for axes in itertools.product((None, 0, -1), repeat=len(args)):
        if all(a is None for a in axes):
            continue
        check_vmap_loop(fn, *[_batched(a, ax) for a, ax in zip(args, axes)], in_axes=list(axes),
                        msg=f"{name} {axes}")


@pytest.mark.parametrize("name", ["getitem", "getitem-apart", "setitem", "at-add-cols",
                                  "take_along_axis", "put_along_axis"])
def test_vmap_out_axes(name):
    fn, args = BATCHED[name]
    ins = [_batched(a, 1) for a in args]
    check_vmap_loop(fn, *ins, in_axes=1, out_axes=-1, msg=name)


@pytest.mark.parametrize("name", ["getitem-apart", "at-add", "take_along_axis"])
def test_gradients_of_batched_functions(name):
    fn, args = BATCHED[name]
    fl = [k for k, a in enumerate(args) if a.dtype.kind == "f"]

    def of_floats(*xs):
        full = [to_lazyx(a) for a in args]
        for k, x in zip(fl, xs):
            full[k] = x
        return fn(*full)

    check_vjp_fd(of_floats, *[args[k] for k in fl], msg=name)
    check_jvp_vjp(of_floats, *[args[k] for k in fl], msg=name)


# -- conventions at repeated positions ----------------------------------------------------
def test_assignment_gradient_reaches_the_winning_write_only():
    w = mx.array([1.0, 2.0, 3.0])

    def f(x, v, idx):
        y = x * 1.0
        y[idx] = v
        return mx.sum(y * w)

    for idx in (mx.array([0, 0, 2]), [0, 0, 2], mx.array([0, 0, 2]) * 1):
        gx, gv = mx.grad(f, argnums=(0, 1))(mx.ones(3), mx.array([5.0, 6.0, 7.0]), idx)
        # Position 0 keeps the last write (6); the overwritten input gets nothing.
        assert gx.tolist() == [0, 2, 0] and gv.tolist() == [0, 1, 3], idx


def test_extremum_ties_share_the_cotangent():
    a = mx.array([1.0, 5.0, 0.0])
    v = mx.array([1.0, 1.0, -1.0])
    ga, gv = mx.grad(lambda a, v: mx.sum(a.at[mx.array([0, 0, 2])].maximum(v)),
                     argnums=(0, 1))(a, v)
    assert np.allclose(ga.tolist(), [1 / 3, 1, 1]) and np.allclose(gv.tolist(), [1 / 3, 1 / 3, 0])
    ga, gv = mx.grad(lambda a, v: mx.sum(a.at[mx.array([1, 1])].minimum(v)),
                     argnums=(0, 1))(a, mx.array([0.5, 2.0]))
    assert ga.tolist() == [1, 0, 1] and gv.tolist() == [1, 0]
    _, (t,) = mx.jvp(lambda a, v: a.at[mx.array([0, 0, 2])].maximum(v), [a, v],
                     [mx.array([3.0, 1.0, 1.0]), mx.array([0.0, 6.0, 9.0])])
    assert np.allclose(t.tolist(), [3.0, 1.0, 1.0])


def test_product_gradient_with_zeros():
    # d/dv_j of a * prod(v) is a times the product of the others, zeros included.
    a = mx.array([2.0, 3.0])
    for v, want in (([0.0, 4.0, 5.0], [40.0, 0.0, 0.0]), ([0.0, 0.0, 5.0], [0.0, 0.0, 0.0]),
                    ([2.0, 4.0, 5.0], [40.0, 20.0, 16.0])):
        gv = mx.grad(lambda v: mx.sum(a.at[mx.array([0, 0, 0])].multiply(v)))(mx.array(v))
        assert np.allclose(gv.tolist(), want), v
    x = _x(4, 3)
    zeros = mx.array([[1.0], [0.0], [0.0]])
    check_vjp_fd(lambda a: a.at[ROWS].multiply(a[1:] * zeros), x)
    check_jvp_vjp(lambda a: a.at[ROWS].multiply(a[1:] * zeros), x)


def test_gather_gradient_accumulates_repeats():
    g = mx.grad(lambda a: mx.sum(a[mx.array([0, 0, 2, 0])]))(mx.zeros((3, 2)))
    assert g.tolist() == [[3, 3], [0, 0], [1, 1]]
    g = mx.grad(lambda a: mx.sum(mx.take_along_axis(a, mx.array([[1, 1, 1]]), 1)))(mx.zeros((2, 3)))
    assert g.tolist() == [[0, 3, 0], [0, 3, 0]]


def test_differentiating_index_arrays_raises_unless_stopped():
    # MLX raises (a ValueError) rather than give integer indices zeros, even for
    # indices computed from the differentiated values; stop_gradient is the fix.
    x = to_lazyx(_x(4, 3))
    fs = (lambda a, i: mx.sum(a[i]),
          lambda a, i: mx.sum(mx.take_along_axis(a[:3], i[:, None], 1)),
          lambda a, i: mx.sum(a.at[i].add(1.0) ** 2),
          lambda a, i: mx.sum(mx.put_along_axis(a[:3], i[:, None], 2.0, 1) ** 2))
    for f in fs:
        with pytest.raises(ValueError, match="stop_gradient"):
            mx.grad(f, argnums=(0, 1))(x, mx.array([0, 2, 1]))
        g = mx.grad(lambda a, i: f(a, mx.stop_gradient(i)), argnums=(0, 1))(x, mx.array([0, 2, 1]))
        assert g[1].tolist() == [0, 0, 0]
    v = mx.array([3.0, 1.0, 2.0])
    with pytest.raises(ValueError, match="stop_gradient"):
        mx.grad(lambda b: mx.sum(b[mx.argsort(b)] * mx.array([1.0, 2.0, 3.0])))(v)
    with pytest.raises(ValueError, match="stop_gradient"):
        mx.jvp(lambda a, i: a[i], [v, mx.array([0, 1])], [v, mx.array([1, 1])])
    g = mx.grad(lambda b: mx.sum(b[mx.stop_gradient(mx.argsort(b))] * mx.array([1.0, 2.0, 3.0])))(v)
    assert g.tolist() == [3.0, 1.0, 2.0]


# -- __setitem__ under transforms ----------------------------------------------------------
def test_setitem_on_an_argument_under_grad():
    def f(x):
        x[0] = 2.0
        return mx.sum(x * x)

    assert mx.grad(f)(mx.array([1.0, 2.0, 3.0])).tolist() == [0, 4, 6]
    _, (t,) = mx.jvp(f, [mx.array([1.0, 2.0, 3.0])], [mx.ones(3)])
    assert t.item() == 10.0

    def g(x):
        y = x * 2.0  # reads the value before the assignment
        x[1] = x[0] * 5.0
        x[mx.array([2])] += 1.0
        return mx.sum(x * y)

    x = np.array([1.0, 2.0, 3.0])
    check_vjp_fd(g, x)
    # (check_jvp_vjp also calls the function directly, which would change its arguments.)
    check_jvp_vjp(lambda a: g(a + 0.0), x)
    assert mx.grad(g)(to_lazyx(x)).tolist() == [24.0, 10.0, 14.0]


def test_setitem_in_a_loss_with_several_arguments():
    def loss(w, b, x):
        h = x @ w
        h[:, 0] = h[:, 0] + b
        h[mx.array([1]), 1:] = 0.0
        return mx.sum(mx.tanh(h) ** 2)

    w, b, x = _x(3, 2), _x(), _x(4, 3)
    check_vjp_fd(lambda w, b: loss(w, b, to_lazyx(x)), w, b)
    gw, gb = mx.grad(loss, argnums=(0, 1))(to_lazyx(w), to_lazyx(b), to_lazyx(x))
    assert gw.shape == (3, 2) and gb.shape == ()


def test_setitem_on_an_argument_under_vmap():
    def f(x, v):
        x[0] = v
        x[mx.array([2, 1])] = x[1:3] * 2.0
        return x

    xs, vs = _x(4, 3).astype(np.float32), _x(4).astype(np.float32)
    check_vmap_loop(f, xs, vs)
    check_vmap_loop(f, xs.T.copy(), vs, in_axes=(1, 0))
    check_vmap_loop(f, xs, vs[0], in_axes=(0, None))


# -- compositions ------------------------------------------------------------------------
def _model(w, x):
    h = mx.concatenate([x, x[:, ::-1]], 1) @ w
    h = mx.transpose(mx.reshape(h, (2, 2, 3)), (0, 2, 1))
    h = h.at[mx.array([0, 0, 1])].add(h[1])
    y = mx.take_along_axis(h, mx.array([[[1], [0], [1]]]), 2)
    z = y * 1.0
    z[0, 1:] = y[1, :2] ** 2
    return mx.sum(mx.sin(z) * mx.arange(6.0).reshape(2, 3, 1))


def test_grad_of_a_function_of_indexing_and_shapes():
    w, x = _x(6, 3), _x(4, 3)
    check_vjp_fd(lambda w: _model(w, to_lazyx(x)), w)
    check_vjp_fd(lambda x: _model(to_lazyx(w), x), x)
    check_jvp_vjp(_model, w, x)


def test_grad_of_grad_through_indexing():
    x = _x(4, 3)
    for f in (lambda a: mx.sum(a[ROWS] ** 3), lambda a: mx.sum(a.at[ROWS].multiply(a[1:]) ** 2),
              lambda a: mx.sum(mx.take_along_axis(a, mx.array([[2], [0], [1], [1]]), 1) ** 3),
              lambda a: mx.sum(a.at[1:, ROWS[:2]].maximum(a[:3, :2] * 0.5) ** 3),
              lambda a: mx.sum(mx.reshape(_assign(a, (ROWS, 0), a[1:, 1] ** 2), (-1,)) ** 3)):
        check_vjp_fd(mx.grad(f), x)


def test_vmap_of_grad_and_grad_of_vmap():
    # Data of its own and of moderate size: _model squares and takes the sine of its
    # values, so at the module generator's scale (whatever earlier tests drew) a GPU's
    # batched and single GEMMs, which sum in other orders, differ past float32's tolerance.
    gen = np.random.default_rng(29)
    ws = gen.uniform(-0.5, 0.5, (3, 6, 3)).astype(np.float32)
    x = to_lazyx(gen.uniform(-0.5, 0.5, (4, 3)).astype(np.float32))
    check_vmap_loop(mx.grad(lambda w: _model(w, x)), ws)
    check_vmap_loop(mx.grad(lambda w: _model(w, x)), np.moveaxis(ws, 0, 2), in_axes=2)
    # Per-example gradients with per-example index arrays.
    f = mx.grad(lambda a, i: mx.sum(a[i] ** 2 * mx.arange(3.0)))
    check_vmap_loop(f, _x(5, 4, 3).astype(np.float32), np.array([[0, 0], [1, 3], [2, 2],
                                                                  [3, 0], [1, 1]], np.int32))
    g = mx.grad(lambda a: mx.sum(mx.vmap(lambda r, i: r[i] * r[0])(a, mx.array([2, 0, 1]))))
    x = _x(3, 4)
    check_vjp_fd(lambda a: mx.sum(mx.vmap(lambda r, i: r[i] * r[0])(a, mx.array([2, 0, 1]))), x)
    assert g(to_lazyx(x)).shape == (3, 4)


def test_out_of_range_batched_index_still_raises():
    f = mx.vmap(lambda a, i: a[i], in_axes=(None, 0))
    with pytest.raises(IndexOutOfRangeError):
        f(mx.zeros((3, 2)), mx.array([[0], [3]])).tolist()


def test_rules_on_primitives_directly():
    x = mx.zeros((4, 3))
    y = x[ROWS]
    (g,) = y._prim.vjp([x, ROWS], [mx.ones((3, 3))], [0], [y])
    assert g.tolist() == [[2] * 3, [0] * 3, [1] * 3, [0] * 3]
    with pytest.raises(ValueError, match="stop_gradient"):
        y._prim.vjp([x, ROWS], [mx.ones((3, 3))], [1], [y])
    (out,), (ax,) = y._prim.vmap([mx.zeros((5, 4, 3)), ROWS], [0, None])
    assert out.shape == (5, 3, 3) and ax == 0
    s = x[1:3]
    (out,), (ax,) = s._prim.vmap([mx.zeros((4, 5, 3))], [1])
    assert out.shape == (2, 5, 3) and ax == 1


def test_every_indexing_primitive_has_rules():
    from lazyx.primitive import Primitive
    for cls in ix.PRIMITIVES:
        for rule in ("vjp", "jvp", "vmap"):
            assert getattr(cls, rule) is not getattr(Primitive, rule), f"{cls.__name__}.{rule}"
