"""The Metal backend's built-in convolution (backends/metal/kernels/conv.py): ``Convolution``
as an implicit-GEMM MSL kernel.

Two levels, as tests/backends/test_metal_products.py:

* the launcher through lazyx's MSL shim (:func:`run_on_cpu`) against the CPU backend's
  NumPy kernel (backends/cpu/kernels/conv.py) in float64 on the same (rounded) inputs,
  within each dtype's rounding plus the float accumulator's error bound;
* ``stream=mx.gpu`` with the Metal backend emulated on the CPU, against the CPU backend:
  forwards and a conv2d gradient (its vjp's convolutions) run the built-in kernel.

Shapes stay small: the shim runs a threadgroup's threads one at a time.
"""

import numpy as np
import pytest

import lazyx.core as mx
from helpers import random_array, rng
from lazyx.backends.cpu.kernels import conv as cpu_conv
from lazyx.backends.metal import kernels
from lazyx.backends.metal.kernels import conv
from lazyx.backends.metal.kernels.common import UnsupportedDtype
from lazyx.backends.metal.msl_cpu import shim_available
from lazyx.errors import DtypeError
from lazyx.plugins import conv as cv
from test_metal_backend import on_metal  # noqa: F401  (the fixture: Metal emulated, stats at 0)
from test_metal_kernels import SUBNORMAL, run, run_reversed  # the shim's two thread orders

pytestmark = pytest.mark.skipif(not shim_available(), reason="no C++ compiler for the MSL shim")

S = mx.default_stream(mx.cpu)
F64 = np.float64
DTYPES = ["float32", "float16", "bfloat16"]
#: Relative error of one rounding to each dtype (the output's), with a little room.
ROUNDING = {"float32": 2e-7, "float16": 1e-3, "bfloat16": 8e-3}
REFERENCE = cpu_conv.KERNELS[cv.Convolution]


def prim(nd, strides=1, lo=0, hi=0, kdil=1, idil=1, groups=1, flip=False):
    """A ``Convolution`` over ``nd`` spatial axes; an int applies to every axis."""
    def axes(v):
        return tuple(v) if isinstance(v, (tuple, list)) else (v,) * nd
    return cv.Convolution(S, axes(strides), axes(lo), axes(hi), axes(kdil), axes(idil), groups,
                          flip)


def data(shape, dtype, gen):
    return random_array(shape, getattr(mx, dtype), gen, -1, 1)


def check_conv(p, x, w, dtype, where):
    """The shim's output within one rounding of the float64 reference plus float32
    accumulation over the taps x channels of a window (``|x| * |w|`` bounds the terms)."""
    got = conv.convolution(p, [x, w], run)
    expected = REFERENCE(p, [x.astype(F64), w.astype(F64)])
    scale = REFERENCE(p, [np.abs(x.astype(F64)), np.abs(w.astype(F64))])
    assert got.dtype == x.dtype and got.shape == expected.shape, (where, got.shape)
    k = int(np.prod(w.shape[1:]))
    got = got.astype(F64)
    tol = ROUNDING[dtype] * np.abs(expected) + (k + 2) * 2.0 ** -24 * scale + SUBNORMAL[dtype]
    bad = ~(np.abs(got - expected) <= tol)
    assert not bad.any(), f"{where} {dtype}: got {got[bad][:5]}, expected {expected[bad][:5]}"
    return got


# (input shape, weight shape, Convolution arguments): 1-3 spatial axes, strides, asymmetric
# and negative (cropping) padding, kernel and input dilation, groups, flip; more than one
# tile of output pixels (M > 32) and channels (O > 32), K = taps x channels past a step of 16.
CASES = [
    ((2, 7, 3), (4, 3, 3), {}),
    ((2, 40, 3), (35, 3, 3), {"strides": 2, "lo": 1, "hi": 2}),
    ((1, 11, 8), (6, 3, 4), {"groups": 2, "kdil": 2, "lo": -1, "hi": 3, "flip": True}),
    ((1, 6, 2), (3, 2, 2), {"idil": 3, "lo": 1, "hi": 1}),
    ((2, 6, 5, 4), (6, 3, 2, 2), {"strides": (2, 1), "lo": (1, -1), "hi": (2, 0),
                                   "kdil": (2, 1), "idil": (1, 2), "groups": 2, "flip": True}),
    ((1, 5, 5, 3), (4, 3, 3, 3), {"lo": 1, "hi": 1}),
    ((1, 4, 5, 3, 2), (3, 2, 2, 2, 2), {"strides": (1, 2, 1), "lo": (1, 0, 1),
                                        "hi": (0, 1, 1), "kdil": (1, 1, 2), "idil": (2, 1, 1),
                                        "flip": True}),
]


@pytest.mark.parametrize("dtype", DTYPES)
def test_convolution_through_the_shim(dtype):
    gen = rng(70)
    for xs, ws, args in CASES:
        x, w = data(xs, dtype, gen), data(ws, dtype, gen)
        check_conv(prim(len(xs) - 2, **args), x, w, dtype, f"{xs} * {ws} {args}")


def test_strided_views_are_read_through_their_strides():
    gen = rng(71)
    # A transposed input (channels not the last in memory) and an every-other-channel weight.
    x = np.swapaxes(data((2, 3, 9), "float32", gen), 1, 2)
    w = data((4, 3, 6), "float32", gen)[..., ::2]
    dispatches = []
    p = prim(1, lo=1, hi=1)
    conv.convolution(p, [x, w], dispatches.append)
    assert dispatches[0].buffers[0] is x and dispatches[0].buffers[2] is w  # not copied
    check_conv(p, x, w, "float32", "strided")
    # a negative stride is copied first (a reversed view)
    check_conv(p, x[:, ::-1], w, "float32", "reversed")


def test_convolution_in_reverse_thread_order():
    # A thread reading another's tile element before the barrier that publishes it would
    # give different numbers when the threads run in the opposite order.
    gen = rng(72)
    x, w = data((2, 20, 6), "float32", gen), data((34, 3, 6), "float32", gen)
    p = prim(1, strides=1, lo=2, hi=1)
    forward = conv.convolution(p, [x, w], run)
    backward = conv.convolution(p, [x, w], run_reversed)
    np.testing.assert_array_equal(forward, backward)


def test_empty_inputs_and_outputs():
    p = prim(1, lo=1, hi=1)
    # no channels: a sum over nothing, zeros (nothing is dispatched)
    dispatches = []
    got = conv.convolution(p, [np.ones((2, 5, 0), np.float32), np.ones((3, 3, 0), np.float32)],
                           dispatches.append)
    assert got.shape == (2, 5, 3) and not got.any() and not dispatches
    got = conv.convolution(p, [np.ones((0, 5, 2), np.float16), np.ones((3, 3, 2), np.float16)],
                           dispatches.append)
    assert got.shape == (0, 5, 3) and got.dtype == np.float16 and not dispatches


def test_half_types_accumulate_in_float_and_round_once():
    # A partial sum (120000) overflows float16 (max 65504); the result (60000) does not.
    x = np.array([[[30000.0], [30000.0], [-30000.0]]], np.float16)
    w = np.full((1, 3, 1), 2.0, np.float16)
    got = conv.convolution(prim(1), [x, w], run)
    assert got.dtype == np.float16 and got.tolist() == [[[60000.0]]]


def test_dtypes_without_a_kernel_are_refused_naming_the_dtypes_it_has():
    for dtype in (np.float64, np.complex64):
        x = np.ones((1, 3, 2), dtype)
        with pytest.raises(UnsupportedDtype, match=f"conv has no version for dtype "
                           f"{np.dtype(dtype).name}; it has float32, float16, bfloat16"):
            conv.convolution(prim(1), [x, x], run)


def test_the_table_and_the_library():
    assert kernels.KERNELS[cv.Convolution] is conv.convolution
    assert conv.LIBRARY in kernels.LIBRARIES
    # One template, instantiated per dtype from the table.
    assert conv.LIBRARY.source.count("[[kernel]] void") == 1
    assert conv.LIBRARY.source.count("[[host_name(") == len(conv.DTYPES)


# -- through the backend: stream=mx.gpu, emulated -------------------------------------------------
def _close_to_cpu(got, cpu, dtype, where):
    """Two float32 accumulations in different orders, each rounded once to ``dtype``."""
    assert got.dtype == cpu.dtype and got.shape == cpu.shape, where
    ulp = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]
    np.testing.assert_allclose(got.astype(F64), cpu.astype(F64), rtol=ulp * 8, atol=2e-5,
                               err_msg=where)


GPU_CASES = {
    "conv1d stride 2 padding 1": (lambda x, w, s: mx.conv1d(x, w, stride=2, padding=1, stream=s),
                                  (2, 9, 4), (5, 3, 4)),
    "conv1d groups dilation": (lambda x, w, s: mx.conv1d(x, w, dilation=2, groups=2, stream=s),
                               (1, 10, 4), (6, 3, 2)),
    "conv2d": (lambda x, w, s: mx.conv2d(x, w, padding=(1, 0), stream=s), (2, 5, 6, 3),
               (4, 3, 2, 3)),
    "conv_general asymmetric negative padding, input dilation, flip":
        (lambda x, w, s: mx.conv_general(x, w, stride=(1, 2), padding=([2, -1], [0, 1]),
                                         input_dilation=(2, 1), flip=True, stream=s),
         (1, 4, 7, 2), (3, 2, 3, 2)),
    "conv_transpose2d": (lambda x, w, s: mx.conv_transpose2d(x, w, stride=2, padding=1, stream=s),
                         (1, 3, 4, 2), (3, 3, 3, 2)),
    "conv3d": (lambda x, w, s: mx.conv3d(x, w, stride=(1, 2, 1), padding=1, stream=s),
               (1, 3, 4, 3, 2), (2, 2, 3, 2, 2)),
}


@pytest.mark.parametrize("dtype", DTYPES)
def test_convolutions_on_the_gpu_stream_equal_the_cpu_backend(on_metal, dtype):
    gen = rng(73)
    d = getattr(mx, dtype)
    for name, (fn, xs, ws) in GPU_CASES.items():
        x, w = (mx.array(random_array(s, d, gen, -1, 1)) for s in (xs, ws))
        got, cpu = (np.asarray(fn(x, w, s)) for s in (mx.gpu, mx.cpu))
        _close_to_cpu(got, cpu, dtype, name)
    # Every convolution ran the built-in kernel.
    assert on_metal["builtin"] == len(GPU_CASES) and on_metal["cpu_fallback"] == 0


def test_a_conv2d_gradient_runs_on_the_built_in_kernel(on_metal, monkeypatch):
    from lazyx.backends.metal import msl_cpu
    shim, functions = msl_cpu.dispatch_on_cpu, []

    def recording(library, function, *args, **kwargs):
        functions.append(function)
        return shim(library, function, *args, **kwargs)
    monkeypatch.setattr(msl_cpu, "dispatch_on_cpu", recording)
    gen = rng(74)
    x, w = (mx.array(random_array(s, mx.float32, gen, -1, 1)) for s in ((2, 6, 5, 4), (6, 3, 3, 2)))
    c = mx.array(random_array((2, 3, 4, 6), mx.float32, gen, -1, 1))

    def loss(s):
        return lambda x, w: mx.sum(mx.multiply(
            mx.conv2d(x, w, stride=2, padding=(1, 2), groups=2, stream=s), c, stream=s), stream=s)

    with mx.stream(mx.gpu):
        value, grads = mx.value_and_grad(loss(mx.gpu), argnums=(0, 1))(x, w)
        mx.eval(value, grads)
    with mx.stream(mx.cpu):
        cpu_value, cpu_grads = mx.value_and_grad(loss(mx.cpu), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(np.asarray(value), np.asarray(cpu_value), rtol=1e-5, atol=1e-5)
    for g, cg in zip(grads, cpu_grads):
        assert g.shape == cg.shape
        np.testing.assert_allclose(np.asarray(g), np.asarray(cg), rtol=1e-5, atol=1e-5)
    # The forward and both cotangents' convolutions ran here, none on the CPU.
    assert [f for f in functions if f.startswith("conv_")] == ["conv_float32"] * 3
    assert "Convolution" not in on_metal["cpu_fallback_by_primitive"]


def test_convolution_is_no_longer_a_cpu_fallback(on_metal):
    assert mx.kernel_provider("metal", "Convolution") == "backend 'metal'"
    # complex64 has no kernel: it falls back, counted; float64 is refused.
    x = np.array([[[1 + 2j], [3j], [2]]], np.complex64)
    w = np.array([[[1 - 1j], [2]]], np.complex64)
    got = np.asarray(mx.conv1d(mx.array(x), mx.array(w), stream=mx.gpu))
    np.testing.assert_allclose(got, np.asarray(mx.conv1d(mx.array(x), mx.array(w), stream=mx.cpu)),
                               rtol=1e-6)
    assert on_metal["cpu_fallback_by_primitive"] == {"Convolution": 1} and on_metal["builtin"] == 0
    with pytest.raises(DtypeError, match=r"^Convolution cannot run on the Metal GPU with float64"):
        y = mx.array(np.ones((1, 3, 2)), dtype=mx.float64)
        mx.eval(mx.conv1d(y, y, stream=mx.gpu))
