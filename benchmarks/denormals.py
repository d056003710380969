"""Subnormal numbers: how much slower a kernel runs when its values underflow.

For each kernel, the same shapes with normal values and with values whose products
are subnormal (float32 below 1.18e-38), for lazyx with flushing on (the default) and
off (``mx.set_flush_denormal``), PyTorch with its default (off) and with
``torch.set_flush_denormal(True)``, and NumPy (IEEE). Prints milliseconds and the
ratio subnormal / normal per column; the issue's bar is 1.5x. The penalty is the
CPU's: Intel cores take microcode assists on subnormal results, AMD Zen 3 does not
(ratios ~1 there in every column). Times are minima of interleaved repeats (the
machine may be shared; a two-thread BLAS call on a loaded machine stalls for ms).

    python benchmarks/denormals.py [--quick]
"""

from __future__ import annotations

import argparse

import numpy as np

import lazyx.core as mx

from benchmarks.timing import compare


def _cases(rng):
    """name -> (normal inputs, underflowing inputs), float32 NumPy arrays."""
    a = rng.standard_normal((256, 512)).astype(np.float32)
    b = rng.standard_normal((512, 512)).astype(np.float32)
    x = rng.standard_normal(1 << 20).astype(np.float32)
    y = rng.standard_normal(1 << 20).astype(np.float32)
    return {
        # A backward pass late in training: cotangents of 1e-30 meet weights of 1e-10.
        "matmul 256x512 @ 512x512": ((a, b), ((a * 1e-30).astype(np.float32), (b * 1e-10).astype(np.float32))),
        "x * y + x, 1M (products 1e-40)": ((x, y), ((x * 1e-20).astype(np.float32), (y * 1e-20).astype(np.float32))),
    }


def _lazyx_fns(name):
    if name.startswith("matmul"):
        return lambda a, b: a @ b
    return lambda x, y: x * y + x


def _lazyx_call(fn, arrays, compiled=False):
    f = mx.compile(fn) if compiled else fn
    xs = [mx.array(v) for v in arrays]
    mx.eval(*xs)
    return lambda: mx.eval(f(*xs))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter timing budget")
    args = ap.parse_args(argv)
    budget = 0.3 if args.quick else 1.0
    try:
        import torch
    except ImportError:  # pragma: no cover - PyTorch is optional here
        torch = None
    rng = np.random.default_rng(0)
    before = mx.get_flush_denormal()
    print(f"flush supported here: {mx.set_flush_denormal(True)}; minima of interleaved repeats, ms")
    for name, (normal, under) in _cases(rng).items():
        fn = _lazyx_fns(name)
        rows = {}
        # The switch restarts OpenBLAS's workers: columns are timed per mode, interleaved.
        for flush in (True, False):
            mx.set_flush_denormal(flush)
            mode = "flush" if flush else "IEEE"
            fns = {}
            for label, arrays in (("normal", normal), ("subnormal", under)):
                fns[f"lazyx {mode} | {label}"] = _lazyx_call(fn, arrays)
                if not name.startswith("matmul"):
                    fns[f"lazyx compiled {mode} | {label}"] = _lazyx_call(fn, arrays, compiled=True)
                fns[f"NumPy (lazyx {mode}) | {label}"] = (lambda arrays=arrays: fn(*arrays))
                if torch is not None:
                    ts = [torch.from_numpy(v) for v in arrays]

                    def torch_flush(ts=ts):
                        torch.set_flush_denormal(True)
                        fn(*ts)
                        torch.set_flush_denormal(False)
                    fns[f"PyTorch default | {label}"] = lambda ts=ts: fn(*ts)
                    fns[f"PyTorch flush | {label}"] = torch_flush
            got = compare(fns, budget_s=budget, statistic=min)
            for k, v in got.items():
                rows[k] = min(v, rows.get(k, v))
        print(f"\n{name}")
        print(f"  {'':26} {'normal':>9} {'subnormal':>10} {'ratio':>7}")
        for col in dict.fromkeys(k.split(" | ")[0] for k in rows):
            t0, t1 = rows[f"{col} | normal"], rows[f"{col} | subnormal"]
            print(f"  {col:26} {t0 * 1e3:9.3f} {t1 * 1e3:10.3f} {t1 / t0:6.2f}x")
    mx.set_flush_denormal(before)


if __name__ == "__main__":
    main()
