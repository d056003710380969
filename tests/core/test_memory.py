"""Memory figures: active, peak and cache bytes of the cpu backend's buffers, the limits,
and the NumPy allocation handler behind them (calloc, realloc, threads)."""

import gc

import numpy as np
import pytest

import lazyx.core as mx
from helpers import run_in_threads
from lazyx.backends.cpu import native_kernels
from lazyx.errors import KernelNotFoundError
from lazyx.primitive import Primitive

native = native_kernels.load()
pytestmark = pytest.mark.skipif(native is None, reason="the native module was not built")

N = 1 << 20  # float32 elements of the large arrays: 4 MiB
NBYTES = 4 * N
PAGE = 4096


try:
    from numpy._core.multiarray import get_handler_name
except ImportError:  # NumPy 1.x
    from numpy.core.multiarray import get_handler_name


def handler_name(a):
    return get_handler_name(a)


@pytest.fixture(autouse=True)
def cpu_backend():
    """Each test runs on the ``cpu`` backend with a full cache and restores the limits."""
    with mx.use_backend("cpu", "cpu"):
        memory = native.get_memory_limit()
        cache = native.get_cache_limit()
        gc.collect()
        yield
        native.set_memory_limit(memory)
        native.set_cache_limit(cache)
    mx.clear_cache()


def big():
    return mx.array(np.ones(N, np.float32))


def test_active_memory_follows_an_evaluated_array():
    x = big()
    mx.eval(x)
    before = mx.get_active_memory()
    y = mx.exp(x)
    mx.eval(y)
    grown = mx.get_active_memory() - before
    assert NBYTES <= grown <= NBYTES + PAGE
    del y
    gc.collect()
    assert mx.get_active_memory() == before


def test_peak_memory_and_reset():
    x = big()
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    assert mx.get_peak_memory() == 0  # MLX's reset: 0, not the active bytes
    z = mx.exp(mx.exp(x) + 1)  # the intermediate exp(x) is freed when `+` has run
    mx.eval(z)
    assert mx.get_peak_memory() >= base + 2 * NBYTES
    del z
    gc.collect()
    assert mx.get_active_memory() == base
    assert mx.get_peak_memory() >= base + 2 * NBYTES  # the peak stays until reset
    mx.reset_peak_memory()
    assert mx.get_peak_memory() == 0 and mx.get_active_memory() == base


def test_freed_blocks_are_cached_reused_and_cleared():
    mx.clear_cache()
    assert mx.get_cache_memory() == 0
    x = big()
    y = mx.exp(x)
    mx.eval(y)
    del y
    gc.collect()
    assert NBYTES <= mx.get_cache_memory() <= NBYTES + PAGE
    y = mx.exp(x) * 2  # the same size again: taken from the cache
    mx.eval(y)
    np.testing.assert_allclose(np.array(y), 2 * np.e, rtol=1e-6)
    assert mx.get_cache_memory() <= NBYTES + PAGE
    del y
    gc.collect()
    mx.clear_cache()
    assert mx.get_cache_memory() == 0


def test_cache_limit_bounds_the_cache():
    default = native.get_cache_limit()
    assert default == native.get_memory_limit()  # as in MLX: the memory limit by default
    assert mx.set_cache_limit(NBYTES // 2) == default  # each call returns the previous limit
    assert mx.set_cache_limit(NBYTES // 2) == NBYTES // 2
    mx.clear_cache()
    y = mx.exp(big())
    mx.eval(y)
    del y
    gc.collect()
    assert mx.get_cache_memory() == 0  # too large to keep
    mx.set_cache_limit(10 * NBYTES)
    y = mx.exp(big())
    mx.eval(y)
    del y
    gc.collect()
    assert mx.get_cache_memory() >= NBYTES
    mx.set_cache_limit(NBYTES // 2)  # lowering the limit trims the cache
    assert mx.get_cache_memory() <= NBYTES // 2


def test_array_construction_is_counted():
    before = mx.get_active_memory()
    x = mx.array(np.ones(N, np.float32))
    assert mx.get_active_memory() - before >= NBYTES
    del x
    gc.collect()
    assert mx.get_active_memory() - before < NBYTES


def test_memory_limit_releases_the_cache():
    previous = mx.set_memory_limit(1 << 40)
    assert mx.set_memory_limit(previous) == 1 << 40
    x = big()
    y = mx.exp(x)
    mx.eval(y)
    del y
    gc.collect()
    assert mx.get_cache_memory() >= NBYTES
    # Room for the cache, not for the cache and a new buffer of another size:
    # the allocation releases the cache instead of growing past the limit.
    z = mx.array(np.ones(2 * N, np.float32))  # counted too, as in MLX
    mx.set_memory_limit(mx.get_active_memory() + NBYTES + NBYTES // 2)
    assert mx.get_cache_memory() >= NBYTES
    y = mx.exp(z)
    mx.eval(y)
    assert mx.get_cache_memory() == 0
    np.testing.assert_allclose(np.array(y)[-3:], np.e, rtol=1e-6)
    # The limit is a guideline: past it evaluation still succeeds.
    mx.set_memory_limit(0)
    np.testing.assert_allclose(np.array(mx.exp(x))[:2], np.e, rtol=1e-6)


@pytest.mark.parametrize("setter", ["set_memory_limit", "set_cache_limit"])
def test_bad_limits_raise(setter):
    with pytest.raises(ValueError, match="must be >= 0"):
        getattr(mx, setter)(-1)
    with pytest.raises(ValueError, match="must be >= 0"):
        getattr(native, setter)(-5)
    with pytest.raises(TypeError):
        getattr(native, setter)("a lot")


def test_eval_installs_and_restores_the_handler():
    outside = handler_name(np.empty(3))
    y = mx.exp(big())
    mx.eval(y)
    assert handler_name(y._data) == "lazyx_allocator"  # (np.asarray(y).base is a memoryview, as MLX)
    assert handler_name(np.empty(3)) == outside

    class NoKernel(Primitive):
        def output_shapes(self, inputs):
            return [inputs[0].shape]

    from lazyx.array import lazy
    bad = lazy((2,), mx.float32, NoKernel(mx.default_stream(mx.cpu)), (mx.array([1.0, 2.0]),))
    with pytest.raises(KernelNotFoundError):
        mx.eval(bad)
    assert handler_name(np.empty(3)) == outside


def test_exit_eval_rejects_a_bad_token():
    with pytest.raises(TypeError, match="what enter_eval returned"):
        native.exit_eval(object())


# -- the handler itself, installed by hand ---------------------------------------
@pytest.fixture
def handler():
    token = native.enter_eval()
    try:
        yield
    finally:
        native.exit_eval(token)


def test_calloc_gives_zeros_even_from_the_cache(handler):
    mx.clear_cache()
    a = np.full(N, 7.0, np.float32)
    del a
    assert native.memory_stats()["cache"] >= NBYTES
    z = np.zeros(N, np.float32)  # the cached block, zeroed
    assert native.memory_stats()["cache"] < NBYTES
    assert not z.any()
    small = np.zeros(5, np.int64)
    assert not small.any() and handler_name(small) == "lazyx_allocator"


def test_a_request_takes_the_block_of_its_size_freed_last(handler):
    """Among cached blocks of one size, the one freed last (likely still in cache): a
    compiled plan frees an intermediate just before it allocates the next of that size."""
    mx.clear_cache()
    blocks = [np.empty(N, np.float32) for _ in range(3)]
    addresses = [b.ctypes.data for b in blocks]
    del blocks[1]   # freed first
    del blocks[-1]  # freed last (the third)
    del blocks[0]   # freed last of all
    for want in (addresses[0], addresses[2], addresses[1]):
        got = np.empty(N, np.float32)
        assert got.ctypes.data == want
        blocks.append(got)  # held, so the next request takes the next newest


@pytest.mark.parametrize("sizes", [(10, 1000), (1000, 10), (N, 2 * N), (2 * N, 100), (100, N)])
def test_realloc_keeps_data_and_accounting(handler, sizes):
    old, new = sizes
    base = native.memory_stats()["active"]
    a = np.arange(old, dtype=np.float32)
    a.resize(new, refcheck=False)  # NumPy reallocates through the handler
    k = min(old, new)
    np.testing.assert_array_equal(a[:k], np.arange(k, dtype=np.float32))
    assert native.memory_stats()["active"] - base >= 4 * new
    del a
    assert native.memory_stats()["active"] == base
    grown = np.fromiter((float(i) for i in range(5000)), np.float64)  # grows by realloc
    np.testing.assert_array_equal(grown, np.arange(5000.0))
    del grown
    assert native.memory_stats()["active"] == base


def test_frees_after_exit_come_back_to_the_handler():
    token = native.enter_eval()
    a = np.ones(N, np.float32)
    native.exit_eval(token)
    active = native.memory_stats()["active"]
    del a
    assert native.memory_stats()["active"] <= active - NBYTES


def test_threads_allocating_at_once(handler):
    base = native.memory_stats()["active"]

    def work(seed):
        rng = np.random.default_rng(seed)
        token = native.enter_eval()  # each thread has its own context
        try:
            for _ in range(40):
                n = int(rng.integers(1, 300_000))
                a = np.ones(n, np.float32) + 1  # NumPy drops the GIL in the add
                assert a[-1] == 2.0 and handler_name(a) == "lazyx_allocator"
                b = np.zeros(n // 2 + 1)
                b.resize(n + 7, refcheck=False)
                del a, b
        finally:
            native.exit_eval(token)

    run_in_threads(work, 4)
    gc.collect()
    assert native.memory_stats()["active"] == base
