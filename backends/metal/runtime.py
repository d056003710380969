"""The Metal runtime: MSL compiled with the Metal API (through PyObjC) and run on the GPU.

**Not run on hardware.** This path needs macOS on Apple silicon and
``pyobjc-framework-Metal``; lazyx's test machines have neither, so it has never run on
a GPU. What is tested on Linux is everything it shares with the CPU check: the kernels'
MSL source (compiled and run through the C++ shim, :mod:`lazyx.backends.metal.msl_cpu`),
the binding of buffers, constants and grid (:func:`lazyx.backends.metal.launch.plan_launch`
for :class:`~lazyx.backends.metal.MetalKernel`, :mod:`lazyx.backends.metal.compiled` for
generated kernels), and this module's own code — shared buffers, their pool and memory
figures, argument binding, command encoding — against a fake of PyObjC's Metal objects
(tests/backends/test_metal_backend.py, test_metal_buffers.py). Left untested: PyObjC's
own behaviour (``contents().as_buffer(n)`` giving a writable view of the buffer's memory,
``MTLSize`` conversion) and the GPU's.

Two entry points touch the GPU, both through :func:`_encode_and_wait`:
:func:`execute` runs a planned :class:`~lazyx.backends.metal.launch.Launch` (one
thread per element, threadgroups as wide as the pipeline allows), and
:func:`dispatch` a built-in kernel's :class:`~lazyx.backends.metal.kernels.Dispatch`
(a 3-D grid in threadgroups of the size the kernel was written for, with the
threadgroup memory lengths it asks for). Libraries are compiled once per source and
pipelines once per kernel function, with fast math off so that results round as on
the CPU.

**Buffers in unified memory.** :func:`empty` allocates an array in a shared
``MTLBuffer`` (``newBufferWithLength:options:``, ``MTLResourceStorageModeShared``) and
gives NumPy a view of its memory, no copy: the CPU and the GPU read the same bytes. The
view's ``base`` chain ends in a :class:`SharedBuffer`, which keeps the ``MTLBuffer``
alive as long as any view of it and hands it back to a pool (by length) when the last
one dies; :func:`memory_stats` counts the live buffers' bytes (active, peak) and the
pool's (cache). Generated kernels (:mod:`.compiled`) allocate their outputs there. A
launch binds an argument that lives in a shared buffer as that buffer at the view's
offset — a kernel's output fed to the next kernel is not copied — and copies any other
NumPy argument as before: into a new shared buffer (written ones copied back after the
command buffer completes), or with ``setBytes`` when small. Built-in kernels allocate
their outputs here too (``dispatch.empty``, through ``kernels.common.empty``); plugins'
:class:`MetalKernel` launches still allocate theirs with NumPy, so those are copied back.

**Synchronous.** Each launch is one command buffer, committed and waited for: the
launchers read some outputs on the host right after a dispatch (an indexing kernel's
bounds flag), and the scheduler tells only the CPU backend where an evaluation begins
and ends, so batching command buffers per evaluation and waiting only at a read is
later work (see docs/codegen.md).

**Emulation.** :func:`set_emulation` replaces the GPU by the CPU shim: the backend
reports itself available and :func:`execute` and :func:`dispatch` run the MSL
through :mod:`lazyx.backends.metal.msl_cpu`, on plain NumPy arrays. Everything above this
module (kernel choice, planning, argument packing) then runs as on a Mac, which is how
the tests check the Metal backend on Linux (``lazyx.backends.metal.emulate_on_cpu``).
"""

from __future__ import annotations

import ctypes
import platform
import sys
import threading

import numpy as np

from lazyx.errors import BackendError, KernelCompileError, OutOfMemoryError

from .launch import plan_for_primitive

__all__ = ["availability", "run", "execute", "dispatch", "MetalCompileError", "set_emulation",
           "emulating", "empty", "SharedBuffer", "shared_buffer_of", "memory_stats",
           "reset_peak_memory", "clear_cache"]

INSTALL_HINT = "pip install pyobjc-framework-Metal"


class MetalCompileError(KernelCompileError):
    """The Metal compiler rejected a kernel's MSL source, or a kernel function is missing."""


_lock = threading.Lock()
_context = None                 # (Metal module, MTLDevice, MTLCommandQueue)
_libraries: dict = {}           # MSL source -> MTLLibrary
_pipelines: dict = {}           # (MSL source, function name) -> MTLComputePipelineState
_SET_BYTES_LIMIT = 4096         # Metal's limit for data passed with setBytes
_emulated = False               # set_emulation: the CPU shim stands for the GPU


def set_emulation(enabled: bool) -> bool:
    """Run Metal kernels on the CPU through the MSL shim instead of a GPU (``True``), or
    on the GPU again (``False``); returns the previous setting. For tests: the Metal
    backend then runs everywhere with a C++ compiler."""
    global _emulated
    previous, _emulated = _emulated, bool(enabled)
    return previous


def emulating() -> bool:
    """Whether :func:`set_emulation` put the CPU shim in the GPU's place."""
    return _emulated


def availability() -> tuple[bool, str]:
    """Whether Metal kernels can run here, and if not, why (in words)."""
    if _emulated:
        return True, ""
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


# -- shared buffers: arrays in MTLBuffers that NumPy views without a copy -----------------
_ALIGN = 256                    # pooled lengths round up to this (reuse across close sizes)
_pool: dict = {}                # length -> [MTLBuffer] free for reuse
# Re-entrant: a SharedBuffer's __del__ (from a garbage collection that may start anywhere,
# inside _allocate too) hands its buffer back under this lock.
_pool_lock = threading.RLock()
_memory = {"active": 0, "peak": 0, "cache": 0}


class SharedBuffer:
    """One shared ``MTLBuffer`` as NumPy sees it: ``np.asarray(owner)`` is a uint8 view of
    its ``length`` bytes at ``address`` (the buffer's ``contents()``), with the owner as
    its ``base``; every array :func:`empty` makes from it keeps it alive. When the last
    view dies the ``MTLBuffer`` goes back to the pool (the launch that wrote it has
    completed: launches are synchronous)."""

    __slots__ = ("mtl", "length", "address", "_bytes", "_anchor")

    def __init__(self, mtl, length: int):
        self.mtl, self.length = mtl, length
        # contents() is the CPU address of a shared buffer's storage; PyObjC hands it as a
        # pointer object whose as_buffer(n) is a read-write memoryview of n bytes there.
        self._bytes = mtl.contents().as_buffer(length)
        self._anchor = (ctypes.c_char * length).from_buffer(self._bytes)
        self.address = ctypes.addressof(self._anchor)

    @property
    def __array_interface__(self):
        return {"shape": (self.length,), "typestr": "|u1", "data": (self.address, False),
                "version": 3}

    def __del__(self):
        try:
            _release(self.mtl, self.length)
        except Exception:  # interpreter shutdown: the module's globals may be gone
            pass


def _release(mtl, length: int) -> None:
    with _pool_lock:
        _pool.setdefault(length, []).append(mtl)
        _memory["active"] -= length
        _memory["cache"] += length


def _allocate(nbytes: int) -> SharedBuffer:
    length = max(_ALIGN, -(-nbytes // _ALIGN) * _ALIGN)
    with _pool_lock:
        free = _pool.get(length)
        mtl = free.pop() if free else None
        if mtl is not None:
            _memory["cache"] -= length
    if mtl is None:
        Metal, device, _ = _get_context()
        mtl = device.newBufferWithLength_options_(length, Metal.MTLResourceStorageModeShared)
        if mtl is None:
            raise OutOfMemoryError(f"Metal could not allocate a shared buffer of {length} bytes "
                                   f"({_memory['active']} bytes are in use by arrays, "
                                   f"{_memory['cache']} cached); free arrays or call "
                                   f"mx.clear_cache().")
    with _pool_lock:
        _memory["active"] += length
        _memory["peak"] = max(_memory["peak"], _memory["active"])
    return SharedBuffer(mtl, length)


def empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array of ``shape`` and ``dtype`` in a shared
    ``MTLBuffer`` (a NumPy view of its memory, no copy); a plain ``np.empty`` while the
    shim is emulating the GPU."""
    if _emulated:
        return np.empty(shape, dtype)
    dtype = np.dtype(dtype)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(n) for n in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return np.asarray(_allocate(nbytes))[:nbytes].view(dtype).reshape(shape)


def shared_buffer_of(a):
    """The :class:`SharedBuffer` whose memory ``a`` (a NumPy array) views, or None."""
    b = a.base
    while True:
        kind = type(b)
        if kind is np.ndarray:
            b = b.base
        elif kind is memoryview:  # np.asarray(lazyx array) goes through its buffer protocol
            b = b.obj
        else:
            return b if kind is SharedBuffer else None


def memory_stats() -> dict:
    """Bytes in shared buffers that arrays hold (``active``, its ``peak``) and in the
    pool (``cache``)."""
    return dict(_memory)


def reset_peak_memory() -> None:
    """Set the peak to 0 (as MLX does); it grows again from the next allocation."""
    _memory["peak"] = 0


def clear_cache() -> None:
    """Release the pooled buffers (their memory goes back to Metal)."""
    with _pool_lock:
        _pool.clear()
        _memory["cache"] = 0


def _size(Metal, sizes: tuple):
    """An ``MTLSize`` of three sizes (width, height, depth)."""
    make = getattr(Metal, "MTLSizeMake", None)
    return make(*sizes) if make is not None else Metal.MTLSize(*sizes)


def _span(a: np.ndarray) -> tuple[bytes, int]:
    """The bytes of ``a`` from its lowest to its highest element address, and the offset
    of its first element among them (views with negative strides start past 0)."""
    if a.size == 0:
        return b"\0" * 4, 0
    low = sum((n - 1) * s for n, s in zip(a.shape, a.strides) if s < 0)
    high = sum((n - 1) * s for n, s in zip(a.shape, a.strides) if s > 0) + a.itemsize
    return ctypes.string_at(a.ctypes.data + low, high - low), -low


def run(kernel, primitive, inputs):
    """Run ``kernel`` for ``primitive`` on NumPy ``inputs`` on the GPU; returns a NumPy array."""
    ok, reason = availability()
    if not ok:
        raise BackendError(f"Cannot run {kernel.label} on Metal: {reason}")
    return execute(kernel, plan_for_primitive(kernel, primitive, inputs))


def execute(kernel, launch):
    """Run a planned launch of ``kernel`` (an object with ``source`` and ``label``): bind
    ``launch.buffers[i]`` to ``[[buffer(i)]]``, dispatch ``launch.grid`` threads, wait,
    and copy the buffers it writes (``launch.written()``) back. Returns ``launch.output``."""
    if launch.grid == 0:
        return launch.output
    if _emulated:
        from . import msl_cpu  # the C++ toolchain: only when emulating
        return msl_cpu.launch_on_cpu(kernel, launch)
    _encode_and_wait(kernel, launch.function, launch.buffers, launch.written(),
                     (launch.grid, 1, 1), None, ())
    return launch.output


def dispatch(d) -> None:
    """Run one :class:`~lazyx.backends.metal.kernels.Dispatch` of a built-in kernel (the
    ``run`` the backend hands the launchers of :data:`lazyx.backends.metal.kernels.KERNELS`):
    Metal's ``dispatchThreads(d.grid, d.threadgroup)`` of function ``d.function`` of
    ``d.library``, ``d.buffers[n]`` bound to ``[[buffer(n)]]``, threadgroup memory of
    ``d.threadgroup_memory[n]`` bytes at ``[[threadgroup(n)]]``; waits, and copies the
    buffers ``d.writes`` names back into their NumPy arrays. Emulated: the same dispatch
    through the shim (:func:`lazyx.backends.metal.msl_cpu.dispatch_on_cpu`)."""
    if 0 in tuple(d.grid):
        return
    if _emulated:
        from . import msl_cpu  # the C++ toolchain: only when emulating
        msl_cpu.dispatch_on_cpu(d.library, d.function, d.buffers, d.grid, d.threadgroup,
                                threadgroup_memory=d.threadgroup_memory)
        return
    _encode_and_wait(d.library, d.function, d.buffers, [d.buffers[i] for i in d.writes],
                     _three(d.grid), _three(d.threadgroup), tuple(d.threadgroup_memory))


#: The built-in kernels' launchers allocate their outputs through their ``run``'s
#: ``empty`` (``kernels.common.empty``): shared buffers on the GPU.
dispatch.empty = empty

def _three(sizes) -> tuple:
    """Up to three sizes as (width, height, depth)."""
    sizes = (sizes,) if isinstance(sizes, (int, np.integer)) else tuple(sizes)
    return tuple(int(n) for n in sizes) + (1,) * (3 - len(sizes))


def _encode_and_wait(kernel, function: str, buffers, written, grid: tuple, threadgroup,
                     threadgroup_memory: tuple) -> None:
    """One compute command on the GPU: bind, dispatch, commit, wait, copy back (only the
    written buffers that did not live in a shared ``MTLBuffer`` already).

    ``grid`` counts threads per dimension; ``threadgroup`` is the threads per threadgroup
    (None: as many along x as the pipeline allows, up to the grid's width). **Untested
    on hardware** (written from Apple's Metal documentation, see the module docstring).
    """
    Metal, device, queue = _get_context()
    pipeline = _pipeline(kernel, function)
    # A pipeline's own limit can be below the device's 1024 (registers, threadgroup
    # memory): a kernel written for a larger threadgroup must not run with a smaller one.
    limit = int(pipeline.maxTotalThreadsPerThreadgroup())
    if threadgroup is None:
        threadgroup = (min(limit, grid[0]), 1, 1)
    elif threadgroup[0] * threadgroup[1] * threadgroup[2] > limit:
        raise BackendError(f"{kernel.label} ({function}) needs threadgroups of {threadgroup} "
                           f"threads; this GPU's pipeline for it allows {limit}.")
    shared = Metal.MTLResourceStorageModeShared
    # One command buffer per launch, one compute encoder in it (MTLCommandBuffer,
    # computeCommandEncoder); the pipeline state selects the kernel function.
    commands = queue.commandBuffer()
    encoder = commands.computeCommandEncoder()
    encoder.setComputePipelineState_(pipeline)
    keep, copies = [], []
    for index, a in enumerate(buffers):
        owner = shared_buffer_of(a) if type(a) is np.ndarray else None
        if owner is not None:
            # Already in a shared MTLBuffer (another kernel's output): bind that buffer at
            # the view's first element, read or written in place, nothing copied. Metal
            # wants buffer offsets aligned to 4 bytes; a view that is not (a float16 slice
            # at an odd element) is copied as below.
            offset = a.ctypes.data - owner.address
            if offset % 4 == 0:
                encoder.setBuffer_offset_atIndex_(owner.mtl, offset, index)
                keep.append(owner)
                continue
        if any(a is w for w in written):
            # Written arrays are C-contiguous: a buffer of their size holding their current
            # bytes (a scatter's copy of its input, a concatenation's earlier blocks, an
            # error flag's zero are read before they are written), read back below.
            buf = device.newBufferWithBytes_length_options_(a.tobytes() or b"\0" * 4,
                                                            max(a.nbytes, 4), shared)
            copies.append((buf, a))
            offset = 0
        else:
            data, offset = _span(a)
            if offset == 0 and len(data) <= _SET_BYTES_LIMIT:  # constants, layouts, small inputs
                # setBytes: Metal copies up to 4 KB into the command itself, no MTLBuffer.
                encoder.setBytes_length_atIndex_(data, len(data), index)
                continue
            buf = device.newBufferWithBytes_length_options_(data, len(data), shared)
        # A view with negative strides is bound at its first element's offset in the
        # buffer: the kernel's negative indices reach the bytes before it.
        encoder.setBuffer_offset_atIndex_(buf, offset, index)
        keep.append(buf)
    for index, length in enumerate(threadgroup_memory):
        # setThreadgroupMemoryLength:atIndex: sizes the [[threadgroup(index)]] argument;
        # Metal requires a multiple of 16 bytes. Statically sized `threadgroup` arrays
        # declared inside a kernel need no call (the built-in kernels' are such).
        if length:
            encoder.setThreadgroupMemoryLength_atIndex_(-(-int(length) // 16) * 16, index)
    # dispatchThreads:threadsPerThreadgroup: runs exactly `grid` threads; Metal clips
    # the threadgroups at the grid's edges (non-uniform threadgroups, Apple GPUs).
    encoder.dispatchThreads_threadsPerThreadgroup_(_size(Metal, grid), _size(Metal, threadgroup))
    encoder.endEncoding()
    commands.commit()
    commands.waitUntilCompleted()
    if commands.error() is not None:
        raise BackendError(f"{kernel.label} ({function}) failed on the GPU: "
                           f"{_describe(commands.error())}")
    for buf, a in copies:
        # contents() is the shared buffer's CPU address: copy the kernel's output out.
        raw = buf.contents().as_buffer(a.nbytes)
        a.reshape(-1).view(np.uint8)[:] = np.frombuffer(raw, np.uint8)
    del keep
