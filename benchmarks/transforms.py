"""The cost of taking a gradient: ``value_and_grad`` over the forward pass alone.

    python benchmarks/transforms.py [--quick]

Two functions, written once per framework with the same operations:

* a chain of 50 element-wise ops on a vector, summed;
* the cross-entropy loss of a 784-256-10 MLP (ReLU) on a batch of 128.

For each framework the table gives the forward time, the ``value_and_grad``
time (value and every gradient evaluated) and their ratio: the overhead of
differentiating. lazyx and MLX (CPU build) are lazy: a timing covers building
the graph and evaluating it. PyTorch's forward runs under ``no_grad``; its
gradient is ``backward`` on a forward that records. The last column is
lazyx's ratio over the better of MLX's and PyTorch's (target: at most 1.5).
Times are medians of repeats after warm-ups, the frameworks taking turns.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks.timing import compare  # noqa: E402

#: Vector sizes of the chain: overhead-bound, between, compute-bound.
CHAIN_SIZES = (256, 4096, 65536)
BATCH, D_IN, D_HIDDEN, D_OUT = 128, 784, 256, 10


# -- the functions, per framework ---------------------------------------------------
def chain(ops, x):
    """50 element-wise ops (then a sum): ten rounds of sin, scale, tanh, ``y * y + y``
    (an array used twice, so the backward pass adds cotangents)."""
    y = x
    for _ in range(10):
        y = ops.sin(y)
        y = y * 1.5
        y = ops.tanh(y)
        y = y * y + y
    return ops.sum(y)


def mlp_loss(ops, matmul, w1, b1, w2, b2, x, onehot):
    """Mean cross-entropy of ``relu(x @ w1 + b1) @ w2 + b2`` against one-hot labels."""
    h = ops.maximum(matmul(x, w1) + b1, 0.0)
    logits = matmul(h, w2) + b2
    return ops.mean(ops.logsumexp(logits, axis=-1) - ops.sum(logits * onehot, axis=-1))


def data():
    gen = np.random.default_rng(0)
    f32 = np.float32
    xs = {n: gen.uniform(-1, 1, n).astype(f32) for n in CHAIN_SIZES}
    params = [(gen.standard_normal((D_IN, D_HIDDEN)) / np.sqrt(D_IN)).astype(f32),
              np.zeros(D_HIDDEN, f32),
              (gen.standard_normal((D_HIDDEN, D_OUT)) / np.sqrt(D_HIDDEN)).astype(f32),
              np.zeros(D_OUT, f32)]
    batch = gen.standard_normal((BATCH, D_IN)).astype(f32)
    onehot = np.eye(D_OUT, dtype=f32)[gen.integers(0, D_OUT, BATCH)]
    return xs, params, batch, onehot


def _mlx_style_cases(mx, xs, params, batch, onehot):
    """The cases for an MLX-style framework module ``mx`` (lazyx.core or mlx.core), on
    its CPU: the forward and ``value_and_grad`` of each function."""

    class Ops:
        sin, tanh, sum, maximum, mean, logsumexp = (mx.sin, mx.tanh, mx.sum, mx.maximum,
                                                    mx.mean, mx.logsumexp)

    mx.set_default_device(mx.cpu)
    ps = [mx.array(p) for p in params]
    xb, oh = mx.array(batch), mx.array(onehot)
    chain_vg = mx.value_and_grad(lambda v: chain(Ops, v))
    mlp = lambda w1, b1, w2, b2: mlp_loss(Ops, mx.matmul, w1, b1, w2, b2, xb, oh)  # noqa: E731
    mlp_vg = mx.value_and_grad(mlp, argnums=(0, 1, 2, 3))
    cases = {("chain", n): _lazy_case(mx, lambda v: chain(Ops, v), chain_vg, [mx.array(x)])
             for n, x in xs.items()}
    cases["mlp"] = _lazy_case(mx, mlp, mlp_vg, ps)
    return cases


def lazyx_cases(xs, params, batch, onehot):
    import lazyx.core as mx
    return _mlx_style_cases(mx, xs, params, batch, onehot)


def mlx_cases(xs, params, batch, onehot):
    import mlx.core as mx
    return _mlx_style_cases(mx, xs, params, batch, onehot)


def torch_cases(xs, params, batch, onehot):
    import torch

    class Ops:
        sin, tanh, mean, maximum = torch.sin, torch.tanh, torch.mean, torch.clamp_min

        @staticmethod
        def sum(a, axis=None):
            return torch.sum(a) if axis is None else torch.sum(a, dim=axis)

        @staticmethod
        def logsumexp(a, axis):
            return torch.logsumexp(a, dim=axis)

    ps = [torch.from_numpy(p) for p in params]
    xb, oh = torch.from_numpy(batch), torch.from_numpy(onehot)

    def forward(fn, *args):
        with torch.no_grad():
            return fn(*args)

    def value_and_grad(fn, *args):
        leaves = [a.detach().requires_grad_() for a in args]
        value = fn(*leaves)
        value.backward()
        return value.detach(), [a.grad for a in leaves]

    def case(fn, args):
        return (lambda: forward(fn, *args), lambda: value_and_grad(fn, *args),
                lambda: forward(fn, *args))

    mlp = lambda w1, b1, w2, b2: mlp_loss(Ops, torch.matmul, w1, b1, w2, b2, xb, oh)  # noqa: E731
    cases = {("chain", n): case(lambda v: chain(Ops, v), [torch.from_numpy(x)])
             for n, x in xs.items()}
    cases["mlp"] = case(mlp, ps)
    return cases


def _lazy_case(mx, fn, vg, args):
    """(forward, value_and_grad, value) callables of a lazy framework (lazyx or MLX)."""
    return (lambda: mx.eval(fn(*args)), lambda: mx.eval(*_flat(vg(*args))),
            lambda: fn(*args))


def _flat(value_and_grads):
    value, grads = value_and_grads
    return [value] + (list(grads) if isinstance(grads, (list, tuple)) else [grads])


def check_agreement(built) -> None:
    """The frameworks compute the same loss (a benchmark of different functions is void)."""
    for case in CASES:
        values = {name: float(np.asarray(cases[case][2]())) for name, cases in built.items()}
        ref = values.get("lazyx")
        for name, v in values.items():
            if not np.isclose(v, ref, rtol=1e-3, atol=1e-4):
                raise SystemExit(f"{case}: {name} computes {v}, lazyx {ref}")


CASES = {("chain", n): f"50 element-wise ops, n={n}" for n in CHAIN_SIZES}
CASES["mlp"] = "MLP 784-256-10, batch 128"
FRAMEWORKS = {"lazyx": lazyx_cases, "MLX": mlx_cases, "PyTorch": torch_cases}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="less time per figure")
    args = ap.parse_args(argv)
    budget = 0.3 if args.quick else 1.0
    inputs = data()
    built = {}
    for name, make in FRAMEWORKS.items():
        try:
            built[name] = make(*inputs)
        except ImportError as exc:
            print(f"{name}: not installed ({exc}); left out")
    check_agreement(built)
    print(f"{'case':34} {'framework':8} {'forward':>10} {'value_and_grad':>15} {'ratio':>7}"
          f" {'lazyx / best peer':>18}")
    for case, title in CASES.items():
        fns = {}
        for name, cases in built.items():
            fwd, vag, _ = cases[case]
            fns[(name, "fwd")] = fwd
            fns[(name, "vag")] = vag
        t = compare(fns, budget_s=budget, rounds=6, warmup=3)
        ratios = {name: t[(name, "vag")] / t[(name, "fwd")] for name in built}
        peers = [ratios[p] for p in ("MLX", "PyTorch") if p in ratios]
        for name in built:
            rel = ""
            if name == "lazyx" and peers:
                rel = f"{ratios[name] / min(peers):.2f}x"
            print(f"{title if name == next(iter(built)) else '':34} {name:8} "
                  f"{t[(name, 'fwd')] * 1e6:8.0f}us {t[(name, 'vag')] * 1e6:13.0f}us "
                  f"{ratios[name]:6.2f}x {rel:>18}")


if __name__ == "__main__":
    main()
