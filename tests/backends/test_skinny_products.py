"""float32 products with a side of at most 16 (``skinny_matmul_float32``, the cpu
backend's ``_skinny_product``): the last layer of a network, its weight gradient and its
input gradient. Against float64 NumPy, in every orientation and layout, with the
threads split, and the layouts the loops do not read going to BLAS."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lazyx.core as mx
from lazyx.backends.cpu import native_kernels
from lazyx.backends.cpu.kernels import products

native = native_kernels.load()
pytestmark = [pytest.mark.skipif(native is None or not hasattr(native, "skinny_matmul_float32"),
                                 reason="the native module was not built"),
              pytest.mark.usefixtures("cpu_backend")]


def _check(got, a, b):
    want = a.astype(np.float64) @ b.astype(np.float64)
    # float32 sums of k terms: a few ulps of the sum of the terms' magnitudes
    bound = 4e-7 * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)) * max(1, a.shape[1]) ** 0.5
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.all(np.abs(got - want) <= bound + 1e-30), np.abs(got - want).max()


def _layout(x, transposed):
    """``x`` itself, or the same values as the transpose of a C-contiguous array."""
    return np.ascontiguousarray(x.T).T if transposed else x


@pytest.mark.parametrize("shape", [(256, 10, 512), (256, 512, 10), (10, 256, 512), (1, 300, 700),
                                   (700, 1, 300), (300, 700, 1), (16, 999, 33), (37, 16, 1001),
                                   (1001, 777, 16), (3, 5000, 7)])
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_every_orientation_and_layout(shape, ta, tb):
    m, k, n = shape
    rng = np.random.default_rng(m * 7 + k * 3 + n)
    a = _layout(rng.standard_normal((m, k)).astype(np.float32), ta)
    b = _layout(rng.standard_normal((k, n)).astype(np.float32), tb)
    out, d = products._product(a, b)
    assert d == np.float32
    _check(np.asarray(out), a, b)
    _check(np.asarray(mx.array(a) @ mx.array(b)), a, b)


@pytest.mark.parametrize("num_threads", [1, 2, 3])
def test_threads(num_threads):
    before = native.set_num_threads(num_threads)
    try:
        rng = np.random.default_rng(num_threads)
        for m, k, n in [(1000, 16, 1000), (16, 1000, 1000), (1000, 1000, 16), (999, 3, 17)]:
            a = rng.standard_normal((m, k)).astype(np.float32)
            b = rng.standard_normal((k, n)).astype(np.float32)
            out = products._skinny_product(a, b)  # the small operand in its loop's layout
            assert out is not None
            _check(out, a, b)
    finally:
        native.set_num_threads(before)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 16), st.integers(1, 300), st.integers(1, 300), st.integers(0, 2),
       st.booleans(), st.booleans())
def test_random_shapes(small, big1, big2, which, ta, tb):
    """The small side in each position, tails of every length (not multiples of the
    vector width), both operand layouts; the product whatever path it takes."""
    dims = [big1, big2]
    dims.insert(which, small)
    m, k, n = dims
    rng = np.random.default_rng(m + 31 * k + 977 * n)
    a = _layout(rng.standard_normal((m, k)).astype(np.float32), ta)
    b = _layout(rng.standard_normal((k, n)).astype(np.float32), tb)
    _check(np.asarray(products._product(a, b)[0]), a, b)


def test_non_finite_values_propagate():
    rng = np.random.default_rng(3)
    for m, k, n in [(256, 10, 512), (10, 256, 512), (256, 512, 10)]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        a[1, 2] = np.nan
        b[3, 4] = np.inf
        out = products._skinny_product(a, b)
        assert out is not None
        with np.errstate(invalid="ignore"):
            want = a.astype(np.float64) @ b
        np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
        np.testing.assert_array_equal(np.isinf(out), np.isinf(want))


def test_empty_inner_dimension_gives_zeros():
    a = np.ones((40, 0), np.float32)
    b = np.ones((0, 5000), np.float32)
    out = np.full((40, 5000), 7.0, np.float32)
    assert native.skinny_matmul_float32(a, b, out)
    assert not out.any()


def test_layouts_the_loops_do_not_read_go_to_blas():
    rng = np.random.default_rng(9)
    a = rng.standard_normal((8, 600)).astype(np.float32)
    b = np.asfortranarray(rng.standard_normal((600, 500)).astype(np.float32))  # M small, b by columns
    out = np.full((8, 500), 7.0, np.float32)
    assert native.skinny_matmul_float32(a, b, out) is False
    assert (out == 7.0).all()  # untouched
    assert products._skinny_product(a, b) is None
    _check(np.asarray(products._product(a, b)[0]), a, b)


def test_bad_arguments_raise():
    a = np.ones((4, 3), np.float32)
    with pytest.raises(ValueError, match="skinny_matmul"):
        native.skinny_matmul_float32(a, np.ones((2, 5), np.float32), np.empty((4, 5), np.float32))
    with pytest.raises(ValueError, match="skinny_matmul"):
        native.skinny_matmul_float32(a, np.ones((3, 5), np.float32), np.empty((4, 6), np.float32))
    with pytest.raises(TypeError):
        native.skinny_matmul_float32(a.astype(np.float64), np.ones((3, 5), np.float32),
                                     np.empty((4, 5), np.float32))
