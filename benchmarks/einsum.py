"""einsum: an attention-shaped contraction side by side with NumPy, PyTorch and MLX.

``bhqd,bhkd->bhqk`` (b=4, h=8, q=k=512, d=64, float32) plus a three-operand chain
whose order the path optimiser chooses (``ij,jk,kl->il``). lazyx lowers each to
batched matmuls (see ``plugins/products.py``); NumPy runs ``np.einsum(optimize=True)``.
Prints the fastest of the interleaved repeats in milliseconds (the machine may be
shared) and lazyx's time over each peer's (target: at most 1.2x NumPy's and PyTorch's).
Run: ``python -m benchmarks.einsum [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks.peers import load  # noqa: E402
from benchmarks.timing import compare, machine_load, side_by_side  # noqa: E402

CASES = {
    "attention bhqd,bhkd->bhqk": ("bhqd,bhkd->bhqk", [(4, 8, 512, 64), (4, 8, 512, 64)]),
    "chain ij,jk,kl->il": ("ij,jk,kl->il", [(64, 1024), (1024, 1024), (1024, 32)]),
}


def callables(peers, subscripts: str, operands: list) -> dict:
    """{column: zero-argument callable computing the contraction and waiting for it}."""
    out = {}
    lx = peers["lazyx"].module
    xs = [lx.array(o) for o in operands]
    out["lazyx"] = lambda: lx.eval(lx.einsum(subscripts, *xs))
    out["NumPy"] = lambda: np.einsum(subscripts, *operands, optimize=True)
    if "PyTorch" in peers:
        torch = peers["PyTorch"].module
        ts = [torch.from_numpy(o) for o in operands]

        def run_torch():
            with torch.inference_mode():
                torch.einsum(subscripts, *ts)
        out["PyTorch"] = run_torch
    if "MLX" in peers:
        mx = peers["MLX"].module
        ms = [mx.array(o) for o in operands]
        out["MLX"] = lambda: mx.eval(mx.einsum(subscripts, *ms))
    return out


def check(peers, subscripts: str, operands: list) -> None:
    """lazyx computes what NumPy computes (a benchmark of a wrong result is void)."""
    lx = peers["lazyx"].module
    got = np.asarray(lx.einsum(subscripts, *[lx.array(o) for o in operands]))
    want = np.einsum(subscripts, *[o.astype(np.float64) for o in operands], optimize=True)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="less time per figure")
    args = ap.parse_args(argv)
    peers = load()
    rng = np.random.default_rng(0)
    print(f"machine load before: {machine_load():.0%}")
    for title, (subscripts, shapes) in CASES.items():
        operands = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        check(peers, subscripts, operands)
        t = compare(callables(peers, subscripts, operands),
                    budget_s=1.0 if args.quick else 4.0, rounds=4, warmup=2, statistic=min)
        print(side_by_side(title, t, 28), flush=True)


if __name__ == "__main__":
    main()
