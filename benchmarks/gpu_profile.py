"""Where the host time of a GPU op goes: cProfile of repeated eager calls with eval and
synchronize, top functions by own time.

    python benchmarks/gpu_profile.py            # x + 1.0 on a float32[16], 2000 calls
    python benchmarks/gpu_profile.py --op conv  # gpu_models.py's conv2d row, 500 calls
"""

import argparse
import cProfile
import pstats
import time

import cupy as cp
import numpy as np

import lazyx.core as mx


def _tiny():
    x = mx.array(np.ones(16, np.float32))
    return lambda: x + 1.0, 2000


def _conv():
    # benchmarks/gpu_models.py's row: 3x3, 64->64 channels, 56x56, batch 32, bfloat16.
    gen = np.random.default_rng(0)
    x = mx.astype(mx.array(gen.standard_normal((32, 56, 56, 64)).astype(np.float32)),
                  mx.bfloat16)
    w = mx.astype(mx.array(gen.standard_normal((64, 3, 3, 64)).astype(np.float32) * 0.05),
                  mx.bfloat16)
    mx.eval(x, w)
    return lambda: mx.conv2d(x, w, padding=1), 500


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", choices=["tiny", "conv"], default="tiny")
    args = ap.parse_args()
    make, calls = {"tiny": _tiny, "conv": _conv}[args.op]()

    def loop():
        for _ in range(calls):
            mx.eval(make())
            cp.cuda.Device().synchronize()

    loop()
    t = time.perf_counter()
    loop()
    print(f"{args.op}: {(time.perf_counter() - t) / calls * 1e6:.1f} us per call "
          "(eval and synchronize)")
    pr = cProfile.Profile()
    pr.enable()
    loop()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
