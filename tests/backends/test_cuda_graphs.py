"""CUDA graphs for compiled calls, and asynchronous execution on the GPU.

* A compiled function's calls replay a CUDA graph from the second call of a signature
  on (backends/cuda/graphs.py): every call's results equal the plan's, with inputs
  that change between calls; the caller keeps its results across later replays; a new
  signature captures a new graph; a plan that reads a value to the host is not
  captured and still gives the right numbers; an input passed again is copied again
  (an eager kernel may have written into its buffer: donation).
* Eager replay (lazyx.transforms.replay): a repeated eager training step becomes one
  CUDA graph, bit for bit the node-by-node numbers.
* Nothing makes the host wait for the GPU until a value is read: a training step,
  eager and compiled, reports no host synchronisation (the backend's hook), and runs
  to the end of its Python while a gate kernel holds the GPU (it would never return
  if anything waited for the GPU).

Skipped where CUDA is not available (CI).
"""

import threading
import weakref

import numpy as np
import pytest

import lazyx.core as mx
import lazyx.nn as nn
import lazyx.optimizers as optim
from lazyx.backend import backends

CUDA = backends()["cuda"]
pytestmark = pytest.mark.skipif(not CUDA.is_available(),
                                reason=f"cuda backend unavailable: {CUDA.unavailable_reason()}")


@pytest.fixture
def graphs():
    from lazyx.backends.cuda import graphs as g
    for k in g.stats:
        g.stats[k] = 0
    return g


def _dev(a, dtype=mx.float32):
    """An array whose buffer is on the GPU (compiled calls of host inputs upload them)."""
    x = mx.array(np.asarray(a), dtype) * mx.array(1, dtype)
    mx.eval(x)
    return x


def _mlp_fn(w1, w2, x):
    h = mx.maximum(x @ w1, 0.0)
    return mx.tanh(h @ w2).sum(axis=1) * 0.5 + mx.exp(-h.mean(axis=1))


def _reference(w1, w2, x):
    h = np.maximum(x @ w1, 0.0)
    return np.tanh(h @ w2).sum(axis=1) * 0.5 + np.exp(-h.mean(axis=1))


def test_replays_give_the_plans_numbers_with_changing_inputs(graphs):
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((32, 64)).astype(np.float32) * 0.2
    w2 = rng.standard_normal((64, 16)).astype(np.float32) * 0.2
    f = mx.compile(_mlp_fn)
    kept = []
    with mx.stream(mx.gpu):
        for i in range(6):
            x = rng.standard_normal((8, 32)).astype(np.float32)
            y = f(_dev(w1), _dev(w2), _dev(x))
            mx.eval(y)
            kept.append((y, _reference(w1.astype(np.float64), w2, x.astype(np.float64))))
    for y, want in kept:  # earlier results survive later replays
        np.testing.assert_allclose(np.asarray(y), want, rtol=2e-3, atol=2e-3)
    assert graphs.stats["captures"] == 1 and graphs.stats["replays"] == 4, (graphs.stats,
                                                                            graphs.last_failure)


def test_inputs_passed_again_and_new_ones_give_their_values(graphs):
    # The same weight arrays every call, the input new; then a new w1 array (new values).
    rng = np.random.default_rng(3)
    w1, w2 = (rng.standard_normal(s).astype(np.float32) * 0.2 for s in ((32, 64), (64, 16)))
    f = mx.compile(lambda a, b, c: _mlp_fn(a, b, c))  # its own cache: no graph captured yet
    with mx.stream(mx.gpu):
        d1, d2 = _dev(w1), _dev(w2)
        for i in range(7):
            if i == 5:
                w1 = w1[::-1].copy()
                d1 = _dev(w1)
            x = rng.standard_normal((8, 32)).astype(np.float32)
            y = f(d1, d2, _dev(x))
            np.testing.assert_allclose(np.asarray(y), _reference(w1.astype(np.float64), w2, x),
                                       rtol=2e-3, atol=2e-3)
    assert graphs.stats["captures"] == 1 and graphs.stats["replays"] == 5, graphs.stats


def test_a_buffer_an_eager_kernel_wrote_into_is_copied_again(graphs):
    """An eager op writes its result into a dead input's buffer (donation): the same
    CuPy array object, new bytes. A replay given the new array must copy it again."""
    rng = np.random.default_rng(4)
    w1, w2 = (rng.standard_normal(s).astype(np.float32) * 0.2 for s in ((32, 64), (64, 16)))
    x = rng.standard_normal((8, 32)).astype(np.float32)
    f = mx.compile(lambda a, b, c: _mlp_fn(a, b, c))
    with mx.stream(mx.gpu):
        d1, d2, dx = _dev(w1), _dev(w2), _dev(x)
        for _ in range(3):  # run, capture, replay: d1's buffer copied into the graph
            mx.eval(f(d1, d2, dx))
        two = _dev(np.float32(2.0))  # on the device: an op with a host operand does not donate
        buf = weakref.ref(d1._data)
        d1 = d1 * two  # the old array dies with this node: its buffer takes the product
        mx.eval(d1)
        assert buf() is d1._data, "no donation: the hazard this test is about did not arise"
        y = f(d1, d2, dx)
        np.testing.assert_allclose(np.asarray(y), _reference(w1 * 2.0, w2, x), rtol=2e-3,
                                   atol=2e-3)
    assert graphs.stats["replays"] >= 2, graphs.stats


def test_an_uploaded_host_buffer_is_never_donated(graphs):
    """A compiled call's input made from host data is uploaded through the backend's cache,
    which shares one device copy per host buffer (per value for a scalar). A replay may
    write its output into a dead input's buffer, but never into such a shared copy."""
    # Three nodes (a product, a sum, the fused rest: a graph is worth it); ``a`` is read
    # once and last by the fused node, whose output has its shape: a donation candidate.
    f = mx.compile(lambda a, b, w: (mx.sum(w @ w) * 0.0 + a * 2.0 + b) * 0.5)
    host = np.linspace(-1, 1, 64).astype(np.float32)
    with mx.stream(mx.gpu):
        w = _dev(np.eye(4, dtype=np.float32))
        b0, b1 = _dev(np.float32(3.0)), _dev(np.ones(64, np.float32))
        for _ in range(5):
            y0 = f(mx.array(np.float32(7.0)), b0, w)  # a 0-d host array: the cache by value
            y1 = f(mx.array(host), b1, w)             # 256 bytes: the cache per host buffer
            mx.eval(y0, y1)
            np.testing.assert_array_equal(np.asarray(y0), np.float32(8.5))
            np.testing.assert_allclose(np.asarray(y1), (host * 2 + 1) * 0.5, rtol=1e-6)
        # The shared copies still hold their bytes.
        np.testing.assert_array_equal(np.asarray(mx.array(np.float32(7.0)) + 0.0), 7.0)
    assert graphs.stats["replays"] >= 4, graphs.stats


def test_eager_training_is_replayed_as_one_graph_bit_for_bit(graphs):
    from lazyx.transforms import replay

    def train(mode):
        old = replay.set_mode(mode)
        try:
            with mx.stream(mx.gpu):
                model, opt, step, state, data = _training(False)
                losses = []
                for x, y in data:
                    loss = step(x, y)
                    mx.eval(loss, state)
                    losses.append(np.asarray(loss).tobytes())
                from lazyx.utils import tree_flatten
                params = [np.asarray(v).tobytes() for _, v in tree_flatten(model.parameters())]
        finally:
            replay.set_mode(old)
        return losses, params

    plain = train("0")
    before = dict(replay.stats)
    got = train("auto")
    assert got == plain
    assert replay.stats["builds"] - before["builds"] >= 1
    assert replay.stats["replays"] - before["replays"] >= 3
    assert graphs.stats["captures"] >= 1 and graphs.stats["replays"] >= 3, (
        graphs.stats, graphs.last_failure)


def test_eager_replay_of_strided_outputs(graphs):
    """Kept arrays that are views (a transpose, a reversed slice) of the graph's values."""
    from lazyx.transforms import replay
    rng = np.random.default_rng(5)
    with mx.stream(mx.gpu):
        for _ in range(5):
            a = rng.standard_normal((6, 4)).astype(np.float32)
            x = _dev(a)
            y = x
            for i in range(10):
                y = mx.sin(y) * 1.5 + 0.25
            t = mx.transpose(y)
            r = y[::-1]
            mx.eval(t, r)
            want = a
            for i in range(10):
                want = np.sin(want) * 1.5 + 0.25
            np.testing.assert_allclose(np.asarray(t), want.T, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(np.asarray(r), want[::-1], rtol=1e-5, atol=1e-5)
    assert replay.stats["replays"] >= 1 and graphs.stats["replays"] >= 1, (
        replay.stats, graphs.stats, graphs.last_failure)


def test_only_the_calls_stream_writes_a_graphs_copy_table(graphs, monkeypatch):
    """The capture stream is not ordered with the stream the calls run on, so nothing
    may run there: a kernel queued on it (the copy table's zero fill once was) can land
    between a call's upload of its table rows and the graph that reads them, and the
    graph then copies nothing (its results read uninitialised memory: seen as NaN or
    update-sized parameters in optimizer tests run 16 to a GPU). Here the capture
    stream is held by a gate kernel until every call has run; the table must then hold
    the rows the last call uploaded, not whatever was queued behind the gate."""
    import cupy as cp
    flag_mem = cp.cuda.alloc_pinned_memory(4)
    flag = np.frombuffer(flag_mem, np.int32, 1)
    flag[0] = 0
    gate = cp.RawKernel(_GATE, "gate")
    real_stream = cp.cuda.Stream

    def gated_stream(*args, **kwargs):
        s = real_stream(*args, **kwargs)
        with s:
            gate((1,), (1,), (flag_mem.ptr,))
        return s

    captured = []
    real_capture = graphs._capture

    def capture(*args):
        g = real_capture(*args)
        captured.append(g)
        return g

    monkeypatch.setattr(cp.cuda, "Stream", gated_stream)
    monkeypatch.setattr(graphs, "_capture", capture)
    opened_by_watchdog, done = threading.Event(), threading.Event()

    def watchdog():  # a call that waits for the capture stream would wait forever
        if not done.wait(60):
            opened_by_watchdog.set()
            flag[0] = 1
    threading.Thread(target=watchdog, daemon=True).start()
    rng = np.random.default_rng(8)
    w1, w2 = (rng.standard_normal(s).astype(np.float32) * 0.2 for s in ((32, 64), (64, 16)))
    f = mx.compile(lambda a, b, c: _mlp_fn(a, b, c))
    try:
        with mx.stream(mx.gpu):
            d1, d2 = _dev(w1), _dev(w2)
            for _ in range(4):  # run, capture and launch, two replays
                x = rng.standard_normal((8, 32)).astype(np.float32)
                y = f(d1, d2, _dev(x))
                np.testing.assert_allclose(np.asarray(y), _reference(w1.astype(np.float64), w2, x),
                                           rtol=2e-3, atol=2e-3)
            (g,) = captured
            assert g is not None, graphs.last_failure
            last = g.ring[(g.turn - 1) % len(g.ring)][1] if g.turn else g.ring[-1][1]
            rows = last[:g.table.shape[0]].copy()
    finally:
        done.set()
        flag[0] = 1
        cp.cuda.Device().synchronize()
    assert not opened_by_watchdog.is_set(), "a call waited for the capture stream"
    np.testing.assert_array_equal(cp.asnumpy(g.table), rows)
    assert graphs.stats["captures"] == 1 and graphs.stats["replays"] == 2, graphs.stats


def test_a_new_signature_captures_a_new_graph(graphs):
    f = mx.compile(_mlp_fn)
    rng = np.random.default_rng(1)
    with mx.stream(mx.gpu):
        for rows in (4, 4, 4, 9, 9, 9):
            w1 = rng.standard_normal((32, 64)).astype(np.float32)
            w2 = rng.standard_normal((64, 16)).astype(np.float32)
            x = rng.standard_normal((rows, 32)).astype(np.float32)
            y = f(_dev(w1), _dev(w2), _dev(x))
            np.testing.assert_allclose(np.asarray(y), _reference(w1.astype(np.float64), w2, x),
                                       rtol=2e-3, atol=2e-3)
    assert graphs.stats["captures"] == 2 and graphs.stats["replays"] == 2, (graphs.stats,
                                                                            graphs.last_failure)


def test_a_plan_that_reads_to_the_host_runs_uncaptured(graphs):
    def f(x, start):
        # dynamic start indices are read to the host (the slice's position decides the copy)
        return (mx.slice(mx.exp(x), start, (0,), (3,)) * 2.0 + 1.0).sum()
    g = mx.compile(f)
    x = np.linspace(-1, 1, 10).astype(np.float32)
    with mx.stream(mx.gpu):
        for k in range(4):
            got = g(_dev(x), _dev(np.array([k]), mx.int32)).item()
            assert got == pytest.approx(float((np.exp(x)[k:k + 3] * 2 + 1).sum()), rel=1e-5)
    assert graphs.stats["uncapturable"] == 1 and graphs.stats["replays"] == 0, graphs.stats
    assert "slice" in graphs.last_failure.lower() or graphs.last_failure


def test_indexing_is_captured_and_its_bounds_still_checked(graphs):
    from lazyx.errors import IndexOutOfRangeError
    g = mx.compile(lambda x, idx: (mx.exp(x)[idx] * 2.0 + 1.0).sum())
    x = np.linspace(-1, 1, 10).astype(np.float32)
    with mx.stream(mx.gpu):
        for k in range(4):
            idx = np.array([k, 9 - k, 3], np.int32)
            got = g(_dev(x), _dev(idx, mx.int32)).item()
            assert got == pytest.approx(float((np.exp(x)[idx] * 2 + 1).sum()), rel=1e-5)
        assert graphs.stats["captures"] == 1 and graphs.stats["replays"] == 2, (graphs.stats,
                                                                                graphs.last_failure)
        bad = g(_dev(x), _dev(np.array([1, 12, 3]), mx.int32))  # replayed: checked all the same
        mx.eval(bad)
        with pytest.raises(IndexOutOfRangeError, match=r"12 is out of bounds|outside"):
            bad.item()
        # eagerly too, reported at the next read (the kernel did not wait for the GPU)
        y = mx.take(_dev(x), _dev(np.array([0, 10]), mx.int32))
        mx.eval(y)
        with pytest.raises(IndexOutOfRangeError, match="10"):
            mx.synchronize()
        assert mx.take(_dev(x), _dev(np.array([0, 9]), mx.int32)).tolist() == \
            pytest.approx([x[0], x[9]])


def test_state_buffers_are_donated_to_the_outputs_and_kept_arrays_are_not(graphs):
    # inputs= and outputs= the same state: a replay writes the new state into the old
    # state's buffers (no allocation), but never into an array the caller still holds.
    from functools import partial
    rng = np.random.default_rng(5)
    w0 = rng.standard_normal((64, 32)).astype(np.float32) * 0.3
    state = {"w": _dev(w0), "m": _dev(np.zeros_like(w0))}

    @partial(mx.compile, inputs=state, outputs=state)
    def step(g, x):
        state["m"] = 0.9 * state["m"] + 0.1 * g
        state["w"] = state["w"] - 0.01 * state["m"]
        return mx.tanh(x @ state["w"]).sum()

    w, m = w0.astype(np.float64), np.zeros(w0.shape)
    kept = []
    with mx.stream(mx.gpu):
        for i in range(9):
            g = rng.standard_normal(w0.shape).astype(np.float32)
            x = rng.standard_normal((4, 64)).astype(np.float32)
            if i in (4, 6):
                kept.append((state["w"], w.copy()))   # the caller holds it: not donated
            loss = step(_dev(g), _dev(x))
            mx.eval(loss, state)
            m = 0.9 * m + 0.1 * g
            w = w - 0.01 * m
            np.testing.assert_allclose(np.asarray(state["w"]), w, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(np.asarray(state["m"]), m, rtol=1e-4, atol=1e-6)
            assert loss.item() == pytest.approx(np.tanh(x @ w).sum(), rel=1e-3, abs=1e-3)
    for arr, want in kept:  # untouched by the replays after it was passed
        np.testing.assert_allclose(np.asarray(arr), want, rtol=1e-4, atol=1e-5)
    assert graphs.stats["replays"] >= 6, (graphs.stats, graphs.last_failure)
    assert graphs.stats["donated"] > 0, graphs.stats


def test_graphs_switched_off(graphs, monkeypatch):
    monkeypatch.setattr(graphs, "ENABLED", False)
    f = mx.compile(_mlp_fn)
    rng = np.random.default_rng(2)
    w1, w2 = rng.standard_normal((32, 64)), rng.standard_normal((64, 16))
    with mx.stream(mx.gpu):
        for _ in range(3):
            x = rng.standard_normal((8, 32))
            y = f(_dev(w1), _dev(w2), _dev(x))
            np.testing.assert_allclose(np.asarray(y), _reference(w1, w2, x), rtol=2e-3, atol=2e-3)
    assert graphs.stats["captures"] == 0


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_direct_cublas_products_over_layouts(dtype):
    import cupy as cp
    import ml_dtypes
    from lazyx.backends.cuda import gemm
    npd = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 5, 7)).astype(npd)
    b = rng.standard_normal((3, 7, 4)).astype(npd)
    tol = {"float32": 1e-5, "float64": 1e-12, "float16": 2e-2, "bfloat16": 5e-2}[dtype]
    cases = [(a[0], b[0]), (a, b), (a, b[1]),
             (np.ascontiguousarray(a[0].T).T, b[0]),            # Fortran-ordered left operand
             (a[0], np.asfortranarray(b[0])),                     # Fortran-ordered right operand
             (np.swapaxes(np.ascontiguousarray(np.swapaxes(a, 1, 2)), 1, 2), b)]  # batched, transposed
    for x, y in cases:
        dx = cp.asarray(x) if x.flags.c_contiguous else cp.asfortranarray(cp.asarray(np.ascontiguousarray(x)))
        if x.ndim == 3 and not x.flags.c_contiguous:
            dx = cp.swapaxes(cp.ascontiguousarray(cp.swapaxes(cp.asarray(np.ascontiguousarray(x)), 1, 2)), 1, 2)
        dy = cp.asarray(y) if y.flags.c_contiguous else cp.asfortranarray(cp.asarray(np.ascontiguousarray(y)))
        got = gemm.matmul(dx, dy)
        assert got is not None, (x.shape, x.strides, y.shape, y.strides)
        want = x.astype(np.float64) @ y.astype(np.float64)
        np.testing.assert_allclose(cp.asnumpy(got).astype(np.float64), want, rtol=tol, atol=tol * 4)
    assert gemm.matmul(cp.ones(3, np.float32), cp.ones((3, 2), np.float32)) is None  # a vector
    x = mx.array(a[0].astype(np.float32))
    with mx.stream(mx.gpu):
        got = np.asarray(x @ mx.array(b[0].astype(np.float32)))
    np.testing.assert_allclose(got, a[0].astype(np.float64) @ b[0].astype(np.float64), rtol=1e-4, atol=1e-4)


# -- asynchronous execution ------------------------------------------------------------
def _training(compiled: bool):
    mx.random.seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = optim.Adam(learning_rate=1e-3)

    def loss_fn(model, x, y):
        return nn.losses.cross_entropy(model(x), y, reduction="mean")

    loss_and_grad = nn.value_and_grad(model, loss_fn)

    def step(x, y):
        loss, grads = loss_and_grad(model, x, y)
        opt.update(model, grads)
        return loss

    state = [model.state, opt.state]
    if compiled:
        step = mx.compile(step, inputs=state, outputs=state)
    rng = np.random.default_rng(0)
    # On the device before the steps (a copy from the host would wait for the GPU).
    data = [(_on_gpu(rng.standard_normal((32, 64)).astype(np.float32)),
             _on_gpu(rng.integers(0, 10, 32).astype(np.int32))) for _ in range(6)]
    mx.eval(model.parameters(), opt.state)
    return model, opt, step, state, data


def _on_gpu(a):
    x = mx.array(a) + mx.array(np.zeros((), a.dtype))
    mx.eval(x)
    return x


@pytest.mark.parametrize("compiled", [False, True])
def test_a_training_step_does_not_synchronise(compiled, monkeypatch):
    from lazyx.backends.cuda import runtime
    with mx.stream(mx.gpu):
        model, opt, step, state, data = _training(compiled)
        for x, y in data[:3]:  # warm-up: kernels built, graphs captured
            mx.eval(step(x, y), state)
        seen = []
        monkeypatch.setattr(runtime, "sync_hooks", [seen.append])
        for x, y in data[3:]:
            loss = step(x, y)
            mx.eval(loss, state)
        assert seen == [], f"the step synchronised the host: {seen}"
        value = loss.item()  # the queued index checks run with the read
        assert seen[-1] == "a value read to the host" and np.isfinite(value)
        assert set(seen) <= {"index bounds checks", "a value read to the host"}, seen


_GATE = r"""
extern "C" __global__ void gate(volatile int* flag) {
    while (*flag == 0) { __nanosleep(1000); }
    __threadfence_system();
}
"""


@pytest.mark.parametrize("compiled", [False, True])
def test_the_host_runs_ahead_of_the_gpu(compiled):
    """A kernel that spins until the host opens a flag holds the GPU; the steps are
    queued behind it. If anything in a step waited for the GPU, eval would not
    return until the watchdog opens the gate (and the test fails saying so)."""
    import cupy as cp
    with mx.stream(mx.gpu):
        model, opt, step, state, data = _training(compiled)
        for x, y in data[:3]:
            mx.eval(step(x, y), state)
        cp.cuda.Device().synchronize()
        flag_mem = cp.cuda.alloc_pinned_memory(4)
        flag = np.frombuffer(flag_mem, np.int32, 1)
        flag[0] = 0
        gate = cp.RawKernel(_GATE, "gate")
        # Pinned memory is mapped at the same address on the device (unified addressing).
        gate((1,), (1,), (flag_mem.ptr,))
        opened_by_watchdog = threading.Event()

        def watchdog():
            if not done.wait(60):
                opened_by_watchdog.set()
                flag[0] = 1
        done = threading.Event()
        t = threading.Thread(target=watchdog, daemon=True)
        t.start()
        try:
            for x, y in data[3:]:
                loss = step(x, y)
                mx.eval(loss, state)
            ran_ahead = not opened_by_watchdog.is_set()
        finally:
            done.set()
            flag[0] = 1
            t.join()
        assert ran_ahead, "evaluating the step waited for the GPU (the watchdog opened the gate)"
        assert np.isfinite(loss.item())
