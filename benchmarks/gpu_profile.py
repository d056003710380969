"""Where the time of GPU work goes.

Host time: cProfile of repeated eager calls with eval and synchronize, top functions by
own time.

    python benchmarks/gpu_profile.py            # x + 1.0 on a float32[16], 2000 calls
    python benchmarks/gpu_profile.py --op conv  # gpu_models.py's conv2d row, 500 calls
    python benchmarks/gpu_profile.py --op qmm   # gpu_models.py's 4-bit decode product
    python benchmarks/gpu_profile.py --op attention  # its bf16 causal attention, 200 calls

The floor under an eager op: ``--op micro`` times CuPy's allocation, a launch of an
empty kernel through CuPy and through the driver API, and PyTorch's tiny op.

Host time per primitive: ``--op mlp`` times each kernel call of gpu_training.py's MLP
step (eager) on the host, then profiles whole steps.

GPU time per primitive: ``--op lm`` runs gpu_training.py's transformer LM step eagerly
with a CUDA event pair around every kernel the ``cuda`` backend runs and prints the
primitives by total GPU time (the queue stays full, so consecutive events time the
kernels between them).
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


def _qmm():
    gen = np.random.default_rng(0)
    w = mx.astype(mx.array(gen.standard_normal((4096, 4096)).astype(np.float32) * 0.05),
                  mx.bfloat16)
    packed, scales, biases = mx.quantize(w, group_size=64, bits=4)
    x = mx.astype(mx.array(gen.standard_normal((1, 4096)).astype(np.float32)), mx.bfloat16)
    mx.eval(packed, scales, biases, x)
    return (lambda: mx.quantized_matmul(x, packed, scales, biases, transpose=True,
                                        group_size=64, bits=4)), 1000


def _attention():
    # gpu_models.py's attention row: bf16, 8 x 16 heads x 2048 x 128, causal.
    gen = np.random.default_rng(0)
    q, k, v = (mx.astype(mx.array(gen.standard_normal((8, 16, 2048, 128)).astype(np.float32)),
                         mx.bfloat16) for _ in range(3))
    mx.eval(q, k, v)
    return (lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=128 ** -0.5,
                                                         mask="causal")), 200


def _per_call(fn, n):
    fn()
    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    cp.cuda.Device().synchronize()
    return (time.perf_counter() - t) / n * 1e6


def micro():
    """The costs an eager op is made of on this machine (µs per call, queued, one wait)."""
    n = 20000
    empty = cp.RawKernel(r'extern "C" __global__ void nop(float* p, long long n) {}', "nop")
    buf = cp.empty(16, cp.float32)
    empty((1,), (32,), (buf, np.int64(16)))
    fn = empty.kernel
    stream = cp.cuda.get_current_stream()
    rows = {
        "cp.empty(16)": lambda: cp.empty(16, cp.float32),
        "RawKernel launch (CuPy)": lambda: empty((1,), (32,), (buf, np.int64(16))),
        "cupy.cuda.driver.launchKernel": None,
        "CuPy x + 1.0": lambda: buf + 1.0,
        "lazyx eval(x + 1.0)": None,
    }
    try:
        import ctypes
        params = (ctypes.c_void_p(buf.data.ptr), ctypes.c_int64(16))
        argv = (ctypes.c_void_p * 2)(*[ctypes.addressof(p) for p in params])
        launch = cp.cuda.driver.launchKernel
        rows["cupy.cuda.driver.launchKernel"] = lambda: launch(
            fn.ptr, 1, 1, 1, 32, 1, 1, 0, stream.ptr, ctypes.addressof(argv), 0)
    except Exception as exc:  # noqa: BLE001
        print("driver launch unavailable:", exc)
        rows.pop("cupy.cuda.driver.launchKernel")
    x = mx.array(np.ones(16, np.float32))
    mx.eval(x)
    rows["lazyx eval(x + 1.0)"] = lambda: mx.eval(x + 1.0)
    try:
        import torch
        t = torch.ones(16, device="cuda")
        rows["PyTorch t + 1.0"] = lambda: t + 1.0
        rows["PyTorch torch.empty(16)"] = lambda: torch.empty(16, device="cuda")
    except Exception as exc:  # noqa: BLE001
        print("no PyTorch:", exc)
    for name, f in rows.items():
        print(f"{name:34s} {_per_call(f, n):8.2f} us")


def lm_kernels(steps: int = 5):
    """GPU time per primitive of gpu_training.py's LM step (eager)."""
    import collections
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import gpu_training as G
    from lazyx.backends import cuda as lcuda

    backend = lcuda._BACKEND
    records = []
    prepare = backend.prepare_kernel

    def timed(fn):
        inner = prepare(fn)

        def kernel(prim, inputs):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            out = inner(prim, inputs)
            b.record()
            records.append((type(prim).__name__, tuple(getattr(x, "shape", ()) for x in inputs),
                            a, b))
            return out
        return kernel
    backend.prepare_kernel = timed
    run, sync = G.lazyx_lm(False)
    run()
    sync()
    records.clear()
    t = time.perf_counter()
    for _ in range(steps):
        run()
    sync()
    wall = (time.perf_counter() - t) / steps
    total = collections.Counter()
    count = collections.Counter()
    shapes = collections.defaultdict(collections.Counter)
    for name, shp, a, b in records:
        ms = cp.cuda.get_elapsed_time(a, b)
        total[name] += ms
        count[name] += 1
        shapes[name][shp] += ms
    gpu = sum(total.values()) / steps
    print(f"LM step (eager, events on): {wall * 1e3:.2f} ms wall, {gpu:.2f} ms GPU in kernels, "
          f"{len(records) // steps} kernels per step")
    for name, ms in total.most_common(25):
        top = shapes[name].most_common(1)[0]
        print(f"{name:28s} {ms / steps:8.3f} ms/step {count[name] // steps:5d} calls  "
              f"top shapes {top[0]} {top[1] / steps:.3f} ms")


def mlp_host(steps: int = 50):
    """Host time per primitive of gpu_training.py's MLP step (eager): each kernel call
    timed on the host (the GPU runs behind), then a profile of whole steps."""
    import collections
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import gpu_training as G
    from lazyx.backends import cuda as lcuda

    run, sync = G.lazyx_mlp(False)
    for _ in range(5):
        run()
    wall = _per_call(run, steps) / 1e6
    backend = lcuda._BACKEND
    total = collections.Counter()
    count = collections.Counter()
    prepare = backend.prepare_kernel
    clock = time.perf_counter

    def timed(fn):
        inner = prepare(fn)

        def kernel(prim, inputs):
            t0 = clock()
            out = inner(prim, inputs)
            total[type(prim).__name__] += clock() - t0
            count[type(prim).__name__] += 1
            return out
        return kernel
    backend.prepare_kernel = timed
    from lazyx import backend as core_backend
    core_backend.invalidate_dispatch()  # the kernel tables are made again, timed
    run()
    sync()
    total.clear()
    count.clear()
    t = time.perf_counter()
    for _ in range(steps):
        run()
    sync()
    timed_wall = (time.perf_counter() - t) / steps
    kernels = sum(total.values()) / steps
    print(f"MLP step (eager): {wall * 1e6:.0f} us per step; with kernel timers {timed_wall * 1e6:.0f} "
          f"us, of which {kernels * 1e6:.0f} us in {sum(count.values()) // steps} kernel calls")
    for name, s in total.most_common(30):
        print(f"  {name:24s} {s / steps * 1e6:8.1f} us/step {count[name] // steps:4d} calls "
              f"{s / count[name] * 1e6:7.2f} us/call")
    backend.prepare_kernel = prepare
    core_backend.invalidate_dispatch()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(steps):
        run()
    sync()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(35)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", choices=["tiny", "conv", "qmm", "attention", "micro", "lm", "mlp"],
                    default="tiny")
    args = ap.parse_args()
    if args.op == "micro":
        return micro()
    if args.op == "lm":
        return lm_kernels()
    if args.op == "mlp":
        return mlp_host()
    make, calls = {"tiny": _tiny, "conv": _conv, "qmm": _qmm, "attention": _attention}[args.op]()

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
    pstats.Stats(pr).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    main()
