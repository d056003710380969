"""The Metal backend's FFT kernel (backends/metal/kernels/fft.py): complex, real-to-complex
and complex-to-real transforms of any length, over any axes.

Two levels, as the other Metal kernel tests:

* the launcher through lazyx's MSL shim (both thread orders) against ``numpy.fft`` in
  float64 on the same complex64/float32 inputs, every plan (direct Stockham, Bluestein in
  one threadgroup, four-step, Bluestein over four-step), every kind (forward, inverse,
  real forward, real inverse of odd and even length), several axes, strided inputs. The
  error bound is normwise, ``C log2(n)`` float32 ulps of the output's norm (a wrong
  twiddle, index or stage order is an error of the order of the signal);
* ``stream=mx.gpu`` with the Metal backend emulated on the CPU, through ``mx.fft``:
  padding and truncation (``n``/``s``, done by the pack before the node), the norms, a
  gradient, counted as built-in and never as an FFT fallback.
"""

import math

import lazyx.core as mx
import numpy as np
import pytest
from helpers import rng
from hypothesis import given, settings
from hypothesis import strategies as st
from lazyx.backends.metal import kernels
from lazyx.backends.metal.kernels import fft as metal_fft
from lazyx.backends.metal.kernels.common import UnsupportedDtype
from lazyx.backends.metal.msl_cpu import shim_available
from lazyx.plugins import fft as ff
from test_metal_backend import on_metal  # noqa: F401  (the fixture: Metal emulated, stats at 0)
from test_metal_kernels import run, run_reversed  # the shim's two thread orders

pytestmark = pytest.mark.skipif(not shim_available(), reason="no C++ compiler for the MSL shim")

CPU = mx.default_stream(mx.cpu)
GPU = mx.default_stream(mx.gpu)
EPS = 2.0 ** -24
#: Normwise error allowed per log2(n): float32 ulps per level of the transform (the kernel
#: measures 0.2 to 0.8 over lengths 2 to 6000, the largest at the smallest lengths).
ULPS_PER_LEVEL = 1.5

#: Lengths and the plan each takes: small, radix 3, radix 8, mixed radix (4 * 3 * 5), a
#: prime (Bluestein in one threadgroup), the largest one-pass lengths, a prime near the
#: Bluestein limit of one threadgroup, a four-step smooth length and a four-step prime.
LENGTHS = {1: "direct", 2: "direct", 3: "direct", 8: "direct", 60: "direct", 97: "bluestein",
           1024: "direct", 2039: "bluestein", 4096: "direct", 5000: "four-step",
           5003: "bluestein four-step"}


def _complex(shape, gen):
    return (gen.standard_normal(shape) + 1j * gen.standard_normal(shape)).astype(np.complex64)


def _primitive(axes, inverse=False, real=False, odd=False, norm="backward"):
    return ff.FFT(GPU, tuple(axes), inverse, real, odd, norm)


def check(got, want, n, what=""):
    """``got`` within ``ULPS_PER_LEVEL * log2(n)`` float32 ulps of ``want`` (float64), in the
    2-norm relative to ``want``'s; the dtype and shape exactly."""
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert got.dtype == (np.float32 if want.dtype.kind == "f" else np.complex64), what
    scale = np.linalg.norm(want)
    err = np.linalg.norm(got.astype(want.dtype) - want)
    bound = ULPS_PER_LEVEL * max(1.0, math.log2(n)) * EPS * scale
    assert err <= bound, f"{what}: error {err / scale:.3g} of the norm, bound {bound / scale:.3g}"


@pytest.mark.parametrize("order", [run, run_reversed], ids=["forward", "reverse"])
@pytest.mark.parametrize("n", list(LENGTHS))
def test_complex_transforms_of_every_plan(order, n):
    assert metal_fft.plan(n)[0] == LENGTHS[n]
    x = _complex((2, n), rng(n))
    for inverse, norm in ((False, "backward"), (True, "backward"), (False, "ortho"),
                          (True, "forward")):
        got = metal_fft.fft(_primitive((1,), inverse, norm=norm), [x], order)
        want = (np.fft.ifft if inverse else np.fft.fft)(x.astype(np.complex128), norm=norm)
        check(got, want, n, f"n={n} inverse={inverse} norm={norm}")


@pytest.mark.parametrize("order", [run, run_reversed], ids=["forward", "reverse"])
@pytest.mark.parametrize("n", [1, 2, 3, 8, 60, 97, 1024, 4096, 5000, 5003])
def test_real_transforms(order, n):
    gen = rng(n + 1)
    x = gen.standard_normal((3, n)).astype(np.float32)
    got = metal_fft.fft(_primitive((1,), real=True), [x], order)
    check(got, np.fft.rfft(x.astype(np.float64)), n, f"rfft n={n}")
    # irfft of any half spectrum (not the rfft of a real signal: the imaginary parts of
    # the DC and Nyquist bins must be ignored, as NumPy does)
    h = _complex((3, n // 2 + 1), gen)
    got = metal_fft.fft(_primitive((1,), True, True, n % 2 == 1, "ortho"), [h], order)
    check(got, np.fft.irfft(h.astype(np.complex128), n=n, norm="ortho"), n, f"irfft n={n}")


def test_several_axes_and_strided_inputs():
    gen = rng(3)
    # A transposed view with every other element along a middle axis: rows of strides
    # that are neither 1 nor contiguous in the kept axes.
    base = _complex((12, 14, 10), gen)
    x = np.swapaxes(base, 0, 2)[:, ::2, :]                       # (10, 7, 12), strided
    for axes, inverse in (((0, 2), False), ((2, 1, 0), True), ((1,), False)):
        got = metal_fft.fft(_primitive(axes, inverse), [x], run)
        fn = np.fft.ifftn if inverse else np.fft.fftn
        check(got, fn(x.astype(np.complex128), axes=axes), 10 * 7 * 12, f"axes={axes}")
    # The multi-pass plans along a leading axis (their scratch arrays keep the other axes).
    for n in (5000, 5003):
        y = _complex((n, 3), gen)[:, ::-1]
        got = metal_fft.fft(_primitive((0,), True), [y], run)
        check(got, np.fft.ifft(y.astype(np.complex128), axis=0), n, f"ifft n={n} axis=0")
    real = np.ascontiguousarray(x.real)[::-1]                      # a negative stride
    got = metal_fft.fft(_primitive((2, 0), real=True), [real], run_reversed)
    want = np.fft.rfftn(real.astype(np.float64), axes=(2, 0))
    check(got, want, 120, "rfftn axes=(2, 0)")
    assert got.shape == (6, 7, 12)   # the real axis 0 keeps 10 // 2 + 1 bins
    back = metal_fft.fft(_primitive((2, 0), True, True, False), [got], run)
    check(back, real.astype(np.float64), 120, "irfftn axes=(2, 0)")


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 2100), st.sampled_from(["fft", "ifft", "rfft", "irfft"]),
       st.integers(1, 3))
def test_random_lengths(n, kind, rows):
    gen = rng(n)
    inverse, real = kind in ("ifft", "irfft"), kind in ("rfft", "irfft")
    if kind == "rfft":
        x = gen.standard_normal((rows, n)).astype(np.float32)
        want = np.fft.rfft(x.astype(np.float64))
    elif kind == "irfft":
        x = _complex((rows, n // 2 + 1), gen)
        want = np.fft.irfft(x.astype(np.complex128), n=n)
    else:
        x = _complex((rows, n), gen)
        want = (np.fft.ifft if inverse else np.fft.fft)(x.astype(np.complex128))
    got = metal_fft.fft(_primitive((1,), inverse, real, n % 2 == 1), [x], run)
    check(got, want, n, f"{kind} n={n}")


def test_plans_and_their_limits():
    assert metal_fft.plan(4096) == ("direct", 4096)
    assert metal_fft.plan(4097)[0] == "bluestein four-step"   # 17 * 241: primes above 13
    assert metal_fft.plan(2 ** 23 + 1) is None                # Bluestein past 4096 ** 2 points
    n1, n2 = metal_fft.plan(3 * 4096)[1:]
    assert n1 * n2 == 3 * 4096 and max(n1, n2) <= metal_fft.MAX_POINTS
    # Twiddles from float64 tables: every root within half an ulp of its value.
    roots = metal_fft._roots(5000).astype(np.complex128)
    exact = np.exp(-2j * np.pi * np.arange(5000) / 5000)
    assert np.abs(roots - exact).max() <= 2.0 ** -24 * 1.01


def test_other_dtypes_and_lengths_are_left_to_the_cpu():
    with pytest.raises(UnsupportedDtype, match="complex128"):
        metal_fft.fft(_primitive((0,)), [np.zeros(4, np.complex128)], run)
    with pytest.raises(UnsupportedDtype, match="complex64"):     # real forward of complex
        metal_fft.fft(_primitive((0,), real=True), [np.zeros(4, np.complex64)], run)
    with pytest.raises(UnsupportedDtype, match="no plan"):
        metal_fft.fft(_primitive((0,)), [np.zeros(2 ** 23 + 1, np.complex64)], run)


def test_the_table_and_the_library():
    assert kernels.KERNELS[ff.FFT] is metal_fft.fft
    assert metal_fft.LIBRARY in kernels.LIBRARIES
    # One template, instantiated per (input, output) element pair from the table.
    assert metal_fft.LIBRARY.source.count("[[kernel]] void") == 1
    assert metal_fft.LIBRARY.source.count("[[host_name(") == len(metal_fft.PAIRS)


# -- through the backend: stream=mx.gpu, emulated -------------------------------------------------
def _no_fft_fallback(stats):
    assert stats["builtin"] >= 1
    assert "FFT" not in stats["cpu_fallback_by_primitive"]


def test_the_public_api_on_the_gpu_stream(on_metal):  # noqa: F811
    gen = rng(11)
    x = _complex((6, 60), gen)
    r = gen.standard_normal((5, 97)).astype(np.float32)
    a, ar = mx.array(x), mx.array(r)
    x64, r64 = x.astype(np.complex128), r.astype(np.float64)
    cases = [
        (mx.fft.fft(a, stream=mx.gpu), np.fft.fft(x64), 60),
        (mx.fft.ifft(a, n=70, stream=mx.gpu), np.fft.ifft(x64, n=70), 70),     # zero-padded
        (mx.fft.fft(a, n=37, axis=0, stream=mx.gpu), np.fft.fft(x64, n=37, axis=0), 37),
        (mx.fft.fft(a, n=50, stream=mx.gpu), np.fft.fft(x64, n=50), 50),       # truncated
        (mx.fft.fft2(a, norm="ortho", stream=mx.gpu), np.fft.fft2(x64, norm="ortho"), 360),
        (mx.fft.ifftn(a, s=(4, 64), axes=(0, 1), stream=mx.gpu),
         np.fft.ifftn(x64, s=(4, 64), axes=(0, 1)), 256),
        (mx.fft.rfft(ar, stream=mx.gpu), np.fft.rfft(r64), 97),
        (mx.fft.rfft(ar, n=128, stream=mx.gpu), np.fft.rfft(r64, n=128), 128),
        (mx.fft.irfft(a, stream=mx.gpu), np.fft.irfft(x64), 118),
        (mx.fft.irfft(a, n=11, norm="forward", stream=mx.gpu),
         np.fft.irfft(x64, n=11, norm="forward"), 11),
        (mx.fft.rfft2(ar, stream=mx.gpu), np.fft.rfft2(r64), 485),
        (mx.fft.irfftn(a, s=(6, 9), axes=(0, 1), stream=mx.gpu),
         np.fft.irfftn(x64, s=(6, 9), axes=(0, 1)), 54),
    ]
    for k, (got, want, n) in enumerate(cases):
        check(np.asarray(got), want, n, f"case {k}")
    _no_fft_fallback(on_metal)
    assert on_metal["builtin"] >= len(cases)


def test_a_long_transform_on_the_gpu_stream(on_metal):  # noqa: F811
    x = _complex((6000,), rng(12))   # 6000 = 75 * 80: the four-step plan
    got = mx.fft.fft(mx.array(x), stream=mx.gpu)
    check(np.asarray(got), np.fft.fft(x.astype(np.complex128)), 6000, "n=6000")
    _no_fft_fallback(on_metal)


def test_gradient_on_the_gpu_stream_matches_the_cpu(on_metal):  # noqa: F811
    # The transforms on the FFT stream, everything else on the CPU's (the whole loss on
    # the GPU stream, real transforms included: the next test).
    gen = rng(13)
    x = mx.array(gen.standard_normal((6, 20)).astype(np.float32))
    c = mx.array(_complex((6, 20), gen))
    w = mx.array(gen.standard_normal((2, 6, 20)).astype(np.float32))

    def loss(x, stream):
        z = mx.multiply(mx.astype(x, mx.complex64), c)
        y = mx.fft.ifft(mx.fft.fft(z, axis=1, stream=stream), axis=0, norm="ortho",
                        stream=stream)
        y = mx.fft.fft2(y, stream=stream)
        return mx.sum(mx.real(y) * w[0] + mx.imag(y) * w[1])

    got = {}
    with mx.stream(CPU):
        for name, stream in (("cpu", CPU), ("gpu", GPU)):
            value, grad = mx.value_and_grad(loss)(x, stream)
            mx.eval(value, grad)
            got[name] = (float(value.item()), np.asarray(grad))
    assert on_metal["builtin"] >= 6   # three FFT nodes forward, three backward
    assert got["gpu"][0] == pytest.approx(got["cpu"][0], rel=1e-5, abs=1e-4)
    np.testing.assert_allclose(got["gpu"][1], got["cpu"][1], rtol=1e-4,
                               atol=1e-5 * np.abs(got["cpu"][1]).max())
    _no_fft_fallback(on_metal)


def test_real_transforms_and_their_gradients_all_on_the_gpu_stream(on_metal):  # noqa: F811
    # rfft and irfft's vjps weight their bins by complex products on the node's stream:
    # generated complex64 kernels on Metal, so the whole loss runs on the GPU.
    gen = rng(14)
    x = mx.array(gen.standard_normal((4, 30)).astype(np.float32))
    w = mx.array(gen.standard_normal((4, 16)).astype(np.float32))

    def loss(x):
        y = mx.fft.rfft(x, axis=1)                       # (4, 16) complex64
        z = mx.fft.irfft(y * mx.conj(y) + y, n=30, axis=1)
        return mx.sum(mx.abs(y) * w) + mx.sum(z * z)

    got = {}
    for name, stream in (("cpu", CPU), ("gpu", GPU)):
        with mx.stream(stream):
            value, grad = mx.value_and_grad(loss)(x)
            mx.eval(value, grad)
        got[name] = (float(value.item()), np.asarray(grad))
    assert got["gpu"][0] == pytest.approx(got["cpu"][0], rel=1e-5)
    np.testing.assert_allclose(got["gpu"][1], got["cpu"][1], rtol=1e-4,
                               atol=1e-5 * np.abs(got["cpu"][1]).max())
    assert on_metal["cpu_fallback"] == 0, on_metal["cpu_fallback_by_primitive"]
