"""Subnormal numbers: ``mx.set_flush_denormal`` (lazyx/denormals.py, native/fpmode.h).

With flushing on (the default), every thread that computes for an evaluation treats
subnormal inputs and results as zero: the evaluating thread, the native thread pool,
the generated kernels' threads and OpenBLAS's workers. With it off, kernels follow IEEE
754. References are NumPy float64 computations with the same semantics: ``flush``
zeroes what float32 would hold as a subnormal.
"""

import subprocess
import sys

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.backends.cpu import native_kernels

native = native_kernels.load()
pytestmark = pytest.mark.skipif(native is None or not mx.set_flush_denormal(mx.get_flush_denormal()),
                                reason="flushing subnormals needs the native module on x86-64/aarch64")

TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32
FLUSH_BITS = {"x86_64": (1 << 15) | (1 << 6), "AMD64": (1 << 15) | (1 << 6), "aarch64": 1 << 24}


def _flush_bits() -> int:
    import platform
    return FLUSH_BITS[platform.machine()]


def flush(x):
    """``x`` (float64) with what float32 would hold as a subnormal set to zero."""
    x = np.asarray(x, np.float64)
    return np.where(np.abs(x) < TINY, 0.0, x)


def flushed_matmul(a, b):
    """a @ b as a flushing float32 FMA loop computes it: each product and each partial
    sum below TINY is zero. Exact when no partial sum crosses TINY (the data below keep
    the subnormal sums well under it)."""
    a, b = flush(a), flush(b)
    return flush(flush(a[:, :, None] * b[None, :, :]).sum(axis=1))


@pytest.fixture(autouse=True)
def on_the_cpu():
    # The switch is the CPU backend's: the tests run there whatever the default device.
    with mx.stream(mx.cpu):
        yield


@pytest.fixture
def mode():
    """Set the switch for one test; put back what was there."""
    before = mx.get_flush_denormal()
    yield mx.set_flush_denormal
    mx.set_flush_denormal(before)


def test_default_is_on_and_switch_round_trips(mode):
    code = "import lazyx.core as mx; print(mx.get_flush_denormal())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
    assert mode(False) is True
    assert mx.get_flush_denormal() is False
    assert mode(True) is True
    assert mx.get_flush_denormal() is True


def test_scoped_to_evaluations(mode):
    """The bits are set on the evaluating thread while lazyx runs kernels only: NumPy
    code outside an evaluation keeps IEEE subnormals."""
    mode(True)
    before = native.fp_control()
    a = mx.array(np.float32(1e-20))
    assert (a * a).item() == 0.0
    assert native.fp_control() & _flush_bits() == before & _flush_bits()
    assert np.float32(1e-20) * np.float32(1e-20) != 0  # NumPy outside lazyx: IEEE
    mode(False)
    assert (a * a).item() == pytest.approx(1e-40, rel=1e-4)


def _mlp_grads():
    """Gradients of an MLP whose backward pass underflows: the output cotangent is
    normal (1e-30), the second layer's weights are 1e-10, so the hidden-layer gradient
    (cotangent @ w2.T) and everything below it is subnormal; dw2 stays normal."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 32)).astype(np.float32)
    w1 = rng.standard_normal((32, 48)).astype(np.float32)
    w2 = (rng.standard_normal((48, 8)) * 1e-10).astype(np.float32)
    scale = np.float32(1e-30)

    def loss(w1, w2):
        h = mx.maximum(mx.array(x) @ w1, 0.0)
        return mx.sum((h @ w2) * scale)

    gw1, gw2 = mx.grad(loss, argnums=(0, 1))(mx.array(w1), mx.array(w2))
    # The float64 reference: the same chain of matmuls.
    h = np.maximum(x.astype(np.float64) @ w1, 0.0)
    g_out = np.full((64, 8), float(scale))
    return (np.asarray(gw1), np.asarray(gw2)), (x, w1, w2, h, g_out)


def test_mlp_gradient_flushed_when_on(mode):
    mode(True)
    (gw1, gw2), (x, w1, w2, h, g_out) = _mlp_grads()
    dh = flushed_matmul(g_out, w2.T.astype(np.float64)) * (h > 0)
    np.testing.assert_array_equal(dh, 0.0)  # every product underflows
    np.testing.assert_allclose(gw2, flushed_matmul(h.T, g_out), rtol=2e-5)
    np.testing.assert_array_equal(gw1, flushed_matmul(x.T.astype(np.float64), dh))


def test_mlp_gradient_ieee_when_off(mode):
    mode(False)
    (gw1, gw2), (x, w1, w2, h, g_out) = _mlp_grads()
    dh = (g_out @ w2.T.astype(np.float64)) * (h > 0)
    ref = x.T.astype(np.float64) @ dh
    assert np.all(np.abs(ref[ref != 0]) < TINY)  # the reference is subnormal...
    assert np.count_nonzero(gw1) > 0.9 * gw1.size  # ... and so is lazyx's, not zero
    # Subnormals carry absolute, not relative, precision: 2**-149 per rounding, and
    # each of the 64-term sums rounds up to 64 times (a few thousand ulps of 1e-39).
    np.testing.assert_allclose(gw1, ref, rtol=1e-3, atol=64 * 64 * 2.0 ** -149)
    np.testing.assert_allclose(gw2, h.T @ g_out, rtol=2e-5)


@pytest.mark.parametrize("on", [True, False])
def test_matmul_threads_follow(mode, on):
    """OpenBLAS's workers compute part of a 256x512 @ 512x512 product: all of it
    flushes (subnormal inputs count as zero) or none of it does."""
    mode(on)
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((256, 512)) * 1e-40).astype(np.float32)
    b = rng.standard_normal((512, 512)).astype(np.float32)
    out = np.asarray(mx.array(a) @ mx.array(b))
    if on:  # every input of `a` counts as zero
        np.testing.assert_array_equal(out, flush(a) @ b)
    else:
        ref = a.astype(np.float64) @ b
        np.testing.assert_allclose(out, ref, rtol=1e-2, atol=512 * 2.0 ** -149)
        assert np.count_nonzero(out) > 0.99 * out.size


@pytest.mark.parametrize("on", [True, False])
def test_parallel_native_and_generated_kernels_follow(mode, on):
    """A reduction split over the native pool and a generated element-wise kernel on
    two threads (1M elements) flush in every part, or in none."""
    mode(on)
    n = 1 << 20
    x = np.full(n, 1e-20, np.float32)
    sub = (np.arange(n, dtype=np.float32) % 7 + 1) * np.float32(1e-40)
    prod = np.asarray(mx.array(x) * mx.array(x))  # normal inputs, subnormal results
    total = mx.sum(mx.array(sub)).item()  # subnormal inputs
    if on:
        np.testing.assert_array_equal(prod, 0.0)
        assert total == 0.0
    else:
        np.testing.assert_allclose(prod, 1e-40, rtol=1e-4)
        assert total == pytest.approx(sub.astype(np.float64).sum(), rel=1e-3)


@pytest.mark.parametrize("on", [True, False])
def test_pool_helpers_load_the_callers_mode(mode, on):
    """The pool's helpers last ran a job in the other mode; each job hands them the
    caller's control register."""
    bits = _flush_bits()
    mode(not on)
    token = native.enter_eval()
    try:
        native.parallel_fp_controls(64)
    finally:
        native.exit_eval(token)
    mode(on)
    seen = []
    token = native.enter_eval()
    try:
        for _ in range(20):  # until a helper has run a chunk (they may wake late)
            seen += native.parallel_fp_controls(64)
            if any(not by_caller for _, by_caller in seen):
                break
        else:
            pytest.skip("no helper thread ran a chunk (machine busy)")
    finally:
        native.exit_eval(token)
    for control, _ in seen:
        assert (control & bits == bits) is on


_SPIN = """
import ctypes, json, os, threadpoolctl
import lazyx.core as mx
mx.set_default_device(mx.cpu)
mx.eval(mx.ones((64, 64)) @ mx.ones((64, 64)))   # the backend's kernels load: follow() runs
out = {}
for info in threadpoolctl.threadpool_info():
    if info.get("internal_api") == "openblas" and info.get("threading_layer") == "pthreads":
        lib = ctypes.CDLL(info["filepath"])
        out[info["filepath"]] = lib.openblas_thread_timeout()
print(json.dumps([out, os.environ.get("OPENBLAS_THREAD_TIMEOUT")]))
"""


@pytest.mark.parametrize("given", [None, "7"])
def test_openblas_workers_spin_shorter_unless_the_user_says(given):
    import json
    import os
    from lazyx.backends.cpu import blas_threads
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    env["LAZYX_BLAS_THREADS"] = "openblas"  # OpenBLAS's own workers run its products
    if given is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = given
    got = subprocess.run([sys.executable, "-c", _SPIN], capture_output=True, text=True,
                         check=True, env=env)
    timeouts, left = json.loads(got.stdout.strip().splitlines()[-1])
    if not timeouts:
        pytest.skip("no pthreads OpenBLAS loaded (an OpenMP build or another BLAS)")
    want = int(given if given is not None else blas_threads.SPIN)
    assert set(timeouts.values()) == {want}, timeouts
    assert left == given   # the process's environment is as it was
