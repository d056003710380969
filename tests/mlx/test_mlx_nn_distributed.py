"""The sharded layers of ``lazyx.nn`` and ``average_gradients`` against ``mlx.nn`` in a
single process (the group of one process that ``init()`` gives a plain run): the same
weights give the same shards, parameters, reprs, outputs and gradients; bad sharding
raises the same exception type. Several processes: tests/distributed/test_nn_distributed.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import lazyx.core as mx
import lazyx.nn as nn
from lazyx.nn.layers import distributed as lx_dist
from lazyx.utils import tree_flatten, tree_unflatten
from mlx_compat import mlx, requires_mlx

pytestmark = requires_mlx

if mlx is not None:
    import mlx.nn as mlx_nn
    import mlx.nn.layers.distributed as mlx_dist
    from mlx.utils import tree_flatten as mlx_tree_flatten


def _copy(mlx_layer, lx_layer):
    """``lx_layer`` with ``mlx_layer``'s parameters (strict: names and shapes must agree)."""
    pairs = [(k, mx.array(np.array(v))) for k, v in mlx_tree_flatten(mlx_layer.parameters())]
    lx_layer.update(tree_unflatten(pairs))
    return lx_layer


def _same_parameters(lx_layer, mlx_layer):
    got = {k: np.array(v) for k, v in tree_flatten(lx_layer.parameters())}
    want = {k: np.array(v) for k, v in mlx_tree_flatten(mlx_layer.parameters())}
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def _close(a, b, tol=2e-5):
    np.testing.assert_allclose(np.array(a.astype(mx.float32)),
                               np.array(b.astype(mlx.float32)), rtol=tol, atol=tol)


X = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)


@pytest.mark.parametrize("name", ["AllToShardedLinear", "ShardedToAllLinear"])
@pytest.mark.parametrize("segments", [1, 2, [16, 48]])
def test_from_linear_matches_mlx(name, segments):
    ref_linear = mlx_nn.Linear(64, 64)
    linear = _copy(ref_linear, nn.Linear(64, 64))
    ref = getattr(mlx_nn, name).from_linear(ref_linear, segments=segments)
    got = getattr(nn, name).from_linear(linear, segments=segments)
    assert repr(got) == repr(ref)
    _same_parameters(got, ref)
    _close(got(mx.array(X)), ref(mlx.array(X)))
    # the input's gradient (a group of one: summed over itself)
    g = mx.grad(lambda x: (got(x) ** 2).sum())(mx.array(X))
    w = mlx.grad(lambda x: (ref(x) ** 2).sum())(mlx.array(X))
    _close(g, w, 1e-4)


@pytest.mark.parametrize("name", ["QuantizedAllToShardedLinear", "QuantizedShardedToAllLinear"])
def test_from_quantized_linear_matches_mlx(name):
    ref_q = mlx_nn.QuantizedLinear(64, 16, group_size=32, bits=8)
    q = _copy(ref_q, nn.QuantizedLinear(64, 16, group_size=32, bits=8))
    ref = getattr(mlx_nn, name).from_quantized_linear(ref_q)
    got = getattr(nn, name).from_quantized_linear(q)
    assert repr(got) == repr(ref)
    _same_parameters(got, ref)
    assert got.trainable_parameters() == {} and got.unfreeze().trainable_parameters() == {}
    _close(got(mx.array(X)), ref(mlx.array(X)), 1e-4)


@pytest.mark.parametrize("sharding", ["all-to-sharded", "sharded-to-all"])
def test_shard_linear_and_shard_inplace_match_mlx(sharding):
    ref_linear = mlx_nn.Linear(64, 32, bias=False)
    linear = _copy(ref_linear, nn.Linear(64, 32, bias=False))
    ref, got = mlx_dist.shard_linear(ref_linear, sharding), lx_dist.shard_linear(linear, sharding)
    assert type(got).__name__ == type(ref).__name__ and repr(got) == repr(ref)
    _same_parameters(got, ref)
    mlx_dist.shard_inplace(ref_linear, sharding, segments=2)
    lx_dist.shard_inplace(linear, sharding, segments=2)
    _same_parameters(linear, ref_linear)


def test_fully_sharded_module_matches_mlx():
    ref = mlx_nn.FullyShardedModule(mlx_nn.Sequential(mlx_nn.Linear(64, 8), mlx_nn.Linear(8, 4)))
    got = _copy(ref, nn.FullyShardedModule(nn.Sequential(nn.Linear(64, 8), nn.Linear(8, 4))))
    assert repr(got) == repr(ref)
    _close(got(mx.array(X)), ref(mlx.array(X)))
    _, g = nn.value_and_grad(got, lambda x: (got(x) ** 2).sum())(mx.array(X))
    _, w = mlx_nn.value_and_grad(ref, lambda x: (ref(x) ** 2).sum())(mlx.array(X))
    gf, wf = dict(tree_flatten(g)), dict(mlx_tree_flatten(w))
    assert sorted(gf) == sorted(wf)
    for k in wf:
        _close(gf[k], wf[k], 1e-4)
    half = nn.FullyShardedModule(nn.Linear(4, 3), compute_dtype=mx.float16)
    ref_half = mlx_nn.FullyShardedModule(mlx_nn.Linear(4, 3), compute_dtype=mlx.float16)
    assert str(half(mx.ones((1, 4), mx.float16)).dtype).split(".")[-1] == \
        str(ref_half(mlx.ones((1, 4), mlx.float16)).dtype).split(".")[-1]
    linear, ref_linear = nn.Linear(2, 2), mlx_nn.Linear(2, 2)
    assert (nn.fully_shard(linear) is linear) == (mlx_nn.fully_shard(ref_linear) is ref_linear)


def test_average_gradients_alone_is_the_identity_as_mlx():
    tree = {"a": mx.ones((2,)), "b": [mx.zeros((3,), mx.int32)]}
    ref = {"a": mlx.ones((2,)), "b": [mlx.zeros((3,), mlx.int32)]}
    for size in (0, 4, 32 * 1024**2):
        assert nn.average_gradients(tree, all_reduce_size=size) is tree
        assert mlx_nn.average_gradients(ref, all_reduce_size=size) is ref


@pytest.mark.parametrize("build", [
    lambda nn_, lin: nn_.AllToShardedLinear.from_linear(lin, segments=3),  # 4 rows in 3
    lambda nn_, lin: nn_.ShardedToAllLinear.from_linear(lin, segments=4),  # 6 columns in 4
    lambda nn_, lin: nn_.AllToShardedLinear.from_linear(lin, segments=0),
])
def test_bad_segments_raise_mlx_exception_type(build):
    with pytest.raises(ValueError):
        build(mlx_nn, mlx_nn.Linear(6, 4))
    with pytest.raises(ValueError, match=r"AllToShardedLinear|ShardedToAllLinear"):
        build(nn, nn.Linear(6, 4))


def test_shard_linear_bad_sharding_raises_value_error_as_mlx():
    with pytest.raises(ValueError):
        mlx_dist.shard_linear(mlx_nn.Linear(2, 2), "bogus")
    with pytest.raises(ValueError, match="all-to-sharded"):
        lx_dist.shard_linear(nn.Linear(2, 2), "bogus")
