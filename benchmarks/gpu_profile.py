"""Where the time of a tiny GPU op goes: cProfile of 2000 calls of ``x + 1.0`` on a
float32[16] with eval and synchronize, top functions by own time.

    python benchmarks/gpu_profile.py
"""

import cProfile
import pstats

import cupy as cp
import numpy as np

import lazyx.core as mx


def main():
    x = mx.array(np.ones(16, np.float32))
    mx.eval(x + 1.0)

    def loop():
        for _ in range(2000):
            y = x + 1.0
            mx.eval(y)
        cp.cuda.Device().synchronize()

    loop()
    pr = cProfile.Profile()
    pr.enable()
    loop()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
