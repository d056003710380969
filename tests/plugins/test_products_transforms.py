"""Transform rules of the products pack (Matmul, AddMM, Softmax): vjp against finite
differences in float64, jvp against vjp, vmap against a Python loop, and compositions."""

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.plugins.products import matmul_shape
from lazyx.plugins.shapes import BroadcastTo, ExpandDims, Reshape, Transpose
from helpers import (assert_close, check_jvp_vjp, check_vjp_fd, check_vmap_loop, has_rules,
                     random_array, rng, to_lazyx)

# Operand shapes: 1-D operands, batch broadcasting (missing and size-1 batch dimensions).
MATMUL_SHAPES = [
    ((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)),
    ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)),
    ((1, 3, 4), (2, 4, 5)), ((4,), (2, 4, 5)), ((2, 3, 4), (4,)),
]
# Shape rules the rules' own graphs go through (transposes, reshapes, expand_dims).
SHAPE_RULES = has_rules(Transpose, Reshape, ExpandDims, BroadcastTo)
needs_shape_rules = pytest.mark.skipif(
    not SHAPE_RULES, reason="the shapes pack's transform rules are needed to transform a "
                            "second time")


def _data(shape, seed, dtype=mx.float64):
    return random_array(shape, dtype, rng(seed), -2.0, 2.0)


def _vmap_axes(*shapes):
    """in_axes combinations: each operand unbatched, batched first or batched last."""
    out = []
    for combo in np.ndindex(*(3,) * len(shapes)):
        axes = tuple((None, 0, len(s))[c] for c, s in zip(combo, shapes))
        if any(a is not None for a in axes):
            out.append(axes)
    return out


def _batched(x, axis, n=3, seed=0):
    """``n`` random examples of ``x``'s shape stacked on ``axis`` (``x`` itself when None)."""
    if axis is None:
        return x
    return np.stack([_data(x.shape, seed + i, mx.float32) for i in range(n)], axis=axis)


def _ids(shapes):
    return [f"{a}@{b}" for a, b in shapes]


# -- matmul -----------------------------------------------------------------------
@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES, ids=_ids(MATMUL_SHAPES))
def test_matmul_vjp_jvp(sa, sb):
    a, b = _data(sa, 1), _data(sb, 2)
    check_vjp_fd(mx.matmul, a, b, msg=f"matmul {sa} {sb}")
    check_jvp_vjp(mx.matmul, a, b, msg=f"matmul {sa} {sb}")
    # Each operand alone (the rule is asked for one argnum).
    check_vjp_fd(lambda x: mx.matmul(x, to_lazyx(b)), a)
    check_jvp_vjp(lambda y: mx.matmul(to_lazyx(a), y), b)


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES, ids=_ids(MATMUL_SHAPES))
def test_matmul_vmap(sa, sb):
    a, b = _data(sa, 3, mx.float32), _data(sb, 4, mx.float32)
    for axes in _vmap_axes(sa, sb):
        check_vmap_loop(mx.matmul, _batched(a, axes[0]), _batched(b, axes[1], seed=7),
                        in_axes=axes, msg=f"matmul {sa} {sb} in_axes={axes}")


def test_matmul_vmap_out_axes_and_nesting():
    a, b = _data((2, 3, 4), 5, mx.float32), _data((2, 4, 5), 6, mx.float32)
    check_vmap_loop(mx.matmul, a, b, in_axes=(0, 0), out_axes=2)
    check_vmap_loop(mx.matmul, a, np.swapaxes(b, 0, 1), in_axes=(0, 1), out_axes=-1)
    inner = mx.vmap(mx.matmul, in_axes=(0, None))
    got = mx.vmap(inner, in_axes=(0, 0))(to_lazyx(a.reshape(2, 3, 1, 4)), to_lazyx(b))
    want = np.stack([a.reshape(2, 3, 1, 4)[i] @ b[i] for i in range(2)])
    assert_close(got, want, mx.float32)


def test_matmul_complex_vjp_conjugates():
    # As MLX: the cotangent of a is g @ conj(b).T (and of b, conj(a).T @ g).
    gen = rng(8)
    a = (gen.normal(size=(2, 3)) + 1j * gen.normal(size=(2, 3))).astype(np.complex64)
    b = (gen.normal(size=(3, 4)) + 1j * gen.normal(size=(3, 4))).astype(np.complex64)
    g = (gen.normal(size=(2, 4)) + 1j * gen.normal(size=(2, 4))).astype(np.complex64)
    _, (ga, gb) = mx.vjp(mx.matmul, [to_lazyx(a), to_lazyx(b)], [to_lazyx(g)])
    assert_close(ga, g @ b.conj().T, mx.complex64)
    assert_close(gb, a.conj().T @ g, mx.complex64)


def test_matmul_vjp_dtype_and_grad():
    a = _data((3, 4), 9, mx.float32)
    b = _data((4,), 10, mx.float32)
    ga, gb = mx.grad(lambda x, y: mx.sum(mx.matmul(x, y)), argnums=(0, 1))(to_lazyx(a),
                                                                         to_lazyx(b))
    assert_close(ga, np.broadcast_to(b, (3, 4)), mx.float32)
    assert_close(gb, a.sum(0), mx.float32)


# -- addmm ------------------------------------------------------------------------
ADDMM_CASES = [
    ((3, 4), (4, 5), (3, 5)), ((3, 4), (4, 5), (5,)), ((3, 4), (4, 5), ()),
    ((4,), (4, 5), (5,)), ((3, 4), (4,), (3,)), ((4,), (4,), ()),
    ((2, 3, 4), (4, 5), (1, 3, 1)), ((3, 4), (2, 4, 5), (2, 1, 5)),
]
SCALES = [(1.0, 1.0), (0.5, -2.0), (2.0, 0.0)]


@pytest.mark.parametrize("sa,sb,sc", ADDMM_CASES, ids=[str(c) for c in ADDMM_CASES])
@pytest.mark.parametrize("alpha,beta", SCALES)
def test_addmm_vjp_jvp(sa, sb, sc, alpha, beta):
    c, a, b = _data(sc, 11), _data(sa, 12), _data(sb, 13)
    f = lambda c, a, b: mx.addmm(c, a, b, alpha=alpha, beta=beta)  # noqa: E731
    check_vjp_fd(f, c, a, b, msg="addmm")
    check_jvp_vjp(f, c, a, b, msg="addmm")
    # c alone: its tangent is broadcast to the product's shape.
    check_jvp_vjp(lambda c: f(c, to_lazyx(a), to_lazyx(b)), c, msg="addmm c")
    check_vjp_fd(lambda a: f(to_lazyx(c), a, to_lazyx(b)), a, msg="addmm a")


@pytest.mark.parametrize("sa,sb,sc", ADDMM_CASES, ids=[str(c) for c in ADDMM_CASES])
@pytest.mark.parametrize("alpha,beta", SCALES)
def test_addmm_vmap(sa, sb, sc, alpha, beta):
    c, a, b = _data(sc, 14, mx.float32), _data(sa, 15, mx.float32), _data(sb, 16, mx.float32)
    f = lambda c, a, b: mx.addmm(c, a, b, alpha=alpha, beta=beta)  # noqa: E731
    for axes in _vmap_axes(sc, sa, sb):
        check_vmap_loop(f, _batched(c, axes[0], seed=20), _batched(a, axes[1], seed=30),
                        _batched(b, axes[2], seed=40), in_axes=axes, msg=f"addmm {axes}")


def test_addmm_vmap_beta_zero_ignores_nan():
    # The kernel ignores c when beta == 0; so does the batched product of a batched c.
    c = np.full((2, 3, 5), np.nan, np.float32)
    a, b = _data((3, 4), 17, mx.float32), _data((4, 5), 18, mx.float32)
    f = lambda c: mx.addmm(c, to_lazyx(a), to_lazyx(b), beta=0.0)  # noqa: E731
    got = mx.vmap(f)(to_lazyx(c))
    assert_close(got, np.broadcast_to(a.astype(np.float64) @ b, (2, 3, 5)), mx.float32)


# -- softmax ----------------------------------------------------------------------
SOFTMAX_CASES = [((3, 4), -1), ((3, 4), 0), ((2, 3, 4), (0, 2)), ((5,), None),
                 ((2, 3, 4), None), ((2, 3), [-1, 0])]


@pytest.mark.parametrize("shape,axis", SOFTMAX_CASES, ids=[str(c) for c in SOFTMAX_CASES])
def test_softmax_vjp_jvp(shape, axis):
    x = _data(shape, 21)
    f = lambda x: mx.softmax(x, axis=axis)  # noqa: E731
    check_vjp_fd(f, x, msg=f"softmax {axis}")
    check_jvp_vjp(f, x, msg=f"softmax {axis}")


@pytest.mark.parametrize("shape,axis", SOFTMAX_CASES, ids=[str(c) for c in SOFTMAX_CASES])
def test_softmax_vmap(shape, axis):
    for in_axis in range(len(shape) + 1):
        x = _batched(_data(shape, 22, mx.float32), in_axis)
        check_vmap_loop(lambda x: mx.softmax(x, axis=axis), x, in_axes=in_axis,
                        msg=f"softmax {axis} in_axes={in_axis}")
    check_vmap_loop(lambda x: mx.softmax(x, axis=axis), _batched(_data(shape, 23), 0),
                    in_axes=-1, msg="negative in_axes")


def test_softmax_vmap_precise_half():
    x = random_array((3, 4, 5), mx.float16, rng(24))
    check_vmap_loop(lambda x: mx.softmax(x, axis=-1, precise=True), x, in_axes=1)


def test_softmax_grad_values():
    # d/dx sum(w * softmax(x)) = s * (w - <w, s>), written out in NumPy.
    x, w = _data((4, 6), 25), _data((4, 6), 26)
    got = mx.grad(lambda x: mx.sum(mx.softmax(x, axis=-1) * to_lazyx(w)))(to_lazyx(x))
    e = np.exp(x - x.max(-1, keepdims=True))
    s = e / e.sum(-1, keepdims=True)
    assert_close(got, s * (w - (w * s).sum(-1, keepdims=True)), mx.float64)


# -- compositions -----------------------------------------------------------------
def _loss(w, b, x, y):
    """Cross-entropy of a softmax classifier: ``-mean(log softmax(x @ w + b)[y])``."""
    p = mx.softmax(mx.addmm(b, x, w), axis=-1)
    return mx.negative(mx.sum(mx.log(p) * y)) / x.shape[0]


def _problem(seed=27, n=6, d=4, k=3):
    x = _data((n, d), seed)
    y = np.eye(k)[rng(seed).integers(0, k, n)]
    return _data((d, k), seed + 1), _data((k,), seed + 2), x, y


def test_grad_of_matmul_softmax_loss():
    w, b, x, y = _problem()
    check_vjp_fd(lambda w, b: _loss(w, b, to_lazyx(x), to_lazyx(y)), w, b, msg="loss")
    gw, gb = mx.grad(_loss, argnums=(0, 1))(*(to_lazyx(v) for v in (w, b, x, y)))
    z = x @ w + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    assert_close(gw, x.T @ (p - y) / len(x), mx.float64)
    assert_close(gb, (p - y).sum(0) / len(x), mx.float64)


@needs_shape_rules
def test_grad_of_grad_of_matmul_softmax_loss():
    # Hessian-vector products: finite differences of the gradient.
    w, b, x, y = _problem(seed=31)
    g = mx.grad(_loss)
    check_vjp_fd(lambda w: g(w, to_lazyx(b), to_lazyx(x), to_lazyx(y)), w, msg="grad of grad")
    check_jvp_vjp(lambda w: g(w, to_lazyx(b), to_lazyx(x), to_lazyx(y)), w, msg="jvp of grad")


@needs_shape_rules
def test_vmap_of_grad_of_matmul_softmax_loss():
    w, b, _, _ = _problem(seed=35)
    xs = _data((4, 5, 4), 36, mx.float32)
    ys = np.eye(3, dtype=np.float32)[rng(37).integers(0, 3, (4, 5))]
    g = mx.grad(_loss, argnums=(0, 1))
    check_vmap_loop(g, w.astype(np.float32), b.astype(np.float32), xs, ys,
                    in_axes=(None, None, 0, 0), msg="per-batch gradients")
    check_vmap_loop(g, np.stack([w, 2 * w]).astype(np.float32), b.astype(np.float32),
                    xs[0], ys[0], in_axes=(0, None, None, None), msg="per-weight gradients")


def test_weight_gradient_through_a_transpose_is_contiguous():
    # x @ W.T (a Linear layer): W's cotangent is g.T @ x computed in W's layout, so an
    # optimizer's update reads it in order (a strided view made Adam's adds ~10x slower).
    import numpy as np
    import lazyx.core as mx
    gen = np.random.default_rng(3)
    x = gen.standard_normal((5, 4)).astype(np.float32)
    w = gen.standard_normal((3, 4)).astype(np.float32)
    c = gen.standard_normal((5, 3)).astype(np.float32)
    for f in (lambda w: (mx.matmul(mx.array(x), w.T) * mx.array(c)).sum(),
              lambda w: (mx.addmm(mx.ones((3,)), mx.array(x), w.T) * mx.array(c)).sum()):
        g = mx.grad(f)(mx.array(w))
        mx.eval(g)
        np.testing.assert_allclose(np.array(g), c.T.astype(np.float64) @ x, rtol=1e-5, atol=1e-5)
        assert g._data.flags.c_contiguous
