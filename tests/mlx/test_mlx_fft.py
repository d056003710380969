"""``lazyx.core.fft`` against ``mlx.core.fft`` 0.32.2: the same calls on both.

Every function over input dtypes, sizes (``n``/``s`` truncating and padding),
axes and normalisations; the bad-input cases (both raise the same built-in
exception type); and the transforms: vjp with random cotangents, jvp and vmap.
"""

import numpy as np
import pytest

from mlx_compat import requires_mlx, same

pytestmark = requires_mlx

GEN = np.random.default_rng(13)
REAL = GEN.standard_normal((3, 4, 6)).astype(np.float32)
CPLX = (GEN.standard_normal((3, 4, 6)) + 1j * GEN.standard_normal((3, 4, 6))).astype(np.complex64)
# Sums of a few dozen float32 terms: compare with an absolute tolerance too.
TOL = {"rtol": 1e-4, "atol": 1e-4}

ONE_AXIS = ["fft", "ifft", "rfft", "irfft"]
MANY_AXES = ["fft2", "ifft2", "rfft2", "irfft2", "fftn", "ifftn", "rfftn", "irfftn"]


def _input(m, name, data=None):
    """Complex data for the transforms that read complex, real for rfft*."""
    if data is None:
        data = REAL if name.startswith("rfft") else CPLX
    return m.array(data)


@pytest.mark.parametrize("name", ONE_AXIS)
@pytest.mark.parametrize("kwargs", [{}, {"n": 3}, {"n": 9, "axis": 1}, {"axis": 0, "norm": "ortho"},
                                    {"n": 5, "axis": -2, "norm": "forward"}, {"n": 1}],
                         ids=str)
def test_one_axis(name, kwargs):
    same(lambda m: getattr(m.fft, name)(_input(m, name), **kwargs), **TOL)


@pytest.mark.parametrize("name", MANY_AXES)
@pytest.mark.parametrize("kwargs", [{}, {"axes": (0, 2)}, {"axes": [2, 0]}, {"axes": (1,)},
                                    {"s": (3, 5), "axes": (0, 2)}, {"s": (7, 2), "axes": (-1, 1)},
                                    {"axes": None}, {"axes": ()}, {"norm": "ortho"},
                                    {"s": (2, 3, 4), "axes": (0, 1, 2), "norm": "forward"}],
                         ids=str)
def test_many_axes(name, kwargs):
    if "s" in kwargs and name.endswith("2") and len(kwargs["s"]) == 3:
        kwargs = dict(kwargs, s=(2, 3), axes=(0, 1))
    same(lambda m: getattr(m.fft, name)(_input(m, name), **kwargs), **TOL)


@pytest.mark.parametrize("name", ["fft2", "rfft2", "irfft2", "ifftn"])
def test_s_without_axes(name):
    # The 2-D functions default to the last two axes; the n-D ones refuse s alone.
    same(lambda m: getattr(m.fft, name)(_input(m, name), s=(3, 5)), **TOL)


@pytest.mark.parametrize("dtype", ["bool_", "uint8", "int32", "int64", "float16", "bfloat16",
                                   "float32", "float64", "complex64"])
@pytest.mark.parametrize("name", ["fft", "rfft", "irfft", "ifft2", "rfftn"])
def test_dtypes(name, dtype):
    data = np.abs(REAL[0]) * 3

    def call(m):
        x = m.array(data).astype(getattr(m, dtype)) if dtype != "complex64" else m.array(CPLX[0])
        return getattr(m.fft, name)(x)
    # float16 / bfloat16 inputs are rounded before the transform on both sides.
    same(call, rtol=1e-3, atol=1e-3)


def test_empty_batch():
    same(lambda m: m.fft.fft(m.zeros((0, 4))))
    same(lambda m: m.fft.irfft(m.zeros((0, 4))))


@pytest.mark.parametrize("call", [
    lambda m: m.fft.fft(m.array(CPLX), n=0),
    lambda m: m.fft.fft(m.array(CPLX), n=-2),
    lambda m: m.fft.fft(m.array(CPLX), n=2.5),
    lambda m: m.fft.rfft(m.array(REAL), n=3.0),
    lambda m: m.fft.fft(m.array(CPLX), axis=3),
    lambda m: m.fft.ifft(m.array(CPLX), axis=-4),
    lambda m: m.fft.fft(m.array(CPLX), axis=1.0),
    lambda m: m.fft.fft(m.array(CPLX), axis=None),
    lambda m: m.fft.fft(m.array(1.0)),
    lambda m: m.fft.fftn(m.array(1.0)),
    lambda m: m.fft.fft2(m.zeros(4)),
    lambda m: m.fft.fft2(m.array(CPLX), axes=(0, 0)),
    lambda m: m.fft.rfftn(m.array(REAL), axes=(0, -3)),
    lambda m: m.fft.fftn(m.array(CPLX), axes=(0, 5)),
    lambda m: m.fft.ifftn(m.array(CPLX), axes=1),
    lambda m: m.fft.fftn(m.array(CPLX), axes=(0, 1.0)),
    lambda m: m.fft.fftn(m.array(CPLX), s=(2,), axes=(0, 1)),
    lambda m: m.fft.fftn(m.array(CPLX), s=(2, 3)),
    lambda m: m.fft.irfftn(m.array(CPLX), s=(0, 2), axes=(0, 1)),
    lambda m: m.fft.rfft2(m.array(REAL), s=(2, 2.5)),
    lambda m: m.fft.irfft(m.zeros((2, 1))),
    lambda m: m.fft.fft(m.zeros((2, 0))),
    lambda m: m.fft.fft(m.array(CPLX), norm="sideways"),
    lambda m: m.fft.fft(m.array(CPLX), norm=None),
    lambda m: m.fft.fftshift(m.array(REAL), axes=3),
    lambda m: m.fft.ifftshift(m.array(REAL), axes=(0, -4)),
    lambda m: m.fft.fftshift(m.array(REAL), axes=1.0),
    lambda m: m.fft.fftfreq(0),
    lambda m: m.fft.fftfreq(-3),
    lambda m: m.fft.fftfreq(2.5),
    lambda m: m.fft.rfftfreq(4, d=0),
    lambda m: m.fft.rfftfreq(0),
], ids=lambda f: f.__code__.co_firstlineno)
def test_bad_input_raises_as_mlx(call):
    # Both raise, exceptions of the same built-in type (the harness checks).
    assert same(call) is None


@pytest.mark.parametrize("axes", [None, 0, -1, (0, 2), (1, 1), ()], ids=str)
@pytest.mark.parametrize("name", ["fftshift", "ifftshift"])
def test_shifts(name, axes):
    same(lambda m: getattr(m.fft, name)(m.array(REAL[:, :3, :5]), axes=axes))
    same(lambda m: getattr(m.fft, name)(m.arange(7), axes=axes if axes in (None, 0, -1) else None))


@pytest.mark.parametrize("n", [1, 2, 5, 8])
@pytest.mark.parametrize("d", [1.0, 0.1, -2, 3])
def test_frequencies(n, d):
    same(lambda m: m.fft.fftfreq(n, d))
    same(lambda m: m.fft.rfftfreq(n, d=d))


# -- transforms --------------------------------------------------------------------
GRAD_CASES = [
    ("fft", {}), ("ifft", {"n": 4, "norm": "ortho"}), ("fft", {"n": 8, "axis": 0}),
    ("rfft", {}), ("rfft", {"n": 5, "norm": "forward"}), ("irfft", {}), ("irfft", {"n": 5}),
    ("fft2", {"norm": "forward"}), ("ifftn", {"axes": (0, 2)}), ("rfft2", {"s": (3, 5)}),
    ("rfftn", {"axes": (1, 0)}), ("irfft2", {}), ("irfftn", {"s": (4, 3, 7), "norm": "ortho",
                                                             "axes": (0, 1, 2)}),
]


def _cotangent(shape, dtype):
    c = GEN.standard_normal(shape)
    if dtype == "complex64":
        c = c + 1j * GEN.standard_normal(shape)
    return c.astype(dtype)


@pytest.mark.parametrize("name,kwargs", GRAD_CASES, ids=str)
def test_vjp(name, kwargs):
    data = REAL if name.startswith("rfft") else CPLX
    out = getattr(np.fft, name)(data.astype(np.complex128 if data.dtype.kind == "c" else np.float64),
                                **kwargs)
    cot = _cotangent(out.shape, "float32" if name.startswith("irfft") else "complex64")

    def call(m):
        f = getattr(m.fft, name)
        return m.vjp(lambda x: [f(x, **kwargs)], [m.array(data)], [m.array(cot)])[1][0]
    same(call, **TOL)


# MLX 0.32.2's jvp of irfft drops an odd n (its tangent has the length of the even n
# below it, not the output's); lazyx transforms the tangent like the primal, which
# tests/plugins/test_fft.py checks against NumPy.
JVP_CASES = [c for c in GRAD_CASES[:8] if c != ("irfft", {"n": 5})]


@pytest.mark.parametrize("name,kwargs", JVP_CASES, ids=str)
def test_jvp(name, kwargs):
    data = REAL if name.startswith("rfft") else CPLX
    tangent = _cotangent(data.shape, str(data.dtype))

    def call(m):
        f = getattr(m.fft, name)
        return m.jvp(lambda x: [f(x, **kwargs)], [m.array(data)], [m.array(tangent)])[1][0]
    same(call, **TOL)


@pytest.mark.parametrize("name,kwargs,in_axes", [
    ("fft", {}, 0), ("ifft2", {}, 2), ("rfft", {"n": 5}, 1), ("irfftn", {"axes": (0, 2)}, 1),
    ("rfft2", {"norm": "ortho"}, 2), ("irfft", {"axis": 0}, 0)], ids=str)
def test_vmap(name, kwargs, in_axes):
    data = REAL if name.startswith("rfft") else CPLX

    def call(m):
        f = getattr(m.fft, name)
        return m.vmap(lambda x: f(x, **kwargs), in_axes=in_axes)(m.array(data))
    same(call, **TOL)


def test_grad_of_a_spectral_loss():
    # A real loss through rfft, a complex product and irfft: a circular convolution.
    kernel = GEN.standard_normal(6).astype(np.float32)

    def call(m):
        k = m.fft.rfft(m.array(kernel))

        def loss(x):
            y = m.fft.irfft(m.fft.rfft(x) * k, n=6)
            return m.sum(y * y)
        return m.grad(loss)(m.array(REAL))
    same(call, **TOL)
