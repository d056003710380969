"""The Metal kernel of :class:`~lazyx_axpby.ops.Axpby`: ``axpby.metal`` (MSL) run by
lazyx's Metal backend (:class:`lazyx.backends.metal.MetalKernel`).

The plugin registers :data:`metal_kernel` for the backend ``"metal"`` through the
``lazyx_kernels`` hook. The source is read when first needed; off a Mac it runs
on the CPU through lazyx's C++ shim, which is how the tests check it
(``metal_kernel.run_on_cpu(primitive, inputs)``).
"""

from __future__ import annotations

from pathlib import Path

import lazyx.core as mx
from lazyx.extend import MetalKernel

#: ``alpha * x + beta * y``: functions ``axpby_contiguous_<dtype>`` and
#: ``axpby_general_<dtype>``, buffers in MetalKernel's default order (x, y, out, alpha,
#: beta, shape, x_strides, y_strides, ndim). Metal has no float64 or complex64: those
#: dtypes are a DtypeError on the GPU, and run on the CPU.
metal_kernel = MetalKernel.from_file(
    Path(__file__).with_name("axpby.metal"), "axpby_{layout}_{dtype}",
    inputs=("x", "y"), constants={"alpha": "float", "beta": "float"},
    dtypes=(mx.float32, mx.float16, mx.bfloat16))
