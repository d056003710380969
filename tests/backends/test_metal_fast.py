"""The Metal backend's built-in kernels of the ``fast`` pack (backends/metal/kernels/fast.py):
RMSNorm, LayerNorm, RoPE, scaled dot-product attention and cross-entropy.

Two levels, as tests/backends/test_metal_products.py:

* the launchers through lazyx's MSL shim (:func:`run_on_cpu`) against the CPU reference
  kernels (backends/cpu/kernels/fast.py) run in float64 on the same (rounded) inputs,
  within one rounding to the dtype plus the float32 computation's error;
* ``stream=mx.gpu`` with the Metal backend emulated on the CPU against the CPU backend:
  the kernels, the norms' and attention's backwards included, are counted as built-in.

Shapes stay small: the shim runs a threadgroup's threads one at a time.
"""

import numpy as np
import pytest

import lazyx.core as mx
from helpers import random_array, rng
from lazyx.backends.cpu.kernels import fast as reference
from lazyx.backends.metal import kernels
from lazyx.backends.metal.kernels import fast
from lazyx.backends.metal.kernels.common import UnsupportedDtype
from lazyx.backends.metal.msl_cpu import shim_available
from lazyx.errors import DtypeError
from lazyx.plugins import fast as fp
from test_metal_backend import on_metal  # noqa: F401  (the fixture: Metal emulated, stats at 0)
# The products' tests' stream, dtypes, rounding bounds and runners (the shim, both orders).
from test_metal_products import DTYPES, F64, ROUNDING, S, run, run_reversed

pytestmark = pytest.mark.skipif(not shim_available(), reason="no C++ compiler for the MSL shim")


def data(shape, dtype, gen, low=-2.0, high=2.0):
    return random_array(shape, getattr(mx, dtype), gen, low, high)


def as64(*arrays):
    return [a if a.dtype.kind in "biu" else a.astype(F64) for a in arrays]


def check(got, expected, dtype, atol, where=""):
    """``got`` (of ``dtype``, or float32) within one rounding of ``expected`` (float64) plus
    ``atol`` (the float32 computation's error at the problem's scale)."""
    assert got.shape == expected.shape, (where, got.shape, expected.shape)
    got = got.astype(F64)
    tol = ROUNDING[dtype] * np.abs(expected) + atol
    bad = ~(np.abs(got - expected) <= tol)
    assert not bad.any(), f"{where} {dtype}: got {got[bad][:5]}, expected {expected[bad][:5]}"


# -- norms ---------------------------------------------------------------------------------------
# (x's shape, x's layout): one element, rows longer than a threadgroup, a strided view.
NORM_CASES = [((1, 1), "contiguous"), ((3, 40), "contiguous"), ((2, 3, 1100), "contiguous"),
              ((4, 33), "transposed"), ((5, 16), "sliced")]


def _laid_out(shape, dtype, gen, how):
    if how == "transposed":
        return data(shape[::-1], dtype, gen).T
    if how == "sliced":
        return data(shape[:-1] + (2 * shape[-1],), dtype, gen)[..., ::2]
    return data(shape, dtype, gen)


@pytest.mark.parametrize("dtype", DTYPES)
def test_norms_through_the_shim(dtype):
    gen = rng(50)
    for shape, how in NORM_CASES:
        x = _laid_out(shape, dtype, gen, how)
        w, b = data(shape[-1:], dtype, gen), data((2 * shape[-1],), dtype, gen)[::2]
        for eps in (1e-5, 0.5):
            p = fp.RMSNorm(S, eps)
            for ins in ([x], [x, w]):
                got = fast.rms_norm(p, ins, run)
                assert got.dtype == x.dtype
                check(got, reference.rms_norm(p, as64(*ins)), dtype, 1e-5, f"rms {shape} {how}")
            for weighted, biased in ((False, False), (True, False), (False, True), (True, True)):
                p = fp.LayerNorm(S, eps, weighted, biased)
                ins = [x] + [w] * weighted + [b] * biased
                got = fast.layer_norm(p, ins, run)
                assert got.dtype == x.dtype
                check(got, reference.layer_norm(p, as64(*ins)), dtype, 2e-5,
                      f"layer_norm {shape} {how} w={weighted} b={biased}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_backwards_through_the_shim(dtype):
    gen = rng(59)
    for shape, how in NORM_CASES:
        x = _laid_out(shape, dtype, gen, how)
        g = _laid_out(shape, dtype, gen, how)
        w, b = data(shape[-1:], dtype, gen), data(shape[-1:], dtype, gen)
        n = shape[-1]
        rows = x.size // n
        # float32 sums over a row (dx) and over the rows (the weight's and bias's).
        atol = 4e-6 * (n + rows)
        for eps in (1e-5, 0.5):
            p = fp.RMSNormVJP(S, eps)
            for ins in ([x, g], [x, w, g]):
                got = fast.rms_norm_vjp(p, ins, run)
                want = reference.rms_norm_vjp(p, as64(*ins))
                assert len(got) == len(want) and all(a.dtype == x.dtype for a in got)
                for a, e, what in zip(got, want, ("dx", "dweight")):
                    check(a, e, dtype, atol, f"rms_vjp {what} {shape} {how}")
            for weighted, biased in ((False, False), (True, False), (False, True), (True, True)):
                p = fp.LayerNormVJP(S, eps, weighted, biased)
                ins = [x] + [w] * weighted + [b] * biased + [g]
                got = fast.layer_norm_vjp(p, ins, run)
                want = reference.layer_norm_vjp(p, as64(*ins))
                assert len(got) == 1 + weighted + biased
                for a, e in zip(got, want):
                    check(a, e, dtype, atol, f"layer_norm_vjp {shape} {how} w={weighted} "
                                             f"b={biased}")


def test_norm_backwards_in_reverse_thread_order():
    gen = rng(60)
    x, g, w, b = (data(s, "float32", gen) for s in ((3, 700), (3, 700), (700,), (700,)))
    p = fp.LayerNormVJP(S, 1e-5, True, True)
    for a, c in zip(fast.layer_norm_vjp(p, [x, w, b, g], run),
                    fast.layer_norm_vjp(p, [x, w, b, g], run_reversed)):
        np.testing.assert_array_equal(a, c)


def test_norms_in_reverse_thread_order():
    # A thread reading the reduction's partial sums before the barrier that publishes them
    # would give other numbers when the threads run in the opposite order.
    gen = rng(51)
    x, w, b = data((3, 700), "float32", gen), data((700,), "float32", gen), data((700,), "float32", gen)
    p = fp.LayerNorm(S, 1e-5, True, True)
    np.testing.assert_array_equal(fast.layer_norm(p, [x, w, b], run),
                                  fast.layer_norm(p, [x, w, b], run_reversed))


# -- RoPE ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_through_the_shim(dtype):
    gen = rng(52)
    x = data((2, 3, 5, 10), dtype, gen)
    strided = data((2, 5, 3, 10), dtype, gen).transpose(0, 2, 1, 3)   # (B, H, T, D) as a view
    freqs = (1.0 + 3.0 * gen.random(3)).astype(np.float32)
    wide = data((1, 2, 3, 80), dtype, gen)   # 32 pairs + 16 copied features: two threadgroups
    p = fp.RoPE(S, 64, False, 10000.0, 1.0, True)
    offset = np.array(5, np.int32)
    check(fast.rope(p, [wide, offset], run), reference.rope(p, as64(wide, offset)), dtype, 1e-5,
          "rope dims=64 of 80")
    for traditional in (False, True):
        for dims, base, scale, offset, fr, forward in [
                (10, 10000.0, 1.0, np.array(0, np.int32), None, True),
                (6, 500.0, 0.5, np.array(7, np.int32), None, True),
                (6, None, 1.5, np.array([3, 11], np.int32), freqs, True),
                (8, 10000.0, 1.0, np.array([2, 0], np.int32), None, False)]:
            p = fp.RoPE(S, dims, traditional, base, scale, forward)
            for xs in (x, strided):
                ins = [xs, offset] + ([fr] if fr is not None else [])
                got = fast.rope(p, ins, run)
                assert got.dtype == xs.dtype
                # float64 angles up to ~25 rad: the kernel's float32 ones are ~2e-6 off.
                check(got, reference.rope(p, as64(xs, offset, *ins[2:])), dtype, 1e-5,
                      f"rope dims={dims} traditional={traditional} forward={forward}")
                if dtype == "float32":   # the same float32 angles: the CPU's numbers closely
                    np.testing.assert_allclose(got, reference.rope(p, ins), rtol=2e-6, atol=2e-6)


# -- attention -----------------------------------------------------------------------------------
def _attention_case(dtype, gen, b, hq, hkv, tq, tk, d, dv):
    return (data((b, hq, tq, d), dtype, gen), data((b, hkv, tk, d), dtype, gen),
            data((b, hkv, tk, dv), dtype, gen))


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_through_the_shim(dtype):
    gen = rng(53)
    cases = [  # (B, Hq, Hkv, Tq, Tk, D, Dv): one key, grouped heads, Tq > Tk, D past 32 lanes
        (1, 1, 1, 1, 1, 4, 4), (2, 4, 2, 5, 7, 8, 3), (1, 2, 1, 6, 3, 40, 8),
        (1, 3, 3, 9, 9, 16, 70)]
    for b, hq, hkv, tq, tk, d, dv in cases:
        q, k, v = _attention_case(dtype, gen, b, hq, hkv, tq, tk, d, dv)
        masks = [("none", None), ("causal", None),
                 ("array", gen.random((b, 1, tq, tk)) > 0.4),       # boolean, broadcast heads
                 ("array", data((1, hq, 1, tk), dtype, gen, -3, 1))]  # additive, broadcast rows
        for mode, mask in masks:
            for sinks in (None, data((hq,), dtype, gen)):
                p = fp.ScaledDotProductAttention(S, 0.35, mode, sinks is not None)
                ins = [q, k, v] + [m for m in (mask, sinks) if m is not None]
                got = fast.attention(p, ins, run)
                assert got.dtype == q.dtype and got.shape == (b, hq, tq, dv)
                check(got, reference.attention(p, as64(*ins)), dtype, 2e-5,
                      f"sdpa {(b, hq, hkv, tq, tk, d, dv)} {mode} "
                      f"{getattr(mask, 'dtype', '')} sinks={sinks is not None}")


def test_attention_rows_that_see_no_key_average_every_value():
    # Causal with Tq > Tk: the first rows see no key; a boolean mask of all False: MLX's
    # finfo.min scores make the row the mean of the values.
    gen = rng(54)
    q, k, v = _attention_case("float32", gen, 1, 2, 1, 5, 3, 4, 4)
    p = fp.ScaledDotProductAttention(S, 1.0, "causal", False)
    got = fast.attention(p, [q, k, v], run)
    np.testing.assert_allclose(got[:, :, :2], np.broadcast_to(v.mean(2, keepdims=True), (1, 2, 2, 4)),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got, reference.attention(p, as64(q, k, v)), rtol=1e-5, atol=1e-6)
    mask = np.zeros((1, 1, 5, 3), bool)
    got = fast.attention(fp.ScaledDotProductAttention(S, 1.0, "array", False), [q, k, v, mask], run)
    np.testing.assert_allclose(got, np.broadcast_to(v.mean(2, keepdims=True), got.shape),
                               rtol=1e-6, atol=1e-6)


def test_attention_in_reverse_thread_order_and_strided():
    gen = rng(55)
    q, k, v = _attention_case("float32", gen, 1, 2, 2, 7, 6, 8, 8)
    qt = np.swapaxes(data((1, 2, 8, 7), "float32", gen), 2, 3)   # q as a view, D strided
    p = fp.ScaledDotProductAttention(S, 0.5, "causal", False)
    for qq in (q, qt):
        forward = fast.attention(p, [qq, k, v], run)
        np.testing.assert_array_equal(forward, fast.attention(p, [qq, k, v], run_reversed))
        np.testing.assert_allclose(forward, reference.attention(p, as64(qq, k, v)),
                                   rtol=1e-5, atol=1e-6)


# -- cross-entropy -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_through_the_shim(dtype):
    gen = rng(56)
    p = fp.CrossEntropy(S)
    for shape, tdtype in (((1, 1), np.int32), ((3, 4, 37), np.int64), ((6, 1100), np.uint8),
                          ((5,), np.int16)):
        logits = data(shape, dtype, gen, -6, 6)
        targets = gen.integers(-2 * shape[-1], 2 * shape[-1], shape[:-1])
        if np.dtype(tdtype).kind == "u":
            targets = np.abs(targets) % 200
        targets = np.asarray(targets, tdtype)   # out of range and negative: taken modulo n
        got = fast.cross_entropy(p, [logits, targets], run)
        assert got.dtype == np.float32 and got.shape == targets.shape
        check(got, reference.cross_entropy(p, as64(logits, targets)).astype(F64), "float32",
              2e-6 * (1 + np.log(shape[-1]) + 6), f"cross_entropy {shape} {tdtype}")
    # Strided logits (a transposed view), and an infinite logit row: NaN as the CPU's.
    logits = data((9, 4), dtype, gen).T
    targets = np.array([0, 8, 3, 5], np.int32)
    got = fast.cross_entropy(p, [logits, targets], run)
    check(got, reference.cross_entropy(p, as64(logits, targets)).astype(F64), "float32", 2e-5)
    logits = np.array([[0.0, np.inf, 1.0]], logits.dtype)
    got = fast.cross_entropy(p, [logits, np.array([1], np.int32)], run)
    with np.errstate(invalid="ignore"):   # inf - inf in the reference
        expected = reference.cross_entropy(p, [logits.astype(F64), np.array([1], np.int32)])
    assert np.isnan(got).tolist() == np.isnan(expected).tolist() == [True]


# -- refusals, the table -------------------------------------------------------------------------
def test_dtypes_and_head_dims_without_a_kernel_are_refused():
    x = np.ones((2, 4), F64)
    with pytest.raises(UnsupportedDtype, match="rms_norm has no version for dtype float64; it "
                       "has float32, float16, bfloat16"):
        fast.rms_norm(fp.RMSNorm(S, 1e-5), [x], run)
    with pytest.raises(UnsupportedDtype, match="cross_entropy has no version for dtype bool"):
        fast.cross_entropy(fp.CrossEntropy(S), [x.astype(np.float32), np.ones(2, bool)], run)
    q = np.ones((1, 1, 2, 300), np.float32)
    with pytest.raises(UnsupportedDtype, match="head dimensions 300 .* at most 256"):
        fast.attention(fp.ScaledDotProductAttention(S, 1.0, "none", False), [q, q, q], run)
    # k or v of another dtype than q (a node built by hand: the op casts them) is refused,
    # never read as q's type.
    q = np.ones((1, 1, 2, 8), np.float32)
    for k, v in ((q.astype(np.float16), q), (q, q.astype(np.float16))):
        with pytest.raises(UnsupportedDtype, match="no version for dtype float16"):
            fast.attention(fp.ScaledDotProductAttention(S, 1.0, "none", False), [q, k, v], run)


def test_the_table_and_the_library():
    for cls, launcher in ((fp.RMSNorm, fast.rms_norm), (fp.LayerNorm, fast.layer_norm),
                          (fp.RMSNormVJP, fast.rms_norm_vjp),
                          (fp.LayerNormVJP, fast.layer_norm_vjp),
                          (fp.RoPE, fast.rope), (fp.ScaledDotProductAttention, fast.attention),
                          (fp.CrossEntropy, fast.cross_entropy)):
        assert kernels.KERNELS[cls] is launcher
    assert kernels.KERNELS[fp.ScaledDotProductAttentionVJP] is fast.attention_vjp
    assert fast.LIBRARY in kernels.LIBRARIES
    # Nine templates (norm, norm_vjp, norm_vjp_columns, rope, sdpa, cross_entropy, and
    # attention's backward: rows, keys, sinks) instantiated from the dtype tables.
    assert fast.LIBRARY.source.count("[[kernel]] void") == 9
    assert fast.LIBRARY.source.count("[[host_name(") == len(fast.DTYPES) * (11 + len(fast.TARGET_DTYPES))


# -- through the backend: stream=mx.gpu, emulated ----------------------------------------------------
def _close_to_cpu(got, cpu, dtype, where, atol=2e-5):
    """Two float32 computations in different orders, each rounded once: a few units in the last
    place of the output apart at most."""
    assert got.dtype == cpu.dtype and got.shape == cpu.shape, where
    ulp = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]
    np.testing.assert_allclose(got.astype(F64), cpu.astype(F64), rtol=ulp * 8, atol=atol,
                               err_msg=where)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fast_ops_on_the_gpu_stream_equal_the_cpu_backend(on_metal, dtype):
    gen = rng(57)
    x, w, b = (mx.array(data(s, dtype, gen)) for s in ((3, 2, 24), (24,), (24,)))
    q, k, v = (mx.array(a) for a in _attention_case(dtype, gen, 1, 4, 2, 5, 6, 8, 8))
    mask = mx.array(gen.random((1, 1, 5, 6)) > 0.3)   # 4-d: no Reshape node before it
    sinks = mx.array(data((4,), dtype, gen))
    logits, targets = mx.array(data((4, 11), dtype, gen)), mx.array(gen.integers(0, 11, 4))
    cases = {
        "rms_norm": lambda s: mx.fast.rms_norm(x, w, 1e-5, stream=s),
        "layer_norm": lambda s: mx.fast.layer_norm(x, w, b, 1e-5, stream=s),
        "layer_norm (bias)": lambda s: mx.fast.layer_norm(x, None, b, 1e-5, stream=s),
        "rope": lambda s: mx.fast.rope(x, 8, traditional=False, base=10000.0, scale=1.0,
                                       offset=3, stream=s),
        "rope traditional": lambda s: mx.fast.rope(x, 24, traditional=True, base=None, scale=0.5,
                                                   offset=mx.array([1, 4, 0]),
                                                   freqs=mx.arange(1, 13, dtype=mx.float32),
                                                   stream=s),
        "sdpa causal sinks": lambda s: mx.fast.scaled_dot_product_attention(
            q, k, v, scale=0.4, mask="causal", sinks=sinks, stream=s),
        "sdpa bool mask": lambda s: mx.fast.scaled_dot_product_attention(
            q, k, v, scale=0.4, mask=mask, stream=s),
        "cross_entropy": lambda s: mx.fast.cross_entropy(logits, targets, stream=s),
    }
    for name, fn in cases.items():
        got, cpu = (np.asarray(fn(s)) for s in (mx.gpu, mx.cpu))
        _close_to_cpu(got, cpu, "float32" if name == "cross_entropy" else dtype, name)
    assert on_metal["builtin"] == len(cases) and on_metal["cpu_fallback"] == 0


def test_the_fast_forwards_and_the_norm_backwards_are_built_in(on_metal):
    for name in ("RMSNorm", "LayerNorm", "RMSNormVJP", "LayerNormVJP", "RoPE",
                 "ScaledDotProductAttention", "CrossEntropy"):
        assert mx.kernel_provider("metal", name) == "backend 'metal'"
    # The norms' gradients run their fused backward built in (attention's: test_metal_attention_vjp).
    gen = rng(58)
    x, w = mx.array(data((3, 16), "float32", gen)), mx.array(data((16,), "float32", gen))
    b = mx.array(data((16,), "float32", gen))
    for norm in (lambda x, w, s: mx.fast.rms_norm(x, w, 1e-5, stream=s),
                 lambda x, w, s: mx.fast.layer_norm(x, w, b, 1e-5, stream=s)):
        grads = mx.grad(lambda x, w: mx.sum(mx.sin(norm(x, w, mx.gpu))), argnums=(0, 1))(x, w)
        cpu = mx.grad(lambda x, w: mx.sum(mx.sin(norm(x, w, mx.cpu))), argnums=(0, 1))(x, w)
        for g, c in zip(grads, cpu):
            np.testing.assert_allclose(np.asarray(g), np.asarray(c), rtol=1e-5, atol=1e-6)
    assert "RMSNormVJP" not in on_metal["cpu_fallback_by_primitive"]
    assert "LayerNormVJP" not in on_metal["cpu_fallback_by_primitive"]
    # A head dimension past the kernel's falls back, counted; float64 is refused.
    q = mx.array(data((1, 1, 2, 300), "float32", gen))
    got = np.asarray(mx.fast.scaled_dot_product_attention(q, q, q, scale=0.1, stream=mx.gpu))
    np.testing.assert_allclose(got, np.asarray(mx.fast.scaled_dot_product_attention(
        q, q, q, scale=0.1, stream=mx.cpu)), rtol=1e-5, atol=1e-6)
    assert on_metal["cpu_fallback_by_primitive"].get("ScaledDotProductAttention") == 1
    with pytest.raises(DtypeError, match=r"^RMSNorm cannot run on the Metal GPU with float64"):
        y = mx.array(np.ones((2, 3)), dtype=mx.float64)
        mx.eval(mx.fast.rms_norm(y, None, 1e-5, stream=mx.gpu))
