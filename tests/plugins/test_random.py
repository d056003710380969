"""The random pack: Threefry-2x32 against its published known-answer vectors, keys and
splitting, determinism (a result depends on its key only, never on evaluation order),
statistical moments on 100k samples with fixed keys (deterministic, so never flaky),
bounds, MLX's shapes and dtypes, and bad input."""

import math

import numpy as np
import pytest

import lazyx.core as mx
from helpers import FLOAT_DTYPES, assert_close, to_lazyx
from lazyx.array import lazy
from lazyx.backends.cpu.kernels.random import threefry2x32
from lazyx.errors import AxisError, DtypeError, ShapeError
from lazyx.plugins.random import RandomBits, bits

R = mx.random
ids = lambda d: d.name  # noqa: E731
N = 100_000


def np_(x):
    return np.array(x.astype(mx.float32) if x.dtype == mx.bfloat16 else x)


# -- Threefry-2x32 and keys ----------------------------------------------------
# Random123's known-answer vectors for threefry2x32_20: (key, counter, result).
THREEFRY_KAT = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


@pytest.mark.parametrize("key,ctr,expected", THREEFRY_KAT, ids=str)
def test_threefry_known_answers(key, ctr, expected):
    u = lambda v: np.array([v], np.uint32)  # noqa: E731
    y0, y1 = threefry2x32(u(key[0]), u(key[1]), u(ctr[0]), u(ctr[1]))
    assert (int(y0[0]), int(y1[0])) == expected


def test_threefry_vectorises_over_keys_and_counters():
    keys = np.array([[k[0] for k, _, _ in THREEFRY_KAT]], np.uint32).T
    keys1 = np.array([[k[1] for k, _, _ in THREEFRY_KAT]], np.uint32).T
    ctr0 = np.array([c[0] for _, c, _ in THREEFRY_KAT], np.uint32)
    ctr1 = np.array([c[1] for _, c, _ in THREEFRY_KAT], np.uint32)
    y0, y1 = threefry2x32(keys, keys1, ctr0, ctr1)  # every key with every counter: (3, 3)
    assert y0.shape == (3, 3)
    assert [(int(y0[i, i]), int(y1[i, i])) for i in range(3)] == [e for _, _, e in THREEFRY_KAT]


@pytest.mark.parametrize("seed,expected", [(0, [0, 0]), (1, [0, 1]), (2**33 + 5, [2, 5]),
                                           (2**64 - 1, [2**32 - 1, 2**32 - 1])], ids=str)
def test_key(seed, expected):
    k = R.key(seed)
    assert k.dtype == mx.uint32 and k.shape == (2,)
    assert np_(k).tolist() == expected


@pytest.mark.parametrize("bad", [-1, 2**64, 1.5, "3"], ids=str)
def test_key_rejects_bad_seeds(bad):
    with pytest.raises(DtypeError):
        R.key(bad)
    with pytest.raises(DtypeError):
        R.seed(bad)


def test_split_matches_reference_values():
    # Threefry splitting of key 0 as JAX (and MLX) define it.
    s = R.split(R.key(0))
    assert s.dtype == mx.uint32 and s.shape == (2, 2)
    assert np_(s).tolist() == [[4146024105, 967050713], [2718843009, 1272950319]]
    assert R.split(R.key(3), 5).shape == (5, 2)
    assert R.split(R.key(3), 0).shape == (0, 2)
    three = np_(R.split(R.key(3), 3))
    assert len({tuple(r) for r in three.tolist()}) == 3
    with pytest.raises(ShapeError):
        R.split(R.key(0), -1)


def test_global_state_splits_at_call_time():
    assert isinstance(R.state, list) and len(R.state) == 1
    R.seed(7)
    assert np_(R.state[0]).tolist() == [0, 7]
    a = R.uniform(shape=(4,))
    first, second = np_(R.split(R.key(7)))
    # The state moved on at the call (nothing was evaluated), to the first half ...
    assert np_(R.state[0]).tolist() == first.tolist()
    # ... and the op used the second half.
    assert_close(a, np_(R.uniform(shape=(4,), key=mx.array(second))), mx.float32)
    # Assigning the state works like seeding.
    R.state[0] = R.key(7)
    assert_close(R.uniform(shape=(4,)), np_(a), mx.float32)


def test_global_state_is_independent_of_evaluation_order():
    def draws():
        R.seed(11)
        return [R.normal((3,)), R.randint(0, 100, (3,)), R.uniform(shape=(3,)),
                R.categorical(mx.array(np.zeros((2, 5), np.float32)))]

    forward = draws()
    mx.eval(*forward)
    backward = draws()
    for x in reversed(backward):
        mx.eval(x)
    for f, b in zip(forward, backward):
        np.testing.assert_array_equal(np_(f), np_(b))
    # Consecutive draws differ.
    R.seed(11)
    assert not np.array_equal(np_(R.uniform(shape=(3,))), np_(R.uniform(shape=(3,))))


def test_a_failed_call_does_not_consume_the_state():
    R.seed(5)
    before = np_(R.state[0]).tolist()
    with pytest.raises(DtypeError):
        R.normal((2,), mx.int32)
    with pytest.raises(ShapeError):
        R.uniform(mx.array([0.0, 1.0]), 2.0, (3,))
    assert np_(R.state[0]).tolist() == before


# -- RandomBits ----------------------------------------------------------------
def _bits_reference(key, nwords):
    # The counter layout RandomBits documents, hashed in one whole-array pass.
    half = (nwords + 1) // 2
    x0 = np.arange(half, dtype=np.uint32)
    x1 = x0 + np.uint32(half)
    if nwords % 2:
        x1[-1] = 0
    k = np.array(key, np.uint32).reshape(2, 1)
    y0, y1 = threefry2x32(k[0], k[1], x0, x1)
    return np.concatenate([y0.ravel(), y1.ravel()[:nwords - half]])


@pytest.mark.parametrize("n", [1, 2, 7, 140_001], ids=str)  # 140_001 spans several chunks
def test_bits_follow_the_counter_layout(n):
    k = R.key(2**40 + 77)
    np.testing.assert_array_equal(np_(bits((n,), 4, key=k)), _bits_reference([256, 77], n))
    ref_bytes = _bits_reference([256, 77], (n + 3) // 4).view(np.uint8)[:n]
    np.testing.assert_array_equal(np_(bits((n,), 1, key=k)), ref_bytes)


def test_bits_widths_share_one_stream_of_bytes():
    k = R.key(42)
    words = np_(bits((4,), 4, key=k))
    assert np_(bits((16,), 1, key=k)).tolist() == words.view(np.uint8).tolist()
    assert np_(bits((7,), 2, key=k)).tolist() == words.view(np.uint16)[:7].tolist()
    assert np_(bits((2,), 8, key=k)).tolist() == words.view(np.uint64).tolist()
    assert bits((3, 0), 1, key=k).shape == (3, 0)
    assert bits((2, 3), 2, key=k).dtype == mx.uint16
    with pytest.raises(DtypeError):
        bits((2,), 3, key=k)


def test_bits_prefix_is_stable_only_for_even_word_counts():
    # Counters pair word i with word i + ceil(n/2), so a longer draw is a
    # different draw: each result depends on (key, shape) alone.
    k = R.key(1)
    a, b = np_(bits((6,), 4, key=k)), np_(bits((7,), 4, key=k))
    assert a.shape == (6,) and b.shape == (7,)
    assert not np.array_equal(a, b[:6])
    np.testing.assert_array_equal(a, np_(bits((6,), 4, key=k)))


def test_random_bits_batches_keys():
    # The primitive takes keys of shape (..., 2), as a vmap rule will need.
    keys = R.split(R.key(9), 3)
    stream = mx.default_stream(mx.default_device())
    out = lazy((3, 5), mx.uint32, RandomBits(stream, (5,), 4), (keys,))
    rows = np_(keys)
    expected = [np_(bits((5,), 4, key=mx.array(r))) for r in rows]
    np.testing.assert_array_equal(np_(out), np.stack(expected))


# -- determinism -----------------------------------------------------------------
DRAWS = {
    "uniform": lambda k: R.uniform(-2, 3, (50,), key=k),
    "normal": lambda k: R.normal((50,), key=k),
    "randint": lambda k: R.randint(-5, 1000, (50,), key=k),
    "bernoulli": lambda k: R.bernoulli(0.5, (50,), key=k),
    "truncated_normal": lambda k: R.truncated_normal(-1.0, 2.0, (50,), key=k),
    "gumbel": lambda k: R.gumbel((50,), key=k),
    "laplace": lambda k: R.laplace((50,), key=k),
    "categorical": lambda k: R.categorical(mx.array(np.zeros((50, 10), np.float32)), key=k),
    "permutation": lambda k: R.permutation(50, key=k),
    "multivariate_normal": lambda k: R.multivariate_normal(
        mx.array(np.zeros(2, np.float32)), mx.array(np.eye(2, dtype=np.float32)), (25,), key=k),
}


@pytest.mark.parametrize("name", list(DRAWS))
def test_same_key_same_values_different_key_different_values(name):
    draw = DRAWS[name]
    k1, k2 = R.key(1), R.key(2)
    a, b, c = draw(k1), draw(k1), draw(k2)
    # Evaluate out of creation order: the values depend on the key alone.
    mx.eval(c)
    mx.eval(b)
    np.testing.assert_array_equal(np_(a), np_(b))
    assert not np.array_equal(np_(a), np_(c))


def test_keys_from_split_are_lazy_and_independent():
    k = R.key(0)
    k1, k2 = (R.split(k)[i] for i in range(2))
    a, b = R.uniform(shape=(100,), key=k1), R.uniform(shape=(100,), key=k2)
    assert np.abs(np.corrcoef(np_(a), np_(b))[0, 1]) < 0.3
    assert not np.array_equal(np_(a), np_(b))


def test_reference_values_are_stable():
    # Regression anchor (these agree with MLX for the same key).
    assert_close(R.uniform(shape=(4,), key=R.key(0)),
                 [0.9653215, 0.22515903, 0.63303, 0.29638183], mx.float32)
    assert np_(R.permutation(8, key=R.key(0))).tolist() == [4, 6, 1, 2, 0, 7, 3, 5]
    assert np_(R.bernoulli(0.5, (8,), key=R.key(3))).tolist() == \
        [True, False, False, True, True, True, False, True]


# -- moments on 100k samples -----------------------------------------------------
def _mean_std(x):
    x = np_(x).astype(np.float64)
    return x.mean(), x.std()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=ids)
def test_uniform_moments_and_bounds(dtype):
    x = R.uniform(shape=(N,), dtype=dtype, key=R.key(1))
    assert x.dtype == dtype and x.shape == (N,)
    v = np_(x).astype(np.float64)
    # ~50 of 100k float32 draws round to 1 in float16: the clamp keeps them below.
    assert v.min() >= 0 and v.max() < 1
    m, s = _mean_std(x)
    assert abs(m - 0.5) < 0.005 and abs(s - math.sqrt(1 / 12)) < 0.005
    y = np_(R.uniform(-3, 5, (N,), dtype, key=R.key(2))).astype(np.float64)
    assert y.min() >= -3 and y.max() < 5 and abs(y.mean() - 1) < 0.04


def test_uniform_array_bounds_broadcast():
    low = mx.transpose(mx.array(np.array([[0.0, 10.0, -5.0]], np.float32)))  # (3, 1)
    high = mx.array(np.array([1.0, 20.0], np.float32))
    with pytest.raises(ShapeError):
        R.uniform(low, high, (3,), key=R.key(0))
    x = np_(R.uniform(mx.array([0.0, 10.0]), 20.0, (N // 2, 2), key=R.key(3)))
    assert x.shape == (N // 2, 2)
    assert x[:, 0].min() >= 0 and x[:, 0].max() < 20 and x[:, 1].min() >= 10
    assert abs(x[:, 0].mean() - 10) < 0.1 and abs(x[:, 1].mean() - 15) < 0.05
    # low > high is not an error (as in MLX): values lie in (high, low].
    r = np_(R.uniform(3.0, 2.0, (1000,), key=R.key(4)))
    assert r.min() > 2 and r.max() <= 3
    assert R.uniform(low, 30.0, (3, 1), key=R.key(0)).shape == (3, 1)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=ids)
def test_normal_moments(dtype):
    m, s = _mean_std(R.normal((N,), dtype, key=R.key(5)))
    assert abs(m) < 0.015 and abs(s - 1) < 0.015
    x = R.normal((N,), dtype, loc=2.0, scale=3.0, key=R.key(6))
    assert x.dtype == dtype
    m, s = _mean_std(x)
    assert abs(m - 2) < 0.05 and abs(s - 3) < 0.05


def test_normal_complex_and_array_parameters():
    z = np_(R.normal((N,), mx.complex64, key=R.key(7)))
    assert z.dtype == np.complex64
    assert abs(z.real.var() - 0.5) < 0.01 and abs(z.imag.var() - 0.5) < 0.01
    assert abs(np.corrcoef(z.real, z.imag)[0, 1]) < 0.02
    loc = mx.array(np.array([-10.0, 0.0, 10.0], np.float64))
    x = R.normal((N // 4, 3), loc=loc, scale=mx.array([1.0, 2.0, 0.5]), key=R.key(8))
    assert x.dtype == mx.float32  # loc and scale take the requested dtype
    v = np_(x)
    assert np.allclose(v.mean(0), [-10, 0, 10], atol=0.05)
    assert np.allclose(v.std(0), [1, 2, 0.5], atol=0.05)
    # loc broadcasts with shape: the result may be larger than shape (as in MLX).
    assert R.normal((3,), loc=mx.array(np.zeros((2, 3), np.float32)), key=R.key(0)).shape == (2, 3)


@pytest.mark.parametrize("dtype", [mx.int32, mx.int64, mx.uint8, mx.int8, mx.uint32, mx.uint64,
                                   mx.int16], ids=ids)
def test_randint_range_and_moments(dtype):
    lo, hi = (-7, 13) if dtype.kind == "i" else (3, 23)
    x = R.randint(lo, hi, (N,), dtype, key=R.key(9))
    assert x.dtype == dtype and x.shape == (N,)
    v = np_(x).astype(np.int64)
    assert v.min() == lo and v.max() == hi - 1
    counts = np.bincount(v - lo)
    assert len(counts) == hi - lo and np.all(np.abs(counts / N - 1 / 20) < 0.004)


def test_randint_wide_ranges_and_edges():
    # MLX's algorithm: float32 uniform samples rounded down, so a wide range has float32's
    # resolution (as in MLX; the differential test checks the numbers themselves).
    big = np_(R.randint(-2**62, 2**62, (N,), mx.int64, key=R.key(10)))
    assert big.min() >= -2**62 and big.max() < 2**62 and np.unique(big).size > N // 2
    full = np_(R.randint(-2**31, 2**31 - 1, (N,), key=R.key(11))).astype(np.int64)
    assert full.min() >= -2**31 and full.max() < 2**31 and abs(full.mean()) < 2**31 * 0.01
    assert np_(R.randint(10, 0, (5,), key=R.key(0))).tolist() == [10] * 5  # empty: low
    assert np_(R.randint(5, 5, (3,), key=R.key(0))).tolist() == [5] * 3
    b = R.randint(0, 2, (1000,), mx.bool_, key=R.key(1))
    assert b.dtype == mx.bool_ and 400 < np_(b).sum() < 600
    arr = np_(R.randint(mx.array([0, 100]), mx.array([10, 200]), (N // 2, 2), key=R.key(2)))
    assert arr[:, 0].min() == 0 and arr[:, 0].max() == 9
    assert arr[:, 1].min() == 100 and arr[:, 1].max() == 199
    # Float bounds: samples of [0.5, 3.7) rounded down (0.5 itself is clamped to 0).
    f = np_(R.randint(0.5, 3.7, (1000,), key=R.key(3)))
    assert set(f.tolist()) == {0, 1, 2, 3}


def test_bernoulli_moments():
    x = R.bernoulli(0.3, (N,), key=R.key(12))
    assert x.dtype == mx.bool_
    assert abs(np_(x).mean() - 0.3) < 0.005
    p = mx.array(np.array([0.0, 0.25, 1.0], np.float16))
    y = np_(R.bernoulli(p, (N // 4, 3), key=R.key(13)))
    assert y[:, 0].sum() == 0 and y[:, 2].all() and abs(y[:, 1].mean() - 0.25) < 0.01
    assert R.bernoulli(p, key=R.key(0)).shape == (3,)
    assert R.bernoulli(key=R.key(0)).shape == ()


def _truncnorm_mean(a, b):
    pdf = lambda x: math.exp(-x * x / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    cdf = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    return (pdf(a) - pdf(b)) / (cdf(b) - cdf(a))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=ids)
@pytest.mark.parametrize("lower,upper", [(-1.0, 0.5), (0.0, 3.0), (-2.0, 2.0)], ids=str)
def test_truncated_normal_bounds_and_mean(dtype, lower, upper):
    x = R.truncated_normal(lower, upper, (N,), dtype, key=R.key(14))
    assert x.dtype == dtype
    v = np_(x).astype(np.float64)
    assert v.min() >= lower and v.max() <= upper
    assert abs(v.mean() - _truncnorm_mean(lower, upper)) < 0.02


def test_truncated_normal_array_bounds():
    lo = mx.array(np.array([-1.0, 0.0], np.float32))
    x = np_(R.truncated_normal(lo, 1.0, key=R.key(15)))
    assert x.shape == (2,)
    y = np_(R.truncated_normal(lo, 1.0, (N // 2, 2), key=R.key(16)))
    assert y[:, 0].min() >= -1 and y[:, 1].min() >= 0 and y.max() <= 1
    # Reversed bounds clip to lower, as in MLX.
    assert np_(R.truncated_normal(1.0, -1.0, (3,), key=R.key(0))).tolist() == [1.0] * 3


def test_gumbel_and_laplace_moments():
    m, s = _mean_std(R.gumbel((N,), key=R.key(17)))
    assert abs(m - 0.5772156649) < 0.015 and abs(s - math.pi / math.sqrt(6)) < 0.02
    m, s = _mean_std(R.laplace((N,), key=R.key(18)))
    assert abs(m) < 0.015 and abs(s - math.sqrt(2)) < 0.02
    x = R.laplace((N,), mx.float16, loc=1.0, scale=2.0, key=R.key(19))
    assert x.dtype == mx.float16
    m, s = _mean_std(x)
    assert abs(m - 1) < 0.03 and abs(s - 2 * math.sqrt(2)) < 0.04


def test_categorical_frequencies():
    logits = np.log(np.array([0.1, 0.2, 0.7], np.float32))
    x = R.categorical(mx.array(logits), num_samples=N, key=R.key(20))
    assert x.dtype == mx.uint32 and x.shape == (N,)
    freq = np.bincount(np_(x), minlength=3) / N
    assert np.allclose(freq, [0.1, 0.2, 0.7], atol=0.005)
    # Transposed logits, categories along axis 0; -inf is never drawn.
    two = np.array([[math.log(0.5), -math.inf], [math.log(0.5), 0.0]], np.float32)
    lt = mx.transpose(mx.array(two.T.copy()))
    y = np_(R.categorical(lt, axis=0, num_samples=1000, key=R.key(21)))
    assert y.shape == (2, 1000) and set(y[1].tolist()) == {1}
    assert 400 < y[0].sum() < 600


def test_permutation():
    p = np_(R.permutation(1000, key=R.key(22)))
    assert p.dtype == np.uint32 and sorted(p.tolist()) == list(range(1000))
    assert not np.array_equal(p, np.arange(1000))
    x = np.arange(12).reshape(3, 4).astype(np.int32)
    for axis in (0, 1, -1):
        y = np_(R.permutation(to_lazyx(x), axis=axis, key=R.key(23)))
        assert y.dtype == np.int32 and y.shape == x.shape
        # Whole slices move together along the axis.
        np.testing.assert_array_equal(np.sort(y, axis=axis), x)
    assert R.permutation(0, key=R.key(0)).shape == (0,)


def test_multivariate_normal_covariance():
    cov = np.array([[2.0, 0.8], [0.8, 1.0]], np.float32)
    x = R.multivariate_normal(mx.array([1.0, -2.0]), mx.array(cov), (N,), key=R.key(24))
    assert x.dtype == mx.float32 and x.shape == (N, 2)
    v = np_(x).astype(np.float64)
    assert np.allclose(v.mean(0), [1, -2], atol=0.02)
    assert np.allclose(np.cov(v.T), cov, atol=0.03)
    # Batched means and covariances broadcast with shape.
    covs = np.stack([cov, np.eye(2, dtype=np.float32) * 4])
    b = R.multivariate_normal(mx.array(np.zeros((2, 2), np.float32)), mx.array(covs),
                              (N // 4, 2), key=R.key(25))
    bv = np_(b)
    assert bv.shape == (N // 4, 2, 2)
    assert np.allclose(np.cov(bv[:, 1].T), np.eye(2) * 4, atol=0.15)
    # A singular covariance is fine: the samples lie on its range.
    s = np_(R.multivariate_normal(mx.array([0.0, 0.0]), mx.array([[1.0, 1.0], [1.0, 1.0]]),
                                  (100,), key=R.key(26)))
    np.testing.assert_allclose(s[:, 0], s[:, 1], atol=1e-5)


# -- shapes, dtypes and errors ---------------------------------------------------
SHAPES = [
    (lambda k: R.uniform(key=k), (), mx.float32),
    (lambda k: R.uniform(shape=[2, 3], dtype=mx.bfloat16, key=k), (2, 3), mx.bfloat16),
    (lambda k: R.normal(key=k), (), mx.float32),
    (lambda k: R.normal([4], mx.float64, key=k), (4,), mx.float64),
    (lambda k: R.randint(0, 5, key=k), (), mx.int32),
    (lambda k: R.randint(0, 5, [3], mx.uint16, key=k), (3,), mx.uint16),
    (lambda k: R.bernoulli(mx.array([0.1, 0.2]), [3, 2], key=k), (3, 2), mx.bool_),
    (lambda k: R.truncated_normal(-1, 1, key=k), (), mx.float32),
    (lambda k: R.gumbel([2], mx.float16, key=k), (2,), mx.float16),
    (lambda k: R.laplace([2, 2], key=k), (2, 2), mx.float32),
    (lambda k: R.categorical(mx.array(np.zeros((4, 3), np.float32)), key=k), (4,), mx.uint32),
    (lambda k: R.categorical(mx.array(np.zeros((4, 3), np.float32)), 0, key=k), (3,), mx.uint32),
    (lambda k: R.categorical(mx.array(np.zeros((4, 3), np.float32)), shape=[5, 4], key=k),
     (5, 4), mx.uint32),
    (lambda k: R.categorical(mx.array(np.zeros((4, 3), np.float32)), 0, num_samples=6, key=k),
     (3, 6), mx.uint32),
    (lambda k: R.categorical(mx.array(np.zeros((4, 3), np.int32)), key=k), (4,), mx.uint32),
    (lambda k: R.permutation(5, key=k), (5,), mx.uint32),
    (lambda k: R.multivariate_normal(mx.array(np.zeros((4, 2), np.int32)),
                                     mx.array(np.eye(2, dtype=np.float32)), key=k),
     (4, 2), mx.float32),
    (lambda k: R.uniform(shape=(0, 3), key=k), (0, 3), mx.float32),
    (lambda k: R.normal((0,), key=k), (0,), mx.float32),
]


@pytest.mark.parametrize("i", range(len(SHAPES)))
def test_output_shapes_and_dtypes(i):
    fn, shape, dtype = SHAPES[i]
    out = fn(R.key(0))
    assert out.shape == shape and out.dtype == dtype
    assert np_(out).shape == shape


def test_bad_keys():
    for bad, err in [(mx.array([1, 2, 3], mx.uint32), ShapeError),
                     (mx.array([[1, 2]], mx.uint32), ShapeError),
                     (mx.array([1.0, 2.0]), DtypeError), (mx.array([1, 2]), DtypeError),
                     (np.array([1, 2], np.uint32), DtypeError)]:
        with pytest.raises(err, match="key"):
            R.uniform(key=bad)
        with pytest.raises(err, match="key"):
            R.split(bad)


@pytest.mark.parametrize("dtype", [mx.int32, mx.bool_, mx.uint8], ids=ids)
def test_float_only_distributions_reject_other_dtypes(dtype):
    for fn in (lambda: R.uniform(dtype=dtype), lambda: R.normal((2,), dtype),
               lambda: R.truncated_normal(-1, 1, dtype=dtype), lambda: R.gumbel((2,), dtype),
               lambda: R.laplace((2,), dtype),
               lambda: R.multivariate_normal(mx.array([0.0]), mx.array([[1.0]]), dtype=dtype)):
        with pytest.raises(DtypeError, match=dtype.name):
            fn()
    with pytest.raises(DtypeError):
        R.uniform(dtype=mx.complex64)
    with pytest.raises(DtypeError):
        R.laplace((2,), mx.complex64)


def test_other_bad_input():
    k = R.key(0)
    z = mx.array(np.zeros((4, 3), np.float32))
    with pytest.raises(DtypeError):
        R.randint(0, 5, dtype=mx.float32, key=k)
    with pytest.raises(DtypeError, match="p must be"):
        R.bernoulli(1, (3,), key=k)
    with pytest.raises(ShapeError):
        R.bernoulli(mx.array([0.1, 0.9]), (3,), key=k)
    with pytest.raises(ShapeError):
        R.uniform(mx.array([0.0, 10.0]), 20.0, (1,), key=k)
    with pytest.raises(ShapeError, match="Negative"):
        R.uniform(shape=(-1,), key=k)
    with pytest.raises(ShapeError):
        R.normal(3, key=k)
    with pytest.raises(ShapeError):
        R.normal((2,), loc=mx.array([1.0, 2.0, 3.0]), key=k)
    with pytest.raises(ShapeError):
        R.truncated_normal(mx.array([-1.0, 0.0]), 1.0, (3,), key=k)
    with pytest.raises(ShapeError, match="At most one"):
        R.categorical(z, shape=(5, 4), num_samples=6, key=k)
    with pytest.raises(ShapeError):
        R.categorical(z, shape=(5, 3), key=k)
    with pytest.raises(AxisError):
        R.categorical(z, axis=2, key=k)
    with pytest.raises(AxisError):
        R.categorical(mx.array(1.0), key=k)
    with pytest.raises(AxisError):
        R.permutation(mx.array(3), key=k)
    with pytest.raises(AxisError):
        R.permutation(z, axis=2, key=k)
    with pytest.raises(ShapeError):
        R.permutation(-1, key=k)
    with pytest.raises(DtypeError):
        R.multivariate_normal(mx.array([0.0, 0.0]), mx.array(np.eye(2)), dtype=mx.float16, key=k)
    two = mx.array([0.0, 0.0])
    for mean, cov in [(mx.array(0.0), mx.array([[1.0]])), (two, mx.array([1.0, 1.0])),
                      (two, mx.array(np.ones((2, 1), np.float32))),
                      (two, mx.array(np.eye(3, dtype=np.float32)))]:
        with pytest.raises(ShapeError):
            R.multivariate_normal(mean, cov, key=k)
    with pytest.raises(ShapeError):
        R.multivariate_normal(mx.array(np.zeros((4, 2), np.float32)),
                              mx.array(np.eye(2, dtype=np.float32)), (3,), key=k)
    # Arrays made before the errors are untouched.
    assert_close(z + 1, np.ones((4, 3)), mx.float32)
