"""CUDA kernels of the ``matmuls`` op pack, on CuPy arrays.

The products are cuBLAS batched GEMMs through ``cupy.matmul``: ``gather_mm`` gathers
the indexed matrices (index checks on the device, one host sync) and multiplies them in
one batched call; ``block_masked_mm`` applies the tile masks and multiplies in one
batched call; ``segmented_mm`` runs one GEMM per segment into the output's slices. The
Hadamard transform is the NumPy reference's vectorised butterfly with CuPy as the array
module (one elementwise pass per stage, one small GEMM for ``H_m``). Not yet run on a
GPU (written from CuPy's documentation).
"""

from lazyx.backends.cpu.kernels import matmuls as ref
from lazyx.plugins import matmuls as mm

from .runtime import cupy_module


def _gather_mm(p, ins):
    cp = cupy_module()
    a, b, lhs, rhs = ins
    a3 = a.reshape((-1,) + a.shape[-2:])
    b3 = b.reshape((-1,) + b.shape[-2:])
    lhs, rhs = lhs.reshape(-1), rhs.reshape(-1)
    ref.check_indices(lhs, a3.shape[0], "lhs_indices", a.shape)  # the CPU's check, on CuPy
    ref.check_indices(rhs, b3.shape[0], "rhs_indices", b.shape)
    out = cp.matmul(a3[lhs], b3[rhs])
    return out.reshape(p.output_shapes(ins)[0])


def _mask(x, mask, block: int):
    cp = cupy_module()
    up = cp.repeat(cp.repeat(mask, block, axis=-2), block, axis=-1)[..., :x.shape[-2], :x.shape[-1]]
    if mask.dtype == cp.bool_:
        return cp.where(up, x, cp.zeros((), x.dtype))
    return x * up.astype(x.dtype, copy=False)


def _block_masked_mm(p, ins):
    cp = cupy_module()
    a, b = ins[0], ins[1]
    mo, ml, mr = p._masks(ins)
    if ml is not None:
        a = _mask(a, ml, p.block_size)
    if mr is not None:
        b = _mask(b, mr, p.block_size)
    out = cp.matmul(a, b)
    return out if mo is None else _mask(out, mo, p.block_size)


def _segmented_mm(p, ins):
    cp = cupy_module()
    a, b, segments = ins
    seg = ref.segment_bounds(cp.asnumpy(segments), a.shape[1])  # bounds decide the GEMMs
    out = cp.zeros((seg.shape[0], a.shape[0], b.shape[1]), a.dtype)
    for s, (lo, hi) in enumerate(seg):
        if hi > lo:
            cp.matmul(a[:, lo:hi], b[lo:hi], out=out[s])
    return out.reshape(tuple(segments.shape[:-1]) + out.shape[1:])


def _hadamard(p, ins):
    return ref.hadamard(ins[0], p.scale, p.transposed, xp=cupy_module())


KERNELS = {
    mm.GatherMM: _gather_mm,
    mm.BlockMaskedMM: _block_masked_mm,
    mm.SegmentedMM: _segmented_mm,
    mm.Hadamard: _hadamard,
}
