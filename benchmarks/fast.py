"""``lazyx.core.fast`` on the CPU beside PyTorch, MLX and NumPy, in one run.

Issue 14's CPU targets:

* ``rms_norm`` / ``layer_norm`` of a 4096 x 4096 float32 array at >= 0.8x the
  bandwidth of a NumPy copy of it (measured here, in the same run): the ratio printed
  is copy time / norm time (both read 64 MiB and write 64 MiB);
* ``scaled_dot_product_attention`` (batch 4, 8 heads, 512 tokens, head dim 64,
  causal) at least as fast as ``torch.nn.functional.scaled_dot_product_attention``,
  forward and forward + backward (beside the same attention written in lazyx ops).

Also ``rope`` and ``cross_entropy``. The callables take turns (interleaved rounds)
and the minimum of each one's samples is reported: the machine is shared.

Run: ``python benchmarks/fast.py``
"""

from __future__ import annotations

import time

import numpy as np

import lazyx.core as lx

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover
    torch = None
try:
    import mlx.core as mlx
    mlx.set_default_device(mlx.cpu)
except ImportError:  # pragma: no cover
    mlx = None


def interleaved_min(fns: dict, rounds: int = 6, per_round: int = 3) -> dict:
    """{name: min seconds} of the callables, taking turns round by round."""
    for fn in fns.values():
        fn()
    best = {k: float("inf") for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(per_round):
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t0)
    return best


def _report(title: str, times: dict, base: str) -> None:
    print(f"\n{title}")
    for name, t in times.items():
        print(f"  {name:<28} {t * 1e3:9.2f} ms   {times[base] / t:5.2f}x of {base}")


def norms() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4096, 4096)).astype(np.float32)
    w = rng.standard_normal(4096).astype(np.float32)
    b = rng.standard_normal(4096).astype(np.float32)
    lxx, lxw, lxb = lx.array(x), lx.array(w), lx.array(b)
    fns = {"numpy copy": lambda: x.copy(),
           "lazyx rms_norm": lambda: lx.eval(lx.fast.rms_norm(lxx, lxw, 1e-5)),
           "lazyx layer_norm": lambda: lx.eval(lx.fast.layer_norm(lxx, lxw, lxb, 1e-5))}
    if torch is not None:
        tx, tw, tb = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b)
        fns["torch rms_norm"] = lambda: F.rms_norm(tx, (4096,), tw, 1e-5)
        fns["torch layer_norm"] = lambda: F.layer_norm(tx, (4096,), tw, tb, 1e-5)
    if mlx is not None:
        mx_, mw, mb = mlx.array(x), mlx.array(w), mlx.array(b)
        fns["mlx rms_norm"] = lambda: mlx.eval(mlx.fast.rms_norm(mx_, mw, 1e-5))
        fns["mlx layer_norm"] = lambda: mlx.eval(mlx.fast.layer_norm(mx_, mw, mb, 1e-5))
    _report("norms, 4096 x 4096 float32 (ratio: copy bandwidth reached; target >= 0.8)",
            interleaved_min(fns), "numpy copy")


def attention() -> None:
    rng = np.random.default_rng(0)
    shape = (4, 8, 512, 64)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    lq, lk, lv = lx.array(q), lx.array(k), lx.array(v)
    scale = 64 ** -0.5
    fns = {"lazyx sdpa causal": lambda: lx.eval(lx.fast.scaled_dot_product_attention(
        lq, lk, lv, scale=scale, mask="causal"))}
    if torch is not None:
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
        fns["torch sdpa causal"] = lambda: F.scaled_dot_product_attention(tq, tk, tv,
                                                                          is_causal=True)
    if mlx is not None:
        mq, mk, mv = mlx.array(q), mlx.array(k), mlx.array(v)
        fns["mlx sdpa causal"] = lambda: mlx.eval(mlx.fast.scaled_dot_product_attention(
            mq, mk, mv, scale=scale, mask="causal"))
    base = "torch sdpa causal" if torch is not None else "lazyx sdpa causal"
    _report("attention, batch 4, 8 heads, 512 tokens, head dim 64, causal, float32 "
            "(target: >= 1.0x of torch)", interleaved_min(fns), base)

    # Forward + backward (gradients of sum(out * g) with respect to q, k, v).
    g = rng.standard_normal(shape).astype(np.float32)
    lg = lx.array(g)

    def lazyx_loss(a, b, c):
        out = lx.fast.scaled_dot_product_attention(a, b, c, scale=scale, mask="causal")
        return lx.sum(out * lg)

    def ops_loss(a, b, c):  # the same attention in lazyx.core ops: the composed vjp
        keep = lx.tri(shape[2], dtype=lx.bool_)
        s = lx.where(keep, (a * scale) @ lx.swapaxes(b, -1, -2), -1e30)
        return lx.sum((lx.softmax(s, -1) @ c) * lg)

    lazyx_grad = lx.grad(lazyx_loss, argnums=(0, 1, 2))
    ops_grad = lx.grad(ops_loss, argnums=(0, 1, 2))
    fns = {"lazyx sdpa fwd+bwd": lambda: lx.eval(lazyx_grad(lq, lk, lv)),
           "lazyx in ops fwd+bwd": lambda: lx.eval(ops_grad(lq, lk, lv))}
    if torch is not None:
        tg = torch.from_numpy(g)

        def torch_grad():
            a, b, c = (t.clone().requires_grad_() for t in (tq, tk, tv))
            F.scaled_dot_product_attention(a, b, c, is_causal=True).backward(tg)
            return a.grad, b.grad, c.grad
        fns["torch sdpa fwd+bwd"] = torch_grad
    if mlx is not None:
        mg = mlx.array(g)
        mlx_grad = mlx.grad(lambda a, b, c: mlx.sum(mlx.fast.scaled_dot_product_attention(
            a, b, c, scale=scale, mask="causal") * mg), argnums=(0, 1, 2))
        fns["mlx sdpa fwd+bwd"] = lambda: mlx.eval(mlx_grad(mq, mk, mv))
    base = "torch sdpa fwd+bwd" if torch is not None else "lazyx sdpa fwd+bwd"
    _report("attention forward + backward, same shapes (fused backward kernel; MLX's CPU "
            "and lazyx in ops: the composed vjp) (target: >= 1.0x of torch)",
            interleaved_min(fns, rounds=3, per_round=2), base)


def rope_and_cross_entropy() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 32, 512, 128)).astype(np.float32)
    lxx = lx.array(x)
    fns = {"numpy copy": lambda: x.copy(),
           "lazyx rope": lambda: lx.eval(lx.fast.rope(lxx, 128, traditional=False, base=1e4,
                                                     scale=1.0, offset=7))}
    if mlx is not None:
        mx_ = mlx.array(x)
        fns["mlx rope"] = lambda: mlx.eval(mlx.fast.rope(mx_, 128, traditional=False, base=1e4,
                                                         scale=1.0, offset=7))
    _report("rope, (4, 32, 512, 128) float32", interleaved_min(fns), "numpy copy")
    logits = rng.standard_normal((2048, 32000)).astype(np.float32)
    t = rng.integers(0, 32000, 2048).astype(np.int32)
    ll, lt = lx.array(logits), lx.array(t)
    fns = {"lazyx cross_entropy": lambda: lx.eval(lx.fast.cross_entropy(ll, lt))}
    if torch is not None:
        tl, tt = torch.from_numpy(logits), torch.from_numpy(t.astype(np.int64))
        fns["torch cross_entropy"] = lambda: F.cross_entropy(tl, tt, reduction="none")
    if mlx is not None:
        ml, mt = mlx.array(logits), mlx.array(t)
        fns["mlx cross_entropy"] = lambda: mlx.eval(mlx.fast.cross_entropy(ml, mt))
    _report("cross_entropy, 2048 x 32000 float32", interleaved_min(fns), "lazyx cross_entropy")


if __name__ == "__main__":
    if torch is not None:
        torch.set_num_threads(2)
    norms()
    attention()
    rope_and_cross_entropy()
