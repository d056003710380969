"""``Sequential``: layers called one after the other (``mlx.nn.Sequential``)."""

from __future__ import annotations

from typing import Callable

from .base import Module

__all__ = ["Sequential"]


class Sequential(Module):
    """Call the given layers (or any callables) in order, each on the previous output.

    The layers are stored in the list ``layers``, so their parameters are named
    ``layers.0.weight``, ``layers.1.weight``, ...

    Args:
        modules (Module or callable): The layers, in calling order.

    Example:
        >>> mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    """

    def __init__(self, *modules: Callable):
        super().__init__()
        self.layers = list(modules)

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
