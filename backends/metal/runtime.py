"""The Metal runtime: MSL compiled with the Metal API (through PyObjC) and run on the GPU.

**Untested.** This path needs macOS on Apple silicon and ``pyobjc-framework-Metal``;
lazyx's test machines have neither, so it has never run. What is tested is
everything it shares with the CPU check: the kernel's MSL source (compiled and run
through the C++ shim, :mod:`lazyx.backends.metal.msl_cpu`) and the binding of
buffers, constants and grid (:func:`lazyx.backends.metal.launch.plan_launch`).

Buffers stay NumPy arrays between kernels (Apple silicon's memory is unified);
each launch copies its inputs into shared ``MTLBuffer`` objects and its output
back, waiting for the command buffer to finish. Simple and slow; a buffer-owning
Metal backend is later work. Libraries are compiled once per source and pipelines
once per kernel function, with fast math off so that results round as on the CPU.
"""

from __future__ import annotations

import ctypes
import platform
import sys
import threading

import numpy as np

from lazyx.errors import BackendError, KernelCompileError

from .launch import plan_for_primitive

__all__ = ["availability", "run", "MetalCompileError"]

INSTALL_HINT = "pip install pyobjc-framework-Metal"


class MetalCompileError(KernelCompileError):
    """The Metal compiler rejected a kernel's MSL source, or a kernel function is missing."""


_lock = threading.Lock()
_context = None                 # (Metal module, MTLDevice, MTLCommandQueue)
_libraries: dict = {}           # MSL source -> MTLLibrary
_pipelines: dict = {}           # (MSL source, function name) -> MTLComputePipelineState
_SET_BYTES_LIMIT = 4096         # Metal's limit for data passed with setBytes


def availability() -> tuple[bool, str]:
    """Whether Metal kernels can run here, and if not, why (in words)."""
    if sys.platform != "darwin":
        return False, (f"Metal needs macOS on Apple silicon; this is {sys.platform} on "
                       f"{platform.machine()}.")
    if platform.machine() != "arm64":
        return False, (f"Metal needs Apple silicon; this Python runs as {platform.machine()} "
                       f"(an Intel Mac, or an x86-64 Python under Rosetta).")
    try:
        import Metal  # noqa: F401
    except ImportError:
        return False, (f"the Metal backend talks to Metal through PyObjC, which is not "
                       f"installed: {INSTALL_HINT}")
    try:
        _get_context()
    except BackendError as exc:
        return False, str(exc)
    return True, ""


def _get_context():
    global _context
    if _context is None:
        with _lock:
            if _context is None:
                import Metal
                device = Metal.MTLCreateSystemDefaultDevice()
                if device is None:
                    raise BackendError("macOS reports no Metal device (MTLCreateSystemDefaultDevice "
                                       "returned nil).")
                _context = (Metal, device, device.newCommandQueue())
    return _context


def _pipeline(kernel, function: str):
    source = kernel.source
    key = (source, function)
    found = _pipelines.get(key)
    if found is not None:
        return found
    Metal, device, _ = _get_context()
    with _lock:
        library = _libraries.get(source)
        if library is None:
            options = Metal.MTLCompileOptions.alloc().init()
            if hasattr(options, "setMathMode_") and hasattr(Metal, "MTLMathModeSafe"):  # macOS 15
                options.setMathMode_(Metal.MTLMathModeSafe)
            else:
                options.setFastMathEnabled_(False)
            library, error = device.newLibraryWithSource_options_error_(source, options, None)
            if library is None:
                raise MetalCompileError(f"{kernel.label} does not compile with Metal:\n"
                                        f"{_describe(error)}")
            _libraries[source] = library
        fn = library.newFunctionWithName_(function)
        if fn is None:
            raise MetalCompileError(f"{kernel.label}: the compiled library has no kernel "
                                    f"function {function!r}.")
        pipeline, error = device.newComputePipelineStateWithFunction_error_(fn, None)
        if pipeline is None:
            raise MetalCompileError(f"{kernel.label}: no pipeline for {function!r}: "
                                    f"{_describe(error)}")
        _pipelines[key] = pipeline
    return pipeline


def _describe(error) -> str:
    return str(error.localizedDescription()) if error is not None else "(no error given)"


def _size(Metal, n: int):
    make = getattr(Metal, "MTLSizeMake", None)
    return make(n, 1, 1) if make is not None else Metal.MTLSize(n, 1, 1)


def _span(a: np.ndarray) -> bytes:
    """The bytes from ``a``'s first element to its last (strides are non-negative)."""
    if a.size == 0:
        return b"\0" * 4
    span = a.itemsize + sum((n - 1) * s for n, s in zip(a.shape, a.strides))
    return ctypes.string_at(a.ctypes.data, span)


def run(kernel, primitive, inputs):
    """Run ``kernel`` for ``primitive`` on NumPy ``inputs`` on the GPU; returns a NumPy array."""
    ok, reason = availability()
    if not ok:
        raise BackendError(f"Cannot run {kernel.label} on Metal: {reason}")
    launch = plan_for_primitive(kernel, primitive, inputs)
    if launch.grid == 0:
        return launch.output
    Metal, device, queue = _get_context()
    pipeline = _pipeline(kernel, launch.function)
    shared = Metal.MTLResourceStorageModeShared
    commands = queue.commandBuffer()
    encoder = commands.computeCommandEncoder()
    encoder.setComputePipelineState_(pipeline)
    keep, out_buffer = [], None
    for index, a in enumerate(launch.buffers):
        if a is launch.output:
            buf = out_buffer = device.newBufferWithLength_options_(a.nbytes, shared)
        else:
            data = _span(a)
            if len(data) <= _SET_BYTES_LIMIT:       # constants, shapes, strides, small inputs
                encoder.setBytes_length_atIndex_(data, len(data), index)
                continue
            buf = device.newBufferWithBytes_length_options_(data, len(data), shared)
        encoder.setBuffer_offset_atIndex_(buf, 0, index)
        keep.append(buf)
    width = min(int(pipeline.maxTotalThreadsPerThreadgroup()), launch.grid)
    encoder.dispatchThreads_threadsPerThreadgroup_(_size(Metal, launch.grid), _size(Metal, width))
    encoder.endEncoding()
    commands.commit()
    commands.waitUntilCompleted()
    if commands.error() is not None:
        raise BackendError(f"{kernel.label} ({launch.function}) failed on the GPU: "
                           f"{_describe(commands.error())}")
    raw = out_buffer.contents().as_buffer(launch.output.nbytes)
    launch.output.reshape(-1).view(np.uint8)[:] = np.frombuffer(raw, np.uint8)
    del keep
    return launch.output
