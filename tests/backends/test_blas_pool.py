"""OpenBLAS's threaded products run on lazyx's native thread pool
(``backends/cpu/blas_threads.py``, ``lazyx_blas_threads`` in ``parallel.cpp``): the
jobs of one product run at the same time on the evaluating thread and the pool's
helpers, on threads of their own when the pool is busy, and the values are those of
a float64 reference whoever runs them."""

import json
import subprocess
import sys
import threading

import numpy as np
import pytest

import lazyx.core as mx
from lazyx.backends.cpu import blas_threads, native_kernels

native = native_kernels.load()
threadpoolctl = pytest.importorskip("threadpoolctl")

pytestmark = pytest.mark.skipif(native is None, reason="the native module was not built")


@pytest.fixture(autouse=True)
def kernels_loaded(cpu_backend):
    mx.eval(mx.ones((2, 2)) @ mx.ones((2, 2)))  # the backend's kernels load: use_pool runs


def _pooled() -> bool:
    if not blas_threads.on_pool:
        pytest.skip("no loaded OpenBLAS takes a threads callback (OpenBLAS < 0.3.27, "
                    "another BLAS, or LAZYX_BLAS_THREADS=openblas)")
    return True


def _reference(a, b):
    return a.astype(np.complex128 if a.dtype.kind == "c" else np.float64) @ b


def _lx(x):
    return mx.array(x, dtype=mx.float64) if x.dtype == np.float64 else mx.array(x)


def _close(got, a, b):
    want = _reference(a, b)
    scale = np.abs(a).max() * np.abs(b).max() * a.shape[-1]
    tol = {np.float32: 1e-6, np.complex64: 1e-6, np.float64: 1e-14}[a.dtype.type]
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=tol * scale)


def test_numpys_openblas_is_on_the_pool():
    _pooled()
    numpy_blas = [i["filepath"] for i in threadpoolctl.threadpool_info()
                  if i.get("internal_api") == "openblas" and "numpy" in i["filepath"]]
    assert numpy_blas and all(p in blas_threads._pooled for p in numpy_blas)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64])
@pytest.mark.parametrize("shapes", [((256, 784), (784, 512)), ((512, 256), (256, 784)),
                                    ((256, 10), (10, 512)), ((3, 200, 300), (300, 100))])
def test_threaded_products_match_float64(dtype, shapes):
    _pooled()
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s).astype(dtype) for s in shapes)
    if a.dtype.kind == "c":
        a = a + 1j * rng.standard_normal(a.shape).astype(np.float32)
    _close(_lx(a) @ _lx(b), a, b)
    # Transposed operands (BLAS reads them in place): x @ W.T as a Linear layer does.
    _close(_lx(a) @ _lx(np.ascontiguousarray(b.T)).T, a, b)


@pytest.mark.parametrize("threads", [1, 2, 4, 7])
def test_any_number_of_openblas_threads(threads):
    """OpenBLAS splits a product into as many jobs as it has threads; the pool starts
    helpers for all of them (the jobs wait for one another: each needs a thread)."""
    _pooled()
    rng = np.random.default_rng(threads)
    a = rng.standard_normal((384, 640)).astype(np.float32)
    b = rng.standard_normal((640, 320)).astype(np.float32)
    with threadpoolctl.threadpool_limits(threads, user_api="blas"):
        _close(mx.array(a) @ mx.array(b), a, b)
        _close(a @ b, a, b)  # NumPy's own products run on the pool too


def test_products_from_many_threads_at_once():
    """Python threads multiply at the same time: one holds the pool, the others run
    their jobs on threads of their own; every result is right."""
    _pooled()
    rng = np.random.default_rng(5)
    pairs = [(rng.standard_normal((256, 384)).astype(np.float32),
              rng.standard_normal((384, 256)).astype(np.float32)) for _ in range(4)]
    errors = []

    def work(k):
        a, b = pairs[k]
        try:
            for i in range(6):
                got = mx.array(a) @ mx.array(b) if i % 2 else a @ b
                _close(got, a, b)
                # a parallel lazyx kernel between products: the pool is busy in turns
                np.testing.assert_allclose(np.asarray(mx.exp(mx.array(a) * 0)), 1.0)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a product hung"
    assert not errors, errors


_OWN_THREADS = """
import json, numpy as np, threadpoolctl
import lazyx.core as mx
from lazyx.backends.cpu import blas_threads
mx.set_default_device(mx.cpu)
rng = np.random.default_rng(2)
a = (rng.standard_normal((256, 512)) * 1e-40).astype(np.float32)
b = rng.standard_normal((512, 512)).astype(np.float32)
mx.set_flush_denormal(True)
flushed = np.asarray(mx.array(a) @ mx.array(b))
mx.set_flush_denormal(False)
c = rng.standard_normal((300, 400)).astype(np.float32)
err = float(np.abs(np.asarray(mx.array(c) @ mx.array(c.T)) - c.astype(np.float64) @ c.T).max())
print(json.dumps([blas_threads.on_pool, int(np.count_nonzero(flushed)), err]))
"""


@pytest.mark.parametrize("setting", ["openblas", "pool"])
def test_the_switch(setting):
    """``LAZYX_BLAS_THREADS=openblas`` leaves OpenBLAS its own workers; either way a
    product is right and flushes subnormals in every part when flushing is on."""
    import os
    env = dict(os.environ, LAZYX_BLAS_THREADS=setting)
    out = subprocess.run([sys.executable, "-c", _OWN_THREADS], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    on_pool, nonzero, err = json.loads(out.stdout.strip().splitlines()[-1])
    if setting == "openblas":
        assert on_pool is False
    elif not on_pool:
        pytest.skip("no loaded OpenBLAS takes a threads callback")
    assert nonzero == 0  # every input counted as zero, on every thread
    assert err < 1e-3
