"""The fused derivative products of the element-wise pack (``TanhGrad``, ``SigmoidGrad``,
``SinGrad``, ``CosGrad``, ``SquareGrad``): the rules of tanh, sigmoid, sin, cos, square
and ``x * x`` add one of them for real floating inputs, and it must give the same bits
as the unfused graph it replaces. Their own rules, vmap and C++ expressions are checked
by the registry-wide tests (test_every_primitive, codegen/test_every_fusible)."""

import numpy as np
import pytest

import lazyx.core as mx
from helpers import FLOAT_DTYPES, assert_close, random_array, rng, to_lazyx
from lazyx.errors import DtypeError
from lazyx.plugins import elementwise as ew

# name: (function, the primitive its vjp adds, the derivative in float64)
CASES = {
    "tanh": (mx.tanh, ew.TanhGrad, lambda x: 1 - np.tanh(x) ** 2),
    "sigmoid": (mx.sigmoid, ew.SigmoidGrad, lambda x: np.exp(-x) / (1 + np.exp(-x)) ** 2),
    "sin": (mx.sin, ew.SinGrad, np.cos),
    "cos": (mx.cos, ew.CosGrad, lambda x: -np.sin(x)),
    "square": (mx.square, ew.SquareGrad, lambda x: 2 * x),
    "x * x": (lambda x: x * x, ew.SquareGrad, lambda x: 2 * x),
}
_FUSING = (ew.Tanh, ew.Sigmoid, ew.Sin, ew.Cos, ew.Square)


def _classes(*outputs) -> set:
    seen, stack, out = set(), list(outputs), set()
    while stack:
        a = stack.pop()
        if id(a) in seen or a._prim is None:
            continue
        seen.add(id(a))
        out.add(type(a._prim))
        stack.extend(a._inputs)
    return out


def _unfused(monkeypatch):
    for cls in _FUSING:
        monkeypatch.setattr(cls, "fused_grad", None)
    monkeypatch.setattr(ew.Multiply, "vjp", ew.Binary.vjp)


def _products(fn, x, t):
    (_, (g,)), (_, (j,)) = mx.vjp(fn, [x], [t]), mx.jvp(fn, [x], [t])
    return g, j


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", sorted(CASES))
def test_same_bits_as_the_unfused_rule(name, dtype, monkeypatch):
    fn, cls, _ = CASES[name]
    gen = rng(3)
    x = mx.array(random_array((5, 7), dtype, gen), dtype=dtype)
    t = mx.array(random_array((5, 7), dtype, gen), dtype=dtype)
    g, j = _products(fn, x, t)
    assert cls in _classes(g)
    assert name == "x * x" or cls in _classes(j)  # x * x: the vjp only
    fused = [np.asarray(v) for v in (g, j)]
    _unfused(monkeypatch)
    g, j = _products(fn, x, t)
    assert cls not in _classes(g, j)
    for got, want in zip(fused, (g, j)):
        assert got.dtype == np.asarray(want).dtype
        np.testing.assert_array_equal(got, np.asarray(want))


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_values_and_layouts(name):
    fn, _, deriv = CASES[name]
    gen = rng(4)
    # Contiguous, transposed (non-contiguous) and 0-d inputs.
    base = gen.uniform(-2, 2, (4, 3))
    for data in (base, base.T, np.array(0.6)):
        x = to_lazyx(np.asarray(data, np.float32))
        if data.ndim == 2:
            x = mx.transpose(mx.transpose(x))
        g = mx.grad(lambda v: mx.sum(fn(v)))(x)
        assert g.shape == x.shape and g.dtype == mx.float32
        assert_close(g, deriv(np.asarray(data, np.float64)), mx.float32)


def test_kernels_broadcast_the_cotangent():
    gen = rng(5)
    g, z = gen.uniform(-2, 2, (2, 3)), gen.uniform(-0.9, 0.9, (3,))
    want = {"TanhGrad": g * (1 - z * z), "SigmoidGrad": g * z * (1 - z),
            "SinGrad": g * np.cos(z), "CosGrad": -g * np.sin(z), "SquareGrad": 2 * g * z}
    for cls, expected in want.items():
        op = getattr(ew, cls)._op
        out = op(to_lazyx(g), to_lazyx(z))
        assert out.shape == (2, 3)
        assert_close(out, expected, mx.float64)
        # The cotangent broadcast instead: a 0-d g against z.
        out = op(to_lazyx(np.array(1.5)), to_lazyx(z))
        assert_close(out, np.broadcast_to(getattr(_scalar_g, cls)(z), (3,)), mx.float64)


class _scalar_g:
    TanhGrad = staticmethod(lambda z: 1.5 * (1 - z * z))
    SigmoidGrad = staticmethod(lambda z: 1.5 * z * (1 - z))
    SinGrad = staticmethod(lambda z: 1.5 * np.cos(z))
    CosGrad = staticmethod(lambda z: -1.5 * np.sin(z))
    SquareGrad = staticmethod(lambda z: 3.0 * z)


def test_complex_and_integer_inputs_keep_the_generic_rule():
    z = mx.array(np.array([0.3 + 0.4j, -1.0 + 0.2j], np.complex64))
    (_, (g,)) = mx.vjp(mx.sin, [z], [mx.ones_like(z)])
    assert ew.SinGrad not in _classes(g)
    np.testing.assert_allclose(np.asarray(g), np.conj(np.cos(np.asarray(z))), rtol=1e-5)
    # x * x of integers: the generic rule, integer cotangents.
    i = mx.array(np.array([2, -3], np.int32))
    (_, (gi,)) = mx.vjp(lambda v: v * v, [i], [mx.ones_like(i)])
    assert ew.SquareGrad not in _classes(gi)
    assert gi.dtype == mx.int32 and gi.tolist() == [4, -6]


def test_the_ops_take_only_real_floating_operands():
    x = mx.array([1.0, 2.0])
    with pytest.raises(DtypeError, match="tanh_grad.*real floating.*complex64"):
        ew.TanhGrad._op(mx.array([1j, 2j]), mx.array([1j, 1j]))
    with pytest.raises(DtypeError, match="sin_grad.*int32"):
        ew.SinGrad._op(mx.array([1, 2]), mx.array([3, 4]))
    assert x.tolist() == [1.0, 2.0]


def test_higher_derivatives_through_the_products():
    x = to_lazyx(np.array(0.4))
    th = np.tanh(0.4)
    assert_close(mx.grad(mx.grad(mx.tanh))(x), -2 * th * (1 - th * th), mx.float64)
    s = 1 / (1 + np.exp(-0.4))
    d1 = s * (1 - s)
    assert_close(mx.grad(mx.grad(mx.sigmoid))(x), d1 * (1 - 2 * s), mx.float64)
    assert_close(mx.grad(mx.grad(mx.grad(mx.sin)))(x), -np.cos(0.4), mx.float64)
    assert_close(mx.grad(mx.grad(lambda v: v * v * v))(x), 6 * 0.4, mx.float64)
    # jvp of grad: the second derivative times the tangent.
    _, (t,) = mx.jvp(mx.grad(mx.cos), [x], [to_lazyx(np.array(2.0))])
    assert_close(t, -2 * np.cos(0.4), mx.float64)
