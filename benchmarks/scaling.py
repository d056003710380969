"""A scaling picture: time against size for add, exp, sum, softmax and matmul.

Each op runs on float32 arrays from 1K to 16M elements (matmul: square n x n
matrices, n*n from 1K up to 4M elements, 16M with --full-matmul) for lazyx eager,
lazyx compiled (``mx.compile`` of the one op), PyTorch (CPU), NumPy and JAX
(``jax.jit``) where installed. Small sizes show each framework's fixed cost per call
(overhead-bound: the time is flat), large ones its memory bandwidth or flops (the
time grows with the size). Prints one table per op with each framework's time and
its ratio to the fastest, and with ``--plot PATH`` writes a PNG (log-log, one panel
per op, one line per framework; needs matplotlib, the ``plot`` extra).

Times are minima of interleaved repeats: on a shared machine the minimum is the
figure least disturbed by other processes.

    python -m benchmarks.scaling [--quick] [--plot /tmp/lazyx_scaling.png]
"""

from __future__ import annotations

import argparse
import math

import numpy as np

import lazyx.core as mx

from benchmarks.timing import compare

SIZES = [1 << k for k in range(10, 25, 2)]  # 1K, 4K, ... 16M
QUICK_SIZES = [1 << 10, 1 << 14, 1 << 18, 1 << 22]
OPS = ["add", "exp", "sum", "softmax", "matmul"]
SOFTMAX_ROW = 1024  # softmax over rows of this length (or the whole array when smaller)


def _shape(op: str, size: int) -> tuple:
    if op == "matmul":
        n = int(round(math.sqrt(size)))
        return (n, n)
    if op == "softmax":
        row = min(size, SOFTMAX_ROW)
        return (size // row, row)
    return (size,)


def _frameworks():
    """name -> module-like handle, for the peers that import."""
    out = {}
    try:
        import torch
        out["PyTorch"] = torch
    except ImportError:  # pragma: no cover - optional peer
        pass
    try:
        import jax
        jax.config.update("jax_platforms", "cpu")
        out["JAX jit"] = jax
    except Exception:  # pragma: no cover - optional peer
        pass
    return out


def _calls(op: str, shape: tuple, peers: dict, rng) -> dict:
    """framework -> zero-argument callable that computes op and waits for it."""
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.standard_normal(shape).astype(np.float32)
    lx = {
        "add": lambda a, b: a + b,
        "exp": lambda a, b: mx.exp(a),
        "sum": lambda a, b: mx.sum(a),
        "softmax": lambda a, b: mx.softmax(a, axis=-1),
        "matmul": lambda a, b: a @ b,
    }[op]
    X, Y = mx.array(x), mx.array(y)
    mx.eval(X, Y)
    compiled = mx.compile(lx)

    def np_softmax(a):
        e = np.exp(a - a.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    npf = {"add": lambda: x + y, "exp": lambda: np.exp(x), "sum": lambda: x.sum(),
           "softmax": lambda: np_softmax(x), "matmul": lambda: x @ y}[op]
    calls = {
        "lazyx eager": lambda: mx.eval(lx(X, Y)),
        "lazyx compiled": lambda: mx.eval(compiled(X, Y)),
        "NumPy": npf,
    }
    torch = peers.get("PyTorch")
    if torch is not None:
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)
        tf = {"add": lambda: tx + ty, "exp": lambda: torch.exp(tx), "sum": lambda: tx.sum(),
              "softmax": lambda: torch.softmax(tx, -1), "matmul": lambda: tx @ ty}[op]
        calls["PyTorch"] = tf
    jax = peers.get("JAX jit")
    if jax is not None:
        jnp = jax.numpy
        jf = jax.jit({"add": lambda a, b: a + b, "exp": lambda a, b: jnp.exp(a),
                      "sum": lambda a, b: jnp.sum(a),
                      "softmax": lambda a, b: jax.nn.softmax(a, axis=-1),
                      "matmul": lambda a, b: a @ b}[op])
        jx, jy = jax.device_put(x), jax.device_put(y)
        calls["JAX jit"] = lambda: jf(jx, jy).block_until_ready()
    return calls


def measure(sizes, ops, budget_s: float, rounds: int, matmul_max: int) -> dict:
    """{op: {size: {framework: seconds}}}."""
    peers = _frameworks()
    rng = np.random.default_rng(0)
    out = {}
    for op in ops:
        out[op] = {}
        for size in sizes:
            if op == "matmul" and size > matmul_max:
                continue
            shape = _shape(op, size)
            elements = int(np.prod(shape))
            calls = _calls(op, shape, peers, rng)
            budget = budget_s * (4 if op == "matmul" and elements >= 1 << 20 else 1)
            out[op][elements] = compare(calls, budget_s=budget, rounds=rounds, warmup=2,
                                        gap_s=0.005, statistic=min)
            del calls
    return out


def _fmt(sec: float) -> str:
    if sec < 1e-3:
        return f"{sec * 1e6:7.1f} us"
    if sec < 1:
        return f"{sec * 1e3:7.2f} ms"
    return f"{sec:7.2f} s "


def table(results: dict) -> str:
    """The printed tables: per op, a row per size with each framework's time and
    its ratio to the fastest framework of that row."""
    lines = []
    for op, rows in results.items():
        if not rows:
            continue
        names = list(next(iter(rows.values())))
        lines.append(f"\n{op} (float32; time, and / fastest)")
        lines.append(f"{'elements':>10} " + " ".join(f"{n:>22}" for n in names))
        for size, times in rows.items():
            best = min(times.values())
            cells = " ".join(f"{_fmt(times[n])} {times[n] / best:5.2f}x    " for n in names)
            lines.append(f"{size:>10} {cells}")
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    import matplotlib  # the `plot` extra: only for --plot
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ops = [op for op in results if results[op]]
    fig, axes = plt.subplots(1, len(ops), figsize=(4.2 * len(ops), 3.8), squeeze=False)
    for ax, op in zip(axes[0], ops):
        rows = results[op]
        sizes = list(rows)
        for name in next(iter(rows.values())):
            ax.plot(sizes, [rows[s][name] * 1e3 for s in sizes], marker="o", ms=3, label=name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(op + (" (n x n)" if op == "matmul" else ""))
        ax.set_xlabel("elements")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("time per call (ms)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("lazyx scaling, float32 on the CPU (minima of interleaved repeats)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 sizes, short budgets")
    ap.add_argument("--plot", nargs="?", const="/tmp/lazyx_scaling.png", default=None,
                    metavar="PATH", help="write the PNG (default path /tmp/lazyx_scaling.png)")
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of " + ",".join(OPS))
    ap.add_argument("--full-matmul", action="store_true", help="matmul up to 4096 x 4096 (slow)")
    args = ap.parse_args(argv)
    ops = [o for o in args.ops.split(",") if o]
    sizes = QUICK_SIZES if args.quick else SIZES
    budget, rounds = (0.08, 3) if args.quick else (0.3, 5)
    matmul_max = 1 << 24 if args.full_matmul else 1 << 22
    results = measure(sizes, ops, budget, rounds, matmul_max)
    print(table(results))
    if args.plot:
        plot(results, args.plot)
        print(f"\nwrote {args.plot}")


if __name__ == "__main__":
    main()
