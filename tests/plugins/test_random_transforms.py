"""Transform rules of the random pack: random bits have no gradient and vmap over keys
(a batch of keys gives the draws of each key, as a loop would); the matrix square root
of multivariate_normal is differentiable (vjp against finite differences in float64)."""

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.array import lazy
from lazyx.device import to_stream
from lazyx.errors import TransformError
from lazyx.plugins import random as rd
from lazyx.plugins.indexing import Slice
from lazyx.plugins.shapes import ExpandDims, Reshape, Squeeze, Transpose, View
from helpers import (assert_close, check_jvp_vjp, check_vjp_fd, check_vmap_loop, has_rules,
                     random_array, rng, to_lazyx)

KEY = mx.random.key(7)


def _keys(n: int, seed: int = 7) -> np.ndarray:
    return np.array(mx.random.split(mx.random.key(seed), n))


def _needs(*classes):
    names = ", ".join(c.__name__ for c in classes)
    return pytest.mark.skipif(not has_rules(*classes),
                              reason=f"needs the transform rules of {names}")


# -- random bits: no gradient ---------------------------------------------------------
BITS = [lambda k: rd.bits((3, 5), 4, key=k), lambda k: rd.bits((7,), 1, key=k),
        lambda k: rd.bits((2,), 8, key=k), lambda k: mx.random.split(k, 3)]


@pytest.mark.parametrize("i", range(len(BITS)))
def test_random_bits_have_zero_cotangent_and_tangent(i):
    fn = BITS[i]
    out = fn(KEY)
    outs, (g,) = mx.vjp(fn, [KEY], [mx.ones_like(out)])
    assert g.dtype == mx.uint32 and g.shape == (2,)
    assert np.array(g).tolist() == [0, 0]
    np.testing.assert_array_equal(np.array(outs[0]), np.array(out))
    outs, (t,) = mx.jvp(fn, [KEY], [mx.ones_like(KEY)])
    assert t.dtype == out.dtype and t.shape == out.shape
    assert not np.array(t).any()


@pytest.mark.parametrize("i", range(len(BITS)))
def test_random_bits_vmap_over_keys(i):
    keys = _keys(4)
    check_vmap_loop(BITS[i], keys, in_axes=0)
    check_vmap_loop(BITS[i], np.ascontiguousarray(keys.T), in_axes=1, out_axes=-1)


def _bits_of_keys(keys, shape=(5,), width=4):
    """RandomBits of a stack of keys ``(..., 2)``, as ``split`` makes them."""
    return lazy(keys.shape[:-1] + shape, rd._UINT[width],
                rd.RandomBits(to_stream(None), shape, width), (keys,))


def test_random_bits_vmap_of_stacked_keys():
    # Per example a (3, 2) array of keys: the draws of each key, batched.
    keys = _keys(12).reshape(4, 3, 2)
    for ax in (0, 1, 2):
        check_vmap_loop(_bits_of_keys, np.ascontiguousarray(np.moveaxis(keys, 0, ax)),
                        in_axes=ax, msg=f"keys batched on axis {ax}")
    for j in range(3):
        np.testing.assert_array_equal(np.array(_bits_of_keys(to_lazyx(keys[1])))[j],
                                      np.array(rd.bits((5,), key=to_lazyx(keys[1, j]))))


@_needs(Slice, Squeeze, Reshape)
def test_vmap_of_a_split_key():
    f = lambda k: mx.random.uniform(shape=(2,), key=mx.random.split(k)[0])  # noqa: E731
    check_vmap_loop(f, _keys(4), msg="uniform of a split key")


def test_vmap_nested_over_keys():
    keys = np.array(mx.random.split(mx.random.key(2), 6)).reshape(2, 3, 2)
    inner = mx.vmap(lambda k: mx.random.uniform(shape=(4,), key=k))
    got = mx.vmap(inner)(to_lazyx(keys))
    want = np.stack([[np.array(mx.random.uniform(shape=(4,), key=to_lazyx(k))) for k in row]
                     for row in keys])
    assert_close(got, want, mx.float32, rtol=0, atol=0)


def test_vmap_key_and_parameter_batched_together():
    keys, lows = _keys(3), random_array((3,), mx.float32, rng(1), -3, 0)
    f = lambda k, lo: mx.random.uniform(lo, 1.0, (5,), key=k)  # noqa: E731
    check_vmap_loop(f, keys, lows)
    check_vmap_loop(f, keys[0], lows, in_axes=(None, 0), msg="one key, a batch of lows")


# -- distributions: vmap over keys --------------------------------------------------
DISTRIBUTIONS = {
    "uniform": lambda k: mx.random.uniform(-1.0, 2.0, (3, 2), key=k),
    "uniform-f16": lambda k: mx.random.uniform(shape=(4,), dtype=mx.float16, key=k),
    "normal": lambda k: mx.random.normal((5,), key=k),
    "normal-loc-scale": lambda k: mx.random.normal((2, 3), loc=1.0, scale=2.0, key=k),
    "randint": lambda k: mx.random.randint(-5, 9, (6,), key=k),
    "bernoulli": lambda k: mx.random.bernoulli(0.3, (6,), key=k),
    "truncated_normal": lambda k: mx.random.truncated_normal(-1.0, 0.5, (4,), key=k),
    "gumbel": lambda k: mx.random.gumbel((4,), key=k),
    "laplace": lambda k: mx.random.laplace((4,), loc=1.0, scale=0.5, key=k),
    "categorical": lambda k: mx.random.categorical(mx.array([[0.0, 1.0, 2.0]] * 2), key=k),
    "permutation": lambda k: mx.random.permutation(8, key=k),
    "multivariate_normal": lambda k: mx.random.multivariate_normal(
        mx.zeros((2,)), mx.array([[2.0, 0.5], [0.5, 1.0]]), (3,), key=k),
}
# Distributions whose graphs go through shape primitives besides the random ones.
SHAPE_NEEDS = {
    "multivariate_normal": (ExpandDims, Squeeze),
    "normal-complex": (View, Reshape),
    "categorical-samples": (ExpandDims,),
    "batched-covariance": (ExpandDims, Squeeze, Transpose),
}
DISTRIBUTIONS_SHAPED = {
    "normal-complex": lambda k: mx.random.normal((3,), dtype=mx.complex64, key=k),
    "categorical-samples": lambda k: mx.random.categorical(mx.array([0.0, 1.0, -1.0]),
                                                          num_samples=5, key=k),
    "batched-covariance": lambda k: mx.random.multivariate_normal(
        mx.zeros((2, 2)), mx.array([[[2.0, 0.5], [0.5, 1.0]], [[1.0, 0.0], [0.0, 3.0]]]),
        key=k),
}


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_distribution_vmap_over_keys(name):
    check_vmap_loop(DISTRIBUTIONS[name], _keys(4), msg=name)
    check_vmap_loop(DISTRIBUTIONS[name], np.ascontiguousarray(_keys(3, 9).T), in_axes=1,
                    msg=f"{name}, keys batched on axis 1")


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS_SHAPED))
def test_distribution_vmap_over_keys_shaped(name):
    if not has_rules(*SHAPE_NEEDS[name]):
        pytest.skip(f"needs the transform rules of the shapes pack for {name}")
    check_vmap_loop(DISTRIBUTIONS_SHAPED[name], _keys(3), msg=name)


def test_vmap_uses_the_global_key_once():
    # Without key=, the draw inside vmap takes one key: every example gets the same bits.
    mx.random.seed(3)
    x = to_lazyx(np.zeros((4, 3), np.float32))
    out = np.array(mx.vmap(lambda x: x + mx.random.uniform(shape=(3,)))(x))
    mx.random.seed(3)
    want = np.array(mx.random.uniform(shape=(3,)))
    np.testing.assert_array_equal(out, np.broadcast_to(want, (4, 3)))


# -- distributions: gradients with respect to their parameters ------------------------
def test_reparameterised_gradients():
    # Parameters enter the samples through ordinary ops, so their gradients are
    # the reparameterisation gradients (as in MLX); the key has none.
    lo, hi = random_array((5,), mx.float64, rng(2), -2, -1), np.array(3.0)
    check_vjp_fd(lambda lo, hi: mx.random.uniform(lo, hi, (5,), mx.float64, key=KEY), lo, hi)
    loc, scale = random_array((2, 3), mx.float64, rng(3)), np.array([1.0, 2.0, 0.5])
    check_vjp_fd(lambda m, s: mx.random.normal((2, 3), mx.float64, m, s, key=KEY), loc, scale)
    check_jvp_vjp(lambda m, s: mx.random.normal((2, 3), mx.float64, m, s, key=KEY), loc, scale)
    u = np.array(mx.random.uniform(shape=(5,), dtype=mx.float64, key=KEY))
    g_lo = mx.grad(lambda lo: mx.sum(mx.random.uniform(lo, hi, (5,), mx.float64, key=KEY)))
    assert_close(g_lo(to_lazyx(lo)), 1.0 - u, mx.float64)


def test_bernoulli_and_randint_have_no_gradient():
    p = to_lazyx(np.array([0.2, 0.7]))
    f = lambda p: mx.sum(mx.random.bernoulli(p, key=KEY) * p)  # noqa: E731
    # Only the explicit factor p contributes; the bool samples carry nothing.
    got = mx.grad(f)(p)
    assert_close(got, np.array(mx.random.bernoulli(p, key=KEY)).astype(np.float64), mx.float64)
    _, (g,) = mx.vjp(lambda k: mx.random.randint(0, 10, (3,), key=k), [KEY],
                     [mx.ones((3,), dtype=mx.int32)])
    assert g.dtype == mx.uint32 and not np.array(g).any()


# -- the matrix square root of multivariate_normal ------------------------------------
def _sqrtm(c):
    return lazy(c.shape, c.dtype, rd.MatrixSqrt(to_stream(None)), (c,))


def _sqrtm_derivative(c, t):
    return lazy(c.shape, c.dtype, rd.MatrixSqrtDerivative(to_stream(None)), (c, t))


def _spd(n, seed, batch=()):
    m = random_array(batch + (n, n), mx.float64, rng(seed), -1, 1)
    return m @ np.swapaxes(m, -1, -2) + n * np.eye(n)


MATRICES = {
    "spd": _spd(3, 1), "spd-batched": _spd(3, 2, (2,)),
    "general": random_array((3, 3), mx.float64, rng(3), -2, 2) + 4 * np.eye(3),
    "general-batched": random_array((2, 1, 2, 2), mx.float64, rng(4), -2, 2),
}


@pytest.mark.parametrize("name", sorted(MATRICES))
def test_matrix_sqrt_vjp_jvp(name):
    c = MATRICES[name]
    check_vjp_fd(_sqrtm, c, msg=name)
    check_jvp_vjp(_sqrtm, c, msg=name)


def test_matrix_sqrt_values_and_symmetric_derivative():
    # For symmetric c and t the derivative x solves r x + x r = t, r = sqrt(c).
    c, t = _spd(4, 5), _spd(4, 6)
    r = np.array(_sqrtm(to_lazyx(c)))
    np.testing.assert_allclose(r @ r, c, rtol=1e-10)
    x = np.array(_sqrtm_derivative(to_lazyx(c), to_lazyx(t)))
    np.testing.assert_allclose(r @ x + x @ r, t, rtol=1e-9, atol=1e-12)


def test_matrix_sqrt_derivative_rules_in_the_direction():
    c, t = _spd(3, 7), random_array((3, 3), mx.float64, rng(8))
    f = lambda t: _sqrtm_derivative(to_lazyx(c), t)  # noqa: E731
    check_vjp_fd(f, t)
    check_jvp_vjp(f, t)


def test_matrix_sqrt_second_derivative_is_refused():
    c, t = to_lazyx(_spd(3, 9)), to_lazyx(_spd(3, 10))
    with pytest.raises(TransformError, match="MatrixSqrtDerivative.*[Ss]econd derivatives"):
        mx.vjp(lambda c: _sqrtm_derivative(c, t), [c], [t])
    with pytest.raises(TransformError, match="MatrixSqrtDerivative"):
        mx.jvp(lambda c: _sqrtm_derivative(c, t), [c], [t])
    # The refused rule leaves the arrays usable.
    assert np.isfinite(np.array(_sqrtm_derivative(c, t))).all()


@pytest.mark.parametrize("in_axis", [0, 1, 2])
def test_matrix_sqrt_vmap(in_axis):
    c = np.stack([_spd(3, 11 + i) for i in range(4)], axis=in_axis).astype(np.float32)
    check_vmap_loop(_sqrtm, c, in_axes=in_axis)
    t = random_array((3, 3), mx.float32, rng(12))
    check_vmap_loop(_sqrtm_derivative, c, t, in_axes=(in_axis, None))
    ts = np.stack([t, 2 * t, -t], axis=in_axis)
    check_vmap_loop(_sqrtm_derivative, _spd(3, 13).astype(np.float32), ts, in_axes=(None, in_axis))


def test_multivariate_normal_gradients():
    # samples = mean + z @ sqrt(cov) with z the normal draws of the key: the gradient
    # with respect to cov is the derivative of the square root applied to z^T @ ones.
    mean = to_lazyx(np.array([0.5, -1.0], np.float32))
    cov = _spd(2, 14).astype(np.float32)
    f = lambda m, c: mx.sum(mx.random.multivariate_normal(m, c, (3,), key=KEY))  # noqa: E731
    g_mean, g_cov = mx.grad(f, argnums=(0, 1))(mean, to_lazyx(cov))
    assert_close(g_mean, np.full(2, 3.0), mx.float32)
    z = np.array(mx.random.normal((3, 2), key=KEY)).astype(np.float64)
    c64 = cov.astype(np.float64)

    def sample_sum(c):
        u, s, vt = np.linalg.svd(c)
        return np.sum(z @ ((u * np.sqrt(s)) @ vt))

    eps = 1e-6
    fd = np.zeros((2, 2))
    for idx in np.ndindex(2, 2):
        d = np.zeros((2, 2))
        d[idx] = eps
        fd[idx] = (sample_sum(c64 + d) - sample_sum(c64 - d)) / (2 * eps)
    assert_close(g_cov, fd, mx.float32, rtol=1e-4, atol=1e-5)
