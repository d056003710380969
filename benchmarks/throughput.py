"""Throughput on arrays of 1M elements or more, and a NumPy copy as the bandwidth reference.

Each case times one call that produces an evaluated result: lazyx and MLX
build and evaluate (so lazyx's per-call Python cost is included), NumPy and
PyTorch run eagerly, JAX runs a jitted function and blocks until ready.
Inputs are made and evaluated before timing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

N = 1 << 22  # 4M float32 elements: 16 MiB
SOFTMAX_SHAPES = ((4096, 1024), (256, 1024))
MATMUL_N = 1024
#: PyTorch is also timed on one thread; its column shows the faster of the two
#: (on small VMs its two-thread runs sometimes wait milliseconds for a worker to wake).
TORCH_ONE_THREAD = "PyTorch 1 thread"


@dataclass
class Case:
    name: str
    runs: dict          # column -> zero-argument callable
    reference: object   # callable returning the NumPy float64 result, for checking
    results: dict       # column -> callable returning the result as NumPy (for checking)


def numpy_softmax(x):
    """Softmax over the last axis in NumPy (a peer's column and the float64 reference)."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _specs(rng):
    """(name, inputs, {column family: fn(namespace, *inputs)}, float64 reference)."""
    a = rng.standard_normal(N, dtype=np.float32)
    b = rng.standard_normal(N, dtype=np.float32)
    specs = [
        (f"add {N // 2**20}M", (a, b),
         {"lazyx": lambda m, x, y: m.add(x, y), "NumPy": lambda m, x, y: np.add(x, y),
          "MLX": lambda m, x, y: m.add(x, y), "PyTorch": lambda m, x, y: m.add(x, y),
          "JAX": lambda m, x, y: m.numpy.add(x, y)},
         lambda: a.astype(np.float64) + b),
        (f"exp {N // 2**20}M", (a,),
         {"lazyx": lambda m, x: m.exp(x), "NumPy": lambda m, x: np.exp(x),
          "MLX": lambda m, x: m.exp(x), "PyTorch": lambda m, x: m.exp(x),
          "JAX": lambda m, x: m.numpy.exp(x)},
         lambda: np.exp(a.astype(np.float64))),
        (f"sum {N // 2**20}M", (a,),
         {"lazyx": lambda m, x: m.sum(x), "NumPy": lambda m, x: np.sum(x),
          "MLX": lambda m, x: m.sum(x), "PyTorch": lambda m, x: m.sum(x),
          "JAX": lambda m, x: m.numpy.sum(x)},
         lambda: np.sum(a.astype(np.float64))),
    ]
    for rows, cols in SOFTMAX_SHAPES:
        x = rng.standard_normal((rows, cols), dtype=np.float32) * 3
        specs.append((
            f"softmax {rows}x{cols} (last axis)", (x,),
            {"lazyx": lambda m, v: m.softmax(v, axis=-1), "NumPy": lambda m, v: numpy_softmax(v),
             "MLX": lambda m, v: m.softmax(v, axis=-1), "PyTorch": lambda m, v: m.softmax(v, -1),
             "JAX": lambda m, v: m.nn.softmax(v, axis=-1)},
            lambda x=x: numpy_softmax(x.astype(np.float64))))
    p = rng.standard_normal((MATMUL_N, MATMUL_N), dtype=np.float32)
    q = rng.standard_normal((MATMUL_N, MATMUL_N), dtype=np.float32)
    specs.append((
        f"matmul {MATMUL_N}x{MATMUL_N}", (p, q),
        {"lazyx": lambda m, x, y: m.matmul(x, y), "NumPy": lambda m, x, y: np.matmul(x, y),
         "MLX": lambda m, x, y: m.matmul(x, y), "PyTorch": lambda m, x, y: m.matmul(x, y),
         "JAX": lambda m, x, y: m.numpy.matmul(x, y)},
        lambda: p.astype(np.float64) @ q))
    return specs


def cases(peers) -> list[Case]:
    rng = np.random.default_rng(0)
    out = []
    for name, inputs, fns, reference in _specs(rng):
        runs, results = {}, {}
        lx = peers["lazyx"].module
        # lazyx and PyTorch wrap the NumPy inputs without copying: the three read the same memory.
        from lazyx.array import from_buffer
        lx_in = [from_buffer(v) for v in inputs]
        f = fns["lazyx"]

        def run_lazyx(f=f, ins=lx_in):
            lx.eval(f(lx, *ins))
        runs["lazyx"] = run_lazyx
        results["lazyx"] = lambda f=f, ins=lx_in: np.asarray(f(lx, *ins))

        def run_reference(f=f, ins=lx_in):
            with lx.use_backend("cpu", "cpu-reference"):
                lx.eval(f(lx, *ins))
        runs["lazyx NumPy kernels"] = run_reference

        f = fns["NumPy"]
        runs["NumPy"] = lambda f=f, ins=inputs: f(np, *ins)
        results["NumPy"] = lambda f=f, ins=inputs: f(np, *ins)
        if "MLX" in peers:
            mx = peers["MLX"].module
            mx_in = [mx.array(v) for v in inputs]
            mx.eval(mx_in)
            f = fns["MLX"]
            runs["MLX"] = lambda f=f, ins=mx_in: mx.eval(f(mx, *ins))
            results["MLX"] = lambda f=f, ins=mx_in: np.asarray(f(mx, *ins))
        if "PyTorch" in peers:
            torch = peers["PyTorch"].module
            t_in = [torch.from_numpy(v) for v in inputs]
            f = fns["PyTorch"]

            default_threads = torch.get_num_threads()

            def run_torch(f=f, ins=t_in, threads=default_threads):
                if torch.get_num_threads() != threads:
                    torch.set_num_threads(threads)
                with torch.inference_mode():
                    return f(torch, *ins)
            runs["PyTorch"] = run_torch
            if default_threads > 1:
                runs[TORCH_ONE_THREAD] = lambda r=run_torch: r(threads=1)
            results["PyTorch"] = lambda r=run_torch: r().numpy()
        if "JAX" in peers:
            jax = peers["JAX"].module
            j_in = [jax.device_put(v) for v in inputs]
            jitted = jax.jit(lambda *ins, f=fns["JAX"]: f(jax, *ins))
            runs["JAX"] = lambda g=jitted, ins=j_in: g(*ins).block_until_ready()
            results["JAX"] = lambda g=jitted, ins=j_in: np.asarray(g(*ins))
        out.append(Case(name, runs, reference, results))
    return out


def check(case: Case) -> list[str]:
    """Columns whose result disagrees with the float64 reference (a wrong result's time is void)."""
    ref = np.asarray(case.reference())
    bad = []
    for col, fn in case.results.items():
        got = np.asarray(fn(), dtype=np.float64)
        scale = np.abs(ref).max() if ref.size else 1.0
        tol = 1e-3 * scale if case.name.startswith(("sum", "matmul")) else 1e-4 * scale
        if got.shape != ref.shape or not np.allclose(got, ref, rtol=1e-4, atol=tol):
            bad.append(col)
    return bad


def copy_bandwidth() -> tuple[float, float]:
    """(seconds, GB/s) of a NumPy copy of N float32 (bytes read + bytes written)."""
    from .timing import median_time
    a = np.ones(N, np.float32)
    out = np.empty_like(a)
    t = median_time(lambda: np.copyto(out, a))
    return t, 2 * a.nbytes / t / 1e9
