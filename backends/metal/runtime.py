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

Two entry points touch the GPU, both through :func:`_encode`:
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
their outputs here too (``dispatch.empty``, through ``kernels.common.empty``), and so do
plugins' :class:`MetalKernel` launches (:func:`run` plans them with :func:`empty`).

**Batched, waited for at a read.** An evaluation's launches go into one command buffer
(one compute encoder per launch; :func:`begin_batch` / :func:`end_batch` from the
backend's ``enter_eval`` / ``exit_eval``), committed when the evaluation ends and not
waited for: the host goes on building the next graph while the GPU runs. The first read
waits (:func:`wait_all`): ``lazyx.backend.host_fences`` holds this module's fence, which
a read of an array (``np.asarray``, ``item``, printing), a CPU kernel (a node on the CPU
stream, the backend's CPU fallbacks), ``synchronize`` and the memory figures run first.
A launch whose written buffer lives outside a shared ``MTLBuffer`` (the launcher reads
it on the host next: an indexing kernel's bounds flag) commits and waits at once, as
does any launch outside an evaluation. Command buffers of one queue run in the order
they are committed, and encoders in a command buffer in the order they were encoded, so
a pooled buffer handed to a later launch is written only after the earlier ones read it.

**Emulation.** :func:`set_emulation` replaces the GPU by the CPU shim: the backend
reports itself available and :func:`execute` and :func:`dispatch` run the MSL
through :mod:`lazyx.backends.metal.msl_cpu`, on plain NumPy arrays. Everything above this
module (kernel choice, planning, argument packing) then runs as on a Mac, which is how
the tests check the Metal backend on Linux (``lazyx.backends.metal.emulate_on_cpu``).
"""

from __future__ import annotations

import ctypes
import functools
import platform
import sys
import threading
import weakref

import numpy as np

from lazyx import backend as _framework
from lazyx.errors import BackendError, KernelCompileError, OutOfMemoryError

from . import launch as _launch
from .launch import plan_for_primitive

__all__ = ["availability", "run", "execute", "dispatch", "MetalCompileError", "set_emulation",
           "emulating", "empty", "SharedBuffer", "shared_buffer_of", "memory_stats",
           "reset_peak_memory", "clear_cache", "begin_batch", "end_batch", "wait_all", "pending"]

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


# -- command batching: one command buffer per evaluation, waited for at a read ------------
class _Batch:
    """A command buffer being encoded or running: the buffers it binds (kept alive until
    it completes), the written NumPy arrays to copy its results into, the launches'
    names (for an error)."""

    __slots__ = ("commands", "keep", "copies", "labels", "outputs")

    def __init__(self, commands):
        self.commands, self.keep, self.copies, self.labels = commands, [], [], []
        self.outputs = []  # the shared buffers its launches write in place


def _serialised(fn):
    """``fn`` under the batch's lock: evaluations on several threads share the open
    command buffer, and a command buffer is not safe to encode into from two at once."""
    @functools.wraps(fn)
    def locked(*args, **kwargs):
        with _batch_lock:
            return fn(*args, **kwargs)
    return locked


_batch_lock = threading.RLock()
_batch = {"depth": 0, "open": None}  # evaluations entered; the command buffer encoding
_inflight: list = []                 # committed command buffers, not yet waited for
_fence_installed = [False]
#: Shared buffers a failed command buffer was to write: a read of an array in one raises
#: its error (every time: the bytes are not the results).
_failed = weakref.WeakKeyDictionary()


@_serialised
def begin_batch() -> None:
    """An evaluation starts (the backend's ``enter_eval``): its launches go into one
    command buffer."""
    _batch["depth"] += 1


@_serialised
def end_batch() -> None:
    """An evaluation ends (``exit_eval``): its command buffer is committed, not waited
    for; the first read of a result waits (:func:`wait_all`)."""
    _batch["depth"] -= 1
    if _batch["depth"] <= 0:
        _batch["depth"] = 0
        _commit()


def _commit() -> None:
    batch, _batch["open"] = _batch["open"], None
    if batch is not None:
        batch.commands.commit()
        _inflight.append(batch)


def discard_pending() -> None:
    """Forget the work encoded and in flight without waiting (tests that replace the Metal
    objects between them; a real queue finishes its work regardless)."""
    _batch["depth"], _batch["open"] = 0, None
    _inflight.clear()


def pending() -> bool:
    """Whether GPU work was encoded or committed and not yet waited for."""
    return bool(_inflight) or _batch["open"] is not None


def _writes_queued(owner) -> bool:
    """Whether work encoded or committed and not yet waited for writes shared buffer
    ``owner``."""
    open_ = _batch["open"]
    return any(owner in b.outputs for b in (_inflight if open_ is None else _inflight + [open_]))


@_serialised
def wait_all() -> None:
    """Commit what is encoded and wait for every command buffer in flight, in order;
    copy results that live outside shared buffers back; raise the first GPU error."""
    _commit()
    error = None
    while _inflight:
        batch = _inflight.pop(0)
        commands = batch.commands
        commands.waitUntilCompleted()
        if commands.error() is not None:
            failure = BackendError(
                f"{', '.join(batch.labels)} failed on the GPU: {_describe(commands.error())}")
            for owner in batch.outputs:
                _failed[owner] = failure
            error = error or failure
            continue
        for buf, a in batch.copies:
            # contents() is the shared buffer's CPU address: copy the kernel's output out.
            raw = buf.contents().as_buffer(a.nbytes)
            a.reshape(-1).view(np.uint8)[:] = np.frombuffer(raw, np.uint8)
    if error is not None:
        raise error


def settle(a) -> None:
    """Wait for the queued GPU work that writes ``a``'s memory, if any (before the host
    copies or converts ``a``: :func:`lazyx.backends.metal.launch.host_array`)."""
    if pending() and type(a) is np.ndarray:
        owner = shared_buffer_of(a)
        if owner is not None and _writes_queued(owner):
            wait_all()


def _fence(buf=None) -> None:
    if _inflight or _batch["open"] is not None:
        wait_all()
    if _failed and type(buf) is np.ndarray:
        owner = shared_buffer_of(buf)
        failure = _failed.get(owner) if owner is not None else None
        if failure is not None:
            raise failure


def _install_fence() -> None:
    """Host code reads shared buffers directly (unified memory): the first GPU launch
    registers :func:`wait_all` as a host fence (``lazyx.backend.host_fences``) that a read
    of an array and a CPU kernel run first; a read of an array a failed command buffer
    was to write raises that failure."""
    if not _fence_installed[0]:
        _framework.host_fences.append(_fence)
        _launch.settle = settle
        _fence_installed[0] = True


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
    view dies the ``MTLBuffer`` goes back to the pool (GPU work encoded since then runs
    after the launches that used it: see the module docstring)."""

    __slots__ = ("mtl", "length", "address", "_bytes", "_anchor", "__weakref__")

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
    return execute(kernel, plan_for_primitive(kernel, primitive, inputs, empty))


def execute(kernel, launch):
    """Run a planned launch of ``kernel`` (an object with ``source`` and ``label``): bind
    ``launch.buffers[i]`` to ``[[buffer(i)]]``, dispatch ``launch.grid`` threads (in the
    evaluation's command buffer, see :func:`_encode`); the buffers it writes
    (``launch.written()``) hold the results once the work is waited for. Returns
    ``launch.output``."""
    if launch.grid == 0:
        return launch.output
    if _emulated:
        from . import msl_cpu  # the C++ toolchain: only when emulating
        return msl_cpu.launch_on_cpu(kernel, launch)
    _encode(kernel, launch.function, launch.buffers, launch.written(), (launch.grid, 1, 1),
            None, ())
    return launch.output


def dispatch(d) -> None:
    """Run one :class:`~lazyx.backends.metal.kernels.Dispatch` of a built-in kernel (the
    ``run`` the backend hands the launchers of :data:`lazyx.backends.metal.kernels.KERNELS`):
    Metal's ``dispatchThreads(d.grid, d.threadgroup)`` of function ``d.function`` of
    ``d.library``, ``d.buffers[n]`` bound to ``[[buffer(n)]]``, threadgroup memory of
    ``d.threadgroup_memory[n]`` bytes at ``[[threadgroup(n)]]``, in the evaluation's command
    buffer (:func:`_encode`); the buffers ``d.writes`` names that live outside shared
    memory are waited for and copied back at once. Emulated: the same dispatch
    through the shim (:func:`lazyx.backends.metal.msl_cpu.dispatch_on_cpu`)."""
    if 0 in tuple(d.grid):
        return
    if _emulated:
        from . import msl_cpu  # the C++ toolchain: only when emulating
        msl_cpu.dispatch_on_cpu(d.library, d.function, d.buffers, d.grid, d.threadgroup,
                                threadgroup_memory=d.threadgroup_memory)
        return
    _encode(d.library, d.function, d.buffers, [d.buffers[i] for i in d.writes], _three(d.grid),
            _three(d.threadgroup), tuple(d.threadgroup_memory))


#: The built-in kernels' launchers allocate their outputs through their ``run``'s
#: ``empty`` (``kernels.common.empty``): shared buffers on the GPU.
dispatch.empty = empty

def _three(sizes) -> tuple:
    """Up to three sizes as (width, height, depth)."""
    sizes = (sizes,) if isinstance(sizes, (int, np.integer)) else tuple(sizes)
    return tuple(int(n) for n in sizes) + (1,) * (3 - len(sizes))


@_serialised
def _encode(kernel, function: str, buffers, written, grid: tuple, threadgroup,
            threadgroup_memory: tuple) -> None:
    """One compute command on the GPU: bind, dispatch, and leave it in the evaluation's
    command buffer (:func:`begin_batch`), committed when the evaluation ends and waited
    for at the first read (:func:`wait_all`). Outside an evaluation, and when a written
    buffer does not live in a shared ``MTLBuffer`` (it is copied back after completion:
    the launcher reads it next, as an indexing kernel's bounds flag), the work queued so
    far is committed and waited for at once.

    ``grid`` counts threads per dimension; ``threadgroup`` is the threads per threadgroup
    (None: as many along x as the pipeline allows, up to the grid's width). **Untested
    on hardware** (written from Apple's Metal documentation, see the module docstring).
    """
    Metal, device, queue = _get_context()
    pipeline = _pipeline(kernel, function)
    # A view of a shared buffer at an offset Metal cannot bind is copied below, on the
    # host: the queued work that writes it finishes first (before this launch's encoder
    # opens in the command buffer that is committed then).
    for a in buffers:
        if type(a) is np.ndarray and pending():
            owner = shared_buffer_of(a)
            if owner is not None and (a.ctypes.data - owner.address) % 4 and _writes_queued(owner):
                wait_all()
                break
    # A pipeline's own limit can be below the device's 1024 (registers, threadgroup
    # memory): a kernel written for a larger threadgroup must not run with a smaller one.
    limit = int(pipeline.maxTotalThreadsPerThreadgroup())
    if threadgroup is None:
        threadgroup = (min(limit, grid[0]), 1, 1)
    elif threadgroup[0] * threadgroup[1] * threadgroup[2] > limit:
        raise BackendError(f"{kernel.label} ({function}) needs threadgroups of {threadgroup} "
                           f"threads; this GPU's pipeline for it allows {limit}.")
    shared = Metal.MTLResourceStorageModeShared
    # The evaluation's command buffer (MTLCommandBuffer), one compute encoder per launch
    # in it: encoders of a command buffer run in order, each seeing the writes of the
    # ones before (the queue tracks hazards on its buffers); the pipeline state selects
    # the kernel function.
    batch = _batch["open"]
    if batch is None:
        batch = _batch["open"] = _Batch(queue.commandBuffer())
    commands = batch.commands
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
                if any(a is w for w in written):
                    batch.outputs.append(owner)
                continue
        if any(a is w for w in written):
            # Written arrays are C-contiguous: a buffer of their size holding their current
            # bytes (a scatter's copy of its input, a concatenation's earlier blocks, an
            # error flag's zero are read before they are written), read back after the
            # wait. An array bound at several indices (an indexing kernel's error flag
            # also fills its unused slots) is one buffer, read back once.
            buf = next((b for b, w in copies if w is a), None)
            if buf is None:
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
    batch.keep += keep
    batch.copies += copies
    batch.labels.append(f"{kernel.label} ({function})")
    _install_fence()
    if not _batch["depth"] or copies:
        wait_all()
