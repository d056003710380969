"""vmap: the replay, in_axes/out_axes trees, nesting, composition and errors."""

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.array import lazy
from lazyx.errors import ArgumentError, AxisError, ShapeError, TransformError
from lazyx.primitive import Primitive
from lazyx.plugins.shapes import Transpose
from helpers import assert_close, check_vmap_loop, has_rules, random_array, rng
from toy_primitives import (t_add, t_mul, t_norule, t_sin, t_sincos, t_sum)

A = random_array((3, 4), mx.float32, rng(21))
B = random_array((4, 3), mx.float32, rng(22))
V = random_array((4,), mx.float32, rng(23))


def test_basic_axes():
    check_vmap_loop(t_sin, A)
    check_vmap_loop(t_sin, A, in_axes=1)
    check_vmap_loop(t_sin, A, in_axes=-1, out_axes=-1)
    check_vmap_loop(lambda x: t_sum(x), A, in_axes=1)
    check_vmap_loop(lambda x: t_sum(t_sin(x), (0,)), random_array((2, 3, 4), mx.float32),
                    in_axes=1, out_axes=1)


def test_several_arguments_and_unmapped_ones():
    check_vmap_loop(t_mul, A, B, in_axes=(0, 1))
    check_vmap_loop(t_mul, A, V, in_axes=(0, None))
    check_vmap_loop(lambda x, y: t_add(t_mul(x, y), t_sin(y)), V, A, in_axes=(None, 0))
    # A Python scalar with in_axes None passes through.
    out = mx.vmap(lambda x, n: t_sin(x) if n == 2 else None, in_axes=(0, None))(mx.array(A), 2)
    assert_close(out, np.sin(A), mx.float32)


def test_captured_arrays_and_unbatched_subgraphs():
    c = t_sin(mx.array(V))  # lazy, captured: stays unbatched
    check_vmap_loop(lambda x: t_mul(x, t_sin(c)), A)
    # An output that does not depend on the mapped input is broadcast.
    out = mx.vmap(lambda x: (t_sin(x), t_sin(c)), out_axes=(0, 1))(mx.array(A))
    assert out[1].shape == (4, 3)
    assert_close(out[1], np.repeat(np.sin(np.sin(V))[:, None], 3, axis=1), mx.float32)
    out = mx.vmap(lambda x: (t_sin(x), c), out_axes=(0, None))(mx.array(A))
    assert out[1] is c


def test_multi_output_nodes():
    s, c = mx.vmap(t_sincos, in_axes=1, out_axes=(0, 1))(mx.array(A))
    assert_close(s, np.sin(A).T, mx.float32)
    assert_close(c, np.cos(A), mx.float32)


def test_trees_of_arguments_and_outputs():
    params = {"w": mx.array(A), "b": mx.array(V)}
    out = mx.vmap(lambda p, x: {"y": t_mul(p["w"], p["b"]), "z": [x]},
                  in_axes=({"w": 0, "b": None}, 1))(params, mx.array(B))
    assert_close(out["y"], A * V, mx.float32)
    assert_close(out["z"][0], B.T, mx.float32)
    # A prefix: one axis for the whole dict.
    out = mx.vmap(lambda p: t_add(p["w"], p["b"]), in_axes=(0,))({"w": mx.array(A),
                                                                  "b": mx.array(A * 2)})
    assert_close(out, A * 3, mx.float32)
    # A list as the per-argument tuple, and out_axes per output.
    y, z = mx.vmap(lambda a, b: (a, t_sin(b)), in_axes=[1, 0], out_axes=[0, 1])(
        mx.array(A), mx.array(B))
    assert_close(y, A.T, mx.float32)
    assert_close(z, np.sin(B).T, mx.float32)


def test_nesting_and_mixed_axes():
    x = random_array((2, 3, 4), mx.float32, rng(24))
    out = mx.vmap(mx.vmap(t_sin))(mx.array(x))
    assert_close(out, np.sin(x), mx.float32)
    out = mx.vmap(mx.vmap(t_sin, in_axes=1, out_axes=1), in_axes=2, out_axes=2)(mx.array(x))
    assert_close(out, np.sin(x), mx.float32)
    x = random_array((2, 3, 5), mx.float32, rng(26))
    y = random_array((3, 5), mx.float32, rng(25))
    # Inner maps a over its axis 0 with b unmapped; outer maps a over 1 and b over 0.
    inner = mx.vmap(lambda a, b: t_mul(a, b), in_axes=(0, None))
    out = mx.vmap(inner, in_axes=(1, 0))(mx.array(x), mx.array(y))
    want = np.stack([x[:, i, :] * y[i] for i in range(3)])
    assert_close(out, want, mx.float32)


@pytest.mark.skipif(not has_rules(Transpose), reason="the shapes pack has no Transpose rules yet")
def test_nesting_with_moved_axes():
    x = random_array((2, 3, 4), mx.float32, rng(24))
    out = mx.vmap(mx.vmap(t_sin, in_axes=1, out_axes=0), in_axes=2, out_axes=1)(mx.array(x))
    assert_close(out, np.sin(x).transpose(1, 2, 0), mx.float32)
    g = mx.grad(lambda a: t_sum(mx.vmap(t_sin, in_axes=1)(a)))(mx.array(A))
    assert_close(g, np.cos(A), mx.float32)


def test_vmap_of_grad_and_grad_of_vmap():
    f = lambda x: t_sum(t_mul(t_sin(x), x))  # noqa: E731
    g = mx.vmap(mx.grad(f))(mx.array(A))
    assert_close(g, np.cos(A) * A + np.sin(A), mx.float32)
    g = mx.grad(lambda x: t_sum(mx.vmap(f, in_axes=1)(x)))(mx.array(A))
    assert_close(g, np.cos(A) * A + np.sin(A), mx.float32)
    # Mixed in_axes under grad.
    g = mx.grad(lambda x, v: t_sum(mx.vmap(t_mul, in_axes=(1, None), out_axes=1)(x, v)),
                argnums=(0, 1))(
        mx.array(B), mx.array(V))
    assert_close(g[0], np.repeat(V[:, None], 3, axis=1), mx.float32)
    assert_close(g[1], B.sum(axis=1), mx.float32)
    _, (t,) = mx.jvp(mx.vmap(t_sin), [mx.array(A)], [mx.array(B.T.copy())])
    assert_close(t, np.cos(A) * B.T, mx.float32)


def test_vmap_of_real_ops_and_of_grad_with_real_ops():
    check_vmap_loop(lambda x, y: mx.sum(mx.sin(x) * y, axis=0), A, B, in_axes=(1, 0))
    g = mx.vmap(mx.grad(lambda x: mx.sum(mx.exp(x) * x)))(mx.array(A))
    assert_close(g, np.exp(A) * A + np.exp(A), mx.float32)


# -- errors -------------------------------------------------------------------------
def test_inconsistent_sizes_name_the_arguments():
    with pytest.raises(ShapeError, match=r"argument 0 has size 3 along axis 0 but argument "
                                         r"1\['b'\] has size 4 along axis 0"):
        mx.vmap(lambda x, p: x)(mx.array(A), {"b": mx.array(B)})


def test_bad_in_axes():
    a = mx.array(A)
    with pytest.raises(AxisError, match="in_axes 2 is out of bounds for argument 0"):
        mx.vmap(t_sin, in_axes=2)(a)
    with pytest.raises(AxisError, match="in_axes -3"):
        mx.vmap(t_sin, in_axes=-3)(a)
    with pytest.raises(ArgumentError, match="in_axes has 1 entries .* 2 argument"):
        mx.vmap(t_mul, in_axes=(0,))(a, a)
    with pytest.raises(ArgumentError, match=r"argument 0.*keys \['a'\].*\['w'\]"):
        mx.vmap(lambda p: p["w"], in_axes=({"a": 0},))({"w": a})
    with pytest.raises(ArgumentError, match="argument 0 is a list but the value there is a dict"):
        mx.vmap(lambda p: p["w"], in_axes=([0],))({"w": a})
    with pytest.raises(ArgumentError, match="At least one of in_axes"):
        mx.vmap(t_sin, in_axes=None)(a)
    with pytest.raises(ArgumentError, match="argument 1 is a value of type float"):
        mx.vmap(lambda x, s: x)(a, 2.0)
    with pytest.raises(ArgumentError, match="must be an int or None"):
        mx.vmap(t_sin, in_axes="0")(a)
    with pytest.raises(ArgumentError, match="Keyword arguments"):
        mx.vmap(lambda x, y=None: x)(a, y=a)
    with pytest.raises(AxisError, match="shape \\(\\)"):
        mx.vmap(t_sin)(mx.array(1.0))


def test_bad_outputs_and_out_axes():
    a = mx.array(A)
    with pytest.raises(ArgumentError, match=r"output\[1\] is a value of type int"):
        mx.vmap(lambda x: (x, 3))(a)
    with pytest.raises(AxisError, match="out_axes 2 is out of bounds for output, which has 2"):
        mx.vmap(t_sin, out_axes=2)(a)
    with pytest.raises(ArgumentError, match="out_axes is None for output.*depends"):
        mx.vmap(t_sin, out_axes=None)(a)
    with pytest.raises(ArgumentError, match="out_axes at output has 3 entries"):
        mx.vmap(lambda x: (x, x), out_axes=(0, 0, 0))(a)


def test_evaluating_a_mapped_value_inside_is_an_error():
    with pytest.raises(TransformError, match=r"\[vmap\] Cannot evaluate"):
        mx.vmap(lambda x: t_sin(x).item())(mx.array(V))
    # Values not depending on the mapped argument can be evaluated.
    c = mx.array(V)
    out = mx.vmap(lambda x: t_mul(x, c) if t_sum(c).item() > -100 else x)(mx.array(A))
    assert_close(out, A * V, mx.float32)


def test_a_primitive_without_a_rule_is_named():
    with pytest.raises(TransformError, match=r"TNoRule\.vmap"):
        mx.vmap(t_norule)(mx.array(A))


class _WrongBatch(Primitive):
    __slots__ = ()

    def output_shapes(self, inputs):
        return [inputs[0].shape]

    def eval_cpu(self, ins):
        return ins[0]

    def vmap(self, inputs, axes):
        return [inputs[0]], [1 - axes[0]]


def test_a_rule_with_a_wrong_batch_axis_is_caught():
    def f(x):
        return lazy(x.shape, x.dtype, _WrongBatch(mx.default_stream(mx.default_device())), (x,))
    with pytest.raises(TransformError, match=r"_WrongBatch\.vmap\] output 0 has shape \(3, 4\)"):
        mx.vmap(f)(mx.array(A))
