"""NumPy kernels of the sorting op pack (NumPy orders NaNs last, as lazyx does)."""

import numpy as np

from lazyx.plugins import sorting as so

from .common import bf16_as_float32

_uint32 = np.dtype(np.uint32)


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
    so.Sort: bf16_as_float32(lambda p, ins: np.sort(ins[0], axis=p.axis)),
    so.ArgSort: bf16_as_float32(
        lambda p, ins: np.argsort(ins[0], axis=p.axis, kind="stable").astype(_uint32)),
    so.Partition: bf16_as_float32(lambda p, ins: np.partition(ins[0], p.kth, axis=p.axis)),
    so.ArgPartition: bf16_as_float32(
        lambda p, ins: np.argpartition(ins[0], p.kth, axis=p.axis).astype(_uint32)),
    so.TopK: bf16_as_float32(_topk),
    so.SearchSorted: lambda p, ins: np.asarray(
        np.searchsorted(ins[0], ins[1], side=p.side)).astype(_uint32),
}
