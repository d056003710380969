"""The one exception hierarchy of lazyx.

Every error lazyx raises on purpose derives from :class:`LazyxError` and from the
built-in exception a NumPy or MLX user would expect (``ValueError`` for shapes,
``TypeError`` for dtypes, ``MemoryError`` for an allocation that cannot be served,
...), so ``except ValueError`` keeps working.

One convention for messages: ``"[op] what is wrong, naming the argument and the
shapes."``, where ``op`` is the public operation the user called (``[take]``,
``[add]``, ``[getitem]``). Argument helpers shared by many ops (:mod:`lazyx.arguments`)
take the op name from their caller; an op family built by one factory (the element-wise
ops) names the op once, where its helpers' errors pass through, with :func:`at_op`.
Errors found while evaluating name the primitive that ran (``[Gather]``), since the
graph no longer knows which call built a node.
"""

__all__ = [
    "LazyxError", "ArgumentError", "ShapeError", "AxisError", "DtypeError", "IntegerRangeError",
    "IndexOutOfRangeError", "TreeStructureError",
    "KernelNotFoundError", "KernelOutputError", "TransformError", "ShapelessCompileError", "PluginError",
    "BackendError", "DeviceError", "OutOfMemoryError", "FileFormatError", "FileMissingError",
    "LinAlgError", "at_op",
]


class LazyxError(Exception):
    """Base class of every error lazyx raises on purpose."""


class ArgumentError(LazyxError, ValueError):
    """An argument value an operation does not accept (a bad mode, side, count...)."""


class ShapeError(LazyxError, ValueError):
    """Shapes that do not fit: broadcasting, reshape, matmul, concatenation."""


class AxisError(LazyxError, ValueError, IndexError):
    """An axis out of range or repeated."""


class DtypeError(LazyxError, TypeError, ValueError):
    """An unknown dtype, or one an operation does not accept: a ``TypeError`` as NumPy
    raises, and a ``ValueError`` as MLX raises (``[floor] Not supported for complex64.``)."""


class IntegerRangeError(LazyxError, OverflowError, ValueError):
    """A Python int outside the range its argument takes: a dimension or an index beyond
    32 bits (MLX's shapes are 32-bit: an ``OverflowError`` for a shape, a ``ValueError``
    for an index or an ``arange`` length)."""


class IndexOutOfRangeError(LazyxError, IndexError, ValueError):
    """An index outside the array: an ``IndexError`` as NumPy raises, and a ``ValueError``
    as MLX raises where it checks (``take`` of an int, an index beyond 32 bits)."""


class TreeStructureError(LazyxError, KeyError, ValueError):
    """A tree (gradients, parameters, optimizer state) that lacks a key or index another
    tree has: a ``KeyError`` as MLX raises. The message names the path."""

    # KeyError's own __str__ quotes the message as a repr.
    __str__ = Exception.__str__


class KernelNotFoundError(LazyxError, NotImplementedError):
    """No kernel for a primitive on the device and backend that must run it."""


class KernelOutputError(LazyxError, RuntimeError):
    """A kernel returned outputs of the wrong number, shape or dtype."""


class TransformError(LazyxError, NotImplementedError):
    """A primitive lacks the rule (vjp, jvp, vmap, output_shapes) a transform needs."""


class ShapelessCompileError(TransformError, ValueError):
    """A primitive whose parameters fix its output shape (a slice's bounds) inside
    ``compile(..., shapeless=True)``: a ValueError, as MLX raises."""


class LinAlgError(LazyxError, RuntimeError):
    """A factorization that failed on the values it was given: a singular matrix to
    invert or solve with, a matrix that is not positive definite (``RuntimeError`` as
    MLX raises)."""


class PluginError(LazyxError, RuntimeError):
    """A plugin failed to load or conflicts with another one."""


class BackendError(LazyxError, ValueError):
    """An unknown or unavailable backend."""


class DeviceError(LazyxError, ValueError):
    """An unknown or unavailable device."""


class OutOfMemoryError(LazyxError, MemoryError):
    """An array, or a buffer a kernel needs, larger than the memory lazyx can get."""


class FileFormatError(LazyxError, RuntimeError):
    """A file ``load`` cannot read as its format: truncated, corrupt or of another format
    (``RuntimeError``, as MLX raises). The message names the file and the format."""


class FileMissingError(FileFormatError, FileNotFoundError):
    """A path that does not exist: a file given to ``load``, a folder to save into."""


def at_op(exc: LazyxError, op: str) -> LazyxError:
    """``exc`` with its message prefixed by ``[op]``, unless it names an op already.

    For the ``except`` clause of an op that lets a shared helper raise (free while
    nothing raises): ``except LazyxError as e: raise at_op(e, "add")``.
    """
    if exc.args and type(exc.args[0]) is str and not exc.args[0].startswith("["):
        exc.args = (f"[{op}] {exc.args[0]}",) + exc.args[1:]
    return exc


class KernelCompileError(LazyxError, RuntimeError):
    """A kernel's source did not compile: generated C++ or CUDA, a plugin's CUDA or MSL
    source. The message names the source and quotes the compiler's first error lines."""


class HostOnlyKernelError(KernelNotFoundError):
    """A kernel that would compute on the host was asked to run on a device backend
    (a NumPy kernel handed device arrays): the device has no kernel for the primitive."""


class MissingCompilerWarning(RuntimeWarning):
    """No C++ compiler: compiled functions run unfused (warned once per process)."""
