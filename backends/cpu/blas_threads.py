"""OpenBLAS's threads: lazyx's own pool runs its jobs, or its workers follow lazyx's
subnormal mode (see ``lazyx.denormals``).

**One pool.** OpenBLAS (0.3.27 and later) lets its caller run the jobs of a threaded
call (``openblas_set_threads_callback_function``). :func:`use_pool` hands them to the
native module's thread pool, the one that runs lazyx's generated kernels: a product's
jobs run on the evaluating thread and the pool's helpers, in the evaluating thread's
floating-point mode, and the helpers spin for lazyx's next kernel afterwards. Without
it, two sets of threads share the cores: OpenBLAS's idle workers spin after every
product while lazyx's kernels run, and the fused Adam update that follows a product in
the compiled MLP step took 480 µs instead of 70 (2 cores). The callback is set in every
loaded OpenBLAS that has it, so NumPy's own products in the process run on the pool
too. ``LAZYX_BLAS_THREADS=openblas`` keeps OpenBLAS's workers (then :func:`follow`).

**Otherwise.**

The floating-point control register (MXCSR, FPCR) belongs to each thread. A matmul
runs on the evaluating thread, whose register the cpu backend sets for the
evaluation, and on OpenBLAS's own worker threads, which keep the register they were
started with: NumPy's OpenBLAS is not built with ``CONSISTENT_FPCSR`` (measured: with
flushing on, the worker's half of a 256x512 @ 512x512 product kept its subnormals,
and on Intel CPUs would run at the subnormal speed). A thread starts with its creator's register, so
:func:`follow` stops OpenBLAS's workers (``blas_thread_shutdown_``) and starts them
again (``blas_thread_init``) from a call made in the wanted mode.

The workers keep that mode for NumPy's own BLAS calls outside lazyx too, while the
switch is on: the share of a NumPy product computed there flushes. Libraries found
through threadpoolctl; one that lacks the two functions (an OpenMP build, MKL) is
left alone. The restarted workers spin for a shorter time when idle (:data:`SPIN`,
unless ``OPENBLAS_THREAD_TIMEOUT`` is set), so that they leave the cores to lazyx's own
kernel threads between products.
"""

from __future__ import annotations

import ctypes
import os

from lazyx.environment import read_variable

_done: dict = {}  # library path -> the mode its workers were started in
_info: list | None = None  # threadpoolctl's scan of the loaded BLAS libraries, once
#: Whether every loaded OpenBLAS runs its threaded calls on lazyx's pool (:func:`use_pool`).
on_pool = False
_pooled: set = set()  # library paths whose callback is lazyx's


def _openblas_libraries(pthreads: bool = True) -> list:
    """The loaded OpenBLAS libraries (those with pthreads workers only, by default)."""
    return [info["filepath"] for info in _threadpool_info()
            if info.get("internal_api") == "openblas"
            and (not pthreads or info.get("threading_layer") == "pthreads")]


def _setter(lib):
    """``openblas_set_threads_callback_function`` of ``lib`` under the names OpenBLAS's
    builds give it (NumPy's and SciPy's wheels prefix ``scipy_``, 64-bit ones suffix
    ``64_``), or None."""
    for prefix in ("", "scipy_"):
        for suffix in ("", "64_", "_64"):
            fn = getattr(lib, f"{prefix}openblas_set_threads_callback_function{suffix}", None)
            if fn is not None:
                return fn
    return None


def use_pool(native) -> bool:
    """Run the threaded calls of every loaded OpenBLAS on the native module's pool
    (unless ``LAZYX_BLAS_THREADS=openblas``); whether all of them do. Called once, when
    the CPU backend loads its kernels; a library loaded later keeps its own threads."""
    global on_pool
    if native is None or read_variable("LAZYX_BLAS_THREADS") == "openblas" or \
            not hasattr(native, "blas_threads_callback"):
        return False
    callback = native.blas_threads_callback()
    libraries = _openblas_libraries(pthreads=False)
    for path in libraries:
        if path in _pooled:
            continue
        try:
            setter = _setter(ctypes.CDLL(path))
        except OSError:
            setter = None
        if setter is None:
            continue
        setter.restype = None
        setter.argtypes = [ctypes.c_void_p]
        setter(callback)
        _pooled.add(path)
    on_pool = bool(libraries) and all(p in _pooled for p in libraries)
    return on_pool


def _threadpool_info() -> list:
    """threadpoolctl's list of the loaded BLAS libraries: one scan of the process, the
    first time lazyx needs it (when the CPU backend loads its kernels)."""
    global _info
    if _info is None:
        from . import blas  # lazyx's own OpenBLAS, where it loads one, is among them
        blas.load()
        import threadpoolctl  # the loaded BLAS libraries: on first use
        _info = threadpoolctl.threadpool_info()
    return _info


def follow(native, flush: bool) -> None:
    """Restart the worker threads of every loaded pthreads OpenBLAS so that they
    flush subnormals (``flush``) or compute them, as lazyx's kernels do. A library
    whose calls run on lazyx's pool (:func:`use_pool`) needs none: its jobs run in the
    evaluating thread's mode."""
    for path in _openblas_libraries():
        if _done.get(path) is flush or path in _pooled:
            continue
        try:
            lib = ctypes.CDLL(path)
            shutdown, init = lib.blas_thread_shutdown_, lib.blas_thread_init
        except (OSError, AttributeError):
            _done[path] = flush
            continue
        shutdown.restype = ctypes.c_int
        shutdown()
        _short_spin(lib)
        native.call_in_fp_mode(ctypes.cast(init, ctypes.c_void_p).value, flush)
        _done[path] = flush


#: How long an idle OpenBLAS worker spins before it sleeps (``OPENBLAS_THREAD_TIMEOUT``:
#: 2**20 cycles, ~0.3 ms, where OpenBLAS's default is 2**28, ~0.1 s).
SPIN = "20"


def _short_spin(lib) -> None:
    """Make the workers that ``blas_thread_init`` starts next sleep sooner after a product.

    An idle OpenBLAS worker spins for 2**28 cycles (about 0.1 s) before it sleeps, and on
    a machine with as many cores as threads it takes a core from lazyx's own kernel
    threads that run next (attention, norms, fused element-wise code). Sleeping at once
    (2**4) costs the products a wake-up each. 2**20 keeps the workers hot through a
    training step's chain of products and lets them sleep during longer kernels:
    interleaved in one process on 2 cores (two runs), the compiled MLP step took 5.44 and
    5.25 ms against 5.64 and 5.43 with the default spin (5.71 and 5.44 sleeping at once),
    the compiled transformer block's forward and backward 33.4 and 33.5 ms against 34.8
    and 33.8. OpenBLAS reads ``OPENBLAS_THREAD_TIMEOUT`` when it loads and when
    ``openblas_read_env`` is called; it is set for that call only (and restored), unless
    the user set it, whose value then stands."""
    if "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        return
    read = getattr(lib, "openblas_read_env", None)
    if read is None:
        return
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = SPIN
    try:
        read()
    finally:
        del os.environ["OPENBLAS_THREAD_TIMEOUT"]
