"""``lazyx.core.custom_primitive``: a primitive from a NumPy kernel and the rules you have."""

import inspect

import numpy as np
import pytest

import lazyx.core as mx
from helpers import FLOAT_DTYPES, assert_close, random_array, rng, to_lazyx
from lazyx import registry
from lazyx.custom_primitive import CustomPrimitive, PrimitiveOp, register
from lazyx.errors import ArgumentError, KernelOutputError, ShapeError, TransformError
from lazyx.primitive import Primitive
from lazyx.testing import check_primitive, isolated_registry


@mx.custom_primitive(elementwise=True)
def axpby(x, y, *, alpha=1.0, beta=1.0):
    return alpha * x + beta * y


@axpby.vjp
def _axpby_vjp(primals, cotangent, output, *, alpha, beta):
    return cotangent * alpha, cotangent * beta


@axpby.jvp
def _axpby_jvp(primals, tangents, *, alpha, beta):
    return tangents[0] * alpha + tangents[1] * beta


@mx.custom_primitive(shape=lambda s: s[:-1])
def row_norm(x):
    return np.sqrt(np.sum(x * x, axis=-1))


@row_norm.vjp
def _row_norm_vjp(primals, cotangent, output):
    return mx.expand_dims(cotangent / output, -1) * primals[0]


@row_norm.jvp
def _row_norm_jvp(primals, tangents):
    return mx.sum(primals[0] * tangents[0], axis=-1) / row_norm(primals[0])


@row_norm.vmap
def _row_norm_vmap(inputs, axes):
    (x,), (ax,) = inputs, axes
    if ax == x.ndim - 1:
        x, ax = mx.moveaxis(x, ax, 0), 0
    return row_norm(x), ax


@mx.custom_primitive(shape=lambda s: [s, s])
def sincos(x):
    return np.sin(x), np.cos(x)


@sincos.vjp
def _sincos_vjp(primals, cotangents, outputs):
    (s, c), (gs, gc) = outputs, cotangents
    return gs * c - gc * s


@sincos.jvp
def _sincos_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return [t * mx.cos(x), -t * mx.sin(x)]


@sincos.vmap
def _sincos_vmap(inputs, axes):
    return sincos(inputs[0]), [axes[0], axes[0]]


def test_the_decorator_makes_an_op_and_a_primitive():
    assert isinstance(axpby, PrimitiveOp) and axpby.__name__ == "axpby"
    cls = axpby.primitive
    assert issubclass(cls, CustomPrimitive) and issubclass(cls, Primitive)
    assert cls.name == "Axpby" and cls._param_names == ("alpha", "beta")
    assert list(inspect.signature(axpby).parameters) == ["x", "y", "alpha", "beta", "stream"]
    # The rules given are methods of the class; the others are the base's.
    assert cls.vjp is not Primitive.vjp and cls.jvp is not Primitive.jvp
    assert cls.vmap is not Primitive.vmap  # element-wise: made for you
    assert row_norm.primitive.name == "RowNorm"
    z = axpby(mx.ones(3), 2.0, alpha=3.0)
    assert repr(z._prim) == "Axpby(alpha=3.0, beta=1.0)" and z._prim.params() == (3.0, 1.0)
    assert z._prim.is_equivalent(axpby(mx.ones(3), 2.0, alpha=3.0)._prim)
    assert not z._prim.is_equivalent(axpby(mx.ones(3), 2.0, alpha=2.0)._prim)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_values_against_numpy(dtype):
    gen = rng(1)
    x, y = random_array((4, 3), dtype, gen), random_array((3,), dtype, gen)
    got = axpby(to_lazyx(x), to_lazyx(y), alpha=2.0, beta=-0.5)
    ref = 2.0 * x.astype(np.float64) - 0.5 * y.astype(np.float64)
    assert_close(got, ref, dtype=dtype)


def test_broadcasting_zero_d_empty_and_non_contiguous_inputs():
    gen = rng(2)
    a = gen.standard_normal((3, 4)).astype(np.float32)
    t = to_lazyx(a).T                                     # a transposed view
    assert_close(axpby(t, 1.0, alpha=2.0), 2.0 * a.T + 1.0, dtype=mx.float32)
    s = to_lazyx(a)[:, ::2]                              # a strided slice
    assert_close(axpby(s, s, beta=3.0), 4.0 * a[:, ::2], dtype=mx.float32)
    assert_close(axpby(mx.array(2.0), mx.array(3.0)), np.array(5.0), dtype=mx.float32)
    e = axpby(mx.zeros((0, 3)), mx.ones(3))
    assert e.shape == (0, 3) and np.array(e).shape == (0, 3)
    assert_close(row_norm(to_lazyx(a).T), np.linalg.norm(a.T, axis=-1), dtype=mx.float32)
    assert row_norm(mx.zeros((2, 0))).tolist() == [0.0, 0.0]


def test_mlx_promotion_and_weak_scalars():
    assert axpby(mx.array([1, 2], dtype=mx.int32), 2.5).dtype == mx.float32
    assert axpby(mx.array([1, 2], dtype=mx.int8), mx.array([1], dtype=mx.int16)).dtype == mx.int16
    assert axpby(mx.array([1.0], dtype=mx.float16), 1.0, alpha=0.1).dtype == mx.float16
    assert axpby(mx.array([1], dtype=mx.uint8), 3).dtype == mx.uint8
    assert axpby(1.0, 2.0).dtype == mx.float32


def test_the_kernels_result_is_converted_to_the_promised_dtype():
    @mx.custom_primitive(elementwise=True)
    def as_float64(x):
        return x.astype(np.float64) * 2  # NumPy gives float64; the op promised x's dtype

    out = as_float64(mx.array([1.0, 2.0], dtype=mx.float16))
    assert out.dtype == mx.float16 and np.array(out).dtype == np.float16
    assert out.tolist() == [2.0, 4.0]


def test_more_than_two_inputs_and_no_promotion():
    @mx.custom_primitive(elementwise=True)
    def lerp(a, b, t):
        return a + t * (b - a)

    out = lerp(mx.zeros(3, dtype=mx.float16), mx.array([2.0, 4.0, 6.0]), 0.5)
    assert out.dtype == mx.float32 and out.tolist() == [1.0, 2.0, 3.0]

    @mx.custom_primitive(promote=False, shape=lambda s, i: i, dtype=lambda d, di: d)
    def take1(x, idx):
        return np.take(x, idx)

    got = take1(mx.array([10.0, 20.0, 30.0]), mx.array([2, 0], dtype=mx.int32))
    assert got.dtype == mx.float32 and got.tolist() == [30.0, 10.0]
    assert got.shape == (2,)


def test_transforms():
    gen = rng(3)
    x, y = to_lazyx(gen.standard_normal((2, 3))), to_lazyx(gen.standard_normal(3))
    dx, dy = mx.grad(lambda x, y: mx.sum(axpby(x, y, alpha=2.0, beta=3.0)), argnums=(0, 1))(x, y)
    assert dx.shape == (2, 3) and np.all(np.array(dx) == 2.0)
    assert dy.shape == (3,) and np.all(np.array(dy) == 6.0)  # summed back over the rows
    _, (t,) = mx.jvp(lambda y: axpby(x, y, beta=3.0), [y], [mx.ones_like(y)])
    assert t.shape == (2, 3) and np.all(np.array(t) == 3.0)  # broadcast to the output
    # Second order: the rules are written with lazyx ops.
    g2 = mx.grad(mx.grad(lambda x: mx.sum(axpby(x * x, x, alpha=2.0))))(mx.array(1.5))
    assert g2.item() == pytest.approx(4.0)


@pytest.mark.parametrize("op, inputs", [
    (lambda x, y: axpby(x, y, alpha=2.0, beta=-0.5), [(2, 3), (3,)]),
    (lambda x, y: axpby(x, y, alpha=2.0, beta=-0.5), [(), (4,)]),
    (row_norm, [(3, 4)]),
    (sincos, [(2, 3)]),
], ids=["axpby", "axpby-0d", "row_norm", "sincos"])
def test_check_primitive_passes(op, inputs):
    gen = rng(4)
    report = check_primitive(op, *[gen.uniform(0.5, 1.5, s) for s in inputs])
    for name in ("graph", "shape rule", "kernel on cpu", "vjp", "jvp", "vmap"):
        assert name in report.passed, report


def test_bad_calls_raise_at_the_call_and_leave_other_arrays_alone():
    x = mx.ones((2, 3))
    y = x + 1
    with pytest.raises(ShapeError, match=r"\(2, 3\) and \(4,\)"):
        axpby(x, mx.ones(4))
    with pytest.raises(ArgumentError, match=r"axpby takes 2 array input\(s\) \(x, y\), got 1"):
        axpby(x)
    with pytest.raises(ArgumentError, match=r"unexpected keyword.*\['gamma'\].*\['alpha', 'beta'\]"):
        axpby(x, x, gamma=2.0)

    @mx.custom_primitive(elementwise=True)
    def scaled(x, *, factor):
        return x * factor

    with pytest.raises(ArgumentError, match=r"scaled is missing the parameter\(s\) \['factor'\]"):
        scaled(x)
    assert scaled(x, factor=2.0).tolist() == [[2.0] * 3] * 2
    assert y.tolist() == [[2.0] * 3] * 2


def test_bad_definitions():
    with pytest.raises(ArgumentError, match="reserved"):
        mx.custom_primitive(lambda x, *, stream: x)
    with pytest.raises(ArgumentError, match="reserved"):
        mx.custom_primitive(lambda x, *, name: x)
    with pytest.raises(ArgumentError, match=r"\*xs"):
        mx.custom_primitive(lambda *xs: xs[0])
    with pytest.raises(ArgumentError, match="decorates a function"):
        axpby.vjp(3)

    @mx.custom_primitive
    def no_shape(x):
        return x

    with pytest.raises(TransformError, match=r"NoShape.output_shapes.*shape=.*@no_shape.shape"):
        no_shape(mx.ones(2))

    @mx.custom_primitive(shape=lambda s: 5)
    def bad_shape(x):
        return x

    with pytest.raises(ShapeError, match="shape rule of BadShape must return a tuple"):
        bad_shape(mx.ones(2))


def test_a_kernel_of_the_wrong_shape_names_the_primitive_and_its_plugin():
    @mx.custom_primitive(elementwise=True)
    def too_long(x):
        return np.concatenate([x, x])

    with isolated_registry():
        register(too_long, plugin="shapes-wrong")
        good = mx.ones(2) + 1
        bad = too_long(mx.ones(2))
        with pytest.raises(KernelOutputError, match=r"TooLong .*'shapes-wrong'.*\(4,\).*\(2,\)"):
            mx.eval(bad, good)
        assert good.tolist() == [2.0, 2.0]


def test_a_missing_rule_names_the_primitive_its_plugin_and_the_decorator():
    @mx.custom_primitive(elementwise=True)
    def clipped(x, *, limit=1.0):
        return np.clip(x, -limit, limit)

    x = mx.array([0.5, 2.0])
    assert clipped(x).tolist() == [0.5, 1.0]
    with pytest.raises(TransformError, match=r"\[Clipped.vjp\] .*@clipped.vjp: rule\(primals, "
                                             r"cotangent, output"):
        mx.grad(lambda x: mx.sum(clipped(x)))(x)
    with isolated_registry():
        register(clipped, plugin="clipping")
        with pytest.raises(TransformError, match=r"\[Clipped.jvp\] Not implemented for Clipped "
                                                 r"\(from plugin 'clipping' of distribution "
                                                 r"'\(not installed\)'\): add it with @clipped.jvp"):
            mx.jvp(clipped, [x], [x])
    # vmap of an element-wise op needs no rule.
    assert mx.vmap(clipped)(mx.array([[3.0, -3.0]])).tolist() == [[1.0, -1.0]]


class _Plain(Primitive):
    """A hand-written primitive without transform rules."""

    __slots__ = ()

    def output_shapes(self, inputs):
        return [inputs[0].shape]

    def eval_cpu(self, inputs):
        return inputs[0] * 2


def test_a_plain_primitive_names_its_plugin_and_the_method_to_write(monkeypatch):
    from lazyx.array import lazy
    from lazyx.device import to_stream

    def op(x):
        return lazy(x.shape, x.dtype, _Plain(to_stream(None)), (x,))

    x = mx.ones(2)
    with pytest.raises(TransformError, match=r"\[_Plain.vmap\] Not implemented for _Plain: "
                                             r"implement vmap\(self, inputs, axes\)"):
        mx.vmap(op)(mx.ones((3, 2)))
    monkeypatch.setitem(registry.primitives, _Plain,
                        registry.PluginInfo("plain", "lazyx-plain", "2.0"))
    with pytest.raises(TransformError, match=r"\[_Plain.vjp\] Not implemented for _Plain \(from "
                                             r"plugin 'plain' of distribution 'lazyx-plain' 2.0\):"
                                             r" implement vjp\(self, primals, cotangents"):
        mx.grad(lambda x: mx.sum(op(x)))(x)


def test_register_installs_the_ops_and_isolation_removes_them():
    with isolated_registry():
        info = register(axpby, row_norm, plugin="mine", install="mine")
        assert registry.plugins["mine"] is info and info.distribution == "(not installed)"
        assert registry.primitives[axpby.primitive] is info
        assert mx.mine.axpby(mx.ones(2), 1.0).tolist() == [2.0, 2.0]
        assert mx.mine.row_norm(mx.array([[3.0, 4.0]])).tolist() == [5.0]
        assert mx.kernel_provider("cpu", axpby.primitive) == (
            "Axpby.eval_cpu (plugin 'mine' of distribution '(not installed)')")
        with pytest.raises(Exception, match="already registered"):
            register(axpby, plugin="mine")
    assert "mine" not in registry.plugins and axpby.primitive not in registry.primitives
    with pytest.raises(AttributeError):
        mx.mine
    with isolated_registry():
        register(sincos, install=True)
        assert registry.plugins[__name__].primitives == [sincos.primitive]
        assert mx.sincos is sincos
    with pytest.raises(AttributeError):
        mx.sincos
    with pytest.raises(ArgumentError):
        register(lambda x: x)


class _Scaled(Primitive):
    __slots__ = ("scale", "shift")
    scale: float
    shift: float


class _ScaledTwice(_Scaled):
    __slots__ = ("times",)
    times: int


def test_parameters_by_position_by_name_or_some_of_them():
    s = mx.default_stream(mx.cpu)
    p = _Scaled(s, 2.0, 3.0)                       # all by position: the generated fast path
    assert (p.stream, p.scale, p.shift) == (s, 2.0, 3.0)
    p = _Scaled(s, 2.0, shift=4.0)                 # the rest by name
    assert (p.scale, p.shift) == (2.0, 4.0)
    p = _Scaled(s, 5.0)                            # fewer: the others stay unset
    assert p.scale == 5.0 and not hasattr(p, "shift")
    q = _ScaledTwice(s, 1.0, 2.0, 3)               # a subclass's init knows its own slots
    assert (q.scale, q.shift, q.times) == (1.0, 2.0, 3)
    assert _ScaledTwice(s, times=7).times == 7
    with pytest.raises(TypeError, match="takes 2 parameters"):
        _Scaled(s, 1.0, 2.0, 3.0)
    with pytest.raises(TypeError, match="unexpected or repeated parameter 'scale'"):
        _Scaled(s, 1.0, scale=2.0)
    with pytest.raises(TypeError, match="unexpected or repeated parameter 'bogus'"):
        _Scaled(s, bogus=1)


def test_a_primitive_with_its_own_init_keeps_it():
    class Own(Primitive):
        __slots__ = ("k",)
        k: int

        def __init__(self, stream, k=3):
            super().__init__(stream)
            self.k = k * 2

    assert Own(mx.default_stream(mx.cpu)).k == 6
    assert Own(mx.default_stream(mx.cpu), 4).k == 8
