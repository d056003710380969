"""Gradients of ``fast.scaled_dot_product_attention`` (lazyx's fused backward node)
against ``mlx.core.grad`` of MLX 0.32.2's on the same inputs: every mask kind, grouped-
and multi-query heads, ``Tq != Tk``, sinks, the half types, and second derivatives."""

import numpy as np
import pytest

from mlx_compat import requires_mlx, same

pytestmark = requires_mlx

GEN = np.random.default_rng(1415)
Q = GEN.standard_normal((2, 4, 6, 8)).astype(np.float32)
K = GEN.standard_normal((2, 2, 9, 8)).astype(np.float32)
V = GEN.standard_normal((2, 2, 9, 5)).astype(np.float32)
G = GEN.standard_normal((2, 4, 6, 5)).astype(np.float32)
SINKS = np.linspace(-1.0, 1.0, 4).astype(np.float32)
MASKS = {"add": GEN.standard_normal((6, 9)).astype(np.float32),
         "bool": GEN.random((2, 1, 6, 9)) < 0.7}


def _grads(m, dtype, mask, sinks, kv_heads=2, tq=6):
    d = getattr(m, dtype)
    q, k, v = (m.array(a).astype(d) for a in (Q[:, :, :tq], K[:, :kv_heads], V[:, :kv_heads]))
    g = m.array(G[:, :, :tq]).astype(d)
    mm = mask
    if mask in MASKS:
        mm = m.array(MASKS[mask][..., :tq, :])
        mm = mm.astype(d) if mask == "add" else mm
    args = [q, k, v] + ([m.array(SINKS).astype(d)] if sinks else [])

    def loss(*xs):
        o = m.fast.scaled_dot_product_attention(*xs[:3], scale=0.35, mask=mm,
                                                sinks=xs[3] if sinks else None)
        return (o * g).astype(m.float32).sum()
    return m.grad(loss, argnums=tuple(range(len(args))))(*args)


@pytest.mark.parametrize("mask", [None, "causal", "add", "bool"])
@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("kv_heads,tq", [(2, 6), (1, 4), (4, 6)], ids=["gqa", "mqa_short", "mha"])
def test_gradients(mask, sinks, kv_heads, tq):
    same(lambda m: _grads(m, "float32", mask, sinks, kv_heads, tq), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("dtype,tol", [("float16", 1e-2), ("bfloat16", 6e-2)])
@pytest.mark.parametrize("mask", [None, "causal"])
def test_gradients_half(dtype, tol, mask):
    # MLX's CPU rounds intermediate products to the half type; lazyx computes in float32
    # and rounds once: the gradients agree to a few ulps of the half type.
    same(lambda m: _grads(m, dtype, mask, True), rtol=tol, atol=tol)


def test_second_derivatives():
    """grad of grad: the backward node's own rule (the composition's)."""
    def fn(m):
        k, v, g = m.array(K), m.array(V), m.array(G)

        def inner(q):
            o = m.fast.scaled_dot_product_attention(q, k, v, scale=0.35, mask="causal")
            return (o * g).sum()

        def outer(q):
            return (m.grad(inner)(q) ** 2).sum()
        return m.grad(outer)(m.array(Q))
    same(fn, rtol=2e-4, atol=2e-5)
