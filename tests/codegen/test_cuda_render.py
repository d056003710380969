"""The CUDA renderer and the cuda backend's generated kernels, checked on the CPU.

The generated CUDA C++ is compiled as host C++ through lazyx's shim
(``lazyx.backends.cuda.cuda_cpu``) and launched by the cuda backend's own
launch logic (``lazyx.backends.cuda.compiled.run_program``), with a runner that
runs every thread of the grid in turn. So these tests check the CUDA source's
semantics (the shared helpers, the device math layer, complex64, casts, half
precision off the device) and the launcher (kernel choice, collapsed layouts,
32/64-bit indexing, packs and their alignment test, grid-stride loops) without
a GPU; ``tests/backends/test_cuda_fusion.py`` runs them on one.

The walk mirrors ``test_every_fusible.py``: every fusible primitive of the
registry, for every dtype its op takes, fused into one kernel per dtype and
compared with the unfused graph.
"""

import concurrent.futures
import os
import re

import numpy as np
import pytest

import lazyx.core as mx
from fusible import UNBOUNDED, add_pairs, check_pairs, fusible_primitives, walk_cases
from helpers import ALL_DTYPES, assert_close, random_array, rng, to_lazyx
from lazyx import backend as _backend
from lazyx.backend import Backend, register_backend, invalidate_dispatch
from lazyx.backends.cuda import compiled as cuda_compiled
from lazyx.backends.cuda.cuda_cpu import HostRunner, run_on_cpu
from lazyx.codegen import cuda, ir, jit
from lazyx.device import DeviceType
from lazyx.transforms.fusion import Compiled, fuse_arrays

pytestmark = pytest.mark.skipif(not jit.available(), reason="no C++ compiler")

f32 = mx.float32


def _program(inputs, outputs):
    return ir.Program(inputs, outputs)


# -- rendering ---------------------------------------------------------------------------
def test_source_is_self_contained_cuda_with_three_kernels():
    x = ir.input(0, f32)
    p = _program([f32], [ir.apply("mul", ir.apply("exp", x), ir.constant(0.1, f32))])
    src = cuda.render(p, (False,))
    for name in cuda.KERNELS:
        assert f'extern "C" __global__ void {name}(' in src
    # NVRTC has no standard library: no header, nothing from std.
    assert "#include" not in src and "std::" not in src
    assert "0.10000000149011612f" in src  # float32(0.1), exactly, as a decimal literal
    assert "lx_m::exp(a0)" in src
    assert p.digest in src
    assert cuda.OPTIONS == ("--fmad=false",)


def test_half_precision_uses_ptx_conversions_on_the_device():
    h = ir.input(0, mx.float16)
    src = cuda.render(_program([mx.float16], [ir.apply("exp", h)]), (False,))
    device = src.split("#ifdef __CUDA_ARCH__", 1)[1].split("#else", 1)[0]
    assert "cvt.rn.f16.f32" in device and "cvt.f32.f16" in device
    assert "const lx_u16* __restrict__ p0" in src and "lx_rh(lx_m::exp(a0))" in src


def test_scalar_inputs_are_read_once_per_thread():
    x, y = ir.input(0, f32), ir.input(1, f32)
    src = cuda.render(_program([f32, f32], [ir.apply("add", x, y)]), (False, True))
    kernels = src.split("---- program", 1)[1]
    for body in kernels.split('extern "C"')[1:]:
        head, loop = body.split("for (", 1)
        assert "const float s1 = *p1;" in head
        assert "p1[" not in loop


@pytest.mark.parametrize("ins,outs,width", [
    ([f32], [f32], 4), ([mx.float16], [mx.float16], 8), ([mx.float64], [mx.float64], 2),
    ([f32], [mx.bool_], 4), ([mx.uint8], [mx.uint8], 8), ([mx.complex64], [mx.float32], 2),
    ([mx.bfloat16, f32], [mx.bfloat16], 4),
])
def test_packs_are_16_bytes_of_the_widest_buffer(ins, outs, width):
    args = [ir.input(k, d) for k, d in enumerate(ins)]
    es = [ir.cast(args[-1], d) for d in outs]
    p = _program(ins, es)
    assert cuda.vector_width(p, (False,) * len(ins)) == width
    # A scalar input does not count: it is not read in packs.
    if len(ins) == 2:
        assert cuda.vector_width(p, (True, False)) == 4


# -- every fusible primitive, every dtype -------------------------------------------------
PRIMITIVES = fusible_primitives()
LAYOUTS = ("contiguous", "unaligned", "strided", "scalar")
SHAPE = (7, 33)  # 231 elements: packs and a remainder


def _unaligned(a):
    """``a``'s values in a C-contiguous array one element past an aligned address."""
    flat = np.empty(a.size + 1, a.dtype)[1:]
    flat[...] = a.reshape(-1)
    return flat.reshape(a.shape)


def _runner(layout):
    # A small grid makes every thread's grid-stride loop take several turns.
    return HostRunner() if layout in ("contiguous", "strided") else HostRunner(grid=3, block=7)


@pytest.fixture(scope="module")
def walk():
    """``{(class, dtype, layout): [(label, [(host CUDA output, unfused output)])]}`` and
    the kernels each layout launched."""
    cases = []
    for dtype, layout, arrays, items, flat in walk_cases(PRIMITIVES, LAYOUTS, SHAPE):
        fused = fuse_arrays(flat, list(arrays.values()), force=True, **UNBOUNDED)
        cases.append((dtype, layout, items, flat, fused))
    # Build the host kernels in parallel (each build is a compiler process).
    jobs = {}
    for *_, fused in cases:
        for f in fused:
            if isinstance(f._prim, Compiled):
                scalar = tuple(x.size == 1 for x in f._inputs)
                k = cuda_compiled.kernel_for(f._prim.program, scalar)
                jobs[k.source] = k
    from lazyx.backends.cuda import cuda_cpu
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        list(pool.map(cuda_cpu._library, jobs.values()))
    table, launched = {}, {}
    for dtype, layout, items, flat, fused in cases:
        mx.eval(flat)
        runner = _runner(layout)
        results = {}
        for f in fused:
            prim = f._prim
            if not isinstance(prim, Compiled) or id(prim) in results:
                continue
            mx.eval(list(f._inputs))
            bufs = [x._data for x in f._inputs]
            if layout == "unaligned":
                bufs = [b if b.size == 1 else _unaligned(b) for b in bufs]
            results[id(prim)] = run_on_cpu(prim.program, bufs, runner)
        launched[layout] = launched.get(layout, set()) | {name for name, _ in runner.launches}
        add_pairs(table, dtype, layout, items, flat, fused, results)
    return table, launched


def test_every_layout_ran_its_kernel(walk):
    # (Plugins' examples bring inputs of their own shapes: other kernels may run too.)
    _, launched = walk
    assert "lx_contiguous" in launched["contiguous"]
    assert "lx_contiguous" in launched["unaligned"]
    assert "lx_strided" in launched["strided"]
    assert "lx_contiguous" in launched["scalar"]


@pytest.mark.parametrize("cls", PRIMITIVES, ids=lambda c: c.name)
def test_cuda_kernels_match_the_unfused_graph(cls, walk):
    table, _ = walk
    checked = check_pairs(table, cls, "CUDA kernel (on the host)")
    assert checked, f"{cls.name} declares to_expression but fused for no dtype"


# -- semantics, one at a time ---------------------------------------------------------------
def _run(program, *arrays, runner=None):
    return run_on_cpu(program, [np.asarray(a) for a in arrays], runner)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: d.name)
def test_every_dtype_loads_computes_and_stores(dtype):
    x, c = ir.input(0, dtype), ir.input(1, mx.bool_)
    k = ir.constant(3, dtype)
    p = _program([dtype, mx.bool_], [x, ir.select(c, x, k), ir.cast(x, mx.float64),
                                     ir.cast(x, mx.bool_)])
    gen = rng(1)
    xs = random_array((5, 9), dtype, gen)
    cs = random_array((5, 9), mx.bool_, gen)
    for runner in (HostRunner(), HostRunner(grid=2, block=3)):
        outs = _run(p, xs, cs, runner=runner)
        np.testing.assert_array_equal(outs[0].view(np.uint8), xs.view(np.uint8))
        three = np.array(3).astype(dtype.np)
        np.testing.assert_array_equal(outs[1], np.where(cs, xs, three))
        ref = xs.real if dtype.kind == "c" else xs
        np.testing.assert_array_equal(outs[2], ref.astype(np.float64))
        np.testing.assert_array_equal(outs[3], ref.astype(np.bool_))


def _f32_patterns():
    gen = rng(2)
    bits = gen.integers(0, 2**32, size=100_000, dtype=np.uint64).astype(np.uint32)
    special = np.array([0.0, -0.0, 65504.0, 65519.99, 65520.0, 65536.0, 6e-8, 2.98e-8, 2.99e-8,
                        6.1e-5, 6.103515625e-05, 1e-30, np.inf, -np.inf, np.nan, 1.0 + 2**-11,
                        1.0 + 3 * 2**-11, 3.4e38, 1.0 + 2**-8, 1.0 + 3 * 2**-8], np.float32)
    return np.concatenate([bits.view(np.float32), special, -special])


@pytest.mark.parametrize("half", [mx.float16, mx.bfloat16], ids=lambda d: d.name)
def test_half_conversions_off_the_device_match_numpy_bit_for_bit(half):
    h, f = ir.input(0, half), ir.input(1, f32)
    p = _program([half, f32], [ir.cast(h, f32), ir.cast(f, half)])
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(half.np)
    xs = _f32_patterns()
    n = max(len(every), len(xs))
    up, down = _run(p, np.resize(every, n), np.resize(xs, n), runner=HostRunner(grid=64))
    with np.errstate(all="ignore"):
        want_up, want_down = np.resize(every, n).astype(np.float32), np.resize(xs, n).astype(half.np)
    nan = np.isnan(want_up)
    np.testing.assert_array_equal(up.view(np.uint32)[~nan], want_up.view(np.uint32)[~nan])
    assert np.isnan(up[nan]).all()
    nan = np.isnan(want_down.astype(np.float32))
    np.testing.assert_array_equal(down.view(np.uint16)[~nan], want_down.view(np.uint16)[~nan])
    assert np.isnan(down[nan].astype(np.float32)).all()


# Values whose conversion NumPy defines: in the target's range, wrapping through a wider
# integer (-3.0 to uint8 is 253, 300.0 to int8 is 44). Beyond int32 (small targets) or
# int64 NumPy's own results depend on the loop that runs (scalar or SIMD).
_SMALL = [300.0, -300.0, 70000.0, -70000.0, -2.5, 255.9, 0.0, -0.0, 2147483520.0, -2147483648.0]
_BIG = {"int64": [3e9, -3e9, 1e18, -1e18, -9.2e18], "uint64": [3e9, -3e9, 1e18, 1.8e19, -1e18],
        "uint32": [3e9, 4294967040.0]}


@pytest.mark.parametrize("src", [f32, mx.float64], ids=lambda d: d.name)
def test_float_to_integer_casts_wrap_as_numpy_does(src):
    # CUDA's conversions saturate; NumPy's wrap (through a 32- or 64-bit conversion).
    targets = [d for d in ALL_DTYPES if d.kind in "iu"]
    x = ir.input(0, src)
    p = _program([src], [ir.cast(x, d) for d in targets])
    xs = np.array(_SMALL, src.np)
    for d, got in zip(targets, _run(p, xs)):
        np.testing.assert_array_equal(got, xs.astype(d.np), err_msg=f"{src.name} -> {d.name}")
    for name, values in _BIG.items():
        xs = np.array(values, src.np)
        got = _run(p, xs)[[d.name for d in targets].index(name)]
        bits = 8 * np.dtype(name).itemsize
        wrapped = [int(v) % 2**bits for v in xs.tolist()]  # trunc(v) modulo 2**bits
        want = np.array(wrapped, np.uint64).view(np.int64) if name == "int64" else \
            np.array(wrapped, np.uint64).astype(name)
        np.testing.assert_array_equal(got, want, err_msg=f"{src.name} -> {name}")


@pytest.mark.parametrize("src", [mx.float16, mx.bfloat16], ids=lambda d: d.name)
def test_half_to_integer_casts_in_range(src):
    xs = np.array([-300.0, -2.5, -0.5, 0.0, 1.5, 255.0, 300.0, 1000.0], src.np)
    targets = [d for d in ALL_DTYPES if d.kind in "iu"]
    x = ir.input(0, src)
    outs = _run(_program([src], [ir.cast(x, d) for d in targets]), xs)
    for d, got in zip(targets, outs):
        want = np.array(mx.astype(mx.array(xs), d))
        np.testing.assert_array_equal(got, want, err_msg=f"{src.name} -> {d.name}")


@pytest.mark.parametrize("dtype", [mx.int8, mx.int16, mx.int32, mx.int64, mx.uint32, mx.uint64],
                         ids=lambda d: d.name)
def test_integer_arithmetic_wraps(dtype):
    info = np.iinfo(dtype.np)
    xs = np.array([info.max, info.min, info.max - 1, -1 if info.min else 7, 3, 0], dtype.np)
    ys = np.array([1, -1 if info.min else 5, info.max, info.min, info.max, info.min], dtype.np)
    x, y = ir.input(0, dtype), ir.input(1, dtype)
    p = _program([dtype, dtype], [ir.apply("add", x, y), ir.apply("sub", x, y),
                                  ir.apply("mul", x, y), ir.apply("square", x),
                                  ir.apply("floordiv", x, y), ir.apply("mod", x, y)] +
                 ([ir.apply("neg", x), ir.apply("abs", x)] if dtype.kind == "i" else []))
    outs = _run(p, xs, ys)
    with np.errstate(all="ignore"):
        want = [xs + ys, xs - ys, xs * ys, xs * xs]
    for got, w in zip(outs, want):
        np.testing.assert_array_equal(got, w)
    q = np.array(mx.floor_divide(to_lazyx(xs), to_lazyx(ys)))
    r = np.array(mx.remainder(to_lazyx(xs), to_lazyx(ys)))
    np.testing.assert_array_equal(outs[4], q)
    np.testing.assert_array_equal(outs[5], r)
    if dtype.kind == "i":
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(outs[6], -xs)
            np.testing.assert_array_equal(outs[7], np.abs(xs))


def test_complex_division_follows_numpy_by_zero_too():
    c = mx.complex64
    a = np.array([1 + 2j, -3 + 0.5j, 1 + 1j, 0j, 2 - 1j], np.complex64)
    b = np.array([0j, 0j, 3 - 4j, 0j, 1e-30 + 1e30j], np.complex64)
    x, y = ir.input(0, c), ir.input(1, c)
    (got,) = _run(_program([c, c], [ir.apply("div", x, y)]), a, b)
    with np.errstate(all="ignore"):
        want = a / b
    np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(np.isinf(got), np.isinf(want))


@pytest.mark.parametrize("op", ["sqrt", "log", "exp", "tanh", "arcsin", "arccos", "arctan",
                                "arcsinh", "arccosh", "arctanh", "tan", "sin", "cosh"])
def test_complex_functions_near_the_axes_and_the_unit_circle(op):
    # Values the random walk rarely meets: tiny, huge, |z| close to 1, near the axes.
    vals = np.array([1e-6 + 2e-7j, 1 + 1e-7j, 0.6 + 0.8j, -0.6 + 0.8000001j, 30 - 0.5j,
                     -0.5 + 30j, 0.25 - 1e-5j, -1e-3 - 2.5j, 1e3 + 1e3j, 1e-20 + 1e-20j],
                    np.complex64)
    name = {"arcsin": "asin", "arccos": "acos", "arctan": "atan", "arcsinh": "asinh",
            "arccosh": "acosh", "arctanh": "atanh"}.get(op, op)
    x = ir.input(0, mx.complex64)
    (got,) = _run(_program([mx.complex64], [ir.apply(name, x)]), vals)
    with np.errstate(all="ignore"):
        want = getattr(np, op)(vals.astype(np.complex128)).astype(np.complex64)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-30)


# -- the launcher: layouts ------------------------------------------------------------------
def _axpy(dtype=f32):
    x, y = ir.input(0, dtype), ir.input(1, dtype)
    return _program([dtype, dtype], [ir.apply("add", ir.apply("mul", x, y), x)])


@pytest.mark.parametrize("shapes", [((3, 1, 5), (4, 5)), ((1,), (2, 3)), ((2, 1, 3, 1), (1, 4, 1, 6)),
                                    ((6,), ()), ((5, 0), (5, 1))])
def test_broadcasting_runs_the_strided_kernel(shapes):
    gen = rng(3)
    a, b = (random_array(s, f32, gen) for s in shapes)
    runner = HostRunner()
    (got,) = _run(_axpy(), a, b, runner=runner)
    want = a * b + a
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6)
    if got.size and a.size > 1 and b.size > 1:
        assert runner.launches == [("lx_strided", got.size)]


def test_transposed_reversed_and_sliced_inputs():
    gen = rng(4)
    base = random_array((6, 10), f32, gen)
    cases = [(base.T, base.T[::-1]), (base[::2, 1::3], base[1::2, 8::-3]), (base[:, ::-1], base)]
    for a, b in cases:
        runner = HostRunner(grid=2, block=5)
        (got,) = _run(_axpy(), a, b, runner=runner)
        np.testing.assert_allclose(got, a * b + a, rtol=1e-6)
        assert runner.launches[0][0] == "lx_strided"


def test_large_offsets_take_the_64_bit_kernel(monkeypatch):
    monkeypatch.setattr(cuda_compiled, "_INT32", 16)
    monkeypatch.setattr(cuda_compiled, "_plans", {})
    gen = rng(5)
    a = random_array((4, 9), f32, gen).T
    b = random_array((9, 1), f32, gen)
    runner = HostRunner(grid=2, block=3)
    (got,) = _run(_axpy(), a, b, runner=runner)
    np.testing.assert_allclose(got, a * b + a, rtol=1e-6)
    assert runner.launches == [("lx_strided_wide", 36)]


def test_layouts_the_strided_kernels_cannot_take_run_on_contiguous_copies():
    gen = rng(6)
    before = cuda_compiled.stats["materialised"]
    # Strides that are not whole elements (a float32 every 6 bytes).
    raw = np.frombuffer(random_array((64,), mx.uint8, gen).tobytes(), np.uint8)
    odd = np.lib.stride_tricks.as_strided(raw.view(np.float32)[:1], shape=(5, 2),
                                          strides=(12, 6))
    odd = np.nan_to_num(odd, nan=1.0, posinf=1.0, neginf=1.0)  # a copy: make it odd again
    buf = np.zeros(64, np.uint8)
    view = np.lib.stride_tricks.as_strided(buf[:4].view(np.float32), shape=(5, 2),
                                           strides=(12, 6))
    for i in range(5):
        for j in range(2):
            buf[12 * i + 6 * j:12 * i + 6 * j + 4] = np.frombuffer(odd[i, j].tobytes(), np.uint8)
    b = random_array((5, 2), f32, gen)
    (got,) = _run(_axpy(), view, b)
    np.testing.assert_allclose(got, view * b + view, rtol=1e-6)
    # More than 16 dimensions that do not merge.
    deep = random_array((2,) * 18, f32, gen)
    other = np.ascontiguousarray(np.transpose(random_array((2,) * 18, f32, gen)))
    other = np.transpose(other)
    (got,) = _run(_axpy(), deep, other)
    np.testing.assert_allclose(got, deep * other + deep, rtol=1e-6)
    assert cuda_compiled.stats["materialised"] == before + 2


def test_empty_zero_d_and_multi_output_programs():
    x, y = ir.input(0, f32), ir.input(1, f32)
    p = _program([f32, f32], [ir.apply("add", x, y), ir.apply("lt", x, y), x])
    runner = HostRunner()
    outs = _run(p, np.zeros((0, 3), np.float32), np.ones(3, np.float32), runner=runner)
    assert [o.shape for o in outs] == [(0, 3)] * 3 and runner.launches == []
    outs = _run(p, np.float32(2.0), np.float32(3.0), runner=runner)
    assert [o.shape for o in outs] == [()] * 3
    assert [o.item() for o in outs] == [5.0, True, 2.0]
    assert [o.dtype for o in outs] == [np.float32, np.bool_, np.float32]


def test_a_program_is_rendered_once_per_scalar_mask():
    p = _axpy()
    a = cuda_compiled.kernel_for(p, (False, False))
    assert cuda_compiled.kernel_for(_axpy(), (False, False)) is a
    assert cuda_compiled.kernel_for(p, (False, True)) is not a
    assert re.search(r"scalar mask \.s", cuda_compiled.kernel_for(p, (False, True)).source)


# -- the cuda backend's logic with a GPU stand-in ----------------------------------------------
_numpy_table = {}


def _numpy_kernel(cls):
    from lazyx.backends.cpu.kernels import numpy_kernels
    if not _numpy_table:
        _numpy_table.update(numpy_kernels())
    return next((_numpy_table[k] for k in cls.__mro__ if k in _numpy_table), None)


class HostGpuBackend(Backend):
    """A GPU backend whose buffers are NumPy arrays and whose generated kernels run on the
    host: the cuda backend's kernels for ``Compiled`` and for element-wise primitives
    (``lazyx.backends.cuda.compiled``), the NumPy kernels for everything else."""

    name = "cuda-on-host"
    device_type = DeviceType.gpu

    def find_kernel(self, cls):
        fallback = _numpy_kernel(cls)
        if cls is Compiled:
            return cuda_compiled.compiled_kernel
        if callable(getattr(cls, "to_expression", None)):
            return cuda_compiled.eager_kernel(cls, fallback)
        return fallback


@pytest.fixture
def host_gpu(monkeypatch):
    b = HostGpuBackend()
    register_backend(b)
    monkeypatch.setattr(cuda_compiled, "_runner", HostRunner())
    try:
        with mx.use_backend("gpu", b.name):
            yield b
    finally:
        _backend._backends.pop(b.name, None)
        _backend._backend_plugins.pop(b.name, None)
        invalidate_dispatch()


def _gelu(x):
    return x * 0.5 * (1 + mx.erf(x * 0.7071067811865476))


def test_compile_fuses_gpu_streams_with_a_compiled_kernel(host_gpu):
    xd = random_array((5, 7), f32, rng(7))
    runner = cuda_compiled._runner
    fn = mx.compile(_gelu)
    with mx.stream(mx.gpu):
        y = fn(mx.array(xd))
        mx.eval(y)
    kinds = [type(n.prim).__name__ for e in fn.cache.entries.values() for n in e.run_tape.nodes]
    assert kinds == ["Compiled"]
    assert [name for name, _ in runner.launches] == ["lx_contiguous"]
    from math import erf
    want = xd * 0.5 * (1 + np.vectorize(erf)(xd.astype(np.float64) * 0.7071067811865476))
    assert_close(y, want, f32)


def _nodes(out):
    """Every node of ``out``'s graph, as (primitive class name, device)."""
    seen, stack, found = set(), [out], []
    while stack:
        a = stack.pop()
        if id(a) in seen or a._prim is None:
            continue
        seen.add(id(a))
        found.append((type(a._prim).__name__, a._prim.stream.device))
        stack.extend(a._inputs)
    return found


def test_groups_never_mix_devices(host_gpu):
    xd = random_array((4, 3), f32, rng(8))
    x = mx.array(xd)
    a = mx.exp(mx.sin(x, stream=mx.cpu), stream=mx.cpu)
    b = mx.cos(mx.add(a, 1.0, stream=mx.gpu), stream=mx.gpu)
    c = mx.sqrt(mx.abs(b, stream=mx.cpu), stream=mx.cpu)
    (out,) = fuse_arrays([c], [x])
    assert sorted(_nodes(out), key=str) == sorted(
        [("Compiled", mx.cpu), ("Compiled", mx.gpu), ("Compiled", mx.cpu)], key=str)
    want = np.sqrt(np.abs(np.cos(np.exp(np.sin(xd.astype(np.float64))) + 1)))
    assert_close(out, want, f32)


def test_gpu_streams_stay_unfused_without_a_compiled_kernel(host_gpu, monkeypatch):
    monkeypatch.setattr(HostGpuBackend, "find_kernel",
                        lambda self, cls: None if cls is Compiled else _numpy_kernel(cls))
    invalidate_dispatch()
    x = mx.array(random_array((4, 3), f32, rng(8)))
    (out,) = fuse_arrays([mx.cos(mx.exp(x, stream=mx.gpu), stream=mx.gpu)], [x])
    assert sorted(n for n, _ in _nodes(out)) == ["Cos", "Exp"]


def test_eager_elementwise_ops_run_generated_kernels(host_gpu):
    runner = cuda_compiled._runner
    gen = rng(9)
    for dtype in (f32, mx.int32, mx.float16, mx.complex64, mx.bool_):
        xd, yd = random_array((3, 5), dtype, gen), random_array((5,), dtype, gen)
        runner.launches.clear()
        with mx.stream(mx.gpu):
            s = mx.add(mx.array(xd), mx.array(yd))
            e = mx.exp(mx.array(xd)) if dtype.kind in "fc" else None
            mx.eval(s, *([e] if e is not None else []))
        want = (xd + yd) if dtype is not mx.bool_ else (xd | yd)
        np.testing.assert_array_equal(np.array(s), want)
        if e is not None:
            assert_close(e, np.exp(xd.astype(np.complex128 if dtype.kind == "c" else np.float64)),
                         dtype)
        assert [n for n, _ in runner.launches] == ["lx_strided"] + (["lx_contiguous"] if e is not None else [])
    # A scalar operand is read once per thread; parameters are part of the cache key.
    with mx.stream(mx.gpu):
        r1, r2 = mx.round(mx.array([1.26, 2.5]), 1), mx.round(mx.array([1.26, 2.5]), 0)
        mx.eval(r1, r2)
    np.testing.assert_allclose(np.array(r1), [1.3, 2.5], rtol=1e-6)
    np.testing.assert_array_equal(np.array(r2), [1.0, 2.0])


def test_eager_ops_without_an_expression_run_the_fallback():
    before = cuda_compiled.stats["fallbacks"]
    prim = mx.imag(mx.array([1j]))._prim  # imag has an expression for complex inputs only
    kernel = cuda_compiled.eager_kernel(type(prim), lambda p, ins: "fallback")
    assert kernel.generated and kernel(prim, [np.array([1.0], np.float32)]) == "fallback"
    assert cuda_compiled.stats["fallbacks"] == before + 1


def test_kernels_that_do_not_compile_warn_once_and_run_unfused(host_gpu, monkeypatch):
    from lazyx.errors import KernelCompileError

    def broken(self, kernel, name, config, args):
        raise KernelCompileError("The CUDA kernel source x.cu did not compile (NVRTC):\n  error")
    monkeypatch.setattr(HostRunner, "launch", broken)
    monkeypatch.setattr(cuda_compiled, "_broken", set())
    xd = random_array((3, 4), f32, rng(10))
    fn = mx.compile(lambda x: mx.sin(x) * 2.0 + 1.0)
    with pytest.warns(RuntimeWarning, match="did not compile") as record:
        with mx.stream(mx.gpu):
            ys = [mx.exp(mx.array(xd)), fn(mx.array(xd))]
            mx.eval(ys)
            again = mx.exp(mx.array(xd))
            mx.eval(again)
    assert len(record) == 1  # the cause is the same for every program
    assert_close(ys[0], np.exp(xd.astype(np.float64)), f32)
    assert_close(again, np.exp(xd.astype(np.float64)), f32)
    assert_close(ys[1], np.sin(xd.astype(np.float64)) * 2 + 1, f32)
