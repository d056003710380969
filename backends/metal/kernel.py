"""``MetalKernel``: a Metal compute kernel written in MSL, and how a node's buffers bind to it.

A primitive (a built-in one or a plugin's) gets a Metal kernel by registering a
:class:`MetalKernel` for ``("metal", PrimitiveClass)`` through the
``lazyx_kernels`` hook. The object is the kernel the dispatch calls,
``kernel(primitive, inputs)``: on a Mac it runs on the GPU
(:mod:`lazyx.backends.metal.runtime`); anywhere with a C++ compiler its MSL
source runs on the CPU through lazyx's shim
(:func:`lazyx.backends.metal.run_msl_on_cpu`), which is how it is tested.

Both paths share :func:`plan_launch`, which decides the kernel function, what
goes into each ``[[buffer(n)]]`` and the grid, so the CPU check exercises the
same binding the GPU gets.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from lazyx import dtypes as ldt
from lazyx.errors import ArgumentError, DtypeError

__all__ = ["MetalKernel", "MSL_TYPES", "plan_launch", "Launch"]

#: MSL scalar type -> NumPy dtype (the constants a kernel may declare).
MSL_TYPES = {
    "bool": np.dtype(np.bool_), "char": np.dtype(np.int8), "uchar": np.dtype(np.uint8),
    "short": np.dtype(np.int16), "ushort": np.dtype(np.uint16),
    "int": np.dtype(np.int32), "uint": np.dtype(np.uint32),
    "long": np.dtype(np.int64), "ulong": np.dtype(np.uint64),
    "int8_t": np.dtype(np.int8), "uint8_t": np.dtype(np.uint8),
    "int16_t": np.dtype(np.int16), "uint16_t": np.dtype(np.uint16),
    "int32_t": np.dtype(np.int32), "uint32_t": np.dtype(np.uint32),
    "int64_t": np.dtype(np.int64), "uint64_t": np.dtype(np.uint64), "size_t": np.dtype(np.uint64),
    "half": np.dtype(np.float16), "bfloat": np.dtype(ml_dtypes.bfloat16),
    "float": np.dtype(np.float32),
}

#: lazyx dtype name -> the MSL type of its elements (``{type}`` in a kernel's name).
#: float64 and complex64 have none: Metal GPUs have no double precision.
_MSL_TYPE_OF = {"bool": "bool", "int8": "char", "uint8": "uchar", "int16": "short",
                "uint16": "ushort", "int32": "int", "uint32": "uint", "int64": "long",
                "uint64": "ulong", "float16": "half", "bfloat16": "bfloat", "float32": "float"}

_SHAPE = np.dtype(np.int32)      # "shape" and "ndim": MSL `int`
_STRIDES = np.dtype(np.int64)    # "<input>_strides": MSL `int64_t`, in elements
_MAX_GRID = 2**32 - 1            # [[thread_position_in_grid]] is a uint
_MAX_BUFFERS = 31                # Metal's buffer argument table


class MetalKernel:
    """A Metal compute kernel in MSL, runnable as a lazyx kernel ``kernel(primitive, inputs)``.

    The grid has one thread per element of the output (C order); a thread finds its
    element with a ``[[thread_position_in_grid]]`` parameter. Each ``[[buffer(n)]]``
    receives the ``n``-th entry of ``buffers``, each a name:

    * an input's name (from ``inputs``) or the output's: its data (``device T*``);
    * a constant's name (from ``constants``): one scalar (``constant T&``), taken from
      the primitive's attribute of that name;
    * ``"shape"``: the output's shape (``constant int*``) and ``"ndim"`` its length
      (``constant int&``);
    * ``"<input>_strides"``: that input's strides in elements (``constant int64_t*``),
      one per output dimension, 0 where the input is broadcast.

    Args:
        source (str): The MSL source (it may ``#include <metal_stdlib>``).
        name (str or callable): The kernel function's name, e.g. ``"axpby_{layout}_{dtype}"``:
          ``{dtype}`` is the output's lazyx dtype name (``float16``), ``{type}`` its MSL
          type (``half``) and ``{layout}`` is ``contiguous`` when every input is
          row-contiguous with the output's shape, else ``general``. A callable gets
          ``(dtype, layout)`` and returns the name.
        inputs (sequence of str): Names of the primitive's inputs, in order.
        output (str): The name of the output. Default: ``"out"``.
        constants (dict, optional): ``{name: MSL type}`` of scalar constants, e.g.
          ``{"alpha": "float"}``.
        buffers (sequence of str, optional): What each buffer index holds. Default: the
          inputs, the output, the constants, ``"shape"``, each input's strides, ``"ndim"``.
        dtypes (sequence of Dtype, optional): The output dtypes the source instantiates;
          another one is a ``DtypeError`` naming these. Default: any.
        out_dtype (callable, optional): ``out_dtype(input_dtypes)`` -> the output's
          lazyx dtype. Default: the first input's.
        filename (str, optional): Where the source came from, for error messages.

    Example:
        >>> k = MetalKernel(SOURCE, "scale_{dtype}", inputs=("x",), constants={"s": "float"})
        >>> run_msl_on_cpu(k, [np.ones(3, np.float32)], (3,), mx.float32, s=2.0)
        array([2., 2., 2.], dtype=float32)
    """

    def __init__(self, source: str, name, *, inputs, output: str = "out", constants=None,
                 buffers=None, dtypes=None, out_dtype=None, filename: str | None = None):
        self._source = source
        self._path = None
        self.name = name
        self.inputs = tuple(inputs)
        self.output = output
        self.constants = {k: _msl_scalar(k, t) for k, t in (constants or {}).items()}
        self.dtypes = None if dtypes is None else tuple(ldt.to_dtype(d) for d in dtypes)
        self.out_dtype = out_dtype
        self.filename = filename
        if buffers is None:
            buffers = (*self.inputs, output, *self.constants, "shape",
                       *(f"{i}_strides" for i in self.inputs), "ndim")
        self.buffers = tuple(buffers)
        self._check_buffers()

    @classmethod
    def from_file(cls, path, name, **options) -> "MetalKernel":
        """A kernel whose MSL source is the file at ``path`` (read when first needed).

        Takes the same options as :class:`MetalKernel`; ``filename`` is ``path``.
        """
        kernel = cls("", name, filename=os.fspath(path), **options)
        kernel._source = None
        kernel._path = Path(path)
        return kernel

    @property
    def source(self) -> str:
        """The MSL source text."""
        if self._source is None:
            self._source = self._path.read_text()
        return self._source

    @property
    def label(self) -> str:
        """How messages name this kernel: its name pattern and where its source is."""
        where = f" ({self.filename})" if self.filename else ""
        return f"Metal kernel {self._name_pattern()!r}{where}"

    def _name_pattern(self) -> str:
        return self.name if isinstance(self.name, str) else getattr(self.name, "__name__", "?")

    def _check_buffers(self) -> None:
        known = {*self.inputs, self.output, *self.constants, "shape", "ndim",
                 *(f"{i}_strides" for i in self.inputs)}
        bad = [b for b in self.buffers if b not in known]
        if bad:
            raise ArgumentError(f"MetalKernel {self._name_pattern()!r}: unknown buffer name(s) "
                                f"{', '.join(map(repr, bad))}; known: {', '.join(sorted(known))}.")
        if len(self.buffers) > _MAX_BUFFERS:
            raise ArgumentError(f"MetalKernel {self._name_pattern()!r} binds {len(self.buffers)} "
                                f"buffers; Metal allows {_MAX_BUFFERS}.")

    def function_name(self, dtype, layout: str) -> str:
        """The kernel function for output dtype ``dtype`` and ``layout`` (``contiguous``/``general``)."""
        dtype = ldt.to_dtype(dtype)
        if self.dtypes is not None and dtype not in self.dtypes:
            raise DtypeError(f"{self.label} has no kernel for dtype {dtype.name}; it supports "
                             f"{', '.join(d.name for d in self.dtypes)}.")
        if not isinstance(self.name, str):
            return self.name(dtype, layout)
        msl = _MSL_TYPE_OF.get(dtype.name)
        if msl is None and "{type}" in self.name:
            raise DtypeError(f"{self.label}: dtype {dtype.name} has no Metal type.")
        return self.name.format(dtype=dtype.name, type=msl, layout=layout)

    def __call__(self, primitive, inputs):
        """Run on the Metal GPU (the Metal backend's dispatch calls this)."""
        from . import runtime
        return runtime.run(self, primitive, inputs)

    def run_on_cpu(self, primitive, inputs) -> np.ndarray:
        """Run the MSL source on the CPU through lazyx's C++ shim, as the dispatch would on
        the GPU: constants from ``primitive``'s attributes, the output shape from its
        ``output_shapes``."""
        from .msl_cpu import launch_on_cpu
        return launch_on_cpu(self, plan_for_primitive(self, primitive, inputs))

    def __repr__(self) -> str:
        return f"<{self.label}>"


def _msl_scalar(name: str, type_name: str) -> np.dtype:
    d = MSL_TYPES.get(type_name)
    if d is None:
        raise ArgumentError(f"MetalKernel constant {name!r}: unknown MSL scalar type "
                            f"{type_name!r}; use one of {', '.join(MSL_TYPES)}.")
    return d


@dataclass
class Launch:
    """One launch of a kernel: the function, each buffer index's contents, the grid."""

    function: str
    #: buffer index -> a NumPy array: an input (possibly a strided view, never negative
    #: strides), the output, or a small array of constants, shapes or strides.
    buffers: list
    output: np.ndarray
    grid: int


def plan_for_primitive(kernel: MetalKernel, primitive, inputs) -> Launch:
    """The launch that runs ``primitive`` on ``inputs`` (NumPy arrays)."""
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
    return plan_launch(kernel, inputs, shape, out_dtype, constants)


def plan_launch(kernel: MetalKernel, inputs, out_shape, out_dtype, constants: dict) -> Launch:
    """Decide the kernel function, the contents of each buffer and the grid.

    Args:
        kernel: The kernel.
        inputs: NumPy arrays, one per name in ``kernel.inputs``; they broadcast to ``out_shape``.
        out_shape: The output's shape.
        out_dtype: The output's dtype (a lazyx or NumPy dtype).
        constants: ``{name: value}`` for every constant the kernel declares.

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
    out = np.empty(out_shape, out_dtype.np)
    if out.size > _MAX_GRID or any(n > np.iinfo(np.int32).max for n in out_shape):
        raise ArgumentError(f"{kernel.label}: an output of shape {out_shape} needs more threads "
                            f"than one Metal grid holds ({_MAX_GRID}).")
    named = {name: a for name, a in zip(kernel.inputs, arrays)}
    named[kernel.output] = out
    for name, d in kernel.constants.items():
        named[name] = np.array([constants[name]]).astype(d)
    named["shape"] = np.array(out_shape, _SHAPE)
    named["ndim"] = np.array([len(out_shape)], _SHAPE)
    for name, a in zip(kernel.inputs, arrays):
        named[f"{name}_strides"] = _broadcast_strides(a, out_shape)
    return Launch(function, [named[b] for b in kernel.buffers], out, out.size)


def _bindable(a: np.ndarray) -> np.ndarray:
    """``a``, or a copy where a kernel could not index it: negative strides or strides
    that are not whole elements."""
    size = a.itemsize
    if any(s < 0 or s % size for s in a.strides):
        return np.ascontiguousarray(a)
    return a


def _broadcast_strides(a: np.ndarray, out_shape: tuple) -> np.ndarray:
    lead = len(out_shape) - a.ndim
    size = a.itemsize
    strides = [0] * lead + [0 if n == 1 else s // size for n, s in zip(a.shape, a.strides)]
    return np.array(strides, _STRIDES)
