"""The CPU backends.

* ``cpu`` (the default): NumPy kernels for every primitive, with native
  kernels from the nanobind module ``_native`` where NumPy needs several passes
  or one thread, generated C++ kernels for fused element-wise runs and for
  single element-wise ops on large arrays (``compiled``), and the native
  allocator that gives the memory figures.
* ``cpu-reference``: the NumPy kernels alone. Swap it in with
  ``lazyx.core.use_backend("cpu", "cpu-reference")`` to cross-check results.
"""

from __future__ import annotations

from lazyx.backend import Backend
from lazyx.device import DeviceType
from lazyx.errors import BackendError
from lazyx.hookspecs import hookimpl
from lazyx.primitive import Primitive
from lazyx.transforms.fusion import Compiled

from . import native_kernels

import numpy as np

try:  # NumPy's floating-point error state is a context variable: swapping it is cheap.
    from numpy._core._ufunc_config import _extobj_contextvar as _errstate_var
    with np.errstate(all="ignore"):
        _SILENT = _errstate_var.get()
except (ImportError, AttributeError):  # pragma: no cover - other NumPy layouts
    _errstate_var = None


class CpuReferenceBackend(Backend):
    """NumPy kernels only."""

    name = "cpu-reference"
    device_type = DeviceType.cpu

    def load_kernels(self) -> dict:
        from .kernels import numpy_kernels  # on first use: the kernel modules are large
        return numpy_kernels()

    # Kernels are silent about floating-point exceptions (0 * inf, x / 0), as MLX is:
    # NumPy's warnings are switched off while an evaluation runs.
    def enter_eval(self):
        if _errstate_var is None:
            ctx = np.errstate(all="ignore")
            ctx.__enter__()
            return ctx
        return _errstate_var.set(_SILENT)

    def exit_eval(self, token):
        if _errstate_var is None:
            token.__exit__(None, None, None)
        else:
            _errstate_var.reset(token)


class CpuBackend(CpuReferenceBackend):
    """NumPy kernels, native kernels where they pay, and native memory accounting."""

    name = "cpu"

    def __init__(self):
        super().__init__()
        self.native = native_kernels.load()

    def load_kernels(self) -> dict:
        table = super().load_kernels()
        table.update(native_kernels.kernels(self.native))
        if self.native is not None:
            from . import blas_threads  # threadpoolctl: with the kernels, once
            blas_threads.use_pool(self.native)
            if self.native.get_flush_denormal():
                blas_threads.follow(self.native, True)
        # Fused element-wise runs: C++ generated and built at run time.
        from .compiled import compiled_kernel  # the C++ toolchain: on first use
        table[Compiled] = compiled_kernel
        return table

    def find_kernel(self, cls: type):
        # Kernels are found on first use, inside an evaluation, where lazyx's allocation
        # handler counts every NumPy buffer made: the kernel modules imported then
        # (SciPy, NumPy's lazy submodules) hold arrays for the life of the process, which
        # are no array's buffer. NumPy's own handler allocates them, so the memory
        # figures count arrays alone, as MLX's do.
        native = self.native
        if native is None:
            fn = super().find_kernel(cls)
        else:
            token = native.enter_eval()
            native.exit_eval(None)  # NumPy's default handler for this context
            try:
                fn = super().find_kernel(cls)
            finally:
                native.exit_eval(token)
        # An element-wise primitive that writes itself in the codegen IR runs a generated
        # kernel (its own expression, as compile's; see .compiled) on large inputs, and
        # `fn` on small ones. A primitive's own eval_cpu is left to it.
        if fn is not None and cls.eval_cpu is Primitive.eval_cpu and \
                callable(getattr(cls, "to_expression", None)):
            from . import compiled  # the C++ toolchain: on first use
            if compiled.ELEMENTWISE:
                return compiled.eager_kernel(cls, fn)
        return fn

    def enter_eval(self):
        outer = super().enter_eval()
        return outer, (self.native.enter_eval() if self.native is not None else None)

    def exit_eval(self, token):
        outer, inner = token
        if self.native is not None:
            self.native.exit_eval(inner)
        super().exit_eval(outer)

    def memory_stats(self) -> dict:
        if self.native is None:
            return super().memory_stats()
        return self.native.memory_stats()

    def reset_peak_memory(self):
        if self.native is not None:
            self.native.reset_peak_memory()

    def clear_cache(self):
        if self.native is not None:
            self.native.clear_cache()

    def set_memory_limit(self, limit):
        return self._require_native().set_memory_limit(limit)

    def set_cache_limit(self, limit):
        return self._require_native().set_cache_limit(limit)

    def set_flush_denormal(self, on):
        if self.native is None:
            return False
        supported = self.native.set_flush_denormal(bool(on))
        if supported:
            from . import blas_threads  # threadpoolctl: on first use
            blas_threads.follow(self.native, self.native.get_flush_denormal())
        return supported

    def get_flush_denormal(self):
        return self.native.get_flush_denormal() if self.native is not None else False

    def _require_native(self):
        if self.native is None:
            raise BackendError(f"The cpu backend's native module did not load "
                               f"({native_kernels.load_error}); memory limits need it. "
                               f"Reinstall lazyx to rebuild it.")
        return self.native

    def describe(self) -> str:
        if self.native is None:
            return f"native module not loaded ({native_kernels.load_error}): NumPy kernels only"
        info = self.native.build_info()
        return (f"native kernels loaded: {info.get('simd', 'scalar')} code "
                f"({info.get('arch', 'native')} build), {self.native.get_num_threads()} threads")


@hookimpl
def lazyx_backends():
    return [CpuBackend(), CpuReferenceBackend()]
