"""Native kernels of the ``quantized`` op pack on the ``cpu`` backend.

``quantized_matmul`` and ``gather_qmm`` run the C++ kernel
``_native.quantized_matmul`` (backends/cpu/native/quantized.cpp), which multiplies from
the packed words. This side puts both into its one layout: ``x`` ``(nx, M, K)``
float32, the weights ``(nw, R, C)`` with their scales (and biases) passed as their
stored bytes plus a kind code (float32/float16/bfloat16 values or E8M0/E4M3 codes: the
kernel reads them itself, so a call converts and copies nothing of the weights), and
int64 index pairs ``(xi, wi)`` (for ``quantized_matmul``, the broadcast of the two
operands' batch positions). ``quantize``/``dequantize`` keep the NumPy kernels (their
arithmetic is MLX's, step by step, for bit-identical packing).
"""

from __future__ import annotations

import numpy as np
from lazyx.dtypes import numpy_name
from lazyx.plugins import quantized as q

_MODE = {"affine": 0, "mxfp4": 1, "nvfp4": 1, "mxfp8": 2}
#: The kernel's scale kinds: affine scales/biases by dtype, the float modes' codes.
#: By dtype name: ml_dtypes (bfloat16's NumPy dtype) loads only once a bfloat16 array exists.
_KIND = {"float32": 0, "float16": 1, "bfloat16": 2}
_CODES = {"mxfp4": 3, "mxfp8": 3, "nvfp4": 4}
_NONE = np.zeros((1,), np.uint8)
_ZERO = np.zeros((1,), np.int64)  # (xi, wi) of an unbatched product


def _bytes(a):
    """``a``'s data as a flat uint8 view (a copy only when it is not contiguous)."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _weights(p, ins):
    """``(w, scales, biases, kind, lead)`` as the kernel reads them: ``w`` 3-D and
    contiguous, the scales and biases their stored bytes (no conversion per call: the
    kernel reads float16/bfloat16 scales and E8M0/E4M3 codes itself)."""
    w, scales = ins[0], ins[1]
    biases = ins[2] if len(ins) > 2 else None
    lead = w.shape[:-2]
    w = np.ascontiguousarray(w).reshape((-1,) + w.shape[-2:])
    if p.mode != "affine":
        kind = _CODES[p.mode]
    else:
        if biases.dtype != scales.dtype or numpy_name(scales.dtype) not in _KIND:
            scales, biases = scales.astype(np.float32), biases.astype(np.float32)
        kind = _KIND[numpy_name(scales.dtype)]
    return w, _bytes(scales), None if biases is None else _bytes(biases), kind, lead


def _call(native, p, x, w, sc, biases, kind, xi, wi, n):
    out = np.empty((len(xi), x.shape[1], n), np.float32)
    native.quantized_matmul(x, w, sc, _NONE if biases is None else biases, kind,
                            biases is not None, xi, wi, out, p.bits, p.group_size,
                            _MODE[p.mode], p.transpose)
    return out


def kernels(native, reference) -> dict:
    if not hasattr(native, "quantized_matmul"):
        return {}

    def qmm(p, ins):
        x = ins[0]
        w, sc, biases, kind, wlead = _weights(p, ins[1:])
        xlead = x.shape[:-2]
        if not xlead and not wlead:
            batch, xi, wi = (), _ZERO, _ZERO
        else:
            batch, xi, wi = q.batch_pairs(xlead, wlead)
        xf = np.ascontiguousarray(x.reshape((-1,) + x.shape[-2:]), dtype=np.float32)
        out = _call(native, p, xf, w, sc, biases, kind, xi, wi, p.columns(w.shape))
        return out.reshape(batch + out.shape[-2:]).astype(x.dtype, copy=False)

    def gather_qmm(p, ins):
        x, lhs, rhs = ins[0], ins[-2], ins[-1]
        w, sc, biases, kind, _ = _weights(p, ins[1:-2])
        xi, wi = lhs.astype(np.int64).ravel(), rhs.astype(np.int64).ravel()
        q.check_gather_pairs(xi, wi, x.shape[0], w.shape[0])
        xf = np.ascontiguousarray(x, dtype=np.float32)
        out = _call(native, p, xf, w, sc, biases, kind, xi, wi, p.columns(w.shape))
        return out.reshape(rhs.shape + out.shape[-2:]).astype(x.dtype, copy=False)

    return {q.QuantizedMatmul: qmm, q.GatherQMM: gather_qmm}
