"""The same calls on lazyx and on MLX 0.32.2 over every dtype: element-wise math,
comparisons, bit operations, reductions and scans, shapes, creation, windows, products,
partitions and the random samplers.

Each case is a function name (looked up with ``getattr`` on both libraries) and a call
built from it; :func:`mlx_compat.same` compares the results (shape, dtype, values with a
tolerance by dtype) or the exception types when both refuse. Inputs are small and fixed,
so the whole file runs in seconds. A case that differs on purpose is listed in
``DIFFERENCES`` with its reason and runs as a strict ``xfail``: it fails the day the
difference goes away.
"""

from __future__ import annotations

import numpy as np
import pytest

from mlx_compat import requires_mlx, same

pytestmark = requires_mlx

DTYPES = ["bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "bfloat16", "float32", "complex64"]

_INT_LIKE = ["bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
_LOG_OF_INTS = ("MLX keeps an integer or bool dtype (truncated or saturated values); lazyx "
                "computes in float32, as logsumexp and softmax with an axis do in both")

#: {case id: why lazyx differs from MLX on purpose}; those cases run as strict xfails.
DIFFERENCES: dict[str, str] = {
    **{f"logsumexp-{d}": "MLX 0.32 gives inf for the logsumexp of a whole unsigned array; "
                         "lazyx gives the value" for d in ("uint8", "uint16", "uint32", "uint64")},
    **{f"softmax-{d}": _LOG_OF_INTS + " (MLX: only with axis=None)" for d in _INT_LIKE},
    **{f"logcumsumexp-{d}": _LOG_OF_INTS for d in _INT_LIKE},
    "bitwise_xor-bool_": "MLX 0.32: a bool made by astype from a float may hold a byte other "
                         "than 1, and bitwise_xor of two such True gives True; lazyx gives False",
    "concat-3": "MLX returns a single array unchanged whatever the axis; lazyx checks the "
                "axis as for several arrays (AxisError)",
}

#: The bitwise functions: on float operands MLX raises RuntimeError, lazyx DtypeError
#: (docs/mlx-differences.md: one answer for one mistake); both must refuse.
BITWISE = {"bitwise_or", "bitwise_xor", "bitwise_and", "bitwise_left_shift",
           "bitwise_right_shift", "left_shift", "right_shift"}

_SIGNED = np.array([[-1.5, -0.5, 0.25], [0.75, 2.0, 3.0]], np.float32)
_UNSIGNED = np.array([[0.25, 0.5, 0.75], [1.5, 2.0, 3.0]], np.float32)
_SMALL = np.array([[3.0, 2.0, 1.5], [0.75, 0.5, 0.25]], np.float32)


def _x(m, dtype: str, data=None):
    """A small 2x3 array of ``dtype`` (negative entries where the dtype has them)."""
    if data is None:
        data = _UNSIGNED if dtype.startswith(("uint", "bool")) else _SIGNED
    d = getattr(m, dtype)
    if dtype == "complex64":
        return m.array((data + 0.5j * data[:, ::-1]).astype(np.complex64).copy())
    return m.array(data).astype(d)


def _cases(names, dtypes, call):
    """pytest params ``(name, dtype, call)`` with the differences marked."""
    out = []
    for name in names:
        for d in dtypes:
            cid = f"{name}-{d}"
            marks = [pytest.mark.xfail(strict=True, reason=DIFFERENCES[cid])] \
                if cid in DIFFERENCES else []
            out.append(pytest.param(name, d, call, id=cid, marks=marks))
    return out


# -- element-wise ----------------------------------------------------------------------
UNARY = ["arccos", "arccosh", "arcsin", "arcsinh", "arctan", "arctanh", "acos", "acosh",
         "asin", "asinh", "atan", "atanh", "cos", "cosh", "sinh", "tan", "tanh", "sqrt",
         "rsqrt", "reciprocal", "log10", "log1p", "log2", "sigmoid", "degrees", "radians",
         "negative", "positive", "conjugate", "conj", "imag", "isfinite", "isinf", "isnan",
         "isneginf", "isposinf"]

BINARY = ["arctan2", "atan2", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
          "bitwise_right_shift", "left_shift", "right_shift", "equal", "not_equal",
          "greater", "greater_equal", "less", "less_equal", "logaddexp", "maximum",
          "minimum", "pow", "power", "subtract"]


@pytest.mark.parametrize("name,dtype,call", _cases(UNARY, DTYPES, None))
def test_unary(name, dtype, call):
    same(lambda m: getattr(m, name)(_x(m, dtype)))


@pytest.mark.parametrize("name,dtype,call", _cases(BINARY, DTYPES, None))
def test_binary_same_dtype(name, dtype, call):
    # the second operand small and non-negative: shifts and powers stay defined
    same(lambda m: getattr(m, name)(_x(m, dtype), _x(m, dtype, _SMALL)),
         same_error_type=name not in BITWISE)


_MIXED = [("int32", "float32"), ("uint8", "int8"), ("bool_", "int16"), ("float16", "bfloat16"),
          ("int64", "uint64"), ("float32", "complex64"), ("uint32", "float16")]


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("pair", _MIXED, ids="-".join)
def test_binary_mixed_dtypes_and_scalars(name, pair):
    a, b = pair
    exact = name not in BITWISE
    same(lambda m: getattr(m, name)(_x(m, a), _x(m, b, _UNSIGNED)), same_error_type=exact)
    if name in ("arctan2", "atan2"):
        return  # MLX takes arrays only there: test_arctan2_takes_scalars
    same(lambda m: getattr(m, name)(_x(m, a), 2), same_error_type=exact)
    same(lambda m: getattr(m, name)(2.0, _x(m, b, _UNSIGNED)), same_error_type=exact)


def test_arctan2_takes_scalars():
    # A deliberate difference: MLX's arctan2 refuses Python scalars (TypeError), lazyx's
    # takes them as every other binary function does, with the same promotion.
    from mlx_compat import assert_same, lx, mlx
    for f in ("arctan2", "atan2"):
        got = getattr(lx, f)(lx.array([1.0, -2.0]), 2)
        assert_same(got, mlx.arctan2(mlx.array([1.0, -2.0]), mlx.array(2.0)))
        got = getattr(lx, f)(0.5, lx.array([1, 2], lx.int8))
        assert_same(got, mlx.arctan2(mlx.array(0.5), mlx.array([1, 2], mlx.int8)))


def test_nan_and_inf_handling():
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0], np.float32)
    for name in ("isfinite", "isinf", "isnan", "isneginf", "isposinf", "sqrt", "log1p",
                 "reciprocal", "rsqrt", "sigmoid", "tanh"):
        same(lambda m, name=name: getattr(m, name)(m.array(special)))
    same(lambda m: m.nan_to_num(m.array(special)))
    same(lambda m: m.nan_to_num(m.array(special), nan=1.0, posinf=2.0, neginf=-2.0))
    same(lambda m: m.nan_to_num(m.array(special).astype(m.float16)))
    same(lambda m: m.nan_to_num(m.array([1, 2])))
    same(lambda m: m.logaddexp(m.array(special), m.array(special[::-1].copy())))


@pytest.mark.parametrize("dtype", DTYPES)
def test_clip_and_closeness(dtype):
    same(lambda m: m.clip(_x(m, dtype), 0, 2))
    same(lambda m: m.clip(_x(m, dtype), None, 1))
    same(lambda m: m.clip(_x(m, dtype), _x(m, dtype)[0], None))
    same(lambda m: m.isclose(_x(m, dtype), _x(m, dtype)))
    same(lambda m: m.isclose(_x(m, dtype), _x(m, dtype) * 1.001, rtol=1e-2, atol=0.0))
    same(lambda m: m.allclose(_x(m, dtype), _x(m, dtype), rtol=1e-5, atol=1e-8).item())
    same(lambda m: m.array_equal(_x(m, dtype), _x(m, dtype)).item())
    same(lambda m: m.array_equal(_x(m, dtype), _x(m, "float32"), equal_nan=True).item())


def test_closeness_with_nans():
    a = np.array([np.nan, 1.0, np.inf], np.float32)
    same(lambda m: m.isclose(m.array(a), m.array(a)))
    same(lambda m: m.isclose(m.array(a), m.array(a), equal_nan=True))
    same(lambda m: m.allclose(m.array(a), m.array(a), equal_nan=True).item())
    same(lambda m: m.array_equal(m.array(a), m.array(a)).item())
    same(lambda m: m.array_equal(m.array(a), m.array(a), equal_nan=True).item())
    same(lambda m: m.array_equal(m.array(a), m.array(a[:2])).item())


# -- reductions and scans ---------------------------------------------------------------
REDUCTIONS = ["all", "any", "logsumexp", "softmax", "count_nonzero"]
SCANS = ["logcumsumexp", "cummin"]


@pytest.mark.parametrize("name,dtype,call", _cases(REDUCTIONS, DTYPES, None))
def test_reductions(name, dtype, call):
    f = lambda m: getattr(m, name)  # noqa: E731
    same(lambda m: f(m)(_x(m, dtype)))
    same(lambda m: f(m)(_x(m, dtype), axis=1))
    same(lambda m: f(m)(_x(m, dtype), axis=(0, 1), keepdims=True))
    same(lambda m: f(m)(_x(m, dtype), axis=-1, keepdims=True))
    same(lambda m: f(m)(_x(m, dtype), axis=2))


@pytest.mark.parametrize("name,dtype,call", _cases(SCANS, DTYPES, None))
def test_scans(name, dtype, call):
    f = lambda m: getattr(m, name)  # noqa: E731
    same(lambda m: f(m)(_x(m, dtype)))
    same(lambda m: f(m)(_x(m, dtype), axis=0))
    same(lambda m: f(m)(_x(m, dtype), axis=1, reverse=True))
    same(lambda m: f(m)(_x(m, dtype), axis=1, inclusive=False))
    same(lambda m: f(m)(_x(m, dtype), axis=3))


def test_softmax_precise_and_trace():
    same(lambda m: m.softmax(_x(m, "float16"), axis=-1, precise=True))
    same(lambda m: m.softmax(_x(m, "bfloat16"), precise=True))
    def square(m, d):
        return m.reshape(m.concatenate([_x(m, d)] * 3).flatten()[:9], (3, 3))
    for d in DTYPES:
        same(lambda m, d=d: m.trace(square(m, d)))
        same(lambda m, d=d: m.trace(square(m, d), 1))
        same(lambda m, d=d: m.trace(square(m, d), -1, 0, 1, dtype=m.float32))
    same(lambda m: m.trace(m.ones((2, 3, 4)), 0, 1, 2))
    same(lambda m: m.trace(m.ones((2, 3, 4)), axis1=0, axis2=0))
    same(lambda m: m.trace(m.ones((3,))))


# -- shapes --------------------------------------------------------------------------------
SHAPES = {
    "atleast_1d": [lambda m: m.atleast_1d(m.array(1.0)),
                   lambda m: m.atleast_1d(m.array(1), m.ones((2, 3)))],
    "atleast_2d": [lambda m: m.atleast_2d(m.array([1, 2])),
                   lambda m: m.atleast_2d(m.array(1.0), m.ones((2, 3, 4)))],
    "atleast_3d": [lambda m: m.atleast_3d(m.array([1, 2])),
                   lambda m: m.atleast_3d(m.ones((2, 3))),
                   lambda m: m.atleast_3d(m.array(2.0))],
    "broadcast_arrays": [lambda m: m.broadcast_arrays(m.ones((2, 1)), m.zeros((3,))),
                         lambda m: m.broadcast_arrays(m.ones((2,)), m.zeros((3,)))],
    "broadcast_shapes": [lambda m: m.broadcast_shapes((2, 1), (1, 3)),
                         lambda m: m.broadcast_shapes((2,), (3,)),
                         lambda m: m.broadcast_shapes((5, 1, 4), (3, 1), ())],
    "concat": [lambda m: m.concat([m.ones((2, 3)), m.zeros((1, 3))]),
               lambda m: m.concat([m.ones((2, 3)), m.zeros((2, 1), m.int32)], axis=1),
               lambda m: m.concat([m.ones((2, 3)), m.zeros((2, 2))], axis=0),
               lambda m: m.concat([m.ones((2, 3))], axis=2)],
    "stack": [lambda m: m.stack([m.ones((2, 3)), m.zeros((2, 3))]),
              lambda m: m.stack([m.ones((2,)), m.zeros((2,))], axis=-1),
              lambda m: m.stack([m.ones((2,)), m.zeros((3,))])],
    "unstack": [lambda m: m.unstack(m.arange(6).reshape(2, 3)),
                lambda m: m.unstack(m.arange(6).reshape(2, 3), axis=1),
                lambda m: m.unstack(m.arange(6).reshape(2, 3), axis=2)],
    "expand_dims": [lambda m: m.expand_dims(m.ones((2, 3)), 0),
                    lambda m: m.expand_dims(m.ones((2, 3)), (0, -1)),
                    lambda m: m.expand_dims(m.ones((2, 3)), 4),
                    lambda m: m.expand_dims(m.ones((2, 3)), (1, 1))],
    "squeeze": [lambda m: m.squeeze(m.ones((1, 2, 1))),
                lambda m: m.squeeze(m.ones((1, 2, 1)), 2),
                lambda m: m.squeeze(m.ones((1, 2, 1)), (0, -1)),
                lambda m: m.squeeze(m.ones((1, 2, 1)), 1)],
    "flip": [lambda m: m.flip(m.arange(6).reshape(2, 3)) if hasattr(m, "flip") else None],
    "moveaxis": [lambda m: m.moveaxis(m.ones((2, 3, 4)), 0, -1),
                 lambda m: m.moveaxis(m.ones((2, 3, 4)), -1, 1),
                 lambda m: m.moveaxis(m.ones((2, 3, 4)), 3, 0)],
    "swapaxes": [lambda m: m.swapaxes(m.arange(24).reshape(2, 3, 4), 0, 2),
                 lambda m: m.swapaxes(m.ones((2, 3)), 0, 5)],
    "permute_dims": [lambda m: m.permute_dims(m.arange(24).reshape(2, 3, 4)),
                     lambda m: m.permute_dims(m.arange(24).reshape(2, 3, 4), (1, 0, 2)),
                     lambda m: m.permute_dims(m.ones((2, 3)), (0, 0))],
    "repeat": [lambda m: m.repeat(m.arange(6).reshape(2, 3), 2),
               lambda m: m.repeat(m.arange(6).reshape(2, 3), 2, axis=1),
               lambda m: m.repeat(m.arange(6).reshape(2, 3), 0, axis=0),
               lambda m: m.repeat(m.arange(3), 2, axis=1)],
    "roll": [lambda m: m.roll(m.arange(6).reshape(2, 3), 1),
             lambda m: m.roll(m.arange(6).reshape(2, 3), -4, axis=1),
             lambda m: m.roll(m.arange(6).reshape(2, 3), (1, 2), axis=(0, 1)),
             lambda m: m.roll(m.arange(6).reshape(2, 3), 1, axis=2)],
    "tile": [lambda m: m.tile(m.arange(3), 2), lambda m: m.tile(m.arange(3), (2, 2)),
             lambda m: m.tile(m.arange(6).reshape(2, 3), (2,))],
    "diagonal": [lambda m: m.diagonal(m.arange(12).reshape(3, 4)),
                 lambda m: m.diagonal(m.arange(12).reshape(3, 4), 1),
                 lambda m: m.diagonal(m.arange(24).reshape(2, 3, 4), -1, 1, 2),
                 lambda m: m.diagonal(m.arange(24).reshape(2, 3, 4), 0, 0, 0)],
    "diag": [lambda m: m.diag(m.arange(3)), lambda m: m.diag(m.arange(3), k=-1),
             lambda m: m.diag(m.arange(12).reshape(3, 4), 1),
             lambda m: m.diag(m.ones((2, 2, 2)))],
    "meshgrid": [lambda m: m.meshgrid(m.arange(2), m.arange(3)),
                 lambda m: m.meshgrid(m.arange(2), m.arange(3), indexing="ij"),
                 lambda m: m.meshgrid(m.arange(2), m.arange(3), sparse=True),
                 lambda m: m.meshgrid(m.arange(2), indexing="xx")],
    "tri": [lambda m: m.tri(3), lambda m: m.tri(2, 4, 1), lambda m: m.tri(3, k=-1, dtype=m.int32)],
    "tril": [lambda m: m.tril(m.ones((3, 4))), lambda m: m.tril(m.ones((2, 3, 3)), 1),
             lambda m: m.tril(m.ones((3,)))],
    "triu": [lambda m: m.triu(m.ones((3, 4))), lambda m: m.triu(m.ones((2, 3, 3)), k=-1),
             lambda m: m.triu(m.ones((3,)))],
    "view": [lambda m: m.view(m.arange(4, dtype=m.int32), m.float32),
             lambda m: m.view(m.arange(4, dtype=m.int32), m.int16),
             lambda m: m.view(m.arange(4, dtype=m.int16), m.int32),
             lambda m: m.view(m.ones((2, 3), m.float16), m.uint16),
             lambda m: m.view(m.arange(3, dtype=m.int16), m.int32)],
    "as_strided": [lambda m: m.as_strided(m.arange(6), (2, 2), (1, 2)),
                   lambda m: m.as_strided(m.arange(6), (3,), (2,), 1),
                   lambda m: m.as_strided(m.arange(6).reshape(2, 3).T, (6,), (1,))],
    "contiguous": [lambda m: m.contiguous(m.arange(6).reshape(2, 3).T),
                   lambda m: m.contiguous(m.ones((2, 3)), allow_col_major=True)],
}


@pytest.mark.parametrize("case", [
    pytest.param(f, id=f"{n}-{i}", marks=[pytest.mark.xfail(strict=True, reason=DIFFERENCES[
        f"{n}-{i}"])] if f"{n}-{i}" in DIFFERENCES else [])
    for n, fs in SHAPES.items() for i, f in enumerate(fs)])
def test_shapes(case):
    same(case)


@pytest.mark.parametrize("dtype", DTYPES)
def test_shape_ops_keep_every_dtype(dtype):
    for f in (lambda m, x: m.flip(x, 0) if hasattr(m, "flip") else x[::-1],
              lambda m, x: m.roll(x, 1, 1), lambda m, x: m.tile(x, (1, 2)),
              lambda m, x: m.repeat(x, 2, 0), lambda m, x: m.stack([x, x]),
              lambda m, x: m.concat([x, x], 1), lambda m, x: m.tril(x),
              lambda m, x: m.triu(x, 1), lambda m, x: m.diagonal(x),
              lambda m, x: m.moveaxis(x, 0, 1), lambda m, x: m.atleast_3d(x),
              lambda m, x: m.unstack(x)):
        same(lambda m, f=f: f(m, _x(m, dtype)))


# -- creation and windows ---------------------------------------------------------------------
CREATION = [
    lambda m: m.linspace(0, 1, 5), lambda m: m.linspace(0, 1), lambda m: m.linspace(1, 0, 4),
    lambda m: m.linspace(0, 10, 4, dtype=m.int32), lambda m: m.linspace(0, 1, 1),
    lambda m: m.linspace(0, 1, 0), lambda m: m.linspace(0, 1, -1),
    lambda m: m.linspace(0, 1, 3, dtype=m.float16),
    lambda m: m.empty((2, 3)).shape, lambda m: str(m.empty(3, dtype=m.int8).dtype).split(".")[-1],
    lambda m: m.empty_like(m.ones((2, 3), m.int16)).shape,
    lambda m: str(m.empty_like(m.ones((2, 3), m.int16)).dtype).split(".")[-1],
    lambda m: m.hanning(5), lambda m: m.hamming(6), lambda m: m.blackman(7),
    lambda m: m.bartlett(5), lambda m: m.hanning(1), lambda m: m.hamming(0),
    lambda m: m.bartlett(1), lambda m: m.blackman(2),
]


@pytest.mark.parametrize("case", [pytest.param(f, id=f"creation-{i}")
                                  for i, f in enumerate(CREATION)])
def test_creation(case):
    same(case, atol=1e-6)


# -- products -------------------------------------------------------------------------------
PRODUCTS = [
    lambda m: m.inner(m.arange(3.0), m.arange(3.0)),
    lambda m: m.inner(m.ones((2, 3)), m.ones((4, 3))),
    lambda m: m.inner(m.ones((2, 3)), m.ones((4, 2))),
    lambda m: m.inner(m.ones((2, 3), m.int32), m.arange(3)),
    lambda m: m.outer(m.arange(3.0), m.arange(4.0)),
    lambda m: m.outer(m.ones((2, 2)), m.arange(3)),
    lambda m: m.outer(m.arange(3, dtype=m.int8), m.arange(2, dtype=m.int8)),
    lambda m: m.tensordot(m.ones((2, 3, 4)), m.ones((3, 4, 5))),
    lambda m: m.tensordot(m.ones((2, 3, 4)), m.ones((4, 3, 5)), axes=([1, 2], [1, 0])),
    lambda m: m.tensordot(m.ones((2, 3)), m.ones((3, 2)), axes=1),
    lambda m: m.tensordot(m.ones((2, 3)), m.ones((2, 3)), axes=0),
    lambda m: m.tensordot(m.ones((2, 3)), m.ones((4, 3)), axes=1),
    lambda m: m.addmm(m.ones((2, 4)), m.ones((2, 3)), m.ones((3, 4))),
    lambda m: m.addmm(m.ones((4,)), m.ones((2, 3)), m.ones((3, 4)), alpha=2.0, beta=0.5),
    lambda m: m.addmm(m.ones((2, 2, 4)), m.ones((2, 2, 3)), m.ones((3, 4)), beta=0.0),
    lambda m: m.addmm(m.ones((2, 4)), m.ones((2, 3)), m.ones((2, 4))),
    lambda m: m.addmm(m.ones((2, 4), m.float16), m.ones((2, 3), m.float16),
                      m.ones((3, 4), m.float16), alpha=0.5),
]


@pytest.mark.parametrize("case", [pytest.param(f, id=f"product-{i}")
                                  for i, f in enumerate(PRODUCTS)])
def test_products(case):
    same(case, rtol=1e-5)


# -- partitions -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "complex64"])
def test_partition_and_argpartition(dtype):
    # Only the kth entry and the sides it splits are promised, not the order within a
    # side: compare the kth entries and each side's sorted values.
    data = np.array([[5, 1, 4, 2, 3, 0], [3, 3, 1, 0, 7, 2]], np.float32)

    def sides(m, kth, axis):
        x = _x(m, dtype, data)
        p = m.partition(x, kth, axis=axis)
        taken = m.take_along_axis(x, m.argpartition(x, kth, axis=axis), axis=axis)
        out = []
        for r in (p, taken):
            r = np.moveaxis(np.array(r.astype(m.float32)), -1 if axis is None else axis, -1)
            out.append((r[..., kth], np.sort(r[..., :kth], -1), np.sort(r[..., kth + 1:], -1)))
        return out
    from mlx_compat import lx, mlx
    for kth, axis in ((2, -1), (0, 0), (3, None), (5, 1)):
        got, want = sides(lx, kth, axis), sides(mlx, kth, axis)
        for g, w in zip(got, want):
            for a, b in zip(g, w):
                np.testing.assert_array_equal(a, b, err_msg=f"kth={kth} axis={axis}")
    same(lambda m: m.partition(_x(m, dtype, data), 6))
    same(lambda m: m.argpartition(_x(m, dtype, data), 1, axis=2))


def test_cpu_is_available():
    # the GPU's answer is the machine's (a CPU-only MLX says False, lazyx may have CUDA)
    same(lambda m: m.is_available(m.cpu))


# -- dtypes ----------------------------------------------------------------------------------
def test_issubdtype():
    from mlx_compat import lx, mlx
    cats = ["generic", "number", "integer", "signedinteger", "unsignedinteger", "inexact",
            "floating", "complexfloating", "bool_"]
    for a in DTYPES + cats:
        for b in DTYPES + cats:
            assert lx.issubdtype(getattr(lx, a), getattr(lx, b)) == \
                mlx.issubdtype(getattr(mlx, a), getattr(mlx, b)), (a, b)


# -- random --------------------------------------------------------------------------------------
RANDOM = [
    lambda m: m.random.normal((3, 2), key=m.random.key(1)),
    lambda m: m.random.normal((4,), loc=1.0, scale=2.0, key=m.random.key(2)),
    lambda m: m.random.normal((4,), dtype=m.float16, key=m.random.key(3)),
    lambda m: m.random.normal((4,), dtype=m.int32, key=m.random.key(3)),
    lambda m: m.random.normal(key=m.random.key(4)),
    lambda m: m.random.truncated_normal(-1.0, 1.0, (5,), key=m.random.key(0)),
    lambda m: m.random.truncated_normal(m.zeros((2, 1)), m.ones((3,)), key=m.random.key(5)),
    lambda m: m.random.truncated_normal(0.0, 2.0, (3,), dtype=m.bfloat16, key=m.random.key(5)),
    lambda m: m.random.gumbel((4,), key=m.random.key(0)),
    lambda m: m.random.gumbel((2, 2), dtype=m.float16, key=m.random.key(6)),
    lambda m: m.random.laplace((4,), key=m.random.key(0)),
    lambda m: m.random.laplace((3,), loc=1.0, scale=0.5, key=m.random.key(7)),
    lambda m: m.random.laplace((3,), dtype=m.int8, key=m.random.key(7)),
    lambda m: m.random.permutation(6, key=m.random.key(0)),
    lambda m: m.random.permutation(m.arange(8).reshape(4, 2), key=m.random.key(1)),
    lambda m: m.random.permutation(m.arange(8).reshape(2, 4), axis=1, key=m.random.key(2)),
    lambda m: m.random.split(m.random.key(0)),
    lambda m: m.random.split(m.random.key(3), num=4),
    lambda m: m.random.split(m.random.key(3), 1),
]


@pytest.mark.parametrize("case", [pytest.param(f, id=f"random-{i}")
                                  for i, f in enumerate(RANDOM)])
def test_random(case):
    same(case, rtol=1e-5, atol=1e-6)


def test_random_seed_makes_the_global_key():
    from mlx_compat import lx, mlx
    lx.random.seed(7)
    mlx.random.seed(7)
    same(lambda m: m.random.uniform(shape=(3,)))
    same(lambda m: m.random.normal((2,)))
