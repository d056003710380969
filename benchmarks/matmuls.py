"""The matmuls pack side by side with MLX (CPU), PyTorch 2.13 CPU and NumPy, one run.

Cases: ``gather_mm`` as mixture-of-experts routing (tokens by sorted expert index),
``block_masked_mm`` with half the output tiles masked, ``segmented_mm``, and
``hadamard_transform`` of a 4096 x 4096 float32 matrix (PyTorch has no Hadamard op:
its column is a matmul by the Hadamard matrix, NumPy's the butterfly in NumPy).
Prints medians in ms and lazyx's time over each peer's (< 1: lazyx is faster). The
machine is shared: read the figures as indicative.

    python benchmarks/matmuls.py
"""

from __future__ import annotations

import numpy as np

import lazyx.core as lx
from benchmarks.timing import compare

try:
    import mlx.core as mlx
except ImportError:  # pragma: no cover
    mlx = None
try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

GEN = np.random.default_rng(0)


def f32(*shape):
    return GEN.standard_normal(shape).astype(np.float32)


def cases():
    E, T, D, F = 8, 256, 512, 1024
    x, w = f32(T, 1, D), f32(E, D, F)
    idx = np.sort(GEN.integers(0, E, T)).astype(np.int32)
    wl, il = lx.array(w), lx.array(idx)
    wm, im = (mlx.array(w), mlx.array(idx)) if mlx else (None, None)
    wt, it = (torch.from_numpy(w), torch.from_numpy(idx.astype(np.int64))) if torch else (None, None)
    yield ("gather_mm MoE 256 tok x 8 experts 512->1024",
           {"lazyx": lambda: lx.eval(lx.gather_mm(lx.array(x), wl, None, il, sorted_indices=True)),
            "mlx": (lambda: mlx.eval(mlx.gather_mm(mlx.array(x), wm, None, im, sorted_indices=True)))
            if mlx else None,
            "torch": (lambda: torch.bmm(torch.from_numpy(x), wt[it])) if torch else None,
            "numpy": lambda: np.matmul(x, w[idx])})
    a, b = f32(512, 512), f32(512, 512)
    mo = GEN.random((8, 8)) < 0.5
    up = np.repeat(np.repeat(mo, 64, 0), 64, 1)
    yield ("block_masked_mm 512^3, half the 64-tiles masked",
           {"lazyx": lambda: lx.eval(lx.block_masked_mm(lx.array(a), lx.array(b), 64, lx.array(mo))),
            "mlx": (lambda: mlx.eval(mlx.block_masked_mm(mlx.array(a), mlx.array(b), 64,
                                                         mlx.array(mo)))) if mlx else None,
            "torch": (lambda: (torch.from_numpy(a) @ torch.from_numpy(b)) * torch.from_numpy(up))
            if torch else None,
            "numpy": lambda: (a @ b) * up})
    sa, sb = f32(256, 2048), f32(2048, 256)
    seg = np.array([[0, 512], [512, 1024], [1024, 1536], [1536, 2048]], np.int32)
    yield ("segmented_mm 256x2048x256, 4 segments",
           {"lazyx": lambda: lx.eval(lx.segmented_mm(lx.array(sa), lx.array(sb), lx.array(seg))),
            "mlx": (lambda: mlx.eval(mlx.segmented_mm(mlx.array(sa), mlx.array(sb), mlx.array(seg))))
            if mlx else None,
            "torch": (lambda: torch.stack([torch.from_numpy(sa[:, s:e]) @ torch.from_numpy(sb[s:e])
                                           for s, e in seg])) if torch else None,
            "numpy": lambda: np.stack([sa[:, s:e] @ sb[s:e] for s, e in seg])})
    h = f32(4096, 4096)
    from scipy.linalg import hadamard
    H = torch.from_numpy(hadamard(4096).astype(np.float32) / 64) if torch else None
    from lazyx.backends.cpu.kernels.matmuls import hadamard as np_hadamard
    yield ("hadamard_transform 4096x4096 f32",
           {"lazyx": lambda: lx.eval(lx.hadamard_transform(lx.array(h))),
            "mlx": (lambda: mlx.eval(mlx.hadamard_transform(mlx.array(h)))) if mlx else None,
            "torch": (lambda: torch.from_numpy(h) @ H) if torch else None,
            "numpy": lambda: np_hadamard(h, 1 / 64, False)})


def main():
    print(f"{'case':52s} " + " ".join(f"{n:>9s}" for n in ("lazyx", "mlx", "torch", "numpy"))
          + "   lazyx/peer")
    for name, fns in cases():
        fns = {k: v for k, v in fns.items() if v is not None}
        t = compare(fns, budget_s=1.0, rounds=4)
        ratios = ", ".join(f"{k} {t['lazyx'] / t[k]:.2f}" for k in t if k != "lazyx")
        print(f"{name:52s} " + " ".join(f"{t.get(n, float('nan')) * 1e3:9.2f}"
                                        for n in ("lazyx", "mlx", "torch", "numpy")) + "   " + ratios)


if __name__ == "__main__":
    main()
