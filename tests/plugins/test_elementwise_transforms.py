"""Transform rules of the element-wise pack: every primitive's vjp against central finite
differences in float64, jvp against vjp, vmap against a Python loop (batch on different
axes, unbatched operands, broadcasting ranks), MLX's subgradient conventions (ties of
maximum/minimum, abs and power at 0, clip), zero gradients (comparisons, rounding,
stop_gradient, where's condition), complex conventions, and compositions."""

import math

import numpy as np
import pytest

import lazyx.core as mx
from helpers import assert_close, check_jvp_vjp, check_vjp_fd, check_vmap_loop, rng, to_lazyx
from lazyx.plugins import elementwise as ew


def _f64(gen, shape, low, high, away=0.0):
    """Float64 data in [low, high), at least ``away`` from 0 (kinks sit at 0)."""
    x = gen.uniform(low, high, size=shape)
    if away:
        x = np.where(np.abs(x) < away, np.copysign(away, x) + x, x)
    return x


# -- the cases -----------------------------------------------------------------------
# name: (function, domain (low, high), distance from 0 that keeps away from a kink)
UNARY = {
    "abs": (mx.abs, (-2, 2), 0.2), "sign": (mx.sign, (-2, 2), 0.2),
    "negative": (mx.negative, (-2, 2), 0), "exp": (mx.exp, (-2, 2), 0),
    "expm1": (mx.expm1, (-2, 2), 0), "log": (mx.log, (0.5, 3), 0),
    "log1p": (mx.log1p, (-0.5, 2), 0), "log2": (mx.log2, (0.5, 3), 0),
    "log10": (mx.log10, (0.5, 3), 0), "sqrt": (mx.sqrt, (0.5, 3), 0),
    "rsqrt": (mx.rsqrt, (0.5, 3), 0), "square": (mx.square, (-2, 2), 0),
    "sin": (mx.sin, (-3, 3), 0), "cos": (mx.cos, (-3, 3), 0), "tan": (mx.tan, (-1.2, 1.2), 0),
    "arcsin": (mx.arcsin, (-0.9, 0.9), 0), "arccos": (mx.arccos, (-0.9, 0.9), 0),
    "arctan": (mx.arctan, (-3, 3), 0), "sinh": (mx.sinh, (-2, 2), 0),
    "cosh": (mx.cosh, (-2, 2), 0), "tanh": (mx.tanh, (-2, 2), 0),
    "arcsinh": (mx.arcsinh, (-3, 3), 0), "arccosh": (mx.arccosh, (1.2, 3), 0),
    "arctanh": (mx.arctanh, (-0.9, 0.9), 0), "floor": (mx.floor, (-3, 3), 0),
    "ceil": (mx.ceil, (-3, 3), 0), "trunc": (mx.trunc, (-3, 3), 0),
    "round": (mx.round, (-3, 3), 0), "round1": (lambda x: mx.round(x, 1), (-3, 3), 0),
    "erf": (mx.erf, (-2, 2), 0), "erfinv": (mx.erfinv, (-0.9, 0.9), 0),
    "sigmoid": (mx.sigmoid, (-4, 4), 0),
    "nan_to_num": (mx.nan_to_num, (-2, 2), 0),
    "reciprocal": (mx.reciprocal, (0.5, 3), 0), "degrees": (mx.degrees, (-2, 2), 0),
    "real": (mx.real, (-2, 2), 0), "conj": (mx.conj, (-2, 2), 0),
}

# name: (function, domain of a, domain of b, distance of b from 0)
BINARY = {
    "add": (mx.add, (-2, 2), (-2, 2), 0), "subtract": (mx.subtract, (-2, 2), (-2, 2), 0),
    "multiply": (mx.multiply, (-2, 2), (-2, 2), 0),
    "divide": (mx.divide, (-2, 2), (-2, 2), 0.5),
    "floor_divide": (mx.floor_divide, (-5, 5), (-2, 2), 0.5),
    "remainder": (mx.remainder, (-5, 5), (-2, 2), 0.5),
    "power": (mx.power, (0.5, 2), (-2, 2), 0), "maximum": (mx.maximum, (-2, 2), (-2, 2), 0),
    "minimum": (mx.minimum, (-2, 2), (-2, 2), 0),
    "logaddexp": (mx.logaddexp, (-3, 3), (-3, 3), 0),
    "arctan2": (mx.arctan2, (-2, 2), (-2, 2), 0.5),
    "divmod_remainder": (lambda a, b: mx.divmod(a, b)[1], (-5, 5), (-2, 2), 0.5),
    "divmod_both": (lambda a, b: mx.add(*mx.divmod(a, b)), (-5, 5), (-2, 2), 0.5),
    "where": (lambda a, b: mx.where(mx.greater(a, 0.3), a, b), (-2, 2), (-2, 2), 0),
    "clip": (lambda a, b: mx.clip(a, b, 1.0), (-2, 2), (-1.5, 0.5), 0),
    "compare_mix": (lambda a, b: mx.where(mx.less(a, b), 1.0, 0.0) + a, (-2, 2), (-2, 2), 0),
}

# Operand shapes: equal, one broadcast along leading/inner axes, a 0-d operand.
BINARY_SHAPES = [((2, 3), (2, 3)), ((2, 3), (3,)), ((3, 1), (1, 4)), ((), (2, 2))]


def _unary_inputs(name, gen, shape=(2, 3)):
    _, (lo, hi), away = UNARY[name]
    return [_f64(gen, shape, lo, hi, away)]


def _binary_inputs(name, gen, shapes):
    _, (alo, ahi), (blo, bhi), away = BINARY[name]
    return [_f64(gen, shapes[0], alo, ahi), _f64(gen, shapes[1], blo, bhi, away)]


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_vjp_jvp(name):
    gen = rng(1)
    fn = UNARY[name][0]
    x = _unary_inputs(name, gen)[0]
    check_vjp_fd(fn, x, msg=name)
    check_jvp_vjp(fn, x, msg=name)
    check_vjp_fd(fn, _unary_inputs(name, gen, ())[0], msg=name)  # 0-d


@pytest.mark.parametrize("shapes", BINARY_SHAPES, ids=str)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_vjp_jvp(name, shapes):
    gen = rng(2)
    fn = BINARY[name][0]
    xs = _binary_inputs(name, gen, shapes)
    check_vjp_fd(fn, *xs, msg=name)
    check_jvp_vjp(fn, *xs, msg=name)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_vmap(name):
    gen = rng(3)
    fn = UNARY[name][0]
    x = _unary_inputs(name, gen, (3, 4, 2))[0]
    for ax in (0, 1, -1):
        check_vmap_loop(fn, x, in_axes=ax, msg=name)
    check_vmap_loop(fn, x, in_axes=1, out_axes=2, msg=name)


# (shape of a, shape of b, in_axes): same axis, different axes, one unbatched
# (of higher or lower rank), broadcasting per-example shapes, negative axes.
VMAP_BINARY = [
    ((3, 4), (3, 4), (0, 0)), ((4, 3), (3, 4), (1, 0)), ((4, 3), (4,), (1, None)),
    ((4,), (3, 2, 4), (None, 0)), ((3, 2, 4), (4,), (1, None)), ((2, 4, 3), (4, 3), (0, None)),
    ((3, 1, 4), (5, 4), (-1, 1)), ((2, 3), (3, 5, 2), (1, 0)), ((3, 5), (3,), (0, 0)),
]


@pytest.mark.parametrize("case", VMAP_BINARY, ids=str)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_vmap(name, case):
    gen = rng(4)
    sa, sb, axes = case
    a, b = _binary_inputs(name, gen, (sa, sb))
    check_vmap_loop(BINARY[name][0], a, b, in_axes=axes, msg=name)


# -- conventions ---------------------------------------------------------------------
def _vjp(fn, *xs):
    xs = [mx.array(x) if not isinstance(x, mx.array) else x for x in xs]
    out = fn(*xs)
    return mx.vjp(fn, xs, [mx.ones_like(out)])[1]


def test_maximum_minimum_ties_go_to_the_second_argument():
    a, b = [1.0, 2.0, 3.0, 0.0, -1.0], [1.0, 3.0, 2.0, 0.0, -1.0]
    ga, gb = _vjp(mx.maximum, a, b)
    assert ga.tolist() == [0, 0, 1, 0, 0] and gb.tolist() == [1, 1, 0, 1, 1]
    ga, gb = _vjp(mx.minimum, a, b)
    assert ga.tolist() == [0, 1, 0, 0, 0] and gb.tolist() == [1, 0, 1, 1, 1]
    ga, gb = _vjp(mx.maximum, [math.nan, 1.0], [1.0, math.nan])
    assert ga.tolist() == [0, 0] and gb.tolist() == [0, 0]


@pytest.mark.parametrize("compiled", [False, True])
def test_maximum_minimum_partials_at_signed_zeros_infinities_and_nans(compiled):
    """a's partial is computed from the output (max(a, b) > b where a > b): the same
    masks as from a, eagerly and compiled (where the fused backward reads the output)."""
    a = np.array([-0.0, 0.0, math.inf, -math.inf, math.nan, 1.0, math.nan, -math.inf, 2.0])
    b = np.array([0.0, -0.0, math.inf, 1.0, 0.0, math.nan, math.nan, -math.inf, -math.inf])
    with np.errstate(invalid="ignore"):
        for fn, first, second in ((mx.maximum, a > b, a <= b), (mx.minimum, a < b, a >= b)):
            grads = mx.compile(lambda x, y, fn=fn: _vjp(fn, x, y)) if compiled else \
                (lambda x, y, fn=fn: _vjp(fn, x, y))
            ga, gb = grads(mx.array(a, mx.float32), mx.array(b, mx.float32))
            assert ga.tolist() == first.astype(float).tolist(), fn
            assert gb.tolist() == second.astype(float).tolist(), fn
    (g,) = _vjp(lambda x: mx.clip(x, 0.0, 2.0), [-1.0, 0.0, 1.0, 2.0, 3.0])
    assert g.tolist() == [0, 0, 1, 0, 0]


def test_abs_sign_and_rounding_subgradients():
    (g,) = _vjp(mx.abs, [1.0, -2.0, 0.0])
    assert g.tolist() == [1, -1, 0]
    for fn in (mx.sign, mx.floor, mx.ceil, mx.round, mx.trunc, mx.stop_gradient):
        (g,) = _vjp(fn, [1.5, -2.5, 0.0])
        assert g.tolist() == [0, 0, 0], fn.__name__
        _, (t,) = mx.jvp(fn, [mx.array([1.5, -0.5])], [mx.array([1.0, 1.0])])
        assert t.tolist() == [0, 0] and t.dtype == mx.float32


def test_power_at_zero_as_mlx():
    x = [0.0, 0.0, 0.0, 0.5, -0.5, math.inf, 2.0]
    y = [0.5, -0.5, 3.0, 2000.0, 2.0, 1.0, math.inf]
    gx, gy = _vjp(mx.power, x, y)
    np.testing.assert_array_equal(np.array(gx), [np.inf, -np.inf, 0, 0, -1, 1, np.inf])
    np.testing.assert_array_equal(np.array(gy), [0, -np.inf, 0, 0, np.nan, np.inf, np.inf])
    gx, gy = _vjp(mx.power, [0.0], [0.0])
    assert math.isnan(gx.item()) and gy.item() == -math.inf


def test_remainder_and_divmod_gradients():
    a, b = [5.0, -5.0, 5.5], [2.0, 2.0, -2.0]
    ga, gb = _vjp(mx.remainder, a, b)
    assert ga.tolist() == [1, 1, 1] and gb.tolist() == [-2, 3, 3]
    assert [g.tolist() for g in _vjp(mx.floor_divide, a, b)] == [[0, 0, 0]] * 2
    la, lb = mx.array(a), mx.array(b)
    _, (ga, gb) = mx.vjp(lambda x, y: mx.divmod(x, y), [la, lb], [mx.ones(3), mx.ones(3)])
    assert ga.tolist() == [1, 1, 1] and gb.tolist() == [-2, 3, 3]  # quotient: no gradient
    _, tans = mx.jvp(lambda x, y: mx.divmod(x, y), [la, lb], [mx.ones(3), mx.ones(3)])
    assert tans[0].tolist() == [0, 0, 0] and tans[1].tolist() == [-1, 4, 4]


def test_where_sends_no_gradient_to_the_condition():
    c = mx.array([True, False, True])
    x, y = mx.array([1.0, 2.0, 3.0]), mx.array(5.0)
    _, (gc, gx, gy) = mx.vjp(mx.where, [c, x, y], [mx.array([1.0, 2.0, 4.0])])
    assert gc.dtype == mx.bool_ and gc.tolist() == [False] * 3
    assert gx.tolist() == [1, 0, 4] and gy.shape == () and gy.item() == 2
    _, (t,) = mx.jvp(lambda x, y: mx.where(c, x, y), [x, y], [mx.ones(3), mx.array(10.0)])
    assert t.tolist() == [1, 10, 1]
    _, (t,) = mx.jvp(lambda x: mx.where(c, x, 0.0), [x], [mx.full(3, 2.0)])
    assert t.tolist() == [2, 0, 2]


def test_comparisons_logical_and_bitwise_carry_no_gradient():
    a, b = mx.array([1.0, 2.0]), mx.array([2.0, 1.0])
    for fn in (mx.equal, mx.not_equal, mx.less, mx.less_equal, mx.greater, mx.greater_equal,
               mx.logical_and, mx.logical_or, mx.logical_xor, mx.isclose):
        assert [g.tolist() for g in _vjp(fn, a, b)] == [[0, 0], [0, 0]], fn.__name__
    for fn in (mx.isnan, mx.isinf, mx.isfinite, mx.isposinf, mx.isneginf, mx.logical_not):
        assert _vjp(fn, a)[0].tolist() == [0, 0], fn.__name__
    # The rules themselves (called for integer inputs, as MLX differentiates them).
    i, j = mx.array([1, 6]), mx.array([3, 2])
    for fn in (mx.bitwise_and, mx.bitwise_or, mx.bitwise_xor, mx.left_shift, mx.right_shift,
               mx.equal, mx.floor_divide):
        r = fn(i, j)
        assert r._prim.vjp([i, j], [mx.ones_like(r)], [0, 1], [r]) == [None, None], fn.__name__
        assert r._prim.jvp([i, j], [i, j], [0, 1]) == [None], fn.__name__
    r = mx.bitwise_invert(i)
    assert r._prim.vjp([i], [r], [0], [r]) == [None]
    r = mx.allclose(a, b)
    assert r._prim.vjp([a, b], [r], [0, 1], [r]) == [None, None]


def test_integer_inputs_differentiate_as_mlx():
    _, (g,) = mx.vjp(lambda x: x * 2, [mx.array([1, 2])], [mx.array([3, 4])])
    assert g.dtype == mx.int32 and g.tolist() == [6, 8]
    _, (g,) = mx.vjp(mx.exp, [mx.array([1, 2])], [mx.array([3.0, 4.0])])
    assert g.dtype == mx.int32 and g.tolist() == [8, 29]  # through the cast to float32
    _, (g,) = mx.vjp(lambda x: mx.astype(x, mx.int32), [mx.array([1.5])], [mx.array([3])])
    assert g.dtype == mx.float32 and g.tolist() == [0]  # integer results carry no gradient
    _, (g,) = mx.vjp(mx.abs, [mx.array([-3, 0, 2])], [mx.array([1, 1, 1])])
    assert g.tolist() == [-1, 0, 1]


def test_astype_gradients_follow_the_input_dtype():
    x = to_lazyx(np.array([1.25, -2.5]))
    _, (g,) = mx.vjp(lambda x: mx.astype(x, mx.float16), [x], [mx.array([1.0, 2.0], mx.float16)])
    assert_close(g, [1.0, 2.0], mx.float64)
    _, (t,) = mx.jvp(lambda x: mx.astype(x, mx.float32), [x], [to_lazyx(np.array([3.0, 4.0]))])
    assert_close(t, [3.0, 4.0], mx.float32)


def test_complex_conventions_match_mlx():
    z, w, c = mx.array([1 + 2j]), mx.array([3 - 1j]), mx.array([1 + 1j])
    cases = [
        (mx.multiply, [z, w], c, [2 + 4j, 3 - 1j]),
        (mx.divide, [z, w], c, [0.4 + 0.2j, -0.18 + 0.26j]),
        (mx.exp, [z], c, [1.34052 - 3.60293j]),
        (mx.sin, [z], c, [-1.01917 + 5.08462j]),
        (mx.log, [z], c, [-0.2 + 0.6j]),
        (mx.square, [z], c, [6 - 2j]),
        (mx.sqrt, [z], c, [0.108643 + 0.460221j]),
        (mx.conj, [z], c, [1 - 1j]),
        (mx.abs, [z], mx.array([1.0]), [0.447214 + 0.894427j]),
        (mx.real, [z], mx.array([1.0]), [1 + 0j]),
        (mx.imag, [z], mx.array([1.0]), [1j]),
        (lambda a: mx.astype(a, mx.float32), [z], mx.array([2.0]), [2 + 0j]),
        (lambda a: mx.astype(a, mx.complex64), [mx.array([2.0])], c, [1.0]),
    ]
    for fn, prim, cot, want in cases:
        _, grads = mx.vjp(fn, prim, [cot])
        for g, e in zip(grads, want):
            assert_close(g, np.array([e]), prim[0].dtype, rtol=1e-4, atol=1e-5, msg=str(fn))
    jvps = [(mx.multiply, [z, w], [c, c], 3 + 5j), (mx.abs, [z], [c], 1.341641),
            (mx.real, [z], [c], 1.0), (mx.imag, [z], [c], 1.0), (mx.conj, [z], [c], 1 - 1j)]
    for fn, prim, tans, want in jvps:
        _, (t,) = mx.jvp(fn, prim, tans)
        np.testing.assert_allclose(np.array(t), [want], rtol=1e-5, err_msg=str(fn))


def test_complex_jvp_is_the_adjoint_of_vjp():
    # Re<u, J v> = Re<J^H u, v> for the complex rules (complex as R^2).
    gen = rng(5)

    def c(shape):
        return to_lazyx((gen.uniform(0.5, 2, shape) + 1j * gen.uniform(0.5, 2, shape))
                        .astype(np.complex64))

    k, k0 = c((3,)), c(())
    fns = [mx.exp, mx.log, mx.sin, mx.cos, mx.tanh, mx.sqrt, mx.square, mx.negative, mx.conj,
           mx.abs, mx.real, mx.imag, mx.reciprocal, mx.sinh, mx.cosh, mx.arctan,
           lambda a: a * k, lambda a: k / a, lambda a: mx.power(a, k), lambda a: mx.power(k, a),
           lambda a: a - k0, lambda a: mx.astype(a, mx.complex64)]
    for fn in fns:
        x, v = c((3,)), c((3,))
        out, (t,) = mx.jvp(fn, [x], [v])
        u = c(out[0].shape) if out[0].dtype == mx.complex64 else mx.real(c(out[0].shape))
        _, (g,) = mx.vjp(fn, [x], [u])
        left = np.real(np.vdot(np.array(u), np.array(t)))
        right = np.real(np.vdot(np.array(g), np.array(v)))
        assert abs(left - right) < 1e-4 * (1 + abs(left)), (fn, left, right)


def test_nan_to_num_passes_gradient_only_where_finite():
    (g,) = _vjp(mx.nan_to_num, [1.0, math.nan, math.inf, -math.inf, -2.0])
    assert g.tolist() == [1, 0, 0, 0, 1]


def test_stop_gradient_in_a_composition():
    x = mx.array([1.5, -2.0])
    _, (g,) = mx.vjp(lambda x: x * mx.stop_gradient(x), [x], [mx.ones(2)])
    assert g.tolist() == [1.5, -2.0]


# -- compositions --------------------------------------------------------------------
def test_grad_of_grad():
    x = to_lazyx(np.array(0.7))
    d2 = mx.grad(mx.grad(mx.sin))(x)
    assert_close(d2, -np.sin(0.7), mx.float64)
    d3 = mx.grad(mx.grad(mx.grad(mx.exp)))(x)
    assert_close(d3, np.exp(0.7), mx.float64)
    f = lambda x: mx.sin(x) * mx.exp(x)  # noqa: E731  (f'' = 2 cos(x) e^x)
    assert_close(mx.grad(mx.grad(f))(x), 2 * np.cos(0.7) * np.exp(0.7), mx.float64)
    g = lambda x, y: x * x * y  # noqa: E731  (d2/dxdy = 2x)
    y = to_lazyx(np.array(-1.3))
    assert_close(mx.grad(lambda y: mx.grad(g)(x, y))(y), 2 * 0.7, mx.float64)
    h = lambda x: mx.tanh(x) / (1 + mx.square(x))  # noqa: E731
    check_vjp_fd(mx.grad(h), np.array(0.3))
    check_jvp_vjp(mx.grad(h), np.array(-0.8))


def test_jvp_of_grad_and_vmap_compositions():
    xs = np.array([-1.0, 0.2, 0.9, 2.0])
    f = lambda x: mx.sigmoid(x) * mx.log1p(mx.square(x))  # noqa: E731
    gx = mx.vmap(mx.grad(f))(to_lazyx(xs))
    want = [mx.grad(f)(to_lazyx(np.array(v))).item() for v in xs]
    assert_close(gx, want, mx.float64)
    # vmap of vmap, mixed in_axes: x[i, j] * y[j] + z
    x = to_lazyx(rng(7).standard_normal((3, 4)))
    y = to_lazyx(rng(8).standard_normal((4,)))
    out = mx.vmap(mx.vmap(lambda a, b: mx.maximum(a * b, 0.1), in_axes=(0, 0)),
                  in_axes=(0, None))(x, y)
    assert_close(out, np.maximum(np.array(x) * np.array(y), 0.1), mx.float64)
    # jvp of grad: the second derivative times the tangent
    _, (t,) = mx.jvp(mx.grad(mx.cos), [to_lazyx(np.array(0.4))], [to_lazyx(np.array(2.0))])
    assert_close(t, -2 * np.cos(0.4), mx.float64)
    # grad of a vmapped function (vmap, then vjp)
    _, (g,) = mx.vjp(mx.vmap(lambda a: mx.exp(a) * a), [to_lazyx(xs)], [mx.ones(4, mx.float64)])
    assert_close(g, np.exp(xs) * (1 + xs), mx.float64)


def test_vmap_of_ops_with_parameters_and_reductions_to_scalars():
    gen = rng(9)
    a = gen.uniform(-2, 2, (4, 3))
    b = a + np.array([[0], [1e-9], [1], [0]])
    check_vmap_loop(lambda x, y: mx.isclose(x, y), a, b)
    check_vmap_loop(lambda x, y: mx.isclose(x, y, atol=0.5), a, b[:, 1], in_axes=(1, None))
    check_vmap_loop(lambda x, y: mx.allclose(x, y), a, b)
    check_vmap_loop(lambda x, y: mx.allclose(x, y), a, b[1], in_axes=(0, None))
    check_vmap_loop(lambda x, y: mx.allclose(x, y), a[:, :1], b, in_axes=(None, 1))
    check_vmap_loop(lambda x, y: mx.array_equal(x, y), a, b, in_axes=(1, 1))
    check_vmap_loop(lambda x, y: mx.array_equal(x, y), a, b.T, in_axes=(0, 1))
    n = np.array([[np.nan, 1.0], [np.nan, 2.0], [0.0, 1.0]])
    check_vmap_loop(lambda x, y: mx.array_equal(x, y, equal_nan=True), n, n[0], in_axes=(0, None))
    check_vmap_loop(lambda x: mx.astype(x, mx.int16), a, in_axes=1)
    check_vmap_loop(lambda x: mx.round(x, 1), a, in_axes=1)
    check_vmap_loop(lambda x: mx.nan_to_num(x, posinf=5.0), n, in_axes=1)
    i = np.array([[1, 2], [3, 4], [5, 6]], np.int32)
    check_vmap_loop(lambda x, y: mx.divmod(x, y), i, np.array([2, 3], np.int32), in_axes=(0, None))
    check_vmap_loop(lambda x, y: mx.divmod(x, y), i, i.T + 1, in_axes=(1, 0), out_axes=1)
    check_vmap_loop(lambda x, y: x << y, i, i.T, in_axes=(1, 0))
    c = np.array([[True, False], [False, False], [True, True]])
    check_vmap_loop(lambda c, x, y: mx.where(c, x, y), c, a[:3, :2], np.array(7.0),
                    in_axes=(0, 0, None))
    check_vmap_loop(lambda c, x, y: mx.where(c, x, y), c, a[:2, :3], a[0, :2], in_axes=(0, 1, None))
    check_vmap_loop(lambda c, x: mx.where(c, x, 0.0), c[0], a[:3, :2], in_axes=(None, 0))
    check_vmap_loop(lambda c, x: mx.where(c, x, 0.0), c, a[:2], in_axes=(1, None))
    z = np.array([[1 + 2j, 3j], [2 - 1j, 0.5 + 0j]], np.complex64)
    for fn in (mx.real, mx.imag, mx.conj, mx.abs):
        check_vmap_loop(fn, z, in_axes=1, msg=fn.__name__)


def test_rules_on_primitives_directly():
    # Unbroadcasting in a binary vjp, and a unary vmap keeps the batch axis.
    a, b = mx.array([[1.0, 2.0, 3.0]]), mx.array([[1.0], [2.0]])
    out = a * b
    g = mx.ones((2, 3))
    ga, gb = out._prim.vjp([a, b], [g], [0, 1], [out])
    assert ga.shape == (1, 3) and ga.tolist() == [[3, 3, 3]]
    assert gb.shape == (2, 1) and gb.tolist() == [[6], [6]]
    (t,) = out._prim.jvp([a, b], [mx.ones((1, 3))], [0])
    assert t.shape == (2, 3) and t.tolist() == [[1, 1, 1], [2, 2, 2]]
    e = mx.exp(a)
    outs, axes = e._prim.vmap([mx.zeros((3, 2))], [1])
    assert axes == [1] and outs[0].shape == (3, 2) and isinstance(e._prim, ew.Exp)
    assert out._prim.vjp([a, b], [g], [], [out]) == []


def test_every_elementwise_primitive_has_rules():
    from lazyx.primitive import Primitive
    for cls in ew.PRIMITIVES:
        for rule in ("vjp", "jvp", "vmap"):
            assert getattr(cls, rule) is not getattr(Primitive, rule), f"{cls.__name__}.{rule}"
        if issubclass(cls, ew.Unary) and "vjp" not in vars(cls) and "jvp" not in vars(cls) \
                and not issubclass(cls, ew.NoGradient):
            assert "derivative" in vars(cls), f"{cls.__name__} has no derivative"
        if issubclass(cls, ew.Binary) and not issubclass(cls, ew.NoGradient) \
                and "vjp" not in vars(cls):
            assert "partial" in vars(cls), f"{cls.__name__} has no partial derivatives"
