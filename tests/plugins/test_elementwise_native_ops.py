"""The element-wise op functions' common case in C++ (``ElementwiseOp``,
framework/native/graph.cpp) gives what the Python op function it wraps gives: the same
node (primitive class, stream, shape, dtype, inputs), the same values, the same errors,
in the common case and in every case it hands over (Python scalars, casts,
broadcasting, an explicit stream, bad input)."""

import inspect

import numpy as np
import pytest

import lazyx.core as mx
from lazyx import array as array_module
from lazyx.errors import LazyxError

pytestmark = pytest.mark.skipif(array_module.native is None, reason="lazyx._graph is not built")

BINARY = ["add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "equal",
          "less", "logical_and", "bitwise_and", "floor_divide", "arctan2"]
UNARY = ["exp", "negative", "abs", "sqrt", "sin", "floor", "logical_not", "square", "sign"]


def _operands():
    f = mx.array(np.linspace(0.5, 2.0, 6, dtype=np.float32).reshape(2, 3))
    g = mx.array(np.linspace(1.0, 3.0, 6, dtype=np.float32).reshape(2, 3))
    i = mx.array(np.arange(6, dtype=np.int32).reshape(2, 3) + 1)
    h = mx.array(np.linspace(1.0, 2.0, 3, dtype=np.float16))
    b = mx.array(np.array([[True, False, True], [False, True, True]]))
    bf = mx.array(np.linspace(-1.0, 1.0, 3), dtype=mx.bfloat16)
    lazy_f = f * 1.5  # an unevaluated operand
    # Python floats and ints with a floating array are taken in C++ too (either side), the
    # rest (an int array, a bool, a complex) by the Python function.
    scalars = [(f, 2.0), (2.0, f), (f, 3), (3, f), (h, 0.5), (0.5, h), (bf, 3), (-1.5, bf),
               (f, -0.0), (-0.0, f), (f, 1e40), (lazy_f, 0.25), (i, 0.5), (f, True), (f, 1j),
               (f, float("nan"))]
    return [(f, g), (f, f), (lazy_f, g), (i, i), (b, b), (f, g[0]), (3, i), (f, i),
            (h, h), (f, h), (g, lazy_f)] + scalars


def _same(got, want):
    assert type(got) is type(want)
    if isinstance(got, mx.array):
        assert got.shape == want.shape and got.dtype == want.dtype
        assert (got._prim is None) == (want._prim is None)
        if got._prim is not None:
            assert type(got._prim) is type(want._prim) and got._prim.stream == want._prim.stream
            assert len(got._inputs) == len(want._inputs)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def _outcome(fn, *args, **kw):
    try:
        return fn(*args, **kw), None
    except LazyxError as e:
        return None, (type(e), str(e))


@pytest.mark.parametrize("name", BINARY)
def test_binary_ops_equal_their_python_function(name):
    op = getattr(mx, name)
    assert type(op).__name__ == "ElementwiseOp"
    py = op.__wrapped__
    for a, b in _operands():
        for kw in ({}, {"stream": None}, {"stream": mx.cpu}):
            got, got_err = _outcome(op, a, b, **kw)
            want, want_err = _outcome(py, a, b, **kw)
            assert got_err == want_err, (name, a, b, kw)
            if got_err is None:
                _same(got, want)


@pytest.mark.parametrize("name", UNARY)
def test_unary_ops_equal_their_python_function(name):
    op = getattr(mx, name)
    py = op.__wrapped__
    for a, _ in _operands():
        for kw in ({}, {"stream": None}, {"stream": mx.cpu}):
            got, got_err = _outcome(op, a, **kw)
            want, want_err = _outcome(py, a, **kw)
            assert got_err == want_err, (name, a, kw)
            if got_err is None:
                _same(got, want)


def test_bad_arguments_are_the_python_functions_errors():
    x = mx.array([1.0, 2.0])
    for call in (lambda f: f(x), lambda f: f(x, x, x), lambda f: f(x, x, axis=1),
                 lambda f: f(x, x, stream="tpu")):
        errors = []
        for f in (mx.add, mx.add.__wrapped__):
            try:
                call(f)
                errors.append(None)
            except Exception as e:  # noqa: BLE001 - compared, whatever they are
                errors.append((type(e), str(e)))
        assert errors[0] == errors[1] and errors[0] is not None
    with pytest.raises(LazyxError):
        mx.add(mx.array([1.0, 2.0]), mx.array([1.0, 2.0, 3.0]))


def test_they_behave_as_functions_and_methods():
    x, y = mx.array([1.0, 2.0]), mx.array([3.0, 4.0])
    assert (x * y).tolist() == [3.0, 8.0] and x.__mul__(y).tolist() == [3.0, 8.0]
    assert mx.array.__mul__(x, y).tolist() == [3.0, 8.0] and (2 * x).tolist() == [2.0, 4.0]
    assert mx.multiply.__name__ == "multiply" and "multiplication" in mx.multiply.__doc__
    assert str(inspect.signature(mx.multiply)) == str(inspect.signature(mx.multiply.__wrapped__))
    assert repr(mx.multiply) == repr(mx.multiply.__wrapped__)
    assert callable(mx.exp) and mx.exp(mx.array(0.0)).item() == 1.0
    with mx.stream(mx.cpu):
        z = x + y
    assert z._prim.stream == mx.default_stream(mx.cpu)
    grads = mx.grad(lambda v: mx.sum(mx.exp(v) * v))(x)
    np.testing.assert_allclose(np.asarray(grads), np.exp([1.0, 2.0]) * (np.array([1.0, 2.0]) + 1),
                               rtol=1e-6)


def test_they_pickle_and_copy_as_functions_do():
    import copy
    import pickle
    import lazyx.nn as nn
    for op in (mx.multiply, mx.exp, mx.add, mx.array.__mul__):
        assert pickle.loads(pickle.dumps(op)) is op
        assert copy.copy(op) is op and copy.deepcopy(op) is op

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = mx.tanh  # an op held by a module: deep copies keep it
            self.w = mx.array([0.5, 2.0])

        def __call__(self, x):
            return self.act(x * self.w)

    m = copy.deepcopy(Scaled())
    assert m.act is mx.tanh
    np.testing.assert_allclose(np.asarray(m(mx.array([1.0, 1.0]))), np.tanh([0.5, 2.0]), rtol=1e-6)
