"""Helpers for a plugin's ``lazyx_examples`` hook (see :mod:`lazyx.hookspecs`).

An example is ``(primitive_class, make)`` with ``make()`` returning ``(fn,
args)`` or ``(fn, args, options)``. These helpers make the NumPy arguments
(float64 for the differentiable ones) from one seeded generator, so the
examples are the same on every run, and wrap them into ``make``::

    from lazyx.examples import example, uniform

    @hookimpl
    def lazyx_examples():
        return [(Cube, example(cube, uniform((2, 3))))]
"""

from __future__ import annotations

import numpy as np

__all__ = ["example", "uniform", "integers", "booleans"]

_state: list = []


def _gen():
    """The examples' generator, made on first use (``numpy.random`` costs a few ms to
    import, and every ``import lazyx.core`` imports this module)."""
    if not _state:
        _state.append(np.random.default_rng(20240601))
    return _state[0]


def uniform(shape, low: float = -1.5, high: float = 1.5, away: float = 0.0) -> np.ndarray:
    """Float64 data uniform in ``[low, high)``, at least ``away`` from 0 (where kinks
    such as those of ``abs`` or ``1 / x`` sit)."""
    x = _gen().uniform(low, high, shape)
    if away:
        x = np.where(np.abs(x) < away, np.copysign(away, x) + x, x)
    return x


def integers(shape, low: int, high: int, dtype=np.int32) -> np.ndarray:
    """Integers in ``[low, high)`` of NumPy ``dtype`` (indices, shifts, bit patterns)."""
    return _gen().integers(low, high, shape).astype(dtype)


def booleans(shape) -> np.ndarray:
    """Random booleans (conditions, masks)."""
    return _gen().random(shape) < 0.5


def example(fn, *args, **options):
    """``make`` for the example ``fn(*args)``: a function returning ``(fn, args)``, or
    ``(fn, args, options)`` when options are given."""
    made = (fn, list(args), options) if options else (fn, list(args))
    return lambda: made
