"""Memory over a long run: an MLP training step, eager and compiled, for 10,000 steps.

    python benchmarks/memory.py [--steps N] [--json]

The step is a two-layer MLP (tanh, biases) with an MSE loss and Adam written with
core ops (its state, the step count included, is arrays, as MLX's optimizers keep
it); the compiled step is ``mx.compile(step, inputs=state, outputs=state)``, the
captured-state pattern of MLX. Each mode runs ``steps`` steps, evaluating the
loss and the whole state after each, and reports steps per second (after the
warm-up) and, at the start (after the first step), the end of the warm-up (a
quarter of the run), the middle and the end:

* lazyx's active memory (``mx.get_active_memory()``: the bytes of live buffers),
* the process's resident set size (RSS, from ``/proc/self/statm``),
* Python's allocated blocks (``sys.getallocatedblocks()``: live Python objects).

All three must stay flat after the warm-up: a graph, a buffer, a trace or any
Python object kept per step shows as growth. ``--json`` prints the figures as
one JSON object instead of a table; ``tests/core/test_memory_flat.py`` runs this
file that way with ``--steps 2000`` in a child process (the test runner's own
memory is noisy) and checks the growth. ``--leak`` keeps one 0-d array per step,
to show what a leak looks like in these figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import lazyx.core as mx  # noqa: E402

N_IN, N_HIDDEN, N_OUT, BATCH = 8, 32, 1, 16
LR, B1, B2, EPS = 1e-2, 0.9, 0.999, 1e-8
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def make_state(seed: int = 0) -> dict:
    """The parameters and Adam's state (moments and step count), all arrays."""
    gen = np.random.default_rng(seed)
    params = {"w1": mx.array(gen.standard_normal((N_IN, N_HIDDEN)).astype(np.float32) * 0.3),
              "b1": mx.zeros((N_HIDDEN,)),
              "w2": mx.array(gen.standard_normal((N_HIDDEN, N_OUT)).astype(np.float32) * 0.3),
              "b2": mx.zeros((N_OUT,))}
    return {"params": params,
            "m": {k: mx.zeros_like(p) for k, p in params.items()},
            "v": {k: mx.zeros_like(p) for k, p in params.items()},
            "t": mx.array(0.0)}


def make_batch(seed: int = 1):
    gen = np.random.default_rng(seed)
    x = gen.standard_normal((BATCH, N_IN)).astype(np.float32)
    return mx.array(x), mx.array(np.sin(x.sum(axis=1, keepdims=True)).astype(np.float32))


def loss_fn(params, x, y):
    h = mx.tanh(x @ params["w1"] + params["b1"])
    return mx.mean(mx.square(h @ params["w2"] + params["b2"] - y))


def train_step(state, x, y):
    """One step of Adam on ``state`` (updated in place); returns the loss."""
    loss, grads = mx.value_and_grad(loss_fn)(state["params"], x, y)
    t = state["t"] + 1
    params, m, v = state["params"], state["m"], state["v"]
    for k, g in grads.items():
        m[k] = B1 * m[k] + (1 - B1) * g
        v[k] = B2 * v[k] + (1 - B2) * mx.square(g)
        step = LR * (m[k] / (1 - B1 ** t)) / (mx.sqrt(v[k] / (1 - B2 ** t)) + EPS)
        params[k] = params[k] - step
    state["t"] = t
    return loss


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def _figures() -> dict:
    gc.collect()
    return {"active": mx.get_active_memory(), "rss": rss_bytes(),
            "blocks": sys.getallocatedblocks()}


def run(mode: str, steps: int, leak: bool = False) -> dict:
    """Run ``steps`` steps of ``mode`` (``eager`` or ``compiled``) and return
    ``{"steps_per_s", "start", "warm", "middle", "end"}``, each point a dict of
    ``active``, ``rss`` and ``blocks``."""
    state = make_state()
    x, y = make_batch()
    if mode == "compiled":
        step = mx.compile(lambda x, y: train_step(state, x, y), inputs=state, outputs=state)
    else:
        step = lambda x, y: train_step(state, x, y)  # noqa: E731
    kept = []
    marks = {1: "start", max(2, steps // 4): "warm", max(3, steps // 2): "middle", steps: "end"}
    out = {}
    t_warm = None
    for i in range(1, steps + 1):
        loss = step(x, y)
        mx.eval(loss, state)
        if leak:
            kept.append(mx.array(float(i)))
        if i == 1:
            out["first_loss"] = float(loss.item())
        if i in marks:
            out[marks[i]] = _figures()
            if marks[i] == "warm":
                t_warm, i_warm = time.perf_counter(), i
    out["steps_per_s"] = (steps - i_warm) / (time.perf_counter() - t_warm)
    out["loss"] = float(loss.item())
    return out


def _mib(b: int) -> str:
    return f"{b / 2 ** 20:.2f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--leak", action="store_true", help="keep one 0-d array per step")
    ap.add_argument("--modes", default="eager,compiled")
    args = ap.parse_args(argv)
    if args.steps < 8:
        ap.error("--steps must be at least 8")
    results = {mode: run(mode, args.steps, args.leak) for mode in args.modes.split(",")}
    if args.json:
        print(json.dumps(results))
        return
    print(f"MLP training step ({N_IN}-{N_HIDDEN}-{N_OUT}, batch {BATCH}, MSE, Adam), "
          f"{args.steps} steps; memory at start / end of warm-up / middle / end")
    print(f"{'mode':10} {'steps/s':>8}  {'active KiB':>28}  {'RSS MiB':>28}  {'Python blocks':>30}")
    for mode, r in results.items():
        pts = [r[k] for k in ("start", "warm", "middle", "end")]
        active = " / ".join(f"{p['active'] / 1024:.1f}" for p in pts)
        rss = " / ".join(_mib(p["rss"]) for p in pts)
        blocks = " / ".join(str(p["blocks"]) for p in pts)
        print(f"{mode:10} {r['steps_per_s']:8.0f}  {active:>28}  {rss:>28}  {blocks:>30}")
        grow = {k: r["end"][k] - r["warm"][k] for k in ("active", "rss", "blocks")}
        print(f"{'':10} {'':8}  growth after warm-up: active {grow['active']} B, "
              f"RSS {grow['rss'] // 1024} KiB, {grow['blocks']} blocks")


if __name__ == "__main__":
    main()
