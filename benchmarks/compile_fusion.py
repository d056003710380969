"""Fused element-wise throughput: GELU (erf and tanh forms) and a 10-op chain on 4M
float32 elements, compiled, against a NumPy copy of the same array (the memory
bandwidth limit) in the same run, side by side with MLX (``mx.compile``), JAX
(``jax.jit``) and PyTorch (``torch.compile``).

Run from the repository root::

    python benchmarks/compile_fusion.py

GB/s counts one read of the input and one write of the output (8 bytes per
element). Each column is timed producing an evaluated result (lazyx and MLX
evaluate, JAX blocks until ready); inputs are made and evaluated first, and
every column's result is checked against NumPy in float64. The columns show
medians; JAX's times are bimodal on the 2-core VM (most calls several times
slower than its best), so its median is far below its best.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.timing import compare, machine_load, samples  # noqa: E402

N = 1 << 22
C = math.sqrt(2 / math.pi)


def gelu_erf(m, x):
    return x * 0.5 * (1 + m.erf(x * (1 / math.sqrt(2))))


def gelu_tanh(m, x):
    return 0.5 * x * (1 + m.tanh(C * (x + 0.044715 * x * x * x)))


def chain(m, x):
    """Ten element-wise operations."""
    y = x * 2.0
    y = y + 1.0
    y = y * x
    y = y - 0.5
    y = m.abs(y)
    y = m.sqrt(y)
    y = y * 0.5
    y = m.maximum(y, x)
    y = y + x
    return y / 3.0


def _reference(name, x):
    from math import erf
    x = x.astype(np.float64)
    if name == "GELU (erf)":
        return x * 0.5 * (1 + np.vectorize(erf)(x / math.sqrt(2)))
    if name == "GELU (tanh)":
        return gelu_tanh(np, x)
    return chain(np, x)


CASES = {"GELU (erf)": gelu_erf, "GELU (tanh)": gelu_tanh, "10-op chain": chain}


def _columns(fn, x_np):
    """{column: (run, result)} for every framework that imports."""
    cols = {}
    import lazyx.core as lx
    xl = lx.array(x_np)
    lazyx_fn = lx.compile(lambda x: fn(lx, x))
    lx.eval(lazyx_fn(xl))
    from lazyx.transforms.fusion import Compiled
    kinds = [type(n.prim).__name__ for e in lazyx_fn.cache.entries.values()
             for n in e.run_tape.nodes]
    print(f"  lazyx runs {kinds} per call" + ("" if Compiled.__name__ in kinds else
                                               " (no fused kernel: is there a C++ compiler?)"))
    cols["lazyx compiled"] = (lambda: lx.eval(lazyx_fn(xl)), lambda: np.array(lazyx_fn(xl)))
    try:
        import mlx.core as mlx
        xm = mlx.array(x_np)
        mlx_fn = mlx.compile(lambda x: fn(mlx, x))
        mlx.eval(mlx_fn(xm))
        cols["MLX compiled"] = (lambda: mlx.eval(mlx_fn(xm)), lambda: np.array(mlx_fn(xm)))
    except ImportError:
        pass
    try:
        import jax
        import jax.numpy as jnp
        import jax.scipy.special  # noqa: F401

        class _J:  # jnp with erf
            def __getattr__(self, name):
                return jax.scipy.special.erf if name == "erf" else getattr(jnp, name)
        jfn = jax.jit(lambda x: fn(_J(), x))
        xj = jax.device_put(x_np)
        jfn(xj).block_until_ready()
        cols["JAX jit"] = (lambda: jfn(xj).block_until_ready(), lambda: np.asarray(jfn(xj)))
    except ImportError:
        pass
    try:
        import torch
        tfn = torch.compile(lambda x: fn(torch, x))
        xt = torch.from_numpy(x_np.copy())
        with torch.no_grad():
            tfn(xt)
        cols["torch.compile"] = (lambda: tfn(xt), lambda: tfn(xt).numpy())
    except Exception as exc:  # a missing compiler or a failed inductor build
        print(f"  torch.compile unavailable: {type(exc).__name__}: {exc}")
    return cols


def main(budget_s: float = 3.0):
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal(N, dtype=np.float32)
    out = np.empty_like(x_np)
    moved = 8 * N
    print(f"Fused element-wise throughput, {N} float32 elements ({moved / 2**20:.0f} MiB moved "
          f"per call); machine load before the run: {machine_load():.0%}")
    rows = []
    for name, fn in CASES.items():
        cols = _columns(fn, x_np)
        ref = _reference(name, x_np)
        for col, (_, result) in cols.items():
            got = result().astype(np.float64)
            # float32 results, within 1e-3 relative or 1e-5 absolute (1 + erf(x) cancels
            # for very negative x: float32 erf's absolute error shows there).
            err = np.max(np.abs(got - ref) / (1e-3 * np.abs(ref) + 1e-5))
            assert err <= 1, f"{col} {name}: error {err} (1 is the tolerance)"
        runs = {"NumPy copy": lambda: np.copy(x_np), "NumPy copyto": lambda: np.copyto(out, x_np)}
        runs.update({col: run for col, (run, _) in cols.items()})
        for run in runs.values():  # JAX runs slowly for its first few dozen calls
            samples(run, budget_s=0.5, min_repeats=20)
        times = compare(runs, budget_s=budget_s)
        copy = min(times["NumPy copy"], times["NumPy copyto"])
        rows.append((name, {c: t for c, t in times.items() if not c.startswith("NumPy")}, copy))
    cols = list(rows[0][1])
    print()
    head = f"{'case':<14}{'copy GB/s':>11}" + "".join(f"{c:>22}" for c in cols)
    print(head)
    print("-" * len(head))
    for name, times, copy in rows:
        line = f"{name:<14}{moved / copy / 1e9:>11.1f}"
        for c in cols:
            t = times.get(c)
            line += f"{moved / t / 1e9:>9.1f} GB/s ({copy / t:>4.0%})" if t else f"{'-':>22}"
        print(line)
    print("\n(percentages: of the copy's bandwidth; the target for lazyx's GELU is 80%)")


if __name__ == "__main__":
    main()
