"""metal: lazyx's Metal backend against MLX on the same Mac's GPU, in one run (issue 20).

    python benchmarks/metal.py [--quick] [--emulate]

Rows (:data:`CASES`), each built from the same code for both frameworks (``core`` is
``lazyx.core`` or ``mlx.core``), both on their GPU:

- **copy**: ``contiguous`` of a transposed 4096x4096 float32 array (GB/s read + written);
- **GELU (erf), compiled**: ``x * 0.5 * (1 + erf(x / sqrt 2))`` under ``compile`` on
  4096x4096 float32 (one fused kernel; GB/s read + written);
- **softmax** over the last axis of 4096x4096 float32 (GB/s read + written);
- **matmul** 2048x2048 @ 2048x2048 in float16 and float32 (TFLOP/s);
- **MLP training step** (784-512-512-10, batch 256, Adam, float32, compiled with the
  model's and optimizer's state as ``inputs``/``outputs``): the program of
  ``benchmarks/training.py`` (steps per second in the "work" column).

Every timing waits for the GPU (``synchronize``); medians of interleaved repeats after
warm-ups (:class:`benchmarks.timing.Table`). The last column is lazyx's time over MLX's.

Where lazyx's Metal backend or MLX's GPU is unavailable (any machine but an Apple-silicon
Mac with ``pyobjc-framework-Metal`` and ``mlx``), the script says why and exits 0
without timing. ``--emulate`` runs the lazyx column through lazyx's C++ MSL shim on the
CPU (and MLX on its CPU where its GPU is missing) at tiny sizes (the MLP step at its
own): a check that the script runs end to end, not a speed figure, and labelled so.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks.timing import Table, waiting  # noqa: E402

#: Problem sizes: the Mac's, and the tiny ones of ``--emulate`` (the shim runs one GPU
#: thread at a time on the CPU).
SIZES = {
    "gpu": {"n": 4096, "mm": 2048},
    "emulated": {"n": 64, "mm": 32},
}


def _normal(core, shape, dtype="float32", seed=0):
    host = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    x = core.array(host).astype(getattr(core, dtype))
    core.eval(x)
    return x


def copy(core, s):
    x = _normal(core, (s["n"], s["n"]))
    return (lambda: core.contiguous(core.transpose(x))), 2 * 4 * s["n"] ** 2


def gelu(core, s):
    x = _normal(core, (s["n"], s["n"]))
    fn = core.compile(lambda a: a * 0.5 * (1.0 + core.erf(a * 0.7071067811865476)))
    return (lambda: fn(x)), 2 * 4 * s["n"] ** 2


def softmax(core, s):
    x = _normal(core, (s["n"], s["n"]))
    return (lambda: core.softmax(x, axis=-1)), 2 * 4 * s["n"] ** 2


def matmul(dtype):
    def build(core, s):
        a, b = _normal(core, (s["mm"],) * 2, dtype, 1), _normal(core, (s["mm"],) * 2, dtype, 2)
        return (lambda: core.matmul(a, b)), 2 * s["mm"] ** 3
    return build


def mlp_step(core, s):
    """One compiled Adam step of training.py's MLP (784-512-512-10, batch 256, at every
    size: the shim runs it in well under a second); work 1e9 "steps", so the rate
    column reads steps per second."""
    from benchmarks import training as T  # the shared MLX-style MLP and trainer
    return T._mlx_like_mlp(core, *_nn_of(core), compiled=True), 1e9


def _nn_of(core):
    if core.__name__.startswith("mlx"):
        import mlx.nn
        import mlx.optimizers
        return mlx.nn, mlx.optimizers
    import lazyx.nn
    import lazyx.optimizers
    return lazyx.nn, lazyx.optimizers


#: (row label, formatted with the sizes; builder ``(core, sizes) -> (zero-argument call,
#: work)``; the unit of the rate column).
CASES = [
    ("copy, transposed {n}x{n} float32", copy, "GB/s"),
    ("GELU erf compiled, {n}x{n} float32", gelu, "GB/s"),
    ("softmax last axis, {n}x{n} float32", softmax, "GB/s"),
    ("matmul {mm}^3 float16", matmul("float16"), "TFLOP/s"),
    ("matmul {mm}^3 float32", matmul("float32"), "TFLOP/s"),
    ("MLP step 784-512-512-10 b256, Adam, compiled", mlp_step, "steps/s"),
]
_UNIT_SCALE = {"GB/s": 1.0, "TFLOP/s": 1e-3, "steps/s": 1.0}


def _mlx_gpu() -> tuple[object | None, str | None]:
    """(mlx.core, None) where MLX runs on a Metal GPU, else (mlx.core or None, why not)."""
    try:
        import mlx.core as mlx
    except ImportError:
        return None, "MLX is not installed (pip install mlx)."
    if not mlx.metal.is_available():
        return mlx, "MLX's Metal GPU is unavailable on this machine."
    return mlx, None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="lazyx's Metal backend against MLX on a Mac's GPU.")
    ap.add_argument("--quick", action="store_true", help="shorter measurements")
    ap.add_argument("--emulate", action="store_true",
                    help="lazyx's Metal kernels through the C++ shim on the CPU, tiny sizes: "
                         "checks the script end to end, not a speed figure")
    args = ap.parse_args(argv)

    import lazyx.core as lx
    from lazyx.backends.metal.selftest import enable

    reason = enable(args.emulate)
    mlx, mlx_reason = _mlx_gpu()
    if reason or (mlx_reason and not args.emulate) or mlx is None:
        why = " ".join(r for r in (reason and f"lazyx: {reason}", mlx_reason and f"MLX: {mlx_reason}")
                       if r)
        print(f"benchmarks/metal.py: nothing timed (it needs an Apple-silicon Mac with lazyx's "
              f"Metal backend and MLX's GPU). {why}")
        return 0
    sizes = SIZES["emulated" if args.emulate else "gpu"]
    mlx_device = mlx.cpu if mlx_reason else mlx.gpu
    peer = "MLX" if not mlx_reason else "MLX (cpu)"
    if args.emulate:
        print("EMULATED: lazyx's column runs its Metal kernels on the CPU through the C++ shim, "
              f"at tiny sizes (arrays {sizes['n']}x{sizes['n']}, matmuls {sizes['mm']}^3; the MLP "
              f"at its size); {peer} runs on its "
              f"{'CPU' if mlx_reason else 'GPU'}. NOT A SPEED FIGURE: a check that the script "
              f"runs end to end.")
    budget = 0.05 if args.emulate else (0.3 if args.quick else 1.0)
    table = Table(budget, rounds=1 if args.emulate else 4)
    with lx.use_backend("gpu", "metal"):
        lx.set_default_device(lx.gpu)
        mlx.set_default_device(mlx_device)
        for label, build, unit in CASES:
            label = label.format(**sizes)
            try:
                ours, work = build(lx, sizes)
                theirs, _ = build(mlx, sizes)
            except Exception as exc:  # noqa: BLE001 - report the row and go on
                table.rows.append((label, [f"failed to build: {type(exc).__name__}: {exc}"[:200]],
                                   float("nan"), ""))
                continue
            table.row(label, {"lazyx": waiting(lambda f=ours: lx.eval(f()), lx.synchronize),
                              peer: waiting(lambda f=theirs: mlx.eval(f()), mlx.synchronize)},
                      work=work * _UNIT_SCALE[unit], unit=unit)
    table.print(48)
    if args.emulate:
        print("\n(emulated: the figures above are not GPU speeds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
