"""Native kernels of the ``fast`` op pack on the ``cpu`` backend.

Each kernel takes float32, float16 and bfloat16 (the half types as uint16 views of
their bits) in C-contiguous rows, allocates its outputs here with NumPy (counted by
lazyx's allocation handler), and calls ``backends/cpu/native/fast.cpp``; float64 and
empty arrays go to the NumPy kernels (``reference``), which compute the same numbers.

Attention is one C++ kernel (flash-style: an online softmax over key blocks, with
its own micro-GEMMs) reading ``q``, ``k``, ``v`` through their strides; its backward
another (FlashAttention-2's: scores recomputed per block from each row's softmax
statistics), which also reads the output and its cotangent through their strides.
"""

from __future__ import annotations

import numpy as np

from lazyx.backends.cpu.kernels import fast as ref
from lazyx.dtypes import numpy_name
from lazyx.plugins import fast

_u16 = np.dtype(np.uint16)
#: NumPy dtype -> (suffix of the native functions, view dtype or None)
#: By dtype name: ml_dtypes (bfloat16's NumPy dtype) loads only once a bfloat16 array exists.
_TYPES = {"float32": ("float32", None), "float16": ("float16", _u16),
          "bfloat16": ("bfloat16", _u16)}


def _view(a, view):
    return None if a is None else (a if view is None else a.view(view))


def _mask_and_sinks(p, ins):
    """Attention's mask as the C++ reads it (a boolean one as uint8, an additive one in
    the scores' float32; any strides) and its sinks as contiguous float32, or None."""
    mb = ma = sk = None
    if p.mask == "array":
        m = ins[3]
        if m.dtype == np.bool_:
            mb = m.view(np.uint8)
        else:
            ma = m.astype(np.float32, copy=False)
    if p.sinks:
        sk = np.ascontiguousarray(ins[3 + (p.mask == "array")], np.float32)
    return mb, ma, sk


def kernels(native, reference) -> dict:
    def typed(x):
        """(suffix, view) for a native dtype and a non-empty input, else None."""
        return _TYPES.get(numpy_name(x.dtype)) if x.size else None

    def rms_norm(p, ins):
        x = ins[0]
        kind = typed(x)
        if kind is None:
            return reference[fast.RMSNorm](p, ins)
        suffix, view = kind
        x = np.ascontiguousarray(x)
        w = np.ascontiguousarray(ins[1]) if len(ins) > 1 else None
        out = np.empty(x.shape, x.dtype)
        getattr(native, f"rms_norm_{suffix}")(_view(x, view), _view(w, view), _view(out, view),
                                              x.shape[-1], p.eps)
        return out

    def layer_norm(p, ins):
        x = ins[0]
        kind = typed(x)
        if kind is None:
            return reference[fast.LayerNorm](p, ins)
        suffix, view = kind
        x = np.ascontiguousarray(x)
        k = 1
        w = b = None
        if p.weighted:
            w, k = np.ascontiguousarray(ins[1]), 2
        if p.biased:
            b = np.ascontiguousarray(ins[k])
        out = np.empty(x.shape, x.dtype)
        getattr(native, f"layer_norm_{suffix}")(_view(x, view), _view(w, view), _view(b, view),
                                                _view(out, view), x.shape[-1], p.eps)
        return out

    def norm_vjp(layer: bool):
        cls = fast.LayerNormVJP if layer else fast.RMSNormVJP

        def kernel(p, ins):
            x, g = ins[0], ins[-1]
            kind = typed(x)
            if kind is None:
                return reference[cls](p, ins)
            suffix, view = kind
            x, g = np.ascontiguousarray(x), np.ascontiguousarray(g)
            n = x.shape[-1]
            weighted = p.weighted if layer else len(ins) > 2
            biased = layer and p.biased
            w = np.ascontiguousarray(ins[1]) if weighted else None
            dx = np.empty(x.shape, x.dtype)
            dw = np.empty(n, np.float32) if weighted else None
            db = np.empty(n, np.float32) if biased else None
            getattr(native, f"norm_vjp_{suffix}")(_view(x, view), _view(w, view), _view(g, view),
                                                  _view(dx, view), dw, db, n, p.eps, layer)
            outs = [dx]
            outs += [a.astype(x.dtype, copy=False) for a in (dw, db) if a is not None]
            return tuple(outs)
        return kernel

    def rope(p, ins):
        x, offset = ins[0], ins[1]
        kind = typed(x)
        if kind is None:
            return reference[fast.RoPE](p, ins)
        suffix, view = kind
        x = np.ascontiguousarray(x)
        cos, sin = ref.rope_tables(p, x.shape, offset, ins[2] if len(ins) > 2 else None,
                                   np.dtype(np.float32))
        cos, sin = np.ascontiguousarray(cos), np.ascontiguousarray(sin)
        t, d = x.shape[-2], x.shape[-1]
        out = np.empty(x.shape, x.dtype)
        getattr(native, f"rope_{suffix}")(_view(x, view), _view(out, view), cos, sin, t,
                                          x.size // (x.shape[0] * d), cos.shape[0], d, p.dims,
                                          p.traditional)
        return out

    def attention(p, ins):
        q, k, v = ins[:3]
        kind = typed(q)
        if kind is None or k.shape[2] == 0:
            return reference[fast.ScaledDotProductAttention](p, ins)
        suffix, view = kind
        mb, ma, sk = _mask_and_sinks(p, ins)
        out = np.empty(q.shape[:3] + v.shape[3:], q.dtype)
        # q, k, v go in through their strides (a transposed (B, T, H, D) layout costs no copy)
        getattr(native, f"attention_{suffix}")(_view(q, view), _view(k, view), _view(v, view),
                                               _view(out, view), p.scale, p.mask == "causal",
                                               mb, ma, sk)
        return out

    def attention_vjp(p, ins):
        q, k, v = ins[:3]
        kind = typed(q)
        if kind is None or k.shape[2] == 0:
            return reference[fast.ScaledDotProductAttentionVJP](p, ins)
        suffix, view = kind
        mb, ma, sk = _mask_and_sinks(p, ins)
        o, g = ins[-2], ins[-1]
        dq, dk, dv = (np.empty(a.shape, a.dtype) for a in (q, k, v))
        dsinks = np.empty(q.shape[:2], np.float32) if p.sinks else None
        getattr(native, f"attention_vjp_{suffix}")(
            *(_view(a, view) for a in (q, k, v, o, g, dq, dk, dv)), dsinks, p.scale,
            p.mask == "causal", mb, ma, sk)
        return (dq, dk, dv) + ((dsinks,) if p.sinks else ())

    def cross_entropy(p, ins):
        logits, t = ins
        kind = typed(logits)
        if kind is None:
            return reference[fast.CrossEntropy](p, ins)
        suffix, view = kind
        x = np.ascontiguousarray(logits)
        targets = np.ascontiguousarray(t, np.int64)
        out = np.empty(t.shape, np.float32)
        getattr(native, f"cross_entropy_{suffix}")(_view(x, view), targets.reshape(-1),
                                                   out.reshape(-1), x.shape[-1])
        return out

    return {fast.RMSNorm: rms_norm, fast.LayerNorm: layer_norm,
            fast.RMSNormVJP: norm_vjp(False), fast.LayerNormVJP: norm_vjp(True),
            fast.RoPE: rope, fast.ScaledDotProductAttention: attention,
            fast.ScaledDotProductAttentionVJP: attention_vjp, fast.CrossEntropy: cross_entropy}
