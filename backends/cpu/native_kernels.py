"""Kernels of the ``cpu`` backend served by the nanobind module ``_native``."""

from __future__ import annotations


def load():
    """The native module, or None when it was not built (the NumPy kernels then serve)."""
    try:
        from . import _native
    except ImportError:
        return None
    return _native if hasattr(_native, "enter_eval") else None


def kernels(native) -> dict:
    """{primitive_class: kernel} that replace NumPy kernels on the ``cpu`` backend."""
    if native is None:
        return {}
    return {}
