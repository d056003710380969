"""Attention's fused backward (``ScaledDotProductAttentionVJP``) against NumPy float64
references: the gradients of ``q``, ``k``, ``v`` and the sinks for every mask kind,
grouped-query heads, ``Tq != Tk``, the half types, on the native ``cpu`` backend (its
blocked C++ kernel: several key chunks per head, one chunk per head, strided inputs)
and on ``cpu-reference``; the reference gradients themselves against central
differences of the forward formula; the mask's cotangent (the composed rule); vmap of
the gradient; and the native kernel's checks of its arguments."""

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.plugins import fast
from test_fast import _ref_sdpa  # the float64 forward formula

GEN = np.random.default_rng(1414)
DTYPES = [("float32", 3e-5), ("float16", 4e-3), ("bfloat16", 3e-2), ("float64", 1e-12)]


def _attention_grads(q, k, v, g, scale, mask=None, sinks=None):
    """float64 ``(dq, dk, dv, dsinks)`` of ``sum(attention(q, k, v) * g)`` by the
    softmax's derivative; a causal or boolean mask holds masked scores constant."""
    hq, hkv = q.shape[1], k.shape[1]
    grp = hq // hkv
    kr, vr = np.repeat(k, grp, 1), np.repeat(v, grp, 1)
    s = scale * q @ np.swapaxes(kr, -1, -2)
    tq, tk = s.shape[-2:]
    keep = None
    if isinstance(mask, str):
        keep = np.arange(tq)[:, None] + tk - tq >= np.arange(tk)
    elif mask is not None and mask.dtype == bool:
        keep = mask
    elif mask is not None:
        s = s + mask
    if keep is not None:
        s = np.where(keep, s, fast.MASKED)
    top = s.max(-1, keepdims=True)
    if sinks is not None:
        top = np.maximum(top, sinks[:, None, None])
    e = np.exp(s - top)
    den = e.sum(-1, keepdims=True)
    if sinks is not None:
        e_sink = np.exp(sinks[:, None, None] - top)
        den = den + e_sink
    p = e / den
    o = p @ vr
    rows = np.sum(g * o, -1, keepdims=True)
    ds = p * (g @ np.swapaxes(vr, -1, -2) - rows)
    if keep is not None:
        ds = np.where(keep, ds, 0.0)
    b, _, _, d = q.shape
    dq = scale * ds @ kr
    dk = (scale * np.swapaxes(ds, -1, -2) @ q).reshape(b, hkv, grp, tk, d).sum(2)
    dv = (np.swapaxes(p, -1, -2) @ g).reshape(b, hkv, grp, tk, -1).sum(2)
    dsinks = None if sinks is None else -(e_sink / den * rows).sum((0, 2, 3))
    return dq, dk, dv, dsinks


def _masks(tq, tk):
    return {"none": None, "causal": "causal",
            "bool": GEN.random((1, 2, tq, tk)) < 0.7,
            "bool_rows": np.broadcast_to(np.arange(tk) < tk - 2, (tq, tk)).copy(),
            "additive": GEN.standard_normal((tq, tk)),
            "additive_4d": GEN.standard_normal((2, 1, tq, 1))}


def _case(shape_q, shape_k, dv, mask_name, sinks):
    q, k = GEN.standard_normal(shape_q), GEN.standard_normal(shape_k)
    v = GEN.standard_normal(shape_k[:3] + (dv,))
    g = GEN.standard_normal(shape_q[:3] + (dv,))
    mask = _masks(shape_q[2], shape_k[2])[mask_name]
    sk = GEN.standard_normal(shape_q[1]) if sinks else None
    return q, k, v, g, mask, sk


def _lazyx_grads(q, k, v, g, scale, mask, sinks, dtype):
    d = getattr(mx, dtype)
    args = [mx.array(a).astype(d) for a in (q, k, v)]
    if sinks is not None:
        args.append(mx.array(sinks).astype(d))
    m = mask
    if isinstance(mask, np.ndarray):
        m = mx.array(mask) if mask.dtype == bool else mx.array(mask).astype(d)
    gg = mx.array(g).astype(d)

    def loss(*xs):
        o = mx.fast.scaled_dot_product_attention(*xs[:3], scale=scale, mask=m,
                                                 sinks=xs[3] if len(xs) > 3 else None)
        return mx.sum((o * gg).astype(mx.float32 if dtype != "float64" else mx.float64))
    grads = mx.grad(loss, argnums=tuple(range(len(args))))(*args)
    return [np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a).astype(np.float64)
            for a in grads]


def _assert_grads(got, want, tol):
    for a, w, name in zip(got, want, ("dq", "dk", "dv", "dsinks")):
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(a, w, rtol=tol, atol=tol * scale, err_msg=name)


@pytest.fixture(params=["cpu", "cpu-reference"])
def backend(request):
    with mx.use_backend("cpu", request.param):
        yield request.param


@pytest.mark.parametrize("mask_name", ["none", "causal", "bool", "bool_rows", "additive",
                                       "additive_4d"])
@pytest.mark.parametrize("heads,tq,tk", [((2, 2), 5, 7), ((4, 2), 9, 6), ((4, 1), 6, 6)],
                         ids=["mha", "gqa_tq_gt_tk", "mqa"])
@pytest.mark.parametrize("sinks", [False, True], ids=["", "sinks"])
def test_gradients_float32(backend, mask_name, heads, tq, tk, sinks):
    q, k, v, g, mask, sk = _case((2, heads[0], tq, 8), (2, heads[1], tk, 8), 5, mask_name, sinks)
    if mask_name == "bool" and heads[0] != 2:
        mask = mask[:, :1]
    want = _attention_grads(q, k, v, g, 0.4, mask, sk)
    got = _lazyx_grads(q, k, v, g, 0.4, mask, sk, "float32")
    _assert_grads(got, [w for w in want if w is not None], 3e-5)


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("mask_name", ["causal", "additive"])
def test_gradients_dtypes(backend, dtype, tol, mask_name):
    q, k, v, g, mask, sk = _case((1, 4, 7, 16), (1, 2, 10, 16), 8, mask_name, True)
    # the reference sees the inputs as the dtype rounds them
    r = [np.array(mx.array(a).astype(getattr(mx, dtype)).astype(mx.float64))
         if a is not None and not isinstance(a, str) else a for a in (q, k, v, g, mask, sk)]
    want = _attention_grads(r[0], r[1], r[2], r[3], 0.3, r[4], r[5])
    got = _lazyx_grads(q, k, v, g, 0.3, mask, sk, dtype)
    _assert_grads(got, want, tol)


# The native kernel's blocking: 48 query rows and 128 keys a block, micro-tiles of 6 rows
# and 16 (AVX2) columns, several key chunks per (batch, kv head) when there are fewer
# than 4 per thread, one chunk (dq written by its task) otherwise.
@pytest.mark.parametrize("shape_q,shape_k", [
    ((1, 2, 100, 24), (1, 1, 300, 24)),   # chunks of keys, Tq < Tk
    ((1, 2, 260, 20), (1, 2, 130, 20)),   # Tq > Tk: causal rows that see no key
    ((4, 4, 61, 33), (4, 2, 77, 33)),     # one chunk per (batch, kv head)
], ids=["chunks", "blind_rows", "one_chunk"])
@pytest.mark.parametrize("mask_name", ["causal", "none", "bool_rows"])
def test_gradients_native_blocks(shape_q, shape_k, mask_name):
    q, k, v, g, mask, sk = _case(shape_q, shape_k, 19, mask_name, True)
    want = _attention_grads(q, k, v, g, 0.2, mask, sk)
    got = _lazyx_grads(q, k, v, g, 0.2, mask, sk, "float32")
    _assert_grads(got, want, 5e-5)


def test_reference_against_finite_differences():
    """The float64 reference gradients above are those of the forward formula."""
    q, k, v, g, _, sk = _case((1, 2, 3, 4), (1, 1, 5, 4), 3, "none", True)
    for mask in ("causal", GEN.standard_normal((3, 5)), GEN.random((3, 5)) < 0.6):
        grads = _attention_grads(q, k, v, g, 0.5, mask, sk)
        xs = [q, k, v, sk]
        for i, (x, gx) in enumerate(zip(xs, grads)):
            d = GEN.standard_normal(x.shape)

            def f(t):
                ys = list(xs)
                ys[i] = x + t * d
                return np.sum(_ref_sdpa(ys[0], ys[1], ys[2], 0.5, mask, ys[3]) * g)
            fd = (f(1e-6) - f(-1e-6)) / 2e-6
            np.testing.assert_allclose(np.sum(gx * d), fd, rtol=1e-6, atol=1e-8)


def test_uses_fused_node_and_strided_inputs():
    """The gradient is one ScaledDotProductAttentionVJP node; (B, T, H, D) views of q, k,
    v (transposed, not copied) give the gradients of the contiguous ones."""
    q, k, v, g, _, _ = _case((2, 4, 12, 8), (2, 2, 15, 8), 8, "none", False)
    lq, lk, lv = (mx.swapaxes(mx.array(np.swapaxes(a, 1, 2), mx.float32), 1, 2) for a in (q, k, v))
    gg = mx.array(g, mx.float32)
    _, grads = mx.vjp(lambda a, b, c: [mx.fast.scaled_dot_product_attention(
        a, b, c, scale=0.3, mask="causal")], [lq, lk, lv], [gg])
    assert all(isinstance(x._prim, fast.ScaledDotProductAttentionVJP) for x in grads)
    want = _attention_grads(q, k, v, g, 0.3, "causal")
    _assert_grads([np.array(x).astype(np.float64) for x in grads], want, 3e-5)


def test_mask_cotangent_composed():
    """The cotangent of an additive mask (the composition's rule) and of q, k, v."""
    q, k, v, g, mask, _ = _case((1, 2, 4, 6), (1, 2, 5, 6), 3, "additive", False)

    def loss(a, b, c, m):
        return mx.sum(mx.fast.scaled_dot_product_attention(a, b, c, scale=0.5, mask=m) *
                      mx.array(g, mx.float64))
    grads = mx.grad(loss, argnums=(0, 1, 2, 3))(*(mx.array(a, mx.float64)
                                                  for a in (q, k, v, mask)))
    want = _attention_grads(q, k, v, g, 0.5, mask)
    _assert_grads([np.array(a) for a in grads[:3]], want[:3], 1e-12)
    # d/dmask = sum over batch and heads of dS / scale
    s = 0.5 * q @ np.swapaxes(k, -1, -2) + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ds = p * (g @ np.swapaxes(v, -1, -2) - np.sum(g * (p @ v), -1, keepdims=True))
    np.testing.assert_allclose(np.array(grads[3]), ds.sum((0, 1)), rtol=1e-10, atol=1e-12)


def test_vmap_of_gradient():
    """Per-example gradients: vmap of grad folds the vmapped axis into the batch of the
    backward node (its sinks' cotangents stay per example)."""
    q, k, v, g, _, sk = _case((3, 2, 6, 8), (3, 1, 9, 8), 4, "none", True)
    lg = mx.array(g[0], mx.float32)

    def grads(a, b, c, s):
        def loss(a, b, c, s):
            o = mx.fast.scaled_dot_product_attention(a[None], b[None], c[None], scale=0.3,
                                                     mask="causal", sinks=s)
            return mx.sum(o[0] * lg)
        return mx.grad(loss, argnums=(0, 1, 2, 3))(a, b, c, s)
    lx_args = [mx.array(a, mx.float32) for a in (q, k, v)]
    got = mx.vmap(grads, in_axes=(0, 0, 0, None))(*lx_args, mx.array(sk, mx.float32))
    for i in range(3):
        want = _attention_grads(q[i:i + 1], k[i:i + 1], v[i:i + 1], g[:1], 0.3, "causal", sk)
        _assert_grads([np.array(a[i]).astype(np.float64) for a in got],
                      [w.reshape(np.array(a[i]).shape) for w, a in zip(want, got)], 3e-5)


def test_native_kernel_checks_its_arguments():
    from lazyx.backends.cpu import _native
    q = np.zeros((1, 2, 3, 4), np.float32)
    k = np.zeros((1, 1, 5, 4), np.float32)
    o = np.zeros((1, 2, 3, 4), np.float32)
    outs = [np.empty_like(q), np.empty_like(k), np.empty_like(k)]
    vjp = _native.attention_vjp_float32
    with pytest.raises(ValueError, match=r"attention_vjp.*\[B, Hq, Tq, Dv\]"):
        vjp(q, k, k, o[:, :, :2], o, *outs, None, 1.0, False, None, None, None)
    with pytest.raises(ValueError, match=r"attention_vjp.*dk has 10 elements, expected 20"):
        vjp(q, k, k, o, o, outs[0], np.empty(10, np.float32), outs[2], None, 1.0, False, None,
            None, None)
    with pytest.raises(ValueError, match="dsinks is given exactly when sinks are"):
        vjp(q, k, k, o, o, *outs, None, 1.0, False, None, None, np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="inconsistent shapes"):
        vjp(q, np.zeros((1, 3, 5, 4), np.float32), k, o, o, *outs, None, 1.0, False, None, None,
            None)
    with pytest.raises(ValueError, match="does not broadcast"):
        vjp(q, k, k, o, o, *outs, None, 1.0, False, None, np.zeros((1, 1, 2, 5), np.float32),
            None)
