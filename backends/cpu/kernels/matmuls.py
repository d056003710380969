"""NumPy kernels of the ``matmuls`` op pack (the cpu-reference backend, and the fallback
of the native one).

Products run through ``np.matmul`` (BLAS) in float32 or float64; float16 and bfloat16
operands are widened to float32 and the result narrowed once, as the products pack's
kernels do. Index data is checked here, at evaluation: a gather position outside the
operand's batch or a segment bound outside ``[0, K]`` is an
:class:`IndexOutOfRangeError` naming the op, the argument and the shapes (MLX reads
out of bounds there).
"""

import numpy as np

from lazyx.errors import IndexOutOfRangeError
from lazyx.plugins import matmuls as mm

_f32 = np.dtype(np.float32)
_BLAS = frozenset((_f32, np.dtype(np.float64)))


def wide(x):
    """``x`` in a dtype BLAS multiplies (half precision widened to float32)."""
    return x if x.dtype in _BLAS else x.astype(_f32)


def narrow(out, d):
    return out if out.dtype == d else out.astype(d)


def check_indices(index, count: int, what: str, operand_shape) -> None:
    """Raise when ``index`` holds a position outside ``[0, count)``."""
    if index.size and (index.min() < 0 or index.max() >= count):
        bad = int(index[(index < 0) | (index >= count)].ravel()[0])  # NumPy or CuPy
        raise IndexOutOfRangeError(
            f"[gather_mm] {what} holds {bad}, outside [0, {count}) for the batch of the "
            f"operand of shape {tuple(operand_shape)} (indices of shape {index.shape}); "
            f"gather_mm checks index arrays when it is evaluated.")


def gather_operands(p, ins):
    """``(a3, b3, lhs, rhs)``: the operands as stacks of matrices (widened) and the flat
    indices, checked."""
    a, b, lhs, rhs = ins
    a3 = wide(a).reshape((-1,) + a.shape[-2:])
    b3 = wide(b).reshape((-1,) + b.shape[-2:])
    lhs, rhs = lhs.reshape(-1), rhs.reshape(-1)
    check_indices(lhs, a3.shape[0], "lhs_indices", a.shape)
    check_indices(rhs, b3.shape[0], "rhs_indices", b.shape)
    return a3, b3, lhs, rhs


def _gather_mm(p, ins):
    a3, b3, lhs, rhs = gather_operands(p, ins)
    out = np.matmul(a3[lhs], b3[rhs])
    return narrow(out.reshape(p.output_shapes(ins)[0]), ins[0].dtype)


def upsample(mask, block: int, rows: int, cols: int):
    """Each mask entry repeated over its ``block x block`` tile, cut to ``rows x cols``."""
    return np.repeat(np.repeat(mask, block, axis=-2), block, axis=-1)[..., :rows, :cols]


def apply_mask(x, mask, block: int):
    """``x`` with the tiles of ``mask`` applied: zeroed (bool) or scaled (floating)."""
    up = upsample(mask, block, x.shape[-2], x.shape[-1])
    if mask.dtype == np.bool_:
        return np.where(up, x, np.zeros((), x.dtype))
    return x * up.astype(x.dtype, copy=False)


def _block_masked_mm(p, ins):
    a, b = wide(ins[0]), wide(ins[1])
    mo, ml, mr = p._masks(ins)
    bs = p.block_size
    if ml is not None:
        a = apply_mask(a, ml, bs)
    if mr is not None:
        b = apply_mask(b, mr, bs)
    out = np.matmul(a, b)
    if mo is not None:
        out = apply_mask(out, mo, bs)
    return narrow(out, ins[0].dtype)


def segment_bounds(segments, k: int):
    """The segments as ``(S, 2)`` int64, checked against the inner size ``k``."""
    seg = segments.reshape(-1, 2).astype(np.int64)
    if seg.size and (seg.min() < 0 or seg.max() > k):
        raise IndexOutOfRangeError(
            f"[segmented_mm] segments (shape {segments.shape}) hold a bound outside "
            f"[0, {k}], the inner dimension of the operands; segmented_mm checks segments "
            f"when it is evaluated.")
    return seg


def _segmented_mm(p, ins):
    a, b, segments = ins
    d = a.dtype
    a, b = wide(a), wide(b)
    seg = segment_bounds(segments, a.shape[1])
    out = np.zeros((seg.shape[0], a.shape[0], b.shape[1]), a.dtype)
    for s, (lo, hi) in enumerate(seg):
        if hi > lo:
            np.matmul(a[:, lo:hi], b[lo:hi], out=out[s])
    return narrow(out.reshape(segments.shape[:-1] + out.shape[1:]), d)


def hadamard_matrix(m: int, p: int, transposed: bool = False):
    """``kron(H_m, H_p)`` as float64 (Sylvester's ``H_p``, MLX's ``H_m``)."""
    hp = np.ones((1, 1))
    while hp.shape[0] < p:
        hp = np.block([[hp, hp], [hp, -hp]])
    hm = np.ones((1, 1)) if m == 1 else \
        np.array([[1.0 if c == "+" else -1.0 for c in row] for row in mm.hadamard_sign_rows(m)])
    h = np.kron(hm, hp)
    return h.T if transposed else h


def hadamard(x, scale: float, transposed: bool, xp=np):
    """The transform along the last axis, in float64 for float64 input, else float32:
    a butterfly over the power-of-two factor, one small matrix product over ``H_m``.
    ``xp`` is the array module (NumPy here, CuPy for the cuda backend)."""
    d = x.dtype
    n = x.shape[-1] if x.ndim else 1
    m, p = mm.hadamard_factors(n)
    y = xp.array(x, dtype=np.float64 if d == np.float64 else _f32).reshape(-1, m, p)
    h = 1
    while h < p:  # y[..., j] and y[..., j + h] for each pair of one butterfly stage
        y = y.reshape(y.shape[0], m, p // (2 * h), 2, h)
        lo, hi = y[..., 0, :], y[..., 1, :]
        y = xp.stack((lo + hi, lo - hi), axis=-2)
        h *= 2
    y = y.reshape(-1, m, p)
    if m > 1:
        hm = xp.asarray(hadamard_matrix(m, 1, transposed).astype(y.dtype))
        y = xp.matmul(hm, y)
    y *= y.dtype.type(scale)
    return narrow(y.reshape(x.shape), d)


def _hadamard(p, ins):
    return hadamard(ins[0], p.scale, p.transposed)


KERNELS = {
    mm.GatherMM: _gather_mm,
    mm.BlockMaskedMM: _block_masked_mm,
    mm.SegmentedMM: _segmented_mm,
    mm.Hadamard: _hadamard,
}
