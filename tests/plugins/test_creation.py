"""The creation pack against NumPy: shapes as ints or sequences, MLX's default dtypes,
arange's three call forms, full with broadcast values, eye/tri/tril/triu, meshgrid,
laziness, and clear errors for bad shapes, counts and dtypes."""

import numpy as np
import pytest

import lazyx.core as mx
from helpers import ALL_DTYPES, FLOAT_DTYPES, assert_close, random_array, rng, to_lazyx
from lazyx.errors import ArgumentError, DtypeError, ShapeError

ids = lambda d: d.name  # noqa: E731

needs_shapes = pytest.mark.skipif(not (hasattr(mx, "reshape") and hasattr(mx, "broadcast_to")),
                                  reason="meshgrid needs mx.reshape and mx.broadcast_to")

SHAPES = [3, (2, 3), [2, 0], (), (1, 1, 4)]


def _np_shape(s):
    return (s,) if isinstance(s, int) else tuple(s)


@pytest.mark.parametrize("d", ALL_DTYPES, ids=ids)
def test_zeros_ones_empty_full(d):
    for shape in SHAPES:
        s = _np_shape(shape)
        assert_close(mx.zeros(shape, d), np.zeros(s), d, msg=f"zeros {shape}")
        assert_close(mx.ones(shape, dtype=d), np.ones(s), d, msg=f"ones {shape}")
        assert_close(mx.empty(shape, d), np.zeros(s), d, msg=f"empty {shape}")
        assert_close(mx.full(shape, 2, d), np.full(s, 2), d, msg=f"full {shape}")
        assert mx.zeros(shape, d).shape == s


def test_default_dtypes():
    assert mx.zeros(2).dtype is mx.float32 and mx.ones(2, None).dtype is mx.float32
    assert mx.empty(2).dtype is mx.float32
    assert mx.full(2, 3).dtype is mx.int32
    assert mx.full(2, 3.0).dtype is mx.float32
    assert mx.full(2, True).dtype is mx.bool_
    assert mx.full(2, 1 + 2j).dtype is mx.complex64
    assert mx.eye(2).dtype is mx.float32 and mx.identity(2).dtype is mx.float32
    assert mx.tri(2).dtype is mx.float32
    assert mx.linspace(0, 1, 3).dtype is mx.float32
    assert mx.linspace(0, 1, 3, dtype=None).dtype is mx.float32


def test_creation_is_lazy():
    a = mx.zeros((1000, 1000))
    assert a._data is None and a._inputs == ()
    for b in (mx.arange(5), mx.eye(3), mx.linspace(0, 1, 4), mx.tri(3), mx.ones_like(a)):
        assert b._data is None and b._inputs == ()


def test_full_with_array_values():
    v = to_lazyx(np.array([1, 2, 3], np.int8))
    out = mx.full((2, 3), v)
    assert_close(out, np.array([[1, 2, 3], [1, 2, 3]]), mx.int8)
    assert_close(mx.full((2, 3), v, mx.float32), np.array([[1, 2, 3], [1, 2, 3]]), mx.float32)
    col = to_lazyx(np.array([[1.5], [2.5]], np.float32))
    assert_close(mx.full((2, 4), col), np.broadcast_to([[1.5], [2.5]], (2, 4)), mx.float32)
    assert_close(mx.full((2, 3), 2.5, mx.int32), np.full((2, 3), 2), mx.int32)
    assert_close(mx.full((), 5), np.array(5), mx.int32)
    with pytest.raises(ShapeError, match=r"\(3,\).*\(2,\)"):
        mx.full((2,), v)
    with pytest.raises(DtypeError, match="vals"):
        mx.full(2, [1, 2])


@pytest.mark.parametrize("d", [mx.bool_, mx.uint8, mx.int16, mx.float16, mx.bfloat16,
                               mx.float64, mx.complex64], ids=ids)
def test_like_functions(d):
    a = to_lazyx(random_array((2, 3), d, rng(1)))
    for fn, ref in [(mx.zeros_like, np.zeros), (mx.ones_like, np.ones), (mx.empty_like, np.zeros)]:
        assert_close(fn(a), ref((2, 3)), d, msg=fn.__name__)
        assert_close(fn(a, mx.float32), ref((2, 3)), mx.float32, msg=fn.__name__)
    assert_close(mx.full_like(a, 1), np.ones((2, 3)), d)
    assert_close(mx.full_like(a, 3.7, dtype=mx.float16), np.full((2, 3), 3.7), mx.float16)
    assert mx.zeros_like(a).shape == (2, 3)


def test_full_like_casts_values_to_the_dtype():
    a = to_lazyx(np.array([1, 2], np.int8))
    assert_close(mx.full_like(a, 3.7), np.array([3, 3]), mx.int8)
    vals = to_lazyx(np.array([3.5, 4.5], np.float32))
    assert_close(mx.full_like(a, vals), np.array([3, 4]), mx.int8)
    with pytest.raises(DtypeError, match="zeros_like"):
        mx.zeros_like(3)


@pytest.mark.parametrize("bad", [-1, (2, -1), 2.5, (2, 2.0), "3", None])
def test_bad_shapes(bad):
    with pytest.raises(ShapeError, match="zeros"):
        mx.zeros(bad)
    with pytest.raises(ShapeError, match="full"):
        mx.full(bad, 1.0)


def test_shape_from_integer_likes():
    assert mx.zeros(np.int64(3)).shape == (3,)
    assert mx.ones((np.int32(2), 2)).shape == (2, 2)


# -- arange and linspace ----------------------------------------------------------
ARANGE = [
    ((5,), {}, np.arange(5), mx.int32),
    ((5.0,), {}, np.arange(5.0), mx.float32),
    ((1, 5), {}, np.arange(1, 5), mx.int32),
    ((1, 5, 0.5), {}, np.arange(1, 5, 0.5), mx.float32),
    ((0, 1, 0.3), {}, np.arange(0, 1, 0.3), mx.float32),
    ((5, 1, -1), {}, np.arange(5, 1, -1), mx.int32),
    ((-3,), {}, np.arange(-3), mx.int32),
    ((5, 1), {}, np.arange(5, 1), mx.int32),
    ((0, 10, 3, mx.int8), {}, np.arange(0, 10, 3), mx.int8),
    ((5,), {"dtype": mx.float16}, np.arange(5), mx.float16),
    ((3,), {"dtype": mx.uint64}, np.arange(3), mx.uint64),
    ((), {"start": 1, "stop": 4}, np.arange(1, 4), mx.int32),
    ((), {"stop": 4}, np.arange(4), mx.int32),
    ((4,), {"step": 2}, np.arange(0, 4, 2), mx.int32),
    ((4, None, 2), {}, np.arange(0, 4, 2), mx.int32),
    ((0, 5), {"dtype": mx.complex64}, np.arange(0, 5), mx.complex64),
    ((0.5, 3, 1, mx.int32), {}, np.array([0, 1, 2]), mx.int32),
    ((-2.5, 2), {"dtype": mx.int32}, np.array([-2, -1, 0, 1, 2]), mx.int32),
    ((0, 2 ** 40, 2 ** 38), {}, np.arange(0, 2 ** 40, 2 ** 38), mx.int64),
    ((np.int64(3),), {}, np.arange(3), mx.int32),
]


@pytest.mark.parametrize("args,kwargs,expected,dtype", ARANGE,
                         ids=[f"{a}{k}" for a, k, _, _ in ARANGE])
def test_arange(args, kwargs, expected, dtype):
    assert_close(mx.arange(*args, **kwargs), expected, dtype)


def test_arange_does_not_accumulate_rounding():
    out = np.array(mx.arange(0, 30000, 0.1))
    np.testing.assert_allclose(out[-3:], [29999.7, 29999.8, 29999.9], rtol=1e-7)
    assert out.shape == (300000,)


def test_arange_errors():
    with pytest.raises(ArgumentError, match="nonzero"):
        mx.arange(0, 10, 0)
    with pytest.raises(ArgumentError, match="length"):
        mx.arange(float("inf"))
    with pytest.raises(DtypeError, match="bool"):
        mx.arange(5, dtype=mx.bool_)
    with pytest.raises(DtypeError, match="stop.*True"):
        mx.arange(True)
    with pytest.raises(DtypeError, match="start"):
        mx.arange(1j, 3)
    with pytest.raises(DtypeError, match="stop"):
        mx.arange(0, "10")
    with pytest.raises(DtypeError, match="arange"):
        mx.arange()


@pytest.mark.parametrize("d", [mx.float32, mx.float16, mx.bfloat16, mx.float64, mx.int32,
                               mx.uint8, mx.bool_, mx.complex64], ids=ids)
def test_linspace(d):
    for start, stop, num, endpoint in [(0, 1, 5, True), (0, 10, 4, False), (1, 0, 4, True),
                                       (0, 10, 1, True), (0, 10, 1, False), (0, 10, 0, True),
                                       (-3, 7.5, 50, True)]:
        expected = np.linspace(start, stop, num, endpoint=endpoint).astype(d.np)
        out = mx.linspace(start, stop, num, endpoint, dtype=d)
        assert_close(out, expected, d, msg=f"{start} {stop} {num} {endpoint}")
    assert mx.linspace(0, 1).shape == (50,)
    assert mx.linspace(0, 1, None).shape == (50,)


def test_linspace_errors():
    with pytest.raises(ArgumentError, match="non-negative"):
        mx.linspace(0, 1, -1)
    with pytest.raises(DtypeError, match="num"):
        mx.linspace(0, 1, 2.5)
    with pytest.raises(DtypeError, match="start"):
        mx.linspace("a", 1, 3)


# -- matrices -------------------------------------------------------------------------
@pytest.mark.parametrize("d", [mx.float32, mx.bool_, mx.int8, mx.bfloat16, mx.complex64],
                         ids=ids)
def test_eye_identity_tri(d):
    for n, m, k in [(3, None, 0), (2, 3, 1), (3, 2, -1), (0, None, 0), (2, 3, 5), (3, 3, -5)]:
        assert_close(mx.eye(n, m, k, d), np.eye(n, m, k), d, msg=f"eye {n} {m} {k}")
        assert_close(mx.tri(n, m, k, dtype=d), np.tri(n, m, k), d, msg=f"tri {n} {m} {k}")
    assert_close(mx.identity(3, d), np.eye(3), d)
    assert_close(mx.eye(3, k=-1, dtype=d), np.eye(3, k=-1), d)


def test_matrix_errors():
    with pytest.raises(ArgumentError, match="n must be non-negative"):
        mx.eye(-1)
    with pytest.raises(ArgumentError, match="m must be non-negative"):
        mx.tri(2, -1)
    with pytest.raises(DtypeError, match="k"):
        mx.eye(2, k=0.5)


@pytest.mark.parametrize("d", ALL_DTYPES, ids=ids)
def test_tril_triu(d):
    x = random_array((2, 3, 4), d, rng(2))
    for k in (0, 1, -1, 10, -10):
        assert_close(mx.tril(to_lazyx(x), k), np.tril(x, k), d, msg=f"tril {k}")
        assert_close(mx.triu(to_lazyx(x), k=k), np.triu(x, k), d, msg=f"triu {k}")
    t = x[0].T  # non-contiguous
    assert_close(mx.tril(to_lazyx(t)), np.tril(t), d)


def test_tril_needs_two_dimensions():
    with pytest.raises(ShapeError, match=r"tril.*\(3,\)"):
        mx.tril(mx.ones(3))
    with pytest.raises(ShapeError, match="triu"):
        mx.triu(mx.ones(()))


# -- meshgrid -------------------------------------------------------------------------
@needs_shapes
@pytest.mark.parametrize("indexing", ["xy", "ij"])
@pytest.mark.parametrize("sparse", [False, True])
def test_meshgrid(indexing, sparse):
    x = np.array([1, 2, 3], np.int32)
    y = np.array([4.0, 5.0], np.float32)
    z = np.array([[6, 7], [8, 9]], np.int8)  # flattened, as in MLX
    for arrays in ([x, y], [x, y, z], [y]):
        out = mx.meshgrid(*(to_lazyx(a) for a in arrays), sparse=sparse, indexing=indexing)
        ref = np.meshgrid(*(a.ravel() for a in arrays), sparse=sparse, indexing=indexing)
        assert isinstance(out, tuple) and len(out) == len(ref)
        for o, r, a in zip(out, ref, arrays):
            assert_close(o, r, mx.array(a).dtype, msg=f"{indexing} {sparse} {len(arrays)}")


@needs_shapes
def test_meshgrid_edge_cases():
    assert mx.meshgrid() == ()
    a, b = mx.meshgrid(mx.array(1), mx.array([4, 5]))
    assert a.shape == (2, 1) and b.shape == (2, 1)
    with pytest.raises(ArgumentError, match="indexing"):
        mx.meshgrid(mx.array([1]), indexing="foo")


@pytest.mark.parametrize("d", FLOAT_DTYPES, ids=ids)
def test_created_arrays_feed_other_ops(d):
    a = mx.ones((2, 3), d) + mx.arange(3, dtype=d)
    assert_close(a, np.ones((2, 3)) + np.arange(3), d)


@pytest.mark.parametrize("name", ["bartlett", "blackman", "hamming", "hanning"])
def test_windows(name):
    fn, ref = getattr(mx, name), getattr(np, name)
    for m in (0, 1, 2, 5, 6, 33, np.int64(4), True):
        out = fn(m)
        assert out._data is None  # lazy, like the other creation functions
        assert_close(out, np.maximum(ref(int(m)), 0), mx.float32, atol=1e-6, msg=f"{name}({m})")
    assert fn(-3).shape == (0,) and fn(-3).dtype is mx.float32
    assert fn(M=4, stream=mx.cpu).shape == (4,)
    with pytest.raises(DtypeError, match="M must be an integer"):
        fn(2.5)
    assert fn(mx.array(3)).shape == (3,)  # integer arrays index, as in MLX
