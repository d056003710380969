"""vjp, jvp, grad and value_and_grad: the walkers, the API and its errors.

Most tests run on the toy primitives of ``toy_primitives`` (rules of their own),
so they test the walkers rather than any op pack's rules.
"""

import gc
import weakref
from collections import namedtuple

import numpy as np
import pytest

import lazyx.core as mx
import lazyx.scheduler as scheduler
from lazyx.array import lazy
from lazyx.errors import ArgumentError, LazyxError, ShapeError, TransformError
from lazyx.primitive import Primitive
from helpers import assert_close
from toy_primitives import (t_add, t_floor_int, t_mul, t_neg, t_norule, t_sin, t_sincos, t_sum,
                            t_to_float)

XS = np.array([0.5, 1.0, 2.0, -0.7], dtype=np.float32)


def x_():
    return mx.array(XS)


def sin_sum(x):
    return t_sum(t_sin(x))


# -- the walkers ---------------------------------------------------------------------
def test_grad_and_value():
    g = mx.grad(sin_sum)(x_())
    assert_close(g, np.cos(XS), mx.float32)
    v, g2 = mx.value_and_grad(sin_sum)(x_())
    assert_close(v, np.sin(XS).sum(), mx.float32)
    assert_close(g2, np.cos(XS), mx.float32)


def test_vjp_and_jvp_several_inputs_and_outputs():
    a, b = x_(), mx.array(XS[::-1].copy())
    outs, vjps = mx.vjp(lambda x, y: [t_mul(x, y), t_sin(x)], [a, b], [mx.ones((4,)), b])
    assert len(outs) == 2 and len(vjps) == 2
    assert_close(vjps[0], XS[::-1] + XS[::-1] * np.cos(XS), mx.float32)
    assert_close(vjps[1], XS, mx.float32)
    outs, jvps = mx.jvp(lambda x, y: [t_mul(x, y), t_sin(x)], [a, b], [mx.ones((4,)), b])
    assert_close(jvps[0], XS[::-1] + XS * XS[::-1], mx.float32)
    assert_close(jvps[1], np.cos(XS), mx.float32)
    assert_close(outs[1], np.sin(XS), mx.float32)


def test_same_array_twice_gets_two_gradients():
    x = x_()
    gx, gy = mx.grad(lambda a, b: t_sum(t_mul(a, b)), argnums=(0, 1))(x, mx.array(XS * 2))
    assert_close(gx, XS * 2, mx.float32)
    assert_close(gy, XS, mx.float32)
    ga, gb = mx.grad(lambda a, b: t_sum(t_mul(t_sin(a), b)), argnums=(0, 1))(x, x)
    assert_close(ga, np.cos(XS) * XS, mx.float32)
    assert_close(gb, np.sin(XS), mx.float32)


def test_fan_out_accumulates():
    # x reaches the output along three paths.
    g = mx.grad(lambda x: t_sum(t_add(t_mul(x, x), t_sin(x))))(x_())
    assert_close(g, 2 * XS + np.cos(XS), mx.float32)


def test_multi_output_nodes():
    # Only one output of the node is used: the other gets a zero cotangent.
    assert_close(mx.grad(lambda x: t_sum(t_sincos(x)[1]))(x_()), -np.sin(XS), mx.float32)

    def both(x):
        s, c = t_sincos(x)
        return t_sum(t_add(s, t_mul(c, c)))
    assert_close(mx.grad(both)(x_()), np.cos(XS) - 2 * np.cos(XS) * np.sin(XS), mx.float32)
    _, (t,) = mx.jvp(lambda x: t_sincos(x)[0], [x_()], [mx.ones((4,))])
    assert_close(t, np.cos(XS), mx.float32)


def test_outputs_independent_of_inputs_and_identity():
    c = mx.array(np.ones(4, np.float32))
    g = mx.grad(lambda x: t_sum(t_sin(c)))(x_())
    assert_close(g, np.zeros(4), mx.float32)
    outs, (v,) = mx.vjp(lambda x: x, [x_()], [mx.array(XS * 3)])
    assert_close(v, XS * 3, mx.float32)
    assert_close(outs[0], XS, mx.float32)
    _, (t,) = mx.jvp(lambda x: c, [x_()], [x_()])
    assert_close(t, np.zeros(4), mx.float32)


def test_lazy_primals_stay_usable():
    base = x_()
    x = t_sin(base)  # unevaluated
    g = mx.grad(sin_sum)(x)
    assert_close(g, np.cos(np.sin(XS)), mx.float32)
    assert_close(x, np.sin(XS), mx.float32)


def test_cotangents_take_input_dtypes_and_tangents_keep_their_own():
    x = x_()
    _, (v,) = mx.vjp(lambda a: t_sin(a), [x], [mx.ones((4,), dtype=mx.float16)])
    assert v.dtype == mx.float32
    # A tangent keeps the dtype its rules give (MLX): no cast to the primal's dtype.
    _, (t,) = mx.jvp(mx.sin, [x], [mx.ones((4,), dtype=mx.int32)])
    assert t.dtype == mx.float32
    assert_close(t, np.cos(XS), mx.float32)
    _, (t,) = mx.jvp(lambda a: a * 3, [mx.array([1, 2])], [mx.array([0.5, 1.5])])
    assert t.dtype == mx.float32 and t.tolist() == [1.5, 4.5]
    _, (t,) = mx.jvp(mx.sin, [mx.array([1.0, 2.0], mx.float16)], [mx.array([0.5, 1.5])])
    assert t.dtype == mx.float32
    np.testing.assert_allclose(np.array(t), np.cos([1.0, 2.0]) * [0.5, 1.5], rtol=2e-3)


def test_integer_inputs_are_differentiated_as_mlx():
    x = mx.array([1, 2, 3])
    g = mx.grad(lambda a: t_sum(t_mul(a, a)))(x)
    assert g.dtype == mx.int32 and g.tolist() == [2, 4, 6]


def test_integer_outputs_of_floats_carry_no_gradient():
    # TFloorInt has no rules at all: the walkers must not call them.
    def f(x):
        return t_sum(t_mul(x, t_to_float(t_floor_int(x))))
    x = mx.array(np.array([0.5, 1.5, 2.5, -1.5], np.float32))
    assert_close(mx.grad(f)(x), np.floor(np.array(x)), mx.float32)
    _, (t,) = mx.jvp(f, [x], [mx.ones((4,))])
    assert_close(t, np.floor(np.array(x)).sum(), mx.float32)
    _, (ti,) = mx.jvp(t_floor_int, [x], [mx.ones((4,))])
    assert ti.dtype == mx.int32 and ti.tolist() == [0, 0, 0, 0]


# -- composition ---------------------------------------------------------------------
def test_grad_of_grad():
    g2 = mx.grad(lambda x: t_sum(mx.grad(sin_sum)(x)))(x_())
    assert_close(g2, -np.sin(XS), mx.float32)
    # With fan-out in the inner gradient (accumulation is differentiated too).
    f = lambda x: t_sum(t_mul(t_sin(x), x))  # noqa: E731
    g2 = mx.grad(lambda x: t_sum(mx.grad(f)(x)))(x_())
    assert_close(g2, 2 * np.cos(XS) - XS * np.sin(XS), mx.float32)
    g3 = mx.grad(lambda x: t_sum(mx.grad(lambda y: t_sum(mx.grad(sin_sum)(y)))(x)))(x_())
    assert_close(g3, -np.cos(XS), mx.float32)


def test_jvp_of_grad_and_vjp_of_jvp():
    _, (h,) = mx.jvp(mx.grad(sin_sum), [x_()], [mx.ones((4,))])
    assert_close(h, -np.sin(XS), mx.float32)
    _, (g,) = mx.vjp(lambda x: mx.jvp(t_sin, [x], [mx.ones((4,))])[1][0], [x_()],
                     [mx.ones((4,))])
    assert_close(g, -np.sin(XS), mx.float32)


def test_grad_with_real_ops():
    x = x_()
    g = mx.grad(lambda a: mx.sum(mx.sin(a) * a))(x)
    assert_close(g, np.cos(XS) * XS + np.sin(XS), mx.float32)
    h = mx.grad(lambda a: mx.sum(mx.grad(lambda b: mx.sum(mx.sin(b) * b))(a)))(x)
    assert_close(h, 2 * np.cos(XS) - XS * np.sin(XS), mx.float32)


def test_stop_gradient():
    x = x_()
    g = mx.grad(lambda a: t_sum(t_mul(a, mx.stop_gradient(t_sin(a)))))(x)
    assert_close(g, np.sin(XS), mx.float32)
    _, (t,) = mx.jvp(lambda a: mx.stop_gradient(t_sin(a)), [x], [mx.ones((4,))])
    assert_close(t, np.zeros(4), mx.float32)


# -- trees, argnums, argnames, aux ------------------------------------------------------
def test_argnums():
    a, b, c = x_(), mx.array(XS * 2), mx.array(XS * 3)

    def f(x, y, z):
        return t_sum(t_mul(t_mul(x, y), z))
    assert_close(mx.grad(f, argnums=1)(a, b, c), XS * XS * 3, mx.float32)
    single = mx.grad(f, argnums=[2])(a, b, c)  # one entry: the gradient itself
    assert isinstance(single, mx.array)
    g = mx.grad(f, argnums=(2, 0))(a, b, c)
    assert isinstance(g, tuple) and len(g) == 2
    assert_close(g[0], XS * XS * 2, mx.float32)
    assert_close(g[1], XS * 6 * XS, mx.float32)


def test_argnames():
    a, z = x_(), mx.array(XS * 2)

    def f(x, *, z, scale=1.0):
        return t_sum(t_mul(t_sin(x), z))
    pos, named = mx.grad(f, argnames="z")(a, z=z)
    assert pos is None and list(named) == ["z"]
    assert_close(named["z"], np.sin(XS), mx.float32)
    pos, named = mx.grad(f, argnums=0, argnames=["z"])(a, z=z, scale=3.0)
    assert_close(pos, np.cos(XS) * XS * 2, mx.float32)
    assert_close(named["z"], np.sin(XS), mx.float32)
    v, (pos, named) = mx.value_and_grad(f, argnums=(0,), argnames=("z",))(a, z=z)
    assert_close(v, (np.sin(XS) * XS * 2).sum(), mx.float32)


def test_tree_arguments_and_passthrough():
    Pair = namedtuple("Pair", "w b")
    a, b = x_(), mx.array(XS * 2)

    def f(params, n, label, extra=None):
        assert n == 3 and label == "hi" and extra is None
        w = params["layers"][0].w
        return t_sum(t_add(t_mul(w, params["layers"][0].b), t_sin(params["scale"][1])))
    params = {"layers": [Pair(a, b)], "scale": (b, a)}
    g = mx.grad(f)(params, 3, "hi")
    assert isinstance(g, dict) and isinstance(g["layers"][0], Pair)
    assert isinstance(g["scale"], tuple) and isinstance(g["layers"], list)
    assert_close(g["layers"][0].w, XS * 2, mx.float32)
    assert_close(g["layers"][0].b, XS, mx.float32)
    assert_close(g["scale"][0], np.zeros(4), mx.float32)
    assert_close(g["scale"][1], np.cos(XS), mx.float32)


def test_value_and_grad_aux():
    def f(x, y):
        return t_sum(t_mul(x, y)), {"sin": t_sin(x)}, 7
    (loss, aux, seven), g = mx.value_and_grad(f)(x_(), mx.array(XS * 2))
    assert seven == 7
    assert_close(loss, (XS * XS * 2).sum(), mx.float32)
    assert_close(aux["sin"], np.sin(XS), mx.float32)
    assert_close(g, XS * 2, mx.float32)


# -- graph retention -----------------------------------------------------------------------
def test_evaluation_inside_the_function_keeps_the_graph(capsys):
    def f(x):
        y = t_sin(x)
        print(y)
        z = t_mul(y, x)
        mx.eval(z)
        s = t_sum(z)
        assert isinstance(s.item(), float)
        return s
    g = mx.grad(f)(x_())
    assert_close(g, np.cos(XS) * XS + np.sin(XS), mx.float32)
    assert "array" in capsys.readouterr().out
    # Under an enclosing transform too (grad of grad with item() inside).
    g2 = mx.grad(lambda x: t_sum(mx.grad(f)(x)))(x_())
    assert_close(g2, 2 * np.cos(XS) - XS * np.sin(XS), mx.float32)


def test_nothing_is_kept_alive_after_the_transform():
    refs = []

    def f(x):
        y = t_sin(x)
        refs.append(weakref.ref(y))
        s = t_sum(y)
        s.item()  # evaluated while the graph is retained
        return s
    v, g = mx.value_and_grad(f)(x_())
    # The retained loss was detached: it no longer holds the intermediate.
    assert v._prim is None and v._inputs is None
    gc.collect()
    assert refs[0]() is None
    mx.eval(g)
    assert scheduler.retain_graph.depth == 0


def test_values_evaluated_inside_but_unused_are_detached_too():
    outside = t_sin(x_())  # lazy, captured by the function
    refs = []

    def f(x):
        side = t_mul(outside, outside)
        refs.append(weakref.ref(side))
        mx.eval(side)  # evaluated while retained, not part of the result
        kept.append(side)
        return sin_sum(x)
    kept = []
    mx.grad(f)(x_())
    assert kept[0]._prim is None and outside._prim is None
    del kept[:]
    gc.collect()
    assert refs[0]() is None
    assert scheduler.retained == []


def test_intermediates_are_freed_once_the_gradient_is_evaluated():
    refs = []

    def f(x):
        y = t_mul(t_sin(x), x)
        refs.append(weakref.ref(y))
        return t_sum(y)
    v, g = mx.value_and_grad(f)(x_())
    mx.eval(v, g)
    gc.collect()
    assert refs[0]() is None


def test_retain_depth_is_restored_after_errors():
    with pytest.raises(ShapeError):
        mx.grad(lambda x: t_sin(x))(x_())
    with pytest.raises(RuntimeError):
        mx.grad(lambda x: (_ for _ in ()).throw(RuntimeError("boom")))(x_())
    assert scheduler.retain_graph.depth == 0


# -- errors --------------------------------------------------------------------------------
def test_non_scalar_output():
    with pytest.raises(ShapeError, match=r"scalar.*shape \(4,\)"):
        mx.grad(lambda x: t_sin(x))(x_())
    with pytest.raises(ShapeError, match="first element"):
        mx.value_and_grad(lambda x: (t_sin(x), 1))(x_())
    with pytest.raises(ArgumentError, match="returned a value of type float"):
        mx.grad(lambda x: 3.0)(x_())
    with pytest.raises(ArgumentError, match="returned a value of type tuple"):
        mx.grad(lambda x: (sin_sum(x), x))(x_())
    with pytest.raises(ArgumentError, match="returned a value of type list"):
        mx.value_and_grad(lambda x: [sin_sum(x)])(x_())


def test_bad_argnums_and_argnames():
    f = lambda x, y=None: sin_sum(x)  # noqa: E731
    with pytest.raises(ArgumentError, match="argument index 2 .* only 1 positional"):
        mx.grad(f, argnums=2)(x_())
    with pytest.raises(ArgumentError, match="negative argument index -1"):
        mx.grad(f, argnums=-1)
    with pytest.raises(ArgumentError, match="Duplicate argument index 0"):
        mx.grad(f, argnums=(0, 0))
    with pytest.raises(ArgumentError, match="no argument"):
        mx.grad(f, argnums=[])
    with pytest.raises(ArgumentError, match="argnums must be"):
        mx.grad(f, argnums="x")
    with pytest.raises(ArgumentError, match="keyword argument 'w'.*\\['y'\\]"):
        mx.grad(f, argnames="w")(x_(), y=x_())
    with pytest.raises(ArgumentError, match="argnames must be strings"):
        mx.grad(f, argnames=[1])


def test_non_array_leaf_in_a_differentiated_argument():
    def f(params, x):
        return sin_sum(x)
    with pytest.raises(ArgumentError, match=r"argument 0 \('params'\)\['b'\]\[1\].*float"):
        mx.grad(f)({"a": x_(), "b": [x_(), 2.0]}, x_())
    with pytest.raises(ArgumentError, match=r"keyword argument 'k'.*str"):
        mx.grad(lambda x, k=None: sin_sum(x), argnames="k")(x_(), k="s")
    with pytest.raises(ArgumentError, match="int"):
        mx.grad(sin_sum)(3)


def test_vjp_jvp_argument_errors():
    x = x_()
    with pytest.raises(ArgumentError, match="primals must be a list"):
        mx.vjp(t_sin, x, [x])
    with pytest.raises(ArgumentError, match=r"cotangents\[0\] must be an array"):
        mx.vjp(t_sin, [x], [1.0])
    with pytest.raises(ArgumentError, match="2 output.* 1 cotangent"):
        mx.vjp(lambda a: [a, a], [x], [x])
    with pytest.raises(ShapeError, match=r"Output 0 has shape \(4,\) .* \(3,\)"):
        mx.vjp(t_sin, [x], [mx.ones((3,))])
    with pytest.raises(ArgumentError, match="1 primal.* 2 tangent"):
        mx.jvp(t_sin, [x], [x, x])
    with pytest.raises(ShapeError, match=r"Primal 0 has shape \(4,\) .* \(2,\)"):
        mx.jvp(t_sin, [x], [mx.ones((2,))])
    with pytest.raises(ArgumentError, match="output 1 is a value of type int"):
        mx.vjp(lambda a: [a, 1], [x], [x, x])


def test_a_primitive_without_rules_is_named():
    with pytest.raises(TransformError, match=r"TNoRule\.vjp"):
        mx.grad(lambda x: t_sum(t_norule(x)))(x_())
    with pytest.raises(TransformError, match=r"TNoRule\.jvp"):
        mx.jvp(t_norule, [x_()], [x_()])
    assert scheduler.retain_graph.depth == 0


class _BadRule(Primitive):
    """A primitive whose rules return the wrong things."""

    __slots__ = ("mode",)

    def __init__(self, stream, mode):
        super().__init__(stream)
        self.mode = mode

    def output_shapes(self, inputs):
        return [inputs[0].shape]

    def eval_cpu(self, ins):
        return ins[0]

    def vjp(self, primals, cotangents, argnums, outputs):
        if self.mode == "count":
            return []
        if self.mode == "type":
            return [3.0]
        return [mx.ones((7,))]

    def jvp(self, primals, tangents, argnums):
        return [mx.ones((7,))] if self.mode == "shape" else [tangents[0], tangents[0]]


def _bad(x, mode):
    return lazy(x.shape, x.dtype, _BadRule(mx.default_stream(mx.default_device()), mode), (x,))


def test_rules_returning_the_wrong_things():
    with pytest.raises(TransformError, match="returned 0 cotangents"):
        mx.vjp(lambda x: _bad(x, "count"), [x_()], [x_()])
    with pytest.raises(TransformError, match="a value of type float"):
        mx.vjp(lambda x: _bad(x, "type"), [x_()], [x_()])
    with pytest.raises(TransformError, match=r"shape \(7,\) for input 0"):
        mx.vjp(lambda x: _bad(x, "shape"), [x_()], [x_()])
    with pytest.raises(TransformError, match=r"shape \(7,\) for output 0"):
        mx.jvp(lambda x: _bad(x, "shape"), [x_()], [x_()])
    with pytest.raises(TransformError, match="2 tangents .* 1 outputs"):
        mx.jvp(lambda x: _bad(x, "count"), [x_()], [x_()])


def test_errors_are_lazyx_errors():
    for exc in (ArgumentError, ShapeError, TransformError):
        assert issubclass(exc, LazyxError)
    assert issubclass(ArgumentError, ValueError) and issubclass(ShapeError, ValueError)


def test_neg_rule_composes():
    # A rule of a rule of a rule: d^3/dx^3 of -sin = cos.
    f = lambda x: t_sum(t_neg(t_sin(x)))  # noqa: E731
    g3 = mx.grad(lambda x: t_sum(mx.grad(lambda y: t_sum(mx.grad(f)(y)))(x)))(x_())
    assert_close(g3, np.cos(XS), mx.float32)
