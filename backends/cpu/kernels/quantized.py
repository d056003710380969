"""NumPy kernels of the ``quantized`` op pack (the cpu-reference backend, and the
fallback of the native kernels).

Quantization follows MLX 0.32's CPU arithmetic step by step so that the packed
words and scales are bit-identical to MLX's:

* ``affine``: per group, in float32, ``scale = max((max - min) / (2^b - 1), 1e-7)``
  signed towards the edge of larger magnitude; ``q0 = rint(edge / scale)``; when
  ``q0 != 0`` the scale becomes ``edge / q0`` and the bias ``edge`` (else bias 0);
  values are ``clip(rint((w - bias) / scale), 0, 2^b - 1)``.
* ``mxfp4``/``mxfp8``: ``s = amax / (6 or 448)`` (in ``w``'s dtype); the E8M0 exponent is
  ``round(log2 s)``, raised by one when ``2^e < s`` (so no element saturates), and 0
  for an all-zero group; elements are ``w / 2^e`` in ``w``'s dtype, then the nearest
  E2M1 value (ties to the first in MLX's table: the smaller magnitude, +0 for a
  signed zero) or E4M3 (round to nearest even).
* ``nvfp4``: the scale is ``amax / 6`` rounded to E4M3 (saturating at 448);
  elements ``w / scale`` as for mxfp4. With a global scale ``g`` (float32), as MLX: the
  scale is ``(amax / 6) * (2688 / g)`` (the quotient in ``w``'s dtype, the product in
  float32) rounded to E4M3, the elements ``(w / scale) * (2688 / g)`` (the quotient in
  ``w``'s dtype); dequantized values are ``fp(q) * (scale * (g / 2688))`` in float32.

Packing is the little-endian bit stream of the values in uint32 words.
``quantized_matmul`` here dequantizes, then multiplies in float32 (the reference:
the native kernels multiply from the packed words).
"""

from __future__ import annotations

import numpy as np
from lazyx.plugins import quantized as q

#: E2M1 values by code, in MLX's order (ties in the nearest search go to the first).
FP4 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)
_E4M3 = []


def _e4m3():
    """float8_e4m3fn from ml_dtypes (imported on the first float-mode kernel)."""
    if not _E4M3:
        import ml_dtypes  # only the float modes need it
        _E4M3.append(ml_dtypes.float8_e4m3fn)
    return _E4M3[0]


# -- bit streams ----------------------------------------------------------------------
def pack(values: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned ``values`` (..., n) below ``2**bits`` as uint32 words (..., n*bits/32)."""
    lead, n = values.shape[:-1], values.shape[-1]
    v = values.astype(np.uint32).reshape(-1, n)
    if 32 % bits == 0:
        per = 32 // bits
        shifts = (np.arange(per, dtype=np.uint32) * bits)
        words = np.bitwise_or.reduce(v.reshape(len(v), -1, per) << shifts, axis=-1)
    else:
        stream = ((v[..., None] >> np.arange(bits, dtype=np.uint32)) & 1).astype(np.uint8)
        words = np.packbits(stream.reshape(len(v), -1), axis=-1, bitorder="little").view("<u4")
    return np.ascontiguousarray(words, dtype=np.uint32).reshape(lead + (n * bits // 32,))


def unpack(words: np.ndarray, bits: int) -> np.ndarray:
    """The inverse of :func:`pack`: uint32 words (..., m) to uint8 values (..., m*32/bits)."""
    w = np.ascontiguousarray(words, dtype=np.uint32)
    lead, m = w.shape[:-1], w.shape[-1]
    if 32 % bits == 0:
        per = 32 // bits
        shifts = np.arange(per, dtype=np.uint32) * bits
        vals = (w[..., None] >> shifts) & np.uint32((1 << bits) - 1)
        return vals.astype(np.uint8).reshape(lead + (m * per,))
    stream = np.unpackbits(w.astype("<u4").view(np.uint8).reshape(lead + (m * 4,)), axis=-1,
                           bitorder="little")
    stream = stream.reshape(lead + (m * 32 // bits, bits)).astype(np.uint8)
    return (stream << np.arange(bits, dtype=np.uint8)).sum(-1, dtype=np.uint8)


# -- scales ----------------------------------------------------------------------------
def scale_values(scales: np.ndarray, mode: str) -> np.ndarray:
    """The float32 scale of each group: ``scales`` as stored (affine), E8M0 codes
    (``2^(s - 127)``; code 0 is ``2^-127``, as MLX decodes it) or E4M3 codes."""
    if mode == "affine":
        return scales.astype(np.float32)
    if mode == "nvfp4":
        return scales.view(_e4m3()).astype(np.float32)
    return np.ldexp(np.float32(1), np.maximum(scales.astype(np.int32), 1) - 127 - (scales == 0))


def element_values(codes: np.ndarray, mode: str) -> np.ndarray:
    """The float32 value of each stored element code."""
    if mode == "affine":
        return codes.astype(np.float32)
    if mode == "mxfp8":
        return codes.view(_e4m3()).astype(np.float32)
    return FP4[codes]


# -- quantize ----------------------------------------------------------------------------
def _affine(w, gs, bits):
    g = w.reshape(-1, gs).astype(np.float32)
    nb = np.float32((1 << bits) - 1)
    hi, lo = g.max(-1, keepdims=True), g.min(-1, keepdims=True)
    mask = np.abs(lo) > np.abs(hi)
    scale = np.maximum((hi - lo) / nb, np.float32(1e-7))
    scale = np.where(mask, scale, -scale)
    edge = np.where(mask, lo, hi)
    q0 = np.rint(edge / scale)
    nz = q0 != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(nz, edge / np.where(nz, q0, 1), scale)
    bias = np.where(nz, edge, np.float32(0))
    vals = np.clip(np.rint((g - bias) / scale), 0, nb)
    lead = w.shape[:-1] + (w.shape[-1] // gs,)
    return (pack(vals.reshape(w.shape), bits), scale.astype(w.dtype).reshape(lead),
            bias.astype(w.dtype).reshape(lead))


def _fp_codes(v: np.ndarray, mode: str) -> np.ndarray:
    """Element codes of the scaled values ``v`` (float32)."""
    if mode == "mxfp8":
        # E4M3 saturates at +-448 as MLX converts (ml_dtypes would give NaN)
        return np.clip(v, -448, 448).astype(_e4m3()).view(np.uint8)
    # nearest E2M1; argmin keeps the first of equals (MLX's tie rule), NaN gives code 0
    return np.argmin(np.abs(v[..., None] - FP4), axis=-1).astype(np.uint8)


def _fp(w, gs, bits, mode, global_scale=None):
    t = w.dtype
    g = w.reshape(-1, gs)
    amax = np.abs(g).max(-1, keepdims=True)
    # amax / 6 (or 448) in w's dtype, as MLX divides (a float16 quotient may be subnormal)
    s = (amax / np.asarray(6 if bits == 4 else 448, t)).astype(t).astype(np.float32)
    inv = None if global_scale is None else _global_inverse(global_scale)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if inv is not None:
            s = s * inv
        if mode == "nvfp4":
            codes = np.minimum(s, np.float32(448)).astype(_e4m3()).view(np.uint8)
            scale = codes.view(_e4m3()).astype(t)
        else:
            e = np.clip(np.round(np.log2(s)), -127, 127)
            e = np.where(np.exp2(e) < s, e + 1, e)
            e = np.where(s == 0, 0, e)
            codes = (e + 127).astype(np.uint8)
            scale = np.exp2(e).astype(t)
        v = (g / scale).astype(t).astype(np.float32)  # the division in w's dtype, as MLX
        if inv is not None:
            v = v * inv
    vals = _fp_codes(v, mode)
    lead = w.shape[:-1] + (w.shape[-1] // gs,)
    return pack(vals.reshape(w.shape), bits), codes.reshape(lead)


def _global_inverse(global_scale) -> np.float32:
    """``2688 / g`` in float32 (E4M3's 448 times E2M1's 6 over the global scale)."""
    return np.float32(448 * 6) / np.float32(np.asarray(global_scale).reshape(()))


def quantize(w: np.ndarray, gs: int, bits: int, mode: str, global_scale=None) -> tuple:
    w = np.ascontiguousarray(w)
    if mode == "affine":
        return _affine(w, gs, bits)
    return _fp(w, gs, bits, mode, global_scale)


def dequantize(w, scales, biases, gs, bits, mode, dtype=np.float32,
               global_scale=None) -> np.ndarray:
    """Values of packed ``w``, cast to ``dtype``. Affine arithmetic runs in the scales'
    dtype (``scale * q`` rounded, then ``+ bias`` rounded), as MLX's CPU kernel does;
    the float modes multiply in float32 (with a global scale ``g``, by the group scale
    times ``g / 2688``, folded first as MLX does)."""
    if global_scale is not None:
        factor = np.float32(np.asarray(global_scale).reshape(())) / np.float32(448 * 6)
        vals = element_values(unpack(w, bits), mode)
        sc = scale_values(scales, mode) * factor
        g = vals.reshape(vals.shape[:-1] + (-1, gs)) * sc[..., None]
        return g.reshape(vals.shape).astype(dtype)
    if mode == "affine":
        t = scales.dtype
        vals = unpack(w, bits).astype(t)
        g = vals.reshape(vals.shape[:-1] + (-1, gs)) * scales[..., None] + biases[..., None]
    else:
        vals = element_values(unpack(w, bits), mode)
        g = vals.reshape(vals.shape[:-1] + (-1, gs)) * scale_values(scales, mode)[..., None]
    return g.reshape(vals.shape).astype(dtype)


def fake_quantize(x, gs, bits, mode):
    """``dequantize(quantize(x))`` in ``x``'s dtype."""
    wq, sc, *b = quantize(x, gs, bits, mode)
    return dequantize(wq, sc, b[0] if b else None, gs, bits, mode, x.dtype)


# -- kernels ---------------------------------------------------------------------------
def _quantize_kernel(p, ins):
    return quantize(ins[0], p.group_size, p.bits, p.mode, ins[1] if len(ins) > 1 else None)


def _dequantize_kernel(p, ins):
    """Inputs ``(w, scales[, biases])``, or ``(w, scales, global_scale)`` in the float
    modes (which have no biases)."""
    w, scales = ins[0], ins[1]
    third = ins[2] if len(ins) > 2 else None
    if p.mode == "affine":
        return dequantize(w, scales, third, p.group_size, p.bits, p.mode, p.dtype.np)
    return dequantize(w, scales, None, p.group_size, p.bits, p.mode, p.dtype.np, third)


def _weights(p, ins):
    return dequantize(ins[0], ins[1], ins[2] if len(ins) > 2 else None, p.group_size,
                      p.bits, p.mode)


def qmm_kernel(p, ins):
    x = ins[0]
    w = _weights(p, ins[1:])
    if p.transpose:
        w = np.swapaxes(w, -1, -2)
    return np.matmul(x.astype(np.float32), w).astype(x.dtype)


def gather_qmm_kernel(p, ins):
    x, lhs, rhs = ins[0], ins[-2].reshape(-1), ins[-1].reshape(-1)
    q.check_gather_pairs(lhs, rhs, x.shape[0], ins[1].shape[0])
    w = _weights(p, ins[1:-2])
    if p.transpose:
        w = np.swapaxes(w, -1, -2)
    out = np.matmul(x.astype(np.float32)[lhs], w[rhs]).astype(x.dtype)
    return out.reshape(ins[-1].shape + out.shape[-2:])


KERNELS = {
    q.Quantize: _quantize_kernel,
    q.Dequantize: _dequantize_kernel,
    q.QuantizedMatmul: qmm_kernel,
    q.GatherQMM: gather_qmm_kernel,
}
