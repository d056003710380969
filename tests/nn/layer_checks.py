"""Checks shared by the layer tests (tests/nn/test_layers_*.py): build a layer in lazyx
and in MLX with the same weights, and check a layer's gradients (input and parameters)
against finite differences in float64."""

from __future__ import annotations

import os
import sys

import numpy as np

import lazyx.core as mx
from lazyx.utils import tree_flatten, tree_unflatten

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "mlx"))
from mlx_compat import requires_mlx  # noqa: E402,F401
from helpers import check_vjp_fd  # noqa: E402

try:
    import mlx.core as mlx_core
    import mlx.nn as mlx_nn
    from mlx.utils import tree_flatten as mlx_tree_flatten
except ImportError:  # pragma: no cover - platforms without an MLX wheel
    mlx_core = mlx_nn = mlx_tree_flatten = None


def same_weights(mlx_layer, lx_layer):
    """Copy ``mlx_layer``'s parameters into ``lx_layer`` (its names and shapes must be
    MLX's: ``update`` is strict)."""
    pairs = [(k, mx.array(np.array(v))) for k, v in mlx_tree_flatten(mlx_layer.parameters())]
    lx_layer.update(tree_unflatten(pairs))
    return lx_layer


def assert_matches_mlx(lx_out, mlx_out, rtol=2e-5, atol=2e-6):
    assert tuple(lx_out.shape) == tuple(mlx_out.shape)
    np.testing.assert_allclose(np.array(lx_out.astype(mx.float32)),
                               np.array(mlx_out.astype(mlx_core.float32)), rtol=rtol, atol=atol)


def check_layer_grads(layer, x, call=None, names=None, **kw):
    """Finite-difference check of ``layer``'s vjp with respect to ``x`` and the
    parameters ``names`` (default: all trainable ones), in float64."""
    call = call or (lambda m, x: m(x))
    params = dict(tree_flatten(layer.trainable_parameters()))
    names = list(params) if names is None else names
    layer.set_dtype(mx.float64)

    def fun(x, *ps):
        layer.update(tree_unflatten(list(zip(names, ps))))
        return call(layer, x)

    check_vjp_fd(fun, np.asarray(x), *[np.array(params[n], dtype=np.float64) for n in names],
                 **kw)
