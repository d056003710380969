"""The CUDA runtime of the ``cuda`` backend: CuPy, imported on first use, and the
kernels plugins write in CUDA C++.

The lowest module of the backend: the backend itself (:mod:`lazyx.backends.cuda`),
its kernels (:mod:`.kernels`, :mod:`.rowwise`) and the generated element-wise
kernels (:mod:`.compiled`) import it. Nothing here imports CuPy until
:func:`cupy_module` is called, so ``import lazyx.core`` costs nothing on a machine
without CUDA.
"""

from __future__ import annotations

from lazyx.environment import read_variable
from lazyx.errors import BackendError, KernelCompileError, LazyxError

__all__ = ["cupy_module", "CudaKernel", "launch_config", "cp", "sync_hooks", "host_sync",
           "native_module", "LaunchError", "NATIVE"]

#: Functions called with a short reason each time lazyx's CUDA backend makes the host
#: wait for the GPU (a value read back to the host, ``synchronize``). Execution is
#: otherwise asynchronous: the tests count these calls around a training step.
sync_hooks: list = []


def host_sync(reason: str) -> None:
    """Report a host synchronisation to :data:`sync_hooks` (called just before it)."""
    for hook in sync_hooks:
        hook(reason)

#: The ``cupy`` module once :func:`cupy_module` imported it, else None.
cp = None
_import_error = None  # why it could not be


def cupy_module():
    """The ``cupy`` module, or a :class:`BackendError` saying why there is none."""
    global cp, _import_error
    if cp is None and _import_error is None:
        try:
            import cupy  # optional: only machines with an NVIDIA GPU have it
            cupy.cuda.runtime.getDeviceCount()
            cp = cupy
        except ImportError as exc:
            _import_error = (f"CuPy is not installed ({exc}); install the wheel for your CUDA "
                             f"version, e.g. `pip install cupy-cuda13x` or `cupy-cuda12x`.")
        except Exception as exc:  # cupy present, no driver or no device
            _import_error = f"CuPy found no usable CUDA device ({type(exc).__name__}: {exc})."
    if cp is None:
        raise BackendError(f"The cuda backend is not available: {_import_error}")
    return cp


#: Whether kernels launch from C++ (``backends/cuda/native/launch.cpp``: the generated
#: element-wise kernels, fused nodes and the kernels of CUDA C++ source), through the
#: driver's ``cuLaunchKernel``; ``LAZYX_CUDA_NATIVE=0``: through CuPy, from Python.
NATIVE = read_variable("LAZYX_CUDA_NATIVE") != "0"  # (checked: 0 or 1)
_native = None  # the module once set up; False where it cannot be


class LaunchError(BackendError):
    """A launch the CUDA driver refused (the native launchers' error: names the kernel)."""


def native_module():
    """``lazyx.backends.cuda._native`` set up for this process's CUDA driver and CuPy, or
    None (switched off, not built, or no driver: everything launches through CuPy)."""
    global _native
    if _native is None:
        _native = False
        if NATIVE:
            try:
                import numpy as np  # (with CuPy: the native module's argument types)
                from . import _native as mod  # the C++ launchers: only once CUDA is in use
                cp_ = cupy_module()
                mod.setup(cp_.ndarray, cp_.cuda.get_current_stream, LaunchError, np.generic)
                _native = mod
            except (ImportError, OSError) as exc:
                from lazyx import log  # the cold path only
                log.logger.debug(f"cuda: no native launcher ({type(exc).__name__}: {exc}); "
                                 f"kernels launch through CuPy")
    return _native or None


class CudaKernel:
    """A kernel from CUDA C++ source, compiled by NVRTC on first use.

    Args:
        source (str): CUDA C++ source; kernels meant to be launched by name
          should be ``extern "C" __global__`` (or listed in ``name_expressions``
          for templates).
        name (str): a name for messages (the file the source came from).
        options (tuple[str]): extra NVRTC options (``"-std=c++17"`` is added).
        name_expressions (tuple[str]): template instantiations to compile,
          e.g. ``("axpby_contiguous<float>",)``.

    ``function(fname)`` returns a launchable ``cupy.RawKernel``-like function:
    ``fn(grid, block, args, shared_mem=0)`` (launched from C++ where the native module is
    built: ``_native.RawFunction``; CuPy arrays and NumPy scalars as arguments), cached.
    A compile error raises :class:`KernelCompileError` with the source's name and NVRTC's
    log.
    """

    def __init__(self, source: str, name: str, options=(), name_expressions=()):
        if not isinstance(source, str) or not source.strip():
            raise LazyxError(f"CudaKernel {name!r}: source must be a non-empty string.")
        self.source = source
        self.name = name
        self.options = ("-std=c++17",) + tuple(options)
        self.name_expressions = tuple(name_expressions)
        self._module = None
        self._functions = {}

    def module(self):
        if self._module is None:
            cp = cupy_module()
            kw = {"name_expressions": self.name_expressions} if self.name_expressions else {}
            mod = cp.RawModule(code=self.source, options=self.options, **kw)
            try:
                mod.compile()
            except Exception as exc:
                log = str(exc).strip().splitlines()
                raise KernelCompileError(f"The CUDA kernel source {self.name} did not compile "
                                         f"(NVRTC):\n" + "\n".join(log[:20])) from None
            self._module = mod
        return self._module

    def function(self, fname: str):
        fn = self._functions.get(fname)
        if fn is not None:
            return fn
        mod = self.module()
        try:
            fn = mod.get_function(fname)
        except Exception as exc:
            raise LazyxError(f"The CUDA kernel source {self.name} has no kernel {fname!r} "
                             f"({exc}). Kernels are looked up by their extern \"C\" name or "
                             f"by a template name listed in name_expressions.") from None
        native = native_module()
        if native is not None:  # launched from C++: CuPy's call costs ~5 µs more per launch
            fn = native.RawFunction(fn)
        self._functions[fname] = fn
        return fn


#: CUDA C++ of the element types the hand-written kernels are templated on: ``S`` the
#: stored type (half types as their 16 bits), ``C`` the computing type (float for the
#: half types), ``load``/``store`` the conversions (bfloat16 rounds to nearest even, NaN
#: kept quiet). Kernel sources start with it (rowwise.py, fast.py).
DTYPE_STRUCTS = r"""
struct F32 {
  typedef float S; typedef float C;
  static __device__ C load(S v) { return v; }
  static __device__ S store(C v) { return v; }
};
struct F64 {
  typedef double S; typedef double C;
  static __device__ C load(S v) { return v; }
  static __device__ S store(C v) { return v; }
};
struct F16 {
  typedef unsigned short S; typedef float C;
  static __device__ C load(S v) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v)); return f; }
  static __device__ S store(C v) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v)); return h; }
};
struct BF16 {
  typedef unsigned short S; typedef float C;
  static __device__ C load(S v) { return __uint_as_float(((unsigned int)v) << 16); }
  static __device__ S store(C v) {
    unsigned int u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
  }
};
"""


#: A dtype's name -> its struct in :data:`DTYPE_STRUCTS` and the dtype a kernel takes its
#: buffers as (the half types as their 16 bits), for the kernels templated on them (keyed
#: by name: the table needs no ml_dtypes import).
DTYPE_STRUCT_OF = {"float32": ("F32", None), "float64": ("F64", None),
                   "float16": ("F16", "uint16"), "bfloat16": ("BF16", "uint16")}


def as_view(a, view):
    """``a`` viewed as ``view`` (a dtype name or None: as it is); None stays None."""
    return a if a is None or view is None else a.view(view)


def on_host(fn):
    """NumPy kernel ``fn`` as a CUDA kernel that runs it on host copies of its inputs and
    uploads the results: for the cases a pack's CUDA kernels leave to the host (exact
    bit-level ports of MLX's packing, float64 where no CUDA kernel is written)."""
    def kernel(p, ins):
        cp = cupy_module()
        host_sync(f"{p.name}: computed on the host")
        out = fn(p, [cp.asnumpy(x) for x in ins])
        if type(out) in (tuple, list):
            return tuple(cp.asarray(o) for o in out)
        return cp.asarray(out)
    kernel.__wrapped__ = fn
    return kernel


def launch_config(n: int, block: int = 256) -> tuple[tuple, tuple]:
    """``(grid, block)`` for one thread per element of ``n`` (grid-stride loops welcome)."""
    blocks = max(1, min((n + block - 1) // block, 65535 * 4))
    return (blocks,), (block,)
