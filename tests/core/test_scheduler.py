"""Laziness, the scheduler's walk, detaching and freeing, kernel output checks."""

import gc
import weakref

import numpy as np
import pytest

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
