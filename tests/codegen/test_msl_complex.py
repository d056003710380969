"""complex64 in the MSL renderer (``lazyx.codegen.msl``): float-only, checked on the CPU.

Metal has no double precision, so the renderer's complex functions are computed in
float (the C++ and CUDA renderers compute them in double). Each source is compiled as
C++ through lazyx's MSL shim and run by the Metal backend's launch logic, as in
``test_msl_render.py`` (whose registry walk also covers complex64 against the unfused
CPU graph). Here:

* every function against a float64 (complex128) reference, in ulps of each part: random
  inputs with |z| from 1e-10 to 1e10, near the unit circle and the axes, and hypothesis;
* C99's special values (infinities, NaN, signed zeros, branch cuts) against NumPy's
  complex64 functions (the CPU backend's), signs that C99 leaves unspecified aside;
* NumPy's arithmetic (products, Smith's quotients, integer powers), comparisons, the
  predicates and the casts to and from complex64, exactly;
* the Metal backend, emulated: ``stream=mx.gpu`` element-wise ops and a compiled
  function on complex64 run generated kernels and match the CPU stream.
"""

import itertools
import math

import lazyx.core as mx
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from helpers import emulated_metal_runner
from lazyx.backends.metal import compiled as metal_compiled
from lazyx.backends.metal import msl_cpu
from lazyx.backends.metal.compiled import ShimRunner
from lazyx.codegen import ir, msl

pytestmark = pytest.mark.skipif(not msl_cpu.shim_available(), reason="no C++ compiler")

c64 = mx.complex64
f32 = mx.float32


def run(program, *arrays):
    """``program``'s outputs on NumPy ``arrays``, through the shim (a list)."""
    out = metal_compiled.run_program(program, [np.asarray(a) for a in arrays], ShimRunner())
    assert out is not None, "Metal refused the program"
    return list(out) if isinstance(out, tuple) else [out]


def unary_program(ops, dtype=c64):
    x = ir.input(0, dtype)
    return ir.Program([dtype], [ir.apply(op, x) for op in ops])


# -- references in float64 --------------------------------------------------------------------
def _log1p(z):
    # NumPy's complex128 log1p is log(1 + z): inaccurate for tiny z. Re = log1p(s) / 2 with
    # s = |1 + z|^2 - 1 = 2x + x^2 + y^2, whose terms are exact for float32 parts and summed
    # exactly (fsum), while |1 + z| is near 1; else log|1 + z| (1 + x exact near x = -1,
    # where s cancels to -1).
    x, y = z.real, z.imag
    s = np.array([math.fsum((2 * a, a * a, b * b)) for a, b in zip(x.ravel(), y.ravel())],
                 np.float64).reshape(x.shape)
    with np.errstate(all="ignore"):
        re = np.where(np.abs(s) < 0.5, 0.5 * np.log1p(s), np.log(np.hypot(1 + x, y)))
    return re + 1j * np.arctan2(y, 1 + x)


#: op -> (float64 reference, bound in float32 ulps of each part).
FUNCTIONS = {
    "exp": (np.exp, 3), "log": (np.log, 4), "log10": (np.log10, 5), "log2": (np.log2, 4),
    "log1p": (_log1p, 4), "sqrt": (np.sqrt, 3), "rsqrt": (lambda z: 1 / np.sqrt(z), 8),
    "sin": (np.sin, 4), "cos": (np.cos, 4), "tan": (np.tan, 6),
    "sinh": (np.sinh, 4), "cosh": (np.cosh, 4), "tanh": (np.tanh, 6),
    "asin": (np.arcsin, 4), "acos": (np.arccos, 4), "atan": (np.arctan, 5),
    "asinh": (np.arcsinh, 4), "acosh": (np.arccosh, 4), "atanh": (np.arctanh, 5),
    "abs": (np.abs, 2), "sign": (lambda z: z / np.abs(z), 3),
}


def ulps(got, want):
    """|got - want| in units of float32's spacing at ``want`` (per part for complex)."""
    if np.iscomplexobj(want):
        return np.maximum(ulps(got.real, want.real), ulps(got.imag, want.imag))
    tiny = np.float32(np.finfo(np.float32).tiny)
    with np.errstate(all="ignore"):  # parts beyond float32 are left out by the caller
        spacing = np.spacing(np.maximum(np.abs(want.astype(np.float32)), tiny)).astype(np.float64)
        return np.abs(got.astype(np.float64) - want) / spacing


def _representable(want):
    """Where ``want``'s parts are finite, normal float32 values (or zero): the comparable ones."""
    parts = [want.real, want.imag] if np.iscomplexobj(want) else [want]
    ok = np.ones(want.shape, bool)
    for p in parts:
        a = np.abs(p)
        ok &= np.isfinite(p) & ((a == 0) | ((a >= np.finfo(np.float32).tiny) & (a < 3e38)))
    return ok


def check_functions(z, ops=tuple(FUNCTIONS), slack=0.0):
    """Run ``ops`` on complex64 ``z`` and compare each with its reference; the max ulps."""
    outs = run(unary_program(ops), z)
    wide = z.astype(np.complex128)
    worst = {}
    for op, got in zip(ops, outs):
        ref, bound = FUNCTIONS[op]
        with np.errstate(all="ignore"):
            want = ref(wide)
        ok = _representable(want)
        u = ulps(got, want)
        u = np.where(ok, u, 0.0)
        worst[op] = float(u.max())
        k = int(u.argmax())
        assert u[k] <= bound + slack, (f"{op}({z[k]!r}) = {got[k]!r}, want {want[k]!r}: "
                                       f"{u[k]:.1f} ulps > {bound}")
    return worst


def _inputs(n=4000, seed=0):
    gen = np.random.default_rng(seed)
    magnitude = 10 ** gen.uniform(-10, 10, n)
    angle = gen.uniform(-np.pi, np.pi, n)
    polar = magnitude * np.exp(1j * angle)
    box = gen.uniform(-4, 4, n) + 1j * gen.uniform(-4, 4, n)
    circle = np.exp(1j * gen.uniform(-np.pi, np.pi, n)) * (1 + gen.normal(0, 1e-4, n))
    near_one = 1 + gen.normal(0, 1e-3, n) + 1j * gen.normal(0, 1e-3, n)
    axes = np.concatenate([gen.uniform(-3, 3, n // 4) + 1j * 10 ** gen.uniform(-9, -3, n // 4),
                           10 ** gen.uniform(-9, -3, n // 4) + 1j * gen.uniform(-3, 3, n // 4)])
    return np.concatenate([polar, box, circle, near_one, axes]).astype(np.complex64)


# -- the source ----------------------------------------------------------------------------------
def test_complex64_renders_as_a_float_pair_without_double():
    x, y = ir.input(0, c64), ir.input(1, mx.float16)
    p = ir.Program([c64, mx.float16], [ir.apply("exp", ir.apply("mul", x, ir.cast(y, c64))),
                                       ir.apply("abs", x), ir.cast(x, mx.bfloat16)])
    assert msl.supports(p) is None
    src = msl.render(p, (False, True))
    assert "device const c64* p0 [[buffer(0)]]" in src and "device float* o1" in src
    assert "device bfloat* o2" in src and "lx_cast<c64>(s1)" in src
    for word in ("double", "LL)", "std::"):
        assert word not in src, word


# -- accuracy against float64 ----------------------------------------------------------------------
def test_functions_are_within_a_few_ulps_of_float64():
    worst = check_functions(_inputs())
    assert set(worst) == set(FUNCTIONS)


@pytest.mark.parametrize("op", ["log", "log1p", "atanh", "atan", "asinh", "acos"])
def test_cancellation_near_the_unit_circle_and_the_axes(op):
    # |z| within a few ulps of 1, and z near -1 for log1p: where a float sum x*x + y*y - 1
    # (or 2x + x*x + y*y) would cancel. Also points just off the branch cuts.
    gen = np.random.default_rng(5)
    t = gen.uniform(-np.pi, np.pi, 3000)
    z = np.exp(1j * t).astype(np.complex64)
    z = np.concatenate([z, (z * np.float32(1 + 2 ** -22)).astype(np.complex64),
                        (z * np.float32(1 - 2 ** -23)).astype(np.complex64)])
    if op == "log1p":
        z = (z - 1).astype(np.complex64)
    cuts = np.array([2 + 1e-7j, 2 - 1e-7j, -2 + 1e-7j, 1e-7 + 2j, -1e-7 + 2j, -1e-7 - 2j,
                     1 + 1e-20j, -1 - 1e-20j, 1e-20 + 1j, 0.5 + 0j, -0.5 - 0j], np.complex64)
    check_functions(np.concatenate([z, cuts]), (op,))


_FLOAT = st.floats(min_value=float(np.float32(1e-10)), max_value=float(np.float32(1e10)),
                   width=32)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(_FLOAT, _FLOAT, st.booleans(), st.booleans(), st.booleans()),
                min_size=1, max_size=32))
# z = -1 + 1e-8j: 1 + z = 1e-8j, where the reference's |1 + z|^2 - 1 cancels to -1.
@example([(1.0, float(np.float32(1e-8)), True, False, False)])
def test_functions_on_random_complex_inputs(parts):
    z = np.array([complex(-a if sa else a, -b if sb else b) if not zero else complex(a, 0.0)
                  for a, b, sa, sb, zero in parts], np.complex64)
    check_functions(z)


# -- special values --------------------------------------------------------------------------------
_SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 100.0, -100.0, 1e30, -1e30, np.inf, -np.inf, np.nan]
_NUMPY = {"exp": np.exp, "log": np.log, "log10": np.log10, "sqrt": np.sqrt, "sin": np.sin,
          "cos": np.cos, "tan": np.tan, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh,
          "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "asinh": np.arcsinh,
          "acosh": np.arccosh, "atanh": np.arctanh, "abs": np.abs}


def _same_part(got, want, signed):
    if np.isnan(want):
        return bool(np.isnan(got))
    if np.isinf(want) or want == 0:
        return abs(got) == abs(want) and (not signed or np.signbit(got) == np.signbit(want))
    return abs(float(got) - float(want)) <= 1e-5 * abs(float(want))


def test_special_values_follow_c99_as_numpy_does():
    pairs = list(itertools.product(_SPECIAL, _SPECIAL))
    z = np.zeros(len(pairs), np.complex64)
    z.real, z.imag = np.array(pairs, np.float32).T
    outs = run(unary_program(list(_NUMPY)), z)
    bad = []
    for (op, ref), got in zip(_NUMPY.items(), outs):
        with np.errstate(all="ignore"):
            want = ref(z)
        for k in range(len(z)):
            if op == "exp" and 0 < np.abs(want[k]) < 1e-37:
                continue  # a subnormal result (Metal flushes them)
            if want.dtype.kind == "f":
                ok = _same_part(got[k], want[k], True)
            else:
                # C99 leaves the sign of a zero or infinite part unspecified when the other
                # part is NaN (csinh(inf + i inf) = +-inf + i NaN, ...).
                signed = not (np.isnan(want[k].real) or np.isnan(want[k].imag))
                ok = (_same_part(got[k].real, want[k].real, signed) and
                      _same_part(got[k].imag, want[k].imag, signed))
            if not ok:
                bad.append(f"{op}({z[k]}) = {got[k]}, NumPy gives {want[k]}")
    assert not bad, "\n".join(bad[:20])


# -- NumPy's arithmetic, comparisons, predicates and casts -----------------------------------------
def _pairs(n=512, seed=3):
    gen = np.random.default_rng(seed)
    a = (gen.normal(0, 3, n) + 1j * gen.normal(0, 3, n)).astype(np.complex64)
    b = (gen.normal(0, 3, n) + 1j * gen.normal(0, 3, n)).astype(np.complex64)
    a[:8] = [1 + 2j, -3 + 0.5j, 1 + 1j, 0j, 2 - 1j, np.nan, complex(np.inf, 1), 1]
    b[:8] = [0j, 0j, 3 - 4j, 0j, 1e-30 + 1e30j, 1, 1, 1]
    b[8:16] = a[8:16]  # equal pairs
    return a, b


def test_arithmetic_and_comparisons_are_numpys():
    a, b = _pairs()
    x, y = ir.input(0, c64), ir.input(1, c64)
    exact = ["add", "sub", "eq", "ne", "lt", "le", "gt", "ge", "max", "min"]
    unary = ["neg", "conj", "real", "imag", "isnan", "isinf", "isfinite", "not"]
    p = ir.Program([c64, c64], [ir.apply(op, x, y) for op in exact] +
                   [ir.apply(op, x) for op in unary] +
                   [ir.apply("mul", x, y), ir.apply("square", x), ir.apply("div", x, y)])
    got = run(p, a, b)
    with np.errstate(all="ignore"):
        want = [a + b, a - b, a == b, a != b, a < b, a <= b, a > b, a >= b, np.maximum(a, b),
                np.minimum(a, b), -a, np.conj(a), a.real, a.imag, np.isnan(a), np.isinf(a),
                np.isfinite(a), a == 0]
    for name, g, w in zip(exact + unary, got, want):
        assert g.dtype == w.dtype, name
        np.testing.assert_array_equal(g, w, err_msg=name)  # bit for bit (NaN where NumPy's)
    # Products and quotients: NumPy's formulas (NumPy's own SIMD loops may fuse the
    # multiply-adds, so the last bit differs): within 2 ulps of |a| |b| (4 of |a| / |b|), and
    # NumPy's infinities and NaNs, also for division by zero.
    aw, bw = a.astype(np.complex128), b.astype(np.complex128)
    with np.errstate(all="ignore"):
        cases = [("mul", a * b, aw * bw, 2 * np.abs(aw) * np.abs(bw)),
                 ("square", a * a, aw * aw, 2 * np.abs(aw) ** 2),
                 ("div", a / b, aw / bw, 4 * np.abs(aw) / np.abs(bw))]  # Smith's: a few more
    for (name, np_result, w, scale), g in zip(cases, got[len(want):]):
        assert g.dtype == np.complex64, name
        finite = np.isfinite(np_result)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(np_result), err_msg=name)
        np.testing.assert_array_equal(g[~finite], np_result[~finite], err_msg=name)
        err = np.abs(g[finite] - w[finite])
        assert np.all(err <= 2.0 ** -24 * scale[finite]), name


def test_integer_powers_are_numpys_products():
    a, _ = _pairs(64)
    a = a[8:]
    x, y = ir.input(0, c64), ir.input(1, c64)
    p = ir.Program([c64, c64], [ir.apply("pow", x, y)])
    for n in (0, 1, 2, 3, 4, 7, -1, -2, -5, 12):
        (got,) = run(p, a, np.full_like(a, n))
        want = a ** np.complex64(n)
        if n >= 0:
            np.testing.assert_array_equal(got, want, err_msg=f"z ** {n}")  # the same products
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"z ** {n}")
    # Gaussian integers: exact
    (got,) = run(p, np.array([1 + 1j, 2 - 1j, -3j], np.complex64), np.full(3, 2, np.complex64))
    np.testing.assert_array_equal(got, np.array([2j, 3 - 4j, -9], np.complex64))
    # zero bases and zero exponents, NumPy's cases
    (got,) = run(p, np.array([0j, 0j, 0j, 2 + 1j], np.complex64),
                 np.array([2, -1, 1j, 0], np.complex64))
    assert got[0] == 0 and np.isnan(got[1].real) and np.isnan(got[2].imag) and got[3] == 1


def test_non_integer_powers_are_exp_of_b_log_a():
    # exp(b log a) in float: its error grows with |b log a| (as MLX's and glibc's cpowf).
    gen = np.random.default_rng(9)
    a = (gen.uniform(-4, 4, 2000) + 1j * gen.uniform(-4, 4, 2000)).astype(np.complex64)
    b = (gen.uniform(-3, 3, 2000) + 1j * gen.uniform(-3, 3, 2000)).astype(np.complex64)
    x, y = ir.input(0, c64), ir.input(1, c64)
    (got,) = run(ir.Program([c64, c64], [ir.apply("pow", x, y)]), a, b)
    aw, bw = a.astype(np.complex128), b.astype(np.complex128)
    want = aw ** bw
    t = np.abs(bw * np.log(aw))
    err = np.abs(got - want) / np.abs(want)
    assert np.all(err <= (4 + 2 * t) * 2.0 ** -24), float((err / (2.0 ** -24 * (4 + 2 * t))).max())


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, f32, mx.int8, mx.uint32, mx.int64,
                                   mx.bool_], ids=lambda d: d.name)
def test_casts_to_and_from_complex64(dtype):
    gen = np.random.default_rng(4)
    from helpers import random_array
    xs = random_array((64,), dtype, gen, -50, 50)
    x = ir.input(0, dtype)
    (up,) = run(ir.Program([dtype], [ir.cast(x, c64)]), xs)
    np.testing.assert_array_equal(up, np.array(mx.astype(mx.array(xs), c64, stream=mx.cpu)))
    zs = (gen.uniform(-50, 50, 64) + 1j * gen.uniform(-50, 50, 64)).astype(np.complex64)
    z = ir.input(0, c64)
    (down,) = run(ir.Program([c64], [ir.cast(z, dtype)]), zs)
    want = np.array(mx.astype(mx.array(zs), dtype, stream=mx.cpu))
    np.testing.assert_array_equal(down.view(np.uint16) if dtype is mx.bfloat16 else down,
                                  want.view(np.uint16) if dtype is mx.bfloat16 else want)


# -- the Metal backend, emulated ---------------------------------------------------------------------
@pytest.fixture
def on_metal():
    """The Metal backend, emulated on the CPU, as the active GPU backend; its shim runner."""
    yield from emulated_metal_runner()


def _close(got, want, msg):
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=2e-5, atol=1e-6, err_msg=msg)


def test_gpu_stream_element_wise_ops_on_complex64_run_generated_kernels(on_metal):
    gen = np.random.default_rng(6)
    zd = (gen.uniform(-3, 3, (4, 6)) + 1j * gen.uniform(-3, 3, (4, 6))).astype(np.complex64)
    wd = (gen.uniform(-3, 3, (6,)) + 1j * gen.uniform(-3, 3, (6,))).astype(np.complex64)
    z, w = mx.array(zd), mx.array(wd)
    h = mx.array(gen.uniform(-3, 3, (4, 6)).astype(np.float16))
    mx.eval(z, w, h)
    ops = {
        "add": lambda s: mx.add(z, w, stream=s), "multiply": lambda s: mx.multiply(z, w, stream=s),
        "divide": lambda s: mx.divide(z, w, stream=s), "exp": lambda s: mx.exp(z, stream=s),
        "log": lambda s: mx.log(z, stream=s), "sqrt": lambda s: mx.sqrt(z, stream=s),
        "abs": lambda s: mx.abs(z, stream=s), "real": lambda s: mx.real(z, stream=s),
        "imag": lambda s: mx.imag(z, stream=s), "conj": lambda s: mx.conj(z, stream=s),
        "arctanh": lambda s: mx.arctanh(z, stream=s), "power": lambda s: mx.power(z, w, stream=s),
        "equal": lambda s: mx.equal(z, w, stream=s), "isnan": lambda s: mx.isnan(z, stream=s),
        "to complex": lambda s: mx.astype(h, c64, stream=s),
        "to float16": lambda s: mx.astype(z, mx.float16, stream=s),
    }
    before = dict(metal_compiled.stats)
    for name, op in ops.items():
        on_metal.launches.clear()
        got = op(mx.gpu)
        mx.eval(got)
        assert on_metal.launches, f"{name}: no generated kernel ran"
        cpu = op(mx.cpu)
        assert got.dtype == cpu.dtype, name
        _close(got, cpu, f"{name}: Metal vs CPU stream")
    assert metal_compiled.stats["fallbacks"] == before["fallbacks"]


def test_compiled_complex_function_fuses_on_metal(on_metal):
    def fn(z, x):
        u = mx.exp(z * 0.5) + mx.astype(x, c64)
        return mx.abs(mx.sqrt(u) / (z - 1j)), mx.conj(mx.tanh(u))

    gen = np.random.default_rng(7)
    zd = (gen.uniform(-2, 2, (5, 6)) + 1j * gen.uniform(-2, 2, (5, 6))).astype(np.complex64)
    xd = gen.uniform(-2, 2, (6,)).astype(np.float32)
    z, x = mx.array(zd), mx.array(xd)
    compiled = mx.compile(fn)
    before = dict(metal_compiled.stats)
    with mx.stream(mx.gpu):
        got = compiled(z, x)
        mx.eval(got)
    assert ("lx_strided", 30) in on_metal.launches  # x broadcasts
    kinds = [type(n.prim).__name__ for e in compiled.cache.entries.values()
             for n in e.run_tape.nodes]
    assert "Compiled" in kinds
    assert metal_compiled.stats["fallbacks"] == before["fallbacks"]
    with mx.stream(mx.cpu):
        cpu = fn(z, x)
    for g, c in zip(got, cpu):
        assert g.dtype == c.dtype
        _close(g, c, "compiled complex function: Metal vs CPU stream")
