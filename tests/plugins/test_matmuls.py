"""The matmuls pack (gather_mm, block_masked_mm, segmented_mm, hadamard_transform)
against NumPy float64 references: values, dtypes, broadcasting, bad input, gradients
by finite differences, vmap against a loop, and under compile."""

import numpy as np
import pytest

import lazyx.core as mx
from helpers import assert_close, check_jvp_vjp, check_vjp_fd, check_vmap_loop
from lazyx.errors import DtypeError, IndexOutOfRangeError, ShapeError, ArgumentError, TransformError
from lazyx.backends.cpu.kernels.matmuls import hadamard_matrix

GEN = np.random.default_rng(5)


def normal(*shape):
    return GEN.standard_normal(shape)


def up(mask, block, rows, cols):
    return np.repeat(np.repeat(mask, block, -2), block, -1)[..., :rows, :cols]


def masked_ref(a, b, block, mo=None, ml=None, mr=None):
    a, b = np.array(a, np.float64), np.array(b, np.float64)
    if ml is not None:
        a = a * up(ml, block, *a.shape[-2:])
    if mr is not None:
        b = b * up(mr, block, *b.shape[-2:])
    out = a @ b
    return out if mo is None else out * up(mo, block, *out.shape[-2:])


# -- gather_mm -----------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["cpu", "cpu-reference"])
def test_gather_mm_matches_numpy_with_broadcast_indices(backend):
    a, b = normal(3, 2, 2, 4), normal(5, 4, 6)
    li, ri = np.array([[0], [5], [3]]), np.array([1, 4, 0, 2])
    with mx.use_backend("cpu", backend):
        got = mx.gather_mm(mx.array(a, mx.float32), mx.array(b, mx.float32), mx.array(li),
                           mx.array(ri, mx.uint32))
    want = a.reshape(-1, 2, 4)[np.broadcast_to(li, (3, 4))] @ b[np.broadcast_to(ri, (3, 4))]
    assert_close(got, want, mx.float32)


def test_gather_mm_absent_index_vectors_sorted_and_dtypes():
    a, b = normal(4), normal(3, 4, 2)
    ri = np.array([0, 0, 1, 2, 2])
    got = mx.gather_mm(mx.array(a, mx.float16), mx.array(b, mx.float16), None, mx.array(ri),
                       sorted_indices=True)
    assert_close(got, np.stack([a @ b[r] for r in ri]), mx.float16)
    # An absent lhs index is every batch position of a, broadcast against rhs.
    a2 = normal(2, 3, 4)
    got = mx.gather_mm(mx.array(a2), mx.array(b), None, mx.array([[1], [2]]))
    assert_close(got, np.stack([[a2[i] @ b[r] for i in range(2)] for r in (1, 2)]), mx.float32)
    # Both absent: a plain matmul.
    e = normal(4, 5)
    assert_close(mx.gather_mm(mx.array(a2), mx.array(e)), a2 @ e, mx.float32)


@pytest.mark.parametrize("call, error, words", [
    (lambda: mx.gather_mm(mx.ones((3, 2, 4)), mx.ones((5, 3, 6)), mx.array([0]), mx.array([0])),
     ShapeError, "(5, 3, 6)"),
    (lambda: mx.gather_mm(mx.ones((3, 2, 4)), mx.ones((5, 4, 6)), mx.array([0.5]), mx.array([0])),
     DtypeError, "integral"),
    (lambda: mx.gather_mm(mx.ones((2, 4), mx.int32), mx.ones((4, 5), mx.int32), mx.array([0]),
                          mx.array([0])), DtypeError, "real floating"),
    (lambda: mx.gather_mm(mx.ones((3, 2, 4)), mx.ones((5, 4, 6)), mx.array([0, 1]),
                          mx.array([0, 1, 2])), ShapeError, "lhs_indices with shape (2,)"),
])
def test_gather_mm_bad_input(call, error, words):
    with pytest.raises(error, match=None) as info:
        call()
    assert words in str(info.value) and "[gather_mm]" in str(info.value)


@pytest.mark.parametrize("backend", ["cpu", "cpu-reference"])
def test_gather_mm_index_out_of_range_at_evaluation(backend):
    with mx.use_backend("cpu", backend):
        out = mx.gather_mm(mx.ones((3, 2, 4)), mx.ones((5, 4, 6)), mx.array([3]), mx.array([0]))
        with pytest.raises(IndexOutOfRangeError, match=r"lhs_indices holds 3, outside \[0, 3\)"):
            mx.eval(out)
        out = mx.gather_mm(mx.ones((3, 2, 4)), mx.ones((5, 4, 6)), mx.array([0]), mx.array([-1]))
        with pytest.raises(IndexOutOfRangeError, match="rhs_indices"):
            mx.eval(out)


def test_gather_mm_gradients_vmap_compile():
    a, b = normal(3, 2, 4), normal(2, 4, 3)
    li, ri = mx.array([[0, 2], [2, 2]]), mx.array([1, 0])
    f = lambda a, b: mx.gather_mm(a, b, li, ri)  # noqa: E731
    check_vjp_fd(f, a, b)
    check_jvp_vjp(f, a, b)
    check_vmap_loop(lambda a, b, i: mx.gather_mm(a, b, i, ri), np.stack([a, 2 * a]),
                    b, np.array([[0, 1], [2, 0]], np.int32), in_axes=(0, None, 0))
    check_vmap_loop(f, a, np.stack([b, -b], 2), in_axes=(None, 2))
    x, y = mx.array(a, mx.float32), mx.array(b, mx.float32)
    assert_close(mx.compile(lambda x, y: mx.exp(f(x, y)) * 2)(x, y), np.exp(np.array(f(x, y))) * 2)


# -- block_masked_mm ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["cpu", "cpu-reference"])
def test_block_masked_mm_bool_and_float_masks(backend):
    a, b = normal(2, 70, 40), normal(40, 33)
    mo, ml, mr = GEN.random((3, 2)) < 0.5, normal(2, 3, 2), GEN.random((2, 2)) < 0.7
    a[0, :10, :10] = np.nan  # a zeroed tile of a keeps its NaNs out when masked by bool...
    ml[0, 0, 0] = 1.0        # ...but a float mask multiplies, so keep that tile unmasked
    with mx.use_backend("cpu", backend):
        got = mx.block_masked_mm(mx.array(a, mx.float32), mx.array(b, mx.float32), 32,
                                 mx.array(mo), mx.array(ml, mx.float32), mx.array(mr))
    want = masked_ref(a, b, 32, mo, ml, mr)
    rows = np.repeat(np.repeat(mo, 32, 0), 32, 1)[:70, :33]
    np.testing.assert_array_equal(np.isnan(np.array(got)), np.isnan(want) & rows[None])
    assert_close(mx.array(np.nan_to_num(np.array(got))), np.nan_to_num(want * rows[None]),
                 mx.float32, atol=1e-4)


def test_block_masked_mm_no_mask_and_bad_input():
    a, b = normal(40, 3), normal(3, 4)
    assert_close(mx.block_masked_mm(mx.array(a), mx.array(b), 2), a @ b, mx.float32)
    with pytest.raises(ArgumentError, match="block_size must be a positive integer"):
        mx.block_masked_mm(mx.array(a), mx.array(b), 0)
    with pytest.raises(ArgumentError, match="Only block_sizes 32, 64 are supported, got block size 16"):
        mx.block_masked_mm(mx.array(a), mx.array(b), 16, mx.ones((3, 1)))
    with pytest.raises(ShapeError, match=r"mask_lhs must have shape \(\.\.\., 2, 1\).*got \(2, 2\)"):
        mx.block_masked_mm(mx.array(a), mx.array(b), 32, None, mx.ones((2, 2)))
    with pytest.raises(ShapeError, match="batch dimensions"):
        mx.block_masked_mm(mx.ones((2, 40, 3)), mx.array(b), 32, mx.ones((3, 2, 1)))
    with pytest.raises(DtypeError, match="real floating"):
        mx.block_masked_mm(mx.ones((4, 4), mx.int32), mx.ones((4, 4), mx.int32), 32, mx.ones((1, 1)))


def test_block_masked_mm_gradients_vmap():
    a, b = normal(2, 40, 3), normal(3, 36)
    mo, ml, mr = normal(2, 2), normal(2, 1), normal(1, 2)
    f = lambda a, b, mo, ml, mr: mx.block_masked_mm(a, b, 32, mo, ml, mr)  # noqa: E731
    check_vjp_fd(f, a, b, mo, ml, mr)
    check_jvp_vjp(f, a, b, mo, ml, mr)
    bo = mx.array(GEN.random((2, 2)) < 0.5)
    check_vjp_fd(lambda a, b: mx.block_masked_mm(a, b, 32, bo), a, b)
    check_vmap_loop(f, np.stack([a, -a]), b, mo, np.stack([ml, 2 * ml]), mr,
                    in_axes=(0, None, None, 0, None))


# -- segmented_mm --------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["cpu", "cpu-reference"])
def test_segmented_mm_matches_numpy(backend):
    a, b = normal(5, 10), normal(10, 3)
    seg = np.array([[[0, 4], [4, 10]], [[3, 3], [6, 2]]])
    with mx.use_backend("cpu", backend):
        got = mx.segmented_mm(mx.array(a), mx.array(b), mx.array(seg))
    want = np.stack([a[:, s:e] @ b[s:e] if e > s else np.zeros((5, 3))
                     for s, e in seg.reshape(-1, 2)]).reshape(2, 2, 5, 3)
    assert_close(got, want, mx.float32)


def test_segmented_mm_bad_input_and_rules():
    a, b = normal(2, 5), normal(5, 3)
    with pytest.raises(DtypeError, match="Segments must be integral"):
        mx.segmented_mm(mx.array(a), mx.array(b), mx.array([[0.0, 1.0]]))
    with pytest.raises(ShapeError, match=r"shape \(\.\.\., 2\) but \(4,\)"):
        mx.segmented_mm(mx.array(a), mx.array(b), mx.array([0, 1, 2, 3]))
    with pytest.raises(ShapeError, match="Batched matmul not supported"):
        mx.segmented_mm(mx.ones((2, 2, 5)), mx.array(b), mx.array([[0, 1]]))
    with pytest.raises(ShapeError, match=r"\(2, 5\).*\(4, 3\)"):
        mx.segmented_mm(mx.array(a), mx.ones((4, 3)), mx.array([[0, 1]]))
    with pytest.raises(IndexOutOfRangeError, match=r"outside \[0, 5\]"):
        mx.eval(mx.segmented_mm(mx.array(a), mx.array(b), mx.array([[0, 6]])))
    seg = mx.array([[0, 2], [1, 5], [4, 4]])
    f = lambda a, b: mx.segmented_mm(a, b, seg)  # noqa: E731
    check_vjp_fd(f, a, b)
    check_jvp_vjp(f, a, b)
    check_vmap_loop(f, np.stack([a, 3 * a]), np.stack([b, b + 1]), in_axes=(0, 0))
    check_vmap_loop(lambda s: mx.segmented_mm(mx.array(a), mx.array(b), s),
                    np.array([[[0, 2]], [[1, 4]]], np.int32))


# -- hadamard_transform ---------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 16, 12, 24, 20, 40, 28, 56, 256])
@pytest.mark.parametrize("backend", ["cpu", "cpu-reference"])
def test_hadamard_matches_the_matrix(n, backend):
    x = normal(3, n)
    with mx.use_backend("cpu", backend):
        got = mx.hadamard_transform(mx.array(x, mx.float64))
    h = hadamard_matrix(*_factors(n))
    assert_close(got, x @ h.T / np.sqrt(n), mx.float64)
    # The matrix is a Hadamard matrix: orthogonal up to n.
    np.testing.assert_array_equal(h @ h.T, n * np.eye(n))


def _factors(n):
    from lazyx.plugins.matmuls import hadamard_factors
    return hadamard_factors(n)


def test_hadamard_power_of_two_is_sylvester_and_dtypes():
    from scipy.linalg import hadamard
    x = normal(2, 3, 32)
    got = mx.hadamard_transform(mx.array(x, mx.float32), scale=0.25)
    assert_close(got, x @ hadamard(32).T * 0.25, mx.float32)
    assert mx.hadamard_transform(mx.ones((4,), mx.int32)).dtype == mx.float32
    assert mx.hadamard_transform(mx.ones((4,), mx.bfloat16)).dtype == mx.bfloat16
    assert_close(mx.hadamard_transform(mx.array(x, mx.float16)), x @ hadamard(32).T / np.sqrt(32),
                 mx.float16)


# The native kernel's paths: p below and above a vector's lanes (a scalar butterfly, lane
# swaps, radix-4 stages and a last radix-2 one), the H_m factors, the transposed matrix (the
# vjp), the half types, a strided input, and an output past the streaming-store threshold.
@pytest.mark.parametrize("n", [1, 2, 4, 8, 32, 64, 128, 512, 2048, 12, 48, 96, 384, 20, 80,
                               320, 28, 224, 896])
def test_hadamard_native_matches_the_matrix_and_its_transpose(n):
    x = normal(5, n)
    h = hadamard_matrix(*_factors(n))
    got = mx.hadamard_transform(mx.array(x, mx.float32), scale=0.5)
    tol = {"rtol": 1e-5, "atol": 1e-6 * n}  # float32 sums of n terms
    assert_close(got, x @ h.T * 0.5, mx.float32, **tol)
    _, (back,) = mx.vjp(lambda a: mx.hadamard_transform(a, scale=0.5),
                        [mx.array(x, mx.float32)], [mx.array(x, mx.float32)])
    assert_close(back, x @ h * 0.5, mx.float32, **tol)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("n", [8, 64, 24, 640])
def test_hadamard_native_half_types(dtype, n):
    d = getattr(mx, dtype)
    xa = mx.array(normal(3, 2, n)).astype(d)
    x = np.array(xa.astype(mx.float32), np.float64)
    got = mx.hadamard_transform(xa)
    assert got.dtype == d
    assert_close(got, x @ hadamard_matrix(*_factors(n)).T / np.sqrt(n), d)


def test_hadamard_native_strided_and_streamed():
    x = normal(64, 24)
    got = mx.hadamard_transform(mx.swapaxes(mx.array(x, mx.float32), 0, 1))  # rows of 64
    assert_close(got, x.T @ hadamard_matrix(1, 64).T / 8, mx.float32)
    big = GEN.standard_normal((1025, 4096)).astype(np.float32)  # 16 MiB: streaming stores
    got = np.array(mx.hadamard_transform(mx.array(big)))
    want = np.array(mx.hadamard_transform(mx.array(big[-3:])))
    np.testing.assert_array_equal(got[-3:], want)
    from lazyx.backends.cpu.kernels.matmuls import hadamard
    np.testing.assert_allclose(got[:4], hadamard(big[:4].astype(np.float64), 1 / 64, False),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("call, error, words", [
    (lambda: mx.hadamard_transform(mx.ones((2, 6))), ArgumentError, "n = 6"),
    (lambda: mx.hadamard_transform(mx.ones((2, 60))), ArgumentError, "n = 60"),
    (lambda: mx.hadamard_transform(mx.ones((2, 0))), ShapeError, "empty"),
    (lambda: mx.hadamard_transform(mx.ones((2, 4), mx.complex64)), DtypeError, "Complex"),
])
def test_hadamard_bad_input(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_hadamard_gradients_vmap_compile():
    for n in (8, 12, 28):
        x = normal(2, n)
        f = lambda x: mx.hadamard_transform(x, scale=0.5)  # noqa: E731
        check_vjp_fd(f, x)
        check_jvp_vjp(f, x)
        check_vmap_loop(f, np.stack([x, -x], 1), in_axes=1)
        check_vmap_loop(f, np.stack([x, -x], 2), in_axes=2)
    x = mx.array(normal(4, 20), mx.float32)
    g = mx.compile(lambda x: mx.hadamard_transform(mx.sin(x)) + 1)
    assert_close(g(x), np.array(mx.hadamard_transform(mx.sin(x))) + 1, mx.float32)


@pytest.mark.parametrize("sorted_indices", [True, False])
def test_gather_mm_grouped_by_expert(sorted_indices):
    # Many indices, few distinct b matrices: the cpu backend's grouped kernel (one BLAS call
    # per matrix), sorted or not, against NumPy and the reference backend.
    a, b = normal(6, 2, 5), normal(3, 5, 4)
    li = GEN.integers(0, 6, 24)
    ri = GEN.integers(0, 3, 24)
    if sorted_indices:
        ri = np.sort(ri)
    want = a[li] @ b[ri]
    for backend in ("cpu", "cpu-reference"):
        with mx.use_backend("cpu", backend):
            got = mx.gather_mm(mx.array(a), mx.array(b), mx.array(li), mx.array(ri),
                               sorted_indices=sorted_indices)
            assert_close(got, want, mx.float32, msg=backend)
