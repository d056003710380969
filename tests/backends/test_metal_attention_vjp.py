"""The Metal backend's built-in kernel of attention's backward (``ScaledDotProductAttentionVJP``,
backends/metal/kernels/fast.py: dq by query rows, dk and dv by key rows, the sinks' cotangents).

Three levels, as tests/backends/test_metal_fast.py:

* the launcher through lazyx's MSL shim, in both thread orders, against a float64 NumPy
  reference of the gradients (the dense softmax derivative, below) on the same rounded
  inputs: every mask kind (none, causal, boolean with a row that sees no key, additive),
  sinks, grouped- and multi-query heads, sequence lengths that are not multiples of 32 and
  head dimensions 8, 64, 80 and 128; causal rows that see no key (``Tq > Tk``); strided
  views; empty sequences; refusals;
* the launcher against the CPU backend's kernel (native C++) on the same float32 inputs;
* ``mx.vjp`` / ``mx.grad`` of ``mx.fast.scaled_dot_product_attention`` on ``stream=mx.gpu``
  with the Metal backend emulated, against the CPU stream: the backward counted as a
  built-in kernel, no CPU fallback.
"""

import numpy as np
import pytest

import lazyx.core as mx
from helpers import rng
from lazyx import backend as registry
from lazyx.backends.metal import kernels
from lazyx.backends.metal.kernels import fast
from lazyx.backends.metal.kernels.common import UnsupportedDtype
from lazyx.backends.metal.msl_cpu import shim_available
from lazyx.plugins import fast as fp
from test_metal_backend import on_metal  # noqa: F401  (the fixture: Metal emulated, stats at 0)
from test_metal_fast import check, data
from test_metal_products import DTYPES, F64, S, run, run_reversed

pytestmark = pytest.mark.skipif(not shim_available(), reason="no C++ compiler for the MSL shim")

VJP = fp.ScaledDotProductAttentionVJP


# -- the float64 reference -----------------------------------------------------------------------
def reference(q, k, v, g, scale, mode, mask=None, sinks=None, out=None):
    """float64 ``(out, (dq, dk, dv[, dsinks]))`` of attention and of ``sum(out * g)`` by the
    softmax's derivative: ``ds = p (g . v - rowsum(g * out))``, 0 where a causal or boolean
    mask holds the score constant (at MLX's ``finfo(float32).min``); ``dk``/``dv`` summed over
    the query heads of a kv head; ``dsinks`` per batch ``(B, Hq)``. ``out``: the forward's
    output the backward is given (default: the float64 one)."""
    q, k, v, g = (np.asarray(a, F64) for a in (q, k, v, g))
    b, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    grp = hq // hkv
    kr, vr = np.repeat(k, grp, 1), np.repeat(v, grp, 1)
    s = scale * q @ np.swapaxes(kr, -1, -2)
    keep = np.ones(s.shape, bool)
    if mode == "causal":
        keep = np.broadcast_to(np.arange(tq)[:, None] + tk - tq >= np.arange(tk), s.shape)
    elif mask is not None and mask.dtype == bool:
        keep = np.broadcast_to(mask, s.shape)
    elif mask is not None:
        s = s + np.asarray(mask, F64)
    s = np.where(keep, s, fp.MASKED)
    if sinks is not None:
        column = np.broadcast_to(np.asarray(sinks, F64)[:, None, None], (b, hq, tq, 1))
        s = np.concatenate([column, s], -1)
    e = np.exp(s - s.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    p_sink, p = (p[..., 0], p[..., 1:]) if sinks is not None else (None, p)
    o = p @ vr
    rows = np.sum(g * (o if out is None else np.asarray(out, F64)), -1, keepdims=True)
    ds = np.where(keep, p * (g @ np.swapaxes(vr, -1, -2) - rows), 0.0)
    dq = scale * ds @ kr
    dk = (scale * np.swapaxes(ds, -1, -2) @ q).reshape(b, hkv, grp, tk, d).sum(2)
    dv = (np.swapaxes(p, -1, -2) @ g).reshape(b, hkv, grp, tk, g.shape[-1]).sum(2)
    grads = (dq, dk, dv)
    if sinks is not None:
        grads += (-(p_sink * rows[..., 0]).sum(-1),)
    return o, grads


def problem(dtype, gen, b, hq, hkv, tq, tk, d, dv, mode, sinks, scale):
    """A primitive and its inputs ``(q, k, v[, mask][, sinks], out, g)`` of ``dtype``: ``out``
    the float64 forward of the rounded inputs, rounded. ``mode``: "none", "causal", "bool"
    (per batch, broadcast over heads; its first row sees no key), "additive" (broadcast over
    batches and rows)."""
    q, k, v = data((b, hq, tq, d), dtype, gen), data((b, hkv, tk, d), dtype, gen), \
        data((b, hkv, tk, dv), dtype, gen)
    g = data((b, hq, tq, dv), dtype, gen)
    mask = None
    if mode == "bool":
        mask = gen.random((b, 1, tq, tk)) > 0.4
        mask[:, :, 0] = False
    elif mode == "additive":
        mask = data((1, hq, 1, tk), dtype, gen, -3, 1)
    sk = data((hq,), dtype, gen) if sinks else None
    kind = {"bool": "array", "additive": "array"}.get(mode, mode)
    out, _ = reference(q, k, v, g, scale, mode, mask, sk)
    ins = [q, k, v] + [a for a in (mask, sk) if a is not None] + [out.astype(q.dtype), g]
    return VJP(S, scale, kind, sinks), ins, mask


def expected(p, ins, mode, mask):
    """The reference's gradients of ``problem``'s inputs (the rounded output given)."""
    sk = ins[3 + (mask is not None)] if p.sinks else None
    return reference(*ins[:3], ins[-1], p.scale, mode, mask, sk, out=ins[-2])[1]


def check_grads(got, want, dtype, where):
    """dq, dk, dv within one rounding to ``dtype`` of the reference plus the float32
    computation's error (scores recomputed, sums of cancelling terms: relative to the
    gradients' scale); the sinks' float32 cotangents likewise."""
    assert len(got) == len(want), where
    for a, w, name in zip(got, want, ("dq", "dk", "dv", "dsinks")):
        assert a.dtype == (np.float32 if name == "dsinks" else getattr(mx, dtype).np), where
        atol = 2e-6 * max(1.0, float(np.abs(w).max()))
        check(a, w, "float32" if name == "dsinks" else dtype, atol, f"{where} {name}")


MODES = ("none", "causal", "bool", "additive")
# (B, Hq, Hkv, Tq, Tk, D, Dv, scale): grouped heads with Dv != D; multi-query heads at head
# dimension 64 over 37 and 45 rows; Tq > Tk at 80 (causal rows that see no key; lanes
# half-filled); 128 with Dv 40.
SHAPES = [(2, 4, 2, 5, 7, 8, 3, 0.35), (1, 4, 1, 37, 45, 64, 64, 0.125),
          (1, 2, 2, 41, 19, 80, 80, 0.11), (1, 2, 1, 9, 33, 128, 40, 0.09)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:7])))
def test_gradients_through_the_shim_float32(shape):
    gen = rng(70)
    for mode in MODES:
        for sinks in (False, True):
            p, ins, mask = problem("float32", gen, *shape[:7], mode, sinks, shape[7])
            got = fast.attention_vjp(p, ins, run)
            check_grads(got, expected(p, ins, mode, mask), "float32", f"{shape} {mode} "
                        f"sinks={sinks}")


@pytest.mark.parametrize("dtype", DTYPES[1:])
def test_gradients_through_the_shim_half_types(dtype):
    gen = rng(71)
    for shape, mode, sinks in ((SHAPES[0], "causal", True), (SHAPES[0], "bool", False),
                               (SHAPES[2], "additive", True), (SHAPES[3], "causal", False)):
        p, ins, mask = problem(dtype, gen, *shape[:7], mode, sinks, shape[7])
        got = fast.attention_vjp(p, ins, run)
        check_grads(got, expected(p, ins, mode, mask), dtype, f"{shape} {mode} sinks={sinks}")


def test_rows_that_see_no_key():
    # Causal with Tq > Tk (the first rows see no key) and a boolean row of all False: every
    # score of the row is constant, so its dq is 0, and its p (1 / Tk, MLX's average of
    # the values) gives each key's dv the row's cotangent over Tk.
    gen = rng(72)
    tq, tk = 6, 4
    for mode, blind in (("causal", tq - tk), ("bool", 1)):
        p, ins, mask = problem("float32", gen, 2, 2, 1, tq, tk, 8, 4, mode, False, 0.5)
        dq, dk, dv = fast.attention_vjp(p, ins, run)
        assert not dq[:, :, :blind].any()
        check_grads((dq, dk, dv), expected(p, ins, mode, mask), "float32", mode)
        g = ins[-1].copy()
        g[:, :, blind:] = 0   # only the blind rows' cotangents
        dv = fast.attention_vjp(p, ins[:-1] + [g], run)[2]
        np.testing.assert_allclose(dv, np.broadcast_to(g.sum((1, 2))[:, None, None] / tk,
                                                       dv.shape), rtol=1e-6, atol=1e-7)


def test_thread_orders_and_strided_views():
    # The sinks' reduction reads other threads' partial sums; a kernel that read them before
    # the barrier that publishes them would differ between the two orders. q, out and the
    # cotangent as (B, T, H, D) views, k with its head dimension strided.
    gen = rng(73)
    b, hq, hkv, tq, tk, d = 1, 4, 2, 35, 40, 16
    q = np.swapaxes(data((b, tq, hq, d), "float32", gen), 1, 2)
    k = data((b, hkv, tk, 2 * d), "float32", gen)[..., ::2]
    v = data((b, hkv, tk, d), "float32", gen)
    g = np.swapaxes(data((b, tq, hq, d), "float32", gen), 1, 2)
    sinks = data((hq,), "float32", gen)
    mask = np.broadcast_to(gen.random((1, 1, 1, tk)) > 0.3, (b, hq, tq, tk))
    for mode, extra in (("causal", [sinks]), ("bool", [mask, sinks])):
        m = mask if mode == "bool" else None
        out = np.swapaxes(np.ascontiguousarray(np.swapaxes(
            reference(q, k, v, g, 0.25, mode, m, sinks)[0].astype(np.float32), 1, 2)), 1, 2)
        p = VJP(S, 0.25, "causal" if mode == "causal" else "array", True)
        ins = [q, k, v] + extra + [out, g]
        forward = fast.attention_vjp(p, ins, run)
        for a, c in zip(forward, fast.attention_vjp(p, ins, run_reversed)):
            np.testing.assert_array_equal(a, c)
        check_grads(forward, expected(p, ins, mode, m), "float32", f"strided {mode}")


def test_the_cpu_backends_kernel_agrees():
    # The native C++ kernel and the Metal one on the same float32 inputs: two float32
    # computations in different orders.
    cpu = registry.backends()["cpu"].find_kernel(VJP)
    gen = rng(74)
    for mode, sinks in (("causal", True), ("bool", False), ("additive", True)):
        p, ins, _ = problem("float32", gen, 2, 4, 2, 33, 37, 64, 48, mode, sinks, 0.125)
        for a, c, name in zip(fast.attention_vjp(p, ins, run), cpu(p, ins),
                              ("dq", "dk", "dv", "dsinks")):
            assert a.dtype == c.dtype and a.shape == c.shape, (mode, name)
            np.testing.assert_allclose(a, c, rtol=1e-5, atol=2e-6 * max(1.0, np.abs(c).max()),
                                       err_msg=f"{mode} {name}")


def test_empty_sequences_and_refusals():
    gen = rng(75)
    for tq, tk in ((0, 5), (4, 0)):
        p, ins, _ = problem("float32", gen, 1, 2, 1, tq, tk, 8, 8, "none", True, 0.5)
        got = fast.attention_vjp(p, ins, run)
        assert [a.shape for a in got] == [(1, 2, tq, 8), (1, 1, tk, 8), (1, 1, tk, 8), (1, 2)]
        assert not any(a.any() for a in got)
    p, ins, _ = problem("float32", gen, 1, 1, 1, 3, 3, 4, 4, "none", False, 0.5)
    with pytest.raises(UnsupportedDtype, match="attention_vjp has no version for dtype float64"):
        fast.attention_vjp(p, [a.astype(F64) for a in ins], run)
    with pytest.raises(UnsupportedDtype, match="attention_vjp has no version for dtype float16"):
        fast.attention_vjp(p, ins[:-1] + [ins[-1].astype(np.float16)], run)
    big = np.ones((1, 1, 2, 300), np.float32)
    with pytest.raises(UnsupportedDtype, match="head dimensions 300 .* at most 256"):
        fast.attention_vjp(p, [big] * 5, run)
    assert kernels.KERNELS[VJP] is fast.attention_vjp


# -- through the backend: stream=mx.gpu, emulated -------------------------------------------------
def _close(got, cpu, dtype, where):
    """Two float32 computations in different orders, each rounded once to ``dtype``."""
    ulp = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]
    assert got.dtype == cpu.dtype and got.shape == cpu.shape, where
    np.testing.assert_allclose(got.astype(F64), cpu.astype(F64), rtol=ulp * 8,
                               atol=max(1e-5, 2 * ulp) * max(1.0, float(np.abs(cpu).max())),
                               err_msg=where)


@pytest.mark.parametrize("dtype", DTYPES)
def test_vjp_on_the_gpu_stream_equals_the_cpu_stream(on_metal, dtype):
    gen = rng(76)
    b, hq, hkv, tq, tk, d = 2, 4, 2, 7, 9, 16
    q, k, v, cot = (mx.array(data(s, dtype, gen, -1, 1)) for s in
                    ((b, hq, tq, d), (b, hkv, tk, d), (b, hkv, tk, d), (b, hq, tq, d)))
    masks = {"none": None, "causal": "causal", "bool": mx.array(gen.random((b, 1, tq, tk)) > 0.3),
             "additive": mx.array(data((1, hq, tq, tk), dtype, gen, -2, 0))}
    # Differentiated sinks only in float32: a half type's get their float32 cotangent cast
    # back by a generated kernel; there they are held fixed (the kernel still runs).
    sinks = mx.array(data((hq,), dtype, gen))
    moving = dtype == "float32"
    for mode, mask in masks.items():
        def attend(q, k, v, *s, stream, mask=mask):
            return mx.fast.scaled_dot_product_attention(
                q, k, v, scale=0.3, mask=mask, sinks=s[0] if s else sinks, stream=stream)
        grads = {}
        for stream in (mx.gpu, mx.cpu):
            _, grads[stream] = mx.vjp(lambda *xs, stream=stream: attend(*xs, stream=stream),
                                      [q, k, v] + [sinks] * moving, [cot])
        assert len(grads[mx.gpu]) == 3 + moving
        for got, cpu, name in zip(grads[mx.gpu], grads[mx.cpu], ("dq", "dk", "dv", "dsinks")):
            _close(np.asarray(got), np.asarray(cpu), dtype, f"{mode} {name}")
    assert on_metal["cpu_fallback"] == 0, on_metal["cpu_fallback_by_primitive"]
    # Per mask: the forward and its backward built in (and the sinks' sum over batches).
    assert on_metal["builtin"] == len(masks) * (2 + moving)


def test_grad_on_the_gpu_stream_is_built_in(on_metal):
    assert mx.kernel_provider("metal", "ScaledDotProductAttentionVJP") == "backend 'metal'"
    gen = rng(77)
    q, k, v = (mx.array(data(s, "float32", gen, -1, 1)) for s in
               ((1, 6, 11, 8), (1, 2, 13, 8), (1, 2, 13, 8)))
    sinks, w = mx.array(data((6,), "float32", gen)), mx.array(data((1, 6, 11, 8), "float32", gen))

    def loss(q, k, v, s, stream):
        o = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.5, mask="causal", sinks=s,
                                                 stream=stream)
        return mx.sum(mx.multiply(o, w, stream=stream), stream=stream)
    grads = {s: mx.grad(lambda *xs, s=s: loss(*xs, s), argnums=(0, 1, 2, 3))(q, k, v, sinks)
             for s in (mx.gpu, mx.cpu)}
    for got, cpu in zip(grads[mx.gpu], grads[mx.cpu]):
        _close(np.asarray(got), np.asarray(cpu), "float32", "grad")
    assert on_metal["cpu_fallback"] == 0, on_metal["cpu_fallback_by_primitive"]
    assert on_metal["builtin"] > 0
