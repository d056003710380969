"""The fft pack against NumPy's float64 transforms: sizes that truncate and pad, axes,
normalisations, input dtypes, strided inputs, round trips, shifts and frequencies,
gradients (finite differences, with truncation and padding in the graph), vmap, compile,
and the errors of bad input."""

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.backends.cpu.kernels import fft as cpu_fft
from helpers import (ALL_DTYPES, assert_close, check_jvp_vjp, check_op, check_vjp_fd,
                     check_vmap_loop, random_array, rng, to_lazyx)
from lazyx.errors import ArgumentError, AxisError, DtypeError, LazyxError, ShapeError

# float32 transforms of up to a few hundred points of size 4: absolute errors ~1e-5.
TOL = {"rtol": 1e-4, "atol": 2e-4}
C64 = mx.complex64
F32 = mx.float32


@pytest.fixture(autouse=True, params=["pocketfft", "mkl"])
def cpu_library(request, monkeypatch):
    """Every test on both CPU libraries: pocketfft, and MKL where ``mkl_fft`` is installed."""
    if request.param == "mkl":
        pytest.importorskip("mkl_fft")
    monkeypatch.setattr(cpu_fft, "LIBRARY", request.param)
    return request.param


def _data(shape, complex_, seed=0):
    return random_array(shape, C64 if complex_ else F32, rng(seed))


def _check(name, x, dtype, **kwargs):
    check_op(lambda a: getattr(mx.fft, name)(a, **kwargs),
             lambda a: getattr(np.fft, name)(a, **kwargs), x, dtype=dtype,
             msg=f"{name}({kwargs})", **TOL)


# -- values --------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{}, {"n": 3}, {"n": 11}, {"n": 1}, {"axis": 0},
                                    {"axis": -2, "n": 6, "norm": "ortho"},
                                    {"norm": "forward"}, {"axis": 1, "norm": "backward"}],
                         ids=str)
@pytest.mark.parametrize("name", ["fft", "ifft", "rfft", "irfft"])
def test_one_axis_matches_numpy(name, kwargs):
    x = _data((4, 7, 5), name != "rfft")
    _check(name, x, F32 if name == "irfft" else C64, **kwargs)


@pytest.mark.parametrize("kwargs", [{}, {"axes": (0, 2)}, {"axes": (2, 0)}, {"axes": (1,)},
                                    {"s": (3, 8), "axes": (0, 2)}, {"s": (5, 1), "axes": (-1, 1)},
                                    {"norm": "ortho"}, {"axes": (-3, -2), "norm": "forward"}],
                         ids=str)
@pytest.mark.parametrize("name", ["fft2", "ifft2", "rfft2", "irfft2"])
def test_two_axes_match_numpy(name, kwargs):
    x = _data((4, 6, 5), not name.startswith("rfft"), seed=1)
    _check(name, x, F32 if name.startswith("irfft") else C64, **kwargs)


@pytest.mark.parametrize("kwargs", [{}, {"axes": (1,)}, {"axes": (2, 0, 1)},
                                    {"s": (3, 4, 7), "axes": (0, 1, 2)},
                                    {"s": (9,), "axes": (-2,), "norm": "ortho"},
                                    {"norm": "forward"}], ids=str)
@pytest.mark.parametrize("name", ["fftn", "ifftn", "rfftn", "irfftn"])
def test_n_axes_match_numpy(name, kwargs):
    x = _data((3, 5, 4), not name.startswith("rfft"), seed=2)
    _check(name, x, F32 if name.startswith("irfft") else C64, **kwargs)


def test_mlx_defaults():
    x = _data((2, 3, 4), True)
    # fft2's axes default to the last two; fft2 with axes=None is fftn over all axes.
    assert_close(mx.fft.fft2(to_lazyx(x)), np.fft.fft2(x.astype(np.complex128)), **TOL)
    assert_close(mx.fft.fft2(to_lazyx(x), axes=None), np.fft.fftn(x.astype(np.complex128)),
                 **TOL)
    # irfft's n defaults to 2 * (m - 1); axes=() transforms nothing (MLX returns the input).
    assert mx.fft.irfft(to_lazyx(x)).shape == (2, 3, 6)
    r = mx.array([1.0, 2.0])
    assert mx.fft.fftn(r, axes=()) is r


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: d.name)
def test_every_input_dtype_gives_complex64_or_float32(dtype):
    x = random_array((3, 6), dtype, rng(3))
    wide = x.astype(np.complex128 if dtype.kind == "c" else np.float64)
    a = to_lazyx(x)
    assert_close(mx.fft.fft(a), np.fft.fft(wide), C64, **TOL)
    assert_close(mx.fft.ifft2(a), np.fft.ifft2(wide), C64, **TOL)
    assert_close(mx.fft.irfft(a, n=5), np.fft.irfft(wide, n=5), F32, **TOL)
    # The real forward transforms drop an imaginary part, as MLX does.
    assert_close(mx.fft.rfftn(a), np.fft.rfftn(wide.real), C64, **TOL)


def test_strided_and_transposed_inputs():
    x = _data((6, 8), True, seed=4)
    a = to_lazyx(x)
    check = x.astype(np.complex128)
    assert_close(mx.fft.fft(mx.transpose(a)), np.fft.fft(check.T), **TOL)
    assert_close(mx.fft.fft2(a[::2, 1::3]), np.fft.fft2(check[::2, 1::3]), **TOL)
    assert_close(mx.fft.rfft(mx.real(a)[:, ::-1]), np.fft.rfft(check.real[:, ::-1]), **TOL)


def test_a_batch_of_many_transforms():
    # pocketfft splits a batch between its worker threads.
    x = _data((64, 3, 128), True, seed=5)
    _check("fft", x, C64, axis=-1)
    _check("rfft2", x.real.copy(), C64, axes=(0, 2))


@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
@pytest.mark.parametrize("name,axes", [("fftn", (1,)), ("ifftn", (0, 2)), ("rfftn", (2,)),
                                       ("irfftn", (1, 2)), ("ifftn", (0, 1, 2))])
def test_normalisation_over_some_of_the_axes(name, axes, norm, cpu_library):
    # The scale is the size of the transformed axes only (mkl_fft 2.3 by itself scales
    # ortho and forward by every axis's size: the kernel corrects it).
    x = _data((3, 5, 8), name != "rfftn", seed=9)
    _check(name, x, F32 if name == "irfftn" else C64, axes=axes, norm=norm)
    assert cpu_fft.library() == cpu_library


def test_a_library_that_is_not_there_or_unknown_is_an_error(monkeypatch):
    monkeypatch.setattr(cpu_fft, "LIBRARY", "fftw")
    with pytest.raises(ValueError, match="LIBRARY.*'fftw'.*'pocketfft'"):
        cpu_fft.library()
    monkeypatch.setattr(cpu_fft, "LIBRARY", "mkl")
    monkeypatch.setattr(cpu_fft, "_mkl_fft", [None])
    with pytest.raises(ImportError, match=r"lazyx\[mkl\]"):
        cpu_fft.library()


def test_empty_batch():
    assert mx.fft.fft(mx.zeros((0, 4))).shape == (0, 4)
    assert mx.fft.irfft(mx.zeros((0, 4))).shape == (0, 6)


@pytest.mark.parametrize("shape,axes", [((5,), (0,)), ((4, 7), (0, 1)), ((3, 4, 6), (2, 0))])
def test_round_trips(shape, axes):
    x = _data(shape, True, seed=6)
    a = to_lazyx(x)
    assert_close(mx.fft.ifftn(mx.fft.fftn(a, axes=axes), axes=axes), x, **TOL)
    r = to_lazyx(x.real.copy())
    s = tuple(shape[k] for k in axes)
    assert_close(mx.fft.irfftn(mx.fft.rfftn(r, axes=axes), s=s, axes=axes), x.real, **TOL)


# -- shifts and frequencies ------------------------------------------------------------
@pytest.mark.parametrize("axes", [None, 0, -1, (0, 2), (1,)], ids=str)
def test_shifts_match_numpy(axes):
    x = random_array((3, 4, 5), mx.int32, rng(7))
    check_op(lambda a: mx.fft.fftshift(a, axes), lambda a: np.fft.fftshift(a, axes), x,
             dtype=mx.int32)
    check_op(lambda a: mx.fft.ifftshift(a, axes=axes), lambda a: np.fft.ifftshift(a, axes), x,
             dtype=mx.int32)
    y = to_lazyx(x)
    assert mx.fft.ifftshift(mx.fft.fftshift(y, axes), axes).tolist() == x.tolist()


@pytest.mark.parametrize("n", [1, 2, 7, 10])
@pytest.mark.parametrize("d", [1.0, 0.25, -3])
def test_frequencies_match_numpy(n, d):
    assert_close(mx.fft.fftfreq(n, d), np.fft.fftfreq(n, d), F32)
    assert_close(mx.fft.rfftfreq(n, d=d), np.fft.rfftfreq(n, d), F32)


# -- transforms --------------------------------------------------------------------------
def _parts(z):
    return [mx.real(z), mx.imag(z)]


def _complex(x, y):
    return mx.add(x, mx.multiply(y, 1j))


# Complex transforms take their input as real and imaginary parts, so the finite
# differences are real; sizes that truncate and pad put a slice and a pad in the graph.
GRADIENT_CASES = [
    ("fft truncated", lambda x, y: _parts(mx.fft.fft(_complex(x, y), n=3)), 2),
    ("ifft padded", lambda x, y: _parts(mx.fft.ifft(_complex(x, y), n=8, axis=0, norm="ortho")), 2),
    ("rfft odd", lambda x: _parts(mx.fft.rfft(x, n=5, norm="forward")), 1),
    ("rfft2 padded", lambda x: _parts(mx.fft.rfft2(x, s=(5, 6))), 1),
    ("irfft odd", lambda x, y: mx.fft.irfft(_complex(x, y), n=7), 2),
    ("irfftn truncated", lambda x, y: mx.fft.irfftn(_complex(x, y), s=(3, 2), axes=(1, 0)), 2),
    ("fftn all axes", lambda x, y: _parts(mx.fft.fftn(_complex(x, y), norm="forward")), 2),
]


@pytest.mark.parametrize("fn,arity", [(f, k) for _, f, k in GRADIENT_CASES],
                         ids=[n for n, _, _ in GRADIENT_CASES])
def test_gradients_against_finite_differences(fn, arity):
    xs = [random_array((4, 5), mx.float64, rng(10 + i), -1, 1) for i in range(arity)]
    # The transforms compute in complex64: differences of float32 accuracy.
    check_vjp_fd(fn, *xs, eps=1e-3, rtol=2e-2, atol=2e-3, max_elements=0)
    check_jvp_vjp(fn, *xs, rtol=1e-4, atol=1e-4)


def test_irfft_jvp_keeps_an_odd_n():
    # (MLX 0.32.2's jvp drops n here; lazyx transforms the tangent like the primal.)
    c = to_lazyx(_data((3,), True, seed=8))
    t = to_lazyx(_data((3,), True, seed=9))
    out, (tan,) = mx.jvp(lambda a: mx.fft.irfft(a, n=5), [c], [t])
    assert tan.shape == out[0].shape == (5,)
    assert_close(tan, np.fft.irfft(np.array(t).astype(np.complex128), n=5), F32, **TOL)


def test_grad_of_a_circular_convolution():
    x, k = random_array((2, 6), F32, rng(11)), random_array((6,), F32, rng(12))
    loss = lambda a: mx.sum(mx.fft.irfft(mx.fft.rfft(a) * mx.fft.rfft(to_lazyx(k)), n=6) ** 2)
    # y = x (*) k, circular along the last axis, so d|y|^2/dx = 2 y (*) reverse(k).
    y = np.real(np.fft.ifft(np.fft.fft(x) * np.fft.fft(k)))
    k_rev = np.roll(k[::-1], 1)
    want = 2 * np.real(np.fft.ifft(np.fft.fft(y) * np.fft.fft(k_rev)))
    assert_close(mx.grad(loss)(to_lazyx(x)), want, F32, **TOL)


@pytest.mark.parametrize("fn,in_axes", [
    (lambda a: mx.fft.fft(a, n=6), 0), (lambda a: mx.fft.ifft2(a), 2),
    (lambda a: mx.fft.irfftn(a, axes=(0, 1), norm="ortho"), 1),
    (lambda a: mx.fft.rfft(mx.real(a), axis=0), 2)])
def test_vmap_against_a_loop(fn, in_axes):
    check_vmap_loop(fn, _data((3, 4, 5), True, seed=13), in_axes=in_axes)


def test_compile():
    x = to_lazyx(_data((4, 8), False, seed=14))
    f = lambda a: mx.fft.irfft(mx.fft.rfft(a) * 2.0, n=8)  # noqa: E731
    assert_close(mx.compile(f)(x), 2 * np.array(x), F32, **TOL)


# -- bad input -----------------------------------------------------------------------------
X = mx.zeros((2, 3, 4), dtype=C64)


@pytest.mark.parametrize("call,error,builtin,words", [
    (lambda: mx.fft.fft(X, n=2.5), DtypeError, TypeError, ["[fft]", "n must be an integer"]),
    (lambda: mx.fft.rfft2(X, s=(2, 3.0)), DtypeError, TypeError, ["[rfft2]", "s entry"]),
    (lambda: mx.fft.fftn(X, axes=1), DtypeError, TypeError, ["[fftn]", "axes"]),
    (lambda: mx.fft.fft(X, axis=None), DtypeError, TypeError, ["[fft]", "axis"]),
    (lambda: mx.fft.rfft(X, n=0), ArgumentError, ValueError, ["[rfft]", "n=0", "(2, 3, 4)"]),
    (lambda: mx.fft.ifftn(X, s=(2, -1), axes=(0, 1)), ArgumentError, ValueError,
     ["[ifftn]", "-1", "(2, 3, 4)"]),
    (lambda: mx.fft.irfft(mx.zeros((2, 1))), ArgumentError, ValueError, ["[irfft]", "n=0", "(2, 1)"]),
    (lambda: mx.fft.ifft(X, axis=3), AxisError, IndexError, ["[ifft] axis", "3", "dimension 3"]),
    (lambda: mx.fft.fft2(mx.zeros(4)), AxisError, IndexError, ["[fft2] axes", "-2"]),
    (lambda: mx.fft.fft2(X, axes=(0, -3)), AxisError, ValueError, ["[fft2]", "Duplicated",
                                                                   "(2, 3, 4)"]),
    (lambda: mx.fft.fftn(X, s=(2,), axes=(0, 1)), ShapeError, ValueError, ["[fftn]", "s=(2,)", "(2, 3, 4)"]),
    (lambda: mx.fft.irfftn(X, s=(2, 2)), ArgumentError, ValueError, ["[irfftn]", "axes"]),
    (lambda: mx.fft.fftn(mx.array(1.0)), ShapeError, ValueError, ["[fftn]", "0-d"]),
    (lambda: mx.fft.fft(X, norm="sideways"), ArgumentError, ValueError, ["[fft]", "'sideways'"]),
    (lambda: mx.fft.fft(X, norm=None), DtypeError, TypeError, ["[fft]", "norm"]),
    (lambda: mx.fft.fftshift(X, axes=(0, 3)), AxisError, ValueError, ["[fftshift]", "3",
                                                                       "(2, 3, 4)"]),
    (lambda: mx.fft.fftfreq(0), ArgumentError, ValueError, ["[fftfreq]", "n must be greater"]),
    (lambda: mx.fft.rfftfreq(4, d=0.0), ArgumentError, ValueError, ["[rfftfreq]", "d must"]),
    (lambda: mx.fft.fftfreq(4.0), DtypeError, TypeError, ["[fftfreq]", "n must be an integer"]),
], ids=lambda v: "" if callable(v) or isinstance(v, (type, list)) else str(v))
def test_bad_input_raises_a_clear_error(call, error, builtin, words):
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, (LazyxError, builtin))
    assert isinstance(info.value, builtin)
    for w in words:
        assert w in str(info.value), f"{w!r} not in {info.value}"


@pytest.mark.parametrize("value,want", [("pocketfft", "pocketfft"), ("POCKETFFT", "pocketfft"),
                                        ("fftw", "EnvironmentVariableError")])
def test_the_library_is_chosen_by_lazyx_cpu_fft(value, want):
    import os
    import subprocess
    import sys
    code = ("try:\n"
            "    import lazyx.core as mx, numpy as np\n"
            "    from lazyx.backends.cpu.kernels import fft as k\n"
            "    assert np.allclose(np.asarray(mx.fft.fft(mx.ones(4))), [4, 0, 0, 0])\n"
            "    print(k.library())\n"
            "except Exception as e:\n"
            "    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, LAZYX_CPU_FFT=value), timeout=120)
    assert out.stdout.split()[0] == want, out.stdout + out.stderr[-2000:]
    if want != "pocketfft":
        assert "LAZYX_CPU_FFT='fftw'" in out.stdout and "pocketfft" in out.stdout
