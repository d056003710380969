"""``lazyx.core.fast`` against NumPy float64 references: every option of the norms,
``rope``, attention and ``cross_entropy``, the dtypes, the native ``cpu`` backend
against ``cpu-reference``, gradients (the pack's examples through the rule checks,
and direct finite differences), ``compile`` beside element-wise code, vmap, and bad
input."""

import numpy as np
import pytest

import lazyx.core as mx
from helpers import check_jvp_vjp, check_vjp_fd, check_vmap_loop
from lazyx.errors import LazyxError
from lazyx.plugins import fast

GEN = np.random.default_rng(14)
PRECISE = {"eps": 1e-6, "rtol": 1e-5, "atol": 1e-7, "jvp": 1e-9}
IMPRECISE = {"eps": 1e-3, "rtol": 2e-2, "atol": 2e-3, "jvp": 1e-4}
DTYPES = [("float32", 2e-5), ("float16", 4e-3), ("bfloat16", 3e-2), ("float64", 1e-12)]


def _np(a):
    return np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a).astype(np.float64)


def _in(x, dtype):
    return mx.array(x).astype(getattr(mx, dtype))


def _ref_rms(x, w, eps):
    y = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)
    return y * w if w is not None else y


def _ref_ln(x, w, b, eps):
    y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
    return (y * w if w is not None else y) + (b if b is not None else 0)


def _ref_rope(x, dims, traditional, base, scale, offset, freqs=None):
    x = x.copy()
    half = dims // 2
    inv = 1.0 / freqs if freqs is not None else base ** (-np.arange(half) / half)
    pos = (np.arange(x.shape[-2]) + np.reshape(offset, (-1, 1))) * scale  # (B or 1, T)
    th = pos[..., None] * inv
    th = th.reshape(th.shape[:1] + (1,) * (x.ndim - 3) + th.shape[1:])
    c, s = np.cos(th), np.sin(th)
    i1, i2 = (slice(0, dims, 2), slice(1, dims, 2)) if traditional else \
        (slice(0, half), slice(half, dims))
    a, b = x[..., i1].copy(), x[..., i2].copy()
    x[..., i1], x[..., i2] = a * c - b * s, a * s + b * c
    return x


def _ref_sdpa(q, k, v, scale, mask=None, sinks=None):
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, 1), np.repeat(v, g, 1)
    s = scale * q @ np.swapaxes(k, -1, -2)
    tq, tk = s.shape[-2:]
    if isinstance(mask, str):
        mask = np.arange(tq)[:, None] + tk - tq >= np.arange(tk)
    if mask is not None:
        s = np.where(mask, s, fast.MASKED) if mask.dtype == bool else s + mask
    if sinks is not None:
        s = np.concatenate([np.broadcast_to(sinks[:, None, None], s.shape[:-1] + (1,)), s], -1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p[..., 1:] if sinks is not None else p) @ v


@pytest.fixture(params=["cpu", "cpu-reference"])
def backend(request):
    with mx.use_backend("cpu", request.param):
        yield request.param


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("weighted", [True, False])
def test_norms(backend, dtype, tol, weighted):
    x = GEN.standard_normal((3, 5, 37))
    w, b = GEN.standard_normal(37), GEN.standard_normal(37)
    xd, wd, bd = (_np(_in(a, dtype)) for a in (x, w, b))
    got = mx.fast.rms_norm(_in(x, dtype), _in(w, dtype) if weighted else None, 1e-5)
    assert got.dtype == getattr(mx, dtype)
    np.testing.assert_allclose(_np(got), _ref_rms(xd, wd if weighted else None, 1e-5),
                               rtol=tol, atol=tol)
    for wb in [(True, True), (weighted, not weighted)]:
        got = mx.fast.layer_norm(_in(x, dtype), _in(w, dtype) if wb[0] else None,
                                 _in(b, dtype) if wb[1] else None, 1e-5)
        want = _ref_ln(xd, wd if wb[0] else None, bd if wb[1] else None, 1e-5)
        np.testing.assert_allclose(_np(got), want, rtol=tol, atol=4 * tol)


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("dims,offset,use_freqs", [(32, 3, False), (8, "vector", False),
                                                   (6, 0, True)])
def test_rope(backend, dtype, tol, traditional, dims, offset, use_freqs):
    x = GEN.standard_normal((2, 3, 7, 32))
    off = np.array([2, 9]) if offset == "vector" else offset
    freqs = GEN.uniform(0.5, 4.0, dims // 2).astype(np.float32) if use_freqs else None
    got = mx.fast.rope(_in(x, dtype), dims, traditional=traditional,
                       base=None if use_freqs else 500.0, scale=0.7,
                       offset=mx.array(off) if offset == "vector" else off,
                       freqs=mx.array(freqs) if use_freqs else None)
    assert got.dtype == getattr(mx, dtype)
    want = _ref_rope(_np(_in(x, dtype)), dims, traditional, 500.0, 0.7, off,
                     None if freqs is None else freqs.astype(np.float64))
    np.testing.assert_allclose(_np(got), want, rtol=tol, atol=4 * tol)


MASKS = [None, "causal", "additive", "bool", "bool-bcast"]


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("heads,tq,tk", [((4, 4), 5, 7), ((4, 2), 9, 5), ((6, 1), 130, 131)])
def test_attention(backend, dtype, tol, mask, heads, tq, tk):
    hq, hkv = heads
    q = GEN.standard_normal((2, hq, tq, 8))
    k, v = GEN.standard_normal((2, hkv, tk, 8)), GEN.standard_normal((2, hkv, tk, 6))
    m = {"additive": GEN.standard_normal((tq, tk)), "bool": GEN.random((2, hq, tq, tk)) < 0.6,
         "bool-bcast": GEN.random((1, tq, 1)) < 0.6}.get(mask, mask)
    sinks = GEN.standard_normal(hq) if tq == 9 else None
    lm = mx.array(m).astype(getattr(mx, dtype)) if mask == "additive" else \
        (mx.array(m) if isinstance(m, np.ndarray) else m)
    got = mx.fast.scaled_dot_product_attention(
        _in(q, dtype), _in(k, dtype), _in(v, dtype), scale=0.4, mask=lm,
        sinks=None if sinks is None else _in(sinks, dtype))
    assert got.dtype == getattr(mx, dtype) and got.shape == (2, hq, tq, 6)
    want = _ref_sdpa(*(_np(_in(a, dtype)) for a in (q, k, v)), 0.4,
                     _np(lm) if mask == "additive" else m,
                     None if sinks is None else _np(_in(sinks, dtype)))
    np.testing.assert_allclose(_np(got), want, rtol=tol, atol=4 * tol)


# The native attention kernel's blocking (48 query rows a task, 256 keys a block, micro-tiles
# of 6 rows by 16 or 32 keys / value columns): sizes across those boundaries, odd head dims,
# grouped heads, causal with Tq > Tk (rows that see no key), q/k/v read through strides.
@pytest.mark.parametrize("dtype,tol", DTYPES[:3])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", [(2, 1, 49, 257, 20, 17), (1, 1, 97, 520, 64, 64),
                                   (2, 1, 61, 40, 9, 33)])
def test_attention_native_blocks(dtype, tol, mask, shape):
    hq, hkv, tq, tk, d, dv = shape
    q = GEN.standard_normal((1, tq, hq, d))  # (B, T, H, D): the kernel reads the transpose
    k, v = GEN.standard_normal((1, hkv, tk, d)), GEN.standard_normal((1, hkv, tk, dv))
    m = {"additive": GEN.standard_normal((1, hq, tq, tk)), "bool": GEN.random((tq, tk)) < 0.3,
         "bool-bcast": GEN.random((1, 1, 1, tk)) < 0.5}.get(mask, mask)
    sinks = GEN.standard_normal(hq) if mask in ("additive", None) else None
    lm = mx.array(m).astype(getattr(mx, dtype)) if mask == "additive" else \
        (mx.array(m) if isinstance(m, np.ndarray) else m)
    lq = mx.swapaxes(_in(q, dtype), 1, 2)
    got = mx.fast.scaled_dot_product_attention(
        lq, _in(k, dtype), _in(v, dtype), scale=0.3, mask=lm,
        sinks=None if sinks is None else _in(sinks, dtype))
    want = _ref_sdpa(np.swapaxes(_np(_in(q, dtype)), 1, 2), _np(_in(k, dtype)),
                     _np(_in(v, dtype)), 0.3, _np(lm) if mask == "additive" else m,
                     None if sinks is None else _np(_in(sinks, dtype)))
    np.testing.assert_allclose(_np(got), want, rtol=tol, atol=4 * tol)


def test_attention_native_strided_kv():
    # k a transposed view, v reversed along the keys (a negative stride): read in place
    q, kt, v = GEN.standard_normal((2, 4, 33, 24)), GEN.standard_normal((2, 2, 24, 70)), \
        GEN.standard_normal((2, 2, 70, 16))
    lk = mx.swapaxes(mx.array(kt, mx.float32), 2, 3)
    lv = mx.array(v, mx.float32)[:, :, ::-1, :]
    got = mx.fast.scaled_dot_product_attention(mx.array(q, mx.float32), lk, lv, scale=0.2,
                                               mask="causal")
    want = _ref_sdpa(_np(mx.array(q, mx.float32)), _np(lk), _np(lv), 0.2, "causal")
    np.testing.assert_allclose(_np(got), want, rtol=2e-5, atol=1e-5)


def test_attention_native_infinite_mask_blocks():
    # A row whose first key block is all -inf (the online softmax starts from nothing),
    # and a row that is -inf everywhere (NaN, as the softmax of all -inf is).
    q, k, v = (GEN.standard_normal((1, 2, 5, 8)) for _ in range(3))
    k, v = np.repeat(k, 60, 2), GEN.standard_normal((1, 2, 300, 8))
    m = np.zeros((5, 300))
    m[:3, :280] = -np.inf
    m[4] = -np.inf
    got = np.array(mx.fast.scaled_dot_product_attention(
        mx.array(q, mx.float32), mx.array(k, mx.float32), mx.array(v, mx.float32), scale=0.5,
        mask=mx.array(m, mx.float32)))
    assert np.isnan(got[:, :, 4]).all()
    with np.errstate(invalid="ignore"):
        want = _ref_sdpa(q[:, :, :4], k, v, 0.5, m[:4])
    np.testing.assert_allclose(got[:, :, :4], want, rtol=1e-5, atol=1e-5)


# The norms' one-sweep statistics and streamed outputs: a mean far from 0, rows that are
# not a whole number of vectors, an output past the streaming-store threshold (16 MiB).
@pytest.mark.parametrize("dtype,tol", DTYPES[:3])
def test_norms_native_shifted_rows(dtype, tol):
    x = 300.0 + GEN.standard_normal((7, 1027))
    w, b = GEN.standard_normal(1027), GEN.standard_normal(1027)
    xd, wd, bd = (_np(_in(a, dtype)) for a in (x, w, b))
    got = mx.fast.layer_norm(_in(x, dtype), _in(w, dtype), _in(b, dtype), 1e-5)
    scale = 1.0 if dtype == "float32" else 300.0  # the half types hold x to 300 ulp(1)
    np.testing.assert_allclose(_np(got), _ref_ln(xd, wd, bd, 1e-5), rtol=tol * scale,
                               atol=4 * tol * scale)
    got = mx.fast.rms_norm(_in(x, dtype), _in(w, dtype), 1e-5)
    np.testing.assert_allclose(_np(got), _ref_rms(xd, wd, 1e-5), rtol=tol, atol=4 * tol)


def test_norms_native_streamed_output():
    x = GEN.standard_normal((1025, 4099)).astype(np.float32)  # rows not 32-byte aligned
    w = GEN.standard_normal(4099).astype(np.float32)
    xd, wd = x.astype(np.float64), w.astype(np.float64)
    got = np.array(mx.fast.layer_norm(mx.array(x), mx.array(w), None, 1e-5))
    np.testing.assert_allclose(got, _ref_ln(xd, wd, None, 1e-5), rtol=2e-5, atol=1e-4)
    got = np.array(mx.fast.rms_norm(mx.array(x), mx.array(w), 1e-5))
    np.testing.assert_allclose(got, _ref_rms(xd, wd, 1e-5), rtol=2e-5, atol=1e-4)


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_cross_entropy(backend, dtype, tol):
    tol = max(tol, 2e-5)  # float32 accumulation whatever the logits' type (MLX's fused kernel)
    x = GEN.standard_normal((4, 3, 50)) * 3
    t = GEN.integers(0, 50, (4, 3))
    got = mx.fast.cross_entropy(_in(x, dtype), mx.array(t))
    assert got.dtype == mx.float32 and got.shape == (4, 3)
    xd = _np(_in(x, dtype))
    m = xd.max(-1)
    want = np.log(np.exp(xd - m[..., None]).sum(-1)) + m - np.take_along_axis(xd, t[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.array(got), want, rtol=tol, atol=4 * tol)


def test_examples_rules():
    """The pack's registry examples through the registry-wide test's checks."""
    for cls, make in fast.lazyx_examples():
        fn, args = make()[:2]
        xs = [np.asarray(a, np.float64) for a in args]
        # cross_entropy's output is float32: the registry test's float32 tolerances
        tol = IMPRECISE if cls is fast.CrossEntropy else PRECISE
        check_vjp_fd(fn, *xs, eps=tol["eps"], rtol=tol["rtol"], atol=tol["atol"], max_elements=0,
                     msg=cls.name)
        check_jvp_vjp(fn, *xs, rtol=tol["jvp"], atol=tol["jvp"], msg=cls.name)
        check_vmap_loop(fn, *[np.stack([a, 0.5 * a]) for a in xs], in_axes=0, msg=cls.name)
        check_vmap_loop(fn, *[np.stack([a, 0.5 * a], -1) for a in xs], in_axes=-1, msg=cls.name)


def test_gradients_float32_native():
    """The fused backward kernels (native, float32) against central differences."""
    x = GEN.standard_normal((6, 40))
    w, b = GEN.standard_normal(40), GEN.standard_normal(40)
    c = GEN.standard_normal((6, 40))
    for fn in (lambda x, w, b: mx.fast.rms_norm(x, w, 1e-5),
               lambda x, w, b: mx.fast.layer_norm(x, w, b, 1e-5)):
        def loss(x, w, b):
            return mx.sum(fn(x, w, b) * mx.array(c, dtype=mx.float32))
        g = mx.grad(loss, argnums=(0, 1, 2))(*(mx.array(a, dtype=mx.float32) for a in (x, w, b)))
        g64 = mx.grad(loss, argnums=(0, 1, 2))(*(mx.array(a) for a in (x, w, b)))
        for a, r in zip(g, g64):
            np.testing.assert_allclose(np.array(a), np.array(r), rtol=2e-4, atol=2e-4)


def test_compile_beside_elementwise():
    x = mx.array(GEN.standard_normal((4, 16)), dtype=mx.float32)
    w = mx.array(GEN.standard_normal(16), dtype=mx.float32)

    def f(x, w):
        h = mx.exp(x) * 0.5 + 1.0
        return mx.tanh(mx.fast.rms_norm(h, w, 1e-5)) * 2.0

    np.testing.assert_allclose(np.array(mx.compile(f)(x, w)), np.array(f(x, w)), rtol=1e-6)
    xs = np.array(x, np.float64)
    h = np.exp(xs) * 0.5 + 1.0
    np.testing.assert_allclose(np.array(mx.compile(f)(x, w)),
                               np.tanh(_ref_rms(h, np.array(w, np.float64), 1e-5)) * 2, rtol=1e-5)


def _raises(fn, match):
    with pytest.raises(LazyxError, match=match) as e:
        fn()
    assert isinstance(e.value, ValueError)


def test_bad_input():
    x = mx.zeros((2, 3, 4))
    q, k = mx.zeros((1, 4, 3, 8)), mx.zeros((1, 3, 5, 8))
    _raises(lambda: mx.fast.rms_norm(x, mx.ones((5,)), 1e-5), r"weight.*5 elements.*\(2,3,4\)")
    _raises(lambda: mx.fast.layer_norm(x, None, mx.ones((1, 4)), 1e-5), r"bias must have 1 dim")
    _raises(lambda: mx.fast.rms_norm(x.astype(mx.int32), None, 1e-5), "unsupported type int32")
    rope = mx.fast.rope
    _raises(lambda: rope(x, 3, traditional=False, base=1.0, scale=1.0, offset=0), "even")
    _raises(lambda: rope(x, 6, traditional=False, base=1.0, scale=1.0, offset=0), r"exceed.*\(4\)")
    _raises(lambda: rope(x, 4, traditional=False, base=1.0, scale=1.0, offset=mx.zeros((3,), mx.int32)),
            r"2 elements.*\(3\)")
    sdpa = mx.fast.scaled_dot_product_attention
    _raises(lambda: sdpa(q, k, k, scale=1.0), r"multiple of n_kv_heads.*4.*3")
    q2, k2 = mx.zeros((1, 4, 3, 8)), mx.zeros((1, 2, 5, 8))
    _raises(lambda: sdpa(q2, k2, k2, scale=1.0, mask=mx.zeros((3, 4))), r"mask.*\(3,4\).*\(1,4,3,5\)")
    _raises(lambda: sdpa(q2.astype(mx.float16), k2.astype(mx.float16), k2.astype(mx.float16),
                         scale=1.0, mask=mx.zeros((3, 5))), "promote to output type float16")
    _raises(lambda: sdpa(q2, k2, k2, scale=1.0, mask="upper"), "causal")
    _raises(lambda: sdpa(q2, k2, k2, scale=1.0, sinks=mx.zeros((3,))), r"sinks \(3\)")
    _raises(lambda: mx.fast.cross_entropy(mx.zeros((3, 5)), mx.zeros((2,), mx.int32)),
            r"targets shape \(2\).*\(3,5\)")
