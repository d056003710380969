"""Input checks shared by the layers: a wrong feature count caught at the layer's call.

The op under a layer (``conv2d``, ``matmul``) would also refuse a wrong trailing
dimension, but its message names the op and its internal shapes; a user who called
``model(x)`` wants the layer and the parameter at fault, as ``[Conv2d] ... weight of
shape (...)``. The check reads shapes only (known without evaluating), so it costs
nothing on the graph.
"""

from __future__ import annotations

from lazyx.errors import ShapeError


def check_features(layer, x, expected: int, parameter: str, parameter_shape=None,
                   min_ndim: int = 1) -> None:
    """Raise :class:`ShapeError` unless ``x`` has ``min_ndim`` axes and ``expected``
    features in its last axis.

    ``parameter`` names the parameter (or constructor argument) that fixed ``expected``;
    ``parameter_shape`` is its shape when it is an array.
    """
    name = type(layer).__name__
    what = f"{parameter} of shape {tuple(parameter_shape)}" if parameter_shape is not None \
        else f"{parameter}={expected}"
    if x.ndim < min_ndim:
        raise ShapeError(f"[{name}] expects an input with at least {min_ndim} dimensions "
                         f"(batch, ..., features); got shape {tuple(x.shape)}.")
    if x.shape[-1] != expected:
        raise ShapeError(f"[{name}] the input's last dimension is {x.shape[-1]} (shape "
                         f"{tuple(x.shape)}) but {what} expects {expected} features; "
                         f"pass inputs with {expected} features in the last axis.")
