"""gpu_training: issue 16's GPU figures, side by side with PyTorch in one run.

1. **MLP training step** (784-512-512-10, batch 256, Adam, float32): the program of
   ``benchmarks/training.py`` (``nn.value_and_grad`` + ``optimizer.update``, then
   ``eval(loss, state)``) with the GPU as the default device, eager and compiled (a
   compiled call replays a CUDA graph: backends/cuda/graphs.py); PyTorch eager on
   CUDA (``loss.backward()`` + ``torch.optim.Adam.step()``) and its step with the
   model under ``torch.compile``. Steps per second over a run of steps that waits for
   the GPU once at the end, as a training loop does; MLX CUDA's compiled step (2,415
   steps/s on this GPU, the issue's figure) is quoted for reference.
2. **Transformer LM training step** (issue 16, item 10): the character LM of
   ``examples/char_lm.py`` at a GPU's size — token and position embeddings, 4 pre-norm
   blocks (RMSNorm, causal multi-head attention, GELU MLP 4x), a tied output layer —
   vocabulary 256, context 256, width 512, 8 heads, batch 32, float32, Adam; lazyx
   eager and compiled against PyTorch eager and with the model under ``torch.compile``,
   in tokens per second. (Written here again: a benchmark does not import an example.)
3. **Eager tiny-op cost**: a chain of 200 element-wise ops on 16 float32 values, per op,
   waited for at the end (lazyx, PyTorch, CuPy).

lazyx's eager rows run as a user's program does, with eager replay on (the default on a
GPU: ``lazyx.transforms.replay``, a repeated eager graph runs as one CUDA graph); the
rows marked "replay off" run the same program node by node (``LAZYX_EAGER_REPLAY=0``),
one kernel launch per node. The GPU is warmed up first (a fresh machine idles at a low
clock).

Timings are the fastest of a few repeats. Run: ``python benchmarks/gpu_training.py``.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import training as T  # noqa: E402

MLX_CUDA_COMPILED = 2415.0  # steps/s, issue 16 (MLX 0.32 CUDA on one H200)


def _best(fn, sync, n: int, repeats: int = 5) -> float:
    """Seconds per call: the fastest of ``repeats`` runs of ``n`` calls, waited for."""
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def lazyx_mlp(compiled: bool):
    import lazyx.core as mx
    import lazyx.nn as nn
    import lazyx.optimizers as optim
    mx.set_default_device(mx.gpu)
    run = T._mlx_like_mlp(mx, nn, optim, compiled)
    return run, mx.synchronize


def torch_mlp(torch, compiled: bool):
    torch.manual_seed(0)
    layers = []
    for i, o in zip(T.SIZES[:-1], T.SIZES[1:]):
        layers += [torch.nn.Linear(i, o), torch.nn.ReLU()]
    run = T._torch_trainer(torch, torch.nn.Sequential(*layers[:-1]), *T._mlp_data(), "cuda",
                           compiled)
    return run, torch.cuda.synchronize


LM = dict(vocab=256, context=256, dims=512, heads=8, layers=4, batch=32)


def _lm_data():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, LM["vocab"], (LM["batch"], LM["context"] + 1)).astype(np.int32)
    return tokens[:, :-1], tokens[:, 1:]


def lazyx_lm(compiled: bool):
    import lazyx.core as mx
    import lazyx.nn as nn
    import lazyx.optimizers as optim
    mx.set_default_device(mx.gpu)
    mx.random.seed(0)

    class Block(nn.Module):
        def __init__(self, dims, heads):
            super().__init__()
            self.attention_norm = nn.RMSNorm(dims)
            self.attention = nn.MultiHeadAttention(dims, heads)
            self.mlp_norm = nn.RMSNorm(dims)
            self.up = nn.Linear(dims, 4 * dims)
            self.down = nn.Linear(4 * dims, dims)

        def __call__(self, x, mask):
            y = self.attention_norm(x)
            x = x + self.attention(y, y, y, mask)
            return x + self.down(nn.gelu(self.up(self.mlp_norm(x))))

    class LM_(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(LM["vocab"], LM["dims"])
            self.positions = nn.Embedding(LM["context"], LM["dims"])
            self.blocks = [Block(LM["dims"], LM["heads"]) for _ in range(LM["layers"])]
            self.norm = nn.RMSNorm(LM["dims"])

        def __call__(self, tokens):
            n = tokens.shape[1]
            x = self.embedding(tokens) + self.positions(mx.arange(n))
            mask = nn.MultiHeadAttention.create_additive_causal_mask(n)
            for b in self.blocks:
                x = b(x, mask)
            return self.embedding.as_linear(self.norm(x))

    # The MLP benchmark's trainer: nn.value_and_grad + Adam, compiled with the state.
    return T._mlx_like_trainer(mx, nn, optim, LM_(), *_lm_data(), compiled), mx.synchronize


def torch_lm(torch, compiled: bool):
    torch.manual_seed(0)
    F = torch.nn.functional

    class Block(torch.nn.Module):
        def __init__(self, dims, heads):
            super().__init__()
            self.heads = heads
            self.attention_norm = torch.nn.RMSNorm(dims)
            self.qkv = torch.nn.Linear(dims, 3 * dims, bias=False)
            self.out = torch.nn.Linear(dims, dims, bias=False)
            self.mlp_norm = torch.nn.RMSNorm(dims)
            self.up = torch.nn.Linear(dims, 4 * dims)
            self.down = torch.nn.Linear(4 * dims, dims)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.attention_norm(x)).view(b, t, 3, self.heads, -1).unbind(2)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True)
            x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
            return x + self.down(F.gelu(self.up(self.mlp_norm(x))))

    class LM_(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(LM["vocab"], LM["dims"])
            torch.nn.init.normal_(self.embedding.weight, std=LM["dims"] ** -0.5)  # as MLX's
            self.positions = torch.nn.Embedding(LM["context"], LM["dims"])
            self.blocks = torch.nn.ModuleList(Block(LM["dims"], LM["heads"])
                                              for _ in range(LM["layers"]))
            self.norm = torch.nn.RMSNorm(LM["dims"])

        def forward(self, tokens):
            x = self.embedding(tokens) + self.positions(torch.arange(tokens.shape[1],
                                                                     device=tokens.device))
            for b in self.blocks:
                x = b(x)
            return self.norm(x) @ self.embedding.weight.T

    model = LM_().cuda()
    fwd = torch.compile(model) if compiled else model
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = (torch.from_numpy(a.astype(np.int64)).cuda() for a in _lm_data())

    def run():
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fwd(x).reshape(-1, LM["vocab"]), y.reshape(-1))
        loss.backward()
        optimizer.step()
        return loss
    return run, torch.cuda.synchronize


def _replay_off(run):
    """``run`` with eager replay off while it runs (one kernel launch per node)."""
    from lazyx.transforms import replay

    def off():
        old = replay.set_mode("0")
        try:
            return run()
        finally:
            replay.set_mode(old)
    return off


def _warm_up() -> None:
    """Half a second of matrix products: the GPU leaves its idle clock."""
    import lazyx.core as mx
    with mx.stream(mx.gpu):
        x = mx.ones((4096, 4096)) * 1e-3
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.5:
            x = mx.tanh(x @ x)
            mx.eval(x)
        mx.synchronize()


def tiny_ops(peers):
    x0 = np.linspace(0.5, 1.5, 16, dtype=np.float32)
    c0 = np.full(16, 0.5, np.float32)
    out = {}
    import lazyx.core as mx
    with mx.stream(mx.gpu):
        x, c = mx.array(x0) * 1, mx.array(c0) * 1
        mx.eval(x, c)

        def lz():
            with mx.stream(mx.gpu):
                y = x
                for _ in range(100):
                    y = y * c
                    y = y + c
                mx.eval(y)
        out["lazyx"] = (lz, mx.synchronize)
        out["lazyx, replay off"] = (_replay_off(lz), mx.synchronize)
    if "torch" in peers:
        torch = peers["torch"]
        tx, tc = torch.from_numpy(x0).cuda(), torch.from_numpy(c0).cuda()

        def tr():
            y = tx
            for _ in range(100):
                y = y * tc
                y = y + tc
        out["PyTorch"] = (tr, torch.cuda.synchronize)
    import cupy as cp
    cx, cc = cp.asarray(x0), cp.asarray(c0)

    def cu():
        y = cx
        for _ in range(100):
            y = y * cc
            y = y + cc
    out["CuPy"] = (cu, cp.cuda.Device().synchronize)
    return {k: _best(fn, sync, 20) / 200 * 1e6 for k, (fn, sync) in out.items()}


def main() -> None:
    peers = {}
    try:
        import torch
        if torch.cuda.is_available():
            peers["torch"] = torch
    except ImportError:
        pass
    _warm_up()
    rows = {}
    for compiled in (False, True):
        run, sync = lazyx_mlp(compiled)
        rows[f"lazyx {'compiled' if compiled else 'eager'}"] = 1.0 / _best(run, sync, 200)
    run, sync = lazyx_mlp(False)
    rows["lazyx eager, replay off"] = 1.0 / _best(_replay_off(run), sync, 200)
    if "torch" in peers:
        run, sync = torch_mlp(peers["torch"], False)
        rows["PyTorch eager"] = 1.0 / _best(run, sync, 200)
        try:
            run, sync = torch_mlp(peers["torch"], True)
            rows["PyTorch torch.compile (model)"] = 1.0 / _best(run, sync, 200)
        except Exception as e:  # noqa: BLE001 - a peer's compiler may be missing pieces
            print(f"torch.compile: {type(e).__name__}: {str(e)[:200]}")
    base = rows.get("PyTorch eager")
    print("MLP 784-512-512-10 step, batch 256, Adam, float32 (steps/s; higher is better)")
    for k, v in rows.items():
        ratio = f"{v / base:5.2f}x PyTorch eager" if base else ""
        print(f"  {k:32s} {v:9.0f}  {ratio}  {v / MLX_CUDA_COMPILED:5.2f}x MLX CUDA compiled")
    print(f"  {'MLX CUDA compiled (issue 16)':32s} {MLX_CUDA_COMPILED:9.0f}")
    tokens = LM["batch"] * LM["context"]
    lm = {}
    for compiled in (False, True):
        run, sync = lazyx_lm(compiled)
        lm[f"lazyx {'compiled' if compiled else 'eager'}"] = tokens / _best(run, sync, 20, 3)
    run, sync = lazyx_lm(False)
    lm["lazyx eager, replay off"] = tokens / _best(_replay_off(run), sync, 20, 3)
    if "torch" in peers:
        run, sync = torch_lm(peers["torch"], False)
        lm["PyTorch eager"] = tokens / _best(run, sync, 20, 3)
        try:
            run, sync = torch_lm(peers["torch"], True)
            lm["PyTorch torch.compile (model)"] = tokens / _best(run, sync, 20, 3)
        except Exception as e:  # noqa: BLE001 - a peer's compiler may be missing pieces
            print(f"torch.compile: {type(e).__name__}: {str(e)[:200]}")
    base = lm.get("PyTorch eager")
    print(f"transformer LM step: vocab {LM['vocab']}, context {LM['context']}, width "
          f"{LM['dims']}, {LM['heads']} heads, {LM['layers']} blocks, batch {LM['batch']}, "
          f"float32, Adam (tokens/s; higher is better)")
    for k, v in lm.items():
        print(f"  {k:32s} {v:9.0f}  " + (f"{v / base:5.2f}x PyTorch eager" if base else ""))
    tiny = tiny_ops(peers)
    print("eager tiny op (200-op chain on 16 float32, per op, µs; lower is better)")
    for k, v in tiny.items():
        print(f"  {k:32s} {v:9.2f}")


if __name__ == "__main__":
    main()
