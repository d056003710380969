"""The MSL renderer (``lazyx.codegen.msl``), checked on the CPU.

Every generated source is compiled as C++ through lazyx's MSL shim and run over its
grid, one thread at a time (``lazyx.backends.metal.msl_cpu``), launched by the Metal
backend's own launch logic (``lazyx.backends.metal.compiled.run_program``: the planning
shared with CUDA, the buffers packed as Metal binds them). The walk mirrors ``test_cuda_render.py``: every fusible primitive
of the registry, for every dtype its op takes except float64 (Metal has none; complex64's
own accuracy and special values: ``test_msl_complex.py``), in contiguous, strided (a transposed and a sliced input;
one dtype of each width and signedness) and scalar-input layouts, fused into kernels of at most Metal's 31 buffers and
compared with the unfused graph on the CPU backend.
"""

import concurrent.futures
import math
import os

import lazyx.core as mx
import numpy as np
import pytest
from fusible import (SCALAR_DTYPES, add_pairs, build, check_pairs, fusible_primitives,
                     layout_arrays, same_values)
from helpers import ALL_DTYPES
from lazyx.backends.metal import compiled as metal_compiled
from lazyx.backends.metal import msl_cpu
from lazyx.backends.metal.compiled import ShimRunner
from lazyx.codegen import ir, msl
from lazyx.errors import DtypeError
from lazyx.transforms.fusion import Compiled, fuse_arrays

pytestmark = pytest.mark.skipif(not msl_cpu.shim_available(), reason="no C++ compiler")

f32 = mx.float32
DTYPES = [d for d in ALL_DTYPES if d not in msl.UNSUPPORTED]
LAYOUTS = ("contiguous", "strided", "scalar")
# The strided kernel on one dtype of each width and signedness (each kernel function is a
# compile of its own, about a second: every dtype in every layout costs twice the time).
STRIDED_DTYPES = (mx.bool_, mx.int8, mx.uint16, mx.int32, mx.uint64, mx.float16, mx.bfloat16,
                  f32)
# A kernel's buffers: 4 inputs, 24 outputs, the count, and the strided layout's two.
BOUNDS = {"max_inputs": 4, "max_outputs": 24, "max_ops": 10**6, "min_ops": 1}


# -- running a program through the shim ------------------------------------------------
# The Metal backend's own launch logic (``lazyx.backends.metal.compiled.run_program``: the
# planning shared with CUDA, the argument packing of the renderer's buffer layout) with its
# shim runner.
class _DryRunner(ShimRunner):
    """Records ``(kernel, function)`` of each launch without running it: the walk builds
    every kernel function side by side first."""

    def launch(self, kernel, name, grid, args):
        self.launches.append((kernel, name))


def _plan(program, inputs):
    """The ``(kernel, function)`` launches that running ``program`` on ``inputs`` makes."""
    dry = _DryRunner()
    assert metal_compiled.run_program(program, inputs, dry) is not None
    return dry.launches


def _build_all(launches):
    # Each source is one compiler process: build them side by side.
    jobs = {k.source: (k, fn) for k, fn in launches}
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        list(pool.map(lambda kf: msl_cpu._entry_point(*kf), jobs.values()))


def run(program, *arrays, runner=None):
    """``program``'s outputs on NumPy ``arrays``, through the shim (a list)."""
    out = metal_compiled.run_program(program, [np.asarray(a) for a in arrays],
                                     runner or ShimRunner())
    assert out is not None, "the inputs' dtypes are not the program's, or Metal refuses it"
    return list(out) if isinstance(out, tuple) else [out]


# -- the source ----------------------------------------------------------------------------
def _program(inputs, outputs):
    return ir.Program(inputs, outputs)


def test_source_is_msl_with_two_kernels_bound_by_attributes():
    h, x = ir.input(0, mx.float16), ir.input(1, mx.int64)
    p = _program([mx.float16, mx.int64],
                 [ir.apply("exp", h), ir.apply("add", x, ir.constant(-2**63, mx.int64)),
                  ir.cast(h, mx.bfloat16)])
    src = msl.render(p, (False, True))
    assert "kernel void lx_contiguous(" in src and "kernel void lx_strided(" in src
    assert "device const half* p0 [[buffer(0)]]" in src
    assert "device const lx_i64* p1 [[buffer(1)]]" in src
    assert "device bfloat* o2 [[buffer(4)]]" in src
    assert "constant uint& lx_n [[buffer(5)]]" in src
    assert "constant int& lx_nd [[buffer(6)]]" in src and "lx_layout [[buffer(7)]]" in src
    assert "uint i [[thread_position_in_grid]]" in src
    assert "lx_rh(lx_m::exp(a0))" in src and "const lx_i64 s1 = p1[0];" in src
    # MSL has neither double, long long nor the standard library.
    for word in ("double", "LL)", "LL ", "std::", "#include <c"):
        assert word not in src, word
    assert p.digest in src


def test_float64_is_refused_with_the_reason():
    x = ir.input(0, f32)
    p = _program([f32], [ir.apply("exp", ir.cast(x, mx.float64))])
    with pytest.raises(DtypeError, match="float64") as info:
        msl.render(p, (False,))
    assert "Metal has no double" in str(info.value)
    assert "another backend" in str(info.value)
    assert msl.supports(p) is not None
    # complex64 is rendered (in float: test_msl_complex.py)
    assert msl.supports(_program([f32], [ir.apply("exp", ir.cast(x, mx.complex64))])) is None


def test_more_buffers_than_metal_binds_is_refused():
    x = ir.input(0, f32)
    p = _program([f32], [ir.apply("add", x, ir.constant(float(k), f32)) for k in range(28)])
    assert msl.buffer_count(p, strided=True) == 32
    with pytest.raises(DtypeError, match="31"):
        msl.render(p, (False,))


# -- every fusible primitive, every dtype ---------------------------------------------------
PRIMITIVES = fusible_primitives()


@pytest.fixture(scope="module")
def walk():
    """``{(class, dtype, layout): [(label, [(MSL output, unfused output)])]}`` and the
    kernel functions each layout ran."""
    cases = []
    for dtype in DTYPES:
        for layout in LAYOUTS:
            if layout == "scalar" and dtype not in SCALAR_DTYPES or \
                    layout == "strided" and dtype not in STRIDED_DTYPES:
                continue
            arrays = layout_arrays(dtype, layout)
            items = []
            for cls in PRIMITIVES:
                for label, outs in build(cls, arrays):
                    # Nodes computed through a dtype Metal has no kernel for (a cast to
                    # float64, isclose on integers) stay out of the kernels here.
                    if all(o.dtype not in msl.UNSUPPORTED for o in outs) and all(
                            msl.supports(f._prim.program) is None
                            for f in fuse_arrays(outs, list(arrays.values()), force=True, **BOUNDS)
                            if isinstance(f._prim, Compiled)):
                        items.append((cls, label, outs))
            flat = [o for *_, outs in items for o in outs]
            fused = fuse_arrays(flat, list(arrays.values()), force=True, **BOUNDS)
            cases.append((dtype, layout, items, flat, fused))
    inputs, launched = {}, {}
    for dtype, layout, items, flat, fused in cases:
        mx.eval(flat)
        for f in fused:
            prim = f._prim
            if isinstance(prim, Compiled) and id(prim) not in inputs \
                    and msl.supports(prim.program) is None:
                mx.eval(list(f._inputs))
                inputs[id(prim)] = (prim.program, [x._data for x in f._inputs])
                launched.setdefault(layout, set()).update(
                    fn for _, fn in _plan(*inputs[id(prim)]))
    _build_all([kf for program, ins in inputs.values() for kf in _plan(program, ins)])
    results = {key: run(program, *ins) for key, (program, ins) in inputs.items()}
    table = {}
    for dtype, layout, items, flat, fused in cases:
        add_pairs(table, dtype, layout, items, flat, fused, results)
    return table, launched


def test_every_layout_ran_its_kernel(walk):
    _, launched = walk
    assert "lx_contiguous" in launched["contiguous"]
    assert "lx_strided" in launched["strided"]
    assert "lx_contiguous" in launched["scalar"]


@pytest.mark.parametrize("cls", PRIMITIVES, ids=lambda c: c.name)
def test_msl_kernels_match_the_unfused_graph(cls, walk):
    table, _ = walk
    checked = check_pairs(table, cls, "MSL kernel (through the shim)")
    # Every fused node of the walk's kernels ran (the fixture launches each one).
    assert checked, f"{cls.name} declares to_expression but fused for no Metal dtype"


# -- semantics, a few at a time -------------------------------------------------------------
def test_a_fused_chain_rounds_every_half_precision_op():
    # gelu-like chain on float16 and bfloat16: each op is rounded to the dtype, as the
    # unfused kernels do.
    for d in (mx.float16, mx.bfloat16, f32):
        x = ir.input(0, d)
        def c(v, d=d):
            return ir.constant(v, d)

        t = ir.apply("mul", x, c(0.7978845608))
        t = ir.apply("tanh", ir.apply("add", t, ir.apply("mul", c(0.044715),
                                                         ir.apply("mul", t, ir.apply("square", x)))))
        y = ir.apply("mul", ir.apply("mul", c(0.5), x), ir.apply("add", c(1.0), t))
        p = _program([d], [y, ir.apply("sigmoid", y)])
        xs = np.linspace(-5, 5, 301).astype(d.np).reshape(7, 43)
        got = run(p, xs)
        a = mx.array(xs)
        t = mx.multiply(a, mx.array(0.7978845608, d))
        t = mx.tanh(mx.add(t, mx.multiply(mx.array(0.044715, d), mx.multiply(t, mx.square(a)))))
        want = mx.multiply(mx.multiply(mx.array(0.5, d), a), mx.add(mx.array(1.0, d), t))
        same_values(got[0], want, f"chain on {d.name}")
        same_values(got[1], mx.sigmoid(want), f"sigmoid of the chain on {d.name}")
        # and on a transposed view: the strided kernel
        got_t = run(p, xs.T)
        same_values(got_t[0], mx.transpose(want), f"chain on {d.name}, strided")


_SMALL = [300.0, -300.0, 70000.0, -70000.0, -2.5, 255.9, 0.0, -0.0, 2147483520.0, -2147483648.0]


def test_float_to_integer_casts_wrap_as_numpy_does():
    targets = [d for d in DTYPES if d.kind in "iu"]
    x = ir.input(0, f32)
    p = _program([f32], [ir.cast(x, d) for d in targets])
    xs = np.array(_SMALL, np.float32)
    for d, got in zip(targets, run(p, xs)):
        np.testing.assert_array_equal(got, xs.astype(d.np), err_msg=f"float32 -> {d.name}")
    big = {"int64": [3e9, -3e9, 1e18, -1e18, -9.2e18], "uint64": [3e9, -3e9, 1e18, 1.8e19, -1e18],
           "uint32": [3e9, 4294967040.0]}
    for name, values in big.items():
        vs = np.array(values, np.float32)
        got = run(p, vs)[[d.name for d in targets].index(name)]
        bits = 8 * np.dtype(name).itemsize
        wrapped = [int(v) % 2**bits for v in vs.tolist()]
        want = np.array(wrapped, np.uint64).view(np.int64) if name == "int64" else \
            np.array(wrapped, np.uint64).astype(name)
        np.testing.assert_array_equal(got, want, err_msg=f"float32 -> {name}")


@pytest.mark.parametrize("dtype", [mx.int8, mx.int32, mx.int64, mx.uint64], ids=lambda d: d.name)
def test_integer_arithmetic_wraps(dtype):
    info = np.iinfo(dtype.np)
    xs = np.array([info.max, info.min, info.max - 1, -1 if info.min else 7, 3, 0], dtype.np)
    ys = np.array([1, -1 if info.min else 5, info.max, info.min, info.max, info.min], dtype.np)
    x, y = ir.input(0, dtype), ir.input(1, dtype)
    p = _program([dtype, dtype], [ir.apply("add", x, y), ir.apply("sub", x, y),
                                  ir.apply("mul", x, y), ir.apply("square", x),
                                  ir.apply("floordiv", x, y), ir.apply("mod", x, y)])
    outs = run(p, xs, ys)
    with np.errstate(all="ignore"):
        want = [xs + ys, xs - ys, xs * ys, xs * xs]
    for got, w in zip(outs, want):
        np.testing.assert_array_equal(got, w)
    np.testing.assert_array_equal(outs[4], np.array(mx.floor_divide(mx.array(xs), mx.array(ys))))
    np.testing.assert_array_equal(outs[5], np.array(mx.remainder(mx.array(xs), mx.array(ys))))


def test_functions_metal_lacks_are_accurate_over_their_range():
    # expm1, log1p, erf, erfinv are the renderer's own (Metal has none): float64 references.
    x = ir.input(0, f32)
    p = _program([f32], [ir.apply(op, x) for op in ("expm1", "log1p", "erf", "erfinv")])
    xs = np.concatenate([np.linspace(-0.999999, 0.999999, 2001), [1e-30, -1e-20, 3e-8, -3e-8,
                                                                  0.5, -0.5, 0.9999, -0.9999]])
    xs = xs.astype(np.float32)
    got = run(p, xs)
    w = xs.astype(np.float64)
    want = [np.expm1(w), np.log1p(w), np.array([math.erf(v) for v in w])]
    for g, e, name in zip(got, want, ("expm1", "log1p", "erf")):
        np.testing.assert_allclose(g, e, rtol=2e-6, atol=1e-30, err_msg=name)
    # erfinv: erf of the result gives the input back (to float32's resolution there).
    back = np.array([math.erf(v) for v in got[3].astype(np.float64)])
    np.testing.assert_allclose(back, w, rtol=1e-6, atol=1e-12, err_msg="erf(erfinv(x))")
    big = np.array([-100.0, -20.0, 20.0, 88.0, 89.0, np.inf, -np.inf, 1e30], np.float32)
    e1, l1 = run(_program([f32], [ir.apply("expm1", x), ir.apply("log1p", x)]), big)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(e1, np.expm1(big), rtol=2e-6)
        np.testing.assert_allclose(l1, np.log1p(big), rtol=2e-6, equal_nan=True)


@pytest.mark.parametrize("dtype", [mx.float16, mx.int16, f32], ids=lambda d: d.name)
def test_broadcast_inputs_run_the_strided_kernel(dtype):
    x, y = ir.input(0, dtype), ir.input(1, dtype)
    p = _program([dtype, dtype], [ir.apply("sub", x, y), ir.apply("max", y, x)])
    gen = np.random.default_rng(3)
    xs = gen.uniform(-50, 50, (5, 1, 9)).astype(dtype.np)
    ys = gen.uniform(-50, 50, (4, 1)).astype(dtype.np)[::2]  # a sliced view, (2, 1)
    runner = ShimRunner()
    got = run(p, xs, ys, runner=runner)
    assert runner.launches == [("lx_strided", 5 * 2 * 9)]
    want_sub = mx.subtract(mx.array(xs), mx.array(ys))
    want_max = mx.maximum(mx.array(ys), mx.array(xs))
    same_values(got[0], want_sub, f"broadcast subtract on {dtype.name}")
    same_values(got[1], want_max, f"broadcast maximum on {dtype.name}")
