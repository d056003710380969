"""``gather_mm``, ``block_masked_mm``, ``segmented_mm``, ``hadamard_transform`` against
MLX 0.32.2: the same calls on both (values, shapes, dtypes, exception types), and the
gradients MLX has (vjp of gather_mm and block_masked_mm, vjp/jvp/vmap of the transform)."""

import numpy as np
import pytest

from mlx_compat import requires_mlx, same

pytestmark = requires_mlx

GEN = np.random.default_rng(7)
A3 = GEN.standard_normal((3, 2, 4)).astype(np.float32)
B3 = GEN.standard_normal((5, 4, 6)).astype(np.float32)
TOL = {"rtol": 1e-4, "atol": 1e-5}


@pytest.mark.parametrize("lhs, rhs", [([0, 2], [1, 4]), ([[0], [2]], [1, 4, 3]), (None, [1, 4, 2]),
                                      ([1], None), ([2], [4])])
@pytest.mark.parametrize("dtype", ["float32"])  # MLX's CPU kernel: float32 only
def test_gather_mm(lhs, rhs, dtype):
    def f(m):
        d = getattr(m, dtype)
        li = None if lhs is None else m.array(lhs)
        ri = None if rhs is None else m.array(rhs, m.uint32)
        a = m.array(A3).astype(d) if lhs is not None else m.array(A3[:1]).astype(d)
        return m.gather_mm(a, m.array(B3).astype(d), li, ri)
    same(f, **(TOL if dtype == "float32" else {}))


@pytest.mark.parametrize("call", [
    lambda m: m.gather_mm(m.array(A3[0, 0]), m.array(B3), None, m.array([1, 0])),
    lambda m: m.gather_mm(m.array(A3[0]), m.array(B3), m.array([0]), m.array([0, 2])),
    lambda m: m.gather_mm(m.array(A3), m.array(B3), m.array([0, 1]), m.array([1, 2]), sorted_indices=True),
    lambda m: m.gather_mm(m.array(A3), m.ones((5, 3, 6)), m.array([0]), m.array([0])),
    lambda m: m.gather_mm(m.array(A3), m.array(B3), m.array([0.5]), m.array([0])),
    lambda m: m.gather_mm(m.array([[1, 2]]), m.array([[1], [2]]), m.array([0]), m.array([0])),
    lambda m: m.gather_mm(m.array(A3), m.array(B3), m.array([1, 2]), None),
])
def test_gather_mm_shapes_and_errors(call):
    same(call, **TOL)


def test_gather_mm_vjp():
    def f(m):
        li, ri = m.array([[0, 2], [2, 1]]), m.array([1, 4])
        return m.grad(lambda a, b: (m.gather_mm(a, b, li, ri) * m.arange(6)).sum(),
                      argnums=(0, 1))(m.array(A3), m.array(B3))
    same(f, **TOL)


MA = GEN.standard_normal((2, 70, 40)).astype(np.float32)
MB = GEN.standard_normal((40, 33)).astype(np.float32)
MO = GEN.random((3, 2)) < 0.5
ML = GEN.standard_normal((2, 3, 2)).astype(np.float32)
MR = GEN.random((2, 2)) < 0.6


@pytest.mark.parametrize("block", [32, 64, 16])
@pytest.mark.parametrize("masks", [(1, 1, 1), (1, 0, 0), (0, 1, 0), (0, 0, 1), (0, 0, 0)])
def test_block_masked_mm(block, masks):
    def f(m):
        tm, tk, tn = (-(-70 // block), -(-40 // block), -(-33 // block))
        mo = m.array(np.resize(MO, (tm, tn))) if masks[0] else None
        ml = m.array(np.resize(ML, (2, tm, tk))) if masks[1] else None
        mr = m.array(np.resize(MR, (tk, tn))) if masks[2] else None
        return m.block_masked_mm(m.array(MA), m.array(MB), block, mo, ml, mr)
    same(f, **TOL)


@pytest.mark.parametrize("call", [
    lambda m: m.block_masked_mm(m.array(MA), m.array(MB), 32, m.ones((2, 3, 3), m.bool_)),
    lambda m: m.block_masked_mm(m.array(MA).astype(m.int32), m.array(MB).astype(m.int32), 32),
    lambda m: m.block_masked_mm(m.array(MA), m.ones((2, 41, 3)), 32),
    lambda m: m.block_masked_mm(m.ones((3, 1, 70, 40)), m.array(MB), 32, m.ones((3, 2), m.bool_)),
    lambda m: m.block_masked_mm(m.array(MA), m.array(MB), 16, m.array(MO)),
])
def test_block_masked_mm_shapes_and_errors(call):
    same(call, **TOL)


def test_block_masked_mm_vjp_with_float_masks():
    def f(m):
        a, b = m.array(MA[:, :64, :64]), m.array(GEN.standard_normal((64, 64)).astype(np.float32))
        mo, ml = m.array([[True, False], [True, True]]), m.array(ML[:, :2, :2])
        return m.grad(lambda a, b, ml: (m.block_masked_mm(a, b, 32, mo, ml) ** 2).sum(),
                      argnums=(0, 1, 2))(a, b, ml)
    same(f, rtol=1e-3, atol=1e-2)


@pytest.mark.parametrize("call", [
    lambda m: m.segmented_mm(m.array(A3[0].T), m.array(B3[0][:2]), m.array([[0, 1], [1, 2], [2, 2]])),
    lambda m: m.segmented_mm(m.ones((5, 10)), m.ones((10, 3)), m.array([[[0, 4], [4, 10]]])),
    lambda m: m.segmented_mm(m.ones((5, 10), m.float16), m.ones((10, 3), m.float16), m.array([[0, 10]])),
    lambda m: m.segmented_mm(m.ones((5, 10)), m.ones((10, 3)), m.array([[0.0, 4.0]])),
    lambda m: m.segmented_mm(m.ones((2, 5, 10)), m.ones((10, 3)), m.array([[0, 4]])),
    lambda m: m.segmented_mm(m.ones((5, 10)), m.ones((10, 3)), m.array([0, 4, 4, 10])),
])
def test_segmented_mm(call):
    same(call, **TOL)


@pytest.mark.parametrize("n", [1, 2, 4, 12, 20, 28, 24, 40, 56, 96, 1024, 12 * 256])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_hadamard_transform(n, dtype):
    x = GEN.standard_normal((3, n)).astype(np.float32)
    same(lambda m: m.hadamard_transform(m.array(x).astype(getattr(m, dtype))),
         **(TOL if dtype == "float32" else {"atol": 8e-2 if dtype == "bfloat16" else 3e-3}))


@pytest.mark.parametrize("call", [
    lambda m: m.hadamard_transform(m.ones((2, 16), m.int32), scale=0.5),
    lambda m: m.hadamard_transform(m.ones((2, 16), m.bool_)),
    lambda m: m.hadamard_transform(m.array(3.0)),
    lambda m: m.hadamard_transform(m.ones((2, 6))),
    lambda m: m.hadamard_transform(m.ones((2, 0))),
])
def test_hadamard_transform_dtypes_and_errors(call):
    same(call)


def test_hadamard_transform_rules():
    x = GEN.standard_normal((4, 16)).astype(np.float32)
    same(lambda m: m.grad(lambda v: (m.hadamard_transform(v) * m.arange(16)).sum())(m.array(x)), **TOL)
    same(lambda m: m.jvp(lambda v: m.hadamard_transform(v, scale=2.0), [m.array(x)],
                         [m.array(x[::-1].copy())])[1], **TOL)
    same(lambda m: m.vmap(m.hadamard_transform, in_axes=1)(m.array(x)), **TOL)
