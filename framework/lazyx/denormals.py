"""Subnormal numbers: flush them to zero in the kernels, or compute them (a lazyx addition).

A float32 result smaller in magnitude than ``finfo(float32).tiny`` (1.18e-38) is
*subnormal*. Many CPUs compute with subnormals through slow microcode: on Intel,
OpenBLAS's matmul ran 25x slower once its products underflowed (17 ms instead of
0.7 ms for 256x512 @ 512x512, issue 16), which happens to the gradients of a model
that fits its batch late in training (AMD Zen 3 shows no penalty). With flushing on, the
CPU treats subnormal inputs and results as zero at full speed (x86-64: MXCSR's
flush-to-zero and denormals-are-zero bits; aarch64: FPCR's FZ bit).

The switch is process-wide and read when an evaluation starts; the CPU backend sets
the bits on the evaluating thread for the length of the evaluation only (NumPy code
outside lazyx keeps IEEE subnormals), and every thread that works for it computes in
the same mode: the native thread pool, the generated kernels' threads and OpenBLAS's
workers. Flushing is **on by default**, as in JAX and TensorFlow on the CPU; PyTorch
leaves it off (``torch.set_flush_denormal``, whose name and return value this follows)
but its MKL and oneDNN kernels are not slowed the way OpenBLAS is. MLX has no switch.
"""

from __future__ import annotations

from .backend import backend_for
from .device import DeviceType

__all__ = ["set_flush_denormal", "get_flush_denormal"]


def set_flush_denormal(mode: bool) -> bool:
    """Flush subnormal numbers to zero in the CPU kernels, or compute them exactly.

    With ``mode=True`` (the default state), a kernel treats a subnormal input as zero
    and writes zero for a result that would be subnormal (float32: below 1.18e-38 in
    magnitude; float64: below 2.2e-308; bfloat16 alike, float16 results are computed in
    float32 and keep their own subnormals). With ``mode=False`` kernels follow IEEE 754,
    at the price of slow kernels on many CPUs when subnormals appear. Takes effect from
    the next evaluation.

    Args:
        mode (bool): whether to flush.

    Returns:
        bool: whether this CPU and backend support flushing (x86-64 or aarch64 with the
        ``cpu`` backend's native module). When not, nothing changes and kernels compute
        subnormals.

    Example:
        >>> mx.set_flush_denormal(False)     # IEEE subnormals
        True
        >>> (mx.array(1e-20) * mx.array(1e-20)).item()
        9.99994610111476e-41
        >>> mx.set_flush_denormal(True)
        True
        >>> (mx.array(1e-20) * mx.array(1e-20)).item()
        0.0
    """
    return backend_for(DeviceType.cpu).set_flush_denormal(bool(mode))


def get_flush_denormal() -> bool:
    """Whether the CPU kernels flush subnormal numbers to zero (see
    :func:`set_flush_denormal`)."""
    return backend_for(DeviceType.cpu).get_flush_denormal()
