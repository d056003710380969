"""The Metal backend end to end on Linux: built-in MSL kernels (reductions, softmax),
generated element-wise kernels and the explicit CPU fallback, on ``stream=mx.gpu``.

Two ways to stand in for the GPU:

* ``emulate_on_cpu`` (the ``on_metal`` fixture): every Metal kernel runs through
  lazyx's C++ shim (:func:`lazyx.backends.metal.runtime.dispatch` and ``execute``
  hand it to :mod:`lazyx.backends.metal.msl_cpu`);
* a **fake Metal API** (``on_fake_gpu``): the runtime's real GPU path
  (``runtime._encode``: argument binding, ``setBytes`` versus buffers, threadgroup
  sizes and memory, one command buffer per evaluation, copying outputs back) runs
  against recording stand-ins for PyObjC's objects, whose command buffer runs the
  bound bytes through the shim when it is waited for (a read the runtime forgot to
  wait for sees stale bytes). Only PyObjC's own semantics are left untested.

Results are compared with the CPU backend's and with NumPy float64 references. Kernel
builds are cached on disk (:mod:`lazyx.codegen.jit`), shared with
tests/backends/test_metal_kernels.py.
"""

import io

import numpy as np
import pytest

import lazyx.core as mx
from helpers import random_array, rng
from lazyx import cli
from lazyx.backends import metal
from lazyx.backends.metal import compiled, msl_cpu, runtime
from lazyx.backend import invalidate_dispatch
from lazyx.backends.metal.kernels import reductions, softmax
from lazyx.codegen import jit
from lazyx.errors import ArgumentError, BackendError, DtypeError, KernelNotFoundError

pytestmark = pytest.mark.skipif(not jit.available(), reason="no C++ compiler for the MSL shim")

F64 = np.float64


def _reset_stats():
    metal.stats.update(builtin=0, cpu_fallback=0, views=0)
    metal.stats["cpu_fallback_by_primitive"].clear()


@pytest.fixture
def on_metal(monkeypatch):
    """The Metal backend, emulated on the CPU, as the active GPU backend; stats at zero."""
    monkeypatch.delenv("LAZYX_METAL_STRICT", raising=False)
    previous = metal.emulate_on_cpu(True)
    try:
        with mx.use_backend("gpu", "metal"):
            _reset_stats()
            compiled.runner().launches.clear()
            yield metal.stats
    finally:
        metal.emulate_on_cpu(previous)


# -- a fake Metal API: PyObjC's objects as recording stand-ins ---------------------------------
class _Buffer:
    """An MTLBuffer: bytes with ``contents().as_buffer(n)``."""

    def __init__(self, data):
        self.data = bytearray(data)

    def contents(self):
        return self

    def as_buffer(self, n):
        return memoryview(self.data)[:n]


class _Pipeline:
    def __init__(self, kernel, function, limit):
        self.kernel, self.function, self.limit = kernel, function, limit

    def maxTotalThreadsPerThreadgroup(self):
        return self.limit


class _Encoder:
    def __init__(self, log):
        self.log, self.bound, self.memory = log, {}, {}

    def setComputePipelineState_(self, pipeline):
        self.pipeline = pipeline

    def setBytes_length_atIndex_(self, data, length, index):
        self.log.append(("setBytes", index, length))
        self.bound[index] = (_Buffer(data[:length]), 0)

    def setBuffer_offset_atIndex_(self, buffer, offset, index):
        self.log.append(("setBuffer", index, offset))
        self.bound[index] = (buffer, offset)

    def setThreadgroupMemoryLength_atIndex_(self, length, index):
        self.log.append(("setThreadgroupMemoryLength", index, length))
        self.memory[index] = length

    def dispatchThreads_threadsPerThreadgroup_(self, grid, threadgroup):
        self.log.append(("dispatchThreads", grid, threadgroup))
        self.grid, self.threadgroup = grid, threadgroup

    def endEncoding(self):
        pass


class _Commands:
    """A command buffer that runs its encoders' dispatches through the shim, in order, on
    the very bytes the runtime bound (so binding mistakes show as wrong numbers) — when it
    is waited for, not at ``commit``: the GPU runs later than the host, so a read the
    runtime did not wait for sees the bytes from before."""

    def __init__(self, log):
        self.log, self.encoders, self.state = log, [], "encoding"

    def computeCommandEncoder(self):
        assert self.state == "encoding", "encoding into a committed command buffer"
        e = _Encoder(self.log)
        self.encoders.append(e)
        return e

    def commit(self):
        assert self.state == "encoding", "a command buffer committed twice"
        self.state = "committed"
        self.log.append(("commit", len(self.encoders)))

    def waitUntilCompleted(self):
        assert self.state != "encoding", "waiting for a command buffer never committed"
        self.log.append(("wait", len(self.encoders)))
        if self.state == "completed":
            return
        self.state = "completed"
        for e in self.encoders:
            views = [np.frombuffer(e.bound[i][0].data, np.uint8)[e.bound[i][1]:]
                     for i in range(max(e.bound) + 1)]
            memory = [e.memory.get(i, 0) for i in range(max(e.memory, default=-1) + 1)]
            msl_cpu.dispatch_on_cpu(e.pipeline.kernel, e.pipeline.function, views, e.grid,
                                    e.threadgroup, threadgroup_memory=memory)

    def error(self):
        return None


class _Metal:
    MTLResourceStorageModeShared = 0

    @staticmethod
    def MTLSizeMake(*sizes):
        return tuple(sizes)


class _Device:
    def newBufferWithLength_options_(self, length, mode):
        return _Buffer(b"\0" * length)

    def newBufferWithBytes_length_options_(self, data, length, mode):
        return _Buffer(data[:length])


class _Queue:
    def __init__(self, log):
        self.log = log

    def commandBuffer(self):
        return _Commands(self.log)


@pytest.fixture
def on_fake_gpu(monkeypatch):
    """The Metal backend on the fake Metal API (not emulated: the runtime's GPU path runs);
    yields the call log and the pipelines' threadgroup limit (a one-element list)."""
    log, limit = [], [1024]
    monkeypatch.setenv("LAZYX_METAL", "1")
    monkeypatch.delenv("LAZYX_METAL_STRICT", raising=False)
    monkeypatch.setattr(runtime, "_get_context", lambda: (_Metal, _Device(), _Queue(log)))
    monkeypatch.setattr(runtime, "_pipeline", lambda k, f: _Pipeline(k, f, limit[0]))
    monkeypatch.setattr(metal, "availability", lambda: (True, ""))
    previous = runtime.set_emulation(False)
    metal._BACKEND.forget_availability()
    try:
        with mx.use_backend("gpu", "metal"):
            _reset_stats()
            yield log, limit
            runtime.wait_all()  # what a test left queued runs on its own fake objects
    finally:
        runtime.discard_pending()
        runtime.set_emulation(previous)
        metal._BACKEND.forget_availability()
        invalidate_dispatch()


# -- a small MLP's forward pass and loss on stream=mx.gpu ---------------------------------------
def _mlp(x, w1, b1, w2, b2, onehot):
    h = mx.maximum(mx.matmul(x, w1) + b1, 0.0)
    logits = mx.matmul(h, w2) + b2
    loss = mx.mean(mx.logsumexp(logits, axis=-1) - mx.sum(logits * onehot, axis=-1))
    return loss, mx.softmax(logits, axis=-1), mx.argmax(logits, axis=-1)


def _mlp_ref(x, w1, b1, w2, b2, onehot):
    x, w1, b1, w2, b2 = (a.astype(F64) for a in (x, w1, b1, w2, b2))
    logits = np.maximum(x @ w1 + b1, 0.0) @ w2 + b2
    m = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(-1)) + m[:, 0]
    probs = np.exp(logits - m) / np.exp(logits - m).sum(-1, keepdims=True)
    return (lse - (logits * onehot).sum(-1)).mean(), probs, logits.argmax(-1)


def _mlp_inputs():
    gen = rng(20)
    x = random_array((12, 20), mx.float32, gen, -1, 1)
    w1 = random_array((20, 48), mx.float32, gen, -0.5, 0.5)
    b1 = random_array((48,), mx.float32, gen, -0.1, 0.1)
    w2 = random_array((48, 10), mx.float32, gen, -0.5, 0.5)
    b2 = random_array((10,), mx.float32, gen, -0.1, 0.1)
    onehot = np.eye(10, dtype=np.float32)[gen.integers(0, 10, 12)]
    return [x, w1, b1, w2, b2, onehot]


def _run(fn, arrays, stream):
    with mx.stream(stream):
        out = fn(*[mx.array(a) for a in arrays])
        mx.eval(*out)
    return [np.asarray(o) for o in out]


def _check_mlp(got, cpu, ref):
    for g, c in zip(got[:2], cpu[:2]):
        np.testing.assert_allclose(g, c, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5)
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(got[2], ref[2])


def test_mlp_forward_and_loss_on_the_gpu_stream_equal_the_cpu_backend(on_metal):
    arrays = _mlp_inputs()
    cpu = _run(_mlp, arrays, mx.cpu)
    ref = _mlp_ref(*arrays)
    got = _run(_mlp, arrays, mx.gpu)
    _check_mlp(got, cpu, ref)
    # Matmul (twice), Reduce (sum, mean), LogSumExp, Softmax and ArgReduce ran built-in
    # kernels; the element-wise ops generated ones; nothing fell back to the CPU.
    assert on_metal["cpu_fallback_by_primitive"] == {}
    assert on_metal["cpu_fallback"] == 0 and on_metal["builtin"] == 7
    assert len(compiled.runner().launches) >= 4
    # The same under compile: element-wise runs fuse, the rest run as above.
    _reset_stats()
    fused = _run(mx.compile(_mlp), arrays, mx.gpu)
    _check_mlp(fused, cpu, ref)
    # (compile's mean counts with a NumberOfElements node, folded into a constant at
    # fixed shapes: the same 7 built-in kernels; shapeless, it runs one more.)
    assert on_metal["cpu_fallback_by_primitive"] == {}
    assert on_metal["builtin"] == 7
    _reset_stats()
    _check_mlp(_run(mx.compile(_mlp, shapeless=True), arrays, mx.gpu), cpu, ref)
    assert on_metal["cpu_fallback_by_primitive"] == {}
    assert on_metal["builtin"] == 8


def test_the_mlp_through_the_runtimes_gpu_path_on_a_fake_metal_api(on_fake_gpu):
    log, _ = on_fake_gpu
    arrays = _mlp_inputs()
    got = _run(_mlp, arrays, mx.gpu)
    _check_mlp(got, _run(_mlp, arrays, mx.cpu), _mlp_ref(*arrays))
    assert metal.stats["builtin"] == 7 and metal.stats["cpu_fallback"] == 0
    dispatches = [c for c in log if c[0] == "dispatchThreads"]
    # Built-in row kernels: one threadgroup of 32 threads per row of 10 (softmax,
    # logsumexp, sum, argmax), the mean's reduction of 12 in one row; the generated
    # kernels: one thread per element, threadgroups as wide as the grid.
    assert ("dispatchThreads", (32, 12, 1), (32, 1, 1)) in dispatches
    assert ("dispatchThreads", (32, 1, 1), (32, 1, 1)) in dispatches
    assert ("dispatchThreads", (12 * 48, 1, 1), (12 * 48, 1, 1)) in dispatches
    # The matmuls: one threadgroup of 16 x 16 threads per 32 x 32 output tile (12 x 48: 2).
    assert ("dispatchThreads", (32, 16, 1), (16, 16, 1)) in dispatches
    # Scalars and layouts go by setBytes; an input larger than 4 KB by a buffer.
    assert any(c[0] == "setBytes" for c in log) and any(c[0] == "setBuffer" for c in log)


def test_kernels_that_read_their_output_buffer_on_the_fake_gpu_path(on_fake_gpu):
    # A scatter writes into a copy of its input, a concatenation into the blocks written
    # before: the runtime must upload a written buffer's bytes, not bind an empty one.
    rng = np.random.default_rng(5)
    base = rng.standard_normal((6, 3)).astype(np.float32)
    idx = np.array([0, 2, 2, 5], np.int32)
    upd = rng.standard_normal((4, 3)).astype(np.float32)
    parts = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(3)]

    def run(stream):
        with mx.stream(stream):
            scattered = mx.array(base).at[mx.array(idx)].add(mx.array(upd))
            joined = mx.concatenate([mx.array(p) for p in parts], axis=0)
            return np.asarray(scattered), np.asarray(joined)
    want_scatter = base.copy()
    np.add.at(want_scatter, idx, upd)
    got = run(mx.gpu)
    np.testing.assert_allclose(got[0], want_scatter, rtol=1e-6)
    np.testing.assert_array_equal(got[1], np.concatenate(parts))
    assert metal.stats["builtin"] >= 2


def test_the_gpu_path_sizes_threadgroup_memory_and_checks_the_pipelines_limit(on_fake_gpu):
    log, limit = on_fake_gpu
    x = random_array((3, 300), mx.float32, rng(21))
    dispatches = []
    reductions.reduce(_reduce("sum", (1,)), [x], dispatches.append)
    d = dispatches[0]
    d.threadgroup_memory = (20, 0, 48)
    runtime.dispatch(d)
    np.testing.assert_allclose(d.buffers[1], x.astype(F64).sum(1), rtol=1e-5)
    # Metal wants threadgroup memory lengths in multiples of 16 bytes; 0 is not set.
    assert [c for c in log if c[0] == "setThreadgroupMemoryLength"] == [
        ("setThreadgroupMemoryLength", 0, 32), ("setThreadgroupMemoryLength", 2, 48)]
    # A pipeline that allows fewer threads than the kernel's threadgroups: an error, not a
    # launch with other threadgroups (the kernel's reductions assume its size).
    limit[0] = 256
    with pytest.raises(BackendError, match=r"reductions.*reduce_rows_sum_float32.*\(320, 1, 1\).*256"):
        runtime.dispatch(d)


def _reduce(op, axes, keepdims=False):
    from lazyx.plugins import reductions as rd
    return rd.Reduce(mx.default_stream(mx.gpu), op, axes, keepdims)


# -- reductions and softmax through the backend ---------------------------------------------
DTYPES = ["float32", "float16", "bfloat16", "int32"]
SHAPES = [((37,), 0), ((6, 45), 1), ((45, 6), 0), ((4, 6, 5), (0, 2)), ((6, 45), None)]


def _tolerance(dtype):
    return {"float32": 2e-6, "float16": 1e-3, "bfloat16": 8e-3}[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_reductions_through_the_backend(on_metal, dtype):
    d = getattr(mx, dtype)
    gen = rng(22)
    for shape, axis in SHAPES:
        x = random_array(shape, d, gen, -2, 2)
        for transposed in (False, True):
            a = mx.array(x.T.copy()).T if transposed else mx.array(x)
            for name, ref in (("sum", np.sum), ("max", np.max), ("min", np.min)):
                got = np.asarray(getattr(mx, name)(a, axis=axis, stream=mx.gpu))
                expected = ref(x.astype(F64), axis=axis)
                where = f"{name} {dtype} {shape} axis {axis} transposed={transposed}"
                if dtype == "int32" or name != "sum":
                    exact = expected.astype(got.dtype).astype(F64)
                    np.testing.assert_array_equal(got.astype(F64), exact, where)
                else:
                    scale = np.sum(np.abs(x.astype(F64)), axis=axis)
                    tol = _tolerance(dtype) * np.abs(expected) + 1e-6 * scale + 1e-6
                    assert np.all(np.abs(got.astype(F64) - expected) <= tol), where
            if axis is None or isinstance(axis, int):
                for name, ref in (("argmax", np.argmax), ("argmin", np.argmin)):
                    got = np.asarray(getattr(mx, name)(a, axis=axis, stream=mx.gpu))
                    np.testing.assert_array_equal(got, ref(x, axis=axis), f"{name} {shape}")
    assert metal.stats["cpu_fallback"] == 0 and metal.stats["builtin"] > 0
    # all / any / prod, and keepdims.
    b = random_array((5, 40), mx.bool_, gen)
    for name, ref in (("all", np.all), ("any", np.any)):
        got = getattr(mx, name)(mx.array(b), axis=1, keepdims=True, stream=mx.gpu)
        np.testing.assert_array_equal(np.asarray(got), ref(b, axis=1, keepdims=True))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_softmax_and_logsumexp_through_the_backend(on_metal, dtype):
    d = getattr(mx, dtype)
    gen = rng(23)
    for shape, axis in [((7, 33), -1), ((33, 7), 0), ((3, 4, 50), (1, 2)), ((1200,), 0)]:
        x = random_array(shape, d, gen, -6, 6)
        wide = x.astype(F64)
        m = wide.max(axis=axis, keepdims=True)
        e = np.exp(wide - m)
        got = np.asarray(mx.softmax(mx.array(x), axis=axis, stream=mx.gpu)).astype(F64)
        expected = e / e.sum(axis=axis, keepdims=True)
        np.testing.assert_allclose(got, expected, rtol=4 * _tolerance(dtype), atol=1e-7,
                                   err_msg=f"softmax {dtype} {shape}")
        got = np.asarray(mx.logsumexp(mx.array(x), axis=axis, keepdims=True, stream=mx.gpu))
        expected = np.log(e.sum(axis=axis, keepdims=True)) + m
        np.testing.assert_allclose(got.astype(F64), expected, rtol=2 * _tolerance(dtype),
                                   err_msg=f"logsumexp {dtype} {shape}")
    assert metal.stats["cpu_fallback"] == 0 and metal.stats["builtin"] == 8


def test_a_dtype_the_built_in_kernel_lacks_falls_back_to_the_cpu_counted(on_metal):
    x = np.arange(-30, 30, dtype=np.int64).reshape(6, 10)
    got = mx.sum(mx.array(x), axis=1, stream=mx.gpu)
    np.testing.assert_array_equal(np.asarray(got), x.sum(1))
    assert got.dtype == mx.int64
    assert on_metal["cpu_fallback_by_primitive"] == {"Reduce": 1} and on_metal["builtin"] == 0


# -- the fallback: listed, counted, refused when strict -------------------------------------
def test_the_cli_lists_the_cpu_fallbacks(on_metal):
    data = cli.kernels_data(["Inverse", "Softmax", "Add", "Matmul"], ["metal"])
    providers = {p["name"]: p["kernels"]["metal"]["provider"] for p in data["primitives"]}
    assert providers == {"Inverse": metal.CPU_FALLBACK, "Softmax": "backend 'metal'",
                         "Add": "backend 'metal'", "Matmul": "backend 'metal'"}
    assert mx.kernel_provider("metal", "Slice") == metal.VIEW   # a view: no kernel
    info = cli.info_data()
    fallbacks = info["fallback_kernels"]["metal"]
    assert "Inverse" in fallbacks and not {"Slice", "Transpose"} & set(fallbacks)
    assert not {"Reduce", "ArgReduce", "Softmax", "LogSumExp", "Add", "Compiled",
                "Gather", "Scatter", "Concatenate", "Matmul", "AddMM"} & set(fallbacks)
    assert "Inverse" not in info["missing_kernels"].get("metal", ())
    out = io.StringIO()
    cli.info(out)
    lines = out.getvalue().splitlines()
    at = lines.index("CPU fallbacks (the CPU backend's kernel runs on the device's memory):")
    assert lines[at + 1].startswith(f"  metal: {len(fallbacks)} of ")
    assert " Inverse " in lines[at + 1]
    # Not when nothing falls back: the CPU backends list none.
    assert "cpu" not in info["fallback_kernels"]


def test_strict_mode_refuses_a_fallback_naming_the_primitive(on_metal, monkeypatch):
    a = mx.array(random_array((4, 5), mx.float32, rng(24)))
    b = mx.array(random_array((5, 5), mx.float32, rng(25)) + 8 * np.eye(5, dtype=np.float32))
    kept = mx.sum(a, axis=1, stream=mx.gpu)
    mx.eval(kept)
    monkeypatch.setenv("LAZYX_METAL_STRICT", "1")
    with pytest.raises(KernelNotFoundError, match=r"^Inverse has no Metal kernel for inputs of "
                       r"dtypes float32, and LAZYX_METAL_STRICT=1 refuses its CPU fallback"):
        mx.eval(mx.linalg.inv(b, stream=mx.gpu))
    assert on_metal["cpu_fallback"] == 0
    # Built-in and generated kernels still run; what was computed stays valid.
    probs = np.asarray(mx.softmax(a, axis=-1, stream=mx.gpu))
    np.testing.assert_allclose(probs.sum(-1), 1, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(kept), np.asarray(a).astype(F64).sum(1), rtol=1e-6)
    # A built-in kernel's dtype gap falls back too, so it is refused as well.
    with pytest.raises(KernelNotFoundError, match=r"^Reduce has no Metal kernel.*int64"):
        mx.eval(mx.sum(mx.array(np.ones(3, np.int64)), stream=mx.gpu))
    # Another value is a warning, and the fallback runs.
    monkeypatch.setenv("LAZYX_METAL_STRICT", "sometimes")
    with pytest.warns(RuntimeWarning, match="LAZYX_METAL_STRICT='sometimes' is not accepted"):
        got = mx.linalg.inv(b, stream=mx.gpu)
        mx.eval(got)
    np.testing.assert_allclose(np.asarray(got) @ np.asarray(b), np.eye(5), atol=1e-5)
    assert on_metal["cpu_fallback_by_primitive"] == {"Inverse": 1}


# -- bad input ---------------------------------------------------------------------------
def test_float64_is_refused_naming_the_op(on_metal):
    x = mx.array(np.ones((3, 4)), dtype=mx.float64)
    with pytest.raises(DtypeError, match=r"^Matmul cannot run on the Metal GPU with float64 inputs"):
        mx.eval(mx.matmul(x, mx.transpose(x, stream=mx.cpu), stream=mx.gpu))
    with pytest.raises(DtypeError, match=r"^Reduce cannot run on the Metal GPU with float64"):
        mx.eval(mx.sum(x, axis=0, stream=mx.gpu))
    with pytest.raises(DtypeError, match=r"^Softmax cannot run on the Metal GPU with float64"):
        mx.eval(mx.softmax(x, axis=0, stream=mx.gpu))
    assert on_metal["cpu_fallback"] == 0


def test_bad_dispatches_are_errors(on_metal):
    x = random_array((2, 50), mx.float32, rng(26))
    dispatches = []
    reductions.reduce(_reduce("sum", (1,)), [x], dispatches.append)
    d = dispatches[0]
    d.threadgroup = (2048, 1, 1)
    with pytest.raises(ArgumentError, match=r"reduce_rows_sum_float32.*threadgroup of \(2048, 1, 1\)"):
        runtime.dispatch(d)
    d.threadgroup, d.function = (64, 1, 1), "reduce_rows_sum_float64"
    with pytest.raises(msl_cpu.MSLShimError, match="reduce_rows_sum_float64"):
        runtime.dispatch(d)
    # A launcher asked for a dtype it has no version of says which it has.
    with pytest.raises(DtypeError, match=r"softmax has no version for dtype int32; it has float32"):
        softmax.softmax(None, [np.ones((2, 3), np.int32)], dispatches.append)


def test_without_metal_the_backend_says_why():
    if metal.is_available():
        pytest.skip("Metal runs here")
    with pytest.raises(BackendError, match=r"Backend 'metal' is not available: .*(macOS|Apple|LAZYX_METAL)"):
        mx.use_backend("gpu", "metal")



def test_on_by_default_where_metal_is_available_and_off_with_lazyx_metal_0(monkeypatch):
    # Every primitive MLX runs on its GPU has a kernel here: on Apple silicon the backend is
    # the gpu backend without opting in; LAZYX_METAL=0 turns it off, saying so.
    monkeypatch.setattr(metal, "availability", lambda: (True, ""))
    previous = runtime.set_emulation(False)
    try:
        monkeypatch.delenv("LAZYX_METAL", raising=False)
        metal._BACKEND.forget_availability()
        assert metal._BACKEND.is_available() and metal._BACKEND.unavailable_reason() == ""
        monkeypatch.setenv("LAZYX_METAL", "0")
        metal._BACKEND.forget_availability()
        assert not metal._BACKEND.is_available()
        assert "LAZYX_METAL=0" in metal._BACKEND.unavailable_reason()
    finally:
        runtime.set_emulation(previous)
        metal._BACKEND.forget_availability()
        invalidate_dispatch()
