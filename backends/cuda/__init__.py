"""The CUDA backend (NVIDIA GPUs): CuPy buffers, CuPy and NVRTC kernels.

Buffers are ``cupy.ndarray``. The kernel of a primitive comes, in order, from

1. this backend's own table (:mod:`.kernels`): CuPy calls and CUDA C++ where
   the NumPy kernel cannot run on the device as written (creation, random bits,
   the ops whose NumPy kernels compute on the host);
2. the NumPy kernel of the ``cpu-reference`` backend, run on CuPy arrays: the
   NumPy kernels are written with NumPy functions that CuPy implements through
   NumPy's dispatch protocols (``__array_ufunc__``/``__array_function__``), so
   ``np.add(x, y)`` on two CuPy arrays is one CuPy kernel on the GPU. A kernel
   that would compute on the host instead raises (the wrapper checks that its
   outputs are device buffers), never a silent fallback.

Element-wise primitives that declare ``to_expression`` (the codegen IR that
``compile`` fuses) run kernels generated from their expression instead, and
``compile``'s fused ``Compiled`` nodes run one generated kernel each: CUDA C++
rendered by :mod:`lazyx.codegen.cuda`, compiled by NVRTC (:mod:`.compiled`). Their
common case (CuPy inputs, contiguous) is launched from C++ through the driver, with the
output written into a dead input's buffer where the scheduler offers one
(``backends/cuda/native/launch.cpp``).

Plugins add kernels for their own primitives from CUDA C++ source with
:class:`CudaKernel` (compiled by NVRTC through CuPy, cached per process and on
disk by CuPy) and register them with the ``lazyx_kernels`` hook for the backend
``"cuda"``; lazyx-axpby's ``axpby.cu`` is the worked example.

Data moves by itself: a kernel here receives host (NumPy) inputs copied to the
device, once per host buffer while it lives; CPU kernels receive device inputs
copied to the host.

CuPy is imported only when the backend is first asked whether it is
available, so ``import lazyx.core`` on a machine without CUDA costs nothing.
"""

from __future__ import annotations

import weakref

import numpy as np

from lazyx.backend import Backend
from lazyx.device import DeviceType
from lazyx.errors import BackendError, HostOnlyKernelError
from lazyx.hookspecs import hookimpl
from lazyx.primitive import Primitive

from . import runtime as _rt
from .runtime import CudaKernel, cupy_module, launch_config

__all__ = ["CudaBackend", "CudaKernel", "cupy_module", "launch_config"]

class _UploadCache:
    """Device copies of host buffers, kept while the host buffer lives.

    Arrays are immutable, so a host buffer's device copy stays valid; an array
    used by many GPU nodes (a weight created from NumPy) is copied once.
    """

    def __init__(self):
        self._copies: dict[int, tuple] = {}
        self._small: dict[tuple, object] = {}

    def get(self, host: np.ndarray):
        if host.ndim == 0:
            # Scalars (the weak Python scalars of ``x + 1``) by value: one copy per
            # distinct value instead of a synchronous copy per use.
            vkey = (host.dtype.str, host.tobytes())
            dev = self._small.get(vkey)
            if dev is None:
                if len(self._small) > 4096:
                    self._small.clear()
                _rt.host_sync("a host buffer copied to the device")
                dev = self._small[vkey] = _rt.cp.asarray(host)
            return dev
        key = id(host)
        hit = self._copies.get(key)
        if hit is not None and hit[0]() is host:
            return hit[1]
        # A copy from pageable host memory waits for the work queued before it.
        _rt.host_sync("a host buffer copied to the device")
        dev = _rt.cp.asarray(host)
        try:
            ref = weakref.ref(host, lambda _r, k=key, c=self._copies: c.pop(k, None))
        except TypeError:
            return dev
        if host.nbytes >= 64:  # tiny buffers (scalars) are cheaper to copy than to track
            self._copies[key] = (ref, dev)
        return dev

    def clear(self):
        self._copies.clear()
        self._small.clear()


class CudaBackend(Backend):
    """CuPy buffers; kernels from :mod:`.kernels`, else NumPy kernels run through CuPy."""

    name = "cuda"
    device_type = DeviceType.gpu

    def __init__(self):
        super().__init__()
        self._loaded = False
        self._uploads = _UploadCache()
        self._peak = 0

    # -- availability -------------------------------------------------------------
    def is_available(self) -> bool:
        try:
            cupy_module()
            return True
        except BackendError:
            return False

    def unavailable_reason(self) -> str:
        try:
            cupy_module()
            return ""
        except BackendError as exc:
            return str(exc).split(": ", 1)[-1]

    def describe(self) -> str:
        if not self.is_available():
            return ""
        cp = _rt.cp
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        return f"{name}, CuPy {cp.__version__}, CUDA runtime {cp.cuda.runtime.runtimeGetVersion()}"

    def device_count(self) -> int:
        """The number of CUDA devices (``lazyx.core.device_count(gpu)``)."""
        return _rt.cp.cuda.runtime.getDeviceCount() if self.is_available() else 0

    def device_info(self) -> dict:
        """The current CUDA device as ``lazyx.core.device_info(gpu)`` reports it."""
        if not self.is_available():
            return {}
        cp = _rt.cp
        dev = cp.cuda.Device()
        props = cp.cuda.runtime.getDeviceProperties(dev.id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        free, total = cp.cuda.runtime.memGetInfo()
        return {"device_name": name, "architecture": f"sm_{props['major']}{props['minor']}",
                "total_memory": int(total), "free_memory": int(free)}

    # -- kernels --------------------------------------------------------------------
    def _load(self):
        # kernels.py imports CuPy: without it, introspection (lazyx kernels) still
        # works and reports the NumPy kernels this backend would run through CuPy.
        if not self._loaded and self.is_available():
            from . import kernels  # imports CuPy: only once the backend is available
            from . import graphs  # compiled calls replayed as CUDA graphs
            self.kernels.update(kernels.KERNELS)
            self.kernels.update(graphs.KERNELS)
            self._loaded = True

    def find_kernel(self, cls):
        self._load()
        fn = self._table_kernel(cls)
        # An element-wise primitive that writes itself in the codegen IR runs a generated
        # kernel (its own expression, compiled by NVRTC; see .compiled), and `fn` where it
        # is not expressible. A primitive's own eval_gpu is left to it.
        if self._loaded and callable(getattr(cls, "to_expression", None)):
            from . import compiled  # the renderers and their toolchain: on first use
            if compiled.ELEMENTWISE and cls.eval_gpu is Primitive.eval_gpu:
                return compiled.eager_kernel(cls, fn)
        return fn

    def _table_kernel(self, cls):
        fn = super().find_kernel(cls)
        if fn is not None:
            return fn
        from lazyx.backends.cpu.kernels import numpy_kernels  # large: on first use
        table = _numpy_table(numpy_kernels)
        for klass in cls.__mro__:
            fn = table.get(klass)
            if fn is not None:
                return _through_cupy(fn, cls)
        # A primitive with a NumPy eval_cpu and no eval_gpu (a custom_primitive, a plugin's
        # Python primitive) runs that kernel on CuPy arrays as well.
        if cls.eval_gpu is Primitive.eval_gpu and cls.eval_cpu is not Primitive.eval_cpu:
            return _through_cupy(cls.eval_cpu, cls)
        return None

    def upload(self, x):
        """The device copy of host buffer ``x`` (cached while it lives; scalars by value)."""
        return self._uploads.get(x) if type(x) is np.ndarray else _to_device(x)

    def prepare_kernel(self, fn):
        cp = cupy_module()
        nd = cp.ndarray
        upload = self.upload

        def kernel(prim, inputs):
            for i, x in enumerate(inputs):
                if type(x) is not nd:
                    inputs[i] = upload(x)
            return fn(prim, inputs)
        kernel.__wrapped__ = fn
        # Its outputs are device buffers (checked by _through_cupy where a NumPy kernel runs):
        # the scheduler's native loop stores one of the promised shape and dtype itself.
        kernel.device_outputs = True
        # Generated element-wise kernels launch from C++ in the common case (.compiled).
        from . import compiled  # loaded with the kernels (_load): a dictionary lookup
        return compiled.native_kernel(kernel, fn, upload)

    # -- buffers ----------------------------------------------------------------------
    def is_buffer(self, obj) -> bool:
        return _rt.cp is not None and type(obj) is _rt.cp.ndarray

    def to_host(self, buf) -> np.ndarray:
        if self._loaded:  # index checks queued by kernels (.kernels): reported at a read
            from . import kernels  # loaded already (self._loaded): a dictionary lookup
            kernels.flush_index_checks()
        _rt.host_sync("a value read to the host")
        return buf.get()

    def from_host(self, data: np.ndarray):
        return cupy_module().asarray(data)

    def synchronize(self, stream) -> None:
        if _rt.cp is not None:
            if self._loaded:
                from . import kernels  # loaded already (self._loaded): a dictionary lookup
                kernels.flush_index_checks()
            _rt.host_sync("synchronize")
            _rt.cp.cuda.Device().synchronize()

    # -- memory -----------------------------------------------------------------------
    def memory_stats(self) -> dict:
        if _rt.cp is None:
            return {"active": 0, "peak": 0, "cache": 0}
        pool = _rt.cp.get_default_memory_pool()
        used, total = pool.used_bytes(), pool.total_bytes()
        self._peak = max(self._peak, used)
        return {"active": used, "peak": self._peak, "cache": total - used}

    def reset_peak_memory(self) -> None:
        self._peak = 0

    def clear_cache(self) -> None:
        self._uploads.clear()
        if _rt.cp is not None:
            _rt.cp.get_default_memory_pool().free_all_blocks()

    def set_memory_limit(self, limit: int) -> int:
        pool = cupy_module().get_default_memory_pool()
        old = pool.get_limit()
        pool.set_limit(size=int(limit))
        return old


_numpy_cache: dict = {}


def _numpy_table(factory) -> dict:
    if not _numpy_cache:
        _numpy_cache.update(factory())
    return _numpy_cache


def _to_device(x):
    cp = _rt.cp
    if hasattr(x, "__cuda_array_interface__"):
        return cp.asarray(x)
    return cp.asarray(np.asarray(x))


def _through_cupy(fn, cls):
    """Run NumPy kernel ``fn`` on CuPy arrays; its outputs must be CuPy arrays."""
    def kernel(prim, inputs):
        try:
            out = fn(prim, inputs)
        except TypeError as exc:
            # A NumPy function CuPy does not dispatch refuses device arrays with a
            # TypeError (CuPy's __array__): the kernel needs the host.
            raise HostOnlyKernelError(
                f"{cls.name} has no kernel on backend 'cuda': its NumPy kernel needs the "
                f"host ({type(exc).__name__}: {exc}). Register a CuPy kernel for it in "
                f"lazyx.backends.cuda.kernels.") from exc
        nd = _rt.cp.ndarray
        outs = out if type(out) in (tuple, list) else (out,)
        for o in outs:
            if type(o) is not nd:
                raise HostOnlyKernelError(
                    f"{cls.name} has no kernel on backend 'cuda': its NumPy kernel returned a "
                    f"host {type(o).__name__} (it computes on the host). Register a CuPy kernel "
                    f"for it in lazyx.backends.cuda.kernels.")
        return out
    kernel.__wrapped__ = fn
    return kernel


_BACKEND = CudaBackend()


@hookimpl
def lazyx_backends():
    return [_BACKEND]


def _cuda_is_available() -> bool:
    """Check if the CUDA back-end is available (CuPy imports and sees a device)."""
    return _BACKEND.is_available()


@hookimpl
def lazyx_ops():
    # MLX's ``mx.cuda`` namespace, answered by the backend that would run the work.
    return {"cuda.is_available": _cuda_is_available}
