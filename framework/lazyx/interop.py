"""Zero-copy interop: the buffer protocol, DLPack, ``asarray`` and ``from_dlpack``.

Out of lazyx, an evaluated array hands out its own memory, as MLX does:

* ``np.asarray(a)`` / ``np.array(a, copy=False)`` (``array.__array__``), ``memoryview(a)``
  (``__buffer__``: Python 3.12 wires it itself; on 3.11 the CPU backend's native module
  fills the C buffer slot, see ``backends/cpu/native/buffer.cpp``) and ``__dlpack__``
  (``torch.from_dlpack(a)``, ``np.from_dlpack(a)``, CuPy's on the GPU) share the
  buffer, writable. A write through them changes ``a`` and every array that views the
  same memory, and an unevaluated graph that reads ``a`` sees it when it runs (MLX's
  semantics); results already computed keep their values.
* Memory that must not change is read-only and stays so: cached scalar constants,
  broadcast views, read-only imports, and host copies of GPU buffers (a write to a copy
  would not reach the array, so it is refused rather than lost).

Into lazyx:

* ``array(x)`` always copies (MLX's constructor), from any of: a NumPy array, an object
  with ``__dlpack__`` (PyTorch, JAX, CuPy), with ``__array__``, or with the buffer
  protocol (``bytes``, ``bytearray``, ``memoryview``, ``array.array``).
* ``asarray(x, copy=None)`` and ``from_dlpack(x, copy=None)`` share the memory where
  lazyx can use it as is (a CPU or CUDA tensor of a lazyx dtype, aligned) and copy
  otherwise; ``copy=False`` refuses to copy (``ValueError``), ``copy=True`` always does.
  As in MLX, float64 and complex128 become float32 and complex64 unless ``dtype`` says
  otherwise (a conversion is a copy).

DLPack capsules are read here with ``ctypes`` (the producer's tensor is wrapped as a
NumPy array whose owner calls the producer's deleter), so every lazyx dtype, bfloat16
included, crosses without a copy, and a tensor of a dtype or device lazyx cannot hold
is refused before it is consumed: the producer keeps ownership.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import array as _array_module
from . import dtypes as _dt
from . import ops
from .array import array, from_buffer
from .errors import ArgumentError, DeviceError, DtypeError

__all__ = ["asarray", "from_dlpack"]

# -- DLPack's C structures (dlpack.h, v1.0) -------------------------------------------------


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):  # the legacy capsule "dltensor"
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _DLManagedTensorVersioned(ctypes.Structure):  # "dltensor_versioned" (DLPack >= 1.0)
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY
_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

# Own function objects (setting argtypes on ctypes.pythonapi's would change them for everyone).
_api = ctypes.PyDLL(ctypes.pythonapi._name, handle=ctypes.pythonapi._handle)
_capsule_valid = _api.PyCapsule_IsValid
_capsule_valid.argtypes, _capsule_valid.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_int
_capsule_pointer = _api.PyCapsule_GetPointer
_capsule_pointer.argtypes, _capsule_pointer.restype = [ctypes.py_object, ctypes.c_char_p], \
    ctypes.c_void_p
_capsule_rename = _api.PyCapsule_SetName
_capsule_rename.argtypes, _capsule_rename.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_int

# Capsule names; PyCapsule_SetName keeps the pointer, so these bytes live as long as the module.
_LEGACY, _VERSIONED = b"dltensor", b"dltensor_versioned"
_USED = {_LEGACY: b"used_dltensor", _VERSIONED: b"used_dltensor_versioned"}

#: (DLDataTypeCode, bits) -> NumPy dtype, for every lazyx dtype (bfloat16 filled in lazily).
_DL_TO_NUMPY = {
    (0, 8): np.dtype(np.int8), (0, 16): np.dtype(np.int16), (0, 32): np.dtype(np.int32),
    (0, 64): np.dtype(np.int64), (1, 8): np.dtype(np.uint8), (1, 16): np.dtype(np.uint16),
    (1, 32): np.dtype(np.uint32), (1, 64): np.dtype(np.uint64), (2, 16): np.dtype(np.float16),
    (2, 32): np.dtype(np.float32), (2, 64): np.dtype(np.float64),
    (5, 64): np.dtype(np.complex64), (5, 128): np.dtype(np.complex128),
    (6, 8): np.dtype(np.bool_),
}
_BFLOAT = (4, 16)
_DL_CODE_NAMES = {0: "int", 1: "uint", 2: "float", 3: "opaque handle", 4: "bfloat",
                  5: "complex", 6: "bool", 7: "float8_e3m4", 8: "float8_e4m3",
                  9: "float8_e4m3b11fnuz", 10: "float8_e4m3fn", 11: "float8_e4m3fnuz",
                  12: "float8_e5m2", 13: "float8_e5m2fnuz", 14: "float8_e8m0fnu",
                  15: "float6_e2m3fn", 16: "float6_e3m2fn", 17: "float4_e2m1fn"}
_DL_DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA host", 4: "OpenCL", 7: "Vulkan", 8: "Metal",
                    9: "VPI", 10: "ROCm", 11: "ROCm host", 12: "ext", 13: "CUDA managed",
                    14: "oneAPI", 15: "WebGPU", 16: "Hexagon", 17: "MAIA"}
_HOST_DEVICES = frozenset({1, 3, 11, 13})  # memory the CPU can read in place
_CUDA = 2
# MLX's import rule: the 64-bit float types arrive as their 32-bit kind.
_NARROW = {np.dtype(np.float64): np.dtype(np.float32),
           np.dtype(np.complex128): np.dtype(np.complex64)}


def _numpy_dtype(code: int, bits: int, lanes: int, op: str, arg: str) -> np.dtype:
    d = _DL_TO_NUMPY.get((code, bits)) if lanes == 1 else None
    if d is None and (code, bits) == _BFLOAT and lanes == 1:
        d = _DL_TO_NUMPY[_BFLOAT] = _dt.bfloat16.np
    if d is None:
        name = f"{_DL_CODE_NAMES.get(code, f'code {code}')}{bits}" + (f"x{lanes}" if lanes != 1 else "")
        raise DtypeError(f"[{op}] {arg}: a DLPack tensor of dtype {name} has no lazyx dtype "
                         f"(lazyx holds bool, (u)int8-64, float16/32/64, bfloat16, complex64); "
                         f"convert it on the producer's side first.")
    return d


def _device_error(device_type: int, op: str, arg: str) -> DeviceError:
    name = _DL_DEVICE_NAMES.get(device_type, f"type {device_type}")
    return DeviceError(f"[{op}] {arg}: a DLPack tensor on a {name} device; lazyx reads CPU "
                       f"and CUDA tensors. Move it to one of them on the producer's side first.")


class _DLPackOwner:
    """Owns a consumed DLPack tensor: NumPy views of it keep this object alive, and
    the producer's deleter runs when the last one goes."""

    __slots__ = ("__array_interface__", "_managed", "_deleter")

    def __init__(self, interface: dict, managed: int, deleter: int | None):
        self.__array_interface__ = interface
        self._managed = managed
        self._deleter = deleter

    def __del__(self):
        if self._deleter:
            _DELETER(self._deleter)(self._managed)


def _host_from_capsule(capsule, op: str, arg: str) -> np.ndarray:
    """The CPU tensor in DLPack ``capsule`` as a NumPy array viewing its memory.

    Everything is checked before the capsule is consumed, so a refused tensor stays
    the producer's to free."""
    if _capsule_valid(capsule, _VERSIONED):
        name = _VERSIONED
        managed = _DLManagedTensorVersioned.from_address(_capsule_pointer(capsule, name))
        if managed.major > 1:
            raise ArgumentError(f"[{op}] {arg}: DLPack version {managed.major}.{managed.minor} "
                                f"is newer than lazyx reads (1.x).")
        read_only = bool(managed.flags & _READ_ONLY)
    elif _capsule_valid(capsule, _LEGACY):
        name = _LEGACY
        managed = _DLManagedTensor.from_address(_capsule_pointer(capsule, name))
        read_only = False
    else:
        raise ArgumentError(f"[{op}] {arg}: a DLPack capsule that was already consumed, or not "
                            f"a DLPack capsule (named 'dltensor' or 'dltensor_versioned').")
    t = managed.dl_tensor
    if t.device.device_type not in _HOST_DEVICES:
        raise _device_error(t.device.device_type, op, arg)
    dtype = _numpy_dtype(t.dtype.code, t.dtype.bits, t.dtype.lanes, op, arg)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = None if not t.strides else tuple(t.strides[i] * dtype.itemsize for i in range(t.ndim))
    _capsule_rename(capsule, _USED[name])  # consumed: the deleter is now ours to call
    address = ctypes.addressof(managed)
    if 0 in shape or not t.data:  # no memory to view (NumPy wants a data pointer)
        if managed.deleter:
            _DELETER(managed.deleter)(address)
        return np.empty(shape, dtype)
    # A bfloat16 tensor is viewed as uint16 first: __array_interface__ knows NumPy's own types.
    storage = np.dtype(np.uint16) if dtype.kind == "V" else dtype
    owner = _DLPackOwner({"version": 3, "shape": shape, "typestr": storage.str,
                          "data": (t.data + t.byte_offset, read_only), "strides": strides},
                         address, managed.deleter)
    host = np.asarray(owner)
    return host if storage is dtype else host.view(dtype)


def _dlpack_capsule(x, max_version=(1, 0), **kwargs):
    """``x.__dlpack__`` asking for a versioned capsule (it can say read-only), or a legacy
    one from producers that predate DLPack 1.0's keywords."""
    try:
        return x.__dlpack__(max_version=max_version, **kwargs)
    except TypeError:
        return x.__dlpack__(**kwargs)


def _cuda_from_dlpack(x, op: str, arg: str):
    """A CUDA tensor as a CuPy array viewing its memory (not run on this project's
    CI: it needs an NVIDIA GPU)."""
    try:
        import cupy as cp  # optional dependency: only a CUDA tensor needs it
    except ImportError:
        raise DeviceError(f"[{op}] {arg}: a CUDA tensor, but CuPy (lazyx's cuda backend) is "
                          f"not installed.") from None
    try:
        return cp.from_dlpack(x)
    except (TypeError, BufferError) as e:
        raise DtypeError(f"[{op}] {arg}: CuPy cannot import this CUDA tensor ({e}); CuPy has "
                         f"no bfloat16, so convert bfloat16 on the producer's side.") from None


def _import(x, op: str, arg: str):
    """The buffer of DLPack object or capsule ``x``, viewing its memory: a NumPy array
    (CPU memory) or a CuPy array (CUDA)."""
    if type(x).__name__ == "PyCapsule":
        return _host_from_capsule(x, op, arg)
    try:
        device_type, _ = x.__dlpack_device__()
    except AttributeError:
        raise DtypeError(f"[{op}] {arg}: a {type(x).__name__} has no __dlpack__ and "
                         f"__dlpack_device__ (a NumPy, PyTorch, JAX or CuPy array has).") from None
    device_type = int(device_type)
    if device_type in _HOST_DEVICES:
        return _host_from_capsule(_dlpack_capsule(x), op, arg)
    if device_type == _CUDA:
        return _cuda_from_dlpack(x, op, arg)
    raise _device_error(device_type, op, arg)


def _shared(buf, dtype: _dt.Dtype | None, copy: bool | None, op: str, arg: str) -> array:
    """An array of buffer ``buf`` (NumPy or CuPy): the buffer itself where ``dtype`` and
    the layout allow it and ``copy`` is not True; a converted copy otherwise."""
    src = buf.dtype
    want = dtype.np if dtype is not None else _NARROW.get(src, src)
    try:
        have = _dt.from_numpy(want)
    except DtypeError as e:
        raise DtypeError(f"[{op}] {arg}: {e}") from None
    usable = want == src and (not isinstance(buf, np.ndarray) or buf.flags.aligned)
    if copy is False and not usable:
        why = f"a {src.name} input becomes {np.dtype(want).name}" if want != src else \
            "the memory is not aligned"
        raise ValueError(f"[{op}] Cannot use {arg} without a copy: {why}.")
    if copy or not usable:
        if isinstance(buf, np.ndarray):
            return array(buf, have)  # the constructor: a copy counted in the memory figures
        return from_buffer(buf.astype(want, copy=True), have)
    # A view, so that reshaping the caller's object in place cannot change this array's shape.
    return from_buffer(buf.view(), have)


def from_dlpack(x, /, *, copy: bool | None = None) -> array:
    """Create an array from an object that supports DLPack.

    Args:
        x: an object with ``__dlpack__`` and ``__dlpack_device__`` (a NumPy, PyTorch,
            JAX or CuPy array), or a DLPack capsule.
        copy (bool, optional): ``True`` always copies; ``False`` never does (a
            ``ValueError`` where a copy is needed); ``None`` shares the memory when
            possible. A shared import keeps the producer's strides, and sees its writes.

    Returns:
        array: an array of the tensor's data (float64 and complex128 become float32
        and complex64, as in MLX).

    Example:
        >>> t = torch.arange(3.0)
        >>> a = mx.from_dlpack(t)     # shares t's memory
    """
    if isinstance(x, array):
        return asarray(x, copy=copy)
    return _shared(_import(x, "from_dlpack", "x"), None, copy, "from_dlpack", "x")


def asarray(a, dtype=None, *, copy: bool | None = None) -> array:
    """Convert the input to an array.

    Args:
        a: input data: an array, a Python scalar or (nested) sequence, a NumPy array, a
            DLPack object (PyTorch, JAX, CuPy), or a buffer (``bytes``, ``memoryview``,
            ``array.array`` ...).
        dtype (Dtype, optional): the desired data type.
        copy (bool, optional): ``True`` always copies; ``False`` never does (a
            ``ValueError`` where a copy is needed); ``None`` shares memory when possible
            and copies otherwise.

    Returns:
        array: an array interpretation of the input.

    Example:
        >>> x = np.arange(3, dtype=np.float32)
        >>> a = mx.asarray(x)         # shares x's memory
    """
    if dtype is not None:
        dtype = _dt.to_dtype(dtype)
    if isinstance(a, array):
        if dtype is not None and dtype is not a._dtype:
            if copy is False:
                raise ValueError(f"[asarray] Cannot convert a {a._dtype.name} array to "
                                 f"{dtype.name} without a copy.")
            return ops.astype(a, dtype)
        if not copy:
            return a
        d = _evaluated(a)
        return array(d, a._dtype) if isinstance(d, np.ndarray) else from_buffer(d.copy(), a._dtype)
    buf = _foreign_buffer(a, "asarray", "a")
    if buf is None:  # Python scalars and sequences: always built anew
        if copy is False:
            raise ValueError("[asarray] Unable to avoid copy while creating an array as "
                             "requested: a is a Python value.")
        return array(a, dtype)
    return _shared(buf, dtype, copy, "asarray", "a")


def _foreign_buffer(x, op: str, arg: str):
    """The memory of ``x`` as a NumPy (or CuPy) array without a copy, or None when ``x``
    holds no memory of its own (a Python scalar, list, tuple)."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, (bool, int, float, complex, list, tuple, np.generic)):
        return None
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__") \
            or type(x).__name__ == "PyCapsule":
        return _import(x, op, arg)
    if hasattr(x, "__array__") or hasattr(x, "__array_interface__"):
        return np.asarray(x)
    try:
        view = memoryview(x)
    except TypeError:
        return None
    try:
        return np.asarray(view)
    except (ValueError, TypeError) as e:  # a format NumPy cannot read
        raise DtypeError(f"[{op}] {arg}: a buffer of format {view.format!r} has no lazyx "
                         f"dtype ({e}).") from None


def _host_for_constructor(x) -> np.ndarray | None:
    """``array(x)``'s reading of a DLPack or buffer-protocol object ``x`` (it copies the
    result), or None for anything else."""
    buf = _foreign_buffer(x, "array", "val")
    if buf is None or isinstance(buf, np.ndarray):
        return buf
    return buf.get()  # a CuPy array: the constructor's copy is made on the host


# -- out of lazyx ----------------------------------------------------------------------


def _evaluated(a: array):
    if a._data is None:
        _array_module.evaluate((a,))
    return a._data


def _buffer(self: array, flags: int = 0) -> memoryview:
    """``memoryview(a)``: the array's memory (evaluated first), writable on the CPU."""
    host = self.__array__()
    try:
        return memoryview(host)
    except ValueError as e:  # bfloat16 has no PEP 3118 format character
        raise DtypeError(f"[memoryview] A {self._dtype.name} array has no buffer-protocol "
                         f"format ({e}); use np.asarray(a), which keeps bfloat16 through "
                         f"ml_dtypes, or a.view(uint16).") from None


def _dlpack(self: array, *, stream=None, max_version=None, dl_device=None, copy=None):
    """The DLPack capsule of the array's buffer (evaluated first), sharing its memory:
    NumPy's exporter on the CPU, CuPy's on the GPU."""
    d = _evaluated(self)
    kwargs = {k: v for k, v in (("stream", stream), ("max_version", max_version),
                                ("dl_device", dl_device), ("copy", copy)) if v is not None}
    if not isinstance(d, np.ndarray):
        return d.__dlpack__(**kwargs)
    legacy = max_version is None or max_version[0] < 1
    if not d.flags.writeable and legacy and copy is not False:
        # DLPack before 1.0 cannot say "read-only": such a consumer gets a copy.
        d = d.copy()
    if self._dtype is not _dt.bfloat16:
        return d.__dlpack__(**kwargs)
    # NumPy exports no bfloat16: export the bits as uint16, then relabel the dtype.
    capsule = d.view(np.uint16).__dlpack__(**kwargs)
    if _capsule_valid(capsule, _VERSIONED):
        t = _DLManagedTensorVersioned.from_address(_capsule_pointer(capsule, _VERSIONED)).dl_tensor
    else:
        t = _DLManagedTensor.from_address(_capsule_pointer(capsule, _LEGACY)).dl_tensor
    t.dtype.code, t.dtype.bits = _BFLOAT
    return capsule


def _dlpack_device(self: array) -> tuple[int, int]:
    """``(device type, device id)`` of the array's buffer in DLPack's numbering
    (evaluates the array: its buffer lives where it was computed)."""
    d = _evaluated(self)
    device_type, device_id = d.__dlpack_device__()
    return int(device_type), int(device_id)


array.__buffer__ = _buffer
array.__dlpack__ = _dlpack
array.__dlpack_device__ = _dlpack_device
_array_module._foreign_host = _host_for_constructor
# Python 3.11 has no __buffer__ slot (PEP 688 is 3.12): the CPU backend's native module
# fills the C slot when it loads (backends/cpu/native_kernels.py). Without that module,
# memoryview(a) is a TypeError there and np.asarray(a) is the way to the memory.
