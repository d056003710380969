"""The ``cuda`` backend's generated element-wise kernels: ``Compiled`` nodes (a fused
run of ``compile``) and single element-wise ops.

A program (:class:`lazyx.codegen.ir.Program`) is rendered to CUDA C++
(:mod:`lazyx.codegen.cuda`) once per scalar mask and compiled by NVRTC through
:class:`~lazyx.backends.cuda.CudaKernel` (CuPy caches the binary on disk). Per
call, as on the CPU (:mod:`lazyx.backends.cpu.compiled`, whose layout logic
this shares):

* the loop shape is the broadcast of the input shapes; inputs of one element
  are *scalars* (read once per thread);
* when every other input has the loop's shape and C strides, ``lx_contiguous``
  runs (16-byte packs per thread where the pointers allow); otherwise
  ``lx_strided`` (32-bit index arithmetic) or ``lx_strided_wide`` runs on the
  layout with size-1 dimensions dropped and contiguous dimensions merged, kept
  on the device per input strides. A layout the strided kernels cannot take
  (strides that are not whole elements, more than 16 dimensions after
  merging) runs the contiguous kernel on contiguous copies of the inputs.

**Single ops.** For a primitive class that declares ``to_expression`` (and
has no ``eval_gpu`` of its own), the backend's kernel is :func:`eager_kernel`:
the primitive's expression for the call's parameters and input dtypes is a
one-node program, run as above; the program and its compiled kernel are
cached per (parameters, dtypes), so a call costs a few dictionary lookups, an
allocation and a launch. Where the primitive is not expressible for the
dtypes, the backend's other kernel (CuPy) runs. ``LAZYX_CUDA_ELEMENTWISE=0``
switches single ops back to the CuPy kernels.

The planning here never imports CuPy: what touches the device is a *runner*
(:class:`_CupyRunner`; :mod:`lazyx.backends.cuda.cuda_cpu` has one that runs
the same kernels as host C++, which is how the tests check this module on
machines without a GPU).
"""

from __future__ import annotations

import math

import numpy as np

from lazyx import dtypes as _dt
from lazyx.arguments import broadcast_shapes
from lazyx.backends.cpu.compiled import (cached_layout, cached_program, compile_failed,
                                         contiguous_layout, runs_contiguous)
from lazyx.codegen import cuda, ir
from lazyx.environment import read_variable
from lazyx.errors import KernelCompileError, KernelNotFoundError
from lazyx.transforms.fusion import _expression, interpret

from .runtime import CudaKernel, cupy_module, launch_config

__all__ = ["compiled_kernel", "eager_kernel", "kernel_for", "run_program", "stats",
           "ELEMENTWISE"]

#: Whether single element-wise ops run generated kernels (``LAZYX_CUDA_ELEMENTWISE=0``: no).
ELEMENTWISE = read_variable("LAZYX_CUDA_ELEMENTWISE") != "0"  # (checked: 0 or 1)

#: Counters for tests and diagnostics: kernels compiled, launches of each kernel, and
#: single-op calls that ran the CuPy kernel instead.
stats = {"compiled": 0, "contiguous": 0, "strided": 0, "materialised": 0, "fallbacks": 0}

_INT32 = 1 << 31


class FusedKernel:
    """The CUDA source of one (program, scalar mask) and its compiled functions."""

    __slots__ = ("program", "scalar", "source", "width", "_module", "_functions")

    def __init__(self, program, scalar):
        self.program = program
        self.scalar = scalar
        self.source = cuda.render(program, scalar)
        self.width = cuda.vector_width(program, scalar)
        self._module = None
        self._functions = {}

    def function(self, name: str):
        """The launchable kernel ``name`` (NVRTC compiles the source on first use)."""
        fn = self._functions.get(name)
        if fn is None:
            if self._module is None:
                self._module = CudaKernel(self.source, f"lazyx fused kernel {self.program.digest}",
                                          options=cuda.OPTIONS)
                stats["compiled"] += 1
            fn = self._functions[name] = self._module.function(name)
        return fn


_kernels: dict = {}


def kernel_for(program, scalar: tuple) -> FusedKernel:
    """The kernel of ``program`` for the scalar mask ``scalar`` (rendered once, cached)."""
    key = (program, scalar)
    k = _kernels.get(key)
    if k is None:
        if len(_kernels) > 8192:
            _kernels.clear()
        k = _kernels[key] = FusedKernel(program, scalar)
    return k


class _Plan:
    """What a call at one set of input shapes needs."""

    __slots__ = ("program", "shape", "size", "dtypes", "scalar", "kernel", "contiguous",
                 "launch", "strided_launch", "layouts", "unrunnable", "checked")


def _plan(program, inputs) -> _Plan:
    p = _Plan()
    p.program = program
    p.checked = False
    p.unrunnable = len(inputs) != len(program.inputs) or \
        any(x.dtype != d.np for x, d in zip(inputs, program.inputs))
    if p.unrunnable:
        return p
    shapes = [x.shape for x in inputs]
    p.shape = tuple(broadcast_shapes(*shapes)) if shapes else ()
    p.size = math.prod(p.shape)
    p.dtypes = [o.dtype.np for o in program.outputs]
    p.scalar = tuple(x.size == 1 for x in inputs)
    p.contiguous = contiguous_layout(p.shape, inputs, p.scalar)
    p.kernel = kernel_for(program, p.scalar)
    # One pack (contiguous) or one element (strided) per thread; the kernels' grid-stride
    # loops take the rest past launch_config's cap. (Measured on an H200: a grid capped
    # at a few blocks per multiprocessor is ~7% slower for a GELU on 64M float32.)
    p.launch = launch_config(-(-p.size // p.kernel.width))
    p.strided_launch = launch_config(p.size)
    p.layouts = {}
    return p


_plans: dict = {}


def _plan_for(program, inputs) -> _Plan:
    # Plans are found by the program's identity (cheap) and checked against it.
    key = (id(program), tuple([x.shape for x in inputs]))
    p = _plans.get(key)
    if p is None or p.program is not program:
        if len(_plans) > 4096:
            _plans.clear()
        p = _plans[key] = _plan(program, inputs)
    return p


def _layout(p: _Plan, inputs, runner):
    """``(device layout, nd, wide)`` for the strided kernels, or None when they cannot run
    this layout."""
    def make(dims, strides):
        # 32-bit index arithmetic when the count and every input's furthest offset fit.
        wide = p.size >= _INT32 or any(
            sum(abs(s) * (n - 1) for s, n in zip(st, dims)) >= _INT32 for st in strides)
        host = np.asarray(dims + [v for s in strides for v in s], dtype=np.int64)
        return runner.layout(host), np.int32(len(dims)), wide
    return cached_layout(p, inputs, make)


def run_program(program, inputs, runner):
    """Run ``program`` on device arrays ``inputs`` with ``runner``; the output array, or a
    tuple of them. Returns None when the inputs' dtypes are not the program's."""
    p = _plan_for(program, inputs)
    if p.unrunnable:
        return None
    empty = runner.empty
    outs = [empty(p.shape, d) for d in p.dtypes]
    n = p.size
    if n:
        if runs_contiguous(p.contiguous, inputs):
            stats["contiguous"] += 1
            runner.launch(p.kernel, "lx_contiguous", p.launch, (*inputs, *outs, np.int64(n)))
        else:
            layout = _layout(p, inputs, runner)
            if layout is None:
                # Contiguous copies at the loop's shape: the contiguous kernel runs them.
                stats["materialised"] += 1
                ins = [x if p.scalar[k] else runner.materialise(x, p.shape)
                       for k, x in enumerate(inputs)]
                runner.launch(p.kernel, "lx_contiguous", p.launch, (*ins, *outs, np.int64(n)))
            else:
                stats["strided"] += 1
                dev, nd, wide = layout
                runner.launch(p.kernel, "lx_strided_wide" if wide else "lx_strided",
                              p.strided_launch, (*inputs, *outs, np.int64(n), nd, dev))
    return outs[0] if len(outs) == 1 else tuple(outs)


class _CupyRunner:
    """Device arrays and launches through CuPy."""

    def __init__(self):
        cp = cupy_module()
        self.cp = cp
        self.empty = cp.empty

    def layout(self, host):
        return self.cp.asarray(host)

    def materialise(self, x, shape):
        cp = self.cp
        return cp.ascontiguousarray(cp.broadcast_to(x, shape))

    @staticmethod
    def launch(kernel: FusedKernel, name: str, config, args):
        kernel.function(name)(config[0], config[1], args)


_runner = None


def _gpu():
    global _runner
    if _runner is None:
        _runner = _CupyRunner()
    return _runner


_broken: set = set()


def _compile_failed(program, exc) -> None:
    compile_failed(_broken, program, exc, "CUDA kernel",
                   "its operations run CuPy's kernels instead")


def compiled_kernel(prim, inputs):
    """Run a ``Compiled`` node's program as one generated kernel (see the module docstring)."""
    program = prim.program
    if program not in _broken:
        try:
            out = run_program(program, inputs, _runner or _gpu())
        except KernelCompileError as exc:
            _compile_failed(program, exc)
            out = None
        if out is not None:
            return out
    return interpret(program, list(inputs), prim.stream)


# -- single ops --------------------------------------------------------------------------


def eager_kernel(cls, fallback):
    """The ``cuda`` kernel of element-wise primitive class ``cls``: a generated kernel of
    the primitive's own expression, and ``fallback`` (a kernel) where it has none for
    the call's dtypes."""
    programs: dict = {}
    with_params = bool(cls._param_names)
    from_numpy = _dt.from_numpy

    def program_of(prim, inputs):
        try:
            args = [ir.input(k, from_numpy(x.dtype)) for k, x in enumerate(inputs)]
        except Exception:
            return None
        es = _expression(prim, args)
        if es is None:
            return None
        program = ir.Program([a.dtype for a in args], es)
        return program

    def kernel(prim, inputs):
        entry = cached_program(programs, prim, inputs, with_params, program_of)
        if entry is not None and entry not in _broken:
            p = _plan_for(entry, inputs)
            if not p.checked:  # first call at these shapes: the primitive's own shape rule
                p.checked = True
                if not p.unrunnable:
                    try:
                        p.unrunnable = tuple(prim.output_shapes(inputs)[0]) != p.shape
                    except Exception:
                        p.unrunnable = True
            if not p.unrunnable:
                try:
                    return run_program(entry, inputs, _runner or _gpu())
                except KernelCompileError as exc:
                    _compile_failed(entry, exc)
        stats["fallbacks"] += 1
        if fallback is None:
            raise KernelNotFoundError(
                f"{cls.name} has no kernel on backend 'cuda' for inputs of dtypes "
                f"{', '.join(str(x.dtype) for x in inputs)}.")
        return fallback(prim, inputs)

    kernel.generated = True
    kernel.fallback = fallback
    kernel.__name__ = f"cuda_elementwise_{cls.name}"
    return kernel
