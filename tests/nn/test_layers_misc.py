"""RoPE, SinusoidalPositionalEncoding, ALiBi and the single-process sharded layers
(AllToShardedLinear, ShardedToAllLinear, FullyShardedModule): NumPy float64 references,
MLX on the same weights, gradients by finite differences, bad input."""

from __future__ import annotations

import numpy as np
import pytest

import lazyx.core as mx
import lazyx.nn as nn
from lazyx.errors import ArgumentError, ShapeError

from layer_checks import assert_matches_mlx, check_layer_grads, mlx_core, mlx_nn, requires_mlx, same_weights


def np_rope(x, dims, traditional, base, scale, offset):
    L = x.shape[-2]
    pos = (np.arange(L) + offset) * scale
    freqs = base ** (-np.arange(0, dims, 2) / dims)
    ang = pos[:, None] * freqs[None]
    cos, sin = np.cos(ang), np.sin(ang)
    y = x.astype(np.float64).copy()
    if traditional:
        a, b = x[..., 0:dims:2], x[..., 1:dims:2]
        y[..., 0:dims:2], y[..., 1:dims:2] = a * cos - b * sin, a * sin + b * cos
    else:
        a, b = x[..., :dims // 2], x[..., dims // 2:dims]
        y[..., :dims // 2], y[..., dims // 2:dims] = a * cos - b * sin, a * sin + b * cos
    return y


@pytest.mark.parametrize("dims,traditional,base,scale", [(8, False, 10000, 1.0), (4, True, 100.0, 0.5)])
def test_rope_matches_numpy(dims, traditional, base, scale):
    x = np.random.default_rng(0).standard_normal((2, 3, 5, 8)).astype(np.float32)
    rope = nn.RoPE(dims, traditional, base, scale)
    np.testing.assert_allclose(np.array(rope(mx.array(x), offset=2)),
                               np_rope(x, dims, traditional, base, scale, 2), rtol=1e-5, atol=1e-5)
    assert repr(rope) == f"RoPE({dims}, traditional={traditional})"
    assert rope.parameters() == {}


def test_sinusoidal_matches_numpy():
    p = np.random.default_rng(1).random((4, 3)) * 10
    pe = nn.SinusoidalPositionalEncoding(8, min_freq=0.01, cos_first=True, full_turns=True)
    sig = np.exp((1 - np.arange(4) / 3) * (0 - np.log(0.01)) + np.log(0.01)) * 2 * np.pi
    y = p[..., None] * sig
    ref = np.concatenate([np.cos(y), np.sin(y)], -1) * np.sqrt(2 / 8)
    np.testing.assert_allclose(np.array(pe(mx.array(p, dtype=mx.float32))), ref, rtol=1e-4, atol=1e-5)
    assert pe.parameters() == {}


def test_alibi_matches_numpy():
    s = np.random.default_rng(2).standard_normal((2, 4, 3, 6))
    mask = np.random.default_rng(3).standard_normal((3, 6))
    got = nn.ALiBi()(mx.array(s, dtype=mx.float32), offset=2, mask=mx.array(mask, dtype=mx.float32))
    slopes = 2.0 ** (-8 * np.arange(1, 5) / 4)  # 4 heads: a power of two
    dist = -np.abs(np.arange(2, 5)[:, None] - np.arange(6)[None])
    np.testing.assert_allclose(np.array(got), s + slopes[:, None, None] * dist + mask, rtol=1e-5, atol=1e-5)


@requires_mlx
def test_positional_match_mlx():
    x = np.random.default_rng(4).standard_normal((2, 3, 5, 8)).astype(np.float32)
    for args in [(8,), (6, True, 500.0, 2.0)]:
        ours, ref = nn.RoPE(*args), mlx_nn.RoPE(*args)
        assert repr(ours) == repr(ref)
        assert_matches_mlx(ours(mx.array(x), offset=3), ref(mlx_core.array(x), offset=3))
    p = np.random.default_rng(5).random((4, 3)).astype(np.float32) * 10
    assert_matches_mlx(nn.SinusoidalPositionalEncoding(16)(mx.array(p)),
                       mlx_nn.SinusoidalPositionalEncoding(16)(mlx_core.array(p)), atol=1e-5)
    assert_matches_mlx(nn.ALiBi()(mx.array(x), offset=1), mlx_nn.ALiBi()(mlx_core.array(x), offset=1))
    for heads in (3, 5, 6, 8):  # the paper's interleaved slopes beyond a power of two
        np.testing.assert_array_equal(
            np.array(nn.ALiBi.create_alibi_slope(heads)),
            np.array(mlx_nn.ALiBi.create_alibi_slope(heads, mlx_core.float32)))


def test_rope_gradient():
    check_layer_grads(nn.RoPE(4), np.random.default_rng(6).standard_normal((1, 3, 6)))


def test_rope_too_few_features():
    with pytest.raises(ShapeError, match=r"\[RoPE\].*\(1, 3, 4\).*dims=8"):
        nn.RoPE(8)(mx.zeros((1, 3, 4)))


# -- single-process sharded layers ------------------------------------------------------

@pytest.mark.parametrize("name", ["AllToShardedLinear", "ShardedToAllLinear"])
def test_sharded_linear_is_linear_alone(name):
    lin = nn.Linear(6, 4)
    layer = getattr(nn, name).from_linear(lin)
    assert repr(layer) == f"{name}(input_dims=6, output_dims=4, bias=True)"
    x = np.random.default_rng(7).standard_normal((3, 6))
    ref = x @ np.array(lin.weight, dtype=np.float64).T + np.array(lin.bias)
    np.testing.assert_allclose(np.array(layer(mx.array(x, dtype=mx.float32))), ref, rtol=1e-5, atol=1e-5)
    check_layer_grads(getattr(nn, name)(3, 2), np.random.default_rng(8).standard_normal((2, 3)))
    with pytest.raises(ShapeError, match=rf"\[{name}\].*weight of shape"):
        layer(mx.zeros((3, 5)))


@requires_mlx
@pytest.mark.parametrize("name", ["AllToShardedLinear", "ShardedToAllLinear"])
def test_sharded_linear_matches_mlx(name):
    ref = getattr(mlx_nn, name)(6, 4)
    layer = same_weights(ref, getattr(nn, name)(6, 4))
    assert repr(layer) == repr(ref)
    x = np.random.default_rng(9).standard_normal((3, 6)).astype(np.float32)
    assert_matches_mlx(layer(mx.array(x)), ref(mlx_core.array(x)))


def test_fully_sharded_module():
    lin = nn.Linear(4, 3)
    wrapped = nn.FullyShardedModule(lin)
    assert repr(wrapped).startswith("FullyShardedModule(num_sharded_params=2\n  (module): Linear(")
    x = mx.random.normal((2, 4))
    np.testing.assert_array_equal(np.array(wrapped(x)), np.array(lin(x)))
    assert nn.fully_shard(lin) is lin  # nothing to shard alone, as MLX
    half = nn.FullyShardedModule(nn.Linear(4, 3), compute_dtype=mx.float16)
    assert half(x.astype(mx.float16)).dtype == mx.float16
    assert half.module.weight.dtype == mx.float32  # only the call sees the cast


def test_shards_of_a_group_of_several_processes():
    """The rank's slice of each parameter (no collective is needed to cut them; the
    layers across processes are tests/distributed/test_nn_distributed.py's)."""
    class Rank1of2:
        def size(self):
            return 2

        def rank(self):
            return 1

    lin = nn.Linear(6, 4)
    w, b = np.array(lin.weight), np.array(lin.bias)
    a = nn.AllToShardedLinear.from_linear(lin, group=Rank1of2())
    np.testing.assert_array_equal(np.array(a.weight), w[2:])
    np.testing.assert_array_equal(np.array(a.bias), b[2:])
    s = nn.ShardedToAllLinear.from_linear(lin, group=Rank1of2())
    np.testing.assert_array_equal(np.array(s.weight), w[:, 3:])
    np.testing.assert_array_equal(np.array(s.bias), b)
    with pytest.raises(ArgumentError, match=r"\[AllToShardedLinear\] cannot shard the output of "
                                            r"size 5 across 2 processes"):
        nn.AllToShardedLinear(4, 5, group=Rank1of2())
