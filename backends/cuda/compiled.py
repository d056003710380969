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

from .. import fused_launch
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


# -- single ops --------------------------------------------------------------------------


def eager_kernel(cls, fallback):
    """The ``cuda`` kernel of element-wise primitive class ``cls``: a generated kernel of
    the primitive's own expression, and ``fallback`` (a kernel) where it has none for
    the call's dtypes."""
    return fused_launch.eager_kernel(_CUDA, cls, fallback)
