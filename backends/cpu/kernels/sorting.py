"""NumPy kernels of the sorting op pack (NumPy orders NaNs last, as lazyx does)."""

import ml_dtypes
import numpy as np

from lazyx.plugins import sorting as so

_uint32 = np.dtype(np.uint32)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_F32 = np.dtype(np.float32)


def _bf16_as_float32(fn):
    """ml_dtypes' bfloat16 comparisons do not order NaNs last in NumPy's sorts: sort the
    values as float32 (exact) and round the sorted values back."""
    def kernel(p, ins):
        x = ins[0]
        if x.dtype != _BF16:
            return fn(p, ins)
        out = fn(p, [x.astype(_F32)] + list(ins[1:]))
        return out.astype(_BF16) if out.dtype == _F32 else out
    return kernel


def _topk(p, ins):
    x = ins[0]
    axis, k = p.axis, p.k
    n = x.shape[axis]
    if k == n:
        return x
    head = (slice(None),) * axis
    if k == 0:
        return x[head + (slice(0, 0),)]
    return np.partition(x, n - k, axis=axis)[head + (slice(n - k, None),)]


KERNELS = {
    so.Sort: _bf16_as_float32(lambda p, ins: np.sort(ins[0], axis=p.axis)),
    so.ArgSort: _bf16_as_float32(
        lambda p, ins: np.argsort(ins[0], axis=p.axis, kind="stable").astype(_uint32)),
    so.Partition: _bf16_as_float32(lambda p, ins: np.partition(ins[0], p.kth, axis=p.axis)),
    so.ArgPartition: _bf16_as_float32(
        lambda p, ins: np.argpartition(ins[0], p.kth, axis=p.axis).astype(_uint32)),
    so.TopK: _bf16_as_float32(_topk),
    so.SearchSorted: lambda p, ins: np.asarray(
        np.searchsorted(ins[0], ins[1], side=p.side)).astype(_uint32),
}
