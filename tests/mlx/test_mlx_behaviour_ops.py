"""MLX's op-level behaviour, call for call (issue 13, item 7): masked assignment, in-place
operators, dtype text and limits, ``__format__`` and ``repr``, complex inputs, error types
and ``random.randint``'s numbers. Each case runs on lazyx and on MLX 0.32.2 through
:func:`mlx_compat.same`; the deliberate differences are asserted as such at the end."""

from __future__ import annotations

import operator

import numpy as np
import pytest

import lazyx.core as lx
from mlx_compat import mlx, requires_mlx, same

pytestmark = requires_mlx


def _text(x) -> str:
    return str(x).replace("mlx.core.", "").replace("lazyx.core.", "")


# -- boolean masks -----------------------------------------------------------------
def _masked(a_shape, mask, value_shape):
    def run(m):
        a = m.arange(int(np.prod(a_shape))).reshape(a_shape)
        v = 100 if value_shape is None else (
            m.arange(int(np.prod(value_shape))) + 100).reshape(value_shape)
        a[m.array(np.array(mask, dtype=bool))] = v
        return a
    return run


@pytest.mark.parametrize("a_shape,mask,value_shape", [
    ((4,), [1, 0, 1, 0], None), ((4,), [1, 0, 1, 0], ()), ((4,), [1, 0, 1, 0], (3,)),
    ((4,), [1, 0, 1, 0], (2, 2)), ((2, 3), [1, 0], (3,)), ((2, 3), [1, 1], (3,)),
    ((2, 3), [1, 1], (2, 1)), ((2, 3), [1, 0], (5, 3)), ((2, 3), [1, 0], (6,)),
    ((2, 3), [1, 1], (1, 2, 3)), ((2, 3, 2), [[1, 0, 1], [0, 0, 1]], (3, 2)),
    ((2, 3, 2), [[1, 0, 1], [0, 0, 1]], (2,)), ((2, 3, 2), [[1, 0, 1], [0, 0, 1]], (3, 1)),
    ((2, 3), [1, 0, 1], None), ((2, 2), [[1], [0]], None), ((0, 3), np.zeros(0), (3,)),
], ids=str)
def test_masked_assignment(a_shape, mask, value_shape):
    same(_masked(a_shape, mask, value_shape))


@pytest.mark.parametrize("key", [[True, False, True, False], np.array([True, False, True, False]),
                                 True, "scalar"], ids=["list", "numpy", "bool", "0-d"])
def test_masked_assignment_keys(key):
    def run(m):
        a = m.array([1.5, 2, 3, 4])
        a[m.array(True) if key == "scalar" else key] = 7
        return a
    same(run)


def test_masked_reads_are_refused_as_in_mlx():
    same(lambda m: m.array([1, 2, 3])[m.array([True, False, True])])
    same(lambda m: m.array([[1, 2], [3, 4]])[m.array([[True, False], [True, True]])])


# -- in-place operators --------------------------------------------------------------
_IOPS = ["iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "iand", "ior",
         "ixor", "ilshift", "irshift"]
_LEFT = {"int32": lambda m: m.array([5, 6, 7]), "float32": lambda m: m.array([5.0, 6, 7]),
         "bool": lambda m: m.array([True, False, True]),
         "uint8": lambda m: m.array([5, 6, 7], dtype=m.uint8)}
_RIGHT = {"int": lambda m: 2, "float": lambda m: 1.5, "int64": lambda m: m.array([2, 2, 2], m.int64),
          "float32": lambda m: m.array([2.0, 2, 2]), "row": lambda m: m.array([[1], [2]])}


@pytest.mark.parametrize("left", list(_LEFT))
@pytest.mark.parametrize("right", list(_RIGHT))
@pytest.mark.parametrize("op", _IOPS)
def test_in_place_operators(op, left, right):
    def run(m):
        a = _LEFT[left](m)
        alias = a
        out = getattr(operator, op)(a, _RIGHT[right](m))
        assert out is alias  # the object itself is updated, as in MLX
        return out
    same(run)


def test_in_place_matmul_and_earlier_consumers():
    def run(m):
        a = m.array([[1.0, 2], [3, 4]])
        before = a * 1
        a @= m.array([[1.0, 0, 1], [0, 1, 1]])
        a += a
        return a, before
    same(run)


def test_in_place_operators_under_transforms():
    def f(x):
        y = x * 1
        y += x
        y *= x
        y **= 2
        return y.sum()

    def g(x):
        x += 1
        return x * x
    same(lambda m: m.grad(f)(m.array([1.0, 2.0])))
    same(lambda m: m.compile(f)(m.array([1.0, 2.0])))
    same(lambda m: m.value_and_grad(lambda x: g(x).sum())(m.array([1.0, 2.0])))
    same(lambda m: [m.compile(g)(x := m.array([1.0, 2.0])), x])  # the input is unchanged


# -- dtypes, limits, text ---------------------------------------------------------------
def test_dtype_text():
    for name in ["bool_", "uint8", "int64", "float16", "bfloat16", "complex64", "float64"]:
        assert _text(getattr(lx, name)) == _text(getattr(mlx, name))
        assert _text(repr(getattr(lx, name))) == _text(repr(getattr(mlx, name)))
    for name in ["floating", "integer", "signedinteger", "complexfloating", "generic"]:
        assert repr(getattr(lx, name)) == repr(getattr(mlx, name))


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32", "float64", "complex64"])
def test_finfo(name):
    f, g = lx.finfo(getattr(lx, name)), mlx.finfo(getattr(mlx, name))
    assert repr(f) == repr(g)
    for attr in ("min", "max", "eps", "smallest_normal", "bits"):
        assert getattr(f, attr) == getattr(g, attr), attr
    assert _text(f.dtype) == _text(g.dtype)


@pytest.mark.parametrize("name", ["uint8", "int16", "uint32", "int64", "uint64"])
def test_iinfo(name):
    f, g = lx.iinfo(getattr(lx, name)), mlx.iinfo(getattr(mlx, name))
    assert (repr(f), f.min, f.max) == (repr(g), g.min, g.max)


@pytest.mark.parametrize("call", [
    lambda m: m.finfo(m.int32), lambda m: m.iinfo(m.bool_), lambda m: m.iinfo(m.float32),
    lambda m: m.finfo(m.array([1.0])),
    lambda m: m.result_type(m.array([1]), m.float16), lambda m: m.result_type(m.float16, m.int32),
    lambda m: m.result_type(m.array([1]), m.array([1.0])), lambda m: m.result_type(1, 2),
    lambda m: m.result_type(),
    lambda m: m.can_cast(m.array([1.0]), m.float16), lambda m: m.can_cast(m.array([1]), m.float32),
    lambda m: m.can_cast(m.int64, m.float32), lambda m: m.can_cast(m.uint64, m.int64),
    lambda m: m.can_cast(1, m.float32),
])
def test_dtype_functions(call):
    def run(m):
        out = call(m)
        return _text(out) if type(out).__name__ == "Dtype" else out
    same(run)


def test_astype_takes_a_positional_stream():
    same(lambda m: m.array([1, 2]).astype(m.float16, m.cpu))


@pytest.mark.parametrize("value,spec", [(3.14159, ".2f"), (3, "5d"), (2.5, "e"), (True, ""),
                                        (1 + 2j, ".1f"), (1 + 2j, ""), (0.1, "")])
def test_format_of_0d_arrays(value, spec):
    assert format(lx.array(value), spec) == format(mlx.array(value), spec)


def test_format_of_other_arrays():
    assert format(lx.array([1.5, 2])) == format(mlx.array([1.5, 2])).replace("mlx.core.", "")
    same(lambda m: format(m.array([1.5, 2]), ".2f"))


@pytest.mark.parametrize("make", [
    lambda m: m.arange(1001), lambda m: m.arange(7), lambda m: m.arange(6),
    lambda m: m.arange(3000).reshape(3, 1000), lambda m: m.arange(1600).reshape(40, 40),
    lambda m: m.arange(1100).reshape(10, 10, 11), lambda m: m.arange(60).reshape(2, 5, 6),
    lambda m: m.arange(140).reshape(7, 20) / 3, lambda m: m.arange(1100).astype(m.bool_),
    lambda m: m.array([1e-5, 1e10, 3.0, float("nan"), -float("inf")]),
    lambda m: m.array([1 + 2j, 3 - 4.5j]), lambda m: m.arange(8).astype(m.complex64),
    lambda m: m.array([1, 2], dtype=m.bfloat16) / 3, lambda m: m.zeros((2, 0, 3)),
    lambda m: m.zeros((0, 3)), lambda m: m.zeros((2, 2, 0)), lambda m: m.array(0.1),
    lambda m: m.array([-1, 2, -300], dtype=m.int64),
])
def test_repr_summarises_as_mlx(make):
    assert _text(repr(make(lx))) == _text(repr(make(mlx)))


# -- complex inputs, logical operators ------------------------------------------------
_C = [1.5 + 2.7j, -1.2 - 0.5j]


@pytest.mark.parametrize("call", [
    lambda m: m.floor(m.array(_C)), lambda m: m.ceil(m.array(_C)), lambda m: m.erf(m.array(_C)),
    lambda m: m.expm1(m.array(_C)), lambda m: m.remainder(m.array(_C), 2),
    lambda m: m.array(_C) % m.array(_C), lambda m: m.floor_divide(m.array(_C), 2),
    lambda m: m.trunc(m.array(_C)), lambda m: m.erfinv(m.array(_C)),
    lambda m: m.divmod(m.array(_C), m.array(_C)), lambda m: m.round(m.array(_C)),
    lambda m: m.sign(m.array(_C)),
    lambda m: m.logical_and(m.array([1.5, 0.0, float("nan")]), m.array([2.0, 1.0, 1.0])),
    lambda m: m.logical_or(m.array([1.5, 0.0]), 0.0), lambda m: m.logical_not(m.array([1.5, 0.0])),
    lambda m: m.logical_xor(m.array([1.5, 0.0]), m.array([2.0, 0.0])),
    lambda m: m.logical_not(m.array(_C + [0j])),
    lambda m: m.array([1.5]) & m.array([1.0]), lambda m: m.bitwise_invert(m.array([1.5])),
])
def test_complex_and_logical(call):
    same(call)


# -- error types --------------------------------------------------------------------------
@pytest.mark.parametrize("call", [
    lambda m: m.zeros((2**31,)), lambda m: m.ones((2**31, 2)), lambda m: m.full((2**31,), 1),
    lambda m: m.zeros((2**40, 2**40)), lambda m: m.broadcast_to(m.zeros(1), (2**31,)),
    lambda m: m.random.uniform(shape=(2**31,)), lambda m: m.zeros((-1,)),
    lambda m: m.reshape(m.zeros(4), (-2, 2)),
    lambda m: m.array([1, 2]) + 2**40, lambda m: m.array([1, 2], dtype=m.uint8) + 300,
    lambda m: m.array([1, 2])[2**31],
    lambda m: m.arange(0, 10, 0), lambda m: m.arange(2**40), lambda m: m.arange(float("inf")),
    lambda m: m.arange(float("nan")), lambda m: m.arange(0, 1, 1e-12),
    lambda m: m.arange(5, dtype=m.bool_), lambda m: m.arange(10, 0), lambda m: m.arange(-3),
    lambda m: m.arange(0.5, 3.5, 1, dtype=m.int32),
    lambda m: m.searchsorted(m.array([[1, 2], [3, 4]]), m.array([1])),
    lambda m: m.searchsorted(m.array([1, 2, 3]), m.array([1]), side="middle"),
    lambda m: m.searchsorted(m.array(1), m.array([1])),
    lambda m: m.take(m.array([1, 2, 3]), m.array([1.5])), lambda m: m.take(m.array([1, 2, 3]), 5),
    lambda m: m.take(m.array([1, 2, 3]), m.array([0]), axis=3),
    lambda m: m.take(m.array([1, 2, 3]), m.array([True])),
    lambda m: m.kron(m.zeros((0, 2)), m.array([1, 2, 3])), lambda m: m.kron(m.array(2), m.array(3)),
    lambda m: m.put_along_axis(m.array([1, 2, 3]), m.array([0]), m.array([9]), axis=1),
    lambda m: m.put_along_axis(m.array([[1, 2, 3]]), m.array([0]), m.array([9]), axis=0),
    lambda m: m.put_along_axis(m.array([1, 2, 3]), m.array([0]), m.array([9, 8]), axis=0),
    lambda m: m.pad(m.array([1, 2, 3]), -1), lambda m: m.pad(m.array([1, 2, 3]), (1, -1)),
    lambda m: m.pad(m.array([1, 2, 3]), [(1, 2), (3, 4)]),
])
def test_error_types(call):
    same(call)


# -- random ----------------------------------------------------------------------------------
@pytest.mark.parametrize("args,kw", [
    ((0, 10, (8,)), {}), ((-5, 1000, (6,)), {"seed": 3}), ((-100, -3, (50,)), {"seed": 7}),
    ((0, 10, (4,)), {"dtype": "int64"}), ((0, 10, (4,)), {"dtype": "uint8"}),
    ((0, 2, (9,)), {"dtype": "bool_"}), ((-2**31, 2**31 - 1, (100,)), {"seed": 2}),
    ((3, 3, (4,)), {}), ((5, 2, (4,)), {}), ((0.5, 7.9, (10,)), {"seed": 4}),
    ((0, 2**40, (5,)), {"dtype": "int64"}), (("lo", "hi", (4, 3)), {"seed": 5}),
], ids=str)
def test_randint_gives_mlx_numbers(args, kw):
    def run(m):
        k = dict(kw)
        key = m.random.key(k.pop("seed", 0))
        if "dtype" in k:
            k["dtype"] = getattr(m, k["dtype"])
        a = list(args)
        if a[0] == "lo":
            a[:2] = m.array([0, 10, -50]), m.array([5, 20, 50])
        return m.random.randint(*a, key=key, **k)
    same(run)


@pytest.mark.parametrize("call", [
    lambda m: m.random.bernoulli(1, (3,), key=m.random.key(0)),
    lambda m: m.random.bernoulli(m.array([0, 1]), key=m.random.key(0)),
    lambda m: m.random.bernoulli(0.5, (4,), key=m.random.key(0)),
    lambda m: m.random.categorical(m.zeros((2, 5)), num_samples=3, key=m.random.key(0)).shape,
    lambda m: m.random.categorical(m.zeros((2, 5)), shape=(4, 2), key=m.random.key(0)).shape,
    lambda m: m.random.categorical(m.zeros((2, 5)), axis=0, num_samples=3, key=m.random.key(0)).shape,
    lambda m: m.random.categorical(m.zeros((2, 5)), shape=(4, 2), num_samples=3, key=m.random.key(0)),
    lambda m: m.random.categorical(m.zeros((2, 5)), shape=(3,), key=m.random.key(0)),
    lambda m: m.random.categorical(m.zeros((5,)), key=m.random.key(0)).shape,
    lambda m: m.random.categorical(m.zeros((2, 3, 5)), axis=1, num_samples=4, key=m.random.key(0)),
    lambda m: m.random.multivariate_normal(m.zeros(2), m.eye(2), key=m.random.key(0)),
    lambda m: m.random.multivariate_normal(m.zeros(2), m.eye(2), dtype=m.float64, key=m.random.key(0),
                                           stream=m.cpu),
    lambda m: m.random.multivariate_normal(m.zeros(2, dtype=m.float64), m.eye(2, dtype=m.float64),
                                           key=m.random.key(0), stream=m.cpu),
    lambda m: m.random.multivariate_normal(m.zeros(2), m.eye(2), dtype=m.float16, key=m.random.key(0),
                                           stream=m.cpu),
    lambda m: m.random.multivariate_normal(m.zeros(2), m.eye(2), shape=(3,), key=m.random.key(0),
                                           stream=m.cpu),
])
def test_random_shapes_dtypes_errors(call):
    # float64 samples: MLX rounds the normal draws to float32 first (a 1e-7 difference).
    same(call, rtol=2e-6)


# -- deliberate differences (the lead lists them in docs/mlx-differences.md) -------------------
def test_deliberate_differences():
    # Gather and ScatterAxis indices out of range: MLX reads/writes out of bounds silently;
    # lazyx raises at evaluation.
    with pytest.raises(IndexError):
        lx.eval(lx.take(lx.array([1, 2, 3]), lx.array([5])))
    # A masked assignment with too few value rows: MLX a RuntimeError at evaluation, lazyx the
    # gather's IndexError (at evaluation too).
    a = lx.array([1, 2, 3, 4])
    a[lx.array([True, False, True, False])] = lx.array([9])
    with pytest.raises(IndexError):
        lx.eval(a)
    # A boolean mask inside a tuple key: MLX raises SystemError (an untranslated C++ error).
    b = lx.zeros((2, 2))
    with pytest.raises(ValueError, match="Boolean"):
        b[:, lx.array([True, False])] = 1
    # Python ints beyond int64: MLX a RuntimeError ("std::bad_cast"), lazyx an error naming
    # the value that is a ValueError and a TypeError.
    with pytest.raises(ValueError):
        lx.array(2**64)
    # Bitwise functions on floats: MLX a RuntimeError (the operators a ValueError); lazyx
    # a ValueError for both.
    with pytest.raises(ValueError):
        lx.bitwise_and(lx.array([1.5]), lx.array([1.5]))
    # finfo/iinfo/can_cast also take dtype names and NumPy dtypes (lazyx's dtype arguments).
    assert lx.finfo("float32").max == lx.finfo(lx.float32).max
