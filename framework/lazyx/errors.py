"""The one exception hierarchy of lazyx.

Every error lazyx raises on purpose derives from :class:`LazyxError` and from the
built-in exception a NumPy or MLX user would expect (``ValueError`` for shapes,
``TypeError`` for dtypes, ...), so ``except ValueError`` keeps working.
"""

__all__ = [
    "LazyxError", "ArgumentError", "ShapeError", "AxisError", "DtypeError", "IndexOutOfRangeError",
    "KernelNotFoundError", "KernelOutputError", "TransformError", "PluginError",
    "BackendError", "DeviceError",
]


class LazyxError(Exception):
    """Base class of every error lazyx raises on purpose."""


class ArgumentError(LazyxError, ValueError):
    """An argument value an operation does not accept (a bad mode, side, count...)."""


class ShapeError(LazyxError, ValueError):
    """Shapes that do not fit: broadcasting, reshape, matmul, concatenation."""


class AxisError(LazyxError, ValueError, IndexError):
    """An axis out of range or repeated."""


class DtypeError(LazyxError, TypeError):
    """An unknown dtype, or one an operation does not accept."""


class IndexOutOfRangeError(LazyxError, IndexError):
    """An index outside the array."""


class KernelNotFoundError(LazyxError, NotImplementedError):
    """No kernel for a primitive on the device and backend that must run it."""


class KernelOutputError(LazyxError, RuntimeError):
    """A kernel returned outputs of the wrong number, shape or dtype."""


class TransformError(LazyxError, NotImplementedError):
    """A primitive lacks the rule (vjp, jvp, vmap, output_shapes) a transform needs."""


class PluginError(LazyxError, RuntimeError):
    """A plugin failed to load or conflicts with another one."""


class BackendError(LazyxError, ValueError):
    """An unknown or unavailable backend."""


class DeviceError(LazyxError, ValueError):
    """An unknown or unavailable device."""
