"""NumPy kernels of the ``fast`` op pack (the cpu-reference backend, and the native
``cpu`` kernels' fallback for float64 and odd layouts).

Each kernel computes in float32 (float64 for float64 inputs) and rounds once to the
output dtype, as the native and CUDA kernels do. Attention goes over query tiles so
that only a tile's scores are held at a time (:func:`attention`: GEMMs in NumPy's BLAS,
:func:`attention_tile` between them), and so does its backward (:func:`attention_vjp`,
written over an array module so that the CUDA backend runs it on CuPy); the native
backend's attention and its backward are C++ kernels instead
(``backends/cpu/native/fast.cpp``).
"""

from __future__ import annotations

import numpy as np

from lazyx.plugins import fast

MASKED = fast.MASKED


def compute_dtype(d: np.dtype) -> np.dtype:
    """float64 stays, every other floating dtype computes in float32."""
    return np.dtype(np.float64) if d == np.float64 else np.dtype(np.float32)


def rms_norm(p, ins):
    x = ins[0]
    c = compute_dtype(x.dtype)
    xf = x.astype(c, copy=False)
    r = 1.0 / np.sqrt(np.mean(np.square(xf), -1, keepdims=True) + c.type(p.eps))
    y = xf * r
    if len(ins) > 1:
        y *= ins[1].astype(c, copy=False)
    return y.astype(x.dtype, copy=False)


def rms_norm_vjp(p, ins):
    x, g = ins[0], ins[-1]
    c = compute_dtype(x.dtype)
    xf, gf = x.astype(c, copy=False), g.astype(c, copy=False)
    n = xf.shape[-1]
    r = 1.0 / np.sqrt(np.mean(np.square(xf), -1, keepdims=True) + c.type(p.eps))
    gw = gf * ins[1].astype(c, copy=False) if len(ins) > 2 else gf
    # d/dx of x r(x): r (gw - x r^2 mean(gw x))
    dx = r * (gw - xf * (r * r) * (np.sum(gw * xf, -1, keepdims=True) / n))
    out = [dx.astype(x.dtype, copy=False)]
    if len(ins) > 2:
        dw = np.sum((gf * xf * r).reshape(-1, n), 0)
        out.append(dw.astype(ins[1].dtype, copy=False))
    return tuple(out)


def _normalised(x, eps, c):
    xf = x.astype(c, copy=False)
    xc = xf - np.mean(xf, -1, keepdims=True)
    r = 1.0 / np.sqrt(np.mean(np.square(xc), -1, keepdims=True) + c.type(eps))
    return xc * r, r


def layer_norm(p, ins):
    x = ins[0]
    c = compute_dtype(x.dtype)
    y, _ = _normalised(x, p.eps, c)
    k = 1
    if p.weighted:
        y *= ins[k].astype(c, copy=False)
        k += 1
    if p.biased:
        y += ins[k].astype(c, copy=False)
    return y.astype(x.dtype, copy=False)


def layer_norm_vjp(p, ins):
    x, g = ins[0], ins[-1]
    c = compute_dtype(x.dtype)
    gf = g.astype(c, copy=False)
    xn, r = _normalised(x, p.eps, c)
    gw = gf * ins[1].astype(c, copy=False) if p.weighted else gf
    dx = r * (gw - np.mean(gw, -1, keepdims=True) - xn * np.mean(gw * xn, -1, keepdims=True))
    out = [dx.astype(x.dtype, copy=False)]
    n = x.shape[-1]
    k = 1
    if p.weighted:
        out.append(np.sum((gf * xn).reshape(-1, n), 0).astype(ins[k].dtype, copy=False))
        k += 1
    if p.biased:
        out.append(np.sum(gf.reshape(-1, n), 0).astype(ins[k].dtype, copy=False))
    return tuple(out)


def rope_angles(p, x_shape, offset, freqs, c, xp=np) -> np.ndarray:
    """The angles ``(offset + t) * scale * inv_freq`` as ``(B or 1, T, dims / 2)`` of
    dtype ``c``, computed in ``c`` as MLX does (float32 for float32 and half inputs).
    ``xp`` is the array module of ``offset`` and ``freqs`` (CuPy's on the GPU, where the
    tables are made on the device: no read back)."""
    half = p.dims // 2
    t = xp.arange(x_shape[-2], dtype=c)
    pos = (t + xp.asarray(offset).reshape(-1, 1).astype(c)) * c.type(p.scale)
    if freqs is not None:
        inv = (1.0 / freqs.astype(c)).astype(c)
    else:
        inv = xp.exp(xp.arange(0, -half, -1, dtype=c) * c.type(np.log(p.base) / half))
    return pos[..., None] * inv


def rope_tables(p, x_shape, offset, freqs, c, xp=np):
    """``(cos, sin)`` of the angles, ``sin`` negated for the inverse rotation."""
    theta = rope_angles(p, x_shape, offset, freqs, c, xp)
    cos, sin = xp.cos(theta), xp.sin(theta)
    return cos, sin if p.forward else -sin


def rope(p, ins):
    x, offset = ins[0], ins[1]
    c = compute_dtype(x.dtype)
    cos, sin = rope_tables(p, x.shape, offset, ins[2] if len(ins) > 2 else None, c)
    shape = x.shape
    xf = x.reshape(shape[0], -1, *shape[-2:]).astype(c)  # a copy: written below
    cos, sin = cos[:, None], sin[:, None]  # (B or 1, 1, T, half)
    d = p.dims
    if p.traditional:
        x1, x2 = xf[..., 0:d:2].copy(), xf[..., 1:d:2].copy()
        xf[..., 0:d:2] = x1 * cos - x2 * sin
        xf[..., 1:d:2] = x1 * sin + x2 * cos
    else:
        h = d // 2
        x1, x2 = xf[..., :h].copy(), xf[..., h:d].copy()
        xf[..., :h] = x1 * cos - x2 * sin
        xf[..., h:d] = x1 * sin + x2 * cos
    return xf.reshape(shape).astype(x.dtype, copy=False)


def attention_parts(p, ins):
    """The attention's operands as the tiled loop reads them: ``q`` scaled and
    ``k``/``v`` in the compute dtype, ``q`` viewed as ``(B, Hkv, G, Tq, D)``, the mask
    (4-d, broadcast dimensions of size 1) or None, the sinks or None."""
    q, k, v = ins[:3]
    c = compute_dtype(q.dtype)
    b, hq, tq, _ = q.shape
    hkv = k.shape[1]
    qf = (q.astype(c) * c.type(p.scale)).reshape(b, hkv, hq // hkv, tq, q.shape[3])
    mask = ins[3] if p.mask == "array" else None
    sinks = ins[3 + (mask is not None)] if p.sinks else None
    return qf, k.astype(c, copy=False), v.astype(c, copy=False), mask, sinks


def tile_keys(p, t0: int, t1: int, tq: int, tk: int) -> int:
    """How many keys the query rows ``[t0, t1)`` read: with a causal mask those up to
    the last row's diagonal, unless a row sees no key at all (``Tq > Tk``): MLX's
    masked value then averages every key, so the tile reads them all."""
    if p.mask != "causal":
        return tk
    off = tk - tq
    if t0 + off < 0:
        return tk
    return min(tk, t1 + off)


def attention_tile(p, s, t0: int, tq: int, tk: int, mask, sinks) -> np.ndarray:
    """Softmax in place of the scores ``s`` (``(B, Hkv, G, rows, keys)``, query rows
    ``t0 ...``), with the causal mask, the mask array and the sinks."""
    b, hkv, g, rows, keys = s.shape
    if p.mask == "causal":
        i = np.arange(t0, t0 + rows)[:, None] + (tk - tq)
        s[..., np.arange(keys)[None, :] > i] = MASKED
    elif mask is not None:
        m = mask[..., t0:t0 + rows, :] if mask.shape[2] != 1 else mask
        m = m[..., :keys] if m.shape[3] != 1 else m
        m = m.reshape(m.shape[0], -1, g, *m.shape[2:]) if m.shape[1] != 1 else m[:, :, None]
        if m.dtype == np.bool_:
            np.copyto(s, s.dtype.type(MASKED), where=~m)
        else:
            s += m.astype(s.dtype, copy=False)
    mx = s.max(-1, keepdims=True)
    if sinks is not None:
        sk = sinks.astype(s.dtype).reshape(1, hkv, g, 1, 1)
        mx = np.maximum(mx, sk)
    np.subtract(s, mx, out=s)
    np.exp(s, out=s)
    den = s.sum(-1, keepdims=True)
    if sinks is not None:
        den += np.exp(sk - mx)
    s /= den
    return s


#: Query rows per tile: a tile's scores (B * Hq * rows * Tk values) stay small.
TILE_ROWS = 128


def attention(p, ins):
    qf, kf, vf, mask, sinks = attention_parts(p, ins)
    b, hkv, g, tq, _ = qf.shape
    tk = kf.shape[2]
    out = np.empty((b, hkv, g, tq, vf.shape[3]), qf.dtype)
    kt = np.swapaxes(kf, -1, -2)[:, :, None]
    vv = vf[:, :, None]
    for t0 in range(0, tq, TILE_ROWS):
        t1 = min(tq, t0 + TILE_ROWS)
        keys = tile_keys(p, t0, t1, tq, tk)
        s = np.matmul(qf[..., t0:t1, :], kt[..., :keys])
        s = attention_tile(p, s, t0, tq, tk, mask, sinks)
        np.matmul(s, vv[..., :keys, :], out=out[..., t0:t1, :])
    return out.reshape(b, hkv * g, tq, -1).astype(ins[0].dtype, copy=False)


def attention_vjp(p, ins, xp=np):
    """The cotangents of attention's ``q``, ``k``, ``v`` (and with sinks their per-batch
    cotangents, ``(B, Hq)`` in the compute dtype) from ``ins = (q, k, v[, mask][, sinks],
    out, cotangent)``, over query tiles as :func:`attention`: per tile the scores and
    ``P`` are recomputed, ``dS = P (dO v^T - rowsum(dO out))`` (zero where a causal or
    boolean mask holds a score constant), ``dq = scale dS k``, and ``dk += scale dS^T q``,
    ``dv += P^T dO`` (the query heads of a kv head summed). ``xp`` is the array module
    (NumPy here, CuPy on the GPU: the same formulas, cuBLAS matmuls)."""
    q, k, v = ins[:3]
    out, cot = ins[-2], ins[-1]
    c = compute_dtype(q.dtype)
    b, hq, tq, d = q.shape
    hkv, tk, dv = k.shape[1], k.shape[2], v.shape[3]
    g = hq // hkv
    scale = c.type(p.scale)
    qf = q.astype(c).reshape(b, hkv, g, tq, d) * scale
    kf, vf = k.astype(c, copy=False), v.astype(c, copy=False)
    gf = cot.astype(c, copy=False).reshape(b, hkv, g, tq, dv)
    rows_d = xp.sum(gf * out.astype(c, copy=False).reshape(b, hkv, g, tq, dv), -1, keepdims=True)
    mask = ins[3] if p.mask == "array" else None
    sinks = ins[3 + (mask is not None)] if p.sinks else None
    dq = xp.zeros(qf.shape, c)
    dk, dvv = xp.zeros(kf.shape, c), xp.zeros(vf.shape, c)
    dsinks = xp.zeros((b, hkv, g), c)
    sk = None if sinks is None else sinks.astype(c).reshape(1, hkv, g, 1, 1)
    kt, k5, v5 = xp.swapaxes(kf, -1, -2)[:, :, None], kf[:, :, None], vf[:, :, None]
    for t0 in range(0, tq if tk else 0, TILE_ROWS):
        t1 = min(tq, t0 + TILE_ROWS)
        keys = tile_keys(p, t0, t1, tq, tk)
        s = xp.matmul(qf[..., t0:t1, :], kt[..., :keys])
        keep = None
        if p.mask == "causal":
            keep = xp.arange(t0, t1)[:, None] + (tk - tq) >= xp.arange(keys)[None, :]
        elif mask is not None:
            m = mask[..., t0:t1, :] if mask.shape[2] != 1 else mask
            m = m[..., :keys] if m.shape[3] != 1 else m
            m = m.reshape(m.shape[0], -1, g, *m.shape[2:]) if m.shape[1] != 1 else m[:, :, None]
            if m.dtype == np.bool_:
                keep = m
            else:
                s = s + m.astype(c, copy=False)
        if keep is not None:
            s = xp.where(keep, s, c.type(MASKED))
        top = s.max(-1, keepdims=True)
        if sk is not None:
            top = xp.maximum(top, sk)
        e = xp.exp(s - top)
        den = e.sum(-1, keepdims=True)
        if sk is not None:
            p_sink = xp.exp(sk - top)
            den = den + p_sink
            dsinks -= (p_sink / den * rows_d[..., t0:t1, :]).sum((-2, -1))
        pr = e / den
        g_t = gf[..., t0:t1, :]
        ds = pr * (xp.matmul(g_t, xp.swapaxes(v5[..., :keys, :], -1, -2)) - rows_d[..., t0:t1, :])
        if keep is not None:
            ds = xp.where(keep, ds, c.type(0))
        dq[..., t0:t1, :] = xp.matmul(ds, k5[..., :keys, :]) * scale
        dk[..., :keys, :] += xp.matmul(xp.swapaxes(ds, -1, -2), qf[..., t0:t1, :]).sum(2)
        dvv[..., :keys, :] += xp.matmul(xp.swapaxes(pr, -1, -2), g_t).sum(2)
    grads = (dq.reshape(q.shape).astype(q.dtype, copy=False), dk.astype(k.dtype, copy=False),
             dvv.astype(v.dtype, copy=False))
    return grads + ((dsinks.reshape(b, hq),) if p.sinks else ())


def cross_entropy(p, ins):
    logits, t = ins
    lf = logits.astype(np.float32, copy=False)
    n = lf.shape[-1]
    m = lf.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, np.float32(0))
    lse = np.log(np.sum(np.exp(lf - m), -1)) + m[..., 0]
    idx = np.mod(t.astype(np.int64), n)[..., None]
    return (lse - np.take_along_axis(lf, idx, -1)[..., 0]).astype(np.float32)


KERNELS = {
    fast.RMSNorm: rms_norm,
    fast.RMSNormVJP: rms_norm_vjp,
    fast.LayerNorm: layer_norm,
    fast.LayerNormVJP: layer_norm_vjp,
    fast.RoPE: rope,
    fast.ScaledDotProductAttention: attention,
    fast.ScaledDotProductAttentionVJP: attention_vjp,
    fast.CrossEntropy: cross_entropy,
}
