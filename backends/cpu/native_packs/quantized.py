"""Native kernels of the ``quantized`` op pack on the ``cpu`` backend.

``quantized_matmul`` and ``gather_qmm`` run the C++ kernel
``_native.quantized_matmul`` (backends/cpu/native/quantized.cpp), which multiplies from
the packed words. This side puts both into its one layout: ``x`` ``(nx, M, K)``
float32, the weights ``(nw, R, C)`` with float32 scales (E8M0/E4M3 scale codes decoded
and float16/bfloat16 scales widened here: they are 1/group_size of the weights), and
int64 index pairs ``(xi, wi)`` (for ``quantized_matmul``, the broadcast of the two
operands' batch positions). ``quantize``/``dequantize`` keep the NumPy kernels (their
arithmetic is MLX's, step by step, for bit-identical packing).
"""

from __future__ import annotations

import numpy as np
from lazyx.backends.cpu.kernels import quantized as ref
from lazyx.errors import IndexOutOfRangeError
from lazyx.plugins import quantized as q

_MODE = {"affine": 0, "mxfp4": 1, "nvfp4": 1, "mxfp8": 2}
_NONE = np.zeros((1,), np.float32)


def _weights(p, ins):
    """``(w, scales, biases)`` as the kernel reads them: 3-D, contiguous, float32 scales."""
    w, scales = ins[0], ins[1]
    biases = ins[2] if len(ins) > 2 else None
    lead = w.shape[:-2]
    w = np.ascontiguousarray(w.reshape((-1,) + w.shape[-2:]))
    sc = np.ascontiguousarray(ref.scale_values(scales, p.mode).reshape((-1,) + scales.shape[-2:]))
    if biases is not None:
        biases = np.ascontiguousarray(biases.astype(np.float32).reshape(sc.shape))
    return w, sc, biases, lead


def _call(native, p, x, w, sc, biases, xi, wi, n):
    out = np.empty((len(xi), x.shape[1], n), np.float32)
    native.quantized_matmul(x, w, sc, _NONE if biases is None else biases, biases is not None,
                            xi, wi, out, p.bits, p.group_size, _MODE[p.mode], p.transpose)
    return out


def kernels(native, reference) -> dict:
    if not hasattr(native, "quantized_matmul"):
        return {}

    def qmm(p, ins):
        x = ins[0]
        w, sc, biases, wlead = _weights(p, ins[1:])
        xlead = x.shape[:-2]
        batch = np.broadcast_shapes(xlead, wlead)
        xi = np.broadcast_to(np.arange(int(np.prod(xlead)), dtype=np.int64).reshape(xlead),
                             batch).ravel()
        wi = np.broadcast_to(np.arange(int(np.prod(wlead)), dtype=np.int64).reshape(wlead),
                             batch).ravel()
        xf = np.ascontiguousarray(x.reshape((-1,) + x.shape[-2:]), dtype=np.float32)
        out = _call(native, p, xf, w, sc, biases, xi, wi, p.columns(w.shape))
        return out.reshape(batch + out.shape[-2:]).astype(x.dtype, copy=False)

    def gather_qmm(p, ins):
        x, lhs, rhs = ins[0], ins[-2], ins[-1]
        w, sc, biases, _ = _weights(p, ins[1:-2])
        xi, wi = lhs.astype(np.int64).ravel(), rhs.astype(np.int64).ravel()
        if xi.size and (xi.min() < 0 or xi.max() >= x.shape[0] or wi.min() < 0
                        or wi.max() >= w.shape[0]):
            raise IndexOutOfRangeError(
                f"[gather_qmm] indices out of range: lhs_indices must lie in [0, {x.shape[0]}) "
                f"and rhs_indices in [0, {w.shape[0]}) (the flat batch sizes of x and w).")
        xf = np.ascontiguousarray(x, dtype=np.float32)
        out = _call(native, p, xf, w, sc, biases, xi, wi, p.columns(w.shape))
        return out.reshape(rhs.shape + out.shape[-2:]).astype(x.dtype, copy=False)

    return {q.QuantizedMatmul: qmm, q.GatherQMM: gather_qmm}
