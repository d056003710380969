"""lazyx's own OpenBLAS for large float32 and float64 products, where it is faster.

NumPy's OpenBLAS picks its kernels by the CPU at load time. On AMD's Zen 4 (x86 family
25 with AVX-512) it picks its SkylakeX kernels, whose 512-bit operations Zen 4 runs in
two halves; its Haswell (AVX2) kernels are faster there. Measured on a 2-core Zen 4
(the best of 7 rounds of 5 calls, NumPy's library under each ``OPENBLAS_CORETYPE``):

====================================  ========  =======
product (float32)                     SkylakeX  Haswell
====================================  ========  =======
256x784 @ (512x784).T (MLP forward)   1068 µs   983 µs
256x512 @ (512x512).T                 741 µs    662 µs
(256x512).T @ 256x512 (a gradient)    687 µs    644 µs
1024x1024 @ 1024x1024                 10.49 ms  9.88 ms
====================================  ========  =======

that is 205 against 218 GFLOP/s on square products, of the two cores' 231 (an FMA
loop). The library cannot switch after loading, and NumPy has loaded it before lazyx
can say anything. So lazyx loads a second OpenBLAS, the ``scipy-openblas32`` wheel
(the build NumPy and SciPy ship, under other symbol names), with the kernels the CPU
runs best (``OPENBLAS_CORETYPE`` set for its load only, unless the user set it), and
calls its ``cblas_sgemm``/``cblas_dgemm`` for products of at least :data:`MIN_WORK`
multiply-adds. Its threaded calls run on lazyx's pool like NumPy's
(``blas_threads.use_pool``: its scan of the loaded libraries loads this one first), in the evaluating
thread's floating-point mode, and its own idle workers sleep at once
(:data:`WORKER_SPIN`). With ``LAZYX_BLAS_THREADS=openblas`` it is not loaded:
the wheel hides the functions that restart OpenBLAS's own workers in lazyx's
subnormal mode (``blas_threads.follow``).

``LAZYX_BLAS`` chooses: ``auto`` (the default: lazyx's library where a CPU has better
kernels than the ones OpenBLAS picks, :data:`CORES`), ``numpy`` (NumPy's products
always) or ``own`` (lazyx's library always, with the kernels OpenBLAS picks unless
``OPENBLAS_CORETYPE`` says). Without the wheel, NumPy's products run.
"""

from __future__ import annotations

import ctypes
import os
import sys

import numpy as np

from lazyx.environment import read_variable

#: Products of at least this many multiply-adds (m * n * k) run on lazyx's library;
#: below, NumPy's call costs less than the ctypes call (~3 µs) can gain.
MIN_WORK = 1 << 21

#: (vendor, x86 family, a CPU flag it must have) -> the OpenBLAS core type whose
#: kernels run faster there than those OpenBLAS picks (see the module docstring).
CORES = {("AuthenticAMD", 25, "avx512f"): "Haswell"}

_ROW_MAJOR, _N, _T = 101, 111, 112
_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
#: The dtypes whose products the library runs (``gemm``'s operands).
DTYPES = frozenset((_F32, _F64))


class OwnBlas:
    """lazyx's loaded OpenBLAS: ``gemm(a, b)`` and the kernels it runs (``core``)."""

    def __init__(self, lib, core: str):
        self.lib = lib
        self.core = core
        args = [ctypes.c_int] * 6
        self._gemm = {}
        for d, name, scalar in ((_F32, "scipy_cblas_sgemm", ctypes.c_float),
                                (_F64, "scipy_cblas_dgemm", ctypes.c_double)):
            fn = getattr(lib, name)
            fn.restype = None
            fn.argtypes = args + [scalar, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                  ctypes.c_int, scalar, ctypes.c_void_p, ctypes.c_int]
            self._gemm[d] = fn

    def gemm(self, a, b):
        """``a @ b`` for 2-D float32 or float64 NumPy arrays of one dtype (C-contiguous
        result); each operand is read in place when its rows or its columns are
        contiguous with a whole-element stride, else copied first."""
        m, k = a.shape
        n = b.shape[1]
        out = np.empty((m, n), a.dtype)
        if m == 0 or n == 0:
            return out
        if k == 0:
            out.fill(0)
            return out
        a, ta, lda = _operand(a)
        b, tb, ldb = _operand(b)
        self._gemm[a.dtype](_ROW_MAJOR, ta, tb, m, n, k, 1.0, a.ctypes.data, lda,
                            b.ctypes.data, ldb, 0.0, out.ctypes.data, max(1, n))
        return out


def _operand(x):
    """``(x, transpose flag, leading dimension)`` of a row-major BLAS operand: ``x`` as
    it is when its rows (``N``) or its columns (``T``) are contiguous, else a C copy."""
    rows, cols = x.shape
    item = x.itemsize
    s0, s1 = x.strides
    if x.flags.aligned:
        if (s1 == item or cols == 1) and (rows == 1 or (s0 % item == 0 and s0 // item >= cols)):
            return x, _N, max(1, cols) if rows == 1 else s0 // item
        if (s0 == item or rows == 1) and (cols == 1 or (s1 % item == 0 and s1 // item >= rows)):
            return x, _T, max(1, rows) if cols == 1 else s1 // item
    return np.ascontiguousarray(x), _N, max(1, cols)


def core_for(cpuinfo: str) -> str | None:
    """The core type :data:`CORES` names for the CPU that ``/proc/cpuinfo``'s text
    describes (its first processor), or None."""
    fields = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())
    try:
        family = int(fields.get("cpu family", ""))
    except ValueError:
        return None
    for (vendor, fam, flag), core in CORES.items():
        if fields.get("vendor_id") == vendor and family == fam and flag in flags:
            return core
    return None


def _cpu_core() -> str | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/cpuinfo") as f:
            return core_for(f.read())
    except OSError:
        return None


_loaded: list = []  # [OwnBlas or None], once


def load() -> OwnBlas | None:
    """lazyx's OpenBLAS as ``LAZYX_BLAS`` says (loaded once), or None: NumPy's serves."""
    if not _loaded:
        _loaded.append(_load_for(read_variable("LAZYX_BLAS") or "auto"))
    return _loaded[0]


def _load_for(choice: str) -> OwnBlas | None:
    if choice == "numpy" or read_variable("LAZYX_BLAS_THREADS") == "openblas":
        return None
    core = _cpu_core()
    if choice != "own" and core is None:
        return None
    return open_library(core)


#: ``OPENBLAS_THREAD_TIMEOUT`` for the library's load (2**4 cycles: its idle workers sleep
#: at once). Its threaded calls run on lazyx's pool, so its own workers have nothing to
#: do; with OpenBLAS's default (2**28 cycles) they spun and took the pool helper's core:
#: 66 of 200 products of 256x784 @ (512x784).T stalled (p90 5 ms, max 25 ms, against
#: a median of 1.0 ms), 2 of 200 (max 1.9 ms) with this.
WORKER_SPIN = "4"


def open_library(core: str | None) -> OwnBlas | None:
    """Load the ``scipy-openblas32`` wheel's library with core type ``core`` (None: the
    one OpenBLAS picks) and idle workers that sleep at once (:data:`WORKER_SPIN`), or
    None when the wheel is missing. A user's ``OPENBLAS_CORETYPE`` or
    ``OPENBLAS_THREAD_TIMEOUT`` stands; the variables are set for the load only. A
    library already loaded keeps what it read."""
    set_core = core is not None and "OPENBLAS_CORETYPE" not in os.environ
    set_spin = "OPENBLAS_THREAD_TIMEOUT" not in os.environ
    if set_core:
        os.environ["OPENBLAS_CORETYPE"] = core
    if set_spin:
        os.environ["OPENBLAS_THREAD_TIMEOUT"] = WORKER_SPIN
    try:
        import scipy_openblas32  # loads the library (the variables read at its load)
        lib = scipy_openblas32.dll
    except (ImportError, OSError, AttributeError):
        return None
    finally:
        if set_core:
            del os.environ["OPENBLAS_CORETYPE"]
        if set_spin:
            del os.environ["OPENBLAS_THREAD_TIMEOUT"]
    if lib is None:
        return None
    name = getattr(lib, "scipy_openblas_get_corename", None)
    picked = ""
    if name is not None:
        name.restype = ctypes.c_char_p
        picked = (name() or b"").decode()
    try:
        return OwnBlas(lib, picked)
    except AttributeError:
        return None
