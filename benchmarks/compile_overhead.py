"""Per-op overhead of a compiled function: a 200-op element-wise chain on 16 float32.

    python benchmarks/compile_overhead.py [--budget SECONDS]

The data is tiny, so the time per call divided by the 200 ops is what a compiled
call costs per original op: lazyx's ``compile`` (one ``CompiledCall`` node
replaying its plan; with element-wise fusion when the fusion pass exists, and
with the plan alone), MLX's ``mx.compile`` (CPU build) and JAX's ``jax.jit``
(CPU), side by side in one run. Eager lazyx and NumPy are shown for reference.
Issue 4's target: at most MLX compiled's figure, aiming at JAX's.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks import peers as peer_mod  # noqa: E402
from benchmarks.timing import compare, machine_load  # noqa: E402

# The chain of the per-op overhead benchmark, here compiled.
from benchmarks.overhead import N_OPS, SIZE, _chain as chain  # noqa: E402


def cases(peers) -> dict:
    """{column: zero-argument callable running one compiled call and waiting for it}."""
    import lazyx.core as lx
    from lazyx.transforms import compile as compile_mod

    x0 = np.linspace(0.5, 1.5, SIZE, dtype=np.float32)
    c0 = np.full(SIZE, 0.5, np.float32)
    out = {}
    x, c = lx.array(x0), lx.array(c0)
    fused = lx.compile(lambda a, b: chain(a, b))
    lx.eval(fused(x, c))
    out["lazyx compile"] = lambda: lx.eval(fused(x, c))
    compile_mod.FUSE = False
    try:
        plan = lx.compile(lambda a, b: chain(a, b))
        lx.eval(plan(x, c))
    finally:
        compile_mod.FUSE = True
    out["lazyx compile, plan only"] = lambda: lx.eval(plan(x, c))
    out["lazyx eager"] = lambda: lx.eval(chain(x, c))
    out["NumPy eager"] = lambda: chain(x0, c0)
    if "MLX" in peers:
        mx = peers["MLX"].module
        mx_x, mx_c = mx.array(x0), mx.array(c0)
        mf = mx.compile(lambda a, b: chain(a, b))
        mx.eval(mf(mx_x, mx_c))
        out["MLX compile"] = lambda: mx.eval(mf(mx_x, mx_c))
    if "JAX" in peers:
        jax = peers["JAX"].module
        jf = jax.jit(lambda a, b: chain(a, b))
        j_x, j_c = jax.numpy.asarray(x0), jax.numpy.asarray(c0)
        jf(j_x, j_c).block_until_ready()
        out["JAX jit"] = lambda: jf(j_x, j_c).block_until_ready()
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=4.0,
                    help="seconds of measurement per column (default 4)")
    args = ap.parse_args(argv)
    peers = peer_mod.load()
    fns = cases(peers)
    load = machine_load()
    times = compare(fns, budget_s=args.budget)
    per_op = {k: v / N_OPS * 1e6 for k, v in times.items()}
    ref = per_op.get("MLX compile")
    print(f"Per-op overhead of a compiled {N_OPS}-op element-wise chain on {SIZE} float32 "
          f"(µs per op, median; machine load {load:.0%} before the run)\n")
    print("| | µs per op | × MLX compile |")
    print("|---|---|---|")
    for k, v in per_op.items():
        ratio = f"{v / ref:.2f}×" if ref else "—"
        print(f"| {k} | {v:.3f} | {ratio} |")
    return per_op


if __name__ == "__main__":
    main()
