"""Single element-wise ops on large arrays run generated kernels on the ``cpu`` backend.

From ``compiled.ELEMENTWISE_MIN_SIZE`` elements in an input, an element-wise
primitive that writes itself in the codegen IR runs the C++ kernel of its own
expression (``backends/cpu/compiled.py``, ``eager_kernel``); smaller ones run the
NumPy kernel. Each op here is evaluated on the ``cpu`` backend and on
``cpu-reference`` (NumPy's kernels: what every op computed before), and the two
must agree: bit for bit where both compute the same correctly rounded formula
(arithmetic, comparisons, casts, select, integer and bool ops), within the codegen
tests' tolerances for transcendental functions (libmvec's against NumPy's); NaN
and infinity included. ``compiled.stats["elementwise"]`` says which path ran.
"""

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import lazyx.core as mx
from helpers import TOLERANCES
from lazyx.backends.cpu import compiled
from lazyx.codegen import jit

pytestmark = pytest.mark.skipif(not jit.available(), reason="no C++ compiler")

LARGE = (256, 256)  # 65,536 elements: the threshold itself
assert LARGE[0] * LARGE[1] == compiled.ELEMENTWISE_MIN_SIZE
BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture(autouse=True)
def _on_cpu_generated():
    """The cpu backend with generated single ops switched on (whatever the environment)."""
    from lazyx.testing import running_on
    previous = compiled.set_elementwise(True)
    try:
        with running_on("cpu"):
            yield
    finally:
        compiled.set_elementwise(previous)


def _data(dtype, shape=LARGE, seed=0, special=True):
    """Random values of ``dtype``; floats include NaN, infinities, zeros of both signs."""
    g = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return g.random(shape) < 0.5
    if dtype.kind in "iu":
        return g.integers(-50 if dtype.kind == "i" else 0, 50, shape).astype(dtype)
    x = (g.standard_normal(shape) * 3).astype(np.float32)
    if special:
        flat = x.reshape(-1)
        flat[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30]
    return x.astype(dtype)


def _both(fn, *arrays):
    """``fn`` of the lazyx arrays on the cpu backend (and the counter's increase), and on
    cpu-reference (NumPy's kernels), as NumPy arrays."""
    before = compiled.stats["elementwise"]
    got = fn(*[mx.array(a) for a in arrays])
    mx.eval(got)
    ran = compiled.stats["elementwise"] - before
    with mx.use_backend("cpu", "cpu-reference"):
        want = fn(*[mx.array(a) for a in arrays])
        mx.eval(want)
    return got, want, ran


def _same(got, want, exact, msg=""):
    if isinstance(got, (tuple, list)):
        for g, w in zip(got, want):
            _same(g, w, exact, msg)
        return
    assert got.dtype == want.dtype and got.shape == want.shape, msg
    g, w = np.asarray(got), np.asarray(want)
    floating = g.dtype.kind in "fc" or g.dtype == BF16
    if exact or not floating:
        # Bit for bit (NaN payloads aside): the same correctly rounded formula.
        if floating:
            np.testing.assert_array_equal(np.isnan(g.astype(np.float32)), np.isnan(w.astype(np.float32)), msg)
            keep = ~np.isnan(w.astype(np.float32))
            assert np.array_equal(g[keep].view(np.uint8), w[keep].view(np.uint8)) or \
                np.array_equal(g[keep], w[keep]), msg
        else:
            np.testing.assert_array_equal(g, w, msg)
    else:
        r, a = TOLERANCES[g.dtype.name]
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=r, atol=a,
                                   equal_nan=True, err_msg=msg)


# -- unary ------------------------------------------------------------------------------
EXACT_UNARY = {
    "abs": mx.abs, "negative": mx.negative, "sqrt": mx.sqrt, "square": mx.square,
    "floor": mx.floor, "ceil": mx.ceil, "isnan": mx.isnan, "isinf": mx.isinf,
}
APPROX_UNARY = {"exp": mx.exp, "log": mx.log, "tanh": mx.tanh, "sin": mx.sin,
                "sigmoid": mx.sigmoid, "erf": mx.erf}


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", list(EXACT_UNARY) + list(APPROX_UNARY))
def test_large_unary_ops_run_generated_and_match_numpy(name, dtype):
    fn = EXACT_UNARY.get(name) or APPROX_UNARY[name]
    got, want, ran = _both(fn, _data(dtype))
    assert ran == 1, f"{name} on {np.dtype(dtype).name} did not run its generated kernel"
    _same(got, want, name in EXACT_UNARY, f"{name} {np.dtype(dtype).name}")


def test_exp_and_tanh_agree_with_float64_references():
    x = _data(np.float32, special=False)
    for fn, ref in ((mx.exp, np.exp), (mx.tanh, np.tanh)):
        got, _, ran = _both(fn, x)
        assert ran == 1
        r, a = TOLERANCES["float32"]
        np.testing.assert_allclose(np.asarray(got), ref(x.astype(np.float64)), rtol=r, atol=a)


@pytest.mark.parametrize("dtype", [np.int32, np.bool_], ids=lambda d: np.dtype(d).name)
def test_integer_and_bool_unary_ops(dtype):
    x = _data(dtype)
    ops = [mx.logical_not] if np.dtype(dtype).kind == "b" else [mx.abs, mx.negative, mx.square,
                                                                  mx.bitwise_invert]
    for fn in ops:
        got, want, ran = _both(fn, x)
        assert ran == 1, fn.__name__
        _same(got, want, True, fn.__name__)


@pytest.mark.parametrize("src,dst", [(np.float32, "int32"), (np.float32, "float16"),
                                     (np.float32, "bfloat16"), (np.int32, "float32"),
                                     (np.bool_, "float32"), (BF16, "float32"),
                                     (np.float16, "int32"), (np.int32, "uint8")],
                         ids=lambda v: str(np.dtype(v)) if not isinstance(v, str) else v)
def test_casts(src, dst):
    x = _data(src, special=False)
    got, want, ran = _both(lambda a: a.astype(getattr(mx, dst)), x)
    assert ran == 1
    _same(got, want, True, f"{np.dtype(src).name} -> {dst}")


def test_a_cast_to_the_same_dtype_and_stop_gradient_compute_nothing():
    x = _data(np.float32)
    for fn in (lambda a: a.astype(mx.float32), mx.stop_gradient):
        got, want, ran = _both(fn, x)
        assert ran == 0  # the NumPy kernel's view: no kernel to run
        _same(got, want, True)


# -- binary, broadcasting, layouts --------------------------------------------------------
BINARY = {"add": mx.add, "subtract": mx.subtract, "multiply": mx.multiply, "divide": mx.divide,
          "maximum": mx.maximum, "minimum": mx.minimum, "less": mx.less, "equal": mx.equal,
          "greater_equal": mx.greater_equal}


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16, np.int32],
                         ids=lambda d: np.dtype(d).name)
def test_large_binary_ops_bit_identical(dtype):
    a, b = _data(dtype, seed=1), _data(dtype, seed=2)
    for name, fn in BINARY.items():
        if name == "divide" and np.dtype(dtype).kind == "i":
            continue  # integer divide is a float op after a cast: two nodes, tested below
        got, want, ran = _both(fn, a, b)
        assert ran == 1, name
        _same(got, want, True, f"{name} {np.dtype(dtype).name}")


def test_integer_division_by_zero_power_and_shifts():
    a = _data(np.int32, seed=3)
    b = _data(np.int32, seed=4)
    b.reshape(-1)[:100] = 0
    for fn in (mx.floor_divide, mx.remainder, mx.bitwise_and, mx.bitwise_xor, mx.divmod):
        got, want, ran = _both(fn, a, b)
        assert ran == 1, fn.__name__
        _same(got, want, True, fn.__name__)
    got, want, ran = _both(mx.left_shift, a, np.abs(b) % 40)
    assert ran == 1
    _same(got, want, True, "left_shift")


def test_bool_logic():
    a, b = _data(np.bool_, seed=5), _data(np.bool_, seed=6)
    for fn in (mx.logical_and, mx.logical_or, mx.logical_xor, mx.equal):
        got, want, ran = _both(fn, a, b)
        assert ran == 1
        _same(got, want, True, fn.__name__)


def test_broadcasting_scalars_and_views():
    x = _data(np.float32, seed=7)
    row = _data(np.float32, shape=(1, 256), seed=8)
    col = _data(np.float32, shape=(256, 1), seed=9)
    cases = {
        "row": (lambda a, r: a + r, x, row),
        "column": (lambda a, c: a * c, x, col),
        "python scalar": (lambda a: a * 0.5 + 0, x),
        "0-d array": (lambda a, s: mx.maximum(a, s), x, np.array(0.25, np.float32)),
        "transposed": (lambda a, b: mx.transpose(a) - b, x, _data(np.float32, seed=10)),
        "strided slice": (lambda a: mx.exp(a[:, ::2]), _data(np.float32, shape=(256, 512))),
        "reversed": (lambda a: a[::-1] / 3, x),
    }
    for label, (fn, *arrays) in cases.items():
        got, want, ran = _both(fn, *arrays)
        assert ran >= 1, label
        _same(got, want, label != "strided slice", label)


def test_where_large():
    c = _data(np.bool_, seed=11)
    x, y = _data(np.float32, seed=12), _data(np.float32, shape=(256,), seed=13)
    got, want, ran = _both(mx.where, c, x, y)
    assert ran == 1
    _same(got, want, True, "where")


def test_values_against_numpy_float64():
    a, b = _data(np.float32, seed=14, special=False), _data(np.float32, seed=15, special=False)
    got = mx.add(mx.array(a), mx.array(b))
    np.testing.assert_array_equal(np.asarray(got), (a.astype(np.float64) + b).astype(np.float32))
    nan = np.full(LARGE, np.nan, np.float32)
    got = np.asarray(mx.maximum(mx.array(nan), mx.array(a)))
    assert np.isnan(got).all()  # NaN propagates, as NumPy's maximum


# -- which path ---------------------------------------------------------------------------
def test_small_ops_run_numpy():
    before = dict(compiled.stats)
    x = mx.array(_data(np.float32, shape=(255, 256)))  # one element short of a row
    y = mx.exp(x) + x
    mx.eval(y)
    assert compiled.stats == before


def test_an_outer_broadcast_of_small_inputs_runs_numpy():
    # The size check reads the inputs' sizes only (one check on the hot path).
    before = compiled.stats["elementwise"]
    a = mx.array(_data(np.float32, shape=(512, 1), special=False))
    b = mx.array(_data(np.float32, shape=(1, 512), special=False))
    got = a + b
    mx.eval(got)
    assert compiled.stats["elementwise"] == before
    np.testing.assert_array_equal(np.asarray(got), np.asarray(a) + np.asarray(b))


def test_cpu_reference_stays_numpy():
    before = compiled.stats["elementwise"]
    with mx.use_backend("cpu", "cpu-reference"):
        mx.eval(mx.exp(mx.array(_data(np.float32))))
    assert compiled.stats["elementwise"] == before


def test_switching_off_runs_numpy():
    x = mx.array(_data(np.float32))
    compiled.set_elementwise(False)
    before = compiled.stats["elementwise"]
    mx.eval(mx.exp(x))
    assert compiled.stats["elementwise"] == before
    compiled.set_elementwise(True)
    mx.eval(mx.exp(x))
    assert compiled.stats["elementwise"] == before + 1


def test_environment_variable_switches_it_off():
    code = ("import numpy as np, lazyx.core as mx\n"
            "from lazyx.backends.cpu import compiled\n"
            "mx.eval(mx.exp(mx.array(np.ones((256, 256), np.float32))))\n"
            "print(compiled.ELEMENTWISE, compiled.stats['elementwise'])\n")
    env = dict(os.environ, LAZYX_CPU_ELEMENTWISE="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "0"]
