"""The Metal backend's generated kernels (``lazyx.backends.metal.compiled``), run on Linux
with the Metal runtime emulated: every launch's MSL runs through lazyx's C++ shim
(``lazyx.backends.metal.emulate_on_cpu``), so the kernel choice, the shared planning
(``lazyx.backends.fused_launch``) and the argument packing are the ones a Mac runs.

``compile`` on Metal streams fuses into ``Compiled`` nodes whose results equal the
CPU backend's and NumPy's float64 references; single element-wise ops run one
generated kernel each; float64 (no double precision on Metal) raises naming the op.
Kernel builds are cached on disk (``lazyx.codegen.jit``): the programs here are few.
"""

import math

import numpy as np
import pytest

import lazyx.core as mx
from helpers import assert_close, emulated_metal_runner, random_array, rng
from lazyx.backends import metal
from lazyx.codegen import jit
from lazyx.errors import (BackendError, DtypeError, KernelCompileError, KernelNotFoundError,
                          ShapeError)

pytestmark = pytest.mark.skipif(not jit.available(), reason="no C++ compiler for the MSL shim")

f32 = mx.float32


@pytest.fixture
def on_metal():
    """The Metal backend, emulated on the CPU, as the active GPU backend; its shim runner."""
    yield from emulated_metal_runner()


def _stats():
    from lazyx.backends.metal import compiled
    return dict(compiled.stats)


def _kinds(fn):
    return [type(n.prim).__name__ for e in fn.cache.entries.values() for n in e.run_tape.nodes]


# -- compile on Metal streams ---------------------------------------------------------------
def _float_fn(x, y):
    # sin, mul, add (a Python scalar), exp, abs, negative, maximum, sub, div: one kernel, two outputs.
    a = mx.sin(x) * y + 1.5
    b = mx.maximum(a, mx.exp(-mx.abs(x))) - y / 2.0
    return b, a


def _float_ref(x, y):
    x, y = x.astype(np.float64), y.astype(np.float64)
    a = np.sin(x) * y + 1.5
    return np.maximum(a, np.exp(-np.abs(x))) - y / 2.0, a


def _int_fn(x, y):
    a = x * y + 3
    return mx.maximum(a, x) - mx.floor_divide(a, 7), mx.remainder(a, 5) == 1


def _int_ref(x, y):
    a = x.astype(np.int64) * y + 3
    return np.maximum(a, x) - np.floor_divide(a, 7), np.remainder(a, 5) == 1


def _bool_fn(x, y):
    return mx.logical_or(mx.logical_and(x, mx.logical_not(y)), x == y), mx.logical_xor(x, y)


def _bool_ref(x, y):
    return (x & ~y) | (x == y), x ^ y


CASES = {  # dtype -> (function, float64/int64 NumPy reference)
    "float32": (_float_fn, _float_ref), "float16": (_float_fn, _float_ref),
    "bfloat16": (_float_fn, _float_ref), "int32": (_int_fn, _int_ref),
    "bool": (_bool_fn, _bool_ref),
}


def _layouts(dtype, gen):
    """``(name, x, y, kernel launched)``: same-shape contiguous inputs; a transposed x
    (a strided view made on the CPU) with a broadcast y; a scalar y (float32 and int32:
    each scalar mask is a source of its own)."""
    xd = random_array((6, 5), dtype, gen, low=-3, high=3)
    yd = random_array((6, 5), dtype, gen, low=-3, high=3)
    if dtype.kind != "b":
        yd = np.where(yd == 0, 1, yd).astype(dtype.np)
    x, y = mx.array(xd), mx.array(yd)
    xt = mx.transpose(mx.array(xd.T.copy()), stream=mx.cpu)  # (6, 5), Fortran order
    yb = mx.array(yd[:1, :])                                 # (1, 5): broadcast
    mx.eval(xt)
    out = [("contiguous", x, y, xd, yd, "lx_contiguous"),
           ("strided", xt, yb, xd, yd[:1, :], "lx_strided")]
    if dtype.name in ("float32", "int32"):
        out.append(("scalar", x, mx.array(yd[0, 0]), xd, yd[0, 0], "lx_contiguous"))
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_compiled_functions_fuse_on_metal_and_match_the_cpu(on_metal, name):
    dtype = getattr(mx, name if name != "bool" else "bool_")
    fn, ref = CASES[name]
    compiled = mx.compile(fn)
    before = _stats()
    for layout, x, y, xd, yd, kernel in _layouts(dtype, rng(1)):
        on_metal.launches.clear()
        with mx.stream(mx.gpu):
            got = compiled(x, y)
            mx.eval(got)
        with mx.stream(mx.cpu):
            cpu = fn(x, y)
        # The first kernel over the whole loop reads the inputs: the layout's kernel. (An op
        # on the broadcast operand alone, ``y / 2``, has a loop of its own; a kernel that
        # reads another's outputs reads contiguous buffers.)
        whole = [k for k, n in on_metal.launches if n == 30]
        assert whole and whole[0] == kernel, (layout, on_metal.launches)
        for g, c, w in zip(got, cpu, ref(xd, yd)):
            assert g.dtype == c.dtype, layout
            assert_close(g, np.array(c), c.dtype, msg=f"{name} {layout}: Metal vs CPU backend")
            assert_close(g, w.astype(np.array(c).dtype) if c.dtype.kind in "biu" else w,
                         c.dtype, msg=f"{name} {layout}: Metal vs NumPy")
    assert "Compiled" in _kinds(compiled)
    assert _stats()["fallbacks"] == before["fallbacks"]  # every op ran a generated kernel


def test_zero_d_and_empty_inputs(on_metal):
    fn = mx.compile(lambda x, y: mx.sqrt(mx.abs(x)) + y * 2.0)
    with mx.stream(mx.gpu):
        z = fn(mx.array(-4.0), mx.array(0.25))
        e = fn(mx.array(np.zeros((0, 3), np.float32)), mx.array(np.ones(3, np.float32)))
        mx.eval(z, e)
    assert z.shape == () and z.item() == 2.5
    assert e.shape == (0, 3) and e.dtype == f32
    assert on_metal.launches and all(n > 0 for _, n in on_metal.launches)  # none for e's loop


# -- single ops ---------------------------------------------------------------------------------
def test_single_elementwise_ops_run_generated_kernels(on_metal):
    before = _stats()
    gen = rng(2)
    xd, yd = random_array((4, 6), f32, gen), random_array((6,), f32, gen)
    x, y, xh = mx.array(xd), mx.array(yd), mx.array(xd.astype(np.float16))
    mx.eval(x, y, xh)

    def launches(op, *args):
        on_metal.launches.clear()
        with mx.stream(mx.gpu):
            out = op(*args)
            mx.eval(out)
        return out, list(on_metal.launches)

    e, ran = launches(mx.exp, x)
    assert ran == [("lx_contiguous", 24)]
    assert_close(e, np.exp(xd.astype(np.float64)), f32)
    s, ran = launches(mx.subtract, x, y)  # y broadcasts: the strided kernel
    assert ran == [("lx_strided", 24)]
    assert_close(s, xd.astype(np.float64) - yd, f32)
    h, ran = launches(mx.tanh, xh)
    assert ran == [("lx_contiguous", 24)]
    assert_close(h, np.tanh(xd.astype(np.float16).astype(np.float64)), mx.float16)
    # parameters are part of a kernel's cache key
    r1, _ = launches(mx.round, x, 1)
    r0, _ = launches(mx.round, x, 0)
    assert_close(r1, np.round(xd, 1), f32)
    assert_close(r0, np.round(xd), f32)
    assert _stats()["fallbacks"] == before["fallbacks"]


def test_kernels_are_rendered_once_per_program_and_scalar_mask(on_metal):
    xd = random_array((3, 3), f32, rng(3))
    with mx.stream(mx.gpu):
        mx.eval(mx.exp(mx.array(xd)))
    rendered = _stats()["rendered"]
    with mx.stream(mx.gpu):
        again = mx.exp(mx.array(xd + 1))
        mx.eval(again)
    assert _stats()["rendered"] == rendered
    assert_close(again, np.exp(xd.astype(np.float64) + 1), f32)


# -- float64 and other refusals -------------------------------------------------------------------
def test_float64_single_ops_raise_naming_the_op_and_dtype(on_metal):
    x = mx.array(np.arange(4.0), dtype=mx.float64)
    with pytest.raises(DtypeError, match=r"Exp cannot run on the Metal GPU.*float64.*double"):
        mx.eval(mx.exp(x, stream=mx.gpu))
    # a cast to float64 inside a compiled function: the cast is named
    fn = mx.compile(lambda a: mx.sin(a.astype(mx.float64)) + 1.0)
    with pytest.raises(DtypeError, match=r"AsType cannot run on the Metal GPU.*float64"):
        with mx.stream(mx.gpu):
            mx.eval(fn(mx.array([1.0, 2.0])))
    # x is still valid, and float64 runs on the CPU stream
    assert_close(mx.exp(x, stream=mx.cpu), np.exp(np.arange(4.0)), mx.float64)


def test_float64_compiled_functions_raise_naming_an_op(on_metal):
    fn = mx.compile(lambda a, b: mx.exp(a) * b - 1.0)
    a = mx.array(np.linspace(0, 1, 5), dtype=mx.float64)
    with pytest.raises(DtypeError, match=r"(Exp|Multiply|Subtract) cannot run on the Metal GPU.*float64"):
        with mx.stream(mx.gpu):
            mx.eval(fn(a, a))
    with mx.stream(mx.cpu):
        assert_close(fn(a, a), np.exp(np.linspace(0, 1, 5)) * np.linspace(0, 1, 5) - 1.0,
                     mx.float64)


def test_kernels_that_do_not_compile_warn_once_and_run_unfused(on_metal, monkeypatch):
    from lazyx.backends.metal import compiled

    def broken(self, kernel, name, grid, args):
        raise KernelCompileError("lazyx fused Metal kernel x does not compile:\n  error")
    monkeypatch.setattr(compiled.ShimRunner, "launch", broken)
    monkeypatch.setattr(compiled, "_broken", set())
    # Every generated kernel fails, so the unfused single ops have no kernel either: their
    # error says why, after the one warning.
    fn = mx.compile(lambda x: mx.sin(x) * 2.0 + 1.0)
    with pytest.warns(RuntimeWarning, match="did not compile") as record:
        with pytest.raises(KernelNotFoundError, match=r"no kernel on backend .metal..*did not compile"):
            with mx.stream(mx.gpu):
                mx.eval(fn(mx.array([1.0, 2.0])))
    assert len(record) == 1


# -- bad input ---------------------------------------------------------------------------------
def test_shape_errors_are_raised_at_the_call(on_metal):
    with pytest.raises(ShapeError, match=r"\(2, 3\).*\(4,\)|\(4,\).*\(2, 3\)"):
        mx.add(mx.zeros((2, 3)), mx.zeros((4,)), stream=mx.gpu)


def test_without_emulation_metal_is_unavailable_here():
    import sys
    if sys.platform == "darwin":
        pytest.skip("Metal may be available on a Mac")
    with pytest.raises(BackendError, match="not available"):
        mx.use_backend("gpu", "metal")


def test_emulation_needs_a_compiler(monkeypatch):
    monkeypatch.setattr(jit, "available", lambda: False)
    with pytest.raises(BackendError, match="C\\+\\+ compiler"):
        metal.emulate_on_cpu(True)
    assert not metal.is_available() or __import__("sys").platform == "darwin"


def test_pack_binds_buffers_as_the_renderer_declares():
    from lazyx.backends.metal.compiled import kernel_for, pack
    from lazyx.codegen import ir, msl
    x, y = ir.input(0, f32), ir.input(1, mx.int32)
    p = ir.Program([f32, mx.int32], [ir.apply("add", x, ir.cast(y, f32)), ir.apply("lt", x, x)])
    k = kernel_for(p, (False, True))
    a, b = np.ones((2, 3), np.float32), np.array(7, np.int32)
    o0, o1 = np.empty((2, 3), np.float32), np.empty((2, 3), bool)
    launch = pack(k, "lx_strided", 6, (a, b, o0, o1, np.int64(6), np.int32(1),
                                       np.array([6, 1, 0], np.int64)))
    assert len(launch.buffers) == msl.buffer_count(p, strided=True) == 7
    assert launch.buffers[4].dtype == np.uint32 and launch.buffers[4].tolist() == [6]
    assert launch.buffers[5].dtype == np.int32 and launch.buffers[6].dtype == np.int64
    assert launch.written() == (o0, o1) and launch.grid == 6
    assert "constant uint& lx_n [[buffer(4)]]" in k.source
    assert math.prod(launch.output.shape) == 6
