"""Run backends/cuda/fast.py's tiled attention (forward and backward) with NumPy standing
in for CuPy and Python versions of its two tile kernels, against the CPU kernels.

Run in a subprocess by tests/backends/test_cuda_attention_tiles.py (it puts a fake
``cupy`` module in ``sys.modules``, which must not leak into other tests). What it
checks is the host side, which CI can run: the tiling over slabs and query rows
(budgets that force one tile, several slabs, rows of one slab), grouped-query heads,
the mask kinds and their broadcast strides, the sinks and their gradient. The CUDA
kernels themselves run in the GPU test run (tests/plugins/test_fast*.py with the GPU
as the default device).

The kernel versions here follow the CUDA source's per-row semantics: a warp per row of
a tile, the row's slab, query position and head from its index.
"""

import sys
import types

import numpy as np

fake = types.ModuleType("cupy")
for name in dir(np):
    if not name.startswith("__"):
        setattr(fake, name, getattr(np, name))
fake.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDevice=lambda: 0))
sys.modules["cupy"] = fake

from lazyx.backends.cpu.kernels import fast as ref  # noqa: E402
from lazyx.backends.cuda import fast as F  # noqa: E402
from lazyx.plugins import fast as fp  # noqa: E402

MASKED = np.float32(fp.MASKED)


def _where(row, R, c0, r0, Hkv, G, Tq):
    slab = c0 + row // R
    fr = r0 + row % R
    return slab, fr, fr % Tq, slab // Hkv, (slab % Hkv) * G + fr // Tq


def _mask_at(mask, b, h, t, j):
    s = mask.shape
    return mask[b if s[0] > 1 else 0, h if s[1] > 1 else 0, t if s[2] > 1 else 0,
                j if s[3] > 1 else 0]


def softmax_tile(grid, block, args):
    (s, n, R, K, c0, r0, Hkv, G, Tq, off, scale, kind, mask, *_strides, sinks, psink,
     rows_total) = args
    n, R, K, c0, r0, Hkv, G, Tq, off, kind, rows_total = map(
        int, (n, R, K, c0, r0, Hkv, G, Tq, off, kind, rows_total))
    S = s.reshape(n * R, K)
    for row in range(n * R):
        slab, fr, t, b, h = _where(row, R, c0, r0, Hkv, G, Tq)
        v = S[row] * np.float32(scale)
        for j in range(K):
            if kind == 1 and j > t + off:
                v[j] = MASKED
            elif kind == 2 and not _mask_at(mask, b, h, t, j):
                v[j] = MASKED
            elif kind == 3:
                v[j] += _mask_at(mask, b, h, t, j)
        m = v.max() if sinks is None else max(v.max(), sinks[h])
        e = np.exp(v - m)
        den = e.sum() + (0 if sinks is None else np.exp(sinks[h] - m))
        S[row] = e / den
        if psink is not None:
            psink.reshape(-1)[slab * rows_total + fr] = np.exp(sinks[h] - m) / den


def ds_tile(grid, block, args):
    (dp, P, rows_d, n, R, K, c0, r0, rows_total, Hkv, G, Tq, off, scale, kind, mask,
     *_strides) = args
    n, R, K, c0, r0, rows_total, Hkv, G, Tq, off, kind = map(
        int, (n, R, K, c0, r0, rows_total, Hkv, G, Tq, off, kind))
    D, PP = dp.reshape(n * R, K), P.reshape(n * R, K)
    for row in range(n * R):
        slab, fr, t, b, h = _where(row, R, c0, r0, Hkv, G, Tq)
        rd = rows_d.reshape(-1)[slab * rows_total + fr]
        for j in range(K):
            keep = True
            if kind == 1:
                keep = j <= t + off
            elif kind == 2:
                keep = bool(_mask_at(mask, b, h, t, j))
            D[row, j] = scale * PP[row, j] * (D[row, j] - rd) if keep else 0.0


class _Kernels:
    def function(self, name):
        return {"attention_softmax_tile": softmax_tile, "attention_ds_tile": ds_tile}[name]


F._KERNEL = _Kernels()

# (B, Hq, Hkv, Tq, Tk, D, mask, sinks, budget in bytes of scores per tile)
CASES = [(2, 4, 2, 5, 7, 8, "additive", False, 1 << 27),   # one tile, grouped heads
         (2, 4, 2, 5, 7, 8, "causal", True, 1 << 27),      # sinks
         (1, 3, 1, 6, 6, 4, "boolean", True, 200),        # rows of one slab per tile
         (2, 2, 2, 9, 4, 4, "causal", False, 100),         # Tq > Tk: rows that see no key
         (2, 4, 4, 3, 5, 4, None, True, 1 << 27),
         (1, 2, 1, 4, 4, 4, "additive", False, 40),         # a few rows per tile
         (3, 2, 1, 3, 5, 4, "boolean", False, 3 * 5 * 4 * 2)]  # several slabs per tile

rng = np.random.default_rng(0)
for b, hq, hkv, tq, tk, d, mask, sinks, budget in CASES:
    F.SCORES_BUDGET = budget
    ins = [rng.standard_normal(s).astype(np.float32)
           for s in ((b, hq, tq, d), (b, hkv, tk, d), (b, hkv, tk, d))]
    if mask == "additive":
        ins.append(rng.standard_normal((1, hq, tq, tk)).astype(np.float32))
    elif mask == "boolean":
        ins.append(rng.random((b, 1, tq, tk)) > 0.3)
    if sinks:
        ins.append(rng.standard_normal((hq,)).astype(np.float32))
    p = object.__new__(fp.ScaledDotProductAttention)  # the parameters the kernels read
    p.scale, p.mask, p.sinks = 0.37, {None: "none", "causal": "causal"}.get(mask, "array"), sinks
    out = ref.attention(p, ins)
    forward = float(np.abs(F._attention_tiled(p, ins) - out).max())
    cot = rng.standard_normal(out.shape).astype(np.float32)
    want = ref.attention_vjp(p, ins + [out, cot])
    got = F._attention_vjp_tiled(p, ins + [out, cot])
    assert len(got) == len(want) and all(g.shape == w.shape for g, w in zip(got, want))
    backward = max(float(np.abs(np.asarray(g) - np.asarray(w)).max()) for g, w in zip(got, want))
    print(f"case {b} {hq} {hkv} {tq} {tk} {d} {mask} {sinks} {budget}: "
          f"forward {forward:.3g} backward {backward:.3g}")
