"""The Metal backend's creation kernels (backends/metal/kernels/creation.py) and the
reductions that are not folds (kernels/reductions.py: ``Median``, ``NumberOfElements``,
``AllClose``, ``ArrayEqual``).

Two levels, as tests/backends/test_metal_kernels.py and test_metal_backend.py:

* each launcher through lazyx's MSL shim (:func:`run_on_cpu`), in both thread orders,
  against the CPU backend's kernel (bit for bit where the module docstring says so) and
  NumPy (float64 references for floats);
* the backend under ``emulate_on_cpu`` (``stream=mx.gpu``) against the CPU stream,
  counted in ``stats["builtin"]`` with no CPU fallback.
"""

import math

import lazyx.core as mx
import ml_dtypes
import numpy as np
import pytest
from helpers import rng
from lazyx import dtypes as ldt
from lazyx.backends import metal
from lazyx.backends.cpu.kernels import creation as cpu_creation
from lazyx.backends.cpu.kernels import elementwise as cpu_elementwise
from lazyx.backends.cpu.kernels import reductions as cpu_reductions
from lazyx.backends.metal.kernels import UnsupportedDtype, creation, reductions
from lazyx.backends.metal.msl_cpu import shim_available
from lazyx.errors import DtypeError
from lazyx.plugins import creation as cr
from lazyx.plugins import elementwise as ew
from lazyx.plugins import reductions as rd
from test_metal_backend import on_fake_gpu, on_metal  # noqa: F401 - the backend, stats at zero
from test_metal_kernels import layout, run, run_reversed  # views; the shim runners

pytestmark = pytest.mark.skipif(not shim_available(), reason="no C++ compiler for the MSL shim")

S = mx.default_stream(mx.cpu)
F64 = np.float64
RUNNERS = [run, run_reversed]
DTYPES = [d.name for d in creation.DTYPES]
FLOATS = ("float32", "float16", "bfloat16")
#: Half the spacing of each float dtype at 1 (one rounding, relative).
ROUNDING = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


def _dtype(name):
    return ldt.to_dtype(name)


def _cpu(module, primitive, inputs=()):
    with np.errstate(all="ignore"):
        return module.KERNELS[type(primitive)](primitive, list(inputs))


def same_bits(got, want, where=""):
    """The CPU kernel's output exactly: dtype, shape and bytes."""
    want = np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, \
        f"{where}: {got.dtype}{got.shape}, the CPU's {want.dtype}{want.shape}"
    if not np.array_equal(*(np.ascontiguousarray(a).reshape(-1).view(np.uint8)
                            for a in (got, want))):
        bad = np.nonzero(got.reshape(-1) != want.reshape(-1))[0][:4]
        raise AssertionError(f"{where}: at {bad} got {got.reshape(-1)[bad]}, the CPU's "
                             f"{want.reshape(-1)[bad]}")


def within_rounding(got, reference, dtype, where=""):
    """``got`` is ``reference`` (float64) rounded once to ``dtype``, give or take one rounding
    (the CPU's float64 steps)."""
    g = got.astype(F64)
    tiny = float(ml_dtypes.finfo(_dtype(dtype).np).smallest_subnormal)
    tol = 2 * ROUNDING[dtype] * np.abs(reference) + tiny
    bad = ~(np.abs(g - reference) <= tol)
    assert not bad.any(), f"{where}: got {g[bad][:4]}, float64 {reference[bad][:4]}"


# -- Arange, Linspace ---------------------------------------------------------------------------
# (start, stop, step): fractional and negative steps, integer arguments, empty ranges, an
# integer dtype given float arguments (truncated first, as MLX), a long range.
ARANGES = [(0, 10, 1), (-7, 40, 3), (-1.3, 2.3, 0.1), (5, -3, -0.37), (0.5, 100, 1 / 3),
           (3, 3, 1), (5, 1, 1), (2.7, 19.2, 2.5), (-1e4, 1e4, 7.77), (0, 5000, 1)]
# (start, stop, num, endpoint): linspace(0, 3, 10)'s 3 * (1/3) rounds to 1 in float64 (its
# integer output is 1, where float32 arithmetic gives 0.99999994), one point, none,
# descending, tiny and huge scales.
LINSPACES = [(0, 3, 10, True), (-1.5, 2.0, 37, True), (0, 1, 7, False), (5, -3, 9, True),
             (2.0, 7.0, 1, True), (2.0, 7.0, 1, False), (1.0, 2.0, 0, True), (-0.0, 1.0, 1, True),
             (1e-3, 7.3, 101, True), (-3e30, 7e29, 64, True), (1e-30, 2e-30, 5, False),
             (0, 1000, 3001, True)]


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "bool"])
def test_arange_bit_for_bit(dtype):
    d = _dtype(dtype)
    for k, (start, stop, step) in enumerate(ARANGES):
        p = cr.Arange(S, start, stop, step, d)
        got = creation.arange(p, [], RUNNERS[k % 2])
        where = f"arange({start}, {stop}, {step}) {dtype}"
        same_bits(got, _cpu(cpu_creation, p), where)
        n = max(math.ceil((stop - start) / step), 0)
        if d.kind in "iu":    # NumPy's integer arange, wrapped to the dtype
            expected = (int(start) + np.arange(n, dtype=np.int64) * int(step)).astype(d.np)
            np.testing.assert_array_equal(got, expected, err_msg=where)
        else:
            with np.errstate(over="ignore"):
                reference = start + np.arange(n, dtype=F64) * step
            finite = np.abs(reference) < float(ml_dtypes.finfo(d.np).max) / 2
            within_rounding(got[finite], reference[finite], dtype, where)


@pytest.mark.parametrize("dtype", DTYPES)
def test_linspace_bit_for_bit(dtype):
    d = _dtype(dtype)
    for k, (start, stop, num, endpoint) in enumerate(LINSPACES):
        p = cr.Linspace(S, float(start), float(stop), num, endpoint, d)
        got = creation.linspace(p, [], RUNNERS[k % 2])
        where = f"linspace({start}, {stop}, {num}, {endpoint}) {dtype}"
        cpu = _cpu(cpu_creation, p)
        reference = np.linspace(start, stop, num, endpoint=endpoint, dtype=F64)
        if d.kind == "f":
            finite = np.abs(reference) < float(ml_dtypes.finfo(d.np).max) / 2
            within_rounding(got[finite], reference[finite], dtype, where)
        elif d.kind != "b":     # truncated; NumPy leaves values out of range undefined
            info = np.iinfo(d.np)
            fits = (reference > info.min - 1) & (reference < info.max + 1)
            np.testing.assert_array_equal(got[fits], np.trunc(reference[fits]).astype(d.np),
                                          err_msg=where)
            same_bits(got[fits], cpu[fits], where)
            continue
        same_bits(got, cpu, where)


def test_random_ranges_bit_for_bit():
    # Random scales from 1e-30 to 1e30: every rounding of the emulated float64 (subnormal
    # float16 outputs, overflow to infinity, truncation to integers) is the CPU's.
    gen = rng(60)
    for trial in range(60):
        d = _dtype(gen.choice(["float32", "float16", "bfloat16", "int32", "int8", "bool"]))
        scale = 10.0 ** int(gen.integers(-30, 30)) if d.kind == "f" else 100.0
        a, b = (float(v) for v in gen.uniform(-1, 1, 2) * scale)
        p = cr.Linspace(S, a, b, int(gen.integers(0, 200)), bool(gen.random() < 0.7), d)
        same_bits(creation.linspace(p, [], RUNNERS[trial % 2]), _cpu(cpu_creation, p), repr(p))
        if d.kind != "b":
            step = float(gen.uniform(-1, 1)) * scale / 37 or 1.0
            p = cr.Arange(S, a, a + step * int(gen.integers(0, 300)), step, d)
            same_bits(creation.arange(p, [], RUNNERS[trial % 2]), _cpu(cpu_creation, p), repr(p))


def test_soft_double_matches_numpy_float64():
    # The emulation itself: start + i * step in float64, two roundings, and the one
    # conversion to float16 (subnormals and all) and to int64 by truncation.
    gen = rng(61)
    for _ in range(20):
        scale = 10.0 ** int(gen.integers(-300, 300))
        start = float(gen.normal()) * scale
        step = float(gen.normal()) * scale * 10.0 ** -int(gen.integers(0, 8))
        p = cr.Arange(S, start, start + 299.5 * step, step, ldt.float32)
        assert p.output_shapes(())[0] == (300,)
        got = creation.arange(p, [], run)
        expected = (start + np.arange(300, dtype=F64) * step).astype(np.float32)
        np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_float64_raises_and_complex_falls_back():
    for p in (cr.Arange(S, 0, 3, 1, ldt.float64), cr.Linspace(S, 0.0, 1.0, 3, True, ldt.float64),
              cr.Eye(S, 2, 2, 0, ldt.float64), cr.Fill(S, (2,), ldt.float64, 1)):
        with pytest.raises(DtypeError, match="float64"):
            creation.KERNELS[type(p)](p, [], run)
    for p in (cr.Arange(S, 0, 3, 1, ldt.complex64), cr.Fill(S, (2,), ldt.complex64, 1),
              cr.Linspace(S, 0.0, math.inf, 3, True, ldt.float32)):
        with pytest.raises(UnsupportedDtype):
            creation.KERNELS[type(p)](p, [], run)


# -- Eye, Tri ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_eye_and_tri(dtype):
    d = _dtype(dtype)
    for n, m in ((5, 7), (7, 5), (1, 1), (0, 4), (33, 18)):
        for k in (-40, -8, -5, -1, 0, 1, 3, 6, 40, 10 ** 12, -(10 ** 12)):
            for cls, launcher, fn in ((cr.Eye, creation.eye, np.eye), (cr.Tri, creation.tri, np.tri)):
                p = cls(S, n, m, k, d)
                got = launcher(p, [], RUNNERS[k % 2])
                where = f"{cls.__name__}({n}, {m}, k={k}) {dtype}"
                same_bits(got, _cpu(cpu_creation, p), where)
                np.testing.assert_array_equal(got, fn(n, m, k, dtype=d.np), err_msg=where)


# -- Window ------------------------------------------------------------------------------------
#: The most float32 ulps each window is from the CPU's (module docstring).
WINDOW_ULPS = {"bartlett": 1, "hanning": 3, "hamming": 3, "blackman": 4}


@pytest.mark.parametrize("kind", sorted(WINDOW_ULPS))
def test_windows(kind):
    fn = {"bartlett": np.bartlett, "blackman": np.blackman, "hamming": np.hamming,
          "hanning": np.hanning}[kind]
    for k, m in enumerate((0, 1, 2, 3, 4, 10, 33, 1000, 4097)):
        p = cr.Window(S, kind, m)
        got = creation.window(p, [], RUNNERS[k % 2])
        want = _cpu(cpu_creation, p)
        assert got.dtype == np.float32 and got.shape == (m,)
        reference = np.maximum(fn(m), 0.0)
        ulp = np.spacing(np.abs(want)).astype(F64)
        err = np.abs(got.astype(F64) - want.astype(F64))
        assert (err <= WINDOW_ULPS[kind] * ulp).all(), f"{kind}({m}): {err.max()} off"
        # symmetric, and the float64 window within its ulps at every point
        np.testing.assert_array_equal(got, got[::-1])
        assert (np.abs(got.astype(F64) - reference) <= (WINDOW_ULPS[kind] + 0.5) * ulp).all()


# -- Fill, Full, FullLike ----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_fill_and_full(dtype):
    d = _dtype(dtype)
    values = (0, 1, True, 7) if d.kind in "bu" else (0, -3, 2.5, 100)
    if d.kind == "f":
        values += (-0.0, 1e40, math.nan)
    for k, value in enumerate(values):
        for shape in ((), (0, 3), (4, 33)):
            p = cr.Fill(S, shape, d, value)
            same_bits(creation.fill(p, [], RUNNERS[k % 2]), _cpu(cpu_creation, p), f"fill {value}")
    gen = rng(62)
    v = gen.integers(0, 9, (33,)).astype(d.np)
    for shape in ((4, 33), (2, 3, 33), (33,)):
        p = cr.Full(S, shape)
        got = creation.full(p, [v], run_reversed)
        same_bits(got, _cpu(cpu_creation, p, [v]), f"full {shape}")
        np.testing.assert_array_equal(got, np.broadcast_to(v, shape))
    a = np.zeros((5, 33), np.float32)
    for values in (v, v.reshape(1, 33), v[:1]):
        p = cr.FullLike(S)
        same_bits(creation.full_like(p, [a, values], run), _cpu(cpu_creation, p, [a, values]),
                  f"full_like {values.shape}")


def test_fill_value_out_of_range_raises_as_the_cpu():
    p = cr.Fill(S, (3,), ldt.uint8, -1)
    with pytest.raises(OverflowError):
        _cpu(cpu_creation, p)
    with pytest.raises(OverflowError):
        creation.fill(p, [], run)


# -- Median ------------------------------------------------------------------------------------
# (shape, axes, layout): one element, odd and even rows, strided views, several axes (a view
# or a copy), a row past one sort block (merge passes).
MEDIAN_LAYOUTS = [((1,), (0,), "contiguous"), ((7,), (0,), "contiguous"),
                  ((6, 33), (1,), "contiguous"), ((33, 6), (0,), "contiguous"),
                  ((6, 45), (1,), "transposed"), ((9, 40), (0,), "sliced"),
                  ((4, 6, 9), (0, 2), "contiguous"), ((4, 5, 6), (1, 2), "contiguous"),
                  ((5, 8), (0, 1), "contiguous"), ((2, 2500), (1,), "contiguous")]


@pytest.mark.parametrize("dtype", FLOATS)
def test_median(dtype):
    gen = rng(63)
    npd = _dtype(dtype).np
    for k, (shape, axes, how) in enumerate(MEDIAN_LAYOUTS):
        x = gen.normal(size=shape).astype(npd)
        if k % 3 == 2:      # ties, and a NaN in one row
            x = np.round(x * 2).astype(npd)
            x.reshape(-1)[min(5, x.size - 1)] = np.nan
        x = layout(x, how)
        for keepdims in (False, True):
            p = rd.Median(S, axes, keepdims)
            got = reductions.median(p, [x], RUNNERS[k % 2])
            where = f"median {dtype} {shape} {axes} {how}"
            want = _cpu(cpu_reductions, p, [x])
            # values (a zero's sign is NumPy's partition's choice among equal values)
            assert got.dtype == want.dtype and got.shape == want.shape, where
            np.testing.assert_array_equal(got, want, err_msg=where)
            with np.errstate(invalid="ignore"):
                reference = np.median(x.astype(F64), axis=axes, keepdims=keepdims)
            nan = np.isnan(reference)
            np.testing.assert_array_equal(np.isnan(got), nan, err_msg=where)
            within_rounding(got[~nan], reference[~nan], dtype, where)


def test_median_empty_rows_and_infinities():
    x = np.zeros((3, 0), np.float32)
    got = reductions.median(rd.Median(S, (1,), False), [x], run)
    assert got.shape == (3,) and np.isnan(got).all()
    x = np.array([[np.inf, -np.inf, 1.0, 2.0], [np.inf, np.inf, 1.0, -1.0]], np.float32)
    p = rd.Median(S, (1,), False)
    same_bits(reductions.median(p, [x], run), _cpu(cpu_reductions, p, [x]), "infinities")


# -- NumberOfElements --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_number_of_elements(dtype):
    d = _dtype(dtype)
    for shape, axes in (((3, 4, 5), (0, 2)), ((7,), (0,)), ((2, 0, 3), (1,)), ((3, 1000), (0, 1))):
        x = np.zeros(shape, np.float32)
        for inverted in (False, True):
            p = rd.NumberOfElements(S, axes, inverted, d)
            try:
                want = _cpu(cpu_reductions, p, [x])
            except (OverflowError, ValueError):     # NumPy refuses the value for this dtype
                with pytest.raises(UnsupportedDtype):
                    reductions.number_of_elements(p, [x], run)
                continue
            same_bits(reductions.number_of_elements(p, [x], run), want,
                      f"{shape} {axes} inverted={inverted}")


# -- AllClose, ArrayEqual ----------------------------------------------------------------------
def _pair(gen, shape_a, shape_b, npd, close: bool):
    """``a`` of ``shape_a`` and ``b`` of ``shape_b`` (broadcast against it), near each other
    (``close``) or not (every 7th element of ``a`` moved, floats a little everywhere)."""
    b = (gen.normal(size=shape_b) * 4).astype(npd)
    a = (b.astype(F64) + gen.normal(size=shape_a) * (1e-7 if close else 1e-1)).astype(npd)
    if not close and a.size:
        flat = a.reshape(-1)
        flat[::7] = ~flat[::7] if npd == np.bool_ else flat[::7] + 3
    return a, b


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32", "uint8", "int16",
                                   "bool"])
def test_allclose(dtype):
    gen = rng(64)
    npd = _dtype(dtype).np
    answers = set()
    shapes = [((6, 33), (33,)), ((3, 2, 4), (2, 1)), ((70, 70), (70, 70)), ((0, 3), (3,)),
              ((5000,), (5000,))]      # 5000: two chunks, folded by the row kernel
    for k, (sa, sb) in enumerate(shapes):
        for close in (True, False):
            a, b = _pair(gen, sa, sb, npd, close)
            if dtype in ("float32", "float16") and a.size and k % 2:
                a.reshape(-1)[-1] = b.reshape(-1)[-1] = np.nan   # the last element: NaN
            for equal_nan in (False, True):
                for rtol, atol in ((1e-5, 1e-8), (1e-2, 0.0), (0.0, 0.5), (1e-3, 1e-3)):
                    p = ew.AllClose(S, rtol, atol, equal_nan)
                    got = reductions.allclose(p, [a, b], RUNNERS[k % 2])
                    want = _cpu(cpu_elementwise, p, [a, b])
                    assert got.shape == () and got.dtype == np.bool_
                    assert got == want, f"allclose {dtype} {sa} {sb} {rtol} {atol} {equal_nan}"
                    answers.add(bool(want))
    assert answers == {True, False}


def test_allclose_of_integers_rounds_in_float64():
    # Pairs where isclose computed in float32 would disagree with NumPy's float64: the
    # kernel's emulated float64 must not.
    # x at distance round(rtol |y|) from y: on the boundary, where the roundings decide.
    y = np.concatenate([np.arange(1, 20000), -np.arange(1, 20000)]).astype(np.int32)
    checked = 0
    for rtol in (0.1, 0.3, 1 / 3, 3e-4, 7.1e-5):
        x = (y - np.rint(rtol * y)).astype(np.int32)
        with np.errstate(all="ignore"):
            in64 = np.abs(x - y.astype(F64)) <= 0.0 + rtol * np.abs(y.astype(F64))
            y32 = y.astype(np.float32)
            in32 = np.abs(x.astype(np.float32) - y32) <= np.float32(rtol) * np.abs(y32)
        for i in np.nonzero(in64 != in32)[0][:6].tolist() + [0, 1]:
            p = ew.AllClose(S, rtol, 0.0, False)
            a, b = x[i:i + 1], y[i:i + 1]
            assert reductions.allclose(p, [a, b], run) == _cpu(cpu_elementwise, p, [a, b]) \
                == bool(in64[i]), (int(a[0]), int(b[0]), rtol)
            checked += 1
    assert checked > 8


@pytest.mark.parametrize("dtype", DTYPES)
def test_array_equal(dtype):
    gen = rng(66)
    d = _dtype(dtype)
    for k, shape in enumerate(((), (0, 4), (7,), (33, 5), (4100,))):
        a = (gen.integers(0, 2, shape) if d.kind == "b" else gen.integers(-9, 9, shape)).astype(d.np)
        b = a.copy()
        for equal_nan in (False, True):
            p = ew.ArrayEqual(S, equal_nan)
            assert reductions.array_equal(p, [a, layout(b, "contiguous")], RUNNERS[k % 2])
            if a.size:      # one element differs: the first, then the last
                for at in (0, -1):
                    c = b.copy()
                    c.reshape(-1)[at] = not c.reshape(-1)[at] if d.kind == "b" else \
                        c.reshape(-1)[at] + 1
                    got = reductions.array_equal(p, [a, c], RUNNERS[k % 2])
                    assert got == _cpu(cpu_elementwise, p, [a, c]) == np.False_
            if d.kind == "f" and a.size:
                c, e = a.copy(), a.copy()
                c.reshape(-1)[-1] = e.reshape(-1)[-1] = np.nan
                got = reductions.array_equal(p, [c, e], run)
                assert got == _cpu(cpu_elementwise, p, [c, e]) == np.bool_(equal_nan)


def test_transposed_operands():
    x = rng(67).normal(size=(40, 45)).astype(np.float32)
    xt = np.ascontiguousarray(x.T).T
    assert reductions.array_equal(ew.ArrayEqual(S, False), [x, xt], run)
    assert reductions.allclose(ew.AllClose(S, 1e-5, 1e-8, False), [xt, x[:1]], run) == \
        _cpu(cpu_elementwise, ew.AllClose(S, 1e-5, 1e-8, False), [xt, x[:1]])


# -- through the backend (emulated), stream=mx.gpu ---------------------------------------------
def _ops():
    x = mx.array(rng(68).normal(size=(6, 33)).astype(np.float32))
    y = mx.array(np.asarray(x) * np.float32(1 + 1e-7))
    return [
        lambda: mx.arange(-1.3, 2.3, 0.1), lambda: mx.arange(-7, 40, 3),
        lambda: mx.arange(5, -3, -0.37, dtype=mx.float16),
        lambda: mx.linspace(0, 3, 10, dtype=mx.int32), lambda: mx.linspace(-1.5, 2.0, 37),
        lambda: mx.eye(5, 7, k=1), lambda: mx.tri(6, 4, k=-1), lambda: mx.zeros((3, 4)),
        lambda: mx.ones((2, 5), dtype=mx.int8), lambda: mx.full((4, 33), x[0]),
        lambda: mx.full((2, 3), 2.5), lambda: mx.hanning(33), lambda: mx.bartlett(12),
        lambda: mx.median(x, axis=1), lambda: mx.median(x, axis=(0, 1)),
        lambda: mx.allclose(x, y), lambda: mx.allclose(x, y + 1.0),
        lambda: mx.array_equal(x, y), lambda: mx.array_equal(x, x + 0.0),
    ]


@pytest.fixture
def stats(on_metal):  # noqa: F811 - the imported fixture
    """The emulated backend's counters, at zero."""
    return on_metal


def test_backend_runs_the_builtin_kernels(stats):
    ops = _ops()
    for k, op in enumerate(ops):
        with mx.stream(mx.cpu):
            want = op()
            mx.eval(want)
        before = stats["builtin"]
        with mx.stream(mx.gpu):
            got = op()
            mx.eval(got)
        assert stats["builtin"] > before, f"op {k} ran no built-in kernel"
        g, w = np.asarray(got), np.asarray(want)
        assert g.dtype == w.dtype and g.shape == w.shape, k
        if k in (11, 12):   # windows: within the documented ulps
            assert np.allclose(g, w, rtol=5e-7, atol=0), k
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"op {k}")
    assert stats["cpu_fallback"] == 0, stats["cpu_fallback_by_primitive"]


def test_backend_number_of_elements_in_compile(stats):
    # mean inside a shapeless compile counts with NumberOfElements at each call's shape
    fn = mx.compile(lambda x: mx.mean(x, axis=1), shapeless=True)
    for n in (3, 7):
        x = mx.array(np.arange(2 * n, dtype=np.float32).reshape(2, n))
        with mx.stream(mx.gpu):
            got = fn(x)
            mx.eval(got)
        np.testing.assert_allclose(np.asarray(got), np.arange(2 * n).reshape(2, n).mean(1),
                                   rtol=1e-6)
    assert stats["cpu_fallback_by_primitive"].get("NumberOfElements", 0) == 0


def test_backend_float64_creation_raises(stats):
    with pytest.raises(DtypeError, match=r"^Arange cannot run on the Metal GPU with float64"):
        mx.eval(mx.arange(3, dtype=mx.float64, stream=mx.gpu))
    assert stats["cpu_fallback"] == 0


@pytest.fixture
def fake_gpu(on_fake_gpu):  # noqa: F811 - the imported fixture
    """The backend on the fake Metal API (the runtime's GPU path: shared buffers, batches)."""
    return on_fake_gpu


def test_the_runtimes_gpu_path_chains_the_dispatches(fake_gpu):
    # Several dispatches per op, intermediate buffers bound in place: median's copy, sort
    # and pick; allclose's chunks and their fold; host-made parameter buffers.
    log, _ = fake_gpu
    x = mx.array(rng(69).normal(size=(4, 1100, 3)).astype(np.float32))
    y = mx.array(np.asarray(x) + np.float32(1e-9))
    ops = [lambda: mx.linspace(0, 3, 10, dtype=mx.int32), lambda: mx.eye(3, 4, k=-1),
           lambda: mx.zeros((2, 3), dtype=mx.int16), lambda: mx.median(x, axis=(0, 1)),
           lambda: mx.allclose(x, y), lambda: mx.array_equal(x, y)]
    for k, op in enumerate(ops):
        with mx.stream(mx.cpu):
            want = op()
            mx.eval(want)
        with mx.stream(mx.gpu):
            got = op()
            mx.eval(got)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=f"op {k}")
    assert metal.stats["cpu_fallback"] == 0 and metal.stats["builtin"] == len(ops)
    assert sum(c[0] == "dispatchThreads" for c in log) > len(ops)
