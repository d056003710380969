"""The Python array API's inspection object: ``lazyx.core.__array_namespace_info__()``.

``array.__array_namespace__()`` returns ``lazyx.core`` itself; this module answers
the questions the standard asks of a namespace (capabilities, devices, default and
supported dtypes) with MLX 0.32's answers, from :mod:`lazyx.device` and
:mod:`lazyx.dtypes`.
"""

from __future__ import annotations

from . import device as _device
from . import dtypes as _dt
from .device_types import Device, DeviceType
from .errors import ArgumentError, DeviceError

__all__ = ["ArrayNamespaceInfo", "__array_namespace_info__"]

#: The dtypes of the array API standard that lazyx has on every device (float16 and
#: bfloat16 are not in the standard).
_STANDARD = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
             "float32", "complex64")
_SIGNED = {"int8", "int16", "int32", "int64"}
_UNSIGNED = {"uint8", "uint16", "uint32", "uint64"}
_KINDS = {
    "bool": {"bool"}, "signed integer": _SIGNED, "unsigned integer": _UNSIGNED,
    "integral": _SIGNED | _UNSIGNED, "real floating": {"float32", "float64"},
    "complex floating": {"complex64"},
    "numeric": _SIGNED | _UNSIGNED | {"float32", "float64", "complex64"},
}


def _check_device(device) -> Device:
    if device is None:
        return _device.default_device()
    if not isinstance(device, Device):
        raise DeviceError(f"[__array_namespace_info__] Expected a lazyx Device, got {device!r}.")
    return device


class ArrayNamespaceInfo:
    """What the array API asks of a namespace, answered for lazyx."""

    def capabilities(self) -> dict:
        return {"boolean indexing": False, "data-dependent shapes": False,
                "max dimensions": 10}

    def default_device(self) -> Device:
        return _device.default_device()

    def default_dtypes(self, *, device=None) -> dict:
        _check_device(device)
        return {"real floating": _dt.float32, "complex floating": _dt.complex64,
                "integral": _dt.int32, "indexing": _dt.int32}

    def devices(self) -> tuple:
        return tuple(Device(t, i) for t in (DeviceType.cpu, DeviceType.gpu)
                     for i in range(_device.device_count(t)))

    def dtypes(self, *, device=None, kind=None) -> dict:
        device = _check_device(device)
        # float64 runs on the CPU only (as in MLX), listed last as MLX lists it.
        names = list(_STANDARD) + (["float64"] if device.type is DeviceType.cpu else [])
        if kind is not None:
            kinds = (kind,) if isinstance(kind, str) else kind
            if not isinstance(kinds, tuple) or any(k not in _KINDS for k in kinds):
                raise ArgumentError(f"Unsupported dtype kind: {kind!r}; expected one of "
                                    f"{', '.join(map(repr, _KINDS))} or a tuple of them.")
            wanted = set().union(*(_KINDS[k] for k in kinds))
            names = [n for n in names if n in wanted]
        return {n: _dt.to_dtype("bool_" if n == "bool" else n) for n in names}


def __array_namespace_info__() -> ArrayNamespaceInfo:
    return ArrayNamespaceInfo()
