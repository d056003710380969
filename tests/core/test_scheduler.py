"""Laziness, the scheduler's walk, detaching and freeing, kernel output checks.

Every test runs twice: with the scheduler's native walk and loop (lazyx._graph,
framework/native/graph.cpp) and with their Python reference versions."""

import gc
import weakref

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lazyx.core as mx
from lazyx.array import lazy, lazy_multi
from lazyx.errors import KernelNotFoundError, KernelOutputError
from lazyx.primitive import Primitive


class Counting(Primitive):
    """x + 1, counting its runs."""

    __slots__ = ()
    runs = 0

    def eval_cpu(self, inputs):
        Counting.runs += 1
        return inputs[0] + np.asarray(1, inputs[0].dtype)

    def output_shapes(self, inputs):
        return [inputs[0].shape]


def counting(x):
    return lazy(x.shape, x.dtype, Counting(mx.default_stream(mx.cpu)), (x,))


@pytest.fixture(autouse=True, params=["native", "python"])
def loop(request, monkeypatch):
    """The scheduler's walk and loop: native (as installed) or the Python reference."""
    from lazyx import scheduler
    if request.param == "python":
        monkeypatch.setattr(scheduler, "_native", None)
        monkeypatch.setattr(scheduler, "_order", scheduler.unevaluated_order)
    elif scheduler._native is None:
        pytest.skip("lazyx._graph is not built (a source checkout): the Python loop only")
    return request.param


@pytest.fixture(autouse=True)
def reset_counter():
    Counting.runs = 0


def test_nothing_runs_before_evaluation():
    x = mx.array([1.0, 2.0])
    y = counting(counting(x))
    assert Counting.runs == 0 and y._data is None
    mx.eval(y)
    assert Counting.runs == 2
    mx.eval(y)
    assert Counting.runs == 2
    assert y.tolist() == [3.0, 4.0]


def test_shared_node_runs_once():
    x = mx.array([1.0])
    shared = counting(x)
    a, b = counting(shared), counting(shared)
    mx.eval(a + b, a, [b, {"c": shared}])
    assert Counting.runs == 3


def test_eval_accepts_trees_and_plain_values():
    x = mx.array([1.0])
    t = {"a": [counting(x), (counting(x),)], "b": 3, "c": None, "d": "text"}
    mx.eval(t)
    assert Counting.runs == 2
    assert t["a"][0]._data is not None and t["a"][1][0]._data is not None
    mx.async_eval(counting(x))
    assert Counting.runs == 3


def test_long_chain_is_iterative():
    y = x = mx.array([0.0])
    for _ in range(200_000):
        y = counting(y)
    mx.eval(y)
    assert y.item() == 200_000 and Counting.runs == 200_000


def test_evaluated_nodes_are_detached():
    x = mx.array([1.0])
    y = counting(x)
    mx.eval(y)
    assert y._prim is None and y._inputs is None


def test_intermediates_are_freed_during_evaluation():
    big = 1 << 18
    alive = []

    class Probe(Primitive):
        __slots__ = ()

        def eval_cpu(self, inputs):
            alive.append(sum(r() is not None and r()._data is not None for r in refs))
            return inputs[0] + 1

        def output_shapes(self, inputs):
            return [inputs[0].shape]

    y = mx.array(np.zeros(big, np.float32))
    refs = []
    for _ in range(30):
        y = lazy(y.shape, y.dtype, Probe(mx.default_stream(mx.cpu)), (y,))
        refs.append(weakref.ref(y))
    mx.eval(y)
    # Of the evaluated nodes, only the input of the node running is still alive.
    assert len(alive) == 30 and max(alive) <= 1, alive
    del y
    gc.collect()
    assert all(r() is None for r in refs)


def test_unreferenced_intermediate_is_freed_after_eval():
    x = mx.array([1.0])
    b = counting(x)
    wb = weakref.ref(b)
    c = counting(b)
    del b
    mx.eval(c)
    assert wb() is None


class Split2(Primitive):
    """Two outputs: x + 1 and x * 2."""

    __slots__ = ()
    runs = 0

    def eval_cpu(self, inputs):
        Split2.runs += 1
        return inputs[0] + 1, inputs[0] * 2

    def output_shapes(self, inputs):
        return [inputs[0].shape, inputs[0].shape]


def test_multi_output_siblings_run_once():
    Split2.runs = 0
    x = mx.array([1.0, 2.0])
    a, b = lazy_multi([x.shape, x.shape], [x.dtype, x.dtype], Split2(mx.default_stream(mx.cpu)), (x,))
    assert a._siblings == (a, b)
    mx.eval(a)
    assert b._data is not None and Split2.runs == 1
    assert a.tolist() == [2.0, 3.0] and b.tolist() == [2.0, 4.0]
    c, d = lazy_multi([x.shape, x.shape], [x.dtype, x.dtype], Split2(mx.default_stream(mx.cpu)), (x,))
    mx.eval(c + d, d)
    assert Split2.runs == 2 and (c + d).tolist() == [4.0, 7.0]


class WrongShape(Primitive):
    __slots__ = ()

    def eval_cpu(self, inputs):
        return np.zeros((7,), inputs[0].dtype)

    def output_shapes(self, inputs):
        return [inputs[0].shape]


class WrongDtype(WrongShape):
    __slots__ = ()

    def eval_cpu(self, inputs):
        return inputs[0].astype(np.float64)


@pytest.mark.parametrize("cls", [WrongShape, WrongDtype])
def test_bad_kernel_output_is_reported_and_harmless(cls):
    x = mx.array([1.0, 2.0])
    good = counting(x)
    bad = lazy(x.shape, x.dtype, cls(mx.default_stream(mx.cpu)), (good,))
    with pytest.raises(KernelOutputError, match=cls.__name__):
        mx.eval(bad)
    assert bad._data is None
    assert good.tolist() == [2.0, 3.0] and x.tolist() == [1.0, 2.0]
    with pytest.raises(KernelOutputError):
        bad.tolist()


class NoKernel(Primitive):
    __slots__ = ()

    def output_shapes(self, inputs):
        return [inputs[0].shape]


def test_missing_kernel_names_primitive_device_backend():
    x = mx.array([1.0])
    y = lazy(x.shape, x.dtype, NoKernel(mx.default_stream(mx.cpu)), (x,))
    with pytest.raises(KernelNotFoundError, match=r"NoKernel.*cpu.*'cpu'"):
        mx.eval(y)
    with mx.use_backend("cpu", "cpu-reference"):
        with pytest.raises(KernelNotFoundError, match="cpu-reference"):
            mx.eval(y)
    assert x.tolist() == [1.0]


def test_missing_transform_rules_name_the_primitive():
    from lazyx.errors import TransformError
    p = NoKernel(mx.default_stream(mx.cpu))
    for call in (lambda: p.vjp([], [], [], []), lambda: p.jvp([], [], []), lambda: p.vmap([], [])):
        with pytest.raises(TransformError, match="NoKernel"):
            call()
    with pytest.raises(TransformError, match="output_shapes"):
        Primitive(mx.default_stream(mx.cpu)).output_shapes([])


def test_primitive_params_and_equivalence():
    from lazyx.plugins.elementwise import AsType, Add
    s = mx.default_stream(mx.cpu)
    assert AsType(s, mx.int8).is_equivalent(AsType(s, mx.int8))
    assert not AsType(s, mx.int8).is_equivalent(AsType(s, mx.int16))
    assert not AsType(s, mx.int8).is_equivalent(Add(s))
    assert AsType(s, mx.int8).params() == (mx.int8,)
    assert repr(AsType(s, mx.int8)) == "AsType(dtype=lazyx.core.int8)"
    assert Add.name == "Add"


class Raising(Primitive):
    __slots__ = ()

    def eval_cpu(self, inputs):
        raise ValueError("kernel refused")

    def output_shapes(self, inputs):
        return [inputs[0].shape]


class Exhausting(Raising):
    __slots__ = ()

    def eval_cpu(self, inputs):
        raise MemoryError("no room")


def test_kernel_exception_propagates_and_leaves_the_rest_valid():
    x = mx.array([1.0, 2.0])
    good = counting(x)
    bad = lazy(x.shape, x.dtype, Raising(mx.default_stream(mx.cpu)), (good,))
    after = counting(bad)
    with pytest.raises(ValueError, match="kernel refused"):
        mx.eval(after)
    assert good.tolist() == [2.0, 3.0] and bad._data is None and after._data is None
    assert bad._prim is not None  # still a node: evaluating it again raises again
    with pytest.raises(ValueError):
        bad.tolist()


def test_kernel_memory_error_names_the_node():
    from lazyx.errors import OutOfMemoryError
    x = mx.array(np.zeros((3, 4), np.float32))
    y = lazy(x.shape, x.dtype, Exhausting(mx.default_stream(mx.cpu)), (counting(x),))
    with pytest.raises(OutOfMemoryError, match=r"Exhausting.*\(3, 4\).*no room"):
        mx.eval(y)


def test_retained_graph_under_grad():
    x = mx.array([0.5, 1.5, 2.0])
    f = lambda v: mx.sum(mx.exp(v) * v + mx.sin(v))  # noqa: E731
    g = mx.grad(f)(x)
    xv = np.array([0.5, 1.5, 2.0])
    np.testing.assert_allclose(np.asarray(g), np.exp(xv) * (xv + 1) + np.cos(xv), rtol=1e-5)


def test_small_ufunc_kernels_give_numpy_results():
    a = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    b = np.linspace(0.5, 3, 4, dtype=np.float32)
    x, y = mx.array(a), mx.array(b)
    np.testing.assert_allclose(np.asarray(x * y + x), a * b + a, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(mx.exp(x)), np.exp(a), rtol=1e-6)
    with mx.use_backend("cpu", "cpu-reference"):
        np.testing.assert_allclose(np.asarray(x - y), a - b, rtol=1e-6)
    big = np.linspace(0, 1, 1 << 17, dtype=np.float32)  # above the generated kernels' limit
    np.testing.assert_allclose(np.asarray(mx.array(big) * 3 + 1), big * 3 + 1, rtol=1e-6)


class InPlace(Primitive):
    """x + 1, written into the input's buffer when the scheduler offers it (donors)."""

    __slots__ = ()
    offered: list = []

    def eval_cpu(self, inputs, donors=()):
        InPlace.offered.append(tuple(donors))
        x = inputs[0]
        if 0 in donors:
            x += np.asarray(1, x.dtype)
            return x
        return x + np.asarray(1, x.dtype)
    eval_cpu.donates = True

    def output_shapes(self, inputs):
        return [inputs[0].shape]


def inplace(x):
    return lazy(x.shape, x.dtype, InPlace(mx.default_stream(mx.cpu)), (x,))


def test_kernels_that_take_donors_get_the_inputs_nothing_else_reads(loop):
    from lazyx import scheduler
    dead = (0,) if loop == "native" else ()  # the Python loop offers none
    x = mx.array([1.0, 2.0])
    InPlace.offered = []
    y = inplace(counting(x))  # the intermediate is read by y alone
    assert y.tolist() == [3.0, 4.0] and InPlace.offered == [dead]
    assert x.tolist() == [1.0, 2.0]  # an array the caller holds is never offered
    InPlace.offered = []
    assert inplace(x).tolist() == [2.0, 3.0] and x.tolist() == [1.0, 2.0]
    t = counting(x)  # held by the caller: not offered, its value stays
    y = inplace(t)
    assert y.tolist() == [3.0, 4.0] and t.tolist() == [2.0, 3.0]
    t = counting(x)
    u = inplace(t)
    z = u + t  # read by two nodes
    del t
    assert z.tolist() == [5.0, 7.0]
    w = inplace(inplace(counting(x)))  # a chain: each intermediate dead once read
    mx.eval(w)
    assert w.tolist() == [4.0, 5.0]
    assert InPlace.offered == [(), (), (), dead, dead]
    InPlace.offered = []
    with scheduler.retain_graph:  # a transform retaining the graph: nothing is offered
        v = inplace(counting(x))
        mx.eval(v)
    assert v.tolist() == [3.0, 4.0] and InPlace.offered == [()]
    m = counting(x)
    mx.eval(m)
    y = inplace(m * 1)
    del m
    assert y.tolist() == [3.0, 4.0]


def test_node_inputs_may_be_a_list():
    x = mx.array([1.0, 2.0])
    y = lazy(x.shape, x.dtype, Counting(mx.default_stream(mx.cpu)), [x])
    assert y.tolist() == [2.0, 3.0]


def test_native_and_python_build_the_same_nodes(loop):
    from lazyx import array as array_module
    from lazyx.plugins.elementwise import Add
    if array_module.native is None:
        pytest.skip("lazyx._graph is not built")
    s = mx.default_stream(mx.cpu)
    x = mx.array([1.0, 2.0])
    for make in (lambda: array_module.native.lazy((2,), x.dtype, Add(s), (x, x)),
                 lambda: array_module.native.node(Add, s, (2,), x.dtype, (x, x)),
                 lambda: array_module.py_lazy((2,), x.dtype, Add(s), (x, x))):
        y = make()
        assert type(y) is mx.array and type(y._prim) is Add and y._prim.stream is s
        assert y._inputs == (x, x) and y._data is None and y._siblings is None
        assert y.shape == (2,) and y.dtype == mx.float32 and y.tolist() == [2.0, 4.0]
    with pytest.raises(TypeError, match="node"):
        array_module.native.node(int, s, (2,), x.dtype, (x,))
    bad = array_module.native.lazy((2,), x.dtype, Add(s), (x, np.ones(2)))
    with pytest.raises(TypeError if loop == "native" else AttributeError,
                       match="not a lazyx array" if loop == "native" else "_data"):
        mx.eval(bad)


def _random_graph(draw_ops, seed):
    """A random DAG of element-wise ops and two-output nodes over three leaves."""
    rng = np.random.default_rng(seed)
    leaves = [mx.array(rng.uniform(0.5, 1.5, 4).astype(np.float32)) for _ in range(3)]
    ref = [np.asarray(v).astype(np.float64) for v in leaves]
    nodes, vals = list(leaves), list(ref)
    for op in draw_ops:
        i, j = rng.integers(0, len(nodes), 2)
        if op == 0:
            nodes.append(nodes[i] + nodes[j]); vals.append(vals[i] + vals[j])
        elif op == 1:
            nodes.append(nodes[i] * 0.5); vals.append(vals[i] * 0.5)
        else:
            a, b = lazy_multi([(4,), (4,)], [mx.float32, mx.float32],
                              Split2(mx.default_stream(mx.cpu)), (nodes[i],))
            nodes += [a, b]; vals += [vals[i] + 1, vals[i] * 2]
    return nodes, vals


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=1, max_size=30), st.integers(0, 2**31))
def test_walk_order_and_values_match_the_reference(ops, seed):
    from lazyx import scheduler
    nodes, vals = _random_graph(ops, seed)
    roots = nodes[-3:]
    if scheduler._native is not None:
        assert scheduler._native.unevaluated_order(roots) == scheduler.unevaluated_order(roots)
    mx.eval(roots)
    for n, v in zip(nodes, vals):
        np.testing.assert_allclose(np.asarray(n), v, rtol=1e-5)


def test_device_buffer_types_are_remembered_until_the_backends_change():
    from lazyx import backend as registry

    class Buffer(np.ndarray):
        pass

    class Accepting(registry.Backend):
        name = "test-buffer-types"

        def is_buffer(self, obj):
            return type(obj) is Buffer

    buf = np.zeros(3).view(Buffer)
    assert not registry.is_device_buffer(buf)
    assert Buffer not in registry._buffer_types
    registry._backends["test-buffer-types"] = Accepting()
    registry.invalidate_dispatch()
    try:
        assert registry.is_device_buffer(buf)
        assert Buffer in registry._buffer_types      # remembered by type
        assert registry.is_device_buffer(np.zeros(2).view(Buffer))
    finally:
        del registry._backends["test-buffer-types"]
        registry.invalidate_dispatch()
    assert Buffer not in registry._buffer_types
    assert not registry.is_device_buffer(buf)
