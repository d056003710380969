"""The products pack against NumPy float64 references: matmul and addmm (1-D operands,
batch broadcasting, transposed inputs, k = 0), inner, outer, tensordot, kron, and a
numerically stable softmax; MLX's output dtypes and its errors."""

import numpy as np
import pytest

import lazyx.core as mx
from helpers import FLOAT_DTYPES, assert_close, check_op, random_array, rng, to_lazyx
from lazyx.errors import AxisError, DtypeError, ShapeError
from lazyx.plugins.products import Softmax

ids = lambda d: d.name  # noqa: E731
INEXACT = FLOAT_DTYPES + [mx.complex64]

MATMUL_SHAPES = [
    ((3, 4), (4, 5)),
    ((4,), (4, 5)),            # 1-D first operand: a row vector
    ((3, 4), (4,)),            # 1-D second operand: a column vector
    ((4,), (4,)),              # dot product: a 0-d result
    ((2, 3, 4), (4, 5)),
    ((3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 6)),  # batch dims broadcast
    ((2, 3, 4), (4,)),
    ((4,), (2, 4, 5)),
    ((3, 0), (0, 5)),          # k = 0: zeros
    ((0, 3, 4), (4, 2)),       # empty batch
    ((3, 4), (4, 0)),
    ((1, 1), (1, 1)),
]


@pytest.mark.parametrize("dtype", INEXACT, ids=ids)
@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES, ids=str)
def test_matmul_matches_numpy(dtype, sa, sb):
    g = rng(1)
    out = check_op(mx.matmul, np.matmul, random_array(sa, dtype, g), random_array(sb, dtype, g),
                   dtype=dtype)
    assert out.shape == np.matmul(np.empty(sa), np.empty(sb)).shape


def test_matmul_k0_gives_zeros():
    out = mx.matmul(mx.array(np.ones((3, 0), np.float32)), mx.array(np.ones((0, 2), np.float32)))
    assert_close(out, np.zeros((3, 2)), mx.float32)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32], ids=ids)
def test_matmul_long_reduction(dtype):
    # A long reduction in half precision: accumulating in float32 keeps it accurate.
    g = rng(2)
    a, b = random_array((8, 512), dtype, g, 0, 1), random_array((512, 8), dtype, g, 0, 1)
    check_op(mx.matmul, np.matmul, a, b, dtype=dtype)


@pytest.mark.parametrize("da,db,expected", [
    (mx.float16, mx.float32, mx.float32), (mx.float16, mx.bfloat16, mx.float32),
    (mx.float32, mx.float64, mx.float64), (mx.int32, mx.float16, mx.float16),
    (mx.bfloat16, mx.int8, mx.bfloat16), (mx.float32, mx.complex64, mx.complex64),
], ids=str)
def test_matmul_promotes(da, db, expected):
    g = rng(3)
    check_op(mx.matmul, np.matmul, random_array((2, 3), da, g), random_array((3, 4), db, g),
             dtype=expected)


def test_matmul_non_contiguous_inputs():
    g = rng(4)
    x, y = random_array((5, 3), mx.float32, g), random_array((4, 6), mx.float32, g)
    a, b = to_lazyx(x), to_lazyx(y)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    assert_close(mx.matmul(mx.transpose(a), a), x64.T @ x64, mx.float32)
    assert_close(mx.matmul(a[::2], b[:3, ::2]), x64[::2] @ y64[:3, ::2], mx.float32)
    assert_close(mx.matmul(b.T, b), y64.T @ y64, mx.float32)
    batch = random_array((3, 4, 2), mx.float32, g)
    assert_close(mx.matmul(mx.transpose(to_lazyx(batch), (0, 2, 1)), to_lazyx(batch)),
                 np.swapaxes(batch, 1, 2).astype(np.float64) @ batch, mx.float32)


def test_matmul_operators():
    g = rng(5)
    x, y = random_array((2, 3), mx.float32, g), random_array((3, 2), mx.float32, g)
    a, b = to_lazyx(x), to_lazyx(y)
    assert_close(a @ b, x.astype(np.float64) @ y, mx.float32)
    assert_close(b.__rmatmul__(a), x.astype(np.float64) @ y, mx.float32)
    assert_close([[1.0, 2.0, 3.0]] @ b, np.array([[1.0, 2.0, 3.0]]) @ y, mx.float32)
    c = a
    c @= b  # in place, as in MLX: the object c (and its alias a) becomes a @ b
    assert_close(c, x.astype(np.float64) @ y, mx.float32)
    assert c is a and a.shape == (2, 2)


@pytest.mark.parametrize("dtype", [mx.bool_, mx.int32, mx.uint8, mx.int64], ids=ids)
def test_matmul_rejects_integer_and_bool(dtype):
    a = to_lazyx(random_array((2, 3), dtype))
    b = to_lazyx(random_array((3, 2), dtype))
    with pytest.raises(DtypeError, match=dtype.name):
        mx.matmul(a, b)
    with pytest.raises(DtypeError):
        mx.tensordot(a, b, 1)
    with pytest.raises(DtypeError):
        mx.inner(a, a)


def test_matmul_shape_errors_name_both_shapes():
    ok = mx.array(np.ones((2, 2), np.float32)) * 3
    a = mx.array(np.ones((2, 3), np.float32))
    b = mx.array(np.ones((4, 5), np.float32))
    with pytest.raises(ShapeError, match=r"\(2, 3\).*\(4, 5\)"):
        mx.matmul(a, b)
    with pytest.raises(ShapeError, match=r"\(2, 3, 4\).*\(5, 4, 6\)"):
        mx.matmul(mx.array(np.ones((2, 3, 4), np.float32)),
                  mx.array(np.ones((5, 4, 6), np.float32)))
    with pytest.raises(ShapeError, match="0-dimensional"):
        mx.matmul(mx.array(2.0), a)
    with pytest.raises(ShapeError):
        mx.matmul(mx.array(np.ones(3, np.float32)), mx.array(np.ones(4, np.float32)))
    # A failed call leaves other arrays usable.
    assert_close(ok, np.full((2, 2), 3.0), mx.float32)


# -- addmm ---------------------------------------------------------------------
ADDMM_CASES = [
    ((2, 4), (2, 3), (3, 4)),
    ((4,), (2, 3), (3, 4)),     # c broadcasts
    ((), (2, 3), (3, 4)),
    ((2, 1), (2, 3), (3, 4)),
    ((2, 4), (5, 2, 3), (3, 4)),  # batched product, 2-D c
    ((), (3,), (3,)),
    ((4,), (3,), (3, 4)),
    ((2,), (2, 3), (3,)),
    ((2, 4), (2, 0), (0, 4)),   # k = 0: only beta * c
]


@pytest.mark.parametrize("dtype", INEXACT, ids=ids)
@pytest.mark.parametrize("sc,sa,sb", ADDMM_CASES, ids=str)
def test_addmm_matches_numpy(dtype, sc, sa, sb):
    g = rng(6)
    c, a, b = (random_array(s, dtype, g) for s in (sc, sa, sb))
    check_op(lambda c, a, b: mx.addmm(c, a, b, alpha=0.5, beta=2.0),
             lambda c, a, b: 0.5 * np.matmul(a, b) + 2.0 * c, c, a, b, dtype=dtype)
    check_op(mx.addmm, lambda c, a, b: np.matmul(a, b) + c, c, a, b, dtype=dtype)


def test_addmm_dtypes_and_beta_zero():
    g = rng(7)
    a, b = random_array((2, 3), mx.float32, g), random_array((3, 2), mx.float32, g)
    c_int = random_array((2, 2), mx.int32, g)
    check_op(mx.addmm, lambda c, a, b: a @ b + c, c_int, a, b, dtype=mx.float32)
    check_op(mx.addmm, lambda c, a, b: a @ b + c, random_array((2, 2), mx.float16, g),
             a.astype(np.float16), b.astype(np.float16), dtype=mx.float16)
    check_op(mx.addmm, lambda c, a, b: a @ b + c, random_array((2, 2), mx.float64, g), a, b,
             dtype=mx.float64)
    # beta == 0 ignores c, NaNs included (as BLAS gemm does).
    out = mx.addmm(mx.array(np.full((2, 2), np.nan, np.float32)), to_lazyx(a), to_lazyx(b),
                   alpha=2.0, beta=0.0)
    assert_close(out, 2.0 * a.astype(np.float64) @ b, mx.float32)


def test_addmm_errors():
    a = mx.array(np.ones((2, 3), np.float32))
    b = mx.array(np.ones((3, 2), np.float32))
    with pytest.raises(ShapeError, match=r"\(4, 2, 2\)"):
        mx.addmm(mx.array(np.ones((4, 2, 2), np.float32)), a, b)
    with pytest.raises(ShapeError, match=r"\(3,\)"):
        mx.addmm(mx.array(np.ones(3, np.float32)), a, b)
    with pytest.raises(ShapeError, match=r"\(2, 3\).*\(4, 2\)"):
        mx.addmm(mx.array(np.ones((2, 2), np.float32)), a, mx.array(np.ones((4, 2), np.float32)))
    with pytest.raises(DtypeError):
        mx.addmm(mx.array([1]), mx.array([[1, 2]]), mx.array([[1], [2]]))
    with pytest.raises(ShapeError):
        mx.addmm(mx.array(1.0), mx.array(1.0), mx.array(np.ones(3, np.float32)))


# -- inner, outer, tensordot, kron ---------------------------------------------
@pytest.mark.parametrize("dtype", INEXACT, ids=ids)
@pytest.mark.parametrize("sa,sb", [((2, 3), (4, 3)), ((3,), (3,)), ((2, 5, 3), (3,)),
                                   ((3,), (2, 3)), ((2, 0), (3, 0)), ((), (2, 3)),
                                   ((2, 3), ())], ids=str)
def test_inner(dtype, sa, sb):
    g = rng(8)
    check_op(mx.inner, np.inner, random_array(sa, dtype, g), random_array(sb, dtype, g),
             dtype=dtype)


def test_inner_0d_integers_multiply_and_errors():
    check_op(mx.inner, np.inner, np.array(2, np.int32), np.arange(3, dtype=np.int32),
             dtype=mx.int32)
    with pytest.raises(ShapeError, match=r"\(2, 3\).*\(3, 2\)"):
        mx.inner(mx.array(np.ones((2, 3), np.float32)), mx.array(np.ones((3, 2), np.float32)))


@pytest.mark.parametrize("dtype", [mx.bool_, mx.uint8, mx.int32, mx.int64] + INEXACT, ids=ids)
@pytest.mark.parametrize("sa,sb", [((3,), (4,)), ((2, 3), (4,)), ((), (4,)), ((0,), (3,)),
                                   ((2, 2), (2, 3))], ids=str)
def test_outer(dtype, sa, sb):
    g = rng(9)
    a, b = random_array(sa, dtype, g), random_array(sb, dtype, g)
    ref = (lambda x, y: np.logical_and.outer(x.ravel(), y.ravel())) if dtype is mx.bool_ \
        else np.outer
    check_op(mx.outer, ref, a, b, dtype=dtype)


TENSORDOT_CASES = [
    ((2, 3, 4), (3, 4, 5), 2),
    ((2, 3, 4), (4, 5), 1),
    ((2, 3), (4, 5), 0),
    ((3, 4), (3, 4), 2),
    ((2, 3, 4), (4, 3, 5), [[1, 2], [1, 0]]),
    ((2, 3, 4), (4, 3, 2), [[-1, 0], [0, 2]]),
    ((2, 3), (3, 2), [[0], [1]]),
    ((2, 0, 3), (0, 3, 4), 2),
    ((2, 3), (3,), ([1], [0])),
]


@pytest.mark.parametrize("dtype", INEXACT, ids=ids)
@pytest.mark.parametrize("sa,sb,axes", TENSORDOT_CASES, ids=str)
def test_tensordot(dtype, sa, sb, axes):
    g = rng(10)
    check_op(lambda a, b: mx.tensordot(a, b, axes), lambda a, b: np.tensordot(a, b, axes),
             random_array(sa, dtype, g), random_array(sb, dtype, g), dtype=dtype)


def test_tensordot_default_and_transposed_inputs():
    g = rng(11)
    x = random_array((4, 3, 2), mx.float32, g)
    a = mx.transpose(to_lazyx(x))  # (2, 3, 4), not contiguous
    y = random_array((3, 4, 5), mx.float32, g)
    assert_close(mx.tensordot(a, to_lazyx(y)), np.tensordot(x.T.astype(np.float64), y),
                 mx.float32)


def test_tensordot_errors():
    a = mx.array(np.ones((2, 3, 4), np.float32))
    b = mx.array(np.ones((4, 3, 5), np.float32))
    with pytest.raises(AxisError, match="same length"):
        mx.tensordot(a, b, [[1], [1, 2]])
    with pytest.raises(ShapeError, match=r"axis 1 of shape \(2, 3, 4\) and axis 0"):
        mx.tensordot(a, b, [[1], [0]])
    with pytest.raises(AxisError):
        mx.tensordot(a, b, 4)
    with pytest.raises(AxisError, match="non-negative"):
        mx.tensordot(a, b, -1)
    with pytest.raises(AxisError):
        mx.tensordot(a, b, [[5], [0]])
    with pytest.raises(AxisError, match="Repeated"):
        mx.tensordot(a, b, [[2, -1], [0, 0]])
    with pytest.raises(AxisError):
        mx.tensordot(a, b, "x")


@pytest.mark.parametrize("dtype", [mx.bool_, mx.int32, mx.uint16] + INEXACT, ids=ids)
@pytest.mark.parametrize("sa,sb", [((2, 3), (4, 5)), ((2, 3), (2, 4, 5)), ((3,), (2, 2)),
                                   ((), (4,)), ((2,), ())], ids=str)
def test_kron(dtype, sa, sb):
    g = rng(12)
    a, b = random_array(sa, dtype, g), random_array(sb, dtype, g)
    ref = (lambda x, y: np.kron(x.astype(np.int8), y.astype(np.int8)).astype(bool)) \
        if dtype is mx.bool_ else np.kron
    check_op(mx.kron, ref, a, b, dtype=dtype)


def test_kron_refuses_empty_inputs_as_mlx():
    with pytest.raises(ShapeError, match="empty"):
        mx.kron(mx.zeros((0, 2)), mx.ones((3, 1)))


def test_kron_and_outer_promote():
    g = rng(13)
    check_op(mx.kron, np.kron, random_array((2,), mx.int32, g),
             random_array((3,), mx.float16, g), dtype=mx.float16)
    check_op(mx.outer, np.outer, random_array((2,), mx.uint8, g),
             random_array((3,), mx.int8, g), dtype=mx.int16)


# -- softmax -------------------------------------------------------------------
def _softmax_ref(x, axis=None):
    x = np.asarray(x)
    if x.size == 0:
        return x
    axis = tuple(axis) if isinstance(axis, list) else axis
    m = np.max(x.real if x.dtype.kind == "c" else x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


@pytest.mark.parametrize("dtype", INEXACT, ids=ids)
@pytest.mark.parametrize("shape,axis", [((3, 4, 5), None), ((3, 4, 5), -1), ((3, 4, 5), 0),
                                        ((3, 4, 5), (0, 2)), ((3, 4, 5), [-1, 1]), ((7,), 0),
                                        ((), None), ((0, 3), -1), ((3, 0), -1),
                                        ((2, 3), ())], ids=str)
def test_softmax_matches_numpy(dtype, shape, axis):
    g = rng(14)
    x = random_array(shape, dtype, g)
    check_op(lambda a: mx.softmax(a, axis=axis), lambda a: _softmax_ref(a, axis), x, dtype=dtype)
    check_op(lambda a: mx.softmax(a, axis=axis, precise=True), lambda a: _softmax_ref(a, axis),
             x, dtype=dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=ids)
@pytest.mark.parametrize("axis", [-1, 0, (0, 1)], ids=str)
def test_softmax_is_stable_for_large_values(dtype, axis):
    g = rng(15)
    # Values near the top of float16's range: a naive exp overflows to inf.
    big = 6e4 if dtype is mx.float16 else 1e30 if dtype is mx.bfloat16 else 1e4
    x = (random_array((4, 6), dtype, g, -3, 3).astype(np.float64) + big).astype(dtype.np)
    out = mx.softmax(to_lazyx(x), axis=axis)
    assert np.all(np.isfinite(np.array(out).astype(np.float64)))
    assert_close(out, _softmax_ref(x.astype(np.float64), axis), dtype)


def test_softmax_infinities_and_integers():
    x = np.array([[-np.inf, 0.0, 1.0], [-np.inf, -np.inf, 2.0]], np.float32)
    assert_close(mx.softmax(mx.array(x), axis=-1), _softmax_ref(x.astype(np.float64), -1),
                 mx.float32)
    allinf = mx.softmax(mx.array(np.full(2, -np.inf, np.float32)))
    assert np.isnan(np.array(allinf)).all()
    for d in (mx.int32, mx.uint8, mx.bool_, mx.int64):
        x = random_array((2, 5), d)
        check_op(lambda a: mx.softmax(a, axis=1),
                 lambda a: _softmax_ref(a.astype(np.float64), 1), x, dtype=mx.float32)
        check_op(mx.softmax, lambda a: _softmax_ref(a.astype(np.float64)), x, dtype=mx.float32)


def test_softmax_transposed_input():
    g = rng(16)
    x = random_array((5, 3), mx.float32, g, -50, 50)
    out = mx.softmax(mx.transpose(to_lazyx(x)), axis=-1)
    assert_close(out, _softmax_ref(x.T.astype(np.float64), -1), mx.float32)


def test_softmax_primitive_contract():
    # The native kernel relies on this class name, these slots and this shape rule.
    x = mx.array(np.ones((2, 3, 4), np.float16))
    y = mx.softmax(x, axis=[-1, 0], precise=True)
    p = y._prim
    assert type(p) is Softmax and p.params() == ((0, 2), True)
    assert p.output_shapes([x]) == [(2, 3, 4)] and y.dtype == mx.float16
    assert Softmax(p.stream, (1,), False).is_equivalent(Softmax(p.stream, (1,), False))
    assert not Softmax(p.stream, (1,), False).is_equivalent(Softmax(p.stream, (1,), True))


def test_softmax_errors():
    x = mx.array(np.ones((2, 3), np.float32))
    with pytest.raises(AxisError):
        mx.softmax(x, axis=2)
    with pytest.raises(AxisError):
        mx.softmax(x, axis=[1, -1])
    with pytest.raises(AxisError):
        mx.softmax(mx.array(1.0), axis=0)
    assert_close(mx.softmax(x, axis=-1), np.full((2, 3), 1 / 3), mx.float32)
