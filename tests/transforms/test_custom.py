"""custom_function (vjp/jvp/vmap overrides and their fallbacks) and checkpoint."""

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.errors import ArgumentError
from helpers import assert_close, random_array, rng
from toy_primitives import (t_add, t_matmul, t_mul, t_norule, t_sin, t_sum, t_tanh)

XS = np.array([0.5, 1.0, 2.0, -0.7], dtype=np.float32)


def x_():
    return mx.array(XS)


def test_custom_vjp_replaces_the_gradient():
    calls = []

    @mx.custom_function
    def f(x):
        return t_sin(x)

    @f.vjp
    def f_vjp(primals, cotangent, output):
        calls.append((primals.shape, cotangent.shape, output.shape))
        return t_mul(cotangent, mx.array(np.full(4, 10.0, np.float32)))

    assert isinstance(f, mx.custom_function)
    assert_close(f(x_()), np.sin(XS), mx.float32)
    assert_close(mx.grad(lambda x: t_sum(f(x)))(x_()), np.full(4, 10.0), mx.float32)
    assert calls == [((4,), (4,), (4,))]
    # Rules that are not given fall back to the function's own transforms.
    _, (t,) = mx.jvp(f, [x_()], [mx.ones((4,))])
    assert_close(t, np.cos(XS), mx.float32)
    assert_close(mx.vmap(f)(mx.array(np.stack([XS, XS]))), np.sin(np.stack([XS, XS])),
                 mx.float32)


def test_the_transforms_do_not_look_inside():
    # The function's own primitive has no rules; the custom ones are enough.
    @mx.custom_function
    def f(x):
        return t_norule(x)

    f.vjp(lambda p, c, o: t_mul(c, p))
    f.jvp(lambda p, t: t_add(t, t))
    f.vmap(lambda x, ax: (t_norule(x), ax))
    assert_close(mx.grad(lambda x: t_sum(f(x)))(x_()), XS, mx.float32)
    assert_close(mx.jvp(f, [x_()], [x_()])[1][0], 2 * XS, mx.float32)
    assert_close(mx.vmap(f, in_axes=1)(mx.array(np.stack([XS, XS]))), np.stack([XS, XS]).T,
                 mx.float32)


def test_several_arguments_outputs_and_keywords():
    seen = {}

    @mx.custom_function
    def g(x, scale, y, *, shift=0.0):
        return t_mul(x, y), t_add(x, y)

    @g.vjp
    def g_vjp(primals, cotangents, outputs, *, shift=0.0):
        x, scale, y = primals
        seen["vjp"] = (scale, shift, len(cotangents), len(outputs))
        return t_add(t_mul(cotangents[0], y), cotangents[1]), None, cotangents[1]

    @g.jvp
    def g_jvp(primals, tangents, *, shift=0.0):
        x, scale, y = primals
        tx, ts, ty = tangents
        seen["jvp"] = ts
        return [t_add(t_mul(tx, y), t_mul(x, ty)), t_add(tx, ty)]

    a, b = x_(), mx.array(XS * 2)
    gx, gy = mx.grad(lambda x, y: t_sum(t_add(*g(x, 3, y, shift=1.0))), argnums=(0, 1))(a, b)
    assert seen["vjp"] == (3, 1.0, 2, 2)
    assert_close(gx, XS * 2 + 1, mx.float32)
    assert_close(gy, np.ones(4), mx.float32)  # the custom rule sends only cotangents[1]
    _, (t0, t1) = mx.jvp(lambda x, y: g(x, 3, y), [a, b], [mx.ones((4,)), mx.zeros((4,))])
    assert seen["jvp"] is None
    assert_close(t0, XS * 2, mx.float32)
    assert_close(t1, np.ones(4), mx.float32)


def test_tree_arguments_and_captured_arrays_are_constants():
    captured = mx.array(XS * 3)

    @mx.custom_function
    def h(p):
        return t_mul(t_mul(p["a"], p["b"]), captured)

    @h.vjp
    def h_vjp(primals, cotangent, output):
        return {"a": t_mul(cotangent, primals["b"]), "b": None}

    g = mx.grad(lambda p: t_sum(h(p)))({"a": x_(), "b": mx.array(XS * 2)})
    assert_close(g["a"], XS * 2, mx.float32)
    assert_close(g["b"], np.zeros(4), mx.float32)
    # Without a custom vjp, the captured array is still a constant (no gradient to it).
    k = mx.custom_function(lambda x: t_mul(x, captured))
    g = mx.grad(lambda c: t_sum(k(x_())), argnums=0)(captured)
    assert_close(g, np.zeros(4), mx.float32)


def test_custom_vmap_and_composition():
    calls = []

    @mx.custom_function
    def f(x, y):
        return t_mul(t_sin(x), y)

    @f.vmap
    def f_vmap(inputs, axes):
        calls.append(axes)
        x, y = inputs
        ax, ay = axes
        return mx.vmap(lambda a, b: t_mul(t_sin(a), b), in_axes=(ax, ay))(x, y), 0

    @f.vjp
    def f_vjp(primals, cotangent, output):
        x, y = primals
        return t_mul(cotangent, y), t_mul(cotangent, t_sin(x))

    xs, y = mx.array(np.stack([XS, -XS])), mx.array(XS)
    assert_close(mx.vmap(f, in_axes=(0, None))(xs, y), np.sin(np.stack([XS, -XS])) * XS,
                 mx.float32)
    assert calls == [(0, None)]
    # vmap of grad: the custom vjp runs on the placeholders, then is batched.
    g = mx.vmap(mx.grad(lambda a, b: t_sum(f(a, b))), in_axes=(0, None))(xs, y)
    assert_close(g, np.stack([XS, XS]), mx.float32)


def test_custom_function_errors():
    with pytest.raises(ArgumentError, match="Expected a callable"):
        mx.custom_function(3)
    bad = mx.custom_function(lambda x: (x, "s"))
    with pytest.raises(ArgumentError, match=r"output\[1\] is a value of type str"):
        bad(x_())

    @mx.custom_function
    def f(x, y):
        return t_mul(x, y)
    f.vjp(lambda p, c, o: {"no": c})
    with pytest.raises(ArgumentError, match="sequence of 2 entries"):
        mx.grad(lambda x: t_sum(f(x, x)))(x_())


def test_depends_orders_without_copying(on_cpu):
    from lazyx.transforms.custom import depends
    a, b = x_(), t_sin(x_())
    (c,) = depends([a], [b])
    mx.eval(c)
    assert np.shares_memory(np.asarray(c), np.asarray(a))
    assert b._data is not None  # the dependency ran first


# -- checkpoint ----------------------------------------------------------------------------
def _mlp(ws, x, ckpt, per_block=4):
    def block(h, *block_ws):
        for w in block_ws:
            h = t_tanh(t_matmul(h, w))
        return h
    f = mx.checkpoint(block) if ckpt else block
    h = x
    for i in range(0, len(ws), per_block):
        h = f(h, *ws[i:i + per_block])
    return t_sum(h)


def _weights(n, d, seed):
    gen = rng(seed)
    return [mx.array((gen.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32))
            for _ in range(n)]


def test_checkpoint_gives_the_same_gradients():
    ws = _weights(8, 16, 31)
    x = mx.array(random_array((4, 16), mx.float32, rng(32)))
    v0, g0 = mx.value_and_grad(_mlp, argnums=(0, 1))(ws, x, False)
    v1, g1 = mx.value_and_grad(_mlp, argnums=(0, 1))(ws, x, True)
    assert_close(v1, np.array(v0), mx.float32)
    for a, b in zip(g1[0] + [g1[1]], g0[0] + [g0[1]]):
        assert_close(a, np.array(b), mx.float32, rtol=1e-5, atol=1e-6)


def test_checkpoint_lowers_peak_memory():
    ws = _weights(16, 128, 33)
    x = mx.array(random_array((128, 128), mx.float32, rng(34)))
    peaks = {}
    for ckpt in (False, True):
        mx.eval(x, ws)
        base = mx.get_active_memory()
        mx.reset_peak_memory()
        v, g = mx.value_and_grad(_mlp)(ws, x, ckpt)
        mx.eval(v, g)
        peaks[ckpt] = mx.get_peak_memory() - base
        del v, g
    if peaks[False] == 0:
        pytest.skip("the active CPU backend reports no memory figures")
    # Without checkpointing every layer's activation waits for the backward pass;
    # with it only the block boundaries and one block's recomputation do.
    assert peaks[True] < 0.8 * peaks[False], peaks


def test_checkpoint_composes():
    ws = _weights(2, 4, 35)
    x = mx.array(random_array((3, 4), mx.float32, rng(36)))
    f = mx.checkpoint(lambda h, w: t_tanh(t_matmul(h, w)))
    plain = lambda h, w: t_tanh(t_matmul(h, w))  # noqa: E731
    g = mx.grad(lambda w: t_sum(f(x, w)))(ws[0])
    assert_close(g, np.array(mx.grad(lambda w: t_sum(plain(x, w)))(ws[0])), mx.float32)
    # Checkpointed values under vmap fall back to batching the function.
    xs = mx.array(random_array((2, 3, 4), mx.float32, rng(37)))
    out = mx.vmap(lambda h: mx.checkpoint(lambda a: t_sin(a))(h))(xs)
    assert_close(out, np.sin(np.array(xs)), mx.float32)
