"""``MetalKernel``: a Metal compute kernel written in MSL, and how a node's buffers bind to it.

A primitive (a built-in one or a plugin's) gets a Metal kernel by registering a
:class:`MetalKernel` for ``("metal", PrimitiveClass)`` through the
``lazyx_kernels`` hook. The object is the kernel the dispatch calls,
``kernel(primitive, inputs)``: on a Mac it runs on the GPU
(:mod:`lazyx.backends.metal.runtime`); anywhere with a C++ compiler its MSL
source runs on the CPU through lazyx's shim
(:func:`lazyx.backends.metal.run_msl_on_cpu`), which is how it is tested.

Both paths share :mod:`.launch` (:func:`~.launch.plan_launch` decides the kernel
function, what goes into each ``[[buffer(n)]]`` and the grid), so the CPU check
exercises the same binding the GPU gets.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from lazyx import dtypes as ldt
from lazyx.errors import ArgumentError, DtypeError

from . import runtime
from .launch import MAX_BUFFERS, MSL_TYPE_OF, Launch, msl_scalar, plan_for_primitive, plan_launch

__all__ = ["MetalKernel", "plan_launch", "plan_for_primitive", "Launch"]


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
        self.constants = {k: msl_scalar(k, t) for k, t in (constants or {}).items()}
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
        if len(self.buffers) > MAX_BUFFERS:
            raise ArgumentError(f"MetalKernel {self._name_pattern()!r} binds {len(self.buffers)} "
                                f"buffers; Metal allows {MAX_BUFFERS}.")

    def function_name(self, dtype, layout: str) -> str:
        """The kernel function for output dtype ``dtype`` and ``layout`` (``contiguous``/``general``)."""
        dtype = ldt.to_dtype(dtype)
        if self.dtypes is not None and dtype not in self.dtypes:
            raise DtypeError(f"{self.label} has no kernel for dtype {dtype.name}; it supports "
                             f"{', '.join(d.name for d in self.dtypes)}.")
        if not isinstance(self.name, str):
            return self.name(dtype, layout)
        msl = MSL_TYPE_OF.get(dtype.name)
        if msl is None and "{type}" in self.name:
            raise DtypeError(f"{self.label}: dtype {dtype.name} has no Metal type.")
        return self.name.format(dtype=dtype.name, type=msl, layout=layout)

    def __call__(self, primitive, inputs):
        """Run on the Metal GPU (the Metal backend's dispatch calls this)."""
        return runtime.run(self, primitive, inputs)

    def run_on_cpu(self, primitive, inputs) -> np.ndarray:
        """Run the MSL source on the CPU through lazyx's C++ shim, as the dispatch would on
        the GPU: constants from ``primitive``'s attributes, the output shape from its
        ``output_shapes``."""
        from . import msl_cpu  # the C++ toolchain: only when MSL runs on the CPU
        return msl_cpu.launch_on_cpu(self, plan_for_primitive(self, primitive, inputs))

    def __repr__(self) -> str:
        return f"<{self.label}>"
