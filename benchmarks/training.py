"""training: steps per second of an MLP training step (784-512-512-10, batch 256, Adam),
eager and compiled, side by side with PyTorch's eager CPU step and MLX's CPU build.

One step is forward, cross-entropy, backward and the Adam update, waited for: lazyx and
MLX run the same program (``nn.value_and_grad`` + ``optimizer.update``, then
``eval(model, optimizer.state)``), compiled with the model's and the optimizer's state as
``inputs=``/``outputs=``; PyTorch runs ``loss.backward()`` + ``torch.optim.Adam.step()``.
Prints the fastest of interleaved repeats (the machine may be shared) in ms per step and
steps per second, and the ratios the issue sets targets for: lazyx compiled at least
PyTorch eager's steps per second, lazyx eager within 1.3x of it.
Run: ``python -m benchmarks.training [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks.peers import load  # noqa: E402
from benchmarks.timing import compare, machine_load  # noqa: E402

SIZES = (784, 512, 512, 10)
BATCH = 256


def _data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], BATCH).astype(np.int32)
    return x, y


def _mlx_like_step(core, nn, optim, compiled: bool):
    """A step of the MLX program on ``core``/``nn``/``optim`` (lazyx's or MLX's)."""

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = [nn.Linear(i, o) for i, o in zip(SIZES[:-1], SIZES[1:])]

        def __call__(self, x):
            for layer in self.layers[:-1]:
                x = nn.relu(layer(x))
            return self.layers[-1](x)

    core.random.seed(0)
    model = MLP()
    optimizer = optim.Adam(learning_rate=1e-3)
    optimizer.init(model.trainable_parameters())
    core.eval(model.parameters(), optimizer.state)

    def loss_fn(model, x, y):
        return nn.losses.cross_entropy(model(x), y, reduction="mean")

    loss_and_grad = nn.value_and_grad(model, loss_fn)
    state = [model.state, optimizer.state]

    def step(x, y):
        loss, grads = loss_and_grad(model, x, y)
        optimizer.update(model, grads)
        return loss

    if compiled:
        step = partial(core.compile, inputs=state, outputs=state)(step)
    xn, yn = _data()
    x, y = core.array(xn), core.array(yn)

    def run():
        loss = step(x, y)
        core.eval(loss, state)
        return loss
    return run


def _torch_step(torch):
    torch.manual_seed(0)
    layers = []
    for i, o in zip(SIZES[:-1], SIZES[1:]):
        layers += [torch.nn.Linear(i, o), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    xn, yn = _data()
    x, y = torch.from_numpy(xn), torch.from_numpy(yn.astype(np.int64))

    def run():
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss
    return run


def callables(peers) -> dict:
    import lazyx.nn
    import lazyx.optimizers
    out = {"lazyx eager": _mlx_like_step(peers["lazyx"].module, lazyx.nn, lazyx.optimizers, False),
           "lazyx compiled": _mlx_like_step(peers["lazyx"].module, lazyx.nn, lazyx.optimizers,
                                            True)}
    if "PyTorch" in peers:
        out["PyTorch eager"] = _torch_step(peers["PyTorch"].module)
    if "MLX" in peers:
        import mlx.nn
        import mlx.optimizers
        mx = peers["MLX"].module
        out["MLX eager"] = _mlx_like_step(mx, mlx.nn, mlx.optimizers, False)
        out["MLX compiled"] = _mlx_like_step(mx, mlx.nn, mlx.optimizers, True)
    return out


def check(fns) -> None:
    """Every column trains: its loss falls over a few steps on the fixed batch (a benchmark
    of a step that does not learn is void)."""
    for name, fn in fns.items():
        first = float(fn().item())
        for _ in range(4):
            last = float(fn().item())
        assert last < first, f"{name}: the loss did not fall ({first} -> {last})"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="less time per figure")
    args = ap.parse_args(argv)
    peers = load()
    print(f"machine load before: {machine_load():.0%}; MLP {'-'.join(map(str, SIZES))}, "
          f"batch {BATCH}, Adam; " + "; ".join(f"{p.name} {p.version}" for p in peers.values()
                                               if p.name in ("lazyx", "PyTorch", "MLX")))
    fns = callables(peers)
    check(fns)
    t = compare(fns, budget_s=1.5 if args.quick else 6.0, rounds=4, warmup=3, statistic=min)
    for name, sec in t.items():
        print(f"  {name:16} {sec * 1e3:8.2f} ms/step  {1 / sec:8.1f} steps/s")
    if "PyTorch eager" in t:
        torch_s = t["PyTorch eager"]
        print(f"lazyx compiled steps/s / PyTorch eager: {torch_s / t['lazyx compiled']:5.2f}x "
              "(target >= 1)")
        print(f"lazyx eager time / PyTorch eager:       {t['lazyx eager'] / torch_s:5.2f}x "
              "(target <= 1.3)")
    if "MLX compiled" in t:
        print(f"lazyx compiled time / MLX compiled:     "
              f"{t['lazyx compiled'] / t['MLX compiled']:5.2f}x")
        print(f"lazyx eager time / MLX eager:           {t['lazyx eager'] / t['MLX eager']:5.2f}x")


if __name__ == "__main__":
    main()
