"""linalg: inv, svd, qr, cholesky and solve on one 512x512 float32 matrix and on a batch
of 64 64x64 matrices, side by side with NumPy/SciPy, PyTorch and MLX.

lazyx's CPU kernels call SciPy's LAPACK wrappers on memory they own (see
``backends/cpu/kernels/linalg.py``); NumPy runs ``numpy.linalg``'s batched gufuncs
(LAPACK through the BLAS NumPy links); SciPy runs ``scipy.linalg`` on the 2-D
case; PyTorch and MLX (``stream=cpu``) their own CPU LAPACK. Every column returns what
lazyx returns (``svd``: full U, S, Vt; ``qr``: reduced). Prints the fastest of the
interleaved repeats in milliseconds (the machine may be shared) and lazyx's time over
each peer's (target: at most 1.2x the fastest peer).
Run: ``python -m benchmarks.linalg [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks.peers import load  # noqa: E402
from benchmarks.timing import compare, machine_load, side_by_side  # noqa: E402

SHAPES = {"512x512": (512, 512), "64 x 64x64": (64, 64, 64)}
OPS = ("inv", "svd", "qr", "cholesky", "solve")


def _inputs(shape):
    """A well-conditioned matrix (stack), its SPD version and a right-hand side."""
    rng = np.random.default_rng(0)
    n = shape[-1]
    a = (rng.standard_normal(shape) + 2 * np.sqrt(n) * np.eye(n)).astype(np.float32)
    spd = (a @ np.swapaxes(a, -1, -2) / n + np.eye(n)).astype(np.float32)
    b = rng.standard_normal(shape[:-1] + (8,)).astype(np.float32)
    return a, spd, b


def callables(peers, op: str, shape) -> dict:
    """{column: zero-argument callable computing ``op`` and waiting for the result}."""
    import scipy.linalg as sl

    a, spd, b = _inputs(shape)
    x = spd if op == "cholesky" else a
    out = {}
    lx = peers["lazyx"].module
    lx_x, lx_b = lx.array(x), lx.array(b)
    lx_fn = {"inv": lambda: lx.linalg.inv(lx_x), "svd": lambda: lx.linalg.svd(lx_x),
             "qr": lambda: lx.linalg.qr(lx_x), "cholesky": lambda: lx.linalg.cholesky(lx_x),
             "solve": lambda: lx.linalg.solve(lx_x, lx_b)}[op]
    out["lazyx"] = lambda: lx.eval(lx_fn())
    out["NumPy"] = {"inv": lambda: np.linalg.inv(x), "svd": lambda: np.linalg.svd(x),
                    "qr": lambda: np.linalg.qr(x), "cholesky": lambda: np.linalg.cholesky(x),
                    "solve": lambda: np.linalg.solve(x, b)}[op]
    if x.ndim == 2:
        out["SciPy"] = {"inv": lambda: sl.inv(x), "svd": lambda: sl.svd(x),
                        "qr": lambda: sl.qr(x, mode="economic"),
                        "cholesky": lambda: sl.cholesky(x, lower=True),
                        "solve": lambda: sl.solve(x, b)}[op]
    if "PyTorch" in peers:
        torch = peers["PyTorch"].module
        tx, tb = torch.from_numpy(x), torch.from_numpy(b)
        t_fn = {"inv": lambda: torch.linalg.inv(tx), "svd": lambda: torch.linalg.svd(tx),
                "qr": lambda: torch.linalg.qr(tx),
                "cholesky": lambda: torch.linalg.cholesky(tx),
                "solve": lambda: torch.linalg.solve(tx, tb)}[op]

        def run_torch():
            with torch.inference_mode():
                t_fn()
        out["PyTorch"] = run_torch
    if "MLX" in peers:
        mx = peers["MLX"].module
        mx_x, mx_b, cpu = mx.array(x), mx.array(b), mx.cpu
        m_fn = {"inv": lambda: mx.linalg.inv(mx_x, stream=cpu),
                "svd": lambda: mx.linalg.svd(mx_x, stream=cpu),
                "qr": lambda: mx.linalg.qr(mx_x, stream=cpu),
                "cholesky": lambda: mx.linalg.cholesky(mx_x, stream=cpu),
                "solve": lambda: mx.linalg.solve(mx_x, mx_b, stream=cpu)}[op]
        out["MLX"] = lambda: mx.eval(m_fn())
    return out


def check(peers, op: str, shape) -> None:
    """lazyx computes what NumPy computes (a benchmark of a wrong result is void)."""
    lx = peers["lazyx"].module
    a, spd, b = _inputs(shape)
    if op == "solve":
        got, want = lx.linalg.solve(lx.array(a), lx.array(b)), np.linalg.solve(a, b)
    elif op == "cholesky":
        got, want = lx.linalg.cholesky(lx.array(spd)), np.linalg.cholesky(spd)
    elif op == "inv":
        got, want = lx.linalg.inv(lx.array(a)), np.linalg.inv(a)
    elif op == "svd":
        got, want = lx.linalg.svd(lx.array(a), compute_uv=False), np.linalg.svd(a, compute_uv=False)
    else:
        q, r = lx.linalg.qr(lx.array(a))
        got, want = lx.matmul(q, r), a
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-3, atol=1e-3)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="less time per figure")
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of " + ",".join(OPS))
    args = ap.parse_args(argv)
    peers = load()
    print(f"machine load before: {machine_load():.0%}; cpus={os.cpu_count()}")
    for label, shape in SHAPES.items():
        for op in args.ops.split(","):
            check(peers, op, shape)
            t = compare(callables(peers, op, shape), budget_s=0.6 if args.quick else 3.0,
                        rounds=4, warmup=2, statistic=min)
            print(side_by_side(f"{op} {label}", t, 22), flush=True)


if __name__ == "__main__":
    main()
