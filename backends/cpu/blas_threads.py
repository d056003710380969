"""OpenBLAS's worker threads in lazyx's subnormal mode (see ``lazyx.denormals``).

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
left alone.
"""

from __future__ import annotations

import ctypes

_done: dict = {}  # library path -> the mode its workers were started in
_libraries: list | None = None


def _openblas_libraries() -> list:
    """The loaded pthreads OpenBLAS libraries (looked up once: a scan of the process)."""
    global _libraries
    if _libraries is None:
        import threadpoolctl  # the loaded BLAS libraries: on first use
        _libraries = [info["filepath"] for info in threadpoolctl.threadpool_info()
                      if info.get("internal_api") == "openblas"
                      and info.get("threading_layer") == "pthreads"]
    return _libraries


def follow(native, flush: bool) -> None:
    """Restart the worker threads of every loaded pthreads OpenBLAS so that they
    flush subnormals (``flush``) or compute them, as lazyx's kernels do."""
    for path in _openblas_libraries():
        if _done.get(path) is flush:
            continue
        try:
            lib = ctypes.CDLL(path)
            shutdown, init = lib.blas_thread_shutdown_, lib.blas_thread_init
        except (OSError, AttributeError):
            _done[path] = flush
            continue
        shutdown.restype = ctypes.c_int
        shutdown()
        native.call_in_fp_mode(ctypes.cast(init, ctypes.c_void_p).value, flush)
        _done[path] = flush
