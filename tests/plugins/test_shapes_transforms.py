"""Transform rules of the shapes pack: every primitive's vjp against central finite
differences in float64, jvp against vjp, and vmap against a Python loop with each
argument unbatched, batched first or batched last; the compositions built on the
primitives (stack, tile, repeat, roll, flip, trace ...); 0-d and empty arrays; dynamic
slices with starts that differ per example; and compositions of transforms."""

import itertools

import numpy as np
import pytest

import lazyx.core as mx
from helpers import assert_close, check_jvp_vjp, check_vjp_fd, check_vmap_loop, rng, to_lazyx
from lazyx.errors import IndexOutOfRangeError
from lazyx.plugins import shapes as sh

GEN = rng(11)


def _x(*shape):
    return GEN.uniform(-2.0, 2.0, size=shape)


# name: (function of float arrays, argument shapes)
CASES = {
    "reshape": (lambda a: mx.reshape(a, (3, 2)), [(2, 3)]),
    "reshape-infer": (lambda a: mx.reshape(a, (2, -1, 2)), [(4, 3)]),
    "reshape-0d": (lambda a: mx.reshape(a, (1, 1)), [()]),
    "reshape-to-0d": (lambda a: mx.reshape(a, ()), [(1,)]),
    "flatten": (lambda a: mx.flatten(a, 1, 2), [(2, 3, 2)]),
    "flatten-all": (lambda a: mx.flatten(a), [(2, 3)]),
    "flatten-0d": (lambda a: mx.flatten(a), [()]),
    "unflatten": (lambda a: mx.unflatten(a, -1, (2, -1)), [(3, 4)]),
    "squeeze": (lambda a: mx.squeeze(a, (0, 2)), [(1, 3, 1, 2)]),
    "squeeze-all": (lambda a: mx.squeeze(a), [(1, 3, 1)]),
    "expand_dims": (lambda a: mx.expand_dims(a, (0, 2)), [(2, 3)]),
    "expand_dims-last": (lambda a: mx.expand_dims(a, -1), [(2, 3)]),
    "expand_dims-0d": (lambda a: mx.expand_dims(a, 0), [()]),
    "transpose": (lambda a: mx.transpose(a, (1, 2, 0)), [(2, 3, 2)]),
    "T": (lambda a: a.T, [(2, 3)]),
    "swapaxes": (lambda a: mx.swapaxes(a, 0, -1), [(2, 3, 4)]),
    "moveaxis": (lambda a: mx.moveaxis(a, 0, 2), [(2, 3, 4)]),
    "broadcast_to": (lambda a: mx.broadcast_to(a, (2, 3, 2)), [(3, 1)]),
    "broadcast_to-0d": (lambda a: mx.broadcast_to(a, (2, 2)), [()]),
    "broadcast_arrays": (lambda a, b: mx.broadcast_arrays(a, b), [(3, 1), (1, 2)]),
    "concatenate": (lambda a, b: mx.concatenate([a, b], 1), [(2, 3), (2, 1)]),
    "concatenate-3": (lambda a, b, c: mx.concatenate([a, b, c], 0), [(1, 2), (2, 2), (1, 2)]),
    "concatenate-None": (lambda a, b: mx.concatenate([a, b], None), [(2, 2), (3,)]),
    "concatenate-empty": (lambda a, b: mx.concatenate([a, b], 0), [(0, 2), (2, 2)]),
    "stack": (lambda a, b: mx.stack([a, b], 1), [(2, 3), (2, 3)]),
    "split": (lambda a: mx.split(a, [1, 3], 1), [(2, 4)]),
    "split-sections": (lambda a: mx.split(a, 2, 0), [(4, 2)]),
    "split-overlapping": (lambda a: mx.split(a, [3, 1], 0), [(4, 2)]),
    "split-empty-piece": (lambda a: mx.split(a, [2, 2], 1), [(2, 3)]),
    "unstack": (lambda a: mx.unstack(a, axis=1), [(2, 3)]),
    "tile": (lambda a: mx.tile(a, (2, 1, 2)), [(2, 3)]),
    "repeat": (lambda a: mx.repeat(a, 2, axis=1), [(2, 3)]),
    "repeat-flat": (lambda a: mx.repeat(a, 3), [(2, 2)]),
    "pad": (lambda a: mx.pad(a, ((1, 0), (0, 2))), [(2, 3)]),
    "pad-value": (lambda a, v: mx.pad(a, 1, constant_values=v), [(2, 3), ()]),
    "pad-edge": (lambda a: mx.pad(a, (1, 2), mode="edge"), [(2, 3)]),
    "pad-reflect": (lambda a: mx.pad(a, ((0, 0), (2, 1)), mode="reflect"), [(2, 4)]),
    "roll": (lambda a: mx.roll(a, (1, -2), (0, 1)), [(3, 4)]),
    "roll-flat": (lambda a: mx.roll(a, 2), [(2, 3)]),
    "flip": (lambda a: mx.flip(a, 1), [(2, 3)]),
    "atleast_3d": (lambda a: mx.atleast_3d(a), [(3,)]),
    "diagonal": (lambda a: mx.diagonal(a, 1), [(3, 4)]),
    "diagonal-axes": (lambda a: mx.diagonal(a, -1, 2, 0), [(3, 2, 4)]),
    "diagonal-adjacent": (lambda a: mx.diagonal(a, 0, 2, 1), [(2, 3, 3)]),
    "diag-matrix": (lambda a: mx.diag(a, -1), [(3,)]),
    "diag-of-matrix": (lambda a: mx.diag(a, 1), [(3, 3)]),
    "trace": (lambda a: mx.trace(a, 1, 1, 2), [(2, 3, 4)]),
    "as_strided": (lambda a: mx.as_strided(a, (3, 2), (1, 1), 1), [(2, 3)]),
    "as_strided-windows": (lambda a: mx.as_strided(a, (4, 3), (1, 1)), [(6,)]),
    "as_strided-reversed": (lambda a: mx.as_strided(a, (3,), (-2,), 5), [(2, 3)]),
    "view-same": (lambda a: mx.view(a, a.dtype), [(2, 3)]),
    "contiguous": (lambda a: mx.contiguous(a.T), [(2, 3)]),
    "slice": (lambda a: mx.slice(a, mx.array([1, 0]), (0, 1), (2, 2)), [(4, 3)]),
    "slice-negative": (lambda a: mx.slice(a, mx.array(-2), (1,), (2, 2)), [(2, 4)]),
    "slice_update": (lambda a, u: mx.slice_update(a, u, mx.array([1]), (0,)), [(4, 3), (2, 3)]),
    "slice_update-repeat": (lambda a, u: mx.slice_update(a, u, mx.array([1, 2]), (1, 0)),
                            [(4, 3), (2,)]),
}
SINGLE = [k for k, (_, shapes) in CASES.items() if len(shapes) == 1]


def _args(name):
    return [_x(*s) for s in CASES[name][1]]


def _vmap_axes(shapes):
    """Each argument unbatched, batched first or batched last (not all unbatched)."""
    out = []
    for combo in itertools.product((None, 0, -1), repeat=len(shapes)):
        if any(c is not None for c in combo):
            out.append(combo)
    return out


def _batched(x, axis, n=3):
    """``n`` examples like ``x`` (random, float32) stacked at ``axis``."""
    if axis is None:
        return x.astype(np.float32)
    return np.stack([_x(*x.shape).astype(np.float32) for _ in range(n)], axis=axis)


@pytest.mark.parametrize("name", CASES)
def test_vjp_and_jvp(name):
    fn = CASES[name][0]
    args = _args(name)
    check_vjp_fd(fn, *args, msg=name)
    check_jvp_vjp(fn, *args, msg=name)


@pytest.mark.parametrize("name", CASES)
def test_vmap_against_a_loop(name):
    fn, shapes = CASES[name]
    args = _args(name)
    for axes in _vmap_axes(shapes):
        check_vmap_loop(fn, *[_batched(a, ax) for a, ax in zip(args, axes)],
                        in_axes=list(axes), msg=f"{name} {axes}")


@pytest.mark.parametrize("name", ["reshape", "transpose", "split", "diagonal-axes", "pad",
                                  "expand_dims", "as_strided", "squeeze"])
@pytest.mark.parametrize("out_axis", [1, -1])
def test_vmap_out_axes(name, out_axis):
    fn = CASES[name][0]
    x = _batched(_args(name)[0], 1, 4)
    check_vmap_loop(fn, x, in_axes=1, out_axes=out_axis, msg=name)


def test_broadcast_to_vjp_sums_over_broadcast_dimensions():
    x = mx.array([[1.0], [2.0]])
    (g,) = mx.vjp(lambda a: mx.broadcast_to(a, (3, 2, 4)), [x],
                  [mx.ones((3, 2, 4))])[1]
    assert g.shape == (2, 1) and g.tolist() == [[12.0], [12.0]]
    g = mx.grad(lambda a: mx.sum(mx.broadcast_to(a, (2, 3)) * mx.array([1.0, 2.0, 3.0])))(
        mx.array(1.0))
    assert g.shape == () and g.item() == 12.0


def test_overlapping_views_accumulate():
    # as_strided windows read elements several times; an overlapping split too.
    x = mx.arange(5, dtype=mx.float32)
    g = mx.grad(lambda a: mx.sum(mx.as_strided(a, (3, 3), (1, 1))))(x)
    assert g.tolist() == [1, 2, 3, 2, 1]
    g = mx.grad(lambda a: mx.sum(mx.concatenate(mx.split(a, [3, 1]))))(x)
    assert g.tolist() == [1, 2, 2, 1, 1]


def test_view_gradients():
    x = mx.array([1.0, 2.0, 3.0])
    # As its own dtype a view is the identity; a reinterpretation has no derivative.
    assert mx.grad(lambda a: mx.sum(mx.view(a, mx.float32) * a))(x).tolist() == [2, 4, 6]
    assert mx.grad(lambda a: mx.sum(mx.view(a, mx.float16)) + mx.sum(a))(x).tolist() == [1, 1, 1]
    out, t = mx.jvp(lambda a: mx.view(a, mx.float16), [x], [mx.ones(3)])
    assert t[0].shape == (6,) and not np.any(np.array(t[0]))
    # vmap with the batch on the axis whose size changes.
    check_vmap_loop(lambda a: mx.view(a, mx.int16), np.arange(12, dtype=np.int32).reshape(3, 4),
                    in_axes=1)
    check_vmap_loop(lambda a: mx.view(a, mx.uint8), np.arange(6, dtype=np.int32).reshape(2, 3),
                    in_axes=0)


def test_pad_value_gradient_is_the_padded_area():
    x = mx.ones((2, 3))
    ga, gv = mx.grad(lambda a, v: mx.sum(mx.pad(a, ((1, 0), (0, 2)), constant_values=v) ** 2),
                     argnums=(0, 1))(x, mx.array(3.0))
    assert ga.tolist() == [[2.0] * 3] * 2
    assert gv.item() == 2 * 3.0 * (3 * 5 - 6)


def test_pad_value_batched():
    check_vmap_loop(lambda a, v: mx.pad(a, ((1, 0), (0, 2)), constant_values=v),
                    _batched(_x(2, 3), 1), np.array([1.0, -2.0, 3.0], np.float32),
                    in_axes=(1, 0))
    check_vmap_loop(lambda a, v: mx.pad(a, 1, constant_values=v), _x(2, 2).astype(np.float32),
                    np.array([1.0, -2.0, 3.0], np.float32), in_axes=(None, 0))


# -- dynamic slices with per-example starts --------------------------------------------
STARTS = np.array([[0, 1], [2, 0], [1, 1]], np.int32)  # one (axis-0, axis-1) start per example


@pytest.mark.parametrize("x_axis", [None, 0, 2])
def test_slice_with_batched_starts(x_axis):
    x = _x(4, 3).astype(np.float32) if x_axis is None else _batched(_x(4, 3), x_axis)
    fn = lambda a, s: mx.slice(a, s, (0, 1), (2, 2))  # noqa: E731
    check_vmap_loop(fn, x, STARTS, in_axes=(x_axis, 0))
    check_vmap_loop(fn, x, np.ascontiguousarray(STARTS.T), in_axes=(x_axis, 1))
    # A start that counts from the end, and a block narrower than its axis elsewhere.
    check_vmap_loop(lambda a, s: mx.slice(a, s, (1,), (3, 2)), x, np.array([-2, 0, 1], np.int32),
                    in_axes=(x_axis, 0))


@pytest.mark.parametrize("axes", [(None, None, 0), (0, None, 0), (None, 0, 0), (1, 1, 0)])
def test_slice_update_with_batched_starts(axes):
    a, u = _x(4, 3), _x(2, 1)
    ins = [_batched(v, ax) for v, ax in zip((a, u), axes[:2])]
    fn = lambda x, v, s: mx.slice_update(x, v, s, (0, 1))  # noqa: E731
    check_vmap_loop(fn, *ins, STARTS, in_axes=axes)
    # An update with fewer dimensions repeats along the leading axes.
    check_vmap_loop(lambda x, v, s: mx.slice_update(x, v[0], s, (1,)), *ins,
                    np.array([0, 2, 1], np.int32), in_axes=axes)


def test_batched_starts_out_of_range_raise():
    f = mx.vmap(lambda a, s: mx.slice(a, s, (0,), (2, 3)), in_axes=(None, 0))
    with pytest.raises(IndexOutOfRangeError):
        f(mx.zeros((4, 3)), mx.array([[0], [3]])).tolist()
    with pytest.raises(IndexOutOfRangeError):
        f(mx.zeros((4, 3)), mx.array([[0], [-5]])).tolist()
    g = mx.vmap(lambda a, s: mx.slice_update(a, mx.ones((2, 3)), s, (0,)), in_axes=(None, 0))
    with pytest.raises(IndexOutOfRangeError):
        g(mx.zeros((4, 3)), mx.array([[1], [3]])).tolist()


def test_slice_start_refuses_gradient_unless_stopped():
    # MLX raises a ValueError for a differentiated start index; stop_gradient is the fix.
    x = to_lazyx(_x(4, 3))
    with pytest.raises(ValueError, match="stop_gradient"):
        mx.grad(lambda a, s: mx.sum(mx.slice(a, s, (0,), (2, 3))), argnums=(0, 1))(
            x, mx.array([1]))
    with pytest.raises(ValueError, match="stop_gradient"):
        mx.grad(lambda a, s: mx.sum(mx.slice_update(a, a[:1] * 2, s, (0,))), argnums=(0, 1))(
            x, mx.array([1]))
    gx, gs = mx.grad(lambda a, s: mx.sum(mx.slice(a, mx.stop_gradient(s), (0,), (2, 3))),
                     argnums=(0, 1))(x, mx.array([1]))
    assert gx.tolist() == [[0] * 3, [1] * 3, [1] * 3, [0] * 3]
    assert gs.tolist() == [0]


# -- compositions --------------------------------------------------------------------
def _chain(a):
    b = mx.reshape(mx.transpose(a, (1, 0)), (2, 3))
    c = mx.concatenate([b, mx.expand_dims(mx.sum(b, 0), 0)], 0)
    return mx.sum(mx.broadcast_to(c[:, None, :], (3, 2, 3)) ** 3 * mx.flatten(c)[:3])


def test_grad_of_grad_through_reshapes():
    x = _x(3, 2)
    check_vjp_fd(mx.grad(_chain), x)
    check_vjp_fd(mx.grad(lambda a: mx.sum(mx.reshape(a, (6,)) ** 3)), x)
    h = mx.grad(lambda a: mx.sum(mx.grad(lambda b: mx.sum(mx.reshape(b, (-1,)) ** 4))(a)))(
        to_lazyx(x))
    assert_close(h, 12 * x ** 2, mx.float64)


def test_vmap_of_grad_and_jvp_of_grad():
    xs = _batched(_x(3, 2), 0, 4)
    check_vmap_loop(mx.grad(_chain), xs)
    check_vmap_loop(mx.grad(_chain), np.moveaxis(xs, 0, 2), in_axes=2)
    x, v = _x(3, 2), _x(3, 2)
    _, (t,) = mx.jvp(mx.grad(_chain), [to_lazyx(x)], [to_lazyx(v)])
    # The Hessian-vector product by central differences of the gradient.
    eps = 1e-6
    g = lambda y: np.array(mx.grad(_chain)(to_lazyx(y)))  # noqa: E731
    np.testing.assert_allclose(np.array(t), (g(x + eps * v) - g(x - eps * v)) / (2 * eps),
                               rtol=1e-6, atol=1e-6)


def test_vmap_of_vmap():
    x = GEN.uniform(-1, 1, (2, 3, 4, 5)).astype(np.float32)
    f = lambda a: mx.split(mx.transpose(mx.pad(a, ((1, 0), (0, 1))), (1, 0)), [2], 0)  # noqa: E731
    got = mx.vmap(mx.vmap(f, in_axes=1), in_axes=3)(to_lazyx(x))
    for k in range(2):
        want = np.stack([np.stack([np.array(f(to_lazyx(x[:, i, :, j]))[k]) for i in range(3)])
                         for j in range(5)])
        np.testing.assert_array_equal(np.array(got[k]), want)


def test_rules_on_primitives_directly():
    x = mx.zeros((2, 3, 4))
    t = mx.transpose(x, (2, 0, 1))
    (out,), (ax,) = t._prim.vmap([mx.zeros((5, 2, 3, 4))], [0])
    assert out.shape == (5, 4, 2, 3) and ax == 0
    (out,), (ax,) = t._prim.vmap([mx.zeros((2, 3, 5, 4))], [2])
    assert out.shape == (4, 2, 5, 3) and ax == 2
    b = mx.broadcast_to(mx.zeros((3, 1)), (2, 3, 4))
    (g,) = b._prim.vjp([mx.zeros((3, 1))], [mx.ones((2, 3, 4))], [0], [b])
    assert g.shape == (3, 1) and g.tolist() == [[8.0]] * 3
    parts = mx.split(mx.zeros((4, 2)), [1])
    assert parts[0]._prim.jvp([mx.zeros((4, 2))], [mx.ones((4, 2))], [0])[1].shape == (3, 2)


def test_every_shapes_primitive_has_rules():
    from lazyx.primitive import Primitive
    for cls in sh.PRIMITIVES:
        for rule in ("vjp", "jvp", "vmap"):
            assert getattr(cls, rule) is not getattr(Primitive, rule), f"{cls.__name__}.{rule}"
