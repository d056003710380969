"""Matrix products through cuBLAS directly (ctypes), so that they can be captured.

CuPy refuses every cuBLAS call while a stream is being captured into a CUDA graph
(``cupy_backends.cuda.libs.cublas.setStream`` raises ``NotImplementedError``), which
would keep every model with a matmul out of backends/cuda/graphs.py. cuBLAS itself
supports capture (its GEMMs with host-side ``alpha``/``beta`` are recorded by
value), so the backend's matmul calls ``cublasGemmEx`` / ``cublasGemmStridedBatchedEx``
itself, on CuPy's cuBLAS handle and the current stream, while a plan is captured
(:data:`capturing`); eagerly the backend calls ``cupy.matmul`` (both are cuBLAS GEMMs
accumulating in float32; the algorithm cuBLAS picks may differ, so the last bits may).

Layouts: C = A @ B in row-major is Cᵀ = Bᵀ Aᵀ in cuBLAS's column-major, so the
operands are passed swapped; an operand whose last two dimensions are transposed
(Fortran order) is passed with ``CUBLAS_OP_T`` instead of copied. Batched products
take equal batch shapes, or a 2-D right operand shared by every batch (stride 0).
Anything else (vectors, broadcast batches, other dtypes, empty sizes) returns None
and the caller uses ``cupy.matmul``. float32 accumulates in float32 (no TF32, as
CuPy's default); float16 and bfloat16 accumulate in float32.
"""

from __future__ import annotations

import ctypes

from lazyx.dtypes import numpy_name

from . import runtime as _rt

__all__ = ["matmul", "capturing", "native"]

#: True while backends/cuda/graphs.py captures a plan: the backend's matmul then comes
#: here. Eagerly too where the native module calls cuBLAS (:func:`native`: one C call);
#: otherwise eagerly it calls ``cupy.matmul`` (measured on the H200's host, the ctypes
#: call of ``cublasGemmEx`` costs more host time per call than CuPy's binding).
capturing = False

_OP_N, _OP_T = 0, 1
_GEMM_DEFAULT = -1
_COMPUTE_32F, _COMPUTE_64F = 68, 70
#: dtype name -> (cudaDataType, compute type, scalar ctype)
_TYPES = {"float32": (0, _COMPUTE_32F, ctypes.c_float), "float64": (1, _COMPUTE_64F, ctypes.c_double),
          "float16": (2, _COMPUTE_32F, ctypes.c_float), "bfloat16": (14, _COMPUTE_32F, ctypes.c_float)}

_lib = None      # the libcublas CuPy loaded, or False when it cannot be found
_ONE = {c: c(1.0) for c in (ctypes.c_float, ctypes.c_double)}
_ZERO = {c: c(0.0) for c in (ctypes.c_float, ctypes.c_double)}


def _library_path():
    """The path of the libcublas CuPy loaded, or None."""
    try:
        # CuPy loads libcublas on its first cuBLAS call: make that happen, or the maps
        # below may not list it yet (a process whose first product is captured).
        _rt.cp.cuda.device.get_cublas_handle()
    except Exception:  # noqa: BLE001 - no cuBLAS: the maps will not list it
        pass
    try:
        with open("/proc/self/maps") as f:  # the exact library CuPy linked
            for line in f:
                if "libcublas.so" in line and "libcublasLt" not in line:
                    return line.split()[-1]
    except OSError:
        pass
    return None


_native = None  # the native module's gemm (launch.cpp) once set up; False where none


def native():
    """The native module's ``gemm`` (one C call per product), or None."""
    global _native
    if _native is None:
        _native = False
        mod = _rt.native_module()
        path = _library_path() if mod is not None else None
        if path is not None:
            try:
                mod.setup_cublas(path)
                _native = mod.gemm
            except OSError:
                _native = False
    return _native or None


def _load():
    """The libcublas this process loaded (CuPy's), with the signatures set; or False."""
    global _lib
    if _lib is None:
        _lib = False
        path = _library_path()
        if path is not None:
            try:
                lib = ctypes.CDLL(path)
                vp, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
                lib.cublasSetStream_v2.argtypes = [vp, vp]
                lib.cublasGemmEx.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, vp, i, i, vp, vp,
                                             i, i, i, i]
                lib.cublasGemmStridedBatchedEx.argtypes = [
                    vp, i, i, i, i, i, vp, vp, i, i, ll, vp, i, i, ll, vp, vp, i, i, ll, i, i, i]
                _lib = lib
            except (OSError, AttributeError):
                _lib = False
    return _lib


def _operand(x):
    """(op, leading dimension, matrix stride) of ``x``'s last two dimensions as cuBLAS
    reads them, or None when its layout needs a copy."""
    item = x.itemsize
    r, c = x.shape[-2], x.shape[-1]
    s_r, s_c = x.strides[-2], x.strides[-1]
    if s_c == item and (s_r == c * item or r == 1):
        op, ld = _OP_N, max(c, 1)
    elif s_r == item and (s_c == r * item or c == 1):
        op, ld = _OP_T, max(r, 1)
    else:
        return None
    if x.ndim == 2:
        return op, ld, 0
    # batches: one uniform stride over the flattened batch dimensions
    stride = r * c
    expect = stride * item
    for d in range(x.ndim - 3, -1, -1):
        if x.shape[d] != 1 and x.strides[d] != expect:
            return None
        expect *= x.shape[d]
    return op, ld, stride


def matmul(a, b):
    """``a @ b`` through cuBLAS for the layouts it takes, else None."""
    if a.ndim < 2 or b.ndim < 2 or a.dtype != b.dtype:
        return None
    t = _TYPES.get(numpy_name(a.dtype))
    if t is None:
        return None
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    if b.shape[-2] != k or not (m and n and k):
        return None
    batch_a, batch_b = a.shape[:-2], b.shape[:-2]
    if b.ndim > 2 and batch_b != batch_a:
        return None
    oa, ob = _operand(a), _operand(b)
    if oa is None or ob is None:
        return None
    fast = native()
    lib = _load() if fast is None else None
    if fast is None and not lib:
        return None
    cp = _rt.cp
    out = cp.empty(batch_a + (m, n), a.dtype)
    dtype, compute, scalar = t
    handle = cp.cuda.device.get_cublas_handle()
    stream = cp.cuda.get_current_stream().ptr
    # row-major C (m x n) = A B  <=>  column-major Cᵀ (n x m) = op(B) op(A)
    batches = 1
    for d in batch_a:
        batches *= d
    if fast is not None:
        status = fast(handle, stream, ob[0], oa[0], n, m, k, b.data.ptr, ob[1], ob[2],
                      a.data.ptr, oa[1], oa[2], out.data.ptr, n, m * n, batches, dtype, compute,
                      scalar is ctypes.c_double)
    elif lib.cublasSetStream_v2(handle, stream) != 0:
        return None
    elif batches == 1:
        one, zero = ctypes.byref(_ONE[scalar]), ctypes.byref(_ZERO[scalar])
        status = lib.cublasGemmEx(handle, ob[0], oa[0], n, m, k, one, b.data.ptr, dtype, ob[1],
                                  a.data.ptr, dtype, oa[1], zero, out.data.ptr, dtype, n,
                                  compute, _GEMM_DEFAULT)
    else:
        one, zero = ctypes.byref(_ONE[scalar]), ctypes.byref(_ZERO[scalar])
        status = lib.cublasGemmStridedBatchedEx(
            handle, ob[0], oa[0], n, m, k, one, b.data.ptr, dtype, ob[1], ob[2],
            a.data.ptr, dtype, oa[1], oa[2], zero, out.data.ptr, dtype, n, m * n, batches,
            compute, _GEMM_DEFAULT)
    if status != 0:
        from lazyx.errors import BackendError  # the cold path only
        raise BackendError(f"[matmul] cuBLAS failed (status {status}) on {a.shape} @ {b.shape} "
                           f"{a.dtype}.")
    return out
