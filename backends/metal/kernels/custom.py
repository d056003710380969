"""The Metal launch of ``fast.metal_kernel``'s nodes (the custom_kernels pack's
``CustomKernel`` written for Metal): a user's MSL kernel, as MLX runs it.

The node carries the whole generated source (``lazyx.plugins.custom_kernels.metal_source``:
MLX's signature, one ``[[buffer(n)]]`` per input, used helper and output, the template
instantiated under the node's ``kernel_name``). A :class:`~.common.Library` of that source
(compiled once: the GPU runtime and the shim cache what they build by source) and one
:class:`~.common.Dispatch` per call, bound in the signature's order:

* each input: a 0-d input as ``constant T&`` (a one-element array), any other as
  ``device const T*`` — made C-contiguous first when the kernel asked for
  ``ensure_row_contiguous`` (MLX's default), else bound as it is, at its offset
  (:func:`.common.bindable`: a view with a negative stride is copied) — then, where the
  body uses them, its ``<name>_shape`` (``int``), ``<name>_strides`` (``int64_t``, in
  elements) and ``<name>_ndim`` (``int``);
* each output: a shared buffer (:func:`.common.empty`), filled with ``init_value``
  first when one was given (an atomic accumulation starts from it).

``grid`` counts threads and ``threadgroup`` tiles it (Metal's ``dispatchThreads``), as
in MLX. A kernel written for another backend (a ``fast.cuda_kernel`` node on a Metal
stream) is refused with :class:`~lazyx.errors.KernelNotFoundError`: lazyx does not fall
back, as the node's own ``eval_gpu`` says.
"""

from __future__ import annotations

import numpy as np

from lazyx.errors import KernelNotFoundError

from .common import Dispatch, Library, bindable, empty, host_array

__all__ = ["custom_kernel"]


def _library(p) -> Library:
    """``p``'s source as a library (a light wrapper: the runtimes cache the build by source)."""
    lib = Library(f"fast.metal_kernel {p.kernel_name}", p.source)
    lib.label = f"the custom Metal kernel {p.kernel_name!r} (fast.metal_kernel)"
    return lib


def custom_kernel(p, inputs, run):
    """Run the ``CustomKernel`` node ``p`` on NumPy (shared-memory) ``inputs``; its outputs."""
    if p.backend != "metal" or p.precompiled:
        raise KernelNotFoundError(
            f"The custom {p.backend} kernel {p.kernel_name!r} cannot run on the Metal backend: "
            f"it runs only on the {p.backend} backend; lazyx does not fall back.")
    buffers = []
    for x, (shape, strides, ndim) in zip(inputs, p.shape_infos, strict=True):
        x = np.asarray(x)
        if x.ndim == 0:
            buffers.append(x.reshape(1))
            continue
        # A copy (after the queued work writing x) only where the layout needs one.
        x = host_array(x) if p.ensure_row_contiguous and not x.flags.c_contiguous else \
            bindable(x)
        buffers.append(x)
        if shape:
            buffers.append(np.array(x.shape, np.int32))
        if strides:
            buffers.append(np.array([s // x.itemsize for s in x.strides], np.int64))
        if ndim:
            buffers.append(np.array([x.ndim], np.int32))
    outs = []
    for shape, d in zip(p.shapes, p.dtypes, strict=True):
        o = empty(run, tuple(shape), d.np)
        if p.init_value is not None:
            o[...] = p.init_value
        outs.append(o)
    first = len(buffers)
    buffers += outs
    run(Dispatch(_library(p), p.kernel_name, buffers, tuple(p.grid), tuple(p.threadgroup),
                 writes=tuple(range(first, first + len(outs)))))
    return outs
