"""quantized: the decode-shaped 4-bit ``quantized_matmul`` (1x4096 by 4096x4096, group
size 64) side by side with the float32 products of the same shape (NumPy, PyTorch)
and with MLX's own ``quantized_matmul`` on the CPU; a few-row one (4 rows, as a
decode batch), a prefill-shaped one (32 rows), and 8-bit and 2-bit decode.

The issue's target: lazyx's 4-bit product faster than the float32 ``matmul`` of the
same shape (it reads 8x fewer weight bytes). Prints the fastest of interleaved
repeats in milliseconds (the machine may be shared) and lazyx's time over each
peer's (lazyx and MLX quantized at the row's bits; NumPy and PyTorch float32).
Run: ``python -m benchmarks.quantized [--quick]``.
The CUDA kernel is measured by ``benchmarks/quantized_cuda_check.py`` on a GPU.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks.peers import load  # noqa: E402
from benchmarks.timing import compare, machine_load, side_by_side  # noqa: E402

N = K = 4096
GROUP, BITS = 64, 4


def callables(peers, x: np.ndarray, w: np.ndarray, bits: int = BITS) -> dict:
    """{column: zero-argument callable computing x @ w.T and waiting for it}."""
    out = {}
    lx = peers["lazyx"].module
    q = [lx.array(np.asarray(a)) for a in lx.quantize(lx.array(w), GROUP, bits)]
    lx_x = lx.array(x)
    out["lazyx"] = lambda: lx.eval(lx.quantized_matmul(lx_x, *q, True, GROUP, bits))
    wt = np.ascontiguousarray(w.T)
    out["NumPy f32"] = lambda: x @ wt
    if "PyTorch" in peers:
        torch = peers["PyTorch"].module
        t_x, t_w = torch.from_numpy(x), torch.from_numpy(w)

        def run_torch():
            with torch.inference_mode():
                torch.nn.functional.linear(t_x, t_w)
        out["PyTorch f32"] = run_torch
    if "MLX" in peers:
        m = peers["MLX"].module
        mq = m.quantize(m.array(w), GROUP, bits)
        m_x = m.array(x)
        out[f"MLX {bits}-bit"] = lambda: m.eval(m.quantized_matmul(m_x, *mq, True, GROUP, bits))
    return out


def check(peers, x, w, bits: int = BITS) -> None:
    """lazyx's product is the dequantized one (a benchmark of a wrong result is void)."""
    lx = peers["lazyx"].module
    q = lx.quantize(lx.array(w), GROUP, bits)
    want = x.astype(np.float64) @ np.asarray(lx.dequantize(*q, GROUP, bits)).astype(np.float64).T
    got = np.asarray(lx.quantized_matmul(lx.array(x), *q, True, GROUP, bits))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3 * np.abs(want).max())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="less time per figure")
    args = ap.parse_args(argv)
    peers = load()
    print(f"machine load before: {machine_load():.0%}")
    rng = np.random.default_rng(0)
    w = rng.standard_normal((N, K)).astype(np.float32)
    for rows, bits in ((1, 4), (4, 4), (32, 4), (1, 8), (1, 2)):
        x = rng.standard_normal((rows, K)).astype(np.float32)
        check(peers, x, w, bits)
        t = compare(callables(peers, x, w, bits), budget_s=1.0 if args.quick else 4.0,
                    rounds=4, warmup=2, statistic=min)
        print(side_by_side(f"{bits}-bit {rows}x{K} . {N}x{K}^T", t, 30), flush=True)


if __name__ == "__main__":
    main()
