"""conv: ``conv2d`` 3x3, 64 -> 64 channels, 32x32, batch 32, float32: the forward, the
input gradient, the weight gradient and forward + backward, side by side with PyTorch
and MLX on the CPU.

lazyx runs its implicit-GEMM C++ kernels on its own thread pool
(``backends/cpu/native_packs/conv.py``: ``conv_direct`` for the forward and the input
gradient, ``conv_swapped`` for the weight gradient); its column "lazyx NumPy kernels"
is the cpu-reference backend (NumPy windows + matmul). PyTorch takes NCHW input (its
native layout; oneDNN), MLX channels-last as lazyx. The gradient rows are ``grad`` of
``sum(conv2d(x, w) * g)`` with respect to one argument (PyTorch:
``aten.convolution_backward`` with one output mask); forward + backward is
``value_and_grad`` for both (PyTorch: forward, then ``backward(g)``). Target (issue
14): lazyx forward + backward within 1.3x of PyTorch. Prints the fastest of
interleaved repeats (``--median``: the median) and ratios; the machine is shared, so
figures are noisy: compare the ratios of one run.
Run: ``python -m benchmarks.conv [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks.peers import load  # noqa: E402
from benchmarks.timing import compare, machine_load  # noqa: E402

N, H, W, C, O, K = 32, 32, 32, 64, 64, 3


def _data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, H, W, C)).astype(np.float32)
    w = (rng.standard_normal((O, K, K, C)) / np.sqrt(K * K * C)).astype(np.float32)
    g = rng.standard_normal((N, H, W, O)).astype(np.float32)
    return x, w, g


def _lazyx_fns(lx, x, w, g, backend=None):
    """(forward, input gradient, weight gradient, forward + backward)."""
    lx_x, lx_w, lx_g = lx.array(x), lx.array(w), lx.array(g)

    def loss(x, w):
        return lx.sum(lx.conv2d(x, w, padding=1) * lx_g)

    def timed(fn):
        def run():
            with lx.use_backend("cpu", backend) if backend else _null():
                lx.eval(fn(lx_x, lx_w))
        return run
    return (timed(lambda a, b: lx.conv2d(a, b, padding=1)), timed(lx.grad(loss, argnums=0)),
            timed(lx.grad(loss, argnums=1)), timed(lx.value_and_grad(loss, argnums=(0, 1))))


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


#: The rows: (title, index into each column's callables).
PARTS = (("forward", 0), ("input gradient", 1), ("weight gradient", 2),
         ("forward + backward (input and weight gradients)", 3))


def callables(peers, x, w, g) -> list[dict]:
    """One {column: callable} per row of PARTS, each callable waiting for its result."""
    rows = [{} for _ in PARTS]

    def put(column, fns):
        for row, fn in zip(rows, fns):
            row[column] = fn
    lx = peers["lazyx"].module
    put("lazyx", _lazyx_fns(lx, x, w, g))
    put("lazyx NumPy kernels", _lazyx_fns(lx, x, w, g, "cpu-reference"))
    if "PyTorch" in peers:
        torch = peers["PyTorch"].module
        tx = torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
        tw = torch.from_numpy(w.transpose(0, 3, 1, 2).copy())
        tg = torch.from_numpy(g.transpose(0, 3, 1, 2).copy())
        conv = torch.nn.functional.conv2d

        def t_fwd():
            with torch.inference_mode():
                conv(tx, tw, padding=1)

        def t_grad(mask):
            def run():
                torch.ops.aten.convolution_backward(tg, tx, tw, [0], [1, 1], [1, 1], [1, 1], False,
                                                    [0, 0], 1, mask)
            return run

        def t_both():
            a = tx.detach().requires_grad_()
            b = tw.detach().requires_grad_()
            conv(a, b, padding=1).backward(tg)
        put("PyTorch", (t_fwd, t_grad([True, False, False]), t_grad([False, True, False]), t_both))
    if "MLX" in peers:
        m = peers["MLX"].module
        mx_, mw, mg = m.array(x), m.array(w), m.array(g)

        def loss(a, b):
            return m.sum(m.conv2d(a, b, padding=1) * mg)

        def timed(fn):
            return lambda: m.eval(fn(mx_, mw))
        put("MLX", (timed(lambda a, b: m.conv2d(a, b, padding=1)), timed(m.grad(loss, argnums=0)),
                    timed(m.grad(loss, argnums=1)), timed(m.value_and_grad(loss, argnums=(0, 1)))))
    return rows


def check(peers, x, w, g) -> None:
    """lazyx computes what a float64 NumPy im2col computes (a benchmark of a wrong
    result is void), forward and both gradients."""
    lx = peers["lazyx"].module
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    cols = np.lib.stride_tricks.sliding_window_view(xp, (K, K), axis=(1, 2))  # N H W C K K
    want = np.einsum("nhwcij,oijc->nhwo", cols, w.astype(np.float64), optimize=True)
    got = np.asarray(lx.conv2d(lx.array(x), lx.array(w), padding=1))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
    gw_want = np.einsum("nhwcij,nhwo->oijc", cols, g.astype(np.float64), optimize=True)
    _, (gx, gw) = lx.value_and_grad(lambda a, b: lx.sum(lx.conv2d(a, b, padding=1) * lx.array(g)),
                                    argnums=(0, 1))(lx.array(x), lx.array(w))
    np.testing.assert_allclose(np.asarray(gw), gw_want, rtol=0, atol=1e-4 * np.abs(gw_want).max())
    assert np.asarray(gx).shape == x.shape


def _print(title: str, t: dict) -> None:
    cells = "  ".join(f"{col} {sec * 1e3:8.2f} ms" for col, sec in t.items())
    ratios = "  ".join(f"lazyx/{col} {t['lazyx'] / sec:5.2f}x" for col, sec in t.items() if col != "lazyx")
    print(f"{title}\n  {cells}\n  {ratios}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="less time per figure")
    ap.add_argument("--median", action="store_true", help="medians instead of the fastest repeats")
    args = ap.parse_args(argv)
    peers = load()
    print(f"machine load before: {machine_load():.0%}; " + "; ".join(
        f"{p.name} {p.version} ({', '.join(p.notes)})" for p in peers.values() if p.notes))
    x, w, g = _data()
    check(peers, x, w, g)
    budget = 2.0 if args.quick else 8.0
    statistic = statistics.median if args.median else min
    print(f"conv2d {N}x{H}x{W}x{C} * {O}x{K}x{K}x{C}, padding 1, float32 "
          f"({'median' if args.median else 'fastest'} of interleaved repeats)")
    for (title, _), fns in zip(PARTS, callables(peers, x, w, g)):
        _print(f"conv2d {title}", compare(fns, budget_s=budget, rounds=4, warmup=2, statistic=statistic))


if __name__ == "__main__":
    main()
