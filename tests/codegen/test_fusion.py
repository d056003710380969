"""The fusion pass: which nodes fuse, materialised outputs, bounds, cycles, constants,
plugin primitives, compile, and the transform rules of fused nodes."""

import math
import warnings

import numpy as np
import pytest

import lazyx.core as mx
from helpers import assert_close, check_jvp_vjp, check_vjp_fd, random_array, rng, to_lazyx
from lazyx.array import lazy
from lazyx.codegen import ir, jit
from lazyx.device import to_stream
from lazyx.primitive import Primitive
from lazyx.transforms import fusion
from lazyx.transforms.fusion import Compiled, fuse_arrays

pytestmark = pytest.mark.skipif(not jit.available(), reason="no C++ compiler")

f32 = mx.float32


def _nodes(outputs):
    """The primitives of the unevaluated graph of ``outputs``, each node once."""
    seen, out, stack = set(), [], list(outputs)
    while stack:
        a = stack.pop()
        if a._prim is None or id(a._prim) in seen:
            continue
        seen.add(id(a._prim))
        out.append(a._prim)
        stack.extend(a._inputs)
    return out


def _fused(outputs):
    return [p for p in _nodes(outputs) if isinstance(p, Compiled)]


def _data(*shapes, seed=0):
    gen = rng(seed)
    return [random_array(s, f32, gen) for s in shapes]


def _gelu(x):
    return mx.multiply(mx.multiply(x, 0.5), mx.add(1.0, mx.erf(mx.multiply(x, 1 / math.sqrt(2)))))


def test_a_chain_becomes_one_node_with_inlined_constants():
    (xd,) = _data((4, 5))
    x = to_lazyx(xd)
    (y,) = fuse_arrays([_gelu(x)], [x], force=True)
    (node,) = _fused([y])
    assert y._prim is node and y._inputs == (x,)
    assert node.program.size == 5 and node.program.inputs == (f32,)
    ref = 0.5 * xd * (1 + np.array([math.erf(v / math.sqrt(2)) for v in xd.ravel()]).reshape(xd.shape))
    assert_close(y, ref, f32)


def test_non_fusible_nodes_split_runs_and_values_used_outside_stay_outputs():
    xd, wd = _data((4, 6), (6, 3))
    x, w = to_lazyx(xd), to_lazyx(wd)
    h = mx.tanh(mx.multiply(x, 2.0))           # fusible
    s = mx.sum(h, axis=1, keepdims=True)       # a reduction reads h: h is materialised
    z = mx.matmul(mx.add(h, 1.0), w)           # a matmul splits the run
    out = mx.exp(mx.subtract(z, 0.5))          # a second run, of another shape
    ys = fuse_arrays([out, s], [x, w], force=True)
    fused = _fused(ys)
    assert len(fused) == 2
    first = next(p for p in fused if len(p.program.outputs) == 2)
    assert sorted(o.op for o in first.program.outputs) == ["add", "tanh"]
    h64 = np.tanh(xd.astype(np.float64) * 2)
    assert_close(ys[0], np.exp((h64 + 1) @ wd - 0.5), f32, rtol=1e-4)
    assert_close(ys[1], h64.sum(axis=1, keepdims=True), f32, rtol=1e-4)


def test_a_node_that_would_close_a_cycle_stays_out_of_the_group():
    # a = exp(x); b = sum over a (not fusible); c = a * b: a and c cannot be one node,
    # since c needs b, which needs a.
    (xd,) = _data((3, 4))
    x = to_lazyx(xd)
    a = mx.exp(mx.multiply(x, -0.1))
    b = mx.sum(a, axis=0)
    c = mx.sin(mx.multiply(a, b))
    (y,) = fuse_arrays([c], [x], force=True)
    fused = _fused([y])
    assert len(fused) == 2
    for p in fused:
        assert len(p.program.outputs) == 1
    a64 = np.exp(-0.1 * xd.astype(np.float64))
    assert_close(y, np.sin(a64 * a64.sum(axis=0)), f32)


def test_sibling_runs_that_read_one_input_share_a_kernel():
    (xd,) = _data((5, 5))
    x = to_lazyx(xd)
    ys = fuse_arrays([mx.exp(x), mx.sin(x), mx.square(mx.cos(x))], [x], force=True)
    (node,) = _fused(ys)
    assert len(node.program.outputs) == 3 and node.program.inputs == (f32,)
    x64 = xd.astype(np.float64)
    for y, ref in zip(ys, (np.exp(x64), np.sin(x64), np.cos(x64) ** 2)):
        assert_close(y, ref, f32)


def test_nodes_of_another_shape_start_another_group():
    xd, rd = _data((4, 5), (5,))
    x, r = to_lazyx(xd), to_lazyx(rd)
    row = mx.exp(mx.multiply(r, 2.0))          # shape (5,)
    y = mx.tanh(mx.add(x, row))                # shape (4, 5): reads row as an input
    (out,) = fuse_arrays([y], [x, r], force=True)
    fused = _fused([out])
    assert sorted(len(p.program.nodes) for p in fused) == [4, 4]
    assert_close(out, np.tanh(xd + np.exp(2.0 * rd.astype(np.float64))), f32)


def test_groups_respect_the_input_and_op_bounds():
    xs = _data(*[(3,)] * 30, seed=1)
    arrays = [to_lazyx(v) for v in xs]
    total = arrays[0]
    for a in arrays[1:]:
        total = mx.add(total, mx.exp(a))
    (y,) = fuse_arrays([total], arrays, force=True)
    fused = _fused([y])
    assert len(fused) >= 2
    assert all(len(p.program.inputs) <= fusion.MAX_INPUTS for p in fused)
    assert_close(y, xs[0] + sum(np.exp(v.astype(np.float64)) for v in xs[1:]), f32, rtol=1e-4)

    (xd,) = _data((7,))
    x = to_lazyx(xd)
    y = x
    for _ in range(300):
        y = mx.multiply(mx.add(y, 0.001), 0.999)
    (out,) = fuse_arrays([y], [x], force=True)
    fused = _fused([out])
    assert len(fused) >= 300 * 2 // fusion.MAX_OPS
    assert all(p.program.size <= fusion.MAX_OPS for p in fused)
    ref = xd.astype(np.float64)
    for _ in range(300):
        ref = (ref + 0.001) * 0.999
    assert_close(out, ref, f32, rtol=1e-4)


def test_a_lone_op_keeps_its_own_kernel():
    (xd,) = _data((3,))
    x = to_lazyx(xd)
    (y,) = fuse_arrays([mx.exp(x)], [x], force=True)
    assert not _fused([y])


def test_integer_and_bool_runs_fuse_exactly():
    gen = rng(2)
    ad = random_array((6, 4), mx.int16, gen)
    bd = random_array((4,), mx.int16, gen)
    a, b = to_lazyx(ad), to_lazyx(bd)
    q, r = mx.divmod(mx.multiply(a, 3), b)
    flag = mx.logical_and(mx.greater(q, 0), mx.not_equal(r, 0))
    ys = fuse_arrays([mx.where(flag, q, mx.left_shift(r, 2)), flag], [a, b], force=True)
    assert len(_fused(ys)) == 1
    with np.errstate(all="ignore"):
        qn = np.floor_divide(ad * 3, bd)
        rn = np.where(bd == 0, ad * 3, np.remainder(ad * 3, bd)).astype(np.int16)
        qn = np.where(bd == 0, 0, qn).astype(np.int16)
    fl = (qn > 0) & (rn != 0)
    assert_close(ys[0], np.where(fl, qn, rn << 2), mx.int16)
    assert_close(ys[1], fl, mx.bool_)


# -- a plugin's primitive ---------------------------------------------------------------
class Softplus(Primitive):
    """A test plugin's element-wise primitive: log(1 + exp(x)), fusible like a built-in."""

    __slots__ = ("beta",)

    def output_shapes(self, inputs):
        return [inputs[0].shape]

    def eval_cpu(self, inputs):
        x = inputs[0]
        return (np.log1p(np.exp(x * self.beta)) / self.beta).astype(x.dtype)

    def to_expression(self, args):
        x = args[0]
        if x.dtype.kind != "f":
            return None
        beta = ir.constant(self.beta, x.dtype)
        return ir.apply("div", ir.apply("log1p", ir.apply("exp", ir.apply("mul", x, beta))), beta)


def softplus(x, beta=1.0):
    return lazy(x.shape, x.dtype, Softplus(to_stream(None), beta), (x,))


def test_a_plugin_primitive_fuses_like_a_built_in():
    (xd,) = _data((8, 3))
    x = to_lazyx(xd)
    y = mx.multiply(softplus(mx.sin(x), 2.0), 3.0)
    unfused = np.array(y)
    y = mx.multiply(softplus(mx.sin(x), 2.0), 3.0)
    (out,) = fuse_arrays([y], [x], force=True)
    (node,) = _fused([out])
    assert {e.op for e in node.program.nodes} >= {"sin", "exp", "log1p", "div", "mul"}
    assert_close(out, unfused, f32)
    # Integers are not expressible: that node keeps its own kernel.
    i = to_lazyx(random_array((4,), mx.int32, rng(3)))
    (out,) = fuse_arrays([mx.add(softplus(mx.abs(i)), 1)], [i], force=True)
    assert not _fused([out])


class Broken(Primitive):
    __slots__ = ()

    def output_shapes(self, inputs):
        return [inputs[0].shape]

    def eval_cpu(self, inputs):
        return np.negative(inputs[0])

    def to_expression(self, args):
        return ir.apply("neg", args[0], args[0])  # wrong arity


def test_a_broken_declaration_runs_unfused_with_a_warning_naming_it():
    (xd,) = _data((3,))
    x = to_lazyx(xd)
    y = mx.exp(lazy(x.shape, x.dtype, Broken(to_stream(None)), (mx.sin(x),)))
    with pytest.warns(RuntimeWarning, match="Broken declares to_expression but cannot be fused"):
        (out,) = fuse_arrays([y], [x], force=True)
    assert_close(out, np.exp(-np.sin(xd.astype(np.float64))), f32)


# -- compile -------------------------------------------------------------------------------
def _run_tape_prims(fn):
    return [n.prim for e in fn.cache.entries.values() for n in e.run_tape.nodes]


def test_compile_fuses_and_agrees_with_the_uncompiled_function():
    def f(x, y):
        return mx.tanh(x * 0.7978845608 * (1 + 0.044715 * x * x)) * y + mx.exp(-y)

    xd, yd = _data((64, 33), (33,))
    x, y = to_lazyx(xd), to_lazyx(yd)
    cf = mx.compile(f)
    assert_close(cf(x, y), np.array(f(x, y)), f32)
    # One node per loop shape: exp(-y) runs over y's shape, the rest over x's.
    prims = _run_tape_prims(cf)
    assert len(prims) == 2 and all(isinstance(p, Compiled) for p in prims)
    # Later calls reuse the kernel, on new values and layouts.
    xt = mx.transpose(to_lazyx(np.ascontiguousarray(xd.T)))
    assert_close(cf(xt, y), np.array(f(x, y)), f32)


def test_compile_does_not_fuse_for_the_reference_backend():
    (xd,) = _data((5,))
    cf = mx.compile(lambda x: mx.exp(x) * 2 + 1)
    with mx.use_backend("cpu", "cpu-reference"):
        out = cf(to_lazyx(xd))
        assert_close(out, np.exp(xd.astype(np.float64)) * 2 + 1, f32)
    assert not any(isinstance(p, Compiled) for p in _run_tape_prims(cf))


def test_shapeless_compile_keeps_outputs_the_loop_shape():
    def f(x, y):
        a = mx.exp(x)                # an output that does not read y
        return a, mx.multiply(a, y)
    cf = mx.compile(f, shapeless=True)
    xd, yd = _data((4,), (3, 4))
    a, b = cf(to_lazyx(xd), to_lazyx(yd))
    assert_close(a, np.exp(xd.astype(np.float64)), f32)
    assert_close(b, np.exp(xd.astype(np.float64)) * yd, f32)
    xd, yd = _data((1,), (2, 6), seed=5)
    a, b = cf(to_lazyx(xd), to_lazyx(yd))
    assert a.shape == (1,) and b.shape == (2, 6)
    assert_close(b, np.exp(xd.astype(np.float64)) * yd, f32)


def test_grad_and_vmap_of_a_compiled_function():
    xd, yd = _data((3, 4), (4,))
    x, y = to_lazyx(xd), to_lazyx(yd)

    def f(x):
        return mx.sum(_gelu(x) * y)
    g = mx.grad(mx.compile(f))(x)
    assert_close(g, np.array(mx.grad(f)(x)), f32)
    v = mx.vmap(mx.compile(lambda r: mx.sin(r) * y))(x)
    assert_close(v, np.sin(xd.astype(np.float64)) * yd, f32)


# -- the rules of a fused node -------------------------------------------------------------
def _fused_fn(fn):
    """``fn`` with its element-wise runs fused (the graph holds Compiled nodes)."""
    def wrapped(*xs):
        outs = fn(*xs)
        single = not isinstance(outs, (list, tuple))
        fused = fuse_arrays([outs] if single else list(outs), force=True)
        assert _fused(fused)
        return fused[0] if single else fused
    return wrapped


def test_fused_nodes_differentiate_like_the_graph_they_replace():
    fn = _fused_fn(lambda x, y: [mx.sin(x) * mx.exp(y) + x, mx.tanh(x - y)])
    xd, yd = _data((2, 3), (2, 3), seed=6)
    check_vjp_fd(fn, xd, yd)
    check_jvp_vjp(fn, xd, yd)


def test_fused_nodes_vectorise_and_stay_fused():
    xd, yd = _data((3, 2, 4), (4,), seed=7)
    x, y = to_lazyx(xd), to_lazyx(yd)
    fn = _fused_fn(lambda a, b: mx.cos(a) * b + 1)
    out = mx.vmap(fn, in_axes=(1, None))(x, y)
    assert _fused([out])
    ref = np.cos(np.moveaxis(xd, 1, 0).astype(np.float64)) * yd + 1
    assert_close(out, ref, f32)


def test_without_a_native_backend_the_pass_leaves_the_graph_alone():
    (xd,) = _data((3,))
    x = to_lazyx(xd)
    with mx.use_backend("cpu", "cpu-reference"):
        (y,) = fuse_arrays([mx.exp(mx.sin(x))], [x])
    assert not _fused([y])


def test_the_pass_warns_once_when_there_is_no_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "nothing"))
    monkeypatch.setattr(jit, "_warned", False)
    (xd,) = _data((3,))
    x = to_lazyx(xd)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(3):
            (y,) = fuse_arrays([mx.exp(mx.sin(x))], [x])
            assert not _fused([y])
    assert [type(m.message) for m in w] == [jit.MissingCompilerWarning]
