"""The kernels models are made of (issue 14) on an NVIDIA GPU, side by side with PyTorch.

    python benchmarks/gpu_models.py [--quick]

Rows, each against PyTorch on the same GPU in the same run (its cuDNN convolution,
its fused ``scaled_dot_product_attention``) and against a device-to-device copy
(cudaMemcpy) where the kernel is bandwidth-bound:

- ``conv2d`` 3x3, 64->64 channels, 56x56, batch 32, bfloat16, channels last;
- attention forward, bfloat16, batch 8, 16 heads, 2048 tokens, head dim 128, causal
  (TFLOP/s counting the causal half of the products);
- ``rms_norm`` and ``layer_norm`` of 16384x8192 bfloat16 (GB/s read + written);
- a 4-bit ``quantized_matmul`` of 1x4096 by 4096x4096 (decode-shaped; GB/s of packed
  weights, scales and biases read), against the copy's bandwidth: the bound; once as one
  eager call (what a call costs: the host's launch dominates) and once as 16 chained
  products of 16 weights in one compiled call (a CUDA graph).

The last rows time the GPU's work alone: CUDA events around calls queued behind a
spinning kernel, so that the host's launch and wait are hidden (the kernels' own pace,
which is what the bandwidth bound and PyTorch's kernels are compared with).

Every timing waits for the GPU; medians of interleaved repeats after warm-ups. The
"queued" rows run 10 calls before one wait (each side alike), so they time the GPU's
work rather than one call's host time and wait. The
last column is lazyx's time over the best peer's (for the copy rows, the fraction of
the copy's bandwidth lazyx reaches).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks.timing import Table, waiting  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    budget = 0.3 if args.quick else 1.0

    import cupy as cp
    import torch
    import torch.nn.functional as F

    import lazyx.core as mx

    def sync():
        cp.cuda.Device().synchronize()

    def lz(f):
        return waiting(lambda: mx.eval(f()), sync)

    def tf(f):
        return waiting(f, torch.cuda.synchronize)

    def cpf(f):
        return waiting(f, sync)

    def d2d(src, calls=1):
        """A device-to-device cudaMemcpy of ``src`` (the copy bandwidth: CuPy's copy kernel
        moves 16-bit elements one at a time, at a fraction of it), ``calls`` times."""
        dst = cp.empty_like(src)

        def run():
            for _ in range(calls):
                dst.data.copy_from_device_async(src.data, src.nbytes)
        return cpf(run)

    #: Calls queued before one wait in the "queued" rows: the GPU's time per call, where
    #: a single call's row also holds its host time and the wait.
    QUEUED = 10

    def lzq(f):
        def run():
            for _ in range(QUEUED):
                mx.eval(f())
        return waiting(run, sync)

    def tfq(f):
        def run():
            for _ in range(QUEUED):
                f()
        return tf(run)

    table = Table(budget)
    row = table.row

    gen = np.random.default_rng(0)
    bf16 = mx.bfloat16

    def both(shape, scale=1.0):
        host = (gen.standard_normal(shape) * scale).astype(np.float32)
        x = mx.astype(mx.array(host), bf16)
        mx.eval(x)
        return x, torch.as_tensor(host, device="cuda").to(torch.bfloat16)

    # -- conv2d --------------------------------------------------------------------
    x, tx = both((32, 56, 56, 64))
    w, tw = both((64, 3, 3, 64), 0.05)
    tx_cl = tx.permute(0, 3, 1, 2)  # NCHW view of NHWC memory: channels last for cuDNN
    tw_cl = tw.permute(0, 3, 1, 2)
    flops = 2 * 32 * 56 * 56 * 64 * 64 * 9
    row("conv2d 3x3 64->64 56^2 b32 bf16 (TFLOP/s)",
        {"lazyx": lz(lambda: mx.conv2d(x, w, padding=1)),
         "torch": tf(lambda: F.conv2d(tx_cl, tw_cl, padding=1))}, work=flops / 1e3, unit="TFLOP/s")

    # -- attention -------------------------------------------------------------------
    B, H, T, D = 8, 16, 2048, 128
    q, tq = both((B, H, T, D))
    k, tk = both((B, H, T, D))
    v, tv = both((B, H, T, D))
    scale = D ** -0.5
    att_flops = 4 * B * H * T * T * D / 2  # two products, the causal half
    row("attention b8 h16 T2048 d128 causal bf16 (TFLOP/s)",
        {"lazyx": lz(lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")),
         "torch": tf(lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=True, scale=scale))},
        work=att_flops / 1e3, unit="TFLOP/s")
    row(f"  the same, {QUEUED} calls queued (TFLOP/s)",
        {"lazyx": lzq(lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale,
                                                                    mask="causal")),
         "torch": tfq(lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=True,
                                                             scale=scale))},
        work=QUEUED * att_flops / 1e3, unit="TFLOP/s")

    # -- norms -------------------------------------------------------------------------
    n, d = 16384, 8192
    a, ta = both((n, d))
    g, tg = both((d,))
    bvec, tb = both((d,))
    ca = a._data.view(cp.uint16)  # the copy of the same bytes (CuPy copies bfloat16 slowly)
    moved = 2 * 2 * n * d
    row("rms_norm 16384x8192 bf16 (GB/s r+w)",
        {"lazyx": lz(lambda: mx.fast.rms_norm(a, g, 1e-5)),
         "torch": tf(lambda: F.rms_norm(ta, (d,), tg, 1e-5)),
         "memcpy": d2d(ca)}, work=moved, unit="GB/s")
    row(f"  the same, {QUEUED} calls queued (GB/s r+w)",
        {"lazyx": lzq(lambda: mx.fast.rms_norm(a, g, 1e-5)),
         "torch": tfq(lambda: F.rms_norm(ta, (d,), tg, 1e-5)),
         "memcpy": d2d(ca, QUEUED)}, work=QUEUED * moved, unit="GB/s")
    row("layer_norm 16384x8192 bf16 (GB/s r+w)",
        {"lazyx": lz(lambda: mx.fast.layer_norm(a, g, bvec, 1e-5)),
         "torch": tf(lambda: F.layer_norm(ta, (d,), tg, tb, 1e-5)),
         "memcpy": d2d(ca)}, work=moved, unit="GB/s")

    # -- 4-bit quantized matmul, decode-shaped --------------------------------------------
    wq, _ = both((4096, 4096), 0.05)
    packed, scales, biases = mx.quantize(wq, group_size=64, bits=4)
    xv, txv = both((1, 4096))
    mx.eval(packed, scales, biases)
    weight_bytes = packed.nbytes + scales.nbytes + biases.nbytes
    # The bound: reading that many bytes at the copy's bandwidth (a copy of the same size).
    same = cp.empty(weight_bytes // 2, dtype=cp.uint16)
    twq = torch.as_tensor(np.asarray(mx.astype(wq, mx.float32)), device="cuda").to(torch.bfloat16)
    row("quantized_matmul 4-bit 1x4096.4096^2 (GB/s of weights)",
        {"lazyx": lz(lambda: mx.quantized_matmul(xv, packed, scales, biases, transpose=True,
                                                 group_size=64, bits=4)),
         "torch bf16 matmul": tf(lambda: txv @ twq.T),
         "memcpy (same bytes, r+w/2)": d2d(same)},
        work=weight_bytes, unit="GB/s")

    # The kernel itself: one call of the row above costs the host more than the GPU (a
    # launch alone ~5 us here), so 16 products of 16 different weights (more bytes than
    # the L2 cache holds) run in one compiled call, replayed as one CUDA graph.
    chain = 16
    ws = [mx.quantize(both((4096, 4096), 0.05)[0], group_size=64, bits=4) for _ in range(chain)]
    mx.eval(ws)

    def products(x, *flat):
        for i in range(chain):
            x = mx.quantized_matmul(x, *flat[3 * i:3 * i + 3], transpose=True, group_size=64,
                                    bits=4)
        return x
    compiled = mx.compile(products)
    flat = [a for w3 in ws for a in w3]
    twc = [twq.clone() for _ in range(chain)]

    def torch_chain():
        y = txv
        for t in twc:
            y = y @ t.T
        return y
    many = cp.empty(chain * weight_bytes // 2, dtype=cp.uint16)
    row(f"quantized_matmul 4-bit, {chain} chained in a CUDA graph (GB/s of weights)",
        {"lazyx": lz(lambda: compiled(xv, *flat)),
         "torch bf16 matmuls (eager, queued)": tf(torch_chain),
         "memcpy (same bytes, r+w/2)": d2d(many)},
        work=chain * weight_bytes, unit="GB/s")

    # -- GPU time per call ---------------------------------------------------------------
    # CUDA events around calls queued behind a kernel that spins ~10 ms: the host enqueues
    # while the GPU is busy, so the events time the GPU's work alone (the kernels' pace,
    # without the host's launch and wait that the rows above hold). Decode products cycle
    # through 16 weights (more than the L2 cache holds), as the copies cycle through 16
    # buffers of the same bytes.
    spin = cp.RawKernel(r"""extern "C" __global__ void spin(long long cycles) {
      const long long t0 = clock64(); while (clock64() - t0 < cycles) {} }""", "spin")

    def gpu_time(calls):
        def timer(fns):
            got = {}
            for name, f in fns.items():
                f(), f()  # warm-ups (compilation, plans, graphs)
                per = []
                for _ in range(7):
                    start, end = cp.cuda.Event(), cp.cuda.Event()
                    spin((1,), (1,), (np.int64(20_000_000),))
                    start.record()
                    f()
                    end.record()
                    end.synchronize()
                    per.append(cp.cuda.get_elapsed_time(start, end) / 1e3 / calls)
                got[name] = float(np.median(per))
            return got
        return timer

    cycled = [cp.empty(weight_bytes // 2, dtype=cp.uint16) for _ in range(chain)]
    copies = [cp.empty_like(c) for c in cycled]

    def lazyx_products():
        for i in range(chain):
            mx.eval(mx.quantized_matmul(xv, *flat[3 * i:3 * i + 3], transpose=True,
                                        group_size=64, bits=4))

    def torch_products():
        for t in twc:
            txv @ t.T

    def memcpys():
        for src, dst in zip(cycled, copies):
            dst.data.copy_from_device_async(src.data, src.nbytes)
    row("qmm 4-bit 1x4096.4096^2, GPU time per product (GB/s)",
        {"lazyx": lazyx_products, "torch bf16 matmul": torch_products,
         "memcpy (same bytes, r+w/2)": memcpys},
        work=weight_bytes, unit="GB/s", timer=gpu_time(chain))
    row("attention b8 h16 T2048 d128 causal bf16, GPU time (TFLOP/s)",
        {"lazyx": lambda: mx.eval(mx.fast.scaled_dot_product_attention(q, k, v, scale=scale,
                                                                       mask="causal")),
         "torch": lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=True,
                                                         scale=scale)},
        work=att_flops / 1e3, unit="TFLOP/s", timer=gpu_time(1))
    row("conv2d 3x3 64->64 56^2 b32 bf16, GPU time (TFLOP/s)",
        {"lazyx": lambda: mx.eval(mx.conv2d(x, w, padding=1)),
         "torch": lambda: F.conv2d(tx_cl, tw_cl, padding=1)},
        work=flops / 1e3, unit="TFLOP/s", timer=gpu_time(1))

    table.print(52)

if __name__ == "__main__":
    main()
