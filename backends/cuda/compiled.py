"""The ``cuda`` backend's generated element-wise kernels: ``Compiled`` nodes (a fused
run of ``compile``) and single element-wise ops.

A program (:class:`lazyx.codegen.ir.Program`) is rendered to CUDA C++
(:mod:`lazyx.codegen.cuda`) once per scalar mask and compiled by NVRTC through
:class:`~lazyx.backends.cuda.CudaKernel` (CuPy caches the binary on disk). The
planning of a call (loop shape, scalars, contiguous or strided kernel, the
collapsed layouts, contiguous copies of layouts the strided kernels cannot take)
is shared with the Metal backend: :mod:`lazyx.backends.fused_launch`. What is
CUDA's own, the :class:`_Cuda` target:

* ``lx_contiguous`` reads 16-byte packs per thread where the pointers allow, so
  its grid has one thread per pack; the strided kernels one per element (the
  kernels' grid-stride loops take the rest past :func:`launch_config`'s cap);
* the strided layout is kept on the device per input strides, and runs
  ``lx_strided`` (32-bit index arithmetic) when the count and every input's
  furthest offset fit, else ``lx_strided_wide``.

**Single ops.** For a primitive class that declares ``to_expression`` (and
has no ``eval_gpu`` of its own), the backend's kernel is :func:`eager_kernel`:
the primitive's expression for the call's parameters and input dtypes is a
one-node program, run as above; the program and its compiled kernel are
cached per (parameters, dtypes), so a call costs a few dictionary lookups, an
allocation and a launch. Where the primitive is not expressible for the
dtypes, the backend's other kernel (CuPy) runs. ``LAZYX_CUDA_ELEMENTWISE=0``
switches single ops back to the CuPy kernels.

The planning never imports CuPy: what touches the device is a *runner*
(:class:`_CupyRunner`; :mod:`lazyx.backends.cuda.cuda_cpu` has one that runs
the same kernels as host C++, which is how the tests check this module on
machines without a GPU).
"""

from __future__ import annotations

import numpy as np

from lazyx.codegen import cuda
from lazyx.environment import read_variable
from lazyx.errors import KernelCompileError

from .. import fused_launch
from ..cpu.compiled import cached_layout, runs_contiguous
from .runtime import CudaKernel, cupy_module, launch_config, native_module

__all__ = ["compiled_kernel", "eager_kernel", "kernel_for", "native_kernel", "run_program",
           "stats", "ELEMENTWISE"]

#: Whether single element-wise ops run generated kernels (``LAZYX_CUDA_ELEMENTWISE=0``: no).
ELEMENTWISE = read_variable("LAZYX_CUDA_ELEMENTWISE") != "0"  # (checked: 0 or 1)

#: Counters for tests and diagnostics: kernels compiled, launches of each kernel, and
#: single-op calls that ran the CuPy kernel instead.
#: ``native``: launches from the native launcher (counted in ``contiguous`` too); ``donated``:
#: outputs it wrote into a donated input.
stats = {"compiled": 0, "contiguous": 0, "strided": 0, "materialised": 0, "fallbacks": 0,
         "native": 0, "donated": 0}

_INT32 = 1 << 31


class FusedKernel:
    """The CUDA source of one (program, scalar mask) and its compiled functions."""

    __slots__ = ("program", "scalar", "source", "width", "_module")

    def __init__(self, program, scalar):
        self.program = program
        self.scalar = scalar
        self.source = cuda.render(program, scalar)
        self.width = cuda.vector_width(program, scalar)
        self._module = None

    def function(self, name: str):
        """The launchable kernel ``name`` (NVRTC compiles the source on first use; the
        module keeps its functions)."""
        if self._module is None:
            self._module = CudaKernel(self.source, f"lazyx fused kernel {self.program.digest}",
                                      options=cuda.OPTIONS)
            stats["compiled"] += 1
        return self._module.function(name)


_kernels: dict = {}


def kernel_for(program, scalar: tuple) -> FusedKernel:
    """The kernel of ``program`` for the scalar mask ``scalar`` (rendered once, cached)."""
    return fused_launch.cached_kernel(_kernels, FusedKernel, program, scalar)


class _Cuda(fused_launch.Target):
    """The CUDA side of :mod:`lazyx.backends.fused_launch` (its caches are this module's
    globals, read per call)."""

    backend = "cuda"
    kernel_kind = "CUDA kernel"
    instead = "its operations run CuPy's kernels instead"
    stats = stats
    plans = property(lambda self: _plans)
    broken = property(lambda self: _broken)

    def runner(self):
        return _runner or _gpu()

    kernel_for = staticmethod(kernel_for)

    def configure(self, p) -> None:
        # One pack (contiguous) or one element (strided) per thread; the kernels' grid-stride
        # loops take the rest past launch_config's cap. (Measured on an H200: a grid capped
        # at a few blocks per multiprocessor is ~7% slower for a GELU on 64M float32.)
        p.launch = launch_config(-(-p.size // p.kernel.width))
        p.strided_launch = launch_config(p.size)

    def launch_plan(self, p, inputs):
        # The native launcher's plan (fused_launch.Target.launch_plan): lx_contiguous, or a
        # strided kernel on the layout of C-contiguous inputs broadcast to the output.
        if p.unrunnable or not p.size or runner_is_fake():
            return None
        strided = None
        if runs_contiguous(p.contiguous, inputs):
            name = "lx_contiguous"
        else:  # the launcher's key holds the strides: the layout is the key's
            layout = cached_layout(p, inputs, lambda dims, strides: self.strided(
                p, dims, strides, _gpu()))
            if layout is None:
                return None  # the Python kernel's contiguous copies
            dev, nd, name = layout
            strided = (int(nd), dev)
        try:
            fn = p.kernel.function(name)
        except KernelCompileError:
            return None  # the Python kernel warns and runs the fallback
        fn = getattr(fn, "kernel", fn)  # a RawKernel's loaded function (cupy.cuda.Function)
        scalar = sum(1 << k for k, s in enumerate(p.scalar) if s)
        full = sum(1 << k for k, x in enumerate(inputs)
                   if x.shape == p.shape and x.flags.c_contiguous)
        config = p.launch if strided is None else p.strided_launch
        return (int(fn.ptr), config[0][0], config[1][0], p.size, scalar, full, p.shape,
                tuple(p.dtypes), strided)

    def strided(self, p, dims, strides, runner):
        # 32-bit index arithmetic when the count and every input's furthest offset fit.
        wide = p.size >= _INT32 or any(
            sum(abs(s) * (n - 1) for s, n in zip(st, dims)) >= _INT32 for st in strides)
        host = np.asarray(dims + [v for s in strides for v in s], dtype=np.int64)
        return runner.layout(host), np.int32(len(dims)), \
            "lx_strided_wide" if wide else "lx_strided"


_CUDA = _Cuda()
_plans: dict = {}


def run_program(program, inputs, runner):
    """Run ``program`` on device arrays ``inputs`` with ``runner``; the output array, or a
    tuple of them. Returns None when the inputs' dtypes are not the program's."""
    return fused_launch.run_program(_CUDA, program, inputs, runner)


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


def compiled_kernel(prim, inputs):
    """Run a ``Compiled`` node's program as one generated kernel (see the module docstring)."""
    return fused_launch.compiled_kernel(_CUDA, prim, inputs)


def runner_is_fake() -> bool:
    """Whether a test replaced the GPU runner (``cuda_cpu``): then nothing launches natively."""
    return _runner is not None and type(_runner) is not _CupyRunner


# -- the native launcher ------------------------------------------------------------------
def native_kernel(kernel, raw, upload):
    """``kernel`` (the backend's prepared kernel of ``raw``) with its common case launched
    from C++ where ``raw`` is a generated element-wise kernel or :func:`compiled_kernel`:
    a ``_native.Launcher`` in front of ``kernel`` (see ``backends/cuda/native/launch.cpp``);
    else ``kernel`` itself. ``upload(host array)``: its device copy (the backend's cache)."""
    if raw is compiled_kernel:
        def planner(prim, inputs):
            return fused_launch.compiled_launch_plan(_CUDA, prim, inputs)
        key = "program"
    elif getattr(raw, "generated", False) and getattr(raw, "launch_plan", None) is not None:
        planner, key = raw.launch_plan, None
    else:
        return kernel
    mod = native_module()
    if mod is None:
        return kernel
    launcher = mod.Launcher(kernel, planner, key, stats, upload)
    launcher.donates = True         # the scheduler passes the inputs it may write into
    launcher.device_outputs = True  # it returns CuPy arrays of the promised shape and dtype
    launcher.__wrapped__ = raw
    launcher.__name__ = getattr(raw, "__name__", "kernel")
    return launcher


# -- single ops --------------------------------------------------------------------------


def eager_kernel(cls, fallback):
    """The ``cuda`` kernel of element-wise primitive class ``cls``: a generated kernel of
    the primitive's own expression, and ``fallback`` (a kernel) where it has none for
    the call's dtypes."""
    return fused_launch.eager_kernel(_CUDA, cls, fallback)
