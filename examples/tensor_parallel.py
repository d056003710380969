"""Tensor parallelism: one transformer block split across N processes, checked against
the same block on one process.

    python -m lazyx.launch -n 2 examples/tensor_parallel.py
    python -m lazyx.launch -n 4 examples/tensor_parallel.py --num-heads 8

The block is ``examples/char_lm.py``'s pre-norm ``Block`` (``RMSNorm ->
MultiHeadAttention``, ``RMSNorm -> Linear -> gelu -> Linear``, each added to the residual
stream). Megatron-LM's split of it needs two collectives per block, both inside the
sharded layers of ``lazyx.nn``:

1. attention: the query, key and value projections become ``AllToShardedLinear``: each
   process computes ``num_heads / N`` heads from the whole input (no communication); the
   output projection becomes ``ShardedToAllLinear``: each process multiplies its heads'
   slice and one ``all_sum`` adds the partial products (then the bias, once);
2. the MLP: ``up`` is ``AllToShardedLinear`` (``4 * dims / N`` hidden units per process,
   gelu is element-wise so it needs nothing), ``down`` is ``ShardedToAllLinear``.

The norms and the residual stream stay whole on every process. Backwards, the sharded
layers' rules sum the replicated inputs' gradients over the group, so the gradient of
the input is the whole block's too.

The flow of the script: every process builds the same block (one seed), computes the
reference output and input gradient alone, cuts the block into its shard with
``from_linear`` (the weights are the same numbers, split), runs the sharded block, and
compares: the largest difference is printed by rank 0; exit status 1 above tolerance.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import lazyx.core as mx
import lazyx.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, also under runpy
from char_lm import Block  # noqa: E402
from training import command_line  # noqa: E402

TOLERANCE = 1e-4


def shard_block(block: Block, group) -> Block:
    """``block`` with its projections replaced (in place) by this process's shards."""
    n = group.size()
    attention = block.attention
    if attention.num_heads % n:
        raise SystemExit(f"{attention.num_heads} heads cannot be split across {n} processes")
    attention.num_heads //= n
    for name in ("query_proj", "key_proj", "value_proj"):
        attention[name] = nn.AllToShardedLinear.from_linear(attention[name], group=group)
    attention.out_proj = nn.ShardedToAllLinear.from_linear(attention.out_proj, group=group)
    block.up = nn.AllToShardedLinear.from_linear(block.up, group=group)
    block.down = nn.ShardedToAllLinear.from_linear(block.down, group=group)
    return block


def output_and_input_gradient(block: Block, x, mask):
    """The block's output and the gradient of ``sum(output * weights)`` by its input."""
    weights = mx.cos(mx.arange(x.size, dtype=mx.float32).reshape(x.shape))
    out = block(x, mask)
    grad = mx.grad(lambda x: (block(x, mask) * weights).sum())(x)
    return out, grad


def main(dims: int = 64, num_heads: int = 4, length: int = 16, batch: int = 2,
         seed: int = 0) -> dict:
    """Run the block alone and sharded; returns ``{"output_gap", "gradient_gap"}``."""
    group = mx.distributed.init()
    mx.random.seed(seed)
    block = Block(dims, num_heads)
    x = mx.random.normal((batch, length, dims))
    mask = nn.MultiHeadAttention.create_additive_causal_mask(length)
    want_out, want_grad = output_and_input_gradient(block, x, mask)
    mx.eval(want_out, want_grad)

    shard_block(block, group)
    got_out, got_grad = output_and_input_gradient(block, x, mask)
    gaps = {"output_gap": float(np.max(np.abs(np.asarray(got_out) - np.asarray(want_out)))),
            "gradient_gap": float(np.max(np.abs(np.asarray(got_grad) - np.asarray(want_grad))))}
    if group.rank() == 0:
        print(f"{group.size()} process(es), {block.attention.num_heads} heads and "
              f"{block.up.weight.shape[0]} hidden units each: output differs from one "
              f"process by {gaps['output_gap']:.2e}, input gradient by "
              f"{gaps['gradient_gap']:.2e} (tolerance {TOLERANCE:g})")
    if max(gaps.values()) > TOLERANCE:
        raise SystemExit(1)
    if group.rank() == 0:
        print("tensor-parallel block matches")
    return gaps


if __name__ == "__main__":
    command_line(main, __doc__)
