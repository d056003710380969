"""lazyx-axpby's plugin: what it registers with lazyx, found through the entry point

    [project.entry-points.lazyx]
    axpby = "lazyx_axpby.plugin"

so ``lazyx.core.ext.axpby`` exists as soon as ``lazyx.core`` is imported, without
importing this package.
"""

from __future__ import annotations

from lazyx.extend import example, hookimpl, uniform

from .cuda import cuda_kernel
from .kernels import reference_kernel
from .metal import metal_kernel
from .ops import Axpby, axpby


@hookimpl
def lazyx_primitives():
    return [Axpby]


@hookimpl
def lazyx_ops():
    return {"ext.axpby": axpby}


@hookimpl
def lazyx_kernels():
    # The NumPy-only backend runs NumPy: the reference the C++ kernel is checked against.
    # The CUDA kernel: axpby.cu through lazyx's CUDA backend (compiled on first use).
    return [("cpu-reference", Axpby, reference_kernel),
            ("cuda", Axpby, cuda_kernel),
            # The Metal kernel: axpby.metal through lazyx's Metal backend (checked on the
            # CPU through its C++ shim where there is no Metal).
            ("metal", Axpby, metal_kernel)]


def _broadcasting(x, y):
    return axpby(x, y, 1.5, -0.75)


def _scaled_sum(x, y):
    return axpby(x, y, -2.0, 0.5)


@hookimpl
def lazyx_examples():
    # For lazyx's registry-wide check of vjp, jvp and vmap.
    return [(Axpby, example(_broadcasting, uniform((2, 3)), uniform((3,)))),
            (Axpby, example(_scaled_sum, uniform((2, 1)), uniform((2, 4))))]
