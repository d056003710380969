"""Large single ops, eager: element-wise ops and reductions on 4M float32 elements,
side by side with PyTorch, NumPy, JAX (jit) and MLX in one run.

lazyx runs a single element-wise op on a large array (from 64K elements) as a
generated C++ kernel of the op's own expression, the code ``compile`` generates,
split over the native thread pool (``backends/cpu/compiled.py``); reductions and
softmax run the native kernels where they exist. The column ``lazyx before`` is the
same lazyx with generated single ops switched off (``LAZYX_CPU_ELEMENTWISE=0``:
NumPy's one-thread loops). Each figure is the fastest of interleaved repeats in
milliseconds (the machine may be shared with other work), then lazyx's time over
each peer's. The issue's target: ``exp``, ``add``, ``sum`` and ``softmax`` within
1.1x of PyTorch's time.

Run: ``python -m benchmarks.eager_large [--quick] [--only NAME ...]``.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks.peers import load  # noqa: E402
from benchmarks.throughput import numpy_softmax as _softmax  # noqa: E402
from benchmarks.timing import compare, machine_load, side_by_side  # noqa: E402

N = 1 << 22  # 4M float32: 16 MiB
ROWS, COLS = 4096, 1024  # softmax over the last axis of 4M elements


#: {title: (inputs (by name), {column family: fn(module, *inputs)}, float64 reference)}
def cases(rng):
    a = rng.standard_normal(N, dtype=np.float32)
    b = rng.standard_normal(N, dtype=np.float32)
    m = rng.standard_normal((ROWS, COLS), dtype=np.float32) * 3
    same = ("lazyx", "NumPy", "PyTorch", "MLX")

    def each(fn, numpy=None, torch=None, jax=None):
        out = dict.fromkeys(same, fn)
        # JAX: the same call on jax.numpy, jitted.
        out["JAX"] = jax or (lambda j, *xs: fn(j.numpy, *xs))
        if numpy is not None:
            out["NumPy"] = numpy
        if torch is not None:
            out["PyTorch"] = torch
        return out

    return {
        "exp 4M": ((a,), each(lambda m_, x: m_.exp(x)), lambda: np.exp(a.astype(np.float64))),
        "add 4M": ((a, b), each(lambda m_, x, y: m_.add(x, y)), lambda: a.astype(np.float64) + b),
        "multiply by scalar 4M": ((a,), each(lambda m_, x: m_.multiply(x, 0.5)), lambda: a * 0.5),
        "tanh 4M": ((a,), each(lambda m_, x: m_.tanh(x)), lambda: np.tanh(a.astype(np.float64))),
        "sum 4M": ((a,), each(lambda m_, x: m_.sum(x)), lambda: np.sum(a.astype(np.float64))),
        "sum 4096x1024 axis 0": ((m,), each(lambda m_, x: m_.sum(x, axis=0)),
                                 lambda: m.astype(np.float64).sum(axis=0)),
        "max 4M": ((a,), each(lambda m_, x: m_.max(x), torch=lambda t, x: t.amax(x)),
                   lambda: np.max(a).astype(np.float64)),
        "mean 4M": ((a,), each(lambda m_, x: m_.mean(x)), lambda: np.mean(a.astype(np.float64))),
        "softmax 4096x1024": ((m,), each(lambda m_, x: m_.softmax(x, axis=-1),
                                         numpy=lambda _, x: _softmax(x),
                                         torch=lambda t, x: t.softmax(x, -1),
                                         jax=lambda j, x: j.nn.softmax(x, axis=-1)),
                              lambda: _softmax(m.astype(np.float64))),
    }


def callables(peers, inputs, fns) -> dict:
    """{column: zero-argument callable computing the op and waiting for its result}."""
    from lazyx.array import from_buffer
    from lazyx.backends.cpu import compiled

    lx = peers["lazyx"].module
    lx_in = [from_buffer(v) for v in inputs]  # the same memory as NumPy's inputs
    f = fns["lazyx"]
    out = {"lazyx": lambda: lx.eval(f(lx, *lx_in))}

    def before():
        previous = compiled.set_elementwise(False)
        try:
            lx.eval(f(lx, *lx_in))
        finally:
            compiled.set_elementwise(previous)
    out["lazyx before"] = before
    if "PyTorch" in peers:
        torch = peers["PyTorch"].module
        t_in = [torch.from_numpy(v) for v in inputs]
        g = fns["PyTorch"]

        def run_torch(g=g):
            with torch.inference_mode():
                g(torch, *t_in)
        out["PyTorch"] = run_torch
    g = fns["NumPy"]
    out["NumPy"] = lambda g=g: g(np, *inputs)
    if "JAX" in peers:
        jax = peers["JAX"].module
        j_in = [jax.device_put(v) for v in inputs]
        jitted = jax.jit(lambda *xs, k=fns["JAX"]: k(jax, *xs))
        out["JAX"] = lambda g=jitted: g(*j_in).block_until_ready()
    if "MLX" in peers:
        mlx = peers["MLX"].module
        m_in = [mlx.array(v) for v in inputs]
        mlx.eval(m_in)
        h = fns["MLX"]
        out["MLX"] = lambda h=h: mlx.eval(h(mlx, *m_in))
    return out


def check(peers, title, inputs, fns, reference) -> None:
    """lazyx (both ways) computes the float64 reference (a wrong result's time is void)."""
    from lazyx.backends.cpu import compiled
    lx = peers["lazyx"].module
    want = np.asarray(reference(), dtype=np.float64)
    for enabled in (True, False):
        previous = compiled.set_elementwise(enabled)
        try:
            got = np.asarray(fns["lazyx"](lx, *[lx.array(v) for v in inputs]), dtype=np.float64)
        finally:
            compiled.set_elementwise(previous)
        scale = float(np.abs(want).max()) or 1.0
        tol = (1e-3 if title.startswith(("sum", "mean")) else 1e-5) * scale
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=tol, err_msg=title)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="less time per figure")
    ap.add_argument("--only", nargs="*", help="titles starting with these words")
    args = ap.parse_args(argv)
    peers = load()
    torch = peers.get("PyTorch")
    print(f"machine load before: {machine_load():.0%}; PyTorch threads: "
          f"{torch.module.get_num_threads() if torch else '-'}; "
          f"{'; '.join(peers['lazyx'].notes)}")
    for title, (inputs, fns, reference) in cases(np.random.default_rng(0)).items():
        if args.only and not title.startswith(tuple(args.only)):
            continue
        check(peers, title, inputs, fns, reference)
        t = compare(callables(peers, inputs, fns), budget_s=1.0 if args.quick else 3.0,
                    rounds=6, warmup=2, statistic=min)
        print(side_by_side(title, t, 22), flush=True)
    print(f"machine load after: {machine_load():.0%}")


if __name__ == "__main__":
    main()
