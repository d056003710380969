"""Print options: how ``repr``/``str`` of an array write floating-point numbers.

One process-wide :class:`PrintOptions` (MLX keeps one global formatter too):
``set_printoptions`` changes it, ``get_printoptions`` returns a copy, and
``printoptions(...)`` is a context manager that sets it on entry and restores the
previous options on exit. :mod:`lazyx.array`'s formatter reads
:func:`float_format` once per array it prints.

``precision=-1`` (the default) writes the shortest form (``%g``: ``1.12346``,
``1e-05``); ``precision=n >= 0`` writes ``n`` digits after the point (``1.12``);
any other negative value writes six, as C++'s ``std::fixed`` does in MLX.
"""

from __future__ import annotations

from .errors import DtypeError

__all__ = ["PrintOptions", "printoptions", "set_printoptions", "get_printoptions"]


class PrintOptions:
    """The options of the array formatter.

    Args:
        precision (int): Number of decimal places; ``-1`` for the shortest form.
    """

    __slots__ = ("precision",)

    def __init__(self, precision: int = -1):
        self.precision = _checked(precision)

    def __repr__(self) -> str:
        return f"PrintOptions(precision={self.precision})"


def _checked(precision) -> int:
    if isinstance(precision, bool) or not isinstance(precision, int):
        raise DtypeError(f"[printoptions] precision must be an int, got {precision!r}.")
    return precision


_current = PrintOptions()


def float_format(x: float) -> str:
    """``x`` written with the current precision (the formatter's one look-up)."""
    p = _current.precision
    if p == -1:
        return f"{x:g}"
    return f"{x:.{p if p >= 0 else 6}f}"


def set_printoptions(precision: int = -1) -> None:
    """Set global printing precision for array formatting.

    Args:
        precision (int): Number of decimal places (``-1``: the default, shortest form).
    """
    _current.precision = _checked(precision)


def get_printoptions() -> PrintOptions:
    """Get global printing precision for array formatting.

    Returns:
        PrintOptions: A copy of the format options used for printing arrays.
    """
    return PrintOptions(_current.precision)


class _PrintOptionsContext:
    """Sets the options on entry and restores the previous ones on exit."""

    __slots__ = ("options", "_saved")

    def __init__(self, options: PrintOptions):
        self.options = options
        self._saved: list = []

    def __enter__(self):
        self._saved.append(_current.precision)
        _current.precision = self.options.precision
        return self

    def __exit__(self, *exc):
        _current.precision = self._saved.pop()
        return False


def printoptions(precision: int = -1) -> _PrintOptionsContext:
    """Context manager for setting print options temporarily.

    Example:
        >>> with printoptions(precision=3):
        ...     print(x)  # three decimal places
        >>> print(x)      # back to the previous options

    Args:
        precision (int): Number of decimal places. Use -1 for default.
    """
    return _PrintOptionsContext(PrintOptions(precision))
