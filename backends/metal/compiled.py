"""The ``metal`` backend's generated element-wise kernels: ``Compiled`` nodes (a fused
run of ``compile``) and single element-wise ops.

A program (:class:`lazyx.codegen.ir.Program`) is rendered to MSL
(:mod:`lazyx.codegen.msl`) once per scalar mask: one source with the kernels
``lx_contiguous`` and ``lx_strided``. The planning of a call is the CUDA backend's
(:mod:`lazyx.backends.fused_launch`: loop shape, scalars, contiguous or strided
kernel, the collapsed layout, contiguous copies of layouts the strided kernel
cannot take). What is Metal's own, the :class:`_Metal` target:

* one thread per element in both kernels (the grid is the element count, which a
  Metal grid holds up to 2**32 - 1; ``lx_n`` is a ``uint``), and one strided
  kernel, whose offsets are 64-bit;
* the arguments packed as the renderer's buffer layout says (:func:`pack`):
  the inputs, the outputs, ``lx_n`` (``uint``), then for ``lx_strided`` ``lx_nd``
  (``int``) and ``lx_layout`` (``long``: the collapsed shape, then each input's
  element strides);
* what Metal cannot compute is refused before anything is rendered: float64 (no
  double precision on Metal GPUs) and programs needing more than Metal's 31 buffers (:func:`lazyx.codegen.msl.supports`).
  A refused ``Compiled`` node runs unfused, each op on the node's stream; a refused
  single op runs the kernel a plugin registered for it, and where there is none it
  raises a :class:`~lazyx.errors.DtypeError` naming the op, the dtypes and the
  reason (as MLX refuses float64 on the GPU), never a silent result.

**Runners.** :class:`GpuRunner` launches through :func:`lazyx.backends.metal.runtime.execute`
(the Metal API: written from Apple's documentation, never run). :class:`ShimRunner`
runs the same launches, argument for argument, through the C++ shim
(:func:`lazyx.backends.metal.msl_cpu.launch_on_cpu`) and records them; it is the
runner while the runtime is emulated (:func:`lazyx.backends.metal.emulate_on_cpu`),
which is how ``compile`` on Metal streams is tested on Linux.
"""

from __future__ import annotations

import numpy as np

from lazyx.codegen import msl
from lazyx.errors import ArgumentError, DtypeError, KernelCompileError

from .. import fused_launch
from . import runtime
from .launch import Launch, host_array

__all__ = ["compiled_kernel", "eager_kernel", "kernel_for", "run_program", "pack", "stats",
           "FusedKernel", "GpuRunner", "ShimRunner", "runner"]

#: Counters for tests and diagnostics: sources rendered, launches of each kernel, and
#: single-op calls that did not run a generated kernel.
stats = {"rendered": 0, "contiguous": 0, "strided": 0, "materialised": 0, "fallbacks": 0}

#: Threads in one Metal grid (``[[thread_position_in_grid]]`` and ``lx_n`` are ``uint``).
MAX_GRID = 2**32 - 1


class FusedKernel:
    """The MSL source of one (program, scalar mask): what :func:`runtime.execute` and
    :func:`msl_cpu.launch_on_cpu` need of a kernel (``source``, ``label``, ``filename``,
    the names of its ``buffers``)."""

    __slots__ = ("program", "scalar", "source", "label", "filename", "buffers")

    def __init__(self, program, scalar):
        self.program = program
        self.scalar = scalar
        self.source = msl.render(program, scalar)
        self.label = f"lazyx fused Metal kernel {program.digest}"
        self.filename = None
        self.buffers = (*(f"p{k}" for k in range(len(program.inputs))),
                        *(f"o{j}" for j in range(len(program.outputs))),
                        "lx_n", "lx_nd", "lx_layout")
        stats["rendered"] += 1


_kernels: dict = {}


def kernel_for(program, scalar: tuple) -> FusedKernel:
    """The kernel of ``program`` for the scalar mask ``scalar`` (rendered once, cached)."""
    return fused_launch.cached_kernel(_kernels, FusedKernel, program, scalar)


def pack(kernel: FusedKernel, name: str, grid: int, args) -> Launch:
    """The launch of kernel function ``name``: ``args`` as the shared planning passes them
    (inputs, outputs, the count, and for ``lx_strided`` the dimension count and the
    layout) bound as :mod:`lazyx.codegen.msl` declares the buffers."""
    n_in, n_out = len(kernel.program.inputs), len(kernel.program.outputs)
    n_buf = n_in + n_out
    buffers = list(args[:n_buf])
    buffers.append(np.array([args[n_buf]], np.uint32))           # constant uint& lx_n
    if len(args) > n_buf + 1:                                    # lx_strided
        buffers.append(np.array([args[n_buf + 1]], np.int32))    # constant int& lx_nd
        buffers.append(np.ascontiguousarray(args[n_buf + 2], np.int64))  # constant long* lx_layout
    outputs = tuple(args[n_in:n_buf])
    return Launch(name, buffers, outputs[0], int(grid), outputs)


class GpuRunner:
    """Launches on the Metal GPU (:func:`lazyx.backends.metal.runtime.execute`). Buffers are
    NumPy arrays: Apple silicon's memory is unified; outputs are views of shared MTLBuffers."""

    empty = staticmethod(runtime.empty)

    @staticmethod
    def layout(host):
        return host

    @staticmethod
    def materialise(x, shape):
        return host_array(np.broadcast_to(x, shape))

    @staticmethod
    def launch(kernel, name, grid, args):
        runtime.execute(kernel, pack(kernel, name, grid, args))


class ShimRunner(GpuRunner):
    """Launches through lazyx's C++ shim on the CPU, one thread of the grid at a time.

    Attributes:
        launches (list): ``(kernel function, grid)`` of each launch, for tests.
    """

    empty = staticmethod(np.empty)  # plain NumPy: no Metal device behind the shim

    def __init__(self):
        self.launches = []

    def launch(self, kernel, name, grid, args):
        from . import msl_cpu  # the C++ toolchain: only when MSL runs on the CPU
        planned = pack(kernel, name, grid, args)
        self.launches.append((name, planned.grid))
        try:
            msl_cpu.launch_on_cpu(kernel, planned)
        except msl_cpu.MSLShimError as exc:
            # A generated source that does not build is the renderer's fault, as a Metal
            # compile error would be: the shared code warns once and runs the ops unfused.
            raise KernelCompileError(str(exc)) from exc


_runner = None      # a runner set by tests; else the one runner() picks
_gpu_runner = None
_shim_runner = None


def runner():
    """The runner launches go to: the shim's while the runtime is emulated, else the GPU's."""
    global _gpu_runner, _shim_runner
    if _runner is not None:
        return _runner
    if runtime.emulating():
        if _shim_runner is None:
            _shim_runner = ShimRunner()
        return _shim_runner
    if _gpu_runner is None:
        _gpu_runner = GpuRunner()
    return _gpu_runner


class _Metal(fused_launch.Target):
    """The Metal side of :mod:`lazyx.backends.fused_launch` (see the module docstring)."""

    backend = "metal"
    kernel_kind = "Metal kernel"
    instead = "its operations run unfused instead"
    stats = stats
    plans = property(lambda self: _plans)
    broken = property(lambda self: _broken)

    def runner(self):
        return runner()

    kernel_for = staticmethod(kernel_for)

    def refuse(self, program, size):
        why = msl.supports(program)
        if why is not None:
            return DtypeError(why)
        if size > MAX_GRID:
            return ArgumentError(f"{size} elements need more threads than one Metal grid "
                                 f"holds ({MAX_GRID})")
        return None

    def configure(self, p) -> None:
        p.launch = p.strided_launch = p.size  # one thread per element

    def strided(self, p, dims, strides, runner):
        host = np.asarray(dims + [v for s in strides for v in s], dtype=np.int64)
        return runner.layout(host), np.int32(len(dims)), "lx_strided"

    def no_kernel(self, cls, inputs, reason):
        if not isinstance(reason, (DtypeError, ArgumentError)):  # not one of refuse's
            return super().no_kernel(cls, inputs, reason)
        dtypes = ", ".join(str(x.dtype) for x in inputs)
        cast = (", or cast its inputs to a dtype Metal has (float32, float16, bfloat16, the "
                "integers, bool)") if isinstance(reason, DtypeError) else ""
        return type(reason)(f"{cls.name} cannot run on the Metal GPU with inputs of dtypes "
                            f"{dtypes}: {reason}. Run it on the CPU (stream=mx.cpu){cast}.")


_METAL = _Metal()
_plans: dict = {}
_broken: set = set()


def run_program(program, inputs, runner):
    """Run ``program`` on NumPy ``inputs`` with ``runner``; the output array, or a tuple of
    them. None when it cannot run here (the inputs' dtypes are not the program's, or
    Metal refuses it: see the module docstring)."""
    return fused_launch.run_program(_METAL, program, inputs, runner)


def compiled_kernel(prim, inputs):
    """The ``metal`` kernel of ``Compiled``: the node's program as one generated MSL kernel,
    or, where Metal refuses it, its operations unfused on the node's stream."""
    return fused_launch.compiled_kernel(_METAL, prim, _host(inputs))


def eager_kernel(cls, fallback):
    """The ``metal`` kernel of element-wise primitive class ``cls``: a generated MSL kernel
    of the primitive's own expression, ``fallback`` (a plugin's kernel, or None) where
    it has none for the call's dtypes, else an error naming the op and the dtypes."""
    return fused_launch.eager_kernel(_METAL, cls, fallback)


def _host(inputs):
    """The inputs as NumPy arrays (a Python or NumPy scalar becomes a 0-d array)."""
    for x in inputs:
        if type(x) is not np.ndarray:
            return [np.asarray(x) for x in inputs]
    return inputs
