"""Axpby's Metal kernel (``axpby.metal``), checked without a Mac: its MSL runs on the CPU
through lazyx's C++ shim, bound exactly as the Metal backend binds it on a GPU, and must
agree with the package's NumPy kernel to the last bit."""

from importlib import resources

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.backend import backends, kernel_provider, resolve_kernel
from lazyx.codegen import jit
from lazyx.errors import DtypeError
from lazyx.testing import random_array, rng

pytest.importorskip("lazyx_axpby", reason="lazyx-axpby is not installed: pip install ./extensions_example")
from lazyx_axpby import Axpby  # noqa: E402
from lazyx_axpby.kernels import reference_kernel  # noqa: E402

pytest.importorskip("lazyx.backends.metal", reason="this lazyx has no Metal backend")
from lazyx.backends.metal import MetalKernel  # noqa: E402
from lazyx.backends.metal.kernel import plan_for_primitive  # noqa: E402

ALPHA, BETA = 1.75, -0.5
METAL_DTYPES = [mx.float32, mx.float16, mx.bfloat16]


@pytest.fixture(scope="module")
def kernel():
    """The kernel the Metal backend runs for Axpby: the plugin's, found through dispatch."""
    fn, provider = resolve_kernel(backends()["metal"], Axpby)
    assert isinstance(fn, MetalKernel), f"Axpby on metal is served by {provider}, not axpby.metal"
    return fn


@pytest.fixture
def compiler():
    if not jit.available():
        pytest.skip(f"no C++ compiler to run MSL on the CPU: {jit.missing_compiler_message()}")


def check(kernel, x, y, alpha=ALPHA, beta=BETA, msg=""):
    prim = Axpby(mx.default_stream(mx.cpu), alpha, beta)
    got = kernel.run_on_cpu(prim, [x, y])
    expected = reference_kernel(prim, [x, y])
    assert got.shape == np.broadcast_shapes(x.shape, y.shape) and got.dtype == x.dtype, msg
    # The same float32 arithmetic, rounded once: bit for bit.
    np.testing.assert_array_equal(got.reshape(-1).view(np.uint8),
                                  np.ascontiguousarray(expected).reshape(-1).view(np.uint8), err_msg=msg)
    exact = alpha * x.astype(np.float64) + beta * y.astype(np.float64)
    np.testing.assert_allclose(got.astype(np.float64), exact, rtol=1e-2, atol=1e-2, err_msg=msg)
    return got


def test_the_plugin_registers_the_metal_source_shipped_in_the_package(kernel):
    assert "lazyx-axpby" in kernel_provider("metal", Axpby)
    shipped = resources.files("lazyx_axpby").joinpath("axpby.metal")
    assert shipped.is_file(), "axpby.metal is missing from the installed package"
    assert "axpby_general" in kernel.source and kernel.source == shipped.read_text()


@pytest.mark.parametrize("dtype", METAL_DTYPES, ids=str)
def test_contiguous(kernel, compiler, dtype):
    gen = rng(0)
    for shape in [(7,), (3, 5), (2, 3, 4), ()]:
        x, y = random_array(shape, dtype, gen), random_array(shape, dtype, gen)
        assert plan_for_primitive(kernel, Axpby(None, 1.0, 1.0), [x, y]).function == \
            f"axpby_contiguous_{dtype.name}"
        check(kernel, x, y, msg=f"{shape}")


@pytest.mark.parametrize("dtype", METAL_DTYPES, ids=str)
@pytest.mark.parametrize("xs, ys", [((2, 3), (3,)), ((4, 1), (1, 5)), ((2, 1, 3), (4, 1)),
                                    ((), (2, 3)), ((3,), ()), ((1,), (1, 1, 1)), ((0, 3), (3,))])
def test_broadcasting(kernel, compiler, dtype, xs, ys):
    gen = rng(1)
    check(kernel, random_array(xs, dtype, gen), random_array(ys, dtype, gen), msg=f"{xs} {ys}")


@pytest.mark.parametrize("dtype", METAL_DTYPES, ids=str)
def test_transposed_and_strided(kernel, compiler, dtype):
    gen = rng(2)
    base = random_array((6, 8), dtype, gen)
    cases = {"transposed": (base.T, random_array((8, 6), dtype, gen)),
             "both transposed": (base.T, base.T[::-1]),
             "strided": (base[::2, 1::3], random_array((3, 3), dtype, gen)),
             "reversed": (base[::-1, ::-1], base),
             "strided broadcast": (base[:, ::2], random_array((8,), dtype, gen)[::2]),
             "column of a transpose": (base.T[:, 2:3], base.T),
             "3-d permuted": (random_array((2, 3, 4), dtype, gen).transpose(2, 0, 1),
                              random_array((2, 1), dtype, gen))}
    for name, (x, y) in cases.items():
        # Negative strides are copied first (a kernel indexes forwards): contiguous again.
        layout = "contiguous" if name == "reversed" else "general"
        assert plan_for_primitive(kernel, Axpby(None, 1.0, 1.0), [x, y]).function == \
            f"axpby_{layout}_{dtype.name}", name
        check(kernel, x, y, msg=name)


def test_parameters_reach_the_kernel(kernel, compiler):
    x, y = np.arange(4, dtype=np.float32), np.full(4, 10.0, np.float32)
    assert check(kernel, x, y, alpha=0.0, beta=1.0).tolist() == [10.0] * 4
    assert check(kernel, x, y, alpha=-3.0, beta=0.25).tolist() == [2.5, -0.5, -3.5, -6.5]


@pytest.mark.parametrize("dtype", [mx.float64, mx.complex64], ids=str)
def test_dtypes_metal_lacks_are_named(kernel, dtype):
    x = random_array((3,), dtype, rng(3))
    with pytest.raises(DtypeError, match=f"no kernel for dtype {dtype.name}; it supports "
                                         f"float32, float16, bfloat16"):
        kernel.run_on_cpu(Axpby(None, 1.0, 1.0), [x, x])
