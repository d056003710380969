"""Transform rules of the creation pack: ``full`` (and ``full_like``) with array values is
linear (vjp sums over the broadcast dimensions, jvp broadcasts, vmap fills a batch),
constant creations carry no gradient and stay unbatched under vmap, and ``tril``/``triu``
differentiate and batch through their composition."""

import numpy as np
import pytest

import lazyx.core as mx
from helpers import assert_close, check_jvp_vjp, check_vjp_fd, check_vmap_loop, rng, to_lazyx
from lazyx.plugins import creation as cr


def _vjp(fn, x, cot):
    return mx.vjp(fn, [x], [cot])[1][0]


@pytest.mark.parametrize("vshape", [(), (3,), (2, 1), (1, 3), (2, 3), (1, 1, 3)])
def test_full_vjp_jvp(vshape):
    shape = (4, 2, 3) if len(vshape) == 3 else (2, 3)
    gen = rng(1)
    v = to_lazyx(gen.standard_normal(vshape))
    g = gen.standard_normal(shape)
    got = _vjp(lambda v: mx.full(shape, v), v, to_lazyx(g))
    lead = len(shape) - len(vshape)
    want = g.sum(axis=tuple(range(lead))).sum(
        axis=tuple(i for i, n in enumerate(vshape) if n == 1), keepdims=True).reshape(vshape)
    assert_close(got, want, mx.float64)
    t = gen.standard_normal(vshape)
    _, (tan,) = mx.jvp(lambda v: mx.full(shape, v), [v], [to_lazyx(t)])
    assert_close(tan, np.broadcast_to(t, shape), mx.float64)
    vals = gen.standard_normal(vshape)
    check_vjp_fd(lambda v: mx.full(shape, v) * mx.full(shape, v), vals)
    check_jvp_vjp(lambda v: mx.full(shape, v), vals)


def test_full_like_and_casts():
    a = mx.zeros((2, 3), mx.float16)
    v = to_lazyx(np.array([1.0, 2.0, 3.0]))
    got = _vjp(lambda v: mx.full_like(a, v), v, mx.ones((2, 3), mx.float16))
    assert_close(got, [2.0, 2.0, 2.0], mx.float64)  # back through the cast to float16
    # zeros_like/ones_like do not depend on their argument's values: no gradient.
    x = mx.array([1.0, 2.0])
    assert _vjp(lambda x: mx.zeros_like(x) + mx.ones_like(x) * 3, x, mx.ones(2)).tolist() == [0, 0]
    assert _vjp(lambda x: x + mx.full_like(x, 2.0), x, mx.ones(2)).tolist() == [1, 1]


@pytest.mark.parametrize("in_axis", [0, 1, -1])
def test_full_vmap(in_axis):
    vals = to_lazyx(rng(2).standard_normal((3, 4)))
    out = mx.vmap(lambda v: mx.full((2, 4) if in_axis == 0 else (2, 3), v), in_axes=in_axis)(vals)
    per = np.moveaxis(np.array(vals), in_axis, 0)
    want = np.stack([np.broadcast_to(p, (2,) + p.shape) for p in per])
    assert_close(out, want, mx.float64)
    # values of lower rank than the shape, batched on the last axis
    v = rng(3).standard_normal((3, 4))
    check_vmap_loop(lambda v: mx.full((5, 2, 3), v), v, in_axes=1)
    check_vmap_loop(lambda v: mx.full((2, 3), v), v, in_axes=1, out_axes=2)
    check_vmap_loop(lambda v, w: mx.full((2, 3), v) * w, v[:2, :1], v, in_axes=(None, 1))


def test_constant_creations_under_transforms():
    x = mx.array([1.0, 2.0, 3.0])
    out = mx.vmap(lambda x: x + mx.arange(2.0) + mx.zeros((2,)) + mx.hanning(2))(
        mx.reshape(mx.arange(6.0), (3, 2)))
    assert_close(out, np.arange(6.0).reshape(3, 2) + np.arange(2.0), mx.float32)
    out = mx.vmap(lambda x: mx.eye(3) * x)(x)
    assert_close(out, np.eye(3)[None] * np.array([1, 2, 3.0])[:, None, None], mx.float32)
    _, (t,) = mx.jvp(lambda x: x * mx.linspace(0, 1, 3), [x], [mx.ones(3)])
    assert t.tolist() == [0, 0.5, 1]
    # The rules themselves: nothing flows back, the tangent is zero, vmap leaves it unbatched.
    for a in (mx.zeros((2, 2)), mx.arange(3), mx.linspace(0, 1, 4), mx.eye(2), mx.tri(2),
              mx.bartlett(5), mx.ones_like(x)):
        p = a._prim
        assert isinstance(p, cr.Creation)
        assert p.vjp([], [mx.ones_like(a)], [], [a]) == [] and p.jvp([], [], []) == [None]
        (b,), axes = p.vmap([], [])
        assert axes == [None] and b.shape == a.shape and b.dtype == a.dtype
        assert_close(b, np.array(a))


@pytest.mark.parametrize("k", [-1, 0, 2])
def test_tril_triu_transforms(k):
    gen = rng(3)
    x = to_lazyx(gen.standard_normal((3, 4)))
    g = to_lazyx(gen.standard_normal((3, 4)))
    assert_close(_vjp(lambda x: mx.tril(x, k), x, g), np.tril(np.array(g), k), mx.float64)
    assert_close(_vjp(lambda x: mx.triu(x, k), x, g), np.triu(np.array(g), k), mx.float64)
    _, (t,) = mx.jvp(lambda x: mx.triu(x, k), [x], [g])
    assert_close(t, np.triu(np.array(g), k), mx.float64)
    b = gen.standard_normal((2, 3, 4))
    check_vmap_loop(lambda x: mx.tril(x, k), b)
    check_vmap_loop(lambda x: mx.triu(x, k), b.transpose(1, 2, 0), in_axes=2)
    check_vjp_fd(lambda x: mx.tril(x, k) * x, b[0])


def test_every_creation_primitive_has_rules():
    from lazyx.primitive import Primitive
    for cls in cr.PRIMITIVES:
        for rule in ("vjp", "jvp", "vmap"):
            assert getattr(cls, rule) is not getattr(Primitive, rule), f"{cls.__name__}.{rule}"
