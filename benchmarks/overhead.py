"""Per-op overhead: a chain of 200 element-wise ops on a 16-element float32 array.

The data is tiny, so the time is the framework's own cost per op: building
the graph and evaluating it (lazyx, MLX) or dispatching each op eagerly
(NumPy, PyTorch, JAX). Reported in microseconds per op.
"""

from __future__ import annotations

import numpy as np

N_OPS = 200
SIZE = 16


def _chain(x, c, n_ops=N_OPS):
    y = x
    for _ in range(n_ops // 2):
        y = y * c
        y = y + c
    return y


def cases(peers) -> dict:
    """{column: zero-argument callable running the whole chain once}."""
    x0 = np.linspace(0.5, 1.5, SIZE, dtype=np.float32)
    c0 = np.full(SIZE, 0.5, np.float32)
    out = {}
    lx = peers["lazyx"].module
    x, c = lx.array(x0), lx.array(c0)

    def run_lazyx():
        lx.eval(_chain(x, c))
    out["lazyx"] = run_lazyx

    def run_lazyx_reference():
        with lx.use_backend("cpu", "cpu-reference"):
            lx.eval(_chain(x, c))
    out["lazyx NumPy kernels"] = run_lazyx_reference

    out["NumPy"] = lambda: _chain(x0, c0)
    if "MLX" in peers:
        mx = peers["MLX"].module
        mx_x, mx_c = mx.array(x0), mx.array(c0)
        out["MLX"] = lambda: mx.eval(_chain(mx_x, mx_c))
    if "PyTorch" in peers:
        torch = peers["PyTorch"].module
        t_x, t_c = torch.from_numpy(x0.copy()), torch.from_numpy(c0.copy())

        def run_torch():
            with torch.inference_mode():
                _chain(t_x, t_c)
        out["PyTorch"] = run_torch
    if "JAX" in peers:
        jnp = peers["JAX"].module.numpy
        j_x, j_c = jnp.asarray(x0), jnp.asarray(c0)
        out["JAX"] = lambda: _chain(j_x, j_c).block_until_ready()
    return out


def check(peers) -> None:
    """Every framework computes the same chain (a benchmark of a wrong result is void)."""
    x0 = np.linspace(0.5, 1.5, SIZE, dtype=np.float32)
    c0 = np.full(SIZE, 0.5, np.float32)
    ref = _chain(x0, c0)
    lx = peers["lazyx"].module
    np.testing.assert_allclose(np.asarray(_chain(lx.array(x0), lx.array(c0))), ref, rtol=1e-5)
