"""The Metal runtime's shared buffers on the fake Metal API: arrays in ``MTLBuffer``
memory that NumPy views without a copy, bound in place by the next kernel, pooled, and
counted by the memory figures.

The fake (``on_fake_gpu`` of test_metal_backend.py) stands for PyObjC's objects: its
``MTLBuffer`` is a ``bytearray`` whose ``contents().as_buffer(n)`` is a writable view,
and its command buffer runs the bound bytes through the C++ shim, so a binding mistake
shows as a wrong number. Here it also records which buffer object each argument binds
and each buffer the device creates.
"""

import gc

import numpy as np
import pytest

import lazyx.core as mx
from helpers import random_array, rng, run_in_threads
from lazyx.backends import metal
from lazyx.backends.metal import runtime
from lazyx.errors import BackendError
from test_metal_backend import (_Device, _Encoder, _Metal, _Queue, _check_mlp, _mlp,
                                _mlp_inputs, _mlp_ref, _run, on_fake_gpu, on_metal,
                                pytestmark)  # noqa: F401

F64 = np.float64


@pytest.fixture
def fake(on_fake_gpu, monkeypatch):
    """``on_fake_gpu`` whose log also names the buffer bound at each index
    (``("bind", index, buffer, offset)``) and each buffer the device creates
    (``("new", "length" | "bytes", length)``, the buffers themselves in ``log.made``); the
    pool starts and ends empty."""
    log, _ = on_fake_gpu
    set_buffer = _Encoder.setBuffer_offset_atIndex_
    new_length = _Device.newBufferWithLength_options_
    new_bytes = _Device.newBufferWithBytes_length_options_

    def bind(self, buffer, offset, index):
        log.append(("bind", index, buffer, offset))
        return set_buffer(self, buffer, offset, index)

    class Log(list):
        made = {}                               # id(buffer) -> "length" | "bytes"
    log = Log(log)

    def made(kind, buffer):
        log.made[id(buffer)] = kind
        return buffer

    def with_length(self, length, mode):
        log.append(("new", "length", length))
        return made("length", new_length(self, length, mode))

    def with_bytes(self, data, length, mode):
        log.append(("new", "bytes", length))
        return made("bytes", new_bytes(self, data, length, mode))

    monkeypatch.setattr(runtime, "_get_context", lambda: (_Metal, _Device(), _Queue(log)))
    monkeypatch.setattr(_Encoder, "setBuffer_offset_atIndex_", bind)
    monkeypatch.setattr(_Device, "newBufferWithLength_options_", with_length)
    monkeypatch.setattr(_Device, "newBufferWithBytes_length_options_", with_bytes)
    runtime.clear_cache()
    try:
        yield log
    finally:
        gc.collect()
        runtime.clear_cache()


def _new(log, kind=None):
    return [c for c in log if c[0] == "new" and (kind is None or c[1] == kind)]


def _binds(log):
    return [c for c in log if c[0] == "bind"]


def _gpu(fn, *arrays):
    with mx.stream(mx.gpu):
        out = fn(*arrays)
        mx.eval(out)
    return out


def test_an_output_is_a_view_of_its_shared_buffer(fake):
    x = random_array((16, 40), mx.float32, rng(30), -2, 2)
    y = _gpu(mx.exp, mx.array(x))
    got = np.asarray(y)
    np.testing.assert_allclose(got, np.exp(x.astype(F64)), rtol=2e-6)
    owner = runtime.shared_buffer_of(got)
    assert owner is not None and owner.length >= got.nbytes
    assert ("new", "length", owner.length) in fake      # newBufferWithLength, no upload
    assert got.ctypes.data == owner.address and got.flags.c_contiguous
    # No copy: bytes written into the MTLBuffer (as the GPU writes them) are the array's,
    # and a second export is the same memory.
    raw = np.frombuffer(owner.mtl.data, np.float32, count=got.size)
    assert not np.shares_memory(raw, x)
    raw[3] = 123.5
    assert np.asarray(y).reshape(-1)[3] == 123.5 and np.shares_memory(np.asarray(y), raw)


def test_an_output_fed_to_the_next_kernel_binds_the_same_buffer(fake):
    x = random_array((32, 64), mx.float32, rng(31), -2, 2)
    y = _gpu(mx.exp, mx.array(x))
    owner = runtime.shared_buffer_of(np.asarray(y))
    del fake[:]
    z = _gpu(mx.sin, y)
    np.testing.assert_allclose(np.asarray(z), np.sin(np.exp(x.astype(F64))), rtol=2e-6,
                               atol=1e-6)
    # One buffer made: z's; y is bound as its own MTLBuffer at offset 0, not uploaded.
    assert _new(fake) == [("new", "length", runtime.shared_buffer_of(np.asarray(z)).length)]
    assert ("bind", 0, owner.mtl, 0) in _binds(fake)
    # A built-in kernel (softmax) reads it in place too.
    del fake[:]
    s = _gpu(lambda a: mx.softmax(a, axis=-1), y)
    e = np.exp(np.exp(x.astype(F64)) - np.exp(x.astype(F64)).max(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(s), e / e.sum(-1, keepdims=True), rtol=1e-5,
                               atol=1e-8)
    assert ("bind", 0, owner.mtl, 0) in _binds(fake)
    # The one new buffer is softmax's own output, allocated shared (kernels.common.empty)
    # and written in place: nothing uploaded, nothing copied back.
    assert _new(fake) == [("new", "length", runtime.shared_buffer_of(np.asarray(s)).length)]
    assert metal.stats["builtin"] == 1


def test_views_of_a_shared_output_bind_at_their_offset(fake):
    x = random_array((8, 64), mx.float32, rng(32), -2, 2)
    y = _gpu(mx.exp, mx.array(x))
    owner = runtime.shared_buffer_of(np.asarray(y))
    want = np.exp(x.astype(F64))
    # A slice (a view on the fallback's NumPy) starts 2 rows in; a reversed one at its
    # last row, the kernel's negative strides reaching back from there.
    for view, ref, offset in ((lambda a: a[2:], want[2:], 2 * 64 * 4),
                              (lambda a: a[::-1], want[::-1], 7 * 64 * 4)):
        del fake[:]
        got = np.asarray(_gpu(lambda a: mx.sin(view(a)), y))
        np.testing.assert_allclose(got, np.sin(ref), rtol=2e-6, atol=1e-6)
        assert ("bind", 0, owner.mtl, offset) in _binds(fake)
        assert _new(fake, "bytes") == []


def test_a_view_at_an_unaligned_offset_is_copied(fake):
    # Metal binds buffers at offsets of 4 bytes: a float16 view one element in is copied.
    x = random_array((60, 50), mx.float16, rng(33), -2, 2)
    y = _gpu(mx.exp, mx.array(x))
    owner = runtime.shared_buffer_of(np.asarray(y))
    del fake[:]
    got = np.asarray(_gpu(lambda a: mx.negative(mx.reshape(a, (-1,))[1:]), y))
    np.testing.assert_array_equal(got, -np.asarray(y).reshape(-1)[1:])
    assert all(c[2] is not owner.mtl for c in _binds(fake))
    assert _new(fake, "bytes") == [("new", "bytes", (60 * 50 - 1) * 2)]


def test_the_pool_and_the_memory_figures(fake):
    gc.collect()
    before = runtime.memory_stats()
    a = runtime.empty((100, 3), np.float32)
    assert a.shape == (100, 3) and a.dtype == np.float32 and a.flags.writeable
    length = runtime.shared_buffer_of(a).length
    assert length >= 1200 and length % 256 == 0
    after = runtime.memory_stats()
    assert after["active"] == before["active"] + length
    assert after["peak"] >= after["active"] and after["cache"] == 0
    assert mx.get_active_memory() >= after["active"]
    assert metal._BACKEND.memory_stats() == after
    # A view keeps the buffer alive; when the last one goes the buffer is pooled, and the
    # next allocation of that length takes it instead of asking Metal.
    view = a[10:].T
    del a
    assert runtime.memory_stats()["active"] == after["active"]
    del view
    gc.collect()
    freed = runtime.memory_stats()
    assert freed["active"] == before["active"] and freed["cache"] == length
    made = len(_new(fake))
    b = runtime.empty(1100, np.uint8)           # rounds to the same length
    assert len(_new(fake)) == made and runtime.memory_stats()["cache"] == 0
    c = runtime.empty(1100, np.uint8)           # the pool is empty: a new buffer
    assert len(_new(fake)) == made + 1
    assert runtime.memory_stats()["active"] == before["active"] + 2 * length
    # reset_peak_memory and clear_cache through lazyx.core.
    mx.reset_peak_memory()
    assert runtime.memory_stats()["peak"] == 0
    del b, c
    gc.collect()
    assert runtime.memory_stats()["cache"] == 2 * length
    mx.clear_cache()
    assert runtime.memory_stats()["cache"] == 0
    # Zero-size arrays have a buffer too (Metal has no empty one) and views of it.
    assert runtime.empty((0, 4), np.int32).shape == (0, 4)


def test_evaluations_move_the_memory_figures(fake):
    x = mx.array(random_array((64, 64), mx.float32, rng(34)))
    mx.eval(x)
    start = mx.get_active_memory()
    y = _gpu(mx.exp, x)
    grown = mx.get_active_memory() - start
    assert grown >= 64 * 64 * 4
    assert runtime.memory_stats()["peak"] >= runtime.memory_stats()["active"]
    del y
    gc.collect()
    assert mx.get_active_memory() - start <= grown - 64 * 64 * 4


def test_the_mlp_on_the_fake_gpu_with_shared_buffers(fake):
    arrays = _mlp_inputs()
    got = _run(_mlp, arrays, mx.gpu)
    _check_mlp(got, _run(_mlp, arrays, mx.cpu), _mlp_ref(*arrays))
    # The generated kernels' outputs live in shared buffers, each bound once by the kernel
    # that writes it; the kernels reading them (the hidden layer, 12 x 48, by the second
    # matmul; the logits by softmax, logsumexp, argmax ...) bind them again, in place.
    shared = [c[2] for c in _binds(fake) if fake.made.get(id(c[2])) == "length"]
    created = len(_new(fake, "length"))
    assert created >= 4 and len(shared) >= created + 4


def test_emulation_keeps_plain_numpy_arrays(on_metal):
    before = runtime.memory_stats()
    y = mx.exp(mx.array(np.ones((4, 5), np.float32)), stream=mx.gpu)
    got = np.asarray(y)
    np.testing.assert_allclose(got, np.e, rtol=1e-6)
    assert runtime.shared_buffer_of(got) is None and runtime.memory_stats() == before


# -- command batching: one command buffer per evaluation, waited for at a read -------------
def _commits(log):
    return [c for c in log if c[0] in ("commit", "wait")]


def test_an_evaluation_is_one_command_buffer_waited_for_at_the_read(fake):
    x = random_array((16, 40), mx.float32, rng(40), -2, 2)
    a = mx.array(x)
    mx.eval(a)
    del fake[:]
    with mx.stream(mx.gpu):
        y = mx.softmax(mx.exp(a) * 0.5, axis=-1)    # generated kernels and a built-in one
        s = mx.sum(y, axis=0)
    mx.eval(s, y)
    # Committed once, with an encoder per launch, and not waited for: the host goes on.
    commits = _commits(fake)
    assert len(commits) == 1 and commits[0][0] == "commit" and commits[0][1] >= 3
    owner = runtime.shared_buffer_of(y._data)
    assert runtime.pending()
    # The fake GPU runs at the wait: the output's memory is still unwritten here.
    assert not np.any(np.frombuffer(owner.mtl.data, np.float32, count=y.size))
    got = np.asarray(y)                              # the read waits
    assert _commits(fake)[1:] == [("wait", commits[0][1])] and not runtime.pending()
    e = np.exp(np.exp(x.astype(F64)) * 0.5)
    want = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(np.asarray(s), want.sum(0), rtol=1e-5)
    assert len(_commits(fake)) == 2                  # nothing more to wait for


@pytest.mark.parametrize("read", ["item", "tolist", "synchronize", "memory", "cpu op"])
def test_every_host_read_waits(fake, read):
    a = mx.array(random_array((8, 8), mx.float32, rng(41), -1, 1))
    mx.eval(a)
    with mx.stream(mx.gpu):
        y = mx.exp(a) + 1.0
        total = mx.sum(y)
    mx.eval(total, y)
    assert runtime.pending()
    want = np.exp(np.asarray(a).astype(F64)) + 1.0
    if read == "item":
        np.testing.assert_allclose(total.item(), want.sum(), rtol=1e-5)
    elif read == "tolist":
        np.testing.assert_allclose(np.array(y.tolist()), want, rtol=1e-6)
    elif read == "synchronize":
        mx.synchronize()
    elif read == "memory":
        mx.get_active_memory()
    else:  # a node on the CPU stream reads the GPU's result from the same memory
        z = mx.multiply(y, 2.0, stream=mx.cpu)
        mx.eval(z)
        np.testing.assert_allclose(np.asarray(z), 2 * want, rtol=1e-6)
    assert not runtime.pending()


def test_gpu_and_cpu_nodes_in_one_evaluation(fake):
    # The CPU node runs in the middle of the evaluation: the GPU work queued before it is
    # committed and waited for first, and the GPU node after it reads its result.
    x = random_array((6, 10), mx.float32, rng(42), -1, 1)
    a = mx.array(x)
    mx.eval(a)
    del fake[:]
    y = mx.exp(a, stream=mx.gpu)
    z = mx.cumsum(y, axis=1, stream=mx.cpu)
    w = mx.sin(z, stream=mx.gpu)
    mx.eval(w)
    ref = np.sin(np.cumsum(np.exp(x.astype(F64)), axis=1))
    np.testing.assert_allclose(np.asarray(w), ref, rtol=2e-6, atol=1e-6)
    assert [c[0] for c in _commits(fake)] == ["commit", "wait", "commit", "wait"]


def test_a_launch_whose_result_is_read_back_waits_at_once(fake):
    # An indexing kernel's bounds flag lives in NumPy memory and is read by its launcher
    # right after the dispatch: that launch is committed and waited for at once.
    x = mx.array(random_array((5, 4), mx.float32, rng(43)))
    mx.eval(x)
    with mx.stream(mx.gpu):
        got = mx.take(x, mx.array([4, 0, 2]), axis=0)
    mx.eval(got)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(x)[[4, 0, 2]])
    with mx.stream(mx.gpu):
        bad = mx.take(x, mx.array([1, 7]), axis=0)
    with pytest.raises(IndexError):
        mx.eval(bad)


def test_a_gpu_error_is_raised_at_the_read_naming_the_kernels(fake, monkeypatch):
    from test_metal_backend import _Commands
    a = mx.array(random_array((4, 4), mx.float32, rng(44)))
    mx.eval(a)

    class _Error:
        def localizedDescription(self):
            return "Execution of the command buffer was aborted (out of memory)"
    monkeypatch.setattr(_Commands, "error", lambda self: _Error())
    with mx.stream(mx.gpu):
        y = mx.exp(a)
    mx.eval(y)
    with pytest.raises(BackendError, match="failed on the GPU: Execution of the command"):
        np.asarray(y)
    assert not runtime.pending()
    # Its bytes are not results: every later read of it raises too (np.asarray tries the
    # buffer protocol first and would otherwise take the memory on its second try).
    for read in (np.asarray, lambda a: a[0, 0].item(), lambda a: a.tolist()):
        with pytest.raises(BackendError, match="failed on the GPU"):
            read(y)
    monkeypatch.setattr(_Commands, "error", lambda self: None)
    ok = mx.exp(a, stream=mx.gpu)                   # the next work is not affected
    np.testing.assert_allclose(np.asarray(ok), np.exp(np.asarray(a)), rtol=1e-6)


def test_a_plugin_kernel_writes_a_shared_output_in_the_evaluations_command_buffer(fake,
                                                                                 monkeypatch):
    # A plugin's MetalKernel (runtime.run) allocates its output in a shared buffer, so its
    # launch joins the evaluation's command buffer like a built-in one (nothing copied back).
    from test_metal_shim import scale_kernel

    class Scale:                                     # what runtime.run asks of a primitive
        factor = -1.5

        def output_shapes(self, inputs):
            return [inputs[0].shape]
    monkeypatch.setattr(runtime, "availability", lambda: (True, ""))
    x = random_array((6, 7), mx.float32, rng(45), -2, 2)
    del fake[:]
    runtime.begin_batch()
    try:
        out = runtime.run(scale_kernel(), Scale(), [x])
        assert _commits(fake) == []                  # encoded, not committed
    finally:
        runtime.end_batch()
    owner = runtime.shared_buffer_of(out)
    assert owner is not None and ("bind", 1, owner.mtl, 0) in _binds(fake)
    assert _commits(fake) == [("commit", 1)] and _new(fake, "bytes") == []  # x: setBytes
    runtime.wait_all()
    np.testing.assert_array_equal(out, np.float32(-1.5) * x)


def test_a_launchers_host_copy_waits_for_the_work_that_writes_it(fake):
    # Launchers copy or convert some inputs on the host (a reversed view, scales to
    # float32): launch.host_array waits for the queued work that writes them first.
    from lazyx.backends.metal import launch
    x = random_array((6, 10), mx.float32, rng(46), -1, 1)
    a = mx.array(x)
    mx.eval(a)
    with mx.stream(mx.gpu):
        y = mx.exp(a)
    mx.eval(y)
    data = y._data                                   # the shared buffer, still unwritten
    assert runtime.pending() and not np.any(np.ascontiguousarray(data))
    got = launch.host_array(data[::-1], np.float64)  # as a launcher copies it
    assert not runtime.pending()
    np.testing.assert_allclose(got, np.exp(x.astype(F64))[::-1], rtol=2e-6)
    # Nothing queued writes it any more: a later copy does not wait.
    del fake[:]
    launch.host_array(data[:, ::2])
    assert _commits(fake) == []


def test_evaluations_on_several_threads_share_the_batch_safely(fake):
    # Launches from several threads go into the shared command buffer one at a time
    # (the runtime's lock); every thread's results are right once read.
    xs = [random_array((8, 16), mx.float32, rng(70 + i), -1, 1) for i in range(4)]
    got = [None] * 4

    def work(i):
        with mx.stream(mx.gpu):
            y = mx.softmax(mx.exp(mx.array(xs[i])) * 0.5, axis=-1)
        mx.eval(y)
        got[i] = np.asarray(y)
    run_in_threads(work, 4)
    for x, y in zip(xs, got):
        e = np.exp(np.exp(x.astype(F64)) * 0.5)
        np.testing.assert_allclose(y, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-8)
    assert not runtime.pending()


def test_views_of_queued_results_wait_for_nothing(fake):
    # A view primitive runs the CPU's kernel, which returns a NumPy view of the shared
    # buffer: counted as a view (not a CPU fallback), and it does not wait for the queued
    # GPU work writing the viewed array: the evaluation stays one command buffer, waited
    # for at the read. A dynamic slice's start, which its kernel reads, is settled first.
    x = random_array((4, 6), mx.float32, rng(43), -1, 1)
    a = mx.array(x)
    mx.eval(a)
    metal.stats.update(views=0, cpu_fallback=0)
    del fake[:]
    with mx.stream(mx.gpu):
        y = mx.exp(a) * 2.0
        views = [mx.transpose(y), y[1:3, ::2], mx.expand_dims(y, 0), mx.squeeze(y[None]),
                 mx.broadcast_to(y[:1], (3, 6)), mx.diagonal(y), mx.split(y, 2, axis=1)[1],
                 mx.as_strided(y, (2, 2), (6, 1), 1)]
        mx.eval(views)
    assert [c[0] for c in _commits(fake)] == ["commit"] and runtime.pending()
    assert metal.stats["views"] >= len(views) and metal.stats["cpu_fallback"] == 0
    want = np.exp(x.astype(F64)) * 2.0
    np.testing.assert_allclose(np.asarray(views[0]), want.T, rtol=1e-6)   # the read waits
    assert [c[0] for c in _commits(fake)] == ["commit", "wait"]
    for got, ref in zip(views[1:], [want[1:3, ::2], want[None], want, np.broadcast_to(want[:1], (3, 6)),
                                    np.diagonal(want), want[:, 3:], want.reshape(-1)[[1, 2, 7, 8]]
                                    .reshape(2, 2)]):
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-6)
    del fake[:]
    with mx.stream(mx.gpu):
        start = mx.array([1]) + 1                   # written by queued GPU work, then read
        got = mx.slice(mx.exp(a), start, axes=(0,), slice_size=(2, 6))
        mx.eval(got)
    np.testing.assert_allclose(np.asarray(got), np.exp(x.astype(F64))[2:4], rtol=1e-6)
    assert mx.kernel_provider("metal", "Transpose") == metal.VIEW
