"""Eager replay (lazyx.transforms.replay): an eval whose graph repeats the structure of
an earlier one runs as one compiled plan. Here on the CPU (mode ``"1"``); the GPU's
(the default mode there, CUDA graphs) is tested in tests/backends/test_cuda_graphs.py.

What must hold: results bit for bit those of node-by-node evaluation; every array a
program can still read gets its value; anything that changes what the kernels compute
(parameters, shapes, dtypes, which arrays are read) is a different structure; nothing
is replayed inside a transform; the cache holds no arrays."""

import gc
import weakref

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import lazyx.core as mx
import lazyx.nn as nn
import lazyx.optimizers as optim
from lazyx import scheduler
from lazyx.errors import ArgumentError
from lazyx.primitive import Primitive
from lazyx.transforms import replay
from lazyx.transforms.compile import CompiledCall


@pytest.fixture(autouse=True)
def replay_everywhere():
    old = replay.set_mode("1")
    try:
        yield
    finally:
        replay.set_mode(old)


def counts():
    return dict(replay.stats)


def delta(before):
    return {k: replay.stats[k] - before[k] for k in before}


def chain(x, y, n=12):
    """A graph of 2n + 1 nodes on two leaves (contracting: a last-bit difference of a
    device's ``sin`` is not amplified)."""
    for i in range(n):
        x = mx.sin(x) * 0.5 + y * 0.25 + (0.5 + i)
        y = y * 0.5 - 0.25 * x
    return x + y


def np_chain(x, y, n=12):
    x, y = x.astype(np.float32), y.astype(np.float32)
    for i in range(n):
        x = (np.sin(x) * np.float32(0.5) + y * np.float32(0.25) + np.float32(0.5 + i))
        y = (y * np.float32(0.5) - np.float32(0.25) * x).astype(np.float32)
    return x + y


def test_a_repeated_graph_is_built_once_then_replayed_with_new_data():
    rng = np.random.default_rng(0)
    before = counts()
    for k in range(5):
        a = rng.standard_normal((3, 4)).astype(np.float32)
        b = rng.standard_normal((3, 4)).astype(np.float32)
        out = chain(mx.array(a), mx.array(b))
        mx.eval(out)
        np.testing.assert_allclose(np.asarray(out), np_chain(a, b), rtol=1e-5, atol=1e-5)
    # Seen once, built at the second eval, replayed at the three after it.
    assert delta(before) == {"builds": 1, "replays": 3}


def test_training_is_bit_for_bit_the_node_by_node_run():
    def train(mode):
        replay.set_mode(mode)
        mx.random.seed(3)
        model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 5))
        opt = optim.Adam(learning_rate=1e-2)
        loss_and_grad = nn.value_and_grad(
            model, lambda m, x, y: nn.losses.cross_entropy(m(x), y, reduction="mean"))
        rng = np.random.default_rng(1)
        losses = []
        for _ in range(6):
            x = mx.array(rng.standard_normal((8, 12)).astype(np.float32))
            y = mx.array(rng.integers(0, 5, 8).astype(np.int32))
            loss, grads = loss_and_grad(model, x, y)
            opt.update(model, grads)
            mx.eval(loss, model.parameters(), opt.state)
            losses.append(np.asarray(loss).copy())
        params = [np.asarray(v).copy() for _, v in
                  mx.utils.tree_flatten(model.parameters())] if hasattr(mx, "utils") else None
        return losses, params, model

    before = counts()
    plain = train("0")
    assert delta(before) == {"builds": 0, "replays": 0}
    replayed = train("1")
    got = delta(before)
    assert got["builds"] >= 1 and got["replays"] >= 3, got
    for a, b in zip(plain[0], replayed[0]):
        assert a.tobytes() == b.tobytes()
    from lazyx.utils import tree_flatten
    for (_, a), (_, b) in zip(tree_flatten(plain[2].parameters()),
                              tree_flatten(replayed[2].parameters())):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert losses_fall(replayed[0])


def losses_fall(losses):
    return float(losses[-1]) < float(losses[0])


def test_arrays_the_program_still_holds_get_their_values():
    rng = np.random.default_rng(2)
    for _ in range(4):
        a = rng.standard_normal((5,)).astype(np.float32)
        b = rng.standard_normal((5,)).astype(np.float32)
        x, y = mx.array(a), mx.array(b)
        mid = chain(x, y, 6)          # held: must get its value
        later = mid * 3.0             # a lazy consumer outside the evaluated graph
        out = chain(mid, y, 6)
        mx.eval(out)
        want_mid = np_chain(a, b, 6)
        np.testing.assert_allclose(np.asarray(mid), want_mid, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(out), np_chain(want_mid, b, 6), rtol=1e-5,
                                   atol=1e-5)
        np.testing.assert_allclose(np.asarray(later), want_mid * 3, rtol=1e-5, atol=1e-5)
    assert replay.stats["replays"] > 0


def test_parameters_shapes_and_dtypes_are_part_of_the_structure():
    rng = np.random.default_rng(3)
    # (Square matrices: a sum over axis 0 or 1 differs in its parameter alone.)
    cases = [((5, 5), np.float32, 0), ((5, 5), np.float32, 1), ((6, 4), np.float32, 0),
             ((5, 5), np.float16, 0)]
    data = [[(rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype))
             for shape, dtype, _ in cases] for _ in range(3)]

    def run(mode):
        replay.set_mode(mode)
        got = []
        for rnd in data:
            for (shape, dtype, axis), (a, b) in zip(cases, rnd):
                out = mx.sum(chain(mx.array(a), mx.array(b), 8), axis=axis)
                mx.eval(out)
                got.append(np.asarray(out).copy())
        return got
    plain = run("0")
    before = counts()
    got = run("1")
    assert delta(before) == {"builds": len(cases), "replays": len(cases)}
    for g, p in zip(got, plain):
        assert g.dtype == p.dtype and g.shape == p.shape and g.tobytes() == p.tobytes()
    for g, (shape, dtype, axis), (a, b) in zip(got, cases, data[0]):
        assert g.dtype == dtype
        if dtype == np.float32:
            np.testing.assert_allclose(g, np_chain(a, b, 8).sum(axis=axis), rtol=1e-4,
                                       atol=1e-4)


def test_which_leaf_is_read_where_is_part_of_the_structure():
    rng = np.random.default_rng(4)
    a = mx.array(rng.standard_normal(7).astype(np.float32))
    b = mx.array(rng.standard_normal(7).astype(np.float32))
    na, nb = np.asarray(a), np.asarray(b)
    for _ in range(3):
        for x, y, nx, ny in ((a, b, na, nb), (b, a, nb, na), (a, a, na, na)):
            out = chain(x, y)
            mx.eval(out)
            np.testing.assert_allclose(np.asarray(out), np_chain(nx, ny), rtol=1e-5,
                                       atol=1e-5)
        # The same nodes in the same order on the same leaves, wired differently.
        for last in (0, 1):
            out = chain(a, b) * a + (a if last == 0 else b)
            mx.eval(out)
            want = np_chain(na, nb) * na + (na if last == 0 else nb)
            np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)


def test_compiled_calls_inside_are_inlined_with_their_fused_plan():
    @mx.compile
    def act(x):
        return mx.maximum(x, 0.0) * 2.0 + 1.0

    rng = np.random.default_rng(5)
    entries = []
    spy = replay._build

    def build(order, leaves, kept):
        e = spy(order, leaves, kept)
        entries.append(e)
        return e
    replay._build = build
    try:
        for _ in range(3):
            a = rng.standard_normal((3, 3)).astype(np.float32)
            x = mx.array(a)
            for _ in range(10):
                x = act(x) * 0.5 - 1.0
            mx.eval(x)
            want = a
            for _ in range(10):
                want = (np.maximum(want, 0) * 2 + 1) * np.float32(0.5) - 1
            np.testing.assert_allclose(np.asarray(x), want, rtol=1e-5)
    finally:
        replay._build = spy
    assert len(entries) == 1
    assert not any(type(n.prim) is CompiledCall for n in entries[0].tape.nodes)


def test_nothing_is_replayed_inside_a_transform():
    def f(x):
        y = chain(x, x)
        mx.eval(y)  # evaluated while grad retains the graph
        return mx.sum(y)
    before = counts()
    g = mx.grad(f)
    for _ in range(3):
        mx.eval(g(mx.array(np.linspace(-1, 1, 5, dtype=np.float32))))
    # The gradients' own graphs (outside the trace) may be replayed, the eval inside not.
    assert replay.stats["builds"] - before["builds"] <= 1


def test_small_graphs_run_node_by_node():
    before = counts()
    for _ in range(4):
        mx.eval(mx.sin(mx.array([1.0, 2.0])) + 1.0)
    assert delta(before) == {"builds": 0, "replays": 0}


def test_mode_zero_turns_it_off_and_other_modes_are_refused():
    replay.set_mode("0")
    assert scheduler.replay is None
    before = counts()
    for _ in range(3):
        mx.eval(chain(mx.array([1.0, 2.0]), mx.array([3.0, 4.0])))
    assert delta(before) == {"builds": 0, "replays": 0}
    with pytest.raises(ArgumentError, match="replay"):
        replay.set_mode("always")
    assert replay.mode() == "0"
    replay.set_mode("auto")  # the CPU's nodes are not replayed in auto
    with mx.stream(mx.cpu):
        for _ in range(3):
            mx.eval(chain(mx.array([1.0, 2.0]), mx.array([3.0, 4.0])))
    assert delta(before) == {"builds": 0, "replays": 0}


class _WithState(Primitive):
    """A primitive with private state its parameters do not determine."""

    __slots__ = ("_scale",)

    def __init__(self, stream, scale):
        super().__init__(stream)
        self._scale = scale

    def output_shapes(self, inputs):
        return [inputs[0].shape]

    def eval_cpu(self, inputs):
        return inputs[0] * np.float32(self._scale)


class _Derived(_WithState):
    derived_slots = ("_scale",)


def test_primitives_with_private_state_are_not_replayed():
    assert replay._class_info(_WithState) is False
    assert replay._class_info(_Derived) is not False
    from lazyx.array import lazy
    before = counts()
    for scale in (1.0, 2.0, 3.0, 4.0):
        with mx.stream(mx.cpu):
            x = chain(mx.array([0.5, -0.5]), mx.array([1.0, 2.0]), 8)
            y = lazy(x.shape, x.dtype, _WithState(mx.default_stream(mx.cpu), scale), (x,))
            mx.eval(y)
        want = np_chain(np.array([0.5, -0.5]), np.array([1.0, 2.0]), 8) * scale
        np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5)
    assert delta(before) == {"builds": 0, "replays": 0}


def test_the_cache_holds_no_arrays():
    for _ in range(3):
        x = mx.array(np.ones(4, np.float32))
        out = chain(x, x)
        mx.eval(out)
    probe = weakref.ref(x)
    out_probe = weakref.ref(out)
    del x, out
    gc.collect()
    assert probe() is None and out_probe() is None


class _Checked(Primitive):
    """Its input unchanged, or a ValueError at evaluation when an element exceeds 100."""

    __slots__ = ()

    def output_shapes(self, inputs):
        return [inputs[0].shape]

    def eval_cpu(self, inputs):
        x = inputs[0]
        if float(x.max()) > 100:
            raise ValueError("_Checked: an element exceeds 100")
        return x


def test_an_error_in_a_replayed_graph_is_raised_and_the_next_eval_works():
    from lazyx.array import lazy

    def run(scale):
        a = np.linspace(0, 1, 6, dtype=np.float32)
        x = chain(mx.array(a), mx.array(a), 8) * scale
        y = lazy(x.shape, x.dtype, _Checked(mx.default_stream(mx.default_device())), (x,))
        out = y + 1.0
        mx.eval(out)
        return np.asarray(out), np_chain(a, a, 8) * scale + 1
    # (Scales that are no other constant of the graph: equal Python scalars share one
    # array, which would make another structure.)
    for _ in range(3):  # seen, built, replayed
        got, want = run(3.0)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    before = counts()
    with pytest.raises(ValueError, match="exceeds 100"):
        run(1e6)  # the same structure, replayed: the kernel's error comes out of eval
    assert delta(before)["replays"] == 1
    got, want = run(2.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert delta(before)["replays"] == 2


ops = st.sampled_from(["add", "mul", "sin", "neg", "sum0", "t"])


@settings(max_examples=25, deadline=None)
@given(program=st.lists(st.tuples(ops, st.integers(0, 7), st.integers(0, 7)),
                        min_size=18, max_size=30),
       seed=st.integers(0, 100))
def test_random_programs_replay_to_the_numpy_values(program, seed):
    """Random programs of square matrices, each evaluated three times with new data (the
    second builds, the third replays): every held intermediate and the output match
    NumPy each time."""
    rng = np.random.default_rng(seed)

    def run(lib, vals):
        for op, i, j in program:
            a, b = vals[i % len(vals)], vals[j % len(vals)]
            if op == "add":
                vals.append(a + b)
            elif op == "mul":
                vals.append(a * b)
            elif op == "sin":
                vals.append(lib.sin(a))
            elif op == "neg":
                vals.append(-a)
            elif op == "sum0":
                vals.append(lib.sum(a, axis=0, keepdims=True) + b)
            else:
                vals.append(lib.transpose(a) if lib is mx else a.T)
        return vals

    for _ in range(3):
        data = [rng.standard_normal((3, 3)).astype(np.float32) for _ in range(3)]
        got = run(mx, [mx.array(d) for d in data])
        want = run(np, [d.copy() for d in data])
        mx.eval(got[-1], got[len(data) + len(program) // 2])
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(replay._graph is None, reason="the native module is not built")
def test_the_native_walk_matches_the_python_reference():
    """lazyx._graph.structure against replay._python_structure: the same kept outputs
    (multi-output nodes, held intermediates, asked-for arrays) and leaves; keys equal
    exactly when the Python reference's are."""
    from lazyx.scheduler import _order

    def graph(k, hold):
        a = mx.array(np.arange(4, dtype=np.float32) + k)
        b = mx.array(np.ones(4, np.float32))
        q, r = mx.divmod(chain(a, b, 5) + 10.0, b + 1.0)  # a node of two outputs
        held = q * 2.0
        out = chain(held, r, 4) + (q if hold else r)
        return out, (held if hold else None), q

    keys = []
    for k, hold in ((0, True), (1, True), (0, False)):
        out, held, q = graph(k, hold)
        order = _order([out])
        py = replay._python_structure(order, [out])
        nat = replay._native_structure(order, [out])
        assert py is not None and nat is not None
        assert py[2] == list(nat[2])
        assert [id(x) for x in py[1]] == [id(x) for x in nat[1]]
        kept_arrays = {id(order[k]._siblings[j] if order[k]._siblings else order[k])
                       for k, j in py[2]}
        assert id(out) in kept_arrays and id(q) in kept_arrays  # asked; held by q
        assert (id(held) in kept_arrays) == hold
        keys.append((py[0], nat[0]))
        del order
    assert (keys[0][0] == keys[1][0]) and (keys[0][1] == keys[1][1])
    assert (keys[0][0] != keys[2][0]) and (keys[0][1] != keys[2][1])


def test_at_most_max_built_structures_are_kept_built(monkeypatch):
    monkeypatch.setattr(replay, "MAX_BUILT", 2)
    replay.clear()
    before = counts()
    for _ in range(4):
        for n in (6, 7, 8):  # three structures in turn: each evicts the oldest built one
            a = np.linspace(0, 1, 5, dtype=np.float32)
            out = chain(mx.array(a), mx.array(a), n)
            mx.eval(out)
            np.testing.assert_allclose(np.asarray(out), np_chain(a, a, n), rtol=1e-5,
                                       atol=1e-5)
            assert len(replay._built) <= 2
    built = sum(1 for v in replay._cache.values() if v is not replay._SEEN)
    assert built == len(replay._built) == 2
    assert delta(before)["builds"] >= 4  # evicted structures are built again


def test_a_graph_whose_entry_cannot_be_built_runs_node_by_node(monkeypatch):
    def broken(order, leaves, kept):
        raise RuntimeError("cannot build")
    monkeypatch.setattr(replay, "_build", broken)
    replay.clear()
    before = counts()
    a = np.linspace(0, 1, 5, dtype=np.float32)
    for _ in range(4):
        out = chain(mx.array(a), mx.array(a), 8)
        mx.eval(out)
        np.testing.assert_allclose(np.asarray(out), np_chain(a, a, 8), rtol=1e-5, atol=1e-5)
    assert delta(before) == {"builds": 0, "replays": 0}
    assert replay._NO in replay._cache.values()


class _ArrayParam(Primitive):
    """Adds its parameter ``other`` (an array: no key of a structure) to its input."""

    __slots__ = ("other",)

    def output_shapes(self, inputs):
        return [inputs[0].shape]

    def eval_cpu(self, inputs):
        return inputs[0] + np.asarray(self.other)


class _Unset(Primitive):
    """A parameter slot never set: reading the parameters raises."""

    __slots__ = ("scale",)

    def __init__(self, stream):
        self.stream = stream

    def output_shapes(self, inputs):
        return [inputs[0].shape]

    def eval_cpu(self, inputs):
        return inputs[0] * np.float32(2.0)


@pytest.mark.parametrize("walk", ["native", "python"])
@pytest.mark.parametrize("kind", ["array parameter", "unreadable parameter"])
def test_nodes_whose_parameters_are_no_key_run_node_by_node(walk, kind, monkeypatch):
    if walk == "native" and replay._graph is None:
        pytest.skip("the native module is not built")
    monkeypatch.setattr(replay, "_structure", replay._native_structure if walk == "native"
                        else replay._python_structure)
    replay.clear()
    from lazyx.array import lazy
    a = np.linspace(0, 1, 5, dtype=np.float32)
    before = counts()
    with mx.stream(mx.cpu):
        for k in range(4):
            x = chain(mx.array(a), mx.array(a), 8)
            if kind == "array parameter":
                other = mx.array(np.full(5, float(k), np.float32))
                mx.eval(other)
                y = lazy(x.shape, x.dtype, _ArrayParam(mx.default_stream(mx.cpu), other), (x,))
                want = np_chain(a, a, 8) + k
            else:
                y = lazy(x.shape, x.dtype, _Unset(mx.default_stream(mx.cpu)), (x,))
                want = np_chain(a, a, 8) * 2
            mx.eval(y)
            np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5)
    assert delta(before) == {"builds": 0, "replays": 0}
    if kind == "array parameter":  # the structures remembered do not keep it alive
        probe = weakref.ref(other)
        del other, y
        gc.collect()
        assert probe() is None
