"""The Metal backend (Apple GPUs), and Metal kernels for primitives.

A primitive gets a Metal kernel from MSL source with :class:`MetalKernel`,
registered for ``("metal", PrimitiveClass)`` through the ``lazyx_kernels`` hook.
The backend is available only on macOS with Apple silicon and PyObjC's Metal
bindings (``pip install pyobjc-framework-Metal``); elsewhere it says why. Its
kernels are checked anywhere with a C++ compiler by running their MSL through
lazyx's C++ shim: :func:`run_msl_on_cpu`.

Where a node's kernel comes from (:meth:`MetalBackend.find_kernel`, once per
primitive class), first match wins:

1. a kernel a plugin registered for ``("metal", cls)`` (``lazyx_kernels``);
2. a **built-in MSL kernel** (:data:`.kernels.KERNELS`, one module per kind: reductions,
   arg-reductions, matrix products (matmul, addmm, gather_mm, block-masked and segmented
   products, Hadamard transforms), softmax, log-sum-exp, scans, random bits, sorts,
   partitions, top-k and searchsorted, gathers, scatters, the shape copies, the creation
   ops, FFTs, the ``fast`` pack (norms and their backwards, RoPE, attention and its
   backward, cross-entropy), convolutions, and quantization (quantize, dequantize, the
   quantized products, every mode)), its dispatches run by :func:`.runtime.dispatch`;
3. a **generated kernel** (:mod:`.compiled`): ``compile``'s fused ``Compiled`` nodes
   and every element-wise primitive that declares ``to_expression`` run MSL rendered
   from compile's IR (:mod:`lazyx.codegen.msl`), so ``compile`` fuses on Metal
   streams as it does on CUDA;
4. the primitive's own ``eval_gpu``;
5. a **view** (:data:`.kernels.shapes.VIEWS`: transpose, slices, broadcasts, ...): the
   CPU's kernel, which returns a NumPy view of the shared buffer; nothing is computed,
   copied or waited for (listed as :data:`VIEW`, counted in ``stats["views"]``);
6. an **explicit CPU fallback**: the active CPU backend's kernel, run on the same
   NumPy buffers (Apple silicon's memory is unified, so nothing is copied). It is
   listed as ``CPU fallback`` by ``lazyx kernels`` and ``lazyx info``, counted in
   :data:`stats` (``cpu_fallback``, and per primitive), and refused with a
   :class:`~lazyx.errors.KernelNotFoundError` naming the primitive when
   ``LAZYX_METAL_STRICT=1``. A built-in kernel asked for a dtype it has no version
   for (``sum`` of int64) falls back the same way.

Every primitive that MLX runs on its GPU has a Metal kernel here. What falls back is what
MLX runs on the CPU only: linear algebra (``mx.linalg``: factorizations, solves,
inverses, and the matrix square root of ``random.multivariate_normal``), where MLX
raises on a GPU stream and lazyx runs the CPU's kernel on the same memory
(docs/mlx-differences.md). So on Apple silicon the backend is the ``gpu`` backend by
default, as MLX's is; ``LAZYX_METAL=0`` turns it off.

float64 has no kernel on Metal (MSL has no double): an op with float64 inputs raises a
:class:`~lazyx.errors.DtypeError` naming it, generated, built-in or fallback alike, as
MLX refuses float64 on the GPU.

:func:`emulate_on_cpu` puts the C++ shim in the GPU's place: the backend is then
available on any machine with a C++ compiler and runs every Metal kernel (generated,
built-in and plugins') through the shim, with the same planning, dispatch sizes and
argument packing as on a Mac. The tests use it; the Metal API calls themselves
(:mod:`.runtime`) have not run on real hardware.

It also answers MLX's ``mx.metal`` namespace (``lazyx.core.metal.is_available()``,
the deprecated memory aliases, captures) through its ``lazyx_ops`` hook, so the
answers come from the backend that would run the work.
"""

from __future__ import annotations

import warnings

import numpy as np

from lazyx import device as lazyx_device
from lazyx import memory
from lazyx.backend import Backend, backend_for, dispatch_tables, invalidate_dispatch, resolve_kernel
from lazyx.device import DeviceType
from lazyx.environment import read_variable
from lazyx.errors import BackendError, DtypeError, KernelNotFoundError
from lazyx.hookspecs import hookimpl
from lazyx.primitive import Primitive
from lazyx.transforms.fusion import Compiled

from . import runtime
from .kernel import MetalKernel
from .runtime import availability

__all__ = ["MetalBackend", "MetalKernel", "MSLShimError", "run_msl_on_cpu", "shim_available",
           "is_available", "unavailable_reason", "emulate_on_cpu", "stats", "CPU_FALLBACK", "VIEW"]


def __getattr__(name):
    # The CPU shim (and with it the C++ toolchain) loads when first used: a plugin that
    # only declares Metal kernels does not pay for it at import.
    if name in ("MSLShimError", "run_msl_on_cpu", "shim_available"):
        from . import msl_cpu  # start-up: see above
        return getattr(msl_cpu, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_available() -> bool:
    """Whether this machine can run Metal kernels (macOS, Apple silicon, PyObjC's Metal)."""
    return availability()[0]


def unavailable_reason() -> str:
    """Why :func:`is_available` is False, in words (empty when it is True)."""
    return availability()[1]


#: Counters for tests and diagnostics: calls that ran a built-in kernel, calls that ran
#: a CPU fallback, and those calls by primitive name.
stats = {"builtin": 0, "cpu_fallback": 0, "cpu_fallback_by_primitive": {}, "views": 0}

#: How ``lazyx kernels`` / :func:`lazyx.core.kernel_provider` name a CPU fallback.
CPU_FALLBACK = "CPU fallback (the CPU backend's kernel, on unified memory)"

_NO_DOUBLE = np.dtype(np.float64)


def _cpu_fallback(cls):
    """The ``metal`` kernel of ``cls`` that runs the active CPU backend's kernel on the
    (NumPy, unified-memory) buffers: counted, refused under ``LAZYX_METAL_STRICT=1``,
    and refused for float64 inputs. It looks the CPU kernel up at each call, so
    ``use_backend("cpu", ...)`` applies to it."""
    name = cls.name
    by_primitive = stats["cpu_fallback_by_primitive"]
    cpu = DeviceType.cpu.value

    def kernel(prim, inputs):
        for x in inputs:
            if getattr(x, "dtype", None) == _NO_DOUBLE:
                raise DtypeError(f"{name} cannot run on the Metal GPU with float64 inputs (Metal "
                                 f"has no double precision). Run it on the CPU (stream=mx.cpu), "
                                 f"or cast its inputs to float32.")
        if read_variable("LAZYX_METAL_STRICT") == "1":
            raise KernelNotFoundError(
                f"{name} has no Metal kernel for inputs of dtypes "
                f"{', '.join(str(getattr(x, 'dtype', type(x).__name__)) for x in inputs)}, and "
                f"LAZYX_METAL_STRICT=1 refuses its CPU fallback. Run it on the CPU "
                f"(stream=mx.cpu), or unset LAZYX_METAL_STRICT to let the backend run the CPU's "
                f"kernel on the same memory.")
        stats["cpu_fallback"] += 1
        by_primitive[name] = by_primitive.get(name, 0) + 1
        runtime.wait_all()  # the inputs may still be being written by queued GPU work
        return dispatch_tables()[0][cpu][cls](prim, inputs)

    kernel.provider = CPU_FALLBACK
    kernel.cpu_fallback = True
    return kernel


#: How ``lazyx kernels`` / :func:`lazyx.core.kernel_provider` name a view primitive's
#: kernel on Metal.
VIEW = "view (the CPU's NumPy view of the shared buffer: no kernel, nothing copied)"


def _view(cls):
    """The ``metal`` kernel of view primitive ``cls`` (:data:`.kernels.shapes.VIEWS`): the
    active CPU backend's kernel, which returns a NumPy view of its input's shared buffer.
    No data moves, so nothing waits for queued GPU work writing the viewed array (a
    fallback would): only the other inputs, which the kernel reads (a dynamic slice's
    start), are settled first. Counted in :data:`stats` as ``views``; never refused by
    ``LAZYX_METAL_STRICT``, which is about data the CPU computes."""
    from .kernels.shapes import COPIES_STRIDED  # loaded with VIEWS already
    cpu = DeviceType.cpu
    found: dict = {}
    copies_strided = cls in COPIES_STRIDED

    def kernel(prim, inputs):
        source = backend_for(cpu)
        fn = found.get(source.name)
        if fn is None:  # the active CPU backend's own kernel, unprepared: it needs no fence
            fn = found[source.name] = resolve_kernel(source, cls)[0]
        if copies_strided and not inputs[0].flags.c_contiguous:
            runtime.settle(inputs[0])  # it reads the elements in C order first
        for x in inputs[1:]:
            runtime.settle(x)
        stats["views"] += 1
        return fn(prim, inputs)

    kernel.provider = VIEW
    return kernel


def _builtin(cls, launcher):
    """The ``metal`` kernel of ``cls`` that runs built-in launcher ``launcher`` (its
    dispatches through :func:`.runtime.dispatch`), and the CPU fallback for a dtype the
    kernel has no version for."""
    from .kernels import UnsupportedDtype  # the kernels' MSL tables: on first use
    fallback = _cpu_fallback(cls)
    run = runtime.dispatch

    def kernel(prim, inputs):
        try:
            out = launcher(prim, inputs, run)
        except UnsupportedDtype:
            return fallback(prim, inputs)
        stats["builtin"] += 1
        return out

    return kernel


class MetalBackend(Backend):
    """Apple GPUs through Metal. Buffers are NumPy arrays (unified memory). Kernels:
    plugins', built-in MSL (:mod:`.kernels`), generated MSL (:mod:`.compiled`), the
    primitive's ``eval_gpu``, then an explicit CPU fallback (see the module docstring;
    the GPU path is untested: :mod:`lazyx.backends.metal.runtime`)."""

    name = "metal"
    device_type = DeviceType.gpu

    def __init__(self):
        super().__init__()
        self._availability = None

    @property
    def stats(self) -> dict:
        """The module's :data:`stats` (built-in kernel calls, CPU fallbacks)."""
        return stats

    def _check(self) -> tuple[bool, str]:
        if self._availability is None:
            ok, why = availability()
            if ok and not runtime.emulating() and read_variable("LAZYX_METAL") == "0":
                ok, why = False, ("LAZYX_METAL=0 turns the Metal backend off; unset it to run "
                                  "on the GPU.")
            self._availability = (ok, why)
        return self._availability

    def is_available(self) -> bool:
        return self._check()[0]

    def unavailable_reason(self) -> str:
        return self._check()[1]

    def describe(self) -> str:
        where = "emulated on the CPU through lazyx's C++ shim" if runtime.emulating() else \
            "checked on the CPU through lazyx's C++ shim"
        return (f"built-in MSL kernels for every primitive MLX runs on its GPU (products, "
                f"reductions, softmax, scans, sorts, random bits, indexing, copies, creation, "
                f"FFTs, the fast pack and its backwards, convolutions, quantization), "
                f"generated element-wise MSL kernels and plugins' MSL kernels; linear "
                f"algebra on the CPU (as in MLX), listed as CPU fallbacks; {where}")

    def load_kernels(self) -> dict:
        from .kernels import KERNELS  # the built-in kernels' MSL: on first use
        return {cls: _builtin(cls, launcher) for cls, launcher in KERNELS.items()}

    def find_kernel(self, cls):
        # A kernel a plugin registered (resolve_kernel, before this) or a built-in one
        # comes first; then an element-wise primitive that writes itself in the codegen
        # IR runs a generated MSL kernel (its own expression; see .compiled), and
        # compile's Compiled nodes one fused kernel. A primitive's own eval_gpu is left
        # to it; any other primitive the CPU backend can run gets the explicit fallback.
        fn = super().find_kernel(cls)
        if fn is not None:
            return fn
        if cls is Compiled:
            from . import compiled  # the MSL renderer: on first use
            return compiled.compiled_kernel
        if cls.eval_gpu is not Primitive.eval_gpu:
            return None
        from .kernels.shapes import VIEWS  # the built-in kernels' tables: on first use
        if cls in VIEWS:
            return _view(cls)
        if callable(getattr(cls, "to_expression", None)):
            from . import compiled  # the MSL renderer: on first use
            return compiled.eager_kernel(cls, None)
        if getattr(resolve_kernel(backend_for(DeviceType.cpu), cls)[0], "missing", False):
            return None
        return _cpu_fallback(cls)

    def forget_availability(self) -> None:
        """Ask again whether Metal is available (after :func:`emulate_on_cpu`)."""
        self._availability = None

    # -- evaluations: one command buffer each, waited for at a read (:mod:`.runtime`) ----
    def enter_eval(self):
        runtime.begin_batch()

    def exit_eval(self, token) -> None:
        runtime.end_batch()

    def synchronize(self, stream) -> None:
        runtime.wait_all()

    # -- memory: the shared MTLBuffers arrays live in (:mod:`.runtime`) ------------------
    def memory_stats(self) -> dict:
        runtime.wait_all()  # buffers of finished work are what the figures count
        return runtime.memory_stats()

    def reset_peak_memory(self) -> None:
        runtime.reset_peak_memory()

    def clear_cache(self) -> None:
        runtime.clear_cache()


_BACKEND = MetalBackend()


def emulate_on_cpu(enabled: bool = True) -> bool:
    """Run the Metal backend on the CPU: every Metal kernel's MSL (generated or a plugin's)
    runs through lazyx's C++ shim in place of the GPU, and the backend reports itself
    available, so ``use_backend("gpu", "metal")`` and ``mx.compile`` on Metal streams
    work on any machine with a C++ compiler. For tests: slow (one thread at a time).

    Args:
        enabled (bool): True to emulate, False to go back to the real GPU (or to no
          Metal backend, where there is none).

    Returns:
        bool: the previous setting.

    Raises:
        BackendError: ``enabled`` and there is no C++ compiler to build the shim with.

    Example:
        >>> previous = lazyx.backends.metal.emulate_on_cpu()
        >>> with mx.use_backend("gpu", "metal"):
        ...     y = mx.compile(f)(x, stream=mx.gpu)
        >>> lazyx.backends.metal.emulate_on_cpu(previous)
    """
    if enabled:
        from lazyx.codegen import jit  # the C++ toolchain: only when emulating
        if not jit.available():
            raise BackendError(f"Cannot emulate the Metal backend on the CPU: lazyx's MSL shim "
                               f"needs a C++ compiler. {jit.missing_compiler_message()}")
    previous = runtime.set_emulation(enabled)
    _BACKEND.forget_availability()
    invalidate_dispatch()
    return previous


@hookimpl
def lazyx_backends():
    return [_BACKEND]


# -- lazyx.core.metal: MLX's ``mx.metal`` namespace, answered by this backend ----------
def _metal_is_available() -> bool:
    """Check if the Metal back-end is available (here: whether lazyx runs on it)."""
    return _BACKEND.is_available()


def _metal_device_info() -> dict:
    """Information about the GPU device and system settings (an empty dict where Metal is
    unavailable, as in MLX). Deprecated in MLX: use ``lazyx.core.device_info``."""
    _deprecated("device_info")
    return lazyx_device.device_info(lazyx_device.gpu) if _BACKEND.is_available() else {}


def _deprecated(name: str) -> None:
    warnings.warn(f"lazyx.core.metal.{name} is deprecated (as in MLX 0.32) and will be "
                  f"removed in a future version. Use lazyx.core.{name} instead.",
                  DeprecationWarning, stacklevel=3)


def _alias(fn):
    """MLX's deprecated ``mx.metal.<name>``: the core function, with a warning."""
    def alias(*args, **kwargs):
        _deprecated(fn.__name__)
        return fn(*args, **kwargs)
    alias.__name__ = alias.__qualname__ = fn.__name__
    alias.__doc__ = fn.__doc__
    return alias


def _start_capture(path: str) -> None:
    """Start a Metal capture (an Xcode ``.gputrace`` of the GPU work that follows).

    Where Metal is unavailable there is nothing to capture and, as in MLX, nothing
    happens; where it is available lazyx's Metal backend cannot capture yet.
    """
    if not isinstance(path, str):
        raise DtypeError(f"[metal.start_capture] path must be a str, got {path!r}.")
    if _BACKEND.is_available():
        raise BackendError("[metal.start_capture] GPU captures are not implemented by lazyx's "
                           "Metal backend yet; use Xcode's Metal debugger on the process.")


def _stop_capture() -> None:
    """Stop a Metal capture (nothing to stop where none could start)."""


@hookimpl
def lazyx_ops():
    ops = {"metal.is_available": _metal_is_available, "metal.device_info": _metal_device_info,
           "metal.start_capture": _start_capture, "metal.stop_capture": _stop_capture}
    for fn in (memory.get_active_memory, memory.get_peak_memory, memory.reset_peak_memory,
               memory.get_cache_memory, memory.clear_cache, memory.set_memory_limit,
               memory.set_cache_limit, lazyx_device.set_wired_limit):
        ops["metal." + fn.__name__] = _alias(fn)
    return ops
