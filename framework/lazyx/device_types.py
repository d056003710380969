"""The device and stream types: :class:`DeviceType`, :class:`Device`, :class:`Stream`.

Plain values with no behaviour that needs a backend, so that :mod:`lazyx.backend`
(which runs device types) and :mod:`lazyx.device` (the default device and stream,
which asks the backends what is available) can both import them.
"""

from __future__ import annotations

import enum

from .errors import DeviceError

__all__ = ["DeviceType", "Device", "Stream"]


class DeviceType(enum.Enum):
    """The kinds of processor: ``cpu`` and ``gpu`` (a backend runs one of them)."""

    cpu = 0
    gpu = 1

    def __repr__(self) -> str:
        return f"DeviceType.{self.name}"


class Device:
    """A device: ``Device(DeviceType.gpu, 0)``."""

    __slots__ = ("type", "index")

    def __init__(self, type: DeviceType, index: int = 0):
        if not isinstance(type, DeviceType):
            raise DeviceError(f"Device type must be a DeviceType, got {type!r}.")
        self.type = type
        self.index = index

    def __eq__(self, other) -> bool:
        if isinstance(other, DeviceType):
            return self.type is other
        return isinstance(other, Device) and other.type is self.type and other.index == self.index

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __repr__(self) -> str:
        return f"Device({self.type.name}, {self.index})"


class Stream:
    """An ordered queue of work on ``device``."""

    __slots__ = ("index", "device", "kind")

    def __init__(self, index: int, device: Device):
        self.index = index
        self.device = device
        # The device type as a plain int: the scheduler's dispatch-table index.
        self.kind = device.type.value

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream) and other.index == self.index and other.device == self.device

    def __hash__(self) -> int:
        return hash((self.index, self.device))

    def __repr__(self) -> str:
        return f"Stream({self.device!r}, {self.index})"
