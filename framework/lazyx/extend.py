"""``lazyx.extend``: the one door for authors of primitives, op packs, kernels and backends.

Everything a plugin needs to add an operation, a kernel or a backend is here, next
to ``lazyx.core`` for the ops themselves. Import nothing else from lazyx: the
modules behind these names are internal and may move (JAX gives its extenders
``jax.extend`` for the same reason). The guides in ``docs/`` and MLX's Axpby example
(``extensions_example/``) use only this module and ``lazyx.core``.

What is here, by what you are writing:

**A primitive** (see ``docs/writing-a-custom-primitive.md``)

* :class:`Primitive`: the base class (``eval_cpu``, ``eval_gpu``, ``output_shapes``,
  ``vjp``, ``jvp``, ``vmap``, ``to_expression``); parameters are its ``__slots__``.
* Parameter declarations, annotations beside ``__slots__`` that ``export_function``
  files are checked against: :data:`Size`, :data:`Shape`, :data:`Axis`, :data:`Axes`,
  :data:`NewAxes`, and the markers :class:`Range` and :class:`AxisOf` for ``Annotated``
  (a bad declaration is a :class:`ParameterDeclarationError`).
* :func:`custom_primitive`, :func:`register`: a whole primitive from a NumPy kernel
  and rules, and its registration without an entry point.

**An op function** (see ``docs/writing-an-op-pack.md``)

* :func:`lazy`, :func:`lazy_multi`: add a node (one or several outputs) to the
  graph; :func:`from_buffer`: an evaluated array around a backend buffer.
* :func:`as_array`, :func:`binary_operands`, :func:`broadcast_shapes`, :func:`cast`,
  :func:`normalize_axis`, :func:`normalize_axes`: argument handling with MLX's
  rules and lazyx's error messages.
* :mod:`dtypes` (the dtype objects and MLX's promotion: ``promote_types``,
  ``result_type``, ``to_dtype``, ``from_numpy``), :func:`to_stream` (the ``stream=``
  argument of every op), :class:`Device`, :class:`DeviceType`, :class:`Stream`.

**Transform rules and the registry-wide checks**

* :func:`sum_to_shape`, :func:`broadcast_to_shape`, :func:`add_tangents`,
  :func:`align_batched`, :func:`batch_first`, :func:`move_batch_axis`,
  :func:`add_batch_axis`, :func:`batched_axes`, :func:`batch_size`: the shared
  moves of ``vjp``/``jvp``/``vmap`` rules.
* :func:`example`, :func:`uniform`, :func:`integers`, :func:`booleans`: example
  inputs for the ``lazyx_examples`` hook (the registry-wide rule test uses them).

**Fusion and kernels**

* :mod:`ir`: the code-generation IR an element-wise primitive's ``to_expression``
  returns, which lets ``compile`` fuse it.
* :class:`Backend`, :func:`backends`, :func:`resolve_kernel`, :func:`kernel_provider`:
  writing a backend and asking who provides a kernel; :func:`primitive_class` finds a
  registered primitive class by name (``"Subtract"``) to override its kernel.
* :class:`CudaKernel` (CUDA C++ through NVRTC, with :func:`cuda_launch_config` for a
  one-thread-per-element grid) and :class:`MetalKernel` (MSL), with
  :func:`run_msl_on_cpu` and :func:`shim_available` to check MSL on the CPU.

**Plugins and errors**

* :data:`hookimpl`: marks a plugin's hook implementations (see ``lazyx.hookspecs``);
  :func:`register_plugin` registers a plugin object in this process, without an entry
  point (notebooks, tests); :func:`print_info` prints what ``lazyx info`` prints, for
  this process (plugins registered in it included).
* The error classes of lazyx's hierarchy: raise the one that fits, with a message
  that names the op, the argument and the shapes.
"""

from __future__ import annotations

from . import dtypes
from .arguments import (as_array, binary_operands, broadcast_shapes, cast, normalize_axes,
                        normalize_axis)
from .array import array, from_buffer, lazy, lazy_multi
from .cli import info as print_info
from .backend import Backend, backends, kernel_provider, primitive_class, resolve_kernel
from .codegen import ir
from .custom_primitive import custom_primitive, register
from .device import Device, DeviceType, Stream, to_stream
from .errors import (ArgumentError, AxisError, BackendError, DeviceError, DtypeError,
                     HostOnlyKernelError, IndexOutOfRangeError, KernelCompileError,
                     KernelNotFoundError, KernelOutputError, LazyxError, PluginError, ShapeError,
                     TransformError)
from .hookspecs import hookimpl
from .primitive import (Axes, Axis, AxisOf, NewAxes, ParameterDeclarationError, Primitive, Range,
                        Shape, Size)
from .registry import register_plugin
from .examples import booleans, example, integers, uniform
from .backends.cuda import CudaKernel
from .backends.cuda import launch_config as cuda_launch_config
from .backends.metal import MetalKernel
from .rules import (add_batch_axis, add_tangents, align_batched, batch_first,
                               batch_size, batched_axes, broadcast_to_shape, move_batch_axis,
                               sum_to_shape)

__all__ = [
    # primitives
    "Primitive", "custom_primitive", "register", "Range", "AxisOf", "Size", "Shape", "Axis",
    "Axes", "NewAxes", "ParameterDeclarationError",
    # op functions
    "array", "lazy", "lazy_multi", "from_buffer", "as_array", "binary_operands",
    "broadcast_shapes", "cast", "normalize_axis", "normalize_axes", "dtypes", "to_stream",
    "Device", "DeviceType", "Stream",
    # rules and examples
    "sum_to_shape", "broadcast_to_shape", "add_tangents", "align_batched", "batch_first",
    "move_batch_axis", "add_batch_axis", "batched_axes", "batch_size",
    "example", "uniform", "integers", "booleans",
    # fusion, kernels, backends
    "ir", "Backend", "backends", "resolve_kernel", "kernel_provider", "primitive_class",
    "CudaKernel", "cuda_launch_config", "MetalKernel", "run_msl_on_cpu", "shim_available",
    # plugins and errors
    "hookimpl", "register_plugin", "print_info", "LazyxError", "ArgumentError", "ShapeError", "AxisError", "DtypeError",
    "IndexOutOfRangeError", "KernelNotFoundError", "KernelOutputError", "KernelCompileError",
    "HostOnlyKernelError", "TransformError", "PluginError", "BackendError", "DeviceError",
]



def __getattr__(name):
    # The MSL checks on the CPU need the C++ toolchain: loaded when first asked for.
    if name in ("run_msl_on_cpu", "shim_available"):
        from .backends.metal import msl_cpu  # start-up: see above
        return getattr(msl_cpu, name)
    raise AttributeError(f"module 'lazyx.extend' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
