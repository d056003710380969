"""The C++ renderer and the cpu backend's fused kernel: rendering, dtypes, half-precision
conversions, the contiguous and strided paths, scalars, threads."""

import ctypes
import math

import ml_dtypes
import numpy as np
import pytest

import lazyx.core as mx
from fusible import run_program
from helpers import ALL_DTYPES, assert_close, random_array, rng, to_lazyx
from lazyx.backends.cpu import compiled
from lazyx.codegen import cpp, ir, jit

pytestmark = pytest.mark.skipif(not jit.available(), reason="no C++ compiler")

f32 = mx.float32


def _axpy_program(dtype=f32):
    """``x * y + x`` (two inputs)."""
    x, y = ir.input(0, dtype), ir.input(1, dtype)
    return ir.Program([dtype, dtype], [ir.apply("add", ir.apply("mul", x, y), x)])


# -- rendering ---------------------------------------------------------------------------
def test_source_has_two_short_entry_points_and_inlined_constants():
    x = ir.input(0, f32)
    p = ir.Program([f32], [ir.apply("mul", x, ir.constant(0.5, f32))])
    src = cpp.render(p, (False,))
    assert 'int lazyx_contiguous(' in src and 'int lazyx_strided(' in src
    assert "0x1.0000000000000p-1f" in src  # 0.5, exactly
    assert p.digest in src
    # The constant is a literal, not an input.
    assert len(p.inputs) == 1 and "buf[1]" in src and "buf[2]" not in src


def test_scalar_inputs_are_loaded_once_before_the_loop():
    src = cpp.render(_axpy_program(), (False, True))
    head, loop = src.split("for (int64_t i = begin; i < end; ++i)", 1)
    assert "const float s1 = *static_cast<const float*>(buf[1]);" in head.split("lx_contiguous(")[-1]
    assert "p1[" not in loop.split("lx_strided")[0]


def test_element_loops_are_declared_free_of_loop_carried_dependences():
    # Without it GCC gives up vectorising a loop over more than ~10 pointer pairs (an
    # optimizer's update: 4 inputs, 3 outputs) rather than check their overlap at run time.
    x = [ir.input(k, mx.float32) for k in range(4)]
    outs = [ir.apply("add", x[0], x[1]), ir.apply("mul", x[2], x[3]),
            ir.apply("sub", x[3], x[0])]
    src = cpp.render(ir.Program([mx.float32] * 4, outs), (False,) * 4)
    body = src.split("// ---- end of the shared preamble ----")[1]
    assert body.count("LX_IVDEP\n  for (int64_t i = begin") == 1
    assert body.count("LX_IVDEP\n    for (int64_t j = 0") == 1
    assert "__restrict" not in body  # a donated output shares its input's buffer


def test_many_arrays_in_place_match_numpy():
    # Each output may be written into a donated input's buffer that another output still
    # reads at the same element: every load of an element precedes its stores.
    rng = np.random.default_rng(3)
    n = 4099  # vector iterations and a scalar tail
    p, g, m, v = (rng.standard_normal(n).astype(np.float32) for _ in range(4))
    step = mx.compile(lambda p, g, m, v: (0.9 * m + 0.1 * g, 0.99 * v + g * g,
                                          p - 0.5 * m / (mx.sqrt(mx.abs(v)) + 1e-3), g - v))
    got = [np.asarray(o) for o in step(mx.array(p), mx.array(g), mx.array(m), mx.array(v))]
    want = [0.9 * m + 0.1 * g, 0.99 * v + g * g, p - 0.5 * m / (np.sqrt(np.abs(v)) + 1e-3), g - v]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_half_precision_is_computed_in_float_and_rounded_per_op():
    for d, rnd, load in ((mx.float16, "lx_rh(", "lx_h2f("), (mx.bfloat16, "lx_rb(", "lx_b2f(")):
        x = ir.input(0, d)
        src = cpp.render(ir.Program([d], [ir.apply("exp", ir.apply("add", x, x))]), (False,))
        assert "const uint16_t* p0" in src
        assert f"const float a0 = {load}p0[i]);" in src
        assert src.count(rnd) >= 2


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: d.name)
def test_every_dtype_loads_computes_and_stores(dtype):
    # A copy, a select with a constant, and casts to float64 and bool: every dtype's
    # load, store, literal and conversions, through the contiguous path.
    x, c = ir.input(0, dtype), ir.input(1, mx.bool_)
    k = ir.constant(3, dtype)
    p = ir.Program([dtype, mx.bool_], [x, ir.select(c, x, k), ir.cast(x, mx.float64),
                                       ir.cast(x, mx.bool_)])
    gen = rng(1)
    xs = random_array((4, 7), dtype, gen)
    cs = random_array((4, 7), mx.bool_, gen)
    outs = run_program(p, to_lazyx(xs), to_lazyx(cs))
    assert_close(outs[0], xs, dtype)
    np.testing.assert_array_equal(np.array(outs[0]).view(np.uint8), xs.view(np.uint8))
    three = np.array(3).astype(dtype.np)
    assert_close(outs[1], np.where(cs, xs, three), dtype)
    ref = xs.real if dtype.kind == "c" else xs
    assert_close(outs[2], ref.astype(np.float64), mx.float64)
    assert_close(outs[3], ref.astype(np.bool_) if dtype.kind != "c" else ref != 0, mx.bool_)


# -- half-precision conversions, exhaustively ------------------------------------------------
def _build(program, define=""):
    """The kernel library of ``program`` (optionally with a #define), called directly."""
    src = define + cpp.render(program, (False,) * len(program.inputs), jit.vector_math_header())
    lib = jit.build(src)
    lib.lazyx_contiguous.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    lib.lazyx_contiguous.restype = ctypes.c_int
    return lib


def _call(lib, *arrays):
    ptrs = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    assert lib.lazyx_contiguous(ptrs, arrays[0].size, 1) == 0


def _f32_patterns():
    gen = rng(2)
    bits = gen.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    special = np.array([0.0, -0.0, 65504.0, 65519.99, 65520.0, 65536.0, 6e-8, 2.98e-8, 2.99e-8,
                        6.1e-5, 6.103515625e-05, 1e-30, np.inf, -np.inf, np.nan, 1.0 + 2**-11,
                        1.0 + 3 * 2**-11, 3.4e38, 1.0 + 2**-8, 1.0 + 3 * 2**-8], np.float32)
    return np.concatenate([bits.view(np.float32), special, -special])


@pytest.mark.parametrize("define", ["", "#define LAZYX_SOFT_HALF 1\n"], ids=["native", "soft"])
def test_float16_conversions_match_numpy_bit_for_bit(define):
    h, f = ir.input(0, mx.float16), ir.input(1, f32)
    lib = _build(ir.Program([mx.float16, f32], [ir.cast(h, f32), ir.cast(f, mx.float16)]), define)
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    xs = _f32_patterns()
    n = max(len(every), len(xs))
    hs = np.resize(every, n)
    fs = np.resize(xs, n)
    up, down = np.empty(n, np.float32), np.empty(n, np.float16)
    _call(lib, hs, fs, up, down)
    with np.errstate(all="ignore"):
        want_up, want_down = hs.astype(np.float32), fs.astype(np.float16)
    nan = np.isnan(want_up)
    np.testing.assert_array_equal(up.view(np.uint32)[~nan], want_up.view(np.uint32)[~nan])
    assert np.isnan(up[nan]).all()
    nan = np.isnan(want_down)
    np.testing.assert_array_equal(down.view(np.uint16)[~nan], want_down.view(np.uint16)[~nan])
    assert np.isnan(down[nan]).all()


def test_bfloat16_conversions_match_ml_dtypes_bit_for_bit():
    b, f = ir.input(0, mx.bfloat16), ir.input(1, f32)
    lib = _build(ir.Program([mx.bfloat16, f32], [ir.cast(b, f32), ir.cast(f, mx.bfloat16)]))
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)
    xs = _f32_patterns()
    n = max(len(every), len(xs))
    bs, fs = np.resize(every, n), np.resize(xs, n)
    up, down = np.empty(n, np.float32), np.empty(n, ml_dtypes.bfloat16)
    _call(lib, bs, fs, up, down)
    with np.errstate(all="ignore"):
        want_up, want_down = bs.astype(np.float32), fs.astype(ml_dtypes.bfloat16)
    nan = np.isnan(want_up)
    np.testing.assert_array_equal(up.view(np.uint32)[~nan], want_up.view(np.uint32)[~nan])
    nan = np.isnan(want_down.astype(np.float32))
    np.testing.assert_array_equal(down.view(np.uint16)[~nan], want_down.view(np.uint16)[~nan])
    assert np.isnan(down[nan].astype(np.float32)).all()


def test_float32_erf_and_tanh_are_accurate_everywhere():
    x = ir.input(0, f32)
    lib = _build(ir.Program([f32], [ir.apply("erf", x), ir.apply("tanh", x)]))
    xs = np.concatenate([np.linspace(-12, 12, 400_001, dtype=np.float32),
                         np.float32([0.0, -0.0, 1e-30, -1e-30, 1e-6, np.inf, -np.inf, np.nan])])
    erf, tanh = np.empty_like(xs), np.empty_like(xs)
    _call(lib, xs, erf, tanh)
    ref_erf = np.array([math.erf(v) for v in xs.astype(np.float64)])
    ref_tanh = np.tanh(xs.astype(np.float64))
    np.testing.assert_allclose(erf, ref_erf, rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(tanh, ref_tanh, rtol=1e-6, atol=1e-30)
    assert np.nanmax(np.abs(erf)) == 1.0 and np.nanmax(np.abs(tanh)) == 1.0


# -- layouts: the contiguous and strided paths -------------------------------------------
@pytest.fixture
def paths(monkeypatch):
    """Counts the calls of each path of the fused kernel."""
    seen = {"contiguous": 0, "strided": 0}

    def spy(name, fn):
        def wrapped(*args):
            seen[name] += 1
            return fn(*args)
        monkeypatch.setattr(compiled, f"_call_{name}", wrapped)
    spy("contiguous", compiled._call_contiguous)
    spy("strided", compiled._call_strided)
    return seen


def _view(data, how):
    """A lazyx array whose buffer is ``data`` laid out as ``how`` says."""
    if how == "contiguous":
        return to_lazyx(data)
    if how == "transposed":
        a = mx.transpose(to_lazyx(np.ascontiguousarray(data.T)))
    elif how == "strided":
        big = np.repeat(data, 2, axis=-1)
        a = to_lazyx(big)[..., ::2]
    elif how == "reversed":
        a = to_lazyx(np.ascontiguousarray(data[::-1]))[::-1]
    mx.eval(a)
    return a


@pytest.mark.parametrize("xs, ys, how, path", [
    ((5, 7), (5, 7), "contiguous", "contiguous"),
    ((5, 7), (7,), "contiguous", "strided"),       # row broadcast
    ((5, 7), (5, 1), "contiguous", "strided"),     # column broadcast
    ((5, 7), (5, 7), "transposed", "strided"),
    ((5, 7), (5, 7), "strided", "strided"),
    ((6, 3), (6, 3), "reversed", "strided"),
    ((5, 7), (), "contiguous", "contiguous"),      # a 0-d scalar
    ((5, 7), (1, 1), "transposed", "strided"),     # a scalar with dimensions
    ((), (), "contiguous", "contiguous"),
    ((0, 3), (3,), "contiguous", None),            # empty: no call
    ((2, 1, 3, 1, 4, 5), (3, 1, 1, 5), "contiguous", "strided"),
    ((4, 1), (1, 6), "contiguous", "strided"),     # an outer product
])
def test_layouts_match_numpy(xs, ys, how, path, paths):
    gen = rng(3)
    xd, yd = random_array(xs, f32, gen), random_array(ys, f32, gen)
    x = _view(xd, how) if xd.ndim == 2 else to_lazyx(xd)
    (out,) = run_program(_axpy_program(), x, to_lazyx(yd))
    assert_close(out, xd.astype(np.float64) * yd + xd, f32)
    if path is not None:
        assert paths[path] == 1 and sum(paths.values()) == 1, paths
    else:
        assert sum(paths.values()) == 0


def test_collapsed_layouts_are_cached_per_strides(paths):
    p = _axpy_program()
    gen = rng(4)
    xd, yd = random_array((6, 8), f32, gen), random_array((8,), f32, gen)
    for _ in range(2):
        (out,) = run_program(p, to_lazyx(xd), to_lazyx(yd))
        assert_close(out, xd.astype(np.float64) * yd + xd, f32)
    plan = compiled._plans[(id(p), ((6, 8), (8,)))]
    assert len(plan.layouts) == 1
    # Merging leaves the row-broadcast as two dimensions; the plan's kernel runs its rows.
    (layout, nd, kernel), = plan.layouts.values()
    assert nd == 2 and list(np.frombuffer(layout, np.int64)) == [6, 8, 8, 1, 0, 1]
    assert plan.rows == (False, False) and kernel is plan.kernel


def _rows_program(dtype=f32):
    """``exp(x + y) * x - z`` and ``y * z`` (three inputs, two outputs): ``exp`` is what
    the strided path's runtime strides keep from vectorising."""
    x, y, z = ir.input(0, dtype), ir.input(1, dtype), ir.input(2, dtype)
    e = ir.apply("exp", ir.apply("add", x, y))
    return ir.Program([dtype] * 3, [ir.apply("sub", ir.apply("mul", e, x), z),
                                    ir.apply("mul", y, z)])


ROW_CASES = [  # shapes of x, y, z; the row mask of C-contiguous inputs
    ((6, 9), (9,), (6, 1), (False, False, True)),            # a bias, a per-row value
    ((6, 9), (6, 1), (1,), (False, True, False)),            # z a scalar
    ((4, 5, 7), (5, 1), (4, 5, 7), (False, True, False)),
    ((4, 5, 7), (4, 1, 7), (7,), (False, False, False)),     # broadcast in the middle
    ((3, 1, 11), (3, 4, 1), (11,), (False, True, False)),    # the loop's shape from two
    ((2, 3), (3,), (2, 3), None),                             # rows of 3 ... and a column:
]


@pytest.mark.parametrize("dtype", [f32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("xs, ys, zs, rows", ROW_CASES)
def test_broadcast_inputs_run_rows(xs, ys, zs, rows, dtype, paths):
    """Inputs of other shapes than the loop's (a bias, a per-row statistic) take the
    strided path; when each reads a row at stride 1 or 0, the plan's kernel runs rows
    (a value per row for the stride-0 inputs, pointers for the others)."""
    gen = rng(11)
    datas = [random_array(sh, dtype, gen) for sh in (xs, ys, zs)]
    p = _rows_program(dtype)
    out, prod = run_program(p, *[to_lazyx(d) for d in datas])
    x, y, z = [d.astype(np.float64) for d in datas]
    # Each op's result rounded to the dtype, as the kernel (and NumPy) round halves.
    r = (lambda v: v) if dtype == f32 else (lambda v: v.astype(datas[0].dtype).astype(np.float64))
    assert_close(out, r(r(r(np.exp(r(x + y))) * x) - z), dtype)
    assert_close(prod, np.broadcast_to(r(y * z), out.shape), dtype)
    assert paths["strided"] == 1
    plan = compiled._plans[(id(p), (xs, ys, zs))]
    (_, _, kernel), = plan.layouts.values()
    if rows is not None:
        assert plan.rows == rows and kernel is plan.kernel
    else:
        assert plan.rows == (False, False, False)


@pytest.mark.parametrize("how", ["transposed", "strided"])
def test_a_layout_other_than_the_plans_rows_gets_the_strided_kernel(how, paths):
    gen = rng(12)
    xd, yd, zd = random_array((7, 6), f32, gen), random_array((6,), f32, gen), \
        random_array((7, 1), f32, gen)
    p = _rows_program()
    run_program(p, *[to_lazyx(d) for d in (xd, yd, zd)])  # C-contiguous: the plan's rows
    out, prod = run_program(p, _view(xd, how), to_lazyx(yd), to_lazyx(zd))
    x, y, z = [d.astype(np.float64) for d in (xd, yd, zd)]
    assert_close(out, np.exp(x + y) * x - z, f32)
    assert_close(prod, y * z, f32)
    plan = compiled._plans[(id(p), ((7, 6), (6,), (7, 1)))]
    kernels = [k for (_, _, k) in plan.layouts.values()]
    assert len(kernels) == 2 and kernels[0] is plan.kernel and kernels[1] is not plan.kernel


@pytest.mark.parametrize("n", [1, 5, 64, 257])
def test_rows_split_over_threads_at_any_element(n, monkeypatch):
    """A thread's chunk may start and end inside a row."""
    monkeypatch.setattr(compiled, "PARALLEL_WORK", 1)
    monkeypatch.setattr(compiled, "_threads", lambda: 3)
    gen = rng(n)
    datas = [random_array(sh, f32, gen) for sh in ((n, 13), (13,), (n, 1))]
    out, prod = run_program(_rows_program(), *[to_lazyx(d) for d in datas])
    x, y, z = [d.astype(np.float64) for d in datas]
    assert_close(out, np.exp(x + y) * x - z, f32)
    assert_close(prod, y * z, f32)


def test_too_many_dimensions_after_merging_fall_back_to_the_reference(paths):
    # Alternating broadcast dimensions cannot merge: 18 of them exceed the strided path.
    assert cpp.MAX_DIMS < 18
    xs = (2, 1) * 9
    ys = (1, 2) * 9
    gen = rng(5)
    xd, yd = random_array(xs, f32, gen), random_array(ys, f32, gen)
    (out,) = run_program(_axpy_program(), to_lazyx(xd), to_lazyx(yd))
    assert_close(out, xd.astype(np.float64) * yd + xd, f32)
    assert sum(paths.values()) == 0


@pytest.mark.parametrize("how", ["contiguous", "transposed"])
def test_threads_split_loops_of_any_length(how, monkeypatch):
    monkeypatch.setattr(compiled, "PARALLEL_WORK", 1)
    monkeypatch.setattr(compiled, "_threads", lambda: 3)
    x = ir.input(0, f32)
    p = ir.Program([f32], [ir.apply("sin", ir.apply("mul", x, ir.constant(3.0, f32)))])
    for n in (1, 63, 64, 65, 1000, 4099):
        xd = random_array((n, 3), f32, rng(n))
        xa = _view(xd, how) if n > 1 else to_lazyx(xd)
        (out,) = run_program(p, xa)
        assert_close(out, np.sin(xd.astype(np.float64) * 3), f32)


def test_large_loops_use_threads():
    x = ir.input(0, f32)
    p = ir.Program([f32], [ir.apply("exp", ir.apply("neg", x))])
    xd = random_array((1 << 20,), f32, rng(6))
    (out,) = run_program(p, to_lazyx(xd))
    assert_close(out, np.exp(-xd.astype(np.float64)), f32)
    assert compiled._plans[(id(p), ((1 << 20,),))].parallel
    xd = random_array((1 << 12,), f32, rng(6))
    run_program(p, to_lazyx(xd))
    assert not compiled._plans[(id(p), ((1 << 12,),))].parallel


def test_a_program_runs_on_the_reference_backend_by_interpretation(monkeypatch):
    def boom(*args):
        raise AssertionError("the native kernel ran")
    monkeypatch.setattr(compiled, "_call_contiguous", boom)
    xd, yd = random_array((3, 4), f32, rng(7)), random_array((3, 4), f32, rng(8))
    with mx.use_backend("cpu", "cpu-reference"):
        (out,) = run_program(_axpy_program(), to_lazyx(xd), to_lazyx(yd))
    assert_close(out, xd.astype(np.float64) * yd + xd, f32)


def test_multiple_outputs_of_mixed_dtypes():
    x = ir.input(0, mx.int32)
    q = ir.apply("floordiv", x, ir.constant(3, mx.int32))
    p = ir.Program([mx.int32], [q, ir.apply("lt", q, ir.constant(0, mx.int32)),
                                ir.cast(q, mx.float16)])
    xd = random_array((10,), mx.int32, rng(9))
    a, b, c = run_program(p, to_lazyx(xd))
    assert_close(a, xd // 3, mx.int32)
    assert_close(b, xd // 3 < 0, mx.bool_)
    assert_close(c, (xd // 3).astype(np.float16), mx.float16)


@pytest.mark.parametrize("how", ["contiguous", "transposed"])
def test_without_the_call_shim_kernels_are_called_through_ctypes(how, monkeypatch, paths):
    monkeypatch.setattr(jit, "shim", lambda: None)
    xd, yd = random_array((5, 6), f32, rng(10)), random_array((5, 6), f32, rng(11))
    (out,) = run_program(_axpy_program(), _view(xd, how), to_lazyx(yd))
    assert_close(out, xd.astype(np.float64) * yd + xd, f32)
    assert paths["contiguous" if how == "contiguous" else "strided"] == 1
