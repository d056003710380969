"""Array operators and element-wise methods: both operand orders, MLX's weak typing of
Python scalars, comparisons and hashing, in-place operators, methods and properties."""

import operator

import numpy as np
import pytest

import lazyx.core as mx
from helpers import ALL_DTYPES, assert_close, random_array, rng, to_lazyx
from lazyx.errors import DtypeError, ShapeError

ids = lambda d: d.name  # noqa: E731

def _mlx_remainder(a, b):
    # MLX keeps a % 0 == a for integers.
    r = np.remainder(a, b)
    if np.asarray(a).dtype.kind in "biu" and np.asarray(b).dtype.kind in "biu":
        return np.where(np.equal(b, 0), a, r).astype(r.dtype)
    return r


# operator: (Python operator, NumPy reference, accepted kinds)
BINARY = {
    "+": (operator.add, np.add, "buifc"),
    "-": (operator.sub, np.subtract, "uifc"),
    "*": (operator.mul, np.multiply, "buifc"),
    "/": (operator.truediv, np.true_divide, "uifc"),
    "//": (operator.floordiv, np.floor_divide, "uif"),
    "%": (operator.mod, _mlx_remainder, "uif"),
    "**": (operator.pow, np.power, "uifc"),
    "==": (operator.eq, np.equal, "buifc"),
    "!=": (operator.ne, np.not_equal, "buifc"),
    "<": (operator.lt, np.less, "buif"),
    "<=": (operator.le, np.less_equal, "buif"),
    ">": (operator.gt, np.greater, "buif"),
    ">=": (operator.ge, np.greater_equal, "buif"),
    "&": (operator.and_, np.bitwise_and, "bui"),
    "|": (operator.or_, np.bitwise_or, "bui"),
    "^": (operator.xor, np.bitwise_xor, "bui"),
    "<<": (operator.lshift, np.left_shift, "ui"),
    ">>": (operator.rshift, np.right_shift, "ui"),
}


def _operands(d, g):
    a = random_array((3, 4), d, g, 1, 5)
    b = random_array((4,), d, g, 1, 3)
    return a, b


@pytest.mark.parametrize("sym,d", [(s, d) for s in BINARY for d in ALL_DTYPES
                                   if d.kind in BINARY[s][2]],
                         ids=lambda v: getattr(v, "name", v))
def test_binary_operators_both_orders(sym, d):
    op, ref, _ = BINARY[sym]
    a, b = _operands(d, rng(2))
    la, lb = to_lazyx(a), to_lazyx(b)
    with np.errstate(all="ignore"):
        for x, y, lx, ly in ((a, b, la, lb), (b, a, lb, la)):
            out = op(lx, ly)
            assert isinstance(out, mx.array)
            expected = ref(x, y)
            assert_close(out, expected, msg=f"{sym} {d.name}")


@pytest.mark.parametrize("sym", ["+", "-", "*", "/", "//", "%", "**", "<", "==", "&", "<<"])
def test_scalar_on_either_side(sym):
    op, ref, _ = BINARY[sym]
    a = np.array([1, 2, 3], np.int32)
    la = to_lazyx(a)
    for s in (2, True):
        with np.errstate(all="ignore"):
            assert_close(op(la, s), ref(a, s), msg=f"a {sym} {s}")
            assert_close(op(s, la), ref(s, a), msg=f"{s} {sym} a")


def test_divmod_operator():
    a = to_lazyx(np.array([7, -7], np.int32))
    q, r = divmod(a, 2)
    assert q.tolist() == [3, -4] and r.tolist() == [1, 1]
    q, r = divmod(7, to_lazyx(np.array([2, -2], np.int32)))
    assert q.tolist() == [3, -4] and r.tolist() == [1, -1]


# (array dtype, Python scalar) -> result dtype of +, as MLX gives it.
WEAK = [
    (mx.int8, 1, mx.int8), (mx.int8, 1.5, mx.float32), (mx.int8, 1j, mx.complex64),
    (mx.int8, True, mx.int8), (mx.uint8, 3, mx.uint8), (mx.uint32, 1, mx.uint32),
    (mx.uint64, 2, mx.uint64), (mx.int64, 1.5, mx.float32), (mx.float16, 2.0, mx.float16),
    (mx.float16, 2, mx.float16), (mx.bfloat16, 1, mx.bfloat16),
    (mx.bfloat16, 2.5, mx.bfloat16), (mx.float64, 1.5, mx.float64),
    (mx.float64, 1j, mx.complex64), (mx.bool_, 1, mx.int32), (mx.bool_, True, mx.bool_),
    (mx.bool_, 1.5, mx.float32), (mx.complex64, 2, mx.complex64),
]


@pytest.mark.parametrize("d,scalar,expected", WEAK, ids=lambda v: getattr(v, "name", repr(v)))
def test_weak_scalar_typing(d, scalar, expected):
    a = to_lazyx(random_array((3,), d, rng(4), 0, 3))
    for out in (a + scalar, scalar + a, a * scalar, scalar - a if d.kind != "b" else a + scalar):
        assert out.dtype is expected
    np_a = np.array(a).astype(np.complex128 if expected.kind == "c" else np.float64)
    assert_close(a + scalar, np_a + scalar, expected)
    assert (a < scalar).dtype is mx.bool_
    assert (a / scalar).dtype is (expected if expected.kind in "fc" else mx.float32)


def test_comparisons_give_bool_and_broadcast():
    a = to_lazyx(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = to_lazyx(np.array([0, 4, 2], np.int8))
    for sym in ("==", "!=", "<", "<=", ">", ">="):
        op, ref, _ = BINARY[sym]
        out = op(a, b)
        assert out.dtype is mx.bool_ and out.shape == (2, 3)
        assert_close(out, ref(np.array(a), np.array(b)), mx.bool_, msg=sym)


def test_equality_with_non_arrays_and_hashing():
    a = to_lazyx(np.array([1, 2], np.int32))
    assert (a == None) is False  # noqa: E711
    assert (a != None) is True  # noqa: E711
    assert (a == "a") is False
    assert a in [None, "x", a]
    d = {a: 1}
    b = to_lazyx(np.array([1, 2], np.int32))
    d[b] = 2
    assert d[a] == 1 and d[b] == 2 and len(d) == 2
    assert hash(a) == hash(a) and hash(a) != hash(b)
    assert (a == np.array([1, 3])).tolist() == [True, False]
    with pytest.raises(DtypeError):
        a < None  # noqa: B015


def test_unary_operators():
    a = to_lazyx(np.array([1, -2, 3], np.int8))
    assert (-a).tolist() == [-1, 2, -3]
    assert (+a) is a
    assert abs(a).tolist() == [1, 2, 3]
    assert (~a).tolist() == [-2, 1, -4]
    b = to_lazyx(np.array([True, False]))
    assert (~b).tolist() == [False, True]
    with pytest.raises(DtypeError):
        -b
    with pytest.raises(DtypeError):
        ~to_lazyx(np.array([1.0], np.float32))
    z = to_lazyx(np.array([3 + 4j], np.complex64))
    assert abs(z).dtype is mx.float32 and abs(z).tolist() == [5.0]


def test_bad_dtypes_raise_at_the_call():
    f = to_lazyx(np.array([1.5, 2.5], np.float32))
    for sym in ("&", "|", "^", "<<", ">>"):
        op = BINARY[sym][0]
        with pytest.raises(DtypeError):
            op(f, 1)
        with pytest.raises(DtypeError):
            op(1, f)
    with pytest.raises(DtypeError):
        to_lazyx(np.array([1j], np.complex64)) % 2
    with pytest.raises(ShapeError, match=r"\(2,\).*\(3,\)"):
        f + to_lazyx(np.zeros(3, np.float32))
    assert f.tolist() == [1.5, 2.5]


def test_augmented_assignment_updates_in_place_and_leaves_other_graphs_alone():
    # As in MLX: `a += 1` updates the object `a` (an alias is the same object and sees
    # the new value); a node built earlier from `a` keeps the value it read.
    a = to_lazyx(np.array([1, 2], np.int32))
    alias = a
    doubled = a * 2
    a += 1
    assert a is alias and a.tolist() == [2, 3]
    assert doubled.tolist() == [2, 4]
    a *= 1.5  # the result's dtype, as MLX
    assert a is alias and a.dtype is mx.float32 and a.tolist() == [3.0, 4.5]
    b = to_lazyx(np.array([6, 7], np.int32))
    for fn, expected in [(operator.ixor, [4, 5]), (operator.ilshift, [16, 20]),
                         (operator.irshift, [4, 5]), (operator.ifloordiv, [2, 2]),
                         (operator.ipow, [4, 4]), (operator.ior, [6, 6]),
                         (operator.iand, [2, 2]), (operator.imod, [0, 0])]:
        before = b
        b = fn(b, 2)
        assert b is before and b.tolist() == expected, fn.__name__
    with pytest.raises(ValueError, match="non-floating"):  # MLX refuses /= on integers
        b /= 2
    assert b.tolist() == [0, 0] and b.dtype is mx.int32
    c = to_lazyx(np.array([[1.0], [2.0]], np.float32))
    c += to_lazyx(np.array([1.0, 2.0, 3.0], np.float32))
    assert c.shape == (2, 3)


def test_identity_ops_on_python_values_return_fresh_arrays():
    # Python scalars become cached constants inside binary ops; an op that is the
    # identity for a dtype must not hand such a shared object to the caller.
    two = mx.add(1, 1)
    for fn in (mx.positive, mx.floor, mx.real, mx.conj, mx.round, mx.nan_to_num, mx.abs):
        x = fn(3)
        assert x.tolist() == 3 and x.dtype is mx.int32
        assert fn(3) is not x
    assert mx.array_equal(mx.ones(2), mx.ones(3)) is not mx.array_equal(mx.ones(2), mx.ones(3))
    assert two.tolist() == 2


METHODS = {
    "abs": np.abs, "square": np.square, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "reciprocal": np.reciprocal, "exp": np.exp, "log": np.log, "log1p": np.log1p,
    "log2": np.log2, "log10": np.log10, "sin": np.sin, "cos": np.cos, "round": np.round,
    "conj": np.conj,
}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_methods(name):
    x = random_array((2, 3), mx.float32, rng(6), 0.5, 4)
    out = getattr(to_lazyx(x), name)()
    assert_close(out, METHODS[name](x.astype(np.float64)), mx.float32, msg=name)


def test_method_arguments():
    a = to_lazyx(np.array([1.26, 2.5], np.float32))
    assert_close(a.round(1), np.array([1.3, 2.5]), mx.float32)
    assert_close(a.round(decimals=1), np.array([1.3, 2.5]), mx.float32)
    assert a.astype(mx.int16).dtype is mx.int16
    assert a.exp(stream=mx.cpu).dtype is mx.float32


def test_real_and_imag_properties():
    z = to_lazyx(np.array([1 + 2j, -3 - 4j], np.complex64))
    assert z.real.tolist() == [1.0, -3.0] and z.real.dtype is mx.float32
    assert z.imag.tolist() == [2.0, -4.0]
    i = to_lazyx(np.array([1, 2], np.int8))
    assert i.real is i
    assert i.imag.tolist() == [0, 0] and i.imag.dtype is mx.int8
    with pytest.raises(AttributeError):
        i.real = i


@pytest.mark.parametrize("op,ref", [("iadd", np.add), ("isub", np.subtract), ("imul", np.multiply),
                                    ("itruediv", np.divide), ("ipow", np.power)])
def test_in_place_operators_under_grad_and_compile(op, ref):
    # d/dx sum((x * 1) op= x) against the NumPy float64 derivative by central differences.
    def f(x):
        y = x * 1.0
        y = getattr(operator, op)(y, x)
        return y.sum()
    xs = np.array([0.5, 1.5, 2.5], np.float64)
    eps = 1e-6
    fd = (ref(xs + eps, xs + eps) - ref(xs - eps, xs - eps)) / (2 * eps)
    assert_close(mx.grad(f)(to_lazyx(xs.astype(np.float32))), fd, mx.float32, rtol=1e-3)
    assert_close(mx.compile(f)(to_lazyx(xs.astype(np.float32))), ref(xs, xs).sum(), mx.float32)


def test_in_place_update_of_a_node_read_elsewhere():
    a = to_lazyx(np.array([1.0, 2.0], np.float32))
    pair = [a * 1, a]  # a list entry holds the object: it sees the update (same object)
    a -= 1
    a @= to_lazyx(np.array([[1.0, 0, 2], [0, 1, 3]], np.float32))
    assert pair[1] is a and a.tolist() == [0.0, 1.0, 3.0] and pair[0].tolist() == [1.0, 2.0]
