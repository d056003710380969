"""NumPy kernels of the element-wise op pack."""

import numpy as np

from lazyx.plugins import elementwise as ew


def _astype(p, ins):
    return ins[0].astype(p.dtype.np)


KERNELS = {
    ew.AsType: _astype,
    ew.Exp: lambda p, ins: np.exp(ins[0]),
    ew.Negative: lambda p, ins: np.negative(ins[0]),
    ew.Add: lambda p, ins: np.add(ins[0], ins[1]),
    ew.Subtract: lambda p, ins: np.subtract(ins[0], ins[1]),
    ew.Multiply: lambda p, ins: np.multiply(ins[0], ins[1]),
}
