"""The CUDA backend on an NVIDIA GPU, side by side with PyTorch and CuPy in one run.

    python benchmarks/gpu.py [--quick]

Rows: the per-op cost of a tiny op (lazyx builds, schedules and launches; the
GPU is idle), bandwidth-bound element-wise ops and a reduction on 64M float32
(GB/s counting bytes read and written, against a device-to-device copy),
compiled (fused) GELU and a 10-op chain against ``torch.compile`` and a copy,
a softmax, and matrix products in float32 and bfloat16 (TFLOP/s). Every timing
waits for the GPU (``synchronize``); medians of repeats after warm-ups, the
frameworks taking turns. The last column is lazyx's time over the best peer's.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks.compile_fusion import chain  # noqa: E402
from benchmarks.timing import Table, waiting  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    budget = 0.3 if args.quick else 1.0

    import cupy as cp
    import lazyx.core as mx
    try:
        import torch
        if not torch.cuda.is_available():
            torch = None
    except ImportError:
        torch = None
    ml_bf16 = mx.bfloat16.np

    def sync():
        cp.cuda.Device().synchronize()

    def tsync():
        torch.cuda.synchronize()

    table = Table(budget)

    def row(label, lazyx_fn, peers: dict, work=None, unit=""):
        table.row(label, {"lazyx": lazyx_fn, **peers}, work, unit)

    gen = np.random.default_rng(0)
    # -- per-op overhead ----------------------------------------------------------
    small = gen.standard_normal(16).astype(np.float32)
    xs = mx.array(small)
    mx.eval(mx.exp(xs))
    cs = cp.asarray(small)
    ts = torch.from_numpy(small).cuda() if torch else None

    def lz_small():
        y = xs
        for _ in range(10):
            y = y + 1.0
        mx.eval(y)
        sync()

    def cp_small():
        y = cs
        for _ in range(10):
            y = y + 1.0
        sync()

    def t_small():
        y = ts
        for _ in range(10):
            y = y + 1.0
        tsync()
    row("10 x (x + 1), float32[16] (per call)", lz_small, {"cupy": cp_small, "torch": t_small if torch else None})

    # -- bandwidth ------------------------------------------------------------------
    n = 1 << 26
    host = gen.standard_normal(n).astype(np.float32)
    a = mx.exp(mx.array(host))
    b = mx.sin(mx.array(host))
    mx.eval(a, b)
    ca, cb = a._data, b._data
    ta = torch.as_tensor(ca, device="cuda") if torch else None
    tb = torch.as_tensor(cb, device="cuda") if torch else None

    def lz(f):
        return waiting(lambda: mx.eval(f()), sync)

    def cpf(f):
        return waiting(f, sync)

    def tf(f):
        return None if torch is None else waiting(f, tsync)
    row("x + 0.0 64M f32 (GB/s r+w)", lz(lambda: mx.array(a) + 0.0),
        {"cupy copy": cpf(lambda: ca.copy()), "torch clone": tf(lambda: ta.clone())},
        work=2 * 4 * n, unit="GB/s")
    row("add 64M f32 (GB/s)", lz(lambda: a + b), {"cupy": cpf(lambda: ca + cb),
                                                 "torch": tf(lambda: ta + tb)},
        work=3 * 4 * n, unit="GB/s")
    row("exp 64M f32 (GB/s)", lz(lambda: mx.exp(a)), {"cupy": cpf(lambda: cp.exp(ca)),
                                                     "torch": tf(lambda: torch.exp(ta))},
        work=2 * 4 * n, unit="GB/s")
    row("sum 64M f32 (GB/s)", lz(lambda: mx.sum(a)), {"cupy": cpf(lambda: ca.sum()),
                                                     "torch": tf(lambda: ta.sum())},
        work=4 * n, unit="GB/s")
    # -- fused element-wise (compile): GELU (erf), one generated kernel ------------------------
    def gelu(m, erf, x):
        return x * 0.5 * (1 + erf(x * (1 / math.sqrt(2))))
    lz_gelu = mx.compile(lambda x: gelu(mx, mx.erf, x))
    mx.eval(lz_gelu(a))  # traces and compiles the kernel
    gelu_peers = {"cupy copy": cpf(lambda: ca.copy())}
    if torch is not None:
        try:
            t_gelu = torch.compile(lambda t: gelu(torch, torch.erf, t))
            t_gelu(ta)
            tsync()
            gelu_peers["torch.compile"] = tf(lambda: t_gelu(ta))
        except Exception as exc:  # no working Triton: report, keep going
            print(f"torch.compile unavailable: {type(exc).__name__}: {str(exc)[:120]}")
    row("compiled GELU (erf) 64M f32 (GB/s)", lz(lambda: lz_gelu(a)), gelu_peers,
        work=2 * 4 * n, unit="GB/s")
    lz_chain = mx.compile(lambda x: chain(mx, x))
    mx.eval(lz_chain(a))
    chain_peers = {"cupy copy": cpf(lambda: ca.copy())}
    if torch is not None:
        try:
            t_chain = torch.compile(lambda t: chain(torch, t))
            t_chain(ta)
            tsync()
            chain_peers["torch.compile"] = tf(lambda: t_chain(ta))
        except Exception as exc:
            print(f"torch.compile unavailable: {type(exc).__name__}: {str(exc)[:120]}")
    row("compiled 10-op chain 64M f32 (GB/s)", lz(lambda: lz_chain(a)), chain_peers,
        work=2 * 4 * n, unit="GB/s")

    m2 = mx.reshape(a, (16384, 4096))
    c2 = ca.reshape(16384, 4096)
    t2 = ta.reshape(16384, 4096) if torch else None
    row("softmax 16384x4096 f32 (GB/s)", lz(lambda: mx.softmax(m2, axis=-1)),
        {"cupy (max/exp/sum)": cpf(lambda: (lambda e: e / e.sum(-1, keepdims=True))(cp.exp(c2 - c2.max(-1, keepdims=True)))),
         "torch": tf(lambda: torch.softmax(t2, -1))}, work=2 * 4 * n, unit="GB/s")

    # -- matmul -----------------------------------------------------------------------
    for dt, name in ((np.float32, "f32"), (ml_bf16, "bf16")):
        k = 8192
        hm = gen.standard_normal((k, k)).astype(np.float32)
        x = mx.astype(mx.array(hm), mx.float32 if name == "f32" else mx.bfloat16)
        mx.eval(x)
        cx = x._data
        tx = torch.as_tensor(hm, device="cuda").to(torch.float32 if name == "f32" else torch.bfloat16) if torch else None
        row(f"matmul {k}^3 {name} (TFLOP/s)", lz(lambda: x @ x),  # a failure is reported
            {"cupy": cpf(lambda: cx @ cx), "torch": tf(lambda: tx @ tx)},
            work=2 * k ** 3 / 1e3, unit="TFLOP/s")

    table.print(40)


if __name__ == "__main__":
    main()
