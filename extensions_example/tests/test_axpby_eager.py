"""axpby evaluated eagerly, against NumPy, on every available CPU backend."""

import math

import ml_dtypes
import numpy as np
import pytest

import lazyx.core as mx
from lazyx.errors import ArgumentError, DtypeError, KernelNotFoundError, ShapeError
from lazyx.testing import (ALL_DTYPES, FLOAT_DTYPES, assert_close, check_op, random_array, rng,
                           to_lazyx)

pytest.importorskip("lazyx_axpby", reason="lazyx-axpby is not installed: pip install ./extensions_example")
from lazyx_axpby import Axpby, axpby  # noqa: E402
from lazyx_axpby import kernels  # noqa: E402

ALPHA, BETA = 1.75, -0.5


def reference(x, y, alpha=ALPHA, beta=BETA):
    return alpha * x + beta * y


def result_dtype(d):
    """MLX's dtype of alpha * x + beta * y for Python floats: floating kept, else float32."""
    return d if d.kind in "fc" else mx.float32


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype_against_numpy(lazyx_backend, dtype):
    gen = rng(1)
    x, y = random_array((3, 4), dtype, gen), random_array((3, 4), dtype, gen)
    check_op(lambda a, b: axpby(a, b, ALPHA, BETA), reference, x, y, dtype=result_dtype(dtype),
             msg=f"{dtype} on {lazyx_backend}")


@pytest.mark.parametrize("xs, ys", [((2, 3), (3,)), ((4, 1), (1, 5)), ((2, 1, 3), (4, 1)),
                                    ((), (2, 3)), ((3,), ()), ((), ()), ((0, 3), (3,)),
                                    ((2, 0), (1, 1)), ((1,), (1, 1, 1))])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_broadcasting(lazyx_backend, xs, ys, dtype):
    gen = rng(2)
    out = check_op(lambda a, b: axpby(a, b, ALPHA, BETA), reference, random_array(xs, dtype, gen),
                   random_array(ys, dtype, gen), dtype=dtype)
    assert out.shape == np.broadcast_shapes(xs, ys)


def _views(gen, dtype):
    base = random_array((6, 8), dtype, gen)
    return {"transposed": (base.T, random_array((8, 6), dtype, gen)),
            "strided": (base[::2, 1::3], random_array((3, 3), dtype, gen)),
            "reversed": (base[::-1, ::-1], base),
            "broadcast row": (base[:, ::2], random_array((8,), dtype, gen)[::2]),
            "column of a transpose": (base.T[:, 2:3], base.T)}


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32, mx.float64, mx.complex64], ids=str)
def test_non_contiguous_inputs(lazyx_backend, dtype):
    for name, (x, y) in _views(rng(3), dtype).items():
        check_op(lambda a, b: axpby(a, b, ALPHA, BETA), reference, x, y, dtype=dtype, msg=name)
        # Views made by lazyx ops (transpose, slicing) reach the kernel as NumPy views.
        lx = mx.transpose(to_lazyx(np.ascontiguousarray(x.T)))[::1]
        check_op(lambda b: axpby(lx, b, ALPHA, BETA), lambda b: reference(x.astype(b.dtype), b), y,
                 dtype=dtype, msg=f"{name}, lazyx views")


@pytest.mark.parametrize("a, b, expected", [
    (mx.int8, mx.float16, mx.float16), (mx.uint32, mx.int32, mx.float32),
    (mx.float16, mx.bfloat16, mx.float32), (mx.bool_, mx.float64, mx.float64),
    (mx.uint8, mx.bfloat16, mx.bfloat16), (mx.int64, mx.complex64, mx.complex64),
    (mx.uint64, mx.int8, mx.float32), (mx.bool_, mx.bool_, mx.float32)])
def test_mixed_dtypes_promote_then_become_floating(a, b, expected):
    gen = rng(4)
    check_op(lambda p, q: axpby(p, q, ALPHA, BETA), reference, random_array((2, 3), a, gen),
             random_array((3,), b, gen), dtype=expected)


def test_python_scalars_are_weak():
    x = mx.array([1.0, 2.0], dtype=mx.float16)
    assert_close(axpby(x, 3, 2.0, 0.5), np.array([3.5, 5.5]), mx.float16)
    assert_close(axpby(2.5, x, 2.0, 1.0), np.array([6.0, 7.0]), mx.float16)
    assert_close(axpby(2, 3, 2.0, 1.0), np.array(7.0), mx.float32)
    assert_close(axpby(mx.array([1, 2], dtype=mx.int16), 2, 0.5, 1.0), np.array([2.5, 3.0]), mx.float32)


def test_alpha_and_beta_are_converted_to_float():
    x, y = mx.array([1.0, 2.0]), mx.array([3.0, 4.0])
    for alpha, beta in [(2, 1), (np.float32(2.0), np.int64(1)), (True, 1.0)]:
        node = axpby(x, y, alpha, beta)
        assert type(node._prim.alpha) is float and type(node._prim.beta) is float
        assert_close(node, np.array([float(alpha) + 3.0, 2 * float(alpha) + 4.0]), mx.float32)


def test_special_values(lazyx_backend):
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e38], np.float32)
    y = np.array([1.0, np.inf, 0.0, -0.0, -0.0, 1e38], np.float32)
    got = np.array(axpby(mx.array(x), mx.array(y), 2.0, 3.0))
    with np.errstate(all="ignore"):
        want = 2.0 * x + 3.0 * y
    np.testing.assert_array_equal(got, want)
    assert np.signbit(got[4])  # -0.0 * 2 + -0.0 * 3 keeps its sign


@pytest.mark.parametrize("args, error, match", [
    (([[1.0, 2.0, 3.0]], [1.0, 2.0], 1.0, 1.0), ShapeError, r"\(1, 3\).*\(2,\)"),
    (([1.0], [1.0], "2", 1.0), ArgumentError, "alpha must be a real Python number"),
    (([1.0], [1.0], 1.0, 1j), ArgumentError, "beta must be a real Python number"),
    (([1.0], [1.0], mx.array(1.0), 1.0), ArgumentError, "alpha"),
])
def test_bad_input_raises_at_the_call_and_leaves_other_arrays_alone(args, error, match):
    good = axpby(mx.array([1.0, 2.0]), mx.array([3.0, 4.0]), 2.0, 1.0)
    x, y, alpha, beta = args
    with pytest.raises(error, match=match):
        axpby(mx.array(x), mx.array(y), alpha, beta)
    assert good.tolist() == [5.0, 8.0]


def test_is_equivalent_compares_alpha_and_beta():
    s = mx.default_stream(mx.cpu)
    p = Axpby(s, 1.0, 2.0)
    assert p.is_equivalent(Axpby(s, 1.0, 2.0))
    assert not p.is_equivalent(Axpby(s, 1.0, 2.5))
    assert not p.is_equivalent(Axpby(s, -1.0, 2.0))
    assert not Axpby(s, 0.0, 1.0).is_equivalent(Axpby(s, -0.0, 1.0))
    assert Axpby(s, math.nan, 1.0).is_equivalent(Axpby(s, math.nan, 1.0))
    assert not p.is_equivalent(mx.Primitive(s))
    assert p.params() == (1.0, 2.0)


def test_gpu_kernels_come_per_backend():
    # The plugin registers its CUDA kernel for the backend "cuda"; any other GPU backend
    # without one of its own gets Axpby.eval_gpu, which says where the kernels are.
    assert "axpby" in mx.kernel_provider("cuda", "Axpby")
    p = Axpby(mx.default_stream(mx.cpu), 1.0, 1.0)
    with pytest.raises(KernelNotFoundError, match="'cuda'"):
        p.eval_gpu([np.ones(2, np.float32), np.ones(2, np.float32)])


# -- the C++ kernel itself --------------------------------------------------------------
needs_native = pytest.mark.skipif(kernels.NATIVE_ERROR is not None,
                                  reason=f"native module not importable: {kernels.NATIVE_ERROR}")
NATIVE_DTYPES = [np.float32, np.float64, np.complex64, np.float16, ml_dtypes.bfloat16]


@needs_native
@pytest.mark.parametrize("npd", NATIVE_DTYPES, ids=lambda d: np.dtype(d).name)
def test_native_kernel_matches_numpy_on_every_layout(npd):
    gen = rng(5)
    p = Axpby(mx.default_stream(mx.cpu), -0.375, 2.5)
    base = gen.uniform(-3, 3, (5, 6, 7)).astype(npd)
    other = gen.uniform(-3, 3, (5, 6, 7)).astype(npd)
    layouts = [(base, other), (base, other[0, 0]), (base[0, 0], other), (base.transpose(2, 0, 1), other[0, :, 0]),
               (base[::-1, :, ::2], other[:, :1, ::2]), (np.broadcast_to(base[:, :1], (5, 6, 7)), other),
               (base[..., 3], np.asarray(other[0, 0, 0])), (np.asarray(base[1, 2, 3]), np.asarray(other[0, 0, 0])),
               (base[:, 2:2], other[:, 2:2]), (base[:1, None], other[:, :, None, 0])]
    for k, (x, y) in enumerate(layouts):
        got = kernels.native_kernel(p, [x, y])
        want = kernels.reference_kernel(p, [x, y])
        assert got.dtype == want.dtype and got.shape == want.shape, k
        assert got.flags.c_contiguous
        rtol = 1e-6 if np.dtype(npd).itemsize >= 4 else 1e-2
        np.testing.assert_allclose(got.astype(np.complex128), want.astype(np.complex128), rtol=rtol,
                                   atol=rtol, err_msg=f"layout {k}")


@needs_native
@pytest.mark.parametrize("npd", [np.float16, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
def test_native_half_rounding_is_numpys(npd):
    # Random bit patterns cover normals, subnormals, zeros, infinities and overflow;
    # x + y is exact in float32, so the result checks the rounding to the half type alone.
    gen = rng(6)
    bits = gen.integers(0, 1 << 16, (2, 1 << 16), dtype=np.uint16)
    x, y = bits[0].view(npd), bits[1].view(npd)
    x = np.where(np.isnan(x.astype(np.float32)), np.zeros_like(x), x)
    p = Axpby(mx.default_stream(mx.cpu), 1.0, 1.0)
    got = kernels.native_kernel(p, [x, y])
    with np.errstate(all="ignore"):
        want = (x.astype(np.float32) + y.astype(np.float32)).astype(npd)
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])


@needs_native
def test_native_kernel_rejects_what_it_cannot_run():
    p = Axpby(mx.default_stream(mx.cpu), 1.0, 1.0)
    with pytest.raises(DtypeError, match="int32"):
        kernels.native_kernel(p, [np.ones(2, np.int32), np.ones(2, np.int32)])
    with pytest.raises(DtypeError, match="float32 with float64"):
        kernels.native_kernel(p, [np.ones(2, np.float32), np.ones(2, np.float64)])
    with pytest.raises(ValueError, match="does not broadcast"):
        kernels._ext.axpby(np.ones(3, np.float32), np.ones(2, np.float32), np.empty(3, np.float32),
                           1.0, 1.0, "float32")
