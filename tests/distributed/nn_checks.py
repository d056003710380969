"""The checks of tests/distributed/test_nn_distributed.py, run on every rank of a job.

Each check compares the sharded layers (or ``average_gradients``) across the processes
with a single-process reference computed on every rank from the same seed: NumPy
float64 for the float layers, the whole ``QuantizedLinear`` for the quantized ones, the
whole module's gradients for ``FullyShardedModule``. Every rank prints ``PASS name`` or
``FAIL name: why`` per check and exits with status 1 if one failed.
"""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
import traceback
from pathlib import Path

import numpy as np

import lazyx.core as mx
import lazyx.nn as nn
from lazyx.errors import ArgumentError, ShapeError
from lazyx.utils import tree_flatten

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
GROUP = mx.distributed.init()
N, R = GROUP.size(), GROUP.rank()
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def f64(a):
    return np.asarray(a, dtype=np.float64)


def close(got, want, tol=2e-5, what="values"):
    np.testing.assert_allclose(f64(got), f64(want), rtol=tol, atol=tol, err_msg=what)


def rows_of_rank(size: int, segments, r: int = R) -> np.ndarray:
    """The indices of an axis of ``size`` that rank ``r`` holds: every segment's r-th N-th."""
    points = list(range(size // segments, size, size // segments)) if isinstance(segments, int) \
        else list(segments)
    idx = []
    for part in np.split(np.arange(size), points):
        idx.extend(np.split(part, N)[r])
    return np.array(idx)


def dense_reference(seed=0, i=12, o=12):
    mx.random.seed(seed)
    lin = nn.Linear(i, o)
    x = np.random.default_rng(seed).standard_normal((5, i)).astype(np.float32)
    return lin, f64(lin.weight), f64(lin.bias), x


@check
def all_to_sharded_forward():
    for segments in (1, 2, [6]):
        lin, w, b, x = dense_reference()
        layer = nn.AllToShardedLinear.from_linear(lin, segments=segments)
        mine = rows_of_rank(12, segments)
        close(layer.weight, w[mine], 0, "weight shard")
        close(layer(mx.array(x)), (f64(x) @ w.T + b)[:, mine], what=f"segments={segments}")
        assert repr(layer) == "AllToShardedLinear(input_dims=12, output_dims=12, bias=True)"


@check
def sharded_to_all_forward():
    for segments in (1, 2):
        lin, w, b, x = dense_reference()
        layer = nn.ShardedToAllLinear.from_linear(lin, segments=segments)
        mine = rows_of_rank(12, segments)
        close(layer.weight, w[:, mine], 0, "weight shard")
        close(layer.bias, b, 0, "the whole bias")
        close(layer(mx.array(x[:, mine])), f64(x) @ w.T + b, what=f"segments={segments}")


@check
def sharded_mlp_gradients():
    """AllToSharded -> relu -> ShardedToAll (Megatron's MLP): output, input gradient and
    parameter gradients equal the whole MLP's (the parameters' as this rank's slices)."""
    mx.random.seed(3)
    up, down = nn.Linear(6, 12), nn.Linear(12, 6)
    x = mx.array(np.random.default_rng(4).standard_normal((4, 6)).astype(np.float32))
    mlp = nn.Sequential(up, nn.ReLU(), down)
    sharded = nn.Sequential(nn.AllToShardedLinear.from_linear(up), nn.ReLU(),
                            nn.ShardedToAllLinear.from_linear(down))

    def loss(model, x):
        return (model(x) ** 2).sum()

    close(sharded(x), mlp(x), what="output")
    close(mx.grad(lambda x: loss(sharded, x))(x), mx.grad(lambda x: loss(mlp, x))(x), 1e-4,
          "input gradient")
    _, g = nn.value_and_grad(sharded, lambda x: loss(sharded, x))(x)
    _, want = nn.value_and_grad(mlp, lambda x: loss(mlp, x))(x)
    mine = rows_of_rank(12, 1)
    close(g["layers"][0]["weight"], f64(want["layers"][0]["weight"])[mine], 1e-4, "up.weight")
    close(g["layers"][0]["bias"], f64(want["layers"][0]["bias"])[mine], 1e-4, "up.bias")
    close(g["layers"][2]["weight"], f64(want["layers"][2]["weight"])[:, mine], 1e-4, "down.w")
    close(g["layers"][2]["bias"], want["layers"][2]["bias"], 1e-4, "down.bias")


@check
def quantized_layers():
    mx.random.seed(5)
    q = nn.QuantizedLinear(192, 12, group_size=32, bits=4)
    q.update({"bias": mx.random.normal((12,))})
    x = mx.array(np.random.default_rng(6).standard_normal((3, 192)).astype(np.float32))
    whole = f64(q(x))
    a = nn.QuantizedAllToShardedLinear.from_quantized_linear(q)
    assert a.trainable_parameters() == {}
    assert repr(a).startswith("QuantizedAllToShardedLinear(input_dims=192, output_dims=12,")
    close(a(x), whole[:, rows_of_rank(12, 1)], 1e-4, "all-to-sharded")
    s = nn.QuantizedShardedToAllLinear.from_quantized_linear(q)
    assert repr(s).startswith("QuantizedShardedToAllLinear(input_dims=192, output_dims=12,")
    cols = rows_of_rank(192, 1)
    close(s(x[:, cols[0]:cols[-1] + 1]), whole, 1e-4, "sharded-to-all")
    fresh = nn.QuantizedAllToShardedLinear(192, 12, group_size=32, bits=4)
    assert fresh.weight.shape == (12 // N, 192 * 4 // 32)
    # the quantized Megatron pair: output and input gradient are the whole pair's
    up = nn.QuantizedLinear(64, 192, group_size=32, bits=4)
    x = mx.array(np.random.default_rng(7).standard_normal((3, 64)).astype(np.float32))
    pair = nn.Sequential(nn.QuantizedAllToShardedLinear.from_quantized_linear(up), nn.GELU(),
                         nn.QuantizedShardedToAllLinear.from_quantized_linear(q))
    whole = nn.Sequential(up, nn.GELU(), q)
    close(pair(x), whole(x), 1e-4, "quantized pair")
    close(mx.grad(lambda x: (pair(x) ** 2).sum())(x), mx.grad(lambda x: (whole(x) ** 2).sum())(x),
          1e-4, "quantized pair: input gradient")


@check
def fully_sharded_module():
    def build():
        mx.random.seed(7)
        return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 6))

    def data(r):
        return mx.array(np.random.default_rng(100 + r).standard_normal((4, 6)).astype(np.float32))

    def loss(model, x):
        return (model(x) ** 2).mean()

    whole = build()
    fsdp = nn.fully_shard(build())
    assert isinstance(fsdp, nn.FullyShardedModule) and N > 1
    shapes = {k: v.shape for k, v in tree_flatten(fsdp.parameters())}
    assert shapes["module.layers.0.weight"] == (12 // N, 6), shapes
    close(fsdp(data(R)), whole(data(R)), what="forward")
    _, g = nn.value_and_grad(fsdp, lambda x: loss(fsdp, x))(data(R))
    # each rank's shard gradient: the mean over the ranks' whole gradients, its slice
    grads = [dict(tree_flatten(nn.value_and_grad(whole, lambda x: loss(whole, x))(data(r))[1]))
             for r in range(N)]
    for k, v in tree_flatten(g):
        full = np.mean([f64(gr[k.removeprefix("module.")]) for gr in grads], axis=0)
        close(v, np.split(full, N)[R], 1e-4, k)
    half = nn.fully_shard(build(), compute_dtype=mx.float16)
    assert half(data(R).astype(mx.float16)).dtype == mx.float16
    assert half.module.layers[0].weight.dtype == mx.float32
    try:
        nn.fully_shard(nn.Linear(4, N + 1))
    except ShapeError as e:
        assert "cannot shard parameter 'weight' of shape" in str(e), e
    else:
        raise AssertionError("an indivisible parameter was sharded")


def _tree(r):
    """A gradient tree of rank r: mixed sizes and dtypes, an integer leaf."""
    rng = np.random.default_rng(r)
    return {"w": [mx.array(rng.standard_normal((4,)).astype(np.float32)) for _ in range(5)],
            "big": mx.array(rng.standard_normal((100,)).astype(np.float32)),
            "half": mx.array(rng.standard_normal((3, 2)).astype(np.float16)),
            "count": mx.array(rng.integers(0, 9, (3,)).astype(np.int32)),
            "tail": (mx.array(rng.standard_normal((2, 2)).astype(np.float32)),)}


@check
def average_gradients_batched():
    want = {k: np.mean([f64(dict(tree_flatten(_tree(r)))[k]) for r in range(N)], axis=0)
            for k, _ in tree_flatten(_tree(0))}
    calls = []
    real = mx.distributed.all_sum

    def counting(x, **kw):
        calls.append(x.size)
        return real(x, **kw)

    mx.distributed.all_sum = counting
    try:
        # all_reduce_size -> the all_sum calls: per array; 16 B = one float32[4] per batch;
        # 64 B closes after four of them; 1 MiB one batch per run of one dtype.
        for size, sizes in ((0, [4] * 5 + [100, 6, 3, 4]), (16, [4] * 5 + [100, 6, 3, 4]),
                            (64, [16, 104, 6, 3, 4]), (1 << 20, [120, 6, 3, 4])):
            calls.clear()
            got = nn.average_gradients(_tree(R), all_reduce_size=size)
            assert calls == sizes, (size, calls)
            flat = dict(tree_flatten(got))
            for k, v in want.items():
                close(flat[k], v, 2e-3 if k == "half" else 1e-6, f"{k} (size {size})")
            assert flat["half"].dtype == mx.float16 and flat["count"].dtype == mx.float32
            assert isinstance(got["tail"], (tuple, list))
    finally:
        mx.distributed.all_sum = real


@check
def split_groups():
    """``group=``: a subgroup from ``split`` (ranks of one parity) averages and shards
    among its members only."""
    sub = GROUP.split(R % 2)
    members = [r for r in range(N) if r % 2 == R % 2]
    assert sub.size() == len(members) and sub.rank() == members.index(R)
    got = dict(tree_flatten(nn.average_gradients(_tree(R), group=sub, all_reduce_size=64)))
    for k, v in tree_flatten(_tree(0)):
        want = np.mean([f64(dict(tree_flatten(_tree(r)))[k]) for r in members], axis=0)
        close(got[k], want, 2e-3 if k == "half" else 1e-6, k)
    lin, w, b, x = dense_reference(i=12, o=12)
    layer = nn.ShardedToAllLinear.from_linear(lin, group=sub)
    cols = np.split(np.arange(12), sub.size())[sub.rank()]
    close(layer(mx.array(x[:, cols])), f64(x) @ w.T + b, what="ShardedToAllLinear on a subgroup")


@check
def bad_sharding_is_refused():
    for build, text in [(lambda: nn.AllToShardedLinear(4, N * 2 + 1),
                         f"cannot shard the output of size {N * 2 + 1} across {N}"),
                        (lambda: nn.ShardedToAllLinear(N * 2 + 1, 4),
                         f"cannot shard the input of size {N * 2 + 1} across {N}"),
                        (lambda: nn.AllToShardedLinear.from_linear(nn.Linear(2, 4 * N),
                                                                   segments=[1]),
                         "cannot shard a segment of size 1")]:
        try:
            build()
        except (ArgumentError, ShapeError) as e:
            assert text in str(e), (text, str(e))
        else:
            raise AssertionError(f"no error for: {text}")


def _example(name: str):
    """The ``main`` of ``examples/<name>.py``, its output kept for the check's message."""
    return runpy.run_path(str(EXAMPLES / f"{name}.py"))["main"]


@check
def example_data_parallel():
    """examples/distributed_mlp.py: the N-process losses equal one process's on the whole
    batches (its ``--check``, with SGD: to the float epsilon over every step)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = _example("distributed_mlp")(epochs=1, batch_size=16 * N, steps=12,
                                              optimizer="sgd", learning_rate=0.1, check=True)
    assert len(result["losses"]) == 12
    if R == 0:
        gaps = np.abs(np.subtract(result["losses"], result["reference"]))
        assert np.max(gaps / np.abs(result["reference"])) <= 1e-5, out.getvalue()
        assert "check passed" in out.getvalue()


@check
def example_tensor_parallel():
    """examples/tensor_parallel.py: the sharded block's output and input gradient equal
    the whole block's (2 heads per process)."""
    with contextlib.redirect_stdout(io.StringIO()):
        gaps = _example("tensor_parallel")(dims=16 * N, num_heads=2 * N, length=8)
    assert max(gaps.values()) <= 1e-4, gaps


def main() -> int:
    only = set(sys.argv[1:])
    failed = 0
    for fn in CHECKS:
        if only and fn.__name__ not in only:
            continue
        try:
            fn()
            print(f"PASS {fn.__name__} rank {R}", flush=True)
        except Exception:
            failed += 1
            why = traceback.format_exc().strip().splitlines()
            print(f"FAIL {fn.__name__} rank {R}: {' | '.join(why[-4:])}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
