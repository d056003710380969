"""Generated CUDA kernels on the GPU: ``compile``'s fused ``Compiled`` nodes and single
element-wise ops, against the CPU (NumPy kernels), for every dtype and layout.

Skipped without the cuda backend (CuPy and a GPU); the same kernels are checked on
the CPU, compiled as host C++, by ``tests/codegen/test_cuda_render.py``.
"""

import math
import os
import sys

import numpy as np
import pytest

import lazyx.core as mx
from helpers import ALL_DTYPES, TOLERANCES, assert_close, random_array, rng, to_lazyx
from lazyx import registry
from lazyx.array import from_buffer
from lazyx.backend import backends, resolve_kernel
from lazyx.transforms.fusion import Compiled, fuse_arrays

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "codegen"))
from fusible import build, fusible_primitives, inputs_for  # noqa: E402

CUDA = backends()["cuda"]
pytestmark = pytest.mark.skipif(not CUDA.is_available(),
                                reason=f"cuda backend unavailable: {CUDA.unavailable_reason()}")

f32 = mx.float32
_UNBOUNDED = {"max_inputs": 64, "max_outputs": 10**6, "max_ops": 10**6, "min_ops": 1}


@pytest.fixture
def gpu_stats():
    from lazyx.backends.cuda import compiled
    before = dict(compiled.stats)

    def delta():
        return {k: compiled.stats[k] - before[k] for k in before}
    return delta


def _same(actual, expected, msg=""):
    """``actual`` (a GPU result) equals ``expected`` (CPU) within the dtype's tolerance."""
    a, e = np.array(actual), np.array(expected)
    assert actual.dtype == expected.dtype and a.shape == e.shape, msg
    d = expected.dtype
    if d.kind in "fc":
        wide = np.complex128 if d.kind == "c" else np.float64
        r, t = TOLERANCES[d.name]
        np.testing.assert_allclose(a.astype(wide), e.astype(wide), rtol=r, atol=t,
                                   equal_nan=True, err_msg=msg)
    else:
        np.testing.assert_array_equal(a, e, err_msg=msg)


def gelu(x):
    return x * 0.5 * (1 + mx.erf(x * (1 / math.sqrt(2))))


def chain(x):
    y = x * 2.0
    y = y + 1.0
    y = y * x
    y = y - 0.5
    y = mx.abs(y)
    y = mx.sqrt(y)
    y = y * 0.5
    y = mx.maximum(y, x)
    y = y + x
    return y / 3.0


def _on(device, fn, *args):
    with mx.stream(device):
        out = fn(*args)
        mx.eval(out)
    return out


def _kinds(compiled_fn):
    return [(type(n.prim).__name__, n.prim.stream.device)
            for e in compiled_fn.cache.entries.values() for n in e.run_tape.nodes]


# -- compile on the GPU ----------------------------------------------------------------------
@pytest.mark.parametrize("fn", [gelu, chain], ids=["gelu", "chain"])
@pytest.mark.parametrize("dtype", [f32, mx.float16, mx.bfloat16, mx.float64],
                         ids=lambda d: d.name)
def test_compiled_functions_match_the_cpu(fn, dtype, gpu_stats):
    xd = random_array((1000, 37), dtype, rng(0))
    x = to_lazyx(xd)
    # Fresh functions: compile keeps one trace cache per function object.
    cpu = _on(mx.cpu, mx.compile(lambda x: fn(x)), x)
    gfn = mx.compile(lambda x: fn(x))
    gpu = _on(mx.gpu, gfn, x)
    assert CUDA.is_buffer(gpu._data)
    assert _kinds(gfn) == [("Compiled", mx.gpu)]  # one node, on the GPU stream
    _same(gpu, cpu, f"{fn.__name__} on {dtype.name}")
    assert gpu_stats()["contiguous"] >= 1


def test_compiled_gelu_on_64m_elements_is_one_kernel(gpu_stats):
    n = 1 << 26
    xd = np.random.default_rng(5).random(n, dtype=np.float32) * 8 - 4
    fn = mx.compile(gelu)
    y = _on(mx.gpu, fn, mx.array(xd))
    got = gpu_stats()
    assert got["contiguous"] == 1 and got["strided"] == 0 and got["materialised"] == 0
    sample = xd[:: 1 << 12].astype(np.float64)
    want = sample * 0.5 * (1 + np.vectorize(math.erf)(sample / math.sqrt(2)))
    # In the tail 1 + erf(x / sqrt(2)) cancels: float32 gives ~4e-7 absolute there.
    np.testing.assert_allclose(np.asarray(y)[:: 1 << 12], want, rtol=2e-6, atol=5e-7)


def _device(a):
    """An evaluated lazyx array holding device buffer ``a`` (a CuPy array, any strides)."""
    return from_buffer(a)


def test_compiled_functions_on_strided_and_broadcast_inputs(gpu_stats):
    import cupy as cp
    gen = rng(1)
    a = random_array((64, 48), f32, gen)
    b = random_array((64,), f32, gen)

    def f(x, y):
        return mx.tanh(x * y + 1.0) - mx.exp(y)

    dev = cp.asarray(a)
    # transposed (48, 64); sliced and reversed (32, 16); broadcast along the rows
    for x, y in ((dev.T, b), (dev[::2, ::-3], b[:16]), (dev, b[:48])):
        host = cp.asnumpy(x)
        got = _on(mx.gpu, mx.compile(f), _device(x), mx.array(y))
        cpu = _on(mx.cpu, mx.compile(f), mx.array(host), mx.array(y))
        _same(got, cpu)
        want = np.tanh(host.astype(np.float64) * y + 1.0) - np.exp(y.astype(np.float64))
        assert_close(got, want, f32)
    assert gpu_stats()["strided"] >= 2


def test_the_64_bit_strided_kernel(monkeypatch, gpu_stats):
    import cupy as cp
    from lazyx.backends.cuda import compiled
    monkeypatch.setattr(compiled, "_INT32", 16)
    monkeypatch.setattr(compiled, "_plans", {})
    a = random_array((40, 30), f32, rng(2))
    with mx.stream(mx.gpu):
        out = mx.add(mx.exp(_device(cp.asarray(a).T)), 1.0)
        mx.eval(out)
    np.testing.assert_allclose(np.array(out), np.exp(a.T.astype(np.float64)) + 1.0, rtol=2e-6)
    assert gpu_stats()["strided"] >= 1


# -- single ops through generated kernels ------------------------------------------------------
def test_single_elementwise_ops_use_generated_kernels():
    for name in ("Exp", "Add", "AsType", "Erf", "Select", "Maximum"):
        fn, provider = resolve_kernel(CUDA, next(c for c in registry.primitives if c.name == name))
        assert provider == "backend 'cuda'" and getattr(fn, "generated", False), name


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: d.name)
def test_eager_add_and_exp_match_numpy(dtype, gpu_stats):
    gen = rng(3)
    xd, yd = random_array((33, 65), dtype, gen), random_array((33, 65), dtype, gen)
    with mx.stream(mx.gpu):
        s = mx.add(to_lazyx(xd), to_lazyx(yd))
        b = mx.add(to_lazyx(xd), to_lazyx(yd[0]))           # broadcast: strided kernel
        k = mx.add(to_lazyx(xd), to_lazyx(yd[0, 0]))        # a scalar operand
        outs = [s, b, k]
        if dtype.kind in "fc":
            outs.append(mx.exp(to_lazyx(xd)))
        mx.eval(outs)
    cpu = [_on(mx.cpu, lambda: mx.add(to_lazyx(xd), to_lazyx(yd))),
           _on(mx.cpu, lambda: mx.add(to_lazyx(xd), to_lazyx(yd[0]))),
           _on(mx.cpu, lambda: mx.add(to_lazyx(xd), to_lazyx(yd[0, 0])))]
    if dtype.kind in "fc":
        cpu.append(_on(mx.cpu, lambda: mx.exp(to_lazyx(xd))))
    for g, c in zip(outs, cpu):
        assert CUDA.is_buffer(g._data)
        _same(g, c, dtype.name)
    got = gpu_stats()
    assert got["fallbacks"] == 0
    assert got["contiguous"] >= 2 and got["strided"] >= 1


def test_eager_ops_on_non_contiguous_and_misaligned_inputs(gpu_stats):
    import cupy as cp
    a = random_array((50, 70), f32, rng(4))
    dev = cp.asarray(a)
    misaligned = dev.reshape(-1)[1:3001].reshape(60, 50)  # contiguous, 4 bytes off
    for v in (dev.T, dev[::3, ::-2], misaligned):
        host = cp.asnumpy(v)
        with mx.stream(mx.gpu):
            y = mx.multiply(mx.sin(_device(v)), 2.0)
            mx.eval(y)
        assert_close(y, np.sin(host.astype(np.float64)) * 2.0, f32)
    got = gpu_stats()
    assert got["strided"] >= 2 and got["fallbacks"] == 0


def test_the_native_launcher_writes_into_dead_inputs_only(gpu_stats):
    # backends/cuda/native/launch.cpp: eager ops launched from C++, the output written into
    # an input nothing else reads (the scheduler's donors), never into one still held.
    from lazyx.backends.cuda import runtime
    if runtime.native_module() is None:
        pytest.skip("the native launcher is off or not built")
    xd = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)
    bd = np.linspace(0.5, 2, 6, dtype=np.float32)
    with mx.stream(mx.gpu):
        x, b = to_lazyx(xd) * 1, to_lazyx(bd) * 1
        mx.eval(x, b)
        held = x * 2.0                      # the caller keeps it: never written into
        y = mx.exp(held + 1.0) * 3.0 - x    # the intermediates are dead once read
        z = mx.transpose(x) * b[:, None]    # a transposed input, a broadcast one: strided
        w = (x - b) / 2.0                   # broadcasting, a Python scalar
        mx.eval(y, z, w)
    heldv = xd * 2
    np.testing.assert_allclose(np.asarray(held), heldv, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(x), xd, rtol=0)
    np.testing.assert_allclose(np.asarray(y), np.exp(heldv + 1) * 3 - xd, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(z), xd.T * bd[:, None], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(w), (xd - bd) / 2, rtol=1e-6)
    got = gpu_stats()
    assert got["native"] >= 7 and got["donated"] >= 2 and got["strided"] >= 2, got


# -- every fusible primitive, every dtype, on the GPU ---------------------------------------------
@pytest.mark.parametrize("layout", ["contiguous", "strided", "scalar"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: d.name)
def test_every_fusible_primitive_fused_on_the_gpu_matches_the_cpu(dtype, layout):
    data = inputs_for(dtype, (7, 33))
    x, y = data["x"], data["y"]
    if layout == "scalar":
        y = y[0, 0]

    def arrays():
        if layout != "strided":
            return {"x": to_lazyx(x), "y": to_lazyx(y)}
        xs = mx.transpose(to_lazyx(np.ascontiguousarray(x.T)))
        ys = to_lazyx(np.repeat(y, 2, axis=1))[:, ::2]
        mx.eval(xs, ys)
        return {"x": xs, "y": ys}

    results = {}
    for device in (mx.cpu, mx.gpu):
        with mx.stream(device):
            ins = arrays()
            items = [(cls, label, outs) for cls in fusible_primitives()
                     for label, outs in build(cls, ins)]
        flat = [o for *_, outs in items for o in outs]
        if device == mx.gpu:
            flat = fuse_arrays(flat, list(ins.values()), force=True, **_UNBOUNDED)
            assert any(isinstance(o._prim, Compiled) for o in flat), dtype.name
            assert all(o._prim.stream.device == mx.gpu for o in flat if o._prim is not None)
        mx.eval(flat)
        results[device] = (items, flat)
    items, cpu = results[mx.cpu]
    gpu = results[mx.gpu][1]
    k = 0
    for cls, label, outs in items:
        for j in range(len(outs)):
            assert CUDA.is_buffer(gpu[k]._data)
            _same(gpu[k], cpu[k], f"{cls.name} {label} on {dtype.name}, {layout}, output {j}")
            k += 1
