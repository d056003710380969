"""Launch planning for Metal kernels: what each ``[[buffer(n)]]`` holds and the grid.

The lowest module of the Metal backend. :mod:`.kernel` (``MetalKernel``), the GPU
runtime (:mod:`.runtime`) and the CPU check (:mod:`.msl_cpu`) all import it, so a
kernel binds its buffers the same way whether it runs on a GPU or through the shim.
It needs NumPy and lazyx's dtypes only; bfloat16's NumPy dtype (ml_dtypes) is asked
for when a kernel uses it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lazyx import dtypes as ldt
from lazyx.errors import ArgumentError

__all__ = ["MSL_TYPES", "MSL_TYPE_OF", "Launch", "plan_for_primitive", "plan_launch",
           "msl_scalar", "MAX_BUFFERS"]

#: MSL scalar type -> lazyx dtype (the constants a kernel may declare).
MSL_TYPES = {
    "bool": ldt.bool_, "char": ldt.int8, "uchar": ldt.uint8, "short": ldt.int16,
    "ushort": ldt.uint16, "int": ldt.int32, "uint": ldt.uint32, "long": ldt.int64,
    "ulong": ldt.uint64, "int8_t": ldt.int8, "uint8_t": ldt.uint8, "int16_t": ldt.int16,
    "uint16_t": ldt.uint16, "int32_t": ldt.int32, "uint32_t": ldt.uint32,
    "int64_t": ldt.int64, "uint64_t": ldt.uint64, "size_t": ldt.uint64,
    "half": ldt.float16, "bfloat": ldt.bfloat16, "float": ldt.float32,
}

#: lazyx dtype name -> the MSL type of its elements (``{type}`` in a kernel's name).
#: float64 has none (Metal GPUs have no double precision); complex64 has no MSL type (the
#: generated kernels use lazyx's own ``c64``: lazyx.codegen.msl), so a MetalKernel takes none.
MSL_TYPE_OF = {"bool": "bool", "int8": "char", "uint8": "uchar", "int16": "short",
                "uint16": "ushort", "int32": "int", "uint32": "uint", "int64": "long",
                "uint64": "ulong", "float16": "half", "bfloat16": "bfloat", "float32": "float"}

_SHAPE = np.dtype(np.int32)      # "shape" and "ndim": MSL `int`
_STRIDES = np.dtype(np.int64)    # "<input>_strides": MSL `int64_t`, in elements
_MAX_GRID = 2**32 - 1            # [[thread_position_in_grid]] is a uint
MAX_BUFFERS = 31                # Metal's buffer argument table


def msl_scalar(name: str, type_name: str) -> "ldt.Dtype":
    """The lazyx dtype of a kernel constant declared with MSL scalar type ``type_name``."""
    d = MSL_TYPES.get(type_name)
    if d is None:
        raise ArgumentError(f"MetalKernel constant {name!r}: unknown MSL scalar type "
                            f"{type_name!r}; use one of {', '.join(MSL_TYPES)}.")
    return d


@dataclass
class Launch:
    """One launch of a kernel: the function, each buffer index's contents, the grid."""

    function: str
    #: buffer index -> a NumPy array: an input (possibly a strided view; negative
    #: strides only in launches of generated kernels, whose layouts carry them), the
    #: output, or a small array of constants, shapes or strides.
    buffers: list
    output: np.ndarray
    grid: int
    #: Every buffer the kernel writes, when there are several (a fused kernel's
    #: outputs); empty means ``(output,)``.
    outputs: tuple = ()

    def written(self) -> tuple:
        """The buffers the kernel writes (copied back from the GPU after it ran)."""
        return self.outputs or (self.output,)


def plan_for_primitive(kernel, primitive, inputs, empty=np.empty) -> Launch:
    """The launch that runs ``primitive`` on ``inputs`` (NumPy arrays); its output
    allocated by ``empty(shape, dtype)`` (the runtime's shared buffers on a GPU)."""
    if kernel.out_dtype is not None:
        out_dtype = ldt.to_dtype(kernel.out_dtype(tuple(ldt.from_numpy(a.dtype) for a in inputs)))
    else:
        out_dtype = ldt.from_numpy(inputs[0].dtype)
    shape = tuple(primitive.output_shapes(inputs)[0])
    constants = {}
    for name in kernel.constants:
        if not hasattr(primitive, name):
            raise ArgumentError(f"{kernel.label} needs constant {name!r}, which primitive "
                                f"{primitive.name} does not have.")
        constants[name] = getattr(primitive, name)
    return plan_launch(kernel, inputs, shape, out_dtype, constants, empty)


def plan_launch(kernel, inputs, out_shape, out_dtype, constants: dict, empty=np.empty) -> Launch:
    """Decide the kernel function, the contents of each buffer and the grid.

    Args:
        kernel: The kernel.
        inputs: NumPy arrays, one per name in ``kernel.inputs``; they broadcast to ``out_shape``.
        out_shape: The output's shape.
        out_dtype: The output's dtype (a lazyx or NumPy dtype).
        constants: ``{name: value}`` for every constant the kernel declares.
        empty: allocates the output, ``empty(shape, dtype)``: NumPy's, or the runtime's
          shared ``MTLBuffer`` memory (which the GPU writes in place: nothing copied back).

    Returns:
        Launch: what to bind and how many threads to run.
    """
    if len(inputs) != len(kernel.inputs):
        raise ArgumentError(f"{kernel.label} takes {len(kernel.inputs)} inputs "
                            f"({', '.join(kernel.inputs)}), got {len(inputs)}.")
    missing = [c for c in kernel.constants if c not in constants]
    extra = [c for c in constants if c not in kernel.constants]
    if missing or extra:
        raise ArgumentError(f"{kernel.label}: "
                            + "; ".join(([f"missing constant(s) {', '.join(missing)}"] if missing else [])
                                        + ([f"unknown constant(s) {', '.join(extra)}"] if extra else []))
                            + f" (it declares {', '.join(kernel.constants) or 'none'}).")
    out_dtype = ldt.to_dtype(out_dtype)
    out_shape = tuple(int(n) for n in out_shape)
    arrays = [_bindable(np.asarray(a)) for a in inputs]
    for name, a in zip(kernel.inputs, arrays):
        try:
            if np.broadcast_shapes(a.shape, out_shape) != out_shape:
                raise ValueError
        except ValueError:
            raise ArgumentError(f"{kernel.label}: input {name!r} of shape {a.shape} does not "
                                f"broadcast to the output's shape {out_shape}.") from None
    layout = "contiguous" if all(a.shape == out_shape and a.flags.c_contiguous
                                 for a in arrays) else "general"
    function = kernel.function_name(out_dtype, layout)
    size = int(np.prod(out_shape, dtype=np.int64))
    if size > _MAX_GRID or any(n > np.iinfo(np.int32).max for n in out_shape):
        raise ArgumentError(f"{kernel.label}: an output of shape {out_shape} needs more threads "
                            f"than one Metal grid holds ({_MAX_GRID}).")
    out = empty(out_shape, out_dtype.np)
    named = {name: a for name, a in zip(kernel.inputs, arrays)}
    named[kernel.output] = out
    for name, d in kernel.constants.items():
        named[name] = np.array([constants[name]]).astype(d.np)
    named["shape"] = np.array(out_shape, _SHAPE)
    named["ndim"] = np.array([len(out_shape)], _SHAPE)
    for name, a in zip(kernel.inputs, arrays):
        named[f"{name}_strides"] = _broadcast_strides(a, out_shape)
    return Launch(function, [named[b] for b in kernel.buffers], out, out.size)


#: ``settle(a)``: waits for the GPU work queued in the evaluation's command buffer that
#: writes ``a``'s memory (:func:`lazyx.backends.metal.runtime.settle`), set by the runtime
#: once it queues work on a GPU; None where nothing is queued (the shim runs at once).
settle = None


def host_array(a, dtype=None) -> np.ndarray:
    """``a`` as a C-contiguous NumPy array (of ``dtype``), copied or converted on the host
    where needed: after the queued GPU work that writes ``a`` (a launcher's own copies and
    conversions of its inputs read their bytes now, not when the GPU runs)."""
    if settle is not None:
        settle(a)
    return np.ascontiguousarray(a, dtype)


def _bindable(a: np.ndarray) -> np.ndarray:
    """``a``, or a copy where a kernel could not index it: negative strides or strides
    that are not whole elements."""
    size = a.itemsize
    if any(s < 0 or s % size for s in a.strides):
        return host_array(a)
    return a


def _broadcast_strides(a: np.ndarray, out_shape: tuple) -> np.ndarray:
    lead = len(out_shape) - a.ndim
    size = a.itemsize
    strides = [0] * lead + [0 if n == 1 else s // size for n, s in zip(a.shape, a.strides)]
    return np.array(strides, _STRIDES)
